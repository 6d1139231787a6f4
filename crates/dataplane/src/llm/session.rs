//! A decoder session: the tiny decoder ([`super::model`]) in ONNX Runtime, run one frame
//! at a time over a batch of sequences of different lengths.
//!
//! A frame's first step feeds every sequence what its cache lacks (a whole context for a
//! prefill, the last generated token for a resumed sequence) and each later step feeds
//! the token the previous step chose (greedy: the highest logit, the lowest id on a
//! tie). Every step yields one token per sequence, so a frame of `steps` steps yields
//! `steps` tokens and leaves the cache one token short of the text (the last token is
//! fed by the next frame).
//!
//! Within a frame the batch's caches live in ONNX Runtime's own tensors: the `present`
//! outputs of one step are the `past` inputs of the next, without a copy. Rows of
//! different lengths are padded: the caches sit at the start of a common `P`-position
//! block, each step appends one column for every row, and the attention bias masks the
//! padding out (and makes the first step causal). A row that has its tokens leaves the
//! batch; its compact cache goes back to the caller at the end of the frame.

use std::path::Path;
use std::time::{Duration, Instant};

use ort::session::builder::GraphOptimizationLevel;
use ort::session::{Session, SessionInputValue};
use ort::value::{DynValue, Tensor};

use super::cache::SequenceCache;
use super::model::{past_name, present_name, DecoderConfig, MASKED, METADATA_KEY};
use crate::error::{DataplaneError, Result};
use crate::runtime::Runtime;
use crate::session::register_device;

/// One sequence of a frame.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameSequence {
    /// What it has cached (empty for a prefill).
    pub cache: SequenceCache,
    /// Tokens not yet in the cache, at least one: the context for a prefill, the last
    /// generated token to resume.
    pub feed: Vec<i64>,
    /// Tokens to generate in this frame, at least one.
    pub steps: usize,
}

/// One sequence's result of a frame.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameOutput {
    /// The tokens it generated, `steps` of them.
    pub tokens: Vec<i64>,
    /// Its cache after the frame: everything fed, i.e. all but the last generated token.
    pub cache: SequenceCache,
}

/// One model call of a frame.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTiming {
    /// Sequences in the batch.
    pub batch: usize,
    /// New positions per sequence (the longest feed on a frame's first step, 1 after).
    pub new_positions: usize,
    /// Attended positions (cached, padded, plus new).
    pub total_positions: usize,
    /// Wall time of the call, with the inputs made and the tokens chosen.
    pub duration: Duration,
}

/// A frame's results, in the order of its sequences, and how its steps went.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameRun {
    /// Per sequence.
    pub outputs: Vec<FrameOutput>,
    /// Per model call.
    pub steps: Vec<StepTiming>,
}

/// The decoder loaded in ONNX Runtime.
pub struct DecoderSession {
    session: Session,
    config: DecoderConfig,
    threads: usize,
}

impl std::fmt::Debug for DecoderSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecoderSession").field("config", &self.config).field("threads", &self.threads).finish()
    }
}

/// A row of the batch while a frame runs.
struct Row {
    /// Index among the frame's sequences.
    sequence: usize,
    /// Which of the batch's `total` positions hold this row's cache.
    valid: Vec<bool>,
    /// Position id of the next token fed.
    position: usize,
    /// Tokens still to generate.
    remaining: usize,
    tokens: Vec<i64>,
}

impl DecoderSession {
    /// Load the decoder from `path` with `threads` intra-op threads (0: ONNX Runtime's
    /// default), checking that its metadata describes `config`.
    pub fn load(runtime: &Runtime, path: &Path, config: DecoderConfig, threads: usize) -> Result<Self> {
        let load_error = |e: ort::Error| DataplaneError::Ort(format!("loading the decoder from {}: {e}", path.display()));
        let mut builder = Session::builder(runtime.environment())
            .map_err(DataplaneError::ort)?
            .with_optimization_level(GraphOptimizationLevel::All)
            .map_err(DataplaneError::ort)?;
        if threads > 0 {
            builder = builder.with_intra_threads(threads).map_err(DataplaneError::ort)?;
        }
        builder = register_device(builder, runtime)?;
        let session = builder.commit_from_file(path).map_err(load_error)?;
        let described = session.metadata().map_err(DataplaneError::ort)?.custom(METADATA_KEY);
        let found = described.as_deref().map(DecoderConfig::parse).transpose()?;
        if found != Some(config) {
            return Err(DataplaneError::Invalid(format!(
                "{} is not the decoder expected ({}); its metadata says {:?}",
                path.display(),
                config.describe(),
                described
            )));
        }
        Ok(Self { session, config, threads })
    }

