//! The words of the verdict's types: a limiter's and a severity's labels, what each flag means,
//! and a predicted gain as the report and the live view say it.

use super::thresholds::MODEL_OFF_SHARE;
use super::{Advice, Flag, Limiter, Severity};
use crate::units::rate;

impl Advice {
    /// "now 1322 images/s (measured over steps 2–30) → predicted 2217 images/s (×1.68)", with
    /// a range where the model is off today's rate; the bare gain for advice with no basis.
    pub fn gain_words(&self) -> Option<String> {
        let Some(b) = &self.basis else {
            return self.predicted_speedup.map(|g| format!("≈{g:.1}× images/s"));
        };
        let g = self.predicted_speedup?;
        if b.floor {
            // A floor's range (the model off today's rate) is no ceiling: its low end is the
            // promise.
            let low = b.range.map_or(g, |(lo, _)| lo);
            return Some(format!(
                "now {} (measured over steps {}–{}) → predicted at least {} (×{low:.1})",
                rate(b.now).replacen('≈', "", 1),
                b.from_step,
                b.to_step,
                rate(low * b.now).replacen('≈', "", 1)
            ));
        }
        let then = match b.range {
            Some((lo, hi)) => format!(
                "predicted {}–{} (×{lo:.1}–{hi:.1}: {})",
                rate(lo * b.now).trim_end_matches(" images/s"),
                rate(hi * b.now).trim_start_matches('≈'),
                match (b.slow_steps, b.model_now / b.now - 1.0) {
                    _ if b.compute_split_unknown => "how much of forward+backward grows with the batch",
                    (true, off) if off.abs() > MODEL_OFF_SHARE => {
                        "the model is off today's rate, and other programs slow some compute steps"
                    }
                    (true, _) => "other programs hold cores: the compute's typical step to its slow ones",
                    (false, _) => "the model is off today's rate",
                }
            ),
            None => format!("predicted {} (×{g:.1})", rate(b.predicted)),
        };
        Some(format!(
            "now {} (measured over steps {}–{}) → {then}",
            rate(b.now).replacen('≈', "", 1),
            b.from_step,
            b.to_step
        ))
    }

    /// The live view's compact form: "now 1322 → ≈2217 images/s (×1.7)", a range as
    /// "now 23.4 → 185–1200 images/s (×7.9–51.3)"; the bare gain for advice with no basis.
    pub fn gain_short(&self) -> Option<String> {
        let g = self.predicted_speedup.filter(|x| x.is_finite() && *x > 0.0)?;
        let Some(b) = &self.basis else {
            return Some(format!("≈{g:.1}× images/s"));
        };
        let bare = |x: f64| rate(x).replacen('≈', "", 1).trim_end_matches(" images/s").to_string();
        if b.floor {
            let low = b.range.map_or(g, |(lo, _)| lo);
            return Some(format!("now {} → ≥{} images/s (×≥{low:.1})", bare(b.now), bare(low * b.now)));
        }
        let then = match b.range {
            Some((lo, hi)) => format!("{}–{} images/s (×{lo:.1}–{hi:.1})", bare(lo * b.now), bare(hi * b.now)),
            None => format!("≈{} images/s (×{g:.1})", bare(b.predicted)),
        };
        Some(format!("now {} → {then}", bare(b.now)))
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
