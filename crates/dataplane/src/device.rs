//! Device selection: the CUDA execution provider when a GPU, its driver and a CUDA-enabled
//! ONNX Runtime are all present, the CPU otherwise — decided once, with one log line that
//! says which and why. GPU discovery and memory telemetry go through `cudarc`, which loads
//! the driver at run time, so all of this compiles and runs on machines without CUDA.

/// Where sessions run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// The CPU execution provider.
    Cpu,
    /// The CUDA execution provider on the GPU with this ordinal.
    Cuda(u32),
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(ordinal) => write!(f, "cuda:{ordinal}"),
        }
    }
}

/// What the operator asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DevicePreference {
    /// The first GPU when everything CUDA needs is present, else the CPU.
    #[default]
    Auto,
    /// The CPU, even where a GPU is present.
    Cpu,
    /// This GPU; falls back to the CPU (with the reason logged) when it cannot be used.
    Cuda(u32),
}

impl std::str::FromStr for DevicePreference {
    type Err = String;

    /// `auto`, `cpu`, `cuda` (the first GPU) or `cuda:N`.
    fn from_str(raw: &str) -> std::result::Result<Self, String> {
        match raw {
            "auto" => Ok(DevicePreference::Auto),
            "cpu" => Ok(DevicePreference::Cpu),
            "cuda" => Ok(DevicePreference::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DevicePreference::Cuda)
                .ok_or_else(|| format!("device {other:?}: expected auto, cpu, cuda or cuda:N")),
        }
    }
}

/// The device chosen and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceChoice {
    /// The device sessions run on.
    pub device: Device,
    /// Why this device (shown in the log line).
    pub reason: String,
}

/// A GPU as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// Ordinal.
    pub ordinal: u32,
    /// Marketing name.
    pub name: String,
    /// Total memory, bytes.
    pub total_bytes: u64,
    /// Free memory now, bytes.
    pub free_bytes: u64,
}

/// The GPUs the CUDA driver can see; an explanation instead when there are none.
#[cfg(feature = "cuda")]
pub fn discover_gpus() -> Result<Vec<GpuInfo>, String> {
    use cudarc::driver::CudaContext;
    // Without the driver library, cudarc's context creation panics: check first.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda) on this machine".into());
    }
    let count = std::panic::catch_unwind(CudaContext::device_count)
        .map_err(|_| "the CUDA driver failed to initialise".to_string())?
        .map_err(|e| format!("the CUDA driver reports no devices ({e})"))?;
    let mut gpus = Vec::new();
    for ordinal in 0..count.max(0) as usize {
        let context = CudaContext::new(ordinal).map_err(|e| format!("GPU {ordinal}: {e}"))?;
        let (free, total) = context.mem_get_info().map_err(|e| format!("GPU {ordinal}: {e}"))?;
        gpus.push(GpuInfo {
            ordinal: ordinal as u32,
            name: context.name().unwrap_or_else(|_| "unknown GPU".into()),
            total_bytes: total as u64,
            free_bytes: free as u64,
        });
    }
    if gpus.is_empty() {
        return Err("the CUDA driver sees no GPU".into());
    }
    Ok(gpus)
}

/// Free and total memory of one GPU now, bytes, as the CUDA driver reports them (what
/// every process on the GPU holds is counted as used).
#[cfg(feature = "cuda")]
pub fn gpu_memory(ordinal: u32) -> Result<(u64, u64), String> {
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda) on this machine".into());
    }
    let context = std::panic::catch_unwind(|| cudarc::driver::CudaContext::new(ordinal as usize))
        .map_err(|_| "the CUDA driver failed to initialise".to_string())?
        .map_err(|e| format!("GPU {ordinal}: {e}"))?;
    let (free, total) = context.mem_get_info().map_err(|e| format!("GPU {ordinal}: {e}"))?;
    Ok((free as u64, total as u64))
}

/// Free and total memory of one GPU; this build has no CUDA support.
#[cfg(not(feature = "cuda"))]
pub fn gpu_memory(_ordinal: u32) -> Result<(u64, u64), String> {
    Err("built without the `cuda` feature".into())
}

/// The GPUs the CUDA driver can see; this build has no CUDA support.
#[cfg(not(feature = "cuda"))]
pub fn discover_gpus() -> Result<Vec<GpuInfo>, String> {
    Err("built without the `cuda` feature".into())
}

/// Whether the loaded ONNX Runtime library was built with the CUDA execution provider.
#[cfg(feature = "cuda")]
pub fn ort_has_cuda() -> bool {
    use ort::ep::ExecutionProvider;
    ort::ep::CUDA::is_available().unwrap_or(false)
}

