#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The live view rendered without a terminal (ratatui's TestBackend) from hand-built state,
//! snapshot-tested with insta. Review changed snapshots by eye: they are the screen.

use pipeprof::tui::state::Focus;
use pipeprof::tui::{view, State};
use pipeprof_core::aggregate::machine::gpu::DeviceSummary;
use pipeprof_core::aggregate::machine::{GpuPoint, HostPoint};
use pipeprof_core::aggregate::{EpochSummary, RunSettings, Snapshot, StageSummary, StepPoint, StepSplit, Summary};
use pipeprof_core::diagnose::{Advice, Change, Flag, Limiter, Severity, Verdict};
use probes::fsinfo::{FsInfo, FsKind};
use probes::sampler::GpuStatus;
use probes::{Stage, StepRecord};
use ratatui::backend::TestBackend;
use ratatui::layout::Rect;
use ratatui::{Frame, Terminal};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
/// The fake run's clock at the last event: 30 s in.
const NOW: u64 = 30 * SEC;

fn stage(name: &str, count: u64, mean_ms: f64, p95_ms: f64, on_cpu: Option<f64>, per_s: f64) -> StageSummary {
    StageSummary {
        stage: Stage::from_name(name).unwrap(),
        count,
        total_ms: mean_ms * count as f64,
        mean_ms,
        p50_ms: mean_ms * 0.9,
        p95_ms,
        max_ms: p95_ms * 1.3,
        on_cpu,
        core_wait: None,
        bytes: 0,
        per_second: per_s,
        trimmed_mean_ms: None,
    }
}

fn settings() -> RunSettings {
    RunSettings {
        model: "examples/cnn.toml".into(),
        data: "/root/.cache/pipeprof/demo-v2".into(),
        images: 384,
        classes: vec!["circle".into(), "cross".into(), "square".into(), "stripes".into()],
        device: "cpu".into(),
        workers: 2,
        cores: 2,
        batch_size: 32,
        prefetch: 2,
        epochs: 3,
        max_steps: Some(1000),
        seed: 1,
        input: [3, 64, 64],
        params: 406_820,
        simulated: Vec::new(),
        auto_workers: Vec::new(),
        ..RunSettings::default()
    }
}

