#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The verdict on real runs of the binary, each scenario built with a wide margin (≥ 10×) so
//! it cannot flip on a noisy machine. One test function: the scenarios run one after the
//! other, never beside another test's training.

use pipeprof_trainer::data::demo::{DemoFormat, DemoSpec};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

const TINY: &str = "[input]\nheight = 16\nwidth = 16\n[[layers]]\ntype = \"flatten\"\n\
                    [[layers]]\ntype = \"dense\"\nunits = \"classes\"\n[train]\nbatch_size = 8\n";

/// ≈ 2 M parameters on 32×32 inputs: tens of milliseconds of compute per step.
const LARGE: &str = "[input]\nheight = 32\nwidth = 32\n\
                     [[layers]]\ntype = \"conv2d\"\nfilters = 64\nkernel_size = 3\npadding = \"same\"\nactivation = \"relu\"\n\
                     [[layers]]\ntype = \"conv2d\"\nfilters = 64\nkernel_size = 3\npadding = \"same\"\nactivation = \"relu\"\n\
                     [[layers]]\ntype = \"flatten\"\n[[layers]]\ntype = \"dense\"\nunits = 32\nactivation = \"relu\"\n\
                     [[layers]]\ntype = \"dense\"\nunits = \"classes\"\n[train]\nbatch_size = 8\n";

fn run(dir: &Path, model: &str, args: &[&str]) -> Value {
    let m = dir.join("m.toml");
    std::fs::write(&m, model).unwrap();
    let s = dir.join("s.json");
    let out = Command::new(env!("CARGO_BIN_EXE_pipeprof"))
        .args(["profile", "--model", m.to_str().unwrap(), "--data", dir.join("imgs").to_str().unwrap()])
        .args(["--no-gpu", "--summary", s.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&std::fs::read(&s).unwrap()).unwrap();
    v["verdict"].clone()
}

fn flags(v: &Value) -> String {
    v["flags"].to_string()
}

#[test]
fn real_runs_get_the_verdict_their_scenario_was_built_for() {
    let d = tempfile::tempdir().unwrap();
    DemoSpec { classes: 2, per_class: 24, size: Some((32, 32)), format: DemoFormat::Png, seed: 5 }
        .write(&d.path().join("imgs"))
        .unwrap();

    // Storage: every file takes 40 ms to arrive (off-CPU); compute is well under 1 ms.
    let v = run(d.path(), TINY, &["--steps", "12", "--workers", "2", "--throttle-read", "+40ms"]);
    assert_eq!(v["limiter"], "Io", "{v}");
    assert_eq!(v["severity"], "High", "{v}");
    assert!(flags(&v).contains("Simulated"), "{v}");

    // CPU preprocessing: 1 worker spends 15 ms of CPU per image decoding, on 2 cores.
    let v = run(d.path(), TINY, &["--steps", "12", "--workers", "1", "--slow", "decode=+15ms"]);
    // On an idle machine the second core is free: too few workers, and the advice says
    // so. If something else keeps the machine busy, the honest answer is "CPU saturated",
    // or, when the worker measurably waited for a core those programs held, contention.
    if v["limiter"] == "Contention" {
        assert!(flags(&v).contains("\"CoreContention\":{\"external\":true"), "{v}");
    } else {
        assert_eq!(v["limiter"], "Preprocess", "{v}");
        if flags(&v).contains("TooFewWorkers") {
            assert!(v["advice"].to_string().contains("--workers 2"), "{v}");
        } else {
            assert!(flags(&v).contains("CpuSaturated") || flags(&v).contains("CoreContention"), "{v}");
        }
    }

    // Compute: a 2 M-parameter model on 32×32 images, the loader idle.
    let v = run(d.path(), LARGE, &["--steps", "8", "--workers", "2"]);
    assert_eq!(v["limiter"], "Compute", "{v}");
    assert_eq!(v["severity"], "Low", "{v}");

    // --workers auto on a preprocess-bound run with a spare core: grows past 1.
    let sj = d.path().join("s.json");
    let _ = run(d.path(), TINY, &["--steps", "30", "--workers", "auto", "--slow", "decode=+10ms"]);
    let s: Value = serde_json::from_slice(&std::fs::read(&sj).unwrap()).unwrap();
    let log = s["settings"]["auto_workers"].to_string();
    assert!(log.contains("trying 2"), "{log}");
    // Two CPU-bound workers on two idle cores halve the step, and 2 stay (going back needs
    // less than 15% of the possible ×2, a step above 1/1.15 of one worker's). On a shared
    // machine another tenant may hold the second core: then the step does not drop, and the
    // run must say so with the step times it measured and go back to 1. Either way the choice
    // follows what was measured.
    let workers = s["settings"]["workers"].as_u64();
    match log.split("moved the step time from ").nth(1).filter(|_| log.contains("no faster")) {
        Some(rest) => {
            let ms: Vec<f64> = rest.split_whitespace().filter_map(|w| w.parse().ok()).take(2).collect();
            assert!(ms.len() == 2 && ms[1] > ms[0] / 1.15, "went back without the step times to show for it: {log}");
            assert!(log.contains("back to 1") && workers == Some(1), "{log}");
        }
        None => assert_eq!(workers, Some(2), "{log}"),
    }

    // A tiny model: per-step fixed cost dominates; flagged whatever else limits.
    let v = run(d.path(), TINY, &["--steps", "30", "--workers", "2", "--batch-size", "2"]);
    assert!(flags(&v).contains("TinyModel"), "{v}");
}
