//! `pipeprof profile`: wire probes → channel → collector → aggregate → report around a real
//! loader and training loop.
//!
//! [`options`] checks every flag before anything happens; [`setup`] opens the data and names
//! the run; this file is the run's source for the [`session`]: the Layer, the samplers, the
//! stall watchdog and the trainer; and its ending: the report and why it failed.

pub mod check;
pub mod options;
mod setup;

pub use options::Options;

use crate::report;
use crate::session::{self, Out, Running, SecondInterrupt, Session, TraceSpec};
use anyhow::bail;
use crossbeam_channel::Receiver;
use pipeprof_core::aggregate::settings::{clean_name, MAX_NAME};
use pipeprof_core::aggregate::RunSettings;
use pipeprof_core::config;
use pipeprof_core::diagnose::Diagnosed;
use pipeprof_trainer::progress;
use pipeprof_trainer::train;
use probes::{Event, Probe, ProbeLayer, ThreadRole};
use setup::Prepared;
use std::thread::JoinHandle;
use tracing_subscriber::layer::SubscriberExt;

/// The training thread's result: how the loop ended.
type Trainer = JoinHandle<anyhow::Result<Trained>>;

/// How the loop ended, and the classes whose images all failed to load.
struct Trained {
    outcome: train::TrainOutcome,
    never_loaded: Vec<(String, usize)>,
}

/// A finished profile run.
pub struct Finished {
    /// The final summary with its verdict.
    pub done: Diagnosed,
    /// The data the run read (`--data`, or the demo set).
    pub data: std::path::PathBuf,
    /// Stopped early (Ctrl-C, q): the summary covers the steps done so far.
    pub interrupted: bool,
}

/// Runs `pipeprof profile`.
pub fn run(opts: &Options) -> anyhow::Result<Finished> {
    opts.validate()?;
    // Bound before anything starts: a taken port fails here, not mid-run.
    let metrics = opts
        .metrics
        .metrics_listen
        .as_deref()
        .map(|a| crate::metrics::bind(a, opts.metrics.metrics_allow_remote))
        .transpose()?;
    let (mut cfg, model) = config::load_model(opts.model.as_deref())?;
    let model_name = model.to_string();
    opts.apply(&mut cfg);
    let dev = train::device::parse_device(&opts.device)?;
    // Before any thread starts: the allocator setting covers every thread's allocations only
    // when no thread has taken an arena of its own yet.
    train::device::keep_freed_memory(&dev);
    name_compute_threads();
    let data = setup::prepare(opts, &cfg, &model)?;
    let plan = plan(opts, &cfg, &model_name, &data)?;
    let settings = setup::settings(opts, &cfg, model, &data, plan.workers, plan.cores, plan.params);
    for s in &settings.simulated {
        progress::say(&format!("pipeprof: simulation on: {s}"));
    }
    let mut running = start_session(opts, &data, settings, metrics)?;
    let probe = running.probe().clone();
    measure_spans(&probe);
    pipeprof_trainer::data::loader::inject_panic_at_step(opts.panic_in_loader_at_step);
    let samplers = start_samplers(opts, &probe);
    let trainer = spawn_trainer(opts, &cfg, &data, plan, dev, &running)?;
    let (watchdog_tx, watchdog_rx) = crossbeam_channel::bounded::<()>(0);
    let watchdog = spawn_watchdog(opts.stall_after(), &probe, running.out(), watchdog_rx);
    running.show();
    // Whatever happened to training, the collector finishes: the trace gets closed and the
    // report covers what was measured.
    let outcome = trainer.join().map_err(|p| {
        anyhow::anyhow!(
            "the training thread panicked in the training loop: {}",
            pipeprof_trainer::data::loader::panic_message(&*p)
        )
    });
    drop(watchdog_tx);
    if let Some(w) = watchdog {
        let _ = w.join();
    }
    let died = samplers.and_then(|s| s.stop().died);
    let outcome = match (outcome, died) {
        (Ok(Ok(_)), Some(name)) => {
            Err(anyhow::anyhow!("the {name} thread panicked (its message is above): machine sampling stopped there"))
        }
        (o, _) => o,
    };
    // A failed run says so in the trace, before the collector closes it.
    let failed = failure_text(&outcome);
    running.close(failed.as_deref());
    finish(&data, running.finish(failed), outcome)
}

/// candle computes on rayon's global pool; named threads, each with its role, make its CPU
/// use visible (they would otherwise inherit the name of the thread that started the pool).
fn name_compute_threads() {
    let _ = rayon::ThreadPoolBuilder::new()
        .thread_name(|i| ThreadRole::Compute(i as u32).thread_name())
        .start_handler(|i| probes::set_thread_role(ThreadRole::Compute(i as u32)))
        .build_global();
}

/// Stage spans into `probe`, through the Layer as the process's tracing subscriber (or a
/// warning, when another is installed already).
fn measure_spans(probe: &probes::Probe) {
    let subscriber = tracing_subscriber::registry().with(ProbeLayer::new(probe.clone()));
    if tracing::subscriber::set_global_default(subscriber).is_err() {
        progress::warn("a tracing subscriber is already installed: stage spans will not be measured");
    }
}