/// A run 30 s in, steps of `wait` + `transfer` + `compute` ms each back to back.
fn run(wait: f64, transfer: f64, compute: f64) -> Snapshot {
    let step_ms = wait + transfer + compute;
    let step_ns = (step_ms * MS as f64) as u64;
    let steps = (NOW / step_ns).min(1024);
    let mut s = Summary {
        settings: settings(),
        steps,
        images: steps * 32,
        elapsed_s: 30.0,
        images_per_s: 32.0 * 1000.0 / step_ms,
        last_loss: Some(1.0349),
        split: StepSplit {
            steps,
            mean_step_ms: step_ms,
            wait_ms: wait,
            transfer_ms: transfer,
            compute_ms: compute,
            wait_share: wait / step_ms,
            transfer_share: transfer / step_ms,
            compute_share: compute / step_ms,
            startup_wait_ms: 0.0,
            from_step: None,
            startup_compute_ms: None,
            changed_at: None,
            validate_ms: 0.0,
        },
        loader_busy: 0.4,
        epochs: vec![
            EpochSummary {
                no_loss: false,
                epoch: 1,
                steps: 12,
                images: 384,
                loss: 1.51,
                accuracy: 0.331,
                seconds: 3.0,
                val_loss: None,
                val_accuracy: None,
                val_images: 0,
                through: None,
            },
            EpochSummary {
                no_loss: false,
                epoch: 2,
                steps: 8,
                images: 256,
                loss: 1.03,
                accuracy: 0.586,
                seconds: 2.0,
                val_loss: None,
                val_accuracy: None,
                val_images: 0,
                through: None,
            },
        ],
        events_received: 5000,
        mean_queued: 1.2,
        data_fs: Some(FsInfo {
            fs_type: "ext4".into(),
            kind: FsKind::Local,
            mount_point: Some("/".into()),
            source: None,
            magic: None,
        }),
        ..Default::default()
    };
    let per_img = |x: f64| x * 32.0 / step_ms;
    s.stages = vec![
        stage("read", steps * 32, per_img(wait * 0.8) / 2.0, per_img(wait) * 1.5, Some(0.55), 128.0),
        stage("decode", steps * 32, 0.07, 0.13, Some(0.99), 128.0),
        stage("resize", steps * 32, 0.05, 0.08, Some(0.99), 128.0),
        stage("wait", steps, wait, wait * 2.0, None, 4.0),
        stage("transfer", steps, transfer, transfer * 1.5, Some(0.31), 4.0),
        stage("compute", steps, compute, compute * 1.2, None, 4.0),
        stage("forward", steps, compute * 0.17, compute * 0.2, None, 4.0),
        stage("backward", steps, compute * 0.79, compute * 0.9, None, 4.0),
        stage("optimizer", steps, compute * 0.02, compute * 0.04, None, 4.0),
    ];
    s.machine.host_samples = 150;
    s.machine.cores = 2;
    s.machine.process_cpu_mean_pct = Some(144.0);
    s.machine.global_cpu_mean_pct = Some(72.0);
    s.machine.busiest_core_mean_pct = Some(85.0);
    s.machine.idlest_core_mean_pct = Some(60.0);
    s.machine.gpu_status =
        Some(GpuStatus::Off("no NVIDIA driver (libnvidia-ml.so.1 not found): GPU sampling off".into()));

    let n = steps;
    let first = NOW - n * step_ns;
    let points: Vec<StepPoint> = (0..n)
        .map(|i| {
            // A slow patch in the middle, so the stacked bars have a shape to show.
            let k = if (n / 3..n / 2).contains(&i) { 2.0 } else { 1.0 };
            StepPoint {
                step: i,
                end_ns: first + (i + 1) * step_ns,
                wait_ns: (wait * k * MS as f64) as u64,
                transfer_ns: (transfer * MS as f64) as u64,
                compute_ns: (compute * MS as f64) as u64,
            }
        })
        .collect();
    let records = points
        .iter()
        .map(|p| StepRecord {
            no_loss: false,
            step: p.step,
            epoch: (p.step / 12) as u32,
            images: 32,
            loss: 1.0,
            correct: 16,
            end_ns: p.end_ns,
            queued: ((p.step % 5) as u32).min(2),
            validation: false,
        })
        .collect();
    let host = (0..150u64)
        .map(|i| HostPoint {
            t_ns: i * 200 * MS,
            process_cpu_pct: 100.0 + (i % 10) as f32 * 8.0,
            global_cpu_pct: 50.0 + (i % 10) as f32 * 4.0,
            rss_bytes: 168 << 20,
            read_bytes_per_s: Some(0.0),
            write_bytes_per_s: None,
            iowait_pct: Some(0.0),
        })
        .collect();
    Snapshot { summary: s, steps: points, records, host, gpu: Vec::new(), now_ns: NOW }
}

fn io_verdict() -> Verdict {
    Verdict {
        limiter: Limiter::Io,
        severity: Severity::High,
        headline: "I/O-bound: steps wait 62% of the time for data; reads are 95% off-CPU".into(),
        evidence: vec![
            "wait 62% of step time".into(),
            "read p95 48ms, 5% on-CPU".into(),
            "queue empty at 80% of steps".into(),
            "loader CPU 12% of 2 cores".into(),
        ],
        measures: Vec::new(),
        flags: vec![Flag::NetworkStorage { fs_type: "fuse.rclone".into() }],
        provisional: false,
        now: None,
        advice: vec![
            Advice {
                action: "Cache the decoded images on local disk".into(),
                // A command as a summary file from another version might carry it: shown as written.
                change: Change::Saved,
                command: Some("pipeprof cache build --data /mnt/gdrive/imgs".into()),
                predicted_speedup: Some(2.4),
                basis: None,
                reason: "reads take 62% of the step; a local cache reads at 400 MB/s here".into(),
            },
            Advice {
                action: "Use more loader workers: reads are off-CPU and overlap".into(),
                change: Change::Workers(8),
                command: Change::Workers(8).command(),
                predicted_speedup: Some(1.8),
                basis: None,
                reason: "4× the workers overlap 4× the reads while 1.4 cores stay idle".into(),
            },
        ],
    }
}

