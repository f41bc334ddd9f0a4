//! Statistics → verdict, evidence, flags and advice with predicted gains. Pure: data in, data
//! out, no clocks, no I/O, no threads.
//!
//! # Severity
//! From the share of step time the training loop spent waiting for its batch (the `wait`
//! span), with TensorFlow's profiler thresholds: ≥ [`HIGH_WAIT_SHARE`] (20%) HIGH,
//! ≥ [`MODERATE_WAIT_SHARE`] (5%) moderate, else low. Unlike TensorFlow, host→device copies are
//! not counted as input time: they have their own limiter and their own fixes.
//!
//! # Limiter, in order
//! 1. `NotEnoughData` — fewer than [`MIN_STEPS`] steps, or no wait/transfer/compute spans.
//! 2. `Transfer` — transfer ≥ [`TRANSFER_SHARE`] (20%) of the step and ≥ the wait share.
//! 3. Input-bound (severity moderate or HIGH): the loader's per-image wall time (read + decode +
//!    resize + augment means) is split into on-CPU (wall × measured on-CPU share) and off-CPU.
//!    `Io` when read's off-CPU time is ≥ [`IO_OFF_CPU_SHARE`] (50%) of the loader's wall time
//!    (waiting on storage), else `Preprocess` (CPU work, including waiting for a core inside
//!    decode/resize). The stage name only decides which off-CPU time counts as storage; the
//!    on-CPU clock decides the rest. Without loader spans: `Io` if iowait ≥ [`IOWAIT_PCT`] or
//!    the data is on a network/FUSE mount, else `Preprocess`.
//! 4. `Overhead` — not input-bound and the step's cost does not follow its work: compute
//!    < [`OVERHEAD_STEP_MS`] (5 ms) per step, or the optimizer step (whose cost follows the
//!    parameter count, not the batch) ≥ [`FIXED_COST_SHARE`] (50%) of compute, or the GPU in use
//!    is busy < [`GPU_LOW_UTIL_PCT`] (50%) on average while the loop does not wait.
//! 5. `Balanced` — not input-bound, and the loader could supply less than
//!    [`BALANCED_HEADROOM`] (1.2×) what the training loop takes: both sides near their limit.
//! 6. `Compute` — otherwise: the model's computation dominates (the healthy case).
//!
//! # Flags
//! `Simulated` (each entry of `settings.simulated`); `GpuUnused` (NVML lists a GPU and the
//! device is `cpu`, or NVML never saw this process on one); `NetworkStorage` (data folder on a
//! network or FUSE filesystem); `CpuSaturated` (machine CPU ≥ [`CPU_SATURATED_PCT`] or this
//! process ≥ 90% × cores); `TooFewWorkers` (`Preprocess`, workers < cores and machine CPU
//! < [`CPU_IDLE_PCT`]); `ComputeCompetesWithLoader` (CPU device and the loader's CPU ≥
//! [`COMPETE_SHARE`] of loader + compute CPU per image); `TinyModel` (the `Overhead` condition,
//! whatever the limiter).
//!
//! # Predicted gains
//! [`model`]: throughput = min(workers / loader wall per image, free cores / loader CPU per
//! image, on a CPU device free cores / (loader + compute CPU per image), batch / (transfer +
//! compute per step)). An action rebuilds the pipeline with one change and predicts the ratio
//! of throughputs; advice is given when the gain is ≥ [`MIN_GAIN`], or when no number can be
//! predicted but the action is still the fix (use the GPU, a tiny model's bigger batch).
//!
//! Actions and what they change: `--workers N` (N up to the cores; up to 4 per core for I/O,
//! whose waits need no core); packed cache (read becomes a memory copy, decode and resize
//! vanish); pre-resize offline (resize × 0.1, decode × 0.5: decode follows the pixel count,
//! unknown here); copy off a network/FUSE mount (read's off-CPU wait ≤ 0.5 ms); bigger batch
//! (the optimizer step stays, forward + backward and transfer scale with the batch); u8 batches
//! (transfer ÷ 4). `--prefetch` is advised only when the loader keeps up on average and the wait
//! is spiky (median ≤ ¼ of the mean, or p95 ≥ 3× the mean): its gain is measured step time over
//! transfer + compute, at most the model's throughput. A GPU's gain is never predicted.
//!
//! The first wait of a run includes filling the pipeline; short runs overstate the wait share.

