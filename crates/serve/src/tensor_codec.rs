//! The KServe tensors of a model from a model repository, as its configuration
//! declares them: which inputs a request must carry, with which shapes, and how the
//! worker's outputs become the response.
//!
//! For a model with `max_batch_size > 0` the client's shapes are `[batch] + dims`
//! (Triton's convention): a request carries a client batch of `1 ≤ N ≤ max_batch_size`
//! items, the same N on every input. The decoded tensors keep the leading N (the
//! request's rows; the stage program hands the data plane one batch element per row,
//! and the policy counts the request as N items), and the outputs come back with the
//! request's N rows. A model with `max_batch_size = 0` is sent its whole input, of any
//! shape (scalars, dynamic dimensions, a batch axis anywhere), and runs one request per
//! call: its tensors go to the data plane as they are and its outputs come back as they
//! are. `-1` in a declared dimension takes any size.
//!
//! Element types: every type of the protocol — BOOL, the integers of 8 to 64 bits,
//! FP16, BF16, FP32, FP64 and BYTES — travels in its own type, exactly, from the
//! request's bytes to ONNX Runtime and back (`yardmaster_dataplane::ElementType`).
//!
//! Copies: a request's fixed-width input becomes a view of the buffer it came in when
//! its bytes are aligned for their type (the data plane hands them to ONNX Runtime in
//! place), else it is copied once into an aligned buffer; an output's bytes go to the
//! response as a slice of the data plane's buffer (ONNX Runtime's), not copied.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use yardmaster_dataplane::{ElementType, SharedBytes, Tensor as PlaneTensor};

use super::api::TensorSpec;
use super::kserve::{DataType, InferRequest, Tensor, TensorData as WireData};
use yardmaster_dataplane::TensorData;

/// One declared tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorDecl {
    /// Name in the graph and on the wire.
    pub name: String,
    /// Shape as clients send or receive it (with the batch dimension when the model
    /// batches); `-1` is any size.
    pub shape: Vec<i64>,
    /// Element type on the wire.
    pub datatype: DataType,
    /// The configuration's `reshape`: the shape the model sees (without the batch
    /// dimension when the model batches; `-1` as in `shape`), when it differs from
    /// what clients send or receive.
    pub reshape: Option<Vec<i64>>,
}

impl TensorDecl {
    /// A declared tensor that the model sees as clients send it (no `reshape`).
    pub fn new(name: &str, shape: Vec<i64>, datatype: DataType) -> Self {
        TensorDecl { name: name.into(), shape, datatype, reshape: None }
    }
}

/// `dims` (one item's, or a whole input's, declared as `from`) in the shape `to`
/// declares: its fixed dimensions as they are, each `-1` taking the size of the next
/// `-1` dimension of `from` in order when that keeps the element count, else a single
/// `-1` taking the one size that does. `None` when no shape of `to` has the count.
fn reshaped(dims: &[usize], from: &[i64], to: &[i64]) -> Option<Vec<usize>> {
    let count: usize = dims.iter().product();
    let open_in_to = to.iter().filter(|d| **d < 0).count();
    // The `-1`s of `to` take the `-1` sizes of `from`, in order.
    let mut open = from.iter().zip(dims).filter(|(d, _)| **d < 0).map(|(_, &size)| size);
    let in_order: Option<Vec<usize>> = to.iter().map(|&d| if d >= 0 { Some(d as usize) } else { open.next() }).collect();
    if let Some(shape) = in_order.filter(|s| s.iter().product::<usize>() == count) {
        return Some(shape);
    }
    // Else a single `-1` is whatever keeps the element count.
    if open_in_to != 1 {
        return None;
    }
    let known: usize = to.iter().filter(|d| **d >= 0).map(|&d| d as usize).product();
    if known == 0 || !count.is_multiple_of(known) {
        return None;
    }
    Some(to.iter().map(|&d| if d >= 0 { d as usize } else { count / known }).collect())
}

