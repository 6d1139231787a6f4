//! Admission at a pipeline's entry from the losses below it: drop at the entry, before
//! any accelerator time is spent, the share of requests the later stages are dropping
//! anyway.
//!
//! A scheduler that checks deadlines stage by stage admits at the entry whatever the
//! entry stage can serve. When a later stage is the bottleneck (a branch of a fan-out,
//! a join, a stage whose batches the deadlines keep small) it drops pieces of requests
//! whose earlier stages already ran — and with a fan-out or a join one lost piece loses
//! the whole request, so the other pieces' work is wasted too. Past capacity the waste
//! grows with the load and goodput falls below what the same cluster served at a lower
//! load. Queue lengths do not show it: a deadline-checking stage drops what waits too
//! long, so its queue stays short while it sheds.
//!
//! [`EntryShedder`] measures, every period, the share of requests the later stages'
//! drops lost, and admits at the entry a fraction of the arrivals that falls by half
//! that share while it is over a tolerance and climbs back by a fixed step otherwise
//! (additive increase, multiplicative decrease). Half, not the whole share: later
//! stages drop some pieces past capacity even when the entry stage is the bottleneck
//! (a request it served late), and falling by the whole share shed requests the
//! pipeline would have served (`vision-chain` at 2× its bound: 0.95 of the bound
//! without shedding, 0.88 falling by the whole share, 0.96 by half). Arrivals are
//! admitted by a deterministic credit, so the admitted ones are spread evenly over the
//! arrivals.

use crate::{Duration, Instant, StageId};

/// Losses below the entry under which the admitted share climbs back.
pub const TOLERANCE: f64 = 0.01;
/// The share of a period's loss below the entry by which the admitted share falls.
pub const DECREASE: f64 = 0.5;
/// How much the admitted share climbs back per quiet period.
pub const STEP: f64 = 0.05;
/// The least share admitted (the measurement needs some traffic below).
pub const FLOOR: f64 = 0.05;

/// Per period: pieces that arrived and pieces dropped at each stage below the entry,
/// and the share of entry arrivals admitted.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryShedder {
    /// Per stage: whether it is an entry (has no predecessor).
    entry: Vec<bool>,
    period: Duration,
    next: Option<Instant>,
    arrived: Vec<u64>,
    dropped: Vec<u64>,
    admit: f64,
    credit: f64,
}

impl EntryShedder {
    /// A shedder for stages whose entries are marked in `entry` (by stage id), measuring
    /// every `period` nanoseconds. It admits everything until the first period ends.
    pub fn new(entry: Vec<bool>, period: Duration) -> Self {
        let n = entry.len();
        Self { entry, period: period.max(1), next: None, arrived: vec![0; n], dropped: vec![0; n], admit: 1.0, credit: 0.0 }
    }

    /// The share of entry arrivals admitted now.
    pub fn admitted_share(&self) -> f64 {
        self.admit
    }

    /// A piece arrived at `stage` (a first arrival, not one handed back).
    pub fn arrived(&mut self, stage: StageId) {
        if let Some(n) = self.arrived.get_mut(stage as usize) {
            *n += 1;
        }
    }

    /// The policy dropped a piece at `stage` (not one the shedder refused).
    pub fn dropped(&mut self, stage: StageId) {
        if let Some(n) = self.dropped.get_mut(stage as usize) {
            *n += 1;
        }
    }

    /// The share of requests the stages below the entry lost over the counts so far: one
    /// less the product of each stage's share of pieces kept.
    pub fn loss(&self) -> f64 {
        let kept: f64 = (0..self.entry.len())
            .filter(|&s| !self.entry[s] && self.arrived[s] > 0)
            .map(|s| 1.0 - (self.dropped[s] as f64 / self.arrived[s] as f64).min(1.0))
            .product();
        1.0 - kept
    }

    /// Close every period that has ended by `now`: the admitted share falls by
    /// [`DECREASE`] times the loss measured below the entry when that is over
    /// [`TOLERANCE`], else climbs by [`STEP`]; the counts start again.
    pub fn advance(&mut self, now: Instant) {
        let next = *self.next.get_or_insert(now.saturating_add(self.period));
        if now < next {
            return;
        }
        let excess = self.loss();
        self.admit = if excess > TOLERANCE { (self.admit * (1.0 - 0.5 * excess)).max(FLOOR) } else { (self.admit + STEP).min(1.0) };
        self.arrived.iter_mut().for_each(|n| *n = 0);
        self.dropped.iter_mut().for_each(|n| *n = 0);
        // Periods with no event in them count as one.
        self.next = Some(now.saturating_add(self.period));
    }

    /// Whether to admit an arrival at `stage`: always below the entry; at an entry, the
    /// admitted share of arrivals, spread evenly.
    pub fn admit(&mut self, stage: StageId) -> bool {
        if !self.entry.get(stage as usize).copied().unwrap_or(false) || self.admit >= 1.0 {
            return true;
        }
        self.credit += self.admit;
        if self.credit >= 1.0 {
            self.credit -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stage 0 the entry, 1 and 2 below it; periods of 10 ns.
    fn shedder() -> EntryShedder {
        EntryShedder::new(vec![true, false, false], 10)
    }

    fn admitted_of(shedder: &mut EntryShedder, n: usize) -> usize {
        (0..n).filter(|_| shedder.admit(0)).count()
    }

    #[test]
    fn admits_everything_while_nothing_below_is_lost() {
        let mut s = shedder();
        s.advance(0);
        for _ in 0..100 {
            s.arrived(1);
        }
        s.advance(10);
        assert_eq!(s.admitted_share(), 1.0);
        assert_eq!(admitted_of(&mut s, 50), 50);
        // Below the entry every arrival is admitted whatever the share.
        assert!(s.admit(1));
    }

    #[test]
    fn a_loss_below_lowers_the_share_by_itself_and_quiet_periods_bring_it_back() {
        let mut s = shedder();
        s.advance(0);
        // Stage 1 drops 20 of 100, stage 2 25 of 100: 1 − 0.8·0.75 = 40 % of requests
        // lost; the share falls by half that, to 0.8.
        for _ in 0..100 {
            s.arrived(1);
            s.arrived(2);
        }
        (0..20).for_each(|_| s.dropped(1));
        (0..25).for_each(|_| s.dropped(2));
        assert!((s.loss() - 0.4).abs() < 1e-12);
        s.advance(10);
        assert!((s.admitted_share() - 0.8).abs() < 1e-12);
        // Four in five admitted, evenly.
        assert_eq!(admitted_of(&mut s, 100), 80);
        assert_eq!(admitted_of(&mut s, 5), 4);
        // The counts started again: a quiet period climbs by the step.
        s.advance(20);
        assert!((s.admitted_share() - 0.85).abs() < 1e-12);
        // Not before the period has ended.
        s.advance(25);
        assert!((s.admitted_share() - 0.85).abs() < 1e-12);
    }

    #[test]
    fn the_share_never_falls_below_the_floor() {
        let mut s = shedder();
        s.advance(0);
        for period in 1..40 {
            s.arrived(1);
            s.dropped(1);
            s.advance(10 * period);
        }
        assert_eq!(s.admitted_share(), FLOOR);
        assert_eq!(admitted_of(&mut s, 100), 5);
    }
}
