#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `pipeprof report`: the summary schema is stable, and `report A B` prints the deltas of two
//! fixture traces.

use pipeprof_core::aggregate::{Aggregator, RunSettings};
use probes::{Event, SpanRecord, Stage, StepRecord, ThreadRole, NONE};
use std::path::Path;
use std::process::Command;

mod common;

const MS: u64 = 1_000_000;

/// A run of `steps` steps of 4 images: each image decodes in `decode_ms`, each step waits
/// `wait_ms` and computes 10 ms.
fn events(steps: u64, decode_ms: u64, wait_ms: u64) -> Vec<Event> {
    events_with(steps, decode_ms, wait_ms, 10)
}

/// [`events`] with `compute_ms` of compute per step.
fn events_with(steps: u64, decode_ms: u64, wait_ms: u64, compute_ms: u64) -> Vec<Event> {
    let mut v = vec![
        Event::Thread { id: 1, name: "train".into(), role: ThreadRole::Train },
        Event::Thread { id: 2, name: "loader-0".into(), role: ThreadRole::loader(0) },
    ];
    let span = |stage, thread, start, dur, step, sample| {
        Event::Span(SpanRecord {
            stage,
            thread,
            start_ns: start,
            dur_ns: dur,
            cpu_ns: dur,
            queue_ns: 0,
            step,
            sample,
            bytes: NONE,
        })
    };
    for k in 0..steps {
        let t0 = k * (wait_ms + compute_ms) * MS;
        for i in 0..4 {
            v.push(span(Stage::Decode, 2, t0 + i * decode_ms * MS, decode_ms * MS, k, k * 4 + i));
        }
        v.push(span(Stage::Wait, 1, t0, wait_ms * MS, k, NONE));
        v.push(span(Stage::Compute, 1, t0 + wait_ms * MS, compute_ms * MS, k, NONE));
        v.push(Event::Step(StepRecord {
            no_loss: false,
            step: k,
            epoch: 0,
            images: 4,
            loss: 1.0 / (k + 1) as f32,
            correct: 2,
            end_ns: t0 + (wait_ms + compute_ms) * MS,
            queued: 0,
            validation: false,
        }));
    }
    v
}

fn settings(workers: usize) -> RunSettings {
    RunSettings {
        model: "fixture.toml".into(),
        data: "fixture/".into(),
        workers,
        cores: 2,
        batch_size: 4,
        ..Default::default()
    }
}

#[test]
fn summary_json_schema_is_stable() {
    let mut agg = Aggregator::new(settings(1));
    for e in events(3, 2, 5) {
        agg.push(&e);
    }
    let mut s = agg.summary();
    // The machine section depends on the machine: the schema test covers everything else.
    s.machine = Default::default();
    // The file holds the summary and its verdict (none here: the schema is the point).
    let file = pipeprof_core::diagnose::Diagnosed { summary: s, verdict: None, straggler: None };
    insta::assert_snapshot!(serde_json::to_string_pretty(&file).unwrap());
}

fn write_trace(path: &Path, workers: usize, decode_ms: u64, wait_ms: u64) {
    use pipeprof::export::chrome::{ChromeTrace, TraceLevel};
    use pipeprof::export::Exporter;
    let mut t = ChromeTrace::create(path, "fixture", TraceLevel::Sample).unwrap();
    t.settings(&settings(workers)).unwrap();
    for e in events(10, decode_ms, wait_ms) {
        t.event(&e).unwrap();
    }
    t.finish().unwrap();
}

