//! Host tensors: a shape and typed elements in row-major order. Requests carry one per
//! model input, without the batch dimension; batches carry it first.
//!
//! Every tensor travels in its own element type ([`ElementType`]): the integers of 8 to
//! 64 bits, signed and unsigned, half, bfloat16, single and double precision floats,
//! booleans (one byte, 0 or 1) and BYTES (each element a byte string). Numeric elements
//! are held as a `Vec` of their type ([`Elements`]) and handed to ONNX Runtime as they
//! are; BYTES elements are held as Triton's binary layout (each string after its
//! 4-byte little-endian length).
//!
//! A tensor's elements ([`TensorData`]) are either its own or a view of a buffer shared
//! with other tensors: a batch's outputs are split per request as views of the one
//! buffer ONNX Runtime wrote, not copied; the buffer is freed with its last view. A
//! server hands the data plane views of the request's own receive buffer where its
//! bytes are aligned for their type ([`TensorData::shared_or_copied`]). Either way a
//! clone shares the elements (a reference count, not a copy); a write copies them
//! first when they are shared.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use crate::error::{DataplaneError, Result};

/// An element type a tensor may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementType {
    /// `float32`.
    F32,
    /// `float64`.
    F64,
    /// `float16` (IEEE half precision).
    F16,
    /// `bfloat16`.
    Bf16,
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
    /// `uint64`.
    U64,
    /// `bool` (one byte, 0 or 1; read from bytes, any non-zero byte is true).
    Bool,
    /// Byte strings (ONNX `string`).
    Bytes,
}

impl ElementType {
    /// Whether its values are integers (signed or unsigned; not `bool`).
    pub fn is_integer(self) -> bool {
        use ElementType::*;
        matches!(self, I8 | I16 | I32 | I64 | U8 | U16 | U32 | U64)
    }

    /// Bytes per element (`None` for BYTES, whose elements vary).
    pub fn width(self) -> Option<usize> {
        Some(match self {
            ElementType::F64 | ElementType::I64 | ElementType::U64 => 8,
            ElementType::F32 | ElementType::I32 | ElementType::U32 => 4,
            ElementType::F16 | ElementType::Bf16 | ElementType::I16 | ElementType::U16 => 2,
            ElementType::I8 | ElementType::U8 | ElementType::Bool => 1,
            ElementType::Bytes => return None,
        })
    }
}

impl fmt::Display for ElementType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            ElementType::F32 => "float32",
            ElementType::F64 => "float64",
            ElementType::F16 => "float16",
            ElementType::Bf16 => "bfloat16",
            ElementType::I8 => "int8",
            ElementType::I16 => "int16",
            ElementType::I32 => "int32",
            ElementType::I64 => "int64",
            ElementType::U8 => "uint8",
            ElementType::U16 => "uint16",
            ElementType::U32 => "uint32",
            ElementType::U64 => "uint64",
            ElementType::Bool => "bool",
            ElementType::Bytes => "string",
        };
        f.write_str(name)
    }
}

/// A numeric element type held in a `Vec` of itself.
pub trait Element: bytemuck::Pod + Send + Sync + fmt::Debug {
    /// Its element type.
    const TYPE: ElementType;
    /// Its `Vec` as [`Elements`].
    fn into_elements(values: Vec<Self>) -> Elements;
}

