//! Yardmaster's own trace format: JSON lines that the live server writes when it
//! captures traffic and that the simulator replays.
//!
//! One JSON object per line, tagged by `"kind"`. The first line is the header:
//!
//! ```text
//! {"kind":"header","version":1,"source":"...","started_at_unix_ms":N}
//! {"kind":"arrival","at":NS,"id":N,"stream":S,"stage":ST,"deadline":NS,"input_size":N,"expected_tokens":N}
//! {"kind":"batch","at":NS,"worker":W,"stage":ST,"variant":V,"requests":[ids],"duration":NS}
//! {"kind":"completion","at":NS,"id":N,"outcome":"completed"|"dropped"|"failed","reason":"..."}
//! ```
//!
//! Times (`at`, `deadline`, `duration`) are nanoseconds from the start of the run;
//! `reason` is optional. A request arrives once per stage it visits; its first
//! arrival is its entry into the system. Unknown fields are ignored, so version 1
//! can grow optional fields; anything incompatible needs a new version, and readers
//! refuse versions they do not know.

use std::collections::HashSet;
use std::io::{self, BufRead, BufWriter, Lines, Write};

use serde::{Deserialize, Serialize};

use super::workload::Arrival;

/// The trace format version this build writes and reads.
pub const TRACE_VERSION: u64 = 1;

/// The first line of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename = "header")]
pub struct TraceHeader {
    /// Format version ([`TRACE_VERSION`]).
    pub version: u64,
    /// What produced the trace (e.g. the server and its configuration).
    pub source: String,
    /// Wall-clock time of the start of the run (time 0 of the records), Unix ms.
    pub started_at_unix_ms: u64,
}

impl TraceHeader {
    /// A header of the current version.
    pub fn new(source: impl Into<String>, started_at_unix_ms: u64) -> Self {
        Self { version: TRACE_VERSION, source: source.into(), started_at_unix_ms }
    }
}

/// A request arriving at a stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrivalRecord {
    /// When, in ns from the start of the run.
    pub at: u64,
    /// Request id.
    pub id: u64,
    /// Stream (application) of the request.
    pub stream: u32,
    /// Stage it arrives at.
    pub stage: u32,
    /// Its deadline, in ns from the start of the run.
    pub deadline: u64,
    /// Input size (prompt tokens for an LLM).
    pub input_size: u32,
    /// Tokens it is expected to generate (0 if unknown).
    pub expected_tokens: u32,
}

/// A batch dispatched to a worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchRecord {
    /// When it started, in ns from the start of the run.
    pub at: u64,
    /// Worker that ran it.
    pub worker: u32,
    /// Stage of the worker.
    pub stage: u32,
    /// Model variant the worker ran.
    pub variant: u32,
    /// Ids of the requests in the batch.
    pub requests: Vec<u64>,
    /// How long it ran, in ns.
    pub duration: u64,
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It was served.
    Completed,
    /// It was dropped (e.g. by the policy, or past its deadline).
    Dropped,
    /// Serving it failed.
    Failed,
}

/// A request ending.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompletionRecord {
    /// When, in ns from the start of the run.
    pub at: u64,
    /// Request id.
    pub id: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// Why, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl From<yardmaster_engine::Ended> for CompletionRecord {
    fn from(end: yardmaster_engine::Ended) -> Self {
        use yardmaster_engine::metrics::Outcome as Ended;
        let (outcome, reason) = match end.outcome {
            Ended::Completed => (Outcome::Completed, None),
            Ended::Dropped { reason } => (Outcome::Dropped, Some(reason)),
            Ended::Failed { error } => (Outcome::Failed, Some(error)),
        };
        CompletionRecord { at: end.at, id: end.id, outcome, reason }
    }
}

/// One record after the header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TraceRecord {
    /// A request arriving at a stage.
    Arrival(ArrivalRecord),
    /// A batch dispatched to a worker.
    Batch(BatchRecord),
    /// A request ending.
    Completion(CompletionRecord),
}

impl TraceRecord {
    /// When the record happened, in ns from the start of the run.
    pub fn at(&self) -> u64 {
        match self {
            Self::Arrival(r) => r.at,
            Self::Batch(r) => r.at,
            Self::Completion(r) => r.at,
        }
    }
}

