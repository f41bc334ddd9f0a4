//! Events → per-stage statistics. Pure: no clocks, no I/O, no threads; time comes from events.

use hdrhistogram::Histogram;
use probes::fsinfo::FsInfo;
pub mod machine;
pub mod ranks;
pub mod settings;
pub mod timeline;

pub use settings::RunSettings;

use machine::{MachineAgg, MachineSummary};
use probes::{Event, LayerRecord, SpanRecord, Stage, StepRecord, NONE};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// Recent steps kept for windowed statistics (bounded whatever the run length).
pub const RECENT_STEPS: usize = 4096;
/// Skipped files listed by path; more are only counted.
pub const MAX_SKIPPED_LISTED: usize = 200;

/// Version of the summary JSON schema.
pub const SUMMARY_SCHEMA_VERSION: u32 = 1;

/// Threads with their own loader statistics; later ones are counted together (a run whose
/// worker processes restart every epoch brings new threads each time).
pub const MAX_LOADER_THREADS: usize = 256;
/// Stalls listed at most (one per thread and file).
pub const MAX_STALLS: usize = 32;
/// The id under which threads past [`MAX_LOADER_THREADS`] are counted.
pub const OTHER_THREADS: u32 = u32::MAX;
/// Threads whose rank is kept, at most.
pub const MAX_RANKED_THREADS: usize = 1 << 16;

/// Layers with their own timings (a model's layers; more are left out).
pub const MAX_LAYERS: usize = 256;

/// Recent per-step timings kept for charts.
pub const RECENT_POINTS: usize = 1024;

/// Epochs listed one by one at each end of the epoch table; the ones between are summed into
/// one row (a loop that calls `next(iter(loader))` every step starts an epoch per step).
pub const EPOCHS_KEPT: usize = 50;
/// Longest thread name, skipped path or reason kept (characters).
pub const MAX_TEXT: usize = 1024;

/// Thread names kept (a run whose worker processes restart every epoch names new threads
/// each time); later threads are shown by id.
pub const MAX_THREAD_NAMES: usize = 4 * MAX_LOADER_THREADS;

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

/// One training step's split, from its spans (for charts).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct StepPoint {
    pub step: u64,
    /// End of the step's compute, monotonic ns.
    pub end_ns: u64,
    pub wait_ns: u64,
    pub transfer_ns: u64,
    pub compute_ns: u64,
}

/// What live views read: the summary plus bounded recent series.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub summary: Summary,
    /// Recent steps' wait / transfer / compute, oldest first.
    pub steps: Vec<StepPoint>,
    /// Recent step records (loss, images, queue occupancy), oldest first.
    pub records: Vec<StepRecord>,
    /// Recent host samples, oldest first.
    pub host: Vec<machine::HostPoint>,
    /// Recent GPU samples, oldest first.
    pub gpu: Vec<machine::GpuPoint>,
    /// Monotonic ns of the newest event seen.
    pub now_ns: u64,
}

/// A message from another process (a failure, with its traceback's last line): line breaks
/// kept, other control characters replaced, at most 16 × [`MAX_TEXT`] characters.
pub fn clean_text(text: &str) -> String {
    text.split('\n')
        .map(|l| settings::clean_name(l, 16 * MAX_TEXT))
        .collect::<Vec<_>>()
        .join("\n")
        .chars()
        .take(16 * MAX_TEXT)
        .collect()
}

/// One layer's mean forward and backward time per step (pipeprof's own model).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LayerSummary {
    pub name: String,
    pub forward_ms: f64,
    pub backward_ms: f64,
}

/// One part of the compute step: a layer's forward or backward pass, or the optimizer.
#[derive(Debug, Clone, PartialEq)]
pub struct ComputePart {
    /// `dense_1 backward`, `optimizer`.
    pub label: String,
    /// Mean per step, ms.
    pub ms: f64,
    /// Share of the mean compute step.
    pub share: f64,
}

#[derive(Default)]
struct LayerAgg {
    name: String,
    forward_ns: u64,
    forwards: u64,
    backward_ns: u64,
    backwards: u64,
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
}

/// Statistics of one stage.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StageSummary {
    pub stage: String,
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

impl StageSummary {
    /// Share of wall time off-CPU and not waiting for a core: blocked on storage, a lock, a
    /// page fault or a queue. None unless both on-CPU and core wait were measured.
    pub fn blocked(&self) -> Option<f64> {
        let (on, wait) = (self.on_cpu?, self.core_wait?);
        Some((1.0 - on - wait).clamp(0.0, 1.0))
    }

    /// Whether these are `stage`'s statistics (`stage` is stored by name, as serialised).
    pub fn is(&self, stage: probes::stage::Stage) -> bool {
        self.stage == stage.name()
    }
}

/// Where the training loop's time went, per step on average.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
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
}

/// A first compute this many times the median of the next ones is a start-up one-off.
pub const STARTUP_COMPUTE_RATIO: f64 = 3.0;

/// Whether the first compute of a run is a one-off to leave out of the compute mean: over
/// [`STARTUP_COMPUTE_RATIO`] × the median compute, with at least two more to judge by.
pub fn startup_compute_one_off(first_ns: u64, count: u64, median_ns: u64) -> bool {
    count >= 3 && median_ns > 0 && first_ns as f64 > STARTUP_COMPUTE_RATIO * median_ns as f64
}

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

/// A stage open past the stall threshold (see [`probes::Event::Stalled`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Stall {
    pub thread: String,
    pub stage: String,
    pub file: String,
    pub open_s: f64,
    /// The run ended without the thread: it was still stuck.
    pub abandoned: bool,
}

/// Where the loss stopped being a number: the first NaN step and the first ±inf step
/// (training steps only).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
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

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Skipped {
    pub path: String,
    pub reason: String,
}

