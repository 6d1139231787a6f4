//! Direction classification (PP-OCR mobile cls): is a text crop upright (0°) or upside
//! down (180°)? Crops are resized to 48 px high, at most 192 wide, and padded.

use super::image::RgbImage;
use crate::error::{DataplaneError, Result};
use crate::tensor::Tensor;

/// Classifier settings (defaults: `rapidocr-onnxruntime` 1.4.4's configuration).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClsOptions {
    /// Input height.
    pub height: usize,
    /// Input width (crops are padded to it).
    pub width: usize,
    /// A crop is turned when "180°" wins with at least this probability.
    pub thresh: f32,
    /// Crops per batch.
    pub batch: usize,
}

impl Default for ClsOptions {
    fn default() -> Self {
        ClsOptions { height: 48, width: 192, thresh: 0.9, batch: 6 }
    }
}

/// The classifier's verdict on one crop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Direction {
    /// 0 or 180 (degrees).
    pub angle: u32,
    /// Probability of that angle.
    pub score: f32,
}

impl Direction {
    /// Whether the crop should be turned by 180° before recognition.
    pub fn upside_down(&self, options: &ClsOptions) -> bool {
        self.angle == 180 && self.score >= options.thresh
    }
}

/// The classifier's input for one crop: `[3, height, width]`.
pub fn preprocess(crop: &RgbImage, options: &ClsOptions) -> Tensor {
    let ratio = crop.width as f32 / crop.height as f32;
    let resized_w = ((options.height as f32 * ratio).ceil() as usize).clamp(1, options.width);
    crop.resize(resized_w, options.height).to_chw(0.5, 0.5, options.width, 0.0)
}

/// The verdict from one crop's output (`[2]`: probabilities of 0° and 180°).
pub fn postprocess(output: &Tensor) -> Result<Direction> {
    match output.data.as_f32().unwrap_or_default() {
        [p0, p180] => Ok(if p180 > p0 { Direction { angle: 180, score: *p180 } } else { Direction { angle: 0, score: *p0 } }),
        _ => Err(DataplaneError::Invalid(format!("classifier output of shape {:?}, expected [2]", output.shape))),
    }
}
