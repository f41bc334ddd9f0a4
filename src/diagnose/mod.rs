//! Statistics → verdict, evidence, flags and advice with predicted gains. Pure: data in, data
//! out, no clocks, no I/O, no threads.
//!
//! `classify` decides (limiter, severity, flags) from the [`model`]'s capacities and the
//! [`thresholds`]; `evidence` and `advice` put the decision into words and typed [`Change`]s.
//! Rendering a verdict belongs to the views (`report`, `tui`).
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
//!    parameter count, not the batch) ≥ [`FIXED_COST_SHARE`] (50%) of compute in a model under
//!    [`SMALL_MODEL_PARAMS`] (1 M) parameters (a larger one's optimizer is work per parameter:
//!    `Compute`, "(optimizer)", with its ns per parameter as evidence), or the GPU in use is
//!    busy < [`GPU_LOW_UTIL_PCT`] (50%) on average while the loop does not wait.
//! 5. `Balanced` — not input-bound, and the loader could supply less than
//!    [`BALANCED_HEADROOM`] (1.2×) what the training loop takes: both sides near their limit.
//! 6. `Compute` — otherwise: the model's computation dominates (the healthy case). With
//!    per-layer times (pipeprof's own model), the headline names the largest part of compute:
//!    a layer's forward or backward pass, or the optimizer.
//!
//! # Flags
//! `Simulated` (each entry of `settings.simulated`); `GpuUnused` (NVML lists a GPU, the run
//! trains on the CPU, and NVML could list processes and none was the run's: when it cannot
//! tell, as in a container that hides them, the GPU's use is unknown, never "unused"); `NetworkStorage` (data folder on a
//! network or FUSE filesystem); `CpuSaturated` (machine CPU ≥ [`CPU_SATURATED_PCT`] or this
//! process ≥ 90% × cores); `TooFewWorkers` (`Preprocess`, workers < cores and machine CPU
//! < [`CPU_IDLE_PCT`]); `ComputeCompetesWithLoader` (CPU device and the loader's CPU ≥
//! [`COMPETE_SHARE`] of loader + compute CPU per image); `TinyModel` (the `Overhead` condition,
//! whatever the limiter).
//!
//! # Predicted gains
//! [`model`]: throughput = min(workers / loader wall per image, free cores / loader CPU per
//! image, on a CPU device free cores / (loader + compute CPU per image), batch / (transfer +
//! compute per step)). An action rebuilds the pipeline with one change; its gain is the model's
//! throughput after the change over the **measured** rate now ([`measured_now`]: the steady
//! state, steps a–b), never over the model's own estimate of today ([`gain_against_measured`]).
//! Where that estimate is off the measured rate by more than [`MODEL_OFF_SHARE`], the evidence
//! says so and the gain is a range ([`Basis::range`]). Advice is given when the gain is ≥
//! [`MIN_GAIN`], or when no number can be predicted but the action is still the fix (use the
//! GPU, a tiny model's bigger batch). Stage costs are trimmed means; on the CPU device an
//! input-bound run's compute step is taken hot, as fed ([`model::hot_compute_ms`]: the lesser
//! of the pool's CPU per step over its overlap and the training thread's CPU less transfer).
//! With other programs holding cores, a change that leaves compute the limit is a range down to
//! the compute's slow steps ([`widen_for_slow_steps`], [`Basis::slow_steps`]).
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

mod advice;
mod classify;
mod diagnosed;
mod evidence;
pub mod frameworks;
pub mod model;
pub mod ranks;
#[cfg(test)]
mod tests;
pub mod thresholds;

pub use advice::CACHE_FILE;
pub use thresholds::*;

pub use classify::{measured_now, Now};
pub use diagnosed::Diagnosed;

use crate::aggregate::Summary;
use serde::{Deserialize, Serialize};