/// One thread's loader stages (read, decode, resize, augment): a loader worker, in this
/// process or in a worker process of the run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LoaderThread {
    pub thread: u32,
    pub name: String,
    /// Loader-stage spans it closed.
    pub spans: u64,
    /// Wall time inside them, ms.
    pub busy_ms: f64,
    /// On-CPU share of that time where measured (0–1): low = waiting on I/O or the scheduler.
    pub on_cpu: Option<f64>,
    /// Times this worker was started: a DataLoader without `persistent_workers` starts its
    /// workers again each epoch (a new process, a new pid), pipeprof's `--workers auto` each
    /// change. All of them are one row, named for the worker, not the process.
    #[serde(default = "one")]
    pub starts: u32,
}

fn one() -> u32 {
    1
}

/// The worker a loader thread's name stands for: the name without the process id its label
/// carries (`loader-1 (pid 42)` → `loader-1`, `loader-0 (rank 1, pid 7)` → `loader-0 (rank
/// 1)`) and without a generation (`loader-0.2` → `loader-0`). Threads of one worker restarted
/// share it.
pub fn worker_role(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(open) = rest.find(" (") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let Some(close) = after.find(')') else {
            out.push_str(&rest[open..]);
            rest = "";
            break;
        };
        let kept: Vec<&str> = after[..close]
            .split(", ")
            .filter(|part| !part.strip_prefix("pid ").is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit())))
            .collect();
        if !kept.is_empty() {
            out.push_str(" (");
            out.push_str(&kept.join(", "));
            out.push(')');
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    // `loader-N.G`: pipeprof's own loader's generation G of worker N.
    if let Some((base, generation)) = out.rsplit_once('.') {
        let worker =
            base.strip_prefix("loader-").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if worker && !generation.is_empty() && generation.bytes().all(|b| b.is_ascii_digit()) {
            out.truncate(base.len());
        }
    }
    out
}

#[derive(Debug, Clone, Copy, Default)]
struct ThreadLoad {
    spans: u64,
    wall_ns: u64,
    cpu_ns: u64,
    cpu_wall_ns: u64,
}

/// A point-in-time view of the run: what reports, the summary JSON and views read.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Summary {
    /// Version of this JSON schema (see docs/traces-and-reports.md, "Traces, summaries and comparisons").
    pub schema_version: u32,
    pub settings: RunSettings,
    pub steps: u64,
    pub images: u64,
    pub elapsed_s: f64,
    pub images_per_s: f64,
    #[serde(with = "probes::nonfinite::option")]
    pub last_loss: Option<f64>,
    /// The first steps whose loss was not a finite number, if any: training diverged.
    pub diverged: Option<Divergence>,
    /// Stages open past the stall threshold: one per thread and file, longest seen.
    pub stalls: Vec<Stall>,
    pub stages: Vec<StageSummary>,
    pub split: StepSplit,
    /// Loader threads' busy share: loader-stage wall time / (workers × elapsed).
    pub loader_busy: f64,
    pub epochs: Vec<EpochSummary>,
    pub skipped_count: u64,
    pub skipped: Vec<Skipped>,
    pub events_received: u64,
    pub events_dropped: u64,
    pub threads: BTreeMap<u32, String>,
    /// Each loader thread's share of the loader work, busiest first.
    pub loader_threads: Vec<LoaderThread>,
    /// Mean batches waiting in the prefetch queue when a step took its batch.
    pub mean_queued: f64,
    /// What the host and GPU samplers saw.
    pub machine: MachineSummary,
    /// The filesystem holding the data folder.
    pub data_fs: Option<FsInfo>,
    /// Why the profiled program failed (an uncaught exception, a non-zero exit), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// Per layer of the model pipeprof trains, in model order (empty for other programs).
    pub layers: Vec<LayerSummary>,
    /// Mean `compute` of the steps timed layer by layer (only some are), ms: what the layers'
    /// shares are of.
    pub layer_compute_ms: f64,
    /// Steps timed layer by layer.
    pub layer_steps: u64,
    /// One line per rank of a distributed run (empty for a run of one process).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<ranks::RankLine>,
    /// The rank this summary is of, when it covers one rank of a distributed run (a per-rank
    /// trace's summary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<probes::Rank>,
    /// The run over time, in at most [`timeline::MAX_BUCKETS`] buckets (empty in summaries
    /// written before it was kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<timeline::TimelineBucket>,
}

impl Summary {
    /// The compute step's parts (each layer's forward and backward, the optimizer), largest
    /// first, as shares of the mean compute span; empty without per-layer times.
    /// Every name a file or another process could have written, capped and free of control
    /// characters (a summary read back from a file may be crafted).
    pub fn clean_names(&mut self) {
        self.settings.clean_names();
        let name = |s: &mut String| *s = settings::clean_name(s, MAX_TEXT);
        self.threads.values_mut().for_each(name);
        self.loader_threads.iter_mut().for_each(|t| name(&mut t.name));
        self.skipped.iter_mut().for_each(|k| {
            name(&mut k.path);
            name(&mut k.reason);
        });
        self.stalls.iter_mut().for_each(|st| {
            name(&mut st.thread);
            name(&mut st.file);
            name(&mut st.stage);
        });
        self.layers.iter_mut().for_each(|l| name(&mut l.name));
        if let Some(f) = &mut self.failed {
            *f = clean_text(f);
        }
    }

    /// Every list held to what pipeprof's own summaries hold at most, the epoch table folded
    /// as the aggregate folds it: a crafted file with 200 000 epochs or thread names reports in
    /// a page, not 200 000 lines.
    pub fn bound_lists(&mut self) {
        fold_epochs(&mut self.epochs);
        while self.threads.len() > MAX_THREAD_NAMES {
            self.threads.pop_last();
        }
        self.loader_threads.truncate(MAX_LOADER_THREADS + 1);
        self.skipped.truncate(MAX_SKIPPED_LISTED);
        self.stalls.truncate(MAX_STALLS);
        self.layers.truncate(MAX_LAYERS);
        self.timeline.truncate(timeline::MAX_BUCKETS);
    }

