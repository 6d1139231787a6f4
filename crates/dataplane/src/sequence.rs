//! Stateful sequences (Triton's sequence batcher) on the worker that runs the model.
//!
//! A stateful model's requests come in sequences, each named by a correlation id. Its
//! clients send only the model's own inputs; the worker fills the rest for each request
//! of a job ([`Sequences::complete`]):
//! - the **control inputs**: START (true on a sequence's first request), END (true on
//!   its last), READY (true for every request in the batch: a batch here holds only
//!   requests, never empty slots) and CORRID (the correlation id, in the input's type);
//! - the **implicit state** inputs: the state the sequence's previous request left, or
//!   the initial state (zeros, or the configuration's file) on its START.
//!
//! After the run, each state output is kept for its sequence, keyed by correlation id,
//! and taken out of the request's outputs ([`Sequences::keep`]); a sequence's state is
//! dropped on its END, when the engine releases the sequence ([`Sequences::release`]:
//! idle past `max_sequence_idle_microseconds`, or its END did not run), and — a
//! backstop against a release that never came — once it has been idle for twice that
//! time ([`Sequences::expire`]). A request that
//! is not a START for a sequence whose state this worker does not hold fails: its state
//! is never silently restarted.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::error::{DataplaneError, Result};
use crate::tensor::{ElementType, Elements, Tensor, TensorData};

/// What a control input carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlKind {
    /// True on a sequence's first request.
    Start,
    /// True on a sequence's last request.
    End,
    /// True for every request present in the batch.
    Ready,
    /// The sequence's correlation id.
    CorrelationId,
}

/// One control input of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    /// The model input it fills.
    pub input: String,
    /// What it carries.
    pub kind: ControlKind,
    /// Its element type.
    pub element: ElementType,
    /// A flag's false value, one element's bytes (empty for the correlation id).
    pub false_value: Vec<u8>,
    /// A flag's true value, one element's bytes (empty for the correlation id).
    pub true_value: Vec<u8>,
}

/// One implicit state of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// The model input fed the state.
    pub input: String,
    /// The model output the next state is read from.
    pub output: String,
    /// Its element type.
    pub element: ElementType,
    /// One request's state shape (without a batch dimension when the model batches).
    pub shape: Vec<usize>,
    /// The state at a sequence's start: its bytes (BYTES in their binary layout), or
    /// empty for zeros.
    pub initial: Vec<u8>,
}

impl State {
    /// The state at a sequence's start.
    pub fn initial_tensor(&self) -> Result<Tensor> {
        let count: usize = self.shape.iter().product();
        let data = if self.initial.is_empty() {
            Elements::zeros(self.element, count)
        } else {
            Elements::from_bytes(self.element, &self.initial, count)?
        };
        Tensor::new(self.shape.clone(), data)
    }
}

/// A stateful model's sequence settings, as a worker needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceSpec {
    /// Control inputs.
    pub controls: Vec<Control>,
    /// Implicit states.
    pub states: Vec<State>,
    /// A sequence idle this long loses its state here (`max_sequence_idle_microseconds`).
    pub idle: Duration,
}

impl SequenceSpec {
    /// Whether the worker fills model input `name` (a control or a state input).
    pub fn fills(&self, name: &str) -> bool {
        self.controls.iter().any(|c| c.input == name) || self.states.iter().any(|s| s.input == name)
    }

    /// The shape of a filled input for one request (`[1]` for a control, the initial
    /// state's for a state), or `None` for an input clients send.
    pub fn filled_shape(&self, name: &str) -> Option<Vec<usize>> {
        if self.controls.iter().any(|c| c.input == name) {
            return Some(vec![1]);
        }
        self.states.iter().find(|s| s.input == name).map(|s| s.shape.clone())
    }
}

/// One request's place in its sequence.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SequenceStep {
    /// The correlation id (a string id's hash when the client sent a string).
    pub id: u64,
    /// The client's string id, when it sent one (for a string CORRID).
    pub label: Option<String>,
    /// The sequence's first request.
    pub start: bool,
    /// The sequence's last request.
    pub end: bool,
}

/// One sequence's state on this worker.
struct Held {
    tensors: Vec<Tensor>,
    used: Instant,
}

/// The sequences a worker holds state for.
pub struct Sequences {
    spec: SequenceSpec,
    held: HashMap<u64, Held>,
}

impl std::fmt::Debug for Sequences {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sequences").field("held", &self.held.len()).finish()
    }
}

impl Sequences {
    /// No sequences yet.
    pub fn new(spec: SequenceSpec) -> Self {
        Sequences { spec, held: HashMap::new() }
    }

    /// The settings.
    pub fn spec(&self) -> &SequenceSpec {
        &self.spec
    }

