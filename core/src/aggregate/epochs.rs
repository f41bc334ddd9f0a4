//! The epoch table: per epoch its steps, images, mean loss and accuracy, time and validation.
//! The first and last [`EPOCHS_KEPT`] epochs are rows of their own, the ones between summed
//! into one (a loop that calls `next(iter(loader))` every step starts an epoch per step).
//! Pure.

use probes::StepRecord;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Epochs listed one by one at each end of the epoch table; the ones between are summed into
/// one row (a loop that calls `next(iter(loader))` every step starts an epoch per step).
pub const EPOCHS_KEPT: usize = 50;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct EpochSummary {
    pub epoch: u32,
    pub steps: u64,
    pub images: u64,
    /// Mean loss per image: NaN or ±inf once training diverged (written as words).
    #[serde(with = "probes::nonfinite")]
    pub loss: f64,
    /// No step of the epoch had its loss measured: `loss` means nothing (shown as `-`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_loss: bool,
    pub accuracy: f64,
    pub seconds: f64,
    /// Mean loss over the validation pass after this epoch, when there was one.
    #[serde(with = "probes::nonfinite::option", default)]
    pub val_loss: Option<f64>,
    #[serde(default)]
    pub val_accuracy: Option<f64>,
    /// A row that sums the epochs from `epoch` through this one (the table keeps the first and
    /// last [`EPOCHS_KEPT`] apart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub through: Option<u32>,
}

/// Keeps the first and last [`EPOCHS_KEPT`] rows of an epoch table apart and sums the ones
/// between into one row (`through` its last epoch), as the aggregate does while it runs: loss
/// and accuracy weighted by images, validation from the last folded epoch that had one. Pure.
pub fn fold_epochs(epochs: &mut Vec<EpochSummary>) {
    if epochs.len() <= 2 * EPOCHS_KEPT + 1 {
        return;
    }
    let mid: Vec<EpochSummary> = epochs.drain(EPOCHS_KEPT..epochs.len() - EPOCHS_KEPT).collect();
    let mut row = EpochSummary { epoch: mid[0].epoch, no_loss: true, ..Default::default() };
    let (mut loss_images, mut loss_sum, mut acc_sum) = (0u64, 0.0, 0.0);
    for e in &mid {
        row.steps = row.steps.saturating_add(e.steps);
        row.images = row.images.saturating_add(e.images);
        row.seconds += e.seconds;
        acc_sum += e.accuracy * e.images as f64;
        if !e.no_loss {
            (loss_images, loss_sum) = (loss_images.saturating_add(e.images), loss_sum + e.loss * e.images as f64);
        }
        if e.val_loss.is_some() {
            (row.val_loss, row.val_accuracy) = (e.val_loss, e.val_accuracy);
        }
        row.through = Some(e.through.unwrap_or(e.epoch));
    }
    row.no_loss = loss_images == 0;
    row.loss = if loss_images > 0 { loss_sum / loss_images as f64 } else { 0.0 };
    row.accuracy = if row.images > 0 { acc_sum / row.images as f64 } else { 0.0 };
    epochs.insert(EPOCHS_KEPT, row);
}

#[derive(Default, Clone)]
struct EpochAgg {
    steps: u64,
    images: u64,
    loss_sum: f64,
    /// Images of the steps whose loss was measured: the mean's denominator.
    loss_images: u64,
    correct: u64,
    start_ns: u64,
    end_ns: u64,
    val_images: u64,
    val_loss_sum: f64,
    val_loss_images: u64,
    val_correct: u64,
}

impl EpochAgg {
    fn add(&mut self, o: &EpochAgg) {
        self.start_ns = if self.steps == 0 { o.start_ns } else { self.start_ns.min(o.start_ns) };
        self.end_ns = self.end_ns.max(o.end_ns);
        self.steps += o.steps;
        self.images += o.images;
        self.loss_sum += o.loss_sum;
        self.loss_images += o.loss_images;
        self.correct += o.correct;
        self.val_images += o.val_images;
        self.val_loss_sum += o.val_loss_sum;
        self.val_loss_images += o.val_loss_images;
        self.val_correct += o.val_correct;
    }

