//! Every rule on hand-built summaries: no clock, no threads, no I/O.

use super::model::Pipeline;
use super::*;
use crate::aggregate::machine::gpu::DeviceSummary;
use crate::aggregate::machine::ThreadSummary;
use crate::aggregate::{RunSettings, StageSummary, StepSplit};
use probes::fsinfo::{FsInfo, FsKind};
use probes::sampler::GpuStatus;
use probes::Stage;

/// The role pipeprof gives the thread so named ("compute-1", "train"), as its sampler reports
/// it: the tests' threads are given by name.
fn role_named(name: &str) -> probes::ThreadRole {
    let roles = (0..64).map(probes::ThreadRole::Compute).chain([probes::ThreadRole::Train]);
    roles.into_iter().find(|r| r.thread_name() == name).unwrap_or_default()
}

/// Builds a `Summary` the way the aggregator would fill it, a few numbers at a time.
#[derive(Clone)]
struct B(Summary);

fn stage(name: &str, mean_ms: f64, on_cpu: Option<f64>, count: u64) -> StageSummary {
    StageSummary {
        stage: Stage::from_name(name).unwrap(),
        count,
        total_ms: mean_ms * count as f64,
        mean_ms,
        p50_ms: mean_ms,
        p95_ms: mean_ms,
        max_ms: mean_ms,
        on_cpu,
        core_wait: None,
        bytes: 0,
        per_second: 0.0,
        trimmed_mean_ms: None,
    }
}

impl B {
    /// 50 steps of batch 32 on `cuda:0`, 2 workers on 2 cores, nothing else measured.
    fn new() -> B {
        B(Summary {
            settings: RunSettings {
                model: "built-in examples/cnn.toml".into(),
                data: "/data/imgs".into(),
                device: "cuda:0".into(),
                workers: 2,
                cores: 2,
                batch_size: 32,
                prefetch: 2,
                input: [3, 64, 64],
                ..Default::default()
            },
            steps: 50,
            split: StepSplit { steps: 50, ..Default::default() },
            ..Default::default()
        })
    }

    fn set_stage(&mut self, x: StageSummary) {
        self.0.stages.retain(|s| s.stage != x.stage);
        self.0.stages.push(x);
    }

    /// Loader per image: (stage, wall ms, on-CPU share).
    fn loader(mut self, stages: &[(&str, f64, f64)]) -> B {
        let n = self.0.split.steps * self.0.settings.batch_size as u64;
        for &(name, ms, on) in stages {
            self.set_stage(stage(name, ms, Some(on), n));
        }
        self
    }

    /// Training loop per step, ms; wait spans all equal unless `spiky_wait` follows.
    fn step(mut self, wait: f64, transfer: f64, compute: f64) -> B {
        let total = wait + transfer + compute;
        let steps = self.0.split.steps;
        self.0.split = StepSplit {
            steps,
            mean_step_ms: total,
            wait_ms: wait,
            transfer_ms: transfer,
            compute_ms: compute,
            wait_share: wait / total,
            transfer_share: transfer / total,
            compute_share: compute / total,
            startup_wait_ms: 0.0,
            from_step: None,
            startup_compute_ms: None,
            changed_at: None,
            validate_ms: 0.0,
        };
        self.0.images_per_s = self.0.settings.batch_size as f64 * 1000.0 / total;
        self.0.elapsed_s = total * steps as f64 / 1000.0;
        self.set_stage(stage("wait", wait, None, steps));
        self.set_stage(stage("transfer", transfer, Some(0.5), steps));
        self.set_stage(stage("compute", compute, None, steps));
        self
    }

    /// Wait shares given exactly (for thresholds), with a fast loader and a 100 ms step.
    fn wait_share(self, share: f64) -> B {
        let mut b = self.loader(&[("read", 0.05, 0.5), ("decode", 0.1, 1.0)]).step(share * 100.0, 1.0, 99.0);
        b.0.split.wait_share = share;
        b
    }

    fn spiky_wait(mut self, p50: f64, p95: f64) -> B {
        if let Some(w) = self.0.stages.iter_mut().find(|s| s.stage == Stage::Wait) {
            w.p50_ms = p50;
            w.p95_ms = p95;
            w.max_ms = p95 * 2.0;
        }
        self
    }

    fn optimizer(mut self, ms: f64) -> B {
        let n = self.0.split.steps;
        self.set_stage(stage("optimizer", ms, None, n));
        self
    }

    fn params(mut self, n: usize) -> B {
        self.0.settings.params = n;
        self
    }

    /// Per-layer means per step: (name, forward ms, backward ms).
    fn layers(mut self, layers: &[(&str, f64, f64)]) -> B {
        self.0.layers = layers
            .iter()
            .map(|&(name, f, b)| crate::aggregate::LayerSummary { name: name.into(), forward_ms: f, backward_ms: b })
            .collect();
        self
    }

    fn workers(mut self, w: usize, cores: usize) -> B {
        self.0.settings.workers = w;
        self.0.settings.cores = cores;
        self
    }

    /// The run's device. A CPU run's processes are not on any GPU: NVML, where sampled, says so.
    fn device(mut self, d: &str) -> B {
        self.0.settings.device = d.into();
        if d.starts_with("cpu") {
            let m = &mut self.0.machine;
            for dev in &mut m.devices {
                dev.this_process_on_gpu = dev.this_process_on_gpu.map(|_| false);
            }
            m.this_process_on_gpu = m.this_process_on_gpu.map(|_| false);
        }
        self
    }

    fn steps(mut self, n: u64) -> B {
        self.0.steps = n;
        self.0.split.steps = n;
        self
    }

    /// Host samples: machine CPU % (0–100) and this process's (100 = one core).
    fn cpu(mut self, global: f32, process: f32) -> B {
        let m = &mut self.0.machine;
        m.host_samples = 20;
        m.cores = self.0.settings.cores;
        m.global_cpu_mean_pct = Some(global);
        m.process_cpu_mean_pct = Some(process);
        self
    }

    /// Measured run-queue wait share of a stage's wall time (the rest off-CPU is blocked).
    fn core_wait(mut self, name: &str, share: f64) -> B {
        if let Some(x) = self.0.stages.iter_mut().find(|s| s.stage.name() == name) {
            x.core_wait = Some(share);
        }
        self
    }

    /// Other programs: the cores they typically keep busy, and the busiest by name.
    fn others(mut self, cores: f32, names: &[(&str, u32, f32)]) -> B {
        let m = &mut self.0.machine;
        m.other_cores_median = Some(cores);
        m.cores = self.0.settings.cores;
        m.others = names
            .iter()
            .map(|(n, procs, pct)| probes::sampler::OtherCpu { name: (*n).into(), processes: *procs, cpu_pct: *pct })
            .collect();
        self
    }

    fn iowait(mut self, pct: f32) -> B {
        self.0.machine.iowait_mean_pct = Some(pct);
        self.0.machine.read_bytes_per_s_mean = Some(2e6);
        self
    }

    fn threads(mut self, threads: &[(&str, f32)]) -> B {
        self.0.machine.threads = threads
            .iter()
            .enumerate()
            .map(|(i, (name, pct))| ThreadSummary {
                tid: i as u32 + 10,
                name: (*name).into(),
                samples: 20,
                cpu_mean_pct: *pct,
                cpu_peak_pct: *pct,
                cpu_ns: 0,
                role: role_named(name),
                ..Default::default()
            })
            .collect();
        self
    }

    /// One GPU at `util`% mean, this process seen on it or not.
    fn gpu(mut self, util: f32, on_gpu: Option<bool>) -> B {
        let m = &mut self.0.machine;
        m.gpu_samples = 20;
        m.gpu_status = Some(GpuStatus::Ok);
        m.devices = vec![DeviceSummary {
            index: 0,
            name: "Fake GPU".into(),
            samples: 20,
            util_mean_pct: Some(util),
            this_process_on_gpu: on_gpu,
            ..Default::default()
        }];
        m.this_process_on_gpu = on_gpu;
        self
    }

    fn fs(mut self, kind: FsKind, fs_type: &str) -> B {
        self.0.data_fs = Some(FsInfo { fs_type: fs_type.into(), kind, mount_point: None, source: None, magic: None });
        self
    }

    fn simulated(mut self, what: &str) -> B {
        self.0.settings.simulated.push(what.into());
        self
    }

    fn verdict(&self) -> Verdict {
        diagnose(&self.0)
    }
}

// ---- scenarios ----

/// 1 worker reading 20 ms per image (5% on-CPU), cheap decode: what `--throttle-read` gives.
fn io_bound() -> B {
    B::new()
        .loader(&[("read", 20.0, 0.05), ("decode", 1.0, 0.95), ("resize", 0.5, 1.0)])
        .step(300.0, 1.0, 20.0)
        .cpu(30.0, 40.0)
        .gpu(10.0, Some(true))
}

/// 1 worker on 2 cores decoding 6 ms and resizing 4 ms per image, CPU half idle.
fn preprocess_one_worker() -> B {
    B::new()
        .workers(1, 2)
        .loader(&[("read", 0.2, 0.5), ("decode", 6.0, 1.0), ("resize", 4.0, 1.0)])
        .step(300.0, 2.0, 20.0)
        .cpu(50.0, 100.0)
        .gpu(7.0, Some(true))
}

fn compute_bound_gpu() -> B {
    B::new()
        .loader(&[("read", 0.3, 0.3), ("decode", 1.0, 1.0), ("resize", 0.5, 1.0)])
        .step(0.5, 1.0, 100.0)
        .cpu(40.0, 60.0)
        .gpu(95.0, Some(true))
}

/// Compute 2 ms per step on a GPU, the optimizer step half of it.
fn tiny_model() -> B {
    B::new()
        .loader(&[("read", 0.005, 0.5), ("decode", 0.01, 1.0)])
        .step(0.02, 0.1, 2.0)
        .optimizer(1.0)
        .cpu(40.0, 60.0)
        .gpu(20.0, Some(true))
}

fn transfer_bound() -> B {
    B::new().loader(&[("read", 0.1, 0.5), ("decode", 0.5, 1.0)]).step(1.0, 30.0, 40.0).gpu(60.0, Some(true))
}

fn speedup_of(v: &Verdict, command_prefix: &str) -> Option<f64> {
    v.advice.iter().find(|a| a.change.command().is_some_and(|c| c.starts_with(command_prefix)))?.predicted_speedup
}

fn has_command(v: &Verdict, command_prefix: &str) -> bool {
    v.advice.iter().any(|a| a.change.command().is_some_and(|c| c.starts_with(command_prefix)))
}

// ---- limiter ----

#[test]
fn throttled_reads_give_io_verdict() {
    let v = io_bound().verdict();
    assert_eq!(v.limiter, Limiter::Io, "{v:#?}");
    assert_eq!(v.severity, Severity::High);
    assert!(v.evidence.iter().any(|e| e.contains("read is 95% blocked off-CPU") && e.contains("19.0 ms")), "{v:#?}");
    assert!(v.flags.is_empty(), "{:?}", v.flags);
    // Reads waiting on storage overlap: more workers than cores are worth it.
    assert!(speedup_of(&v, "--workers").is_some_and(|g| g > 2.0), "{v:#?}");
    assert!(has_command(&v, "pipeprof cache --model examples/cnn.toml --data /data/imgs"), "{v:#?}");
}

#[test]
fn cpu_bound_decode_and_resize_give_preprocess_verdict_with_too_few_workers() {
    let v = preprocess_one_worker().verdict();
    assert_eq!(v.limiter, Limiter::Preprocess, "{v:#?}");
    assert_eq!(v.severity, Severity::High);
    assert!(v.flags.contains(&Flag::TooFewWorkers { workers: 1, cores: 2 }), "{:?}", v.flags);
    let g = speedup_of(&v, "--workers 2").unwrap_or(0.0);
    assert!((g - 2.0).abs() < 0.05, "1 → 2 workers on 2 idle cores: ≈2×, got {g}");
    assert!(v.advice.iter().any(|a| a.action.starts_with("pre-resize") && a.predicted_speedup.is_some()));
    assert!(v.evidence.iter().any(|e| e.contains("decode 6.00 ms (100% on-CPU)")), "{:#?}", v.evidence);
}

#[test]
fn saturated_cpu_flags_it_and_predicts_no_gain_from_workers() {
    let v = preprocess_one_worker().cpu(98.0, 100.0).verdict();
    assert_eq!(v.limiter, Limiter::Preprocess);
    assert!(v.flags.contains(&Flag::CpuSaturated), "{:?}", v.flags);
    assert!(!v.flags.iter().any(|f| matches!(f, Flag::TooFewWorkers { .. })));
    assert!(!has_command(&v, "--workers"), "no core is free: {v:#?}");
}

#[test]
fn process_using_every_core_counts_as_saturated() {
    let v = preprocess_one_worker().cpu(70.0, 185.0).verdict();
    assert!(v.flags.contains(&Flag::CpuSaturated), "{:?}", v.flags);
}

#[test]
fn on_cpu_time_not_the_stage_name_decides_io() {
    // A read that is all CPU (decompressing, page-cache copies) is not storage.
    let busy_read =
        B::new().workers(1, 2).loader(&[("read", 9.0, 0.95), ("decode", 1.0, 1.0)]).step(200.0, 1.0, 20.0).verdict();
    assert_eq!(busy_read.limiter, Limiter::Preprocess, "{busy_read:#?}");
    // A decode that is mostly off-CPU waits for a core, not for storage.
    let starved_decode = B::new().loader(&[("read", 0.5, 0.5), ("decode", 10.0, 0.3)]).step(200.0, 1.0, 20.0).verdict();
    assert_eq!(starved_decode.limiter, Limiter::Preprocess, "{starved_decode:#?}");
    // Its run-queue wait unmeasured: off-CPU, either way, said as such.
    assert!(
        starved_decode.evidence.iter().any(|e| e.contains("off-CPU (waiting for a core or blocked")),
        "{starved_decode:#?}"
    );
}

