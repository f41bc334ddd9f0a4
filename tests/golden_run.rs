#![allow(clippy::unwrap_used, clippy::expect_used)]
//! One fixed, synthetic run through the whole pure path: every event kind (steps and
//! validation steps over two epochs, spans of every `Stage`, loader worker threads and a second
//! generation of them after a `--workers auto` change, the training thread, compute threads in
//! the host samples, host and GPU samples, per-layer times, skipped files, a stall, settings,
//! two ranks, one of which failed) fed to the `Aggregator` and to the Chrome trace exporter.
//! The summary JSON, the trace's events and the report's text are snapshots: a refactor of
//! aggregate, export, diagnose or report must leave them byte-identical (review a changed one
//! by reading its `.snap.new`; never accept a change you cannot explain).

use pipeprof::export::chrome::{ChromeTrace, TraceLevel};
use pipeprof::export::Exporter;
use pipeprof_core::aggregate::{Aggregator, RunSettings};
use pipeprof_core::diagnose::Diagnosed;
use probes::fsinfo::{FsInfo, FsKind};
use probes::sampler::{GpuDevice, GpuSample, GpuStatus, HostSample, OtherCpu, ProcessMatch, ThreadCpu};
use probes::{Event, LayerRecord, Rank, SpanRecord, Stage, StepRecord, ThreadRole, NONE};
use std::io::Write;

mod common;

const MS: u64 = 1_000_000;
/// Steps in the run; the loader's workers change after [`CHANGE_AT`].
const STEPS: u64 = 24;
const CHANGE_AT: u64 = 10;
const STEPS_PER_EPOCH: u64 = 12;
const STEP_NS: u64 = 20 * MS;

fn settings() -> RunSettings {
    RunSettings {
        model: "golden.toml".into(),
        data: "golden/".into(),
        images: 96,
        classes: vec!["circle".into(), "square".into()],
        device: "cpu".into(),
        workers: 2,
        cores: 4,
        batch_size: 4,
        prefetch: 2,
        epochs: 2,
        seed: 7,
        input: [3, 32, 32],
        params: 12_345,
        ..Default::default()
    }
}

fn span(stage: Stage, thread: u32, start_ns: u64, dur_ns: u64, step: u64, sample: u64) -> SpanRecord {
    // On-CPU 80% of the span, a tenth waiting for a core; reads carry their bytes.
    let bytes = if stage == Stage::Read { 40_000 + sample * 10 } else { NONE };
    SpanRecord { stage, thread, start_ns, dur_ns, cpu_ns: dur_ns / 5 * 4, queue_ns: dur_ns / 10, step, sample, bytes }
}

/// One sample's loader stages on `thread`, from `t`: (spans, end).
fn sample_spans(thread: u32, mut t: u64, step: u64, sample: u64) -> (Vec<SpanRecord>, u64) {
    let stages = [
        (Stage::Read, 500_000),
        (Stage::Decode, 2 * MS + (sample % 3) * 100_000),
        (Stage::Resize, 400_000),
        (Stage::Augment, 300_000),
        (Stage::Convert, 200_000),
    ];
    let mut v = Vec::new();
    for (stage, dur) in stages {
        v.push(span(stage, thread, t, dur, step, sample));
        t += dur;
    }
    (v, t)
}

fn thread(id: u32, name: &str, role: ThreadRole) -> Event {
    Event::Thread { id, name: name.into(), role }
}

/// A thread pipeprof names for its role.
fn own_thread(id: u32, role: ThreadRole) -> Event {
    thread(id, &role.thread_name(), role)
}

fn generation_1(worker: u32) -> ThreadRole {
    ThreadRole::Loader { worker, generation: 1 }
}

/// The loader threads making batch `k`: workers 0 and 1 (ids 2, 3) before the change; after it
/// three workers of the next generation (`loader-N.1`, ids 4–6).
fn loader_threads(k: u64) -> Vec<u32> {
    if k <= CHANGE_AT {
        vec![2, 3]
    } else {
        vec![4, 5, 6]
    }
}

/// Batch `k`'s loader work: each worker's spans in one batch event, as the Layer sends them;
/// the fetch and collate of the batch on its first worker.
fn loader_events(k: u64) -> Vec<Event> {
    let workers = loader_threads(k);
    let start = (k * STEP_NS).saturating_sub(12 * MS);
    let mut per: Vec<Vec<SpanRecord>> = vec![Vec::new(); workers.len()];
    let mut ends = vec![start; workers.len()];
    for i in 0..4u64 {
        let w = (i as usize) % workers.len();
        let (v, end) = sample_spans(workers[w], ends[w], k, k * 4 + i);
        per[w].extend(v);
        ends[w] = end;
    }
    let first = workers[0];
    per[0].push(span(Stage::Fetch, first, ends[0], 100_000, k, NONE));
    per[0].push(span(Stage::Collate, first, ends[0] + 100_000, 400_000, k, NONE));
    per.into_iter().map(Event::Spans).collect()
}

