//! The diagnosis's words, whole: every headline, evidence line, flag, advice and gain of the
//! scenarios above (and the straggler verdicts), in one snapshot. The table tests check what
//! each rule decides; this pins how it is said, so a refactor of the wording code cannot change
//! a byte unseen.

use super::*;
use crate::aggregate::ranks::RankLine;
use std::fmt::Write;

/// A verdict as text: every field a view can show.
fn render(name: &str, v: &Verdict) -> String {
    let mut o = format!("## {name}\n");
    let _ = writeln!(o, "limiter: {} ({:?}), severity {}", v.limiter.label(), v.limiter, v.severity.label());
    let _ = writeln!(o, "provisional: {}", v.provisional);
    let _ = writeln!(o, "headline: {}", v.headline);
    for e in &v.evidence {
        let _ = writeln!(o, "evidence: {e}");
    }
    for f in &v.flags {
        let _ = writeln!(o, "flag: {}", f.describe());
    }
    for a in &v.advice {
        let _ = writeln!(o, "advice: {}", a.action);
        let _ = writeln!(o, "  change: {:?}", a.change);
        let _ = writeln!(o, "  command: {}", a.command.clone().unwrap_or_else(|| "-".into()));
        let _ = writeln!(o, "  gain: {}", a.predicted_speedup.map_or("-".into(), |g| format!("{g:.4}")));
        let _ = writeln!(o, "  gain words: {}", a.gain_words().unwrap_or_else(|| "-".into()));
        let _ = writeln!(o, "  gain short: {}", a.gain_short().unwrap_or_else(|| "-".into()));
        let _ = writeln!(o, "  reason: {}", a.reason);
    }
    o
}

fn with(b: B, f: impl FnOnce(&mut Summary)) -> B {
    let mut b = b;
    f(&mut b.0);
    b
}

/// Threads whose scheduler figures say they waited for a core half their ready time.
fn contended_threads(s: &mut Summary) {
    s.machine.threads = vec![ThreadSummary {
        name: "loader-0".into(),
        core_wait_ns: Some(500),
        sched_cpu_ns: Some(500),
        ..Default::default()
    }];
}

