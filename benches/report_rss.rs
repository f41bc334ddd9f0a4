#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `pipeprof report` memory against trace size: peak RSS of the real binary reading a
//! trace as pipeprof writes it (read as a stream), at 1/8 and at the full size, and the
//! same events in another layout (one line: read whole) at 1/8 for contrast.
//!
//! `cargo bench --bench report_rss` (PP_TRACE_MB sets the full size, default 1024).

use pipeprof::export::chrome::{ChromeTrace, TraceLevel};
use pipeprof::export::Exporter;
use pipeprof_core::aggregate::RunSettings;
use probes::sampler::HostSample;
use probes::{Event, SpanRecord, Stage, StepRecord, ThreadRole, NONE};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// Writes a trace of about `mb` MB: per-sample loader spans, loop spans, steps, host samples.
fn write_trace(path: &Path, mb: u64) {
    let mut t = ChromeTrace::create(path, "bench", TraceLevel::Sample).unwrap();
    t.settings(&RunSettings { workers: 2, batch_size: 32, ..Default::default() }).unwrap();
    t.event(&Event::Thread { id: 2, name: "loader-0".into(), role: ThreadRole::loader(0) }).unwrap();
    t.event(&Event::Thread { id: 1, name: "train".into(), role: ThreadRole::Train }).unwrap();
    let span = |stage, thread, start_ns, step, sample| SpanRecord {
        stage,
        thread,
        start_ns,
        dur_ns: 987_654,
        cpu_ns: 876_543,
        queue_ns: 12_345,
        step,
        sample,
        bytes: NONE,
    };
    let mut step = 0u64;
    loop {
        let t0 = 1_000_000_000 + step * 50_000_000;
        let mut batch = Vec::with_capacity(3 * 32 + 2);
        for k in 0..32 {
            for st in [Stage::Read, Stage::Decode, Stage::Resize] {
                batch.push(span(st, 2, t0 + k * 1_000_000, step, step * 32 + k));
            }
        }
        batch.push(span(Stage::Wait, 1, t0, step, NONE));
        batch.push(span(Stage::Compute, 1, t0 + 1_000_000, step, NONE));
        t.event(&Event::Spans(batch)).unwrap();
        t.event(&Event::Step(StepRecord {
            no_loss: false,
            step,
            epoch: (step / 1000) as u32,
            images: 32,
            loss: 1.0 / (1.0 + step as f32),
            correct: 16,
            end_ns: t0 + 40_000_000,
            queued: 1,
            validation: false,
        }))
        .unwrap();
        if step % 4 == 0 {
            let h = HostSample {
                t_ns: t0,
                process_cpu_pct: 150.0,
                global_cpu_pct: 80.0,
                rss_bytes: 1 << 28,
                ..Default::default()
            };
            t.event(&Event::Host(Box::new(h))).unwrap();
        }
        step += 1;
        if step % 1000 == 0 && std::fs::metadata(path).unwrap().len() >= mb << 20 {
            break;
        }
    }
    t.finish().unwrap();
}

/// Peak RSS (MB) of `pipeprof report FILE`, and its wall time. Read from the child's own
/// `VmHWM` while it runs: `wait4`'s `ru_maxrss` would start from this process's high-water
/// mark at fork (Linux carries it over exec), and this process held a trace in memory.
fn report_rss(trace: &Path) -> (f64, f64) {
    let t0 = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pipeprof"))
        .arg("report")
        .arg(trace)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status_file = format!("/proc/{}/status", child.id());
    let mut hwm_kb = 0u64;
    loop {
        if let Ok(text) = std::fs::read_to_string(&status_file) {
            let kb = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok());
            hwm_kb = hwm_kb.max(kb.unwrap_or(0));
        }
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "pipeprof report failed on {}", trace.display());
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    (hwm_kb as f64 / 1024.0, t0.elapsed().as_secs_f64())
}

fn main() {
    let full: u64 = std::env::var("PP_TRACE_MB").ok().and_then(|s| s.parse().ok()).unwrap_or(1024);
    let dir = tempfile::tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/target")).unwrap();
    let small = dir.path().join("small.json");
    let big = dir.path().join("big.json");
    write_trace(&small, full / 8);
    write_trace(&big, full);
    // The same events as one line: not pipeprof's layout, so read whole.
    let text = std::fs::read_to_string(&small).unwrap();
    let one_line = dir.path().join("one-line.json");
    std::fs::write(&one_line, text.replace(",\n", ",").replace("[\n", "[").replace("\n]", "]")).unwrap();
    drop(text);
    let mb = |p: &Path| std::fs::metadata(p).unwrap().len() as f64 / (1 << 20) as f64;
    let (s_rss, s_t) = report_rss(&small);
    let (b_rss, b_t) = report_rss(&big);
    let (w_rss, w_t) = report_rss(&one_line);
    println!("report, streamed:   {:>6.0} MB trace → peak RSS {s_rss:>6.1} MB ({s_t:.1} s)", mb(&small));
    println!("report, streamed:   {:>6.0} MB trace → peak RSS {b_rss:>6.1} MB ({b_t:.1} s)", mb(&big));
    println!("report, read whole: {:>6.0} MB trace → peak RSS {w_rss:>6.1} MB ({w_t:.1} s)", mb(&one_line));
    println!(
        "streamed RSS ratio, {:.0}× the trace: {:.2}×; read whole / streamed at the same size: {:.1}×",
        mb(&big) / mb(&small),
        b_rss / s_rss,
        w_rss / s_rss
    );
}