fn step_record(k: u64, end_ns: u64, validation: bool) -> StepRecord {
    StepRecord {
        step: k,
        epoch: (k / STEPS_PER_EPOCH) as u32,
        images: 4,
        loss: 2.0 / (k + 1) as f32,
        correct: (k % 5) as u32,
        end_ns,
        queued: (k % 3) as u32,
        validation,
        no_loss: false,
    }
}

/// Step `k` on the training thread (id 1): wait, transfer, compute (forward, backward,
/// optimizer inside), its layers on two steps, the step record; a validation pass at the end
/// of each epoch.
fn train_events(k: u64) -> Vec<Event> {
    let t0 = k * STEP_NS;
    // The first wait fills the queue; the pipeline of the change waits less.
    let wait = match k {
        0 => 50 * MS,
        k if k <= CHANGE_AT => 4 * MS,
        _ => MS,
    };
    // A one-off first compute (a warm-up).
    let compute = if k == 0 { 60 * MS } else { 12 * MS + (k % 4) * 250_000 };
    let c0 = t0 + wait + MS;
    let mut v = vec![
        Event::Span(span(Stage::Wait, 1, t0, wait, k, NONE)),
        Event::Span(span(Stage::Transfer, 1, t0 + wait, MS, k, NONE)),
        Event::Span(span(Stage::Forward, 1, c0, compute / 3, k, NONE)),
        Event::Span(span(Stage::Backward, 1, c0 + compute / 3, compute / 2, k, NONE)),
        Event::Span(span(Stage::Optimizer, 1, c0 + compute / 3 + compute / 2, compute / 12, k, NONE)),
    ];
    if k == 20 || k == 21 {
        // Layer records come before their step's compute span closes.
        for (layer, backward, dur) in [("conv2d_1", false, 2 * MS), ("dense_1", false, MS), ("dense_1", true, 3 * MS)] {
            v.push(Event::Layer(LayerRecord { layer: layer.into(), backward, step: k, start_ns: c0, dur_ns: dur }));
        }
    }
    v.push(Event::Span(span(Stage::Compute, 1, c0, compute, k, NONE)));
    let end = c0 + compute;
    v.push(Event::Step(step_record(k, end, false)));
    if (k + 1) % STEPS_PER_EPOCH == 0 {
        v.push(Event::Span(span(Stage::Validate, 1, end, 5 * MS, k, NONE)));
        v.push(Event::Step(step_record(k, end + 3 * MS, true)));
        v.push(Event::Step(StepRecord { images: 2, correct: 1, ..step_record(k, end + 5 * MS, true) }));
    }
    v
}

fn thread_cpu(tid: u32, role: ThreadRole, pct: f32, t_ms: u64) -> ThreadCpu {
    let cpu_ns = u64::from(tid % 7 + 1) * t_ms * MS / 10;
    let name = role.thread_name();
    ThreadCpu { tid, name, cpu_pct: pct, cpu_ns, sched_ns: Some((cpu_ns, cpu_ns / 8)), role }
}

/// The host sample after step `k`: the named threads (workers of the generation running, the
/// training thread, two compute threads), another program, the disk.
fn host_sample(k: u64) -> HostSample {
    let t_ms = (k + 1) * STEP_NS / MS;
    let mut threads = vec![thread_cpu(1001, ThreadRole::Train, 35.0, t_ms)];
    if k <= CHANGE_AT {
        threads.push(thread_cpu(1002, ThreadRole::loader(0), 60.0, t_ms));
        threads.push(thread_cpu(1003, ThreadRole::loader(1), 55.0, t_ms));
    } else {
        threads.push(thread_cpu(1004, generation_1(0), 40.0, t_ms));
        threads.push(thread_cpu(1005, generation_1(1), 42.0, t_ms));
        threads.push(thread_cpu(1006, generation_1(2), 38.0, t_ms));
    }
    threads.push(thread_cpu(1007, ThreadRole::Compute(0), 80.0 + k as f32, t_ms));
    threads.push(thread_cpu(1008, ThreadRole::Compute(1), 78.0, t_ms));
    let busy = 50.0 + (k % 4) as f32 * 5.0;
    HostSample {
        t_ns: (k + 1) * STEP_NS,
        global_cpu_pct: busy,
        per_core_pct: vec![busy + 20.0, busy, busy - 10.0, busy - 30.0],
        process_cpu_pct: 150.0 + k as f32,
        process_cpu_ns: t_ms * MS * 3 / 2,
        rss_bytes: 300_000_000 + k * 1_000_000,
        rss_processes: 1,
        host_rss_bytes: None,
        read_bytes_per_s: Some(8e6 + k as f64 * 1e5),
        write_bytes_per_s: Some(1e5),
        syscall_read_bytes_per_s: Some(9e6),
        iowait_pct: Some(2.5),
        threads,
        steal_pct: Some(0.5),
        others: if k % 8 == 3 {
            vec![OtherCpu { name: "backup".into(), processes: 2, cpu_pct: 45.0 }]
        } else {
            Vec::new()
        },
        physical_cores: Some(2),
    }
}