/// Every scenario, named: the rules' table above, one of each kind of words.
fn scenarios() -> Vec<(&'static str, B)> {
    let fetch = |w: Option<f64>| {
        let b = B::new().loader(&[("decode", 10.0, 0.1)]).step(200.0, 1.0, 20.0);
        match w {
            Some(w) => b.core_wait("decode", w),
            None => b,
        }
    };
    let hot_threads = |s: &mut Summary| {
        let t = |name: &str, cpu_ms_per_step: f64| ThreadSummary {
            name: name.into(),
            role: role_named(name),
            samples: 10,
            cpu_mean_pct: 2.0,
            sched_cpu_ns: Some((cpu_ms_per_step * 1e6 * 50.0) as u64),
            core_wait_ns: Some(0),
            ..Default::default()
        };
        s.machine.threads = vec![t("compute-0", 3.0), t("compute-1", 2.0), t("train", 4.5)];
    };
    vec![
        ("io bound", io_bound()),
        ("io bound on fuse", io_bound().fs(FsKind::Fuse, "fuse.rclone")),
        ("io bound on nfs", io_bound().fs(FsKind::Network, "nfs4")),
        (
            "io bound, page cache",
            with(io_bound(), |s| {
                s.machine.read_bytes_per_s_mean = Some(0.5e6);
                s.machine.syscall_read_bytes_per_s_mean = Some(10e6);
            }),
        ),
        ("io bound, cpu saturated", io_bound().cpu(95.0, 40.0)),
        ("io bound, cpu device", io_bound().device("cpu")),
        ("io bound, simulated", io_bound().simulated("--throttle-read 2MB/s").simulated("--slow decode=+5ms")),
        ("io bound, one worker", io_bound().workers(1, 2)),
        (
            "io bound, attached numpy program",
            with(io_bound(), |s| s.settings.model = "python/examples/train_numpy.py".into()),
        ),
        (
            "io bound, workers changed late",
            with(io_bound().steps(24), |s| {
                s.split.changed_at = Some(21);
                s.settings.workers = 8;
            }),
        ),
        ("io bound, 3 steps", io_bound().steps(3)),
        ("tiny model that waits", tiny_model().loader(&[("read", 5.0, 0.02)]).step(100.0, 0.1, 2.0)),
        ("preprocess, one worker", preprocess_one_worker()),
        ("preprocess, saturated", preprocess_one_worker().cpu(98.0, 100.0)),
        ("preprocess, process on every core", preprocess_one_worker().cpu(70.0, 185.0)),
        ("preprocess, model off today", with(preprocess_one_worker(), |s| s.images_per_s /= 2.0)),
        (
            "preprocess, cpu device competes",
            preprocess_one_worker().device("cpu").threads(&[("compute-0", 6.0), ("compute-1", 6.0), ("train", 1.0)]),
        ),
        ("preprocess, hot compute", with(preprocess_one_worker().device("cpu"), hot_threads)),
        ("preprocess, no workers", preprocess_one_worker().workers(0, 2)),
        ("preprocess, own threads contend", {
            preprocess_one_worker()
                .workers(4, 2)
                .loader(&[("decode", 6.0, 0.7), ("resize", 4.0, 0.7)])
                .core_wait("decode", 0.3)
                .core_wait("resize", 0.3)
                .others(0.1, &[])
        }),
        ("preprocess, validation heavy", {
            let mut b = preprocess_one_worker();
            b.0.elapsed_s = 10.0;
            b.set_stage(stage("validate", 300.0, None, 10));
            b
        }),
        (
            "busy read is preprocessing",
            B::new().workers(1, 2).loader(&[("read", 9.0, 0.95), ("decode", 1.0, 1.0)]).step(200.0, 1.0, 20.0),
        ),
        (
            "decode off-cpu, unmeasured",
            B::new().loader(&[("read", 0.5, 0.5), ("decode", 10.0, 0.3)]).step(200.0, 1.0, 20.0),
        ),
        (
            "decode waiting for a core",
            B::new()
                .loader(&[("read", 0.5, 0.5), ("decode", 10.0, 0.3)])
                .step(200.0, 1.0, 20.0)
                .core_wait("decode", 0.6),
        ),
        ("fetch blocked in the dataset", fetch(Some(0.0))),
        ("fetch mostly waiting for a core", fetch(Some(0.8))),
        ("fetch, run queue unmeasured", fetch(None)),
        ("uninstrumented loader, iowait", B::new().step(100.0, 1.0, 20.0).iowait(40.0)),
        ("uninstrumented loader, no iowait", B::new().step(100.0, 1.0, 20.0).iowait(2.0)),
        (
            "costly augmentation",
            B::new()
                .workers(1, 2)
                .loader(&[("read", 0.2, 0.5), ("decode", 1.0, 1.0), ("resize", 0.5, 1.0), ("augment", 8.0, 1.0)])
                .step(300.0, 2.0, 20.0)
                .cpu(50.0, 100.0)
                .gpu(7.0, Some(true)),
        ),
        ("spiky loader that keeps up", compute_bound_gpu().step(25.0, 1.0, 100.0).spiky_wait(0.01, 80.0)),
        ("compute bound gpu", compute_bound_gpu()),
        ("compute bound, loader untimed", B::new().step(0.5, 1.0, 100.0).cpu(40.0, 60.0)),
        (
            "compute bound, model off, contended",
            with(compute_bound_gpu(), |s| {
                s.images_per_s /= 2.0;
                contended_threads(s);
            }),
        ),
        ("compute bound, model off", with(compute_bound_gpu(), |s| s.images_per_s /= 2.0)),
        (
            "compute bound, layers",
            compute_bound_gpu()
                .params(42_500_000)
                .layers(&[("conv2d_1", 4.0, 10.0), ("dense_1", 5.0, 61.0), ("dense_2", 0.5, 0.5)])
                .optimizer(19.0),
        ),
        (
            "compute bound, large model's optimizer",
            compute_bound_gpu().device("cpu").gpu(0.0, None).params(42_500_000).optimizer(71.0),
        ),
        ("gpu unused", compute_bound_gpu().device("cpu").gpu(0.0, Some(false))),
        ("cpu run on a busy gpu, own loop", io_bound().device("cpu").gpu(40.0, None)),
        (
            "diverged",
            with(compute_bound_gpu(), |s| {
                s.diverged = Some(crate::aggregate::Divergence { first_nan: Some(412), first_inf: Some(410) })
            }),
        ),
        ("stalled before the first step", {
            let mut b = B::new().steps(0);
            b.0.stalls.push(crate::aggregate::Stall {
                thread: "loader-0".into(),
                stage: "read".into(),
                file: "a/zz_pipe.png".into(),
                open_s: 45.2,
                abandoned: true,
            });
            b
        }),
        ("transfer bound", transfer_bound()),
        ("transfer bound, model off", with(transfer_bound(), |s| s.images_per_s /= 2.0)),
        ("transfer bound on the cpu", transfer_bound().device("cpu")),
        ("tiny model", tiny_model()),
        ("tiny model on the cpu", tiny_model().device("cpu").gpu(0.0, None)),
        ("optimizer-bound small model", compute_bound_gpu().optimizer(60.0)),
        ("idle gpu", compute_bound_gpu().gpu(20.0, Some(true))),
        ("balanced", B::new().workers(1, 4).loader(&[("decode", 10.0, 1.0)]).step(1.0, 1.0, 299.0)),
        ("no spans", B::new()),
        ("empty summary", B(Summary::default())),
        (
            "slow steps, 3 of them",
            B::new().device("cpu").loader(&[("read", 0.1, 0.5), ("decode", 1.0, 1.0)]).step(1.0, 0.5, 4500.0).steps(3),
        ),
        ("four 2 s steps", B::new().device("cpu").step(0.0, 0.0, 2000.0).steps(4)),
        ("preempted reads", preempted_reads()),
        (
            "preempted reads, slow compute steps",
            with(preempted_reads(), |s| {
                if let Some(c) = s.stages.iter_mut().find(|s| s.stage == Stage::Compute) {
                    c.p95_ms = 40.0;
                }
            }),
        ),
        ("preempted reads, model off", with(preempted_reads(), |s| s.images_per_s *= 3.0)),
        (
            "preempted reads were blocked",
            preempted_reads().core_wait("read", 0.0).core_wait("decode", 0.0).core_wait("resize", 0.0),
        ),
        ("short spans, contended", {
            let mut b = B::new()
                .device("cpu")
                .loader(&[("read", 0.01, 1.0), ("decode", 0.02, 1.0)])
                .step(2.0, 0.01, 0.5)
                .cpu(100.0, 20.0)
                .others(1.8, &[("sh", 3, 180.0)]);
            contended_threads(&mut b.0);
            b
        }),
        ("in-memory mlp on the cpu", in_memory_mlp()),
        (
            "in-memory mlp on a gpu",
            with(in_memory_mlp().gpu(30.0, Some(true)), |s| s.settings.device = "cuda:0".into()),
        ),
        (
            "decode inside getitem",
            with(in_memory_mlp().loader(&[("fetch", 64.0, 1.0)]).step(64.5, 0.0, 0.80), |s| s.settings.workers = 0),
        ),
        ("pytorch, no workers, hyper-threads", {
            let mut b = B::new()
                .workers(0, 4)
                .device("cpu")
                .loader(&[("decode", 0.9, 1.0)])
                .step(34.0, 0.0, 35.0)
                .cpu(50.0, 100.0);
            b.0.settings.framework = "pytorch".into();
            b.0.machine.physical_cores = Some(2);
            b
        }),
        ("torchvision mnist in memory", mnist_in_memory()),
        ("torchvision mnist, waiting", with(mnist_in_memory(), |s| s.split.wait_share = 0.3)),
        ("folder on the training thread", folder_on_training_thread()),
        ("folder, one compute thread", with(folder_on_training_thread(), |s| s.settings.compute_threads = Some(1))),
        ("folder on a gpu", {
            let mut b = folder_on_training_thread().device("cuda:0").gpu(30.0, Some(true));
            b.0.settings.compute_threads = Some(2);
            b
        }),
        ("pytorch workers restart each epoch", {
            let mut b = preprocess_one_worker().workers(2, 4);
            b.0.settings.framework = "pytorch".into();
            b.0.settings.model = "train.py".into();
            b.0.settings.persistent_workers = Some(false);
            b.0.settings.prefetch_factor = Some(2);
            // An ImageFolder whose transforms crop first: packed as stored.
            b.0.settings.folder_dataset = true;
            b.0.epochs = vec![crate::aggregate::EpochSummary::default(); 3];
            b.0.split.startup_wait_ms = 1500.0;
            b.0.images = 50 * 32;
            b
        }),
        (
            "pytorch spiky loader",
            with(compute_bound_gpu().step(25.0, 1.0, 100.0).spiky_wait(0.01, 80.0), |s| {
                s.settings.framework = "pytorch".into();
                s.settings.model = "train.py".into();
            }),
        ),
        ("pytorch tiny model", with(tiny_model(), |s| s.settings.framework = "pytorch".into())),
        ("keras pydataset", with(preprocess_one_worker().workers(0, 2), |s| s.settings.framework = "keras".into())),
        ("keras tiny model", with(tiny_model(), |s| s.settings.framework = "keras".into())),
        ("keras tf.data", {
            let mut b = B::new()
                .workers(0, 2)
                .device("cpu")
                .loader(&[("decode", 0.4, 1.0), ("transform", 6.8, 1.0)])
                .step(72.0, 0.0, 50.0);
            b.0.settings.framework = "keras".into();
            b.0.settings.tf_data = true;
            b
        }),
        (
            "io bound, storage share unknown",
            with(io_bound(), |s| {
                s.machine.read_bytes_per_s_mean = None;
                s.machine.syscall_read_bytes_per_s_mean = Some(4e6);
            }),
        ),
        ("io bound, on-cpu share assumed", {
            let mut b = io_bound();
            let n = b.0.split.steps * 32;
            b.set_stage(stage("read", 20.0, None, n));
            b
        }),
        (
            "io bound, stalled read",
            with(io_bound(), |s| {
                s.stalls.push(crate::aggregate::Stall {
                    thread: "loader-1".into(),
                    stage: "decode".into(),
                    file: "b/huge.png".into(),
                    open_s: 12.0,
                    abandoned: false,
                })
            }),
        ),
        ("preempted reads, steal", with(preempted_reads(), |s| s.machine.steal_mean_pct = Some(8.0))),
        ("preempted reads, unnamed others", preempted_reads().others(1.4, &[])),
        (
            "preempted reads, slow compute steps, model off",
            with(preempted_reads(), |s| {
                s.images_per_s *= 1.5;
                if let Some(c) = s.stages.iter_mut().find(|s| s.stage == Stage::Compute) {
                    c.p95_ms = 40.0;
                }
            }),
        ),
        (
            "transfer bound, bytes counted",
            with(transfer_bound(), |s| {
                if let Some(t) = s.stages.iter_mut().find(|s| s.stage == Stage::Transfer) {
                    t.bytes = 50 * 3 * 64 * 64 * 32 * 4;
                }
            }),
        ),
        ("pytorch transfer bound", with(transfer_bound(), |s| s.settings.framework = "pytorch".into())),
        (
            "jax folder on the training thread",
            with(folder_on_training_thread(), |s| s.settings.framework = "jax".into()),
        ),
        (
            "keras tf.data, preprocessing",
            with(preprocess_one_worker(), |s| {
                s.settings.framework = "keras".into();
                s.settings.tf_data = true;
            }),
        ),
        (
            "keras spiky loader",
            with(compute_bound_gpu().step(25.0, 1.0, 100.0).spiky_wait(0.01, 80.0), |s| {
                s.settings.framework = "keras".into()
            }),
        ),
        (
            "keras gpu unused",
            with(compute_bound_gpu().device("cpu").gpu(0.0, Some(false)), |s| s.settings.framework = "keras".into()),
        ),
        (
            "pytorch gpu unused",
            with(compute_bound_gpu().device("cpu").gpu(0.0, Some(false)), |s| s.settings.framework = "pytorch".into()),
        ),
    ]
}