#[test]
fn off_cpu_time_is_called_waiting_for_a_core_only_where_the_run_queue_wait_was_measured() {
    let decode_off_cpu = || B::new().loader(&[("read", 0.5, 0.5), ("decode", 10.0, 0.3)]).step(200.0, 1.0, 20.0);
    let said = |v: &Verdict, what: &str| v.evidence.iter().any(|e| e.contains(what));
    // Measured: 60% of decode in the run queue (other threads held the cores).
    let queued = decode_off_cpu().core_wait("decode", 0.6).verdict();
    assert!(said(&queued, "of it waiting for a core"), "{queued:#?}");
    // Measured: no run-queue wait, so the off-CPU time was blocked (a sleep, a lock, a fetch).
    let blocked = decode_off_cpu().core_wait("decode", 0.0).verdict();
    assert!(!said(&blocked, "of it waiting for a core"), "{blocked:#?}");
}

#[test]
fn a_sample_stage_blocked_off_cpu_is_io_where_the_run_queue_wait_says_so() {
    // A Python Dataset timed as one "decode" per sample, 10 ms of which 1 ms on-CPU: what the
    // other 9 ms were decides the verdict, and only a measured run-queue wait can say.
    let fetch = |core_wait: Option<f64>| {
        let b = B::new().loader(&[("decode", 10.0, 0.1)]).step(200.0, 1.0, 20.0);
        match core_wait {
            Some(w) => b.core_wait("decode", w),
            None => b,
        }
        .verdict()
    };
    let cases = [
        // Blocked (a remote fetch, a sleep): input-bound on I/O, said as a fetch, not a file read.
        (Some(0.0), Limiter::Io, "blocked off-CPU"),
        (Some(0.1), Limiter::Io, "blocked off-CPU"),
        // Runnable without a core most of it: CPU work starved of cores.
        (Some(0.8), Limiter::Preprocess, "of it waiting for a core"),
        // Not measured: never called I/O on a guess.
        (None, Limiter::Preprocess, "off-CPU (waiting for a core or blocked"),
    ];
    for (wait, limiter, says) in cases {
        let v = fetch(wait);
        assert_eq!(v.limiter, limiter, "core wait {wait:?}: {v:#?}");
        assert!(v.evidence.iter().any(|e| e.contains(says)), "core wait {wait:?}: {v:#?}");
    }
    assert!(fetch(Some(0.0)).headline.contains("waits off-CPU for its samples"), "{:#?}", fetch(Some(0.0)));
}

#[test]
fn io_threshold_is_half_the_loader_time_off_cpu_in_read() {
    let at = |read_off_share: f64| {
        // 10 ms loader per image: read fully off-CPU for `share`, the rest on-CPU decode.
        let read = 10.0 * read_off_share;
        B::new().loader(&[("read", read, 0.0), ("decode", 10.0 - read, 1.0)]).step(200.0, 1.0, 20.0).verdict().limiter
    };
    assert_eq!(at(0.49), Limiter::Preprocess);
    assert_eq!(at(0.50), Limiter::Io);
}

#[test]
fn uninstrumented_loader_is_judged_from_iowait() {
    let io = B::new().step(100.0, 1.0, 20.0).iowait(40.0).verdict();
    assert_eq!(io.limiter, Limiter::Io);
    assert!(io.evidence.iter().any(|e| e.contains("no read/decode/resize spans")));
    assert_eq!(B::new().step(100.0, 1.0, 20.0).iowait(2.0).verdict().limiter, Limiter::Preprocess);
}

#[test]
fn compute_bound_gpu_run_is_healthy() {
    let v = compute_bound_gpu().verdict();
    assert_eq!(v.limiter, Limiter::Compute, "{v:#?}");
    assert_eq!(v.severity, Severity::Low);
    assert!(v.flags.is_empty(), "{:?}", v.flags);
    assert!(v.advice.is_empty(), "nothing in the input pipeline to fix: {:?}", v.advice);
    assert!(v.evidence.iter().any(|e| e.contains("GPU busy 95%")));
}

#[test]
fn a_loader_whose_stages_were_not_timed_has_an_unknown_rate_not_an_unlimited_one() {
    for (b, timed) in [(compute_bound_gpu(), true), (B::new().step(0.5, 1.0, 100.0).cpu(40.0, 60.0), false)] {
        let v = b.verdict();
        assert_eq!(v.limiter, Limiter::Compute, "{v:#?}");
        let line = v.evidence.iter().find(|e| e.contains("the loader")).cloned().unwrap_or_default();
        assert!(!line.contains("unlimited") && !line.contains("inf×"), "{line}");
        assert_eq!(line.starts_with("the loader could supply ≈"), timed, "{line}");
        assert_eq!(line.contains("were not timed, so what it could supply is unknown"), !timed, "{line}");
    }
}

#[test]
fn large_transfer_share_gives_transfer_verdict() {
    let v = transfer_bound().verdict();
    assert_eq!(v.limiter, Limiter::Transfer, "{v:#?}");
    let u8 = v.advice.iter().find(|a| a.action.contains("u8")).and_then(|a| a.predicted_speedup).unwrap_or(0.0);
    // Transfer 30 → 7.5 ms next to 40 ms compute, against the measured 71 ms step.
    assert!((u8 - 71.0 / 47.5).abs() < 0.01, "{u8}");
}

#[test]
fn transfer_below_the_wait_share_stays_input_bound() {
    let v = B::new().loader(&[("read", 20.0, 0.05)]).step(40.0, 25.0, 35.0).verdict();
    assert_eq!(v.limiter, Limiter::Io);
}

#[test]
fn tiny_compute_per_step_gives_overhead_with_bigger_batch_advice() {
    let v = tiny_model().verdict();
    assert_eq!(v.limiter, Limiter::Overhead, "{v:#?}");
    assert!(v.flags.contains(&Flag::TinyModel));
    // On a GPU a tiny model's step is launches: its 2 ms of compute stay for 128 images, the
    // 0.1 ms transfer grows 4×.
    let g = speedup_of(&v, "--batch-size 128").unwrap_or(0.0);
    // Against the measured step (2.12 ms, the 0.02 ms wait included), not the model's 2.1 ms.
    let want = (128.0 / 2.4) / (32.0 / 2.12);
    assert!((g - want).abs() < 0.01, "{g} vs {want}");
}

#[test]
fn batch_independent_optimizer_step_gives_overhead() {
    let v = compute_bound_gpu().optimizer(60.0).verdict();
    assert_eq!(v.limiter, Limiter::Overhead, "{v:#?}");
    assert!(v.evidence.iter().any(|e| e.contains("optimizer step")));
}

#[test]
fn optimizer_dominating_a_large_model_is_compute_with_its_cost_per_parameter() {
    // The issue-22 case: 42.5 M parameters, Adam 71% of compute on the CPU.
    let v = compute_bound_gpu().device("cpu").gpu(0.0, None).params(42_500_000).optimizer(71.0).verdict();
    assert_eq!(v.limiter, Limiter::Compute, "{v:#?}");
    assert!(!v.flags.contains(&Flag::TinyModel), "{v:#?}");
    assert!(v.headline.contains("Compute-bound (optimizer)") && v.headline.contains("71%"), "{}", v.headline);
    // 71 ms over 42.5 M parameters: 1.7 ns each.
    assert!(v.evidence.iter().any(|e| e.contains("1.7 ns per parameter over 42.5 M parameters")), "{v:#?}");
    assert!(!has_command(&v, "--batch-size"), "{v:#?}");
}

#[test]
fn optimizer_dominating_a_small_model_stays_per_step_overhead() {
    let v = compute_bound_gpu().params(SMALL_MODEL_PARAMS - 1).optimizer(60.0).verdict();
    assert_eq!(v.limiter, Limiter::Overhead, "{v:#?}");
    assert!(v.flags.contains(&Flag::TinyModel));
}

#[test]
fn compute_bound_run_names_the_layer_and_pass_that_dominate() {
    let v = compute_bound_gpu()
        .params(42_500_000)
        .layers(&[("conv2d_1", 4.0, 10.0), ("dense_1", 5.0, 61.0), ("dense_2", 0.5, 0.5)])
        .optimizer(19.0)
        .verdict();
    assert_eq!(v.limiter, Limiter::Compute, "{v:#?}");
    assert!(v.headline.contains("61% of it in dense_1 backward"), "{}", v.headline);
    assert!(v.evidence.iter().any(|e| e.starts_with("dense_1 backward takes 61% of compute")), "{v:#?}");
}

#[test]
fn idle_gpu_without_waiting_gives_overhead() {
    let v = compute_bound_gpu().gpu(20.0, Some(true)).verdict();
    assert_eq!(v.limiter, Limiter::Overhead, "{v:#?}");
    assert!(v.evidence.iter().any(|e| e.contains("busy only 20%")));
    // No optimizer span: no number for the bigger batch, still advised.
    assert!(has_command(&v, "--batch-size 128"));
    assert_eq!(speedup_of(&v, "--batch-size"), None);
}

#[test]
fn tiny_model_that_waits_stays_input_bound_but_is_flagged() {
    let v = tiny_model().loader(&[("read", 5.0, 0.02)]).step(100.0, 0.1, 2.0).verdict();
    assert_eq!(v.limiter, Limiter::Io);
    assert!(v.flags.contains(&Flag::TinyModel));
}

#[test]
fn loader_barely_faster_than_compute_is_balanced() {
    // 1 worker at 10 ms per image = 100 images/s; the loop takes 32 per 300 ms ≈ 107.
    let v = B::new().workers(1, 4).loader(&[("decode", 10.0, 1.0)]).step(1.0, 1.0, 299.0).verdict();
    assert_eq!(v.limiter, Limiter::Balanced, "{v:#?}");
    assert!(v.evidence.iter().any(|e| e.contains("under 1.2×")));
}

#[test]
fn too_few_steps_say_how_many_are_needed() {
    for (steps, needed) in [(0, 5), (3, 2), (4, 1)] {
        let v = io_bound().steps(steps).verdict();
        assert_eq!(v.limiter, Limiter::NotEnoughData { steps_needed: needed });
        assert!(v.headline.contains(&format!("{needed} more steps")), "{}", v.headline);
        assert!(v.evidence.is_empty() && v.advice.is_empty());
    }
    assert_ne!(io_bound().steps(MIN_STEPS).verdict().limiter, Limiter::NotEnoughData { steps_needed: 0 });
}

#[test]
fn steps_without_loop_spans_are_not_enough_data() {
    let v = B::new().verdict();
    assert_eq!(v.limiter, Limiter::NotEnoughData { steps_needed: 0 });
    assert!(v.headline.contains("instrumented"));
}

// ---- severity ----

#[test]
fn severity_follows_tensorflow_thresholds() {
    let cases = [
        (0.0, Severity::Low),
        (0.049, Severity::Low),
        (0.05, Severity::Moderate),
        (0.199, Severity::Moderate),
        (0.20, Severity::High),
        (0.9, Severity::High),
    ];
    for (share, want) in cases {
        let v = B::new().wait_share(share).verdict();
        assert_eq!(v.severity, want, "wait share {share}");
        let rule = match want {
            Severity::High => "HIGH: ≥ 20%",
            Severity::Moderate => "moderate: ≥ 5%",
            Severity::Low => "low: < 5%",
        };
        assert!(v.evidence[0].contains(rule) && v.evidence[0].contains("TensorFlow"), "{}", v.evidence[0]);
    }
}

// ---- flags ----

#[test]
fn gpu_present_with_cpu_device_is_unused() {
    let v = compute_bound_gpu().device("cpu").gpu(0.0, Some(false)).verdict();
    assert!(v.flags.contains(&Flag::GpuUnused), "{:?}", v.flags);
    let a = v.advice.iter().find(|a| a.change == Change::UseDevice("cuda".into()));
    assert!(a.is_some_and(|a| a.predicted_speedup.is_none()), "{:?}", v.advice);
    // pipeprof's own loop needs its CUDA build; a program's build flags are its own.
    assert!(a.is_some_and(|a| a.reason.ends_with("(needs a build with --features cuda)")), "{a:?}");
    let mut program = compute_bound_gpu().device("cpu").gpu(0.0, Some(false));
    program.0.settings.framework = "jax".into();
    let v = program.verdict();
    let a = v.advice.iter().find(|a| a.change == Change::UseDevice("cuda".into()));
    assert!(a.is_some_and(|a| !a.reason.contains("--features")), "{a:?}");
}

#[test]
fn a_gpu_device_never_seen_by_nvml_is_not_called_unused() {
    // The run says it trains on cuda: NVML not listing it (another namespace, a driver that
    // hides processes) is not evidence that the GPU is unused.
    let v = compute_bound_gpu().gpu(0.0, Some(false)).verdict();
    assert!(!v.flags.contains(&Flag::GpuUnused), "{:?}", v.flags);
}

#[test]
fn a_cpu_run_whose_processes_nvml_lists_on_the_gpu_trains_there() {
    // A Python program whose device pipeprof did not see (JAX, Keras) but that has a compute
    // context on the GPU: it uses the GPU, and it is not a CPU run.
    let v = compute_bound_gpu().device("cpu").gpu(60.0, Some(true)).verdict();
    assert!(!v.flags.contains(&Flag::GpuUnused), "{:?}", v.flags);
    assert!(!v.advice.iter().any(|a| a.change == Change::UseDevice("cuda".into())), "{:?}", v.advice);
}

#[test]
fn no_gpu_or_unknown_process_is_not_flagged() {
    assert!(!compute_bound_gpu().gpu(90.0, None).verdict().flags.contains(&Flag::GpuUnused));
    let mut no_gpu = compute_bound_gpu().device("cpu");
    no_gpu.0.machine.devices.clear();
    no_gpu.0.machine.gpu_status = Some(GpuStatus::Off("no driver".into()));
    assert!(!no_gpu.verdict().flags.contains(&Flag::GpuUnused));
}

