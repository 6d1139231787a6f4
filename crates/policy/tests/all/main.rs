//! Tests of the policy runtime against the contract's WIT: released versions stay
//! frozen, and the hand-written canonical-ABI layouts (the fast event lowering, the
//! Zig example) match the layout the WIT defines.

mod abi;
mod frozen;
