#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Cost of one stage span (create + enter + exit + close) through the probes Layer and channel.
//!
//! `cargo bench --bench overhead`. Prints ns per span for: no subscriber, the bare registry,
//! the Layer on a non-stage span, a stage span with wall-clock timestamps only, and a stage
//! span that also reads the thread CPU clock and run-queue wait; and those two readings alone.
//! A thread drains the channel as the collector would.

use probes::{Probe, ProbeLayer};
use std::time::Instant;
use tracing::info_span;
use tracing_subscriber::layer::SubscriberExt;

const N: u64 = 2_000_000;

fn time(label: &str, f: impl Fn(u64)) -> f64 {
    // Warm up, then best of 5 to shrug off a noisy neighbour.
    f(N / 10);
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        f(N);
        best = best.min(t.elapsed().as_nanos() as f64 / N as f64);
    }
    println!("{label:<52} {best:>7.1} ns/span");
    best
}

fn spans(name: &'static str) -> impl Fn(u64) {
    move |n| {
        for i in 0..n {
            match name {
                "wait" => drop(info_span!("wait", step = i).entered()),
                "decode" => drop(info_span!("decode", step = i, sample = i).entered()),
                "chain" => {
                    drop(info_span!("read", step = i, sample = i).entered());
                    drop(info_span!("decode", step = i, sample = i).entered());
                    drop(info_span!("resize", step = i, sample = i).entered());
                }
                _ => drop(info_span!("other", step = i).entered()),
            }
        }
    }
}

fn main() {
    // The clocks a CPU-timed span boundary reads, alone: the run-queue wait (schedstat, for the
    // off-CPU split) is the new one; the loader also reads all three once per batch.
    time("thread CPU clock alone (per reading)", |n| {
        for _ in 0..n {
            std::hint::black_box(probes::clock::thread_cpu_ns());
        }
    });
    time("run-queue wait alone, schedstat pread (per reading)", |n| {
        for _ in 0..n {
            std::hint::black_box(probes::clock::thread_queue_ns());
        }
    });
    time("no subscriber (spans disabled)", spans("wait"));
    tracing::subscriber::with_default(tracing_subscriber::registry(), || {
        time("bare registry", spans("wait"));
    });
    let (probe, rx) = Probe::new(probes::DEFAULT_CAPACITY);
    let drain = std::thread::spawn(move || rx.iter().count());
    let sub = tracing_subscriber::registry().with(ProbeLayer::new(probe.clone()));
    tracing::subscriber::with_default(sub, || {
        time("registry + Layer, span that is not a stage", spans("other"));
        time("registry + Layer, stage span, wall clock only", spans("wait"));
        time("registry + Layer, stage span + thread CPU clock", spans("decode"));
        let chain = time("  read→decode→resize back to back (per 3 spans)", spans("chain"));
        println!("{:<52} {:>7.1} ns/span", "  = per CPU-timed span in a chain", chain / 3.0);
    });
    println!("dropped on a full channel: {} (drain thread kept up: should be ~0)", probe.dropped());
    drop(probe);
    let _ = drain;
}