#[test]
fn network_and_fuse_mounts_are_flagged_and_advised_away() {
    for (kind, name) in [(FsKind::Fuse, "fuse.rclone"), (FsKind::Network, "nfs4")] {
        let v = io_bound().fs(kind, name).verdict();
        assert!(v.flags.contains(&Flag::NetworkStorage { fs_type: name.into() }), "{:?}", v.flags);
        let copy = v.advice.iter().find(|a| a.action.contains("copy the data set")).and_then(|a| a.predicted_speedup);
        // 20 ms → 1.5 ms read: the loader gets ≈ 21.5 / 3 faster, capped by 2 cores.
        assert!(copy.is_some_and(|g| g > 5.0), "{v:#?}");
    }
    for kind in [FsKind::Local, FsKind::Memory, FsKind::Unknown] {
        let v = io_bound().fs(kind, "ext4").verdict();
        assert!(!v.flags.iter().any(|f| matches!(f, Flag::NetworkStorage { .. })));
    }
}

#[test]
fn simulated_slowdowns_are_flagged_even_before_a_verdict() {
    let v = io_bound().simulated("--throttle-read 2MB/s").simulated("--slow decode=+5ms").verdict();
    assert!(v.flags.contains(&Flag::Simulated { what: "--throttle-read 2MB/s".into() }));
    assert!(v.flags.contains(&Flag::Simulated { what: "--slow decode=+5ms".into() }));
    let early = io_bound().simulated("--throttle-read 2MB/s").steps(1).verdict();
    assert_eq!(early.flags, vec![Flag::Simulated { what: "--throttle-read 2MB/s".into() }]);
}

#[test]
fn cpu_device_with_a_busy_loader_competes_with_compute() {
    // Compute 20 ms of a 322 ms step on 2 threads: ≈ 6% each.
    let b = preprocess_one_worker().device("cpu").threads(&[("compute-0", 6.0), ("compute-1", 6.0), ("train", 1.0)]);
    let v = b.verdict();
    assert!(v.flags.contains(&Flag::ComputeCompetesWithLoader), "{:?}", v.flags);
    // Compute's CPU per image counts against the 2 cores: less than the GPU run's 2×.
    let g = speedup_of(&v, "--workers 2").unwrap_or(0.0);
    assert!(g > MIN_GAIN && g < 1.9, "{g}");
    assert!(v.advice.iter().any(|a| a.reason.contains("take cores from compute")));
    // A light loader next to heavy CPU compute does not compete.
    let light = B::new()
        .loader(&[("read", 0.05, 0.3), ("decode", 0.2, 1.0)])
        .step(0.5, 1.0, 100.0)
        .device("cpu")
        .threads(&[("compute-0", 90.0), ("compute-1", 90.0)])
        .verdict();
    assert!(!light.flags.contains(&Flag::ComputeCompetesWithLoader), "{:?}", light.flags);
}

#[test]
fn too_few_workers_needs_preprocess_and_idle_cores() {
    let io = io_bound().workers(1, 2).verdict();
    assert!(!io.flags.iter().any(|f| matches!(f, Flag::TooFewWorkers { .. })), "{:?}", io.flags);
    let all_cores = preprocess_one_worker().workers(2, 2).verdict();
    assert!(!all_cores.flags.iter().any(|f| matches!(f, Flag::TooFewWorkers { .. })));
    let busy = preprocess_one_worker().cpu(80.0, 100.0).verdict();
    assert!(!busy.flags.iter().any(|f| matches!(f, Flag::TooFewWorkers { .. })));
}

// ---- advice ----

#[test]
fn prefetch_is_advised_only_for_a_spiky_loader_that_keeps_up() {
    // Loader 10× faster than compute on average, but the median step never waits.
    let spiky = compute_bound_gpu().step(25.0, 1.0, 100.0).spiky_wait(0.01, 80.0).verdict();
    assert_eq!(spiky.severity, Severity::Moderate);
    let g = speedup_of(&spiky, "--prefetch").unwrap_or(0.0);
    assert!((g - 126.0 / 101.0).abs() < 0.01, "{g}");
    // Steady waits: the loader is slow on average and a deeper queue cannot help.
    assert!(!has_command(&preprocess_one_worker().verdict(), "--prefetch"));
}

#[test]
fn advice_is_sorted_by_predicted_gain_and_every_gain_is_worth_it() {
    for b in
        [io_bound(), preprocess_one_worker(), transfer_bound(), tiny_model(), io_bound().fs(FsKind::Fuse, "fuse.x")]
    {
        let v = b.verdict();
        let gains: Vec<f64> = v.advice.iter().filter_map(|a| a.predicted_speedup).collect();
        assert!(gains.windows(2).all(|w| w[0] >= w[1]), "{gains:?}");
        assert!(gains.iter().all(|g| g.is_finite() && *g >= MIN_GAIN), "{gains:?}");
        assert!((1..=5).contains(&v.evidence.len()), "{:#?}", v.evidence);
        assert!(v.advice.iter().all(|a| !a.reason.is_empty()));
    }
}

#[test]
fn cache_removes_read_decode_and_resize() {
    let p = Pipeline::from_summary(&preprocess_one_worker().0);
    let c = p.cached();
    assert!(c.loader_wall_ms() < 0.01, "{}", c.loader_wall_ms());
    let v = preprocess_one_worker().verdict();
    // Loader 10.2 ms → 0.006 ms per image: the 22 ms step becomes the limit, against the
    // measured 322 ms step.
    let g = speedup_of(&v, "pipeprof cache").unwrap_or(0.0);
    let want = (32.0 / 0.022) / (32.0 / 0.322);
    assert!((g - want).abs() / want < 0.01, "{g} vs {want}");
}

// ---- the model ----

#[test]
fn free_cores_are_own_use_plus_idle_capped_by_cores() {
    let p = |g: f32, proc: f32| Pipeline::from_summary(&preprocess_one_worker().cpu(g, proc).0).free_cores;
    assert!((p(50.0, 100.0) - 2.0).abs() < 1e-9);
    assert!((p(98.0, 100.0) - 1.04).abs() < 1e-6, "another program holds one core");
    assert!((p(10.0, 10.0) - 1.9).abs() < 1e-6, "others hold 0.1 core");
    assert!((Pipeline::from_summary(&preprocess_one_worker().0).free_cores - 2.0).abs() < 1e-9);
    let mut unsampled = preprocess_one_worker();
    unsampled.0.machine = Default::default();
    assert!((Pipeline::from_summary(&unsampled.0).free_cores - 2.0).abs() < 1e-9, "unsampled: all cores");
}

#[test]
fn throughput_is_the_minimum_capacity() {
    let p = Pipeline::from_summary(&preprocess_one_worker().0);
    let c = p.capacity();
    assert!((c.loader_latency - 1000.0 / 10.2).abs() < 1e-6);
    assert!((c.compute - 32_000.0 / 22.0).abs() < 1e-6);
    assert_eq!(c.shared_cpu, f64::INFINITY, "a GPU run does not share cores with compute");
    assert_eq!(c.bound(), model::Bound::LoaderLatency);
    assert!((c.throughput() - c.loader_latency).abs() < 1e-9);
}

// ---- text ----

#[test]
fn simulated_preprocessing_run_advises_typed_workers() {
    let v = preprocess_one_worker().simulated("--slow resize=+4ms").verdict();
    assert_eq!((v.limiter.clone(), v.severity), (Limiter::Preprocess, Severity::High), "{v:#?}");
    assert!(v.flags.contains(&Flag::Simulated { what: "--slow resize=+4ms".into() }), "{:?}", v.flags);
    let workers = v.advice.iter().find(|a| matches!(a.change, Change::Workers(_))).expect("workers advice");
    assert_eq!(workers.change, Change::Workers(2), "{:#?}", v.advice);
    assert_eq!(workers.change.command().as_deref(), Some("--workers 2"));
    assert!(workers.predicted_speedup.is_some_and(|g| (1.95..2.05).contains(&g)), "{workers:?}");
    let not_yet = io_bound().steps(2).verdict();
    assert_eq!(not_yet.limiter, Limiter::NotEnoughData { steps_needed: 3 });
    assert!(not_yet.headline.starts_with("collecting… 3 more steps"), "{}", not_yet.headline);
}

#[test]
fn advice_json_keeps_the_command_string_and_reads_back_as_saved() {
    let v = preprocess_one_worker().verdict();
    let workers = v.advice.iter().find(|a| a.change == Change::Workers(2)).expect("workers advice");
    let json = serde_json::to_value(workers).unwrap();
    let keys: Vec<&str> = json.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["action", "basis", "command", "predicted_speedup", "reason"]);
    assert_eq!(json["command"], "--workers 2");
    let back: Advice = serde_json::from_value(json).unwrap();
    assert_eq!(back.change, Change::Saved);
    assert_eq!(back.command.as_deref(), Some("--workers 2"));
    assert_eq!(back.command, workers.command);
}

#[test]
fn every_limiter_and_flag_has_words() {
    let limiters = [
        Limiter::Io,
        Limiter::Contention,
        Limiter::Preprocess,
        Limiter::Transfer,
        Limiter::Compute,
        Limiter::Overhead,
        Limiter::Balanced,
        Limiter::NotEnoughData { steps_needed: 1 },
    ];
    let labels: std::collections::BTreeSet<&str> = limiters.iter().map(Limiter::label).collect();
    assert_eq!(labels.len(), limiters.len());
    let flags = [
        Flag::GpuUnused,
        Flag::NetworkStorage { fs_type: "nfs4".into() },
        Flag::CpuSaturated,
        Flag::TooFewWorkers { workers: 1, cores: 8 },
        Flag::TinyModel,
        Flag::ComputeCompetesWithLoader,
        Flag::Simulated { what: "x".into() },
        Flag::ValidationHeavy { share: 0.3 },
        Flag::CoreContention { share: 0.4, others: vec!["sh".into()], external: true },
        Flag::CoreContention { share: 0.4, others: vec![], external: false },
    ];
    for f in flags {
        assert!(f.describe().len() > 10, "{f:?}");
    }
}

#[test]
fn costly_augmentation_counts_as_preprocessing_with_a_predicted_gain() {
    let v = B::new()
        .workers(1, 2)
        .loader(&[("read", 0.2, 0.5), ("decode", 1.0, 1.0), ("resize", 0.5, 1.0), ("augment", 8.0, 1.0)])
        .step(300.0, 2.0, 20.0)
        .cpu(50.0, 100.0)
        .gpu(7.0, Some(true))
        .verdict();
    assert_eq!(v.limiter, Limiter::Preprocess, "{v:#?}");
    let a = v.advice.iter().find(|a| a.action.contains("augmentation cheaper")).expect("augment advice");
    assert!(a.predicted_speedup.is_some_and(|g| g > 1.5), "{a:?}");
    assert!(a.reason.contains("augment costs 8.00 ms"), "{a:?}");
    assert!(v.advice.iter().any(|a| a.change == Change::Workers(2)), "{:#?}", v.advice);
}

#[test]
fn a_large_validation_share_is_flagged() {
    let mut b = preprocess_one_worker();
    b.0.elapsed_s = 10.0;
    b.set_stage(stage("validate", 300.0, None, 10));
    let v = b.verdict();
    assert!(v.flags.contains(&Flag::ValidationHeavy { share: 0.3 }), "{:#?}", v.flags);
    b.set_stage(stage("validate", 50.0, None, 10));
    assert!(!b.verdict().flags.iter().any(|f| matches!(f, Flag::ValidationHeavy { .. })));
}

#[test]
fn diagnosis_is_deterministic_and_finite_on_an_empty_summary() {
    let v = diagnose(&Summary::default());
    assert_eq!(v, diagnose(&Summary::default()));
    assert_eq!(v.limiter, Limiter::NotEnoughData { steps_needed: MIN_STEPS });
}

// ---- GPU evidence ----

#[test]
fn input_bound_gpu_run_states_how_idle_the_gpu_was_while_the_loop_waited() {
    for (b, idle) in [(io_bound(), "idle 90%"), (preprocess_one_worker(), "idle 93%")] {
        let v = b.verdict();
        assert!(matches!(v.limiter, Limiter::Io | Limiter::Preprocess), "{:?}", v.limiter);
        let line = v.evidence.get(1).expect("a second evidence line");
        assert!(line.contains(idle) && line.contains("while the loop waited for data"), "{line}");
    }
}

#[test]
fn no_gpu_idle_line_on_a_cpu_device_or_without_nvml() {
    let cpu = io_bound().device("cpu").verdict();
    assert!(!cpu.evidence.iter().any(|l| l.contains("GPU was idle")), "{:?}", cpu.evidence);
    let mut unknown = io_bound();
    unknown.0.machine.devices.clear();
    assert!(!unknown.verdict().evidence.iter().any(|l| l.contains("GPU was idle")));
}

#[test]
fn tiny_model_on_a_gpu_is_also_advised_to_stay_on_the_cpu_and_not_on_a_cpu_device() {
    let v = tiny_model().verdict();
    let stay = v.advice.iter().find(|a| a.change == Change::UseDevice("cpu".into()));
    assert!(stay.is_some_and(|a| a.predicted_speedup.is_none() && a.reason.contains("per-step overhead")), "{v:#?}");
    let on_cpu = tiny_model().device("cpu").gpu(0.0, None).verdict();
    assert!(!on_cpu.advice.iter().any(|a| a.change == Change::UseDevice("cpu".into())), "{on_cpu:#?}");
}

// ---- off-CPU split, contention, early verdicts (issue 13) ----

/// The second round's busy machine: 500 page-cached tiny PNGs, read 85% off-CPU, but the
/// off-CPU time is run-queue wait while three busy loops hold the 2 cores.
fn preempted_reads() -> B {
    B::new()
        .device("cpu")
        .loader(&[("read", 2.0, 0.15), ("decode", 0.5, 0.6), ("resize", 0.3, 0.6)])
        .core_wait("read", 0.8)
        .core_wait("decode", 0.4)
        .core_wait("resize", 0.4)
        .step(40.0, 0.9, 20.0)
        .cpu(100.0, 60.0)
        .others(1.4, &[("sh", 3, 140.0)])
}