    pub fn compute_parts(&self) -> Vec<ComputePart> {
        let mean = |st: Stage| self.stages.iter().find(|x| x.stage == st.name() && x.count > 0).map(|x| x.mean_ms);
        // The layers' times are of the steps timed layer by layer: shares of those steps' compute.
        let timed = Some(self.layer_compute_ms).filter(|c| *c > 0.0);
        let Some(compute) = timed.or(mean(Stage::Compute)).filter(|c| *c > 0.0) else { return vec![] };
        if self.layers.is_empty() {
            return vec![];
        }
        let mut parts: Vec<ComputePart> = self
            .layers
            .iter()
            .flat_map(|l| {
                [(format!("{} forward", l.name), l.forward_ms), (format!("{} backward", l.name), l.backward_ms)]
            })
            .chain(mean(Stage::Optimizer).map(|o| ("optimizer".to_string(), o)))
            .map(|(label, ms)| ComputePart { label, ms, share: ms / compute })
            .collect();
        parts.sort_by(|a, b| b.ms.total_cmp(&a.ms).then(a.label.cmp(&b.label)));
        parts
    }

    /// The validation passes' share of the run's wall time (their `validate` spans cover
    /// loading and forward), or None without validation.
    pub fn validation_share(&self) -> Option<f64> {
        let v = self.stages.iter().find(|x| x.stage == Stage::Validate.name())?;
        (self.elapsed_s > 0.0).then(|| (v.total_ms / (self.elapsed_s * 1000.0)).min(1.0))
    }
}

#[derive(Default, Clone)]
struct Folded {
    first: u32,
    last: u32,
    agg: EpochAgg,
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

/// Steps a phase after a workers change needs before the split describes it alone: a few
/// steps (the workers reached 8 at step 21 of 24) are too short a window to judge by, and the
/// split covers the whole run instead, with the change marked ([`StepSplit::changed_at`]).
pub const MIN_PHASE_STEPS: u64 = 8;

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

/// Accumulates events. Memory is bounded: histograms, a capped window of recent steps and a
/// capped list of skipped files.
pub struct Aggregator {
    settings: RunSettings,
    stages: Vec<StageAgg>,
    threads: BTreeMap<u32, String>,
    loader_threads: BTreeMap<u32, ThreadLoad>,
    epochs: BTreeMap<u32, EpochAgg>,
    /// Epochs past the first [`EPOCHS_KEPT`] and before the last ones, summed.
    folded: Option<Folded>,
    recent: VecDeque<StepRecord>,
    steps: u64,
    images: u64,
    queued_sum: u64,
    first_ns: u64,
    last_ns: u64,
    train_start_ns: u64,
    skipped: Vec<Skipped>,
    skipped_count: u64,
    received: u64,
    dropped: u64,
    last_loss: Option<f64>,
    diverged: Option<Divergence>,
    stalls: Vec<Stall>,
    machine: MachineAgg,
    data_fs: Option<FsInfo>,
    points: VecDeque<StepPoint>,
    /// The train thread's wait and transfer of the step in flight.
    cur: StepPoint,
    /// The first wait of the run: it includes filling the prefetch queue (start-up, not
    /// steady state), so the step split leaves it out.
    first_wait_ns: Option<u64>,
    /// The first compute of the run (a compile or warm-up may make it a one-off).
    first_compute_ns: Option<u64>,
    /// Since the last workers change, when there was one.
    phase: Option<Phase>,
    /// The first failure the program reported.
    failed: Option<String>,
    layers: Vec<LayerAgg>,
    /// Steps with layer times whose compute span has not arrived (the Layer batches spans, so
    /// a step's compute span can come after later steps' layer records), and the compute spans
    /// of such steps.
    layer_pending: std::collections::BTreeSet<u64>,
    layer_compute_ns: u64,
    layer_computes: u64,
    /// Each rank's own aggregate, once a ranked event came.
    ranks: Option<Box<ranks::Ranks>>,
    /// The rank of each thread a distributed run's rank announced (bounded): its loader
    /// workers are that rank's, however they are named.
    thread_ranks: BTreeMap<u32, u32>,
    timeline: timeline::Timeline,
}

impl Aggregator {
    pub fn new(settings: RunSettings) -> Aggregator {
        Aggregator {
            settings,
            stages: Stage::ALL.iter().map(|_| StageAgg::new()).collect(),
            threads: BTreeMap::new(),
            loader_threads: BTreeMap::new(),
            epochs: BTreeMap::new(),
            folded: None,
            recent: VecDeque::with_capacity(RECENT_STEPS),
            steps: 0,
            images: 0,
            queued_sum: 0,
            first_ns: u64::MAX,
            last_ns: 0,
            train_start_ns: u64::MAX,
            skipped: Vec::new(),
            skipped_count: 0,
            received: 0,
            dropped: 0,
            last_loss: None,
            diverged: None,
            stalls: Vec::new(),
            machine: MachineAgg::default(),
            data_fs: None,
            points: VecDeque::with_capacity(RECENT_POINTS),
            cur: StepPoint::default(),
            first_wait_ns: None,
            first_compute_ns: None,
            phase: None,
            failed: None,
            layers: Vec::new(),
            layer_pending: std::collections::BTreeSet::new(),
            layer_compute_ns: 0,
            layer_computes: 0,
            ranks: None,
            thread_ranks: BTreeMap::new(),
            timeline: timeline::Timeline::default(),
        }
    }

    /// A snapshot for live views (summary + recent series).
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            summary: self.summary(),
            steps: self.points.iter().copied().collect(),
            records: self.recent.iter().rev().take(RECENT_POINTS).rev().copied().collect(),
            host: self.machine.host_series().iter().copied().collect(),
            gpu: self.machine.gpu_series().iter().cloned().collect(),
            now_ns: self.last_ns,
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

