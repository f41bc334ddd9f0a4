//! The spelling of pipeprof's own flags, once. The command line's definition (`cli`), the
//! command line a `--check-advice` follow-up is given (`profile::options::to_args`) and the
//! commands advice names (`diagnose`'s `Change`) all spell a flag through these names: renaming
//! one here renames it everywhere. A name is the flag without its dashes, as clap's `long` takes.

/// `profile --model`, `cache --model`.
pub const MODEL: &str = "model";
/// `profile --data`, `cache --data`.
pub const DATA: &str = "data";
pub const VAL_DATA: &str = "val-data";
pub const EPOCHS: &str = "epochs";
pub const STEPS: &str = "steps";
pub const BATCH_SIZE: &str = "batch-size";
/// `profile --workers`, `cache --workers`.
pub const WORKERS: &str = "workers";
pub const PREFETCH: &str = "prefetch";
pub const SEED: &str = "seed";
pub const DEVICE: &str = "device";
pub const SUMMARY: &str = "summary";
pub const TRACE: &str = "trace";
/// `profile --html`, `run --html`, `attach --html`, `report --html`.
pub const HTML: &str = "html";
pub const TRACE_LEVEL: &str = "trace-level";
pub const SAMPLE_HZ: &str = "sample-hz";
pub const NO_GPU: &str = "no-gpu";
pub const THROTTLE_READ: &str = "throttle-read";
pub const SLOW: &str = "slow";
pub const PANIC_AT_STEP: &str = "panic-at-step";
pub const PANIC_IN_LOADER_AT_STEP: &str = "panic-in-loader-at-step";
pub const NO_TUI: &str = "no-tui";
pub const CHECK_ADVICE: &str = "check-advice";
pub const STALL_AFTER: &str = "stall-after";
pub const METRICS_LISTEN: &str = "metrics-listen";
pub const METRICS_ALLOW_REMOTE: &str = "metrics-allow-remote";
pub const CHANNEL_CAPACITY: &str = "channel-capacity";
/// `cache --out`.
pub const OUT: &str = "out";

/// The flag as typed: `--NAME`.
pub fn long(name: &str) -> String {
    format!("--{name}")
}

/// `--NAME VALUE`, as a command line says it.
pub fn with_value(name: &str, value: impl std::fmt::Display) -> String {
    format!("--{name} {value}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_is_its_name_after_two_dashes() {
        assert_eq!(long(BATCH_SIZE), "--batch-size");
        assert_eq!(with_value(WORKERS, 4), "--workers 4");
    }
}