/// The straggler verdicts' words: each rule of `ranks::judge`.
fn rank_scenarios() -> Vec<(&'static str, Vec<RankLine>)> {
    let line = |rank: u32, wait_ms: f64, compute_ms: f64, backward_ms: Option<f64>| {
        let step = wait_ms + compute_ms;
        RankLine {
            rank,
            local_rank: rank,
            world_size: 2,
            steps: 20,
            step_ms: step,
            wait_ms,
            wait_share: wait_ms / step,
            compute_ms,
            backward_ms,
            workers: 2,
            loader_busy: 0.75,
            ..Default::default()
        }
    };
    let no_loader = |mut l: RankLine| {
        l.workers = 0;
        l.loader_busy = 0.0;
        l
    };
    vec![
        ("input, inferred", vec![line(0, 6.0, 94.0, None), line(1, 41.0, 59.0, None)]),
        ("input, measured", vec![line(0, 6.0, 94.0, Some(50.0)), line(1, 41.0, 59.0, Some(15.0))]),
        ("input, no loader figures", vec![no_loader(line(0, 6.0, 94.0, None)), no_loader(line(1, 41.0, 59.0, None))]),
        ("input, three ranks", vec![line(0, 30.0, 70.0, None), line(1, 2.0, 98.0, None), line(2, 3.0, 97.0, None)]),
        ("compute", vec![line(0, 2.0, 98.0, Some(60.0)), line(1, 2.0, 98.0, Some(30.0))]),
        ("keep pace", vec![line(0, 2.0, 98.0, None), line(1, 2.5, 97.5, None)]),
        ("not together, waiting", vec![line(0, 1.0, 49.0, None), line(1, 60.0, 40.0, None)]),
        ("not together, computing", vec![line(0, 1.0, 49.0, None), line(1, 2.0, 98.0, None)]),
    ]
}

