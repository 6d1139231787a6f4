//! Triton's trace extension: requests traced with their timestamps into a file, the
//! settings read and changed while the server runs (`GET`/`POST /v2/trace/setting`,
//! `…/v2/models/{m}/trace/setting`, gRPC `TraceSetting`).
//!
//! Settings are Triton's, as strings or lists of strings: `trace_level` (`["OFF"]` or
//! `["TIMESTAMPS"]`; `TENSORS` is refused), `trace_rate` (trace one request in this
//! many), `trace_count` (traces left to take; `-1` without end), `log_frequency` (kept
//! and reported; the file is written after every trace), `trace_mode` (`triton`) and
//! `trace_file`. The file is the server's choice (`trace_file` in the configuration or
//! `serve --trace-file`): a client may read it but not point it elsewhere, so no API
//! call can make the server write a file it was not told to. A model's settings
//! override the server's where given; `null` takes a setting back to the server's
//! (for a model) or to the default.
//!
//! The file is Triton's trace format, a JSON array kept valid after every trace: for
//! each traced request one object naming it (`id`, `model_name`, `model_version`) and
//! one with its `timestamps` (`REQUEST_START` when the server took it,
//! `QUEUE_START` when the scheduling engine took it in, `COMPUTE_START` when a job
//! first ran it, `COMPUTE_INPUT_END` when its last job's inputs were stacked on the
//! worker and `COMPUTE_OUTPUT_START` when that job's `Run` ended (where the worker
//! measures them: not on a remote host), `COMPUTE_END` when its last job ended, `REQUEST_END` when its answer
//! was ready), each in nanoseconds of the server's monotonic clock. A request that is
//! dropped or fails has only `REQUEST_START` and `REQUEST_END`.

use std::collections::HashMap;
use std::io::{Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use serde_json::{json, Map, Value};

/// When a request's steps happened, in nanoseconds of the scheduling engine's clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestTiming {
    /// The server took the request.
    pub request_start: u64,
    /// The scheduling engine took it in.
    pub queue_start: u64,
    /// A job first ran it (`None`: none did).
    pub compute_start: Option<u64>,
    /// Its last job ended.
    pub compute_end: u64,
    /// Its last job's inputs were stacked on the worker (after the hand-over to it and
    /// the worker taking the job up), where the worker measures it.
    pub compute_input_end: Option<u64>,
    /// Its last job's `Run` ended and the split of its outputs began, where the worker
    /// measures it.
    pub compute_output_start: Option<u64>,
    /// Its answer was ready.
    pub request_end: u64,
}

/// One level of detail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Off,
    Timestamps,
}

/// Settings in force for the server or one model.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Settings {
    level: Level,
    rate: u64,
    count: i64,
    log_frequency: u64,
}

impl Default for Settings {
    /// Triton's defaults: off, one in 1,000, no end.
    fn default() -> Self {
        Settings { level: Level::Off, rate: 1000, count: -1, log_frequency: 0 }
    }
}

/// The trace settings and the file traces go to.
#[derive(Debug, Default)]
pub struct Tracer {
    state: Mutex<State>,
    /// Whether any settings trace at all: while none does, a request is not sampled
    /// without taking the lock (tracing off costs one atomic load per request).
    on: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    file: Option<PathBuf>,
    server: Settings,
    /// Each model's overrides, as given (`None` is the server's value).
    models: HashMap<String, Overrides>,
    /// Requests seen per model since its settings last changed (for the rate).
    seen: HashMap<String, u64>,
    next_id: u64,
    writer: Option<TraceFile>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Overrides {
    level: Option<Level>,
    rate: Option<u64>,
    count: Option<i64>,
    log_frequency: Option<u64>,
}

/// A request chosen to be traced (its trace id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Traced {
    id: u64,
}

