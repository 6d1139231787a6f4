//! Batch forming: per-request tensors are stacked into one batch along a new first
//! dimension (padding smaller ones with a fill value where the model's dimension is
//! dynamic, refusing where it is fixed), and batch outputs are split back per request.

use crate::error::{DataplaneError, Result};
use crate::tensor::Tensor;

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
    let n = requests.len();
    check_requests(specs, requests)?;
    let mut padded = false;
    let mut inputs = Vec::with_capacity(specs.len());
    for (k, spec) in specs.iter().enumerate() {
        let target = batch_shape(spec, k, requests)?;
        let item: usize = target.iter().product();
        let mut data = Vec::with_capacity(item * n);
        for request in requests {
            let tensor = &request[k];
            if tensor.shape == target {
                data.extend_from_slice(&tensor.data);
            } else {
                padded = true;
                let start = data.len();
                data.resize(start + item, pad_value);
                copy_padded(tensor, &target, &mut data[start..]);
            }
        }
        let mut shape = Vec::with_capacity(target.len() + 1);
        shape.push(n);
        shape.extend_from_slice(&target);
        inputs.push(Tensor { shape, data });
    }
    Ok(Stacked { inputs, batch: n, padded })
}

/// A batch of one request without copying it: each input's shape with a batch dimension
/// of 1 in front, beside a view of the request's own data (checked as [`stack`] checks).
pub fn single<'a>(specs: &[InputSpec], request: &'a [Tensor]) -> Result<Vec<(Vec<usize>, &'a [f32])>> {
    check_requests(specs, &[request])?;
    specs
        .iter()
        .enumerate()
        .map(|(k, spec)| {
            let mut shape = vec![1];
            shape.extend(batch_shape(spec, k, &[request])?);
            Ok((shape, request[k].data.as_slice()))
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

/// Copy `source` into the top-left corner of a `target`-shaped, pre-filled buffer.
fn copy_padded(source: &Tensor, target: &[usize], out: &mut [f32]) {
    let rank = target.len();
    if rank == 0 {
        out[0] = source.data[0];
        return;
    }
    let row = source.shape[rank - 1];
    let rows: usize = source.shape[..rank - 1].iter().product();
    let mut index = vec![0usize; rank - 1];
    for r in 0..rows {
        // Offset of this row in the target layout.
        let mut offset = 0;
        for (d, &i) in index.iter().enumerate() {
            offset = offset * target[d] + i;
        }
        offset *= target[rank - 1];
        out[offset..offset + row].copy_from_slice(&source.data[r * row..(r + 1) * row]);
        for d in (0..rank - 1).rev() {
            index[d] += 1;
            if index[d] < source.shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

/// Split batch outputs (batch dimension first) into `n` per-request output lists.
pub fn split(outputs: Vec<Tensor>, n: usize) -> Result<Vec<Vec<Tensor>>> {
    let mut per_request: Vec<Vec<Tensor>> = (0..n).map(|_| Vec::with_capacity(outputs.len())).collect();
    for output in outputs {
        for (request, tensor) in per_request.iter_mut().zip(split_slice(&output.shape, &output.data, n)?) {
            request.push(tensor);
        }
    }
    Ok(per_request)
}

/// Split one batch output (`shape` with the batch dimension first) into `n` tensors.
pub fn split_slice(shape: &[usize], data: &[f32], n: usize) -> Result<Vec<Tensor>> {
    if shape.first() != Some(&n) {
        return Err(DataplaneError::Batch(format!("an output has shape {shape:?}: no batch dimension of {n} to split along")));
    }
    let item_shape = shape[1..].to_vec();
    let item: usize = item_shape.iter().product();
    Ok((0..n).map(|i| Tensor { shape: item_shape.clone(), data: data[i * item..(i + 1) * item].to_vec() }).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dims: &[Option<usize>]) -> Vec<InputSpec> {
        vec![InputSpec { name: "x".into(), dims: dims.to_vec() }]
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
        assert_eq!(&s.inputs[0].data[6..], &[7., 8., -1., -1., -1., -1.]);
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
}
