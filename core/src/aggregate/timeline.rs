//! The run over time, in a bounded number of buckets: steps, the step split, images/s, process
//! CPU and GPU utilisation. Charts of a finished run read it from the summary. Pure.
//!
//! Buckets start [`FIRST_WIDTH_NS`] wide. When the run outgrows [`MAX_BUCKETS`], neighbours
//! are merged pairwise and the width doubles ([`merge_pairs`]), so memory stays the same for
//! any run length and the buckets always cover the whole run.

use probes::sampler::GpuStatus;
use probes::{Event, Stage};
use serde::{Deserialize, Serialize};

/// Buckets kept at most.
pub const MAX_BUCKETS: usize = 120;
/// Width of a bucket until the run outgrows [`MAX_BUCKETS`]: 250 ms (about one host sample
/// in each at the default 5 Hz), so a 30 s run is charted at full width.
pub const FIRST_WIDTH_NS: u64 = 250_000_000;

/// One bucket of the run's timeline, as the summary carries it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(default)]
pub struct TimelineBucket {
    /// Start, seconds after the first event the timeline saw.
    pub t_s: f64,
    /// Width, s: the last bucket's ends with the run's last event.
    pub width_s: f64,
    /// Training steps that ended in it.
    pub steps: u64,
    /// Mean wait for data per step, ms (the spans that ended in it).
    pub wait_ms: f64,
    /// Mean host → device transfer per step, ms.
    pub transfer_ms: f64,
    /// Mean compute per step, ms.
    pub compute_ms: f64,
    /// Training images per second of the bucket.
    pub images_per_s: f64,
    /// Mean CPU % of the profiled process (100 = one core); `None`: no host sample in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_pct: Option<f64>,
    /// Mean GPU utilisation % of the run's GPUs (those NVML lists the run's processes on, else
    /// every GPU); `None`: no GPU sample in it (no GPU, or GPU sampling off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_util_pct: Option<f64>,
}

/// What one bucket has summed so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Acc {
    pub steps: u64,
    pub images: u64,
    pub wait_ns: u64,
    pub waits: u64,
    pub transfer_ns: u64,
    pub transfers: u64,
    pub compute_ns: u64,
    pub computes: u64,
    pub cpu_sum: f64,
    pub cpu_n: u64,
    pub gpu_sum: f64,
    pub gpu_n: u64,
}

impl Acc {
    /// The sum of two buckets: the bucket twice as wide that covers both.
    pub fn add(&self, o: &Acc) -> Acc {
        Acc {
            steps: self.steps.saturating_add(o.steps),
            images: self.images.saturating_add(o.images),
            wait_ns: self.wait_ns.saturating_add(o.wait_ns),
            waits: self.waits.saturating_add(o.waits),
            transfer_ns: self.transfer_ns.saturating_add(o.transfer_ns),
            transfers: self.transfers.saturating_add(o.transfers),
            compute_ns: self.compute_ns.saturating_add(o.compute_ns),
            computes: self.computes.saturating_add(o.computes),
            cpu_sum: self.cpu_sum + o.cpu_sum,
            cpu_n: self.cpu_n.saturating_add(o.cpu_n),
            gpu_sum: self.gpu_sum + o.gpu_sum,
            gpu_n: self.gpu_n.saturating_add(o.gpu_n),
        }
    }
}

/// Buckets `2i` and `2i + 1` summed into bucket `i` (an odd last one stays alone): the same
/// run in buckets twice as wide. Pure.
fn merge_pairs(buckets: &[Acc]) -> Vec<Acc> {
    buckets.chunks(2).map(|p| p.iter().fold(Acc::default(), |a, b| a.add(b))).collect()
}

/// The bucket a time falls in, on a grid starting at `origin` `width` wide. Pure.
fn index(t_ns: u64, origin: u64, width: u64) -> usize {
    usize::try_from(t_ns.saturating_sub(origin) / width.max(1)).unwrap_or(usize::MAX)
}

/// Accumulates the timeline (the aggregate hands it every event).
#[derive(Debug, Clone)]
pub struct Timeline {
    /// Start of bucket 0, monotonic ns (`None`: nothing seen yet).
    origin: Option<u64>,
    width: u64,
    buckets: Vec<Acc>,
    /// The latest time seen: where the last bucket ends.
    last_ns: u64,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline { origin: None, width: FIRST_WIDTH_NS, buckets: Vec::new(), last_ns: 0 }
    }
}

