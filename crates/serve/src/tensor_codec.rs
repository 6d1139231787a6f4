//! The KServe tensors of a model from a model repository, as its configuration
//! declares them: which inputs a request must carry, with which shapes, and how the
//! worker's outputs become the response.
//!
//! The data plane stacks requests along a batch dimension of its own, so a request
//! carries one item. For a model with `max_batch_size > 0` the client's shapes are
//! `[batch] + dims` (Triton's convention) and `batch` must be 1 — the policy forms the
//! batches; a model with `max_batch_size = 0` is sent its full shape, whose first
//! dimension (the data plane's batch dimension) is 1. Either way the leading 1 is taken
//! off on the way in and put back on every output. `-1` in a declared dimension takes
//! any size.

use yardmaster_dataplane::Tensor as PlaneTensor;

use super::api::TensorSpec;
use super::kserve::{DataType, InferRequest, Tensor};

/// One declared tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorDecl {
    /// Name in the graph and on the wire.
    pub name: String,
    /// Shape as clients send or receive it (with the batch dimension when the model
    /// batches); `-1` is any size.
    pub shape: Vec<i64>,
}

/// A repository model's tensors: FP32 inputs and outputs (what the data plane feeds).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorCodec {
    /// Inputs, in the graph's order.
    pub inputs: Vec<TensorDecl>,
    /// Outputs, in the graph's order (the order the worker returns them).
    pub outputs: Vec<TensorDecl>,
    /// The model batches (`max_batch_size > 0`): shapes lead with the batch dimension.
    pub batching: bool,
}

impl TensorCodec {
    /// Input specs, for metadata.
    pub fn input_specs(&self) -> Vec<TensorSpec> {
        self.inputs.iter().map(|t| TensorSpec { name: t.name.clone(), datatype: DataType::F32, shape: t.shape.clone() }).collect()
    }

    /// Output specs, for metadata.
    pub fn output_specs(&self) -> Vec<TensorSpec> {
        self.outputs.iter().map(|t| TensorSpec { name: t.name.clone(), datatype: DataType::F32, shape: t.shape.clone() }).collect()
    }

    /// The worker's tensors for a request (the leading 1 taken off), or why the
    /// request's inputs do not fit.
    pub fn decode(&self, request: &InferRequest) -> Result<Vec<PlaneTensor>, String> {
        let mut tensors = Vec::with_capacity(self.inputs.len());
        for decl in &self.inputs {
            let name = &decl.name;
            let tensor = request.inputs.iter().find(|t| &t.name == name).ok_or_else(|| format!("input {name:?} is missing"))?;
            let values = tensor.as_f32().ok_or_else(|| format!("input {name:?} must be FP32, got {}", tensor.datatype.name()))?;
            check_shape(name, &tensor.shape, &decl.shape, self.batching)?;
            let shape: Vec<usize> = tensor.shape[1..].iter().map(|&d| d as usize).collect();
            tensors.push(PlaneTensor::new(shape, values).map_err(|e| format!("input {name:?}: {e}"))?);
        }
        Ok(tensors)
    }

    /// The response tensors for a request's outputs (the leading 1 put back).
    pub fn encode(&self, outputs: Vec<PlaneTensor>) -> Result<Vec<Tensor>, String> {
        if outputs.len() != self.outputs.len() {
            return Err(format!("the model produced {} outputs, its configuration declares {}", outputs.len(), self.outputs.len()));
        }
        self.outputs
            .iter()
            .zip(outputs)
            .map(|(decl, t)| {
                let shape: Vec<u64> = std::iter::once(1).chain(t.shape.iter().map(|&d| d as u64)).collect();
                Tensor::f32(&decl.name, shape, &t.data).map_err(|e| e.0)
            })
            .collect()
    }
}

/// Check a request's shape against a declared one (`-1`: any size); a batching model's
/// leading dimension must be 1.
fn check_shape(name: &str, got: &[u64], declared: &[i64], batching: bool) -> Result<(), String> {
    let fits = got.len() == declared.len() && got.iter().zip(declared).all(|(&g, &d)| d < 0 || g as i64 == d);
    if !fits {
        return Err(format!("input {name:?} must have shape {declared:?} (-1: any size), got {got:?}"));
    }
    if batching && got.first() != Some(&1) {
        return Err(format!(
            "input {name:?} carries a batch of {} in one request: send one item per request (shape [1, …]); the scheduling policy forms the batches",
            got.first().copied().unwrap_or(0)
        ));
    }
    if got.contains(&0) {
        return Err(format!("input {name:?} has an empty dimension: {got:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kserve::TensorData;

    fn codec(batching: bool) -> TensorCodec {
        let shape = if batching { vec![-1, 3, -1] } else { vec![1, 3, 4] };
        TensorCodec {
            inputs: vec![TensorDecl { name: "x".into(), shape: shape.clone() }],
            outputs: vec![TensorDecl { name: "y".into(), shape }],
            batching,
        }
    }

    fn request(shape: Vec<u64>) -> InferRequest {
        let n: u64 = shape.iter().product();
        let data: Vec<f32> = (0..n).map(|i| i as f32).collect();
        InferRequest { inputs: vec![Tensor::f32("x", shape, &data).unwrap()], ..InferRequest::default() }
    }

    #[test]
    fn one_item_per_request_with_the_leading_one_taken_off_and_put_back() {
        let batched = codec(true);
        let tensors = batched.decode(&request(vec![1, 3, 5])).unwrap();
        assert_eq!(tensors[0].shape, vec![3, 5]);
        let out = batched.encode(tensors).unwrap();
        assert_eq!(out[0].shape, vec![1, 3, 5]);
        assert_eq!(out[0].name, "y");
        let fixed = codec(false);
        assert_eq!(fixed.decode(&request(vec![1, 3, 4])).unwrap()[0].shape, vec![3, 4]);
    }

    #[test]
    fn wrong_inputs_are_refused_with_the_reason() {
        let batched = codec(true);
        let cases = [
            (request(vec![2, 3, 5]), "a batch of 2"),
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
        ints.inputs[0].data = TensorData::Raw(vec![0; 15 * 8]);
        assert!(batched.decode(&ints).unwrap_err().contains("FP32"));
        assert!(codec(false).decode(&request(vec![1, 3, 5])).unwrap_err().contains("must have shape"));
    }
}
