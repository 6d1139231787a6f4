//! Text detection (PP-OCRv4 det, a DB network): resize and normalise the image, and turn
//! the probability map it returns into boxes — threshold, dilate, connected regions,
//! minimum-area rectangles, box score, unclip, back to image coordinates.

use super::geometry::{mean_inside, min_area_rect, regions};
use super::image::{Point, RgbImage};
use crate::error::{DataplaneError, Result};
use crate::tensor::Tensor;

/// How the image side limit applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitType {
    /// Scale up until the shorter side reaches the limit.
    Min,
    /// Scale down until the longer side is within the limit.
    Max,
}

/// Detection settings (defaults: `rapidocr-onnxruntime` 1.4.4's configuration).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DetOptions {
    /// Side limit, pixels.
    pub limit_side_len: usize,
    /// Which side the limit applies to.
    pub limit_type: LimitType,
    /// Per-channel mean after scaling to [0, 1].
    pub mean: f32,
    /// Per-channel standard deviation.
    pub std: f32,
    /// Map threshold for the text bitmap.
    pub thresh: f32,
    /// Minimum mean probability inside a box.
    pub box_thresh: f32,
    /// Most regions considered.
    pub max_candidates: usize,
    /// How much a box grows (area × ratio / perimeter on each side).
    pub unclip_ratio: f32,
    /// Dilate the bitmap with a 2×2 kernel.
    pub use_dilation: bool,
    /// Boxes with a shorter side below this (map pixels) are dropped.
    pub min_size: f32,
}

impl Default for DetOptions {
    fn default() -> Self {
        DetOptions {
            limit_side_len: 736,
            limit_type: LimitType::Min,
            mean: 0.5,
            std: 0.5,
            thresh: 0.3,
            box_thresh: 0.5,
            max_candidates: 1000,
            unclip_ratio: 1.6,
            use_dilation: true,
            min_size: 3.0,
        }
    }
}

/// A detected text box in image coordinates.
#[derive(Debug, Clone, PartialEq)]
pub struct TextBox {
    /// Corners: top-left, top-right, bottom-right, bottom-left.
    pub corners: [Point; 4],
    /// Mean text probability inside the box.
    pub score: f32,
}

/// The detector's input size (height, width) for an image of `width` × `height`: the
/// side limit applied, each side rounded to a multiple of 32.
pub fn input_size(width: usize, height: usize, options: &DetOptions) -> (usize, usize) {
    let (h, w) = (height as f32, width as f32);
    let limit = options.limit_side_len as f32;
    let ratio = match options.limit_type {
        LimitType::Min if h.min(w) < limit => limit / h.min(w),
        LimitType::Max if h.max(w) > limit => limit / h.max(w),
        _ => 1.0,
    };
    let to_32 = |side: f32| (((side * ratio) / 32.0).round() as usize * 32).max(32);
    (to_32(h), to_32(w))
}

/// The detector's input for `image`: a `[3, H, W]` tensor with H and W multiples of 32
/// (see [`input_size`]).
pub fn preprocess(image: &RgbImage, options: &DetOptions) -> Tensor {
    let (rh, rw) = input_size(image.width, image.height, options);
    let resized = if (rh, rw) == (image.height, image.width) { image.clone() } else { image.resize(rw, rh) };
    resized.to_chw(options.mean, options.std, rw, 0.0)
}

/// Boxes from the detector's output for one image (`[1, H, W]`), in the coordinates of
/// an image of `width` × `height`, sorted top to bottom, then left to right.
pub fn postprocess(map: &Tensor, width: usize, height: usize, options: &DetOptions) -> Result<Vec<TextBox>> {
    let (mh, mw) = match map.shape.as_slice() {
        [1, h, w] => (*h, *w),
        other => return Err(DataplaneError::Invalid(format!("detection map of shape {other:?}, expected [1, H, W]"))),
    };
    let pred = map
        .data
        .as_f32()
        .ok_or_else(|| DataplaneError::Invalid(format!("detection map of {} elements, expected float32", map.data.element())))?;
    let raw: Vec<bool> = pred.iter().map(|&p| p > options.thresh).collect();
    let bitmap = if options.use_dilation {
        let mut out = raw.clone();
        for y in 0..mh {
            for x in 0..mw {
                let any = raw[y * mw + x]
                    || (x > 0 && raw[y * mw + x - 1])
                    || (y > 0 && raw[(y - 1) * mw + x])
                    || (x > 0 && y > 0 && raw[(y - 1) * mw + x - 1]);
                out[y * mw + x] = any;
            }
        }
        out
    } else {
        raw
    };
    let (sx, sy) = (width as f32 / mw as f32, height as f32 / mh as f32);
    let mut boxes = Vec::new();
    for region in regions(&bitmap, mw, mh).into_iter().take(options.max_candidates) {
        let points: Vec<Point> = region.rows.iter().flat_map(|&(y, a, b)| [(a as f32, y as f32), (b as f32, y as f32)]).collect();
        let rect = min_area_rect(&points);
        if rect.short_side() < options.min_size {
            continue;
        }
        let score = mean_inside(pred, mw, mh, &rect.corners());
        if score < options.box_thresh {
            continue;
        }
        let perimeter = 2.0 * (rect.width + rect.height);
        let grown = rect.expanded(rect.width * rect.height * options.unclip_ratio / perimeter);
        if grown.short_side() < options.min_size + 2.0 {
            continue;
        }
        let corners = grown.corners().map(|(x, y)| ((x * sx).round().clamp(0.0, width as f32), (y * sy).round().clamp(0.0, height as f32)));
        let side = |a: Point, b: Point| ((a.0 - b.0).powi(2) + (a.1 - b.1).powi(2)).sqrt();
        if side(corners[0], corners[1]) <= 3.0 || side(corners[0], corners[3]) <= 3.0 {
            continue;
        }
        boxes.push(TextBox { corners, score });
    }
    sort_reading_order(&mut boxes);
    Ok(boxes)
}

/// The top-left `height` × `width` of a detection map (`[1, H, W]`): an image's own map
/// out of one that ran in a batch padded to a larger image.
pub fn unpad_map(map: &Tensor, height: usize, width: usize) -> Result<Tensor> {
    let (mh, mw) = match map.shape.as_slice() {
        [1, h, w] => (*h, *w),
        other => return Err(DataplaneError::Invalid(format!("detection map of shape {other:?}, expected [1, H, W]"))),
    };
    if height > mh || width > mw {
        return Err(DataplaneError::Invalid(format!("detection map of {mh}×{mw} is smaller than its input of {height}×{width}")));
    }
    if (height, width) == (mh, mw) {
        return Ok(map.clone());
    }
    let mut data = Vec::with_capacity(height * width);
    for row in map.data.floats().chunks_exact(mw).take(height) {
        data.extend_from_slice(&row[..width]);
    }
    Ok(Tensor { shape: vec![1, height, width], data: data.into() })
}

/// Sort boxes top to bottom, and left to right within a line (tops within 10 px).
pub fn sort_reading_order(boxes: &mut [TextBox]) {
    boxes.sort_by(|a, b| (a.corners[0].1, a.corners[0].0).partial_cmp(&(b.corners[0].1, b.corners[0].0)).unwrap());
    for i in 0..boxes.len().saturating_sub(1) {
        for j in (0..=i).rev() {
            let (a, b) = (&boxes[j], &boxes[j + 1]);
            if (b.corners[0].1 - a.corners[0].1).abs() < 10.0 && b.corners[0].0 < a.corners[0].0 {
                boxes.swap(j, j + 1);
            } else {
                break;
            }
        }
    }
}
