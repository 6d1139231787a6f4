//! Decoupled models: Triton's `model_transaction_policy { decoupled: true }`, a model
//! that answers one request with zero, one or many responses.
//!
//! A model here computes all of a request's outputs in one run, so a decoupled model's
//! responses are the rows of its outputs: response *i* carries row *i* of every output
//! (the output's shape with its first dimension 1), in order. A model that answers
//! `[n, …]` rows sends *n* responses; one whose outputs have no rows sends none. Every
//! output of a decoupled model must have the same number of rows.
//!
//! As in Triton, only gRPC's `ModelStreamInfer` carries them: HTTP's `infer` and gRPC's
//! `ModelInfer` refuse a decoupled model ([`unary_refusal`]). Each response on the
//! stream carries the `triton_final_response` parameter: `false` on every row but the
//! last one, `true` on the last. A request that set `triton_enable_empty_final_response`
//! gets every row with `false` and then an empty response with `true` (the only answer
//! to a request that produced no rows). The request itself ends exactly once in the
//! engine, like any other: its final flag is its end.

use serde_json::Value;

use super::kserve::{InferResponse, Tensor, TensorData};

/// The response parameter that marks a request's last response.
pub const FINAL_RESPONSE: &str = "triton_final_response";
/// The request parameter asking for an empty final response after the last row.
pub const ENABLE_EMPTY_FINAL: &str = "triton_enable_empty_final_response";

/// Whether a model's configuration (Triton's JSON form) makes it decoupled.
pub fn is_decoupled(config: &Value) -> bool {
    config.pointer("/model_transaction_policy/decoupled").and_then(Value::as_bool).unwrap_or(false)
}

/// Why a unary call (HTTP `infer` or gRPC `ModelInfer`, named by `endpoint`) refuses a
/// decoupled model, in Triton's words.
pub fn unary_refusal(endpoint: &str, model: &str) -> String {
    format!("{endpoint} doesn't support models with decoupled transaction policy: model {model:?} answers over gRPC ModelStreamInfer only")
}

/// A decoupled model's answer to one request as the responses the stream sends, each
/// with its `triton_final_response` flag; refuses outputs whose row counts differ.
pub fn responses(response: InferResponse, empty_final: bool) -> Result<Vec<InferResponse>, String> {
    let rows = match response.outputs.first() {
        None => 0,
        Some(first) => first.shape.first().copied().unwrap_or(1),
    };
    if let Some(odd) = response.outputs.iter().find(|t| t.shape.first().copied().unwrap_or(1) != rows) {
        return Err(format!(
            "decoupled model {:?}: output {:?} has shape {:?}, but every output must have {rows} rows (one per response)",
            response.model_name, odd.name, odd.shape
        ));
    }
    let mut answers = Vec::with_capacity(rows as usize + usize::from(empty_final));
    for row in 0..rows {
        let outputs = response.outputs.iter().map(|tensor| row_of(tensor, row)).collect::<Result<Vec<_>, _>>()?;
        let last = row + 1 == rows && !empty_final;
        answers.push(flagged(&response, outputs, last));
    }
    if empty_final {
        answers.push(flagged(&response, Vec::new(), true));
    }
    Ok(answers)
}

/// `response`'s identity and parameters with `outputs` and the final flag.
fn flagged(response: &InferResponse, outputs: Vec<Tensor>, last: bool) -> InferResponse {
    let mut parameters = response.parameters.clone();
    parameters.insert(FINAL_RESPONSE.into(), Value::Bool(last));
    InferResponse {
        model_name: response.model_name.clone(),
        model_version: response.model_version.clone(),
        id: response.id.clone(),
        parameters,
        outputs,
        timing: None,
    }
}

