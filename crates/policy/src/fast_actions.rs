//! A faster lifting of the action list a policy's `handle` returns.
//!
//! wasmtime 48 lifts a `list<action>` element by element through the generic variant
//! and record lifting, which looks up the component's type tables for every case and
//! field. [`ActionList`] reads the hot cases — `drop` and `dispatch` — straight from the
//! policy's memory with the offsets of [`crate::abi`] (tested against the WIT), and hands
//! every other action to wasmtime's own lifting. It checks what wasmtime checks: the
//! list and every `requests` list in bounds and aligned, the discriminants of
//! `drop-reason` and `option` in range, and the host-call fuel the lists cost. In debug
//! builds every list is lifted the generic way as well (lifting only reads the policy's
//! memory) and the two compared, so any drift between this file and the contract fails
//! the test suite.
//!
//! Like [`crate::fast_events`], this uses wasmtime's `#[doc(hidden)]` lifting traits.

use wasmtime::component::__internal::{CanonicalAbiInfo, InterfaceType, LiftContext};
use wasmtime::component::{ComponentType, Lift};
use wasmtime::ValRaw;

use super::abi::action::{DISPATCH, DROP, PAYLOAD};
use super::abi::{dispatch, drop_request};
use super::contract::{Action, Dispatch, DropReason, DropRequest};

/// Size of one `action`.
const STRIDE: usize = super::abi::action::SIZE;

// wasmtime's own idea of the layout must agree with the one written here.
const _: () = assert!(Action::SIZE32 == STRIDE && Action::ALIGN32 as usize == super::abi::action::ALIGN);

/// The actions of one `handle` call, lifted with the fast path.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionList(pub Vec<Action>);

// SAFETY: the type-level information is exactly that of `Vec<Action>`, which this
// type lifts from.
unsafe impl ComponentType for ActionList {
    type Lower = [ValRaw; 2];
    const ABI: CanonicalAbiInfo = CanonicalAbiInfo::POINTER_PAIR;

    fn typecheck(ty: &InterfaceType, types: &wasmtime::component::__internal::InstanceType<'_>) -> wasmtime::Result<()> {
        <Vec<Action> as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: reads a pointer/length pair and the canonical-ABI `action` values it points
// to, validated as `Vec<Action>`'s own impl validates them.
unsafe impl Lift for ActionList {
    fn linear_lift_from_flat(cx: &mut LiftContext<'_>, ty: InterfaceType, src: &[ValRaw; 2]) -> wasmtime::Result<Self> {
        let (ptr, len) = (src[0].get_u32() as usize, src[1].get_u32() as usize);
        lift_actions(cx, ty, ptr, len).map(ActionList)
    }

    fn linear_lift_from_memory(cx: &mut LiftContext<'_>, ty: InterfaceType, bytes: &[u8]) -> wasmtime::Result<Self> {
        let (ptr, len) = pointer_pair(bytes, 0);
        lift_actions(cx, ty, ptr, len).map(ActionList)
    }
}

/// A little-endian u32 at `at`.
fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("four bytes"))
}

/// A list's pointer and length at `at`.
fn pointer_pair(bytes: &[u8], at: usize) -> (usize, usize) {
    (u32_at(bytes, at) as usize, u32_at(bytes, at + 4) as usize)
}

/// The bytes of a list of `len` elements of `size` bytes at `ptr`, checked as wasmtime
/// checks a list (in bounds, then aligned) and charged to the host-call fuel (`host_size`
/// bytes an element, the size of the host's type).
fn list_bytes<'a>(
    cx: &mut LiftContext<'a>,
    ptr: usize,
    len: usize,
    size: usize,
    align: usize,
    host_size: usize,
) -> wasmtime::Result<&'a [u8]> {
    let memory = cx.memory();
    let bytes = match len.checked_mul(size).and_then(|n| Some((n, ptr.checked_add(n)?))) {
        Some((n, end)) if end <= memory.len() => &memory[ptr..ptr + n],
        _ => return Err(wasmtime::Error::msg("list pointer/length out of bounds of memory")),
    };
    cx.consume_fuel_array(len, host_size)?;
    if !ptr.is_multiple_of(align) {
        return Err(wasmtime::Error::msg("list pointer is not aligned"));
    }
    Ok(bytes)
}

/// Lift the `len` actions at `ptr`.
fn lift_actions(cx: &mut LiftContext<'_>, ty: InterfaceType, ptr: usize, len: usize) -> wasmtime::Result<Vec<Action>> {
    let elem = match ty {
        InterfaceType::List(i) => cx.types[i].element,
        other => panic!("ActionList lifted as {other:?}, not a list"),
    };
    let list = list_bytes(cx, ptr, len, STRIDE, super::abi::action::ALIGN, std::mem::size_of::<Action>())?;
    let mut actions = Vec::with_capacity(len);
    for slot in list.chunks_exact(STRIDE) {
        let payload = &slot[PAYLOAD..];
        let action = match slot[0] {
            DROP => {
                use drop_request::{REASON, REQUEST};
                let request = u64::from_le_bytes(payload[REQUEST..REQUEST + 8].try_into().expect("eight bytes"));
                let reason = match payload[REASON] {
                    0 => DropReason::DeadlineUnreachable,
                    1 => DropReason::Overload,
                    2 => DropReason::QueueFull,
                    3 => DropReason::Preempted,
                    4 => DropReason::Policy,
                    _ => return Err(wasmtime::Error::msg("unexpected discriminant")),
                };
                Action::Drop(DropRequest { request, reason })
            }
            DISPATCH => {
                use dispatch::{REQUESTS, VARIANT, VARIANT_ID, WORKER};
                let worker = u32_at(payload, WORKER);
                let (at, count) = pointer_pair(payload, REQUESTS);
                let ids = list_bytes(cx, at, count, 8, 8, 8)?;
                let requests = ids.chunks_exact(8).map(|id| u64::from_le_bytes(id.try_into().expect("eight bytes"))).collect();
                let variant = match payload[VARIANT] {
                    0 => None,
                    1 => Some(u32_at(payload, VARIANT_ID)),
                    _ => return Err(wasmtime::Error::msg("invalid option discriminant")),
                };
                Action::Dispatch(Dispatch { worker, requests, variant })
            }
            // Anything else: wasmtime's own lifting.
            _ => Action::linear_lift_from_memory(cx, elem, slot)?,
        };
        actions.push(action);
    }
    #[cfg(debug_assertions)]
    check_against_generic(cx, ty, ptr, len, &actions)?;
    Ok(actions)
}

/// Debug builds: lift the same list the generic way and compare.
#[cfg(debug_assertions)]
fn check_against_generic(cx: &mut LiftContext<'_>, ty: InterfaceType, ptr: usize, len: usize, fast: &[Action]) -> wasmtime::Result<()> {
    let mut pair = [0u8; 8];
    pair[..4].copy_from_slice(&(ptr as u32).to_le_bytes());
    pair[4..].copy_from_slice(&(len as u32).to_le_bytes());
    let generic = <Vec<Action> as Lift>::linear_lift_from_memory(cx, ty, &pair)?;
    assert_eq!(fast, generic.as_slice(), "fast lifting of the action list differs from wasmtime's");
    Ok(())
}