macro_rules! elements {
    ($($variant:ident($ty:ty)),* $(,)?) => {
        /// A tensor's own elements, in a `Vec` of their type.
        #[derive(Clone, PartialEq)]
        pub enum Elements {
            $(
                #[doc = concat!("`", stringify!($ty), "` elements.")]
                $variant(Vec<$ty>),
            )*
            /// Booleans, one byte each (0 or 1).
            Bool(Vec<u8>),
            /// BYTES: each string after its 4-byte little-endian length, and how many.
            Bytes {
                /// The strings in Triton's binary layout.
                data: Vec<u8>,
                /// How many strings.
                count: usize,
            },
        }

        $(
            impl Element for $ty {
                const TYPE: ElementType = ElementType::$variant;
                fn into_elements(values: Vec<Self>) -> Elements {
                    Elements::$variant(values)
                }
            }

        )*

        impl Elements {
            /// Their element type.
            pub fn element(&self) -> ElementType {
                match self {
                    $(Elements::$variant(_) => ElementType::$variant,)*
                    Elements::Bool(_) => ElementType::Bool,
                    Elements::Bytes { .. } => ElementType::Bytes,
                }
            }

            /// How many elements.
            pub fn len(&self) -> usize {
                match self {
                    $(Elements::$variant(v) => v.len(),)*
                    Elements::Bool(v) => v.len(),
                    Elements::Bytes { count, .. } => *count,
                }
            }

            /// Whether there are none.
            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }

            /// Their bytes (little-endian on this machine's order, which every
            /// supported target has; BYTES in their binary layout).
            pub fn bytes(&self) -> &[u8] {
                match self {
                    $(Elements::$variant(v) => bytemuck::cast_slice(v),)*
                    Elements::Bool(v) => v,
                    Elements::Bytes { data, .. } => data,
                }
            }

            /// The bytes of numeric elements, for writing (BYTES: their layout).
            pub fn bytes_mut(&mut self) -> &mut [u8] {
                match self {
                    $(Elements::$variant(v) => bytemuck::cast_slice_mut(v),)*
                    Elements::Bool(v) => v,
                    Elements::Bytes { data, .. } => data,
                }
            }

            /// `len` elements of `element`, all zero (BYTES: empty strings).
            pub fn zeros(element: ElementType, len: usize) -> Elements {
                match element {
                    $(ElementType::$variant => Elements::$variant(vec![<$ty as bytemuck::Zeroable>::zeroed(); len]),)*
                    ElementType::Bool => Elements::Bool(vec![0; len]),
                    ElementType::Bytes => Elements::Bytes { data: vec![0; 4 * len], count: len },
                }
            }

            /// Elements of `element` from their little-endian bytes (one copy); BYTES
            /// from their binary layout, `count` strings.
            pub fn from_bytes(element: ElementType, bytes: &[u8], count: usize) -> Result<Elements> {
                fn typed<T: bytemuck::Pod>(bytes: &[u8]) -> Vec<T> {
                    let count = bytes.len() / std::mem::size_of::<T>();
                    let mut values = vec![<T as bytemuck::Zeroable>::zeroed(); count];
                    bytemuck::cast_slice_mut::<T, u8>(&mut values).copy_from_slice(&bytes[..count * std::mem::size_of::<T>()]);
                    values
                }
                if let Some(width) = element.width() {
                    if bytes.len() != count * width {
                        return Err(DataplaneError::Invalid(format!("{count} {element} elements need {} bytes, got {}", count * width, bytes.len())));
                    }
                }
                Ok(match element {
                    $(ElementType::$variant => Elements::$variant(typed::<$ty>(bytes)),)*
                    // Any non-zero byte is true, as C++ and numpy read a bool.
                    ElementType::Bool => Elements::Bool(bytes.iter().map(|&b| u8::from(b != 0)).collect()),
                    ElementType::Bytes => {
                        let found = string_offsets(bytes)?.len();
                        if found != count {
                            return Err(DataplaneError::Invalid(format!("{count} strings expected, the bytes hold {found}")));
                        }
                        Elements::Bytes { data: bytes.to_vec(), count }
                    }
                })
            }
        }
    };
}

elements!(F32(f32), F64(f64), F16(half::f16), Bf16(half::bf16), I8(i8), I16(i16), I32(i32), I64(i64), U8(u8), U16(u16), U32(u32), U64(u64),);

impl fmt::Debug for Elements {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} × {}", self.len(), self.element())
    }
}

/// Whether `pointer` is aligned for elements of `element` (BYTES: any address).
fn aligned_for(element: ElementType, pointer: *const u8) -> bool {
    let align = match element {
        ElementType::F32 => std::mem::align_of::<f32>(),
        ElementType::F64 => std::mem::align_of::<f64>(),
        ElementType::F16 | ElementType::Bf16 => std::mem::align_of::<half::f16>(),
        ElementType::I8 | ElementType::U8 | ElementType::Bool | ElementType::Bytes => 1,
        ElementType::I16 | ElementType::U16 => std::mem::align_of::<u16>(),
        ElementType::I32 | ElementType::U32 => std::mem::align_of::<u32>(),
        ElementType::I64 | ElementType::U64 => std::mem::align_of::<u64>(),
    };
    (pointer as usize).is_multiple_of(align)
}

