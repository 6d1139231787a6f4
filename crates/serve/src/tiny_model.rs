//! The trivial model of the overhead benchmark, `y = x + 1` on a `[batch, 4]` float
//! tensor, written as ONNX protobuf bytes from Rust (no `onnx` Python package needed);
//! the same graph in half precision ([`Precision::Half`]) for tests of FP16 models.
//!
//! The protobuf encoding is the data plane's ([`yardmaster_dataplane::proto`]); the
//! field numbers are those of `onnx.proto`:
//! `ModelProto { ir_version = 1, producer_name = 2, graph = 7, opset_import = 8 }`,
//! `OperatorSetIdProto { domain = 1, version = 2 }`,
//! `GraphProto { node = 1, name = 2, initializer = 5, input = 11, output = 12 }`,
//! `NodeProto { input = 1, output = 2, name = 3, op_type = 4 }`,
//! `TensorProto { dims = 1, data_type = 2, float_data = 4, name = 8, raw_data = 9 }`,
//! `ValueInfoProto { name = 1, type = 2 }`, `TypeProto { tensor_type = 1 }`,
//! `TypeProto.Tensor { elem_type = 1, shape = 2 }`, `TensorShapeProto { dim = 1 }`,
//! `Dimension { dim_value = 1, dim_param = 2 }`.

use std::path::{Path, PathBuf};

use yardmaster_dataplane::proto::Message;

/// Elements per request.
pub const WIDTH: usize = 4;
/// The model's input name.
pub const INPUT: &str = "x";
/// The model's output name.
pub const OUTPUT: &str = "y";
/// What the model adds to every element.
pub const ADDEND: f32 = 1.0;
/// File name in the assets folder.
pub const FILE: &str = "tiny-add.onnx";

/// ONNX `TensorProto.DataType.FLOAT`.
const FLOAT: i64 = 1;
/// ONNX `TensorProto.DataType.FLOAT16`.
const FLOAT16: i64 = 10;

/// The element type of the model's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// `float32` (the benchmark's model).
    Single,
    /// `float16`.
    Half,
}

impl Precision {
    fn onnx_type(self) -> i64 {
        match self {
            Precision::Single => FLOAT,
            Precision::Half => FLOAT16,
        }
    }
}

/// A tensor's type: the batch dimension symbolic, then `WIDTH`.
fn value_info(name: &str, precision: Precision) -> Message {
    let batch = Message::default().string(2, "batch");
    let width = Message::default().int(1, WIDTH as i64);
    let shape = Message::default().message(1, &batch).message(1, &width);
    let tensor_type = Message::default().int(1, precision.onnx_type()).message(2, &shape);
    let type_proto = Message::default().message(1, &tensor_type);
    Message::default().string(1, name).message(2, &type_proto)
}

/// The model's bytes.
pub fn bytes() -> Vec<u8> {
    bytes_in(Precision::Single)
}

/// The model's bytes with tensors of `precision`.
pub fn bytes_in(precision: Precision) -> Vec<u8> {
    let addend = Message::default().int(1, 1).int(2, precision.onnx_type());
    let addend = match precision {
        Precision::Single => addend.packed_floats(4, &[ADDEND]),
        Precision::Half => addend.bytes(9, &half::f16::from_f32(ADDEND).to_le_bytes()),
    }
    .string(8, "one");
    let node = Message::default().string(1, INPUT).string(1, "one").string(2, OUTPUT).string(3, "add").string(4, "Add");
    let graph = Message::default()
        .message(1, &node)
        .string(2, "tiny")
        .message(5, &addend)
        .message(11, &value_info(INPUT, precision))
        .message(12, &value_info(OUTPUT, precision));
    let opset = Message::default().string(1, "").int(2, 13);
    Message::default().int(1, 8).string(2, "yardmaster").message(7, &graph).message(8, &opset).into_bytes()
}

/// The model's file in `dir`, written there if it is not already (or differs).
pub fn ensure(dir: &Path) -> std::io::Result<PathBuf> {
    let path = dir.join(FILE);
    let bytes = bytes();
    if std::fs::read(&path).ok().as_deref() != Some(bytes.as_slice()) {
        std::fs::create_dir_all(dir)?;
        // Written beside and renamed, so a concurrent reader never sees half a file.
        let partial = dir.join(format!("{FILE}.{}.partial", std::process::id()));
        std::fs::write(&partial, &bytes)?;
        std::fs::rename(&partial, &path)?;
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_is_written_once_and_read_back_whole() {
        let model = bytes();
        assert_eq!(&model[..2], &[0x08, 0x08], "starts with ir_version = 8");
        let dir = std::env::temp_dir().join(format!("yardmaster-tiny-{}", std::process::id()));
        let path = ensure(&dir).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), model);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
