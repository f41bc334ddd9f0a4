//! `pipeprof profile`: wire probes → channel → collector → aggregate → report around a real
//! loader and training loop.
//!
//! [`options`] checks every flag before anything happens; [`setup`] opens the data and names
//! the run; this file starts the probes, the collector, the samplers and the trainer, shows
//! the run, and finishes it.

pub mod options;
mod setup;

pub use options::Options;

use crate::aggregate::settings::{clean_name, MAX_NAME};
use crate::aggregate::{Aggregator, RunSettings};
use crate::diagnose::Diagnosed;
use crate::export::{chrome::ChromeTrace, Exporter};
use crate::session::{self, Latest};
use crate::{config, progress, report, signal, train};
use anyhow::{bail, Context};
use crossbeam_channel::Receiver;
use probes::{Event, Probe, ProbeLayer, ThreadRole};
use setup::Prepared;
use std::sync::{Arc, OnceLock};
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
    let metrics =
        opts.metrics_listen.as_deref().map(|a| crate::metrics::bind(a, opts.metrics_allow_remote)).transpose()?;
    let (mut cfg, model_name) = config::load_model(opts.model.as_deref())?;
    opts.apply(&mut cfg);
    let dev = train::parse_device(&opts.device)?;
    // Before any thread starts: the allocator setting covers every thread's allocations only
    // when no thread has taken an arena of its own yet.
    train::keep_freed_memory(&dev);
    // candle computes on rayon's global pool; named threads make its CPU use visible (they
    // would otherwise inherit the name of the thread that started the pool).
    let _ = rayon::ThreadPoolBuilder::new()
        .thread_name(|i| ThreadRole::Compute(i as u32).thread_name())
        .start_handler(|i| probes::set_thread_role(ThreadRole::Compute(i as u32)))
        .build_global();
    let data = setup::prepare(opts, &cfg, &model_name)?;
    let samples = data.train.samples();
    let shapes = cfg.infer_shapes(samples.classes().len()).map_err(|e| anyhow::anyhow!("{model_name}: {e}"))?;
    let params: usize = shapes.iter().map(|l| l.params).sum();
    setup::check_memory(&shapes, &cfg, &opts.device, &model_name)?;
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
        format!("Model: {}  ·  {} classes: {}\n", clean_name(&model_name, MAX_NAME), classes.len(), classes.join(", "));
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
    let settings = setup::settings(opts, &cfg, model_name, &data, workers, cores, params);
    for s in &settings.simulated {
        progress::say(&format!("pipeprof: simulation on: {s}"));
    }

    let (probe, rx) = Probe::new(opts.channel_capacity);
    let subscriber = tracing_subscriber::registry().with(ProbeLayer::new(probe.clone()));
    if tracing::subscriber::set_global_default(subscriber).is_err() {
        progress::warn("a tracing subscriber is already installed: stage spans will not be measured");
    }
    signal::install();
    crate::data::loader::inject_panic_at_step(opts.panic_in_loader_at_step);
    let (collector, failure_slot) = start_collector(opts, &data, settings, &probe, rx)?;
    let _metrics = session::serve_metrics(metrics, &collector.1);
    let samplers = start_samplers(opts, &probe);
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
    let trainer = start_trainer(opts, &cfg, &data, workers, auto_workers, dev, &probe, done_tx)?;
    let (watchdog_tx, watchdog_rx) = crossbeam_channel::bounded::<()>(0);
    let watchdog = start_watchdog(opts.stall_after(), &probe, watchdog_rx);
    session::show(opts.no_tui, &collector.1, &done_rx);
    // Whatever happened to training, the collector finishes: the trace gets closed and the
    // report covers what was measured.
    let outcome = trainer.join().map_err(|p| {
        anyhow::anyhow!(
            "the training thread panicked in the training loop: {}",
            crate::data::loader::panic_message(&*p)
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
    if let (Some(slot), Some(why)) = (&failure_slot, failure_text(&outcome)) {
        let _ = slot.set(why);
    }
    probe.send_blocking(Event::Finish);
    let done = match collector.0.join() {
        Ok(d) => d,
        Err(p) => {
            // The aggregate died with the collector: report its last published summary, and
            // fail the run with why.
            let why =
                format!("the collector thread (pp-collector) panicked: {}", crate::data::loader::panic_message(&*p));
            let last = collector.1.lock().unwrap_or_else(|e| e.into_inner()).snap.summary.clone();
            let outcome = match outcome {
                Err(e) => Err(e.context(why)),
                Ok(_) => Err(anyhow::anyhow!(why)),
            };
            return finish(opts, &data, Diagnosed::new(last), outcome);
        }
    };
    finish(opts, &data, done, outcome)
}

/// Why the run failed, if it did: a thread that panicked or returned an error.
fn failure_text(outcome: &anyhow::Result<anyhow::Result<Trained>>) -> Option<String> {
    match outcome {
        Ok(Ok(_)) => None,
        Ok(Err(e)) | Err(e) => Some(format!("{e:#}")),
    }
}

/// The trace (if asked for), the aggregate and the collector thread.
#[allow(clippy::type_complexity)]
fn start_collector(
    opts: &Options,
    data: &Prepared,
    settings: RunSettings,
    probe: &Probe,
    rx: Receiver<Event>,
) -> anyhow::Result<((JoinHandle<Diagnosed>, Latest), Option<Arc<OnceLock<String>>>)> {
    let mut exporters: Vec<Box<dyn Exporter>> = Vec::new();
    let mut failure_slot = None;
    let mut trace_guard = None;
    if let Some(path) = &opts.trace {
        let (mut t, guard) =
            ChromeTrace::create_guarded(path, &format!("pipeprof: {}", settings.model), opts.trace_level)
                .with_context(|| format!("cannot create the trace file {}", path.display()))?;
        trace_guard = Some(guard);
        t.settings(&settings).with_context(|| format!("cannot write the trace file {}", path.display()))?;
        failure_slot = Some(t.failure_slot());
        exporters.push(Box::new(t));
    }
    let data_fs = probes::fsinfo::detect(&data.dir);
    if data_fs.kind.is_remote_or_fuse() {
        progress::say(&format!(
            "note: {} is on a {} filesystem ({}): every image read may be a network round trip",
            data.dir.display(),
            data_fs.kind,
            data_fs.fs_type
        ));
    }
    let mut agg = Aggregator::new(settings);
    agg.set_data_fs(data_fs);
    let latest = session::latest(&agg);
    let handle = {
        let latest = latest.clone();
        let probe = probe.clone();
        std::thread::Builder::new()
            .name("pp-collector".into())
            .spawn(move || session::collect(rx, agg, exporters, &latest, &move || probe.dropped()))?
    };
    on_abort(trace_guard, opts.summary.clone(), latest.clone());
    Ok(((handle, latest), failure_slot))
}

/// What an immediate exit (a second interrupt, after the grace period) writes first: the
/// trace's closing bytes (through the guard, whatever the collector is doing) and the summary
/// of the last published snapshot. Neither waits on a lock: a busy snapshot slot means no
/// summary file, and says so.
fn on_abort(trace: Option<crate::export::guard::TraceGuard>, summary: Option<std::path::PathBuf>, latest: Latest) {
    signal::on_abort(Box::new(move || {
        if let Some(g) = &trace {
            if let Err(e) = g.close_now() {
                progress::warn(&format!(
                    "exiting at once: cannot close the trace ({e}): `pipeprof report --repair` closes it"
                ));
            }
        }
        let Some(path) = &summary else { return };
        let Ok(live) = latest.try_lock() else {
            progress::warn("exiting at once: the summary was being updated, so no summary file was written");
            return;
        };
        let done = Diagnosed::new(live.snap.summary.clone());
        drop(live);
        let mut v = serde_json::to_value(&done).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert("failed".into(), "interrupted twice: exited at once, the summary covers the last snapshot".into());
        }
        if let Err(e) = std::fs::write(path, v.to_string()) {
            progress::warn(&format!("exiting at once: cannot write the summary to {}: {e}", path.display()));
        }
    }));
}

/// How often the watchdog looks at the loader's open work.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// The stall watchdog: names a loader stage open longer than `after` (on the progress line,
/// and through the channel into the live view, report, summary and trace), until `stop` is
/// dropped.
fn start_watchdog(after: std::time::Duration, probe: &Probe, stop: Receiver<()>) -> Option<JoinHandle<()>> {
    let probe = probe.clone();
    let threshold = u64::try_from(after.as_nanos()).unwrap_or(u64::MAX);
    let spawned = std::thread::Builder::new().name("pp-watchdog".into()).spawn(move || {
        let mut named = std::collections::HashSet::new();
        while let Err(crossbeam_channel::RecvTimeoutError::Timeout) = stop.recv_timeout(WATCH_EVERY) {
            let now = probes::clock::now_ns();
            for (w, open_ns) in crate::data::watch::stalled(&crate::data::watch::open_work(), now, threshold) {
                let stall = crate::aggregate::Stall {
                    thread: w.thread.clone(),
                    stage: w.stage.name().into(),
                    file: w.file.clone(),
                    open_s: open_ns as f64 / 1e9,
                    abandoned: false,
                };
                // Named once per stall on the progress line; the live view shows it as a flag.
                if named.insert((w.thread.clone(), w.since_ns)) && !crate::tui::is_active() {
                    progress::warn(&crate::diagnose::stall_words(&stall));
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
        thread_prefixes: vec!["loader".into(), "train".into(), "compute".into()],
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

/// The `train` thread: the loader and the training loop; signals `done` when it ends.
#[allow(clippy::too_many_arguments)]
fn start_trainer(
    opts: &Options,
    cfg: &config::ModelConfig,
    data: &Prepared,
    workers: usize,
    auto_workers: Option<train::auto::AutoWorkers>,
    dev: candle_core::Device,
    probe: &Probe,
    done: crossbeam_channel::Sender<()>,
) -> anyhow::Result<Trainer> {
    let loader_cfg = crate::data::LoaderConfig {
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
    };
    let val = data.val.clone().map(|v| train::Validation {
        ds: std::sync::Arc::new(v),
        loader: crate::data::LoaderConfig {
            shuffle: false,
            epochs: 1,
            max_steps: None,
            augment: config::Augment::default(),
            ..loader_cfg.clone()
        },
    });
    let samples = data.train.samples();
    let classes = samples.classes().len();
    let hooks = train::Hooks { panic_at_step: opts.panic_at_step, slow: opts.slow.clone(), auto_workers };
    let (probe, cfg) = (probe.clone(), cfg.clone());
    Ok(std::thread::Builder::new().name(ThreadRole::Train.thread_name()).spawn(move || {
        probes::set_thread_role(ThreadRole::Train);
        let result = (|| {
            let mut loader = crate::data::Loader::start(samples, loader_cfg, probe.clone())?;
            let outcome = train::train(&cfg, classes, &dev, &mut loader, val.as_ref(), &probe, signal::flag(), &hooks)?;
            Ok(Trained { outcome, never_loaded: loader.classes_never_loaded() })
        })();
        let _ = done.send(());
        result
    })?)
}

/// The summary file, marked failed with why when the run failed.
fn write_summary(opts: &Options, done: &Diagnosed, failed: Option<&str>) -> anyhow::Result<()> {
    let Some(path) = &opts.summary else { return Ok(()) };
    let mut v = serde_json::to_value(done)?;
    if let (Some(why), Some(o)) = (failed, v.as_object_mut()) {
        o.insert("failed".into(), serde_json::Value::String(why.to_string()));
    }
    let json = serde_json::to_string_pretty(&v)?;
    std::fs::write(path, json).with_context(|| format!("cannot write the summary to {}", path.display()))?;
    progress::say(&format!("pipeprof: summary written to {}", path.display()));
    Ok(())
}

/// The report, the summary file and the outcome's messages.
fn finish(
    opts: &Options,
    data: &Prepared,
    done: Diagnosed,
    outcome: anyhow::Result<anyhow::Result<Trained>>,
) -> anyhow::Result<Finished> {
    let verdict = done.verdict();
    let failed = failure_text(&outcome);
    // The summary file first, as `run` does: a closed stdout or terminal must not cost it, and
    // nothing printed can panic (`progress::out`). The trace is closed (the collector ended);
    // once the summary is written too, an immediate exit has nothing left to close: its hooks
    // are disarmed.
    let written = signal::disarm_after(|| write_summary(opts, &done, failed.as_deref()));
    progress::out(&report::render(&done.summary, &verdict));
    if let Some(why) = &failed {
        progress::say(&format!("pipeprof: RUN FAILED: {why}"));
        progress::say("pipeprof: the report above covers the steps done before the failure");
    }
    written?;
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