/// Where each string of a BYTES buffer starts and ends (after its length), checked.
pub fn string_offsets(bytes: &[u8]) -> Result<Vec<Range<usize>>> {
    let mut offsets = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let Some(length) = bytes.get(at..at + 4) else {
            return Err(DataplaneError::Invalid(format!("a string's length is cut short at byte {at}")));
        };
        let length = u32::from_le_bytes(length.try_into().expect("4 bytes")) as usize;
        let start = at + 4;
        if start + length > bytes.len() {
            return Err(DataplaneError::Invalid(format!("a string of {length} bytes at byte {at} runs past the end")));
        }
        offsets.push(start..start + length);
        at = start + length;
    }
    Ok(offsets)
}

/// A buffer of bytes several tensors may view (ONNX Runtime's output of a whole batch,
/// for one). Its start is aligned for its element type.
pub trait SharedBytes: Send + Sync {
    /// Every byte of the buffer.
    fn bytes(&self) -> &[u8];
}

impl SharedBytes for Elements {
    fn bytes(&self) -> &[u8] {
        Elements::bytes(self)
    }
}

/// A tensor's elements: its own, or a range of a shared buffer. Cloning shares them.
#[derive(Clone)]
pub struct TensorData(Storage);

#[derive(Clone)]
enum Storage {
    /// Shared by clones; copied on write while shared.
    Owned(Arc<Elements>),
    /// `range` is in bytes; `element` is never BYTES.
    View { element: ElementType, buffer: Arc<dyn SharedBytes>, range: Range<usize> },
}

impl TensorData {
    /// A view of the bytes `range` of a shared `buffer` holding `element`s (no copy);
    /// `None` when the range is not inside the buffer, is not whole elements, does not
    /// start at an address aligned for the element type, or the element type is BYTES.
    pub fn view(element: ElementType, buffer: Arc<dyn SharedBytes>, range: Range<usize>) -> Option<Self> {
        let width = element.width()?;
        let bytes = buffer.bytes();
        let fits = range.start <= range.end && range.end <= bytes.len();
        // (An empty range reads nothing, wherever it points.)
        let aligned = fits && (range.is_empty() || aligned_for(element, bytes[range.start..].as_ptr()));
        (aligned && range.len().is_multiple_of(width)).then_some(TensorData(Storage::View { element, buffer, range }))
    }

    /// `count` elements of `element` at the bytes `range` of `buffer` (a request's
    /// receive buffer, say): a view of them where they can be read in place — aligned
    /// for their type, and for `bool` every byte 0 or 1 — else one copy of them
    /// ([`TensorData::from_bytes`]; BYTES always).
    pub fn shared_or_copied(element: ElementType, buffer: Arc<dyn SharedBytes>, range: Range<usize>, count: usize) -> Result<Self> {
        let bytes = buffer
            .bytes()
            .get(range.clone())
            .ok_or_else(|| DataplaneError::Invalid(format!("bytes {range:?} of a buffer of {} bytes", buffer.bytes().len())))?;
        if let Some(width) = element.width() {
            if bytes.len() != count * width {
                return Err(DataplaneError::Invalid(format!(
                    "{count} {element} elements need {} bytes, got {}",
                    count * width,
                    bytes.len()
                )));
            }
            // (No elements: nothing to share; an owned empty buffer is aligned.)
            let readable = !bytes.is_empty() && (element != ElementType::Bool || bytes.iter().all(|&b| b <= 1));
            if readable {
                if let Some(view) = TensorData::view(element, Arc::clone(&buffer), range.clone()) {
                    return Ok(view);
                }
            }
        }
        TensorData::from_bytes(element, bytes, count)
    }

    /// Elements of any numeric type, owned (no copy).
    pub fn from_vec<T: Element>(values: Vec<T>) -> Self {
        TensorData(Storage::Owned(Arc::new(T::into_elements(values))))
    }

    /// Elements of `element` from little-endian bytes, `count` of them (one copy).
    pub fn from_bytes(element: ElementType, bytes: &[u8], count: usize) -> Result<Self> {
        Ok(TensorData(Storage::Owned(Arc::new(Elements::from_bytes(element, bytes, count)?))))
    }

