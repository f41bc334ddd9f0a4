#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Hostile numbers in every numeric config key and flag (0, -1, 2^32, 2^63, NaN, inf, 1e-300,
//! huge strings): each is accepted, or refused with a message that names what was wrong.
//! Never a panic: a panic anywhere here fails the test.

use clap::Parser;
use pipeprof::cli::{Cli, Command};
use pipeprof_core::config::ModelConfig;

/// The values, as TOML literals (a string literal for the huge string).
fn hostile_toml() -> Vec<String> {
    let mut v: Vec<String> = ["0", "-1", "4294967296", "9223372036854775808", "18446744073709551616", "nan", "inf"]
        .iter()
        .chain(&["-inf", "1e-300", "1e300", "0.5", "1"])
        .map(|s| s.to_string())
        .collect();
    v.push("9".repeat(400));
    v.push(format!("\"{}\"", "9".repeat(100_000)));
    v
}

/// The values as a user would type them on the command line.
fn hostile_flag_values() -> Vec<String> {
    let mut v: Vec<String> =
        ["0", "-1", "4294967296", "9223372036854775808", "NaN", "inf", "-inf", "1e-300", "1e300", "", " "]
            .iter()
            .map(|s| s.to_string())
            .collect();
    v.push("9".repeat(100_000));
    v
}

/// Every numeric key of cnn.toml, with a value that is valid on its own.
const KEYS: [(&str, &str); 19] = [
    ("height", "32"),
    ("width", "32"),
    ("channels", "3"),
    ("filters", "4"),
    ("kernel_size", "3"),
    ("conv_strides", "1"),
    ("pool_size", "2"),
    ("units", "8"),
    ("rate", "0.5"),
    ("batch_size", "4"),
    ("epochs", "1"),
    ("learning_rate", "0.001"),
    ("workers", "1"),
    ("prefetch", "2"),
    ("seed", "7"),
    ("validation_split", "0.0"),
    ("rotation_range", "0.0"),
    ("zoom_range", "0.0"),
    ("shear_range", "0.0"),
];

fn model(values: &[String]) -> String {
    let v = |k: &str| &values[KEYS.iter().position(|(n, _)| *n == k).unwrap()];
    format!(
        "[input]\nheight = {}\nwidth = {}\nchannels = {}\n\
         [[layers]]\ntype = \"conv2d\"\nfilters = {}\nkernel_size = {}\nstrides = {}\npadding = \"same\"\n\
         [[layers]]\ntype = \"max_pooling2d\"\npool_size = {}\n\
         [[layers]]\ntype = \"flatten\"\n\
         [[layers]]\ntype = \"dense\"\nunits = {}\n\
         [[layers]]\ntype = \"dropout\"\nrate = {}\n\
         [[layers]]\ntype = \"dense\"\nunits = \"classes\"\n\
         [train]\nbatch_size = {}\nepochs = {}\nlearning_rate = {}\n\
         [data]\nworkers = {}\nprefetch = {}\nseed = {}\nvalidation_split = {}\n\
         [augment]\nrotation_range = {}\nzoom_range = {}\nshear_range = {}\n",
        v("height"),
        v("width"),
        v("channels"),
        v("filters"),
        v("kernel_size"),
        v("conv_strides"),
        v("pool_size"),
        v("units"),
        v("rate"),
        v("batch_size"),
        v("epochs"),
        v("learning_rate"),
        v("workers"),
        v("prefetch"),
        v("seed"),
        v("validation_split"),
        v("rotation_range"),
        v("zoom_range"),
        v("shear_range"),
    )
}

/// Parses, validates and shapes a model: Ok, or an error message.
fn check_model(text: &str) -> Result<(), String> {
    let cfg = ModelConfig::parse(text, "hostile.toml").map_err(|e| e.to_string())?;
    let shapes = cfg.infer_shapes(3)?;
    // The estimate is total: a number or None, whatever the shapes.
    let _ = pipeprof_trainer::train::shapes::memory_estimate(&shapes, &cfg.input, cfg.train.batch_size);
    Ok(())
}

/// The key as the error message calls it.
fn key_name(k: &str) -> &str {
    if k == "conv_strides" {
        "strides"
    } else {
        k
    }
}

#[test]
fn every_config_number_is_accepted_or_refused_by_name() {
    let base: Vec<String> = KEYS.iter().map(|(_, v)| v.to_string()).collect();
    assert_eq!(check_model(&model(&base)), Ok(()), "the base model is valid");
    for (i, (key, _)) in KEYS.iter().enumerate() {
        for h in hostile_toml() {
            let mut values = base.clone();
            values[i] = h.clone();
            let text = model(&values);
            if let Err(e) = check_model(&text) {
                // A range error names the key; a type error (TOML) points at its line; a shape
                // that does not work names the layer.
                let name = key_name(key);
                // (Inside a [[layers]] entry TOML points at the entry's header line.)
                let lines: Vec<&str> = text.lines().collect();
                let at = lines.iter().position(|l| l.starts_with(&format!("{name} = "))).unwrap();
                let header = (0..at).rev().find(|&i| lines[i].starts_with('[')).unwrap();
                let points_at = |i: usize| e.contains(&format!("hostile.toml:{}:", i + 1));
                let shown: String = h.chars().take(20).collect();
                assert!(
                    e.contains(name) || points_at(at) || points_at(header) || e.starts_with("layer "),
                    "{key} = {shown}…: {e}"
                );
            }
        }
    }
}