fn compute_verdict() -> Verdict {
    Verdict {
        limiter: Limiter::Compute,
        severity: Severity::Low,
        headline: "compute-bound: the model's own work is 99% of each step".into(),
        evidence: vec!["compute 99% of step time".into(), "wait 0.1%".into(), "queue full at 95% of steps".into()],
        measures: Vec::new(),
        flags: vec![Flag::ComputeCompetesWithLoader],
        provisional: false,
        now: None,
        advice: vec![Advice {
            action: "Train on a GPU".into(),
            change: Change::UseDevice("cuda".into()),
            command: Change::UseDevice("cuda".into()).command(),
            predicted_speedup: None,
            basis: None,
            reason: "the data pipeline keeps up; only faster compute helps".into(),
        }],
    }
}

fn collecting() -> State {
    let mut s = run(0.2, 0.01, 240.0);
    s.summary.steps = 3;
    s.summary.split.steps = 3;
    s.steps.drain(..s.steps.len() - 3);
    s.records.drain(..s.records.len() - 3);
    State::with_verdict(
        s,
        Verdict {
            limiter: Limiter::NotEnoughData { steps_needed: 2 },
            severity: Severity::Low,
            headline: "collecting… 2 steps to go".into(),
            evidence: vec![],
            measures: Vec::new(),
            flags: vec![],
            advice: vec![],
            provisional: false,
            now: None,
        },
    )
}

fn io_bound() -> State {
    let mut s = run(150.0, 0.05, 90.0);
    s.summary.settings.data = "/mnt/gdrive/imgs".into();
    s.summary.data_fs = Some(FsInfo {
        fs_type: "fuse.rclone".into(),
        kind: FsKind::Fuse,
        mount_point: Some("/mnt/gdrive".into()),
        source: Some("gdrive:".into()),
        magic: None,
    });
    s.summary.stages[0].on_cpu = Some(0.05);
    s.summary.stages[0].mean_ms = 7.0;
    s.summary.stages[0].p95_ms = 48.0;
    s.summary.stages[0].total_ms = 7.0 * s.summary.stages[0].count as f64;
    s.summary.skipped_count = 2;
    State::with_verdict(s, io_verdict())
}

fn compute_bound() -> State {
    let s = run(0.15, 0.01, 242.6);
    State::with_verdict(s, compute_verdict())
}

fn gpu_two() -> State {
    let mut s = run(0.2, 3.5, 40.0);
    s.summary.settings.device = "cuda:0".into();
    s.summary.machine.gpu_status = Some(GpuStatus::Ok);
    s.summary.machine.devices = (0..2u32)
        .map(|i| DeviceSummary {
            index: i,
            name: format!("NVIDIA A100-SXM4-40GB #{i}"),
            samples: 150,
            util_mean_pct: Some(if i == 0 { 87.0 } else { 0.0 }),
            mem_total_bytes: Some(40 << 30),
            pcie_rx_mean_bytes_per_s: Some(if i == 0 { 2.5e9 } else { 0.0 }),
            ..Default::default()
        })
        .collect();
    s.gpu = (0..150u64)
        .map(|i| GpuPoint {
            t_ns: i * 200 * MS,
            util_pct: vec![Some(60.0 + (i % 8) as f32 * 5.0), Some(0.0)],
            mem_used_bytes: vec![Some((5 << 30) + i * (1 << 20)), Some(400 << 20)],
        })
        .collect();
    State::with_verdict(s, compute_verdict())
}

fn gpu_off() -> State {
    let mut st = compute_bound();
    st.snap.summary.settings.device = "cuda:0".into();
    st.snap.summary.machine.gpu_status =
        Some(GpuStatus::Off("NVML init failed: Driver/library version mismatch; GPU sampling off".into()));
    st
}

fn long_path() -> State {
    let mut st = compute_bound();
    st.snap.summary.settings.data =
        "/home/someone/projects/2024/very-long-project-name/datasets/imagenet-subset/train/augmented-v3".into();
    st.snap.summary.settings.model = "/home/someone/projects/2024/very-long-project-name/models/resnet-ish.toml".into();
    st
}

