//! The training loop's step split: where its time went per step (wait for data, transfer,
//! compute), steady state only (the first wait, a one-off first compute and the pipelines a
//! `--workers auto` search tried are left out), and the recent steps' split for charts. Pure.

use super::stages::Stages;
use probes::{SpanRecord, Stage};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Recent per-step timings kept for charts.
pub const RECENT_POINTS: usize = 1024;

/// A first compute this many times the median of the next ones is a start-up one-off.
pub const STARTUP_COMPUTE_RATIO: f64 = 3.0;

/// Steps a phase after a workers change needs before the split describes it alone: a few
/// steps (the workers reached 8 at step 21 of 24) are too short a window to judge by, and the
/// split covers the whole run instead, with the change marked ([`StepSplit::changed_at`]).
pub const MIN_PHASE_STEPS: u64 = 8;

/// Whether the first compute of a run is a one-off to leave out of the compute mean: over
/// [`STARTUP_COMPUTE_RATIO`] × the median compute, with at least two more to judge by.
pub fn startup_compute_one_off(first_ns: u64, count: u64, median_ns: u64) -> bool {
    count >= 3 && median_ns > 0 && first_ns as f64 > STARTUP_COMPUTE_RATIO * median_ns as f64
}

/// One training step's split, from its spans (for charts).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct StepPoint {
    pub step: u64,
    /// End of the step's compute, monotonic ns.
    pub end_ns: u64,
    pub wait_ns: u64,
    pub transfer_ns: u64,
    pub compute_ns: u64,
}

/// Where the training loop's time went, per step on average.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(default)]
pub struct StepSplit {
    pub steps: u64,
    /// The run's first wait (filling the prefetch queue), left out of the figures below.
    pub startup_wait_ms: f64,
    pub mean_step_ms: f64,
    pub wait_ms: f64,
    pub transfer_ms: f64,
    pub compute_ms: f64,
    pub wait_share: f64,
    pub transfer_share: f64,
    pub compute_share: f64,
    /// The figures above cover the steps from this one on: the last change of the loader's
    /// workers (`--workers auto`), whose earlier steps ran another pipeline. `None`: the run.
    #[serde(default)]
    pub from_step: Option<u64>,
    /// The run's first compute, when it was a one-off (a JIT/XLA compile, a warm-up: over
    /// [`STARTUP_COMPUTE_RATIO`] × the median of the others): left out of the figures above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_compute_ms: Option<f64>,
    /// The workers changed after this step, too few steps ago ([`MIN_PHASE_STEPS`]) for the
    /// new pipeline to be judged alone: the figures above cover the whole run, and a verdict
    /// from them is provisional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_at: Option<u64>,
    /// Validation passes after training began, ms in all: inside the run's images/s clock but
    /// no training (an eval loop between epochs); the training rate leaves them out.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub validate_ms: f64,
}

/// For serde: a total left out of the JSON when nothing was timed.
fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// The training loop's wait / transfer / compute totals over a phase of the run.
#[derive(Debug, Clone, Copy, Default)]
struct Phase {
    first_step: u64,
    /// The phase's first wait refills the prefetch queue: left out, like the run's start-up.
    skip_wait: bool,
    wait_ns: u64,
    waits: u64,
    transfer_ns: u64,
    transfers: u64,
    compute_ns: u64,
    computes: u64,
}

impl Phase {
    fn push(&mut self, s: &SpanRecord) {
        match s.stage {
            Stage::Wait if self.skip_wait => self.skip_wait = false,
            Stage::Wait => (self.wait_ns, self.waits) = (self.wait_ns + s.dur_ns, self.waits + 1),
            Stage::Transfer => (self.transfer_ns, self.transfers) = (self.transfer_ns + s.dur_ns, self.transfers + 1),
            Stage::Compute => (self.compute_ns, self.computes) = (self.compute_ns + s.dur_ns, self.computes + 1),
            _ => {}
        }
    }
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Mean of `n` spans totalling `total` ns, ms (0 without spans).
pub(super) fn per(total: u64, n: u64) -> f64 {
    if n > 0 {
        ms(total) / n as f64
    } else {
        0.0
    }
}

/// The training loop's spans (wait, transfer, compute) as a split, and the recent steps'.
pub(super) struct Split {
    /// The first wait of the run: it includes filling the prefetch queue (start-up, not
    /// steady state), so the step split leaves it out.
    first_wait_ns: Option<u64>,
    /// The first compute of the run (a compile or warm-up may make it a one-off).
    first_compute_ns: Option<u64>,
    /// Start of the first wait: when training began.
    train_start_ns: u64,
    /// Validation spans after training began, ns.
    validate_ns: u64,
    /// Since the last workers change, when there was one.
    phase: Option<Phase>,
    points: VecDeque<StepPoint>,
    /// The train thread's wait and transfer of the step in flight.
    cur: StepPoint,
}

impl Split {
    pub(super) fn new() -> Split {
        Split {
            first_wait_ns: None,
            first_compute_ns: None,
            train_start_ns: u64::MAX,
            validate_ns: 0,
            phase: None,
            points: VecDeque::with_capacity(RECENT_POINTS),
            cur: StepPoint::default(),
        }
    }

