//! Stage programs: how a request's [`Payload`] becomes a stage's model inputs, and how
//! the stage's outputs update the payload. The executor runs one program per stage; the
//! models themselves run on the workers.
//!
//! A request may give a stage several batch elements, or none: the OCR chain carries
//! one engine request per client image, and classification and recognition run every
//! crop of every request of the job in one batch. The programs here are thin: the
//! pre- and post-processing is the data plane's (`yardmaster_dataplane::ocr`).
//!
//! - [`DetProgram`]: image → detector input; probability map → text boxes and crops.
//! - [`ClsProgram`]: crops → classifier inputs; verdicts → crops turned upright.
//! - [`RecProgram`]: crops → recogniser inputs; CTC outputs → lines of text.
//! - [`TensorProgram`]: the payload's tensors in, the model's outputs back (a
//!   repository's models).
//! - [`EnsembleStepProgram`]: a step of an ensemble, its tensors carried by name.
//!
//! The OCR programs are the built-in programs a repository model names with
//! `yardmaster.program` ([`builtin_program`]).

use std::sync::Arc;
use yardmaster_dataplane::ocr::pipeline::assemble;
use yardmaster_dataplane::ocr::rec::Dictionary;
use yardmaster_dataplane::ocr::{cls, det, rec, OcrOptions};

use yardmaster_dataplane::{ModelSession, ModelSpec, Tensor, WorkerContext};
use yardmaster_formats::model_repository::BuiltinProgram;

use super::payload::{OcrDocument, Payload};

/// One stage's pre- and post-processing.
pub trait StageProgram: Send + Sync {
    /// A short name, for logs and errors.
    fn name(&self) -> &str;
    /// The model inputs of one request: one entry per batch element, each one tensor per
    /// model input (without the batch dimension).
    fn inputs(&self, payload: &Payload) -> Result<Vec<Vec<Tensor>>, String>;
    /// Fold the outputs of those elements (in the same order) back into the payload.
    fn apply(&self, payload: &mut Payload, outputs: Vec<Vec<Tensor>>) -> Result<(), String>;
    /// Whether each batch element is one row of a client batch, so that a job's
    /// elements must not exceed the stage's batch limit (`max_batch_size`); a program
    /// whose elements are parts of one request (an image's crops) says no.
    fn counts_rows(&self) -> bool {
        false
    }
    /// Whether folding outputs into a payload and making the next stage's inputs is
    /// light work (moving tensors, no image processing), done on the thread that
    /// receives the job's end rather than handed to a finisher thread: the hand-over
    /// costs more than the fold. Programs that search boxes, crop or resize say no.
    fn folds_lightly(&self) -> bool {
        false
    }
}

fn document<'a>(program: &str, payload: &'a Payload) -> Result<&'a OcrDocument, String> {
    match payload {
        Payload::Ocr(document) => Ok(document),
        Payload::Tensors(_) | Payload::Named(_) => Err(format!("{program}: the request carries tensors, not an image")),
    }
}

fn document_mut<'a>(program: &str, payload: &'a mut Payload) -> Result<&'a mut OcrDocument, String> {
    match payload {
        Payload::Ocr(document) => Ok(document),
        Payload::Tensors(_) | Payload::Named(_) => Err(format!("{program}: the request carries tensors, not an image")),
    }
}

/// The first output of each element, checking that every element got one.
fn first_outputs(program: &str, outputs: Vec<Vec<Tensor>>, expected: usize) -> Result<Vec<Tensor>, String> {
    if outputs.len() != expected {
        return Err(format!("{program}: {} outputs for {expected} inputs", outputs.len()));
    }
    outputs.into_iter().map(|o| o.into_iter().next().ok_or_else(|| format!("{program}: the model returned no output"))).collect()
}

/// Text detection: one element per request.
#[derive(Debug, Clone, Default)]
pub struct DetProgram {
    /// Settings.
    pub options: OcrOptions,
}

impl StageProgram for DetProgram {
    fn name(&self) -> &str {
        "ocr-det"
    }

    fn inputs(&self, payload: &Payload) -> Result<Vec<Vec<Tensor>>, String> {
        let document = document(self.name(), payload)?;
        Ok(vec![vec![det::preprocess(&document.image, &self.options.det)]])
    }

