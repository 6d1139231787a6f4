//! Request data while it is served: what a client sent, as it is turned stage by stage
//! into what the client gets back, kept where the backend and the executor both reach
//! it.
//!
//! The engine moves ids, never tensors. The backend parks a request's [`Payload`] in
//! the [`PayloadStore`] under the request's id (in the actor's `admitted` callback,
//! before any policy decision), the executor reads it to build each stage's model
//! inputs and writes each stage's findings back into it, and the backend takes it out
//! again when the request ends. In a chain pipeline the engine keeps one id per client
//! request from the entry stage to the last, so one entry per request is enough.
//!
//! Each entry has a lock of its own: the map's lock is held only to find an entry, so
//! post-processing one request's outputs never blocks another request, and never the
//! engine's turn.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use yardmaster_dataplane::ocr::cls::Direction;
use yardmaster_dataplane::ocr::det::TextBox;
use yardmaster_dataplane::ocr::{RgbImage, TextLine};
use yardmaster_dataplane::{SequenceStep, Tensor};

/// One request's data.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// A text-recognition request: an image, then its text boxes and crops, then its
    /// lines of text.
    Ocr(OcrDocument),
    /// A request of a tensor pipeline: the tensors the next stage takes (after the
    /// last stage, the outputs).
    Tensors(Vec<Tensor>),
    /// A request of an ensemble: its tensors by the ensemble's names — its inputs, then
    /// each step's outputs as the step's `output_map` names them.
    Named(std::collections::BTreeMap<String, Tensor>),
}

/// An image going through detection → direction classification → recognition.
#[derive(Debug, Clone, PartialEq)]
pub struct OcrDocument {
    /// The image.
    pub image: RgbImage,
    /// Text boxes found by detection, in reading order.
    pub boxes: Vec<TextBox>,
    /// One upright crop per box (turned by classification where it was upside down).
    pub crops: Vec<RgbImage>,
    /// Classification's verdict per crop.
    pub directions: Vec<Direction>,
    /// The lines read by recognition (those above the text-score threshold).
    pub lines: Vec<TextLine>,
}

impl OcrDocument {
    /// A document holding only its image.
    pub fn new(image: RgbImage) -> Self {
        Self { image, boxes: Vec::new(), crops: Vec::new(), directions: Vec::new(), lines: Vec::new() }
    }
}

/// Model inputs made ahead of time for one stage: one entry per batch element, each
/// one tensor per model input (without the batch dimension).
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    /// The stage they are for.
    pub stage: u32,
    /// The batch elements.
    pub elements: Vec<Vec<Tensor>>,
}

/// A payload with the inputs of its next stage, when they were made ahead (by the
/// backend for the entry stage, by the worker-event handlers for the following ones),
/// so the engine's turn only moves tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct Parcel {
    /// The request's data.
    pub payload: Payload,
    /// Inputs of the next stage, if already made.
    pub prepared: Option<Prepared>,
    /// The request's place in a stateful sequence, for the worker that holds the
    /// sequence's state (a model with a sequence batcher).
    pub sequence: Option<SequenceStep>,
    /// Where the last job that ran the request spent its time (for its trace).
    pub last_job: Option<JobSpans>,
}

/// When a job was handed to its worker and where its time went there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobSpans {
    /// The job was handed over to the worker.
    pub handed: std::time::Instant,
    /// The worker's own measure: the wait before taking the job up, stacking, `Run`,
    /// the split.
    pub timing: yardmaster_dataplane::JobTiming,
}

impl Parcel {
    /// A parcel without prepared inputs, of no sequence.
    pub fn new(payload: Payload) -> Self {
        Self { payload, prepared: None, sequence: None, last_job: None }
    }
}

/// A parked parcel; `None` once taken out.
pub type Slot = Arc<Mutex<Option<Parcel>>>;

/// Parcels by request id, shared by the backend and the executor.
#[derive(Debug, Clone, Default)]
pub struct PayloadStore {
    slots: Arc<Mutex<HashMap<u64, Slot>>>,
}

impl PayloadStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Park `parcel` under request `id` (replacing what was there).
    pub fn park(&self, id: u64, parcel: Parcel) {
        self.slots.lock().unwrap().insert(id, Arc::new(Mutex::new(Some(parcel))));
    }

    /// The slot of request `id`, to read or update in place.
    pub fn slot(&self, id: u64) -> Option<Slot> {
        self.slots.lock().unwrap().get(&id).cloned()
    }

    /// Remove request `id` and return its parcel. Waits for whoever is updating it.
    pub fn take(&self, id: u64) -> Option<Parcel> {
        let slot = self.slots.lock().unwrap().remove(&id)?;
        let parcel = slot.lock().unwrap().take();
        parcel
    }

    /// Remove request `id` without waiting for its parcel (for requests that ended
    /// without a result: whoever is updating it finishes on a detached copy).
    pub fn discard(&self, id: u64) {
        self.slots.lock().unwrap().remove(&id);
    }

    /// Requests parked.
    pub fn len(&self) -> usize {
        self.slots.lock().unwrap().len()
    }

    /// Whether nothing is parked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parcels_are_updated_in_place_and_taken_once() {
        let store = PayloadStore::new();
        store.park(7, Parcel::new(Payload::Tensors(vec![Tensor::filled(vec![2], 1.0)])));
        let slot = store.slot(7).unwrap();
        if let Some(Parcel { payload: Payload::Tensors(t), .. }) = slot.lock().unwrap().as_mut() {
            t[0].data.as_f32_mut().unwrap()[0] = 5.0;
        }
        let parcel = store.take(7).unwrap();
        assert_eq!(parcel.payload, Payload::Tensors(vec![Tensor::new(vec![2], vec![5.0, 1.0]).unwrap()]));
        assert!(store.take(7).is_none(), "taken once");
        assert!(slot.lock().unwrap().is_none(), "a holder of the old slot sees it emptied");
        store.park(8, Parcel::new(Payload::Tensors(Vec::new())));
        store.discard(8);
        assert!(store.is_empty());
    }
}
