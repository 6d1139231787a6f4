//! Batch forming: per-request tensors are stacked into one batch along a new first
//! dimension (padding smaller ones with a fill value where the model's dimension is
//! dynamic, refusing where it is fixed), and batch outputs are split back per request.
//! Every element type stacks as its bytes; BYTES inputs stack when their shapes agree
//! (a string cannot be padded).
//!
//! A request that carries several rows (a client batch of N, its tensors leading with
//! N) is handed over as N batch elements ([`rows`]: views of its tensors, no copy), so
//! requests of different N stack, pad and split as items do; its N outputs are joined
//! back along a leading dimension of N ([`join_rows`]).

use std::sync::Arc;

use crate::error::{DataplaneError, Result};
use crate::tensor::{ElementType, Elements, Tensor, TensorData};

/// One input of a run as ONNX Runtime is given it: its shape, element type and bytes
/// (a request's own, or a stacked batch's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InputView<'a> {
    /// Dimensions, batch first where the model batches.
    pub shape: &'a [usize],
    /// Element type.
    pub element: ElementType,
    /// The elements' bytes (BYTES in their binary layout).
    pub bytes: &'a [u8],
}

/// What a model accepts on one input: its name and dimensions, batch first; `None`
/// marks a dynamic dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputSpec {
    /// Input name.
    pub name: String,
    /// Dimensions including the batch dimension; `None` is dynamic.
    pub dims: Vec<Option<usize>>,
}

impl InputSpec {
    /// The largest batch the model takes on this input (`None`: any).
    pub fn max_batch(&self) -> Option<usize> {
        self.dims.first().copied().flatten()
    }
}

/// A batch ready to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Stacked {
    /// One tensor per model input, batch dimension first.
    pub inputs: Vec<Tensor>,
    /// Number of requests.
    pub batch: usize,
    /// Whether any request was padded.
    pub padded: bool,
}

/// Stack `requests` (each one tensor per input, without batch dimension) into one batch.
pub fn stack(specs: &[InputSpec], requests: &[&[Tensor]], pad_value: f32) -> Result<Stacked> {
    let mut buffers = Vec::new();
    let (shapes, padded) = stack_into(specs, requests, pad_value, &mut buffers)?;
    let inputs = shapes.into_iter().zip(buffers).map(|(shape, data)| Tensor { shape, data: data.into() }).collect();
    Ok(Stacked { inputs, batch: requests.len(), padded })
}

/// [`stack`] into `buffers` (one per input, reused from batch to batch so a large
/// batch's memory is not mapped and faulted in afresh each time). Returns each input's
/// batch shape and whether any request was padded.
pub fn stack_into(
    specs: &[InputSpec],
    requests: &[&[Tensor]],
    pad_value: f32,
    buffers: &mut Vec<Elements>,
) -> Result<(Vec<Vec<usize>>, bool)> {
    let (shapes, padded) = shapes(specs, requests)?;
    fill(requests, &shapes, pad_value, buffers)?;
    Ok((shapes, padded))
}

/// Copy `requests` into `buffers`, one per input, as batches of `shapes` (from
/// [`shapes`] for these requests), padding `f32` inputs with `pad_value` and others
/// with zeros. Refuses requests whose input types differ, and BYTES that would need
/// padding.
pub fn fill(requests: &[&[Tensor]], shapes: &[Vec<usize>], pad_value: f32, buffers: &mut Vec<Elements>) -> Result<()> {
    buffers.resize_with(shapes.len(), || Elements::F32(Vec::new()));
    for ((k, shape), data) in shapes.iter().enumerate().zip(buffers.iter_mut()) {
        let target = &shape[1..];
        let element = requests[0][k].data.element();
        if let Some((i, other)) = requests.iter().enumerate().find(|(_, r)| r[k].data.element() != element) {
            return Err(DataplaneError::Batch(format!(
                "request {i}'s input {k} is {}, request 0's is {element}: one batch holds one element type",
                other[k].data.element()
            )));
        }
        if element == ElementType::Bytes {
            if let Some(i) = requests.iter().position(|r| r[k].shape != target) {
                return Err(DataplaneError::Batch(format!(
                    "request {i}'s strings (input {k}) have shape {:?}, the batch {target:?}: strings are not padded",
                    requests[i][k].shape
                )));
            }
            let bytes: Vec<u8> = requests.iter().flat_map(|r| r[k].data.bytes().iter().copied()).collect();
            *data = Elements::Bytes { data: bytes, count: requests.iter().map(|r| r[k].data.len()).sum() };
            continue;
        }
        let item: usize = target.iter().product();
        // Every element is written below (a request's own data, or the fill value where
        // it is padded), so a buffer of the right type and length is reused as it stands.
        if data.element() != element || data.len() != item * requests.len() {
            *data = Elements::zeros(element, item * requests.len());
        }
        let width = element.width().expect("not BYTES");
        let pad = if element == ElementType::F32 { pad_value.to_ne_bytes().to_vec() } else { vec![0; width] };
        copy_requests(requests, k, target, item * width, &pad, data.bytes_mut());
    }
    Ok(())
}

