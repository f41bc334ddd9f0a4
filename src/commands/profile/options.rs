//! What `pipeprof profile` was asked for: its command line's definition (clap derives the
//! flags from this struct, their help from its docs and their defaults from its attributes),
//! its checks (every option validated here, before anything is created, written or started) and
//! its way back to flags ([`Options::to_args`], for `--check-advice`'s re-runs). A new flag is
//! a field here and a line in `to_args`, then its use.

use crate::export::chrome::TraceLevel;
use crate::metrics::MetricsArgs;
use anyhow::bail;
use clap::builder::RangedU64ValueParser;
use pipeprof_core::config::{ModelConfig, Workers};
use pipeprof_core::flags;
use pipeprof_core::limits::{MAX_BATCH_SIZE, MAX_EPOCHS, MAX_PREFETCH};
use pipeprof_trainer::data::simulate::{Slow, Throttle};
use std::ffi::OsString;
use std::path::PathBuf;

/// Highest sampling rate: the CPU figures refresh at most every 200 ms anyway.
pub const MAX_SAMPLE_HZ: f64 = 1000.0;

/// The options of one profiled run: `pipeprof profile`'s flags.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct Options {
    /// Model and training description (Keras-like TOML). Default: the built-in examples/cnn.toml.
    #[arg(long = flags::MODEL, value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// Image folder with one sub-folder per class, or a packed cache written by `pipeprof cache`.
    /// Default: a generated demo set in the cache folder.
    #[arg(long = flags::DATA, value_name = "DIR|FILE")]
    pub data: Option<PathBuf>,
    /// Validation images (one sub-folder per class, same classes as --data), checked after
    /// every epoch (overrides [data] validation_split).
    #[arg(long = flags::VAL_DATA, value_name = "DIR")]
    pub val_data: Option<PathBuf>,
    /// Epochs to train (overrides [train] epochs).
    #[arg(long = flags::EPOCHS, value_parser = RangedU64ValueParser::<usize>::new().range(1..=MAX_EPOCHS as u64))]
    pub epochs: Option<usize>,
    /// Stop after N steps in total, over as many epochs as needed (overrides --epochs).
    #[arg(long = flags::STEPS, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: Option<u64>,
    /// Images per batch (overrides [train] batch_size).
    #[arg(long = flags::BATCH_SIZE, value_parser = RangedU64ValueParser::<usize>::new().range(1..=MAX_BATCH_SIZE as u64))]
    pub batch_size: Option<usize>,
    /// Loader worker threads: a number, or "auto" = start with 1 and add workers while the
    /// training loop waits and it helps, up to the cores (overrides [data] workers).
    #[arg(long = flags::WORKERS, value_parser = parse_workers)]
    pub workers: Option<Workers>,
    /// Batches waiting in the prefetch queue (overrides [data] prefetch).
    #[arg(long = flags::PREFETCH, value_parser = RangedU64ValueParser::<usize>::new().range(1..=MAX_PREFETCH as u64))]
    pub prefetch: Option<usize>,
    /// Seed for shuffling and weight initialisation (overrides [data] seed).
    #[arg(long = flags::SEED)]
    pub seed: Option<u64>,
    /// Device to train on: cpu, cuda or cuda:N (CUDA needs a build with --features cuda).
    #[arg(long = flags::DEVICE, default_value = "cpu")]
    pub device: String,
    /// Write the run's summary (settings, stages, epochs, skipped files) as JSON.
    #[arg(long = flags::SUMMARY, value_name = "FILE")]
    pub summary: Option<PathBuf>,
    /// Write a Chrome/Perfetto trace (JSON) of every span, streamed as the run goes.
    #[arg(long = flags::TRACE, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Write the report as one self-contained HTML page when the run ends (charts included).
    #[arg(long = flags::HTML, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Trace detail: "sample" (default) adds one span per image per loader stage, up to
    /// 200,000 of them; "stage" keeps only the training loop's stages and counters.
    #[arg(long = flags::TRACE_LEVEL, value_enum, default_value_t = TraceLevel::Sample)]
    pub trace_level: TraceLevel,
    /// Host and GPU samples per second (CPU figures refresh at most every 200 ms).
    #[arg(long = flags::SAMPLE_HZ, default_value_t = probes::sampler::DEFAULT_HZ, value_name = "HZ")]
    pub sample_hz: f64,
    /// Do not sample the GPU (NVML). Set PIPEPROF_NVML_LIB=/path/libnvidia-ml.so to load another library.
    #[arg(long = flags::NO_GPU)]
    pub no_gpu: bool,
    /// Simulate slow storage: RATE (2MB/s), +LATENCY per file (+20ms), or both (2MB/s+20ms).
    /// Shown as a simulation in every report.
    #[arg(long = flags::THROTTLE_READ, value_name = "SPEC", value_parser = pipeprof_trainer::data::simulate::parse_throttle)]
    pub throttle_read: Option<Throttle>,
    /// Add time to one stage: STAGE=+MS, e.g. decode=+5ms (CPU work) or read=+10ms (waiting).
    /// Repeatable. Shown as a simulation in every report.
    #[arg(long = flags::SLOW, value_name = "STAGE=+MS", value_parser = pipeprof_trainer::data::simulate::parse_slow)]
    pub slow: Vec<Slow>,
    /// Testing hook: panic in the training loop at this step (proves the exit paths).
    #[arg(long = flags::PANIC_AT_STEP, hide = true)]
    pub panic_at_step: Option<u64>,
    /// Testing hook: a loader worker panics while decoding this step.
    #[arg(long = flags::PANIC_IN_LOADER_AT_STEP, hide = true)]
    pub panic_in_loader_at_step: Option<u64>,
    /// No live terminal view: print a progress line and the report (the default when stdout
    /// or stdin is not a terminal).
    #[arg(long = flags::NO_TUI)]
    pub no_tui: bool,
    /// Print the verdict as one JSON document on stdout (schema pipeprof.verdict/2:
    /// docs/schema/verdict.schema.json): the limiter, the evidence as figures, the advice as
    /// data. The report and every other line go to stderr; no live view.
    #[arg(long)]
    pub json: bool,
    /// After the report, re-run briefly with each applicable piece of advice (workers, batch
    /// size, prefetch, the packed cache) and print predicted vs measured images/s.
    #[arg(long = flags::CHECK_ADVICE)]
    pub check_advice: bool,
    /// Capacity of the event channel; when full, events are dropped and counted, never waited for.
    #[arg(
        long = flags::CHANNEL_CAPACITY,
        default_value_t = probes::DEFAULT_CAPACITY,
        hide = true,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=probes::MAX_CAPACITY as u64)
    )]
    pub channel_capacity: usize,
    /// Name a loader stage open longer than this as stalled, live and in the report (a read
    /// that never returns: a FIFO, a hung network drive). Default 30.
    #[arg(long = flags::STALL_AFTER, value_name = "SECONDS")]
    pub stall_after: Option<f64>,
    #[command(flatten)]
    pub metrics: MetricsArgs,
}

