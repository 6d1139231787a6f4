//! An allocation plan: which variants run on how many workers with which max batch
//! size, and what the planner expects of it.

/// Replicas of one variant of one task.
#[derive(Clone, Debug, PartialEq)]
pub struct Hosting {
    /// Task index in the model.
    pub task: usize,
    /// Variant index in the task.
    pub variant: usize,
    /// Max batch size of its workers.
    pub batch: u32,
    /// Number of workers.
    pub replicas: u32,
    /// Planned load in requests per second (0 when the planner does not say).
    pub load: f64,
}

/// How the plan was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Regime {
    /// Most accurate variants only, fewest workers (STEP1).
    Hardware,
    /// Accuracy scaling on the whole cluster (STEP2).
    Accuracy,
    /// Demand beyond the maximum capacity: planned for the largest feasible demand.
    Capped,
    /// No latency-feasible plan: fastest variants at batch 1.
    Fastest,
}

/// An allocation plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Hosted variants (replicas > 0).
    pub hosts: Vec<Hosting>,
    /// Planned (flow-weighted, branch-averaged) end-to-end accuracy.
    pub accuracy: f64,
    /// Root demand the plan serves (QPS).
    pub demand: f64,
    /// How it was found.
    pub regime: Regime,
}

impl Plan {
    /// Workers in use.
    pub fn workers(&self) -> u32 {
        self.hosts.iter().map(|h| h.replicas).sum()
    }

    /// Workers of one task.
    pub fn task_workers(&self, task: usize) -> u32 {
        self.hosts.iter().filter(|h| h.task == task).map(|h| h.replicas).sum()
    }

    /// The hosting of a variant, if any.
    pub fn hosting(&self, task: usize, variant: usize) -> Option<&Hosting> {
        self.hosts.iter().find(|h| h.task == task && h.variant == variant && h.replicas > 0)
    }

    /// Same variants, batch sizes and replica counts (loads and estimates aside).
    pub fn same_allocation(&self, other: &Plan) -> bool {
        let key = |p: &Plan| {
            let mut v: Vec<(usize, usize, u32, u32)> =
                p.hosts.iter().filter(|h| h.replicas > 0).map(|h| (h.task, h.variant, h.batch, h.replicas)).collect();
            v.sort_unstable();
            v
        };
        key(self) == key(other)
    }
}
