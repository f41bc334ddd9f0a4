#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Trace writing speed: span events per second through the Chrome exporter into a file.
//!
//! `cargo bench --bench trace`. Also prints bytes per event, to size traces of long runs.

use pipeprof::export::chrome::{ChromeTrace, TraceLevel};
use pipeprof::export::Exporter;
use probes::{Event, SpanRecord, Stage, NONE};
use std::time::Instant;

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench-trace.json");
    let n: u64 = 2_000_000;
    let batch: Vec<SpanRecord> = (0..64u64)
        .map(|i| SpanRecord {
            stage: if i % 2 == 0 { Stage::Compute } else { Stage::Wait },
            thread: 3,
            start_ns: 1_000_000_000 + i * 1_000,
            dur_ns: 987_654,
            cpu_ns: if i % 2 == 0 { 876_543 } else { NONE },
            queue_ns: if i % 2 == 0 { 12_345 } else { NONE },
            step: i,
            sample: NONE,
            bytes: NONE,
        })
        .collect();
    let ev = Event::Spans(batch);
    let t0 = Instant::now();
    let mut t = ChromeTrace::create(&path, "bench", TraceLevel::Sample).unwrap();
    for _ in 0..n / 64 {
        t.event(&ev).unwrap();
    }
    t.finish().unwrap();
    drop(t);
    let secs = t0.elapsed().as_secs_f64();
    let bytes = std::fs::metadata(&path).unwrap().len();
    println!(
        "trace writing: {:.2} M span events/s, {:.0} bytes per event",
        n as f64 / secs / 1e6,
        bytes as f64 / n as f64
    );
}