/// What limits the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Limiter {
    /// Storage: the loader waits on reads.
    Io,
    /// The loader's threads wait for a core that other programs hold.
    Contention,
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
    /// The run's threads wait for a core this share of the time they are ready to run: other
    /// programs (named, busiest first) hold the cores or, without `external`, the run's own
    /// threads outnumber them.
    CoreContention { share: f64, others: Vec<String>, external: bool },
    /// The loss stopped being a number (NaN, ±inf): training diverged. The timings are still
    /// measured right.
    Diverged { first_nan: Option<u64>, first_inf: Option<u64> },
    /// A stage has been open past the stall threshold: a read that does not return.
    Stalled(crate::aggregate::Stall),
}

/// What an [`Advice`] changes, typed: views render it, `--check-advice` applies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    /// `--workers N`.
    Workers(usize),
    /// `--batch-size N`.
    BatchSize(usize),
    /// `--prefetch N`.
    Prefetch(usize),
    /// Pack the data into a cache with `pipeprof cache`, then train from it.
    Cache {
        /// The model file whose input size the images are resized to.
        model: String,
        /// The image folder to pack.
        data: String,
    },
    /// `--device D`.
    UseDevice(String),
    /// Pack decoded, resized samples into one memory-mapped file the program's own loader
    /// reads (an attached program that is not a pipeprof `cnn.toml` run: no command for it).
    PackOwnLoader,
    /// A PyTorch or Keras program's image folder packed with `pipeprof pack` and read by
    /// `pipeprof.data.PackedImageFolder` / `pipeprof.keras.packed_dataset` in place of
    /// `ImageFolder` / `image_dataset_from_directory`. From the run's settings: `data` the folder
    /// (empty when unknown), `height` × `width` the model's input (0 when unknown).
    PackFolder { keras: bool, data: String, height: usize, width: usize },
    /// Copy the data set off a network/FUSE mount to a local disk.
    CopyLocal,
    /// Stop, or lower the priority of, the programs that hold the cores.
    FreeCores,
    /// Resize the images offline to the model's input size.
    PreResize { width: usize, height: usize },
    /// Cheaper augmentation, or augmentation on the device.
    CheaperAugment,
    /// Send batches as u8, convert to f32 on the device.
    U8Batches,
    /// Advice read back from a summary file: only its command text was saved, so it is shown
    /// as written and never applied.
    Saved(Option<String>),
    /// A change to the program's own code, in its framework's terms
    /// (`DataLoader(..., num_workers=6)`): shown as written; pipeprof cannot apply it.
    Code(String),
    /// A change to the program's loader arguments (PyTorch `DataLoader`, Keras `PyDataset`),
    /// shown as `code`; `pipeprof run --check-advice` applies `set` through the start-up hook.
    Loader { code: String, set: LoaderKnobs },
}

/// Loader arguments a `pipeprof run` program's start-up hook can set without an edit to it
/// (`pipeprof._override`); `None` leaves the program's own. Keras `PyDataset`: `num_workers`
/// sets `workers` (with `use_multiprocessing`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderKnobs {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_workers: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_workers: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefetch_factor: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pin_memory: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<usize>,
}

/// One concrete action with its predicted effect.
///
/// In JSON the change is written as the `command` it stands for (the summary's schema), and
/// read back as [`Change::Saved`]: verdicts are recomputed from statistics, never from text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "AdviceJson", from = "AdviceJson")]
pub struct Advice {
    /// What to do, in words.
    pub action: String,
    /// The change that does it.
    pub change: Change,
    /// Predicted images/s after / before (e.g. 1.8 = 1.8× faster), when the model can say.
    pub predicted_speedup: Option<f64>,
    /// Why this should help, with the number behind the prediction.
    pub reason: String,
    /// What the predicted gain is measured against: today's measured rate and the model's rate
    /// after the change. `None` for advice whose gain is not the capacity model's.
    pub basis: Option<Basis>,
}

