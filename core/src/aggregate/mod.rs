//! Events → statistics. Pure: no clocks, no I/O, no threads; time comes from events.
//!
//! One accumulator per concern, each with its own `push` and its part of the summary:
//! `stages` (per-stage statistics), `split` (the training loop's wait / transfer / compute),
//! `steps` (step totals and the loss), `epochs` (the epoch table), `layers` (per-layer times),
//! `incidents` (skipped files, stalls, the failure), `threads` (names, ranks, loader rows),
//! `machine` (host and GPU samples), `ranks` (each rank's own aggregate). The [`Aggregator`]
//! hands each event to the ones it concerns and puts the [`Summary`] together from their parts.

mod epochs;
mod incidents;
mod layers;
pub mod machine;
mod program;
pub mod ranks;
pub mod settings;
mod split;
mod stages;
mod steps;
mod summary;
#[cfg(test)]
mod testing;
mod threads;
pub mod timeline;

pub use epochs::{fold_epochs, EpochSummary, EPOCHS_KEPT};
pub use incidents::{clean_text, Skipped, Stall, MAX_SKIPPED_LISTED, MAX_STALLS};
pub use layers::{ComputePart, LayerSummary, MAX_LAYERS};
pub use program::{Device, Framework};
pub use settings::RunSettings;
pub use split::{startup_compute_one_off, StepPoint, StepSplit, MIN_PHASE_STEPS, RECENT_POINTS, STARTUP_COMPUTE_RATIO};
pub use stages::{trimmed_mean, StageSummary, TRIM_SHARE};
pub use steps::{Divergence, RECENT_STEPS};
pub use summary::{Summary, SUMMARY_SCHEMA_OLDEST, SUMMARY_SCHEMA_VERSION};
pub use threads::{without_pid, LoaderThread, MAX_LOADER_THREADS, MAX_RANKED_THREADS, MAX_THREAD_NAMES, OTHER_THREADS};

use machine::MachineAgg;
use probes::fsinfo::FsInfo;
use probes::{Event, Rank, SpanRecord, StepRecord};

/// Longest thread name, skipped path or reason kept (characters).
pub const MAX_TEXT: usize = 1024;

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

/// Accumulates events: a dispatcher over one accumulator per concern. Memory is bounded:
/// histograms, capped windows of recent steps and samples, capped lists.
pub struct Aggregator {
    settings: RunSettings,
    /// Events counted (a batch of spans counts each span).
    received: u64,
    /// Dropped on the sender side (set by the collector).
    dropped: u64,
    /// Earliest start and latest end of any span or step seen, monotonic ns.
    first_ns: u64,
    last_ns: u64,
    data_fs: Option<FsInfo>,
    stages: stages::Stages,
    split: split::Split,
    steps: steps::Steps,
    epochs: epochs::Epochs,
    layers: layers::Layers,
    incidents: incidents::Incidents,
    threads: threads::Threads,
    machine: MachineAgg,
    /// Each rank's own aggregate, once a ranked event came.
    ranks: Option<Box<ranks::Ranks>>,
    /// The run over time, for the charts of a finished run.
    timeline: timeline::Timeline,
}

impl Aggregator {
    pub fn new(settings: RunSettings) -> Aggregator {
        Aggregator {
            settings,
            received: 0,
            dropped: 0,
            first_ns: u64::MAX,
            last_ns: 0,
            data_fs: None,
            stages: stages::Stages::new(),
            split: split::Split::new(),
            steps: steps::Steps::new(),
            epochs: epochs::Epochs::default(),
            layers: layers::Layers::default(),
            incidents: incidents::Incidents::default(),
            threads: threads::Threads::default(),
            machine: MachineAgg::default(),
            ranks: None,
            timeline: timeline::Timeline::default(),
        }
    }