/// The run's loader workers (and whether `auto` adjusts them), the cores, the model's size.
struct Plan {
    workers: usize,
    auto_workers: Option<train::auto::AutoWorkers>,
    cores: usize,
    params: usize,
}

/// The model's shapes checked against the data and the device's memory, the worker count, and
/// the run's head printed.
fn plan(opts: &Options, cfg: &config::ModelConfig, model_name: &str, data: &Prepared) -> anyhow::Result<Plan> {
    let samples = data.train.samples();
    let shapes = cfg.infer_shapes(samples.classes().len()).map_err(|e| anyhow::anyhow!("{model_name}: {e}"))?;
    let params: usize = shapes.iter().map(|l| l.params).sum();
    setup::check_memory(&shapes, cfg, &opts.device, model_name)?;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    // `auto`: start with one worker and let the measured wait decide (train::auto).
    let auto_workers = (cfg.data.workers == config::Workers::Auto).then(|| train::auto::AutoWorkers::new(cores));
    let workers = match &auto_workers {
        Some(a) => a.initial(),
        None => cfg.data.workers.resolve(cores),
    };
    // Class names are folder names (or a cache's copy of them): cleaned, one line.
    let classes: Vec<String> = samples.classes().iter().map(|c| clean_name(c, MAX_NAME)).collect();
    let mut head =
        format!("Model: {}  ·  {} classes: {}\n", clean_name(model_name, MAX_NAME), classes.len(), classes.join(", "));
    head.push_str(&train::shapes::summary_table(&shapes, &cfg.input));
    if cfg.augment.is_on() {
        head.push_str(&format!("Augmentation (training only): {}\n", cfg.augment.describe()));
    }
    if let Some(v) = &data.val {
        head.push_str(&format!(
            "Validation: {} images after every epoch, {} for training\n",
            v.samples.len(),
            samples.len()
        ));
    }
    // A closed stdout (`| head -1`) costs nothing: the run, its summary and trace go on.
    progress::out(&format!("{head}\n"));
    Ok(Plan { workers, auto_workers, cores, params })
}

/// Why the run failed, if it did: a thread that panicked or returned an error.
fn failure_text(outcome: &anyhow::Result<anyhow::Result<Trained>>) -> Option<String> {
    match outcome {
        Ok(Ok(_)) => None,
        Ok(Err(e)) | Err(e) => Some(format!("{e:#}")),
    }
}

/// The run's session: the trace (if asked for), the summary file, the data's filesystem,
/// `/metrics`, the view; a second interrupt exits at once.
fn start_session(
    opts: &Options,
    data: &Prepared,
    settings: RunSettings,
    metrics: Option<crate::metrics::Listener>,
) -> anyhow::Result<Running> {
    let title = format!("pipeprof: {}", settings.model);
    let trace =
        opts.trace.as_deref().map(|path| TraceSpec { path, title: &title, level: opts.trace_level, per_rank: false });
    let mut session = Session::new(settings, SecondInterrupt::ExitsAtOnce)
        .capacity(opts.channel_capacity)
        .trace(trace)?
        .summary(opts.summary.clone())
        .html(opts.html.clone())
        .metrics(metrics)
        .no_tui(opts.no_tui);
    let data_fs = probes::fsinfo::detect(&data.dir);
    if data_fs.kind.is_remote_or_fuse() {
        progress::say(&format!(
            "note: {} is on a {} filesystem ({}): every image read may be a network round trip",
            data.dir.display(),
            data_fs.kind,
            data_fs.fs_type
        ));
    }
    session.aggregate().set_data_fs(data_fs);
    session.start()
}

/// How often the watchdog looks at the loader's open work.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// The stall watchdog: names a loader stage open longer than `after` (on the progress line,
/// and through the channel into the live view, report, summary and trace), until `stop` is
/// dropped.
fn spawn_watchdog(after: std::time::Duration, probe: &Probe, out: Out, stop: Receiver<()>) -> Option<JoinHandle<()>> {
    let probe = probe.clone();
    let threshold = u64::try_from(after.as_nanos()).unwrap_or(u64::MAX);
    let spawned = std::thread::Builder::new().name("pp-watchdog".into()).spawn(move || {
        let mut named = std::collections::HashSet::new();
        while let Err(crossbeam_channel::RecvTimeoutError::Timeout) = stop.recv_timeout(WATCH_EVERY) {
            let now = probes::clock::now_ns();
            for (w, open_ns) in
                pipeprof_trainer::data::watch::stalled(&pipeprof_trainer::data::watch::open_work(), now, threshold)
            {
                let stall = pipeprof_core::aggregate::Stall {
                    thread: w.thread.clone(),
                    stage: w.stage.name().into(),
                    file: w.file.clone(),
                    open_s: open_ns as f64 / 1e9,
                    abandoned: false,
                };
                // Named once per stall on the progress line; the live view shows it as a flag.
                if named.insert((w.thread.clone(), w.since_ns)) {
                    out.note(&pipeprof_core::diagnose::stall_words(&stall));
                }
                probe.send(Event::Stalled {
                    thread: w.thread.into_boxed_str(),
                    stage: w.stage,
                    file: w.file.into_boxed_str(),
                    open_ns,
                    abandoned: false,
                });
            }
        }
    });
    match spawned {
        Ok(h) => Some(h),
        Err(e) => {
            progress::warn(&format!("no stall watchdog ({e}): a read that never returns will not be named"));
            None
        }
    }
}

