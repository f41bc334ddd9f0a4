//! Per-stage statistics: count, wall and CPU time, run-queue wait, bytes and a latency
//! histogram for each [`Stage`]. Pure.

use hdrhistogram::Histogram;
use probes::{SpanRecord, Stage, NONE};
use serde::{Deserialize, Serialize};

/// Statistics of one stage.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct StageSummary {
    /// Written as its name (`"decode"`); a name no stage has does not read.
    pub stage: Stage,
    pub count: u64,
    pub total_ms: f64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub max_ms: f64,
    /// On-CPU share of wall time where measured (0–1), or None.
    pub on_cpu: Option<f64>,
    /// Share of wall time the thread was runnable but had no core (run-queue wait: other
    /// threads or processes held the cores), where measured (0–1), or None.
    #[serde(default)]
    pub core_wait: Option<f64>,
    pub bytes: u64,
    /// Per sample for loader stages, per step for the others.
    pub per_second: f64,
    /// Mean of the middle spans, ms: the shortest and the longest [`TRIM_SHARE`] left out, so
    /// one slow file or one preempted span does not move a per-image cost (from the
    /// histogram, 2 significant digits). `None` in summaries written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trimmed_mean_ms: Option<f64>,
}

impl StageSummary {
    /// Share of wall time off-CPU and not waiting for a core: blocked on storage, a lock, a
    /// page fault or a queue. None unless both on-CPU and core wait were measured.
    pub fn blocked(&self) -> Option<f64> {
        let (on, wait) = (self.on_cpu?, self.core_wait?);
        Some((1.0 - on - wait).clamp(0.0, 1.0))
    }

    /// Whether these are `stage`'s statistics.
    pub fn is(&self, stage: Stage) -> bool {
        self.stage == stage
    }
}

/// Share of spans left out at each end of a stage's trimmed mean.
pub const TRIM_SHARE: f64 = 0.05;

/// The mean of a histogram's values with the lowest and highest `trim` share of the count left
/// out (at least one value kept). Pure.
pub fn trimmed_mean(h: &Histogram<u64>, trim: f64) -> Option<f64> {
    let n = h.len();
    if n == 0 {
        return None;
    }
    let cut = ((n as f64 * trim.clamp(0.0, 0.49)).floor() as u64).min((n - 1) / 2);
    let (lo, hi) = (cut, n - cut);
    let (mut rank, mut sum, mut kept) = (0u64, 0.0f64, 0u64);
    for v in h.iter_recorded() {
        let c = v.count_at_value();
        let (a, b) = (rank.max(lo), (rank + c).min(hi));
        rank += c;
        if b > a {
            sum += h.median_equivalent(v.value_iterated_to()) as f64 * (b - a) as f64;
            kept += b - a;
        }
    }
    (kept > 0).then(|| sum / kept as f64)
}

/// `part / whole`, at most 1, where `whole` was measured.
pub(super) fn share(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| (part as f64 / whole as f64).min(1.0))
}

struct StageAgg {
    count: u64,
    wall_ns: u64,
    cpu_ns: u64,
    cpu_wall_ns: u64,
    /// Run-queue wait and the wall time of the spans that measured both it and CPU time.
    queue_ns: u64,
    queue_wall_ns: u64,
    bytes: u64,
    hist: Histogram<u64>,
    /// The longest span past the histogram's 1-hour bound (0: none): such spans are recorded
    /// at the bound, and this keeps the reported max true.
    longest_over: u64,
}

impl StageAgg {
    fn new() -> StageAgg {
        // 1 ns … 1 hour at 2 significant digits: a few KB per stage, whatever the run length.
        #[allow(clippy::expect_used)]
        let hist = Histogram::new_with_bounds(1, 3_600_000_000_000, 2).expect("constant bounds are valid");
        StageAgg {
            count: 0,
            wall_ns: 0,
            cpu_ns: 0,
            cpu_wall_ns: 0,
            queue_ns: 0,
            queue_wall_ns: 0,
            bytes: 0,
            hist,
            longest_over: 0,
        }
    }

