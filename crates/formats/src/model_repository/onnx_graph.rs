//! The signature of an ONNX model's graph — its inputs' and outputs' names, element
//! types and shapes — read straight from the file's protobuf bytes, for completing a
//! configuration the way Triton's auto-complete does ([`super::autocomplete`]). This
//! crate must not depend on ONNX Runtime, so the reader is our own.
//!
//! Only the path to the signature is decoded; everything else (nodes, weights, metadata)
//! is skipped over by its length, never copied:
//!
//! ```text
//! ModelProto      { graph = 7 }
//! GraphProto      { initializer = 5, input = 11, output = 12, sparse_initializer = 15 }
//! TensorProto     { name = 8 }                       (initializers: names only)
//! SparseTensorProto { values = 1 }                   (its TensorProto's name)
//! ValueInfoProto  { name = 1, type = 2 }
//! TypeProto       { tensor_type = 1 }                (sequence, map, optional, sparse: refused)
//! TypeProto.Tensor { elem_type = 1, shape = 2 }
//! TensorShapeProto { dim = 1 }
//! Dimension       { dim_value = 1, dim_param = 2 }   (neither: unknown)
//! ```
//!
//! An input that is also an initializer is not a model input (older exporters list the
//! weights among the inputs). A dimension with `dim_param`, with neither field, or with a
//! `dim_value` below 1 (exporters write -1 for "any") is unknown: `None`, -1 in a
//! configuration.
//!
//! The reader is total: malformed bytes (a truncated file, a varint over ten bytes, a
//! length past the end of its message, a known field with another wire type, an
//! unmatched group, a name that is not UTF-8) give a [`GraphError`] with the byte offset,
//! never a panic. The nesting it follows is fixed, so it never recurses on the input's
//! say-so (unknown groups are skipped with a loop), and it allocates only for what it
//! returns, each item at least one byte of input.

use std::fmt;
use std::path::Path;

use super::config::DataType;

/// What an ONNX graph takes and returns.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphSignature {
    /// The model's inputs, in the graph's order, initializers left out.
    pub inputs: Vec<TensorSignature>,
    /// The model's outputs, in the graph's order.
    pub outputs: Vec<TensorSignature>,
}

/// One input or output of a graph.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSignature {
    /// The tensor's name.
    pub name: String,
    /// Its element type.
    pub data_type: DataType,
    /// Its shape: one entry per dimension, `None` where the size is symbolic or unknown;
    /// `None` as a whole when the graph gives no shape (not even the rank).
    pub dims: Option<Vec<Option<i64>>>,
}

impl TensorSignature {
    /// The shape as a configuration writes it (-1 for an unknown size), if the graph has one.
    pub fn config_dims(&self) -> Option<Vec<i64>> {
        self.dims.as_ref().map(|dims| dims.iter().map(|d| d.unwrap_or(-1)).collect())
    }
}

/// Why a graph's signature could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct GraphError {
    /// The model file, when the signature was read from one.
    pub file: Option<std::path::PathBuf>,
    /// Byte offset in the file where the problem is, when it is a problem of the bytes.
    pub offset: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl GraphError {
    fn new(offset: Option<usize>, message: String) -> GraphError {
        GraphError { file: None, offset, message }
    }
}

impl fmt::Display for GraphError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}: ", file.display())?;
        }
        match self.offset {
            Some(offset) => write!(f, "malformed ONNX model at byte {offset}: {}", self.message),
            None => write!(f, "{}", self.message),
        }
    }
}

/// Read the signature of the ONNX model in the file at `path`.
pub fn read_graph_signature(path: &Path) -> Result<GraphSignature, GraphError> {
    let in_file = |e: GraphError| GraphError { file: Some(path.to_path_buf()), ..e };
    let bytes = std::fs::read(path).map_err(|e| in_file(GraphError::new(None, format!("cannot be read: {e}"))))?;
    graph_signature(&bytes).map_err(in_file)
}