/// The data plane's element type for a wire type (every one has one).
pub fn element_type(datatype: DataType) -> Option<ElementType> {
    Some(match datatype {
        DataType::F32 => ElementType::F32,
        DataType::F64 => ElementType::F64,
        DataType::F16 => ElementType::F16,
        DataType::Bf16 => ElementType::Bf16,
        DataType::I8 => ElementType::I8,
        DataType::I16 => ElementType::I16,
        DataType::I32 => ElementType::I32,
        DataType::I64 => ElementType::I64,
        DataType::U8 => ElementType::U8,
        DataType::U16 => ElementType::U16,
        DataType::U32 => ElementType::U32,
        DataType::U64 => ElementType::U64,
        DataType::Bool => ElementType::Bool,
        DataType::Bytes => ElementType::Bytes,
    })
}

/// A repository model's tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorCodec {
    /// Inputs, in the graph's order.
    pub inputs: Vec<TensorDecl>,
    /// Outputs, in the graph's order (the order the worker returns them).
    pub outputs: Vec<TensorDecl>,
    /// The model batches (`max_batch_size > 0`): shapes lead with the batch dimension.
    pub batching: bool,
    /// The largest client batch a request may carry (`max_batch_size`; 0 when the
    /// model does not batch).
    pub max_batch_size: u32,
}

impl TensorCodec {
    /// Input specs, for metadata.
    pub fn input_specs(&self) -> Vec<TensorSpec> {
        self.inputs.iter().map(|t| TensorSpec { name: t.name.clone(), datatype: t.datatype, shape: t.shape.clone() }).collect()
    }

    /// Output specs, for metadata.
    pub fn output_specs(&self) -> Vec<TensorSpec> {
        self.outputs.iter().map(|t| TensorSpec { name: t.name.clone(), datatype: t.datatype, shape: t.shape.clone() }).collect()
    }

    /// The worker's tensors for a request, or why the request's inputs do not fit. A
    /// batching model's tensors keep the request's leading dimension N (its rows, the
    /// same on every input, `1 ≤ N ≤ max_batch_size`); a `reshape` applies to each row.
    pub fn decode(&self, request: &InferRequest) -> Result<Vec<PlaneTensor>, String> {
        let mut tensors = Vec::with_capacity(self.inputs.len());
        let mut rows: Option<(&str, u64)> = None;
        for decl in &self.inputs {
            let name = &decl.name;
            let tensor = request.inputs.iter().find(|t| &t.name == name).ok_or_else(|| format!("input {name:?} is missing"))?;
            if tensor.datatype != decl.datatype {
                return Err(format!("input {name:?} must be {}, got {}", decl.datatype.name(), tensor.datatype.name()));
            }
            check_shape(name, &tensor.shape, &decl.shape, self.batching)?;
            if self.batching {
                let n = tensor.shape[0];
                if n > u64::from(self.max_batch_size) {
                    return Err(format!("input {name:?} carries a batch of {n}, over max_batch_size {}", self.max_batch_size));
                }
                match rows {
                    Some((first, m)) if m != n => {
                        return Err(format!(
                            "input {name:?} carries a batch of {n}, input {first:?} a batch of {m}: every input of a request has the same batch size"
                        ))
                    }
                    _ => rows = Some((name, n)),
                }
            }
            let values = carried(tensor, decl.datatype)?;
            let from = usize::from(self.batching);
            let mut shape: Vec<usize> = tensor.shape[from..].iter().map(|&d| d as usize).collect();
            if let Some(to) = &decl.reshape {
                shape = reshaped(&shape, &decl.shape[from..], to)
                    .ok_or_else(|| format!("input {name:?}: shape {:?} does not reshape to {to:?}", tensor.shape))?;
            }
            if self.batching {
                shape.insert(0, tensor.shape[0] as usize);
            }
            tensors.push(PlaneTensor::new(shape, values).map_err(|e| format!("input {name:?}: {e}"))?);
        }
        Ok(tensors)
    }

    /// The rows (client batch size) of a request's decoded tensors: their leading
    /// dimension for a batching model, 1 otherwise.
    pub fn rows(&self, tensors: &[PlaneTensor]) -> u32 {
        match tensors.first() {
            Some(first) if self.batching => first.shape.first().map_or(1, |&n| n as u32),
            _ => 1,
        }
    }