    /// Records the filesystem under the data folder (found once, before the run).
    pub fn set_data_fs(&mut self, fs: FsInfo) {
        self.data_fs = Some(fs);
    }

    /// The machine time series (for live charts).
    pub fn machine(&self) -> &MachineAgg {
        &self.machine
    }

    /// The dropped-events count as reported by the probe (it lives on the sender side).
    pub fn set_dropped(&mut self, dropped: u64) {
        self.dropped = dropped;
    }

    pub fn settings_mut(&mut self) -> &mut RunSettings {
        &mut self.settings
    }

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

    fn see(&mut self, start: u64, end: u64) {
        self.first_ns = self.first_ns.min(start);
        self.last_ns = self.last_ns.max(end);
    }

    pub fn push(&mut self, ev: &Event) {
        if let Event::Ranked(rank, inner) = ev {
            // For the run as a whole, and for its rank.
            if matches!(**inner, Event::Ranked(..)) {
                return;
            }
            if let Event::Thread { id, .. } = &**inner {
                if self.thread_ranks.len() < MAX_RANKED_THREADS || self.thread_ranks.contains_key(id) {
                    self.thread_ranks.insert(*id, rank.rank);
                }
            }
            self.push(inner);
            let settings = &self.settings;
            self.ranks.get_or_insert_with(|| Box::new(ranks::Ranks::new(settings.clone()))).push(*rank, inner);
            return;
        }
        if let Event::Spans(batch) = ev {
            for s in batch {
                self.push(&Event::Span(*s));
            }
            return;
        }
        self.received += 1;
        self.timeline.push(ev);
        match ev {
            Event::Span(s) => {
                self.stages[s.stage.index()].push(s);
                if s.stage.is_loader() {
                    self.push_loader_thread(s);
                }
                self.see(s.start_ns, s.end_ns());
                if s.stage == Stage::Compute && self.first_compute_ns.is_none() {
                    self.first_compute_ns = Some(s.dur_ns);
                }
                if s.stage == Stage::Wait {
                    self.train_start_ns = self.train_start_ns.min(s.start_ns);
                    if self.first_wait_ns.is_none() {
                        self.first_wait_ns = Some(s.dur_ns);
                    }
                }
                self.track_step(s);
                if s.stage == Stage::Compute && self.layer_pending.remove(&s.step) {
                    // Layer records are sent before their step's compute span closes.
                    self.layer_compute_ns += s.dur_ns;
                    self.layer_computes += 1;
                }
                if let Some(p) = self.phase.as_mut() {
                    p.push(s);
                }
            }
            // Bounded: 300 000 distinct names (a crafted trace) were 650 MB.
            Event::Thread { id, name } if self.threads.len() < MAX_THREAD_NAMES || self.threads.contains_key(id) => {
                self.threads.insert(*id, settings::clean_name(name, MAX_TEXT));
            }
            Event::Step(st) if !st.validation => {
                self.steps += 1;
                self.images += st.images as u64;
                self.queued_sum += st.queued as u64;
                if !st.no_loss {
                    self.last_loss = Some(st.loss as f64);
                    Divergence::see(&mut self.diverged, st.step, st.loss);
                }
                let e = self.epoch(st.epoch);
                if e.steps == 0 {
                    e.start_ns = st.end_ns;
                }
                e.steps += 1;
                e.images += st.images as u64;
                if !st.no_loss {
                    e.loss_sum += st.loss as f64 * st.images as f64;
                    e.loss_images += st.images as u64;
                }
                e.correct += st.correct as u64;
                e.end_ns = st.end_ns;
                self.see(st.end_ns, st.end_ns);
                if self.recent.len() == RECENT_STEPS {
                    self.recent.pop_front();
                }
                self.recent.push_back(*st);
            }
            Event::Step(st) => {
                let e = self.epoch(st.epoch);
                e.val_images += st.images as u64;
                if !st.no_loss {
                    e.val_loss_sum += st.loss as f64 * st.images as f64;
                    e.val_loss_images += st.images as u64;
                }
                e.val_correct += st.correct as u64;
                self.see(st.end_ns, st.end_ns);
            }
            Event::Skipped { path, reason } => {
                self.skipped_count += 1;
                if self.skipped.len() < MAX_SKIPPED_LISTED {
                    let (path, reason) = (settings::clean_name(path, MAX_TEXT), settings::clean_name(reason, MAX_TEXT));
                    self.skipped.push(Skipped { path, reason });
                }
            }
            Event::Host(h) => self.machine.push_host(h),
            Event::Gpu(g) => self.machine.push_gpu(g),
            Event::Stalled { thread, stage, file, open_ns, abandoned } => {
                let open_s = *open_ns as f64 / 1e9;
                let full = self.stalls.len() >= MAX_STALLS;
                match self.stalls.iter_mut().find(|s| *s.thread == **thread && *s.file == **file) {
                    Some(s) => {
                        s.open_s = s.open_s.max(open_s);
                        s.abandoned |= *abandoned;
                        s.stage = stage.name().to_string();
                    }
                    // Bounded: a run with thousands of stuck files names the first few.
                    None if !full => self.stalls.push(Stall {
                        thread: thread.to_string(),
                        stage: stage.name().to_string(),
                        file: file.to_string(),
                        open_s,
                        abandoned: *abandoned,
                    }),
                    None => {}
                }
            }
            Event::Workers { workers, reason, settled } => {
                self.settings.workers = *workers as usize;
                // A new pipeline from the next step on: its split starts afresh.
                self.phase = Some(Phase { first_step: self.steps, skip_wait: true, ..Default::default() });
                let tag = if *settled { "chose" } else { "trying" };
                self.settings.auto_workers.push(format!("{tag} {workers}: {reason}"));
            }
            Event::Settings(v) => {
                // Refused keys stay listed in the settings: the report shows them.
                self.settings.merge_json(v);
            }
            Event::Failed(why) => {
                self.failed.get_or_insert_with(|| clean_text(why));
            }
            Event::Layer(l) => self.push_layer(l),
            // A thread past the names kept: shown by id.
            Event::Finish | Event::Spans(_) | Event::Ranked(..) | Event::Thread { .. } => {}
        }
    }