/// Whether the loaded ONNX Runtime library was built with the CUDA execution provider.
#[cfg(not(feature = "cuda"))]
pub fn ort_has_cuda() -> bool {
    false
}

/// Decide the device for a preference. Needs ONNX Runtime loaded (it asks the library
/// whether it carries the CUDA provider).
pub fn choose(preference: DevicePreference) -> DeviceChoice {
    let wanted = match preference {
        DevicePreference::Cpu => return DeviceChoice { device: Device::Cpu, reason: "the CPU was asked for".into() },
        DevicePreference::Auto => 0,
        DevicePreference::Cuda(ordinal) => ordinal,
    };
    let cpu = |why: String| DeviceChoice { device: Device::Cpu, reason: why };
    let gpus = match discover_gpus() {
        Ok(gpus) => gpus,
        Err(why) => return cpu(why),
    };
    let Some(gpu) = gpus.iter().find(|g| g.ordinal == wanted) else {
        return cpu(format!("GPU {wanted} does not exist ({} found)", gpus.len()));
    };
    if !ort_has_cuda() {
        return cpu(format!(
            "found {} but the loaded ONNX Runtime has no CUDA execution provider (install the onnxruntime-gpu library)",
            gpu.name
        ));
    }
    DeviceChoice {
        device: Device::Cuda(wanted),
        reason: format!("{} with {} MiB free of {} MiB", gpu.name, gpu.free_bytes >> 20, gpu.total_bytes >> 20),
    }
}

/// How cuDNN picks a convolution algorithm on the GPU (`YARDMASTER_CUDA_CONV_ALGO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConvAlgorithmSearch {
    /// Benchmark every algorithm on the first run of each new input shape: the fastest
    /// steady state, but that first run is slow (ONNX Runtime's own default).
    Exhaustive,
    /// cuDNN's heuristic: no benchmarking, so a new image size costs no first-run stall
    /// (the default here: a server sees many shapes, and a policy's profile must hold
    /// from the first request).
    #[default]
    Heuristic,
    /// cuDNN's default algorithm (least workspace memory).
    Default,
}

/// How the GPU's memory arena grows (`YARDMASTER_CUDA_ARENA`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ArenaGrowth {
    /// By what is asked for: a replica holds about what it uses, so the memory a policy
    /// is told a replica needs is what it takes (the default here).
    #[default]
    SameAsRequested,
    /// In powers of two (ONNX Runtime's own default): fewer allocations, up to twice the
    /// memory.
    NextPowerOfTwo,
}

/// Options of the CUDA execution provider that Yardmaster sets on every GPU session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaOptions {
    /// cuDNN convolution algorithm search.
    pub conv_algorithm_search: ConvAlgorithmSearch,
    /// Memory arena growth.
    pub arena_growth: ArenaGrowth,
    /// How many ONNX Runtime sessions one loaded model keeps on the GPU, each bound to
    /// the input shapes it last ran (`YARDMASTER_CUDA_SHAPE_SESSIONS`, 1–64). ONNX
    /// Runtime's CUDA convolutions rebuild their cuDNN plans whenever a session's input
    /// shape changes — measured on an H100 at 0.1–1.5 s per change for the PP-OCR
    /// models, against 3–30 ms for the batch itself — so a server whose batch sizes vary
    /// keeps a session per recent shape instead of re-planning one session.
    pub shape_sessions: usize,
    /// Whether a batch of large requests (1 MiB and more each, such as images) is
    /// stacked straight into GPU memory, each request copied into its slot of a device
    /// tensor (`YARDMASTER_CUDA_STACK=device`, the default), or always stacked in host
    /// memory that ONNX Runtime then copies (`host`). Smaller requests are stacked on the
    /// host either way.
    pub stack_on_device: bool,
}

/// The default of [`CudaOptions::shape_sessions`]: one per batch size up to 8.
pub const DEFAULT_SHAPE_SESSIONS: usize = 8;

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            conv_algorithm_search: ConvAlgorithmSearch::default(),
            arena_growth: ArenaGrowth::default(),
            shape_sessions: DEFAULT_SHAPE_SESSIONS,
            stack_on_device: true,
        }
    }
}