#[test]
fn preempted_reads_are_contention_not_storage() {
    let v = preempted_reads().verdict();
    assert_eq!(v.limiter, Limiter::Contention, "{v:#?}");
    assert!(v.headline.contains("wait for cores other programs hold"), "{}", v.headline);
    let flag = v.flags.iter().find_map(|f| match f {
        Flag::CoreContention { share, others, external } => Some((*share, others.clone(), *external)),
        _ => None,
    });
    let (share, others, external) = flag.expect("contention is flagged");
    assert!(external && others == ["sh"], "{others:?}");
    // (0.8 × 2 + 0.4 × 0.5 + 0.4 × 0.3) / 2.8 ms of loader wall.
    assert!((share - 1.92 / 2.8).abs() < 1e-9, "{share}");
    assert!(v.evidence.iter().any(|e| e.contains("waiting for a core") && e.contains("sh ×3 140%")), "{v:#?}");
    let free = v.advice.iter().find(|a| a.change == Change::FreeCores).expect("advice names the competitors");
    assert!(free.action.contains("sh (140% CPU)"), "{}", free.action);
    assert!(free.predicted_speedup.is_some_and(|g| g > 1.5), "{free:?}");
    assert!(!v.flags.contains(&Flag::CpuSaturated), "the contention flag says more: {:?}", v.flags);
}

#[test]
fn a_program_under_five_percent_is_not_named_as_holding_the_cores() {
    // The sampler lists every other program; a kernel worker at 0–1% is nothing to stop.
    let v =
        preempted_reads().others(1.4, &[("sh", 3, 140.0), ("process_api", 1, 0.4), ("kworker/0:2", 1, 4.9)]).verdict();
    let named = |t: &str| t.contains("sh") && !t.contains("process_api") && !t.contains("kworker");
    let flag = v.flags.iter().find_map(|f| match f {
        Flag::CoreContention { others, .. } => Some(others.clone()),
        _ => None,
    });
    assert_eq!(flag, Some(vec!["sh".to_string()]), "{:?}", v.flags);
    let free = v.advice.iter().find(|a| a.change == Change::FreeCores).expect("advice names the competitors");
    assert!(named(&free.action), "{}", free.action);
    let line = v.evidence.iter().find(|e| e.contains("other programs kept")).expect("the contention line");
    assert!(named(line), "{line}");
}

#[test]
fn waits_between_short_spans_count_through_the_threads_scheduler_figures() {
    // 30 µs spans hold no preemption; the threads still waited for a core half their ready time.
    let mut b = B::new()
        .device("cpu")
        .loader(&[("read", 0.01, 1.0), ("decode", 0.02, 1.0)])
        .step(2.0, 0.01, 0.5)
        .cpu(100.0, 20.0)
        .others(1.8, &[("sh", 3, 180.0)]);
    b.0.machine.threads = vec![ThreadSummary {
        name: "loader-0".into(),
        core_wait_ns: Some(500),
        sched_cpu_ns: Some(500),
        ..Default::default()
    }];
    let v = b.verdict();
    assert_eq!(v.limiter, Limiter::Contention, "{v:#?}");
    assert!(v.flags.iter().any(|f| matches!(f, Flag::CoreContention { share, external: true, .. } if *share == 0.5)));
    assert!(v.evidence.iter().any(|e| e.contains("50% of the time they were ready to run")), "{v:#?}");
}

#[test]
fn the_same_off_cpu_read_blocked_instead_is_storage() {
    // Same 85% off-CPU read, no run-queue wait: blocked on storage.
    let b = preempted_reads().core_wait("read", 0.0).core_wait("decode", 0.0).core_wait("resize", 0.0);
    let v = b.verdict();
    assert_eq!(v.limiter, Limiter::Io, "{v:#?}");
    assert!(!v.flags.iter().any(|f| matches!(f, Flag::CoreContention { .. })), "{:?}", v.flags);
    assert!(!v.advice.iter().any(|a| a.change == Change::FreeCores));
}

#[test]
fn contention_from_the_runs_own_threads_is_flagged_without_blaming_others() {
    // Decode waits for a core, nobody else runs: too many threads of this run, not others.
    let b = preprocess_one_worker()
        .workers(4, 2)
        .loader(&[("decode", 6.0, 0.7), ("resize", 4.0, 0.7)])
        .core_wait("decode", 0.3)
        .core_wait("resize", 0.3)
        .others(0.1, &[]);
    let v = b.verdict();
    assert_eq!(v.limiter, Limiter::Preprocess, "{v:#?}");
    assert!(v.flags.iter().any(|f| matches!(f, Flag::CoreContention { external: false, .. })), "{:?}", v.flags);
    assert!(v.evidence.iter().any(|e| e.contains("own threads")), "{v:#?}");
    assert!(!v.advice.iter().any(|a| a.change == Change::FreeCores), "nobody else to stop");
}

#[test]
fn little_core_wait_is_no_finding() {
    let v = io_bound().core_wait("read", 0.02).others(1.0, &[("cc1", 1, 100.0)]).verdict();
    assert_eq!(v.limiter, Limiter::Io);
    assert!(!v.flags.iter().any(|f| matches!(f, Flag::CoreContention { .. })), "{:?}", v.flags);
}

#[test]
fn io_evidence_says_whether_bytes_came_from_storage_or_the_page_cache() {
    let mut b = io_bound();
    b.0.machine.read_bytes_per_s_mean = Some(0.5e6);
    b.0.machine.syscall_read_bytes_per_s_mean = Some(10e6);
    let v = b.verdict();
    assert!(
        v.evidence.iter().any(|e| e.contains("10.0 MB/s read, 0.5 MB/s of it from storage (95% from the page cache")),
        "{v:#?}"
    );
}

#[test]
fn no_transfer_verdict_on_a_cpu_device() {
    let v = transfer_bound().device("cpu").verdict();
    assert_ne!(v.limiter, Limiter::Transfer, "{v:#?}");
    assert!(!v.headline.contains("host→device"), "{}", v.headline);
}

#[test]
fn a_few_preempted_copies_do_not_make_a_transfer_verdict() {
    // Mean 30 ms from a few long slices; the typical copy takes 3 µs.
    let mut b = transfer_bound();
    if let Some(t) = b.0.stages.iter_mut().find(|s| s.stage == Stage::Transfer) {
        t.p50_ms = 0.003;
    }
    let v = b.verdict();
    assert_ne!(v.limiter, Limiter::Transfer, "{v:#?}");
    assert_eq!(transfer_bound().verdict().limiter, Limiter::Transfer, "the typical copy decides");
}

#[test]
fn cpu_saturated_is_not_flagged_beside_io_workers_advice() {
    let v = io_bound().cpu(95.0, 40.0).verdict();
    assert_eq!(v.limiter, Limiter::Io);
    assert!(has_command(&v, "--workers"), "{v:#?}");
    assert!(!v.flags.contains(&Flag::CpuSaturated), "{:?}", v.flags);
}

#[test]
fn free_cores_come_from_the_typical_competing_load() {
    // Means say 0.1 core free (one busy moment); the median of the other programs' load says 1.5.
    let b = preprocess_one_worker().cpu(100.0, 10.0).others(0.5, &[]);
    assert!((Pipeline::from_summary(&b.0).free_cores - 1.5).abs() < 1e-9);
}

#[test]
fn slow_steps_get_a_provisional_verdict_after_three() {
    let slow = B::new().device("cpu").loader(&[("read", 0.1, 0.5), ("decode", 1.0, 1.0)]).step(1.0, 0.5, 4500.0);
    let v = slow.clone().steps(EARLY_STEPS).verdict();
    assert!(v.provisional, "{v:#?}");
    assert_eq!(v.limiter, Limiter::Compute);
    assert!(v.headline.starts_with("Provisional after 3 steps of 4.5 s"), "{}", v.headline);
    let one = slow.clone().steps(1).verdict();
    assert!(matches!(one.limiter, Limiter::NotEnoughData { steps_needed: 4 }), "{one:#?}");
    // Two 1.5 s steps (3 s measured) wait; four 2 s steps of a large model, all compute
    // (8 s measured), are enough for a verdict.
    let short = slow.clone().step(0.0, 0.0, 1500.0).steps(2).verdict();
    assert!(matches!(short.limiter, Limiter::NotEnoughData { .. }), "{short:#?}");
    let big = B::new().device("cpu").step(0.0, 0.0, 2000.0).steps(4).verdict();
    assert_eq!(big.limiter, Limiter::Compute, "{big:#?}");
    assert!(big.provisional && big.headline.contains("8.0 s measured"), "{}", big.headline);
    let firm = slow.steps(MIN_STEPS).verdict();
    assert!(!firm.provisional && firm.limiter == Limiter::Compute);
    // Fast steps wait for the usual window.
    let fast = compute_bound_gpu().steps(EARLY_STEPS).verdict();
    assert!(matches!(fast.limiter, Limiter::NotEnoughData { .. }) && !fast.provisional);
}

#[test]
fn an_attached_program_gets_cache_advice_for_its_own_loader_not_a_pipeprof_command() {
    let mut b = io_bound();
    b.0.settings.model = "python/examples/train_numpy.py".into();
    let v = b.verdict();
    let own = v.advice.iter().find(|a| a.change == Change::PackOwnLoader);
    assert!(own.is_some_and(|a| a.predicted_speedup.is_some() && a.change.command().is_none()), "{v:#?}");
    assert!(!v.advice.iter().any(|a| matches!(a.change, Change::Cache { .. })), "{v:#?}");
    // A cnn.toml run keeps the command it can copy.
    assert!(io_bound().verdict().advice.iter().any(|a| matches!(a.change, Change::Cache { .. })));
}

#[test]
fn a_pytorch_or_keras_program_is_told_the_pack_command_and_the_reader_line() {
    use crate::aggregate::settings::LeadingResize;
    // (framework, data folder, input C×H×W, the PyTorch transforms' leading resize, the
    // command shown, whether the program's resize stays)
    let table = [
        ("pytorch", "/mnt/drive/imgs", [3, 224, 224], Some(LeadingResize::Exact { height: 224, width: 224 }), "pipeprof pack /mnt/drive/imgs data.ppk --size 224, then pipeprof.data.PackedImageFolder(\"data.ppk\", transform=...) in place of ImageFolder(\"/mnt/drive/imgs\", ...)", false),
        // Resize(256) then CenterCrop(224): the pack keeps the shorter side at 256, the crop
        // still sees what it saw; the model's 224 would squash and up-scale.
        ("pytorch", "/data/train", [3, 224, 224], Some(LeadingResize::Shorter(256)), "pipeprof pack /data/train data.ppk --shorter 256, then pipeprof.data.PackedImageFolder(\"data.ppk\", transform=...) in place of ImageFolder(\"/data/train\", ...)", false),
        // RandomResizedCrop first: it must crop from the image as stored.
        ("pytorch", "/data/train", [3, 224, 224], None, "pipeprof pack /data/train data.ppk --as-stored, then pipeprof.data.PackedImageFolder(\"data.ppk\", transform=...) in place of ImageFolder(\"/data/train\", ...)", true),
        // A decomposed (macOS) name: a literal Python reads.
        ("pytorch", "/data/Cafe\u{301}", [3, 64, 64], Some(LeadingResize::Shorter(64)), "pipeprof pack '/data/Cafe\u{301}' data.ppk --shorter 64, then pipeprof.data.PackedImageFolder(\"data.ppk\", transform=...) in place of ImageFolder(\"/data/Cafe\\u0301\", ...)", false),
        ("keras", "/content/drive/My Drive/pets", [3, 160, 128], None, "pipeprof pack '/content/drive/My Drive/pets' data.ppk --size 128x160 --layout keras, then pipeprof.keras.packed_dataset(\"data.ppk\", ...) in place of image_dataset_from_directory(\"/content/drive/My Drive/pets\", ...)", false),
        ("keras", "", [0, 0, 0], None, "pipeprof pack DIR data.ppk --size S --layout keras, then pipeprof.keras.packed_dataset(\"data.ppk\", ...) in place of image_dataset_from_directory(DIR, ...)", false),
    ];
    for (fw, data, input, resize, want, keeps_resize) in table {
        // Reads that do not block most of the loader's time: the gain has its number (see
        // a_framework_program_whose_reads_block_gets_copy_and_pack_advice_with_no_number).
        let mut b = preprocess_one_worker();
        b.0.settings.model = "train.py".into();
        b.0.settings.framework = fw.into();
        b.0.settings.data = data.into();
        b.0.settings.input = input;
        b.0.settings.folder_dataset = fw == "pytorch";
        b.0.settings.leading_resize = resize;
        let v = b.verdict();
        let pack = v.advice.iter().find(|a| matches!(a.change, Change::PackFolder { .. }));
        let pack = pack.unwrap_or_else(|| panic!("{fw}: {v:#?}"));
        assert_eq!(pack.change.command().as_deref(), Some(want), "{fw}");
        assert!(pack.predicted_speedup.is_some_and(|g| g > 1.0), "{pack:#?}");
        assert_eq!(
            pack.reason.contains("your transforms still resize the images, stored as they are"),
            keeps_resize,
            "{}",
            pack.reason
        );
        assert!(!v.advice.iter().any(|a| matches!(a.change, Change::Cache { .. } | Change::PackOwnLoader)), "{fw}");
    }
}

/// What the hook measured of a loader's work at the program's end: cold after a read, fed
/// back to back, the transform alone on packed images.
fn cold_cpu(cold_ms: f64, fed_ms: f64, packed_ms: Option<f64>) -> crate::aggregate::settings::ColdCpu {
    crate::aggregate::settings::ColdCpu { after_wait_ms: 19.0, images: 16, cold_ms, fed_ms, packed_ms }
}