/// The batch shape of each input for `requests` (batch dimension first) and whether any
/// request would be padded, checked as [`stack`] checks, without copying anything.
pub fn shapes(specs: &[InputSpec], requests: &[&[Tensor]]) -> Result<(Vec<Vec<usize>>, bool)> {
    check_requests(specs, requests)?;
    if requests.len() > 1 && requests.iter().any(|r| is_whole(specs, r)) {
        return Err(DataplaneError::Batch(format!(
            "a batch of {} whole requests: a model without a batch dimension runs one request per call",
            requests.len()
        )));
    }
    let mut padded = false;
    let mut shapes = Vec::with_capacity(specs.len());
    for (k, spec) in specs.iter().enumerate() {
        let target = batch_shape(spec, k, requests)?;
        padded |= requests.iter().any(|request| request[k].shape != target);
        let mut shape = Vec::with_capacity(target.len() + 1);
        shape.push(requests.len());
        shape.extend(target);
        shapes.push(shape);
    }
    Ok((shapes, padded))
}

/// Whether `request` is a whole input of the model rather than one item of a batch:
/// every tensor has the rank of the model's input itself (a model without a batch
/// dimension, Triton's `max_batch_size: 0`, is fed each request as it is, one request
/// per run, and its outputs are the request's whole).
pub fn is_whole(specs: &[InputSpec], request: &[Tensor]) -> bool {
    request.len() == specs.len() && specs.iter().zip(request).all(|(spec, tensor)| tensor.shape.len() == spec.dims.len())
}

/// A batch of one request without copying it: each input's shape with a batch dimension
/// of 1 in front, beside the request's own data (checked as [`stack`] checks); a whole
/// request ([`is_whole`]) as it is, checked against every fixed dimension.
pub fn single(specs: &[InputSpec], request: &[Tensor]) -> Result<Vec<Vec<usize>>> {
    check_requests(specs, &[request])?;
    if is_whole(specs, request) {
        return specs
            .iter()
            .zip(request)
            .map(|(spec, tensor)| {
                let fixed = spec.dims.iter().zip(&tensor.shape).enumerate().find(|(_, (want, size))| want.is_some_and(|w| w != **size));
                if let Some((d, (want, size))) = fixed {
                    return Err(DataplaneError::Batch(format!(
                        "input {:?} dimension {d} is {size}, the model fixes it at {}",
                        spec.name,
                        want.unwrap_or_default()
                    )));
                }
                Ok(tensor.shape.clone())
            })
            .collect();
    }
    specs
        .iter()
        .enumerate()
        .map(|(k, spec)| {
            let mut shape = vec![1];
            shape.extend(batch_shape(spec, k, &[request])?);
            Ok(shape)
        })
        .collect()
}

fn check_requests(specs: &[InputSpec], requests: &[&[Tensor]]) -> Result<()> {
    if requests.is_empty() {
        return Err(DataplaneError::Batch("an empty batch".into()));
    }
    for (i, request) in requests.iter().enumerate() {
        if request.len() != specs.len() {
            return Err(DataplaneError::Batch(format!("request {i} has {} tensors, the model takes {}", request.len(), specs.len())));
        }
    }
    Ok(())
}

