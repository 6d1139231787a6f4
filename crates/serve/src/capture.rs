//! Trace capture while serving: every arrival, batch and completion the engine sees,
//! written in the simulator's JSON-lines trace format ([`yardmaster_formats::trace`]), so any
//! policy can be replayed against real traffic
//! (`yardmaster sim compare --workload trace:FILE --policies X.wasm`).
//!
//! The recorder lives with the engine and is fed by its turns. Writing never
//! stands in the way of serving: when a write fails (a full disk, a closed pipe) the
//! recorder says so once in the log — with how many records reached the sink whole —
//! stops capturing, and requests go on as before. Records are buffered and pushed to
//! the sink at every turn of the actor loop ([`Recorder::flush`]), so a failure shows
//! at the latest one turn after the record that met it.

use std::io::Write;

use yardmaster_engine::{Clock, Ended, Engine, Executor, JobResult};
use yardmaster_formats::trace::{ArrivalRecord, BatchRecord, TraceHeader, TraceRecord, TraceWriter};

/// Where a capture goes.
pub type CaptureSink = Box<dyn Write + Send>;

/// Writes the trace of a serving engine; see the module docs.
pub struct Recorder {
    writer: Option<TraceWriter<CaptureSink>>,
    name: String,
    records: u64,
    flushed: u64,
    stopped: Option<String>,
}

impl Recorder {
    /// Start a trace on `sink` (its header written at once), named `name` in log lines.
    pub fn start(sink: CaptureSink, name: &str) -> std::io::Result<Recorder> {
        let started_at_unix_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let header = TraceHeader::new(format!("yardmaster serve ({name})"), started_at_unix_ms);
        let writer = TraceWriter::new(sink, &header)?;
        Ok(Recorder { writer: Some(writer), name: name.to_string(), records: 0, flushed: 0, stopped: None })
    }

    /// Whether it still writes (false after a write error).
    pub fn active(&self) -> bool {
        self.writer.is_some()
    }

    /// Records written so far (some may still be buffered).
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Records known to be whole in the sink: those written before its last
    /// successful flush.
    pub fn flushed(&self) -> u64 {
        self.flushed
    }

    /// Why it stopped, once a write failed.
    pub fn stopped(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// Request `id` was just submitted to `engine`.
    pub fn arrival<C: Clock, X: Executor>(&mut self, engine: &Engine<C, X>, id: u64, input_size: u32, expected_tokens: u32) {
        if self.writer.is_none() {
            return;
        }
        let state = engine.state();
        let Some(origin) = state.origins().get(&id) else { return };
        let entry = state.pipeline().streams.get(origin.stream as usize).map_or(0, |s| s.entry);
        self.write(TraceRecord::Arrival(ArrivalRecord {
            at: origin.sent_at,
            id,
            stream: origin.stream,
            stage: entry,
            deadline: origin.deadline,
            input_size,
            expected_tokens,
        }));
    }

    /// A job finished on a worker of `engine` (call before the engine takes it).
    pub fn batch<C: Clock, X: Executor>(&mut self, engine: &Engine<C, X>, result: &JobResult) {
        if self.writer.is_none() {
            return;
        }
        let state = engine.state();
        let worker = state.workers().get(&result.worker);
        self.write(TraceRecord::Batch(BatchRecord {
            at: state.now().saturating_sub(result.duration),
            worker: result.worker,
            stage: worker.map_or(0, |w| w.info.stage),
            variant: worker.map_or(0, |w| w.info.variant),
            requests: result.items.iter().map(|i| i.id).collect(),
            duration: result.duration,
        }));
    }

    /// A request ended.
    pub fn ended(&mut self, end: &Ended) {
        if self.writer.is_some() {
            self.write(TraceRecord::Completion(end.clone().into()));
        }
    }

    /// Push what is buffered to the sink.
    pub fn flush(&mut self) {
        if let Some(writer) = &mut self.writer {
            match writer.flush() {
                Ok(()) => self.flushed = self.records,
                Err(error) => self.fail(&error),
            }
        }
    }

    fn write(&mut self, record: TraceRecord) {
        let Some(writer) = &mut self.writer else { return };
        match writer.write(&record) {
            Ok(()) => self.records += 1,
            Err(error) => self.fail(&error),
        }
    }

    fn fail(&mut self, error: &std::io::Error) {
        let reason = format!("{error}");
        tracing::error!(
            "trace capture {} stopped: {reason}; {} records reached it whole, {} more did not; serving goes on without it",
            self.name,
            self.flushed,
            self.records - self.flushed
        );
        self.stopped = Some(reason);
        // Dropped, the buffered writer tries once more to write what it holds and
        // ignores the outcome; nothing is written after that.
        self.writer = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yardmaster_engine::metrics::Outcome;
    use yardmaster_engine::Ended;

    /// A sink that takes `room` bytes and then fails like a full disk.
    struct Full {
        room: usize,
    }

    impl Write for Full {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if buf.len() > self.room {
                return Err(std::io::Error::other("no space left on device"));
            }
            self.room -= buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_failing_sink_stops_the_capture_and_nothing_else() {
        let mut recorder = Recorder::start(Box::new(Full { room: 100_000 }), "t").unwrap();
        let end = Ended {
            id: 1,
            outcome: Outcome::Dropped { reason: "late".repeat(40_000) },
            at: 5,
            sent_at: 0,
            deadline: 0,
            arrived_at: 0,
            first_job_at: None,
        };
        recorder.ended(&Ended { id: 0, outcome: Outcome::Completed, at: 1, sent_at: 0, deadline: 0, arrived_at: 0, first_job_at: None });
        recorder.flush();
        assert_eq!((recorder.records(), recorder.flushed()), (1, 1));
        recorder.ended(&end);
        recorder.flush();
        assert!(!recorder.active(), "a write past the room stops the recorder");
        assert_eq!(recorder.stopped(), Some("no space left on device"));
        assert_eq!((recorder.records(), recorder.flushed()), (1, 1), "the record that met the full sink is not counted");
        recorder.ended(&end);
        recorder.flush();
        assert!(!recorder.active());
        assert_eq!(recorder.records(), 1, "nothing is written once stopped");
    }

    #[test]
    fn records_are_counted() {
        let mut recorder = Recorder::start(Box::new(Vec::new()), "t").unwrap();
        recorder.ended(&Ended { id: 1, outcome: Outcome::Completed, at: 5, sent_at: 0, deadline: 0, arrived_at: 0, first_job_at: None });
        recorder.ended(&Ended {
            id: 2,
            outcome: Outcome::Failed { error: "x".into() },
            at: 6,
            sent_at: 0,
            deadline: 0,
            arrived_at: 0,
            first_job_at: None,
        });
        recorder.flush();
        assert!(recorder.active());
        assert_eq!(recorder.records(), 2);
    }
}