#[test]
fn a_framework_program_whose_reads_block_gets_copy_and_pack_advice_as_a_floor_unless_its_fed_cost_was_measured() {
    // (framework, run, the hook's measurement, the copy and pack: None no number, Some(floor)):
    // io_bound's read is 20 ms, 95% blocked, of a 21.5 ms loader; preprocess_one_worker's
    // 0.2 ms, half blocked, of 10.2 ms.
    let measured = Some(cold_cpu(1.5, 1.0, Some(0.1)));
    let table = [
        ("pytorch", io_bound(), None, Some(true)),
        ("keras", io_bound(), None, Some(true)),
        ("pytorch", io_bound(), measured, Some(false)),
        // pipeprof's own loop: its figures stand (its copy and cache re-runs measured them).
        ("", io_bound(), None, Some(false)),
        ("pytorch", preprocess_one_worker(), None, Some(false)),
    ];
    for (fw, b, cold, floor) in table {
        let mut b = b.fs(FsKind::Fuse, "fuse");
        b.0.settings.framework = fw.into();
        b.0.settings.folder_dataset = fw == "pytorch";
        b.0.settings.cold_cpu = cold;
        let v = b.verdict();
        let moves: Vec<&Advice> = v
            .advice
            .iter()
            .filter(|a| matches!(a.change, Change::CopyLocal | Change::PackFolder { .. } | Change::Cache { .. }))
            .collect();
        assert_eq!(moves.len(), 2, "{fw}: the copy and the pack: {v:#?}");
        // The workers that overlap the cold reads: no number (a mount's parallel reads are
        // not the run's to know), measured or not.
        if v.limiter == Limiter::Io {
            let workers = v.advice.iter().find(|a| matches!(a.change, Change::Workers(_)));
            let workers = workers.unwrap_or_else(|| panic!("{fw}: workers advice: {v:#?}"));
            assert_eq!(workers.predicted_speedup.is_some(), fw.is_empty(), "{fw}: {workers:#?}");
        }
        for a in moves {
            // (preprocess_one_worker's copy gains nothing: its reads barely block.)
            if matches!(a.change, Change::CopyLocal) && a.predicted_speedup.is_none() && floor == Some(false) {
                assert!(!fw.is_empty() && cold.is_none(), "{fw}: {a:#?}");
                continue;
            }
            let b = a.basis.unwrap_or_else(|| panic!("{fw}: a number: {a:#?}"));
            assert_eq!(Some(b.floor), floor, "{fw}: {a:#?}");
            let words = a.gain_words().unwrap();
            assert_eq!(words.contains("predicted at least"), b.floor, "{fw}: {words}");
            assert_eq!(a.reason.contains("a floor"), b.floor, "{fw}: {a:#?}");
            assert_eq!(a.reason.contains("CPU work counted fed"), cold.is_some(), "{fw}: {a:#?}");
        }
    }
}

#[test]
fn the_fed_cost_the_hook_measured_raises_the_copy_and_the_pack_and_the_packed_transform_sets_the_packs() {
    // Training on the CPU, reads blocked on a FUSE mount, a torchvision folder reader.
    let gain = |cold: Option<crate::aggregate::settings::ColdCpu>, change: fn(&Change) -> bool| {
        let mut b = io_bound().fs(FsKind::Fuse, "fuse");
        b.0.settings.model = "train.py".into();
        b.0.settings.framework = "pytorch".into();
        b.0.settings.device = "cpu".into();
        b.0.machine.this_process_on_gpu = Some(false);
        b.0.settings.folder_dataset = true;
        b.0.settings.cold_cpu = cold;
        let v = b.verdict();
        let a = v.advice.iter().find(|a| change(&a.change));
        a.and_then(|a| a.predicted_speedup).unwrap_or_else(|| panic!("{cold:?}: {:#?}", v.advice))
    };
    let copy = |c: &Change| matches!(c, Change::CopyLocal);
    let pack = |c: &Change| matches!(c, Change::PackFolder { .. });
    let floor = (gain(None, copy), gain(None, pack));
    // Work measured ×1.5 dearer cold than fed: more after either change.
    let fed = (gain(Some(cold_cpu(1.5, 1.0, None)), copy), gain(Some(cold_cpu(1.5, 1.0, None)), pack));
    assert!(fed.0 > floor.0 && fed.1 > floor.1, "{floor:?} {fed:?}");
    // No dearer cold than fed: the floor's figures.
    let same = (gain(Some(cold_cpu(1.0, 1.0, None)), copy), gain(Some(cold_cpu(1.0, 1.0, None)), pack));
    assert!((same.0 - floor.0).abs() < 1e-9 && (same.1 - floor.1).abs() < 1e-9, "{floor:?} {same:?}");
    // The transform on packed images measured: the pack's transform stages cost that, the
    // copy is unchanged.
    let cheap = gain(Some(cold_cpu(1.5, 1.0, Some(0.001))), pack);
    let dear = gain(Some(cold_cpu(1.5, 1.0, Some(5.0))), pack);
    assert!(cheap > fed.1 && dear < fed.1, "{cheap} {} {dear}", fed.1);
    assert_eq!(gain(Some(cold_cpu(1.5, 1.0, Some(5.0))), copy), fed.0);
}

#[test]
fn a_pytorch_dataset_that_is_not_torchvisions_folder_reader_gets_no_pack_command() {
    // A CSV dataset, Food101(root=…), an ImageFolder with its own loader: the folder the run
    // names is not what PackedImageFolder reads.
    let mut b = io_bound();
    b.0.settings.model = "train.py".into();
    b.0.settings.framework = "pytorch".into();
    b.0.settings.data = "data".into();
    let v = b.verdict();
    assert!(!v.advice.iter().any(|a| matches!(a.change, Change::PackFolder { .. })), "{v:#?}");
    assert!(v.advice.iter().any(|a| a.change == Change::PackOwnLoader), "{v:#?}");
}

#[test]
fn packing_as_stored_predicts_less_than_packing_at_the_resize_it_replaces() {
    use crate::aggregate::settings::LeadingResize;
    let gain = |resize| {
        // Reads that do not block most of the loader's time: the gain has its number.
        let mut b = preprocess_one_worker();
        b.0.settings.model = "train.py".into();
        b.0.settings.framework = "pytorch".into();
        b.0.settings.folder_dataset = true;
        b.0.settings.leading_resize = resize;
        let v = b.verdict();
        let pack = v.advice.iter().find(|a| matches!(a.change, Change::PackFolder { .. }));
        pack.and_then(|a| a.predicted_speedup).unwrap_or_else(|| panic!("{v:#?}"))
    };
    let (exact, stored) = (gain(Some(LeadingResize::Shorter(224))), gain(None));
    assert!(stored <= exact, "as stored ×{stored} against at the resize ×{exact}");
}

// ---- how a run ended ----

#[test]
fn a_diverged_loss_is_flagged_first_with_the_steps_and_the_timings_kept() {
    use crate::aggregate::Divergence;
    // (first NaN, first inf, the words)
    let table = [
        (Some(412), Some(410), "loss is NaN from step 412 (inf at 410): training diverged — lower the learning rate; the timings stay valid"),
        (Some(7), None, "loss is NaN from step 7: training diverged"),
        (None, Some(3), "loss is inf from step 3: training diverged"),
    ];
    for (first_nan, first_inf, words) in table {
        let mut b = compute_bound_gpu();
        b.0.diverged = Some(Divergence { first_nan, first_inf });
        let v = b.verdict();
        assert_eq!(v.flags[0], Flag::Diverged { first_nan, first_inf });
        assert!(v.flags[0].describe().starts_with(words), "{}", v.flags[0].describe());
        assert_eq!(v.limiter, compute_bound_gpu().verdict().limiter, "the timings' verdict is unchanged");
    }
    assert!(!compute_bound_gpu().verdict().flags.iter().any(|f| matches!(f, Flag::Diverged { .. })));
}

#[test]
fn a_stall_is_flagged_with_thread_stage_file_and_time_even_before_the_first_step() {
    use crate::aggregate::Stall;
    let stall = |abandoned| Stall {
        thread: "loader-0".into(),
        stage: "read".into(),
        file: "a/zz_pipe.png".into(),
        open_s: 45.2,
        abandoned,
    };
    let mut s = Summary::default();
    s.stalls.push(stall(false));
    let v = diagnose(&s);
    let words: Vec<String> = v.flags.iter().map(Flag::describe).collect();
    assert_eq!(words, ["loader-0 has been reading a/zz_pipe.png for 45 s"]);
    s.stalls[0] = stall(true);
    let left = diagnose(&s).flags[0].describe();
    assert!(
        left.starts_with("loader-0 was still reading a/zz_pipe.png after 45 s when the run ended: left behind"),
        "{left}"
    );
}

// ---- gains against measurement ----

#[test]
fn a_gain_is_the_models_rate_after_over_the_measured_rate_now() {
    // (measured now, model's now, model's after) → (gain, range)
    type Row = (f64, f64, f64, Option<(f64, Option<(f64, f64)>)>);
    let table: [Row; 8] = [
        // The model agrees with the measurement: the point, no range.
        (100.0, 100.0, 300.0, Some((3.0, None))),
        // Off by 20% (within ±25%): still a point, and over the measured rate, not the model's.
        (100.0, 120.0, 300.0, Some((3.0, None))),
        (100.0, 80.0, 300.0, Some((3.0, None))),
        // The case: the model put today at 121 images/s, 23.4 were measured: ≈7.9×
        // against the measurement, widened down to 1.5× (the model's own ratio).
        (23.4, 121.0, 185.0, Some((185.0 / 23.4, Some((185.0 / 121.0, 185.0 / 23.4))))),
        // The model under-estimates today: the range goes up from the measured ratio.
        (200.0, 100.0, 400.0, Some((2.0, Some((2.0, 4.0))))),
        // No model estimate of today: the point against the measurement.
        (100.0, f64::INFINITY, 150.0, Some((1.5, None))),
        // Nothing measured, or no prediction: nothing.
        (0.0, 100.0, 300.0, None),
        (100.0, 100.0, f64::NAN, None),
    ];
    for (now, model_now, after, want) in table {
        let got = gain_against_measured(now, model_now, after);
        match (got, want) {
            (Some((g, r)), Some((wg, wr))) => {
                assert!((g - wg).abs() < 1e-9, "{now} {model_now} {after}: {g} vs {wg}");
                match (r, wr) {
                    (None, None) => {}
                    (Some((lo, hi)), Some((wlo, whi))) => {
                        assert!((lo - wlo).abs() < 1e-9 && (hi - whi).abs() < 1e-9, "{lo}–{hi} vs {wlo}–{whi}")
                    }
                    other => panic!("{now} {model_now} {after}: range {other:?}"),
                }
            }
            (None, None) => {}
            other => panic!("{now} {model_now} {after}: {other:?}"),
        }
    }
}

#[test]
fn every_predicted_gain_is_against_the_measured_rate_and_says_so() {
    for b in
        [io_bound(), preprocess_one_worker(), transfer_bound(), tiny_model(), io_bound().fs(FsKind::Fuse, "fuse.x")]
    {
        let v = b.verdict();
        let measured = b.0.images_per_s;
        for a in v.advice.iter().filter(|a| a.predicted_speedup.is_some()) {
            let basis = a.basis.unwrap_or_else(|| panic!("no basis: {a:?}"));
            let g = a.predicted_speedup.unwrap_or_default();
            assert!((basis.now - measured).abs() < 1e-6, "now {} vs measured {measured}", basis.now);
            assert!((g - basis.predicted / basis.now).abs() < 1e-9, "{a:?}");
            let words = a.gain_words().unwrap_or_default();
            assert!(words.starts_with("now ") && words.contains("(measured over steps 1–50) → predicted"), "{words}");
            // The live view's one-line form says the same: now X → Y (×g).
            let short = a.gain_short().unwrap_or_default();
            let want = format!("(×{g:.1})");
            assert!(short.starts_with("now ") && short.contains(" → ") && short.ends_with(&want), "{short}");
        }
    }
}

#[test]
fn a_model_off_todays_rate_says_so_and_gives_ranges() {
    // The same pipeline measured at half the rate the model gives it (another program took
    // the cores between samples, say): the model's today is off by +100%.
    let mut b = preprocess_one_worker();
    b.0.images_per_s /= 2.0;
    let v = b.verdict();
    assert!(v.evidence.iter().any(|e| e.contains("off the measured") && e.contains("ranges")), "{:#?}", v.evidence);
    let cache = v.advice.iter().find(|a| matches!(a.change, Change::Cache { .. })).expect("cache advice");
    let basis = cache.basis.expect("basis");
    let (lo, hi) = basis.range.expect("a range, not a point");
    let g = cache.predicted_speedup.unwrap_or_default();
    assert!(lo < hi && (hi - g).abs() < 1e-9 && (hi / lo - 2.0).abs() < 0.05, "{lo}–{hi}, point {g}");
    let words = cache.gain_words().unwrap_or_default();
    assert!(words.contains("the model is off today's rate") && words.contains('–'), "{words}");
    assert_eq!(words.matches("images/s").count(), 2, "one for now, one for the range: {words}");
    let short = cache.gain_short().unwrap_or_default();
    assert!(short.starts_with("now ") && short.contains(" → ") && short.contains('–'), "{short}");
    assert_eq!(short.matches("images/s").count(), 1, "{short}");
    // The same run measured as modelled: a point.
    let v = preprocess_one_worker().verdict();
    assert!(v.advice.iter().filter_map(|a| a.basis).all(|b| b.range.is_none()), "{:#?}", v.advice);
    assert!(!v.evidence.iter().any(|e| e.contains("off the measured")), "{:#?}", v.evidence);
}