/// The shape (without the batch dimension) input `k` takes for `requests`: the largest
/// size of each dimension, after checking ranks, fixed dimensions and a fixed batch size.
fn batch_shape(spec: &InputSpec, k: usize, requests: &[&[Tensor]]) -> Result<Vec<usize>> {
    let n = requests.len();
    match spec.max_batch() {
        Some(fixed) if fixed != n => {
            return Err(DataplaneError::Batch(format!(
                "input {:?} has a fixed batch dimension of {fixed}: the model cannot run a batch of {n}",
                spec.name
            )))
        }
        _ => {}
    }
    let rank = spec.dims.len().saturating_sub(1);
    let mut target = vec![0usize; rank];
    for (i, request) in requests.iter().enumerate() {
        let shape = &request[k].shape;
        if shape.len() != rank {
            return Err(DataplaneError::Batch(format!(
                "request {i}: input {:?} has rank {}, the model wants {rank} (without the batch dimension)",
                spec.name,
                shape.len()
            )));
        }
        for (d, (&size, want)) in shape.iter().zip(&spec.dims[1..]).enumerate() {
            if let Some(fixed) = want {
                if size != *fixed {
                    return Err(DataplaneError::Batch(format!(
                        "request {i}: input {:?} dimension {} is {size}, the model fixes it at {fixed}",
                        spec.name,
                        d + 1
                    )));
                }
            }
            target[d] = target[d].max(size);
        }
    }
    Ok(target)
}

/// Below this many bytes a batch input is copied on the calling thread alone; above, the
/// requests are copied by several threads at once (one thread copied a batch of eight
/// 736×736 images, 52 MB, in 7.7 ms on an H100 machine's host).
const PARALLEL_COPY_BYTES: usize = 8 << 20;

/// Write input `k` of each request into its `item_bytes` slot of `out`, padding with
/// copies of `pad` (one element's bytes) where its shape is smaller than `target`.
fn copy_requests(requests: &[&[Tensor]], k: usize, target: &[usize], item_bytes: usize, pad: &[u8], out: &mut [u8]) {
    let copy_one = |request: &[Tensor], slot: &mut [u8]| {
        let tensor = &request[k];
        if tensor.shape == target {
            slot.copy_from_slice(tensor.data.bytes());
        } else {
            for element in slot.chunks_exact_mut(pad.len()) {
                element.copy_from_slice(pad);
            }
            copy_padded(tensor, target, pad.len(), slot);
        }
    };
    let threads = crate::parallel::cores().min(requests.len()).min(8);
    if item_bytes == 0 || threads < 2 || out.len() < PARALLEL_COPY_BYTES {
        for (request, slot) in requests.iter().zip(out.chunks_mut(item_bytes.max(1))) {
            copy_one(request, slot);
        }
        return;
    }
    // Parts of a few requests each, so a thread that finishes early takes another.
    let per_part = requests.len().div_ceil(threads * 2);
    let parts: Vec<_> = requests.chunks(per_part).zip(out.chunks_mut(per_part * item_bytes)).collect();
    crate::parallel::each(parts, threads, "yardmaster-stack", |(requests, slots)| {
        for (request, slot) in requests.iter().zip(slots.chunks_mut(item_bytes)) {
            copy_one(request, slot);
        }
    });
}