    /// The response tensors for a request's outputs (a batching model's lead with the
    /// request's rows, as the stage program joined them; a `reshape` applies to each row).
    pub fn encode(&self, outputs: Vec<PlaneTensor>) -> Result<Vec<Tensor>, String> {
        if outputs.len() != self.outputs.len() {
            return Err(format!("the model produced {} outputs, its configuration declares {}", outputs.len(), self.outputs.len()));
        }
        self.outputs
            .iter()
            .zip(outputs)
            .map(|(decl, t)| {
                let from = usize::from(self.batching);
                if t.shape.len() < from {
                    return Err(format!("output {:?}: the model's output has no batch dimension", decl.name));
                }
                let (leading, item) = t.shape.split_at(from);
                let dims = match &decl.reshape {
                    // The model's shape back to the one clients are told.
                    Some(model) => reshaped(item, model, &decl.shape[from..]).ok_or_else(|| {
                        format!("output {:?}: the model's shape {:?} does not reshape to {:?}", decl.name, item, &decl.shape[from..])
                    })?,
                    None => item.to_vec(),
                };
                let shape: Vec<u64> = leading.iter().chain(dims.iter()).map(|&d| d as u64).collect();
                wire_tensor(&decl.name, decl.datatype, shape, &t.data)
            })
            .collect()
    }
}

/// A request's bytes as a buffer the data plane's tensors view.
struct WireBytes(Bytes);