    /// The row for epoch `e` (from 0), summing through `through` when it is the middle one.
    fn summary(&self, e: u32, through: Option<u32>) -> EpochSummary {
        EpochSummary {
            epoch: e + 1,
            through,
            steps: self.steps,
            images: self.images,
            loss: if self.loss_images > 0 { self.loss_sum / self.loss_images as f64 } else { 0.0 },
            no_loss: self.loss_images == 0,
            accuracy: if self.images > 0 { self.correct as f64 / self.images as f64 } else { 0.0 },
            seconds: self.end_ns.saturating_sub(self.start_ns) as f64 / 1e9,
            val_loss: (self.val_loss_images > 0).then(|| self.val_loss_sum / self.val_loss_images as f64),
            val_accuracy: (self.val_images > 0).then(|| self.val_correct as f64 / self.val_images as f64),
        }
    }
}

#[derive(Default, Clone)]
struct Folded {
    first: u32,
    last: u32,
    agg: EpochAgg,
}

/// The epochs' accumulators: at most 2 × [`EPOCHS_KEPT`] apart, the rest summed.
#[derive(Default)]
pub(super) struct Epochs {
    epochs: BTreeMap<u32, EpochAgg>,
    /// Epochs past the first [`EPOCHS_KEPT`] and before the last ones, summed.
    folded: Option<Folded>,
}

impl Epochs {
    /// The accumulator of epoch `e`: its own, or the summed middle of the table. At most
    /// 2 × [`EPOCHS_KEPT`] epochs are kept apart: a new one beyond that moves the oldest of the
    /// last ones into the middle.
    fn epoch(&mut self, e: u32) -> &mut EpochAgg {
        let in_fold = self.folded.as_ref().is_some_and(|f| (f.first..=f.last).contains(&e));
        if !in_fold && !self.epochs.contains_key(&e) && self.epochs.len() >= 2 * EPOCHS_KEPT {
            if let Some(&mid) = self.epochs.keys().nth(EPOCHS_KEPT) {
                if let Some(a) = self.epochs.remove(&mid) {
                    let f = self.folded.get_or_insert(Folded { first: mid, last: mid, agg: EpochAgg::default() });
                    (f.first, f.last) = (f.first.min(mid), f.last.max(mid));
                    f.agg.add(&a);
                }
            }
        }
        match (in_fold, self.folded.as_mut()) {
            (true, Some(f)) => &mut f.agg,
            _ => self.epochs.entry(e).or_default(),
        }
    }

    /// Counts a training or validation step in its epoch.
    pub(super) fn push(&mut self, st: &StepRecord) {
        let e = self.epoch(st.epoch);
        let loss = (!st.no_loss).then_some(st.loss as f64 * st.images as f64);
        if st.validation {
            e.val_images += st.images as u64;
            if let Some(l) = loss {
                e.val_loss_sum += l;
                e.val_loss_images += st.images as u64;
            }
            e.val_correct += st.correct as u64;
            return;
        }
        if e.steps == 0 {
            e.start_ns = st.end_ns;
        }
        e.steps += 1;
        e.images += st.images as u64;
        if let Some(l) = loss {
            e.loss_sum += l;
            e.loss_images += st.images as u64;
        }
        e.correct += st.correct as u64;
        e.end_ns = st.end_ns;
    }

