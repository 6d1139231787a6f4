//! The default pipeline: PP-OCR text recognition from the models in the
//! `rapidocr-onnxruntime` 1.4.4 wheel — detection ([`det`]), direction classification
//! ([`cls`]) and recognition ([`rec`]), with the pre- and post-processing each needs,
//! joined by [`pipeline::OcrPipeline`].

pub mod cls;
pub mod det;
pub mod geometry;
pub mod image;
pub mod pipeline;
pub mod rec;
pub mod sample;

pub use image::RgbImage;
pub use pipeline::{OcrModels, OcrOptions, OcrPipeline, TextLine};