impl Timeline {
    /// Takes what the timeline charts from one event (ranked and batched events come unpacked).
    pub fn push(&mut self, ev: &Event) {
        match ev {
            Event::Span(s) => {
                let Some(b) = self.at(s.end_ns()) else { return };
                match s.stage {
                    Stage::Wait => (b.wait_ns, b.waits) = (b.wait_ns.saturating_add(s.dur_ns), b.waits + 1),
                    Stage::Transfer => {
                        (b.transfer_ns, b.transfers) = (b.transfer_ns.saturating_add(s.dur_ns), b.transfers + 1)
                    }
                    Stage::Compute => {
                        (b.compute_ns, b.computes) = (b.compute_ns.saturating_add(s.dur_ns), b.computes + 1)
                    }
                    _ => {}
                }
            }
            Event::Step(st) if !st.validation => {
                if let Some(b) = self.at(st.end_ns) {
                    (b.steps, b.images) = (b.steps + 1, b.images.saturating_add(u64::from(st.images)));
                }
            }
            Event::Host(h) if h.process_cpu_pct.is_finite() => {
                if let Some(b) = self.at(h.t_ns) {
                    (b.cpu_sum, b.cpu_n) = (b.cpu_sum + f64::from(h.process_cpu_pct), b.cpu_n + 1);
                }
            }
            Event::Gpu(g) if g.status == GpuStatus::Ok => {
                let ours = g.devices.iter().any(|d| d.this_process_on_gpu == Some(true));
                let utils: Vec<f64> = g
                    .devices
                    .iter()
                    .filter(|d| !ours || d.this_process_on_gpu == Some(true))
                    .filter_map(|d| d.util_pct.filter(|u| u.is_finite()).map(f64::from))
                    .collect();
                if utils.is_empty() {
                    return;
                }
                if let Some(b) = self.at(g.t_ns) {
                    let mean = utils.iter().sum::<f64>() / utils.len() as f64;
                    (b.gpu_sum, b.gpu_n) = (b.gpu_sum + mean, b.gpu_n + 1);
                }
            }
            _ => {}
        }
    }

    /// The bucket of time `t_ns`, the grid grown (before or after) and merged as needed;
    /// `None` for a time of 0 (never measured).
    fn at(&mut self, t_ns: u64) -> Option<&mut Acc> {
        if t_ns == 0 {
            return None;
        }
        let mut origin = *self.origin.get_or_insert(t_ns);
        // An event from before the first one seen (events arrive batched): whole buckets in
        // front, on the same grid, merged first when they would not fit.
        while t_ns < origin {
            let front = (origin - t_ns).div_ceil(self.width);
            if front.saturating_add(self.buckets.len() as u64) <= MAX_BUCKETS as u64 {
                origin = origin.saturating_sub(front * self.width);
                let mut grown = vec![Acc::default(); front as usize];
                grown.append(&mut self.buckets);
                self.buckets = grown;
                self.origin = Some(origin);
            } else {
                self.merge();
            }
        }
        self.last_ns = self.last_ns.max(t_ns);
        let mut i = index(t_ns, origin, self.width);
        while i >= MAX_BUCKETS {
            self.merge();
            i = index(t_ns, origin, self.width);
        }
        if self.buckets.len() <= i {
            self.buckets.resize(i + 1, Acc::default());
        }
        self.buckets.get_mut(i)
    }

    /// The same run in buckets twice as wide.
    fn merge(&mut self) {
        self.buckets = merge_pairs(&self.buckets);
        self.width = self.width.saturating_mul(2);
    }

    /// The buckets as the summary carries them (empty when nothing was seen).
    pub fn buckets(&self) -> Vec<TimelineBucket> {
        let Some(origin) = self.origin else { return Vec::new() };
        let n = self.buckets.len();
        self.buckets
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let start = origin.saturating_add(self.width.saturating_mul(i as u64));
                let end = if i + 1 == n { self.last_ns.max(start) } else { start.saturating_add(self.width) };
                bucket(a, (start - origin) as f64 / 1e9, (end - start) as f64 / 1e9)
            })
            .collect()
    }
}