mod diagnosed;
pub mod model;
mod rules;
#[cfg(test)]
mod tests;

pub use diagnosed::Diagnosed;

use crate::aggregate::Summary;
use serde::{Deserialize, Serialize};

/// What limits the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Limiter {
    /// Storage: the loader waits on reads.
    Io,
    /// CPU decode / resize / augment in the loader.
    Preprocess,
    /// Host → device copies.
    Transfer,
    /// The model's own computation (GPU, or CPU when training on the CPU).
    Compute,
    /// Per-step fixed cost of a tiny model.
    Overhead,
    /// Nothing stands out.
    Balanced,
    /// Too few steps measured yet.
    NotEnoughData { steps_needed: u64 },
}

/// How input-bound the run is, from the share of step time spent waiting for data
/// (TensorFlow's profiler: ≥ 20% high, ≥ 5% moderate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Severity {
    High,
    Moderate,
    Low,
}

/// The classic traps, flagged whatever the limiter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Flag {
    /// A GPU is present but this process does not use it.
    GpuUnused,
    /// The data folder is on a network or FUSE filesystem.
    NetworkStorage { fs_type: String },
    /// The CPU is saturated: more workers will not help.
    CpuSaturated,
    /// Cores are idle while preprocessing limits.
    TooFewWorkers { workers: usize, cores: usize },
    /// Step time barely depends on work: per-step overhead dominates.
    TinyModel,
    /// Training on the CPU: compute and the loader share the same cores.
    ComputeCompetesWithLoader,
    /// A simulated slowdown (--throttle-read, --slow) is active.
    Simulated { what: String },
    /// Validation passes take a large share of the run's wall time.
    ValidationHeavy { share: f64 },
}

/// One concrete action with its predicted effect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Advice {
    /// What to do, in words.
    pub action: String,
    /// A command or flag that does it, when there is one.
    pub command: Option<String>,
    /// Predicted images/s after / before (e.g. 1.8 = 1.8× faster), when the model can say.
    pub predicted_speedup: Option<f64>,
    /// Why this should help, with the number behind the prediction.
    pub reason: String,
}

/// The diagnosis of one window (or the whole run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub limiter: Limiter,
    pub severity: Severity,
    /// One line: what limits the run and how much.
    pub headline: String,
    /// The 3–5 numbers that decided it, in words.
    pub evidence: Vec<String>,
    pub flags: Vec<Flag>,
    /// Best first.
    pub advice: Vec<Advice>,
}

/// Steps needed before a verdict is given.
pub const MIN_STEPS: u64 = 5;

/// Wait share at or above which the run is highly input-bound (TensorFlow's profiler).
pub const HIGH_WAIT_SHARE: f64 = 0.20;
/// Wait share at or above which the run is moderately input-bound (TensorFlow's profiler).
pub const MODERATE_WAIT_SHARE: f64 = 0.05;
/// Transfer share at or above which host→device copies limit (when ≥ the wait share).
pub const TRANSFER_SHARE: f64 = 0.20;
/// Share of the loader's wall time off-CPU in `read` at or above which an input-bound run is
/// I/O-bound.
pub const IO_OFF_CPU_SHARE: f64 = 0.5;
/// Machine iowait % that marks an uninstrumented loader as I/O-bound.
pub const IOWAIT_PCT: f64 = 20.0;
/// Compute per step under which fixed per-step costs dominate, ms.
pub const OVERHEAD_STEP_MS: f64 = 5.0;
/// Share of compute in the batch-independent optimizer step marking a per-step-overhead run.
pub const FIXED_COST_SHARE: f64 = 0.5;
/// Mean GPU utilisation % under which a not-input-bound GPU run is overhead-bound.
pub const GPU_LOW_UTIL_PCT: f64 = 50.0;
/// Loader capacity / compute capacity under which the run is balanced.
pub const BALANCED_HEADROOM: f64 = 1.2;
/// Machine CPU % at or above which the CPU is saturated.
pub const CPU_SATURATED_PCT: f64 = 90.0;
/// Machine CPU % under which cores count as idle (too few workers).
pub const CPU_IDLE_PCT: f64 = 75.0;
/// Loader share of the process's CPU per image at or above which it competes with CPU compute.
pub const COMPETE_SHARE: f64 = 0.10;
/// Share of wall time in validation passes from which it is flagged.
pub const VALIDATION_SHARE: f64 = 0.10;
/// Smallest predicted gain worth advising.
pub const MIN_GAIN: f64 = 1.10;

