//! A faster lowering of the event list into a policy's memory.
//!
//! wasmtime 48 lowers a `list<event>` field by field, looking up the guest's memory
//! and recomputing the record layout for every field store; for the arrival record
//! (twelve fields) that is most of the cost of delivering an event. [`EventList`]
//! lowers the hot cases — `arrival` without tags, `worker-idle` and `batch-done` — by
//! writing their canonical-ABI bytes straight into memory (a `batch-done` still needs
//! one guest allocation for its results), and hands every other event to wasmtime's
//! own lowering. It lowers the latest contract's `event` (the host's [`Event`]); a
//! component of an older contract version gets its events converted by its bindings
//! module and lowered the generic way. The offsets are the constants of [`crate::abi`],
//! which a test derives from the WIT; in debug builds every hot event is also lowered
//! the generic way, in place and without a second guest allocation (the guest frees
//! only what the list it receives points to), and the bytes compared, so any drift
//! between this file and the contract fails the test suite.
//!
//! This uses wasmtime's `#[doc(hidden)]` lowering traits, which is why the wasmtime
//! version is pinned exactly in the workspace.

use std::mem::MaybeUninit;

use wasmtime::component::__internal::{CanonicalAbiInfo, InterfaceType, LowerContext};
use wasmtime::component::{ComponentType, Lower};
use wasmtime::ValRaw;

use super::abi::event::{ARRIVAL, BATCH_DONE, PAYLOAD, WORKER_IDLE};
use super::abi::{batch_outcome, request, request_result};
use super::contract::{BatchOutcome, Event, Request, RequestStatus};

/// Size of one `event` (the stride of the event list).
const STRIDE: usize = super::abi::event::SIZE;

/// Size of `request-result` (the stride of the results list).
const RESULT_SIZE: usize = request_result::SIZE;

// wasmtime's own idea of the layout must agree with the one written here.
const _: () = assert!(Event::SIZE32 == super::abi::event::SIZE && Event::ALIGN32 as usize == super::abi::event::ALIGN);

/// A borrowed event list, lowered with the fast path.
///
/// It holds a raw pointer so that a `TypedFunc` over it can be stored; it is only
/// ever built by [`EventList::new`] from a slice that outlives the call it is passed to.
#[derive(Clone, Copy)]
pub struct EventList {
    ptr: *const Event,
    len: usize,
}

// SAFETY: an `EventList` is a shared view of `Event`s (which are `Send + Sync`),
// created and consumed within one synchronous call on one thread.
unsafe impl Send for EventList {}
// SAFETY: as above.
unsafe impl Sync for EventList {}

impl EventList {
    /// A view of `events` for one call.
    ///
    /// # Safety
    /// The `EventList` must not outlive `events` (pass it straight to the call).
    pub unsafe fn new(events: &[Event]) -> Self {
        Self { ptr: events.as_ptr(), len: events.len() }
    }