    fn push_layer(&mut self, l: &LayerRecord) {
        if self.layer_pending.insert(l.step) && self.layer_pending.len() > MAX_LAYERS {
            // Bounded: a compute span that never comes (a run cut short) leaves its step here.
            self.layer_pending.pop_first();
        }
        let i = match self.layers.iter().position(|a| *a.name == *l.layer) {
            Some(i) => i,
            None if self.layers.len() < MAX_LAYERS => {
                self.layers.push(LayerAgg { name: l.layer.to_string(), ..Default::default() });
                self.layers.len() - 1
            }
            None => return,
        };
        let a = &mut self.layers[i];
        if l.backward {
            (a.backward_ns, a.backwards) = (a.backward_ns + l.dur_ns, a.backwards + 1);
        } else {
            (a.forward_ns, a.forwards) = (a.forward_ns + l.dur_ns, a.forwards + 1);
        }
    }

    fn push_loader_thread(&mut self, s: &SpanRecord) {
        let known = self.loader_threads.contains_key(&s.thread);
        let id = if known || self.loader_threads.len() < MAX_LOADER_THREADS { s.thread } else { OTHER_THREADS };
        let t = self.loader_threads.entry(id).or_default();
        t.spans += 1;
        t.wall_ns += s.dur_ns;
        if s.cpu_ns != NONE {
            t.cpu_ns += s.cpu_ns.min(s.dur_ns);
            t.cpu_wall_ns += s.dur_ns;
        }
    }

    /// One row per worker ([`worker_role`]): a worker's restarts add to its row and its
    /// `starts`.
    fn loader_threads(&self) -> Vec<LoaderThread> {
        let mut rows: BTreeMap<(Option<u32>, String), (u32, u32, ThreadLoad)> = BTreeMap::new();
        for (&id, t) in &self.loader_threads {
            let rank = self.thread_ranks.get(&id).copied();
            let mut name = match self.threads.get(&id) {
                Some(n) => worker_role(n),
                None if id == OTHER_THREADS => "other threads".to_string(),
                None => format!("thread-{id}"),
            };
            // Workers of different ranks are different workers, whatever their names.
            if let Some(r) = rank.filter(|r| !name.contains(&format!("rank {r}"))) {
                name = format!("{name} (rank {r})");
            }
            let row = rows.entry((rank, name)).or_insert((id, 0, ThreadLoad::default()));
            row.1 += 1;
            row.2.spans += t.spans;
            row.2.wall_ns += t.wall_ns;
            row.2.cpu_ns += t.cpu_ns;
            row.2.cpu_wall_ns += t.cpu_wall_ns;
        }
        let mut v: Vec<LoaderThread> = rows
            .into_iter()
            .map(|((_, name), (thread, starts, t))| LoaderThread {
                thread,
                name,
                spans: t.spans,
                busy_ms: t.wall_ns as f64 / 1e6,
                on_cpu: (t.cpu_wall_ns > 0).then(|| (t.cpu_ns as f64 / t.cpu_wall_ns as f64).min(1.0)),
                starts,
            })
            .collect();
        v.sort_by(|a, b| b.busy_ms.total_cmp(&a.busy_ms).then(a.name.cmp(&b.name)));
        v
    }

    pub fn has_thread(&self, id: u32) -> bool {
        self.threads.contains_key(&id)
    }

    /// Skipped files listed so far (for printing warnings as they arrive).
    pub fn skipped(&self) -> &[Skipped] {
        &self.skipped
    }

