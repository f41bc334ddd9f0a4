//! What `pipeprof profile` was asked for, as plain data, and its checks: every option is
//! validated here, before anything is created, written or started.

use crate::config::{ModelConfig, Workers};
use crate::data::simulate::{Slow, Throttle};
use crate::export::chrome::TraceLevel;
use anyhow::bail;
use std::ffi::OsString;
use std::path::PathBuf;

/// Highest sampling rate: the CPU figures refresh at most every 200 ms anyway.
pub const MAX_SAMPLE_HZ: f64 = 1000.0;

/// The options of one profiled run (the command line's `profile` flags).
#[derive(Debug, Clone, PartialEq)]
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
    /// Every number the command line's definition does not range-check itself (clap checks
    /// the counts: `--steps`, `--batch-size`, `--workers`, `--prefetch`, `--epochs`,
    /// `--channel-capacity`) in its range; the message names the flag and the accepted range.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !(self.sample_hz.is_finite() && self.sample_hz > 0.0 && self.sample_hz <= MAX_SAMPLE_HZ) {
            bail!("--sample-hz must be a positive number up to {MAX_SAMPLE_HZ}, got {}", self.sample_hz);
        }
        if let Some(s) = self.stall_after.filter(|s| !(s.is_finite() && *s > 0.0 && *s <= MAX_STALL_AFTER_S)) {
            bail!("--stall-after must be a positive number of seconds up to {MAX_STALL_AFTER_S}, got {s}");
        }
        if let Some(a) = &self.metrics_listen {
            crate::metrics::check_listen(a, self.metrics_allow_remote)?;
        }
        Ok(())
    }

    /// The command line that gives these options: `profile`, then each option not at its
    /// default, in the command line's order. The one place options become flags: a
    /// `--check-advice` follow-up's command line is its options, changed, through here.
    pub fn to_args(&self) -> Vec<OsString> {
        use crate::flags as f;
        let d = Options::default();
        let mut a = Args(vec!["profile".into()]);
        a.value(f::MODEL, self.model.clone());
        a.value(f::DATA, self.data.clone());
        a.value(f::VAL_DATA, self.val_data.clone());
        a.shown(f::EPOCHS, self.epochs);
        a.shown(f::STEPS, self.steps);
        a.shown(f::BATCH_SIZE, self.batch_size);
        a.shown(f::WORKERS, self.workers);
        a.shown(f::PREFETCH, self.prefetch);
        a.shown(f::SEED, self.seed);
        a.value(f::DEVICE, (self.device != d.device).then(|| self.device.clone()));
        a.value(f::SUMMARY, self.summary.clone());
        a.value(f::TRACE, self.trace.clone());
        a.value(f::HTML, self.html.clone());
        let level = match self.trace_level {
            TraceLevel::Stage => "stage",
            TraceLevel::Sample => "sample",
        };
        a.shown(f::TRACE_LEVEL, (self.trace_level != d.trace_level).then_some(level));
        a.shown(f::SAMPLE_HZ, (self.sample_hz != d.sample_hz).then_some(self.sample_hz));
        a.flag(f::NO_GPU, self.no_gpu);
        a.shown(f::THROTTLE_READ, self.throttle_read.map(|t| t.spec()));
        for s in &self.slow {
            a.shown(f::SLOW, Some(s.spec()));
        }
        a.shown(f::PANIC_AT_STEP, self.panic_at_step);
        a.shown(f::PANIC_IN_LOADER_AT_STEP, self.panic_in_loader_at_step);
        a.flag(f::NO_TUI, self.no_tui);
        a.flag(f::CHECK_ADVICE, self.check_advice);
        a.shown(f::STALL_AFTER, self.stall_after);
        a.value(f::METRICS_LISTEN, self.metrics_listen.clone());
        a.flag(f::METRICS_ALLOW_REMOTE, self.metrics_allow_remote);
        a.shown(f::CHANNEL_CAPACITY, (self.channel_capacity != d.channel_capacity).then_some(self.channel_capacity));
        a.0
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

/// A command line being written.
struct Args(Vec<OsString>);

impl Args {
    /// `--NAME VALUE` when there is a value.
    fn value(&mut self, name: &str, value: Option<impl Into<OsString>>) {
        if let Some(v) = value {
            self.0.push(crate::flags::long(name).into());
            self.0.push(v.into());
        }
    }

    /// `--NAME VALUE` with the value as it is shown (numbers, "auto", a simulation's spec).
    fn shown(&mut self, name: &str, value: Option<impl std::fmt::Display>) {
        self.value(name, value.map(|v| v.to_string()));
    }

    /// `--NAME` when set.
    fn flag(&mut self, name: &str, set: bool) {
        if set {
            self.0.push(crate::flags::long(name).into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_numbers_are_refused_with_the_flag_named() {
        // The counts are range-checked by the command line's definition (see `commands`'
        // tests); the rest here.
        let cases: Vec<(Options, &str)> = vec![
            (Options { sample_hz: f64::NAN, ..Options::default() }, "--sample-hz"),
            (Options { sample_hz: 0.0, ..Options::default() }, "--sample-hz"),
            (Options { sample_hz: 1e300, ..Options::default() }, "--sample-hz"),
            (Options { stall_after: Some(-1.0), ..Options::default() }, "--stall-after"),
        ];
        for (o, flag) in cases {
            let e = o.validate().map(|_| ()).expect_err(flag).to_string();
            assert!(e.contains(flag), "{e}");
        }
        assert!(Options::default().validate().is_ok());
    }

    #[test]
    fn options_at_their_defaults_are_no_flags() {
        assert_eq!(Options::default().to_args(), vec![OsString::from("profile")]);
        let o = Options { workers: Some(Workers::Auto), no_gpu: true, ..Options::default() };
        assert_eq!(o.to_args(), ["profile", "--workers", "auto", "--no-gpu"].map(OsString::from));
    }
}
