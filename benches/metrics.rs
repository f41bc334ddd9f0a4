#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Cost of one `/metrics` scrape: rendering a run's snapshot as OpenMetrics text, and the whole
//! round trip (connect, GET, copy of the snapshot, render, response) against the real endpoint.
//!
//! `cargo bench --bench metrics`

use pipeprof::metrics::{render, Listener, Scrape};
use pipeprof_core::aggregate::machine::GpuPoint;
use pipeprof_core::aggregate::{StageSummary, Summary};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;

/// A snapshot the size of a real run's: the ten stages of `profile`, one GPU.
fn scrape() -> Scrape {
    let mut summary = Summary::default();
    summary.settings.model = "cnn.toml".into();
    summary.steps = 12_345;
    summary.images = 12_345 * 32;
    summary.images_per_s = 1_234.5;
    summary.split.mean_step_ms = 25.0;
    summary.split.wait_share = 0.3;
    summary.mean_queued = 1.2;
    let names =
        ["read", "decode", "resize", "augment", "wait", "transfer", "compute", "forward", "backward", "optimizer"];
    summary.stages = names
        .iter()
        .map(|n| StageSummary {
            stage: probes::Stage::from_name(n).unwrap(),
            count: 1000,
            total_ms: 1000.0,
            mean_ms: 1.0,
            p50_ms: 0.9,
            p95_ms: 2.5,
            max_ms: 9.0,
            on_cpu: Some(0.8),
            core_wait: Some(0.1),
            bytes: 0,
            per_second: 100.0,
            trimmed_mean_ms: None,
        })
        .collect();
    let gpu = GpuPoint { t_ns: 1, util_pct: vec![Some(63.0)], mem_used_bytes: vec![Some(3 << 30)] };
    Scrape { summary, gpu: Some(gpu), verdict: None, straggler: None }
}

fn main() {
    let s = scrape();
    let n = 20_000;
    let mut bytes = 0;
    let t = Instant::now();
    for _ in 0..n {
        bytes += render(&s).len();
    }
    let render_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!("render: {render_us:.1} µs per scrape ({} bytes)", bytes / n);

    // A distributed run of 8 ranks: each rank's series and the straggler gauges as well.
    let mut ranked = s.clone();
    ranked.summary.ranks = (0..8u32)
        .map(|r| pipeprof_core::aggregate::ranks::RankLine {
            rank: r,
            local_rank: r,
            world_size: 8,
            steps: 1000,
            images: 32_000,
            images_per_s: 150.0,
            step_ms: 25.0,
            wait_ms: 2.0 + r as f64,
            wait_share: (2.0 + r as f64) / 25.0,
            compute_ms: 23.0 - r as f64,
            stages: ranked.summary.stages.clone(),
            ..Default::default()
        })
        .collect();
    let n = 5_000;
    let mut bytes = 0;
    let t = Instant::now();
    for _ in 0..n {
        bytes += render(&ranked).len();
    }
    let ranked_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!("render, 8 ranks: {ranked_us:.1} µs per scrape ({} bytes)", bytes / n);

    let l = Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.addr();
    let _serving = l.serve(std::sync::Arc::new(move || s.clone())).unwrap();
    let n = 2_000;
    let t = Instant::now();
    for _ in 0..n {
        let mut c = TcpStream::connect(addr).unwrap();
        write!(c, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = Vec::new();
        c.read_to_end(&mut out).unwrap();
        assert!(out.starts_with(b"HTTP/1.1 200"));
    }
    let http_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!("GET /metrics round trip (new connection each): {http_us:.1} µs per scrape");
}