    fn push(&mut self, s: &SpanRecord) {
        self.count += 1;
        self.wall_ns += s.dur_ns;
        if s.cpu_ns != NONE {
            // Thread CPU clocks tick coarser than the monotonic clock: cap at wall time.
            self.cpu_ns += s.cpu_ns.min(s.dur_ns);
            self.cpu_wall_ns += s.dur_ns;
            if s.queue_ns != NONE {
                // Waiting for a core is part of the off-CPU time: never more than it.
                let off = s.dur_ns - s.cpu_ns.min(s.dur_ns);
                self.queue_ns += s.queue_ns.min(off);
                self.queue_wall_ns += s.dur_ns;
            }
        }
        if s.bytes != NONE {
            self.bytes += s.bytes;
        }
        let v = s.dur_ns.max(1);
        if v > self.hist.high() {
            self.longest_over = self.longest_over.max(v);
        }
        // Saturating: a span over an hour counts (at the bound) instead of being dropped.
        self.hist.saturating_record(v);
    }

    /// `stage`'s statistics over a run of `elapsed_ns`.
    fn summary(&self, stage: Stage, elapsed_ns: u64) -> StageSummary {
        let ms = |ns: u64| ns as f64 / 1e6;
        StageSummary {
            stage,
            count: self.count,
            total_ms: ms(self.wall_ns),
            mean_ms: ms(self.wall_ns) / self.count as f64,
            p50_ms: ms(self.hist.value_at_quantile(0.5)),
            p95_ms: ms(self.hist.value_at_quantile(0.95)),
            max_ms: ms(self.hist.max().max(self.longest_over)),
            on_cpu: share(self.cpu_ns, self.cpu_wall_ns),
            core_wait: share(self.queue_ns, self.queue_wall_ns),
            bytes: self.bytes,
            per_second: if elapsed_ns > 0 { self.count as f64 / (elapsed_ns as f64 / 1e9) } else { 0.0 },
            trimmed_mean_ms: trimmed_mean(&self.hist, TRIM_SHARE).map(|ns| ns / 1e6),
        }
    }
}

/// Every stage's accumulator, in [`Stage::ALL`] order. Memory is bounded: one histogram each.
pub(super) struct Stages {
    aggs: Vec<StageAgg>,
}

impl Stages {
    pub(super) fn new() -> Stages {
        Stages { aggs: Stage::ALL.iter().map(|_| StageAgg::new()).collect() }
    }

    pub(super) fn push(&mut self, s: &SpanRecord) {
        self.aggs[s.stage.index()].push(s);
    }

    /// Wall time of `stage`'s spans, ns.
    pub(super) fn wall_ns(&self, stage: Stage) -> u64 {
        self.aggs[stage.index()].wall_ns
    }

    /// Spans of `stage` closed.
    pub(super) fn count(&self, stage: Stage) -> u64 {
        self.aggs[stage.index()].count
    }

    /// The median span of `stage`, ns (0 without spans).
    pub(super) fn median_ns(&self, stage: Stage) -> u64 {
        self.aggs[stage.index()].hist.value_at_quantile(0.5)
    }

    /// Loader threads' busy share: loader-stage wall time / (`workers` × `elapsed_ns`).
    pub(super) fn loader_busy(&self, workers: usize, elapsed_ns: u64) -> f64 {
        let loader_ns: u64 = Stage::ALL.iter().filter(|s| s.is_loader()).map(|s| self.wall_ns(*s)).sum();
        let workers = workers.max(1) as f64;
        if elapsed_ns > 0 {
            (loader_ns as f64 / (workers * elapsed_ns as f64)).min(1.0)
        } else {
            0.0
        }
    }

    /// The stages that had spans, in pipeline order, over a run of `elapsed_ns`.
    pub(super) fn summary(&self, elapsed_ns: u64) -> Vec<StageSummary> {
        Stage::ALL
            .iter()
            .zip(&self.aggs)
            .filter(|(_, a)| a.count > 0)
            .map(|(st, a)| a.summary(*st, elapsed_ns))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::testing::{span, timed};
    use crate::aggregate::{Aggregator, RunSettings};

    #[test]
    fn the_trimmed_mean_leaves_the_slowest_and_fastest_spans_out() {
        let h = |values: &[u64]| {
            let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 2).unwrap();
            values.iter().for_each(|v| h.record(*v).unwrap());
            h
        };
        // 19 spans of 100 and one of 100 000: the mean is 5 095, the trimmed mean 100.
        let mut v = vec![100u64; 19];
        v.push(100_000);
        let t = trimmed_mean(&h(&v), 0.05).unwrap();
        assert!((t - 100.0).abs() < 1.0, "{t}");
        // Too few values to trim: the plain mean (within the histogram's precision).
        let t = trimmed_mean(&h(&[100, 300]), 0.05).unwrap();
        assert!((t - 200.0).abs() < 2.0, "{t}");
        assert_eq!(trimmed_mean(&h(&[]), 0.05), None);
        // A whole stage: the summary carries it.
        let mut a = Aggregator::new(RunSettings::default());
        for (i, d) in v.iter().enumerate() {
            a.push(&span(Stage::Decode, i as u64 * 1_000_000, *d, *d));
        }
        let s = a.summary();
        let d = s.stages.iter().find(|x| x.is(Stage::Decode)).unwrap();
        assert!(d.mean_ms > 0.005 && d.trimmed_mean_ms.is_some_and(|t| (t - 0.0001).abs() < 1e-5), "{d:?}");
    }

