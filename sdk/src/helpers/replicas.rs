//! Replica bounds a policy may ask for at a stage: its own limits (parameters such as
//! `r_min` and `r_max`) narrowed to the stage's `[min_replicas, max_replicas]`.
//!
//! A stage whose model is out of service — *offline*, as a model unloaded while a
//! model repository is served leaves it (`min_replicas = max_replicas = 0`) — allows
//! no replica at all, whatever floor the policy keeps elsewhere: scaling it to one is
//! rejected. Its stage and stream keep their ids, and loading the model again brings
//! the bounds back (the policy is then initialised again with the new configuration).

use crate::Stage;

/// Whether `stage` is offline: no replica allowed (its model is out of service).
pub fn is_offline(stage: &Stage) -> bool {
    stage.max_replicas == 0
}

/// The replica bounds `(low, high)` at `stage` for a policy whose own limits are
/// `[low, high]`: never outside the stage's own bounds (an offline stage gets
/// `(0, 0)`); where the policy's floor is above its ceiling, the floor wins (within
/// the stage's bounds).
pub fn replica_bounds(stage: &Stage, low: u32, high: u32) -> (u32, u32) {
    let low = low.max(stage.min_replicas).min(stage.max_replicas);
    (low, high.min(stage.max_replicas).max(low))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StageKind;

    fn stage(min_replicas: u32, max_replicas: u32) -> Stage {
        Stage {
            id: 0,
            name: "s".into(),
            kind: StageKind::Batch,
            successors: vec![],
            predecessors: vec![],
            variants: vec![],
            max_batch: 4,
            min_replicas,
            max_replicas,
        }
    }

    #[test]
    fn the_policys_limits_are_narrowed_to_the_stages() {
        assert_eq!(replica_bounds(&stage(1, 8), 1, 4), (1, 4));
        assert_eq!(replica_bounds(&stage(2, 3), 1, 8), (2, 3));
        // A floor above the ceiling: the floor, within the stage's bounds.
        assert_eq!(replica_bounds(&stage(1, 8), 3, 2), (3, 3));
        assert_eq!(replica_bounds(&stage(1, 2), 3, 8), (2, 2));
    }

    #[test]
    fn an_offline_stage_allows_no_replica_whatever_the_policys_floor() {
        let offline = stage(0, 0);
        assert!(is_offline(&offline) && !is_offline(&stage(0, 1)));
        assert_eq!(replica_bounds(&offline, 1, 8), (0, 0));
        assert_eq!(replica_bounds(&offline, 0, 0), (0, 0));
    }
}
