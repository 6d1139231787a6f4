//! A small RGB image type with what the OCR stages need: bilinear resizing, sampling of
//! a (rotated) quadrilateral into an upright crop, 180° rotation, and conversion to the
//! normalised CHW tensors PaddleOCR models take.

use crate::tensor::Tensor;

/// An 8-bit RGB image, rows top to bottom, pixels interleaved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// `width * height * 3` bytes.
    pub data: Vec<u8>,
}

/// A point in image coordinates (x right, y down).
pub type Point = (f32, f32);

impl RgbImage {
    /// An image filled with one colour.
    pub fn filled(width: usize, height: usize, rgb: [u8; 3]) -> Self {
        let mut data = Vec::with_capacity(width * height * 3);
        for _ in 0..width * height {
            data.extend_from_slice(&rgb);
        }
        RgbImage { width, height, data }
    }

    /// The pixel at (x, y).
    pub fn pixel(&self, x: usize, y: usize) -> [u8; 3] {
        let i = (y * self.width + x) * 3;
        [self.data[i], self.data[i + 1], self.data[i + 2]]
    }

    /// Set the pixel at (x, y).
    pub fn set_pixel(&mut self, x: usize, y: usize, rgb: [u8; 3]) {
        let i = (y * self.width + x) * 3;
        self.data[i..i + 3].copy_from_slice(&rgb);
    }

    /// Bilinear sample at a real position (pixel centres at integer coordinates; edges clamp).
    pub fn sample(&self, x: f32, y: f32) -> [f32; 3] {
        let x = x.clamp(0.0, (self.width - 1) as f32);
        let y = y.clamp(0.0, (self.height - 1) as f32);
        let (x0, y0) = (x.floor() as usize, y.floor() as usize);
        let (x1, y1) = ((x0 + 1).min(self.width - 1), (y0 + 1).min(self.height - 1));
        let (fx, fy) = (x - x0 as f32, y - y0 as f32);
        let (a, b, c, d) = (self.pixel(x0, y0), self.pixel(x1, y0), self.pixel(x0, y1), self.pixel(x1, y1));
        let mut out = [0.0; 3];
        for k in 0..3 {
            let top = a[k] as f32 * (1.0 - fx) + b[k] as f32 * fx;
            let bottom = c[k] as f32 * (1.0 - fx) + d[k] as f32 * fx;
            out[k] = top * (1.0 - fy) + bottom * fy;
        }
        out
    }

    /// Resized to `width` × `height` (bilinear, pixel centres aligned).
    pub fn resize(&self, width: usize, height: usize) -> RgbImage {
        let sx = self.width as f32 / width as f32;
        let sy = self.height as f32 / height as f32;
        let mut out = RgbImage::filled(width, height, [0, 0, 0]);
        for y in 0..height {
            let src_y = (y as f32 + 0.5) * sy - 0.5;
            for x in 0..width {
                let src_x = (x as f32 + 0.5) * sx - 0.5;
                let p = self.sample(src_x, src_y);
                out.set_pixel(x, y, [p[0].round() as u8, p[1].round() as u8, p[2].round() as u8]);
            }
        }
        out
    }

    /// Turned by 180°.
    pub fn rotate_180(&self) -> RgbImage {
        let mut out = self.clone();
        for y in 0..self.height {
            for x in 0..self.width {
                out.set_pixel(self.width - 1 - x, self.height - 1 - y, self.pixel(x, y));
            }
        }
        out
    }

    /// Turned by 90° counter-clockwise (for crops of vertical text).
    pub fn rotate_90_ccw(&self) -> RgbImage {
        let mut out = RgbImage::filled(self.height, self.width, [0, 0, 0]);
        for y in 0..self.height {
            for x in 0..self.width {
                out.set_pixel(y, self.width - 1 - x, self.pixel(x, y));
            }
        }
        out
    }

    /// The quadrilateral `quad` (top-left, top-right, bottom-right, bottom-left) sampled
    /// into an upright crop; tall crops (height ≥ 1.5 × width) are turned to lie flat.
    pub fn crop_quad(&self, quad: &[Point; 4]) -> RgbImage {
        let dist = |a: Point, b: Point| ((a.0 - b.0).powi(2) + (a.1 - b.1).powi(2)).sqrt();
        let width = dist(quad[0], quad[1]).max(dist(quad[2], quad[3])).round().max(1.0) as usize;
        let height = dist(quad[0], quad[3]).max(dist(quad[1], quad[2])).round().max(1.0) as usize;
        let mut out = RgbImage::filled(width, height, [0, 0, 0]);
        for y in 0..height {
            let v = (y as f32 + 0.5) / height as f32;
            for x in 0..width {
                let u = (x as f32 + 0.5) / width as f32;
                // Bilinear blend of the corners (exact for parallelograms).
                let px = (1.0 - u) * (1.0 - v) * quad[0].0 + u * (1.0 - v) * quad[1].0 + u * v * quad[2].0 + (1.0 - u) * v * quad[3].0;
                let py = (1.0 - u) * (1.0 - v) * quad[0].1 + u * (1.0 - v) * quad[1].1 + u * v * quad[2].1 + (1.0 - u) * v * quad[3].1;
                let p = self.sample(px - 0.5, py - 0.5);
                out.set_pixel(x, y, [p[0].round() as u8, p[1].round() as u8, p[2].round() as u8]);
            }
        }
        if height as f32 >= width as f32 * 1.5 {
            out.rotate_90_ccw()
        } else {
            out
        }
    }

    /// A CHW tensor of `out_width` columns (the image's columns first, then `pad`),
    /// channels in BGR order (as the PaddleOCR models were trained), each value
    /// `(v / 255 − mean) / std`.
    pub fn to_chw(&self, mean: f32, std: f32, out_width: usize, pad: f32) -> Tensor {
        let (h, w) = (self.height, self.width.min(out_width));
        let mut data = vec![pad; 3 * h * out_width];
        for y in 0..h {
            for x in 0..w {
                let p = self.pixel(x, y);
                for (c, value) in [p[2], p[1], p[0]].into_iter().enumerate() {
                    data[(c * h + y) * out_width + x] = (value as f32 / 255.0 - mean) / std;
                }
            }
        }
        Tensor { shape: vec![3, h, out_width], data: data.into() }
    }
}