/// Read the signature of the ONNX model whose file's bytes are `bytes`.
pub fn graph_signature(bytes: &[u8]) -> Result<GraphSignature, GraphError> {
    let mut graph = RawGraph::default();
    let mut has_graph = false;
    for field in Fields::new(bytes, 0) {
        let field = field?;
        if field.number == 7 {
            let (body, at) = field.bytes("ModelProto.graph")?;
            has_graph = true;
            read_graph(body, at, &mut graph)?;
        }
    }
    if !has_graph {
        return Err(GraphError { file: None, offset: None, message: "not an ONNX model: it has no graph (ModelProto field 7)".into() });
    }
    let is_initializer = |name: &str| graph.initializers.iter().any(|i| i == name);
    let signature = |raw: RawTensor| -> Result<TensorSignature, GraphError> {
        let fail = |message: String| GraphError { file: None, offset: Some(raw.offset), message };
        let kind = raw.kind.ok_or_else(|| fail(format!("tensor {:?} has no type", raw.name)))?;
        let elem_type = match kind {
            Kind::Tensor(elem_type) => elem_type,
            Kind::Other(what) => return Err(fail(format!("tensor {:?} is a {what}, not a tensor: not served", raw.name))),
        };
        let data_type = data_type(elem_type).ok_or_else(|| {
            fail(format!("tensor {:?} has element type {} ({}), which is not served", raw.name, elem_type, elem_type_name(elem_type)))
        })?;
        Ok(TensorSignature { name: raw.name, data_type, dims: raw.dims })
    };
    // With many initializers listed as inputs, this is quadratic; sorting would need a
    // copy of every name. Graphs list at most thousands: fine.
    let inputs: Vec<RawTensor> = std::mem::take(&mut graph.inputs).into_iter().filter(|t| !is_initializer(&t.name)).collect();
    Ok(GraphSignature {
        inputs: inputs.into_iter().map(signature).collect::<Result<_, _>>()?,
        outputs: std::mem::take(&mut graph.outputs).into_iter().map(signature).collect::<Result<_, _>>()?,
    })
}

/// The configuration's type for an ONNX `TensorProto.DataType` number.
fn data_type(elem_type: u64) -> Option<DataType> {
    Some(match elem_type {
        1 => DataType::Fp32,
        2 => DataType::Uint8,
        3 => DataType::Int8,
        4 => DataType::Uint16,
        5 => DataType::Int16,
        6 => DataType::Int32,
        7 => DataType::Int64,
        8 => DataType::String,
        9 => DataType::Bool,
        10 => DataType::Fp16,
        11 => DataType::Fp64,
        12 => DataType::Uint32,
        13 => DataType::Uint64,
        16 => DataType::Bf16,
        _ => return None,
    })
}

/// ONNX's name for the element types that are not served, for messages.
fn elem_type_name(elem_type: u64) -> &'static str {
    match elem_type {
        0 => "UNDEFINED",
        14 => "COMPLEX64",
        15 => "COMPLEX128",
        17..=20 => "a FLOAT8 type",
        21 | 22 => "a 4-bit integer type",
        23 => "FLOAT4E2M1",
        _ => "unknown",
    }
}

/// What the graph says, before the initializers are taken out of the inputs.
#[derive(Default)]
struct RawGraph {
    inputs: Vec<RawTensor>,
    outputs: Vec<RawTensor>,
    initializers: Vec<String>,
}

/// A `ValueInfoProto`, as read.
struct RawTensor {
    name: String,
    kind: Option<Kind>,
    dims: Option<Vec<Option<i64>>>,
    /// Where its `ValueInfoProto` starts.
    offset: usize,
}

