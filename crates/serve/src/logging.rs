//! Triton's logging extension: the server's log settings read and changed while it
//! runs (`GET`/`POST /v2/logging`, gRPC `LogSettings`).
//!
//! The settings are Triton's: `log_info`, `log_warning`, `log_error` (booleans),
//! `log_verbose_level` (0 off; 1 adds debug records; 2 and up trace records),
//! `log_format` (`default` or `ISO8601`: the records' timestamps are ISO 8601 either
//! way) and `log_file` (only `""`: the log goes to stderr, where a container runtime
//! collects it). Yardmaster logs through `tracing` with one level threshold, so the
//! switches act as a threshold: the most verbose level switched on is the one kept
//! (with `log_info` off and `log_warning` on, warnings and errors; with every switch
//! off, nothing).
//!
//! The process that owns the log subscriber (the `yardmaster` binary) hands this
//! module a function that applies a threshold ([`install`]); without one, changes
//! are refused, since they could not take effect.

use std::sync::{Mutex, OnceLock};

use serde_json::{json, Map, Value};

/// The log settings in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// Informational records.
    pub info: bool,
    /// Warnings.
    pub warning: bool,
    /// Errors.
    pub error: bool,
    /// Verbosity beyond info: 1 debug, 2 and up trace.
    pub verbose_level: u32,
    /// `default` or `ISO8601`.
    pub format: String,
}

impl Default for LogSettings {
    /// Yardmaster's default threshold: warnings and errors.
    fn default() -> Self {
        LogSettings { info: false, warning: true, error: true, verbose_level: 0, format: "default".into() }
    }
}

impl LogSettings {
    /// The settings a `tracing` threshold (`error`, `warn`, `info`, `debug`, `trace`,
    /// `off`) stands for; `None` for a filter that is more than a bare level.
    pub fn from_threshold(threshold: &str) -> Option<LogSettings> {
        let (info, warning, error, verbose_level) = match threshold.trim().to_ascii_lowercase().as_str() {
            "off" => (false, false, false, 0),
            "error" => (false, false, true, 0),
            "warn" | "warning" => (false, true, true, 0),
            "info" => (true, true, true, 0),
            "debug" => (true, true, true, 1),
            "trace" => (true, true, true, 2),
            _ => return None,
        };
        Some(LogSettings { info, warning, error, verbose_level, format: "default".into() })
    }

    /// The `tracing` threshold these settings come to.
    pub fn threshold(&self) -> &'static str {
        match (self.verbose_level, self.info, self.warning, self.error) {
            (2.., ..) => "trace",
            (1, ..) => "debug",
            (_, true, ..) => "info",
            (_, _, true, _) => "warn",
            (_, _, _, true) => "error",
            _ => "off",
        }
    }

    /// As Triton's logging extension answers them.
    pub fn to_json(&self) -> Value {
        json!({
            "log_file": "",
            "log_info": self.info,
            "log_warning": self.warning,
            "log_error": self.error,
            "log_verbose_level": self.verbose_level,
            "log_format": self.format,
        })
    }

    /// These settings with `changes` (Triton's keys) applied; every key checked.
    pub fn updated(&self, changes: &Map<String, Value>) -> Result<LogSettings, String> {
        let mut next = self.clone();
        for (key, value) in changes {
            let flag = || value.as_bool().ok_or_else(|| format!("{key} must be a boolean, got {value}"));
            match key.as_str() {
                "log_info" => next.info = flag()?,
                "log_warning" => next.warning = flag()?,
                "log_error" => next.error = flag()?,
                "log_verbose_level" => {
                    next.verbose_level = value
                        .as_u64()
                        .and_then(|v| u32::try_from(v).ok())
                        .ok_or_else(|| format!("log_verbose_level must be a non-negative integer, got {value}"))?
                }
                "log_format" => match value.as_str() {
                    Some(format @ ("default" | "ISO8601")) => next.format = format.to_string(),
                    _ => return Err(format!("log_format must be \"default\" or \"ISO8601\", got {value}")),
                },
                "log_file" => match value.as_str() {
                    Some("") => {}
                    _ => return Err(format!("log_file {value} is not supported: the log goes to stderr")),
                },
                other => {
                    return Err(format!(
                        "unknown log setting {other:?} (log_file, log_info, log_warning, log_error, log_verbose_level, log_format)"
                    ))
                }
            }
        }
        Ok(next)
    }
}

type Reloader = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

static RELOADER: OnceLock<Reloader> = OnceLock::new();
static SETTINGS: Mutex<Option<LogSettings>> = Mutex::new(None);

/// Called once by the process that owns the log subscriber: its filter `initial`
/// (e.g. `warn`, from `YARDMASTER_LOG`), and `reload`, which applies a threshold.
pub fn install(initial: &str, reload: impl Fn(&str) -> Result<(), String> + Send + Sync + 'static) {
    let settings = LogSettings::from_threshold(initial).unwrap_or_default();
    *SETTINGS.lock().unwrap_or_else(|p| p.into_inner()) = Some(settings);
    let _ = RELOADER.set(Box::new(reload));
}

/// The settings in force.
pub fn current() -> LogSettings {
    SETTINGS.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_default()
}

/// Apply `changes` (Triton's keys) and answer the settings now in force.
pub fn update(changes: &Map<String, Value>) -> Result<LogSettings, String> {
    let reload = RELOADER.get().ok_or("log settings cannot be changed in this process: it installed no log subscriber to change")?;
    let mut settings = SETTINGS.lock().unwrap_or_else(|p| p.into_inner());
    let next = settings.clone().unwrap_or_default().updated(changes)?;
    reload(next.threshold())?;
    *settings = Some(next.clone());
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_come_to_one_threshold_and_read_back() {
        let base = LogSettings::default();
        assert_eq!(base.threshold(), "warn");
        let change = |value: Value| base.updated(value.as_object().unwrap());
        assert_eq!(change(json!({"log_verbose_level": 1})).unwrap().threshold(), "debug");
        assert_eq!(change(json!({"log_verbose_level": 3})).unwrap().threshold(), "trace");
        assert_eq!(change(json!({"log_info": true})).unwrap().threshold(), "info");
        assert_eq!(change(json!({"log_warning": false})).unwrap().threshold(), "error");
        assert_eq!(change(json!({"log_warning": false, "log_error": false})).unwrap().threshold(), "off");
        for threshold in ["off", "error", "warn", "info", "debug", "trace"] {
            assert_eq!(LogSettings::from_threshold(threshold).unwrap().threshold(), threshold);
        }
        assert_eq!(LogSettings::from_threshold("yardmaster_serve=debug"), None);
        assert_eq!(change(json!({"log_format": "ISO8601"})).unwrap().to_json()["log_format"], "ISO8601");
    }

    #[test]
    fn bad_settings_are_refused_with_the_reason() {
        let base = LogSettings::default();
        let refused = |value: Value| base.updated(value.as_object().unwrap()).unwrap_err();
        assert!(refused(json!({"log_info": 1})).contains("log_info must be a boolean"));
        assert!(refused(json!({"log_verbose_level": -1})).contains("non-negative"));
        assert!(refused(json!({"log_format": "xml"})).contains("log_format"));
        assert!(refused(json!({"log_file": "/tmp/x"})).contains("stderr"));
        assert!(refused(json!({"loud": true})).contains("unknown log setting \"loud\""));
    }
}
