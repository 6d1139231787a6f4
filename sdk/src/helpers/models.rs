//! Multi-model serving: which model a request needs and what a batch of it costs, for
//! policies whose workers keep several models resident and pick one per dispatch
//! (`dispatch` with a variant), as SHEPHERD's GPUs do.
//!
//! A *model* is one (stage, variant) pair of the configuration. A request at a stage
//! needs the variant its stream names: the part of the stream's name before the first
//! `/` (so streams `rn18/a` and `rn18/b` both use the variant called `rn18`), compared
//! without regard to case. A stream that names no variant of the stage uses the stage's
//! first variant.

use std::collections::HashMap;

use crate::{Config, Duration, StageId, StreamId, VariantId};

/// One model: a variant of a stage with its batch latencies.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// The stage it serves.
    pub stage: StageId,
    /// Its variant id within the stage.
    pub variant: VariantId,
    /// The variant's name.
    pub name: String,
    /// Accelerator memory one resident copy needs.
    pub memory_bytes: u64,
    /// The stage's largest batch.
    pub max_batch: u32,
    /// Mean latency of batch sizes 1..=max_batch (index `b - 1`), made non-decreasing.
    latency: Vec<Duration>,
}

impl ModelInfo {
    /// Mean latency of a batch of `batch` requests (sizes past `max_batch` cost as much
    /// as `max_batch`).
    pub fn latency(&self, batch: u32) -> Duration {
        let index = (batch.max(1) as usize).min(self.latency.len()) - 1;
        self.latency[index]
    }

    /// The largest batch of at most `limit` requests that takes at most `budget`
    /// (0 when even one request does not fit).
    pub fn largest_batch_within(&self, budget: Duration, limit: u32) -> u32 {
        let limit = (limit as usize).min(self.latency.len());
        self.latency[..limit].partition_point(|&l| l <= budget) as u32
    }

    /// The batch of at most `limit` requests, taking at most `budget`, that serves the
    /// most requests per second (the smaller on a tie; 0 when even one request does not
    /// fit). On a profile whose throughput grows with the batch this is
    /// [`Self::largest_batch_within`]; on one where a larger batch serves fewer per
    /// second (a GPU past its sweet spot), it is the sweet spot.
    pub fn most_productive_batch_within(&self, budget: Duration, limit: u32) -> u32 {
        crate::most_productive_batch(self.largest_batch_within(budget, limit), |b| self.latency(b))
    }

    /// The linear model `l(b) = α·b + β` through the latencies of batch 1 and of the
    /// largest batch, as `(α, β)` in nanoseconds (SHEPHERD's Eq. 1).
    pub fn linear(&self) -> (f64, f64) {
        let first = self.latency[0] as f64;
        let n = self.latency.len();
        if n < 2 {
            return (0.0, first);
        }
        let alpha = (self.latency[n - 1] as f64 - first) / (n - 1) as f64;
        (alpha, first - alpha)
    }
}

/// Every model of a configuration and the model each stream needs at each stage.
#[derive(Debug, Clone, Default)]
pub struct ModelCatalog {
    models: Vec<ModelInfo>,
    /// (stage, variant) → model index.
    index: HashMap<(StageId, VariantId), usize>,
    /// `stream_models[stream][stage]`: the model a stream's requests need at a stage.
    stream_models: Vec<Vec<usize>>,
    /// Per stage: its first variant's model (for unknown streams).
    stage_default: Vec<Option<usize>>,
}

impl ModelCatalog {
    /// The models of `config`, with latencies from its profiles.
    pub fn from_config(config: &Config) -> Self {
        let table = crate::LatencyTable::from_config(config);
        let mut catalog = Self::default();
        for stage in &config.stages {
            let index = stage.id as usize;
            if catalog.stage_default.len() <= index {
                catalog.stage_default.resize(index + 1, None);
            }
            for variant in &stage.variants {
                let mut latency: Vec<Duration> =
                    (1..=stage.max_batch.max(1)).map(|b| table.mean(stage.id, variant.id, b).unwrap_or(0)).collect();
                // Monotone, so budget searches can bisect.
                for i in 1..latency.len() {
                    latency[i] = latency[i].max(latency[i - 1]);
                }
                let model = catalog.models.len();
                catalog.index.insert((stage.id, variant.id), model);
                if catalog.stage_default[index].is_none() {
                    catalog.stage_default[index] = Some(model);
                }
                catalog.models.push(ModelInfo {
                    stage: stage.id,
                    variant: variant.id,
                    name: variant.name.clone(),
                    memory_bytes: variant.memory_bytes,
                    max_batch: stage.max_batch.max(1),
                    latency,
                });
            }
        }
        for stream in &config.streams {
            let index = stream.id as usize;
            if catalog.stream_models.len() <= index {
                catalog.stream_models.resize(index + 1, Vec::new());
            }
            let wanted = stream.name.split('/').next().unwrap_or("").to_ascii_lowercase();
            let per_stage = config
                .stages
                .iter()
                .map(|stage| {
                    let named = stage.variants.iter().find(|v| v.name.to_ascii_lowercase() == wanted);
                    match named {
                        Some(v) => catalog.index[&(stage.id, v.id)],
                        None => catalog.stage_default.get(stage.id as usize).copied().flatten().unwrap_or(usize::MAX),
                    }
                })
                .collect::<Vec<_>>();
            // Indexed by stage id.
            let mut by_id = vec![usize::MAX; catalog.stage_default.len()];
            for (stage, model) in config.stages.iter().zip(per_stage) {
                by_id[stage.id as usize] = model;
            }
            catalog.stream_models[index] = by_id;
        }
        catalog
    }