    pub fn summary(&self) -> Summary {
        let elapsed_ns = self.last_ns.saturating_sub(self.first_ns.min(self.last_ns));
        let train_ns = self.last_ns.saturating_sub(self.train_start_ns.min(self.last_ns));
        let secs = |ns: u64| ns as f64 / 1e9;
        let ms = |ns: u64| ns as f64 / 1e6;
        let stages: Vec<StageSummary> = Stage::ALL
            .iter()
            .zip(&self.stages)
            .filter(|(_, a)| a.count > 0)
            .map(|(st, a)| StageSummary {
                stage: st.name().to_string(),
                count: a.count,
                total_ms: ms(a.wall_ns),
                mean_ms: ms(a.wall_ns) / a.count as f64,
                p50_ms: ms(a.hist.value_at_quantile(0.5)),
                p95_ms: ms(a.hist.value_at_quantile(0.95)),
                max_ms: ms(a.hist.max().max(a.longest_over)),
                on_cpu: (a.cpu_wall_ns > 0).then(|| (a.cpu_ns as f64 / a.cpu_wall_ns as f64).min(1.0)),
                core_wait: (a.queue_wall_ns > 0).then(|| (a.queue_ns as f64 / a.queue_wall_ns as f64).min(1.0)),
                bytes: a.bytes,
                per_second: if elapsed_ns > 0 { a.count as f64 / secs(elapsed_ns) } else { 0.0 },
                trimmed_mean_ms: trimmed_mean(&a.hist, TRIM_SHARE).map(|ns| ns / 1e6),
            })
            .collect();
        let wall = |s: Stage| self.stages[s.index()].wall_ns;
        // Means per step; the first wait (start-up) is left out of the wait mean.
        let count = |s: Stage| self.stages[s.index()].count;
        let first = self.first_wait_ns.unwrap_or(0);
        let per = |total: u64, n: u64| if n > 0 { ms(total) / n as f64 } else { 0.0 };
        let phase = self.phase.filter(|p| p.computes >= MIN_PHASE_STEPS && p.waits > 0);
        let changed_at = self.phase.filter(|_| phase.is_none()).map(|p| p.first_step);
        let compute_agg = &self.stages[Stage::Compute.index()];
        let startup_compute = self
            .first_compute_ns
            .filter(|f| startup_compute_one_off(*f, compute_agg.count, compute_agg.hist.value_at_quantile(0.5)));
        let (wait_ms, transfer_ms, compute_ms) = match phase {
            // After the last workers change: the pipeline the run settled on, not the ones tried.
            Some(p) => (per(p.wait_ns, p.waits), per(p.transfer_ns, p.transfers), per(p.compute_ns, p.computes)),
            None => {
                let wait_ms = match count(Stage::Wait) {
                    0 | 1 => 0.0,
                    n => ms(wall(Stage::Wait).saturating_sub(first)) / (n - 1) as f64,
                };
                let all = |s: Stage| per(wall(s), count(s));
                let compute_ms = match startup_compute {
                    Some(f) => ms(wall(Stage::Compute).saturating_sub(f)) / (count(Stage::Compute) - 1) as f64,
                    None => all(Stage::Compute),
                };
                (wait_ms, all(Stage::Transfer), compute_ms)
            }
        };
        let step_ms = wait_ms + transfer_ms + compute_ms;
        let share = |x: f64| if step_ms > 0.0 { x / step_ms } else { 0.0 };
        let split = StepSplit {
            steps: self.steps,
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
        };
        let loader_ns: u64 = Stage::ALL.iter().filter(|s| s.is_loader()).map(|s| wall(*s)).sum();
        let workers = self.settings.workers.max(1) as f64;
        let loader_busy =
            if elapsed_ns > 0 { (loader_ns as f64 / (workers * elapsed_ns as f64)).min(1.0) } else { 0.0 };
        let folded = self.folded.as_ref().map(|f| (f.first, &f.agg, Some(f.last + 1)));
        let mut rows: Vec<(u32, &EpochAgg, Option<u32>)> =
            self.epochs.iter().map(|(e, a)| (*e, a, None)).chain(folded).collect();
        rows.sort_by_key(|r| r.0);
        let epochs = rows
            .into_iter()
            .map(|(e, a, through)| EpochSummary {
                epoch: e + 1,
                through,
                steps: a.steps,
                images: a.images,
                loss: if a.loss_images > 0 { a.loss_sum / a.loss_images as f64 } else { 0.0 },
                no_loss: a.loss_images == 0,
                accuracy: if a.images > 0 { a.correct as f64 / a.images as f64 } else { 0.0 },
                seconds: secs(a.end_ns.saturating_sub(a.start_ns)),
                val_loss: (a.val_loss_images > 0).then(|| a.val_loss_sum / a.val_loss_images as f64),
                val_accuracy: (a.val_images > 0).then(|| a.val_correct as f64 / a.val_images as f64),
            })
            .collect();
        let machine = self.machine.summary();
        let ranks = self.ranks.as_ref().map(|r| r.lines(&machine)).unwrap_or_default();
        Summary {
            schema_version: SUMMARY_SCHEMA_VERSION,
            settings: self.settings.clone(),
            steps: self.steps,
            images: self.images,
            elapsed_s: secs(elapsed_ns),
            images_per_s: if train_ns > 0 { self.images as f64 / secs(train_ns) } else { 0.0 },
            last_loss: self.last_loss,
            diverged: self.diverged,
            stalls: self.stalls.clone(),
            stages,
            split,
            loader_busy,
            epochs,
            skipped_count: self.skipped_count,
            skipped: self.skipped.clone(),
            events_received: self.received,
            events_dropped: self.dropped,
            threads: self.threads.clone(),
            loader_threads: self.loader_threads(),
            mean_queued: if self.steps > 0 { self.queued_sum as f64 / self.steps as f64 } else { 0.0 },
            machine,
            data_fs: self.data_fs.clone(),
            failed: self.failed.clone(),
            layers: self
                .layers
                .iter()
                .map(|a| LayerSummary {
                    name: a.name.clone(),
                    forward_ms: per(a.forward_ns, a.forwards),
                    backward_ms: per(a.backward_ns, a.backwards),
                })
                .collect(),
            layer_compute_ms: per(self.layer_compute_ns, self.layer_computes),
            layer_steps: self.layer_computes,
            ranks,
            rank: None,
            timeline: self.timeline.buckets(),
        }
    }

