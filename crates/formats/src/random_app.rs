//! Random applications in Loki's application format, for measuring policies on
//! pipelines nobody chose ([`generate`]).
//!
//! Each application is a tree of tasks (a task named under two parents is one fan-in
//! stage, as the format reads it) of one of seven shapes, taken in turn so that every
//! set of seven has each once ([`AppShape`]):
//! - a chain of 2–6 tasks;
//! - a fan-out at the root into 2–3 branches of 1–2 tasks, without or with a join at a
//!   `sink`;
//! - a chain of 2–3 tasks, then a fan-out in the middle (at its last task) into 2–3 branches, without or
//!   with a join at a `sink`;
//! - a diamond: one task feeding two that both feed a fourth (a real join);
//! - any of the other shapes under a `source` pseudo-task root.
//!
//! Every task takes its models from one of the families the authors profiled —
//! detection (`yolov5*`), car classification (`efficientnet-*`) and face recognition
//! (`genderNet*`) — a run of 1 to all of the family's variants that have both a
//! published latency profile and a published accuracy, in the family's order. Out of
//! a detector, each edge states its fan-out (the format's `fan_out` extension, see
//! `pipeline::from_loki_app`), drawn in [`DETECTOR_FAN_OUT`] pieces per query and
//! capped so that no task receives more than [`MAX_PIECES`] per query; every other edge
//! hands on exactly the piece it gets (a fan-out point of another task gives each
//! branch the same piece). The SLO is drawn as 2.5–5 times the
//! application's critical path: the slowest root-to-leaf path of the most accurate
//! variants, each at the batch of the pieces one query brings it.
//!
//! The set is a pure function of the seed, the count and the profiles.

use serde_json::{json, Value};

use crate::pipeline::LokiProfiles;
use crate::rng::SimRng;

/// The most pieces one query may bring any task (the product of the fan-outs above
/// it), so that a chain of detectors does not make a query into thousands of pieces.
pub const MAX_PIECES: f64 = 32.0;

/// Pieces per query out of a detector, drawn in this range per edge: at least 1.5, so
/// that few queries bring no piece at all below it (a query with none ends there, on
/// time, with less work than the capacity bound's mean counts on).
pub const DETECTOR_FAN_OUT: (f64, f64) = (1.5, 4.0);

/// The index of the detection family in [`FAMILIES`].
const DETECT: usize = 0;

/// The SLO as a multiple of the critical path: drawn in this range.
pub const SLO_FACTOR: (f64, f64) = (2.5, 5.0);

/// The model families, each the published variants of one of the authors' tasks, in
/// their order (cheapest first).
pub const FAMILIES: [(&str, &[&str]); 3] = [
    ("detect", &["yolov5n", "yolov5s", "yolov5m", "yolov5l", "yolov5x"]),
    (
        "classify",
        &[
            "efficientnet-b0",
            "efficientnet-b1",
            "efficientnet-b2",
            "efficientnet-b3",
            "efficientnet-b4",
            "efficientnet-b5",
            "efficientnet-b6",
            "efficientnet-b7",
        ],
    ),
    ("recognise", &["genderNet_11", "genderNet_13", "genderNet_16", "genderNet", "genderNet_19"]),
];

/// The shape of a generated application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppShape {
    /// A chain of tasks.
    Chain,
    /// A fan-out at the root; `join`: the branches end in a `sink`.
    RootFan {
        /// Whether the branches join at a `sink`.
        join: bool,
    },
    /// A chain, then a fan-out; `join`: the branches end in a `sink`.
    MidFan {
        /// Whether the branches join at a `sink`.
        join: bool,
    },
    /// One task feeding two that both feed a fourth.
    Diamond,
}

impl AppShape {
    /// The shape's short name (`chain`, `root-fan`, `root-fan-join`, `mid-fan`,
    /// `mid-fan-join`, `diamond`).
    pub fn name(self) -> &'static str {
        match self {
            AppShape::Chain => "chain",
            AppShape::RootFan { join: false } => "root-fan",
            AppShape::RootFan { join: true } => "root-fan-join",
            AppShape::MidFan { join: false } => "mid-fan",
            AppShape::MidFan { join: true } => "mid-fan-join",
            AppShape::Diamond => "diamond",
        }
    }

    /// The six shapes without a pseudo root.
    const ALL: [AppShape; 6] = [
        AppShape::Chain,
        AppShape::RootFan { join: false },
        AppShape::RootFan { join: true },
        AppShape::MidFan { join: false },
        AppShape::MidFan { join: true },
        AppShape::Diamond,
    ];
}

