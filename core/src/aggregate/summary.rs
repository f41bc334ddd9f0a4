//! The summary: a point-in-time view of the run, what reports, the summary JSON and views
//! read. It knows no verdict. Pure.

use super::epochs::{fold_epochs, EpochSummary};
use super::incidents::{clean_text, Skipped, Stall, MAX_SKIPPED_LISTED, MAX_STALLS};
use super::layers::{ComputePart, LayerSummary, MAX_LAYERS};
use super::machine::MachineSummary;
use super::settings::{clean_name, RunSettings};
use super::split::StepSplit;
use super::stages::StageSummary;
use super::steps::Divergence;
use super::threads::{LoaderThread, MAX_LOADER_THREADS, MAX_THREAD_NAMES};
use super::{timeline, MAX_TEXT};
use probes::fsinfo::FsInfo;
use probes::Stage;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Version of the summary JSON schema.
pub const SUMMARY_SCHEMA_VERSION: u32 = 2;

/// Oldest summary schema still read: 2 only added fields (the node of a run and of its
/// ranks), so a version 1 file reads as it is, with no node.
pub const SUMMARY_SCHEMA_OLDEST: u32 = 1;

/// A point-in-time view of the run: what reports, the summary JSON and views read.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(default)]
pub struct Summary {
    /// Version of this JSON schema (see docs/traces-and-reports.md, "Traces, summaries and
    /// comparisons").
    pub schema_version: u32,
    pub settings: RunSettings,
    pub steps: u64,
    pub images: u64,
    pub elapsed_s: f64,
    pub images_per_s: f64,
    #[schemars(with = "Option<probes::nonfinite::Json>")]
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
    pub ranks: Vec<RankLine>,
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
    /// Every name a file or another process could have written, capped and free of control
    /// characters (a summary read back from a file may be crafted).
    pub fn clean_names(&mut self) {
        self.settings.clean_names();
        let name = |s: &mut String| *s = clean_name(s, MAX_TEXT);
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
        for l in &mut self.ranks {
            l.node = l.node.as_deref().map(|n| probes::node::clean(n).unwrap_or_else(|| "?".into()));
        }
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

    /// The compute step's parts (each layer's forward and backward, the optimizer), largest
    /// first, as shares of the mean compute span; empty without per-layer times.
    pub fn compute_parts(&self) -> Vec<ComputePart> {
        let mean = |st: Stage| self.stages.iter().find(|x| x.stage == st && x.count > 0).map(|x| x.mean_ms);
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
        let v = self.stages.iter().find(|x| x.is(Stage::Validate))?;
        (self.elapsed_s > 0.0).then(|| (v.total_ms / (self.elapsed_s * 1000.0)).min(1.0))
    }

    /// Whether the run trains on the CPU: its device says so (or says nothing), and NVML did
    /// not list any of its processes on a GPU. A program that never moved a batch to a device
    /// in a way pipeprof sees (JAX, Keras) but has a compute context on a GPU trains there.
    pub fn trains_on_cpu(&self) -> bool {
        let d = &self.settings.device;
        (d.is_unseen() || d.is_cpu()) && self.machine.this_process_on_gpu != Some(true)
    }
}

/// One rank's part of the run, in the numbers the report's per-rank table shows (made from
/// the rank's own summary by `ranks`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct RankLine {
    pub rank: u32,
    /// The node this rank ran on, when the run knew it (`pipeprof run` does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub local_rank: u32,
    pub world_size: u32,
    /// Training steps this rank reported.
    pub steps: u64,
    pub images: u64,
    pub images_per_s: f64,
    /// Mean step (wait + transfer + compute), ms: steady state, like the run's split.
    pub step_ms: f64,
    /// Mean wait for the next batch per step, ms.
    pub wait_ms: f64,
    /// Wait share of the step.
    pub wait_share: f64,
    pub transfer_ms: f64,
    pub compute_ms: f64,
    /// Mean `backward` span, ms, when the program's hooks timed one (under DDP it holds the
    /// gradient computation and the wait for the gradients' all-reduce).
    pub backward_ms: Option<f64>,
    /// This rank's loader threads' busy share (see [`Summary::loader_busy`]).
    pub loader_busy: f64,
    /// Loader workers and batch size this rank's program reported.
    pub workers: usize,
    pub batch_size: usize,
    /// Mean utilisation of the GPU numbered like its local rank, when GPUs were sampled.
    pub gpu_util_pct: Option<f32>,
    /// This rank's stages (the stage table's rank column).
    pub stages: Vec<StageSummary>,
    /// Why this rank's program failed, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}