fn gpu_sample(k: u64) -> GpuSample {
    let util = [0.0, 35.0, 80.0, 95.0][(k / 4 % 4) as usize];
    GpuSample {
        t_ns: (k + 1) * STEP_NS,
        status: GpuStatus::Ok,
        devices: vec![GpuDevice {
            index: 0,
            name: "Golden GPU".into(),
            util_pct: Some(util),
            mem_util_pct: Some(util / 2.0),
            mem_used_bytes: Some(2_000_000_000 + k * 10_000_000),
            mem_total_bytes: Some(16_000_000_000),
            pcie_rx_bytes_per_s: Some(2.5e9),
            pcie_tx_bytes_per_s: Some(1e8),
            power_w: Some(120.0),
            sm_clock_mhz: Some(1410),
            this_process_on_gpu: Some(true),
            process_match: Some(ProcessMatch::Pid),
            process_mem_used_bytes: Some(1_500_000_000),
            pcie_gen_max: Some(4),
            pcie_gen_current: Some(if util > 0.0 { 4 } else { 1 }),
            pcie_width_max: Some(16),
            pcie_width_current: Some(16),
            run_processes: Vec::new(),
        }],
    }
}

/// Rank `r`'s part of a distributed run: its training thread and one loader worker, six steps;
/// rank 1 waits longer for data and its program fails.
fn rank_events(r: u32) -> Vec<Event> {
    let rank = Rank { rank: r, local_rank: r, world_size: 2 };
    let (train, loader) = (100 + r, 110 + r);
    let base = (STEPS + 2) * STEP_NS;
    let mut v = vec![
        thread(train, &format!("rank {r}"), ThreadRole::Other),
        thread(loader, &format!("loader-0 (rank {r}, pid {})", 500 + r), ThreadRole::loader(0)),
    ];
    let wait = if r == 1 { 9 * MS } else { MS };
    for k in 0..6u64 {
        let t0 = base + k * STEP_NS;
        v.push(Event::Spans(vec![
            span(Stage::Read, loader, t0, MS, k, k),
            span(Stage::Decode, loader, t0 + MS, 3 * MS + u64::from(r) * MS, k, k),
        ]));
        v.push(Event::Span(span(Stage::Wait, train, t0, wait, k, NONE)));
        v.push(Event::Span(span(Stage::Backward, train, t0 + wait, 4 * MS, k, NONE)));
        v.push(Event::Span(span(Stage::Compute, train, t0 + wait, 8 * MS, k, NONE)));
        v.push(Event::Step(StepRecord { epoch: 1, ..step_record(100 + k, t0 + wait + 8 * MS, false) }));
    }
    if r == 1 {
        v.push(Event::Failed("ValueError: bad label (in train.py, line 3)".into()));
    }
    v.into_iter().map(|e| Event::Ranked(rank, Box::new(e))).collect()
}

