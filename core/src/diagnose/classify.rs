//! Classification: the facts every rule reads, the limiter, the severity and the flags. No words
//! here: [`super::evidence`] and [`super::advice`] explain what this module decided.

use super::model::{Capacity, Pipeline};
use super::now::{measured_now, Now};
use super::readings::measured;
use super::thresholds::*;
use super::{Flag, Limiter, Severity};
use crate::aggregate::{ComputePart, StageSummary, Summary};
use probes::stage::Stage;

/// Why a run counts as per-step-overhead bound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum OverheadWhy {
    /// Compute per step below [`OVERHEAD_STEP_MS`].
    TinyStep(f64),
    /// The optimizer step (batch-independent) is this share of compute.
    FixedCost(f64),
    /// The GPU in use is busy this % on average while the loop does not wait.
    LowGpu(f64),
    /// The wait is the loop taking samples already in memory and batching them (this ms per
    /// image): the DataLoader's own per-step work, not preprocessing.
    InMemoryLoader(f64),
}

/// Everything the rules read, computed once.
pub(super) struct Facts<'a> {
    pub s: &'a Summary,
    pub p: Pipeline,
    pub cap: Capacity,
    pub severity: Severity,
    pub cpu_device: bool,
    pub gpu_present: bool,
    pub gpu_unused: bool,
    /// Mean utilisation of the GPU this run uses (or the busiest one), %.
    pub gpu_util: Option<f64>,
    pub global_cpu: Option<f64>,
    pub process_cpu: Option<f64>,
    pub wait: Option<&'a StageSummary>,
    pub overhead: Option<OverheadWhy>,
    /// Cores other programs kept busy, typically (median), when sampled.
    pub other_cores: Option<f64>,
    /// Today's measured rate: what every predicted gain is against.
    pub now: Option<Now>,
}

pub(super) fn severity(wait_share: f64) -> Severity {
    if wait_share >= HIGH_WAIT_SHARE {
        Severity::High
    } else if wait_share >= MODERATE_WAIT_SHARE {
        Severity::Moderate
    } else {
        Severity::Low
    }
}

