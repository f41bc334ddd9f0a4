//! Classification: the facts every rule reads, the limiter, the severity and the flags. No words
//! here: [`super::evidence`] and [`super::advice`] explain what this module decided.

use super::model::{is_cpu_device, Capacity, Pipeline};
use super::thresholds::*;
use super::{Flag, Limiter, Severity};
use crate::aggregate::{StageSummary, Summary};
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
}

/// A stage's statistics, when it has at least one span.
pub(super) fn measured(s: &Summary, stage: Stage) -> Option<&StageSummary> {
    s.stages.iter().find(|x| x.is(stage) && x.count > 0)
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
        let cpu_device = is_cpu_device(&s.settings.device);
        let gpu_present = !m.devices.is_empty();
        let gpu_unused = gpu_present && (cpu_device || m.this_process_on_gpu == Some(false));
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
            p,
        };
        f.overhead = f.overhead_why();
        f
    }

    fn overhead_why(&self) -> Option<OverheadWhy> {
        let compute = self.s.split.compute_ms;
        if compute > 0.0 && compute < OVERHEAD_STEP_MS {
            return Some(OverheadWhy::TinyStep(compute));
        }
        if let Some(fixed) = self.p.fixed_step_ms() {
            if compute > 0.0 && fixed / compute >= FIXED_COST_SHARE {
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

    /// The model says the loader outpaces the training loop on average.
    pub fn loader_keeps_up(&self) -> bool {
        self.cap.loader().min(self.cap.shared_cpu) >= self.cap.compute
    }

    pub fn input_bound(&self) -> bool {
        self.severity != Severity::Low
    }

    /// Share of the loader's wall time spent off-CPU inside `read`: waiting on storage.
    pub fn read_off_share(&self) -> f64 {
        let wall = self.p.loader_wall_ms();
        let off = self.p.stage(Stage::Read).map_or(0.0, |r| r.off_cpu_ms());
        if wall > 0.0 {
            off / wall
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
        let total = c + self.p.compute_cpu_ms_per_image;
        self.cpu_device && total > 0.0 && c / total >= COMPETE_SHARE
    }

    /// Whether the machine alone (no loader spans) points at storage.
    fn machine_says_io(&self) -> bool {
        let iowait = self.s.machine.iowait_mean_pct.is_some_and(|w| f64::from(w) >= IOWAIT_PCT);
        iowait || self.remote_fs().is_some()
    }

    /// The limiter of a run with enough steps (see the module docs of [`super`] for the order).
    pub fn limiter(&self) -> Limiter {
        let sp = &self.s.split;
        if sp.transfer_share >= TRANSFER_SHARE && sp.transfer_share >= sp.wait_share {
            return Limiter::Transfer;
        }
        if self.input_bound() {
            let io = if self.p.loader.is_empty() {
                // The loader is not instrumented: judge from the machine only.
                self.machine_says_io()
            } else {
                self.read_off_share() >= IO_OFF_CPU_SHARE
            };
            return if io { Limiter::Io } else { Limiter::Preprocess };
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
        if self.gpu_unused {
            flags.push(Flag::GpuUnused);
        }
        if let Some(fs) = self.remote_fs() {
            flags.push(Flag::NetworkStorage { fs_type: fs.fs_type.clone() });
        }
        if matches!(limiter, Limiter::NotEnoughData { .. }) {
            return flags;
        }
        if self.cpu_saturated() {
            flags.push(Flag::CpuSaturated);
        }
        let (workers, cores) = (self.s.settings.workers.max(1), self.p.cores as usize);
        let idle = self.global_cpu.is_none_or(|g| g < CPU_IDLE_PCT);
        if *limiter == Limiter::Preprocess && workers < cores && idle {
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