/// A predicted gain and what it stands on: `predicted_speedup` = `predicted` / `now`, never
/// over the model's own estimate of today's rate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Basis {
    /// Images/s measured now, over the steady state (steps `from_step`–`to_step`: after the
    /// start-up and the last change of workers).
    pub now: f64,
    pub from_step: u64,
    pub to_step: u64,
    /// Images/s the model predicts after the change.
    pub predicted: f64,
    /// The model's own estimate of today's rate, images/s.
    pub model_now: f64,
    /// Where the model's estimate of today is off the measured rate by more than
    /// [`MODEL_OFF_SHARE`]: the gain as a range (low, high), whose ends read the prediction
    /// against the measured rate and against the model's.
    pub range: Option<(f64, f64)>,
    /// The range takes in the compute's slow steps: other programs hold cores, and which
    /// steps the scheduler slows is theirs to decide ([`widen_for_slow_steps`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub slow_steps: bool,
    /// The range is how much of compute grows with the batch, which one run on the CPU
    /// cannot tell (from none of it to all of it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compute_split_unknown: bool,
}

/// The gain of a change from the model's rates before (`model_now`) and after (`after`) and
/// the measured rate today (`now`): after over measured, and a range when the model's today is
/// off the measured by more than [`MODEL_OFF_SHARE`]: from after/measured to after/model (the
/// model may be as far off after the change as before). `None` without three finite, positive
/// rates. Pure.
pub fn gain_against_measured(now: f64, model_now: f64, after: f64) -> Option<(f64, Option<(f64, f64)>)> {
    let ok = |x: f64| x.is_finite() && x > 0.0;
    if !(ok(now) && ok(after)) {
        return None;
    }
    let g = after / now;
    if !ok(model_now) || (model_now / now - 1.0).abs() <= MODEL_OFF_SHARE {
        return Some((g, None));
    }
    let other = after / model_now;
    Some((g, Some((g.min(other), g.max(other)))))
}

/// A gain `g` (with its range, if any) widened to take in `slow`, the gain if the compute runs
/// at its slow steps (CPU contention from other programs: which steps the scheduler slows is
/// not this run's to decide). Unchanged where `slow` is not finite and positive or inside the
/// range already. Pure.
pub fn widen_for_slow_steps(g: f64, range: Option<(f64, f64)>, slow: Option<f64>) -> Option<(f64, f64)> {
    let Some(slow) = slow.filter(|x| x.is_finite() && *x > 0.0) else { return range };
    let (lo, hi) = range.unwrap_or((g, g));
    let (lo, hi) = (lo.min(slow), hi.max(slow));
    (lo < hi).then_some((lo, hi))
}

/// [`Advice`] as the summary JSON stores it.
#[derive(Serialize, Deserialize)]
struct AdviceJson {
    action: String,
    command: Option<String>,
    predicted_speedup: Option<f64>,
    reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    basis: Option<Basis>,
}

impl From<Advice> for AdviceJson {
    fn from(a: Advice) -> AdviceJson {
        AdviceJson {
            command: a.change.command(),
            action: a.action,
            predicted_speedup: a.predicted_speedup,
            reason: a.reason,
            basis: a.basis,
        }
    }
}

impl From<AdviceJson> for Advice {
    fn from(a: AdviceJson) -> Advice {
        Advice {
            action: a.action,
            change: Change::Saved(a.command),
            predicted_speedup: a.predicted_speedup,
            reason: a.reason,
            basis: a.basis,
        }
    }
}

impl Advice {
    /// "now 1322 images/s (measured over steps 2–30) → predicted 2217 images/s (×1.68)", with
    /// a range where the model is off today's rate; the bare gain for advice with no basis.
    pub fn gain_words(&self) -> Option<String> {
        let Some(b) = &self.basis else {
            return self.predicted_speedup.map(|g| format!("≈{g:.1}× images/s"));
        };
        let g = self.predicted_speedup?;
        let then = match b.range {
            Some((lo, hi)) => format!(
                "predicted {}–{} (×{lo:.1}–{hi:.1}: {})",
                crate::units::rate(lo * b.now).trim_end_matches(" images/s"),
                crate::units::rate(hi * b.now).trim_start_matches('≈'),
                match (b.slow_steps, b.model_now / b.now - 1.0) {
                    _ if b.compute_split_unknown => "how much of forward+backward grows with the batch",
                    (true, off) if off.abs() > MODEL_OFF_SHARE => {
                        "the model is off today's rate, and other programs slow some compute steps"
                    }
                    (true, _) => "other programs hold cores: the compute's typical step to its slow ones",
                    (false, _) => "the model is off today's rate",
                }
            ),
            None => format!("predicted {} (×{g:.1})", crate::units::rate(b.predicted)),
        };
        Some(format!(
            "now {} (measured over steps {}–{}) → {then}",
            crate::units::rate(b.now).replacen('≈', "", 1),
            b.from_step,
            b.to_step
        ))
    }
}