impl Tracer {
    /// A tracer writing to `file` when tracing is on (`None`: tracing cannot be turned on).
    pub fn new(file: Option<PathBuf>) -> Self {
        Tracer { state: Mutex::new(State { file, ..State::default() }), on: AtomicBool::new(false) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The settings for `model` (`None`: the server's) as Triton's extension answers them.
    pub fn settings_json(&self, model: Option<&str>) -> Value {
        let state = self.lock();
        let settings = state.effective(model);
        state.to_json(&settings)
    }

    /// Change the settings for `model` (`None`: the server's) with Triton's JSON object
    /// of settings; answers the settings now in force, or why the change is refused
    /// (nothing is changed then).
    pub fn update(&self, model: Option<&str>, changes: &Map<String, Value>) -> Result<Value, String> {
        let mut state = self.lock();
        let mut overrides = match model {
            Some(model) => state.models.get(model).cloned().unwrap_or_default(),
            None => Overrides {
                level: Some(state.server.level),
                rate: Some(state.server.rate),
                count: Some(state.server.count),
                log_frequency: Some(state.server.log_frequency),
            },
        };
        for (key, value) in changes {
            let text = setting_text(key, value)?;
            match key.as_str() {
                "trace_level" => overrides.level = text.map(|t| parse_level(&t)).transpose()?,
                "trace_rate" => overrides.rate = text.map(|t| parse_number(key, &t, 1)).transpose()?.map(|n| n as u64),
                "trace_count" => overrides.count = text.map(|t| parse_number(key, &t, -1)).transpose()?,
                "log_frequency" => overrides.log_frequency = text.map(|t| parse_number(key, &t, 0)).transpose()?.map(|n| n as u64),
                "trace_mode" => {
                    if let Some(mode) = text.filter(|m| m != "triton") {
                        return Err(format!("trace_mode {mode:?} is not supported: traces are written in Triton's format (\"triton\")"));
                    }
                }
                "trace_file" => {
                    let now = state.file.as_ref().map(|f| f.display().to_string()).unwrap_or_default();
                    if text.is_some_and(|t| t != now) {
                        return Err(
                            "trace_file is set when the server starts (trace_file in its configuration, or serve --trace-file), not through the API"
                                .into(),
                        );
                    }
                }
                other => return Err(format!("unknown trace setting {other:?}")),
            }
        }
        let turns_on = overrides.level == Some(Level::Timestamps);
        if turns_on && state.file.is_none() {
            return Err("tracing needs a trace file: start the server with trace_file in its configuration, or serve --trace-file".into());
        }
        match model {
            Some(model) => {
                state.models.insert(model.to_string(), overrides);
                state.seen.remove(model);
            }
            None => {
                let defaults = Settings::default();
                state.server = Settings {
                    level: overrides.level.unwrap_or(defaults.level),
                    rate: overrides.rate.unwrap_or(defaults.rate),
                    count: overrides.count.unwrap_or(defaults.count),
                    log_frequency: overrides.log_frequency.unwrap_or(defaults.log_frequency),
                };
                state.seen.clear();
            }
        }
        let on = state.server.level == Level::Timestamps || state.models.values().any(|o| o.level == Some(Level::Timestamps));
        self.on.store(on, Ordering::Release);
        let settings = state.effective(model);
        Ok(state.to_json(&settings))
    }

    /// Whether to trace this request to `model`: one in `trace_rate` while traces are
    /// left. Takes one of the count.
    pub fn sample(&self, model: &str) -> Option<Traced> {
        if !self.on.load(Ordering::Acquire) {
            return None;
        }
        let mut state = self.lock();
        let settings = state.effective(Some(model));
        if settings.level == Level::Off || settings.count == 0 || state.file.is_none() {
            return None;
        }
        let seen = state.seen.entry(model.to_string()).or_insert(0);
        *seen += 1;
        if !(*seen - 1).is_multiple_of(settings.rate.max(1)) {
            return None;
        }
        if settings.count > 0 {
            let left = settings.count - 1;
            match state.models.get_mut(model).filter(|o| o.count.is_some()) {
                Some(overrides) => overrides.count = Some(left),
                None => state.server.count = left,
            }
        }
        state.next_id += 1;
        Some(Traced { id: state.next_id })
    }

    /// Write a traced request's timestamps (`timing`: `None` for a request that did not
    /// complete, traced with `request_start` and `request_end` only).
    pub fn record(&self, traced: Traced, model: &str, version: &str, timing: &RequestTiming, completed: bool) {
        let mut stamps = vec![("REQUEST_START", timing.request_start)];
        if completed {
            stamps.push(("QUEUE_START", timing.queue_start));
            if let Some(start) = timing.compute_start {
                stamps.push(("COMPUTE_START", start));
                if let (Some(input_end), Some(output_start)) = (timing.compute_input_end, timing.compute_output_start) {
                    stamps.push(("COMPUTE_INPUT_END", input_end));
                    stamps.push(("COMPUTE_OUTPUT_START", output_start));
                }
                stamps.push(("COMPUTE_END", timing.compute_end));
            }
        }
        stamps.push(("REQUEST_END", timing.request_end));
        let version: Value = version.parse::<u64>().map(Value::from).unwrap_or_else(|_| Value::from(version));
        let entries = [
            json!({ "id": traced.id, "model_name": model, "model_version": version }),
            json!({ "id": traced.id, "timestamps": stamps.iter().map(|(name, ns)| json!({ "name": name, "ns": ns })).collect::<Vec<_>>() }),
        ];
        let mut state = self.lock();
        let Some(path) = state.file.clone() else { return };
        if state.writer.is_none() {
            match TraceFile::create(&path) {
                Ok(writer) => state.writer = Some(writer),
                Err(error) => {
                    tracing::warn!("trace file {}: {error}; tracing turned off", path.display());
                    state.server.level = Level::Off;
                    state.models.clear();
                    self.on.store(false, Ordering::Release);
                    return;
                }
            }
        }
        if let Err(error) = state.writer.as_mut().expect("opened above").append(&entries) {
            tracing::warn!("trace file {}: {error}", path.display());
        }
    }
}

impl State {
    fn effective(&self, model: Option<&str>) -> Settings {
        let base = self.server.clone();
        let Some(overrides) = model.and_then(|m| self.models.get(m)) else { return base };
        Settings {
            level: overrides.level.unwrap_or(base.level),
            rate: overrides.rate.unwrap_or(base.rate),
            count: overrides.count.unwrap_or(base.count),
            log_frequency: overrides.log_frequency.unwrap_or(base.log_frequency),
        }
    }

    fn to_json(&self, settings: &Settings) -> Value {
        let level = match settings.level {
            Level::Off => "OFF",
            Level::Timestamps => "TIMESTAMPS",
        };
        json!({
            "trace_file": self.file.as_ref().map(|f| f.display().to_string()).unwrap_or_default(),
            "trace_level": [level],
            "trace_rate": settings.rate.to_string(),
            "trace_count": settings.count.to_string(),
            "log_frequency": settings.log_frequency.to_string(),
            "trace_mode": "triton",
        })
    }
}

/// A setting's value as text: a string, a number, or a list of one string (Triton's
/// clients send each); `None` for `null` (back to the default).
fn setting_text(key: &str, value: &Value) -> Result<Option<String>, String> {
    match value {
        Value::Null => Ok(None),
        Value::String(text) => Ok(Some(text.clone())),
        Value::Number(n) => Ok(Some(n.to_string())),
        Value::Array(items) if key == "trace_level" => {
            let levels: Vec<&str> = items.iter().filter_map(Value::as_str).collect();
            if levels.len() != items.len() {
                return Err("trace_level must be a list of strings".into());
            }
            // OFF beside another level means that level (Triton's rule: OFF alone turns it off).
            Ok(Some(levels.iter().copied().find(|l| *l != "OFF").unwrap_or("OFF").to_string()))
        }
        Value::Array(items) if items.len() == 1 => setting_text(key, &items[0]),
        other => Err(format!("{key} must be a string, got {other}")),
    }
}

fn parse_level(text: &str) -> Result<Level, String> {
    match text {
        "OFF" => Ok(Level::Off),
        "TIMESTAMPS" => Ok(Level::Timestamps),
        "TENSORS" => Err("trace_level TENSORS is not supported: traces carry timestamps (TIMESTAMPS)".into()),
        other => Err(format!("unknown trace_level {other:?} (OFF or TIMESTAMPS)")),
    }
}

fn parse_number(key: &str, text: &str, min: i64) -> Result<i64, String> {
    text.trim().parse::<i64>().ok().filter(|n| *n >= min).ok_or_else(|| format!("{key} must be an integer of at least {min}, got {text:?}"))
}

/// The trace file: a JSON array, valid after every append.
#[derive(Debug)]
struct TraceFile {
    file: std::fs::File,
    empty: bool,
}

impl TraceFile {
    fn create(path: &std::path::Path) -> std::io::Result<TraceFile> {
        let mut file = std::fs::File::create(path)?;
        file.write_all(b"[]")?;
        Ok(TraceFile { file, empty: true })
    }

    /// Append `entries` before the closing bracket (the file is `[]` while empty, and
    /// ends in a newline and `]` after that).
    fn append(&mut self, entries: &[Value]) -> std::io::Result<()> {
        let back = if self.empty { 1 } else { 2 };
        let mut text = String::new();
        for entry in entries {
            text.push_str(if self.empty { "\n" } else { ",\n" });
            text.push_str(&entry.to_string());
            self.empty = false;
        }
        text.push_str("\n]");
        self.file.seek(SeekFrom::End(-back))?;
        self.file.write_all(text.as_bytes())?;
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> RequestTiming {
        RequestTiming {
            request_start: 10,
            queue_start: 20,
            compute_start: Some(30),
            compute_end: 40,
            request_end: 50,
            ..Default::default()
        }
    }

    #[test]
    fn traces_one_in_rate_until_the_count_and_the_file_stays_valid_json() {
        let dir = std::env::temp_dir().join(format!("yardmaster-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("trace.json");
        let tracer = Tracer::new(Some(path.clone()));
        assert!(tracer.sample("m").is_none(), "off by default");
        let changes = json!({ "trace_level": ["TIMESTAMPS"], "trace_rate": "2", "trace_count": "2" });
        let now = tracer.update(None, changes.as_object().unwrap()).unwrap();
        assert_eq!(now["trace_level"], json!(["TIMESTAMPS"]));
        let sampled: Vec<Option<Traced>> = (0..6).map(|_| tracer.sample("m")).collect();
        assert_eq!(sampled.iter().filter(|s| s.is_some()).count(), 2, "one in two, two in all: {sampled:?}");
        assert_eq!(tracer.settings_json(None)["trace_count"], "0");
        for traced in sampled.into_iter().flatten() {
            tracer.record(traced, "m", "1", &timing(), true);
        }
        let written: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let entries = written.as_array().unwrap();
        assert_eq!(entries.len(), 4);
        assert_eq!(entries[0], json!({ "id": 1, "model_name": "m", "model_version": 1 }));
        let names: Vec<&str> = entries[1]["timestamps"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END", "REQUEST_END"]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_model_overrides_the_server_and_bad_settings_change_nothing() {
        let tracer = Tracer::new(Some(std::env::temp_dir().join("never-written.json")));
        let on = json!({ "trace_level": ["TIMESTAMPS"], "trace_rate": "1" });
        tracer.update(Some("a"), on.as_object().unwrap()).unwrap();
        assert!(tracer.sample("a").is_some() && tracer.sample("b").is_none(), "only model a is traced");
        assert_eq!(tracer.settings_json(Some("a"))["trace_rate"], "1");
        assert_eq!(tracer.settings_json(None)["trace_rate"], "1000");
        for (changes, reason) in [
            (json!({ "trace_level": ["TENSORS"] }), "TENSORS is not supported"),
            (json!({ "trace_rate": "0" }), "at least 1"),
            (json!({ "trace_file": "/etc/passwd" }), "set when the server starts"),
            (json!({ "trace_mode": "opentelemetry" }), "not supported"),
            (json!({ "colour": "blue" }), "unknown trace setting"),
        ] {
            let error = tracer.update(None, changes.as_object().unwrap()).unwrap_err();
            assert!(error.contains(reason), "{error}");
        }
        let reset = json!({ "trace_level": null, "trace_rate": null });
        tracer.update(Some("a"), reset.as_object().unwrap()).unwrap();
        assert!(tracer.sample("a").is_none(), "back to the server's: off");
        let no_file = Tracer::new(None);
        assert!(no_file.update(None, on.as_object().unwrap()).unwrap_err().contains("needs a trace file"));
    }
}