/// One generated application.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedApp {
    /// Its name, which says its shape: `r03-root-fan-join`, `r06-src-chain`.
    pub name: String,
    /// Its shape.
    pub shape: AppShape,
    /// Whether it has a `source` pseudo-task root.
    pub source_root: bool,
    /// Tasks, pseudo-tasks left out.
    pub tasks: usize,
    /// The critical path, ms (see the module's documentation).
    pub critical_path_ms: f64,
    /// The application in Loki's format (pretty-printed JSON).
    pub json: String,
}

/// `count` applications drawn from `seed`, with models, latencies and accuracies from
/// `profiles`; an error when `profiles` lack every variant of a family.
pub fn generate(count: usize, seed: u64, profiles: &LokiProfiles) -> Result<Vec<GeneratedApp>, String> {
    let families: Vec<(&str, Vec<&str>)> = FAMILIES
        .iter()
        .map(|(family, models)| {
            let usable: Vec<&str> =
                models.iter().copied().filter(|m| profiles.profile(m).is_ok() && profiles.accuracy(m).is_some()).collect();
            if usable.is_empty() {
                Err(format!("the Loki profiles give no variant of {family} ({}) both a profile and an accuracy", models.join(", ")))
            } else {
                Ok((*family, usable))
            }
        })
        .collect::<Result<_, _>>()?;
    let mut root_rng = SimRng::new(seed);
    (0..count)
        .map(|index| {
            let mut rng = root_rng.fork(index as u64);
            // Every run of seven has each shape once, the seventh under a source root.
            let turn = index % 7;
            let (shape, source_root) = if turn < 6 { (AppShape::ALL[turn], false) } else { (AppShape::ALL[rng.below(6) as usize], true) };
            let name = format!("r{index:02}-{}{}", if source_root { "src-" } else { "" }, shape.name());
            Builder { rng: &mut rng, families: &families, profiles, tasks: 0 }.app(name, shape, source_root)
        })
        .collect()
}

/// Draws one application.
struct Builder<'a> {
    rng: &'a mut SimRng,
    families: &'a [(&'a str, Vec<&'a str>)],
    profiles: &'a LokiProfiles,
    tasks: usize,
}

/// A task being drawn: its JSON and what the critical path needs.
struct Node {
    name: String,
    family: usize,
    /// The most accurate variant (the last listed).
    slowest: String,
    /// Edge fan-out from its parent (None on the root).
    fan_out: Option<f64>,
    children: Vec<Node>,
    /// Variants listed.
    variants: Vec<String>,
    /// A pseudo-task.
    pseudo: bool,
}

