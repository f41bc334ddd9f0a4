//! The epoch table: per epoch its steps, images, mean loss and accuracy, time and validation.
//! The first and last [`EPOCHS_KEPT`] epochs are rows of their own, the ones between summed
//! into one (a loop that calls `next(iter(loader))` every step starts an epoch per step).
//!
//! An epoch's time runs from its earliest record to its latest, validation records included
//! (Keras's epoch ends after its validation pass). A validation record with no images is a
//! mark on that clock and nothing else: Keras's hook sends one at its epoch's begin and one at
//! its end, so an epoch of one step, whose only step record is its end, has its time too.
//! Pure.

use probes::StepRecord;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Epochs listed one by one at each end of the epoch table; the ones between are summed into
/// one row (a loop that calls `next(iter(loader))` every step starts an epoch per step).
pub const EPOCHS_KEPT: usize = 50;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct EpochSummary {
    pub epoch: u32,
    pub steps: u64,
    pub images: u64,
    /// Mean loss per image: NaN or ±inf once training diverged (written as words).
    #[schemars(with = "probes::nonfinite::Json")]
    #[serde(with = "probes::nonfinite")]
    pub loss: f64,
    /// No step of the epoch had its loss measured: `loss` means nothing (shown as `-`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_loss: bool,
    pub accuracy: f64,
    pub seconds: f64,
    /// Mean loss over the validation pass after this epoch, when there was one.
    #[schemars(with = "Option<probes::nonfinite::Json>")]
    #[serde(with = "probes::nonfinite::option", default)]
    pub val_loss: Option<f64>,
    #[serde(default)]
    pub val_accuracy: Option<f64>,
    /// Images the validation passes of this epoch evaluated (not in `images`: no training).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub val_images: u64,
    /// A row that sums the epochs from `epoch` through this one (the table keeps the first and
    /// last [`EPOCHS_KEPT`] apart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub through: Option<u32>,
}

/// For serde: a count left out of the JSON when nothing was counted.
fn is_zero(n: &u64) -> bool {
    *n == 0
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
        row.val_images = row.val_images.saturating_add(e.val_images);
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
    /// The epoch's clock: its earliest and latest record, once one came.
    clock: Option<(u64, u64)>,
    val_images: u64,
    val_loss_sum: f64,
    val_loss_images: u64,
    val_correct: u64,
}

impl EpochAgg {
    fn add(&mut self, o: &EpochAgg) {
        if let Some((start, end)) = o.clock {
            self.see(start);
            self.see(end);
        }
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

    /// A record of the epoch at `ns`: its clock reaches it.
    fn see(&mut self, ns: u64) {
        self.clock = Some(self.clock.map_or((ns, ns), |(start, end)| (start.min(ns), end.max(ns))));
    }

    /// Whether the epoch has anything to show: a step, or a validation pass (not only marks).
    fn has_rows(&self) -> bool {
        self.steps > 0 || self.val_images > 0
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
            seconds: self.clock.map_or(0, |(start, end)| end.saturating_sub(start)) as f64 / 1e9,
            val_loss: (self.val_loss_images > 0).then(|| self.val_loss_sum / self.val_loss_images as f64),
            val_accuracy: (self.val_images > 0).then(|| self.val_correct as f64 / self.val_images as f64),
            val_images: self.val_images,
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

    /// Counts a training or validation step in its epoch (a validation record with no images:
    /// a mark on the epoch's clock).
    pub(super) fn push(&mut self, st: &StepRecord) {
        let e = self.epoch(st.epoch);
        e.see(st.end_ns);
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
        e.steps += 1;
        e.images += st.images as u64;
        if let Some(l) = loss {
            e.loss_sum += l;
            e.loss_images += st.images as u64;
        }
        e.correct += st.correct as u64;
    }

    /// The table, in epoch order, the summed middle in its place.
    pub(super) fn summary(&self) -> Vec<EpochSummary> {
        let folded = self.folded.as_ref().map(|f| (f.first, &f.agg, Some(f.last + 1)));
        let mut rows: Vec<(u32, &EpochAgg, Option<u32>)> =
            self.epochs.iter().map(|(e, a)| (*e, a, None)).chain(folded).filter(|(_, a, _)| a.has_rows()).collect();
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
        // Its images are counted apart from training's, in the row they belong to.
        assert_eq!((s.epochs[EPOCHS_KEPT].val_images, s.epochs.last().map(|e| e.val_images)), (4, Some(4)));
        assert_eq!(s.epochs.iter().map(|e| e.images).sum::<u64>(), s.images);
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

    fn record(epoch: u32, images: u32, validation: bool, end_ns: u64) -> Event {
        Event::Step(StepRecord {
            no_loss: images == 0,
            step: 0,
            epoch,
            images,
            loss: 1.0,
            correct: 0,
            end_ns,
            queued: 0,
            validation,
        })
    }

    #[test]
    fn an_epochs_time_runs_from_its_begin_mark_to_its_end_mark() {
        // Keras, one step an epoch: begun at 1 s, its step done at 4 s, its validation pass
        // and end at 5 s. Without the marks its only record is its step's end: 0 s.
        let s = 1_000_000_000;
        let mut a = Aggregator::new(RunSettings::default());
        for e in 0..3u32 {
            let t0 = u64::from(e) * 10 * s;
            a.push(&record(e, 0, true, t0 + s));
            a.push(&record(e, 8, false, t0 + 4 * s));
            a.push(&record(e, 4, true, t0 + 4 * s + s / 2));
            a.push(&record(e, 0, true, t0 + 5 * s));
        }
        let sum = a.summary();
        let rows: Vec<(u32, u64, u64, f64)> =
            sum.epochs.iter().map(|e| (e.epoch, e.steps, e.images, e.seconds)).collect();
        assert_eq!(rows, [(1, 1, 8, 4.0), (2, 1, 8, 4.0), (3, 1, 8, 4.0)]);
        assert_eq!((sum.steps, sum.images), (3, 24), "marks are no steps");
        assert_eq!(sum.epochs[0].val_accuracy, Some(0.0), "the marks carry no validation images");
        // An epoch with marks only (interrupted before its first step) is no row.
        a.push(&record(3, 0, true, 40 * s));
        assert_eq!(a.summary().epochs.len(), 3);
        // A loop without marks: its epoch runs from its first step's end to its last one's.
        let mut b = Aggregator::new(RunSettings::default());
        b.push(&record(0, 8, false, 2 * s));
        b.push(&record(0, 8, false, 5 * s));
        assert_eq!(b.summary().epochs[0].seconds, 3.0);
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