    /// Sequences whose state is held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether no state is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Whether sequence `id`'s state is held.
    pub fn holds(&self, id: u64) -> bool {
        self.held.contains_key(&id)
    }

    /// Drop the state of sequence `id` (released by the engine).
    pub fn release(&mut self, id: u64) {
        self.held.remove(&id);
    }

    /// Drop the state of every sequence idle for longer than twice the spec's idle
    /// time (the engine releases idle sequences after the idle time itself; the margin
    /// keeps the state of a sequence whose next request waited in the queue).
    pub fn expire(&mut self, now: Instant) {
        let idle = self.spec.idle.saturating_mul(2);
        self.held.retain(|_, held| now.saturating_duration_since(held.used) <= idle);
    }

    /// The model's whole inputs for one request of `step` (in the order of `names`, the
    /// model's inputs): its own `given` tensors where clients send them, in order, the
    /// control and state inputs filled in.
    pub fn complete(&self, names: &[String], given: Vec<Tensor>, step: &SequenceStep) -> Result<Vec<Tensor>> {
        let held = match (step.start, self.held.get(&step.id)) {
            (true, _) => None,
            (false, Some(held)) => Some(held),
            (false, None) => {
                return Err(DataplaneError::Invalid(format!(
                    "sequence {}: this worker holds no state for it (it did not start here, or it ended, or it was idle past {} µs); send a START to begin it again",
                    step.id,
                    self.spec.idle.as_micros()
                )))
            }
        };
        let mut given = given.into_iter();
        let mut inputs = Vec::with_capacity(names.len());
        for name in names {
            if let Some(control) = self.spec.controls.iter().find(|c| &c.input == name) {
                inputs.push(control_tensor(control, step)?);
            } else if let Some((k, state)) = self.spec.states.iter().enumerate().find(|(_, s)| &s.input == name) {
                inputs.push(match held {
                    Some(held) => held.tensors[k].clone(),
                    None => state.initial_tensor()?,
                });
            } else {
                inputs.push(given.next().ok_or_else(|| DataplaneError::Invalid(format!("input {name:?} is missing")))?);
            }
        }
        if given.next().is_some() {
            return Err(DataplaneError::Invalid(format!("more inputs given than the {} the model takes", names.len())));
        }
        Ok(inputs)
    }

    /// Keep the state outputs of one request of `step` (the model's outputs, named by
    /// `names`) for its next request — or drop the sequence's state on its END — and
    /// return the other outputs, in order.
    pub fn keep(&mut self, names: &[String], outputs: Vec<Tensor>, step: &SequenceStep, now: Instant) -> Result<Vec<Tensor>> {
        let mut states: Vec<Option<Tensor>> = vec![None; self.spec.states.len()];
        let mut rest = Vec::with_capacity(outputs.len());
        for (name, tensor) in names.iter().zip(outputs) {
            match self.spec.states.iter().position(|s| &s.output == name) {
                // Its own copy: a view would hold the whole batch's output buffer.
                Some(k) => states[k] = Some(Tensor { shape: tensor.shape, data: tensor.data.into_elements().into() }),
                None => rest.push(tensor),
            }
        }
        if step.end {
            self.held.remove(&step.id);
        } else {
            let tensors = states
                .into_iter()
                .zip(&self.spec.states)
                .map(|(t, s)| t.ok_or_else(|| DataplaneError::Invalid(format!("the model gave no state output {:?}", s.output))))
                .collect::<Result<Vec<Tensor>>>()?;
            self.held.insert(step.id, Held { tensors, used: now });
        }
        Ok(rest)
    }
}