    /// The model a request of `stream` needs at `stage` (`None` for a stage without
    /// variants).
    pub fn model_of(&self, stream: StreamId, stage: StageId) -> Option<usize> {
        let named = self.stream_models.get(stream as usize).and_then(|s| s.get(stage as usize)).copied();
        match named {
            Some(model) if model != usize::MAX => Some(model),
            _ => self.stage_default.get(stage as usize).copied().flatten(),
        }
    }

    /// The model serving (stage, variant).
    pub fn model_at(&self, stage: StageId, variant: VariantId) -> Option<usize> {
        self.index.get(&(stage, variant)).copied()
    }

    /// Cap `model`'s largest batch ([`ModelInfo::max_batch`]) at `limit` (at least 1),
    /// for a policy that forms smaller batches than the stage allows. Its latencies
    /// are kept.
    pub fn limit_batch(&mut self, model: usize, limit: u32) {
        if let Some(info) = self.models.get_mut(model) {
            info.max_batch = info.max_batch.min(limit).max(1);
        }
    }

    /// One model.
    pub fn get(&self, model: usize) -> &ModelInfo {
        &self.models[model]
    }

    /// Every model, by index.
    pub fn models(&self) -> &[ModelInfo] {
        &self.models
    }

    /// Number of models.
    pub fn len(&self) -> usize {
        self.models.len()
    }

    /// Whether there are no models.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{linear_variant, one_stage};
    use crate::{Stream, Variant};

    fn variant(id: u32, name: &str, alpha: u64, beta: u64) -> Variant {
        Variant { memory_bytes: 100, ..linear_variant(id, name, alpha, beta, 8) }
    }

    fn config() -> Config {
        let mut config = one_stage(vec![variant(0, "RN18", 10, 100), variant(1, "RS269", 50, 700)], 8, 1);
        config.streams = vec![
            Stream { id: 0, name: "rs269/bursty".into(), entry: 0, slo: 1 },
            Stream { id: 1, name: "rn18".into(), entry: 0, slo: 1 },
            Stream { id: 2, name: "other".into(), entry: 0, slo: 1 },
        ];
        config
    }

    #[test]
    fn streams_name_their_model_and_others_get_the_first_variant() {
        let catalog = ModelCatalog::from_config(&config());
        assert_eq!(catalog.len(), 2);
        assert_eq!(catalog.model_of(0, 0), Some(1));
        assert_eq!(catalog.model_of(1, 0), Some(0));
        assert_eq!(catalog.model_of(2, 0), Some(0));
        assert_eq!(catalog.model_of(9, 0), Some(0));
        assert_eq!(catalog.model_at(0, 1), Some(1));
    }

    #[test]
    fn latency_budget_and_linear_fit() {
        let catalog = ModelCatalog::from_config(&config());
        let rn18 = catalog.get(0);
        assert_eq!(rn18.latency(1), 110);
        assert_eq!(rn18.latency(4), 140);
        assert_eq!(rn18.latency(100), 180);
        assert_eq!(rn18.largest_batch_within(139, 8), 3);
        assert_eq!(rn18.largest_batch_within(140, 8), 4);
        assert_eq!(rn18.largest_batch_within(109, 8), 0);
        assert_eq!(rn18.largest_batch_within(10_000, 5), 5);
        let (alpha, beta) = rn18.linear();
        assert!((alpha - 10.0).abs() < 1e-9 && (beta - 100.0).abs() < 1e-9);
    }

    #[test]
    fn the_most_productive_batch_is_the_sweet_spot_within_the_budget() {
        // Linear: throughput grows with the batch, so the largest that fits.
        let catalog = ModelCatalog::from_config(&config());
        let rn18 = catalog.get(0);
        assert_eq!(rn18.most_productive_batch_within(140, 8), 4);
        assert_eq!(rn18.most_productive_batch_within(10_000, 8), 8);
        assert_eq!(rn18.most_productive_batch_within(109, 8), 0);
        // A sweet spot at 4 (4 per 40 ns); batches of 5–8 serve fewer (8 per 160 ns).
        let mut config = config();
        config.stages[0].variants[0].profile =
            [(1, 20), (4, 40), (8, 160)].into_iter().map(|(batch, mean)| crate::LatencyPoint { batch, mean, tail: mean }).collect();
        let catalog = ModelCatalog::from_config(&config);
        let model = catalog.get(0);
        assert_eq!(model.largest_batch_within(10_000, 8), 8);
        assert_eq!(model.most_productive_batch_within(10_000, 8), 4);
        assert_eq!(model.most_productive_batch_within(39, 8), 3);
        assert_eq!(model.most_productive_batch_within(10_000, 2), 2);
        let mut capped = catalog.clone();
        capped.limit_batch(0, 4);
        assert_eq!(capped.get(0).max_batch, 4);
        assert_eq!(capped.get(0).latency(8), 160);
    }
}