#[test]
fn a_workers_change_too_recent_to_judge_gives_a_provisional_whole_run_verdict() {
    // `--workers auto` reached 8 at step 21 of 24: the split covers the whole run (the
    // aggregator's rule), and the verdict says it is provisional and why.
    let mut b = io_bound().steps(24);
    b.0.split.changed_at = Some(21);
    b.0.settings.workers = 8;
    let v = b.verdict();
    assert!(v.provisional, "{v:#?}");
    assert_eq!(v.limiter, Limiter::Io, "the whole run's waits decide");
    assert!(
        v.headline.starts_with("Provisional: the workers changed to 8 after step 21, only 3 steps"),
        "{}",
        v.headline
    );
    assert!(!io_bound().steps(24).verdict().provisional);
}

#[test]
fn an_input_bound_cpu_run_predicts_the_hot_compute_step_from_the_pools_cpu() {
    // Compute measured at 20 ms per step between long waits (cold, behind the loader), while
    // the pool's two threads used 5 ms of CPU per step and the training thread 4 ms (with its
    // 2 ms transfer): once fed, a step costs about the pool's CPU over its overlap, 4 ms.
    let mut b = preprocess_one_worker().device("cpu");
    let t = |name: &str, cpu_ms_per_step: f64| ThreadSummary {
        name: name.into(),
        role: role_named(name),
        samples: 10,
        cpu_mean_pct: 2.0,
        sched_cpu_ns: Some((cpu_ms_per_step * 1e6 * 50.0) as u64),
        core_wait_ns: Some(0),
        ..Default::default()
    };
    b.0.machine.threads = vec![t("compute-0", 3.0), t("compute-1", 2.0), t("train", 7.0)];
    let p = Pipeline::from_summary(&b.0);
    assert!((p.compute_ms - 5.0 / super::readings::POOL_OVERLAP).abs() < 1e-9, "{}", p.compute_ms);
    // Its CPU per image shrinks with the step fed; the rest was spent beside the loader's CPU
    // and is kept apart: as the run is, the compute's CPU is the measured one.
    let cold = Pipeline { compute_ms: 20.0, ..p.clone() };
    let fed_share = p.compute_ms / 20.0;
    let measured = p.compute_cpu_ms_per_image + p.compute_cpu_beside_ms;
    assert!(p.compute_cpu_beside_ms > 0.0, "{p:#?}");
    assert!((p.compute_cpu_ms_per_image - measured * fed_share).abs() < 1e-9, "{p:#?}");
    assert!((p.compute_cpu_now_ms() - measured).abs() < 1e-9 && cold.compute_ms > p.compute_ms);
    // Packed, little of the loader's CPU is left, and little of that part.
    let packed = p.cached().compute_cpu_now_ms();
    assert!(
        packed >= p.compute_cpu_ms_per_image && packed < p.compute_cpu_ms_per_image + 0.1 * p.compute_cpu_beside_ms
    );
    // Slow opens: the pool woke and spun through long waits (its CPU over the overlap is 4 ms),
    // the training thread spent 4.5 ms with its 2 ms transfer: the lesser, 2.5 ms, is the hot
    // step.
    b.0.machine.threads = vec![t("compute-0", 3.0), t("compute-1", 2.0), t("train", 4.5)];
    assert!((Pipeline::from_summary(&b.0).compute_ms - 2.5).abs() < 1e-9);
    // The training thread only dispatched (1 ms of its own, under half the pool's 4): the pool's.
    b.0.machine.threads = vec![t("compute-0", 3.0), t("compute-1", 2.0), t("train", 3.0)];
    assert!((Pipeline::from_summary(&b.0).compute_ms - 4.0).abs() < 1e-9);
    // A tiny model's ops stay on the training thread: its CPU, less the transfer, decides.
    b.0.machine.threads = vec![t("compute-0", 0.01), t("compute-1", 0.0), t("train", 9.0)];
    assert!((Pipeline::from_summary(&b.0).compute_ms - 7.0).abs() < 1e-9);
    // Too few samples to trust the counters: the measured step stays.
    b.0.machine.threads.iter_mut().for_each(|t| t.samples = 2);
    assert!((Pipeline::from_summary(&b.0).compute_ms - 20.0).abs() < 1e-9);
}

#[test]
fn per_image_costs_come_from_the_trimmed_mean_not_one_slow_file() {
    let mut b = preprocess_one_worker();
    // One 2-second file pulled decode's mean from 6 to 8 ms; the trimmed mean stays at 6.
    let mut d = stage("decode", 8.0, Some(1.0), 1000);
    d.trimmed_mean_ms = Some(6.0);
    b.set_stage(d);
    let p = Pipeline::from_summary(&b.0);
    assert_eq!(p.stage(probes::stage::Stage::Decode).map(|x| x.wall_ms), Some(6.0));
}

#[test]
fn the_hot_step_is_the_lesser_of_the_pools_and_a_working_training_threads_estimates() {
    use super::estimates::hot_step_ms;
    // (pool CPU per step over its overlap, training thread's CPU less transfer) → hot step
    let table: [(f64, Option<f64>, f64); 9] = [
        // slow opens: the pool spun between 240 ms waits; the training thread says 0.47 ms.
        (0.73, Some(0.47), 0.47),
        // The built-in CNN at 64×64: the pool does the work, the training thread dispatches
        // it (5.3 ms in one run, 15.7 in the next, against the pool's 18.9; fed, 18 ms).
        (18.9, Some(5.3), 18.9),
        (18.8, Some(15.7), 15.7),
        // At the edge: half the pool's reading still reads the step.
        (2.0, Some(1.0), 1.0),
        // decode-1w: the training thread's dispatch and spin make it the larger.
        (1.99, Some(2.6), 1.99),
        (1.0, Some(1.0), 1.0),
        // No training thread, or nothing left of it after its transfer: the pool's.
        (1.2, None, 1.2),
        (1.2, Some(-0.3), 1.2),
        (1.2, Some(f64::NAN), 1.2),
    ];
    for (pool, train, want) in table {
        assert_eq!(hot_step_ms(pool, train), want, "{pool} {train:?}");
    }
}

#[test]
fn slow_steps_widen_a_gain_into_a_range() {
    // (point, range, gain at the slow steps) → range
    type Row = (f64, Option<(f64, f64)>, Option<f64>, Option<(f64, f64)>);
    let table: [Row; 6] = [
        // A point widened down to the slow steps' gain.
        (3.4, None, Some(2.0), Some((2.0, 3.4))),
        // A range (the model off today) taken further down.
        (3.4, Some((3.4, 5.0)), Some(2.0), Some((2.0, 5.0))),
        // Already inside the range: unchanged.
        (3.4, Some((1.5, 3.4)), Some(2.0), Some((1.5, 3.4))),
        // No slow steps (no contention, or a change that leaves the loader the limit): as was.
        (3.4, None, None, None),
        (3.4, None, Some(3.4), None),
        (3.4, Some((3.0, 3.4)), Some(f64::INFINITY), Some((3.0, 3.4))),
    ];
    for (g, range, slow, want) in table {
        assert_eq!(widen_for_slow_steps(g, range, slow), want, "{g} {range:?} {slow:?}");
    }
}

#[test]
fn under_contention_a_change_leaving_compute_the_limit_is_a_range_down_to_its_slow_steps() {
    // Busy loops hold 1.4 cores; training on the CPU, the typical compute step is 20 ms and
    // its slow ones (p95) 40 ms: the cache, which leaves compute the limit, is predicted from
    // the typical step to the slow ones, and says why.
    let mut b = preempted_reads();
    if let Some(c) = b.0.stages.iter_mut().find(|s| s.stage == Stage::Compute) {
        c.p95_ms = 40.0;
    }
    let v = b.verdict();
    assert_eq!(v.limiter, Limiter::Contention, "{v:#?}");
    let cache = v.advice.iter().find(|a| matches!(a.change, Change::Cache { .. })).expect("cache advice");
    let basis = cache.basis.expect("basis");
    let (lo, hi) = basis.range.expect("a range");
    let g = cache.predicted_speedup.unwrap_or_default();
    assert!(basis.slow_steps && (hi - g).abs() < 1e-9 && lo < g, "{lo}–{hi}, point {g}");
    // 32 images per 40.9 ms (transfer + the slow step) over the measured rate.
    let now = basis.now;
    assert!((lo - 32.0 * 1000.0 / 40.9 / now).abs() < 1e-6, "{lo} vs {}", 32.0 * 1000.0 / 40.9 / now);
    let words = cache.gain_words().unwrap_or_default();
    assert!(words.contains("other programs"), "{words}");
    // Freeing the cores leaves no slow steps to widen by; nor does a quiet machine.
    let free = v.advice.iter().find(|a| a.change == Change::FreeCores).expect("free the cores");
    assert!(free.basis.is_some_and(|b| !b.slow_steps), "{free:?}");
    let mut quiet = b.others(0.0, &[]);
    quiet.0.machine.global_cpu_mean_pct = Some(30.0);
    assert!(quiet.verdict().advice.iter().filter_map(|a| a.basis).all(|b| !b.slow_steps));
}

#[test]
fn the_compute_rate_counts_the_images_a_step_trained_not_the_batch_size() {
    // 50 steps of 20 ms compute at batch 32: (images trained, images per second compute takes).
    let table: [(u64, f64); 4] = [
        // A data set of 24 images: every step trains 24.
        (50 * 24, 24.0 / 0.020),
        // Full batches.
        (50 * 32, 32.0 / 0.020),
        // Not counted (a summary without images): the batch size.
        (0, 32.0 / 0.020),
        // More than a batch a step is not a thing a step trains: the batch size caps it.
        (50 * 40, 32.0 / 0.020),
    ];
    for (images, want) in table {
        let mut b = B::new().step(0.0, 0.0, 20.0);
        b.0.images = images;
        let got = Pipeline::from_summary(&b.0).capacity().compute;
        assert!((got - want).abs() < 1e-6 * want, "{images} images: {got} vs {want}");
    }
}

// ---- a loop that batches in-memory samples itself ----

/// An MNIST-sized MLP on an in-memory TensorDataset, `num_workers=0`, on the CPU: each step
/// waits 0.23 ms (fetch 0.09 ms and collate 0.08 ms for the batch of 32, the rest the
/// DataLoader's own), computes 0.80 ms of which the optimizer is 0.31 ms.
fn in_memory_mlp() -> B {
    let mut b = B::new().device("cpu").loader(&[("fetch", 0.09, 0.9), ("collate", 0.08, 1.0)]).step(0.23, 0.0, 0.80);
    b.0.settings.workers = 0;
    b.optimizer(0.31).cpu(83.0, 60.0)
}

#[test]
fn a_wait_made_of_in_memory_samples_is_per_step_overhead_with_batch_advice_and_no_workers() {
    let v = in_memory_mlp().verdict();
    assert_eq!(v.limiter, Limiter::Overhead, "{v:#?}");
    assert!(v.headline.contains("samples already in memory"), "{}", v.headline);
    assert!(v.evidence.iter().any(|e| e.contains("fetching and collating")), "{:?}", v.evidence);
    let kinds: Vec<&Change> = v.advice.iter().map(|a| &a.change).collect();
    assert!(!kinds.iter().any(|c| matches!(c, Change::Workers(_) | Change::Cache { .. })), "{kinds:?}");
    let batch = v.advice.iter().find(|a| a.change == Change::BatchSize(128)).expect("batch advice");
    // Step 1.03 ms: fixed 0.06 (DataLoader) + 0.31 (optimizer); fetch+collate 0.17 and the
    // 0.49 ms of forward+backward grow ×4 at most: 4·1.03/(0.37+4·0.66) = 1.37 at the low end,
    // 4·1.03/(0.37+0.49+4·0.17) = 2.68 at the high end.
    let (lo, hi) = batch.basis.and_then(|b| b.range).expect("a range on the CPU");
    assert!((lo - 1.37).abs() < 0.02 && (hi - 2.68).abs() < 0.02, "{lo} {hi}");
    assert!(batch.gain_words().unwrap().contains("how much of forward+backward grows"), "{:?}", batch.gain_words());
}

#[test]
fn on_a_gpu_a_tiny_models_kernels_do_not_grow_with_the_batch_and_staying_on_the_cpu_is_advised() {
    let mut b = in_memory_mlp().gpu(30.0, Some(true));
    b.0.settings.device = "cuda:0".into();
    let v = b.verdict();
    assert_eq!(v.limiter, Limiter::Overhead, "{v:#?}");
    let batch = v.advice.iter().find(|a| a.change == Change::BatchSize(128)).expect("batch advice");
    assert!(batch.basis.is_some_and(|b| b.range.is_none()), "{batch:?}");
    assert!((batch.predicted_speedup.unwrap() - 2.68).abs() < 0.02, "{batch:?}");
    assert!(v.advice.iter().any(|a| a.change == Change::UseDevice("cpu".into())), "{:?}", v.advice);
}

#[test]
fn a_dataset_that_decodes_inside_getitem_is_preprocessing_not_overhead() {
    // 32 samples of 2 ms each (an OpenCV decode pipeprof does not hook): real loader work.
    let mut b = in_memory_mlp().loader(&[("fetch", 64.0, 1.0)]).step(64.5, 0.0, 0.80);
    b.0.settings.workers = 0;
    let v = b.verdict();
    assert_eq!(v.limiter, Limiter::Preprocess, "{v:#?}");
    assert!(!v.headline.contains("already in memory"), "{}", v.headline);
}