/// What went wrong reading a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceErrorKind {
    /// The underlying reader failed.
    #[error("read failed: {0}")]
    Io(#[from] io::Error),
    /// A line is not a valid record.
    #[error("malformed record: {0}")]
    Json(#[from] serde_json::Error),
    /// The first line is not a header.
    #[error("missing header: a trace must start with {{\"kind\":\"header\",\"version\":{TRACE_VERSION},...}}, but {0}")]
    MissingHeader(String),
    /// The header names a version this build cannot read.
    #[error("unsupported trace version {0} (this build reads version {TRACE_VERSION})")]
    UnsupportedVersion(u64),
    /// An entry arrival is earlier than the one before it.
    #[error("arrival at {at} ns is before the previous arrival at {previous} ns")]
    OutOfOrder {
        /// Time of the offending arrival.
        at: u64,
        /// Time of the arrival before it.
        previous: u64,
    },
}

/// An error reading a trace, with the (1-based) line it concerns.
#[derive(Debug, thiserror::Error)]
#[error("trace line {line}: {kind}")]
pub struct TraceError {
    /// Line number, from 1 (the header).
    pub line: usize,
    /// What went wrong.
    pub kind: TraceErrorKind,
}

impl TraceError {
    fn new(line: usize, kind: impl Into<TraceErrorKind>) -> Self {
        Self { line, kind: kind.into() }
    }
}

/// Writes a trace: the header on creation, then one record per line (buffered; call
/// [`TraceWriter::flush`] or [`TraceWriter::into_inner`] to see write errors).
#[derive(Debug)]
pub struct TraceWriter<W: Write> {
    out: BufWriter<W>,
}

impl<W: Write> TraceWriter<W> {
    /// Start a trace on `inner` with `header`.
    pub fn new(inner: W, header: &TraceHeader) -> io::Result<Self> {
        let mut writer = Self { out: BufWriter::new(inner) };
        writer.write_line(header)?;
        Ok(writer)
    }

    /// Append a record.
    pub fn write(&mut self, record: &TraceRecord) -> io::Result<()> {
        self.write_line(record)
    }

    /// Push buffered lines to the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Flush and give back the underlying writer.
    pub fn into_inner(self) -> io::Result<W> {
        self.out.into_inner().map_err(io::IntoInnerError::into_error)
    }

    fn write_line(&mut self, value: &impl Serialize) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, value)?;
        self.out.write_all(b"\n")
    }
}

/// Reads a trace: checks the header on creation, then yields the records, each error
/// naming its line. Blank lines are skipped. After a read error it yields nothing
/// more; after a malformed line it goes on with the next.
#[derive(Debug)]
pub struct TraceReader<R> {
    lines: Lines<R>,
    /// Number of the last line read.
    line: usize,
    header: TraceHeader,
    failed: bool,
}

impl<R: BufRead> TraceReader<R> {
    /// Read and check the header (it must be the first line, of version
    /// [`TRACE_VERSION`]).
    pub fn new(reader: R) -> Result<Self, TraceError> {
        let mut lines = reader.lines();
        let (line, text) = match next_non_blank(&mut lines, 0) {
            Some((line, Ok(text))) => (line, text),
            Some((line, Err(e))) => return Err(TraceError::new(line, e)),
            None => return Err(TraceError::new(1, TraceErrorKind::MissingHeader("the trace is empty".into()))),
        };
        let header = parse_header(&text).map_err(|kind| TraceError::new(line, kind))?;
        Ok(Self { lines, line, header, failed: false })
    }

    /// The trace's header.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// Number of the last line read (1 after the header).
    pub fn line(&self) -> usize {
        self.line
    }
}

impl<R: BufRead> Iterator for TraceReader<R> {
    type Item = Result<TraceRecord, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let (line, text) = next_non_blank(&mut self.lines, self.line)?;
        self.line = line;
        Some(match text {
            Ok(text) => serde_json::from_str(&text).map_err(|e| TraceError::new(line, e)),
            Err(e) => {
                self.failed = true;
                Err(TraceError::new(line, e))
            }
        })
    }
}

/// The next line that is not blank, with its number (`after` is the last number).
fn next_non_blank<R: BufRead>(lines: &mut Lines<R>, after: usize) -> Option<(usize, io::Result<String>)> {
    let mut line = after;
    for text in lines {
        line += 1;
        if !text.as_ref().is_ok_and(|t| t.trim().is_empty()) {
            return Some((line, text));
        }
    }
    None
}

