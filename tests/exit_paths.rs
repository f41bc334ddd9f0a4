#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Every way a run can end leaves a loadable trace and the report: normal end, Ctrl-C,
//! SIGTERM, a panic in training, and `kill -9` (then `report --repair`).

use pipeprof::data::demo::{DemoFormat, DemoSpec};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MODEL: &str = "[input]\nheight = 16\nwidth = 16\n[[layers]]\ntype = \"flatten\"\n\
                     [[layers]]\ntype = \"dense\"\nunits = \"classes\"\n[train]\nbatch_size = 4\n";

struct Run {
    _dir: tempfile::TempDir,
    model: PathBuf,
    data: PathBuf,
    trace: PathBuf,
    summary: PathBuf,
}

fn setup() -> Run {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("imgs");
    DemoSpec { classes: 2, per_class: 8, size: Some((24, 24)), format: DemoFormat::Png, seed: 2 }.write(&data).unwrap();
    let model = d.path().join("m.toml");
    std::fs::write(&model, MODEL).unwrap();
    let (trace, summary) = (d.path().join("t.json"), d.path().join("s.json"));
    Run { _dir: d, model, data, trace, summary }
}

fn start(r: &Run, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_pipeprof"))
        .args(["profile", "--model", r.model.to_str().unwrap(), "--data", r.data.to_str().unwrap()])
        .args(["--trace", r.trace.to_str().unwrap(), "--summary", r.summary.to_str().unwrap(), "--no-gpu"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits (bounded) until the streamed trace shows training steps on disk.
fn wait_until_training(trace: &Path) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if std::fs::read_to_string(trace).map(|t| t.contains("\"name\":\"compute\"")).unwrap_or(false) {
            return;
        }
        std::thread::yield_now();
    }
    panic!("the run never wrote a compute span to {}", trace.display());
}

fn trace_events(trace: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(trace).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).expect("a closed, valid JSON trace");
    v["traceEvents"].as_array().unwrap().clone()
}

fn stop_with(sig: i32) {
    let r = setup();
    let child = start(&r, &["--steps", "100000000"]);
    wait_until_training(&r.trace);
    unsafe { libc::kill(child.id() as i32, sig) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + sig), "{}", String::from_utf8_lossy(&out.stderr));
    let evs = trace_events(&r.trace);
    assert!(evs.iter().any(|e| e["name"] == "compute"));
    assert!(evs.iter().any(|e| e["name"] == "summary"), "the final summary is in the trace");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("pipeprof report"), "{report}");
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&r.summary).unwrap()).unwrap();
    assert!(s["steps"].as_u64().unwrap() >= 1);
}

#[test]
fn ctrl_c_stops_cleanly_with_report_and_closed_trace() {
    stop_with(libc::SIGINT);
}

#[test]
fn sigterm_stops_cleanly_with_report_and_closed_trace() {
    stop_with(libc::SIGTERM);
}

#[test]
fn a_panic_in_training_still_closes_the_trace() {
    let r = setup();
    let out = start(&r, &["--epochs", "3", "--panic-at-step", "2"]).wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("training thread panicked"));
    let evs = trace_events(&r.trace);
    assert_eq!(evs.iter().filter(|e| e["name"] == "compute").count(), 2, "steps 0 and 1 ran");
}

#[test]
fn kill_9_leaves_a_prefix_that_report_repair_closes() {
    let r = setup();
    let mut child = start(&r, &["--steps", "100000000"]);
    wait_until_training(&r.trace);
    child.kill().unwrap();
    child.wait().unwrap();
    let text = std::fs::read_to_string(&r.trace).unwrap();
    assert!(serde_json::from_str::<serde_json::Value>(&text).is_err(), "not closed after kill -9");
    let out = Command::new(env!("CARGO_BIN_EXE_pipeprof"))
        .args(["report", "--repair", r.trace.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("compute"));
    let evs = trace_events(&r.trace);
    assert!(evs.iter().any(|e| e["ph"] == "X" && e["name"] == "compute"));
}
