//! A model configuration in Triton's JSON (`POST /v2/repository/models/{m}/load` with
//! `{"parameters": {"config": "<JSON>"}}`, the shape `GET /v2/models/{m}/config`
//! returns) read into a [`ModelConfig`] by the same reader as `config.pbtxt`.
//!
//! The JSON is turned into the text format's untyped tree first: an object is a
//! message, an array a repeated field, a map field (`parameters`, `input_map`,
//! `output_map`, …) a repeated `{ key, value }` entry, as protobuf's JSON mapping
//! writes them. As that mapping allows, enum values may be strings (`"TYPE_FP32"`) and
//! 64-bit integers may be strings (`"-1"`).

use serde_json::Value as Json;

use super::config::ModelConfig;
use super::pbtxt::{Field, Message, ParseError, Pos, Value};

/// Fields whose JSON object is a protobuf map (entries keyed by the object's keys).
const MAP_FIELDS: [&str; 5] = ["parameters", "input_map", "output_map", "priority_queue_policy", "cc_model_filenames"];

/// Where errors say the configuration came from.
pub const JSON_SOURCE: &str = "the configuration given in JSON";

/// No position: JSON errors name the field's path instead.
const NOWHERE: Pos = Pos { line: 0, column: 0 };

impl ModelConfig {
    /// Read a configuration in Triton's JSON for the model `model` (its `name`, when
    /// given, must be `model`). An error names the field; its position is 0:0.
    pub fn from_triton_json(text: &str, model: &str) -> Result<ModelConfig, ParseError> {
        let json: Json = serde_json::from_str(text).map_err(|e| ParseError::at(JSON_SOURCE, NOWHERE, format!("not valid JSON: {e}")))?;
        let tree = json_message(&json, "").map_err(|message| ParseError::at(JSON_SOURCE, NOWHERE, message))?;
        ModelConfig::from_tree(&tree, JSON_SOURCE, model, true)
    }
}

/// The message a JSON object stands for; `path` names it in errors.
fn json_message(json: &Json, path: &str) -> Result<Message, String> {
    let Json::Object(object) = json else {
        return Err(format!("{}: expected a JSON object", if path.is_empty() { "the configuration" } else { path }));
    };
    let mut message = Message::default();
    for (name, value) in object {
        let at = if path.is_empty() { name.clone() } else { format!("{path}.{name}") };
        match value {
            Json::Null => {}
            Json::Object(entries) if MAP_FIELDS.contains(&name.as_str()) => {
                for (key, entry) in entries {
                    let key = match name.as_str() {
                        // A map keyed by priority level: integer keys.
                        "priority_queue_policy" => {
                            Value::Int(key.parse().map_err(|_| format!("{at}: key {key:?} is not a priority level"))?)
                        }
                        _ => Value::Str(key.clone()),
                    };
                    let entry = Message { fields: vec![field("key", key), field("value", json_value(entry, &format!("{at}.{name}"))?)] };
                    message.fields.push(field(name, Value::Message(entry)));
                }
            }
            Json::Array(items) => {
                for item in items {
                    if item.is_array() {
                        return Err(format!("{at}: a list inside a list has no meaning in a configuration"));
                    }
                    message.fields.push(field(name, json_value(item, &at)?));
                }
            }
            other => message.fields.push(field(name, json_value(other, &at)?)),
        }
    }
    Ok(message)
}

/// The text-format value of one JSON value.
fn json_value(json: &Json, path: &str) -> Result<Value, String> {
    Ok(match json {
        Json::String(text) => Value::Str(text.clone()),
        Json::Bool(flag) => Value::Ident(flag.to_string()),
        Json::Number(number) => match (number.as_i64(), number.as_u64()) {
            (Some(i), _) => Value::Int(i.into()),
            (None, Some(u)) => Value::Int(u.into()),
            (None, None) => Value::Float(number.as_f64().unwrap_or(f64::NAN)),
        },
        Json::Object(_) => Value::Message(json_message(json, path)?),
        Json::Array(_) | Json::Null => return Err(format!("{path}: expected a value, found {json}")),
    })
}

fn field(name: &str, value: Value) -> Field {
    Field { name: name.to_string(), pos: NOWHERE, value, value_pos: NOWHERE }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_repository::config::{DataType, InstanceKind};

    const PBTXT: &str = r#"
        name: "det"
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, -1, -1 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 1, -1, -1 ] } ]
        dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100 }
        instance_group [ { count: 2 kind: KIND_CPU } ]
        version_policy: { latest { num_versions: 2 } }
        parameters { key: "yardmaster.slo_ms" value: { string_value: "250" } }
    "#;

    #[test]
    fn the_configuration_endpoint_json_reads_back_to_the_same_configuration() {
        let config = ModelConfig::from_pbtxt(PBTXT, "config.pbtxt", "det").unwrap();
        let json = serde_json::to_string(&config.to_triton_json()).unwrap();
        let back = ModelConfig::from_triton_json(&json, "det").unwrap_or_else(|e| panic!("{e}\n{json}"));
        assert_eq!(back.to_triton_json(), config.to_triton_json(), "{json}");
        assert_eq!(back.input[0].data_type, DataType::Fp32);
        assert_eq!(back.instance_group[0].kind, InstanceKind::Cpu);
        assert_eq!(back.parameters["yardmaster.slo_ms"], "250");
    }

    #[test]
    fn protobuf_json_spellings_are_accepted_and_mistakes_name_the_field() {
        // 64-bit integers as strings, enums as strings, as protobuf's JSON mapping writes them.
        let json = r#"{"name": "m", "max_batch_size": 4, "input": [{"name": "x", "data_type": "TYPE_INT64", "dims": ["16"]}],
            "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": ["-1"]}], "instance_group": [{"count": 1, "kind": "KIND_GPU", "gpus": [0]}]}"#;
        let config = ModelConfig::from_triton_json(json, "m").unwrap();
        assert_eq!((config.input[0].dims.clone(), config.output[0].dims.clone()), (vec![16], vec![-1]));
        assert_eq!(config.instance_group[0].kind, InstanceKind::Gpu);
        for (bad, says) in [
            (r#"{"max_batch_size": "many"}"#, "max_batch_size: expected an integer"),
            (r#"{"input": [{"name": "x", "data_type": "TYPE_COMPLEX"}]}"#, "data_type"),
            (r#"{"name": "other"}"#, "differs from the model's folder"),
            (r#"[1, 2]"#, "expected a JSON object"),
            (r#"{"dims": [[1]]}"#, "a list inside a list"),
            (r#"{"max_batch_size": 4"#, "not valid JSON"),
        ] {
            let error = ModelConfig::from_triton_json(bad, "m").unwrap_err();
            assert!(error.message.contains(says), "{bad}: {error}");
            assert_eq!(error.file, JSON_SOURCE);
        }
    }
}