/// Parse and check a header line.
fn parse_header(text: &str) -> Result<TraceHeader, TraceErrorKind> {
    let value: serde_json::Value = serde_json::from_str(text)?;
    match value.get("kind").and_then(serde_json::Value::as_str) {
        Some("header") => {}
        Some(kind) => return Err(TraceErrorKind::MissingHeader(format!("the first record has kind {kind:?}"))),
        None => return Err(TraceErrorKind::MissingHeader("the first line has no \"kind\"".into())),
    }
    match value.get("version").and_then(serde_json::Value::as_u64) {
        Some(TRACE_VERSION) => Ok(serde_json::from_value(value)?),
        Some(version) => Err(TraceErrorKind::UnsupportedVersion(version)),
        None => Err(TraceErrorKind::MissingHeader("the header has no numeric \"version\"".into())),
    }
}

/// The entry arrivals of a trace (see [`arrivals_from_trace`]).
#[derive(Debug)]
pub struct TraceArrivals<R> {
    reader: TraceReader<R>,
    /// Ids whose entry arrival has been seen.
    seen: HashSet<u64>,
    previous: u64,
    /// When the first request arrived: a replay starts there.
    origin: Option<u64>,
}

/// The workload a trace recorded: each request's first arrival record (its entry
/// stage), as an [`Arrival`], in the trace's order, timed from the first request's
/// arrival — the idle time a capture holds before its first request (a server up
/// before any client) is not replayed, so rates per second are the traffic's own.
/// Other records are skipped; malformed lines and entry arrivals earlier than the
/// previous one are errors (with their line numbers).
pub fn arrivals_from_trace<R: BufRead>(reader: TraceReader<R>) -> TraceArrivals<R> {
    TraceArrivals { reader, seen: HashSet::new(), previous: 0, origin: None }
}