impl Builder<'_> {
    fn app(mut self, name: String, shape: AppShape, source_root: bool) -> Result<GeneratedApp, String> {
        let mut root = match shape {
            AppShape::Chain => {
                let length = 2 + self.rng.below(5) as usize;
                self.chain(length)
            }
            AppShape::RootFan { join } => {
                let mut root = self.task();
                self.fan(&mut root, join);
                root
            }
            AppShape::MidFan { join } => {
                let length = 2 + self.rng.below(2) as usize;
                let mut head = self.chain(length);
                let tail = last_mut(&mut head);
                self.fan(tail, join);
                head
            }
            AppShape::Diamond => {
                let mut top = self.task();
                let join = self.task();
                for _ in 0..2 {
                    let mut side = self.task();
                    side.children.push(Node { fan_out: None, ..join.clone_shallow() });
                    top.children.push(side);
                }
                top
            }
        };
        if source_root {
            let mut source = pseudo("source");
            source.children.push(root);
            root = source;
        }
        self.fan_outs(&mut root, 1.0);
        let critical_path_ms = self.critical_path(&root, 1.0)?;
        let factor = self.rng.uniform_range(SLO_FACTOR.0, SLO_FACTOR.1);
        let slo_ms = (critical_path_ms * factor).ceil().max(1.0);
        let app = json!({
            "appName": name,
            "latencySLOInMSec": slo_ms,
            "shape": shape.name(),
            "root": to_json(&root),
        });
        Ok(GeneratedApp {
            name,
            shape,
            source_root,
            tasks: self.tasks,
            critical_path_ms,
            json: serde_json::to_string_pretty(&app).expect("a JSON value prints"),
        })
    }

    /// A fresh task of a random family, with a run of its variants.
    fn task(&mut self) -> Node {
        let family = self.rng.below(self.families.len() as u64) as usize;
        let models = &self.families[family].1;
        let count = 1 + self.rng.below(models.len() as u64) as usize;
        let start = self.rng.below((models.len() - count + 1) as u64) as usize;
        let variants: Vec<String> = models[start..start + count].iter().map(|m| m.to_string()).collect();
        self.tasks += 1;
        Node {
            name: format!("{}{}", self.families[family].0, self.tasks),
            family,
            slowest: variants.last().expect("at least one").clone(),
            fan_out: None,
            children: Vec::new(),
            variants,
            pseudo: false,
        }
    }

    /// A chain of `length` tasks (the first returned, the rest below it).
    fn chain(&mut self, length: usize) -> Node {
        let mut nodes: Vec<Node> = (0..length).map(|_| self.task()).collect();
        let mut below = nodes.pop().expect("length ≥ 1");
        while let Some(mut above) = nodes.pop() {
            above.children.push(below);
            below = above;
        }
        below
    }

    /// Hang 2–3 branches of 1–2 tasks under `node`, each ending in a `sink` when
    /// `join`.
    fn fan(&mut self, node: &mut Node, join: bool) {
        let branches = 2 + self.rng.below(2) as usize;
        for _ in 0..branches {
            let length = 1 + self.rng.below(2) as usize;
            let mut branch = self.chain(length);
            if join {
                last_mut(&mut branch).children.push(pseudo("sink"));
            }
            node.children.push(branch);
        }
    }

    /// Draw every edge's fan-out (see the module's documentation), top down;
    /// `pieces`: pieces per query reaching `node`.
    fn fan_outs(&mut self, node: &mut Node, pieces: f64) {
        let parent_family = if node.pseudo { None } else { Some(node.family) };
        for child in &mut node.children {
            // A detector's pieces are drawn (Poisson, by the simulator) around its
            // stated mean, capped so that no task receives more than MAX_PIECES per
            // query; every other edge, and every edge into a sink, carries exactly the
            // piece it is given, which a stated mean would turn into a draw.
            child.fan_out = match parent_family {
                Some(DETECT) if !child.pseudo => {
                    let drawn = self.rng.uniform_range(DETECTOR_FAN_OUT.0, DETECTOR_FAN_OUT.1);
                    Some((drawn.min(MAX_PIECES / pieces) * 100.0).round() / 100.0)
                }
                // The sink under a detector: one piece, stated (the detector's published
                // branching names only the authors' tasks, so would give it none).
                Some(DETECT) => Some(1.0),
                _ => None,
            };
        }
        for child in &mut node.children {
            let below = pieces * child.fan_out.unwrap_or(1.0);
            self.fan_outs(child, below);
        }
    }

    /// The slowest root-to-leaf path, ms: the most accurate variant of each task at
    /// the batch of the pieces one query brings it.
    fn critical_path(&self, node: &Node, pieces: f64) -> Result<f64, String> {
        let own = if node.pseudo {
            0.0
        } else {
            let batch = pieces.ceil().max(1.0) as u32;
            self.profiles.profile(&node.slowest)?.mean(batch) as f64 / 1e6
        };
        let mut below: f64 = 0.0;
        for child in &node.children {
            below = below.max(self.critical_path(child, pieces * child.fan_out.unwrap_or(1.0))?);
        }
        Ok(own + below)
    }
}

impl Node {
    /// The same task, without its children (a join listed under a second parent).
    fn clone_shallow(&self) -> Node {
        Node {
            name: self.name.clone(),
            family: self.family,
            slowest: self.slowest.clone(),
            fan_out: self.fan_out,
            children: Vec::new(),
            variants: self.variants.clone(),
            pseudo: self.pseudo,
        }
    }
}

/// A pseudo-task (`source` or `sink`).
fn pseudo(name: &str) -> Node {
    Node {
        name: name.into(),
        family: usize::MAX,
        slowest: name.into(),
        fan_out: None,
        children: Vec::new(),
        variants: vec![name.into()],
        pseudo: true,
    }
}

/// The last task down the first children of `node`.
fn last_mut(node: &mut Node) -> &mut Node {
    if node.children.is_empty() {
        node
    } else {
        last_mut(&mut node.children[0])
    }
}