/// What a `TypeProto` holds.
enum Kind {
    /// A tensor of this element type.
    Tensor(u64),
    /// Something else, named.
    Other(&'static str),
}

fn read_graph(bytes: &[u8], base: usize, graph: &mut RawGraph) -> Result<(), GraphError> {
    for field in Fields::new(bytes, base) {
        let field = field?;
        match field.number {
            5 => {
                let (body, at) = field.bytes("GraphProto.initializer")?;
                if let Some(name) = tensor_name(body, at)? {
                    graph.initializers.push(name);
                }
            }
            15 => {
                let (body, at) = field.bytes("GraphProto.sparse_initializer")?;
                for inner in Fields::new(body, at) {
                    let inner = inner?;
                    if inner.number == 1 {
                        let (values, at) = inner.bytes("SparseTensorProto.values")?;
                        if let Some(name) = tensor_name(values, at)? {
                            graph.initializers.push(name);
                        }
                    }
                }
            }
            11 | 12 => {
                let what = if field.number == 11 { "GraphProto.input" } else { "GraphProto.output" };
                let (body, at) = field.bytes(what)?;
                let tensor = value_info(body, at)?;
                if field.number == 11 { &mut graph.inputs } else { &mut graph.outputs }.push(tensor);
            }
            _ => {}
        }
    }
    Ok(())
}

/// A `TensorProto`'s name (field 8), if it has one.
fn tensor_name(bytes: &[u8], base: usize) -> Result<Option<String>, GraphError> {
    let mut name = None;
    for field in Fields::new(bytes, base) {
        let field = field?;
        if field.number == 8 {
            name = Some(field.string("TensorProto.name")?);
        }
    }
    Ok(name)
}

fn value_info(bytes: &[u8], base: usize) -> Result<RawTensor, GraphError> {
    let mut tensor = RawTensor { name: String::new(), kind: None, dims: None, offset: base };
    for field in Fields::new(bytes, base) {
        let field = field?;
        match field.number {
            1 => tensor.name = field.string("ValueInfoProto.name")?,
            2 => {
                let (body, at) = field.bytes("ValueInfoProto.type")?;
                type_proto(body, at, &mut tensor)?;
            }
            _ => {}
        }
    }
    if tensor.name.is_empty() {
        return Err(GraphError { file: None, offset: Some(base), message: "a graph input or output has no name".into() });
    }
    Ok(tensor)
}

fn type_proto(bytes: &[u8], base: usize, tensor: &mut RawTensor) -> Result<(), GraphError> {
    for field in Fields::new(bytes, base) {
        let field = field?;
        let other = match field.number {
            1 => {
                let (body, at) = field.bytes("TypeProto.tensor_type")?;
                let mut elem_type = match tensor.kind {
                    Some(Kind::Tensor(t)) => t,
                    _ => 0,
                };
                for inner in Fields::new(body, at) {
                    let inner = inner?;
                    match inner.number {
                        1 => elem_type = inner.varint("TypeProto.Tensor.elem_type")?,
                        2 => {
                            let (shape, at) = inner.bytes("TypeProto.Tensor.shape")?;
                            read_shape(shape, at, tensor.dims.get_or_insert_with(Vec::new))?;
                        }
                        _ => {}
                    }
                }
                tensor.kind = Some(Kind::Tensor(elem_type));
                continue;
            }
            4 => "sequence",
            5 => "map",
            8 => "sparse tensor",
            9 => "optional",
            _ => continue,
        };
        tensor.kind = Some(Kind::Other(other));
    }
    Ok(())
}

fn read_shape(bytes: &[u8], base: usize, dims: &mut Vec<Option<i64>>) -> Result<(), GraphError> {
    for field in Fields::new(bytes, base) {
        let field = field?;
        if field.number != 1 {
            continue;
        }
        let (body, at) = field.bytes("TensorShapeProto.dim")?;
        let mut dim = None;
        for inner in Fields::new(body, at) {
            let inner = inner?;
            match inner.number {
                1 => {
                    let value = inner.varint("Dimension.dim_value")? as i64;
                    dim = (value >= 1).then_some(value);
                }
                2 => {
                    inner.string("Dimension.dim_param")?;
                    dim = None;
                }
                _ => {}
            }
        }
        dims.push(dim);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The protobuf wire format: a message is a sequence of (tag, value); the tag's low three
// bits are the wire type, the rest the field number.

/// One field's value, by wire type.
#[derive(Debug, Clone, Copy)]
enum WireValue<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1 (the bytes are skipped).
    Fixed64,
    /// Wire type 2: the bytes, and where they start in the file.
    Bytes(&'a [u8], usize),
    /// Wire types 3 and 4, a whole group (skipped).
    Group,
    /// Wire type 5 (the bytes are skipped).
    Fixed32,
}

impl WireValue<'_> {
    fn describe(self) -> &'static str {
        match self {
            WireValue::Varint(_) => "varint",
            WireValue::Fixed64 => "64-bit",
            WireValue::Bytes(..) => "length-delimited",
            WireValue::Group => "group",
            WireValue::Fixed32 => "32-bit",
        }
    }
}

/// One field of a message.
struct WireField<'a> {
    number: u64,
    value: WireValue<'a>,
    /// Where its tag starts in the file.
    offset: usize,
}

impl<'a> WireField<'a> {
    fn wrong_type(&self, what: &str, expected: &str) -> GraphError {
        GraphError {
            file: None,
            offset: Some(self.offset),
            message: format!("{what} (field {}) is {}, expected {expected}", self.number, self.value.describe()),
        }
    }

    /// The bytes of a length-delimited field, and their offset in the file.
    fn bytes(&self, what: &str) -> Result<(&'a [u8], usize), GraphError> {
        match self.value {
            WireValue::Bytes(b, at) => Ok((b, at)),
            _ => Err(self.wrong_type(what, "length-delimited")),
        }
    }

    fn varint(&self, what: &str) -> Result<u64, GraphError> {
        match self.value {
            WireValue::Varint(v) => Ok(v),
            _ => Err(self.wrong_type(what, "a varint")),
        }
    }

    fn string(&self, what: &str) -> Result<String, GraphError> {
        let (bytes, at) = self.bytes(what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GraphError {
            file: None,
            offset: Some(at),
            message: format!("{what} (field {}) is not UTF-8", self.number),
        })
    }
}

/// The fields of one message's bytes, in order; after an error, nothing more.
struct Fields<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Where `bytes` starts in the file, for offsets in errors.
    base: usize,
    failed: bool,
}