/// Diagnoses a summary (a window or the whole run).
pub fn diagnose(s: &Summary) -> Verdict {
    let f = rules::Facts::new(s);
    let sp = &s.split;
    let measured = sp.mean_step_ms.is_finite() && sp.mean_step_ms > 0.0;
    let limiter = if sp.steps < MIN_STEPS || !measured {
        Limiter::NotEnoughData { steps_needed: MIN_STEPS.saturating_sub(sp.steps) }
    } else {
        f.limiter()
    };
    let flags = f.flags(&limiter);
    if let Limiter::NotEnoughData { steps_needed } = limiter {
        return Verdict {
            headline: rules::not_enough_headline(steps_needed),
            limiter,
            severity: Severity::Low,
            evidence: Vec::new(),
            flags,
            advice: Vec::new(),
        };
    }
    Verdict {
        headline: f.headline(&limiter),
        evidence: f.evidence(&limiter),
        advice: f.advice(&limiter, &flags),
        severity: f.severity,
        limiter,
        flags,
    }
}

impl Limiter {
    /// A short name for reports and views.
    pub fn label(&self) -> &'static str {
        match self {
            Limiter::Io => "I/O (storage)",
            Limiter::Preprocess => "CPU preprocessing",
            Limiter::Transfer => "host→device transfer",
            Limiter::Compute => "compute",
            Limiter::Overhead => "per-step overhead",
            Limiter::Balanced => "balanced",
            Limiter::NotEnoughData { .. } => "not enough data",
        }
    }
}

impl Flag {
    /// One line saying what the trap is and what it means.
    pub fn describe(&self) -> String {
        match self {
            Flag::GpuUnused => "GPU present but unused: this process does not train on it".into(),
            Flag::NetworkStorage { fs_type } => {
                format!("data on a network/FUSE filesystem ({fs_type}): every image read may be a round trip")
            }
            Flag::CpuSaturated => "CPU saturated: more loader workers will not help".into(),
            Flag::TooFewWorkers { workers, cores } => {
                format!("too few workers: {workers} on {cores} cores, cores idle while preprocessing limits")
            }
            Flag::TinyModel => "tiny model: the step costs about the same whatever its work".into(),
            Flag::ComputeCompetesWithLoader => {
                "training on the CPU: compute and the loader compete for the same cores".into()
            }
            Flag::Simulated { what } => format!("simulated slowdown active: {what} (not the real hardware)"),
            Flag::ValidationHeavy { share } => format!(
                "validation passes take {:.0}% of the run's wall time: validate less often, on a smaller held-out set, or with a larger batch (no gradients to store)",
                share * 100.0
            ),
        }
    }
}

/// The verdict as a plain-text block for the end-of-run report.
pub fn render(v: &Verdict) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let severity = match v.limiter {
        Limiter::NotEnoughData { .. } => String::new(),
        _ => format!(" · input-bound: {}", v.severity.label()),
    };
    let _ = writeln!(o, "verdict: {}{severity}", v.limiter.label());
    let _ = writeln!(o, "  {}", v.headline);
    if !v.evidence.is_empty() {
        let _ = writeln!(o, "evidence");
        for e in &v.evidence {
            let _ = writeln!(o, "  · {e}");
        }
    }
    if !v.flags.is_empty() {
        let _ = writeln!(o, "flags");
        for f in &v.flags {
            let _ = writeln!(o, "  ! {}", f.describe());
        }
    }
    if !v.advice.is_empty() {
        let _ = writeln!(o, "advice");
        for a in &v.advice {
            let what = a.command.as_deref().unwrap_or(&a.action);
            let gain = a.predicted_speedup.map(|g| format!(": ≈{g:.1}× images/s")).unwrap_or_default();
            let _ = writeln!(o, "  → {what}{gain} ({})", a.reason);
            if a.command.is_some() {
                let _ = writeln!(o, "    {}", a.action);
            }
        }
    }
    o
}