/// The task as the format writes it.
fn to_json(node: &Node) -> Value {
    let mut task = json!({
        "task": node.name,
        "model_variants": node.variants,
        "children": node.children.iter().map(to_json).collect::<Vec<_>>(),
    });
    if let Some(fan_out) = node.fan_out {
        task["fan_out"] = json!(fan_out);
    }
    task
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::from_loki_app;

    fn profiles() -> LokiProfiles {
        let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/loki"));
        LokiProfiles::load(dir, "onnxruntime_gpu_ampere").unwrap()
    }

    #[test]
    fn the_generator_is_deterministic_in_its_seed() {
        let profiles = profiles();
        let a = generate(14, 7, &profiles).unwrap();
        assert_eq!(a, generate(14, 7, &profiles).unwrap(), "the same seed, the same set");
        let b = generate(14, 8, &profiles).unwrap();
        assert_ne!(a.iter().map(|x| &x.json).collect::<Vec<_>>(), b.iter().map(|x| &x.json).collect::<Vec<_>>());
        // A longer set begins with the shorter one.
        assert_eq!(generate(5, 7, &profiles).unwrap()[..], a[..5]);
    }

    #[test]
    fn every_generated_application_imports_with_its_shape() {
        let profiles = profiles();
        let apps = generate(21, 1, &profiles).unwrap();
        let mut shapes = std::collections::BTreeSet::new();
        for app in &apps {
            let pipeline = from_loki_app(&app.json, &profiles, &app.name).unwrap_or_else(|e| panic!("{e}\n{}", app.json));
            shapes.insert((app.shape.name(), app.source_root));
            assert!(app.name.contains(app.shape.name()), "{}", app.name);
            let real: Vec<_> = pipeline.stages.iter().filter(|s| !s.takes_no_time()).collect();
            assert_eq!(real.len(), app.tasks, "{}", app.json);
            let roots = pipeline.stages.iter().filter(|s| s.predecessors.is_empty()).count();
            assert_eq!(roots, 1, "{}", app.name);
            let entry = &pipeline.stages[pipeline.streams[0].entry as usize];
            assert_eq!(entry.takes_no_time(), app.source_root, "{}", app.name);
            let fan_in = pipeline.stages.iter().filter(|s| s.predecessors.len() > 1).collect::<Vec<_>>();
            match app.shape {
                AppShape::Chain => {
                    assert!((2..=6).contains(&app.tasks), "{}", app.name);
                    assert!(pipeline.stages.iter().all(|s| s.successors.len() <= 1), "{}", app.name);
                }
                AppShape::Diamond => assert!(fan_in.len() == 1 && !fan_in[0].takes_no_time(), "{}", app.name),
                AppShape::RootFan { join } | AppShape::MidFan { join } => {
                    assert_eq!(fan_in.len(), usize::from(join), "{}", app.name);
                    assert!(fan_in.iter().all(|s| s.takes_no_time()), "the join is a sink: {}", app.name);
                    let fan_point = pipeline.stages.iter().position(|s| s.successors.len() > 1).expect("a fan-out");
                    let at_root = pipeline.stages[fan_point].predecessors.is_empty()
                        || pipeline.stages[fan_point].predecessors.iter().all(|p| pipeline.stages[*p as usize].takes_no_time());
                    assert_eq!(at_root, matches!(app.shape, AppShape::RootFan { .. }), "{}", app.name);
                }
            }
            // The SLO is 2.5–5 times the critical path (rounded up to a millisecond).
            let slo_ms = pipeline.streams[0].slo_ns as f64 / 1e6;
            assert!(slo_ms >= SLO_FACTOR.0 * app.critical_path_ms - 1e-6, "{}: {slo_ms} for {}", app.name, app.critical_path_ms);
            assert!(slo_ms <= SLO_FACTOR.1 * app.critical_path_ms + 1.0, "{}: {slo_ms} for {}", app.name, app.critical_path_ms);
            // Every variant is published, fan-outs are the application's own.
            for stage in &pipeline.stages {
                for variant in &stage.variants {
                    if !stage.takes_no_time() {
                        assert_eq!(profiles.accuracy(&variant.name), Some(variant.accuracy));
                    }
                    for &(_, f) in &variant.fan_out {
                        assert!((0.0..=MAX_PIECES).contains(&f), "{}: {f}", app.name);
                    }
                }
            }
        }
        assert_eq!(shapes.iter().filter(|(_, source)| !source).count(), 6, "every shape: {shapes:?}");
        assert!(shapes.iter().any(|(_, source)| *source), "a source root: {shapes:?}");
    }

    #[test]
    fn a_stated_edge_fan_out_is_the_edge_s_and_a_bad_one_is_refused_with_the_file() {
        let profiles = profiles();
        let app = r#"{"appName": "f", "latencySLOInMSec": 300, "root": {"task": "d", "model_variants": ["yolov5n", "yolov5s"],
            "children": [{"task": "c", "fan_out": 2.5, "model_variants": ["efficientnet-b0"]}]}}"#;
        let p = from_loki_app(app, &profiles, "f.json").unwrap();
        for variant in &p.stages[0].variants {
            assert_eq!(variant.fan_out, vec![(1, 2.5)], "{}", variant.name);
        }
        let error = from_loki_app(&app.replace("2.5", "-1"), &profiles, "f.json").unwrap_err().to_string();
        assert!(error.contains("f.json") && error.contains("fan_out -1"), "{error}");
    }
}
