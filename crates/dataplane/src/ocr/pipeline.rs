//! The PP-OCR pipeline: detection → direction classification → recognition, each stage a
//! session of its own running batches, with the pre- and post-processing between them.

use std::sync::Arc;

use super::cls::{self, ClsOptions, Direction};
use super::det::{self, DetOptions, TextBox};
use super::image::RgbImage;
use super::rec::{self, Dictionary, RecOptions, Recognized};
use crate::assets;
use crate::cache::{ModelCache, ModelKey};
use crate::error::Result;
use crate::runtime::Runtime;
use crate::session::{ModelSession, ModelSpec};
use crate::tensor::Tensor;

/// The three models of the pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OcrModels {
    /// Text detection.
    pub det: ModelSpec,
    /// Direction classification.
    pub cls: ModelSpec,
    /// Recognition.
    pub rec: ModelSpec,
}

impl OcrModels {
    /// The models the set-up script installs (see [`assets::models_dir`]).
    pub fn from_assets() -> Result<Self> {
        let dir = assets::models_dir()?;
        Ok(OcrModels {
            det: ModelSpec::new(ModelKey::new("ocr-det", "ppocrv4"), dir.join(assets::DET_MODEL)),
            cls: ModelSpec::new(ModelKey::new("ocr-cls", "mobile-v2"), dir.join(assets::CLS_MODEL)),
            rec: ModelSpec::new(ModelKey::new("ocr-rec", "ppocrv4"), dir.join(assets::REC_MODEL)),
        })
    }
}

/// Settings of every stage.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OcrOptions {
    /// Detection.
    pub det: DetOptions,
    /// Direction classification.
    pub cls: ClsOptions,
    /// Recognition.
    pub rec: RecOptions,
}

/// One line of text found in an image.
#[derive(Debug, Clone, PartialEq)]
pub struct TextLine {
    /// Where.
    pub region: TextBox,
    /// The classifier's verdict on its direction.
    pub direction: Direction,
    /// What it says.
    pub text: String,
    /// Recognition confidence.
    pub score: f32,
}

/// The loaded pipeline.
#[derive(Debug)]
pub struct OcrPipeline {
    det: ModelSession,
    cls: ModelSession,
    rec: ModelSession,
    dictionary: Dictionary,
    /// Settings of every stage.
    pub options: OcrOptions,
}

impl OcrPipeline {
    /// Load the three sessions (through the cache) with `threads` intra-op threads each.
    pub fn load(runtime: &Arc<Runtime>, cache: &ModelCache, models: &OcrModels, threads: usize) -> Result<Self> {
        let det = ModelSession::start(runtime, cache, &models.det, threads)?.session;
        let cls = ModelSession::start(runtime, cache, &models.cls, threads)?.session;
        let rec = ModelSession::start(runtime, cache, &models.rec, threads)?.session;
        let dictionary = Dictionary::from_session(&rec)?;
        Ok(OcrPipeline { det, cls, rec, dictionary, options: OcrOptions::default() })
    }

    /// Detection alone: text boxes of `image`.
    pub fn detect(&mut self, image: &RgbImage) -> Result<Vec<TextBox>> {
        let input = [det::preprocess(image, &self.options.det)];
        let map = self.det.run_batch(&[&input], None)?.remove(0).remove(0);
        det::postprocess(&map, image.width, image.height, &self.options.det)
    }

    /// Direction classification alone, in batches; crops judged upside down are turned.
    pub fn classify(&mut self, crops: &mut [RgbImage]) -> Result<Vec<Direction>> {
        let options = self.options.cls;
        let mut directions = Vec::with_capacity(crops.len());
        for chunk in crops.chunks_mut(options.batch.max(1)) {
            let inputs: Vec<[Tensor; 1]> = chunk.iter().map(|c| [cls::preprocess(c, &options)]).collect();
            let refs: Vec<&[Tensor]> = inputs.iter().map(|i| i.as_slice()).collect();
            for (crop, outputs) in chunk.iter_mut().zip(self.cls.run_batch(&refs, None)?) {
                let direction = cls::postprocess(&outputs[0])?;
                if direction.upside_down(&options) {
                    *crop = crop.rotate_180();
                }
                directions.push(direction);
            }
        }
        Ok(directions)
    }

    /// Recognition alone, in batches of crops of similar aspect ratio.
    pub fn recognize(&mut self, crops: &[RgbImage]) -> Result<Vec<Recognized>> {
        let options = self.options.rec;
        let mut order: Vec<usize> = (0..crops.len()).collect();
        order.sort_by(|&a, &b| {
            let ratio = |c: &RgbImage| c.width as f32 / c.height as f32;
            ratio(&crops[a]).partial_cmp(&ratio(&crops[b])).unwrap()
        });
        let mut results: Vec<Option<Recognized>> = vec![None; crops.len()];
        for chunk in order.chunks(options.batch.max(1)) {
            let batch: Vec<RgbImage> = chunk.iter().map(|&i| crops[i].clone()).collect();
            let inputs: Vec<[Tensor; 1]> = rec::preprocess(&batch, &options).into_iter().map(|t| [t]).collect();
            let refs: Vec<&[Tensor]> = inputs.iter().map(|i| i.as_slice()).collect();
            for (&i, outputs) in chunk.iter().zip(self.rec.run_batch(&refs, None)?) {
                results[i] = Some(rec::decode(&outputs[0], &self.dictionary)?);
            }
        }
        Ok(results.into_iter().map(|r| r.expect("every crop decoded")).collect())
    }

    /// The whole pipeline: image in, lines of text out (in reading order; lines whose
    /// recognition scores below the text threshold are dropped).
    pub fn run(&mut self, image: &RgbImage) -> Result<Vec<TextLine>> {
        let boxes = self.detect(image)?;
        let mut crops: Vec<RgbImage> = boxes.iter().map(|b| image.crop_quad(&b.corners)).collect();
        let directions = self.classify(&mut crops)?;
        let texts = self.recognize(&crops)?;
        Ok(assemble(boxes, directions, texts, &self.options.rec))
    }

    /// The stage sessions (detection, classification, recognition).
    pub fn sessions(&mut self) -> [&mut ModelSession; 3] {
        [&mut self.det, &mut self.cls, &mut self.rec]
    }
}

/// Lines of text from each stage's findings, box by box (in the boxes' reading order),
/// without those whose recognition scores below `options.text_score`.
pub fn assemble(boxes: Vec<TextBox>, directions: Vec<Direction>, texts: Vec<Recognized>, options: &RecOptions) -> Vec<TextLine> {
    boxes
        .into_iter()
        .zip(directions)
        .zip(texts)
        .filter(|(_, r)| r.score >= options.text_score)
        .map(|((region, direction), r)| TextLine { region, direction, text: r.text, score: r.score })
        .collect()
}