/// One summed bucket's means and rate. Pure.
pub fn bucket(a: &Acc, t_s: f64, width_s: f64) -> TimelineBucket {
    let mean_ms = |ns: u64, n: u64| if n > 0 { ns as f64 / 1e6 / n as f64 } else { 0.0 };
    TimelineBucket {
        t_s,
        width_s,
        steps: a.steps,
        wait_ms: mean_ms(a.wait_ns, a.waits),
        transfer_ms: mean_ms(a.transfer_ns, a.transfers),
        compute_ms: mean_ms(a.compute_ns, a.computes),
        images_per_s: if width_s > 0.0 { a.images as f64 / width_s } else { 0.0 },
        cpu_pct: (a.cpu_n > 0).then(|| a.cpu_sum / a.cpu_n as f64),
        gpu_util_pct: (a.gpu_n > 0).then(|| a.gpu_sum / a.gpu_n as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use probes::sampler::{GpuDevice, GpuSample, HostSample};
    use probes::{SpanRecord, StepRecord, NONE};

    fn acc(steps: u64, wait_ns: u64, cpu: Option<f64>) -> Acc {
        Acc {
            steps,
            images: steps * 4,
            wait_ns,
            waits: steps,
            cpu_sum: cpu.unwrap_or(0.0),
            cpu_n: u64::from(cpu.is_some()),
            ..Default::default()
        }
    }

    #[test]
    fn merging_sums_neighbours_pairwise_and_keeps_an_odd_last_one_alone() {
        // (buckets in, buckets out)
        let table: Vec<(Vec<Acc>, Vec<Acc>)> = vec![
            (vec![], vec![]),
            (vec![acc(1, 10, None)], vec![acc(1, 10, None)]),
            (
                vec![acc(1, 10, Some(50.0)), acc(2, 30, Some(150.0))],
                vec![{
                    let mut a = acc(3, 40, None);
                    (a.cpu_sum, a.cpu_n) = (200.0, 2);
                    a
                }],
            ),
            (
                vec![acc(1, 10, None), acc(0, 0, None), acc(5, 50, Some(80.0))],
                vec![acc(1, 10, None), acc(5, 50, Some(80.0))],
            ),
            (
                vec![acc(1, 1, None), acc(1, 1, None), acc(2, 2, None), acc(2, 2, None)],
                vec![acc(2, 2, None), acc(4, 4, None)],
            ),
        ];
        for (input, want) in table {
            assert_eq!(merge_pairs(&input), want, "{input:?}");
        }
    }

    #[test]
    fn a_bucket_reads_as_means_per_step_a_rate_and_samples_or_none() {
        let a = Acc {
            steps: 4,
            images: 128,
            wait_ns: 8_000_000,
            waits: 4,
            transfer_ns: 0,
            transfers: 0,
            compute_ns: 12_000_000,
            computes: 3,
            cpu_sum: 300.0,
            cpu_n: 2,
            gpu_sum: 0.0,
            gpu_n: 0,
        };
        let b = bucket(&a, 1.0, 0.5);
        assert_eq!((b.t_s, b.width_s, b.steps), (1.0, 0.5, 4));
        assert_eq!((b.wait_ms, b.transfer_ms, b.compute_ms), (2.0, 0.0, 4.0));
        assert_eq!(b.images_per_s, 256.0);
        assert_eq!((b.cpu_pct, b.gpu_util_pct), (Some(150.0), None));
        assert_eq!(bucket(&Acc::default(), 0.0, 0.0).images_per_s, 0.0, "an empty last bucket");
    }

    const S: u64 = 1_000_000_000;

    fn record(end_ns: u64, validation: bool) -> StepRecord {
        StepRecord {
            step: 1,
            epoch: 0,
            images: 8,
            loss: 1.0,
            correct: 0,
            end_ns,
            queued: 0,
            validation,
            no_loss: false,
        }
    }

    fn step(end_ns: u64) -> Event {
        Event::Step(record(end_ns, false))
    }

    fn span(stage: Stage, end_ns: u64, dur_ns: u64) -> Event {
        let (thread, cpu_ns, queue_ns, step, sample, bytes) = (1, NONE, NONE, 0, NONE, NONE);
        Event::Span(SpanRecord {
            stage,
            thread,
            start_ns: end_ns - dur_ns,
            dur_ns,
            cpu_ns,
            queue_ns,
            step,
            sample,
            bytes,
        })
    }

    #[test]
    fn a_long_run_stays_within_the_bucket_cap_and_covers_the_whole_run() {
        let mut t = Timeline::default();
        // One step every 100 ms for an hour.
        let steps = 36_000u64;
        for i in 0..steps {
            let end = 10 * S + i * S / 10;
            t.push(&span(Stage::Wait, end - S / 20, S / 100));
            t.push(&span(Stage::Compute, end, S / 20));
            t.push(&step(end));
        }
        let b = t.buckets();
        assert!(b.len() <= MAX_BUCKETS && b.len() > MAX_BUCKETS / 2, "{}", b.len());
        assert_eq!(b.iter().map(|x| x.steps).sum::<u64>(), steps, "no step lost in the merges");
        let last = b.last().unwrap();
        // From the first wait (9.95 s) to the last step (3609.9 s).
        assert!((last.t_s + last.width_s - 3599.95).abs() < 1e-6, "ends with the last step: {last:?}");
        // Every full bucket: the same means and rate as the steps themselves.
        for x in &b[..b.len() - 1] {
            assert!((x.wait_ms - 10.0).abs() < 1e-9 && (x.compute_ms - 50.0).abs() < 1e-9, "{x:?}");
            assert!((x.images_per_s - 80.0).abs() < 1e-6, "{x:?}");
        }
    }

    #[test]
    fn early_events_arriving_late_grow_the_grid_in_front() {
        let mut t = Timeline::default();
        t.push(&step(100 * S));
        // A batch of spans from a second earlier, sent after the step.
        t.push(&span(Stage::Wait, 99 * S, S / 10));
        let b = t.buckets();
        assert_eq!(b.len(), 5, "{b:?}");
        assert_eq!((b[0].t_s, b[0].wait_ms), (0.0, 100.0));
        assert_eq!((b[4].t_s, b[4].steps), (1.0, 1));
        // 98 s earlier still: 392 buckets of 250 ms in front would not fit; 1 s ones do.
        t.push(&step(S));
        let b = t.buckets();
        assert_eq!(b.len(), 100, "{b:?}");
        assert_eq!((b[0].width_s, b[0].steps, b[98].wait_ms, b[99].steps), (1.0, 1, 100.0, 1));
    }

    #[test]
    fn samples_fill_cpu_and_the_runs_own_gpus_and_validation_steps_are_left_out() {
        let mut t = Timeline::default();
        t.push(&Event::Host(Box::new(HostSample { t_ns: S, process_cpu_pct: 250.0, ..Default::default() })));
        let dev = |index, util, ours| GpuDevice {
            index,
            util_pct: Some(util),
            this_process_on_gpu: ours,
            ..Default::default()
        };
        // GPU 1 is the run's: GPU 0's 0% (another user's idle card) is not averaged in.
        t.push(&Event::Gpu(Box::new(GpuSample {
            t_ns: S,
            status: GpuStatus::Ok,
            devices: vec![dev(0, 0.0, Some(false)), dev(1, 90.0, Some(true))],
        })));
        t.push(&Event::Gpu(Box::new(GpuSample::off(S, "no NVML"))));
        t.push(&Event::Step(record(S, true)));
        let b = t.buckets();
        assert_eq!(b.len(), 1);
        assert_eq!((b[0].cpu_pct, b[0].gpu_util_pct, b[0].steps), (Some(250.0), Some(90.0), 0));
        // Nobody's process listed: every GPU counts.
        let mut t = Timeline::default();
        t.push(&Event::Gpu(Box::new(GpuSample {
            t_ns: S,
            status: GpuStatus::Ok,
            devices: vec![dev(0, 20.0, None), dev(1, 60.0, None)],
        })));
        assert_eq!(t.buckets()[0].gpu_util_pct, Some(40.0));
        assert!(Timeline::default().buckets().is_empty());
    }
}
