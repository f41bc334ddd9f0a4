#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End to end: the real binary on generated data.

mod common;
use common::{pipeprof_env as pipeprof, text};

use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

fn setup() -> (tempfile::TempDir, String, String) {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("imgs");
    common::demo(&data, 3, 48, 11);
    let model = d.path().join("tiny.toml");
    std::fs::write(&model, common::tiny_model(2)).unwrap();
    (d, model.display().to_string(), data.display().to_string())
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

#[test]
fn tiny_model_learns_and_every_stage_arrives_in_causal_order() {
    let (d, model, data) = setup();
    let summary = d.path().join("s.json");
    let trace = d.path().join("t.json");
    let out = pipeprof(
        &[
            "profile",
            "--model",
            &model,
            "--data",
            &data,
            "--epochs",
            "6",
            "--summary",
            summary.to_str().unwrap(),
            "--trace",
            trace.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("Total params") && stdout.contains("pipeprof report"), "{stdout}");

    let s = read_json(&summary);
    let epochs = s["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), 6);
    let first = epochs[0]["loss"].as_f64().unwrap();
    let last = epochs[5]["loss"].as_f64().unwrap();
    let acc = epochs[5]["accuracy"].as_f64().unwrap();
    assert!(last < 0.8 * first, "loss should fall: {first} → {last}");
    assert!(acc > 0.5, "3 classes, chance is 0.33: accuracy {acc}");
    let images = 3 * 48 * 6;
    assert_eq!(s["images"], images);
    let counts: HashMap<String, u64> = s["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| (x["stage"].as_str().unwrap().to_string(), x["count"].as_u64().unwrap()))
        .collect();
    for st in ["read", "decode", "resize"] {
        assert_eq!(counts[st], images, "{st}");
    }
    for st in ["transfer", "compute", "forward", "backward", "optimizer"] {
        assert_eq!(counts[st], 54, "{st}: 144 images / 16 = 9 steps × 6 epochs");
    }
    assert_eq!(counts["wait"], 55, "one wait per step, and the last one finds the end");
    assert_eq!(s["events_dropped"], 0);

    // The trace: loader stages of each sample in order, before the step that trains on it.
    let t = read_json(&trace);
    let evs = t["traceEvents"].as_array().unwrap();
    let names: HashMap<u64, String> = evs
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| (e["tid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap().to_string()))
        .collect();
    let mut per_sample: HashMap<(u64, u64), HashMap<String, (f64, f64)>> = HashMap::new();
    let mut transfer_start: HashMap<u64, f64> = HashMap::new();
    let mut layer_spans: HashMap<String, u64> = HashMap::new();
    for e in evs.iter().filter(|e| e["ph"] == "X") {
        let name = e["name"].as_str().unwrap().to_string();
        let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
        let thread = &names[&e["tid"].as_u64().unwrap()];
        let step = e["args"]["step"].as_u64().unwrap();
        if matches!(name.as_str(), "read" | "decode" | "resize") {
            assert!(thread.starts_with("loader-"), "{name} on {thread}");
            let sample = e["args"]["sample"].as_u64().unwrap();
            per_sample.entry((step, sample)).or_default().insert(name, (ts, ts + dur));
        } else if e["cat"] == "layer" {
            // Each layer's forward and backward, on the track beside the training thread.
            assert_eq!(thread, "train: layers", "{name}");
            *layer_spans.entry(name).or_default() += 1;
        } else {
            assert_eq!(thread, "train", "{name}");
            if name == "transfer" {
                transfer_start.insert(step, ts);
            }
        }
    }
    assert_eq!(per_sample.len(), images as usize);
    // Every layer of the model, both passes, once per timed step.
    let layers: Vec<&str> = s["layers"].as_array().unwrap().iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert!(!layers.is_empty());
    // Steps 1–3, then every 10th, of the 54 (steps 0..54): 1, 2, 3, 10, 20, 30, 40, 50.
    let timed = (0..54).filter(|s| pipeprof_trainer::train::times_layers(*s)).count() as u64;
    assert_eq!(timed, 8);
    assert_eq!(s["layer_steps"], 8);
    for l in &layers {
        for pass in ["forward", "backward"] {
            assert_eq!(layer_spans.get(&format!("{l} {pass}")), Some(&timed), "{l} {pass}");
        }
    }
    assert_eq!(layer_spans.len(), 2 * layers.len(), "{layer_spans:?}");
    // Per thread, top-level spans never overlap and appear in time order.
    let mut last_end: HashMap<u64, f64> = HashMap::new();
    for e in evs.iter().filter(|e| e["ph"] == "X") {
        if matches!(e["name"].as_str(), Some("forward" | "backward" | "optimizer")) {
            continue;
        }
        let (tid, ts, dur) = (e["tid"].as_u64().unwrap(), e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
        let prev = last_end.insert(tid, ts + dur).unwrap_or(0.0);
        assert!(
            ts + 0.001 >= prev,
            "{} on thread {tid} starts at {ts} before the previous span ended at {prev}",
            e["name"]
        );
    }
    for counter in ["CPU %", "RSS MB", "step", "images/s"] {
        assert!(evs.iter().any(|e| e["ph"] == "C" && e["name"] == counter), "counter {counter}");
    }
    for ((step, sample), st) in &per_sample {
        let (r, de, rs) = (st["read"], st["decode"], st["resize"]);
        assert!(r.1 <= de.0 && de.1 <= rs.0, "sample {sample}: read → decode → resize");
        assert!(rs.1 <= transfer_start[step], "sample {sample} resized before step {step} transfers it");
    }
}

#[test]
fn corrupt_files_are_skipped_with_their_names_and_the_run_goes_on() {
    let (d, model, data) = setup();
    std::fs::write(Path::new(&data).join("circle/zero.png"), b"").unwrap();
    std::fs::write(Path::new(&data).join("cross/garbage.jpg"), b"\xff\xd8\xffnot really").unwrap();
    let summary = d.path().join("s.json");
    let out = pipeprof(
        &["profile", "--model", &model, "--data", &data, "--epochs", "2", "--summary", summary.to_str().unwrap()],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert_eq!(err.matches("warning: skipped").count(), 2, "one warning per file, not per epoch: {err}");
    assert!(err.contains("zero.png: empty file"), "{err}");
    let s = read_json(&summary);
    assert_eq!(s["skipped_count"], 2);
    assert_eq!(s["images"], 2 * 3 * 48);
    assert!(text(&out.stdout).contains("garbage.jpg"));
}

#[test]
fn zero_usable_images_is_a_clear_error() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join("imgs/a")).unwrap();
    for i in 0..3 {
        std::fs::write(d.path().join(format!("imgs/a/{i}.png")), b"nope").unwrap();
    }
    let model = d.path().join("m.toml");
    std::fs::write(&model, common::tiny_model(2)).unwrap();
    let out = pipeprof(
        &["profile", "--model", model.to_str().unwrap(), "--data", d.path().join("imgs").to_str().unwrap()],
        &[],
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("no usable images") && err.contains("3 files were skipped"), "{err}");
}

#[test]
fn tiny_channel_drops_and_counts_instead_of_stalling() {
    let (d, model, data) = setup();
    let summary = d.path().join("s.json");
    let out = pipeprof(
        &[
            "profile",
            "--model",
            &model,
            "--data",
            &data,
            "--steps",
            "6",
            "--channel-capacity",
            "1",
            "--summary",
            summary.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = read_json(&summary);
    // 96 images × 3 loader spans + 6 steps × 5 spans + 7 waits + 6 step records: every one
    // was either received or counted as dropped.
    let offered = 96 * 3 + 6 * 5 + 7 + 6;
    let (rx, dropped) = (s["events_received"].as_u64().unwrap(), s["events_dropped"].as_u64().unwrap());
    assert!(rx + dropped >= offered, "{rx} received + {dropped} dropped < {offered} offered");
    assert!(text(&out.stdout).contains(&format!("{dropped} dropped")));
}

#[test]
fn broken_config_names_the_file_line_and_column() {
    let d = tempfile::tempdir().unwrap();
    let model = d.path().join("bad.toml");
    std::fs::write(&model, "[train]\nbatch_size = 8\nlearning_rat = 0.1\n[[layers]]\ntype = \"flatten\"\n").unwrap();
    let out = pipeprof(&["profile", "--model", model.to_str().unwrap(), "--data", "/nonexistent"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("bad.toml:3:1") && err.contains("learning_rat"), "{err}");
}

#[test]
fn default_run_uses_the_builtin_model_and_writes_demo_data_once() {
    let cache = tempfile::tempdir().unwrap();
    let out = pipeprof(&["profile", "--steps", "2"], &[("XDG_CACHE_HOME", cache.path())]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("writing the demo data set"), "{err}");
    assert!(text(&out.stdout).contains("built-in examples/cnn.toml"));
    let again = pipeprof(&["profile", "--steps", "1"], &[("XDG_CACHE_HOME", cache.path())]);
    assert!(again.status.success());
    assert!(text(&again.stderr).contains("using the demo data set"));
}

#[test]
fn cuda_without_the_feature_and_bad_flags_are_explained() {
    let out = pipeprof(&["profile", "--device", "cuda:0", "--data", "/nonexistent"], &[]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--features cuda"), "{}", text(&out.stderr));
    let out = pipeprof(&["profile", "--workers", "zero"], &[]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("workers must be"), "{}", text(&out.stderr));
}

#[test]
fn a_node_name_or_job_id_that_would_not_name_a_file_is_refused_before_anything_runs() {
    // `{node}` becomes part of file names, and the name a metric label: `..`, a slash or a space
    // is a usage error, not a name quietly replaced by the host's.
    for (flag, value) in [("--node", ".."), ("--node", "a/b"), ("--job", "my job"), ("--node", "")] {
        let out = pipeprof(&["run", "--once", flag, value, "--", "true"], &[]);
        assert_eq!(out.status.code(), Some(2), "{flag} {value:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains("letters, digits, '-', '_' and '.' only"), "{}", text(&out.stderr));
    }
}

#[test]
fn demo_data_writes_the_requested_set() {
    let d = tempfile::tempdir().unwrap();
    let out = pipeprof(
        &[
            "demo-data",
            d.path().to_str().unwrap(),
            "--classes",
            "2",
            "--per-class",
            "3",
            "--size",
            "20x10",
            "--format",
            "png",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ds = pipeprof_trainer::data::scan(d.path()).unwrap();
    assert_eq!(ds.class_counts(), vec![3, 3]);
    let img = image::open(&ds.samples[0].path).unwrap();
    assert_eq!((img.width(), img.height()), (20, 10));
}

#[test]
fn fake_nvml_fills_the_gpu_section_and_a_missing_driver_says_why() {
    let (d, model, data) = setup();
    let lib = fake_nvml::build(Path::new(env!("CARGO_TARGET_TMPDIR"))).unwrap();
    let summary = d.path().join("s.json");
    let mut c = Command::new(env!("CARGO_BIN_EXE_pipeprof"));
    c.args(["profile", "--model", &model, "--data", &data, "--steps", "3", "--summary", summary.to_str().unwrap()])
        .env("PIPEPROF_NVML_LIB", &lib)
        .env("FAKE_NVML_DEVICES", "2")
        .env("FAKE_NVML_MEM_USED_MIB", "3")
        .env("FAKE_NVML_UTIL", "0,15,95,100,40");
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = text(&out.stdout);
    assert!(report.contains("GPU 0") && report.contains("GPU 1"), "{report}");
    assert!(report.contains("NVML lists none of the run's processes on it"), "{report}");
    assert!(report.contains("GPU present but unused"), "a CPU run beside an idle GPU: {report}");
    let s = read_json(&summary);
    assert_eq!(s["machine"]["devices"].as_array().unwrap().len(), 2);
    assert_eq!(s["machine"]["gpu_status"], "Ok");
    assert!(s["machine"]["host_samples"].as_u64().unwrap() >= 1, "the final sample is always taken");

    let missing = d.path().join("no-such-libnvidia-ml.so");
    let out = pipeprof(
        &["profile", "--model", &model, "--data", &data, "--steps", "2", "--summary", summary.to_str().unwrap()],
        &[("PIPEPROF_NVML_LIB", &missing)],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = text(&out.stdout);
    assert!(report.contains("GPU      off:"), "{report}");
    let s = read_json(&summary);
    assert!(s["machine"]["gpu_status"]["Off"].as_str().unwrap().contains("no-such-libnvidia-ml.so"), "{s}");
}