/// Copy `source` (elements of `width` bytes) into the top-left corner of a
/// `target`-shaped, pre-filled buffer.
fn copy_padded(source: &Tensor, target: &[usize], width: usize, out: &mut [u8]) {
    let bytes = source.data.bytes();
    let rank = target.len();
    if rank == 0 {
        out[..width].copy_from_slice(&bytes[..width]);
        return;
    }
    let row = source.shape[rank - 1] * width;
    let rows: usize = source.shape[..rank - 1].iter().product();
    let mut index = vec![0usize; rank - 1];
    for r in 0..rows {
        // Offset of this row in the target layout, in elements.
        let mut offset = 0;
        for (d, &i) in index.iter().enumerate() {
            offset = offset * target[d] + i;
        }
        let offset = offset * target[rank - 1] * width;
        out[offset..offset + row].copy_from_slice(&bytes[r * row..(r + 1) * row]);
        for d in (0..rank - 1).rev() {
            index[d] += 1;
            if index[d] < source.shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

/// Split batch outputs (batch dimension first) into `n` per-request output lists: views
/// of each output's buffer, not copies.
pub fn split(outputs: Vec<Tensor>, n: usize) -> Result<Vec<Vec<Tensor>>> {
    let mut per_request: Vec<Vec<Tensor>> = (0..n).map(|_| Vec::with_capacity(outputs.len())).collect();
    for output in outputs {
        for (request, tensor) in per_request.iter_mut().zip(split_views(output, n)?) {
            request.push(tensor);
        }
    }
    Ok(per_request)
}

/// Split one batch output (batch dimension first) into `n` tensors that view its buffer
/// (BYTES outputs are copied apart: their strings vary in length).
pub fn split_views(output: Tensor, n: usize) -> Result<Vec<Tensor>> {
    if output.shape.first() != Some(&n) {
        return Err(DataplaneError::Batch(format!("an output has shape {:?}: no batch dimension of {n} to split along", output.shape)));
    }
    let item_shape = output.shape[1..].to_vec();
    let item: usize = item_shape.iter().product();
    let element = output.data.element();
    let Some(width) = element.width() else {
        let strings = output.data.strings()?;
        let bytes = output.data.bytes();
        return (0..n)
            .map(|i| {
                let mine = strings.get(i * item..(i + 1) * item).unwrap_or_default();
                let span = match (mine.first(), mine.last()) {
                    (Some(first), Some(last)) => first.start - 4..last.end,
                    _ => 0..0,
                };
                let data = TensorData::from_bytes(ElementType::Bytes, &bytes[span], mine.len())?;
                Tensor::new(item_shape.clone(), data)
            })
            .collect();
    };
    let (buffer, range) = output.data.into_shared();
    (0..n)
        .map(|i| {
            let start = range.start + i * item * width;
            let data = TensorData::view(element, Arc::clone(&buffer), start..start + item * width)
                .ok_or_else(|| DataplaneError::Batch(format!("an output of shape {:?} holds too few elements", item_shape)))?;
            Ok(Tensor { shape: item_shape.clone(), data })
        })
        .collect()
}

/// The `n` rows of a request whose tensors each lead with a dimension of `n` (a client
/// batch): one batch element per row, each one tensor per input without that dimension,
/// viewing the request's buffers (BYTES rows are copied apart).
pub fn rows(tensors: &[Tensor], n: usize) -> Result<Vec<Vec<Tensor>>> {
    let mut elements: Vec<Vec<Tensor>> = (0..n).map(|_| Vec::with_capacity(tensors.len())).collect();
    for (k, tensor) in tensors.iter().enumerate() {
        if tensor.shape.first() != Some(&n) {
            return Err(DataplaneError::Batch(format!("input {k} has shape {:?}: not a batch of {n} rows", tensor.shape)));
        }
        for (element, row) in elements.iter_mut().zip(split_views(tensor.clone(), n)?) {
            element.push(row);
        }
    }
    Ok(elements)
}

/// Join the outputs of a request's rows (one list per row, one tensor per output, each
/// row's output of one shape and type) into one tensor per output leading with the
/// number of rows — the inverse of [`rows`] on the way back. Nothing is copied for one
/// row, nor for rows that lie one after another in one buffer (a request's rows run in
/// one batch); other rows are copied once, into the joined tensor.
pub fn join_rows(rows: Vec<Vec<Tensor>>) -> Result<Vec<Tensor>> {
    let Some(first) = rows.first() else {
        return Err(DataplaneError::Batch("no rows to join".into()));
    };
    let n = rows.len();
    let outputs = first.len();
    for (i, row) in rows.iter().enumerate() {
        if row.len() != outputs {
            return Err(DataplaneError::Batch(format!("row {i} has {} outputs, row 0 {outputs}", row.len())));
        }
        for (k, tensor) in row.iter().enumerate() {
            let (shape, element) = (&first[k].shape, first[k].data.element());
            if &tensor.shape != shape || tensor.data.element() != element {
                return Err(DataplaneError::Batch(format!(
                    "output {k}: row {i} is {:?} {}, row 0 {shape:?} {element}: the rows of one request do not join",
                    tensor.shape,
                    tensor.data.element()
                )));
            }
        }
    }
    let mut columns: Vec<Vec<Tensor>> = (0..outputs).map(|_| Vec::with_capacity(n)).collect();
    for row in rows {
        for (column, tensor) in columns.iter_mut().zip(row) {
            column.push(tensor);
        }
    }
    columns.into_iter().map(join_column).collect()
}

/// One output of every row (checked to agree in shape and type) as one tensor leading
/// with the number of rows.
fn join_column(column: Vec<Tensor>) -> Result<Tensor> {
    let n = column.len();
    let mut full = Vec::with_capacity(column[0].shape.len() + 1);
    full.push(n);
    full.extend_from_slice(&column[0].shape);
    let element = column[0].data.element();
    if n == 1 {
        let data = column.into_iter().next().expect("one row").data;
        return Tensor::new(full, data);
    }
    if let Some(data) = adjacent_views(&column, element) {
        return Tensor::new(full, data);
    }
    let count = column.iter().map(|t| t.data.len()).sum();
    let data = match element {
        ElementType::Bytes => {
            let mut bytes = Vec::with_capacity(column.iter().map(|t| t.data.bytes().len()).sum());
            for tensor in &column {
                bytes.extend_from_slice(tensor.data.bytes());
            }
            Elements::Bytes { data: bytes, count }
        }
        _ => {
            let mut joined = Elements::zeros(element, count);
            let mut at = 0;
            let out = joined.bytes_mut();
            for tensor in &column {
                let bytes = tensor.data.bytes();
                out[at..at + bytes.len()].copy_from_slice(bytes);
                at += bytes.len();
            }
            joined
        }
    };
    Tensor::new(full, data)
}

/// The rows as one view when each is a view of the same buffer right after the one
/// before (the split of one batch's output, as a request's rows run together).
fn adjacent_views(column: &[Tensor], element: ElementType) -> Option<TensorData> {
    if element == ElementType::Bytes || !column.iter().all(|t| t.data.is_view()) {
        return None;
    }
    let (buffer, first) = column[0].data.clone().into_shared();
    let mut end = first.end;
    for tensor in &column[1..] {
        let (other, range) = tensor.data.clone().into_shared();
        if !std::ptr::addr_eq(Arc::as_ptr(&other), Arc::as_ptr(&buffer)) || range.start != end {
            return None;
        }
        end = range.end;
    }
    TensorData::view(element, buffer, first.start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dims: &[Option<usize>]) -> Vec<InputSpec> {
        vec![InputSpec { name: "x".into(), dims: dims.to_vec() }]
    }

    #[test]
    fn a_whole_request_runs_as_it_is_and_alone() {
        let specs = spec(&[None]);
        let whole = vec![Tensor::new(vec![3], vec![1., 2., 3.]).unwrap()];
        assert!(is_whole(&specs, &whole));
        let shapes_of_one = single(&specs, &whole).unwrap();
        assert_eq!(shapes_of_one[0], vec![3], "no batch dimension put in front");
        let error = shapes(&specs, &[&whole, &whole]).unwrap_err().to_string();
        assert!(error.contains("one request per call"), "{error}");
        let fixed = spec(&[Some(2)]);
        assert!(single(&fixed, &whole).unwrap_err().to_string().contains("fixes it at 2"));
        let item = vec![Tensor::new(vec![2], vec![1., 2.]).unwrap()];
        assert!(!is_whole(&spec(&[None, Some(2)]), &item), "an item of a batching model is not whole");
    }

    #[test]
    fn same_shapes_stack_without_padding_and_split_back() {
        let a = vec![Tensor::new(vec![2, 2], vec![1., 2., 3., 4.]).unwrap()];
        let b = vec![Tensor::new(vec![2, 2], vec![5., 6., 7., 8.]).unwrap()];
        let s = stack(&spec(&[None, Some(2), None]), &[&a, &b], 0.0).unwrap();
        assert!(!s.padded);
        assert_eq!(s.inputs[0].shape, vec![2, 2, 2]);
        let back = split(s.inputs, 2).unwrap();
        assert_eq!(back[0], a);
        assert_eq!(back[1], b);
    }

    #[test]
    fn smaller_requests_are_padded_in_place() {
        let a = vec![Tensor::new(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]).unwrap()];
        let b = vec![Tensor::new(vec![1, 2], vec![7., 8.]).unwrap()];
        let s = stack(&spec(&[None, None, None]), &[&a, &b], -1.0).unwrap();
        assert!(s.padded);
        assert_eq!(s.inputs[0].shape, vec![2, 2, 3]);
        assert_eq!(&s.inputs[0].data.floats()[6..], &[7., 8., -1., -1., -1., -1.]);
    }

    #[test]
    fn large_batches_stack_on_several_threads_into_a_reused_buffer() {
        // Nine requests of 1 MiB each pass the parallel threshold; every third is
        // smaller and padded. A reused buffer holding other values must be overwritten.
        let (rows, cols) = (512, 512);
        let requests: Vec<Vec<Tensor>> = (0..9)
            .map(|i| {
                let r = if i % 3 == 2 { rows - 7 } else { rows };
                vec![Tensor::new(vec![r, cols], (0..r * cols).map(|e| (e * 9 + i) as f32).collect::<Vec<f32>>()).unwrap()]
            })
            .collect();
        let refs: Vec<&[Tensor]> = requests.iter().map(|r| r.as_slice()).collect();
        let specs = spec(&[None, None, Some(cols)]);
        let mut buffers = vec![Elements::F32(vec![123.0; 9 * rows * cols])];
        let (shapes, padded) = stack_into(&specs, &refs, -1.0, &mut buffers).unwrap();
        assert!(padded);
        assert_eq!(shapes[0], vec![9, rows, cols]);
        let Elements::F32(stacked) = &buffers[0] else { panic!("stacked as f32") };
        for (i, chunk) in stacked.chunks(rows * cols).enumerate() {
            let own = requests[i][0].data.floats();
            assert_eq!(&chunk[..own.len()], own, "request {i}");
            assert!(chunk[own.len()..].iter().all(|&v| v == -1.0), "request {i}'s padding");
        }
    }

    #[test]
    fn typed_and_string_inputs_stack_and_split_in_their_own_type() {
        let a = vec![Tensor::new(vec![2], TensorData::from_vec(vec![i64::MAX, 1])).unwrap()];
        let b = vec![Tensor::new(vec![1], TensorData::from_vec(vec![-5i64])).unwrap()];
        let s = stack(&spec(&[None, None]), &[&a, &b], 7.0).unwrap();
        assert_eq!(s.inputs[0].data.as_slice_of::<i64>(), Some(&[i64::MAX, 1, -5, 0][..]), "integers padded with zeros");
        let text = |words: &[&str]| {
            let layout: Vec<u8> = words.iter().flat_map(|w| [&(w.len() as u32).to_le_bytes()[..], w.as_bytes()].concat()).collect();
            vec![Tensor::new(vec![words.len()], TensorData::from_bytes(ElementType::Bytes, &layout, words.len()).unwrap()).unwrap()]
        };
        let (x, y) = (text(&["ab", ""]), text(&["cde", "f"]));
        let s = stack(&spec(&[None, Some(2)]), &[&x, &y], 0.0).unwrap();
        assert_eq!(s.inputs[0].data.len(), 4);
        let back = split(s.inputs, 2).unwrap();
        assert_eq!((&back[0], &back[1]), (&x, &y), "strings split back per request");
        let short = text(&["g"]);
        assert!(stack(&spec(&[None, None]), &[&x, &short], 0.0).unwrap_err().to_string().contains("strings are not padded"));
        let floats = vec![Tensor::filled(vec![2], 1.0)];
        assert!(stack(&spec(&[None, None]), &[&a, &floats], 0.0).unwrap_err().to_string().contains("one element type"));
    }

    #[test]
    fn fixed_dimensions_and_fixed_batches_are_refused() {
        let a = vec![Tensor::filled(vec![3], 0.0)];
        let b = vec![Tensor::filled(vec![4], 0.0)];
        let error = stack(&spec(&[None, Some(3)]), &[&a, &b], 0.0).unwrap_err().to_string();
        assert!(error.contains("fixes it at 3"), "{error}");
        let error = stack(&spec(&[Some(1), Some(3)]), &[&a, &a], 0.0).unwrap_err().to_string();
        assert!(error.contains("cannot run a batch of 2"), "{error}");
        assert!(split(vec![Tensor::filled(vec![3, 1], 0.0)], 2).is_err());
    }
    #[test]
    fn requests_of_mixed_rows_stack_pad_and_split_back_to_their_rows() {
        // Three requests of 2, 1 and 3 rows; rows of the second are shorter (padded).
        let request = |rows: usize, width: usize, base: i64| {
            let values: Vec<i64> = (0..(rows * width) as i64).map(|v| base + v).collect();
            vec![Tensor::new(vec![rows, width], TensorData::from_vec(values)).unwrap()]
        };
        let requests = [request(2, 3, 0), request(1, 2, 100), request(3, 3, 200)];
        let counts = [2, 1, 3];
        let mut elements = Vec::new();
        for (r, &n) in requests.iter().zip(&counts) {
            elements.extend(rows(r, n).unwrap());
        }
        assert_eq!(elements.len(), 6, "one element per row");
        assert!(elements[0][0].data.is_view(), "rows view the request's buffer");
        let refs: Vec<&[Tensor]> = elements.iter().map(|e| e.as_slice()).collect();
        let stacked = stack(&spec(&[None, None]), &refs, 0.0).unwrap();
        assert!(stacked.padded);
        assert_eq!(stacked.inputs[0].shape, vec![6, 3]);
        assert_eq!(&stacked.inputs[0].data.as_slice_of::<i64>().unwrap()[6..9], &[100, 101, 0], "the short row padded with zeros");
        let mut per_row = split(stacked.inputs, 6).unwrap().into_iter();
        let back: Vec<Vec<Tensor>> = counts.iter().map(|&n| join_rows(per_row.by_ref().take(n).collect()).unwrap()).collect();
        assert_eq!(back[0], requests[0], "two rows back as they came");
        assert_eq!(back[2], requests[2], "three rows back as they came");
        assert_eq!(back[1][0].shape, vec![1, 3], "the padded request keeps the batch's padded width");
        assert_eq!(back[1][0].data.as_slice_of::<i64>(), Some(&[100, 101, 0][..]));
        assert!(rows(&requests[0], 3).unwrap_err().to_string().contains("not a batch of 3 rows"));
    }

    #[test]
    fn one_row_and_adjacent_rows_join_without_a_copy() {
        let output = Tensor::new(vec![3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let split_rows = split(vec![output.clone()], 3).unwrap();
        let one = join_rows(vec![split_rows[1].clone()]).unwrap();
        assert_eq!(one[0].shape, vec![1, 2]);
        assert!(one[0].data.shares(split_rows[1][0].data.bytes()), "one row is its own output");
        let two = join_rows(split_rows[1..].to_vec()).unwrap();
        assert!(two[0].data.shares(&output.data.bytes()[8..]), "rows side by side in one buffer are one view");
        assert_eq!(two[0].data.floats(), &[3.0, 4.0, 5.0, 6.0]);
        let apart = join_rows(vec![split_rows[2].clone(), split_rows[0].clone()]).unwrap();
        assert_eq!(apart[0].data.floats(), &[5.0, 6.0, 1.0, 2.0], "rows out of order are copied once");
        assert!(!apart[0].data.is_view());
    }

    #[test]
    fn string_rows_split_and_join_exactly() {
        let words = ["a", "", "\u{e9}t\u{e9}", "xyz"];
        let layout: Vec<u8> = words.iter().flat_map(|w| [&(w.len() as u32).to_le_bytes()[..], w.as_bytes()].concat()).collect();
        let tensor = Tensor::new(vec![2, 2], TensorData::from_bytes(ElementType::Bytes, &layout, 4).unwrap()).unwrap();
        let split_rows = rows(std::slice::from_ref(&tensor), 2).unwrap();
        assert_eq!(split_rows[1][0].data.len(), 2);
        assert_eq!(join_rows(split_rows).unwrap(), vec![tensor]);
        let mismatched = vec![vec![Tensor::filled(vec![2], 0.0)], vec![Tensor::filled(vec![3], 0.0)]];
        assert!(join_rows(mismatched).unwrap_err().to_string().contains("do not join"));
    }
}
