//! Host tensors: a shape and `f32` data in row-major order. Requests carry one per model
//! input, without the batch dimension; batches carry it first.

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
