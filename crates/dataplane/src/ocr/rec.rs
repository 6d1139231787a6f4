//! Text recognition (PP-OCRv4 rec, CTC): crops resized to 48 px high and padded to a
//! common width, and the greedy CTC decode of its per-step character probabilities
//! with the character list stored in the model's metadata (key `character`).

use super::image::RgbImage;
use crate::error::{DataplaneError, Result};
use crate::session::ModelSession;
use crate::tensor::Tensor;

/// Recogniser settings (defaults: `rapidocr-onnxruntime` 1.4.4's configuration).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecOptions {
    /// Input height.
    pub height: usize,
    /// Narrowest input width (crops of a batch are padded to at least this).
    pub width: usize,
    /// Crops per batch.
    pub batch: usize,
    /// Results scoring below this are dropped by the pipeline.
    pub text_score: f32,
}

impl Default for RecOptions {
    fn default() -> Self {
        RecOptions { height: 48, width: 320, batch: 6, text_score: 0.5 }
    }
}

/// Recognised text and its confidence (mean probability of the kept characters).
#[derive(Debug, Clone, PartialEq)]
pub struct Recognized {
    /// The text.
    pub text: String,
    /// Its confidence in [0, 1].
    pub score: f32,
}

/// The CTC label list: index 0 is the blank, then the model's characters, then a space.
#[derive(Debug, Clone, PartialEq)]
pub struct Dictionary {
    labels: Vec<String>,
}

impl Dictionary {
    /// From the model's `character` metadata (one character per line).
    pub fn from_metadata(character: &str) -> Self {
        let mut labels = vec![String::new()];
        labels.extend(character.lines().map(str::to_string));
        labels.push(" ".into());
        Dictionary { labels }
    }

    /// The dictionary stored in a loaded recogniser's metadata (key `character`).
    pub fn from_session(session: &ModelSession) -> Result<Self> {
        let character = session.custom_metadata("character")?.ok_or_else(|| {
            DataplaneError::Invalid(format!("{} has no `character` metadata (the CTC dictionary)", session.spec().path.display()))
        })?;
        Ok(Self::from_metadata(&character))
    }

    /// Number of labels, blank included.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether it holds only the blank and the space.
    pub fn is_empty(&self) -> bool {
        self.labels.len() <= 2
    }
}

/// The recogniser's inputs for crops that run in one batch: each `[3, height, W]`, with
/// W the widest crop's scaled width (at least `options.width`).
pub fn preprocess(crops: &[RgbImage], options: &RecOptions) -> Vec<Tensor> {
    let h = options.height as f32;
    let max_ratio = crops.iter().map(|c| c.width as f32 / c.height as f32).fold(options.width as f32 / h, f32::max);
    let batch_width = (h * max_ratio) as usize;
    crops
        .iter()
        .map(|crop| {
            let ratio = crop.width as f32 / crop.height as f32;
            let resized_w = ((h * ratio).ceil() as usize).clamp(1, batch_width);
            crop.resize(resized_w, options.height).to_chw(0.5, 0.5, batch_width, 0.0)
        })
        .collect()
}

/// Greedy CTC decode of one crop's output (`[T, C]` probabilities).
pub fn decode(output: &Tensor, dictionary: &Dictionary) -> Result<Recognized> {
    let [steps, classes] = output.shape[..] else {
        return Err(DataplaneError::Invalid(format!("recogniser output of shape {:?}, expected [T, C]", output.shape)));
    };
    if classes != dictionary.len() {
        return Err(DataplaneError::Invalid(format!("the recogniser has {classes} classes, its dictionary {}", dictionary.len())));
    }
    let probabilities = output
        .data
        .as_f32()
        .ok_or_else(|| DataplaneError::Invalid(format!("recogniser output of {} elements, expected float32", output.data.element())))?;
    let (mut text, mut total, mut kept, mut previous) = (String::new(), 0.0f32, 0usize, 0usize);
    for t in 0..steps {
        let row = &probabilities[t * classes..(t + 1) * classes];
        let (best, p) = row.iter().enumerate().fold((0, f32::MIN), |acc, (i, &p)| if p > acc.1 { (i, p) } else { acc });
        if best != 0 && best != previous {
            text.push_str(&dictionary.labels[best]);
            total += p;
            kept += 1;
        }
        previous = best;
    }
    Ok(Recognized { text, score: if kept == 0 { 0.0 } else { total / kept as f32 } })
}