impl CudaOptions {
    /// The options from `YARDMASTER_CUDA_CONV_ALGO` (`exhaustive`, `heuristic`,
    /// `default`), `YARDMASTER_CUDA_ARENA` (`same-as-requested`, `next-power-of-two`)
    /// `YARDMASTER_CUDA_SHAPE_SESSIONS` (1–64) and `YARDMASTER_CUDA_STACK` (`device`,
    /// `host`); unset variables keep the defaults, a bad value is an error naming the
    /// variable.
    pub fn from_env() -> Result<CudaOptions, String> {
        let read = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let mut options = CudaOptions::default();
        if let Some(raw) = read("YARDMASTER_CUDA_CONV_ALGO") {
            options.conv_algorithm_search = match raw.as_str() {
                "exhaustive" => ConvAlgorithmSearch::Exhaustive,
                "heuristic" => ConvAlgorithmSearch::Heuristic,
                "default" => ConvAlgorithmSearch::Default,
                other => return Err(format!("YARDMASTER_CUDA_CONV_ALGO={other:?}: expected exhaustive, heuristic or default")),
            };
        }
        if let Some(raw) = read("YARDMASTER_CUDA_ARENA") {
            options.arena_growth = match raw.as_str() {
                "same-as-requested" => ArenaGrowth::SameAsRequested,
                "next-power-of-two" => ArenaGrowth::NextPowerOfTwo,
                other => return Err(format!("YARDMASTER_CUDA_ARENA={other:?}: expected same-as-requested or next-power-of-two")),
            };
        }
        if let Some(raw) = read("YARDMASTER_CUDA_SHAPE_SESSIONS") {
            options.shape_sessions = match raw.parse::<usize>() {
                Ok(n @ 1..=64) => n,
                _ => return Err(format!("YARDMASTER_CUDA_SHAPE_SESSIONS={raw:?}: expected a whole number from 1 to 64")),
            };
        }
        if let Some(raw) = read("YARDMASTER_CUDA_STACK") {
            options.stack_on_device = match raw.as_str() {
                "device" => true,
                "host" => false,
                other => return Err(format!("YARDMASTER_CUDA_STACK={other:?}: expected device or host")),
            };
        }
        Ok(options)
    }
}

impl std::fmt::Display for CudaOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let conv = match self.conv_algorithm_search {
            ConvAlgorithmSearch::Exhaustive => "exhaustive",
            ConvAlgorithmSearch::Heuristic => "heuristic",
            ConvAlgorithmSearch::Default => "default",
        };
        let arena = match self.arena_growth {
            ArenaGrowth::SameAsRequested => "same-as-requested",
            ArenaGrowth::NextPowerOfTwo => "next-power-of-two",
        };
        let stack = if self.stack_on_device { "device" } else { "host" };
        write!(
            f,
            "cuDNN conv search {conv}, arena {arena}, up to {} sessions per model (one per input shape), batches stacked on the {stack}",
            self.shape_sessions
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preferences_parse_and_bad_ones_say_what_is_expected() {
        assert_eq!("auto".parse::<DevicePreference>(), Ok(DevicePreference::Auto));
        assert_eq!("cuda".parse::<DevicePreference>(), Ok(DevicePreference::Cuda(0)));
        assert_eq!("cuda:3".parse::<DevicePreference>(), Ok(DevicePreference::Cuda(3)));
        assert!("gpu".parse::<DevicePreference>().unwrap_err().contains("expected auto, cpu, cuda or cuda:N"));
    }

    #[test]
    fn cuda_options_come_from_the_environment_and_refuse_unknown_values() {
        // One test owns both variables (tests run in threads of one process).
        std::env::set_var("YARDMASTER_CUDA_CONV_ALGO", "exhaustive");
        std::env::set_var("YARDMASTER_CUDA_ARENA", "next-power-of-two");
        std::env::set_var("YARDMASTER_CUDA_SHAPE_SESSIONS", "3");
        std::env::set_var("YARDMASTER_CUDA_STACK", "host");
        let options = CudaOptions::from_env().unwrap();
        assert_eq!(options.conv_algorithm_search, ConvAlgorithmSearch::Exhaustive);
        assert_eq!(options.arena_growth, ArenaGrowth::NextPowerOfTwo);
        assert_eq!(options.shape_sessions, 3);
        assert!(!options.stack_on_device);
        std::env::remove_var("YARDMASTER_CUDA_STACK");
        std::env::set_var("YARDMASTER_CUDA_SHAPE_SESSIONS", "0");
        let error = CudaOptions::from_env().unwrap_err();
        assert!(error.contains("YARDMASTER_CUDA_SHAPE_SESSIONS=\"0\""), "{error}");
        std::env::remove_var("YARDMASTER_CUDA_SHAPE_SESSIONS");
        std::env::set_var("YARDMASTER_CUDA_CONV_ALGO", "fastest");
        let error = CudaOptions::from_env().unwrap_err();
        assert!(error.contains("YARDMASTER_CUDA_CONV_ALGO=\"fastest\""), "{error}");
        std::env::remove_var("YARDMASTER_CUDA_CONV_ALGO");
        std::env::remove_var("YARDMASTER_CUDA_ARENA");
        assert_eq!(CudaOptions::from_env().unwrap(), CudaOptions::default());
    }
}
