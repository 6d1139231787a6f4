//! The process-wide ONNX Runtime: the shared library loaded once from the path the set-up
//! script installs (or `YARDMASTER_ORT_LIB`), one environment, and the device decision.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use ort::environment::Environment;

use crate::assets;
use crate::device::{self, Device, DeviceChoice, DevicePreference};
use crate::error::{DataplaneError, Result};

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
    library: PathBuf,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("library", &self.library).field("choice", &self.choice).finish()
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
        let builder = ort::init_from(&library).map_err(|e| DataplaneError::Ort(format!("loading {}: {e}", library.display())))?;
        let environment = builder.with_name("yardmaster").with_telemetry(false).build().map_err(DataplaneError::ort)?;
        let choice = device::choose(config.device);
        match (config.device, choice.device) {
            (DevicePreference::Cuda(_), Device::Cpu) => {
                tracing::warn!("data plane device: cpu, not the GPU asked for: {}", choice.reason)
            }
            (_, device) => tracing::info!("data plane device: {device} ({})", choice.reason),
        }
        Ok(Runtime { environment, choice, library })
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

    /// The library that was loaded.
    pub fn library(&self) -> &std::path::Path {
        &self.library
    }
}
