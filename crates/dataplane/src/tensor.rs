//! Host tensors: a shape and `f32` data in row-major order. Requests carry one per model
//! input, without the batch dimension; batches carry it first.
//!
//! Elements travel as `f32` whatever the model's element type ([`ElementType`]): a
//! session casts them to the model's type on the way in and back on the way out. That
//! is exact for every value of the 8- and 16-bit integer types, booleans, half-precision
//! floats, and integers of magnitude up to 2^24 (token ids, byte values, class
//! indices); the server refuses an input element it could not carry exactly.
//!
//! A tensor's elements ([`TensorData`]) are either its own `Vec` or a view of a buffer
//! shared with other tensors: a batch's outputs are split per request as views of the
//! one buffer ONNX Runtime wrote, not copied; the buffer is freed with its last view,
//! and writing through a view copies that view first.

use std::fmt;
use std::ops::{Deref, DerefMut, Range};
use std::sync::Arc;

use crate::error::{DataplaneError, Result};

/// A dense `f32` tensor on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Elements, row-major; `data.len()` is the product of `shape`.
    pub data: TensorData,
}

/// A buffer of `f32` elements that several tensors may view (ONNX Runtime's output of
/// a whole batch, for one).
pub trait SharedElements: Send + Sync {
    /// Every element of the buffer.
    fn elements(&self) -> &[f32];
}

impl SharedElements for Vec<f32> {
    fn elements(&self) -> &[f32] {
        self
    }
}

/// A tensor's elements: owned, or a range of a shared buffer. Reads through
/// `Deref<Target = [f32]>`; a write to a view copies the view into its own `Vec` first.
#[derive(Clone)]
pub struct TensorData(Storage);

#[derive(Clone)]
enum Storage {
    Owned(Vec<f32>),
    View { buffer: Arc<dyn SharedElements>, range: Range<usize> },
}

impl TensorData {
    /// A view of `range` of a shared `buffer` (no copy); `None` when the range is not
    /// inside the buffer.
    pub fn view(buffer: Arc<dyn SharedElements>, range: Range<usize>) -> Option<Self> {
        (range.start <= range.end && range.end <= buffer.elements().len()).then_some(TensorData(Storage::View { buffer, range }))
    }

    /// The elements as a slice.
    pub fn as_slice(&self) -> &[f32] {
        match &self.0 {
            Storage::Owned(data) => data,
            Storage::View { buffer, range } => &buffer.elements()[range.clone()],
        }
    }

    /// The elements as a `Vec` (moved when owned, copied from a view).
    pub fn into_vec(self) -> Vec<f32> {
        match self.0 {
            Storage::Owned(data) => data,
            Storage::View { buffer, range } => buffer.elements()[range].to_vec(),
        }
    }

    /// The elements as a shared buffer and the range of it they are (an owned `Vec`
    /// becomes the buffer, without a copy).
    pub fn into_shared(self) -> (Arc<dyn SharedElements>, Range<usize>) {
        match self.0 {
            Storage::Owned(data) => {
                let len = data.len();
                (Arc::new(data), 0..len)
            }
            Storage::View { buffer, range } => (buffer, range),
        }
    }

    /// Whether the elements are a view of a shared buffer.
    pub fn is_view(&self) -> bool {
        matches!(self.0, Storage::View { .. })
    }

    /// The elements for writing: a view is copied into its own `Vec` first.
    pub fn to_mut(&mut self) -> &mut Vec<f32> {
        if let Storage::View { buffer, range } = &self.0 {
            self.0 = Storage::Owned(buffer.elements()[range.clone()].to_vec());
        }
        match &mut self.0 {
            Storage::Owned(data) => data,
            Storage::View { .. } => unreachable!("a view was just made owned"),
        }
    }
}

impl Deref for TensorData {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        self.as_slice()
    }
}

impl DerefMut for TensorData {
    fn deref_mut(&mut self) -> &mut [f32] {
        self.to_mut()
    }
}

impl From<Vec<f32>> for TensorData {
    fn from(data: Vec<f32>) -> Self {
        TensorData(Storage::Owned(data))
    }
}

impl FromIterator<f32> for TensorData {
    fn from_iter<I: IntoIterator<Item = f32>>(iter: I) -> Self {
        iter.into_iter().collect::<Vec<f32>>().into()
    }
}

impl Default for TensorData {
    fn default() -> Self {
        Vec::new().into()
    }
}

impl fmt::Debug for TensorData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_slice().fmt(f)
    }
}

impl PartialEq for TensorData {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl PartialEq<Vec<f32>> for TensorData {
    fn eq(&self, other: &Vec<f32>) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl PartialEq<[f32]> for TensorData {
    fn eq(&self, other: &[f32]) -> bool {
        self.as_slice() == other
    }
}

impl<'a> IntoIterator for &'a TensorData {
    type Item = &'a f32;
    type IntoIter = std::slice::Iter<'a, f32>;
    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

impl Tensor {
    /// A tensor from its shape and data; refuses data of the wrong length.
    pub fn new(shape: Vec<usize>, data: impl Into<TensorData>) -> Result<Self> {
        let data = data.into();
        let expected: usize = shape.iter().product();
        if expected != data.len() {
            return Err(DataplaneError::Invalid(format!("shape {shape:?} needs {expected} elements, got {}", data.len())));
        }
        Ok(Tensor { shape, data })
    }

    /// A tensor filled with `value`.
    pub fn filled(shape: Vec<usize>, value: f32) -> Self {
        let n = shape.iter().product();
        Tensor { shape, data: vec![value; n].into() }
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
    /// `float16` (IEEE half precision; every half value is an `f32` value, so it
    /// travels exactly both ways).
    F16,
}

/// The largest integer magnitude an `f32` carries exactly: 2^24.
pub const EXACT_INTEGER_LIMIT: f64 = 16_777_216.0;

impl ElementType {
    /// Whether `value` converts to this type and back without change.
    pub fn carries_exactly(self, value: f64) -> bool {
        let integer = value.fract() == 0.0;
        match self {
            ElementType::F32 => true,
            ElementType::F16 => half::f16::from_f64(value).to_f64() == value || value.is_nan(),
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
    fn views_share_one_buffer_and_copy_only_when_written() {
        let buffer: Arc<dyn SharedElements> = Arc::new(vec![1.0f32, 2.0, 3.0, 4.0]);
        let mut second = TensorData::view(Arc::clone(&buffer), 2..4).unwrap();
        let first = TensorData::view(Arc::clone(&buffer), 0..2).unwrap();
        assert_eq!((first.as_slice(), second.as_slice()), (&[1.0, 2.0][..], &[3.0, 4.0][..]));
        assert!(second.is_view() && Arc::strong_count(&buffer) == 3);
        second[0] = 9.0;
        assert!(!second.is_view(), "a write makes the view its own copy");
        assert_eq!((second.as_slice(), buffer.elements()), (&[9.0, 4.0][..], &[1.0, 2.0, 3.0, 4.0][..]));
        assert!(TensorData::view(Arc::clone(&buffer), 3..5).is_none(), "a range past the buffer is refused");
        assert_eq!(first.clone().into_vec(), vec![1.0, 2.0]);
    }

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
