//! What a run's summary says of each part of the pipeline the model is made of
//! ([`super::model`]): the cores free to it, each loader stage's cost per image, the images a
//! step trains, the compute's step and CPU (fed or as measured; its waits behind other
//! programs and beside the loader's workers), the training process's serial work, how its
//! workers start, and [`Pipeline::from_summary`], which puts them together. Reads a
//! `Summary`; the model itself never does.

use super::estimates::*;
use super::model::*;
use super::thresholds::{MODERATE_WAIT_SHARE, OTHER_CORES};
use crate::aggregate::{StageSummary, Summary};
use probes::stage::Stage;
use probes::ThreadRole;

/// A stage's statistics, when it has at least one span.
pub fn measured(s: &Summary, stage: Stage) -> Option<&StageSummary> {
    s.stages.iter().find(|x| x.is(stage) && x.count > 0)
}

/// A stage's typical cost per span, ms: the trimmed mean where the summary has one, else the
/// mean.
fn robust_ms(x: &crate::aggregate::StageSummary) -> f64 {
    x.trimmed_mean_ms.filter(|t| t.is_finite()).unwrap_or(x.mean_ms).max(0.0)
}

/// Host samples a compute thread needs before its CPU time per step is trusted: its counters
/// are read at each sample, so the steps after the last one are not in them.
pub const MIN_WORK_SAMPLES: u64 = 3;

/// How much the compute pool's threads overlap in a hot step: the pool's CPU per step over the
/// step (calibrated by `scripts/calibrate.sh`: `docs/calibration-notes.md`).
pub const POOL_OVERLAP: f64 = 1.25;

/// CPU device: what a compute step costs when it runs back to back (hot), ms, from the
/// threads' schedstat: the compute pool's ([`ThreadRole::Compute`]) CPU per step over [`POOL_OVERLAP`];
/// where the pool hardly ran (under a quarter of the training thread's CPU: a tiny model's ops
/// stay on the calling thread), the training thread's, less its transfer (`transfer_ms`). A
/// step measured between waits for data is longer (threads wake, caches refill). `None`
/// without those threads, or with fewer than [`MIN_WORK_SAMPLES`] samples of them.
fn compute_work_ms(s: &Summary, transfer_ms: f64) -> Option<f64> {
    let threads: Vec<_> = s.machine.threads.iter().filter(|t| t.role.runs_the_model()).collect();
    if threads.is_empty() || s.steps == 0 || threads.iter().any(|t| t.samples < MIN_WORK_SAMPLES) {
        return None;
    }
    let per_step = |ns: u64| ns as f64 / 1e6 / s.steps as f64;
    let pool: Vec<_> = threads.iter().filter(|t| t.role != ThreadRole::Train).collect();
    let pool_ms = per_step(pool.iter().map(|t| t.sched_cpu_ns.unwrap_or(0)).sum()) / POOL_OVERLAP;
    let train_ms =
        per_step(threads.iter().filter(|t| t.role == ThreadRole::Train).map(|t| t.sched_cpu_ns.unwrap_or(0)).sum());
    let ms = if pool_ms * POOL_OVERLAP * 4.0 >= train_ms { pool_ms } else { train_ms - transfer_ms.max(0.0) };
    (ms > 0.0).then_some(ms)
}

/// CPU device, a loop that waits for data: the hot step a faster-fed loop would get, ms: the
/// lesser ([`hot_step_ms`]) of two readings of the same work from the threads' schedstat, each
/// inflated by a cold step in its own way: the compute pool's CPU per step over
/// [`POOL_OVERLAP`] ([`compute_work_ms`]; its threads wake and spin for work that does not
/// come) and the training thread's CPU per step less its transfer (its own dispatch and
/// spinning), the latter only while it is at least [`TRAIN_CARRIES`] of the pool's (below,
/// the training thread dispatches and waits: its CPU is no reading of the step). The
/// measurements behind the rule: `docs/calibration-notes.md`. `None` as for
/// [`compute_work_ms`].
pub fn hot_compute_ms(s: &Summary, transfer_ms: f64) -> Option<f64> {
    let work = compute_work_ms(s, transfer_ms)?;
    let train: Vec<_> = s.machine.threads.iter().filter(|t| t.role == ThreadRole::Train).collect();
    let train_ms = (!train.is_empty())
        .then(|| train.iter().map(|t| t.sched_cpu_ns.unwrap_or(0)).sum::<u64>() as f64 / 1e6 / s.steps as f64)
        .map(|t| t - transfer_ms.max(0.0));
    Some(hot_step_ms(work, train_ms))
}