/// The whole run, in arrival order.
fn events() -> Vec<Event> {
    let mut v = vec![
        own_thread(1, ThreadRole::Train),
        own_thread(2, ThreadRole::loader(0)),
        own_thread(3, ThreadRole::loader(1)),
        Event::Settings(Box::new(serde_json::json!({"pin_memory": true, "prefetch": 2}))),
    ];
    for k in 0..STEPS {
        if k == CHANGE_AT + 1 {
            v.extend([own_thread(4, generation_1(0)), own_thread(5, generation_1(1)), own_thread(6, generation_1(2))]);
            // A thread of the program's own doing loader work: a row of its own.
            v.push(thread(8, "pool-7", ThreadRole::Other));
            v.push(Event::Span(span(Stage::Transform, 8, k * STEP_NS, 700_000, k, NONE)));
        }
        v.extend(loader_events(k));
        v.extend(train_events(k));
        if k == CHANGE_AT {
            let workers = |workers, reason: &str, settled| Event::Workers { workers, reason: reason.into(), settled };
            v.push(workers(3, "the loader kept the step waiting", false));
            v.push(workers(3, "3 kept up", true));
        }
        if k == 5 {
            v.push(Event::Skipped { path: "golden/circle/broken.png".into(), reason: "not an image".into() });
            v.push(Event::Skipped { path: "golden/square/empty.png".into(), reason: "empty file".into() });
        }
        if k == 7 || k == 8 {
            let open_ns = if k == 7 { 31_000 * MS } else { 36_000 * MS };
            v.push(Event::Stalled {
                thread: "loader-1".into(),
                stage: Stage::Read,
                file: "golden/circle/slow.png".into(),
                open_ns,
                abandoned: false,
            });
        }
        if k % 4 == 3 {
            v.push(Event::Host(Box::new(host_sample(k))));
            v.push(Event::Gpu(Box::new(gpu_sample(k))));
        }
    }
    v.extend(rank_events(0));
    v.extend(rank_events(1));
    v.push(Event::Finish);
    v
}

fn aggregate() -> Aggregator {
    let mut a = Aggregator::new(settings());
    a.set_data_fs(FsInfo {
        fs_type: "ext4".into(),
        kind: FsKind::Local,
        mount_point: Some("/".into()),
        source: Some("/dev/sda1".into()),
        magic: Some(0xEF53),
    });
    for e in events() {
        a.push(&e);
    }
    a.set_dropped(3);
    a
}

#[test]
fn golden_run_summary_json() {
    let s = aggregate().summary();
    insta::assert_snapshot!(serde_json::to_string_pretty(&s).unwrap());
}

/// `--json`'s document of the golden run: every kind of evidence, flag, advice and the
/// straggler it has, held against the schema by a real validator.
#[test]
fn golden_run_verdict_json() {
    let d = Diagnosed::new(aggregate().summary());
    let doc = serde_json::to_value(pipeprof::report::json::VerdictJson::of(&d, &[])).unwrap();
    assert_eq!(common::verdict_schema_errors(&doc), Vec::<String>::new());
    insta::assert_snapshot!(serde_json::to_string_pretty(&doc).unwrap());
    let summary = serde_json::to_value(&d).unwrap();
    assert_eq!(common::summary_schema_errors(&summary), Vec::<String>::new(), "the summary file holds too");
}

#[test]
fn golden_run_report_text() {
    let d = Diagnosed::new(aggregate().summary());
    insta::assert_snapshot!(pipeprof::report::render(&d));
}

/// A writer the test keeps a handle to after the trace is gone.
#[derive(Clone, Default)]
struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The trace the exporter writes for the run, with what depends on the test process made fixed:
/// its pid, and the clock reading of the opening settings event.
fn trace_text() -> String {
    let buf = Shared::default();
    let mut t = ChromeTrace::new(buf.clone(), "golden", TraceLevel::Sample).unwrap();
    t.settings(&settings()).unwrap();
    for e in events() {
        t.event(&e).unwrap();
    }
    t.summary(&Diagnosed::new(aggregate().summary())).unwrap();
    t.finish().unwrap();
    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    let text = text.replace(&format!("\"pid\":{},", std::process::id()), "\"pid\":1,");
    let mut settings_seen = false;
    text.lines()
        .map(|l| {
            let body = l.trim_end_matches(',');
            match serde_json::from_str::<serde_json::Value>(body) {
                Ok(mut v) if v["name"] == "settings" && !settings_seen => {
                    settings_seen = true;
                    v["ts"] = 0.into();
                    format!("{}{}", v, &l[body.len()..])
                }
                _ => l.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn golden_run_chrome_trace() {
    let text = trace_text();
    // Whole, valid JSON: what viewers load.
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(v["traceEvents"].as_array().is_some_and(|e| e.len() > 100), "{text}");
    insta::assert_snapshot!(text);
}

#[test]
fn golden_run_report_of_its_trace() {
    // `pipeprof report` on the trace: the statistics rebuilt from its events, the rest from the
    // summary the run wrote at its end.
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("golden.json");
    std::fs::write(&p, trace_text()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pipeprof")).args(["report"]).arg(&p).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    insta::assert_snapshot!(String::from_utf8(out.stdout).unwrap());
}
