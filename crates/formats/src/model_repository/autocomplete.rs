//! Completing a model's configuration from its ONNX graph, as Triton's auto-complete
//! does, and checking a configuration that lists tensors against the graph.
//!
//! - Inputs and outputs the configuration leaves out are the graph's (initializers are
//!   not inputs), with their names, element types and shapes.
//! - `max_batch_size`: when the configuration lists no tensors and leaves it at 0 (in
//!   protobuf, 0 and absent are the same), and every input and output of the graph has
//!   an unknown (symbolic, -1) first dimension, the first dimension is taken as the batch
//!   dimension: `max_batch_size` becomes [`DEFAULT_MAX_BATCH_SIZE`] and the dims listed
//!   are the rest. Triton does the same, with a default of 4 (its
//!   `--backend-config=default-max-batch-size`); Yardmaster chooses Triton's 4 so that a
//!   repository behaves the same under both. As Triton does, a model whose batch size is
//!   set this way gets `dynamic_batching { }` when it has no `dynamic_batching` (in
//!   Yardmaster the policy forms every batch regardless). Otherwise `max_batch_size`
//!   stays 0 and the dims are the full shape.
//! - A tensor the configuration lists is checked against the graph: a name the graph
//!   lacks, another element type, another rank, or a fixed dimension that differs from a
//!   fixed one in the graph is refused, naming the model, the tensor and both values
//!   (-1 on either side matches anything, as in Triton). With `max_batch_size > 0` the
//!   graph's first dimension must be unknown (the batch), and the configuration's dims
//!   (or its `reshape`, which is what the model sees) are compared with the rest.
//!
//! [`ModelEntry::complete_from_graph`] does this for a scanned model from its served
//! versions' files; [`Repository::complete_from_graphs`] for every model of a scan.

use super::config::{Backend, DynamicBatching, ModelConfig, TensorConfig};
use super::onnx_graph::{read_graph_signature, GraphSignature, TensorSignature};
use super::repository::{check_ensembles, ModelEntry, ModelError, Repository};

/// The `max_batch_size` given to a model whose graph has a batch dimension and whose
/// configuration does not say (Triton's default, 4).
pub const DEFAULT_MAX_BATCH_SIZE: u32 = 4;

impl ModelConfig {
    /// Fill in what this configuration leaves to the ONNX graph `graph`, and check what it
    /// lists against it (see the [module docs](self)). Clears [`ModelConfig::from_graph`].
    /// On an error the configuration is left as it was.
    pub fn complete_from_graph(&mut self, graph: &GraphSignature) -> Result<(), ModelError> {
        let fail = |message: String| ModelError { model: self.name.clone(), message };
        if self.backend == Backend::Ensemble {
            return Err(fail("an ensemble has no ONNX graph of its own to complete its configuration from".into()));
        }
        let (fill_inputs, fill_outputs) = (self.input.is_empty(), self.output.is_empty());
        let mut max_batch_size = self.max_batch_size;
        let mut defaulted = false;
        if max_batch_size == 0 && fill_inputs && fill_outputs {
            let batch_first = |t: &TensorSignature| matches!(t.dims.as_deref(), Some([None, ..]));
            let all: Vec<&TensorSignature> = graph.inputs.iter().chain(&graph.outputs).collect();
            if !all.is_empty() && all.iter().all(|t| batch_first(t)) {
                max_batch_size = DEFAULT_MAX_BATCH_SIZE;
                defaulted = true;
            }
        }
        let batched = max_batch_size > 0;
        let sides = [("input", &self.input, &graph.inputs, fill_inputs), ("output", &self.output, &graph.outputs, fill_outputs)];
        let mut filled: [Vec<TensorConfig>; 2] = [Vec::new(), Vec::new()];
        for (side, (kind, listed, in_graph, fill)) in sides.into_iter().enumerate() {
            if fill {
                for tensor in in_graph {
                    filled[side].push(derived(kind, tensor, batched, max_batch_size).map_err(fail)?);
                }
            } else {
                for tensor in listed {
                    check(kind, tensor, in_graph, max_batch_size).map_err(fail)?;
                }
            }
        }
        if self.output.is_empty() && graph.outputs.is_empty() {
            return Err(fail("the ONNX graph has no outputs".into()));
        }
        let [inputs, outputs] = filled;
        if fill_inputs {
            self.input = inputs;
        }
        if fill_outputs {
            self.output = outputs;
        }
        self.max_batch_size = max_batch_size;
        if defaulted && self.dynamic_batching.is_none() {
            self.dynamic_batching = Some(DynamicBatching::default());
        }
        self.from_graph = None;
        Ok(())
    }
}