/// CPU device: how much of a compute step (`compute_ms`) was waiting for a core behind other
/// programs, ms per step. The compute pool's threads ([`ThreadRole::Compute`]) waited a share `w` of the
/// time they were ready to run (their schedstat, from the sampler); that share of the step,
/// but never below the compute's own CPU time per step ([`compute_work_ms`]), is split between
/// the competitors by the cores each kept busy: other programs' (the median sampled), the
/// loader's (its CPU per image × the measured rate) and compute's own threads'. 0 when not
/// sampled.
pub fn compute_core_wait(s: &Summary, p: &Pipeline, compute_ms: f64) -> f64 {
    let (mut wait, mut cpu, mut cores_used) = (0u64, 0u64, 0.0f64);
    for t in s.machine.threads.iter().filter(|t| t.role.runs_the_model()) {
        cores_used += f64::from(t.cpu_mean_pct) / 100.0;
        if let (Some(w), Some(c)) = (t.core_wait_ns, t.sched_cpu_ns) {
            if matches!(t.role, ThreadRole::Compute(_)) {
                wait = wait.saturating_add(w);
                cpu = cpu.saturating_add(c);
            }
        }
    }
    if wait == 0 || compute_ms <= 0.0 {
        return 0.0;
    }
    let share = wait as f64 / (wait + cpu) as f64;
    let loader = p.loader_cpu_ms() * s.images_per_s.max(0.0) / 1000.0;
    let others = (p.cores - p.free_cores).max(0.0);
    let all = loader + others + cores_used;
    if all <= 0.0 {
        return 0.0;
    }
    let work_ms = compute_work_ms(s, p.transfer_ms).unwrap_or(cpu as f64 / 1e6 / s.steps.max(1) as f64);
    let stretch = (compute_ms * share).min((compute_ms - work_ms).max(0.0));
    stretch * others / all
}

/// CPU device, compute threads not sampled (a Python program: `pipeprof run`, `attach`): the
/// compute's CPU per image, ms, from what was measured instead of assumed: the program's whole
/// process tree (its workers too) used `process_cpu_training_pct` of a core while it trained,
/// so its CPU per image is that over its training rate (else `process_cpu_mean_pct` × the
/// run's time / its images, start-up included: a PyTorch import is seconds of CPU); less the loader's own CPU per image,
/// the rest is the training loop's. A PyTorch script at one compute thread keeps one core busy
/// in its loop body, not every free one (`docs/calibration-notes.md`).
/// `None` without a process sample, images or time, or when the loader's CPU is all of it.
fn tree_compute_cpu_ms(s: &Summary, loader: &[StageCost]) -> Option<f64> {
    let tree_ms = tree_cpu_ms(s)?;
    let loader_ms: f64 = loader.iter().map(|x| x.on_cpu_ms).sum();
    finite_pos(tree_ms - loader_ms)
}

/// The program's process tree's CPU per image while it trained, ms (see
/// [`tree_compute_cpu_ms`]); `None` without a process sample, images or time.
fn tree_cpu_ms(s: &Summary) -> Option<f64> {
    tree_cpu_ms_at(s, s.images_per_s)
}

/// The same at a training rate of `rate` images/s.
fn tree_cpu_ms_at(s: &Summary, rate: f64) -> Option<f64> {
    let m = &s.machine;
    match m.process_cpu_training_pct.map(f64::from) {
        // While it trained, at its training rate: the start-up's CPU (imports, a framework's
        // first compile) is not the steps'.
        Some(pct) if pct.is_finite() && pct > 0.0 && rate > 0.0 => Some(pct / 100.0 * 1000.0 / rate),
        _ => {
            let pct = f64::from(m.process_cpu_mean_pct?);
            (pct.is_finite() && pct > 0.0 && s.images > 0 && s.elapsed_s > 0.0)
                .then(|| pct / 100.0 * s.elapsed_s * 1000.0 / s.images as f64)
        }
    }
}

/// Images of the training steps TensorFlow's host-trace windows covered, when it sampled any.
fn traced_images(s: &Summary) -> Option<f64> {
    let t = s.settings.tf_trace?;
    (t.sampled_steps > 0).then(|| t.sampled_steps as f64 * s.settings.batch_size.max(1) as f64)
}

