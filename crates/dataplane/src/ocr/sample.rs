//! Sample input for the OCR pipeline: lines of text rendered black on white with the
//! DejaVu Sans font (Debian's `fonts-dejavu-core`, which the set-up script installs),
//! for the main job's demonstration load, the benchmarks and the tests.

use ab_glyph::{Font, FontVec, PxScale, ScaleFont};

use super::image::RgbImage;
use crate::error::{DataplaneError, Result};

/// The font rendered with, unless `YARDMASTER_FONT` names another file.
pub const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// The font file to render with: `YARDMASTER_FONT`, else [`FONT`].
pub fn font_path() -> std::path::PathBuf {
    std::env::var_os("YARDMASTER_FONT").filter(|v| !v.is_empty()).map_or_else(|| FONT.into(), Into::into)
}

/// `lines` rendered in black on white, `px` pixels high, starting at (`left`, `top`),
/// one line every `1.8 * px` pixels, in an image of `width` × `height`.
pub fn render_text(lines: &[&str], px: f32, width: usize, height: usize, left: f32, top: f32) -> Result<RgbImage> {
    let path = font_path();
    let bytes = std::fs::read(&path).map_err(|e| {
        DataplaneError::Invalid(format!(
            "{}: {e} (scripts/setup.sh installs fonts-dejavu-core; YARDMASTER_FONT names another font file)",
            path.display()
        ))
    })?;
    let font = FontVec::try_from_vec(bytes).map_err(|e| DataplaneError::Invalid(format!("{}: {e}", path.display())))?;
    let scaled = font.as_scaled(PxScale::from(px));
    let mut image = RgbImage::filled(width, height, [255, 255, 255]);
    for (n, line) in lines.iter().enumerate() {
        let baseline = top + n as f32 * px * 1.8 + scaled.ascent();
        let mut x = left;
        let mut previous = None;
        for c in line.chars() {
            let id = scaled.glyph_id(c);
            if let Some(p) = previous {
                x += scaled.kern(p, id);
            }
            let glyph = id.with_scale_and_position(PxScale::from(px), ab_glyph::point(x, baseline));
            x += scaled.h_advance(id);
            previous = Some(id);
            if let Some(outline) = font.outline_glyph(glyph) {
                let bounds = outline.px_bounds();
                outline.draw(|gx, gy, coverage| {
                    let (px_x, px_y) = (bounds.min.x as i64 + gx as i64, bounds.min.y as i64 + gy as i64);
                    if px_x >= 0 && px_y >= 0 && (px_x as usize) < width && (px_y as usize) < height {
                        let old = image.pixel(px_x as usize, px_y as usize)[0] as f32;
                        let v = (old * (1.0 - coverage)).round() as u8;
                        image.set_pixel(px_x as usize, px_y as usize, [v, v, v]);
                    }
                });
            }
        }
    }
    Ok(image)
}
