//! The tiny decoder-only transformer, written as an ONNX model from Rust with random
//! weights drawn from a fixed seed (so every build writes the same bytes).
//!
//! Interface (`L` layers, `H` heads of width `Dh`, vocabulary `V`; `P` cached
//! positions, `S` new positions, `T = P + S`):
//!
//! | input | type | shape |
//! |---|---|---|
//! | `input_ids` | int64 | `[batch, S]` |
//! | `position_ids` | int64 | `[batch, S]` |
//! | `attention_bias` | float | `[batch, 1, S, T]`, 0 where a query may attend, −1e9 where not |
//! | `past_key_{l}`, `past_value_{l}` | float | `[batch, H, P, Dh]` |
//!
//! | output | type | shape |
//! |---|---|---|
//! | `logits` | float | `[batch, S, V]` |
//! | `present_key_{l}`, `present_value_{l}` | float | `[batch, H, T, Dh]` (past then new) |
//!
//! The caller builds the additive attention bias, so padding (rows of different
//! lengths in one batch) and causality are the caller's: the graph stays plain ONNX
//! (opset 17: `Gather`, `LayerNormalization`, `MatMul`, `Reshape`, `Transpose`,
//! `Concat`, `Softmax`, `Relu`, `Add`, `Mul`). Each layer is pre-norm attention plus
//! a ReLU feed-forward block; learned position embeddings; untied output head.
//!
//! The configuration travels in the model's metadata (key [`METADATA_KEY`]), so a
//! session can check it loaded the model it expects.
//!
//! `onnx.proto` field numbers used: `ModelProto { ir_version = 1, producer_name = 2,
//! graph = 7, opset_import = 8, metadata_props = 14 }`, `OperatorSetIdProto { domain = 1,
//! version = 2 }`, `StringStringEntryProto { key = 1, value = 2 }`, `GraphProto { node = 1,
//! name = 2, initializer = 5, input = 11, output = 12 }`, `NodeProto { input = 1,
//! output = 2, name = 3, op_type = 4, attribute = 5 }`, `AttributeProto { name = 1, f = 2,
//! i = 3, ints = 8, type = 20 }`, `TensorProto { dims = 1, data_type = 2, name = 8,
//! raw_data = 9 }`, `ValueInfoProto { name = 1, type = 2 }`, `TypeProto { tensor_type = 1 }`,
//! `TypeProto.Tensor { elem_type = 1, shape = 2 }`, `TensorShapeProto { dim = 1 }`,
//! `Dimension { dim_value = 1, dim_param = 2 }`.

use std::path::{Path, PathBuf};

use crate::error::{DataplaneError, Result};
use crate::proto::Message;

/// File name of the tiny decoder in the assets folder.
pub const TINY_DECODER_FILE: &str = "tiny-decoder.onnx";
/// Metadata key holding the configuration ([`DecoderConfig::describe`]).
pub const METADATA_KEY: &str = "yardmaster.decoder";
/// The additive bias that masks a position out.
pub const MASKED: f32 = -1e9;

/// ONNX `TensorProto.DataType.FLOAT`.
const FLOAT: i64 = 1;
/// ONNX `TensorProto.DataType.INT64`.
const INT64: i64 = 7;
/// ONNX `AttributeProto.AttributeType`: `FLOAT`, `INT`, `INTS`.
const ATTR_FLOAT: i64 = 1;
const ATTR_INT: i64 = 2;
const ATTR_INTS: i64 = 7;

/// The decoder's dimensions and weight seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderConfig {
    /// Vocabulary size (token ids are `0..vocab`).
    pub vocab: usize,
    /// Hidden width.
    pub hidden: usize,
    /// Attention heads (`hidden` divides evenly among them).
    pub heads: usize,
    /// Transformer layers.
    pub layers: usize,
    /// Feed-forward width.
    pub ffn: usize,
    /// Longest context (prompt and generated tokens): the position-embedding table.
    pub max_positions: usize,
    /// Seed of the random weights.
    pub seed: u64,
}