impl<R: BufRead> Iterator for TraceArrivals<R> {
    type Item = Result<Arrival, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let record = match self.reader.next()? {
                Ok(TraceRecord::Arrival(record)) if self.seen.insert(record.id) => record,
                Ok(_) => continue,
                Err(e) => return Some(Err(e)),
            };
            if record.at < self.previous {
                let kind = TraceErrorKind::OutOfOrder { at: record.at, previous: self.previous };
                return Some(Err(TraceError::new(self.reader.line(), kind)));
            }
            self.previous = record.at;
            let origin = *self.origin.get_or_insert(record.at);
            return Some(Ok(Arrival {
                at: record.at - origin,
                stream: record.stream,
                input_size: record.input_size,
                expected_tokens: record.expected_tokens,
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(at: u64, id: u64, stage: u32) -> TraceRecord {
        TraceRecord::Arrival(ArrivalRecord {
            at,
            id,
            stream: (id % 3) as u32,
            stage,
            deadline: at + 100,
            input_size: 10 * id as u32,
            expected_tokens: id as u32,
        })
    }

    fn sample_records() -> Vec<TraceRecord> {
        vec![
            arrival(5, 1, 0),
            arrival(7, 2, 0),
            TraceRecord::Batch(BatchRecord { at: 8, worker: 3, stage: 0, variant: 1, requests: vec![1, 2], duration: 40 }),
            arrival(48, 1, 2),
            TraceRecord::Completion(CompletionRecord { at: 60, id: 2, outcome: Outcome::Dropped, reason: Some("late".into()) }),
            TraceRecord::Completion(CompletionRecord { at: 90, id: 1, outcome: Outcome::Completed, reason: None }),
            arrival(95, 3, 0),
        ]
    }

    fn write_trace(records: &[TraceRecord]) -> String {
        let mut writer = TraceWriter::new(Vec::new(), &TraceHeader::new("test", 1_700_000_000_000)).unwrap();
        for record in records {
            writer.write(record).unwrap();
        }
        String::from_utf8(writer.into_inner().unwrap()).unwrap()
    }

    fn read_all(text: &str) -> Result<Vec<TraceRecord>, TraceError> {
        TraceReader::new(text.as_bytes())?.collect()
    }

    fn error_of(text: &str) -> TraceError {
        match TraceReader::new(text.as_bytes()) {
            Err(e) => e,
            Ok(mut reader) => reader.find_map(Result::err).expect("an error"),
        }
    }

    const HEADER: &str = r#"{"kind":"header","version":1,"source":"t","started_at_unix_ms":0}"#;

    #[test]
    fn writes_the_documented_format() {
        let text = write_trace(&sample_records());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], r#"{"kind":"header","version":1,"source":"test","started_at_unix_ms":1700000000000}"#);
        assert_eq!(lines[1], r#"{"kind":"arrival","at":5,"id":1,"stream":1,"stage":0,"deadline":105,"input_size":10,"expected_tokens":1}"#);
        assert_eq!(lines[3], r#"{"kind":"batch","at":8,"worker":3,"stage":0,"variant":1,"requests":[1,2],"duration":40}"#);
        assert_eq!(lines[5], r#"{"kind":"completion","at":60,"id":2,"outcome":"dropped","reason":"late"}"#);
        assert_eq!(lines[6], r#"{"kind":"completion","at":90,"id":1,"outcome":"completed"}"#);
        assert_eq!(lines.len(), 8);
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn round_trips() {
        let records = sample_records();
        let text = write_trace(&records);
        let reader = TraceReader::new(text.as_bytes()).unwrap();
        assert_eq!(reader.header(), &TraceHeader::new("test", 1_700_000_000_000));
        assert_eq!(reader.collect::<Result<Vec<_>, _>>().unwrap(), records);
    }

    #[test]
    fn reads_optional_and_extra_fields_and_blank_lines() {
        let text = format!(
            "\n{HEADER}\n\n{}\n{}\n",
            r#"{"kind":"completion","at":1,"id":4,"outcome":"failed","reason":null,"extra":true}"#,
            r#"{"kind":"completion","at":2,"id":5,"outcome":"completed"}"#
        );
        let records = read_all(&text).unwrap();
        assert_eq!(
            records,
            [
                TraceRecord::Completion(CompletionRecord { at: 1, id: 4, outcome: Outcome::Failed, reason: None }),
                TraceRecord::Completion(CompletionRecord { at: 2, id: 5, outcome: Outcome::Completed, reason: None }),
            ]
        );
        assert_eq!(records.iter().map(TraceRecord::at).collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn refuses_missing_header() {
        for (text, expected) in [
            ("", "trace line 1: missing header: a trace must start with"),
            ("\n\n", "the trace is empty"),
            (r#"{"kind":"arrival","at":1}"#, "trace line 1: missing header: a trace must start with {\"kind\":\"header\""),
            (r#"{"version":1}"#, "the first line has no \"kind\""),
            (r#"{"kind":"header","source":"x","started_at_unix_ms":0}"#, "the header has no numeric \"version\""),
            ("not json", "trace line 1: malformed record"),
        ] {
            let message = TraceReader::new(text.as_bytes()).unwrap_err().to_string();
            assert!(message.contains(expected), "{text:?}: {message}");
        }
        let error = TraceReader::new(r#"{"kind":"arrival","at":1}"#.as_bytes()).unwrap_err();
        assert!(error.to_string().contains("the first record has kind \"arrival\""), "{error}");
    }

    #[test]
    fn refuses_unknown_version() {
        let error = TraceReader::new("\n{\"kind\":\"header\",\"version\":2}\n".as_bytes()).unwrap_err();
        assert_eq!(error.line, 2);
        assert!(matches!(error.kind, TraceErrorKind::UnsupportedVersion(2)));
        assert_eq!(error.to_string(), "trace line 2: unsupported trace version 2 (this build reads version 1)");
    }

    #[test]
    fn refuses_malformed_header_fields() {
        let error = TraceReader::new(r#"{"kind":"header","version":1,"source":3}"#.as_bytes()).unwrap_err();
        assert!(matches!(error.kind, TraceErrorKind::Json(_)), "{error}");
    }

    #[test]
    fn malformed_lines_name_their_line_and_reading_goes_on() {
        let text = format!(
            "{HEADER}\n{}\n{{oops\n\n{}\n{}\n{}\n{}\n",
            r#"{"kind":"completion","at":1,"id":4,"outcome":"completed"}"#,
            r#"{"kind":"arrival","at":1}"#,
            r#"{"kind":"completion","at":1,"id":4,"outcome":"lost"}"#,
            r#"{"kind":"teleport","at":1}"#,
            r#"{"kind":"header","version":1,"source":"again","started_at_unix_ms":0}"#,
        );
        let results: Vec<Result<TraceRecord, TraceError>> = TraceReader::new(text.as_bytes()).unwrap().collect();
        assert_eq!(results.len(), 6);
        assert!(results[0].is_ok());
        let errors: Vec<(usize, String)> = results[1..].iter().map(|r| r.as_ref().unwrap_err()).map(|e| (e.line, e.to_string())).collect();
        let expected = [
            (3, "malformed record"),
            (5, "missing field `id`"),
            (6, "unknown variant `lost`"),
            (7, "unknown variant `teleport`"),
            (8, "unknown variant `header`"),
        ];
        for ((line, message), (expected_line, needle)) in errors.iter().zip(expected) {
            assert_eq!(*line, expected_line, "{message}");
            assert!(message.starts_with(&format!("trace line {expected_line}: ")), "{message}");
            assert!(message.contains(needle), "{message}");
        }
    }

    #[test]
    fn wrong_types_are_malformed() {
        let text = format!("{HEADER}\n{}\n", r#"{"kind":"batch","at":-1,"worker":0,"stage":0,"variant":0,"requests":[],"duration":0}"#);
        let error = error_of(&text);
        assert_eq!(error.line, 2);
        assert!(matches!(error.kind, TraceErrorKind::Json(_)), "{error}");
    }

    /// A reader that fails after its first chunk.
    struct FailingReader {
        data: &'static [u8],
    }

    impl io::Read for FailingReader {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.data.is_empty() {
                return Err(io::Error::other("disk on fire"));
            }
            let n = self.data.len().min(buf.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn read_errors_stop_the_reader() {
        let data = b"{\"kind\":\"header\",\"version\":1,\"source\":\"t\",\"started_at_unix_ms\":0}\n";
        let reader = TraceReader::new(io::BufReader::new(FailingReader { data })).unwrap();
        let results: Vec<_> = reader.collect();
        assert_eq!(results.len(), 1);
        let error = results[0].as_ref().unwrap_err();
        assert_eq!(error.line, 2);
        assert!(error.to_string().contains("disk on fire"), "{error}");
    }

    #[test]
    fn arrivals_are_each_ids_first_arrival_from_the_first_request_on() {
        let text = write_trace(&sample_records());
        let arrivals: Vec<Arrival> = arrivals_from_trace(TraceReader::new(text.as_bytes()).unwrap()).collect::<Result<_, _>>().unwrap();
        // Recorded at 5, 7 and 95 ns: the 5 ns before the first request are not replayed.
        assert_eq!(
            arrivals,
            [
                Arrival { at: 0, stream: 1, input_size: 10, expected_tokens: 1 },
                Arrival { at: 2, stream: 2, input_size: 20, expected_tokens: 2 },
                Arrival { at: 90, stream: 0, input_size: 30, expected_tokens: 3 },
            ]
        );
    }

    #[test]
    fn arrivals_report_errors_and_disorder_with_line_numbers() {
        let records = [arrival(10, 1, 0), arrival(4, 2, 0), arrival(12, 3, 0), arrival(3, 1, 1)];
        let mut text = write_trace(&records);
        text.push_str("{\"kind\":\"arrival\"}\n");
        let results: Vec<_> = arrivals_from_trace(TraceReader::new(text.as_bytes()).unwrap()).collect();
        assert_eq!(results.len(), 4);
        assert_eq!(results[0].as_ref().unwrap().at, 0, "timed from the first request");
        let disorder = results[1].as_ref().unwrap_err();
        assert_eq!(disorder.line, 3);
        assert!(matches!(disorder.kind, TraceErrorKind::OutOfOrder { at: 4, previous: 10 }), "{disorder}");
        // The later stage's arrival of id 1 (at 3) is not an entry, so not out of order.
        assert_eq!(results[2].as_ref().unwrap().at, 2);
        assert_eq!(results[3].as_ref().unwrap_err().line, 6);
    }

    #[test]
    fn synthetic_workload_round_trips_through_a_trace() {
        use super::super::workload::{Sizes, SyntheticSpec};
        let workload: Vec<Arrival> =
            SyntheticSpec::bursty(200.0, 1.5, 5_000_000_000).build(3).unwrap().with_sizes(Sizes::azure_code()).collect();
        let records: Vec<TraceRecord> = workload
            .iter()
            .enumerate()
            .map(|(id, a)| {
                TraceRecord::Arrival(ArrivalRecord {
                    at: a.at,
                    id: id as u64,
                    stream: a.stream,
                    stage: 0,
                    deadline: a.at + 1,
                    input_size: a.input_size,
                    expected_tokens: a.expected_tokens,
                })
            })
            .collect();
        let text = write_trace(&records);
        let replayed: Vec<Arrival> = arrivals_from_trace(TraceReader::new(text.as_bytes()).unwrap()).collect::<Result<_, _>>().unwrap();
        let first = workload[0].at;
        let shifted: Vec<Arrival> = workload.iter().map(|a| Arrival { at: a.at - first, ..*a }).collect();
        assert_eq!(replayed, shifted);
    }

    #[test]
    fn write_errors_surface() {
        struct Full;
        impl Write for Full {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::other("full"))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut writer = TraceWriter::new(Full, &TraceHeader::new("x", 0)).unwrap();
        assert!(writer.flush().is_err());
    }
}
