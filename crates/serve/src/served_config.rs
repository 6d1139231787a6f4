//! The configuration a repository model serves (`GET /v2/models/{m}/config`, gRPC
//! `ModelConfig`, `repository check --json`): every field its `config.pbtxt` gives,
//! with the fields Yardmaster reads in the form it reads them.
//!
//! The configuration as written is read field by field through Triton's schema (the
//! `ModelConfig` message in `proto/model_config.proto`, which declares all of it), so
//! a field Yardmaster does not act on — `optimization`, `model_warmup`,
//! `response_cache`, an input's `allow_ragged_batch`, … — is served as given, in
//! Triton's JSON shape (lists as arrays, maps as objects, enum values by name). The
//! typed configuration (completed from the graph, with defaults filled in) then goes
//! over it: where both give a field, the typed one is served; lists of the same length
//! (inputs, outputs, instance groups) are merged item by item.

use prost_reflect::{Kind, MessageDescriptor};
use serde_json::{Map, Value};
use yardmaster_formats::model_repository::pbtxt::{self, Value as Text};
use yardmaster_formats::model_repository::ModelConfig;

/// The configuration `config` serves, in Triton's JSON form.
pub fn served(config: &ModelConfig) -> Value {
    let typed = config.to_triton_json();
    match &config.source {
        Some(source) => merge(message_json(source, super::grpc::message_descriptor("ModelConfig").as_ref()), typed),
        None => typed,
    }
}

/// A text-format message as JSON, its fields' shapes from `descriptor` (a field the
/// schema does not know is kept too: a list when it is given more than once).
fn message_json(message: &pbtxt::Message, descriptor: Option<&MessageDescriptor>) -> Value {
    let mut object = Map::new();
    for field in &message.fields {
        let declared = descriptor.and_then(|d| d.get_field_by_name(&field.name));
        let kind = declared.as_ref().map(|f| f.kind());
        match &declared {
            Some(declared) if declared.is_map() => {
                let Text::Message(entry) = &field.value else { continue };
                let entry_kind = declared.kind();
                let entry_descriptor = entry_kind.as_message();
                let key = entry.fields.iter().find(|f| f.name == "key").map(|f| scalar_text(&f.value)).unwrap_or_default();
                let value_kind = entry_descriptor.and_then(|d| d.get_field_by_name("value")).map(|f| f.kind());
                let value = entry.fields.iter().find(|f| f.name == "value").map(|f| value_json(&f.value, value_kind.as_ref()));
                let map = object.entry(field.name.clone()).or_insert_with(|| Value::Object(Map::new()));
                if let (Value::Object(map), Some(value)) = (map, value) {
                    map.insert(key, value);
                }
            }
            Some(declared) if declared.is_list() => {
                let list = object.entry(field.name.clone()).or_insert_with(|| Value::Array(Vec::new()));
                if let Value::Array(list) = list {
                    list.push(value_json(&field.value, kind.as_ref()));
                }
            }
            Some(_) => {
                object.insert(field.name.clone(), value_json(&field.value, kind.as_ref()));
            }
            None => {
                let value = value_json(&field.value, None);
                match object.remove(&field.name) {
                    None => object.insert(field.name.clone(), value),
                    Some(Value::Array(mut list)) => {
                        list.push(value);
                        object.insert(field.name.clone(), Value::Array(list))
                    }
                    Some(first) => object.insert(field.name.clone(), Value::Array(vec![first, value])),
                };
            }
        }
    }
    Value::Object(object)
}

/// One value as JSON: a message through its descriptor, an enum by name, `true` and
/// `false` as booleans, numbers as numbers, strings as strings.
fn value_json(value: &Text, kind: Option<&Kind>) -> Value {
    match value {
        Text::Message(message) => message_json(message, kind.and_then(Kind::as_message)),
        Text::Ident(ident) if matches!(kind, Some(Kind::Bool)) || (kind.is_none() && (ident == "true" || ident == "false")) => {
            Value::Bool(matches!(ident.as_str(), "true" | "True" | "t"))
        }
        Text::Ident(ident) => Value::String(ident.clone()),
        Text::Int(i) if matches!(kind, Some(Kind::Bool)) => Value::Bool(*i != 0),
        Text::Int(i) => i64::try_from(*i).map(Value::from).or_else(|_| u64::try_from(*i).map(Value::from)).unwrap_or(Value::Null),
        Text::Float(f) => serde_json::Number::from_f64(*f).map(Value::Number).unwrap_or(Value::Null),
        Text::Str(text) => Value::String(text.clone()),
    }
}

