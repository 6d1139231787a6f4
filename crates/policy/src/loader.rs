//! Loading a policy component: identify it (SHA-256), compile it (or reuse a cached
//! compilation), read which contract version it was built against and refuse a version
//! the host does not accept, refuse anything that imports outside the policy world, and
//! link it through its version's bindings ready for fast instantiation.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};

use super::contract::{self, Binding, ContractVersion, Linked, VersionError, ACCEPTED, WORLD_IMPORTS};
use super::instance::HostState;
use super::sandbox::Sandbox;

/// WASI interfaces that language runtimes link into every `wasm32-wasip2` component
/// even when the policy never uses them. They are bound to stubs that trap if called,
/// so a policy still cannot read files, clocks, the environment or entropy.
pub const INERT_WASI_IMPORTS: &[&str] = &[
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
];

/// Why a policy file was refused.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read policy {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The bytes are a core module, not a component.
    #[error("{name} is a core WebAssembly module, not a component: build policies for wasm32-wasip2 (or wrap the module with `wasm-tools component new`)")]
    CoreModule {
        /// The policy's name.
        name: String,
    },
    /// The component does not compile.
    #[error("{name} is not a valid WebAssembly component: {reason}")]
    Invalid {
        /// The policy's name.
        name: String,
        /// What the compiler said.
        reason: String,
    },
    /// The component imports something outside the policy world.
    #[error("{name} imports `{import}`, which is outside the yardmaster:policy world: a policy may import only yardmaster:policy/host (and the WASI interfaces a language runtime links by default, which are inert)")]
    ForbiddenImport {
        /// The policy's name.
        name: String,
        /// The offending import.
        import: String,
    },
    /// The component was built against a contract version the host does not accept.
    #[error("{name} was built against contract version yardmaster:policy@{found}, which this host does not accept: it accepts {accepted}; rebuild the policy against an accepted version (see wit/README.md)")]
    UnsupportedContract {
        /// The policy's name.
        name: String,
        /// The version the component carries (`none` when its export is unversioned).
        found: String,
        /// The versions the host accepts.
        accepted: contract::Accepted,
    },
    /// The component imports the policy world's interfaces at another contract version
    /// than the one it exports.
    #[error("{name} exports yardmaster:policy/policy@{version} but imports `{import}`: a policy's imports and exports must all come from one contract version")]
    MixedContract {
        /// The policy's name.
        name: String,
        /// The version of its policy export.
        version: ContractVersion,
        /// The import of another version.
        import: String,
    },
    /// The component does not implement the policy world's exports.
    #[error("{name} does not implement the yardmaster:policy scheduler world: {reason}")]
    WrongWorld {
        /// The policy's name.
        name: String,
        /// What is missing or mistyped.
        reason: String,
    },
}

/// A loaded, checked, compiled and linked policy component.
pub struct PolicyModule {
    name: String,
    sha256: [u8; 32],
    size: usize,
    from_cache: bool,
    linked: Linked,
}

impl std::fmt::Debug for PolicyModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyModule")
            .field("name", &self.name)
            .field("sha256", &self.sha256_hex())
            .field("size", &self.size)
            .field("from_cache", &self.from_cache)
            .field("contract", &self.contract_version())
            .finish()
    }
}

impl PolicyModule {
    /// The policy's name (its file stem, or the name it was loaded under).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// SHA-256 of the component's bytes.
    pub fn sha256(&self) -> [u8; 32] {
        self.sha256
    }

    /// SHA-256 as lowercase hex.
    pub fn sha256_hex(&self) -> String {
        hex::encode(self.sha256)
    }

    /// Size of the component in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether the compiled code came from the cache rather than a fresh compilation.
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }

    /// The contract version the component was built against.
    pub fn contract_version(&self) -> ContractVersion {
        self.linked.binding().version()
    }

    /// The linked component, ready to instantiate.
    pub(crate) fn linked(&self) -> &Linked {
        &self.linked
    }
}