    pub(super) fn push(&mut self, s: &SpanRecord) {
        match s.stage {
            Stage::Compute => {
                self.first_compute_ns.get_or_insert(s.dur_ns);
            }
            Stage::Wait => {
                self.train_start_ns = self.train_start_ns.min(s.start_ns);
                self.first_wait_ns.get_or_insert(s.dur_ns);
            }
            // An eval loop before training (a sanity check) is outside the rate's clock.
            Stage::Validate if s.start_ns >= self.train_start_ns => self.validate_ns += s.dur_ns,
            _ => {}
        }
        self.track_step(s);
        if let Some(p) = self.phase.as_mut() {
            p.push(s);
        }
    }

    fn track_step(&mut self, s: &SpanRecord) {
        match s.stage {
            Stage::Wait => self.cur = StepPoint { step: s.step, wait_ns: s.dur_ns, ..Default::default() },
            Stage::Transfer => {
                if self.cur.step != s.step {
                    self.cur = StepPoint { step: s.step, ..Default::default() };
                }
                self.cur.transfer_ns = s.dur_ns;
            }
            Stage::Compute => {
                let mut p =
                    if self.cur.step == s.step { self.cur } else { StepPoint { step: s.step, ..Default::default() } };
                p.compute_ns = s.dur_ns;
                p.end_ns = s.end_ns();
                if self.points.len() == RECENT_POINTS {
                    self.points.pop_front();
                }
                self.points.push_back(p);
            }
            _ => {}
        }
    }

    /// The loader's workers changed after `steps` steps: a new pipeline from the next step on,
    /// whose split starts afresh.
    pub(super) fn workers_changed(&mut self, steps: u64) {
        self.phase = Some(Phase { first_step: steps, skip_wait: true, ..Default::default() });
    }

    /// When training began (its first wait), monotonic ns; `u64::MAX` before it did.
    pub(super) fn train_start_ns(&self) -> u64 {
        self.train_start_ns
    }

    /// The recent steps' split, oldest first.
    pub(super) fn points(&self) -> Vec<StepPoint> {
        self.points.iter().copied().collect()
    }

    /// Mean wait, transfer and compute per step over the whole run, ms: the first wait left out,
    /// and the first compute when it was a one-off (`startup_compute`).
    fn run_means(stages: &Stages, first_wait: u64, startup_compute: Option<u64>) -> (f64, f64, f64) {
        let (wall, count) = (|s: Stage| stages.wall_ns(s), |s: Stage| stages.count(s));
        let wait_ms = match count(Stage::Wait) {
            0 | 1 => 0.0,
            n => ms(wall(Stage::Wait).saturating_sub(first_wait)) / (n - 1) as f64,
        };
        let all = |s: Stage| per(wall(s), count(s));
        let compute_ms = match startup_compute {
            Some(f) => ms(wall(Stage::Compute).saturating_sub(f)) / (count(Stage::Compute) - 1) as f64,
            None => all(Stage::Compute),
        };
        (wait_ms, all(Stage::Transfer), compute_ms)
    }

