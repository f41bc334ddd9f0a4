//! Statistics → verdict, evidence, flags and advice with predicted gains. Pure: data in, data
//! out, no clocks, no I/O, no threads.
//!
//! `classify` decides (limiter, severity, flags) from the [`model`]'s capacities and the
//! [`thresholds`]; `findings` lists the evidence typed and `evidence` words it; `advice` decides
//! typed [`Change`]s with a typed reason (`why`), which `frameworks::in_user_terms` words last,
//! once, in the run's own terms.
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
//!    A `tf.data` pipeline beside training on the CPU is `Preprocess` also where its step
//!    hardly waits: when its map takes [`TF_MAP_CPU_SHARE`] (60%) or more of the process's CPU
//!    per image on cores that are all busy (the step slows instead of waiting: the map's
//!    threads take the cores it needs).
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
//! input-bound run's compute step is taken hot, as fed ([`readings::hot_compute_ms`]: the lesser
//! of the pool's CPU per step over its overlap and the training thread's CPU less transfer).
//! With other programs holding cores, a change that leaves compute the limit is a range down to
//! the compute's slow steps ([`widen_for_slow_steps`], [`Basis::slow_steps`]).
//!
//! Actions and what they change: `--workers N` (N up to the cores; up to 4 per core for I/O,
//! whose waits need no core); packed cache (read becomes a memory copy, decode and resize
//! vanish); pre-resize offline (resize × 0.1, decode × 0.5: decode follows the pixel count,
//! unknown here); copy off a network/FUSE mount (a read, decode's lazy reads included, ≤ 0.25
//! ms; where the reads blocked half the loader's time, its CPU work as measured, cold: a floor,
//! [`Basis::floor`]); bigger batch
//! (the optimizer step stays, forward + backward and transfer scale with the batch); u8 batches
//! (transfer ÷ 4). `--prefetch` is advised only when the loader keeps up on average and the wait
//! is spiky (median ≤ ¼ of the mean, or p95 ≥ 3× the mean): its gain is measured step time over
//! transfer + compute, at most the model's throughput. A GPU's gain is never predicted.
//!
//! The first wait of a run includes filling the pipeline; short runs overstate the wait share.

mod advice;
mod classify;
mod command;
pub mod compare;
mod diagnosed;
pub mod estimates;
mod evidence;
mod findings;
pub mod frameworks;
pub mod job;
pub mod measures;
pub mod model;
mod now;
pub mod ranks;
pub mod readings;
#[cfg(test)]
mod tests;
pub mod thresholds;
mod types;
mod why;
mod words;

pub use advice::{gain_against_measured, widen_for_slow_steps};
pub use command::CACHE_FILE;
pub use thresholds::*;
pub use types::*;
pub use words::{loss_words, stall_words};

pub use diagnosed::Diagnosed;
pub use now::{measured_now, Now};

use crate::aggregate::Summary;

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
            headline: if finished && sp.steps == 0 {
                evidence::ended_before_a_step()
            } else {
                evidence::not_enough_headline(steps_needed)
            },
            limiter,
            severity: Severity::Low,
            evidence: Vec::new(),
            measures: Vec::new(),
            flags,
            advice: Vec::new(),
            provisional: false,
            now: measured_now(s),
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
        now: measured_now(s),
        evidence: f.evidence(&limiter),
        measures: f.measures(&limiter),
        advice: frameworks::in_user_terms(f.advice(&limiter, &flags), s),
        severity: f.severity,
        limiter,
        flags,
    }
}