impl DecoderConfig {
    /// The model the server ships: 2 layers, hidden 128 (4 heads of 32), vocabulary
    /// 512, contexts up to 2,048 tokens; about 0.6 M parameters, 2 KiB of KV cache per token.
    pub const fn tiny() -> Self {
        Self { vocab: 512, hidden: 128, heads: 4, layers: 2, ffn: 512, max_positions: 2048, seed: 0x5EED_CA1E }
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// KV-cache bytes per cached token: keys and values of every layer, float32.
    pub fn kv_bytes_per_token(&self) -> u64 {
        (self.layers * 2 * self.hidden * std::mem::size_of::<f32>()) as u64
    }

    /// The configuration as the model's metadata value.
    pub fn describe(&self) -> String {
        format!(
            "vocab={} hidden={} heads={} layers={} ffn={} max_positions={} seed={}",
            self.vocab, self.hidden, self.heads, self.layers, self.ffn, self.max_positions, self.seed
        )
    }

    /// Parse [`Self::describe`]'s format.
    pub fn parse(text: &str) -> Result<Self> {
        let mut config = Self { vocab: 0, hidden: 0, heads: 0, layers: 0, ffn: 0, max_positions: 0, seed: 0 };
        for pair in text.split_whitespace() {
            let (key, value) = pair.split_once('=').ok_or_else(|| invalid(text))?;
            let value: u64 = value.parse().map_err(|_| invalid(text))?;
            match key {
                "vocab" => config.vocab = value as usize,
                "hidden" => config.hidden = value as usize,
                "heads" => config.heads = value as usize,
                "layers" => config.layers = value as usize,
                "ffn" => config.ffn = value as usize,
                "max_positions" => config.max_positions = value as usize,
                "seed" => config.seed = value,
                _ => return Err(invalid(text)),
            }
        }
        config.check()?;
        Ok(config)
    }

    /// Refuse dimensions the graph cannot be built with.
    pub fn check(&self) -> Result<()> {
        let dims = [self.vocab, self.hidden, self.heads, self.layers, self.ffn, self.max_positions];
        if dims.contains(&0) || !self.hidden.is_multiple_of(self.heads) {
            return Err(DataplaneError::Invalid(format!(
                "decoder configuration {}: every size must be positive and heads must divide hidden",
                self.describe()
            )));
        }
        Ok(())
    }
}

fn invalid(text: &str) -> DataplaneError {
    DataplaneError::Invalid(format!("decoder metadata {text:?} is not `key=value` pairs of the known sizes"))
}

/// SplitMix64: a small, well-mixed generator; the weights only need to be fixed and
/// not degenerate.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `n` values uniform in ±`std`·√3 (standard deviation `std`).
    fn uniform(&mut self, n: usize, std: f32) -> Vec<f32> {
        let half = std * 3f32.sqrt();
        (0..n).map(|_| ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * half).collect()
    }
}

/// The graph under construction.
#[derive(Default)]
struct Graph {
    nodes: Vec<Message>,
    initializers: Vec<Message>,
}

fn attr_int(name: &str, value: i64) -> Message {
    Message::default().string(1, name).int(3, value).int(20, ATTR_INT)
}

fn attr_float(name: &str, value: f32) -> Message {
    Message::default().string(1, name).float(2, value).int(20, ATTR_FLOAT)
}

fn attr_ints(name: &str, values: &[i64]) -> Message {
    values.iter().fold(Message::default().string(1, name), |m, v| m.int(8, *v)).int(20, ATTR_INTS)
}

impl Graph {
    fn node(&mut self, op: &str, inputs: &[&str], output: &str, attributes: &[Message]) -> String {
        let mut node = Message::default();
        for input in inputs {
            node = node.string(1, input);
        }
        node = node.string(2, output).string(3, output).string(4, op);
        for attribute in attributes {
            node = node.message(5, attribute);
        }
        self.nodes.push(node);
        output.to_string()
    }

    fn tensor(&mut self, name: &str, dims: &[usize], data_type: i64, raw: Vec<u8>) -> String {
        let tensor = dims.iter().fold(Message::default(), |m, d| m.int(1, *d as i64));
        self.initializers.push(tensor.int(2, data_type).string(8, name).bytes(9, &raw));
        name.to_string()
    }