    /// Whether the elements are these bytes in place (not a copy of them): for tests
    /// and checks that a path does not copy.
    pub fn shares(&self, bytes: &[u8]) -> bool {
        let own = self.bytes();
        own.as_ptr() == bytes.as_ptr() && own.len() == bytes.len()
    }

    /// Their element type.
    pub fn element(&self) -> ElementType {
        match &self.0 {
            Storage::Owned(elements) => elements.element(),
            Storage::View { element, .. } => *element,
        }
    }

    /// How many elements.
    pub fn len(&self) -> usize {
        match &self.0 {
            Storage::Owned(elements) => elements.len(),
            Storage::View { element, range, .. } => range.len() / element.width().unwrap_or(1),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements' bytes (BYTES in their binary layout).
    pub fn bytes(&self) -> &[u8] {
        match &self.0 {
            Storage::Owned(elements) => elements.bytes(),
            Storage::View { buffer, range, .. } => &buffer.bytes()[range.clone()],
        }
    }

    /// The elements as a slice of `T`, when they are `T`s.
    pub fn as_slice_of<T: Element>(&self) -> Option<&[T]> {
        (self.element() == T::TYPE).then(|| bytemuck::try_cast_slice(self.bytes()).ok()).flatten()
    }

    /// The elements as `f32`s, when they are.
    pub fn as_f32(&self) -> Option<&[f32]> {
        self.as_slice_of::<f32>()
    }

    /// The `f32` elements of a tensor the data plane's own pipelines made in `f32`
    /// (OCR, profiling, tests). Panics on another element type: a typed tensor is read
    /// with [`TensorData::as_slice_of`].
    pub fn floats(&self) -> &[f32] {
        self.as_f32().unwrap_or_else(|| panic!("{} elements read as float32", self.element()))
    }

    /// The `f32` elements for writing (a view is copied into its own first); `None`
    /// for another element type.
    pub fn as_f32_mut(&mut self) -> Option<&mut [f32]> {
        if let Storage::View { element: ElementType::F32, .. } = &self.0 {
            let owned = self.as_f32()?.to_vec();
            self.0 = Storage::Owned(Arc::new(Elements::F32(owned)));
        }
        match &mut self.0 {
            Storage::Owned(elements) if elements.element() == ElementType::F32 => match Arc::make_mut(elements) {
                Elements::F32(values) => Some(values),
                _ => None,
            },
            _ => None,
        }
    }

    /// The strings of a BYTES tensor, each a range of [`TensorData::bytes`].
    pub fn strings(&self) -> Result<Vec<Range<usize>>> {
        if self.element() != ElementType::Bytes {
            return Err(DataplaneError::Invalid(format!("{} elements are not strings", self.element())));
        }
        string_offsets(self.bytes())
    }

    /// The elements as a shared buffer and the bytes range of it they are (owned
    /// elements become the buffer, without a copy).
    pub fn into_shared(self) -> (Arc<dyn SharedBytes>, Range<usize>) {
        match self.0 {
            Storage::Owned(elements) => {
                let len = elements.bytes().len();
                (elements as Arc<dyn SharedBytes>, 0..len)
            }
            Storage::View { buffer, range, .. } => (buffer, range),
        }
    }

    /// Whether the elements are a view of a shared buffer.
    pub fn is_view(&self) -> bool {
        matches!(self.0, Storage::View { .. })
    }

    /// The elements as their own [`Elements`] (moved when owned, copied from a view).
    pub fn into_elements(self) -> Elements {
        match self.0 {
            Storage::Owned(elements) => Arc::try_unwrap(elements).unwrap_or_else(|shared| (*shared).clone()),
            Storage::View { element, buffer, range } => {
                let count = range.len() / element.width().unwrap_or(1);
                Elements::from_bytes(element, &buffer.bytes()[range], count).expect("a view holds whole elements")
            }
        }
    }
}

/// `f32` elements (the type float literals take: other types go through
/// [`TensorData::from_vec`], so that `vec![1.0, 2.0]` stays `f32`).
impl From<Vec<f32>> for TensorData {
    fn from(values: Vec<f32>) -> Self {
        TensorData(Storage::Owned(Arc::new(Elements::F32(values))))
    }
}

impl From<Elements> for TensorData {
    fn from(elements: Elements) -> Self {
        TensorData(Storage::Owned(Arc::new(elements)))
    }
}

impl FromIterator<f32> for TensorData {
    fn from_iter<I: IntoIterator<Item = f32>>(iter: I) -> Self {
        iter.into_iter().collect::<Vec<f32>>().into()
    }
}

impl Default for TensorData {
    fn default() -> Self {
        Vec::<f32>::new().into()
    }
}

impl fmt::Debug for TensorData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.as_f32() {
            Some(values) => values.fmt(f),
            None => write!(f, "{} × {} ({} bytes)", self.len(), self.element(), self.bytes().len()),
        }
    }
}