    /// The table, in epoch order, the summed middle in its place.
    pub(super) fn summary(&self) -> Vec<EpochSummary> {
        let folded = self.folded.as_ref().map(|f| (f.first, &f.agg, Some(f.last + 1)));
        let mut rows: Vec<(u32, &EpochAgg, Option<u32>)> =
            self.epochs.iter().map(|(e, a)| (*e, a, None)).chain(folded).collect();
        rows.sort_by_key(|r| r.0);
        rows.into_iter().map(|(e, a, through)| a.summary(e, through)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::testing::{span, step};
    use crate::aggregate::{Aggregator, RunSettings};
    use probes::{Event, Stage, NONE};

    #[test]
    fn the_epoch_table_keeps_the_first_and_last_epochs_and_sums_the_rest() {
        // `next(iter(loader))` every step: an epoch per step, 100,000 of them.
        let mut a = Aggregator::new(RunSettings::default());
        let n = 100_000u32;
        for i in 0..n {
            a.push(&step(u64::from(i), i, 1.0, 2, 1_000 + u64::from(i)));
        }
        let s = a.summary();
        assert_eq!(s.epochs.len(), 2 * EPOCHS_KEPT + 1);
        assert_eq!((s.epochs[0].epoch, s.epochs[EPOCHS_KEPT - 1].epoch), (1, EPOCHS_KEPT as u32));
        let mid = &s.epochs[EPOCHS_KEPT];
        assert_eq!((mid.epoch, mid.through), (EPOCHS_KEPT as u32 + 1, Some(n - EPOCHS_KEPT as u32)));
        assert_eq!(mid.steps, u64::from(n) - 2 * EPOCHS_KEPT as u64);
        assert_eq!(s.epochs.last().map(|e| (e.epoch, e.through)), Some((n, None)));
        // Nothing is lost: the rows add up to the run.
        assert_eq!(s.epochs.iter().map(|e| e.images).sum::<u64>(), s.images);
        assert!((mid.loss - 1.0).abs() < 1e-9 && (mid.accuracy - 0.5).abs() < 1e-9);
        // A validation step for a summed epoch goes into its row.
        let mut v = StepRecord {
            no_loss: false,
            step: 0,
            epoch: 500,
            images: 4,
            loss: 2.0,
            correct: 4,
            end_ns: 9,
            queued: 0,
            validation: true,
        };
        a.push(&Event::Step(v));
        v.epoch = n - 1;
        a.push(&Event::Step(v));
        let s = a.summary();
        assert_eq!(s.epochs[EPOCHS_KEPT].val_loss, Some(2.0));
        assert_eq!(s.epochs.last().and_then(|e| e.val_accuracy), Some(1.0));
        // Short runs are listed whole.
        let mut b = Aggregator::new(RunSettings::default());
        (0..100).for_each(|i| b.push(&step(i, i as u32, 1.0, 2, 1_000 + i)));
        assert!(b.summary().epochs.iter().all(|e| e.through.is_none()));
    }

    #[test]
    fn epochs_average_loss_per_image_and_count_accuracy() {
        let mut a = Aggregator::new(RunSettings::default());
        a.push(&span(Stage::Wait, 0, 10, NONE));
        a.push(&step(0, 0, 2.0, 1, 1_000_000_000));
        a.push(&step(1, 0, 1.0, 3, 2_000_000_000));
        a.push(&step(2, 1, 0.5, 4, 3_000_000_000));
        let s = a.summary();
        assert_eq!(s.epochs.len(), 2);
        assert!((s.epochs[0].loss - 1.5).abs() < 1e-9);
        assert!((s.epochs[0].accuracy - 0.5).abs() < 1e-9);
        assert_eq!(s.epochs[1].epoch, 2);
        assert_eq!((s.steps, s.images), (3, 12));
        assert!((s.images_per_s - 4.0).abs() < 1e-6, "{}", s.images_per_s);
    }

    #[test]
    fn validation_steps_fill_val_metrics_without_counting_as_training() {
        let mut a = Aggregator::new(RunSettings::default());
        a.push(&span(Stage::Wait, 0, 10, NONE));
        a.push(&step(0, 0, 2.0, 1, 1_000_000_000));
        let val = |loss: f32, correct: u32, images: u32| {
            Event::Step(StepRecord {
                no_loss: false,
                step: 0,
                epoch: 0,
                images,
                loss,
                correct,
                end_ns: 1_500_000_000,
                queued: 0,
                validation: true,
            })
        };
        a.push(&val(1.0, 3, 4));
        a.push(&val(0.5, 1, 2));
        a.push(&span(Stage::Validate, 1_000_000_000, 500_000_000, NONE));
        let s = a.summary();
        assert_eq!((s.steps, s.images), (1, 4), "validation is not training");
        let e = &s.epochs[0];
        assert!((e.val_loss.unwrap() - 5.0 / 6.0).abs() < 1e-9, "{e:?}");
        assert!((e.val_accuracy.unwrap() - 4.0 / 6.0).abs() < 1e-9);
        assert!((e.loss - 2.0).abs() < 1e-9);
        assert!((s.validation_share().unwrap() - 0.5 / 1.5).abs() < 1e-6, "{:?}", s.validation_share());
        let mut plain = Aggregator::new(RunSettings::default());
        plain.push(&step(0, 0, 2.0, 1, 1_000_000_000));
        assert_eq!(plain.summary().epochs[0].val_loss, None);
    }
}