    fn apply(&self, payload: &mut Payload, outputs: Vec<Vec<Tensor>>) -> Result<(), String> {
        let document = document_mut(self.name(), payload)?;
        let map = first_outputs(self.name(), outputs, 1)?.remove(0);
        let (width, height) = (document.image.width, document.image.height);
        // A map from a batch of larger images is padded: keep this image's own part.
        let (rh, rw) = det::input_size(width, height, &self.options.det);
        let map = det::unpad_map(&map, rh, rw).map_err(|e| e.to_string())?;
        document.boxes = det::postprocess(&map, width, height, &self.options.det).map_err(|e| e.to_string())?;
        document.crops = document.boxes.iter().map(|b| document.image.crop_quad(&b.corners)).collect();
        Ok(())
    }
}

/// Direction classification: one element per crop.
#[derive(Debug, Clone, Default)]
pub struct ClsProgram {
    /// Settings.
    pub options: OcrOptions,
}

impl StageProgram for ClsProgram {
    fn name(&self) -> &str {
        "ocr-cls"
    }

    fn inputs(&self, payload: &Payload) -> Result<Vec<Vec<Tensor>>, String> {
        let document = document(self.name(), payload)?;
        Ok(document.crops.iter().map(|crop| vec![cls::preprocess(crop, &self.options.cls)]).collect())
    }

    fn apply(&self, payload: &mut Payload, outputs: Vec<Vec<Tensor>>) -> Result<(), String> {
        let name = self.name().to_string();
        let document = document_mut(&name, payload)?;
        let outputs = first_outputs(&name, outputs, document.crops.len())?;
        let mut directions = Vec::with_capacity(outputs.len());
        for (crop, output) in document.crops.iter_mut().zip(&outputs) {
            let direction = cls::postprocess(output).map_err(|e| e.to_string())?;
            if direction.upside_down(&self.options.cls) {
                *crop = crop.rotate_180();
            }
            directions.push(direction);
        }
        document.directions = directions;
        Ok(())
    }
}

/// Recognition: one element per crop (crops of a job are padded to a common width, as
/// the data plane's own batches are).
#[derive(Debug, Clone)]
pub struct RecProgram {
    /// Settings.
    pub options: OcrOptions,
    /// The recogniser's character list.
    pub dictionary: Dictionary,
}

impl StageProgram for RecProgram {
    fn name(&self) -> &str {
        "ocr-rec"
    }

    fn inputs(&self, payload: &Payload) -> Result<Vec<Vec<Tensor>>, String> {
        let document = document(self.name(), payload)?;
        Ok(document
            .crops
            .iter()
            .flat_map(|crop| rec::preprocess(std::slice::from_ref(crop), &self.options.rec))
            .map(|tensor| vec![tensor])
            .collect())
    }

    fn apply(&self, payload: &mut Payload, outputs: Vec<Vec<Tensor>>) -> Result<(), String> {
        let name = self.name().to_string();
        let document = document_mut(&name, payload)?;
        let outputs = first_outputs(&name, outputs, document.crops.len())?;
        let texts = outputs.iter().map(|o| rec::decode(o, &self.dictionary)).collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())?;
        if document.directions.len() != document.crops.len() {
            return Err(format!("{name}: {} crops but {} direction verdicts", document.crops.len(), document.directions.len()));
        }
        document.lines = assemble(document.boxes.clone(), document.directions.clone(), texts, &self.options.rec);
        Ok(())
    }
}

/// The stage program of a model that runs a built-in program (`yardmaster.program`),
/// around its model `spec`. The recogniser's dictionary is read from the model's
/// metadata (which leaves the model in `context`'s cache, so its worker starts warm).
pub fn builtin_program(program: BuiltinProgram, spec: &ModelSpec, context: &WorkerContext) -> Result<Arc<dyn StageProgram>, String> {
    let options = OcrOptions::default();
    Ok(match program {
        BuiltinProgram::OcrDet => Arc::new(DetProgram { options }),
        BuiltinProgram::OcrCls => Arc::new(ClsProgram { options }),
        BuiltinProgram::OcrRec => {
            let session = ModelSession::start(&context.runtime, &context.cache, spec, 1).map_err(|e| e.to_string())?.session;
            let dictionary = Dictionary::from_session(&session).map_err(|e| e.to_string())?;
            Arc::new(RecProgram { options, dictionary })
        }
    })
}

/// A model fed the payload's tensors: a model without a batch dimension one element
/// per request, its tensors as they are; a batching model one element per row of the
/// request's client batch (the tensors lead with N rows). The outputs (joined back
/// into N rows) become the payload.
#[derive(Debug, Clone)]
pub struct TensorProgram {
    /// Name, for logs and errors.
    pub name: String,
    /// The model batches: the payload's tensors lead with the request's rows.
    pub batching: bool,
}