/// Compiles policies, keeping compiled code in memory (by SHA-256) and optionally on
/// disk, so loading the same policy again — after a restart too — skips compilation.
pub struct PolicyLoader {
    sandbox: Sandbox,
    disk: Option<PathBuf>,
    memory: Mutex<HashMap<[u8; 32], Component>>,
}

impl PolicyLoader {
    /// A loader for `sandbox` with an on-disk cache in `cache_dir` (none if `None`).
    pub fn new(sandbox: Sandbox, cache_dir: Option<PathBuf>) -> Self {
        Self { sandbox, disk: cache_dir, memory: Mutex::new(HashMap::new()) }
    }

    /// The default on-disk cache: `$YARDMASTER_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/yardmaster/policies`, else `~/.cache/yardmaster/policies`.
    pub fn default_cache_dir() -> Option<PathBuf> {
        if let Some(dir) = std::env::var_os("YARDMASTER_CACHE_DIR") {
            return Some(PathBuf::from(dir));
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(base.join("yardmaster").join("policies"))
    }

    /// The sandbox policies are compiled for.
    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    /// Load a policy file (named after its file stem).
    pub fn load_file(&self, path: &Path) -> Result<Arc<PolicyModule>, LoadError> {
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read { path: path.to_path_buf(), source })?;
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        self.load(&name, &bytes)
    }

    /// Load a policy from its bytes.
    pub fn load(&self, name: &str, bytes: &[u8]) -> Result<Arc<PolicyModule>, LoadError> {
        if !bytes.starts_with(b"\0asm") {
            return Err(LoadError::Invalid {
                name: name.into(),
                reason: "the file does not start with the WebAssembly magic bytes (\\0asm)".into(),
            });
        }
        if wasmparser_is_core_module(bytes) {
            return Err(LoadError::CoreModule { name: name.into() });
        }
        let sha256: [u8; 32] = Sha256::digest(bytes).into();
        let (component, from_cache) = self.compile(name, &sha256, bytes)?;
        let binding = contract_binding(self.sandbox.engine(), name, &component)?;
        check_imports(self.sandbox.engine(), name, &component, binding.version())?;

        let mut linker: Linker<HostState> = Linker::new(self.sandbox.engine());
        binding.add_to_linker(&mut linker).map_err(|e| LoadError::Invalid { name: name.into(), reason: e.to_string() })?;
        define_deterministic_seed(&mut linker, self.sandbox.engine(), &component)
            .map_err(|e| LoadError::Invalid { name: name.into(), reason: e.to_string() })?;
        linker.define_unknown_imports_as_traps(&component).map_err(|e| LoadError::Invalid { name: name.into(), reason: e.to_string() })?;
        let instance_pre =
            linker.instantiate_pre(&component).map_err(|e| LoadError::WrongWorld { name: name.into(), reason: e.to_string() })?;
        let linked = binding.link(instance_pre).map_err(|e| LoadError::WrongWorld { name: name.into(), reason: e.to_string() })?;
        Ok(Arc::new(PolicyModule { name: name.into(), sha256, size: bytes.len(), from_cache, linked }))
    }