    /// The split after `steps` training steps, from `stages`' totals (or the phase since the
    /// last workers change, once it is long enough to judge by).
    pub(super) fn summary(&self, stages: &Stages, steps: u64) -> StepSplit {
        let first = self.first_wait_ns.unwrap_or(0);
        let phase = self.phase.filter(|p| p.computes >= MIN_PHASE_STEPS && p.waits > 0);
        let changed_at = self.phase.filter(|_| phase.is_none()).map(|p| p.first_step);
        let startup_compute = self
            .first_compute_ns
            .filter(|f| startup_compute_one_off(*f, stages.count(Stage::Compute), stages.median_ns(Stage::Compute)));
        let (wait_ms, transfer_ms, compute_ms) = match phase {
            // After the last workers change: the pipeline the run settled on, not the ones tried.
            Some(p) => (per(p.wait_ns, p.waits), per(p.transfer_ns, p.transfers), per(p.compute_ns, p.computes)),
            None => Split::run_means(stages, first, startup_compute),
        };
        let step_ms = wait_ms + transfer_ms + compute_ms;
        let share = |x: f64| if step_ms > 0.0 { x / step_ms } else { 0.0 };
        StepSplit {
            steps,
            startup_wait_ms: ms(first),
            mean_step_ms: step_ms,
            wait_ms,
            transfer_ms,
            compute_ms,
            wait_share: share(wait_ms),
            transfer_share: share(transfer_ms),
            compute_share: share(compute_ms),
            from_step: phase.map(|p| p.first_step),
            startup_compute_ms: startup_compute.filter(|_| phase.is_none()).map(ms),
            changed_at,
            validate_ms: ms(self.validate_ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::testing::{span, span_record, step};
    use crate::aggregate::{Aggregator, RunSettings};
    use probes::{Event, NONE};

    #[test]
    fn a_one_off_first_compute_is_left_out_of_the_split() {
        let ms = 1_000_000;
        // (first compute, later computes, expected compute mean, one-off?)
        let table: [(u64, &[u64], f64, bool); 4] = [
            (800, &[5, 5, 5, 5], 5.0, true),
            // Not past 3× the median: a normal step.
            (12, &[5, 5, 5, 5], 6.4, false),
            // Too few steps to judge.
            (800, &[5], 402.5, false),
            (5, &[5, 5, 5], 5.0, false),
        ];
        for (first, rest, mean, one_off) in table {
            let mut a = Aggregator::new(RunSettings::default());
            let mut t = 0;
            for (k, c) in std::iter::once(&first).chain(rest).enumerate() {
                a.push(&span(Stage::Wait, t, ms, NONE));
                a.push(&Event::Span(SpanRecord { step: k as u64, ..span_record(Stage::Compute, t + ms, c * ms) }));
                t += (c + 1) * ms;
            }
            let sp = a.summary().split;
            assert!((sp.compute_ms - mean).abs() < 1e-9, "first {first}: {sp:?}");
            assert_eq!(sp.startup_compute_ms.is_some(), one_off, "first {first}");
        }
        assert!(startup_compute_one_off(31, 3, 10));
        assert!(!startup_compute_one_off(30, 3, 10));
        assert!(!startup_compute_one_off(31, 2, 10));
    }

    #[test]
    fn validation_after_training_began_is_timed_apart() {
        // Two epochs of 4 steps (10 ms each, 4 images), an eval pass of 40 ms between them;
        // one before training (a sanity check) is outside the rate's clock from the start.
        let ms = 1_000_000;
        let mut a = Aggregator::new(RunSettings::default());
        a.push(&span(Stage::Validate, 0, 30 * ms, NONE));
        let mut t = 100 * ms;
        for k in 0..8u64 {
            a.push(&span(Stage::Wait, t, ms, NONE));
            a.push(&Event::Span(SpanRecord { step: k, ..span_record(Stage::Compute, t + ms, 9 * ms) }));
            a.push(&step(k, (k / 4) as u32, 1.0, 1, t + 10 * ms));
            t += 10 * ms;
            if k == 3 {
                a.push(&span(Stage::Validate, t, 40 * ms, NONE));
                t += 40 * ms;
            }
        }
        let s = a.summary();
        assert!((s.split.validate_ms - 40.0).abs() < 1e-9, "{:?}", s.split);
        // The run's clock holds 120 ms for 32 images; training took 80 of them (the training
        // rate, `diagnose::measured_now`, leaves the 40 out).
        assert!((s.images_per_s - 32.0 / 0.120).abs() < 1e-6, "{}", s.images_per_s);
    }

    #[test]
    fn step_split_adds_up_and_reports_wait_share() {
        let mut a = Aggregator::new(RunSettings::default());
        let ms = 1_000_000;
        for k in 0..4u64 {
            let t0 = k * 10 * ms;
            // The first wait fills the queue: start-up, left out of the split.
            a.push(&span(Stage::Wait, t0, if k == 0 { 50 * ms } else { 3 * ms }, NONE));
            a.push(&span(Stage::Transfer, t0 + 3 * ms, ms, ms));
            a.push(&span(Stage::Compute, t0 + 4 * ms, 6 * ms, 6 * ms));
            a.push(&span(Stage::Forward, t0 + 4 * ms, 2 * ms, NONE));
        }
        let s = a.summary().split;
        assert!((s.startup_wait_ms - 50.0).abs() < 1e-9);
        assert!((s.wait_share - 0.3).abs() < 1e-9, "{s:?}");
        assert!((s.wait_share + s.transfer_share + s.compute_share - 1.0).abs() < 1e-9);
        assert!((s.mean_step_ms - 10.0).abs() < 1e-9);
    }

    #[test]
    fn after_a_workers_change_the_split_covers_the_new_pipeline_only() {
        let mut a = Aggregator::new(RunSettings::default());
        let ms = 1_000_000;
        let mut t = 0;
        let mut steps = |a: &mut Aggregator, n: u64, wait: u64, refill: u64| {
            for k in 0..n {
                let w = if k == 0 { refill } else { wait };
                a.push(&span(Stage::Wait, t, w * ms, NONE));
                a.push(&span(Stage::Compute, t + w * ms, 10 * ms, NONE));
                a.push(&step(k, 0, 1.0, 1, t + (w + 10) * ms));
                t += (w + 10) * ms;
            }
        };
        steps(&mut a, 6, 90, 90);
        a.push(&Event::Workers { workers: 4, reason: "trying 4".into(), settled: false });
        steps(&mut a, 2, 0, 50);
        let short = a.summary().split;
        assert_eq!(short.from_step, None, "too few steps since the change: the run");
        assert_eq!(short.changed_at, Some(6), "the change is marked");
        assert!(short.wait_ms > 50.0, "the whole run's waits, not the 2 steps': {short:?}");
        steps(&mut a, MIN_PHASE_STEPS - 2, 0, 0);
        let s = a.summary().split;
        assert_eq!((s.from_step, s.changed_at), (Some(6), None));
        assert!(
            s.wait_ms.abs() < 1e-9 && (s.compute_ms - 10.0).abs() < 1e-9,
            "the refill after the change is left out: {s:?}"
        );
    }
}