    #[test]
    fn off_cpu_time_splits_into_core_wait_and_blocked() {
        let mut a = Aggregator::new(RunSettings { workers: 1, ..Default::default() });
        // 10 ms read: 2 on-CPU, 5 waiting for a core, 3 blocked; then 10 ms: 2 on, 1 waiting.
        a.push(&timed(Stage::Read, 10_000_000, 2_000_000, 5_000_000));
        a.push(&timed(Stage::Read, 10_000_000, 2_000_000, 1_000_000));
        let r = &a.summary().stages[0];
        assert_eq!(r.on_cpu, Some(0.2));
        assert_eq!(r.core_wait, Some(0.3));
        assert!((r.blocked().unwrap() - 0.5).abs() < 1e-12, "{r:?}");
    }

    #[test]
    fn core_wait_is_capped_at_off_cpu_time_and_absent_when_unmeasured() {
        let mut a = Aggregator::new(RunSettings { workers: 1, ..Default::default() });
        // The run-queue counter can include a wait that ended just before the span: cap it.
        a.push(&timed(Stage::Decode, 10_000_000, 8_000_000, 6_000_000));
        a.push(&timed(Stage::Resize, 10_000_000, 8_000_000, NONE));
        let s = a.summary();
        assert_eq!(s.stages[0].core_wait, Some(0.2));
        assert_eq!(s.stages[0].blocked(), Some(0.0));
        assert_eq!((s.stages[1].core_wait, s.stages[1].blocked()), (None, None));
    }

    #[test]
    fn stage_statistics_come_from_spans() {
        let mut a = Aggregator::new(RunSettings { workers: 1, ..Default::default() });
        for i in 0..10u64 {
            a.push(&span(Stage::Decode, i * 1_000_000, 1_000_000, 250_000));
        }
        let s = a.summary();
        let d = &s.stages[0];
        assert_eq!((d.stage, d.count), (Stage::Decode, 10));
        assert!((d.mean_ms - 1.0).abs() < 1e-9);
        assert!((d.p95_ms - 1.0).abs() < 0.02, "{}", d.p95_ms);
        assert_eq!(d.on_cpu, Some(0.25));
        assert!((s.loader_busy - 1.0).abs() < 1e-9, "the single worker decoded all the time");
    }

    #[test]
    fn a_stage_is_written_by_its_name_and_read_back_typed() {
        let mut a = Aggregator::new(RunSettings::default());
        a.push(&span(Stage::Optimizer, 0, 1_000_000, NONE));
        let s = &a.summary().stages[0];
        let json = serde_json::to_value(s).unwrap();
        assert_eq!(json["stage"], "optimizer");
        assert_eq!(serde_json::from_value::<StageSummary>(json.clone()).unwrap(), *s);
        let mut bogus = json;
        bogus["stage"] = "teleport".into();
        assert!(serde_json::from_value::<StageSummary>(bogus).is_err(), "a stage no pipeprof has");
    }

    #[test]
    fn spans_over_an_hour_are_counted_and_keep_their_true_max() {
        let mut a = Aggregator::new(RunSettings { workers: 1, ..Default::default() });
        let two_hours = 7_200_000_000_000u64;
        a.push(&span(Stage::Decode, 0, 1_000_000, 0));
        a.push(&span(Stage::Decode, 0, two_hours, 0));
        let s = a.summary();
        let d = &s.stages[0];
        assert_eq!(d.count, 2);
        assert_eq!(d.max_ms, two_hours as f64 / 1e6);
        assert!(d.p95_ms >= 3_590_000.0, "recorded at the 1-hour bound, not dropped: {}", d.p95_ms);
    }
}
