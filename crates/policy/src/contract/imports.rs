//! What every contract version's bindings module has in the same shape: its host
//! imports, delegating to [`HostState`](crate::instance::HostState)'s `host_*`
//! methods, and its linked-component type. Each version's `bindgen!` generates its own
//! `Host` traits and `SchedulerPre`, so [`version_imports!`] writes these items into
//! the version's module (where those generated names resolve), with the module's own
//! `level_into_latest` converting the log level.

/// Expand, inside a version's bindings module, to `add_to_linker`, the `host` and
/// `types` interface impls for `HostState`, and `Linked`.
macro_rules! version_imports {
    () => {
        /// Add this version's imports (`yardmaster:policy/host`) to a linker.
        pub(crate) fn add_to_linker(linker: &mut wasmtime::component::Linker<$crate::instance::HostState>) -> wasmtime::Result<()> {
            Scheduler::add_to_linker::<$crate::instance::HostState, wasmtime::component::HasSelf<$crate::instance::HostState>>(
                linker,
                |state| state,
            )
        }

        impl yardmaster::policy::types::Host for $crate::instance::HostState {}

        impl yardmaster::policy::host::Host for $crate::instance::HostState {
            fn now(&mut self) -> wasmtime::Result<u64> {
                self.host_now()
            }

            fn log(&mut self, level: yardmaster::policy::host::Level, message: String) -> wasmtime::Result<()> {
                self.host_log(level_into_latest(level), message)
            }

            fn profile(&mut self, stage: u32, variant: u32, batch: u32) -> wasmtime::Result<Option<u64>> {
                self.host_profile(stage, variant, batch)
            }

            fn emit(&mut self, name: String, value: f64) -> wasmtime::Result<()> {
                self.host_emit(name, value)
            }

            fn random(&mut self) -> wasmtime::Result<u64> {
                self.host_random()
            }
        }

        /// A component of this version, linked and ready to instantiate.
        pub(crate) struct Linked {
            pre: SchedulerPre<$crate::instance::HostState>,
        }

        impl Linked {
            /// Check that the linked component has this version's exports.
            pub(crate) fn new(instance_pre: wasmtime::component::InstancePre<$crate::instance::HostState>) -> wasmtime::Result<Self> {
                Ok(Self { pre: SchedulerPre::new(instance_pre)? })
            }
        }
    };
}

pub(crate) use version_imports;