impl SharedBytes for WireBytes {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// A range of the data plane's buffer (ONNX Runtime's output, say) as the bytes of a
/// response's tensor.
struct PlaneBytes {
    buffer: Arc<dyn SharedBytes>,
    range: Range<usize>,
}

impl AsRef<[u8]> for PlaneBytes {
    fn as_ref(&self) -> &[u8] {
        &self.buffer.bytes()[self.range.clone()]
    }
}

/// A request tensor's elements in the data plane's type for `datatype`: a view of the
/// request's own bytes where they are aligned for the type, else one copy; BYTES in
/// their binary layout.
fn carried(tensor: &Tensor, datatype: DataType) -> Result<TensorData, String> {
    let name = &tensor.name;
    let element = element_type(datatype).ok_or_else(|| format!("input {name:?}: {} is not carried", datatype.name()))?;
    let count = tensor.element_count() as usize;
    let data = match &tensor.data {
        WireData::Raw(bytes) => {
            let len = bytes.len();
            TensorData::shared_or_copied(element, Arc::new(WireBytes(bytes.clone())), 0..len, count)
        }
        // Strings are laid out once, in the binary layout the data plane keeps.
        WireData::Strings(items) if items.len() == count => {
            let mut layout = Vec::with_capacity(tensor.byte_size());
            tensor.write_binary(&mut layout);
            Ok(TensorData::from(yardmaster_dataplane::Elements::Bytes { data: layout, count }))
        }
        WireData::Strings(items) => {
            Err(yardmaster_dataplane::DataplaneError::Invalid(format!("{count} strings expected, got {}", items.len())))
        }
    };
    let data = data.map_err(|e| format!("input {name:?}: {e}"))?;
    if datatype == DataType::Bytes {
        // Refused here, as the client's error, rather than by the worker.
        let strings = data.strings().map_err(|e| format!("input {name:?}: {e}"))?;
        if let Some(k) = strings.into_iter().position(|range| data.bytes()[range].contains(&0)) {
            return Err(format!("input {name:?}: string {k} holds a NUL byte, which ONNX Runtime's strings cannot"));
        }
    }
    Ok(data)
}

/// An output of the data plane as the protocol's tensor of `datatype` (its bytes, or
/// its strings), refusing one of another element type.
fn wire_tensor(name: &str, datatype: DataType, shape: Vec<u64>, data: &TensorData) -> Result<Tensor, String> {
    if Some(data.element()) != element_type(datatype) {
        return Err(format!(
            "output {name:?}: the model produced {} elements, the configuration declares {}",
            data.element(),
            datatype.name()
        ));
    }
    if datatype == DataType::Bytes {
        let strings = data.strings().map_err(|e| format!("output {name:?}: {e}"))?;
        let items = strings.into_iter().map(|range| data.bytes()[range].to_vec()).collect();
        return Ok(Tensor { name: name.into(), datatype, shape, data: WireData::Strings(items) });
    }
    // The data plane's buffer itself, shared: no copy.
    let (buffer, range) = data.clone().into_shared();
    Tensor::raw_bytes(name, datatype, shape, Bytes::from_owner(PlaneBytes { buffer, range })).map_err(|e| e.0)
}

/// Check a request's shape against a declared one (`-1`: any size); a batching model's
/// items must not be empty, nor its batch.
fn check_shape(name: &str, got: &[u64], declared: &[i64], batching: bool) -> Result<(), String> {
    let fits = got.len() == declared.len() && got.iter().zip(declared).all(|(&g, &d)| d < 0 || g as i64 == d);
    if !fits {
        return Err(format!("input {name:?} must have shape {declared:?} (-1: any size), got {got:?}"));
    }
    if batching && got.first() == Some(&0) {
        return Err(format!("input {name:?} carries a batch of 0: a request carries 1 to max_batch_size items"));
    }
    // A model fed whole inputs may take an empty one (a request of no elements).
    if batching && got.contains(&0) {
        return Err(format!("input {name:?} has an empty dimension: {got:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batching codec of one input and one output of `width` elements.
    fn one_to_one(input: (&str, DataType), output: (&str, DataType), width: i64) -> TensorCodec {
        let decl = |(name, datatype): (&str, DataType)| TensorDecl::new(name, vec![-1, width], datatype);
        TensorCodec { inputs: vec![decl(input)], outputs: vec![decl(output)], batching: true, max_batch_size: 8 }
    }

    fn codec(batching: bool) -> TensorCodec {
        let shape = if batching { vec![-1, 3, -1] } else { vec![1, 3, 4] };
        TensorCodec {
            inputs: vec![TensorDecl::new("x", shape.clone(), DataType::F32)],
            outputs: vec![TensorDecl::new("y", shape, DataType::F32)],
            batching,
            max_batch_size: if batching { 4 } else { 0 },
        }
    }

    fn request(shape: Vec<u64>) -> InferRequest {
        let n: u64 = shape.iter().product();
        let data: Vec<f32> = (0..n).map(|i| i as f32).collect();
        InferRequest { inputs: vec![Tensor::f32("x", shape, &data).unwrap()], ..InferRequest::default() }
    }

    #[test]
    fn a_request_keeps_its_rows_on_the_way_in_and_out() {
        let batched = codec(true);
        for n in [1, 3, 4] {
            let tensors = batched.decode(&request(vec![n, 3, 5])).unwrap();
            assert_eq!(tensors[0].shape, vec![n as usize, 3, 5], "the rows stay in front");
            assert_eq!(batched.rows(&tensors), n as u32);
            let out = batched.encode(tensors).unwrap();
            assert_eq!(out[0].shape, vec![n, 3, 5]);
            assert_eq!(out[0].name, "y");
        }
        let fixed = codec(false);
        let whole = fixed.decode(&request(vec![1, 3, 4])).unwrap();
        assert_eq!(whole[0].shape, vec![1, 3, 4], "a model without a batch dimension gets its input whole");
        assert_eq!(fixed.rows(&whole), 1);
        assert_eq!(fixed.encode(whole).unwrap()[0].shape, vec![1, 3, 4]);
    }

    #[test]
    fn a_batch_over_max_batch_size_or_of_disagreeing_inputs_is_refused() {
        let batched = codec(true);
        let error = batched.decode(&request(vec![5, 3, 5])).unwrap_err();
        assert_eq!(error, "input \"x\" carries a batch of 5, over max_batch_size 4");
        let mut two = batched.clone();
        two.inputs.push(TensorDecl::new("z", vec![-1, 2], DataType::F32));
        let mut r = request(vec![3, 3, 5]);
        r.inputs.push(Tensor::f32("z", vec![2, 2], &[0.0; 4]).unwrap());
        let error = two.decode(&r).unwrap_err();
        assert!(error.contains("input \"z\" carries a batch of 2, input \"x\" a batch of 3"), "{error}");
        assert!(batched.decode(&request(vec![0, 3, 5])).unwrap_err().contains("a batch of 0"));
    }

    #[test]
    fn reshape_gives_the_model_its_shape_and_clients_theirs() {
        assert_eq!(reshaped(&[15], &[15], &[5, 3]), Some(vec![5, 3]));
        assert_eq!(reshaped(&[1], &[1], &[]), Some(vec![]), "a scalar");
        assert_eq!(reshaped(&[2, 6], &[-1, 6], &[-1, 2, 3]), Some(vec![2, 2, 3]), "open dimensions in order");
        assert_eq!(reshaped(&[4, 6], &[4, -1], &[-1]), Some(vec![24]), "one open dimension from the count");
        assert_eq!(reshaped(&[7], &[-1], &[2, -1]), None, "7 does not split in twos");
        let mut codec = codec(true);
        codec.inputs[0].reshape = Some(vec![-1, 3]);
        codec.outputs[0].reshape = Some(vec![-1, 3]);
        let tensors = codec.decode(&request(vec![2, 3, 5])).unwrap();
        assert_eq!(tensors[0].shape, vec![2, 5, 3], "the model sees its reshape, row by row");
        let out = codec.encode(vec![PlaneTensor::new(vec![2, 5, 3], vec![0.0; 30]).unwrap()]).unwrap();
        assert_eq!(out[0].shape, vec![2, 3, 5], "clients get the declared shape back");
    }

    #[test]
    fn half_precision_travels_exactly_both_ways() {
        let codec = one_to_one(("x", DataType::F16), ("y", DataType::F16), 4);
        // Values only half precision holds exactly: a subnormal, the largest, a fraction.
        let values = [half::f16::from_bits(1), half::f16::MAX, half::f16::from_f32(-0.333), half::f16::from_f32(2049.0)];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let input = Tensor::raw("x", DataType::F16, vec![1, 4], bytes.clone()).unwrap();
        let tensors = codec.decode(&InferRequest { inputs: vec![input], ..InferRequest::default() }).unwrap();
        assert_eq!(tensors[0].data.as_slice_of::<half::f16>(), Some(&values[..]), "carried as half precision");
        let out = codec.encode(tensors).unwrap();
        assert_eq!(out[0].datatype, DataType::F16);
        assert_eq!(out[0].data, WireData::Raw(bytes.into()), "the same bytes come back");
    }

    /// `values` at byte `offset` of a buffer whose start is aligned for 8-byte words.
    fn placed(values: &[f32], offset: usize) -> Bytes {
        struct Words(Vec<u64>);
        impl AsRef<[u8]> for Words {
            fn as_ref(&self) -> &[u8] {
                bytemuck::cast_slice(&self.0)
            }
        }
        let mut words = Words(vec![0u64; (offset + 4 * values.len()).div_ceil(8)]);
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut words.0);
        for (i, v) in values.iter().enumerate() {
            bytes[offset + 4 * i..offset + 4 * i + 4].copy_from_slice(&v.to_le_bytes());
        }
        Bytes::from_owner(words).slice(offset..offset + 4 * values.len())
    }

    #[test]
    fn aligned_inputs_are_viewed_in_place_and_outputs_are_not_copied() {
        let codec = one_to_one(("x", DataType::F32), ("y", DataType::F32), 3);
        let values = [1.5f32, -2.0, 7.25];
        let decode = |wire: &Bytes| {
            let input = Tensor::raw_bytes("x", DataType::F32, vec![1, 3], wire.clone()).unwrap();
            codec.decode(&InferRequest { inputs: vec![input], ..InferRequest::default() }).unwrap()
        };
        let aligned = placed(&values, 8);
        let tensors = decode(&aligned);
        assert!(tensors[0].data.is_view() && tensors[0].data.shares(&aligned), "aligned: the request's bytes, viewed");
        let misaligned = placed(&values, 9);
        let copied = decode(&misaligned);
        assert!(!copied[0].data.is_view(), "misaligned: copied once, into an aligned buffer");
        assert_eq!(copied[0].data.as_f32(), Some(&values[..]));
        let out = codec.encode(tensors).unwrap();
        let WireData::Raw(sent) = &out[0].data else { panic!("raw") };
        assert_eq!(sent.as_ptr(), aligned.as_ptr(), "the output's bytes are the data plane's buffer, not a copy");
        assert_eq!(out[0].as_f32().unwrap(), values);
    }

    #[test]
    fn wrong_inputs_are_refused_with_the_reason() {
        let batched = codec(true);
        let cases = [
            (request(vec![9, 3, 5]), "a batch of 9, over max_batch_size 4"),
            (request(vec![1, 4, 5]), "must have shape"),
            (request(vec![1, 3]), "must have shape"),
            (request(vec![1, 3, 0]), "empty dimension"),
        ];
        for (r, reason) in cases {
            let error = batched.decode(&r).unwrap_err();
            assert!(error.contains(reason), "{error}");
        }
        let missing = InferRequest::default();
        assert!(batched.decode(&missing).unwrap_err().contains("missing"));
        let mut ints = request(vec![1, 3, 5]);
        ints.inputs[0].datatype = DataType::I64;
        ints.inputs[0].data = WireData::Raw(vec![0; 15 * 8].into());
        assert!(batched.decode(&ints).unwrap_err().contains("must be FP32"));
        assert!(codec(false).decode(&request(vec![1, 3, 5])).unwrap_err().contains("must have shape"));
    }

    #[test]
    fn every_type_travels_exactly_in_its_own_type() {
        let codec = one_to_one(("ids", DataType::I64), ("n", DataType::I64), 3);
        let values = [i64::MAX, -(1 << 60), (1 << 24) + 1];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let request =
            InferRequest { inputs: vec![Tensor::raw("ids", DataType::I64, vec![1, 3], bytes.clone()).unwrap()], ..InferRequest::default() };
        let tensors = codec.decode(&request).unwrap();
        assert_eq!(tensors[0].data.as_slice_of::<i64>(), Some(&values[..]), "beyond 2^24 and 2^53, exactly");
        let out = codec.encode(tensors).unwrap();
        assert_eq!(out[0].data, WireData::Raw(bytes.into()), "the same bytes come back");
        // Strings: any bytes, in and out.
        let words = one_to_one(("text", DataType::Bytes), ("echo", DataType::Bytes), 2);
        let strings = WireData::Strings(vec![b"caf\xc3\xa9".to_vec(), vec![0xff, 0x01]]);
        let input = Tensor { name: "text".into(), datatype: DataType::Bytes, shape: vec![1, 2], data: strings.clone() };
        let tensors = words.decode(&InferRequest { inputs: vec![input], ..InferRequest::default() }).unwrap();
        assert_eq!(tensors[0].data.len(), 2);
        assert_eq!(words.encode(tensors).unwrap()[0].data, strings);
        let nul = WireData::Strings(vec![b"ok".to_vec(), b"a\0b".to_vec()]);
        let input = Tensor { name: "text".into(), datatype: DataType::Bytes, shape: vec![1, 2], data: nul };
        let error = words.decode(&InferRequest { inputs: vec![input], ..InferRequest::default() }).unwrap_err();
        assert_eq!(error, "input \"text\": string 1 holds a NUL byte, which ONNX Runtime's strings cannot");
        // An output of another type than declared is an error naming both.
        let wrong = codec.encode(vec![PlaneTensor::new(vec![3], vec![2.0f32, -5.0, 9.0]).unwrap()]).unwrap_err();
        assert!(wrong.contains("float32") && wrong.contains("INT64"), "{wrong}");
    }
}