/// The run's cores (logical: its own limit, else the machine's), its physical cores (at most
/// those; all of them when not read), and the cores this process could use: what it uses plus
/// what nobody uses, capped by its limit: the cores less the other programs' typical (median)
/// load, so one busy moment does not move every prediction; the means where no series was kept.
fn cores_of(s: &Summary) -> (f64, f64, f64) {
    let m = &s.machine;
    let cores = if s.settings.cores > 0 { s.settings.cores } else { m.cores.max(1) } as f64;
    let free = match (m.other_cores_median, m.process_cpu_mean_pct, m.global_cpu_mean_pct) {
        (Some(others), _, _) if m.cores > 0 => (m.cores as f64 - f64::from(others)).clamp(0.1, cores),
        (None, Some(p), Some(g)) if m.cores > 0 => {
            let idle = m.cores as f64 * (1.0 - f64::from(g) / 100.0).max(0.0);
            (f64::from(p) / 100.0 + idle).clamp(0.1, cores)
        }
        _ => cores,
    };
    // At least the cores the process used while it trained: a median of the others' load
    // beside a mean of its own can leave it fewer than it had.
    let used = m.process_cpu_training_pct.map(|p| f64::from(p) / 100.0).filter(|u| u.is_finite());
    let free = free.max(used.unwrap_or(0.0)).min(cores);
    let physical = match m.physical_cores {
        Some(n) if n > 0 => (n as f64).min(cores),
        _ => cores,
    };
    (cores, physical, free)
}

/// The loader stages (`Stage::is_loader`) with at least one span, in pipeline order, each
/// costed per image: its typical span ([`robust_ms`]: one slow file does not move it); `fetch`
/// and `collate` are timed once per batch, so their cost per image is a span over the batch;
/// a tf.data function's runs are an element's or a whole batch's, so what they cost an image
/// is their total over the images of the sampled steps. The on-CPU share where measured, else
/// assumed from the name (read off-CPU, the others on-CPU).
pub fn loader_costs(s: &Summary) -> Vec<StageCost> {
    Stage::ALL
        .iter()
        .filter(|x| x.is_loader())
        .filter_map(|&stage| {
            let x = measured(s, stage)?;
            let assumed = if stage == Stage::Read { 0.0 } else { 1.0 };
            let share = x.on_cpu.unwrap_or(assumed).clamp(0.0, 1.0);
            let waiting = x.core_wait.unwrap_or(0.0).clamp(0.0, 1.0 - share);
            let per_span =
                if matches!(stage, Stage::Fetch | Stage::Collate) { s.settings.batch_size.max(1) as f64 } else { 1.0 };
            let wall = match traced_images(s) {
                Some(images) if stage == Stage::Transform => x.total_ms / images,
                _ => robust_ms(x) / per_span,
            };
            Some(StageCost {
                stage,
                wall_ms: wall,
                on_cpu_ms: wall * share,
                core_wait_ms: wall * waiting,
                measured: x.on_cpu.is_some(),
                queue_measured: x.on_cpu.is_some() && x.core_wait.is_some(),
            })
        })
        .collect()
}

/// Images per step as trained: the batch size, or fewer where the data set (or each epoch's
/// last batch) is smaller: 24 images at batch 32 train 24 a step, and the compute's rate is
/// 24 over the step, not 32.
fn trained_batch(s: &Summary) -> f64 {
    let nominal = s.settings.batch_size.max(1) as f64;
    if s.steps > 0 && s.images > 0 {
        (s.images as f64 / s.steps as f64).min(nominal)
    } else {
        nominal
    }
}

/// A part of the step (`stage`, `split_ms` in the split), ms: the steady state's; over the
/// whole run (no change of workers), its trimmed mean, which leaves a one-off first step and
/// the odd preempted one out.
fn step_part(s: &Summary, stage: Stage, split_ms: f64) -> f64 {
    match (s.split.from_step, measured(s, stage)) {
        (None, Some(x)) => robust_ms(x).min(split_ms.max(0.0)),
        _ => split_ms.max(0.0),
    }
}

/// CPU device, a loop that waits for data ([`MODERATE_WAIT_SHARE`]): the step a change that
/// feeds it faster gets ([`hot_compute_ms`]): steps that wait compute cold (the pool's threads
/// wake, caches refill) and behind the loader's threads. Not while other programs hold
/// [`OTHER_CORES`]: they keep taking what they took, and the step measured stays.
pub fn fed_compute_ms(s: &Summary, cpu_device: bool, others_cores: f64, transfer_ms: f64) -> Option<f64> {
    let waits = s.split.wait_share >= MODERATE_WAIT_SHARE;
    (cpu_device && waits && others_cores < OTHER_CORES).then(|| hot_compute_ms(s, transfer_ms)).flatten()
}