impl<'a> Facts<'a> {
    pub fn new(s: &'a Summary) -> Facts<'a> {
        let p = Pipeline::from_summary(s);
        let cap = p.capacity();
        let m = &s.machine;
        let cpu_device = s.trains_on_cpu();
        let gpu_present = !m.devices.is_empty();
        // Unused when the run says it trains on the CPU and either NVML could see processes and
        // none was the run's, or the run knows its own device (pipeprof's loop, a Rust program:
        // `device` is what it trains on, not a guess from a batch). NVML unable to tell (a
        // container hiding processes) about a framework's program is unknown.
        let knows_device = s.settings.framework.is_own() && !s.settings.device.is_unseen();
        let gpu_unused = gpu_present && cpu_device && (knows_device || m.this_process_on_gpu == Some(false));
        let used: Vec<f64> = m
            .devices
            .iter()
            .filter(|d| d.this_process_on_gpu == Some(true))
            .filter_map(|d| d.util_mean_pct.map(f64::from))
            .collect();
        let all = || m.devices.iter().filter_map(|d| d.util_mean_pct.map(f64::from));
        let gpu_util = if used.is_empty() { all().reduce(f64::max) } else { used.into_iter().reduce(f64::max) };
        let mut f = Facts {
            s,
            cap,
            severity: severity(s.split.wait_share),
            cpu_device,
            gpu_present,
            gpu_unused,
            gpu_util,
            global_cpu: m.global_cpu_mean_pct.map(f64::from),
            process_cpu: m.process_cpu_mean_pct.map(f64::from),
            wait: measured(s, Stage::Wait),
            overhead: None,
            now: measured_now(s),
            other_cores: m.other_cores_median.map(f64::from).or_else(|| {
                let (p, g) = (m.process_cpu_mean_pct?, m.global_cpu_mean_pct?);
                (m.cores > 0).then(|| (f64::from(g) / 100.0 * m.cores as f64 - f64::from(p) / 100.0).max(0.0))
            }),
            p,
        };
        f.overhead = f.overhead_why();
        f
    }

    fn overhead_why(&self) -> Option<OverheadWhy> {
        if let Some(per_image) = self.in_memory_loader() {
            if self.input_bound() {
                return Some(OverheadWhy::InMemoryLoader(per_image));
            }
        }
        let compute = self.s.split.compute_ms;
        if compute > 0.0 && compute < OVERHEAD_STEP_MS {
            return Some(OverheadWhy::TinyStep(compute));
        }
        if let Some(fixed) = self.p.fixed_step_ms() {
            // An optimizer that dominates a large model is work per parameter: compute.
            if compute > 0.0 && fixed / compute >= FIXED_COST_SHARE && !self.large_model() {
                return Some(OverheadWhy::FixedCost(fixed / compute));
            }
        }
        let gpu_in_use = self.gpu_present && !self.cpu_device && !self.gpu_unused;
        match self.gpu_util {
            Some(u) if gpu_in_use && u < GPU_LOW_UTIL_PCT && self.severity == Severity::Low => {
                Some(OverheadWhy::LowGpu(u))
            }
            _ => None,
        }
    }

    /// The loader's cost per image, ms, when all it does is take samples already in memory:
    /// every loader stage measured is `fetch` or `collate`, together under
    /// [`IN_MEMORY_IMAGE_MS`] per image.
    fn in_memory_loader(&self) -> Option<f64> {
        let loader = &self.p.loader;
        let only = !loader.is_empty()
            && loader.iter().all(|x| matches!(x.stage, Stage::Fetch | Stage::Convert | Stage::Collate));
        let per_image: f64 = loader.iter().map(|x| x.wall_ms).sum();
        (only && per_image < IN_MEMORY_IMAGE_MS).then_some(per_image)
    }

    /// The samples come from files or encoded bytes: a `read` or `decode` stage ran. A loader
    /// that hands out arrays already in memory (torchvision's MNIST, a `TensorDataset`) has
    /// neither, and nothing to pack, copy or pre-resize.
    pub fn samples_from_files(&self) -> bool {
        self.p.loader.iter().any(|x| matches!(x.stage, Stage::Read | Stage::Decode) && x.wall_ms > 0.0)
    }

    /// The threads the run's compute holds the cores with ([`super::readings::compute_threads`]).
    pub fn compute_threads(&self) -> usize {
        super::readings::compute_threads(self.s, self.p.cores)
    }

    /// Training on the CPU in a framework's program, `n` loader worker processes beside its
    /// compute threads would outnumber the cores ([`super::readings::oversubscribed`]; see
    /// [`OVERSUBSCRIBED_TRY_GAIN`]).
    pub fn oversubscribed(&self, n: usize) -> bool {
        super::readings::oversubscribed(self.s, self.cpu_device, self.p.cores, n)
    }

    /// The serial step of a loop that batches in-memory samples itself, when it does.
    pub fn serial_step(&self) -> Option<super::model::SerialStep> {
        let per_image = self.in_memory_loader()?;
        let sp = &self.s.split;
        let optimizer = measured(self.s, Stage::Optimizer).map(|x| x.mean_ms);
        Some(super::model::SerialStep::new(
            sp.wait_ms,
            sp.transfer_ms + sp.compute_ms,
            optimizer,
            per_image,
            self.p.batch,
            self.cpu_device,
        ))
    }

    /// The model has at least [`SMALL_MODEL_PARAMS`] parameters (unknown for a program of the
    /// user's own: then not large).
    fn large_model(&self) -> bool {
        self.s.settings.params >= SMALL_MODEL_PARAMS
    }

    /// The largest part of the compute step: a layer's forward or backward pass (pipeprof's
    /// own model), else the optimizer when it takes at least [`FIXED_COST_SHARE`] of compute.
    pub fn dominant_part(&self) -> Option<ComputePart> {
        if let Some(top) = self.s.compute_parts().into_iter().next() {
            return Some(top);
        }
        let compute = self.s.split.compute_ms;
        let fixed = self.p.fixed_step_ms().filter(|_| compute > 0.0)?;
        (fixed / compute >= FIXED_COST_SHARE).then(|| ComputePart {
            label: "optimizer".into(),
            ms: fixed,
            share: fixed / compute,
        })
    }

    /// How far the model's estimate of today's rate is off the measured one (model / measured
    /// − 1), when both are known.
    pub fn model_off(&self) -> Option<f64> {
        let now = self.now?.rate;
        let m = self.cap.throughput();
        (m.is_finite() && m > 0.0 && now > 0.0).then(|| m / now - 1.0)
    }

    /// The model says the loader outpaces the training loop on average.
    pub fn loader_keeps_up(&self) -> bool {
        self.cap.loader().min(self.cap.shared_cpu) >= self.cap.compute
    }

    pub fn input_bound(&self) -> bool {
        self.severity != Severity::Low
    }

    /// Share of the loader's wall time blocked inside `read` (off-CPU, not waiting for a
    /// core): waiting on storage.
    pub fn read_blocked_share(&self) -> f64 {
        let wall = self.p.loader_wall_ms();
        let blocked = self.read_blocked_ms();
        if wall > 0.0 {
            blocked / wall
        } else {
            0.0
        }
    }

    /// Blocked time per image in the loader's other stages, where it was measured (on-CPU and
    /// run-queue wait both): a sample fetched inside a Python `__getitem__` (a remote store, a
    /// database, a sleep) is timed as one stage that waits off-CPU without reading a file.
    /// Where the run-queue wait was not measured, that off-CPU time may be waiting for a core
    /// and is not counted.
    pub fn other_blocked_ms(&self) -> f64 {
        self.p.loader.iter().filter(|x| x.stage != Stage::Read && x.queue_measured).map(|x| x.blocked_ms()).sum()
    }

    /// Read's blocked time per image (off-CPU, not waiting for a core), ms.
    fn read_blocked_ms(&self) -> f64 {
        self.p.stage(Stage::Read).map_or(0.0, |r| r.blocked_ms())
    }

    /// Whether the loader blocks more inside the samples' other stages (a fetch in a Python
    /// `__getitem__`) than in reading files.
    pub fn blocked_in_dataset(&self) -> bool {
        self.other_blocked_ms() > self.read_blocked_ms()
    }

    /// Share of the loader's time blocked off-CPU (storage, a fetch, a lock), not computing
    /// and not waiting for a core: read's, and the other stages' where measured.
    pub fn loader_blocked_share(&self) -> f64 {
        let wall = self.p.loader_wall_ms();
        if wall > 0.0 {
            self.read_blocked_share() + self.other_blocked_ms() / wall
        } else {
            0.0
        }
    }

    /// Share of the loader stages' wall time runnable without a core (run-queue wait inside
    /// their spans).
    fn loader_core_wait_share(&self) -> f64 {
        let wall = self.p.loader_wall_ms();
        if wall > 0.0 {
            self.p.loader_core_wait_ms() / wall
        } else {
            0.0
        }
    }

    /// Share of the time this run's threads were ready to run that they waited for a core:
    /// from the samplers' per-thread scheduler figures (which also see the waits between
    /// spans: short spans rarely contain a preemption), else from the loader's spans.
    pub fn core_wait_share(&self) -> f64 {
        let spans = self.loader_core_wait_share();
        self.s.machine.threads_core_wait_share().map_or(spans, |t| t.max(spans))
    }

    /// This run's threads wait for a core a material share of the time.
    pub fn contended(&self) -> bool {
        self.core_wait_share() >= CONTENTION_SHARE
    }

    /// The other programs worth naming as holding the cores: [`NAMED_OTHER_PCT`] or more.
    pub fn holders(&self) -> impl Iterator<Item = &probes::sampler::OtherCpu> + '_ {
        self.s.machine.others.iter().filter(|o| f64::from(o.cpu_pct) >= NAMED_OTHER_PCT)
    }