#[test]
fn a_python_runs_compute_cpu_is_its_process_trees_less_the_loaders_not_every_free_core() {
    // A torchvision script, num_workers=0 on 2 idle cores, one compute thread: 68.7 ms steps
    // of 32 (wait 27.4, compute 41.3), the process 102% of a core, no compute threads sampled.
    let mut b = B::new()
        .device("cpu")
        .workers(0, 2)
        .loader(&[("decode", 0.30, 1.0), ("resize", 0.45, 0.93), ("augment", 0.04, 1.0)])
        .step(27.4, 0.0, 41.3)
        .cpu(55.0, 102.0);
    b.0.images = 50 * 32;
    let p = Pipeline::from_summary(&b.0);
    let want = 1.02 * 68.7 / 32.0 - (0.30 + 0.45 * 0.93 + 0.04);
    assert!((p.compute_cpu_ms_per_image - want).abs() < 1e-6, "{} vs {want}", p.compute_cpu_ms_per_image);
    // While training (the start-up left out) it used 60% of a core at the run's rate: that,
    // over the rate, less the loader's.
    b.0.images_per_s = 400.0;
    b.0.machine.process_cpu_training_pct = Some(60.0);
    let t = Pipeline::from_summary(&b.0);
    let want = 0.6 * 1000.0 / 400.0 - (0.30 + 0.45 * 0.93 + 0.04);
    assert!((t.compute_cpu_ms_per_image - want).abs() < 1e-6, "{} vs {want}", t.compute_cpu_ms_per_image);
    // A tree that burned more than every core through each step (threads spinning between
    // steps, a start-up in the figure) is capped there: 41.3 ms × the free cores / 32.
    b.0.machine.process_cpu_training_pct = Some(600.0);
    let cap = Pipeline::from_summary(&b.0);
    let all = 41.3 * cap.free_cores / 32.0;
    assert!((cap.compute_cpu_ms_per_image - all).abs() < 1e-6, "{} vs {all}", cap.compute_cpu_ms_per_image);
    // Unsampled, the compute is assumed to keep both cores busy.
    b.0.machine.process_cpu_training_pct = None;
    b.0.machine.process_cpu_mean_pct = None;
    let q = Pipeline::from_summary(&b.0);
    assert!((q.compute_cpu_ms_per_image - 41.3 * 2.0 / 32.0).abs() < 1e-6, "{}", q.compute_cpu_ms_per_image);
}

#[test]
fn a_loader_in_the_training_process_loads_and_trains_in_turn_and_workers_overlap_them() {
    // num_workers=0: 32 images at 0.85 ms each, then 34.3 ms of compute, one after the other.
    let b = B::new()
        .device("cpu")
        .workers(0, 2)
        .loader(&[("decode", 0.40, 1.0), ("resize", 0.45, 1.0)])
        .step(27.2, 0.0, 34.3)
        .cpu(50.0, 100.0);
    let mut b = b;
    b.0.images = 50 * 32;
    let p = Pipeline::from_summary(&b.0);
    assert!(p.in_process);
    let today = p.capacity();
    assert_eq!(today.bound(), model::Bound::InProcess);
    assert!((today.throughput() - 32_000.0 / (32.0 * 0.85 + 34.3)).abs() < 1e-6, "{today:?}");
    // Two workers load beside the loop: it is left with its compute.
    let two = p.with_workers(2);
    assert!(!two.in_process);
    assert!(two.capacity().in_process.is_infinite());
    assert!(two.capacity().throughput() > today.throughput() * 1.5, "{:?}", two.capacity());
}

// ---- the loader model's terms in words (issue 33) ----

#[test]
fn a_pytorch_run_without_workers_names_the_work_its_training_process_keeps_and_the_physical_cores() {
    // 0 workers, batch 32: the wait is 34 ms, of which the stages explain 32 × 0.9 ms; the
    // rest (5.2 ms) stays in the training process with workers. 4 logical cores, 2 physical.
    let mut b =
        B::new().workers(0, 4).device("cpu").loader(&[("decode", 0.9, 1.0)]).step(34.0, 0.0, 35.0).cpu(50.0, 100.0);
    b.0.settings.framework = "pytorch".into();
    b.0.machine.physical_cores = Some(2);
    let v = b.verdict();
    let model = v.evidence.iter().find(|e| e.starts_with("model: ")).cloned().unwrap_or_default();
    assert!(model.contains("5.20 ms a batch of the training process's own work"), "{model}");
    // With workers the loop takes 32 per (5.2 + 35) ms, not per 35 ms.
    assert!(model.contains(&format!("could take {}", crate::units::rate(32.0 * 1000.0 / 40.2))), "{model}");
    let cpu = v.evidence.iter().find(|e| e.starts_with("CPU ")).cloned().unwrap_or_default();
    assert!(cpu.contains("on 4 cores (2 physical"), "{cpu}");
    // pipeprof's own loader (no framework) hands batches over in the process: no such work.
    let mut own = b.clone();
    own.0.settings.framework = crate::aggregate::Framework::Own;
    own.0.settings.workers = 2;
    let line = own.verdict().evidence.into_iter().find(|e| e.starts_with("model: ")).unwrap_or_default();
    assert!(!line.contains("the training process's own work"), "{line}");
}

// ---- premises: a rule gives its advice only where its premise holds ----

/// The advice that changes the loader's workers, said in pipeprof's or a framework's terms.
fn workers_advice(v: &Verdict) -> Option<&Advice> {
    v.advice.iter().find(|a| matches!(a.change, Change::Workers(_)))
}

#[test]
fn a_dataloader_is_never_advised_more_workers_than_an_epoch_has_batches() {
    // 16 cores free, a preprocess-bound loader: (images in the dataset, batch, framework, the
    // most workers the advice may name). A worker takes whole batches of one epoch.
    let table = [
        (96, 32, "pytorch", 3),
        (480, 32, "pytorch", 15),
        (100, 32, "keras", 4),
        (0, 32, "pytorch", 16),
        (96, 32, "", 16),
    ];
    for (images, batch, fw, most) in table {
        let mut b = B::new()
            .workers(0, 16)
            .loader(&[("read", 0.2, 0.5), ("decode", 6.0, 1.0), ("resize", 4.0, 1.0)])
            .step(300.0, 2.0, 20.0)
            .cpu(7.0, 100.0)
            .gpu(7.0, Some(true));
        b.0.settings.framework = fw.into();
        b.0.settings.images = images;
        b.0.settings.batch_size = batch;
        let v = b.verdict();
        let n = match workers_advice(&v).map(|a| &a.change) {
            Some(Change::Workers(n)) => *n,
            _ => panic!("{images} {fw}: no workers advice in {v:#?}"),
        };
        assert!(n <= most && n >= 1, "{images} images, batch {batch}, {fw:?}: {n} workers (at most {most})");
    }
}

/// A PyTorch program training on the CPU of 2 cores with `num_workers=0`, torch's 2 compute
/// threads on them, its loader's stages per image as given (wall ms, on-CPU share).
fn torch_cpu(loader: &[(&str, f64, f64)], wait: f64, compute: f64) -> B {
    let mut b = B::new().workers(0, 2).device("cpu");
    b.0.settings.framework = "pytorch".into();
    b.0.settings.model = "train.py".into();
    b.0.settings.batch_size = 8;
    b.0.settings.compute_threads = Some(2);
    b.0.settings.input = [1, 28, 28];
    b.loader(loader).step(wait, 0.0, compute).cpu(60.0, 120.0)
}

/// Torchvision's MNIST: uint8 images in memory, ToTensor + Normalize (convert), collate.
fn mnist_in_memory() -> B {
    torch_cpu(&[("convert", 0.05, 1.0), ("collate", 0.01, 1.0)], 0.6, 6.0)
}

/// An ImageFolder of photos on the training thread: read, decode, resize, augment.
/// torchvision's ImageFolder whose transforms begin with `Resize(32)`.
fn folder_on_training_thread() -> B {
    let mut b =
        torch_cpu(&[("read", 0.2, 0.5), ("decode", 3.0, 1.0), ("resize", 1.0, 1.0), ("augment", 0.8, 1.0)], 40.0, 30.0);
    b.0.settings.folder_dataset = true;
    b.0.settings.leading_resize = Some(crate::aggregate::settings::LeadingResize::Shorter(32));
    b
}

#[test]
fn samples_already_in_memory_get_no_pack_copy_or_pre_resize_advice() {
    // Each case: a loader, and whether its samples come from files.
    let cases: [(&str, B, bool); 4] = [
        ("mnist in memory", mnist_in_memory(), false),
        ("tensors resized in memory", torch_cpu(&[("resize", 2.0, 1.0), ("collate", 0.05, 1.0)], 30.0, 6.0), false),
        ("a folder of photos", folder_on_training_thread(), true),
        ("bytes decoded in memory", torch_cpu(&[("decode", 3.0, 1.0), ("resize", 1.0, 1.0)], 40.0, 30.0), true),
    ];
    for (what, b, from_files) in cases {
        let v = b.verdict();
        let packs = v.advice.iter().any(|a| {
            matches!(a.change, Change::PackOwnLoader | Change::Cache { .. } | Change::PreResize { .. })
                || a.action.contains("memory-mapped")
                || a.action.contains("pre-resize")
        });
        if !from_files {
            assert!(!packs, "{what}: nothing to pack or pre-resize in memory: {:#?}", v.advice);
        }
        assert_eq!(classify::Facts::new(&b.0).samples_from_files(), from_files, "{what}");
    }
    // The premise holds on the folder: its cache advice stays.
    let v = folder_on_training_thread().verdict();
    assert!(v.advice.iter().any(|a| a.action.contains("memory-mapped")), "{:#?}", v.advice);
}

#[test]
fn no_workers_are_called_no_workers_never_one() {
    let v = preprocess_one_worker().workers(0, 2).verdict();
    let f = v.flags.iter().find(|f| matches!(f, Flag::TooFewWorkers { .. })).expect("flagged");
    assert_eq!(f, &Flag::TooFewWorkers { workers: 0, cores: 2 });
    assert!(f.describe().starts_with("no loader workers: the training thread loads every batch"), "{}", f.describe());
    let w = workers_advice(&v).expect("workers advised");
    assert!(w.action.contains("0 → 2"), "{}", w.action);
}

#[test]
fn workers_beside_compute_threads_on_every_core_get_no_prediction() {
    // (case, the run, workers advised at all, with a number)
    let light = mnist_in_memory();
    let heavy = folder_on_training_thread();
    let mut one_thread = folder_on_training_thread();
    one_thread.0.settings.compute_threads = Some(1);
    let gpu = {
        let mut b = folder_on_training_thread().device("cuda:0").gpu(30.0, Some(true));
        b.0.settings.compute_threads = Some(2);
        b
    };
    let own_loop = {
        let mut b = folder_on_training_thread();
        b.0.settings.framework = crate::aggregate::Framework::Own;
        b
    };
    let cases: [(&str, B, bool, bool); 5] = [
        ("light loader, cores held: the best case is within the error", light, false, false),
        ("heavy loader, cores held: try it, unpredicted", heavy, true, false),
        ("torch on 1 thread of 2 cores: 1 worker fits beside it", one_thread, true, true),
        ("on a GPU workers do not compete with compute", gpu, true, true),
        ("pipeprof's own loop: calibrated threads", own_loop, true, true),
    ];
    for (what, b, advised, predicted) in cases {
        let v = b.verdict();
        let w = workers_advice(&v);
        assert_eq!(w.is_some(), advised, "{what}: {:#?}", v.advice);
        if let Some(w) = w {
            assert_eq!(w.predicted_speedup.is_some(), predicted, "{what}: {w:#?}");
            if !predicted {
                assert!(
                    w.reason.contains("--check-advice") && w.reason.contains("2 compute threads"),
                    "{what}: {}",
                    w.reason
                );
            }
        }
    }
    // Nor are idle cores between compute's bursts "too few workers".
    assert!(!mnist_in_memory().verdict().flags.iter().any(|f| matches!(f, Flag::TooFewWorkers { .. })));
}

#[test]
fn the_compute_threads_are_the_runs_else_the_sampled_pool_else_every_core() {
    let mut b = folder_on_training_thread();
    assert_eq!(classify::Facts::new(&b.0).compute_threads(), 2);
    b.0.settings.compute_threads = None;
    b = b.threads(&[("compute-0", 50.0), ("compute-1", 50.0), ("compute-2", 50.0)]);
    assert_eq!(classify::Facts::new(&b.0).compute_threads(), 3);
    b.0.machine.threads.clear();
    b.0.settings.cores = 16;
    assert_eq!(classify::Facts::new(&b.0).compute_threads(), 16);
}

#[test]
fn only_worker_processes_beside_compute_threads_on_every_core_have_their_cpu_in_the_step() {
    // A folder loaded by 2 worker processes beside torch's 2 compute threads on 2 cores.
    let beside = || {
        let mut b = folder_on_training_thread().workers(2, 2);
        b.0.split.compute_share = 0.9;
        b
    };
    let mut four_cores = beside();
    four_cores.0.settings.cores = 4;
    let mut own_loop = beside();
    own_loop.0.settings.framework = crate::aggregate::Framework::Own;
    let cases: [(&str, B, bool); 5] = [
        ("2 workers beside 2 compute threads on 2 cores", beside(), true),
        ("no workers: loading takes turns with the step", folder_on_training_thread(), false),
        ("on a GPU", beside().device("cuda:0").gpu(30.0, Some(true)), false),
        ("pipeprof's own loop: the sampler measures its threads' waits", own_loop, false),
        ("4 cores, 2 workers beside 2 threads: room for both", four_cores, false),
    ];
    for (what, b, part) in cases {
        let p = Pipeline::from_summary(&b.0);
        assert_eq!(p.compute_beside_ms > 0.0, part, "{what}: {p:#?}");
        // As measured, the step is the step.
        assert!((p.compute_step_ms() - p.compute_ms).abs() < 1e-9, "{what}");
        if part {
            assert!(p.cached().compute_step_ms() < p.compute_ms, "{what}: the pack frees the compute");
        }
    }
}

#[test]
fn a_run_without_a_gpu_says_nothing_of_gpus() {
    for (what, b) in [
        ("mnist", mnist_in_memory()),
        ("folder", folder_on_training_thread()),
        ("tiny step", torch_cpu(&[("fetch", 0.001, 1.0)], 0.5, 1.0).optimizer(0.6)),
    ] {
        let v = b.verdict();
        let mut words = vec![v.headline.clone()];
        words.extend(v.evidence.iter().cloned());
        words.extend(v.flags.iter().map(Flag::describe));
        words.extend(v.advice.iter().flat_map(|a| [a.action.clone(), a.reason.clone()]));
        for w in words {
            assert!(!w.contains("GPU"), "{what}: {w}");
        }
    }
}