impl Default for Options {
    /// The options of `pipeprof profile` with no flag: the defaults the attributes above give.
    // No flag given cannot fail to parse: every field has a default or is optional (the
    // `options_at_their_defaults_are_no_flags` test runs this).
    #[allow(clippy::expect_used)]
    fn default() -> Options {
        use clap::{Args, FromArgMatches};
        let cmd = Options::augment_args(clap::Command::new("profile"));
        Options::from_arg_matches(&cmd.get_matches_from(["profile"])).expect("the flags' defaults parse")
    }
}

/// `--workers`: "auto" or a number of workers in range.
fn parse_workers(s: &str) -> Result<Workers, String> {
    let w: Workers = s.parse()?;
    pipeprof_core::config::validate::workers_in_range(&flags::long(flags::WORKERS), w)?;
    Ok(w)
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
        if let Some(a) = &self.metrics.metrics_listen {
            crate::metrics::check_listen(a, self.metrics.metrics_allow_remote)?;
        }
        Ok(())
    }

    /// The command line that gives these options: `profile`, then each option not at its
    /// default, in the command line's order. The one place options become flags: a
    /// `--check-advice` follow-up's command line is its options, changed, through here.
    pub fn to_args(&self) -> Vec<OsString> {
        let d = Options::default();
        // Each option by its field's name: the flag is spelled where it is defined, above.
        let mut a = Args::new();
        a.value("model", self.model.clone());
        a.value("data", self.data.clone());
        a.value("val_data", self.val_data.clone());
        a.shown("epochs", self.epochs);
        a.shown("steps", self.steps);
        a.shown("batch_size", self.batch_size);
        a.shown("workers", self.workers);
        a.shown("prefetch", self.prefetch);
        a.shown("seed", self.seed);
        a.value("device", (self.device != d.device).then(|| self.device.clone()));
        a.value("summary", self.summary.clone());
        a.value("trace", self.trace.clone());
        a.value("html", self.html.clone());
        let level = match self.trace_level {
            TraceLevel::Stage => "stage",
            TraceLevel::Sample => "sample",
        };
        a.shown("trace_level", (self.trace_level != d.trace_level).then_some(level));
        a.shown("sample_hz", (self.sample_hz != d.sample_hz).then_some(self.sample_hz));
        a.flag("no_gpu", self.no_gpu);
        a.shown("throttle_read", self.throttle_read.map(|t| t.spec()));
        for s in &self.slow {
            a.shown("slow", Some(s.spec()));
        }
        a.shown("panic_at_step", self.panic_at_step);
        a.shown("panic_in_loader_at_step", self.panic_in_loader_at_step);
        a.flag("no_tui", self.no_tui);
        a.flag("json", self.json);
        a.flag("check_advice", self.check_advice);
        a.shown("stall_after", self.stall_after);
        a.value("metrics_listen", self.metrics.metrics_listen.clone());
        a.flag("metrics_allow_remote", self.metrics.metrics_allow_remote);
        a.shown("channel_capacity", (self.channel_capacity != d.channel_capacity).then_some(self.channel_capacity));
        a.line
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

/// A command line being written: `profile`, then flags named by their options' field names,
/// spelled as the clap definition above spells them.
struct Args {
    line: Vec<OsString>,
    definition: clap::Command,
}

impl Args {
    fn new() -> Args {
        use clap::Args as _;
        Args { line: vec!["profile".into()], definition: Options::augment_args(clap::Command::new("profile")) }
    }

    /// `--LONG` of the option whose field is `id` (a field that is no flag is a bug the
    /// round-trip test finds: it is written as the id itself).
    fn long(&self, id: &str) -> OsString {
        let arg = self.definition.get_arguments().find(|a| a.get_id() == id);
        format!("--{}", arg.and_then(|a| a.get_long()).unwrap_or(id)).into()
    }

    /// `--LONG VALUE` when there is a value.
    fn value(&mut self, id: &str, value: Option<impl Into<OsString>>) {
        if let Some(v) = value {
            let flag = self.long(id);
            self.line.push(flag);
            self.line.push(v.into());
        }
    }

    /// `--LONG VALUE` with the value as it is shown (numbers, "auto", a simulation's spec).
    fn shown(&mut self, id: &str, value: Option<impl std::fmt::Display>) {
        self.value(id, value.map(|v| v.to_string()));
    }

    /// `--LONG` when set.
    fn flag(&mut self, id: &str, set: bool) {
        if set {
            let flag = self.long(id);
            self.line.push(flag);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `profile`'s command line parsed as clap parses it.
    fn parsed(args: &[OsString]) -> Result<Options, String> {
        use clap::{Args as _, FromArgMatches};
        let cmd = Options::augment_args(clap::Command::new("profile"));
        let m = cmd.try_get_matches_from(args).map_err(|e| e.to_string())?;
        Options::from_arg_matches(&m).map_err(|e| e.to_string())
    }

    #[test]
    fn options_written_as_flags_read_back_as_the_same_options() {
        // Every option away from its default: a new flag is added here too (the struct literal
        // does not compile without it), and its `to_args` line is proved.
        use pipeprof_trainer::data::simulate::{parse_slow, parse_throttle};
        let o = Options {
            model: Some("m.toml".into()),
            data: Some("imgs dir".into()),
            val_data: Some("val".into()),
            epochs: Some(3),
            steps: Some(40),
            batch_size: Some(128),
            workers: Some(pipeprof_core::config::Workers::Auto),
            prefetch: Some(6),
            seed: Some(7),
            device: "cuda:1".into(),
            summary: Some("s.json".into()),
            trace: Some("t.json".into()),
            html: Some("r.html".into()),
            trace_level: TraceLevel::Stage,
            sample_hz: 2.5,
            no_gpu: true,
            throttle_read: Some(parse_throttle("1.5MB/s+20ms").unwrap()),
            slow: vec![parse_slow("decode=+1ms").unwrap(), parse_slow("read=+0.25ms").unwrap()],
            panic_at_step: Some(5),
            panic_in_loader_at_step: Some(6),
            no_tui: true,
            json: true,
            check_advice: true,
            channel_capacity: 17,
            stall_after: Some(0.5),
            metrics: crate::metrics::MetricsArgs {
                metrics_listen: Some("0.0.0.0:0".into()),
                metrics_allow_remote: true,
            },
        };
        assert_eq!(parsed(&o.to_args()), Ok(o));
        let d = Options::default();
        assert_eq!(parsed(&d.to_args()), Ok(d));
    }

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
