//! What `pipeprof profile` was asked for, as plain data, and its checks: every option is
//! validated here, before anything is created, written or started.

use crate::config::{ModelConfig, Workers};
use crate::data::simulate::{Slow, Throttle};
use crate::export::chrome::TraceLevel;
use anyhow::bail;
use std::path::PathBuf;

/// Largest event channel: 2^24 events × 48 bytes ≈ 800 MB, far past any need.
pub const MAX_CHANNEL_CAPACITY: usize = 1 << 24;
/// Highest sampling rate: the CPU figures refresh at most every 200 ms anyway.
pub const MAX_SAMPLE_HZ: f64 = 1000.0;

/// The options of one profiled run (the command line's `profile` flags).
#[derive(Debug, Clone)]
pub struct Options {
    pub model: Option<PathBuf>,
    pub data: Option<PathBuf>,
    pub val_data: Option<PathBuf>,
    pub epochs: Option<usize>,
    pub steps: Option<u64>,
    pub batch_size: Option<usize>,
    pub workers: Option<Workers>,
    pub prefetch: Option<usize>,
    pub seed: Option<u64>,
    pub device: String,
    pub summary: Option<PathBuf>,
    pub trace: Option<PathBuf>,
    /// `--html`: the report as an HTML page, written when the run ends.
    pub html: Option<PathBuf>,
    pub trace_level: TraceLevel,
    pub sample_hz: f64,
    pub no_gpu: bool,
    pub throttle_read: Option<Throttle>,
    pub slow: Vec<Slow>,
    pub panic_at_step: Option<u64>,
    pub panic_in_loader_at_step: Option<u64>,
    pub no_tui: bool,
    pub check_advice: bool,
    pub channel_capacity: usize,
    /// `--stall-after`, seconds ([`STALL_AFTER_S`] when not given).
    pub stall_after: Option<f64>,
    /// `--metrics-listen`: serve `/metrics` there while the run goes.
    pub metrics_listen: Option<String>,
    /// `--metrics-allow-remote`.
    pub metrics_allow_remote: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            model: None,
            data: None,
            val_data: None,
            epochs: None,
            steps: None,
            batch_size: None,
            workers: None,
            prefetch: None,
            seed: None,
            device: "cpu".into(),
            summary: None,
            trace: None,
            html: None,
            trace_level: TraceLevel::default(),
            sample_hz: probes::sampler::DEFAULT_HZ,
            no_gpu: false,
            throttle_read: None,
            slow: Vec::new(),
            panic_at_step: None,
            panic_in_loader_at_step: None,
            no_tui: false,
            check_advice: false,
            channel_capacity: probes::DEFAULT_CAPACITY,
            stall_after: None,
            metrics_listen: None,
            metrics_allow_remote: false,
        }
    }
}

/// A loader stage open this long is named as stalled, unless `--stall-after` says otherwise.
pub const STALL_AFTER_S: f64 = 30.0;
/// Longest accepted `--stall-after`: a day.
pub const MAX_STALL_AFTER_S: f64 = 86_400.0;

impl Options {
    /// The stall threshold.
    pub fn stall_after(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.stall_after.unwrap_or(STALL_AFTER_S).clamp(1e-3, MAX_STALL_AFTER_S))
    }
}

impl Options {
    /// Every number in its range; the message names the flag and the accepted range.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.steps == Some(0) {
            bail!("--steps must be at least 1");
        }
        use crate::config::validate::workers_in_range;
        use crate::limits::{in_range, MAX_BATCH_SIZE, MAX_EPOCHS, MAX_PREFETCH};
        let counts = [
            self.batch_size.map(|b| in_range("--batch-size", b, 1, MAX_BATCH_SIZE)),
            self.prefetch.map(|p| in_range("--prefetch", p, 1, MAX_PREFETCH)),
            self.epochs.map(|e| in_range("--epochs", e, 1, MAX_EPOCHS)),
            self.workers.map(|w| workers_in_range("--workers", w)),
        ];
        if let Some(Err(m)) = counts.into_iter().flatten().find(Result::is_err) {
            bail!(m);
        }
        if !(self.sample_hz.is_finite() && self.sample_hz > 0.0 && self.sample_hz <= MAX_SAMPLE_HZ) {
            bail!("--sample-hz must be a positive number up to {MAX_SAMPLE_HZ}, got {}", self.sample_hz);
        }
        if let Some(s) = self.stall_after.filter(|s| !(s.is_finite() && *s > 0.0 && *s <= MAX_STALL_AFTER_S)) {
            bail!("--stall-after must be a positive number of seconds up to {MAX_STALL_AFTER_S}, got {s}");
        }
        if let Some(a) = &self.metrics_listen {
            crate::metrics::check_listen(a, self.metrics_allow_remote)?;
        }
        if !(1..=MAX_CHANNEL_CAPACITY).contains(&self.channel_capacity) {
            bail!("--channel-capacity must be between 1 and {MAX_CHANNEL_CAPACITY}, got {}", self.channel_capacity);
        }
        Ok(())
    }

    /// The command line's overrides of the model file's settings.
    pub fn apply(&self, cfg: &mut ModelConfig) {
        if let Some(e) = self.epochs {
            cfg.train.epochs = e;
        }
        if let Some(b) = self.batch_size {
            cfg.train.batch_size = b;
        }
        if let Some(w) = self.workers {
            cfg.data.workers = w;
        }
        if let Some(p) = self.prefetch {
            cfg.data.prefetch = p;
        }
        if let Some(s) = self.seed {
            cfg.data.seed = s;
        }
    }

    /// The simulations on, as the reports name them.
    pub fn simulated(&self) -> Vec<String> {
        self.throttle_read.iter().map(|t| t.describe()).chain(self.slow.iter().map(|s| s.describe())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_numbers_are_refused_with_the_flag_named() {
        let cases: Vec<(Options, &str)> = vec![
            (Options { steps: Some(0), ..Options::default() }, "--steps"),
            (Options { batch_size: Some(0), ..Options::default() }, "--batch-size"),
            (Options { prefetch: Some(0), ..Options::default() }, "--prefetch"),
            (Options { prefetch: Some(1 << 40), ..Options::default() }, "--prefetch"),
            (Options { batch_size: Some(usize::MAX), ..Options::default() }, "--batch-size"),
            (Options { epochs: Some(0), ..Options::default() }, "--epochs"),
            (Options { workers: Some(Workers::Fixed(1 << 32)), ..Options::default() }, "--workers"),
            (Options { sample_hz: f64::NAN, ..Options::default() }, "--sample-hz"),
            (Options { sample_hz: 0.0, ..Options::default() }, "--sample-hz"),
            (Options { sample_hz: 1e300, ..Options::default() }, "--sample-hz"),
            (Options { channel_capacity: 0, ..Options::default() }, "--channel-capacity"),
        ];
        for (o, flag) in cases {
            let e = o.validate().map(|_| ()).expect_err(flag).to_string();
            assert!(e.contains(flag), "{e}");
        }
        assert!(Options::default().validate().is_ok());
    }
}
