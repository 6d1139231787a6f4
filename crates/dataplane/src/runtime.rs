//! The process-wide ONNX Runtime: the shared library loaded once from the path the set-up
//! script installs (or `YARDMASTER_ORT_LIB`), one environment, and the device decision.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use ort::environment::Environment;

use crate::assets;
use crate::device::{self, CudaOptions, Device, DeviceChoice, DevicePreference};
use crate::error::{DataplaneError, Result};
use crate::session::WarmStart;

/// How to bring ONNX Runtime up.
#[derive(Debug, Clone, Default)]
pub struct RuntimeConfig {
    /// The library file; `None` looks it up with [`assets::ort_library`].
    pub library: Option<PathBuf>,
    /// The device to run on.
    pub device: DevicePreference,
}

/// ONNX Runtime, loaded and ready to build sessions.
pub struct Runtime {
    environment: Environment,
    choice: DeviceChoice,
    cuda: CudaOptions,
    warm_start: WarmStart,
    library: PathBuf,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("library", &self.library).field("choice", &self.choice).field("cuda", &self.cuda).finish()
    }
}

static RUNTIME: OnceLock<Result<Arc<Runtime>>> = OnceLock::new();

impl Runtime {
    /// The process's runtime with the default configuration (library from the assets
    /// folder, device chosen automatically).
    pub fn global() -> Result<Arc<Runtime>> {
        Self::init(RuntimeConfig::default())
    }

    /// Bring the process's runtime up with `config`. ONNX Runtime loads once per
    /// process: the first call decides, later calls return that runtime.
    pub fn init(config: RuntimeConfig) -> Result<Arc<Runtime>> {
        RUNTIME.get_or_init(|| Self::load(config).map(Arc::new)).clone()
    }

    fn load(config: RuntimeConfig) -> Result<Runtime> {
        let library = match config.library {
            Some(path) => path,
            None => assets::ort_library()?,
        };
        keep_batch_buffers_in_the_heap();
        let cuda = CudaOptions::from_env().map_err(DataplaneError::Invalid)?;
        let warm_start = WarmStart::from_env().map_err(DataplaneError::Invalid)?;
        let builder = ort::init_from(&library).map_err(|e| DataplaneError::Ort(format!("loading {}: {e}", library.display())))?;
        let environment = builder.with_name("yardmaster").with_telemetry(false).build().map_err(DataplaneError::ort)?;
        let choice = device::choose(config.device);
        match (config.device, choice.device) {
            (DevicePreference::Cuda(_), Device::Cpu) => {
                tracing::warn!("data plane device: cpu, not the GPU asked for: {}", choice.reason)
            }
            (_, Device::Cpu) => tracing::info!("data plane device: cpu ({})", choice.reason),
            (_, device) => tracing::info!("data plane device: {device} ({}; {cuda})", choice.reason),
        }
        Ok(Runtime { environment, choice, cuda, warm_start, library })
    }

    /// The ONNX Runtime environment sessions are built in.
    pub fn environment(&self) -> &Environment {
        &self.environment
    }

    /// The device sessions run on.
    pub fn device(&self) -> Device {
        self.choice.device
    }

    /// The device and why it was chosen.
    pub fn device_choice(&self) -> &DeviceChoice {
        &self.choice
    }

    /// The CUDA execution provider's options (used where the device is a GPU).
    pub fn cuda_options(&self) -> CudaOptions {
        self.cuda
    }

    /// What the model cache keeps for warm starts.
    pub fn warm_start(&self) -> WarmStart {
        self.warm_start
    }

    /// The library that was loaded.
    pub fn library(&self) -> &std::path::Path {
        &self.library
    }
}

/// Batches move large buffers between threads: request tensors made by the server's
/// threads are freed by the worker that ran them, outputs the worker made are freed by
/// whoever folds them in. glibc's allocator serves a buffer above its (adaptive) mapping
/// threshold with a fresh `mmap` and gives it back with `munmap` when freed, so every
/// batch paid page faults and unmaps for every request's tensors — measured on an H100
/// as a worker-served batch taking up to three times a plain `Run`. A fixed threshold of
/// 32 MiB (glibc's largest) and a high trim threshold keep such buffers in the heap, to
/// be reused batch after batch. Process-wide; set once, when ONNX Runtime is loaded.
fn keep_batch_buffers_in_the_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: mallopt only changes allocator parameters; it is safe to call at any time.
            let set =
                unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20) == 1 && libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30) == 1 };
            if !set {
                tracing::debug!("the allocator's mapping threshold could not be raised");
            }
        });
    }
}