/// The compute step a change would get, ms, and the share of the measured step it is (what
/// the compute's CPU per image, measured cold too, shrinks by): the fed step
/// ([`fed_compute_ms`]) where shorter than the step measured ([`step_part`]), else that and 1.
pub fn compute_step(s: &Summary, cpu_device: bool, others_cores: f64, transfer_ms: f64) -> (f64, f64) {
    let measured_ms = step_part(s, Stage::Compute, s.split.compute_ms);
    match fed_compute_ms(s, cpu_device, others_cores, transfer_ms).filter(|&w| w < measured_ms) {
        Some(fed) => (fed, fed / measured_ms),
        None => (measured_ms, 1.0),
    }
}

/// CPU device, other programs holding [`OTHER_CORES`]: the compute's slow steps (its p95), ms,
/// when slower than `compute_ms` (see [`Pipeline::compute_slow_ms`]).
fn slow_compute_ms(s: &Summary, cpu_device: bool, others_cores: f64, compute_ms: f64) -> Option<f64> {
    measured(s, Stage::Compute)
        .map(|x| x.p95_ms)
        .filter(|&slow| cpu_device && others_cores >= OTHER_CORES && slow.is_finite() && slow > compute_ms)
}

/// The threads a run's compute holds the cores with: as the run said
/// (`torch.get_num_threads()`), else the compute threads the sampler saw, else every core
/// (PyTorch's, TensorFlow's and JAX's default).
pub fn compute_threads(s: &Summary, cores: f64) -> usize {
    if let Some(t) = s.settings.compute_threads.filter(|t| *t > 0) {
        return t;
    }
    let seen = s.machine.threads.iter().filter(|t| matches!(t.role, ThreadRole::Compute(_))).count();
    if seen > 0 {
        seen
    } else {
        cores as usize
    }
}

/// CPU device: the compute's CPU per image as measured, ms: the compute pool's and the
/// training thread's mean CPU use × the step time, where sampled; else the process tree's
/// less the loader's ([`tree_compute_cpu_ms`]), at most every free core through each step.
pub fn compute_cpu_ms(s: &Summary, loader: &[StageCost], batch: f64, free_cores: f64) -> f64 {
    let cores_used: f64 =
        s.machine.threads.iter().filter(|t| t.role.runs_the_model()).map(|t| f64::from(t.cpu_mean_pct) / 100.0).sum();
    if cores_used > 0.0 {
        return (cores_used * s.split.mean_step_ms).max(0.0) / batch;
    }
    // Every free core busy while it computes is all the compute can take: a loop that waits
    // burns CPU between its steps too (threads spinning for work that does not come, the
    // start-up), which a tree's CPU counts.
    let all_cores = (s.split.compute_ms * free_cores).max(0.0) / batch;
    tree_compute_cpu_ms(s, loader).map_or(all_cores, |t| t.min(all_cores))
}

/// Training on the CPU in a framework's program (`cpu_device`), `n` loader worker processes
/// beside its compute threads ([`compute_threads`]) outnumber the `cores`. pipeprof's own loop
/// is not counted: its workers are threads beside a rayon pool, whose waits for a core the
/// sampler measures ([`compute_core_wait`]).
pub fn oversubscribed(s: &Summary, cpu_device: bool, cores: f64, n: usize) -> bool {
    cpu_device && !s.settings.framework.is_own() && compute_threads(s, cores) + n > cores as usize
}

/// The training process's serial work per batch ([`main_per_batch_ms`]) where it receives its
/// batches: pipeprof's own loader hands them over an in-process channel, without a copy; a
/// framework's workers are processes whose batches the training process receives; tf.data
/// hands its batches over inside the step's own graph, from its own threads. `busy_ms`: the
/// step's transfer and compute.
fn serial_main_ms(s: &Summary, loader_wall_ms: f64, batch: f64, busy_ms: f64) -> f64 {
    let st = &s.settings;
    let receives = (st.workers == 0 || !st.framework.is_own()) && !st.tf_data;
    if !receives {
        return 0.0;
    }
    let wait_p50 = measured(s, Stage::Wait).map_or(s.split.wait_ms, |w| w.p50_ms);
    main_per_batch_ms(st.workers, s.split.wait_ms, wait_p50, loader_wall_ms, batch, busy_ms)
}