    /// A snapshot for live views (summary + recent series).
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            summary: self.summary(),
            steps: self.split.points(),
            records: self.steps.recent(RECENT_POINTS),
            host: self.machine.host_series().iter().copied().collect(),
            gpu: self.machine.gpu_series().iter().cloned().collect(),
            now_ns: self.last_ns,
        }
    }

    /// Records the filesystem under the data folder (found once, before the run).
    pub fn set_data_fs(&mut self, fs: FsInfo) {
        self.data_fs = Some(fs);
    }

    /// The data folder a program named (its `data` setting) while its filesystem is still
    /// unknown: a `pipeprof run` program says where it reads only once it runs, and the session
    /// then looks the filesystem up ([`Aggregator::set_data_fs`]). Pure.
    pub fn data_fs_wanted(&self) -> Option<&str> {
        (self.data_fs.is_none() && !self.settings.data.is_empty()).then_some(self.settings.data.as_str())
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

    fn see(&mut self, start: u64, end: u64) {
        self.first_ns = self.first_ns.min(start);
        self.last_ns = self.last_ns.max(end);
    }

    /// Hands `ev` to the accumulators it concerns.
    pub fn push(&mut self, ev: &Event) {
        match ev {
            Event::Ranked(rank, inner) => return self.push_ranked(*rank, inner),
            Event::Spans(batch) => {
                for s in batch {
                    self.received += 1;
                    self.timeline.push(&Event::Span(*s));
                    self.push_span(s);
                }
                return;
            }
            _ => {
                self.received += 1;
                self.timeline.push(ev);
            }
        }
        match ev {
            Event::Span(s) => self.push_span(s),
            Event::Thread { id, name, role } => self.threads.push_name(*id, name, *role),
            Event::Step(st) => self.push_step(st),
            Event::Skipped { path, reason } => self.incidents.push_skipped(path, reason),
            Event::Host(h) => self.machine.push_host(h),
            Event::Gpu(g) => self.machine.push_gpu(g),
            Event::Stalled { thread, stage, file, open_ns, abandoned } => {
                self.incidents.push_stall(thread, *stage, file, *open_ns, *abandoned)
            }
            Event::Workers { workers, reason, settled } => {
                self.settings.workers = *workers as usize;
                self.split.workers_changed(self.steps.steps);
                let tag = if *settled { "chose" } else { "trying" };
                self.settings.auto_workers.push(format!("{tag} {workers}: {reason}"));
            }
            Event::Settings(v) => {
                // Refused keys stay listed in the settings: the report shows them.
                self.settings.merge_json(v);
            }
            Event::Failed(why) => self.incidents.push_failed(why),
            Event::Layer(l) => self.layers.push(l),
            Event::Finish | Event::Spans(_) | Event::Ranked(..) => {}
        }
    }

    /// An event of one rank: counted for the run as a whole, and for its rank.
    fn push_ranked(&mut self, rank: Rank, inner: &Event) {
        if matches!(inner, Event::Ranked(..)) {
            return;
        }
        if let Event::Thread { id, .. } = inner {
            self.threads.push_rank(*id, rank.rank);
        }
        self.push(inner);
        let settings = &self.settings;
        self.ranks.get_or_insert_with(|| Box::new(ranks::Ranks::new(settings.clone()))).push(rank, inner);
    }

    fn push_span(&mut self, s: &SpanRecord) {
        self.stages.push(s);
        if s.stage.is_loader() {
            self.threads.push_loader_span(s);
        }
        self.see(s.start_ns, s.end_ns());
        self.split.push(s);
        self.layers.push_span(s);
    }

    fn push_step(&mut self, st: &StepRecord) {
        if !st.validation {
            self.steps.push(st);
            self.machine.training_step();
        }
        self.epochs.push(st);
        self.see(st.end_ns, st.end_ns);
    }

    pub fn has_thread(&self, id: u32) -> bool {
        self.threads.has(id)
    }

    /// Skipped files listed so far (for printing warnings as they arrive).
    pub fn skipped(&self) -> &[Skipped] {
        &self.incidents.skipped
    }

    /// The summary so far: each accumulator's part.
    pub fn summary(&self) -> Summary {
        let elapsed_ns = self.last_ns.saturating_sub(self.first_ns.min(self.last_ns));
        let train_ns = self.last_ns.saturating_sub(self.split.train_start_ns().min(self.last_ns));
        let secs = |ns: u64| ns as f64 / 1e9;
        let machine = self.machine.summary();
        let ranks = self.ranks.as_ref().map(|r| r.lines(&machine)).unwrap_or_default();
        let (steps, inc) = (&self.steps, &self.incidents);
        Summary {
            schema_version: SUMMARY_SCHEMA_VERSION,
            settings: self.settings.clone(),
            steps: steps.steps,
            images: steps.images,
            elapsed_s: secs(elapsed_ns),
            images_per_s: if train_ns > 0 { steps.images as f64 / secs(train_ns) } else { 0.0 },
            last_loss: steps.last_loss,
            diverged: steps.diverged,
            stalls: inc.stalls.clone(),
            stages: self.stages.summary(elapsed_ns),
            split: self.split.summary(&self.stages, steps.steps),
            loader_busy: self.stages.loader_busy(self.settings.workers, elapsed_ns),
            epochs: self.epochs.summary(),
            skipped_count: inc.skipped_count,
            skipped: inc.skipped.clone(),
            events_received: self.received,
            events_dropped: self.dropped,
            threads: self.threads.names().clone(),
            loader_threads: self.threads.loader_rows(),
            mean_queued: steps.mean_queued(),
            machine,
            data_fs: self.data_fs.clone(),
            failed: inc.failed.clone(),
            layers: self.layers.summary(),
            layer_compute_ms: self.layers.compute_ms(),
            layer_steps: self.layers.steps(),
            ranks,
            rank: None,
            timeline: self.timeline.buckets(),
        }
    }

    /// Each rank's own summary, by rank (empty for a run of one process).
    pub fn rank_summaries(&self) -> Vec<(Rank, Summary)> {
        self.ranks.as_ref().map(|r| r.summaries()).unwrap_or_default()
    }
}
