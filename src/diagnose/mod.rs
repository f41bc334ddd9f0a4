//! Statistics → verdict, evidence, flags and advice with predicted gains. Pure: data in, data
//! out, no clocks, no I/O.
//!
//! (Types fixed; the rules are being written.)

use crate::aggregate::Summary;
use serde::Serialize;

/// What limits the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Severity {
    High,
    Moderate,
    Low,
}

/// The classic traps, flagged whatever the limiter.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
}

/// One concrete action with its predicted effect.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize)]
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

/// Diagnoses a summary (a window or the whole run).
pub fn diagnose(s: &Summary) -> Verdict {
    let needed = MIN_STEPS.saturating_sub(s.split.steps);
    Verdict {
        limiter: Limiter::NotEnoughData { steps_needed: needed },
        severity: Severity::Low,
        headline: format!("collecting… {needed} steps to go"),
        evidence: Vec::new(),
        flags: Vec::new(),
        advice: Vec::new(),
    }
}

/// The verdict block of the plain report.
pub fn render(v: &Verdict) -> String {
    format!("\nverdict: {}\n", v.headline)
}