impl<'a> Fields<'a> {
    fn new(bytes: &'a [u8], base: usize) -> Fields<'a> {
        Fields { bytes, pos: 0, base, failed: false }
    }

    fn error(&self, at: usize, message: impl Into<String>) -> GraphError {
        GraphError { file: None, offset: Some(self.base + at), message: message.into() }
    }

    fn varint(&mut self) -> Result<u64, GraphError> {
        let start = self.pos;
        let mut value = 0u64;
        for i in 0..10 {
            let Some(&byte) = self.bytes.get(self.pos) else {
                return Err(self.error(start, "the data ends inside a varint"));
            };
            self.pos += 1;
            if i == 9 && byte > 1 {
                return Err(self.error(start, "a varint overflows 64 bits"));
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(self.error(start, "a varint is longer than ten bytes"))
    }

    fn skip(&mut self, n: u64, at: usize, what: &str) -> Result<&'a [u8], GraphError> {
        let left = self.bytes.len() - self.pos;
        if n > left as u64 {
            return Err(self.error(at, format!("{what} of {n} bytes runs past the end of its message ({left} bytes left)")));
        }
        let slice = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(slice)
    }

    /// The tag at the current position: field number and wire type.
    fn tag(&mut self) -> Result<(u64, u64), GraphError> {
        let at = self.pos;
        let tag = self.varint()?;
        let number = tag >> 3;
        if number == 0 || number > u64::from(u32::MAX >> 3) {
            return Err(self.error(at, format!("field number {number} is out of range")));
        }
        Ok((number, tag & 7))
    }

    /// Skip a group whose start tag (field `number`) was just read, with nested groups,
    /// without recursion.
    fn skip_group(&mut self, number: u64, at: usize) -> Result<(), GraphError> {
        let mut open = vec![number];
        while let Some(&innermost) = open.last() {
            if self.pos >= self.bytes.len() {
                return Err(self.error(at, format!("group (field {number}) is not closed")));
            }
            let tag_at = self.pos;
            let (n, wire) = self.tag()?;
            match wire {
                0 => {
                    self.varint()?;
                }
                1 => {
                    self.skip(8, tag_at, "a 64-bit value")?;
                }
                2 => {
                    let len = self.varint()?;
                    self.skip(len, tag_at, "a length-delimited field")?;
                }
                3 => open.push(n),
                4 if n == innermost => {
                    open.pop();
                }
                4 => return Err(self.error(tag_at, format!("group end (field {n}) does not match its start (field {innermost})"))),
                5 => {
                    self.skip(4, tag_at, "a 32-bit value")?;
                }
                _ => return Err(self.error(tag_at, format!("wire type {wire} is not a protobuf wire type"))),
            }
        }
        Ok(())
    }

    fn next_field(&mut self) -> Result<WireField<'a>, GraphError> {
        let at = self.pos;
        let (number, wire) = self.tag()?;
        let value = match wire {
            0 => WireValue::Varint(self.varint()?),
            1 => {
                self.skip(8, at, "a 64-bit value")?;
                WireValue::Fixed64
            }
            2 => {
                let len = self.varint()?;
                let start = self.base + self.pos;
                WireValue::Bytes(self.skip(len, at, &format!("field {number}"))?, start)
            }
            3 => {
                self.skip_group(number, at)?;
                WireValue::Group
            }
            4 => return Err(self.error(at, format!("group end (field {number}) without a group start"))),
            5 => {
                self.skip(4, at, "a 32-bit value")?;
                WireValue::Fixed32
            }
            _ => return Err(self.error(at, format!("wire type {wire} is not a protobuf wire type"))),
        };
        Ok(WireField { number, value, offset: self.base + at })
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<WireField<'a>, GraphError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.bytes.len() {
            return None;
        }
        let field = self.next_field();
        self.failed = field.is_err();
        Some(field)
    }
}

/// Writing ONNX protobuf bytes by hand, for tests here and in [`super::autocomplete`].
#[cfg(test)]
pub(super) mod encode {
    /// A protobuf message being written.
    #[derive(Default, Clone)]
    pub struct Msg(pub Vec<u8>);

    /// `value` as a varint.
    pub fn varint(mut value: u64) -> Vec<u8> {
        let mut out = Vec::new();
        while value >= 0x80 {
            out.push((value as u8) | 0x80);
            value >>= 7;
        }
        out.push(value as u8);
        out
    }

    impl Msg {
        /// A tag: field `field`, wire type `wire`.
        pub fn tag(mut self, field: u64, wire: u64) -> Self {
            self.0.extend(varint(field << 3 | wire));
            self
        }
        /// Raw bytes, as they are.
        pub fn raw(mut self, bytes: &[u8]) -> Self {
            self.0.extend_from_slice(bytes);
            self
        }
        /// A varint field (negative numbers as ten bytes, as protobuf writes `int64`).
        pub fn int(self, field: u64, value: i64) -> Self {
            self.tag(field, 0).raw(&varint(value as u64))
        }
        /// A length-delimited field.
        pub fn bytes(self, field: u64, bytes: &[u8]) -> Self {
            self.tag(field, 2).raw(&varint(bytes.len() as u64)).raw(bytes)
        }
        /// A string field.
        pub fn string(self, field: u64, text: &str) -> Self {
            self.bytes(field, text.as_bytes())
        }
        /// An embedded message.
        pub fn message(self, field: u64, message: &Msg) -> Self {
            self.bytes(field, &message.0)
        }
        /// Packed floats.
        pub fn packed_floats(self, field: u64, values: &[f32]) -> Self {
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            self.bytes(field, &bytes)
        }
    }

