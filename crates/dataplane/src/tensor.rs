//! Host tensors: a shape and `f32` data in row-major order. Requests carry one per model
//! input, without the batch dimension; batches carry it first.
//!
//! Elements travel as `f32` whatever the model's element type ([`ElementType`]): a
//! session casts them to the model's type on the way in and back on the way out. That
//! is exact for every value of the 8- and 16-bit integer types, booleans, and integers
//! of magnitude up to 2^24 (token ids, byte values, class indices); the server refuses
//! an input element it could not carry exactly.

use crate::error::{DataplaneError, Result};

/// A dense `f32` tensor on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Elements, row-major; `data.len()` is the product of `shape`.
    pub data: Vec<f32>,
}

impl Tensor {
    /// A tensor from its shape and data; refuses data of the wrong length.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Result<Self> {
        let expected: usize = shape.iter().product();
        if expected != data.len() {
            return Err(DataplaneError::Invalid(format!("shape {shape:?} needs {expected} elements, got {}", data.len())));
        }
        Ok(Tensor { shape, data })
    }

    /// A tensor filled with `value`.
    pub fn filled(shape: Vec<usize>, value: f32) -> Self {
        let n = shape.iter().product();
        Tensor { shape, data: vec![value; n] }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The largest absolute difference to `other` (infinite when shapes differ).
    pub fn max_abs_diff(&self, other: &Tensor) -> f32 {
        if self.shape != other.shape {
            return f32::INFINITY;
        }
        self.data.iter().zip(&other.data).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max)
    }
}

/// An element type a model's input or output may have; the data plane feeds and reads
/// them through `f32` (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementType {
    /// `float32`.
    F32,
    /// `int8`.
    I8,
    /// `int16`.
    I16,
    /// `int32`.
    I32,
    /// `int64`.
    I64,
    /// `uint8`.
    U8,
    /// `uint16`.
    U16,
    /// `uint32`.
    U32,
    /// `bool` (0 or 1).
    Bool,
}

/// The largest integer magnitude an `f32` carries exactly: 2^24.
pub const EXACT_INTEGER_LIMIT: f64 = 16_777_216.0;

impl ElementType {
    /// Whether `value` converts to this type and back without change.
    pub fn carries_exactly(self, value: f64) -> bool {
        let integer = value.fract() == 0.0;
        match self {
            ElementType::F32 => true,
            ElementType::Bool => value == 0.0 || value == 1.0,
            ElementType::I8 => integer && (-128.0..=127.0).contains(&value),
            ElementType::I16 => integer && (-32_768.0..=32_767.0).contains(&value),
            ElementType::U8 => integer && (0.0..=255.0).contains(&value),
            ElementType::U16 => integer && (0.0..=65_535.0).contains(&value),
            ElementType::I32 | ElementType::I64 => integer && value.abs() <= EXACT_INTEGER_LIMIT,
            ElementType::U32 => integer && (0.0..=EXACT_INTEGER_LIMIT).contains(&value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_up_to_two_to_the_24_travel_exactly() {
        assert!(ElementType::I64.carries_exactly(16_777_216.0));
        assert!(!ElementType::I64.carries_exactly(16_777_217.0));
        assert!(!ElementType::I32.carries_exactly(0.5));
        assert!(ElementType::U8.carries_exactly(255.0) && !ElementType::U8.carries_exactly(256.0));
        assert!(!ElementType::U32.carries_exactly(-1.0));
        assert!(ElementType::Bool.carries_exactly(1.0) && !ElementType::Bool.carries_exactly(2.0));
        for v in [-128.0f32, 127.0] {
            assert_eq!(v as i8 as f32, v);
        }
    }
}
