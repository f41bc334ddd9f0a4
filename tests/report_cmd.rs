#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `pipeprof report`: the summary schema is stable, and `report A B` prints the deltas of two
//! fixture traces.

use pipeprof::aggregate::{Aggregator, RunSettings};
use probes::{Event, SpanRecord, Stage, StepRecord, NONE};
use std::path::Path;
use std::process::Command;

const MS: u64 = 1_000_000;

/// A run of `steps` steps of 4 images: each image decodes in `decode_ms`, each step waits
/// `wait_ms` and computes 10 ms.
fn events(steps: u64, decode_ms: u64, wait_ms: u64) -> Vec<Event> {
    let mut v = vec![Event::Thread { id: 1, name: "train".into() }, Event::Thread { id: 2, name: "loader-0".into() }];
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
        let t0 = k * (wait_ms + 10) * MS;
        for i in 0..4 {
            v.push(span(Stage::Decode, 2, t0 + i * decode_ms * MS, decode_ms * MS, k, k * 4 + i));
        }
        v.push(span(Stage::Wait, 1, t0, wait_ms * MS, k, NONE));
        v.push(span(Stage::Compute, 1, t0 + wait_ms * MS, 10 * MS, k, NONE));
        v.push(Event::Step(StepRecord {
            step: k,
            epoch: 0,
            images: 4,
            loss: 1.0 / (k + 1) as f32,
            correct: 2,
            end_ns: t0 + (wait_ms + 10) * MS,
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
    let file = pipeprof::diagnose::Diagnosed { summary: s, verdict: None, straggler: None };
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
fn report_refuses_files_that_are_not_runs() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("x.json");
    std::fs::write(&p, "{\"hello\": 1}").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pipeprof")).args(["report", p.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("neither a pipeprof trace nor a summary"));
}