    /// A dimension of a shape, as a test writes it.
    #[derive(Clone, Copy)]
    pub enum D {
        /// `dim_value`.
        V(i64),
        /// `dim_param`.
        P(&'static str),
        /// Neither.
        Unknown,
    }

    /// A `ValueInfoProto` for a tensor of `elem_type` with `dims` (`None`: no shape).
    pub fn value_info(name: &str, elem_type: i64, dims: Option<&[D]>) -> Msg {
        let mut tensor_type = Msg::default().int(1, elem_type);
        if let Some(dims) = dims {
            let mut shape = Msg::default();
            for d in dims {
                let dim = match d {
                    D::V(v) => Msg::default().int(1, *v),
                    D::P(p) => Msg::default().string(2, p),
                    D::Unknown => Msg::default(),
                };
                shape = shape.message(1, &dim);
            }
            tensor_type = tensor_type.message(2, &shape);
        }
        Msg::default().string(1, name).message(2, &Msg::default().message(1, &tensor_type))
    }

    /// A model whose graph has these inputs and outputs (`ValueInfoProto`s) and no nodes.
    pub fn model(inputs: &[Msg], outputs: &[Msg]) -> Vec<u8> {
        let mut graph = Msg::default().string(2, "g");
        for i in inputs {
            graph = graph.message(11, i);
        }
        for o in outputs {
            graph = graph.message(12, o);
        }
        Msg::default().int(1, 8).message(7, &graph).into_bytes()
    }

    impl Msg {
        /// The bytes.
        pub fn into_bytes(self) -> Vec<u8> {
            self.0
        }
    }

    /// The PP-OCR models the setup script installs, if they are there.
    pub fn pp_ocr(file: &str) -> Option<std::path::PathBuf> {
        let home = std::env::var_os("HOME")?;
        let path = std::path::Path::new(&home).join(".cache/yardmaster/rapidocr-1.4.4").join(file);
        if path.is_file() {
            Some(path)
        } else {
            eprintln!("skipped: {} is absent (the setup script installs it)", path.display());
            None
        }
    }

    /// The bytes `yardmaster_serve::tiny_model::bytes` writes (the same messages, in the
    /// same order): `y = x + 1` on `[batch, 4]` floats, the addend an initializer.
    pub fn tiny_model() -> Vec<u8> {
        let value_info = |name: &str| {
            let batch = Msg::default().string(2, "batch");
            let width = Msg::default().int(1, 4);
            let shape = Msg::default().message(1, &batch).message(1, &width);
            let tensor_type = Msg::default().int(1, 1).message(2, &shape);
            let type_proto = Msg::default().message(1, &tensor_type);
            Msg::default().string(1, name).message(2, &type_proto)
        };
        let addend = Msg::default().int(1, 1).int(2, 1).packed_floats(4, &[1.0]).string(8, "one");
        let node = Msg::default().string(1, "x").string(1, "one").string(2, "y").string(3, "add").string(4, "Add");
        let graph = Msg::default()
            .message(1, &node)
            .string(2, "tiny")
            .message(5, &addend)
            .message(11, &value_info("x"))
            .message(12, &value_info("y"));
        let opset = Msg::default().string(1, "").int(2, 13);
        Msg::default().int(1, 8).string(2, "yardmaster").message(7, &graph).message(8, &opset).into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::encode::{model, pp_ocr, tiny_model, value_info, varint, Msg, D};
    use super::*;

    fn read(bytes: &[u8]) -> GraphSignature {
        graph_signature(bytes).unwrap_or_else(|e| panic!("{e}"))
    }

    fn refused(bytes: &[u8]) -> GraphError {
        match graph_signature(bytes) {
            Ok(signature) => panic!("should be refused: {signature:?}"),
            Err(e) => e,
        }
    }

    fn tensor(name: &str, data_type: DataType, dims: &[Option<i64>]) -> TensorSignature {
        TensorSignature { name: name.into(), data_type, dims: Some(dims.to_vec()) }
    }

    #[test]
    fn reads_the_tiny_model() {
        let bytes = tiny_model();
        assert_eq!(&bytes[..2], &[0x08, 0x08], "starts with ir_version = 8, as serve's test checks");
        let signature = read(&bytes);
        assert_eq!(signature.inputs, [tensor("x", DataType::Fp32, &[None, Some(4)])], "the initializer `one` is not an input");
        assert_eq!(signature.outputs, [tensor("y", DataType::Fp32, &[None, Some(4)])]);
        assert_eq!(signature.inputs[0].config_dims(), Some(vec![-1, 4]));
    }

    #[test]
    fn initializers_listed_among_inputs_are_not_inputs() {
        let f = |name: &str| value_info(name, 1, Some(&[D::V(2)]));
        // A weight written the way older exporters write it: raw_data after the name, and
        // before it (field order is not fixed).
        let weight = Msg::default().int(1, 2).int(2, 1).string(8, "w").bytes(9, &[0; 8]);
        let bias = Msg::default().bytes(9, &[0; 8]).string(8, "b").int(1, 2);
        let sparse = Msg::default().message(1, &Msg::default().string(8, "s")).message(2, &Msg::default().string(8, "s_idx"));
        let graph = Msg::default()
            .message(5, &weight)
            .message(11, &f("w"))
            .message(11, &f("x"))
            .message(11, &f("b"))
            .message(11, &f("s"))
            .message(5, &bias)
            .message(15, &sparse)
            .message(12, &f("y"));
        let signature = read(&Msg::default().message(7, &graph).into_bytes());
        let names: Vec<&str> = signature.inputs.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["x"]);
        assert_eq!(signature.outputs.len(), 1);
    }