#[test]
fn the_diagnosis_text_of_every_scenario_is_unchanged() {
    let mut o = String::new();
    for (name, b) in scenarios() {
        o.push_str(&render(name, &b.verdict()));
        o.push('\n');
    }
    // A finished run's few steps: the verdict it gets at the end.
    let four =
        B::new().loader(&[("read", 0.1, 0.5), ("decode", 1.0, 1.0)]).step(1.0, 2.0, 500.0).params(42_500_000).steps(4);
    o.push_str(&render("finished after 4 steps", &diagnose_finished(&four.0)));
    for (name, lines) in rank_scenarios() {
        let _ = writeln!(o, "\n## ranks: {name}");
        match ranks::judge(&lines) {
            None => o.push_str("no verdict\n"),
            Some(v) => {
                let _ = writeln!(
                    o,
                    "straggler {:?}, cause {:?}, synchronised {}, sync {:?}",
                    v.straggler, v.cause, v.synchronised, v.sync
                );
                let _ = writeln!(o, "sync waits: {:?}", v.sync_wait_ms);
                let _ = writeln!(o, "headline: {}", v.headline);
                for e in &v.evidence {
                    let _ = writeln!(o, "evidence: {e}");
                }
                for a in &v.advice {
                    let _ = writeln!(o, "advice: {a}");
                }
            }
        }
    }
    insta::assert_snapshot!("diagnosis_text", o);
}

#[test]
fn a_model_file_is_named_whole_in_the_cache_command() {
    // The display name was split on spaces and its last word taken: `model.toml`.
    let b =
        with(io_bound(), |s| s.settings.model = crate::model_source::ModelSource::File("models/my model.toml".into()));
    let v = b.verdict();
    let cache = v.advice.iter().find(|a| matches!(a.change, Change::Cache { .. })).expect("cache advice");
    assert_eq!(
        cache.change.command().as_deref(),
        Some("pipeprof cache --model models/my model.toml --data /data/imgs --out data.ppk")
    );
}