/// A control input's tensor (`[1]`) for one request.
fn control_tensor(control: &Control, step: &SequenceStep) -> Result<Tensor> {
    let flag = |on: bool| if on { &control.true_value } else { &control.false_value };
    let bytes: Vec<u8> = match control.kind {
        ControlKind::Start => flag(step.start).clone(),
        ControlKind::End => flag(step.end).clone(),
        ControlKind::Ready => flag(true).clone(),
        ControlKind::CorrelationId => match control.element {
            ElementType::U64 => step.id.to_le_bytes().to_vec(),
            ElementType::I64 => (step.id as i64).to_le_bytes().to_vec(),
            ElementType::U32 => (step.id as u32).to_le_bytes().to_vec(),
            ElementType::I32 => (step.id as i32).to_le_bytes().to_vec(),
            ElementType::Bytes => {
                let text = step.label.clone().unwrap_or_else(|| step.id.to_string());
                [&(text.len() as u32).to_le_bytes()[..], text.as_bytes()].concat()
            }
            other => {
                return Err(DataplaneError::Invalid(format!("control {:?}: a correlation id is not carried as {other}", control.input)))
            }
        },
    };
    let data = TensorData::from(Elements::from_bytes(control.element, &bytes, 1)?);
    Tensor::new(vec![1], data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SequenceSpec {
        let flag = |input: &str, kind| Control {
            input: input.into(),
            kind,
            element: ElementType::I32,
            false_value: 0i32.to_le_bytes().to_vec(),
            true_value: 1i32.to_le_bytes().to_vec(),
        };
        SequenceSpec {
            controls: vec![
                flag("START", ControlKind::Start),
                flag("END", ControlKind::End),
                flag("READY", ControlKind::Ready),
                Control {
                    input: "CORRID".into(),
                    kind: ControlKind::CorrelationId,
                    element: ElementType::U64,
                    false_value: vec![],
                    true_value: vec![],
                },
            ],
            states: vec![State {
                input: "STATE_IN".into(),
                output: "STATE_OUT".into(),
                element: ElementType::F32,
                shape: vec![2],
                initial: [0.5f32.to_le_bytes(), 0.5f32.to_le_bytes()].concat(),
            }],
            idle: Duration::from_millis(100),
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn ints(t: &Tensor) -> i32 {
        t.data.as_slice_of::<i32>().unwrap()[0]
    }

    #[test]
    fn controls_and_state_are_filled_and_the_state_carried_to_the_next_request() {
        let mut sequences = Sequences::new(spec());
        let inputs = names(&["IN", "START", "STATE_IN", "END", "READY", "CORRID"]);
        let outputs = names(&["STATE_OUT", "OUT"]);
        let step = |start, end| SequenceStep { id: 42, label: None, start, end };
        let x = Tensor::filled(vec![2], 3.0);
        let first = sequences.complete(&inputs, vec![x.clone()], &step(true, false)).unwrap();
        assert_eq!(first[0], x, "the client's input in its place");
        assert_eq!((ints(&first[1]), ints(&first[3]), ints(&first[4])), (1, 0, 1), "START, not END, READY");
        assert_eq!(first[2], Tensor::filled(vec![2], 0.5), "the initial state on START");
        assert_eq!(first[5].data.as_slice_of::<u64>(), Some(&[42][..]), "the correlation id");
        let rest = sequences
            .keep(&outputs, vec![Tensor::filled(vec![2], 7.0), Tensor::filled(vec![1], 1.0)], &step(true, false), Instant::now())
            .unwrap();
        assert_eq!(rest, vec![Tensor::filled(vec![1], 1.0)], "the state output is not the client's");
        let second = sequences.complete(&inputs, vec![x.clone()], &step(false, true)).unwrap();
        assert_eq!(second[2], Tensor::filled(vec![2], 7.0), "the state the first request left");
        assert_eq!((ints(&second[1]), ints(&second[3])), (0, 1));
        sequences
            .keep(&outputs, vec![Tensor::filled(vec![2], 9.0), Tensor::filled(vec![1], 1.0)], &step(false, true), Instant::now())
            .unwrap();
        assert!(!sequences.holds(42), "END drops the state");
        let error = sequences.complete(&inputs, vec![x], &step(false, false)).unwrap_err().to_string();
        assert!(error.contains("sequence 42: this worker holds no state"), "{error}");
    }

    #[test]
    fn idle_sequences_lose_their_state_and_string_ids_travel_as_strings() {
        let mut sequences = Sequences::new(spec());
        let step = SequenceStep { id: 7, label: None, start: true, end: false };
        let begun = Instant::now();
        sequences.keep(&names(&["STATE_OUT"]), vec![Tensor::filled(vec![2], 1.0)], &step, begun).unwrap();
        sequences.expire(begun + Duration::from_millis(150));
        assert!(sequences.holds(7), "kept while the engine may still send its next request");
        sequences.expire(begun + Duration::from_millis(250));
        assert!(!sequences.holds(7), "idle past twice 100 ms");
        sequences.keep(&names(&["STATE_OUT"]), vec![Tensor::filled(vec![2], 1.0)], &step, begun).unwrap();
        sequences.release(7);
        assert!(sequences.is_empty(), "released by the engine");
        let control = Control {
            input: "C".into(),
            kind: ControlKind::CorrelationId,
            element: ElementType::Bytes,
            false_value: vec![],
            true_value: vec![],
        };
        let labelled = SequenceStep { id: 1, label: Some("user-7".into()), start: true, end: false };
        let tensor = control_tensor(&control, &labelled).unwrap();
        assert_eq!(tensor.data.bytes(), [&6u32.to_le_bytes()[..], b"user-7"].concat());
    }
}