/// Host and GPU sampling, or a warning and none.
fn start_samplers(opts: &Options, probe: &Probe) -> Option<probes::sampler::SamplerHandle> {
    let cfg = probes::sampler::SamplerConfig {
        hz: opts.sample_hz,
        gpu: !opts.no_gpu,
        ..probes::sampler::SamplerConfig::default()
    };
    match probes::sampler::start(probe.clone(), cfg) {
        Ok(h) => Some(h),
        Err(e) => {
            progress::warn(&format!("machine sampling is off: {e}"));
            None
        }
    }
}

/// The loader's settings for the training set: the model's input, the run's batches and workers.
fn loader_config(opts: &Options, cfg: &config::ModelConfig, workers: usize) -> pipeprof_trainer::data::LoaderConfig {
    pipeprof_trainer::data::LoaderConfig {
        height: cfg.input.height as u32,
        width: cfg.input.width as u32,
        channels: cfg.input.channels,
        batch_size: cfg.train.batch_size,
        workers,
        prefetch: cfg.data.prefetch,
        shuffle: cfg.data.shuffle,
        seed: cfg.data.seed,
        epochs: cfg.train.epochs,
        max_steps: opts.steps,
        throttle: opts.throttle_read,
        slow: opts.slow.clone(),
        augment: cfg.augment.clone(),
    }
}

/// The `train` thread: the loader and the training loop, until done or the run's stop; fires
/// the session's `done` when it ends.
fn spawn_trainer(
    opts: &Options,
    cfg: &config::ModelConfig,
    data: &Prepared,
    plan: Plan,
    dev: candle_core::Device,
    running: &Running,
) -> anyhow::Result<Trainer> {
    let loader_cfg = loader_config(opts, cfg, plan.workers);
    let val = data.val.clone().map(|v| train::Validation {
        ds: std::sync::Arc::new(v),
        loader: pipeprof_trainer::data::LoaderConfig {
            shuffle: false,
            epochs: 1,
            max_steps: None,
            augment: config::Augment::default(),
            ..loader_cfg.clone()
        },
    });
    let samples = data.train.samples();
    let classes = samples.classes().len();
    let hooks =
        train::Hooks { panic_at_step: opts.panic_at_step, slow: opts.slow.clone(), auto_workers: plan.auto_workers };
    let (probe, cfg, done, stop) = (running.probe().clone(), cfg.clone(), running.done(), running.stop());
    Ok(std::thread::Builder::new().name(ThreadRole::Train.thread_name()).spawn(move || {
        probes::set_thread_role(ThreadRole::Train);
        let result = (|| {
            let mut loader = pipeprof_trainer::data::Loader::start(samples, loader_cfg, probe.clone())?;
            let outcome = train::train(&cfg, classes, &dev, &mut loader, val.as_ref(), &probe, stop.flag(), &hooks)?;
            Ok(Trained { outcome, never_loaded: loader.classes_never_loaded() })
        })();
        let _ = done.send(());
        result
    })?)
}

/// The report and the outcome's messages; the summary file was written by the session, first.
fn finish(
    data: &Prepared,
    fin: session::Finished,
    outcome: anyhow::Result<anyhow::Result<Trained>>,
) -> anyhow::Result<Finished> {
    let session::Finished { done, failed, collector_died, written } = fin;
    progress::out(&report::render(&done));
    if let Some(why) = &failed {
        progress::say(&format!("pipeprof: RUN FAILED: {why}"));
        progress::say("pipeprof: the report above covers the steps done before the failure");
    }
    written?;
    if collector_died.is_some() {
        bail!("{}", failed.unwrap_or_default());
    }
    let Trained { outcome, never_loaded } = outcome??;
    for (class, failed) in &never_loaded {
        progress::warn(&format!(
            "class {class}: none of its images could be loaded ({failed} tried, all skipped: see the list above): \
             the model has an output for a class it never saw; fix or remove {}",
            data.dir.join(class).display()
        ));
    }
    if outcome.interrupted {
        progress::say("pipeprof: stopped early: the report covers the steps done so far");
    }
    // The loop's own count, not the events': those may have been dropped.
    if outcome.images == 0 && !outcome.interrupted {
        bail!(
            "no usable images in {}: {} files were skipped (see the list above)",
            done.summary.settings.data,
            done.summary.skipped_count
        );
    }
    Ok(Finished { done, data: data.dir.clone(), interrupted: outcome.interrupted })
}