#[test]
fn a_finished_run_gets_a_verdict_from_its_few_steps() {
    // pipeprof's own loop: a 42.5 M-parameter CNN, 4 steps of 0.5 s, all compute.
    let b =
        B::new().loader(&[("read", 0.1, 0.5), ("decode", 1.0, 1.0)]).step(1.0, 2.0, 500.0).params(42_500_000).steps(4);
    let live = diagnose(&b.0);
    assert!(matches!(live.limiter, Limiter::NotEnoughData { .. }), "while running, 4 short steps wait for more");
    let done = diagnose_finished(&b.0);
    assert_eq!(done.limiter, Limiter::Compute, "{done:#?}");
    assert!(done.provisional);
    assert!(done.headline.starts_with("Provisional after 4 steps of 0.5 s"), "{}", done.headline);
    // A run with no step at all still has nothing to judge.
    let none = diagnose_finished(&B::new().steps(0).0);
    assert!(matches!(none.limiter, Limiter::NotEnoughData { .. }));
    // … and says the run ended: no more steps are coming, nothing is "collecting".
    assert!(none.headline.starts_with("No verdict: the run ended before its first training step"), "{}", none.headline);
    assert!(!none.headline.contains("collecting"), "{}", none.headline);
}

#[test]
fn a_run_that_knows_it_trains_on_the_cpu_leaves_a_busy_gpu_unused() {
    // NVML sees the GPU busy with another program's memory and lists no process: unknown for a
    // framework's program, but pipeprof's own loop knows its device.
    let own = io_bound().device("cpu").gpu(40.0, None);
    assert!(own.verdict().flags.contains(&Flag::GpuUnused), "{:?}", own.verdict().flags);
    let mut framework = io_bound().device("cpu").gpu(40.0, None);
    framework.0.settings.framework = "pytorch".into();
    assert!(!framework.verdict().flags.contains(&Flag::GpuUnused));
    let on_gpu = io_bound();
    assert!(!on_gpu.verdict().flags.contains(&Flag::GpuUnused));
}

#[test]
fn a_tf_data_functions_cost_per_image_is_its_total_over_the_traced_images() {
    // 352 function runs in the trace windows: tiny per-element glue and whole-batch blurs; a
    // trimmed mean of the runs says nothing per image, the total over the images does.
    let mut b = B::new().step(30.0, 0.0, 15.0);
    b.0.settings.framework = "keras".into();
    let mut t = stage("transform", 468.6 / 352.0, Some(1.0), 352);
    t.trimmed_mean_ms = Some(0.008);
    b.set_stage(t);
    let untraced = Pipeline::from_summary(&b.0).stage(probes::stage::Stage::Transform).unwrap().wall_ms;
    assert!((untraced - 0.008).abs() < 1e-9, "without the windows: per span, {untraced}");
    b.0.settings.tf_trace = Some(crate::aggregate::settings::TfTrace { windows: 2, sampled_steps: 10, cost_ms: 200.0 });
    let per_image = Pipeline::from_summary(&b.0).stage(probes::stage::Stage::Transform).unwrap().wall_ms;
    assert!((per_image - 468.6 / 320.0).abs() < 1e-9, "{per_image}");
}

#[test]
fn the_words_name_the_stages_measured_and_the_workers_there_are() {
    let mut b = mnist_in_memory();
    b.0.split.wait_share = 0.3;
    let v = b.verdict();
    let all = format!("{} {}", v.headline, v.evidence.join(" "));
    assert!(!all.contains("decode") && !all.contains("resize"), "{all}");
    assert!(!all.contains("1 loader worker"), "there are none: {all}");
    assert!(v.evidence.iter().any(|e| e.contains("the training thread loads")), "{:#?}", v.evidence);
    if v.limiter == Limiter::Preprocess {
        assert!(v.headline.contains("(convert, collate)"), "{}", v.headline);
    }
    let folder = folder_on_training_thread().verdict();
    assert_eq!(folder.limiter, Limiter::Preprocess);
    assert!(folder.headline.contains("(decode, resize)"), "{}", folder.headline);
}

#[test]
fn a_tf_data_pipeline_loads_beside_the_step_never_in_turn_with_it() {
    let mut b = B::new()
        .workers(0, 2)
        .device("cpu")
        .loader(&[("decode", 0.4, 1.0), ("transform", 6.8, 1.0)])
        .step(72.0, 0.0, 50.0);
    b.0.settings.framework = "keras".into();
    let in_turn = Pipeline::from_summary(&b.0);
    assert!(in_turn.in_process, "0 workers of a PyDataset read in the process");
    b.0.settings.tf_data = true;
    let p = Pipeline::from_summary(&b.0);
    assert!(!p.in_process && p.workers == 2.0 && p.main_per_batch_ms == 0.0, "{p:?}");
    let v = b.verdict();
    let model = v.evidence.iter().find(|e| e.starts_with("model: ")).cloned().unwrap_or_default();
    assert!(model.starts_with("model: tf.data's parallel calls (2, one a core) supply"), "{model}");
    assert!(v.headline.contains("(transform, decode)"), "{}", v.headline);
}

mod text;

#[test]
fn a_floor_says_at_least_its_low_end_even_with_a_range() {
    let floor = |range| Advice {
        action: "copy".into(),
        change: Change::CopyLocal,
        command: None,
        predicted_speedup: Some(6.0),
        basis: Some(Basis {
            now: 100.0,
            from_step: 1,
            to_step: 40,
            predicted: 600.0,
            model_now: 140.0,
            range,
            slow_steps: false,
            compute_split_unknown: false,
            floor: true,
        }),
        reason: String::new(),
    };
    let plain = floor(None);
    assert!(
        plain.gain_words().unwrap().ends_with("predicted at least 600 images/s (×6.0)"),
        "{:?}",
        plain.gain_words()
    );
    assert!(plain.gain_short().unwrap().contains("≥600 images/s (×≥6.0)"), "{:?}", plain.gain_short());
    // The model off today's rate: ×4.3–6.0; the floor is the low end, and no "–".
    let ranged = floor(Some((4.3, 6.0)));
    let (w, s) = (ranged.gain_words().unwrap(), ranged.gain_short().unwrap());
    assert!(w.ends_with("→ predicted at least 430 images/s (×4.3)"), "{w}");
    assert!(s.contains("≥430 images/s (×≥4.3)") && !s.contains('–'), "{s}");
}

/// Keras on TensorFlow training on the CPU (2 cores, batch 32) beside a `tf.data` map, as
/// measured on `python/corpus/tf_heavy_map_cpu.py`: the trace's loader stages per image
/// (wall, ms: TensorFlow's trace has no on-CPU clock), the step's wait for its batch inside it
/// and the rest of it (ms), the process's CPU while it trained (100 = one core), the other
/// programs' cores and the run's clock (images/s, the compile in it).
fn tf_map_on_cpu(stages: &[(&str, f64)], wait: f64, compute: f64, process: f32, others: f32, rate: f64) -> B {
    let mut b = B::new().workers(0, 2).device("cpu").step(wait, 0.0, compute).cpu(100.0, process);
    let n = b.0.split.steps * b.0.settings.batch_size as u64;
    for &(name, ms) in stages {
        b.set_stage(stage(name, ms, None, n));
    }
    b.0.settings.framework = "keras".into();
    b.0.settings.tf_data = true;
    // Every step sampled: a tf.data function's cost per image is its total over them.
    let sampled_steps = b.0.split.steps;
    b.0.settings.tf_trace = Some(crate::aggregate::settings::TfTrace { windows: 4, sampled_steps, cost_ms: 700.0 });
    b.0.machine.process_cpu_training_pct = Some(process);
    b.0.machine.other_cores_median = Some(others);
    b.0.images_per_s = rate;
    b.0.split.startup_compute_ms = Some(1300.0);
    b
}

/// The blur map's stages (`--augment heavy`), per image: its function's own work is transform.
const HEAVY_MAP: [(&str, f64); 5] =
    [("read", 0.047), ("decode", 0.73), ("resize", 0.098), ("augment", 2.03), ("transform", 4.68)];

#[test]
fn a_heavy_tf_data_map_on_the_cpu_is_preprocessing_with_the_in_step_wait_and_its_cpu_share() {
    // (case, the run, CPU preprocessing expected, the step's wait for its batch as said).
    // Measured: the heavy map ran the script at 198 images/s (its own clock), the identity
    // map at 577: the map's CPU limits the run, through the wait when the trace windows saw
    // the step wait for its batch, through the cores when they saw tf.data's buffer full.
    let cases: [(&str, B, bool, &str); 5] = [
        (
            "heavy map, windows past the start-up: the step waits for its batch",
            tf_map_on_cpu(&HEAVY_MAP, 32.07, 70.12, 93.3, 1.0, 163.5),
            true,
            "31.4%",
        ),
        (
            "heavy map beside other programs: the process had more cores than their median left",
            tf_map_on_cpu(
                &[("read", 0.036), ("decode", 0.41), ("resize", 0.07), ("augment", 1.21), ("transform", 3.76)],
                17.36,
                66.27,
                110.5,
                1.24,
                218.0,
            ),
            true,
            "20.8%",
        ),
        (
            "heavy map, one window on the batches made during the compile: no wait, the cores taken",
            tf_map_on_cpu(
                &[("read", 0.042), ("decode", 0.49), ("resize", 0.09), ("augment", 2.77), ("transform", 6.55)],
                0.08,
                107.2,
                87.5,
                1.0,
                170.0,
            ),
            true,
            "0.1%",
        ),
        (
            "identity map: loading alone, the step computes",
            tf_map_on_cpu(
                &[("read", 0.043), ("decode", 0.64), ("resize", 0.106), ("transform", 0.057)],
                1.33,
                38.16,
                128.7,
                1.2,
                361.9,
            ),
            false,
            "3.4%",
        ),
        (
            "identity map, one window: no wait",
            tf_map_on_cpu(
                &[("read", 0.04), ("decode", 0.67), ("resize", 0.14), ("transform", 0.07)],
                0.04,
                34.56,
                87.0,
                1.0,
                393.0,
            ),
            false,
            "0.1%",
        ),
    ];
    for (what, b, map_limits, waited) in cases {
        let v = b.verdict();
        let f = classify::Facts::new(&b.0);
        assert_eq!(v.limiter == Limiter::Preprocess, map_limits, "{what}: {:?} {}", v.limiter, v.headline);
        assert_eq!(f.tf_map_takes_cores(), map_limits, "{what}: share {:?}", f.tf_map_cpu_share());
        // The wait said is the one inside the step, TensorFlow's IteratorGetNext.
        assert!(v.evidence[0].contains("inside it (tf.data's IteratorGetNext)"), "{what}: {}", v.evidence[0]);
        assert!(v.evidence[0].contains(waited), "{what}: {}", v.evidence[0]);
        if !map_limits {
            assert!(!v.headline.contains("tf.data's map"), "{what}: {}", v.headline);
            continue;
        }
        // Which limits: the map's CPU, its share of the process's against the step's.
        let share = f.tf_map_cpu_share().expect("known");
        assert!(
            v.headline.starts_with("CPU preprocessing in tf.data's map (transform, augment) limits training"),
            "{what}: {}",
            v.headline
        );
        assert!(
            v.headline.contains(&format!("{} of this process's CPU", crate::units::pct(share))),
            "{what}: {}",
            v.headline
        );
        assert!(v.headline.contains(&format!("waited for its batch {waited}")), "{what}: {}", v.headline);
        assert!(v.evidence.iter().any(|e| e.contains("tf.data's map and loading use")), "{what}: {:#?}", v.evidence);
        // The numbers agree: the loader supplies at least what the run trained, and the
        // model's rate is the measured one within the model's own tolerance.
        let now = f.now.expect("measured").rate;
        assert!(f.cap.loader() >= now, "{what}: the loader supplies {} < the measured {now}", f.cap.loader());
        let off = f.model_off().expect("both known");
        assert!(off.abs() <= MODEL_OFF_SHARE, "{what}: the model {} off the measured {now}: {off}", f.cap.throughput());
        assert!(
            !v.evidence.iter().any(|e| e.contains("capacity model puts today's rate")),
            "{what}: {:#?}",
            v.evidence
        );
    }
}

#[test]
fn traced_stages_share_out_the_processs_cpu_where_their_wall_is_more() {
    use super::estimates::traced_cpu_within_tree;
    let b = tf_map_on_cpu(&HEAVY_MAP, 32.07, 70.12, 93.3, 1.0, 163.5);
    let mut loader = super::readings::loader_costs(&b.0);
    let wall: f64 = loader.iter().map(|x| x.wall_ms).sum();
    // 7.59 ms of wall and 2.2 ms of compute in 5.7 ms of the process's CPU an image.
    let compute = traced_cpu_within_tree(&mut loader, 2.2, 5.7);
    let cpu: f64 = loader.iter().map(|x| x.on_cpu_ms).sum();
    assert!((cpu + compute - 5.7).abs() < 1e-9, "{cpu} + {compute}");
    assert!((cpu / compute - (wall - 0.047) / 2.2).abs() < 1e-9, "shared out in proportion: {cpu} {compute}");
    assert_eq!(loader.iter().map(|x| x.wall_ms).sum::<f64>(), wall, "the wall stays");
    // Within the process's CPU already, or measured on-CPU: unchanged.
    let mut again = loader.clone();
    assert_eq!(traced_cpu_within_tree(&mut again, compute, 10.0), compute);
    let mut measured = super::readings::loader_costs(&b.0);
    measured[0].measured = true;
    assert_eq!(traced_cpu_within_tree(&mut measured, 2.2, 5.7), 2.2);
}
