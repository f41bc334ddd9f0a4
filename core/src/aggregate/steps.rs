//! The training steps the loop reported: how many, their images, the last loss and where it
//! stopped being a number, the prefetch queue they found, and the recent records for charts.
//! Pure.

use probes::StepRecord;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Recent steps kept for windowed statistics (bounded whatever the run length).
pub const RECENT_STEPS: usize = 4096;

/// Where the loss stopped being a number: the first NaN step and the first ±inf step
/// (training steps only).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct Divergence {
    pub first_nan: Option<u64>,
    pub first_inf: Option<u64>,
}

impl Divergence {
    /// The first step whose loss was not finite.
    pub fn first(&self) -> u64 {
        self.first_nan.into_iter().chain(self.first_inf).min().unwrap_or(0)
    }

    /// Records step `step`'s loss; `true` if it was not finite.
    fn see(this: &mut Option<Divergence>, step: u64, loss: f32) -> bool {
        if loss.is_finite() {
            return false;
        }
        let d = this.get_or_insert_with(Divergence::default);
        let slot = if loss.is_nan() { &mut d.first_nan } else { &mut d.first_inf };
        slot.get_or_insert(step);
        true
    }
}

/// The training (not validation) steps' totals.
pub(super) struct Steps {
    pub(super) steps: u64,
    pub(super) images: u64,
    queued_sum: u64,
    pub(super) last_loss: Option<f64>,
    pub(super) diverged: Option<Divergence>,
    recent: VecDeque<StepRecord>,
}

impl Steps {
    pub(super) fn new() -> Steps {
        Steps {
            steps: 0,
            images: 0,
            queued_sum: 0,
            last_loss: None,
            diverged: None,
            recent: VecDeque::with_capacity(RECENT_STEPS),
        }
    }

    /// Counts one training step.
    pub(super) fn push(&mut self, st: &StepRecord) {
        self.steps += 1;
        self.images += st.images as u64;
        self.queued_sum += st.queued as u64;
        if !st.no_loss {
            self.last_loss = Some(st.loss as f64);
            Divergence::see(&mut self.diverged, st.step, st.loss);
        }
        if self.recent.len() == RECENT_STEPS {
            self.recent.pop_front();
        }
        self.recent.push_back(*st);
    }

    /// Mean batches waiting in the prefetch queue when a step took its batch.
    pub(super) fn mean_queued(&self) -> f64 {
        if self.steps > 0 {
            self.queued_sum as f64 / self.steps as f64
        } else {
            0.0
        }
    }

    /// The last `n` step records, oldest first.
    pub(super) fn recent(&self, n: usize) -> Vec<StepRecord> {
        self.recent.iter().rev().take(n).rev().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::testing::step;
    use crate::aggregate::{Aggregator, RunSettings, Summary};
    use probes::Event;

    #[test]
    fn non_finite_losses_mark_where_training_diverged_and_the_summary_json_keeps_them() {
        let mut a = Aggregator::new(RunSettings::default());
        for (i, loss) in [1.0, 0.5, f32::INFINITY, f32::NAN, 2.0, f32::NAN].into_iter().enumerate() {
            a.push(&step(i as u64, 0, loss, 1, 1000 * (i as u64 + 1)));
        }
        let s = a.summary();
        assert_eq!(s.diverged, Some(Divergence { first_nan: Some(3), first_inf: Some(2) }));
        assert_eq!(s.diverged.unwrap().first(), 2);
        assert!(s.last_loss.unwrap().is_nan() && s.epochs[0].loss.is_nan());
        let text = serde_json::to_string(&s).unwrap();
        assert!(text.contains("\"last_loss\":\"NaN\""), "{text}");
        let back: Summary = serde_json::from_str(&text).unwrap();
        assert!(back.epochs[0].loss.is_nan() && back.diverged == s.diverged);
        let mut fine = Aggregator::new(RunSettings::default());
        fine.push(&step(0, 0, 1.0, 1, 1000));
        assert_eq!(fine.summary().diverged, None);
    }

    #[test]
    fn unmeasured_losses_are_left_out_and_an_epoch_without_one_says_so() {
        let mut a = Aggregator::new(RunSettings::default());
        let unseen = |k: u64, epoch: u32| {
            let Event::Step(mut st) = step(k, epoch, 0.0, 0, 1000 * (k + 1)) else { unreachable!() };
            st.no_loss = true;
            Event::Step(st)
        };
        // Epoch 0: one step measured 2.0, one not (its 0.0 must not halve the mean).
        a.push(&step(0, 0, 2.0, 0, 1000));
        a.push(&unseen(1, 0));
        // Epoch 1: nothing measured.
        a.push(&unseen(2, 1));
        let s = a.summary();
        assert!((s.epochs[0].loss - 2.0).abs() < 1e-9 && !s.epochs[0].no_loss, "{:?}", s.epochs[0]);
        assert!(s.epochs[1].no_loss, "{:?}", s.epochs[1]);
        assert_eq!(s.last_loss, Some(2.0));
    }
}