    #[test]
    fn maps_every_element_type_and_refuses_the_others() {
        let served = [
            (1, DataType::Fp32),
            (2, DataType::Uint8),
            (3, DataType::Int8),
            (4, DataType::Uint16),
            (5, DataType::Int16),
            (6, DataType::Int32),
            (7, DataType::Int64),
            (8, DataType::String),
            (9, DataType::Bool),
            (10, DataType::Fp16),
            (11, DataType::Fp64),
            (12, DataType::Uint32),
            (13, DataType::Uint64),
            (16, DataType::Bf16),
        ];
        for (number, data_type) in served {
            let bytes = model(&[value_info("in", number, Some(&[D::V(1)]))], &[value_info("out", number, Some(&[]))]);
            let signature = read(&bytes);
            assert_eq!(signature.inputs[0].data_type, data_type, "elem_type {number}");
            assert_eq!(signature.outputs[0].data_type, data_type, "elem_type {number}");
        }
        for (number, name) in [(0, "UNDEFINED"), (14, "COMPLEX64"), (15, "COMPLEX128"), (17, "FLOAT8"), (99, "unknown")] {
            let bytes = model(&[value_info("ok", 1, None)], &[value_info("odd", number, Some(&[D::V(1)]))]);
            let e = refused(&bytes);
            assert!(e.message.contains("tensor \"odd\" has element type") && e.message.contains(name), "{number}: {e}");
            assert!(e.message.contains("not served"), "{e}");
        }
        let no_elem_type = Msg::default().string(1, "t").message(2, &Msg::default().message(1, &Msg::default()));
        assert!(refused(&model(&[no_elem_type], &[])).message.contains("element type 0 (UNDEFINED)"));
        let sequence = Msg::default().string(1, "seq").message(2, &Msg::default().message(4, &Msg::default()));
        let e = refused(&model(&[sequence], &[]));
        assert!(e.message.contains("tensor \"seq\" is a sequence, not a tensor"), "{e}");
        let untyped = Msg::default().string(1, "bare");
        assert!(refused(&model(&[untyped], &[])).message.contains("tensor \"bare\" has no type"));
        let unnamed = value_info("", 1, None);
        assert!(refused(&model(&[unnamed], &[])).message.contains("has no name"));
    }

    #[test]
    fn reads_every_kind_of_dimension() {
        let dims = [D::V(3), D::P("batch"), D::Unknown, D::V(-1), D::V(0), D::V(i64::MAX)];
        let bytes = model(&[value_info("a", 1, Some(&dims)), value_info("scalar", 1, Some(&[])), value_info("any", 1, None)], &[]);
        let signature = read(&bytes);
        assert_eq!(signature.inputs[0].dims, Some(vec![Some(3), None, None, None, None, Some(i64::MAX)]));
        assert_eq!(signature.inputs[0].config_dims(), Some(vec![3, -1, -1, -1, -1, i64::MAX]));
        assert_eq!(signature.inputs[1].dims, Some(vec![]), "a scalar has a shape of no dimensions");
        assert_eq!(signature.inputs[2].dims, None, "no shape: not even the rank is known");
        assert!(signature.outputs.is_empty());
    }

    /// Every field a reader does not know, of every wire type, at every level it reads.
    fn unknown_fields() -> Msg {
        let group = Msg::default().tag(30, 3).int(1, 5).tag(31, 3).tag(31, 4).raw(&[0x0d, 1, 2, 3, 4]).tag(30, 4);
        Msg::default()
            .int(20, -7)
            .tag(21, 1)
            .raw(&[9; 8])
            .string(22, "\u{ff}skip")
            .raw(&group.0)
            .tag(23, 5)
            .raw(&[7; 4])
            .bytes(24, &[0xff, 0xff, 0xff])
    }