/// Dims as a configuration writes them, for messages.
fn show(dims: &[i64]) -> String {
    let dims: Vec<String> = dims.iter().map(i64::to_string).collect();
    format!("[{}]", dims.join(", "))
}

/// The configuration of graph tensor `tensor`.
fn derived(kind: &str, tensor: &TensorSignature, batched: bool, max_batch_size: u32) -> Result<TensorConfig, String> {
    let Some(mut dims) = tensor.config_dims() else {
        return Err(format!("{kind} {:?} has no shape in the ONNX graph: list it in config.pbtxt", tensor.name));
    };
    if batched {
        if dims.first() != Some(&-1) {
            return Err(format!(
                "max_batch_size {max_batch_size} needs a batch dimension, but {kind} {:?} has shape {} in the ONNX graph \
                 (its first dimension must be dynamic)",
                tensor.name,
                show(&dims)
            ));
        }
        dims.remove(0);
    }
    Ok(TensorConfig {
        name: tensor.name.clone(),
        data_type: tensor.data_type,
        dims,
        reshape: None,
        optional: false,
        format: None,
        label_filename: None,
    })
}

/// Check configuration tensor `tensor` against the graph's tensors of its kind.
fn check(kind: &str, tensor: &TensorConfig, in_graph: &[TensorSignature], max_batch_size: u32) -> Result<(), String> {
    let Some(found) = in_graph.iter().find(|t| t.name == tensor.name) else {
        let names: Vec<String> = in_graph.iter().map(|t| format!("{:?}", t.name)).collect();
        return Err(format!(
            "config.pbtxt lists {kind} {:?}, which the ONNX graph does not have (its {kind}s: {})",
            tensor.name,
            if names.is_empty() { "none".to_string() } else { names.join(", ") }
        ));
    };
    if found.data_type != tensor.data_type {
        return Err(format!(
            "{kind} {:?}: config.pbtxt says {}, the ONNX graph {}",
            tensor.name,
            tensor.data_type.triton_name(),
            found.data_type.triton_name()
        ));
    }
    let Some(graph_dims) = found.config_dims() else { return Ok(()) };
    let (seen, what) = match &tensor.reshape {
        Some(shape) => (shape, "reshape"),
        None => (&tensor.dims, "dims"),
    };
    let model_dims: &[i64] = if max_batch_size > 0 {
        match graph_dims.split_first() {
            Some((-1, rest)) => rest,
            _ => {
                return Err(format!(
                    "{kind} {:?}: config.pbtxt says max_batch_size {max_batch_size}, but the ONNX graph's shape {} has no \
                     dynamic first (batch) dimension",
                    tensor.name,
                    show(&graph_dims)
                ))
            }
        }
    } else {
        &graph_dims
    };
    let agrees = seen.len() == model_dims.len() && seen.iter().zip(model_dims).all(|(&c, &g)| c == -1 || g == -1 || c == g);
    if !agrees {
        let batch_note = if max_batch_size > 0 { " after the batch dimension" } else { "" };
        return Err(format!(
            "{kind} {:?}: config.pbtxt says {what} {}, the ONNX graph's shape is {}{batch_note}",
            tensor.name,
            show(seen),
            show(model_dims)
        ));
    }
    Ok(())
}