    fn compile(&self, name: &str, sha256: &[u8; 32], bytes: &[u8]) -> Result<(Component, bool), LoadError> {
        if let Some(component) = self.memory.lock().unwrap().get(sha256) {
            return Ok((component.clone(), true));
        }
        let engine = self.sandbox.engine();
        let cached_file = self.disk.as_ref().map(|dir| {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            engine.precompile_compatibility_hash().hash(&mut hasher);
            dir.join(format!("{}-{}-{:016x}.cwasm", hex::encode(sha256), self.sandbox.mode().name(), hasher.finish()))
        });
        if let Some(bytes) = cached_file.as_ref().and_then(|f| std::fs::read(f).ok()) {
            // Read into memory rather than mapping the file, so a cache file replaced or
            // truncated by another process cannot fault this one.
            // SAFETY: the bytes were written by `Component::serialize` of this same
            // engine configuration (its compatibility hash is in the file name) into
            // the operator's own cache directory; wasmtime still checks their header
            // and refuses anything it did not produce.
            if let Ok(component) = unsafe { Component::deserialize(engine, &bytes) } {
                self.memory.lock().unwrap().insert(*sha256, component.clone());
                return Ok((component, true));
            }
        }
        let component = Component::new(engine, bytes).map_err(|e| LoadError::Invalid { name: name.into(), reason: format!("{e:#}") })?;
        if let Some(file) = cached_file {
            if let Err(error) = write_cache_file(&file, &component) {
                tracing::warn!(policy = name, file = %file.display(), %error, "cannot cache the compiled policy");
            }
        }
        self.memory.lock().unwrap().insert(*sha256, component.clone());
        Ok((component, false))
    }
}

fn write_cache_file(file: &Path, component: &Component) -> anyhow::Result<()> {
    let bytes = component.serialize().map_err(|e| anyhow::anyhow!("{e}"))?;
    let dir = file.parent().expect("cache file has a directory");
    std::fs::create_dir_all(dir)?;
    let temporary = file.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&temporary, bytes)?;
    std::fs::rename(&temporary, file)?;
    Ok(())
}

/// `wasi:random/insecure-seed` is what language runtimes use to seed hash tables
/// (Rust's `HashMap` calls it on first use). It gets a value derived from the arm's
/// seed — never entropy — so decisions stay reproducible.
fn define_deterministic_seed(linker: &mut Linker<HostState>, engine: &wasmtime::Engine, component: &Component) -> wasmtime::Result<()> {
    let ty = component.component_type();
    let names: Vec<String> =
        ty.imports(engine).map(|(name, _)| name.to_string()).filter(|name| name.starts_with("wasi:random/insecure-seed@")).collect();
    for name in names {
        linker
            .instance(&name)?
            .func_wrap("insecure-seed", |store: wasmtime::StoreContextMut<'_, HostState>, (): ()| Ok((store.data().hash_seed(),)))?;
    }
    Ok(())
}

/// A core module starts with the magic and version 1; a component with the magic and
/// its own layer/version word.
fn wasmparser_is_core_module(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && bytes[0..4] == *b"\0asm" && bytes[4..8] == [1, 0, 0, 0]
}

/// The bindings for the contract version the component exports, or why it is refused.
fn contract_binding(engine: &wasmtime::Engine, name: &str, component: &Component) -> Result<Binding, LoadError> {
    let ty = component.component_type();
    let refused = |error: VersionError| match error {
        VersionError::NoPolicyExport => LoadError::WrongWorld { name: name.into(), reason: error.to_string() },
        VersionError::Unsupported { found } => LoadError::UnsupportedContract { name: name.into(), found, accepted: ACCEPTED },
    };
    let version = contract::exported_version(ty.exports(engine).map(|(export, _)| export)).map_err(refused)?;
    Binding::for_version(version).map_err(refused)
}

/// Refuse any import that is neither part of the world (at the component's own
/// contract version) nor an inert WASI interface.
fn check_imports(engine: &wasmtime::Engine, name: &str, component: &Component, contract: ContractVersion) -> Result<(), LoadError> {
    let ty = component.component_type();
    for (import, _) in ty.imports(engine) {
        let (interface, version) = import.split_once('@').unwrap_or((import, ""));
        if WORLD_IMPORTS.contains(&interface) {
            if ContractVersion::parse(version) != Some(contract) {
                return Err(LoadError::MixedContract { name: name.into(), version: contract, import: import.into() });
            }
        } else if !INERT_WASI_IMPORTS.contains(&interface) {
            return Err(LoadError::ForbiddenImport { name: name.into(), import: import.into() });
        }
    }
    Ok(())
}