fn zeros() -> State {
    let mut s = Snapshot::default();
    s.summary.stages = [Stage::Read, Stage::Decode, Stage::Wait, Stage::Transfer, Stage::Compute]
        .iter()
        .map(|n| StageSummary {
            stage: *n,
            count: 0,
            total_ms: 0.0,
            mean_ms: 0.0,
            p50_ms: 0.0,
            p95_ms: 0.0,
            max_ms: 0.0,
            on_cpu: Some(0.0),
            core_wait: None,
            bytes: 0,
            per_second: 0.0,
            trimmed_mean_ms: None,
        })
        .collect();
    s.steps = vec![StepPoint::default(); 3];
    s.host = vec![HostPoint::default(); 3];
    s.records = vec![
        StepRecord {
            no_loss: false,
            step: 0,
            epoch: 0,
            images: 0,
            loss: 0.0,
            correct: 0,
            end_ns: 0,
            queued: 0,
            validation: false
        };
        3
    ];
    s.summary.machine.gpu_status = Some(GpuStatus::Ok);
    State::new(s)
}

fn draw(w: u16, h: u16, f: impl FnOnce(&mut Frame)) -> String {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(f).unwrap();
    t.backend().to_string()
}

fn screen(st: &State, w: u16, h: u16) -> String {
    draw(w, h, |f| view::render(f, st))
}

fn panel(w: u16, h: u16, st: &State, p: fn(&mut Frame, Rect, &State)) -> String {
    draw(w, h, |f| p(f, f.area(), st))
}

macro_rules! screens {
    ($($name:ident => $state:expr),* $(,)?) => {$(
        #[test]
        fn $name() {
            let st = $state;
            insta::assert_snapshot!(concat!(stringify!($name), "_80x24"), screen(&st, 80, 24));
            insta::assert_snapshot!(concat!(stringify!($name), "_120x40"), screen(&st, 120, 40));
        }
    )*};
}

screens! {
    screen_collecting => collecting(),
    screen_io_bound => io_bound(),
    screen_compute_bound => compute_bound(),
    screen_gpu_off => gpu_off(),
    screen_gpu_two_devices => gpu_two(),
    screen_long_paths => long_path(),
    screen_all_zero => zeros(),
}

#[test]
fn panels_at_80_and_120_columns() {
    let st = io_bound();
    for w in [80u16, 120] {
        insta::assert_snapshot!(format!("header_{w}"), panel(w, 3, &st, view::render_header));
        insta::assert_snapshot!(format!("verdict_{w}"), panel(w, 4, &st, view::render_verdict));
        insta::assert_snapshot!(format!("stages_{w}"), panel(w, 11, &st, view::render_stages));
        insta::assert_snapshot!(
            format!("charts_{w}"),
            panel(w, if w == 80 { 8 } else { 16 }, &st, view::render_charts)
        );
    }
    insta::assert_snapshot!("help_80x24", panel(80, 24, &st, view::render_help));
    insta::assert_snapshot!("help_120x40", panel(120, 40, &st, view::render_help));
}

#[test]
fn verdict_states() {
    insta::assert_snapshot!("verdict_collecting", panel(80, 4, &collecting(), view::render_verdict));
    insta::assert_snapshot!("verdict_compute", panel(80, 4, &compute_bound(), view::render_verdict));
    let mut st = io_bound();
    st.focus = Focus::Verdict;
    insta::assert_snapshot!("verdict_io_focused", panel(80, 14, &st, view::render_verdict));
}

#[test]
fn gpu_panels() {
    insta::assert_snapshot!("charts_gpu_two_80", panel(80, 8, &gpu_two(), view::render_charts));
    insta::assert_snapshot!("charts_gpu_two_120", panel(120, 16, &gpu_two(), view::render_charts));
    insta::assert_snapshot!("charts_gpu_off_80", panel(80, 8, &compute_bound(), view::render_charts));
}

