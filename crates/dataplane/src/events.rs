//! Where workers' events go: an [`EventSink`] is either a channel, read by a thread of
//! the caller's (an event pump, a test), or a handler called on the worker's own thread
//! as soon as the event happens, which saves a thread hand-over per job for callers
//! whose handling is light (the server claims the job, moves a few tensors and tells
//! its engine).

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;

use crate::worker::WorkerEvent;

/// A function that handles one worker event, on the thread of the worker it is about.
pub type EventHandler = Arc<dyn Fn(WorkerEvent) + Send + Sync>;

/// Where a worker sends its events. Cloning it gives another sender to the same place.
#[derive(Clone)]
pub enum EventSink {
    /// Sent on a channel.
    Channel(Sender<WorkerEvent>),
    /// Handled on the worker's thread.
    Handler(EventHandler),
}

impl EventSink {
    /// A sink whose events arrive on the returned receiver.
    pub fn channel() -> (EventSink, Receiver<WorkerEvent>) {
        let (sender, receiver) = mpsc::channel();
        (EventSink::Channel(sender), receiver)
    }

    /// A sink that calls `handler` with each event, on the worker's thread.
    pub fn handler(handler: impl Fn(WorkerEvent) + Send + Sync + 'static) -> EventSink {
        EventSink::Handler(Arc::new(handler))
    }

    /// Deliver `event`; false when no one listens any more (a channel whose receiver
    /// is gone: the event is dropped).
    pub fn send(&self, event: WorkerEvent) -> bool {
        match self {
            EventSink::Channel(sender) => sender.send(event).is_ok(),
            EventSink::Handler(handler) => {
                handler(event);
                true
            }
        }
    }
}

impl From<Sender<WorkerEvent>> for EventSink {
    fn from(sender: Sender<WorkerEvent>) -> Self {
        EventSink::Channel(sender)
    }
}

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EventSink::Channel(_) => f.write_str("EventSink::Channel"),
            EventSink::Handler(_) => f.write_str("EventSink::Handler"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn a_channel_delivers_to_its_receiver_and_a_handler_on_the_sending_thread() {
        let (sink, receiver) = EventSink::channel();
        assert!(sink.send(WorkerEvent::Retired { worker: 3 }));
        assert!(matches!(receiver.try_recv(), Ok(WorkerEvent::Retired { worker: 3 })));
        drop(receiver);
        assert!(!sink.send(WorkerEvent::Retired { worker: 4 }), "no one listens");

        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        let sink = EventSink::handler(move |event| {
            if let WorkerEvent::Retired { worker } = event {
                record.lock().unwrap().push((worker, std::thread::current().id()));
            }
        });
        let other = sink.clone();
        let thread = std::thread::spawn(move || {
            assert!(other.send(WorkerEvent::Retired { worker: 5 }));
            std::thread::current().id()
        })
        .join()
        .unwrap();
        assert!(sink.send(WorkerEvent::Retired { worker: 6 }));
        assert_eq!(*seen.lock().unwrap(), vec![(5, thread), (6, std::thread::current().id())]);
    }
}