impl Advice {
    /// The live view's compact form: "now 1322 → ≈2217 images/s (×1.7)", a range as
    /// "now 23.4 → 185–1200 images/s (×7.9–51.3)"; the bare gain for advice with no basis.
    pub fn gain_short(&self) -> Option<String> {
        let g = self.predicted_speedup.filter(|x| x.is_finite() && *x > 0.0)?;
        let Some(b) = &self.basis else {
            return Some(format!("≈{g:.1}× images/s"));
        };
        let bare = |x: f64| crate::units::rate(x).replacen('≈', "", 1).trim_end_matches(" images/s").to_string();
        let then = match b.range {
            Some((lo, hi)) => format!("{}–{} images/s (×{lo:.1}–{hi:.1})", bare(lo * b.now), bare(hi * b.now)),
            None => format!("≈{} images/s (×{g:.1})", bare(b.predicted)),
        };
        Some(format!("now {} → {then}", bare(b.now)))
    }
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
    /// Given early before [`MIN_STEPS`] (≥ [`EARLY_STEPS`] steps of ≥ [`EARLY_STEP_MS`], or ≥
    /// [`EARLY_MIN_STEPS`] steps and [`EARLY_TIME_MS`] measured): may change once the usual
    /// window fills.
    #[serde(default)]
    pub provisional: bool,
}

/// Diagnoses a summary of a run still going (a window, or the whole run so far): too few
/// steps wait for more.
pub fn diagnose(s: &Summary) -> Verdict {
    judge(s, false)
}

/// Diagnoses a finished run: whatever steps it measured give a verdict (provisional when
/// short), never "collecting…" — no more steps are coming.
pub fn diagnose_finished(s: &Summary) -> Verdict {
    judge(s, true)
}

fn judge(s: &Summary, finished: bool) -> Verdict {
    let f = classify::Facts::new(s);
    let sp = &s.split;
    let measured = sp.mean_step_ms.is_finite() && sp.mean_step_ms > 0.0;
    // Slow steps answer early: three 4-second steps say as much as five.
    let long_steps = sp.steps >= EARLY_STEPS && sp.mean_step_ms >= EARLY_STEP_MS;
    let long_run = sp.steps >= EARLY_MIN_STEPS && sp.steps as f64 * sp.mean_step_ms >= EARLY_TIME_MS;
    let over = finished && sp.steps >= 1;
    let early = sp.steps < MIN_STEPS && (long_steps || long_run || over);
    // A change of workers too recent to judge the new pipeline alone: the whole run decides,
    // and says so.
    let provisional = early || sp.changed_at.is_some();
    let limiter = if (sp.steps < MIN_STEPS && !early) || !measured {
        Limiter::NotEnoughData { steps_needed: MIN_STEPS.saturating_sub(sp.steps) }
    } else {
        f.limiter()
    };
    let flags = f.flags(&limiter);
    if let Limiter::NotEnoughData { steps_needed } = limiter {
        return Verdict {
            headline: evidence::not_enough_headline(steps_needed),
            limiter,
            severity: Severity::Low,
            evidence: Vec::new(),
            flags,
            advice: Vec::new(),
            provisional: false,
        };
    }
    let headline = f.headline(&limiter);
    Verdict {
        headline: match sp.changed_at {
            Some(k) => evidence::provisional_after_change(&headline, k, sp.steps, s.settings.workers),
            None if early => evidence::provisional(&headline, sp.steps, sp.mean_step_ms),
            None => headline,
        },
        provisional,
        evidence: f.evidence(&limiter),
        advice: frameworks::in_user_terms(f.advice(&limiter, &flags), s),
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
            Limiter::Contention => "CPU contention (other programs)",
            Limiter::Preprocess => "CPU preprocessing",
            Limiter::Transfer => "host→device transfer",
            Limiter::Compute => "compute",
            Limiter::Overhead => "per-step overhead",
            Limiter::Balanced => "balanced",
            Limiter::NotEnoughData { .. } => "not enough data",
        }
    }
}