    /// Each rank's own summary, by rank (empty for a run of one process).
    pub fn rank_summaries(&self) -> Vec<(probes::Rank, Summary)> {
        self.ranks.as_ref().map(|r| r.summaries()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_merge_key_by_key_and_keep_what_reads() {
        use serde_json::json;
        // (sent, batch_size, workers, input, refused keys)
        type Row = (serde_json::Value, usize, usize, [usize; 3], Vec<&'static str>);
        let table: Vec<Row> = vec![
            (json!({"batch_size": 32, "workers": 2}), 32, 2, [0, 0, 0], vec![]),
            // The bad key of the original report: the others stay.
            (json!({"input": "3x150x150", "batch_size": 32, "workers": 4}), 32, 4, [0, 0, 0], vec!["input"]),
            (json!({"input": [3, 64, 64], "workers": "many"}), 0, 0, [3, 64, 64], vec!["workers"]),
            // Keys pipeprof does not know are ignored, not refused.
            (json!({"optimizer": "adam", "batch_size": 8}), 8, 0, [0, 0, 0], vec![]),
            (json!(null), 0, 0, [0, 0, 0], vec![]),
        ];
        for (sent, batch, workers, input, refused) in table {
            let mut st = RunSettings::default();
            let why = st.merge_json(&sent);
            assert_eq!((st.batch_size, st.workers, st.input), (batch, workers, input), "{sent}");
            let keys: Vec<&str> = why.iter().map(|w| w.split(' ').next().unwrap_or("")).collect();
            assert_eq!(keys, refused, "{sent}: {why:?}");
            assert_eq!(st.unreadable, why, "{sent}");
        }
        let mut st = RunSettings::default();
        assert_eq!(st.merge_json(&json!([1, 2])).len(), 1, "not an object");
        // Later settings win, and earlier refusals stay listed.
        let mut st2 = RunSettings::default();
        st2.merge_json(&json!({"input": "3x1", "workers": 1}));
        st2.merge_json(&json!({"workers": 3, "framework": "pytorch", "pin_memory": true}));
        assert_eq!((st2.workers, st2.framework.as_str(), st2.pin_memory), (3, "pytorch", Some(true)));
        assert_eq!(st2.unreadable.len(), 1);
    }

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
    fn settings_and_failure_events_reach_the_summary() {
        let mut a = Aggregator::new(RunSettings { model: "train.py".into(), ..RunSettings::default() });
        a.push(&Event::Settings(Box::new(serde_json::json!({"framework": "keras", "batch_size": 16}))));
        a.push(&Event::Failed("ValueError: bad label (in train.py, line 3)".into()));
        a.push(&Event::Failed("a later failure".into()));
        let s = a.summary();
        assert_eq!(
            (&*s.settings.model.name(), s.settings.framework.as_str(), s.settings.batch_size),
            ("train.py", "keras", 16)
        );
        assert_eq!(
            s.failed.as_deref(),
            Some("ValueError: bad label (in train.py, line 3)"),
            "the first failure is the one"
        );
        let json = serde_json::to_value(&s).expect("summary serialises");
        assert_eq!(json["failed"], "ValueError: bad label (in train.py, line 3)");
        assert!(Aggregator::new(RunSettings::default()).summary().failed.is_none());
    }

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

    fn span_record(stage: Stage, start: u64, dur: u64) -> SpanRecord {
        SpanRecord {
            stage,
            thread: 1,
            start_ns: start,
            dur_ns: dur,
            cpu_ns: NONE,
            queue_ns: NONE,
            step: 0,
            sample: NONE,
            bytes: NONE,
        }
    }

    fn layer(name: &str, backward: bool, step: u64, dur_ms: u64) -> Event {
        Event::Layer(LayerRecord {
            layer: name.into(),
            backward,
            step,
            start_ns: step * 1_000_000_000,
            dur_ns: dur_ms * 1_000_000,
        })
    }

    #[test]
    fn layer_times_become_per_step_means_and_shares_of_compute() {
        let mut a = Aggregator::new(RunSettings::default());
        for step in 0..2 {
            a.push(&layer("conv2d_1", false, step, 5));
            a.push(&layer("dense_1", false, step, 10 + step * 10));
            a.push(&layer("dense_1", true, step, 50));
            a.push(&layer("conv2d_1", true, step, 20));
        }
        // The Layer batches spans: both steps' compute spans come after all layer records.
        for step in 0..2 {
            let t0 = step * 1_000_000_000;
            a.push(&Event::Span(SpanRecord { step, ..compute_span(t0, 100) }));
            a.push(&Event::Span(SpanRecord { stage: Stage::Optimizer, step, ..compute_span(t0, 10 + step * 10) }));
        }
        // A step not timed layer by layer (slower or faster) leaves the shares alone.
        a.push(&Event::Span(SpanRecord { step: 2, ..compute_span(2_000_000_000, 400) }));
        let s = a.summary();
        let names: Vec<&str> = s.layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["conv2d_1", "dense_1"], "model order, as first seen");
        assert_eq!((s.layers[1].forward_ms, s.layers[1].backward_ms), (15.0, 50.0));
        let parts = s.compute_parts();
        let labels: Vec<&str> = parts.iter().map(|p| p.label.as_str()).collect();
        assert_eq!(
            labels,
            ["dense_1 backward", "conv2d_1 backward", "dense_1 forward", "optimizer", "conv2d_1 forward"]
        );
        assert!((parts[0].share - 0.5).abs() < 1e-9, "50 ms of a 100 ms compute step");
        assert_eq!((s.layer_steps, s.layer_compute_ms), (2, 100.0));
        assert_eq!(parts[3].ms, 15.0);
    }

    #[test]
    fn no_layer_times_no_compute_parts() {
        let mut a = Aggregator::new(RunSettings::default());
        a.push(&Event::Span(compute_span(0, 100)));
        assert!(a.summary().compute_parts().is_empty());
    }

    fn compute_span(start_ns: u64, dur_ms: u64) -> SpanRecord {
        SpanRecord {
            stage: Stage::Compute,
            thread: 1,
            start_ns,
            dur_ns: dur_ms * 1_000_000,
            cpu_ns: NONE,
            queue_ns: NONE,
            step: 0,
            sample: NONE,
            bytes: NONE,
        }
    }

    fn span(stage: Stage, start: u64, dur: u64, cpu: u64) -> Event {
        Event::Span(SpanRecord {
            stage,
            thread: 1,
            start_ns: start,
            dur_ns: dur,
            cpu_ns: cpu,
            queue_ns: NONE,
            step: 0,
            sample: NONE,
            bytes: NONE,
        })
    }

    fn timed(stage: Stage, dur: u64, cpu: u64, queue: u64) -> Event {
        Event::Span(SpanRecord {
            stage,
            thread: 1,
            start_ns: 0,
            dur_ns: dur,
            cpu_ns: cpu,
            queue_ns: queue,
            step: 0,
            sample: NONE,
            bytes: NONE,
        })
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

    fn step(step: u64, epoch: u32, loss: f32, correct: u32, end: u64) -> Event {
        Event::Step(StepRecord {
            no_loss: false,
            step,
            epoch,
            images: 4,
            loss,
            correct,
            end_ns: end,
            queued: 1,
            validation: false,
        })
    }

    fn on_thread(thread: u32, stage: Stage, dur: u64, cpu: u64) -> Event {
        Event::Span(SpanRecord {
            stage,
            thread,
            start_ns: 1,
            dur_ns: dur,
            cpu_ns: cpu,
            queue_ns: NONE,
            step: NONE,
            sample: 0,
            bytes: NONE,
        })
    }

    #[test]
    fn loader_work_is_split_per_thread_with_its_on_cpu_share() {
        let mut a = Aggregator::new(RunSettings { workers: 2, ..Default::default() });
        a.push(&Event::Thread { id: 7, name: "loader-0 (pid 41)".into() });
        a.push(&Event::Thread { id: 9, name: "loader-1 (pid 42)".into() });
        for _ in 0..4 {
            a.push(&on_thread(7, Stage::Decode, 1_000_000, 900_000));
            a.push(&on_thread(9, Stage::Read, 3_000_000, 300_000));
        }
        // The training thread's stages are not loader work.
        a.push(&on_thread(1, Stage::Wait, 5_000_000, NONE));
        let t = a.summary().loader_threads;
        assert_eq!(t.len(), 2, "{t:?}");
        assert_eq!((t[0].name.as_str(), t[0].spans, t[0].busy_ms), ("loader-1", 4, 12.0));
        assert_eq!(t[0].on_cpu, Some(0.1), "busiest first: the one waiting on reads");
        assert_eq!((t[1].name.as_str(), t[1].on_cpu, t[1].starts), ("loader-0", Some(0.9), 1));
    }

    #[test]
    fn workers_restarted_each_epoch_are_one_row_each_with_their_starts() {
        // 3 epochs, 2 workers each for a train and a validation loader, never persistent: 12
        // processes, 2 workers.
        let mut a = Aggregator::new(RunSettings { workers: 2, ..Default::default() });
        for start in 0..6u32 {
            for w in 0..2u32 {
                let id = 10 + start * 2 + w;
                a.push(&Event::Thread { id, name: format!("loader-{w} (pid {})", 100 + id).into() });
                a.push(&on_thread(id, Stage::Decode, 1_000_000, 500_000));
            }
        }
        let t = a.summary().loader_threads;
        let rows: Vec<(&str, u32, u64)> = t.iter().map(|x| (x.name.as_str(), x.starts, x.spans)).collect();
        assert_eq!(rows, [("loader-0", 6, 6), ("loader-1", 6, 6)]);
    }

    #[test]
    fn a_workers_role_is_its_name_without_the_process_or_generation() {
        let table = [
            ("loader-1 (pid 42)", "loader-1"),
            ("loader-0 (rank 1, pid 7)", "loader-0 (rank 1)"),
            ("worker-0 (pid 77) thread-9", "worker-0 thread-9"),
            ("loader-0.2", "loader-0"),
            ("loader-3", "loader-3"),
            ("loader-x.2", "loader-x.2"),
            ("tf.data (trace)", "tf.data (trace)"),
            ("train (pid 1a)", "train (pid 1a)"),
            ("odd (pid 5", "odd (pid 5"),
        ];
        for (name, role) in table {
            assert_eq!(worker_role(name), role, "{name}");
        }
    }

    #[test]
    fn loader_threads_are_bounded() {
        let mut a = Aggregator::new(RunSettings::default());
        for id in 0..(MAX_LOADER_THREADS as u32 + 10) {
            a.push(&on_thread(id, Stage::Decode, 1_000, NONE));
        }
        let t = a.summary().loader_threads;
        assert_eq!(t.len(), MAX_LOADER_THREADS + 1);
        let other = t.iter().find(|x| x.thread == OTHER_THREADS).unwrap();
        assert_eq!((other.name.as_str(), other.spans, other.on_cpu), ("other threads", 10, None));
    }

    #[test]
    fn stage_statistics_come_from_spans() {
        let mut a = Aggregator::new(RunSettings { workers: 1, ..Default::default() });
        for i in 0..10u64 {
            a.push(&span(Stage::Decode, i * 1_000_000, 1_000_000, 250_000));
        }
        let s = a.summary();
        let d = &s.stages[0];
        assert_eq!((d.stage.as_str(), d.count), ("decode", 10));
        assert!((d.mean_ms - 1.0).abs() < 1e-9);
        assert!((d.p95_ms - 1.0).abs() < 0.02, "{}", d.p95_ms);
        assert_eq!(d.on_cpu, Some(0.25));
        assert!((s.loader_busy - 1.0).abs() < 1e-9, "the single worker decoded all the time");
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
    fn names_from_other_processes_are_capped_and_lose_their_control_characters() {
        let mut a = Aggregator::new(RunSettings::default());
        a.push(&Event::Thread { id: 3, name: format!("w\u{1b}[2J{}", "x".repeat(900_000)).into() });
        a.push(&Event::Skipped { path: "a\rb.png".into(), reason: "bad\u{7}".into() });
        a.push(&Event::Failed("Error: x\u{1b}]0;t\u{7}\nline 2".into()));
        let s = a.summary();
        assert_eq!(s.threads[&3].chars().count(), MAX_TEXT);
        assert!(s.threads[&3].starts_with("w?[2J"));
        assert_eq!((s.skipped[0].path.as_str(), s.skipped[0].reason.as_str()), ("a?b.png", "bad?"));
        assert_eq!(s.failed.as_deref(), Some("Error: x?]0;t?\nline 2"));
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

    #[test]
    fn skipped_files_are_counted_and_listed_up_to_a_cap() {
        let mut a = Aggregator::new(RunSettings::default());
        for i in 0..(MAX_SKIPPED_LISTED + 5) {
            a.push(&Event::Skipped { path: format!("f{i}").into(), reason: "bad".into() });
        }
        let s = a.summary();
        assert_eq!(s.skipped_count as usize, MAX_SKIPPED_LISTED + 5);
        assert_eq!(s.skipped.len(), MAX_SKIPPED_LISTED);
    }
}