/// A map key as text.
fn scalar_text(value: &Text) -> String {
    match value {
        Text::Str(text) | Text::Ident(text) => text.clone(),
        Text::Int(i) => i.to_string(),
        Text::Float(f) => f.to_string(),
        Text::Message(_) => String::new(),
    }
}

/// `typed` over `written`: objects key by key, lists of the same length item by item,
/// anything else `typed`.
fn merge(written: Value, typed: Value) -> Value {
    match (written, typed) {
        (Value::Object(mut written), Value::Object(typed)) => {
            for (key, value) in typed {
                let merged = match written.remove(&key) {
                    Some(old) => merge(old, value),
                    None => value,
                };
                written.insert(key, merged);
            }
            Value::Object(written)
        }
        (Value::Array(written), Value::Array(typed)) if written.len() == typed.len() => {
            Value::Array(written.into_iter().zip(typed).map(|(w, t)| merge(w, t)).collect())
        }
        (_, typed) => typed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_not_acted_on_are_served_as_written() {
        let text = r#"
            name: "m"
            backend: "onnxruntime"
            max_batch_size: 8
            input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] allow_ragged_batch: true } ]
            output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
            dynamic_batching { preserve_ordering: true priority_queue_policy { key: 1 value: { max_queue_size: 3 } } }
            optimization { execution_accelerators { cpu_execution_accelerator : [ { name : "openvino" } ] } input_pinned_memory { enable: false } }
            model_warmup [ { name: "w" batch_size: 1 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]
            response_cache { enable: true }
            instance_group [ { count: 1 kind: KIND_CPU rate_limiter { resources [ { name: "r" count: 2 } ] } } ]
            metric_tags { key: "team" value: "vision" }
        "#;
        let config = ModelConfig::from_pbtxt(text, "m/config.pbtxt", "m").unwrap();
        let json = served(&config);
        assert_eq!(json["input"][0]["allow_ragged_batch"], true, "{json}");
        assert_eq!(json["input"][0]["data_type"], "TYPE_FP32", "{json}");
        assert_eq!(json["dynamic_batching"]["preserve_ordering"], true, "{json}");
        assert_eq!(json["dynamic_batching"]["priority_queue_policy"]["1"]["max_queue_size"], 3, "{json}");
        assert_eq!(json["optimization"]["execution_accelerators"]["cpu_execution_accelerator"][0]["name"], "openvino", "{json}");
        assert_eq!(json["optimization"]["input_pinned_memory"]["enable"], false, "{json}");
        assert_eq!(json["model_warmup"][0]["inputs"]["x"]["dims"], serde_json::json!([4]), "{json}");
        assert_eq!(json["response_cache"]["enable"], true, "{json}");
        assert_eq!(json["instance_group"][0]["rate_limiter"]["resources"][0]["count"], 2, "{json}");
        assert_eq!(json["instance_group"][0]["name"], "m_0", "the typed name is served: {json}");
        assert_eq!(json["metric_tags"]["team"], "vision", "{json}");
        // And gRPC's ModelConfig carries them too: the schema declares every field.
        let message = crate::grpc::message_from_json::<crate::grpc::proto::ModelConfig>("ModelConfig", &json).unwrap();
        assert!(message.response_cache.unwrap().enable);
        assert!(message.input[0].allow_ragged_batch);
        assert_eq!(message.model_warmup[0].inputs["x"].dims, [4]);
    }

    #[test]
    fn a_model_without_a_configuration_serves_the_typed_one() {
        let config = ModelConfig::without_file("m");
        assert_eq!(served(&config), config.to_triton_json());
    }
}