impl ModelEntry {
    /// Complete this model's configuration from its ONNX graph (or, when nothing is left
    /// to the graph, check the configuration against it): the highest served version's
    /// model file completes it, and each other served version's is checked against the
    /// result. Does nothing for an ensemble. On an error the entry is left as it was.
    pub fn complete_from_graph(&mut self) -> Result<(), ModelError> {
        if self.config.backend == Backend::Ensemble {
            return Ok(());
        }
        let fail = |message: String| ModelError { model: self.name.clone(), message };
        let mut config = self.config.clone();
        for (i, version) in self.versions.iter().rev().enumerate() {
            let Some(file) = &version.model_file else { continue };
            let graph = read_graph_signature(file).map_err(|e| fail(e.to_string()))?;
            let in_version = |e: ModelError| fail(format!("version {} ({}): {}", version.version, file.display(), e.message));
            if i == 0 {
                config.complete_from_graph(&graph).map_err(in_version)?;
            } else {
                // The completed configuration lists every tensor: this only checks.
                config.clone().complete_from_graph(&graph).map_err(in_version)?;
            }
        }
        self.config = config;
        Ok(())
    }
}

impl Repository {
    /// Complete, from their ONNX graphs, the configurations of the models that leave
    /// something to the graph ([`ModelConfig::from_graph`]), and check the complete ones
    /// against theirs. A model whose graph cannot be read or contradicts its
    /// configuration becomes an error for that model (and so does an ensemble that
    /// steps into it), so a model refused here is not one that would fail at its first
    /// request; the others are unchanged.
    pub fn complete_from_graphs(&mut self) {
        for result in self.models.values_mut() {
            let Ok(entry) = result else { continue };
            if let Err(e) = entry.complete_from_graph() {
                *result = Err(e);
            }
        }
        check_ensembles(&mut self.models);
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::model_repository::config::{DataType, FromGraph};
    use crate::model_repository::onnx_graph::encode::{model, pp_ocr, tiny_model, value_info, D};
    use crate::model_repository::onnx_graph::graph_signature;
    use crate::model_repository::repository::scan;
    use crate::model_repository::test_dir::TempDir;

    fn t(name: &str, data_type: DataType, dims: &[Option<i64>]) -> TensorSignature {
        TensorSignature { name: name.into(), data_type, dims: Some(dims.to_vec()) }
    }

    fn graph(inputs: Vec<TensorSignature>, outputs: Vec<TensorSignature>) -> GraphSignature {
        GraphSignature { inputs, outputs }
    }

    fn config(text: &str) -> ModelConfig {
        ModelConfig::from_pbtxt(text, "m/config.pbtxt", "m").unwrap_or_else(|e| panic!("{e}"))
    }

    fn tensor(config: &[TensorConfig], name: &str) -> (DataType, Vec<i64>) {
        let t = config.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no tensor {name}"));
        (t.data_type, t.dims.clone())
    }

    /// The error completing `config` from `g`, checking the configuration is unchanged.
    fn contradiction(config: &ModelConfig, g: &GraphSignature) -> String {
        let mut changed = config.clone();
        let e = changed.complete_from_graph(g).expect_err("should be refused");
        assert_eq!(&changed, config, "a refused completion changes nothing");
        assert_eq!(e.model, config.name);
        e.to_string()
    }

    const F: DataType = DataType::Fp32;

    #[test]
    fn a_dynamic_first_dimension_becomes_the_batch() {
        let mut c = ModelConfig::without_file("tiny");
        let g = graph_signature(&tiny_model()).unwrap();
        c.complete_from_graph(&g).unwrap();
        assert_eq!(c.max_batch_size, DEFAULT_MAX_BATCH_SIZE);
        assert_eq!(DEFAULT_MAX_BATCH_SIZE, 4, "Triton's default");
        assert_eq!(tensor(&c.input, "x"), (F, vec![4]));
        assert_eq!(tensor(&c.output, "y"), (F, vec![4]));
        assert_eq!(c.from_graph, None);
        assert_eq!(c.dynamic_batching, Some(DynamicBatching::default()), "as Triton does for an auto-completed batch size");
        let json = c.to_triton_json();
        assert_eq!(json["max_batch_size"], 4);
        assert_eq!(json["input"][0]["dims"], serde_json::json!([4]));
        assert_eq!(json["output"][0]["data_type"], "TYPE_FP32");
    }

    #[test]
    fn without_a_batch_dimension_the_full_shape_is_listed() {
        let cases = [
            // A fixed first dimension.
            graph(vec![t("a", F, &[Some(1), Some(3)])], vec![t("b", F, &[None, Some(2)])]),
            // Every input batched, one output not.
            graph(vec![t("a", F, &[None, Some(3)])], vec![t("b", F, &[Some(2)])]),
            // A scalar output.
            graph(vec![t("a", F, &[None])], vec![t("b", DataType::Int64, &[])]),
        ];
        for g in cases {
            let mut c = ModelConfig::without_file("m");
            c.complete_from_graph(&g).unwrap();
            assert_eq!(c.max_batch_size, 0, "{g:?}");
            assert_eq!(c.dynamic_batching, None);
            assert_eq!(c.input[0].dims, g.inputs[0].config_dims().unwrap());
            assert_eq!(c.output[0].dims, g.outputs[0].config_dims().unwrap());
        }
        let unknown = graph(vec![TensorSignature { name: "a".into(), data_type: F, dims: None }], vec![t("b", F, &[None])]);
        let e = contradiction(&ModelConfig::without_file("m"), &unknown);
        assert_eq!(e, "model \"m\": input \"a\" has no shape in the ONNX graph: list it in config.pbtxt");
        let e = contradiction(&ModelConfig::without_file("m"), &graph(vec![t("a", F, &[Some(1)])], vec![]));
        assert_eq!(e, "model \"m\": the ONNX graph has no outputs");
    }

    #[test]
    fn a_batch_size_the_config_gives_is_kept() {
        let g = graph(vec![t("x", F, &[None, Some(3), None])], vec![t("y", DataType::Int32, &[None])]);
        let mut c = config("max_batch_size: 16\ndynamic_batching { preferred_batch_size: [8] }");
        assert_eq!(c.from_graph, Some(FromGraph::Tensors));
        c.complete_from_graph(&g).unwrap();
        assert_eq!(c.max_batch_size, 16);
        assert_eq!(tensor(&c.input, "x"), (F, vec![3, -1]));
        assert_eq!(tensor(&c.output, "y"), (DataType::Int32, vec![]));
        assert_eq!(c.dynamic_batching.unwrap().preferred_batch_size, [8]);

        let fixed = graph(vec![t("x", F, &[Some(1), Some(3)])], vec![t("y", F, &[None])]);
        let e = contradiction(&config("max_batch_size: 16"), &fixed);
        assert!(e.contains("max_batch_size 16 needs a batch dimension, but input \"x\" has shape [1, 3]"), "{e}");

        // Inputs listed with max_batch_size 0: the listed dims are the full shape, and
        // the outputs come from the graph in full.
        let mut c = config("input { name: \"x\" data_type: TYPE_FP32 dims: [-1, 3, 7] }");
        c.complete_from_graph(&g).unwrap();
        assert_eq!(c.max_batch_size, 0, "the config listed tensors: its 0 is taken as said");
        assert_eq!(tensor(&c.output, "y"), (DataType::Int32, vec![-1]));
        assert_eq!(tensor(&c.input, "x"), (F, vec![-1, 3, 7]), "listed tensors are kept as written");
    }

    #[test]
    fn listed_tensors_that_contradict_the_graph_are_refused() {
        let g = graph(vec![t("x", F, &[None, Some(3), None]), t("mask", DataType::Bool, &[None])], vec![t("y", F, &[None, Some(10)])]);
        let out = "output { name: \"y\" data_type: TYPE_FP32 dims: [10] }";
        let with = |input: &str| config(&format!("max_batch_size: 8\n{input}\n{out}"));
        let cases = [
            (
                "input { name: \"z\" data_type: TYPE_FP32 dims: [3, 5] }",
                "model \"m\": config.pbtxt lists input \"z\", which the ONNX graph does not have (its inputs: \"x\", \"mask\")",
            ),
            (
                "input { name: \"x\" data_type: TYPE_FP16 dims: [3, 5] }",
                "model \"m\": input \"x\": config.pbtxt says TYPE_FP16, the ONNX graph TYPE_FP32",
            ),
            (
                "input { name: \"x\" data_type: TYPE_FP32 dims: [4, 5] }",
                "model \"m\": input \"x\": config.pbtxt says dims [4, 5], the ONNX graph's shape is [3, -1] after the batch dimension",
            ),
            (
                "input { name: \"x\" data_type: TYPE_FP32 dims: [3] }",
                "model \"m\": input \"x\": config.pbtxt says dims [3], the ONNX graph's shape is [3, -1] after the batch dimension",
            ),
            (
                "input { name: \"x\" data_type: TYPE_FP32 dims: [15] reshape { shape: [5, 3] } }",
                "model \"m\": input \"x\": config.pbtxt says reshape [5, 3], the ONNX graph's shape is [3, -1] after the batch dimension",
            ),
        ];
        for (input, message) in cases {
            assert_eq!(contradiction(&with(input), &g), message, "{input}");
        }
        let e = contradiction(&config(&format!("{out}\ninput {{ name: \"x\" data_type: TYPE_FP32 dims: [1, 3, 1] }}")), &g);
        assert!(e.contains("output \"y\": config.pbtxt says dims [10], the ONNX graph's shape is [-1, 10]"), "{e}");
        assert!(!e.contains("after the batch"), "no batch dimension with max_batch_size 0: {e}");
        let fixed_batch = graph(vec![t("x", F, &[Some(2), Some(3)])], vec![t("y", F, &[None, Some(10)])]);
        let e = contradiction(&with("input { name: \"x\" data_type: TYPE_FP32 dims: [3] }"), &fixed_batch);
        assert!(
            e.contains("input \"x\": config.pbtxt says max_batch_size 8, but the ONNX graph's shape [2, 3] has no dynamic first"),
            "{e}"
        );
        let ensemble = config("platform: \"ensemble\" ensemble_scheduling { step { model_name: \"a\" } }");
        assert!(contradiction(&ensemble, &g).contains("an ensemble has no ONNX graph"));

        // -1 on either side agrees with anything; reshape is what is compared.
        let mut c = with(
            "input { name: \"x\" data_type: TYPE_FP32 dims: [-1, 9] }\n\
             input { name: \"mask\" data_type: TYPE_BOOL dims: [1] reshape { shape: [ ] } optional: true }",
        );
        c.complete_from_graph(&g).unwrap();
        assert_eq!(c.max_batch_size, 8);
        assert_eq!(c.input.len(), 2);
        assert_eq!(c.from_graph, None);
    }

    #[test]
    fn completes_the_pp_ocr_models() {
        let cases = [
            ("ch_PP-OCRv4_det_infer.onnx", ("x", vec![3, -1, -1]), ("sigmoid_0.tmp_0", vec![1, -1, -1])),
            ("ch_PP-OCRv4_rec_infer.onnx", ("x", vec![3, -1, -1]), ("softmax_11.tmp_0", vec![-1, 6625])),
            ("ch_ppocr_mobile_v2.0_cls_infer.onnx", ("x", vec![3, -1, -1]), ("save_infer_model/scale_0.tmp_1", vec![2])),
        ];
        for (file, (input, input_dims), (output, output_dims)) in cases {
            let Some(path) = pp_ocr(file) else { continue };
            let g = read_graph_signature(&path).unwrap();
            let mut c = ModelConfig::without_file("ocr");
            c.complete_from_graph(&g).unwrap();
            assert_eq!(c.max_batch_size, 4, "{file}");
            assert_eq!(tensor(&c.input, input), (F, input_dims), "{file}");
            assert_eq!(tensor(&c.output, output), (F, output_dims), "{file}");
            let e = contradiction(&config("max_batch_size: 4\ninput { name: \"x\" data_type: TYPE_FP32 dims: [1, 48, 320] }"), &g);
            assert!(e.contains("input \"x\": config.pbtxt says dims [1, 48, 320], the ONNX graph's shape is [3, -1, -1]"), "{file}: {e}");
        }
    }

    #[test]
    fn a_scanned_repository_is_completed_model_by_model() {
        let dir = TempDir::new("repo");
        let tiny = tiny_model();
        let wider = model(&[value_info("x", 1, Some(&[D::P("n"), D::V(8)]))], &[value_info("y", 1, Some(&[D::P("n"), D::V(8)]))]);
        dir.file("tiny/1/model.onnx", &tiny);
        dir.file("partial/3/model.onnx", &tiny).file("partial/config.pbtxt", b"max_batch_size: 32");
        dir.file("listed/1/model.onnx", &tiny).file(
            "listed/config.pbtxt",
            b"max_batch_size: 2\ninput { name: \"x\" data_type: TYPE_FP32 dims: [4] }\noutput { name: \"y\" data_type: TYPE_FP32 dims: [4] }",
        );
        dir.file("wrong/1/model.onnx", &tiny).file("wrong/config.pbtxt", b"input { name: \"x\" data_type: TYPE_INT64 dims: [-1, 4] }");
        dir.file("garbage/1/model.onnx", b"not really onnx");
        dir.file("versions/1/model.onnx", &wider).file("versions/2/model.onnx", &tiny);
        dir.file("versions/config.pbtxt", b"version_policy { all { } }");
        dir.file("pipe/1/.keep", b"")
            .file("pipe/config.pbtxt", b"platform: \"ensemble\" ensemble_scheduling { step { model_name: \"wrong\" } }");
        dir.file("pipe_ok/1/.keep", b"")
            .file("pipe_ok/config.pbtxt", b"platform: \"ensemble\" ensemble_scheduling { step { model_name: \"tiny\" } }");
        if let Some(det) = pp_ocr("ch_PP-OCRv4_det_infer.onnx") {
            fs::create_dir_all(dir.0.join("det/1")).unwrap();
            fs::copy(det, dir.0.join("det/1/model.onnx")).unwrap();
        }

        let mut repo = scan(&[&dir.0]).unwrap();
        assert_eq!(repo.errors().count(), 0, "{:?}", repo.errors().collect::<Vec<_>>());
        let listed_before = repo.models["listed"].as_ref().unwrap().config.clone();
        repo.complete_from_graphs();
        let ok = |name: &str| match &repo.models[name] {
            Ok(entry) => entry.config.clone(),
            Err(e) => panic!("{e}"),
        };
        let err = |name: &str| match &repo.models[name] {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{name} should be refused"),
        };
        let tiny_config = ok("tiny");
        assert_eq!((tiny_config.max_batch_size, tiny_config.from_graph), (4, None));
        assert_eq!(tensor(&tiny_config.input, "x"), (F, vec![4]));
        let partial = ok("partial");
        assert_eq!(partial.max_batch_size, 32);
        assert_eq!(tensor(&partial.output, "y"), (F, vec![4]));
        assert_eq!(ok("listed"), listed_before, "a complete configuration that agrees with its graph is unchanged");
        assert_eq!(
            err("wrong"),
            format!(
                "model \"wrong\": version 1 ({}): input \"x\": config.pbtxt says TYPE_INT64, the ONNX graph TYPE_FP32",
                dir.0.join("wrong/1/model.onnx").display()
            )
        );
        let garbage = err("garbage");
        assert!(
            garbage.starts_with(&format!(
                "model \"garbage\": {}: malformed ONNX model at byte 0: ",
                dir.0.join("garbage/1/model.onnx").display()
            )),
            "{garbage}"
        );
        let versions = err("versions");
        assert!(
            versions.contains("version 1 (") && versions.contains("input \"x\": config.pbtxt says dims [4], the ONNX graph's shape is [8]"),
            "the latest version completes the configuration, the others are checked against it: {versions}"
        );
        assert!(err("pipe").contains("ensemble step 1 runs model \"wrong\", which cannot be served"), "{}", err("pipe"));
        assert_eq!(ok("pipe_ok").ensemble_steps.len(), 1);
        if pp_ocr("ch_PP-OCRv4_det_infer.onnx").is_some() {
            let det = ok("det");
            assert_eq!(det.max_batch_size, 4);
            assert_eq!(tensor(&det.input, "x"), (F, vec![3, -1, -1]));
        }

        // The entry's own method checks a complete configuration against its graph.
        let mut listed = repo.models["listed"].as_ref().unwrap().clone();
        listed.complete_from_graph().unwrap();
        assert_eq!(listed.config, listed_before);
        let mut broken = listed.clone();
        broken.config.input[0].dims = vec![5];
        let e = broken.complete_from_graph().unwrap_err();
        assert!(e.message.contains("input \"x\": config.pbtxt says dims [5], the ONNX graph's shape is [4]"), "{e}");
        assert_eq!(broken.config.input[0].dims, [5], "left as it was");
    }
}