impl PartialEq for TensorData {
    fn eq(&self, other: &Self) -> bool {
        self.element() == other.element() && self.len() == other.len() && self.bytes() == other.bytes()
    }
}

impl PartialEq<Vec<f32>> for TensorData {
    fn eq(&self, other: &Vec<f32>) -> bool {
        self.as_f32() == Some(other.as_slice())
    }
}

impl PartialEq<[f32]> for TensorData {
    fn eq(&self, other: &[f32]) -> bool {
        self.as_f32() == Some(other)
    }
}

/// A dense tensor on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Elements, row-major; as many as the product of `shape`.
    pub data: TensorData,
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

    /// An `f32` tensor filled with `value`.
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

    /// Its element type.
    pub fn element(&self) -> ElementType {
        self.data.element()
    }

    /// The largest absolute difference to `other`, for `f32` tensors (infinite when
    /// shapes or element types differ).
    pub fn max_abs_diff(&self, other: &Tensor) -> f32 {
        match (self.data.as_f32(), other.data.as_f32()) {
            (Some(a), Some(b)) if self.shape == other.shape => a.iter().zip(b).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max),
            _ => f32::INFINITY,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_share_one_buffer_and_copy_only_when_written() {
        let buffer: Arc<dyn SharedBytes> = Arc::new(Elements::F32(vec![1.0, 2.0, 3.0, 4.0]));
        let mut second = TensorData::view(ElementType::F32, Arc::clone(&buffer), 8..16).unwrap();
        let first = TensorData::view(ElementType::F32, Arc::clone(&buffer), 0..8).unwrap();
        assert_eq!((first.floats(), second.floats()), (&[1.0, 2.0][..], &[3.0, 4.0][..]));
        assert!(second.is_view() && Arc::strong_count(&buffer) == 3);
        second.as_f32_mut().unwrap()[0] = 9.0;
        assert!(!second.is_view(), "a write makes the view its own copy");
        assert_eq!((second.floats(), bytemuck::cast_slice::<u8, f32>(buffer.bytes())), (&[9.0, 4.0][..], &[1.0, 2.0, 3.0, 4.0][..]));
        assert!(TensorData::view(ElementType::F32, Arc::clone(&buffer), 12..20).is_none(), "a range past the buffer is refused");
        assert!(TensorData::view(ElementType::F32, Arc::clone(&buffer), 2..6).is_none(), "a range of part elements is refused");
        assert_eq!(first.into_elements(), Elements::F32(vec![1.0, 2.0]));
    }

    #[test]
    fn clones_share_the_elements_and_a_write_copies_them_first() {
        let original = TensorData::from(vec![1.0f32, 2.0]);
        let mut copy = original.clone();
        assert!(copy.shares(original.bytes()), "a clone is a reference, not a copy");
        copy.as_f32_mut().unwrap()[0] = 5.0;
        assert_eq!((original.floats(), copy.floats()), (&[1.0, 2.0][..], &[5.0, 2.0][..]), "the write went to a copy");
        let mut alone = TensorData::from(vec![3.0f32]);
        let before = alone.bytes().as_ptr();
        alone.as_f32_mut().unwrap()[0] = 4.0;
        assert_eq!(alone.bytes().as_ptr(), before, "unshared elements are written in place");
    }

    #[test]
    fn received_bytes_are_viewed_where_aligned_and_copied_once_where_not() {
        let words: Vec<u64> = vec![0, u64::from_le_bytes([1, 0, 0, 0, 2, 0, 0, 0]), 0];
        let buffer: Arc<dyn SharedBytes> = Arc::new(Elements::U64(words));
        let viewed = TensorData::shared_or_copied(ElementType::I32, Arc::clone(&buffer), 8..16, 2).unwrap();
        assert!(viewed.is_view() && viewed.shares(&buffer.bytes()[8..16]));
        assert_eq!(viewed.as_slice_of::<i32>(), Some(&[1, 2][..]));
        let shifted = TensorData::shared_or_copied(ElementType::I16, Arc::clone(&buffer), 7..11, 2).unwrap();
        assert!(!shifted.is_view(), "an odd address is copied into an aligned buffer");
        assert_eq!(shifted.as_slice_of::<i16>(), Some(&[256, 0][..]));
        assert!(TensorData::view(ElementType::I16, Arc::clone(&buffer), 7..11).is_none(), "views must be aligned");
        let bools = TensorData::shared_or_copied(ElementType::Bool, Arc::clone(&buffer), 8..13, 5).unwrap();
        assert!(!bools.is_view() && bools.bytes() == [1, 0, 0, 0, 1], "bytes other than 0 and 1 are read as bools in a copy");
        let flags = TensorData::shared_or_copied(ElementType::Bool, Arc::clone(&buffer), 8..10, 2).unwrap();
        assert!(flags.is_view(), "0s and 1s are bools as they are");
        assert!(TensorData::shared_or_copied(ElementType::I32, Arc::clone(&buffer), 8..16, 3).is_err(), "the count must fit");
        let none = TensorData::shared_or_copied(ElementType::I32, Arc::clone(&buffer), 9..9, 0).unwrap();
        assert_eq!(none.as_slice_of::<i32>(), Some(&[][..]), "no elements, wherever they would start");
        assert!(TensorData::shared_or_copied(ElementType::I32, buffer, 20..28, 2).is_err(), "the range must fit");
    }

    #[test]
    fn every_type_keeps_its_values_exactly() {
        let big = vec![i64::MAX, -(1 << 60), 16_777_217];
        let ints = TensorData::from_vec(big.clone());
        assert_eq!(ints.as_slice_of::<i64>(), Some(big.as_slice()), "beyond 2^24 and 2^53");
        assert!(ints.as_f32().is_none());
        let back = TensorData::from_bytes(ElementType::I64, ints.bytes(), 3).unwrap();
        assert_eq!(back, ints);
        let doubles = TensorData::from_vec(vec![0.1f64, 1e300]);
        assert_eq!(doubles.as_slice_of::<f64>(), Some(&[0.1, 1e300][..]));
        let unsigned = TensorData::from_vec(vec![u64::MAX]);
        assert_eq!(unsigned.as_slice_of::<u64>(), Some(&[u64::MAX][..]));
        let bools = TensorData::from_bytes(ElementType::Bool, &[0, 1, 103], 3).unwrap();
        assert_eq!(bools.bytes(), &[0, 1, 1], "any non-zero byte is true");
        assert!(TensorData::from_bytes(ElementType::I32, &[0; 7], 2).is_err(), "7 bytes are not two int32s");
    }

    #[test]
    fn strings_keep_their_bytes_and_count() {
        let layout = [&3u32.to_le_bytes()[..], b"abc", &0u32.to_le_bytes(), &2u32.to_le_bytes(), &[0xff, 0x00]].concat();
        let strings = TensorData::from_bytes(ElementType::Bytes, &layout, 3).unwrap();
        assert_eq!(strings.len(), 3);
        let ranges = strings.strings().unwrap();
        assert_eq!(&strings.bytes()[ranges[0].clone()], b"abc");
        assert!(ranges[1].is_empty());
        assert_eq!(&strings.bytes()[ranges[2].clone()], &[0xff, 0x00], "any bytes, not only UTF-8");
        assert!(TensorData::from_bytes(ElementType::Bytes, &layout, 2).is_err(), "the count must match");
        assert!(TensorData::from_bytes(ElementType::Bytes, &layout[..5], 1).is_err(), "a cut string is refused");
    }
}