    /// The decoder's dimensions.
    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// Run one frame over `sequences` (see the module docs). `stop` is asked before
    /// every model call; when it says yes the frame ends with
    /// [`DataplaneError::Aborted`] and nothing is returned.
    pub fn run_frame(&mut self, sequences: Vec<FrameSequence>, stop: &dyn Fn() -> bool) -> Result<FrameRun> {
        self.check(&sequences)?;
        let mut outputs: Vec<Option<FrameOutput>> = vec![None; sequences.len()];
        let mut timings = Vec::new();
        if sequences.is_empty() {
            return Ok(FrameRun { outputs: Vec::new(), steps: timings });
        }
        let (heads, head_dim) = (self.config.heads, self.config.head_dim());
        // The first step: caches padded to a common length (at least one position, kept
        // masked, so no tensor is empty), feeds padded to the longest.
        let past_len = sequences.iter().map(|s| s.cache.len()).max().unwrap_or(0).max(1);
        let feed_len = sequences.iter().map(|s| s.feed.len()).max().unwrap_or(1);
        let batch = sequences.len();
        let mut past = Vec::with_capacity(self.config.layers * 2);
        for layer in 0..self.config.layers {
            for kind in 0..2 {
                let mut data = vec![0.0f32; batch * heads * past_len * head_dim];
                for (row, sequence) in sequences.iter().enumerate() {
                    let (len, part) = (sequence.cache.len(), sequence.cache.part(layer, kind));
                    for head in 0..heads {
                        let at = ((row * heads + head) * past_len) * head_dim;
                        data[at..at + len * head_dim].copy_from_slice(&part[head * len * head_dim..(head + 1) * len * head_dim]);
                    }
                }
                past.push(tensor(vec![batch, heads, past_len, head_dim], data)?);
            }
        }
        let mut rows: Vec<Row> = sequences
            .iter()
            .enumerate()
            .map(|(i, s)| Row {
                sequence: i,
                valid: (0..past_len).map(|p| p < s.cache.len()).collect(),
                position: s.cache.len(),
                remaining: s.steps,
                tokens: Vec::with_capacity(s.steps),
            })
            .collect();
        let total = past_len + feed_len;
        let mut ids = vec![0i64; batch * feed_len];
        let mut positions = vec![0i64; batch * feed_len];
        let mut bias = vec![MASKED; batch * feed_len * total];
        for (r, (row, sequence)) in rows.iter().zip(&sequences).enumerate() {
            for (j, &token) in sequence.feed.iter().enumerate() {
                ids[r * feed_len + j] = token;
                positions[r * feed_len + j] = (row.position + j) as i64;
            }
            for q in 0..feed_len {
                let line = &mut bias[(r * feed_len + q) * total..(r * feed_len + q + 1) * total];
                for (k, slot) in line.iter_mut().enumerate() {
                    let visible = if k < past_len { row.valid[k] } else { k - past_len <= q && k - past_len < sequence.feed.len() };
                    if visible {
                        *slot = 0.0;
                    }
                }
            }
        }
        let last: Vec<usize> = sequences.iter().map(|s| s.feed.len() - 1).collect();
        if stop() {
            return Err(DataplaneError::Aborted);
        }
        let begin = Instant::now();
        let chosen = self.step(&mut past, ids, positions, bias, batch, feed_len, total, &last)?;
        timings.push(StepTiming { batch, new_positions: feed_len, total_positions: total, duration: begin.elapsed() });
        for ((row, sequence), token) in rows.iter_mut().zip(&sequences).zip(chosen) {
            row.valid.extend((0..feed_len).map(|j| j < sequence.feed.len()));
            row.position += sequence.feed.len();
            row.remaining -= 1;
            row.tokens.push(token);
        }
        let mut total = total;
        loop {
            // Rows with all their tokens leave the batch.
            if rows.iter().any(|r| r.remaining == 0) {
                let keep: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].remaining > 0).collect();
                for (index, row) in rows.iter().enumerate().filter(|(_, r)| r.remaining == 0) {
                    let cache = self.extract(&past, rows.len(), total, index, &row.valid)?;
                    outputs[row.sequence] = Some(FrameOutput { tokens: row.tokens.clone(), cache });
                }
                if keep.is_empty() {
                    break;
                }
                past = past.iter().map(|p| select_rows(p, &keep)).collect::<Result<_>>()?;
                let mut kept = Vec::with_capacity(keep.len());
                for (i, row) in rows.into_iter().enumerate() {
                    if keep.contains(&i) {
                        kept.push(row);
                    }
                }
                rows = kept;
            }
            if stop() {
                return Err(DataplaneError::Aborted);
            }
            let batch = rows.len();
            let next = total + 1;
            let ids: Vec<i64> = rows.iter().map(|r| *r.tokens.last().expect("one token per step")).collect();
            let positions: Vec<i64> = rows.iter().map(|r| r.position as i64).collect();
            let mut bias = Vec::with_capacity(batch * next);
            for row in &rows {
                bias.extend(row.valid.iter().map(|&v| if v { 0.0 } else { MASKED }));
                bias.push(0.0);
            }
            let begin = Instant::now();
            let chosen = self.step(&mut past, ids, positions, bias, batch, 1, next, &vec![0; batch])?;
            timings.push(StepTiming { batch, new_positions: 1, total_positions: next, duration: begin.elapsed() });
            for (row, token) in rows.iter_mut().zip(chosen) {
                row.valid.push(true);
                row.position += 1;
                row.remaining -= 1;
                row.tokens.push(token);
            }
            total = next;
        }
        let outputs = outputs.into_iter().map(|o| o.expect("every row leaves the batch with its tokens")).collect();
        Ok(FrameRun { outputs, steps: timings })
    }

    /// Generate `tokens` tokens after `prompt` in frames of at most `frame` steps,
    /// keeping the cache between frames: the reference run the tests compare with.
    pub fn generate(&mut self, prompt: &[i64], tokens: usize, frame: usize) -> Result<Vec<i64>> {
        let mut cache = SequenceCache::empty(&self.config);
        let mut out: Vec<i64> = Vec::with_capacity(tokens);
        while out.len() < tokens {
            let feed = match out.last() {
                Some(&last) => vec![last],
                None => prompt.to_vec(),
            };
            let steps = frame.max(1).min(tokens - out.len());
            let run = self.run_frame(vec![FrameSequence { cache, feed, steps }], &|| false)?;
            let output = run.outputs.into_iter().next().expect("one sequence in, one out");
            out.extend(output.tokens);
            cache = output.cache;
        }
        Ok(out)
    }

    fn check(&self, sequences: &[FrameSequence]) -> Result<()> {
        for (i, s) in sequences.iter().enumerate() {
            if s.feed.is_empty() || s.steps == 0 {
                return Err(DataplaneError::Invalid(format!("frame sequence {i}: nothing to feed or no step to run")));
            }
            if let Some(bad) = s.feed.iter().find(|&&t| t < 0 || t as usize >= self.config.vocab) {
                return Err(DataplaneError::Invalid(format!(
                    "frame sequence {i}: token {bad} is outside the vocabulary (0..{})",
                    self.config.vocab
                )));
            }
            let context = s.cache.len() + s.feed.len() + s.steps - 1;
            if context > self.config.max_positions {
                return Err(DataplaneError::Invalid(format!(
                    "frame sequence {i}: {context} positions exceed the decoder's {}",
                    self.config.max_positions
                )));
            }
            if s.cache.bytes() != s.cache.len() as u64 * self.config.kv_bytes_per_token() {
                return Err(DataplaneError::Invalid(format!("frame sequence {i}: its cache is not shaped for this decoder")));
            }
        }
        Ok(())
    }

    /// One model call: feeds `ids` (`[batch, seq]`) with `past`, replaces `past` with
    /// the presents, and returns each row's greedy token at position `last[row]`.
    #[allow(clippy::too_many_arguments)]
    fn step(
        &mut self,
        past: &mut [DynValue],
        ids: Vec<i64>,
        positions: Vec<i64>,
        bias: Vec<f32>,
        batch: usize,
        seq: usize,
        total: usize,
        last: &[usize],
    ) -> Result<Vec<i64>> {
        let mut inputs: Vec<(String, SessionInputValue<'_>)> = vec![
            ("input_ids".into(), Tensor::from_array((vec![batch, seq], ids)).map_err(DataplaneError::ort)?.into()),
            ("position_ids".into(), Tensor::from_array((vec![batch, seq], positions)).map_err(DataplaneError::ort)?.into()),
            ("attention_bias".into(), Tensor::from_array((vec![batch, 1, seq, total], bias)).map_err(DataplaneError::ort)?.into()),
        ];
        for layer in 0..self.config.layers {
            for (kind, name) in ["key", "value"].iter().enumerate() {
                inputs.push((past_name(name, layer), SessionInputValue::from(&past[layer * 2 + kind])));
            }
        }
        let mut outputs = self.session.run(inputs).map_err(DataplaneError::ort)?;
        let vocab = self.config.vocab;
        let logits = outputs.remove("logits").ok_or_else(|| DataplaneError::Ort("output \"logits\" missing".into()))?;
        let (_, data) = logits.try_extract_tensor::<f32>().map_err(DataplaneError::ort)?;
        let chosen =
            last.iter().enumerate().map(|(row, &at)| argmax(&data[(row * seq + at) * vocab..(row * seq + at + 1) * vocab])).collect();
        for layer in 0..self.config.layers {
            for (kind, name) in ["key", "value"].iter().enumerate() {
                let present = present_name(name, layer);
                past[layer * 2 + kind] =
                    outputs.remove(&present).ok_or_else(|| DataplaneError::Ort(format!("output {present:?} missing")))?;
            }
        }
        Ok(chosen)
    }

    /// Row `row`'s compact cache out of the batch's `past` (`rows` rows, `total`
    /// positions), keeping the positions `valid` marks.
    fn extract(&self, past: &[DynValue], rows: usize, total: usize, row: usize, valid: &[bool]) -> Result<SequenceCache> {
        let (heads, dh) = (self.config.heads, self.config.head_dim());
        let len = valid.iter().filter(|v| **v).count();
        let mut layers = Vec::with_capacity(self.config.layers);
        for layer in 0..self.config.layers {
            let mut parts = [Vec::new(), Vec::new()];
            for (kind, part) in parts.iter_mut().enumerate() {
                let (shape, data) = past[layer * 2 + kind].try_extract_tensor::<f32>().map_err(DataplaneError::ort)?;
                debug_assert_eq!(shape.num_elements(), rows * heads * total * dh);
                part.reserve(heads * len * dh);
                for head in 0..heads {
                    let base = (row * heads + head) * total;
                    let mut p = 0;
                    while p < total {
                        if !valid[p] {
                            p += 1;
                            continue;
                        }
                        let start = p;
                        while p < total && valid[p] {
                            p += 1;
                        }
                        part.extend_from_slice(&data[(base + start) * dh..(base + p) * dh]);
                    }
                }
            }
            let [keys, values] = parts;
            layers.push((keys, values));
        }
        Ok(SequenceCache::from_parts(len, heads, dh, layers))
    }
}