    /// Other programs (or the hypervisor's other guests) hold cores this run could use.
    pub fn competing_load(&self) -> bool {
        let others = self.other_cores.is_some_and(|c| c >= OTHER_CORES);
        let steal = self.s.machine.steal_mean_pct.is_some_and(|s| f64::from(s) >= STEAL_PCT);
        others || steal
    }

    /// The typical step's host→device share: the median copy, not a mean that a few
    /// preempted copies (a 6 ms time slice on a 3 µs copy) decide.
    pub fn transfer_share(&self) -> f64 {
        let sp = &self.s.split;
        let typical = measured(self.s, Stage::Transfer).map_or(sp.transfer_ms, |t| t.p50_ms.min(sp.transfer_ms));
        if sp.mean_step_ms > 0.0 {
            typical / sp.mean_step_ms
        } else {
            0.0
        }
    }

    pub fn cpu_saturated(&self) -> bool {
        let global = self.global_cpu.is_some_and(|g| g >= CPU_SATURATED_PCT);
        let process = self.process_cpu.is_some_and(|p| p >= CPU_SATURATED_PCT * self.p.cores);
        global || process
    }

    pub fn remote_fs(&self) -> Option<&'a probes::fsinfo::FsInfo> {
        self.s.data_fs.as_ref().filter(|fs| fs.kind.is_remote_or_fuse())
    }

    /// Loader CPU is a visible share of the process's CPU work (CPU device only).
    pub fn loader_competes(&self) -> bool {
        let c = self.p.loader_cpu_ms();
        let total = c + self.p.compute_cpu_now_ms();
        self.cpu_device && total > 0.0 && c / total >= COMPETE_SHARE
    }

    /// Training on the CPU beside a `tf.data` pipeline: the loader's share of this process's
    /// CPU per image (its map and loading over those and the step's), when both are known.
    pub fn tf_map_cpu_share(&self) -> Option<f64> {
        if !(self.s.settings.tf_data && self.cpu_device) {
            return None;
        }
        let loader = self.p.loader_cpu_ms();
        let total = loader + self.p.compute_cpu_now_ms();
        (loader > 0.0 && total.is_finite()).then(|| loader / total)
    }

    /// tf.data's map takes the cores the step needs: at least [`TF_MAP_CPU_SHARE`] of the
    /// process's CPU per image on cores that are all busy. It limits the run even where the
    /// step's wait for its batch is low: the step slows instead of waiting.
    pub fn tf_map_takes_cores(&self) -> bool {
        let busy = self.cpu_saturated() || self.contended();
        busy && self.tf_map_cpu_share().is_some_and(|x| x >= TF_MAP_CPU_SHARE)
    }

    /// Whether the machine alone (no loader spans) points at storage.
    fn machine_says_io(&self) -> bool {
        let iowait = self.s.machine.iowait_mean_pct.is_some_and(|w| f64::from(w) >= IOWAIT_PCT);
        iowait || self.remote_fs().is_some()
    }

    /// The limiter of a run with enough steps (see the module docs of [`super`] for the order).
    pub fn limiter(&self) -> Limiter {
        let sp = &self.s.split;
        // On a CPU device the "transfer" is a copy in host memory: never the limiter.
        let transfer = self.transfer_share();
        if !self.cpu_device && transfer >= TRANSFER_SHARE && transfer >= sp.wait_share {
            return Limiter::Transfer;
        }
        if self.input_bound() {
            if matches!(self.overhead, Some(OverheadWhy::InMemoryLoader(_))) {
                return Limiter::Overhead;
            }
            if self.p.loader.is_empty() {
                // The loader is not instrumented: judge from the machine only.
                return if self.machine_says_io() { Limiter::Io } else { Limiter::Preprocess };
            }
            let blocked = self.loader_blocked_share();
            if self.contended() && self.competing_load() && blocked < IO_OFF_CPU_SHARE {
                return Limiter::Contention;
            }
            return if blocked >= IO_OFF_CPU_SHARE { Limiter::Io } else { Limiter::Preprocess };
        }
        if self.tf_map_takes_cores() {
            return Limiter::Preprocess;
        }
        if self.overhead.is_some() {
            return Limiter::Overhead;
        }
        if self.cap.loader() / self.cap.compute < BALANCED_HEADROOM {
            return Limiter::Balanced;
        }
        Limiter::Compute
    }

    pub fn flags(&self, limiter: &Limiter) -> Vec<Flag> {
        let mut flags: Vec<Flag> =
            self.s.settings.simulated.iter().map(|w| Flag::Simulated { what: w.clone() }).collect();
        if let Some(d) = self.s.diverged {
            flags.insert(0, Flag::Diverged { first_nan: d.first_nan, first_inf: d.first_inf });
        }
        flags.extend(self.s.stalls.iter().cloned().map(Flag::Stalled));
        if self.gpu_unused {
            flags.push(Flag::GpuUnused);
        }
        if let Some(fs) = self.remote_fs() {
            flags.push(Flag::NetworkStorage { fs_type: fs.fs_type.clone() });
        }
        if matches!(limiter, Limiter::NotEnoughData { .. }) {
            return flags;
        }
        if self.contended() {
            flags.push(Flag::CoreContention {
                share: self.core_wait_share(),
                others: self.holders().map(|o| o.name.clone()).collect(),
                external: self.competing_load(),
            });
        } else if self.cpu_saturated() && *limiter != Limiter::Io {
            // Saturated cores do not stop workers that wait on storage (they need no core),
            // and with contention measured the flag above says more.
            flags.push(Flag::CpuSaturated);
        }
        let (workers, cores) = (self.s.settings.workers, self.p.cores as usize);
        let idle = self.global_cpu.is_none_or(|g| g < CPU_IDLE_PCT);
        // Cores idle between compute's bursts are not free when compute's threads hold them all.
        if *limiter == Limiter::Preprocess && workers.max(1) < cores && idle && !self.oversubscribed(workers + 1) {
            flags.push(Flag::TooFewWorkers { workers, cores });
        }
        if self.loader_competes() {
            flags.push(Flag::ComputeCompetesWithLoader);
        }
        if self.overhead.is_some() {
            flags.push(Flag::TinyModel);
        }
        if let Some(share) = self.s.validation_share().filter(|v| *v >= VALIDATION_SHARE) {
            flags.push(Flag::ValidationHeavy { share });
        }
        flags
    }
}