/// One batch element per row of `tensors` (each leading with the request's rows) when
/// `batching`, else the tensors as one element.
fn elements_of(program: &str, tensors: Vec<Tensor>, batching: bool) -> Result<Vec<Vec<Tensor>>, String> {
    if !batching {
        return Ok(vec![tensors]);
    }
    let n = tensors.first().and_then(|t| t.shape.first().copied()).unwrap_or(1);
    yardmaster_dataplane::batch::rows(&tensors, n).map_err(|e| format!("{program}: {e}"))
}

/// The outputs of a request's elements: joined back into rows when `batching`, else
/// the one element's.
fn outputs_of(program: &str, outputs: Vec<Vec<Tensor>>, batching: bool) -> Result<Vec<Tensor>, String> {
    if batching {
        return yardmaster_dataplane::batch::join_rows(outputs).map_err(|e| format!("{program}: {e}"));
    }
    let [outputs] = <[Vec<Tensor>; 1]>::try_from(outputs).map_err(|o| format!("{program}: {} outputs for one input", o.len()))?;
    Ok(outputs)
}

impl StageProgram for TensorProgram {
    fn name(&self) -> &str {
        &self.name
    }

    fn inputs(&self, payload: &Payload) -> Result<Vec<Vec<Tensor>>, String> {
        match payload {
            Payload::Tensors(tensors) => elements_of(&self.name, tensors.clone(), self.batching),
            Payload::Named(_) => Err(format!("{}: the request carries an ensemble's named tensors", self.name)),
            Payload::Ocr(_) => Err(format!("{}: the request carries an image, not tensors", self.name)),
        }
    }

    fn apply(&self, payload: &mut Payload, outputs: Vec<Vec<Tensor>>) -> Result<(), String> {
        *payload = Payload::Tensors(outputs_of(&self.name, outputs, self.batching)?);
        Ok(())
    }

    fn counts_rows(&self) -> bool {
        self.batching
    }

    fn folds_lightly(&self) -> bool {
        true
    }
}

/// One step of an ensemble: its model is fed the ensemble tensors its `input_map`
/// names (in the model's input order), and its outputs are stored under the names its
/// `output_map` gives (outputs it does not map are dropped).
#[derive(Debug, Clone)]
pub struct EnsembleStepProgram {
    /// `ensemble/step-model`, for logs and errors.
    pub name: String,
    /// The ensemble tensor fed to each model input, in the model's input order.
    pub inputs: Vec<String>,
    /// The ensemble name of each model output, in the model's output order.
    pub outputs: Vec<Option<String>>,
    /// The step's model batches: the ensemble's tensors lead with the request's rows.
    pub batching: bool,
}

impl StageProgram for EnsembleStepProgram {
    fn name(&self) -> &str {
        &self.name
    }

    fn counts_rows(&self) -> bool {
        self.batching
    }

    fn folds_lightly(&self) -> bool {
        true
    }

    fn inputs(&self, payload: &Payload) -> Result<Vec<Vec<Tensor>>, String> {
        let Payload::Named(tensors) = payload else {
            return Err(format!("{}: the request does not carry an ensemble's named tensors", self.name));
        };
        let fed = self
            .inputs
            .iter()
            .map(|name| tensors.get(name).cloned().ok_or_else(|| format!("{}: no ensemble tensor {name:?} yet", self.name)))
            .collect::<Result<Vec<Tensor>, String>>()?;
        elements_of(&self.name, fed, self.batching)
    }

