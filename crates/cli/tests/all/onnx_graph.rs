//! Small ONNX graphs written in the tests, with the data plane's protobuf encoder (no
//! `onnx` package needed). Field numbers are `onnx.proto`'s: `ModelProto { ir_version
//! = 1, producer_name = 2, graph = 7, opset_import = 8 }`, `GraphProto { node = 1, name
//! = 2, initializer = 5, input = 11, output = 12 }`, `NodeProto { input = 1, output = 2,
//! name = 3, op_type = 4, attribute = 5 }`, `ValueInfoProto { name = 1, type = 2 }`.

use yardmaster::dataplane::proto::Message;

/// A graph input or output: `name` of ONNX element type `elem_type`, each dimension
/// symbolic (named by `dims`).
pub(crate) fn value_info(name: &str, elem_type: i64, dims: &[&str]) -> Message {
    let shape = dims.iter().fold(Message::default(), |shape, dim| shape.message(1, &Message::default().string(2, dim)));
    let tensor_type = Message::default().int(1, elem_type).message(2, &shape);
    Message::default().string(1, name).message(2, &Message::default().message(1, &tensor_type))
}

/// A node running `op` on `inputs`, writing `output` (also its name).
pub(crate) fn node(op: &str, inputs: &[&str], output: &str) -> Message {
    let node = inputs.iter().fold(Message::default(), |m, input| m.string(1, input));
    node.string(2, output).string(3, output).string(4, op)
}

/// A model of `graph` for the default domain at `opset`.
pub(crate) fn model(graph: &Message, opset: i64) -> Vec<u8> {
    let opset = Message::default().string(1, "").int(2, opset);
    Message::default().int(1, 8).string(2, "yardmaster-test").message(7, graph).message(8, &opset).into_bytes()
}