#[test]
fn report_a_b_prints_the_deltas_of_two_traces() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("a.json"), d.path().join("b.json"));
    // Before: each step waits 30 ms for data (40 ms steps). After: 0 ms (10 ms steps): 4×.
    write_trace(&a, 1, 8, 30);
    write_trace(&b, 2, 2, 0);
    let out = Command::new(env!("CARGO_BIN_EXE_pipeprof"))
        .args(["report", a.to_str().unwrap(), b.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |name: &str| text.lines().find(|l| l.trim_start().starts_with(name)).unwrap_or("").to_string();
    assert!(line("images/s").ends_with("4.00×"), "{text}");
    assert!(line("step time").contains("40.00 ms") && line("step time").ends_with("0.25×"), "{text}");
    assert!(line("decode").contains("8.00 ms") && line("decode").ends_with("0.25×"), "{text}");
    assert!(line("workers").contains("1 · 4") && line("workers").contains("2 · 4"), "{text}");
    assert!(text.contains("verdict:"), "{text}");

    let one = Command::new(env!("CARGO_BIN_EXE_pipeprof")).args(["report", a.to_str().unwrap()]).output().unwrap();
    let text = String::from_utf8_lossy(&one.stdout);
    assert!(text.contains("trained 10 steps, 40 images"), "{text}");
}

#[test]
fn compare_says_what_changed_and_its_gates_fail_with_exit_1_naming_why() {
    let d = tempfile::tempdir().unwrap();
    let (slow, fast) = (d.path().join("slow.json"), d.path().join("fast.json"));
    // Slow: each step waits 30 ms for data (40 ms steps); fast: none (10 ms steps).
    write_trace(&slow, 1, 8, 30);
    write_trace(&fast, 2, 2, 0);
    let compare = |args: &[&Path], extra: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_pipeprof"));
        c.arg("compare").args(extra).args(args);
        c.output().unwrap()
    };
    // Faster: passes every gate.
    let out = compare(&[&slow, &fast], &["--max-slowdown", "10", "--fail-if-input-bound"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let line = |name: &str| text.lines().find(|l| l.trim_start().starts_with(name)).unwrap_or("").to_string();
    assert!(line("images/s").ends_with("4.00×") && line("decode").ends_with("0.25×"), "{text}");
    // Slower (the files swapped): 75% fewer images/s, over the 10% allowed; and input-bound.
    let out = compare(&[&fast, &slow], &["--max-slowdown", "10", "--fail-if-input-bound=moderate"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let failed: Vec<&str> = err.lines().filter(|l| l.starts_with("pipeprof compare: FAILED: ")).collect();
    assert_eq!(failed.len(), 2, "{err}");
    assert!(failed[0].contains("images/s fell 75.0%") && failed[0].contains("over the 10% allowed"), "{err}");
    assert!(failed[1].contains("the new run is input-bound (high)"), "{err}");
    // The same as JSON, with the same status.
    let out = compare(&[&fast, &slow], &["--max-slowdown", "10", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document on stdout");
    assert_eq!(v["schema"], "pipeprof.compare/1");
    assert_eq!((v["passed"].as_bool(), v["failures"].as_array().map(Vec::len)), (Some(false), Some(1)), "{v}");
    assert!((v["slowdown_pct"].as_f64().unwrap() - 75.0).abs() < 1e-6, "{v}");
    assert_eq!(v["verdict"]["new"]["input_bound"], true, "{v}");
    assert_eq!(v["verdict_changed"], true, "{v}");
    assert!(v["stages"].as_array().unwrap().iter().any(|s| s["stage"] == "decode" && s["base"] == 2.0), "{v}");
    // A file that does not read: 2, not a failed gate.
    let out = compare(&[&fast, &d.path().join("missing.json")], &["--max-slowdown", "10"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.json"));
    // A slowdown that is not a percentage is refused by the command line.
    let out = compare(&[&fast, &slow], &["--max-slowdown", "150"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("150 is not a percentage from 0 to 100"));
}

#[test]
fn report_refuses_files_that_are_not_runs() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("x.json");
    std::fs::write(&p, "{\"hello\": 1}").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pipeprof")).args(["report", p.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("neither a pipeprof trace nor a summary"));
}

#[test]
fn report_reads_one_trace_per_rank_and_names_the_straggler() {
    use pipeprof::export::ranks::{rank_path, RankTraces};
    use pipeprof::export::Exporter;
    let d = tempfile::tempdir().unwrap();
    let base = d.path().join("t.json");
    let mut traces = RankTraces::new(&base, "fixture", Default::default());
    traces.settings(&settings(1)).unwrap();
    // Steps of 40 ms on both ranks: rank 1 waits 30 ms of them for data, rank 0 1 ms.
    let ranks = [(0, events_with(10, 1, 1, 39)), (1, events_with(10, 8, 30, 10))];
    for (r, evs) in ranks {
        let rank = probes::Rank { rank: r, local_rank: r, world_size: 2 };
        for e in evs {
            traces.event(&Event::Ranked(rank, Box::new(e))).unwrap();
        }
    }
    traces.summary(&Default::default()).unwrap();
    traces.finish().unwrap();
    let (r0, r1) = (rank_path(&base, 0), rank_path(&base, 1));
    let header = std::fs::read_to_string(&r1).unwrap().lines().next().unwrap().to_string();
    assert!(header.contains(r#""distributedInfo":{"local_rank":1,"rank":1,"world_size":2}"#), "{header}");
    assert!(header.contains(r#""clockOffsetNs":"#), "{header}");

    let report =
        |files: &[&Path]| Command::new(env!("CARGO_BIN_EXE_pipeprof")).arg("report").args(files).output().unwrap();
    // In any order: by rank.
    let out = report(&[&r1, &r0]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("pipeprof report: 2 ranks"), "{text}");
    let l0 = text.find("  rank 0 · 10 steps · ").expect("rank 0's line");
    let l1 = text.find("  rank 1 · 10 steps · ").expect("rank 1's line");
    assert!(l0 < l1, "{text}");
    assert!(text.contains("wait for data 75% (30.0ms)"), "{text}");
    assert!(text.contains("straggler: rank 1\n"), "{text}");
    assert!(
        text.contains("rank 0 spends the difference waiting in the all-reduce: 29.0 ms per step (inferred"),
        "{text}"
    );

    // The same rank twice, or a file that is no rank: refused, naming the file.
    let out = report(&[&r0, &r0]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("both rank 0"), "{}", String::from_utf8_lossy(&out.stderr));
    let plain = d.path().join("plain.json");
    write_trace(&plain, 1, 2, 5);
    let out = report(&[&r0, &r1, &plain]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("plain.json: not part of a distributed run"), "{err}");
}

#[test]
fn a_crafted_summary_with_a_huge_hostile_name_gives_a_short_clean_report() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.json");
    let mut v = serde_json::to_value(pipeprof_core::diagnose::Diagnosed::default()).unwrap();
    v["schema_version"] = pipeprof_core::aggregate::SUMMARY_SCHEMA_VERSION.into();
    // 900 KB of program name with a terminal escape in it (before: 533 MB and a panic).
    v["settings"]["model"] = format!("\u{1b}]0;owned\u{7}{}", "m".repeat(900_000)).into();
    v["failed"] = "boom\u{1b}[2J".into();
    std::fs::write(&path, v.to_string()).unwrap();
    let out = common::pipeprof(&["report", path.to_str().unwrap()]);
    let (stdout, stderr) = (common::text(&out.stdout), common::text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.len() < 64 * 1024, "{} bytes of report", stdout.len());
    assert!(!stdout.contains('\u{1b}') && !stderr.contains('\u{1b}'), "an escape reached the terminal");
}