    fn apply(&self, payload: &mut Payload, outputs: Vec<Vec<Tensor>>) -> Result<(), String> {
        let Payload::Named(tensors) = payload else {
            return Err(format!("{}: the request does not carry an ensemble's named tensors", self.name));
        };
        let outputs = outputs_of(&self.name, outputs, self.batching)?;
        if outputs.len() != self.outputs.len() {
            return Err(format!("{}: the model gave {} outputs, {} expected", self.name, outputs.len(), self.outputs.len()));
        }
        for (name, tensor) in self.outputs.iter().zip(outputs) {
            if let Some(name) = name {
                tensors.insert(name.clone(), tensor);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yardmaster_dataplane::ocr::RgbImage;

    #[test]
    fn detection_keeps_its_own_part_of_a_padded_map_and_crops_boxes() {
        let program = DetProgram::default();
        let mut payload = Payload::Ocr(OcrDocument::new(RgbImage::filled(100, 40, [255, 255, 255])));
        let input = program.inputs(&payload).unwrap();
        let (rh, rw) = det::input_size(100, 40, &program.options.det);
        assert_eq!(input[0][0].shape, vec![3, rh, rw]);
        // A map padded by 32 on each side with one text-like band inside the image's part.
        let (ph, pw) = (rh + 32, rw + 32);
        let mut map = Tensor::filled(vec![1, ph, pw], 0.0);
        for y in rh / 3..rh / 2 {
            for x in rw / 10..rw / 2 {
                map.data.as_f32_mut().unwrap()[y * pw + x] = 0.9;
            }
        }
        // Padding that would be a box if it were read as part of the image.
        for y in rh..ph {
            for x in 0..pw {
                map.data.as_f32_mut().unwrap()[y * pw + x] = 0.9;
            }
        }
        program.apply(&mut payload, vec![vec![map]]).unwrap();
        let Payload::Ocr(document) = &payload else { unreachable!() };
        assert_eq!(document.boxes.len(), 1, "{:?}", document.boxes);
        assert_eq!(document.crops.len(), 1);
        assert!(document.boxes[0].corners.iter().all(|&(x, y)| x <= 100.0 && y <= 40.0));
    }

    #[test]
    fn an_ensemble_step_reads_and_writes_the_tensors_its_maps_name() {
        let step =
            EnsembleStepProgram { name: "e/add".into(), inputs: vec!["t".into()], outputs: vec![Some("y".into()), None], batching: false };
        let mut payload = Payload::Named([("x".to_string(), Tensor::filled(vec![2], 1.0))].into());
        assert!(step.inputs(&payload).unwrap_err().contains("no ensemble tensor \"t\""));
        let Payload::Named(tensors) = &mut payload else { unreachable!() };
        tensors.insert("t".into(), Tensor::filled(vec![2], 3.0));
        assert_eq!(step.inputs(&payload).unwrap(), vec![vec![Tensor::filled(vec![2], 3.0)]]);
        step.apply(&mut payload, vec![vec![Tensor::filled(vec![2], 4.0), Tensor::filled(vec![1], 9.0)]]).unwrap();
        let Payload::Named(tensors) = &payload else { unreachable!() };
        assert_eq!(tensors.keys().collect::<Vec<_>>(), ["t", "x", "y"], "the unmapped output is dropped");
        assert!(step.apply(&mut payload, vec![vec![Tensor::filled(vec![2], 4.0)]]).unwrap_err().contains("1 outputs, 2 expected"));
        assert!(step.inputs(&Payload::Tensors(vec![])).is_err());
    }

    #[test]
    fn programs_refuse_the_wrong_payload_and_miscounted_outputs() {
        let tensor = TensorProgram { name: "tiny".into(), batching: false };
        let image = Payload::Ocr(OcrDocument::new(RgbImage::filled(8, 8, [0, 0, 0])));
        assert!(tensor.inputs(&image).unwrap_err().contains("an image"));
        assert!(DetProgram::default().inputs(&Payload::Tensors(Vec::new())).unwrap_err().contains("tensors"));
        let mut payload = image.clone();
        let error = ClsProgram::default().apply(&mut payload, vec![vec![Tensor::filled(vec![2], 0.5)]]).unwrap_err();
        assert!(error.contains("1 outputs for 0 inputs"), "{error}");
        let mut tensors = Payload::Tensors(vec![Tensor::filled(vec![4], 1.0)]);
        assert_eq!(tensor.inputs(&tensors).unwrap(), vec![vec![Tensor::filled(vec![4], 1.0)]]);
        tensor.apply(&mut tensors, vec![vec![Tensor::filled(vec![4], 2.0)]]).unwrap();
        assert_eq!(tensors, Payload::Tensors(vec![Tensor::filled(vec![4], 2.0)]));
        // A batching model: one element per row, the outputs joined back into rows.
        let rows = TensorProgram { name: "rows".into(), batching: true };
        let mut three = Payload::Tensors(vec![Tensor::new(vec![3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap()]);
        let elements = rows.inputs(&three).unwrap();
        assert_eq!(elements.len(), 3);
        assert_eq!(elements[1], vec![Tensor::new(vec![2], vec![3.0, 4.0]).unwrap()]);
        rows.apply(&mut three, elements).unwrap();
        assert_eq!(three, Payload::Tensors(vec![Tensor::new(vec![3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap()]));
    }
}