impl Severity {
    /// HIGH / moderate / low.
    pub fn label(&self) -> &'static str {
        match self {
            Severity::High => "HIGH",
            Severity::Moderate => "moderate",
            Severity::Low => "low",
        }
    }
}

/// "loss is NaN from step 412 (inf at 410)": where the loss stopped being a number.
pub fn loss_words(first_nan: Option<u64>, first_inf: Option<u64>) -> String {
    match (first_nan, first_inf) {
        (Some(n), Some(i)) => format!("loss is NaN from step {n} (inf at {i})"),
        (Some(n), None) => format!("loss is NaN from step {n}"),
        (None, Some(i)) => format!("loss is inf from step {i}"),
        (None, None) => "loss is not a number".into(),
    }
}

/// "loader-0 has been reading a/zz_pipe.png for 45 s", or for a thread the run left behind
/// "… was still reading … after 19 s when the run ended".
pub fn stall_words(s: &crate::aggregate::Stall) -> String {
    let doing = match s.stage.as_str() {
        "read" => "reading".to_string(),
        "decode" => "decoding".to_string(),
        "resize" => "resizing".to_string(),
        "augment" => "augmenting".to_string(),
        other => format!("in {other} on"),
    };
    if s.abandoned {
        format!(
            "{} was still {doing} {} after {:.0} s when the run ended: left behind (a file that never answers: a FIFO, a hung network drive?)",
            s.thread, s.file, s.open_s
        )
    } else {
        format!("{} has been {doing} {} for {:.0} s", s.thread, s.file, s.open_s)
    }
}

impl Flag {
    /// One line saying what the trap is and what it means.
    pub fn describe(&self) -> String {
        match self {
            Flag::GpuUnused => "GPU present but unused: this run trains on the CPU".into(),
            Flag::NetworkStorage { fs_type } => {
                format!("data on a network/FUSE filesystem ({fs_type}): every image read may be a round trip")
            }
            Flag::CpuSaturated => "CPU saturated: more loader workers will not help".into(),
            Flag::TooFewWorkers { workers: 0, cores } => {
                format!("no loader workers: the training thread loads every batch while {cores} cores sit idle")
            }
            Flag::TooFewWorkers { workers, cores } => {
                format!("too few workers: {workers} on {cores} cores, cores idle while preprocessing limits")
            }
            Flag::TinyModel => "tiny model: the step costs about the same whatever its work".into(),
            Flag::ComputeCompetesWithLoader => {
                "training on the CPU: compute and the loader compete for the same cores".into()
            }
            Flag::Simulated { what } => format!("simulated slowdown active: {what} (not the real hardware)"),
            Flag::CoreContention { share, others, external } => {
                let who = if !external {
                    "this run's own threads outnumber the cores".to_string()
                } else if others.is_empty() {
                    "other programs or guests hold the cores".to_string()
                } else {
                    format!("other programs hold the cores: {}", others.join(", "))
                };
                format!("CPU contention: this run's threads wait for a core {:.0}% of the time they are ready to run; {who}", share * 100.0)
            }
            Flag::Diverged { first_nan, first_inf } => {
                format!("{}: training diverged — lower the learning rate; the timings stay valid", loss_words(*first_nan, *first_inf))
            }
            Flag::Stalled(s) => stall_words(s),
            Flag::ValidationHeavy { share } => format!(
                "validation passes take {:.0}% of the run's wall time: validate less often, on a smaller held-out set, or with a larger batch (no gradients to store)",
                share * 100.0
            ),
        }
    }
}