    #[test]
    fn skips_unknown_fields_of_every_wire_type_at_every_level() {
        let u = unknown_fields();
        let with = |m: Msg| Msg(u.0.clone()).raw(&m.0).raw(&u.0);
        let dim = with(Msg::default().int(1, 5));
        let shape = with(Msg::default().message(1, &dim)).message(1, &with(Msg::default().string(2, "n")));
        let tensor_type = with(Msg::default().int(1, 7).message(2, &shape));
        let type_proto = with(Msg::default().message(1, &tensor_type)).string(6, "denotation");
        let input = with(Msg::default().string(1, "ids").message(2, &type_proto)).string(3, "doc");
        let node = Msg::default().string(4, "Identity");
        let graph = with(Msg::default().message(1, &node).message(11, &input).message(12, &value_info("out", 1, Some(&[]))));
        let bytes = with(Msg::default().int(1, 9).message(7, &graph).message(14, &Msg::default())).into_bytes();
        let signature = read(&bytes);
        assert_eq!(signature.inputs, [tensor("ids", DataType::Int64, &[Some(5), None])]);
        assert_eq!(signature.outputs, [tensor("out", DataType::Fp32, &[])]);

        // Deeply nested unknown groups are skipped without recursion.
        let depth = 200_000;
        let mut deep = Msg::default();
        for _ in 0..depth {
            deep = deep.tag(40, 3);
        }
        for _ in 0..depth {
            deep = deep.tag(40, 4);
        }
        let bytes = Msg(deep.0).raw(&tiny_model()).into_bytes();
        assert_eq!(read(&bytes).inputs.len(), 1);
    }

    #[test]
    fn a_graph_given_twice_is_merged_as_protobuf_merges() {
        let first = Msg::default().message(11, &value_info("a", 1, Some(&[D::V(1)])));
        let second = Msg::default().message(12, &value_info("b", 1, Some(&[D::V(1)])));
        let signature = read(&Msg::default().message(7, &first).message(7, &second).into_bytes());
        assert_eq!((signature.inputs.len(), signature.outputs.len()), (1, 1));
    }

    #[test]
    fn every_truncation_is_an_error_or_a_whole_prefix() {
        let bytes = tiny_model();
        // ir_version (2 bytes), producer_name (12), then the graph; a cut before its end
        // leaves no graph or half of one.
        let graph_end = bytes.len() - Msg::default().message(8, &Msg::default().string(1, "").int(2, 13)).0.len();
        for cut in 0..bytes.len() {
            let result = graph_signature(&bytes[..cut]);
            if cut < graph_end {
                let e = result.expect_err(&format!("cut at {cut}"));
                assert!(!e.message.is_empty());
            } else {
                // Cut inside the opset: the graph is whole, only the opset is truncated.
                assert!(result.is_err() || cut == graph_end, "cut at {cut}");
            }
        }
        assert_eq!(read(&bytes[..graph_end]), read(&bytes));
        let e = refused(&bytes[..bytes.len() - 1]);
        assert_eq!(e.offset, Some(graph_end), "the truncated field is named where it starts: {e}");
        assert!(e.to_string().starts_with(&format!("malformed ONNX model at byte {graph_end}: ")), "{e}");
    }