    fn events(&self) -> &[Event] {
        // SAFETY: built from a live slice by `new`, whose contract keeps it alive.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

// SAFETY: the type-level information is exactly that of `[Event]`, which this type
// lowers to.
unsafe impl ComponentType for EventList {
    type Lower = [ValRaw; 2];
    const ABI: CanonicalAbiInfo = CanonicalAbiInfo::POINTER_PAIR;

    fn typecheck(ty: &InterfaceType, types: &wasmtime::component::__internal::InstanceType<'_>) -> wasmtime::Result<()> {
        <[Event] as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: writes a pointer/length pair of a list allocated with the guest's realloc
// and filled with canonical-ABI `event` values, as `[Event]`'s own impl does.
unsafe impl Lower for EventList {
    fn linear_lower_to_flat<T>(
        &self,
        cx: &mut LowerContext<'_, T>,
        ty: InterfaceType,
        dst: &mut MaybeUninit<[ValRaw; 2]>,
    ) -> wasmtime::Result<()> {
        let (ptr, len) = lower_events(cx, element(cx, ty), self.events())?;
        dst.write([ValRaw::i64(ptr as i64), ValRaw::i64(len as i64)]);
        Ok(())
    }

    fn linear_lower_to_memory<T>(&self, cx: &mut LowerContext<'_, T>, ty: InterfaceType, offset: usize) -> wasmtime::Result<()> {
        let (ptr, len) = lower_events(cx, element(cx, ty), self.events())?;
        let memory = cx.as_slice_mut();
        memory[offset..offset + 4].copy_from_slice(&(ptr as u32).to_le_bytes());
        memory[offset + 4..offset + 8].copy_from_slice(&(len as u32).to_le_bytes());
        Ok(())
    }
}

fn element<T>(cx: &LowerContext<'_, T>, ty: InterfaceType) -> InterfaceType {
    match ty {
        InterfaceType::List(i) => cx.types[i].element,
        other => panic!("EventList lowered as {other:?}, not a list"),
    }
}

/// Allocate the list in the guest and fill it.
fn lower_events<T>(cx: &mut LowerContext<'_, T>, elem: InterfaceType, events: &[Event]) -> wasmtime::Result<(usize, usize)> {
    let stride = Event::SIZE32;
    let size = events.len().checked_mul(stride).ok_or_else(|| wasmtime::Error::msg("event list too large"))?;
    let base = cx.realloc(0, 0, Event::ALIGN32, size)?;
    let mut i = 0;
    while i < events.len() {
        // Runs of hot events are written through one view of memory.
        let memory = cx.as_slice_mut();
        let region = memory.get_mut(base..base + size).ok_or_else(|| wasmtime::Error::msg("event list out of the policy's memory"))?;
        while let Some(event) = events.get(i) {
            // A fixed-size view: every write below is at a constant offset.
            let slot: &mut [u8; STRIDE] = (&mut region[i * stride..(i + 1) * stride]).try_into().expect("one event's bytes");
            match event {
                Event::Arrival(request) if request.tags.is_none() => write_arrival(slot, request),
                Event::WorkerIdle(worker) => {
                    slot[0] = WORKER_IDLE;
                    slot[PAYLOAD..PAYLOAD + 4].copy_from_slice(&worker.to_le_bytes());
                }
                _ => break,
            }
            i += 1;
        }
        match events.get(i) {
            Some(Event::BatchDone(outcome)) => {
                write_batch_done(cx, base + i * stride, outcome)?;
                i += 1;
            }
            Some(event) => {
                // Anything else: wasmtime's own lowering.
                event.linear_lower_to_memory(cx, elem, base + i * stride)?;
                i += 1;
            }
            None => {}
        }
    }
    #[cfg(debug_assertions)]
    check_against_generic(cx, elem, events, base)?;
    Ok((base, events.len()))
}

/// `batch-done(batch-outcome)`: allocate the results list, then write both.
fn write_batch_done<T>(cx: &mut LowerContext<'_, T>, at: usize, outcome: &BatchOutcome) -> wasmtime::Result<()> {
    let len = outcome.results.len();
    let list = cx.realloc(0, 0, request_result::ALIGN as u32, len * RESULT_SIZE)?;
    let memory = cx.as_slice_mut();
    let results =
        memory.get_mut(list..list + len * RESULT_SIZE).ok_or_else(|| wasmtime::Error::msg("results list out of the policy's memory"))?;
    use request_result::{ID, STATUS, STATUS_FAILED, STATUS_OK, TOKENS};
    for (slot, result) in results.chunks_exact_mut(RESULT_SIZE).zip(&outcome.results) {
        slot[ID..ID + 8].copy_from_slice(&result.id.to_le_bytes());
        slot[STATUS] = match result.status {
            RequestStatus::Ok => STATUS_OK,
            RequestStatus::Failed => STATUS_FAILED,
        };
        slot[TOKENS..TOKENS + 4].copy_from_slice(&result.tokens.to_le_bytes());
    }
    let slot = &mut memory[at..at + Event::SIZE32];
    slot[0] = BATCH_DONE;
    let p = &mut slot[PAYLOAD..];
    use batch_outcome::{DURATION, RESULTS, STARTED_AT, WORKER};
    p[WORKER..WORKER + 4].copy_from_slice(&outcome.worker.to_le_bytes());
    p[STARTED_AT..STARTED_AT + 8].copy_from_slice(&outcome.started_at.to_le_bytes());
    p[DURATION..DURATION + 8].copy_from_slice(&outcome.duration.to_le_bytes());
    p[RESULTS..RESULTS + 4].copy_from_slice(&(list as u32).to_le_bytes());
    p[RESULTS + 4..RESULTS + 8].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(())
}

/// `arrival(request)` with `tags: none`, in the canonical ABI layout of `request`
/// (its `correlation` too).
fn write_arrival(slot: &mut [u8; STRIDE], r: &Request) {
    use request::*;
    slot[0] = ARRIVAL;
    let p: &mut [u8; STRIDE - PAYLOAD] = (&mut slot[PAYLOAD..]).try_into().expect("the payload's bytes");
    p[ID..ID + 8].copy_from_slice(&r.id.to_le_bytes());
    p[ORIGIN..ORIGIN + 8].copy_from_slice(&r.origin.to_le_bytes());
    p[STAGE..STAGE + 4].copy_from_slice(&r.stage.to_le_bytes());
    p[STREAM..STREAM + 4].copy_from_slice(&r.stream.to_le_bytes());
    p[SENT_AT..SENT_AT + 8].copy_from_slice(&r.sent_at.to_le_bytes());
    p[ARRIVED_AT..ARRIVED_AT + 8].copy_from_slice(&r.arrived_at.to_le_bytes());
    p[DEADLINE..DEADLINE + 8].copy_from_slice(&r.deadline.to_le_bytes());
    p[PRIORITY..PRIORITY + 4].copy_from_slice(&r.priority.to_le_bytes());
    p[INPUT_SIZE..INPUT_SIZE + 4].copy_from_slice(&r.input_size.to_le_bytes());
    p[EXPECTED_TOKENS..EXPECTED_TOKENS + 4].copy_from_slice(&r.expected_tokens.to_le_bytes());
    p[REQUEUES..REQUEUES + 4].copy_from_slice(&r.requeues.to_le_bytes());
    // tags: none, and every byte after it zero (padding and an absent correlation's
    // payload), so the slot holds no stale guest bytes.
    p[TAGS..SIZE].fill(0);
    p[ITEMS..ITEMS + 4].copy_from_slice(&r.items.to_le_bytes());
    if let Some(c) = &r.correlation {
        use super::abi::correlation as at;
        p[CORRELATION] = 1;
        let q = &mut p[CORRELATION_PAYLOAD..];
        q[at::ID..at::ID + 8].copy_from_slice(&c.id.to_le_bytes());
        q[at::START] = c.start as u8;
        q[at::END] = c.end as u8;
        if let Some(worker) = c.worker {
            q[at::WORKER] = 1;
            q[at::WORKER_ID..at::WORKER_ID + 4].copy_from_slice(&worker.to_le_bytes());
        }
    }
}

/// Debug builds: lower every hot event of the list again the generic way, in place,
/// and compare the bytes the fast path wrote (padding excluded).
///
/// The check allocates nothing in the guest: an event list is owned by the guest once
/// passed, and the guest frees exactly the allocations the list it receives points to,
/// so a second copy of the list (or of a results list) would never be freed. (An
/// earlier version lowered a whole second list; in debug builds every call leaked it,
/// and a long run's policy memory grew by about one page per few hundred requests.)
/// Arrivals without tags and idle workers own no list, so wasmtime's lowering of them
/// writes the same slot and nothing else. A `batch-done`'s results are lowered into
/// the fast path's results list itself (its elements own no list either), and its
/// record is compared with wasmtime's lowering of the same outcome with no results
/// (an empty list: a zero-byte request to the guest's `cabi_realloc`, which the Rust
/// bindings answer without allocating), after which the fast path's bytes are put back.
#[cfg(debug_assertions)]
fn check_against_generic<T>(cx: &mut LowerContext<'_, T>, elem: InterfaceType, events: &[Event], base: usize) -> wasmtime::Result<()> {
    let stride = Event::SIZE32;
    for (i, event) in events.iter().enumerate() {
        let at = base + i * stride;
        match event {
            Event::Arrival(r) if r.tags.is_none() => compare_in_place(cx, elem, event, at, PAYLOAD + request::SIZE)?,
            Event::WorkerIdle(_) => compare_in_place(cx, elem, event, at, PAYLOAD + 4)?,
            Event::BatchDone(outcome) => check_batch_done(cx, elem, outcome, at)?,
            _ => {}
        }
    }
    Ok(())
}

/// Lower `event` the generic way over the `used` bytes the fast path wrote at `at` and
/// compare (the discriminant's padding excluded).
#[cfg(debug_assertions)]
fn compare_in_place<T>(cx: &mut LowerContext<'_, T>, elem: InterfaceType, event: &Event, at: usize, used: usize) -> wasmtime::Result<()> {
    let mut fast = cx.as_slice_mut()[at..at + used].to_vec();
    fast[1..PAYLOAD].fill(0);
    cx.as_slice_mut()[at..at + Event::SIZE32].fill(0);
    event.linear_lower_to_memory(cx, elem, at)?;
    let generic = &cx.as_slice_mut()[at..at + used];
    assert_eq!(fast, generic, "fast lowering of {} differs from wasmtime's", event.kind());
    Ok(())
}

/// The `batch-done` check of [`check_against_generic`].
#[cfg(debug_assertions)]
fn check_batch_done<T>(cx: &mut LowerContext<'_, T>, elem: InterfaceType, outcome: &BatchOutcome, at: usize) -> wasmtime::Result<()> {
    use batch_outcome::{DURATION, RESULTS, STARTED_AT, WORKER};
    use request_result::{STATUS, TOKENS};
    let slot = cx.as_slice_mut()[at..at + Event::SIZE32].to_vec();
    let p = PAYLOAD;
    let list = u32::from_le_bytes(slot[p + RESULTS..p + RESULTS + 4].try_into().unwrap()) as usize;
    let len = u32::from_le_bytes(slot[p + RESULTS + 4..p + RESULTS + 8].try_into().unwrap()) as usize;
    assert_eq!(len, outcome.results.len(), "batch-done result count differs");
    // The results, lowered over the fast path's own list.
    let fast = cx.as_slice_mut()[list..list + len * RESULT_SIZE].to_vec();
    cx.as_slice_mut()[list..list + len * RESULT_SIZE].fill(0);
    super::contract::RequestResult::linear_store_list_to_memory(cx, results_element(cx, elem), list, &outcome.results)?;
    let generic = &cx.as_slice_mut()[list..list + len * RESULT_SIZE];
    for (f, g) in fast.chunks_exact(RESULT_SIZE).zip(generic.chunks_exact(RESULT_SIZE)) {
        assert_eq!(f[..STATUS + 1], g[..STATUS + 1], "fast lowering of batch-done results differs");
        assert_eq!(f[TOKENS..TOKENS + 4], g[TOKENS..TOKENS + 4], "fast lowering of batch-done results differs");
    }
    // The record, against the same outcome without results; then the fast bytes back.
    let header = Event::BatchDone(BatchOutcome { results: Vec::new(), ..outcome.clone() });
    header.linear_lower_to_memory(cx, elem, at)?;
    let memory = cx.as_slice_mut();
    let generic = &memory[at..at + Event::SIZE32];
    assert_eq!(slot[0], generic[0], "batch-done discriminant differs");
    assert_eq!(slot[p + WORKER..p + WORKER + 4], generic[p + WORKER..p + WORKER + 4], "batch-done worker differs");
    assert_eq!(slot[p + STARTED_AT..p + DURATION + 8], generic[p + STARTED_AT..p + DURATION + 8], "batch-done times differ");
    memory[at..at + Event::SIZE32].copy_from_slice(&slot);
    Ok(())
}

/// The element type of `batch-outcome.results` inside the `event` variant `elem`.
#[cfg(debug_assertions)]
fn results_element<T>(cx: &LowerContext<'_, T>, elem: InterfaceType) -> InterfaceType {
    let InterfaceType::Variant(variant) = elem else { panic!("event lowered as {elem:?}, not a variant") };
    let Some((_, Some(InterfaceType::Record(record)))) = cx.types[variant].cases.get_index(BATCH_DONE as usize) else {
        panic!("the event variant has no batch-done record")
    };
    let field = cx.types[*record].fields.iter().find(|f| f.name == "results").expect("batch-outcome has results");
    match field.ty {
        InterfaceType::List(list) => cx.types[list].element,
        other => panic!("batch-outcome.results lowered as {other:?}, not a list"),
    }
}