    fn floats(&mut self, name: &str, dims: &[usize], data: &[f32]) -> String {
        self.tensor(name, dims, FLOAT, data.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    fn int64s(&mut self, name: &str, data: &[i64]) -> String {
        self.tensor(name, &[data.len()], INT64, data.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
}

/// A tensor's type with symbolic (`&str`) or fixed (`usize`) dimensions.
enum Dim {
    Named(&'static str),
    Fixed(usize),
}

fn value_info(name: &str, elem_type: i64, dims: &[Dim]) -> Message {
    let shape = dims.iter().fold(Message::default(), |shape, dim| {
        let dim = match dim {
            Dim::Named(param) => Message::default().string(2, param),
            Dim::Fixed(value) => Message::default().int(1, *value as i64),
        };
        shape.message(1, &dim)
    });
    let tensor_type = Message::default().int(1, elem_type).message(2, &shape);
    Message::default().string(1, name).message(2, &Message::default().message(1, &tensor_type))
}

/// Input name of layer `layer`'s cached keys (`kind` = `key` | `value`).
pub fn past_name(kind: &str, layer: usize) -> String {
    format!("past_{kind}_{layer}")
}

/// Output name of layer `layer`'s keys after the step (`kind` = `key` | `value`).
pub fn present_name(kind: &str, layer: usize) -> String {
    format!("present_{kind}_{layer}")
}

/// The model's ONNX bytes for `config`.
pub fn model_bytes(config: &DecoderConfig) -> Result<Vec<u8>> {
    config.check()?;
    let (d, h, dh, v, f) = (config.hidden, config.heads, config.head_dim(), config.vocab, config.ffn);
    let mut rng = SplitMix(config.seed);
    let mut g = Graph::default();
    let ones = vec![1.0f32; d];
    let zeros = vec![0.0f32; d];
    let ln_scale = g.floats("ln_scale", &[d], &ones);
    let ln_bias = g.floats("ln_bias", &[d], &zeros);
    let heads_shape = g.int64s("shape_heads", &[0, 0, h as i64, dh as i64]);
    let hidden_shape = g.int64s("shape_hidden", &[0, 0, d as i64]);
    let scale = g.floats("attention_scale", &[], &[1.0 / (dh as f32).sqrt()]);
    let layer_norm = |g: &mut Graph, x: &str, out: &str| {
        g.node("LayerNormalization", &[x, &ln_scale, &ln_bias], out, &[attr_int("axis", -1), attr_float("epsilon", 1e-5)])
    };

    let embedding = g.floats("token_embedding", &[v, d], &rng.uniform(v * d, 1.0));
    let positions = g.floats("position_embedding", &[config.max_positions, d], &rng.uniform(config.max_positions * d, 0.5));
    let tokens = g.node("Gather", &[&embedding, "input_ids"], "tokens", &[attr_int("axis", 0)]);
    let placed = g.node("Gather", &[&positions, "position_ids"], "positions", &[attr_int("axis", 0)]);
    let mut x = g.node("Add", &[&tokens, &placed], "embedded", &[]);
    let projection_std = 1.0 / (d as f32).sqrt();
    for layer in 0..config.layers {
        let p = |name: &str| format!("l{layer}_{name}");
        let a = layer_norm(&mut g, &x, &p("attn_norm"));
        let mut heads = Vec::new();
        for which in ["q", "k", "v"] {
            let w = g.floats(&p(&format!("w{which}")), &[d, d], &rng.uniform(d * d, projection_std));
            let projected = g.node("MatMul", &[&a, &w], &p(which), &[]);
            let split = g.node("Reshape", &[&projected, &heads_shape], &p(&format!("{which}_heads")), &[]);
            heads.push(g.node("Transpose", &[&split], &p(&format!("{which}_bhsd")), &[attr_ints("perm", &[0, 2, 1, 3])]));
        }
        let concat_axis = [attr_int("axis", 2)];
        let keys = g.node("Concat", &[&past_name("key", layer), &heads[1]], &present_name("key", layer), &concat_axis);
        let values = g.node("Concat", &[&past_name("value", layer), &heads[2]], &present_name("value", layer), &concat_axis);
        let keys_t = g.node("Transpose", &[&keys], &p("k_t"), &[attr_ints("perm", &[0, 1, 3, 2])]);
        let scores = g.node("MatMul", &[&heads[0], &keys_t], &p("scores"), &[]);
        let scaled = g.node("Mul", &[&scores, &scale], &p("scaled"), &[]);
        let biased = g.node("Add", &[&scaled, "attention_bias"], &p("biased"), &[]);
        let weights = g.node("Softmax", &[&biased], &p("weights"), &[attr_int("axis", -1)]);
        let context = g.node("MatMul", &[&weights, &values], &p("context"), &[]);
        let merged = g.node("Transpose", &[&context], &p("context_bshd"), &[attr_ints("perm", &[0, 2, 1, 3])]);
        let flat = g.node("Reshape", &[&merged, &hidden_shape], &p("context_flat"), &[]);
        let wo = g.floats(&p("wo"), &[d, d], &rng.uniform(d * d, projection_std));
        let attended = g.node("MatMul", &[&flat, &wo], &p("attended"), &[]);
        x = g.node("Add", &[&x, &attended], &p("after_attention"), &[]);
        let m = layer_norm(&mut g, &x, &p("ffn_norm"));
        let w1 = g.floats(&p("w1"), &[d, f], &rng.uniform(d * f, projection_std));
        let w2 = g.floats(&p("w2"), &[f, d], &rng.uniform(f * d, 1.0 / (f as f32).sqrt()));
        let up = g.node("MatMul", &[&m, &w1], &p("up"), &[]);
        let active = g.node("Relu", &[&up], &p("relu"), &[]);
        let down = g.node("MatMul", &[&active, &w2], &p("down"), &[]);
        x = g.node("Add", &[&x, &down], &p("out"), &[]);
    }
    let normed = layer_norm(&mut g, &x, "final_norm");
    // Wide logits (standard deviation about 4): greedy choices are far from ties, so
    // the small float differences between a batched prefill and step-by-step decoding
    // never change a token.
    let head = g.floats("lm_head", &[d, v], &rng.uniform(d * v, 4.0 / (d as f32).sqrt()));
    g.node("MatMul", &[&normed, &head], "logits", &[]);

    let mut graph = Message::default();
    for node in &g.nodes {
        graph = graph.message(1, node);
    }
    graph = graph.string(2, "tiny-decoder");
    for initializer in &g.initializers {
        graph = graph.message(5, initializer);
    }
    use Dim::{Fixed, Named};
    graph = graph
        .message(11, &value_info("input_ids", INT64, &[Named("batch"), Named("seq")]))
        .message(11, &value_info("position_ids", INT64, &[Named("batch"), Named("seq")]))
        .message(11, &value_info("attention_bias", FLOAT, &[Named("batch"), Fixed(1), Named("seq"), Named("total")]));
    for layer in 0..config.layers {
        for kind in ["key", "value"] {
            let dims = [Named("batch"), Fixed(h), Named("past"), Fixed(dh)];
            graph = graph.message(11, &value_info(&past_name(kind, layer), FLOAT, &dims));
        }
    }
    graph = graph.message(12, &value_info("logits", FLOAT, &[Named("batch"), Named("seq"), Fixed(v)]));
    for layer in 0..config.layers {
        for kind in ["key", "value"] {
            let dims = [Named("batch"), Fixed(h), Named("total"), Fixed(dh)];
            graph = graph.message(12, &value_info(&present_name(kind, layer), FLOAT, &dims));
        }
    }
    let opset = Message::default().string(1, "").int(2, 17);
    let metadata = Message::default().string(1, METADATA_KEY).string(2, &config.describe());
    Ok(Message::default().int(1, 8).string(2, "yardmaster").message(7, &graph).message(8, &opset).message(14, &metadata).into_bytes())
}

/// The model file for `config` in `dir` (named `file`), written there if it is
/// missing or differs. Written beside and renamed, so a concurrent reader never sees
/// half a file.
pub fn ensure_model(dir: &Path, file: &str, config: &DecoderConfig) -> Result<PathBuf> {
    let path = dir.join(file);
    let bytes = model_bytes(config)?;
    if std::fs::read(&path).ok().as_deref() != Some(bytes.as_slice()) {
        let io = |e: std::io::Error| DataplaneError::Io { path: path.clone(), message: e.to_string() };
        std::fs::create_dir_all(dir).map_err(io)?;
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let partial = dir.join(format!("{file}.{}-{n}.partial", std::process::id()));
        std::fs::write(&partial, &bytes).map_err(io)?;
        std::fs::rename(&partial, &path).map_err(io)?;
    }
    Ok(path)
}

/// The tiny decoder ([`DecoderConfig::tiny`]) in the assets folder
/// ([`crate::assets::assets_dir`]), written on first use.
pub fn tiny_decoder() -> Result<(PathBuf, DecoderConfig)> {
    let config = DecoderConfig::tiny();
    Ok((ensure_model(&crate::assets::assets_dir(), TINY_DECODER_FILE, &config)?, config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_round_trips_through_its_metadata_text() {
        let tiny = DecoderConfig::tiny();
        assert_eq!(DecoderConfig::parse(&tiny.describe()).unwrap(), tiny);
        assert_eq!(tiny.kv_bytes_per_token(), 2048);
        assert!(DecoderConfig::parse("vocab=1 hidden=3 heads=2 layers=1 ffn=1 max_positions=1 seed=0").is_err());
        assert!(DecoderConfig::parse("vocab=x").is_err());
    }

    #[test]
    fn the_same_configuration_writes_the_same_bytes() {
        let tiny = DecoderConfig::tiny();
        let a = model_bytes(&tiny).unwrap();
        assert_eq!(a, model_bytes(&tiny).unwrap());
        assert_ne!(a, model_bytes(&DecoderConfig { seed: 7, ..tiny }).unwrap());
        assert_eq!(&a[..2], &[0x08, 0x08], "starts with ir_version = 8");
    }
}