/// A CPU run's compute CPU per image, as the pipeline holds it: (the part that shrinks with
/// the step, the part spent beside the loader's CPU). Measured cold (`cold` < 1), its CPU per
/// image shrinks with the step; the rest was spent beside the loader's CPU, and stays with it
/// (`Pipeline::compute_cpu_beside_ms`). Under TensorFlow's sampled trace, the process tree's
/// CPU bounds it with the loader's (`loader` adjusted in place).
fn compute_cpu_parts(s: &Summary, loader: &mut [StageCost], batch: f64, free_cores: f64, cold: f64) -> (f64, f64) {
    let all = compute_cpu_ms(s, loader, batch, free_cores);
    let mut per_image = all * cold;
    if s.settings.tf_data && s.settings.tf_trace.is_some() {
        // The process's CPU from its first step's end on, over the rate from there: the first
        // step (TensorFlow's compile) in neither.
        let steady = super::now::measured_now(s).map_or(s.images_per_s, |n| n.rate);
        if let Some(tree) = tree_cpu_ms_at(s, steady) {
            per_image = traced_cpu_within_tree(loader, per_image, tree);
        }
    }
    (per_image, all * (1.0 - cold))
}

impl Pipeline {
    /// The pipeline a run's summary describes, part by part: its cores ([`cores_of`]), its
    /// loader's stages per image ([`loader_costs`]), the images a step trains
    /// ([`trained_batch`]), the compute's CPU, the step's parts ([`step_part`], the fed step
    /// [`compute_step`], the slow steps [`slow_compute_ms`]), the training process's serial
    /// work ([`serial_main_ms`]) and how its workers start ([`worker_start_ms`]).
    pub fn from_summary(s: &Summary) -> Pipeline {
        let st = &s.settings;
        let (cores, physical_cores, free_cores) = cores_of(s);
        let mut loader = loader_costs(s);
        let cpu_device = s.trains_on_cpu();
        let batch = trained_batch(s);
        let transfer_ms = step_part(s, Stage::Transfer, s.split.transfer_ms);
        let others_cores = (cores - free_cores).max(0.0);
        let (compute_ms, cold) = compute_step(s, cpu_device, others_cores, transfer_ms);
        let (compute_cpu_ms_per_image, compute_cpu_beside_ms) =
            if cpu_device { compute_cpu_parts(s, &mut loader, batch, free_cores, cold) } else { (0.0, 0.0) };
        let loader_wall: f64 = loader.iter().map(|x| x.wall_ms).sum();
        let k = cpu_cores(cores, physical_cores);
        let mut p = Pipeline {
            // tf.data's map runs beside the step on its own threads (AUTOTUNE's parallelism).
            workers: if st.tf_data { cores } else { st.workers.max(1) as f64 },
            in_process: st.workers == 0 && !st.tf_data,
            cores,
            physical_cores,
            free_cores,
            main_per_batch_ms: serial_main_ms(s, loader_wall, batch, transfer_ms + compute_ms),
            persistent: st.persistent_workers.unwrap_or(true),
            epoch_batches: (st.images > 0 && s.split.startup_wait_ms > 0.0)
                .then(|| (st.images as f64 / st.batch_size.max(1) as f64).ceil()),
            run_batches: (s.steps > 0 && s.split.startup_wait_ms > 0.0).then_some(s.steps as f64),
            worker_start_ms: worker_start_ms(st.workers, s.split.startup_wait_ms, loader_wall, batch, k),
            cpu_device,
            batch,
            loader,
            transfer_ms,
            compute_ms,
            optimizer_ms: measured(s, Stage::Optimizer).map(|x| x.mean_ms),
            compute_cpu_ms_per_image,
            input_bytes: st.input.iter().product::<usize>() as f64,
            compute_wait_others_ms: 0.0,
            compute_beside_ms: 0.0,
            beside_loader_cpu_ms: 0.0,
            compute_cpu_beside_ms,
            compute_slow_ms: slow_compute_ms(s, cpu_device, others_cores, compute_ms),
            cold_cpu: st.cold_cpu.map_or(1.0, |c| c.factor()),
            packed_transform_ms: st.cold_cpu.and_then(|c| c.packed_ms),
            loop_waits: s.split.wait_share >= MODERATE_WAIT_SHARE,
        };
        p.compute_wait_others_ms = if cpu_device { compute_core_wait(s, &p, compute_ms) } else { 0.0 };
        let beside_workers = if st.tf_data { 0 } else { st.workers };
        p.beside_loader_cpu_ms = p.loader_cpu_ms();
        p.compute_beside_ms = compute_beside_ms(
            oversubscribed(s, cpu_device, cores, beside_workers),
            beside_workers,
            p.beside_loader_cpu_ms,
            batch,
            s.split.compute_share,
            compute_ms,
        );
        p
    }
}