#[test]
fn screen_states_paused_stopping_help_focus() {
    let mut st = io_bound();
    st.paused = true;
    insta::assert_snapshot!("header_paused", panel(80, 3, &st, view::render_header));
    st.stop_requested = true;
    insta::assert_snapshot!("header_stopping", panel(80, 3, &st, view::render_header));
    let mut st = io_bound();
    st.help = true;
    insta::assert_snapshot!("screen_help_80x24", screen(&st, 80, 24));
    st.help = false;
    st.focus = Focus::Charts;
    insta::assert_snapshot!("screen_focus_charts_80x24", screen(&st, 80, 24));
    st.focus = Focus::Verdict;
    insta::assert_snapshot!("screen_focus_verdict_80x24", screen(&st, 80, 24));
    st.focus = Focus::Charts;
    st.window = 0;
    insta::assert_snapshot!("screen_window_15s_120x40", screen(&st, 120, 40));
}

#[test]
fn stage_table_lists_worker_threads_with_their_on_cpu_split() {
    use pipeprof_core::aggregate::LoaderThread;
    let mut st = io_bound();
    let t = |thread, name: &str, on_cpu, starts| LoaderThread {
        thread,
        name: name.into(),
        spans: 40,
        busy_ms: 9000.0,
        on_cpu,
        starts,
    };
    st.snap.summary.loader_threads = vec![t(7, "loader-0", Some(0.04), 1), t(9, "loader-1", Some(0.9), 6)];
    let out = panel(120, 16, &st, view::render_stages);
    let line = |k: &str| out.lines().find(|l| l.contains(k)).unwrap_or_default().to_string();
    assert!(line("↳ loader-0").contains("4%") && line("↳ loader-0").contains("40"), "{out}");
    assert!(!line("↳ loader-0").contains("start"), "{out}");
    // A worker restarted each epoch is one row, its starts counted.
    assert!(line("↳ loader-1").contains("90%") && line("↳ loader-1").contains("6× start"), "{out}");
    // A single loader thread is the whole loader: no extra rows.
    st.snap.summary.loader_threads.truncate(1);
    assert!(!panel(120, 16, &st, view::render_stages).contains('↳'));
}

#[test]
fn stage_table_has_a_row_per_rank_with_the_straggler_marked() {
    use pipeprof_core::aggregate::ranks::RankLine;
    let mut st = io_bound();
    let line = |rank: u32, wait_ms: f64| RankLine {
        rank,
        local_rank: rank,
        world_size: 2,
        steps: 20,
        images_per_s: 50.0,
        step_ms: 100.0,
        wait_ms,
        wait_share: wait_ms / 100.0,
        compute_ms: 100.0 - wait_ms,
        ..Default::default()
    };
    st.snap.summary.ranks = vec![line(0, 6.0), line(1, 41.0)];
    // The collector judges the ranks; the view shows its judgement.
    st.straggler = pipeprof_core::diagnose::ranks::judge(&st.snap.summary.ranks);
    let out = panel(120, 20, &st, view::render_stages);
    let row = |k: &str| out.lines().find(|l| l.contains(k)).unwrap_or_default().to_string();
    assert!(row("⇉ rank 0").contains("6%") && !row("⇉ rank 0").contains("straggler"), "{out}");
    assert!(row("⇉ rank 1").contains("41%") && row("⇉ rank 1").contains("straggler"), "{out}");
    assert!(row("⇉ rank 0").contains("all-reduce 35"), "{out}");
    // One process: no rank rows.
    st.snap.summary.ranks.clear();
    assert!(!panel(120, 20, &st, view::render_stages).contains('⇉'));
}

#[test]
fn tiny_terminal_gets_a_notice() {
    let out = screen(&compute_bound(), 30, 8);
    assert!(out.contains("needs"), "{out}");
}

#[test]
fn every_size_renders_without_panicking() {
    let states = [collecting(), io_bound(), compute_bound(), gpu_two(), long_path(), zeros(), State::default()];
    for st in &states {
        for w in (1..=140).step_by(7) {
            for h in (1..=50).step_by(3) {
                let _ = screen(st, w, h);
            }
        }
    }
}

#[test]
fn a_program_that_reports_no_accuracy_shows_none_rather_than_zero() {
    let mut st = compute_bound();
    for e in &mut st.snap.summary.epochs {
        e.accuracy = 0.0;
    }
    let with = screen(&st, 120, 40);
    assert!(with.contains("acc 0.0%"), "{with}");
    st.snap.summary.settings.no_accuracy = true;
    let without = screen(&st, 120, 40);
    assert!(without.contains("acc -") && !without.contains("acc 0.0%"), "{without}");
}
