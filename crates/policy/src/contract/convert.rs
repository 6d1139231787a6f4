//! The machinery for converting between two contract versions' generated types.
//!
//! Each version's `bindgen!` generates its own Rust types, even for records that did
//! not change, so a bindings module converts every type that crosses the boundary:
//! events and the configuration down to its version, actions up to the latest. The
//! [`Convert`] trait carries a value from one version's type to the other's; the
//! macros write the field-by-field and case-by-case impls, so a version module lists
//! only the shapes and writes by hand only what really changed (a field the older
//! version lacks, a case it does not know).

/// Convert a value to another contract version's type of the same WIT name.
pub trait Convert<T> {
    /// The value as `T`.
    fn convert(self) -> T;
}

macro_rules! identity {
    ($($t:ty),*) => {$(
        impl Convert<$t> for $t {
            fn convert(self) -> $t {
                self
            }
        }
    )*};
}
identity!(bool, u8, u32, u64, f64, String);

impl<A: Convert<B>, B> Convert<Vec<B>> for Vec<A> {
    fn convert(self) -> Vec<B> {
        self.into_iter().map(Convert::convert).collect()
    }
}

impl<A: Convert<B>, B> Convert<Option<B>> for Option<A> {
    fn convert(self) -> Option<B> {
        self.map(Convert::convert)
    }
}

impl<A: Convert<C>, B: Convert<D>, C, D> Convert<(C, D)> for (A, B) {
    fn convert(self) -> (C, D) {
        (self.0.convert(), self.1.convert())
    }
}

/// `record!(from::Name => to::Name { field, … })`: convert a record field by field
/// (every field of the target, each found under the same name in the source).
macro_rules! record {
    ($from:ident :: $name:ident => $to:ident :: $target:ident { $($field:ident),* $(,)? }) => {
        impl $crate::contract::convert::Convert<$to::$target> for $from::$name {
            fn convert(self) -> $to::$target {
                $to::$target { $($field: $crate::contract::convert::Convert::convert(self.$field)),* }
            }
        }
    };
}

/// `cases!(from::Name => to::Name { Case, … })`: convert an enum case by case (cases
/// without a payload).
macro_rules! cases {
    ($from:ident :: $name:ident => $to:ident :: $target:ident { $($case:ident),* $(,)? }) => {
        impl $crate::contract::convert::Convert<$to::$target> for $from::$name {
            fn convert(self) -> $to::$target {
                match self {
                    $($from::$name::$case => $to::$target::$case),*
                }
            }
        }
    };
}

/// `payloads!(from::Name => to::Name { Case, … })`: convert a variant whose cases each
/// carry one payload, case by case.
macro_rules! payloads {
    ($from:ident :: $name:ident => $to:ident :: $target:ident { $($case:ident),* $(,)? }) => {
        impl $crate::contract::convert::Convert<$to::$target> for $from::$name {
            fn convert(self) -> $to::$target {
                match self {
                    $($from::$name::$case(payload) => $to::$target::$case($crate::contract::convert::Convert::convert(payload))),*
                }
            }
        }
    };
}

pub(crate) use {cases, payloads, record};
