//! How a worker group's events reach the executor. Workers of a remote host send theirs
//! over the network, and an event pump thread reads them off a channel; workers of this
//! process hand theirs straight to the executor's handler on their own thread
//! ([`EventRelay`]), which saves a thread hand-over (a wake-up of the pump) on every
//! job.
//!
//! A pool is made before the executor that handles its events, so the relay keeps the
//! events that come before the handler is bound (none, usually: workers start when the
//! executor provisions them) and hands them over in order when it is.

use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use yardmaster_dataplane::{EventHandler, EventSink, WorkerEvent};

/// Where a group's worker events come from.
#[derive(Debug)]
pub enum GroupEvents {
    /// A channel, read by an event pump thread (a remote host's workers).
    Channel(Receiver<WorkerEvent>),
    /// The workers' own threads, through the relay their pool sends to.
    Direct(EventRelay),
}

impl From<Receiver<WorkerEvent>> for GroupEvents {
    fn from(receiver: Receiver<WorkerEvent>) -> Self {
        GroupEvents::Channel(receiver)
    }
}

/// Events handled on the thread that sends them, once a handler is bound; until then
/// they wait, in order.
#[derive(Clone, Default)]
pub struct EventRelay(Arc<Mutex<RelayState>>);

#[derive(Default)]
struct RelayState {
    handler: Option<EventHandler>,
    waiting: Vec<WorkerEvent>,
}

impl std::fmt::Debug for EventRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state();
        f.debug_struct("EventRelay").field("bound", &state.handler.is_some()).field("waiting", &state.waiting.len()).finish()
    }
}

impl EventRelay {
    /// A relay with no handler yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The sink to give the workers' pool.
    pub fn sink(&self) -> EventSink {
        let relay = self.clone();
        EventSink::handler(move |event| relay.deliver(event))
    }

    /// Handle every event with `handler` from now on, those that waited first (in the
    /// order they came).
    pub fn bind(&self, handler: EventHandler) {
        // The lock is held while the waiting events are handled, so an event sent
        // meanwhile waits for them rather than passing them.
        let mut state = self.state();
        for event in std::mem::take(&mut state.waiting) {
            handler(event);
        }
        state.handler = Some(handler);
    }

    fn deliver(&self, event: WorkerEvent) {
        let handler = {
            let mut state = self.state();
            match &state.handler {
                Some(handler) => Arc::clone(handler),
                None => {
                    state.waiting.push(event);
                    return;
                }
            }
        };
        handler(event);
    }

    fn state(&self) -> std::sync::MutexGuard<'_, RelayState> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_before_the_handler_wait_and_come_first_in_order() {
        let relay = EventRelay::new();
        let sink = relay.sink();
        for worker in [1, 2] {
            assert!(sink.send(WorkerEvent::Retired { worker }));
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        relay.bind(Arc::new(move |event| {
            if let WorkerEvent::Retired { worker } = event {
                record.lock().unwrap().push(worker);
            }
        }));
        assert_eq!(*seen.lock().unwrap(), vec![1, 2], "the waiting events are handled at the bind");
        assert!(sink.send(WorkerEvent::Retired { worker: 3 }));
        assert_eq!(*seen.lock().unwrap(), vec![1, 2, 3], "later events are handled as they are sent");
    }
}