/// Row `row` of `tensor` as a tensor of its own, first dimension 1 (a scalar output
/// counts as one row and is sent whole).
fn row_of(tensor: &Tensor, row: u64) -> Result<Tensor, String> {
    if tensor.shape.is_empty() {
        return Ok(tensor.clone());
    }
    let rows = tensor.shape[0].max(1);
    let per_row = (tensor.element_count() / rows) as usize;
    let mut shape = tensor.shape.clone();
    shape[0] = 1;
    let data = match &tensor.data {
        TensorData::Raw(bytes) => {
            let width = tensor.datatype.width().unwrap_or(1);
            let start = row as usize * per_row * width;
            TensorData::Raw(bytes.slice(start..start + per_row * width))
        }
        TensorData::Strings(items) => {
            let start = row as usize * per_row;
            TensorData::Strings(items[start..start + per_row].to_vec())
        }
    };
    Ok(Tensor { name: tensor.name.clone(), datatype: tensor.datatype, shape, data })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kserve::DataType;
    use serde_json::Map;

    fn answer(outputs: Vec<Tensor>) -> InferResponse {
        InferResponse {
            timing: None,
            model_name: "repeat".into(),
            model_version: Some("1".into()),
            id: Some("7".into()),
            parameters: Map::new(),
            outputs,
        }
    }

    fn flag(response: &InferResponse) -> bool {
        response.parameters[FINAL_RESPONSE].as_bool().unwrap()
    }

    #[test]
    fn one_response_per_row_and_the_last_is_final() {
        let out = Tensor::raw("OUT", DataType::I32, vec![3], [4i32, 5, 6].iter().flat_map(|v| v.to_le_bytes()).collect()).unwrap();
        let idx = Tensor::from_binary(
            "IDX",
            DataType::Bytes,
            vec![3, 1],
            [b"\x01\0\0\0a".to_vec(), b"\x01\0\0\0b".to_vec(), b"\x01\0\0\0c".to_vec()].concat(),
        )
        .unwrap();
        let sent = responses(answer(vec![out, idx]), false).unwrap();
        assert_eq!(sent.len(), 3);
        assert_eq!(sent.iter().map(flag).collect::<Vec<_>>(), [false, false, true]);
        assert_eq!(sent[1].outputs[0].shape, [1]);
        assert_eq!(sent[1].outputs[0].data, TensorData::Raw(5i32.to_le_bytes().to_vec().into()));
        assert_eq!(sent[2].outputs[1].data, TensorData::Strings(vec![b"c".to_vec()]));
        assert!(sent.iter().all(|r| r.id.as_deref() == Some("7")));
    }

    #[test]
    fn an_empty_final_response_follows_the_rows_when_asked_for() {
        let out = Tensor::raw("OUT", DataType::I32, vec![2], vec![0; 8]).unwrap();
        let sent = responses(answer(vec![out]), true).unwrap();
        assert_eq!(sent.iter().map(flag).collect::<Vec<_>>(), [false, false, true]);
        assert!(sent[2].outputs.is_empty());
        let none = Tensor::raw("OUT", DataType::I32, vec![0], Vec::new()).unwrap();
        assert!(responses(answer(vec![none.clone()]), false).unwrap().is_empty(), "no rows, no responses");
        assert_eq!(responses(answer(vec![none]), true).unwrap().len(), 1, "only the final flag");
    }

    #[test]
    fn outputs_of_different_row_counts_are_refused() {
        let a = Tensor::raw("A", DataType::U8, vec![2], vec![0; 2]).unwrap();
        let b = Tensor::raw("B", DataType::U8, vec![3], vec![0; 3]).unwrap();
        let error = responses(answer(vec![a, b]), false).unwrap_err();
        assert!(error.contains("\"B\"") && error.contains("2 rows"), "{error}");
    }

    #[test]
    fn the_configuration_says_whether_a_model_is_decoupled() {
        assert!(is_decoupled(&serde_json::json!({ "model_transaction_policy": { "decoupled": true } })));
        assert!(!is_decoupled(&serde_json::json!({ "model_transaction_policy": { "decoupled": false } })));
        assert!(!is_decoupled(&serde_json::json!({ "name": "m" })));
    }
}