/// A float tensor as an ONNX Runtime value.
fn tensor(shape: Vec<usize>, data: Vec<f32>) -> Result<DynValue> {
    Ok(Tensor::from_array((shape, data)).map_err(DataplaneError::ort)?.into_dyn())
}

/// The rows `keep` of a `[batch, …]` float tensor.
fn select_rows(value: &DynValue, keep: &[usize]) -> Result<DynValue> {
    let (shape, data) = value.try_extract_tensor::<f32>().map_err(DataplaneError::ort)?;
    let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
    let row = dims[1..].iter().product::<usize>();
    let mut kept = Vec::with_capacity(keep.len() * row);
    for &r in keep {
        kept.extend_from_slice(&data[r * row..(r + 1) * row]);
    }
    let mut new_dims = dims;
    new_dims[0] = keep.len();
    tensor(new_dims, kept)
}

/// The index of the largest value (the first on a tie).
fn argmax(values: &[f32]) -> i64 {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best as i64
}

#[cfg(test)]
mod tests {
    use super::argmax;

    #[test]
    fn argmax_takes_the_first_of_equal_maxima() {
        assert_eq!(argmax(&[0.0, 2.0, 1.0, 2.0]), 1);
        assert_eq!(argmax(&[-1.0]), 0);
    }
}