    #[test]
    fn wrong_wire_types_are_refused() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (Msg::default().int(7, 3).into_bytes(), "ModelProto.graph (field 7) is varint, expected length-delimited"),
            (model(&[Msg::default().int(1, 3)], &[]), "ValueInfoProto.name (field 1) is varint"),
            (model(&[Msg::default().string(1, "x").int(2, 1)], &[]), "ValueInfoProto.type (field 2) is varint"),
            (
                model(&[Msg::default().string(1, "x").message(2, &Msg::default().message(1, &Msg::default().string(1, "FLOAT")))], &[]),
                "TypeProto.Tensor.elem_type (field 1) is length-delimited, expected a varint",
            ),
            (
                model(&[Msg::default().string(1, "x").message(2, &Msg::default().tag(1, 5).raw(&[0; 4]))], &[]),
                "TypeProto.tensor_type (field 1) is 32-bit",
            ),
            (
                {
                    let dim = Msg::default().string(1, "3");
                    let shape = Msg::default().message(1, &dim);
                    let tt = Msg::default().int(1, 1).message(2, &shape);
                    model(&[Msg::default().string(1, "x").message(2, &Msg::default().message(1, &tt))], &[])
                },
                "Dimension.dim_value (field 1) is length-delimited",
            ),
            (Msg::default().message(7, &Msg::default().tag(5, 1).raw(&[0; 8])).into_bytes(), "GraphProto.initializer (field 5) is 64-bit"),
            (
                Msg::default().message(7, &Msg::default().message(5, &Msg::default().int(8, 1))).into_bytes(),
                "TensorProto.name (field 8) is varint",
            ),
            (Msg::default().message(7, &Msg::default().tag(11, 3).tag(11, 4)).into_bytes(), "GraphProto.input (field 11) is group"),
        ];
        for (bytes, message) in cases {
            let e = refused(&bytes);
            assert!(e.message.contains(message), "expected {message:?}, got {e}");
        }
    }

    #[test]
    fn malformed_bytes_are_refused() {
        let length = |n: u64| Msg::default().tag(7, 2).raw(&varint(n)).raw(&[0; 16]).into_bytes();
        let name_bytes = |b: &[u8]| model(&[Msg::default().bytes(1, b)], &[]);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (Vec::new(), "it has no graph"),
            (b"this is a config file, not a model".to_vec(), ""),
            (length(u64::MAX), "field 7 of 18446744073709551615 bytes runs past the end of its message (16 bytes left)"),
            (length(1 << 40), "runs past the end"),
            (length(17), "field 7 of 17 bytes runs past the end of its message (16 bytes left)"),
            (Msg::default().tag(7, 2).raw(&[0xff; 11]).into_bytes(), "a varint overflows 64 bits"),
            (Msg::default().tag(7, 2).raw(&[0x80; 9]).raw(&[0x02]).into_bytes(), "a varint overflows 64 bits"),
            (vec![0x80; 3], "the data ends inside a varint"),
            (Msg::default().tag(3, 6).into_bytes(), "wire type 6 is not a protobuf wire type"),
            (Msg::default().tag(3, 7).into_bytes(), "wire type 7 is not a protobuf wire type"),
            (vec![0x02, 0x00], "field number 0 is out of range"),
            (Msg::default().tag(5, 4).into_bytes(), "group end (field 5) without a group start"),
            (Msg::default().tag(5, 3).tag(6, 4).into_bytes(), "group end (field 6) does not match its start (field 5)"),
            (Msg::default().tag(5, 3).int(1, 1).into_bytes(), "group (field 5) is not closed"),
            (Msg::default().tag(5, 3).tag(1, 7).into_bytes(), "wire type 7"),
            (Msg::default().tag(5, 1).raw(&[0; 7]).into_bytes(), "a 64-bit value of 8 bytes runs past the end"),
            (Msg::default().tag(5, 5).raw(&[0; 3]).into_bytes(), "a 32-bit value of 4 bytes runs past the end"),
            (name_bytes(&[0x66, 0xff, 0x6f]), "ValueInfoProto.name (field 1) is not UTF-8"),
        ];
        for (bytes, message) in cases {
            let e = refused(&bytes);
            assert!(e.message.contains(message), "expected {message:?}, got {e}");
        }
        // The graph's length is checked against what is left of the file, not the
        // message's own: a graph whose input claims more bytes than the graph holds.
        let graph = Msg::default().tag(11, 2).raw(&varint(5)).raw(&[0x0a, 0x01]);
        let bytes = Msg::default().message(7, &graph).int(1, 1).int(1, 1).into_bytes();
        assert!(refused(&bytes).message.contains("field 11 of 5 bytes runs past the end of its message (2 bytes left)"));
    }

    #[test]
    fn random_damage_never_panics() {
        let original = tiny_model();
        let mut rng = crate::rng::SimRng::new(21);
        let (mut ok, mut refused) = (0, 0);
        for _ in 0..20_000 {
            let mut bytes = original.clone();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(bytes.len() as u64) as usize;
                bytes[at] = rng.below(256) as u8;
            }
            match graph_signature(&bytes) {
                Ok(_) => ok += 1,
                Err(_) => refused += 1,
            }
        }
        assert!(ok > 0 && refused > 0, "{ok} read, {refused} refused");
    }

    #[test]
    fn reads_the_pp_ocr_models() {
        let f = DataType::Fp32;
        let cases = [
            (
                "ch_PP-OCRv4_det_infer.onnx",
                tensor("x", f, &[None, Some(3), None, None]),
                tensor("sigmoid_0.tmp_0", f, &[None, Some(1), None, None]),
            ),
            (
                "ch_PP-OCRv4_rec_infer.onnx",
                tensor("x", f, &[None, Some(3), None, None]),
                tensor("softmax_11.tmp_0", f, &[None, None, Some(6625)]),
            ),
            (
                // Its batch dimension is written as dim_value -1.
                "ch_ppocr_mobile_v2.0_cls_infer.onnx",
                tensor("x", f, &[None, Some(3), None, None]),
                tensor("save_infer_model/scale_0.tmp_1", f, &[None, Some(2)]),
            ),
        ];
        for (file, input, output) in cases {
            let Some(path) = pp_ocr(file) else { continue };
            let signature = read_graph_signature(&path).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(signature, GraphSignature { inputs: vec![input], outputs: vec![output] }, "{file}");
        }
    }

    #[test]
    fn a_missing_file_is_named() {
        let path = std::env::temp_dir().join("yardmaster-no-such-model.onnx");
        let e = read_graph_signature(&path).unwrap_err();
        assert_eq!((e.offset, e.file.as_deref()), (None, Some(path.as_path())));
        assert!(e.to_string().starts_with(&format!("{}: cannot be read: ", path.display())), "{e}");
    }
}