#[test]
fn seeded_combinations_of_hostile_config_numbers_never_panic() {
    let base: Vec<String> = KEYS.iter().map(|(_, v)| v.to_string()).collect();
    let hostile = hostile_toml();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        // xorshift64*: a fixed sequence, so a failure is reproducible from this seed.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..400 {
        let mut values = base.clone();
        for _ in 0..1 + next() % 4 {
            let k = (next() % KEYS.len() as u64) as usize;
            values[k] = hostile[(next() % hostile.len() as u64) as usize].clone();
        }
        match check_model(&model(&values)) {
            Ok(()) => ok += 1,
            Err(e) => {
                assert!(!e.trim().is_empty());
                refused += 1;
            }
        }
    }
    assert!(refused > 0 && ok + refused == 400);
}

/// `pipeprof profile FLAG VALUE`: refused by clap or by `Options::validate`, naming the flag,
/// or accepted.
fn check_profile_flag(flag: &str, value: &str) -> Result<(), String> {
    let arg = format!("{flag}={value}");
    let cli = Cli::try_parse_from(["pipeprof", "profile", &arg]).map_err(|e| e.to_string())?;
    let Some(Command::Profile(a)) = cli.command else { panic!("parsed as another command") };
    a.validate().map_err(|e| e.to_string())
}

#[test]
fn every_numeric_flag_is_accepted_or_refused_by_name() {
    let flags = [
        "--epochs",
        "--steps",
        "--batch-size",
        "--workers",
        "--prefetch",
        "--seed",
        "--sample-hz",
        "--channel-capacity",
    ];
    for flag in flags {
        for v in hostile_flag_values() {
            if let Err(e) = check_profile_flag(flag, &v) {
                assert!(e.contains(flag), "{flag} {}: {e}", &v[..v.len().min(20)]);
            }
        }
    }
    // Rates and delays, in each of their forms.
    for v in hostile_flag_values() {
        for (flag, spec) in [
            ("--throttle-read", format!("{v}B/s")),
            ("--throttle-read", format!("{v}MB/s+{v}ms")),
            ("--throttle-read", format!("+{v}ms")),
            ("--slow", format!("decode=+{v}ms")),
            ("--slow", format!("read=+{v}s")),
        ] {
            if let Err(e) = check_profile_flag(flag, &spec) {
                assert!(e.contains(flag), "{flag} {}: {e}", &spec[..spec.len().min(20)]);
            }
        }
    }
    // The acceptance case: a rate that made a worker panic is refused with the range.
    let e = check_profile_flag("--throttle-read", "1e-20B/s").unwrap_err();
    assert!(e.contains("between 1 B/s and 1000 GB/s"), "{e}");
}

#[test]
fn attach_duration_and_other_commands_numbers_are_range_checked() {
    for v in hostile_flag_values() {
        match Cli::try_parse_from(["pipeprof", "attach", &format!("--duration={v}")]) {
            Ok(cli) => {
                let Some(Command::Attach(a)) = cli.command else { panic!("parsed as another command") };
                let d = a.duration.unwrap();
                assert!(d.is_finite() && d > 0.0 && d <= pipeprof::cli::MAX_DURATION_S, "{v} → {d}");
            }
            Err(e) => assert!(e.to_string().contains("--duration"), "{e}"),
        }
    }
    for bad in ["inf", "NaN", "-1", "0"] {
        assert!(Cli::try_parse_from(["pipeprof", "attach", &format!("--duration={bad}")]).is_err(), "{bad}");
    }
    // cache --workers and demo-data --per-class are checked before any file is touched.
    let d = tempfile::tempdir().unwrap();
    for v in ["0", "4294967296", "9223372036854775808"] {
        let out = d.path().join("c.ppk");
        let args =
            ["pipeprof", "cache", "--data", "/nonexistent", "--out", out.to_str().unwrap(), &format!("--workers={v}")];
        if let Ok(cli) = Cli::try_parse_from(args) {
            let e = pipeprof::commands::run(cli).unwrap_err().to_string();
            assert!(e.contains("--workers must be between 1 and 1024"), "{v}: {e}");
        }
        let dir = d.path().join("demo");
        let args = ["pipeprof", "demo-data", dir.to_str().unwrap(), &format!("--per-class={v}")];
        if let Ok(cli) = Cli::try_parse_from(args) {
            let e = pipeprof::commands::run(cli).unwrap_err().to_string();
            assert!(e.contains("--per-class"), "{v}: {e}");
        }
    }
}
