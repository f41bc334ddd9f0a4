//! `pipeprof profile`: wire probes → channel → collector → aggregate → report around a real
//! loader and training loop.

use crate::aggregate::{Aggregator, RunSettings, Snapshot, Summary};
use crate::cli::ProfileArgs;
use crate::config::{self, ModelConfig};
use crate::data::demo::DemoSpec;
use crate::data::{self, Loader, LoaderConfig, Source};
use crate::export::{chrome::ChromeTrace, Exporter};
use crate::{diagnose, report, signal, train, tui};
use anyhow::{bail, Context};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use probes::{Event, Probe, ProbeLayer};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing_subscriber::layer::SubscriberExt;

/// The shared latest view, written by the collector, read by the live view or progress line.
pub(crate) type Latest = Arc<Mutex<Snapshot>>;

/// Least time between two snapshots published on steps: a snapshot copies the recent series,
/// and the live view redraws at 10 Hz anyway.
const PUBLISH_EVERY: Duration = Duration::from_millis(50);

/// The model file, or the built-in default; with its display name.
pub(crate) fn load_model(model: Option<&std::path::Path>) -> anyhow::Result<(ModelConfig, String)> {
    match model {
        Some(p) => Ok((ModelConfig::load(p)?, p.display().to_string())),
        None => Ok((
            ModelConfig::parse(config::DEFAULT_MODEL, "built-in examples/cnn.toml")?,
            "built-in examples/cnn.toml".into(),
        )),
    }
}

fn data_dir(args: &ProfileArgs) -> anyhow::Result<PathBuf> {
    if let Some(d) = &args.data {
        return Ok(d.clone());
    }
    let spec = DemoSpec::default();
    let dir = DemoSpec::default_dir();
    if !spec.is_present(&dir) {
        eprintln!("pipeprof: no --data given: writing the demo data set to {} (first run only)…", dir.display());
        spec.write(&dir).with_context(|| format!("cannot write the demo data set to {}", dir.display()))?;
    } else {
        eprintln!("pipeprof: no --data given: using the demo data set in {}", dir.display());
    }
    Ok(dir)
}

/// The training set and the validation set, if any: `--val-data` (same classes required), or
/// `[data] validation_split` held out of `ds` per class.
fn validation_set(
    args: &ProfileArgs,
    cfg: &ModelConfig,
    ds: data::Dataset,
) -> anyhow::Result<(data::Dataset, Option<data::Dataset>)> {
    if let Some(dir) = &args.val_data {
        let v = data::scan(dir).with_context(|| format!("--val-data {}", dir.display()))?;
        if v.classes != ds.classes {
            bail!(
                "--val-data {} has classes [{}] but --data has [{}]: the validation folder needs the same class sub-folders",
                dir.display(),
                v.classes.join(", "),
                ds.classes.join(", ")
            );
        }
        return Ok((ds, Some(v)));
    }
    let f = cfg.data.validation_split;
    if f <= 0.0 {
        return Ok((ds, None));
    }
    let (train, val) = data::split::split(&ds, f, cfg.data.seed);
    if val.samples.is_empty() || train.samples.is_empty() {
        eprintln!(
            "warning: validation_split = {f} of {} images leaves {} for validation and {} for training: no validation pass",
            ds.samples.len(),
            val.samples.len(),
            train.samples.len()
        );
        return Ok((ds, None));
    }
    Ok((train, Some(val)))
}

/// Runs `pipeprof profile`; returns the final summary.
pub fn run(args: &ProfileArgs) -> anyhow::Result<Summary> {
    let (mut cfg, model_name) = load_model(args.model.as_deref())?;
    if let Some(e) = args.epochs {
        cfg.train.epochs = e.max(1);
    }
    if let Some(b) = args.batch_size {
        if b == 0 {
            bail!("--batch-size must be at least 1");
        }
        cfg.train.batch_size = b;
    }
    if let Some(w) = args.workers {
        cfg.data.workers = w;
    }
    if let Some(p) = args.prefetch {
        if p == 0 {
            bail!("--prefetch must be at least 1");
        }
        cfg.data.prefetch = p;
    }
    if let Some(s) = args.seed {
        cfg.data.seed = s;
    }
    if args.steps == Some(0) {
        bail!("--steps must be at least 1");
    }
    let dev = train::parse_device(&args.device)?;
    // candle computes on rayon's global pool; named threads make its CPU use visible (they
    // would otherwise inherit the name of the thread that started the pool).
    let _ = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("compute-{i}")).build_global();
    let dir = data_dir(args)?;
    let ds = Source::open(&dir)?;
    match &ds {
        Source::Folder(f) => {
            for p in &f.problems {
                eprintln!("warning: {}: {}", p.path.display(), p.reason);
            }
        }
        Source::Packed(p) => {
            let i = &cfg.input;
            p.check_input(i.height as u32, i.width as u32, i.channels as u32, &model_name)?;
            let m = p.meta();
            let checked = if p.source_checked() {
                "matches its source".to_string()
            } else {
                format!("source {} is gone: not checked for staleness", m.source.display())
            };
            eprintln!(
                "pipeprof: training from the packed cache {} ({} images, {}; {} files were skipped when it was built)",
                dir.display(),
                p.len(),
                checked,
                m.skipped.len()
            );
        }
    }
    let (ds, val_ds) = match ds {
        Source::Folder(f) => {
            let (train_ds, val_ds) = validation_set(args, &cfg, (*f).clone())?;
            (Source::Folder(Arc::new(train_ds)), val_ds)
        }
        Source::Packed(_) if cfg.augment.is_on() || cfg.data.validation_split > 0.0 || args.val_data.is_some() => {
            bail!(
            "{}: [augment] and validation need the image folder (training from a packed cache supports neither yet): \
             pass the folder as --data, or drop [augment] / validation_split / --val-data",
            dir.display()
        )
        }
        packed => (packed, None),
    };
    let shapes = cfg.infer_shapes(ds.classes().len()).map_err(|e| anyhow::anyhow!("{model_name}: {e}"))?;
    let params: usize = shapes.iter().map(|l| l.params).sum();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    // `auto`: start with one worker and let the measured wait decide (train::auto).
    let auto_workers = (cfg.data.workers == config::Workers::Auto).then(|| train::auto::AutoWorkers::new(cores));
    let workers = match &auto_workers {
        Some(a) => a.initial(),
        None => cfg.data.workers.resolve(cores),
    };
    println!("Model: {model_name}  ·  {} classes: {}", ds.classes().len(), ds.classes().join(", "));
    print!("{}", config::summary_table(&shapes, &cfg.input));
    if cfg.augment.is_on() {
        println!("Augmentation (training only): {}", cfg.augment.describe());
    }
    if let Some(v) = &val_ds {
        println!("Validation: {} images after every epoch, {} for training", v.samples.len(), ds.len());
    }
    println!();

    let settings = RunSettings {
        model: model_name,
        data: dir.display().to_string(),
        images: ds.len(),
        classes: ds.classes().to_vec(),
        device: args.device.clone(),
        workers,
        cores,
        batch_size: cfg.train.batch_size,
        prefetch: cfg.data.prefetch,
        epochs: cfg.train.epochs,
        max_steps: args.steps,
        seed: cfg.data.seed,
        input: [cfg.input.channels, cfg.input.height, cfg.input.width],
        params,
        simulated: args
            .throttle_read
            .iter()
            .map(|t| t.describe())
            .chain(args.slow.iter().map(|s| s.describe()))
            .collect(),
        auto_workers: Vec::new(),
    };
    for s in &settings.simulated {
        eprintln!("pipeprof: simulation on: {s}");
    }

    let (probe, rx) = Probe::new(args.channel_capacity.max(1));
    let subscriber = tracing_subscriber::registry().with(ProbeLayer::new(probe.clone()));
    if tracing::subscriber::set_global_default(subscriber).is_err() {
        eprintln!("warning: a tracing subscriber is already installed: stage spans will not be measured");
    }
    signal::install();

    let mut exporters: Vec<Box<dyn Exporter>> = Vec::new();
    if let Some(path) = &args.trace {
        let mut t = ChromeTrace::create(path, &format!("pipeprof: {}", settings.model), args.trace_level)
            .with_context(|| format!("cannot create the trace file {}", path.display()))?;
        t.settings(&settings).with_context(|| format!("cannot write the trace file {}", path.display()))?;
        exporters.push(Box::new(t));
    }
    let data_fs = probes::fsinfo::detect(&dir);
    if data_fs.kind.is_remote_or_fuse() {
        eprintln!(
            "note: {} is on a {} filesystem ({}): every image read may be a network round trip",
            dir.display(),
            data_fs.kind,
            data_fs.fs_type
        );
    }
    let mut agg = Aggregator::new(settings);
    agg.set_data_fs(data_fs);
    let latest: Latest = Arc::new(Mutex::new(agg.snapshot()));
    let collector = {
        let latest = latest.clone();
        let probe = probe.clone();
        std::thread::Builder::new()
            .name("pp-collector".into())
            .spawn(move || collect(rx, agg, exporters, &latest, &move || probe.dropped()))?
    };
    if !(args.sample_hz.is_finite() && args.sample_hz > 0.0) {
        bail!("--sample-hz must be a positive number, got {}", args.sample_hz);
    }
    let sampler_cfg = probes::sampler::SamplerConfig {
        hz: args.sample_hz,
        gpu: !args.no_gpu,
        thread_prefixes: vec!["loader".into(), "train".into(), "compute".into()],
        ..probes::sampler::SamplerConfig::default()
    };
    let samplers = match probes::sampler::start(probe.clone(), sampler_cfg) {
        Ok(h) => Some(h),
        Err(e) => {
            eprintln!("warning: machine sampling is off: {e}");
            None
        }
    };

    let loader_cfg = LoaderConfig {
        height: cfg.input.height as u32,
        width: cfg.input.width as u32,
        channels: cfg.input.channels,
        batch_size: cfg.train.batch_size,
        workers,
        prefetch: cfg.data.prefetch,
        shuffle: cfg.data.shuffle,
        seed: cfg.data.seed,
        epochs: cfg.train.epochs,
        max_steps: args.steps,
        throttle: args.throttle_read,
        slow: args.slow.clone(),
        augment: cfg.augment.clone(),
    };
    let val = val_ds.map(|v| train::Validation {
        ds: Arc::new(v),
        loader: LoaderConfig {
            shuffle: false,
            epochs: 1,
            max_steps: None,
            augment: config::Augment::default(),
            ..loader_cfg.clone()
        },
    });
    let classes = ds.classes().len();
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
    let panic_at = args.panic_at_step;
    let slow = args.slow.clone();
    let trainer = {
        let probe = probe.clone();
        let cfg = cfg.clone();
        std::thread::Builder::new().name("train".into()).spawn(move || {
            let result = (|| {
                let mut loader = Loader::start_source(ds, loader_cfg, probe.clone())?;
                let total = loader.total_steps();
                let hooks = train::Hooks { panic_at_step: panic_at, slow: slow.clone(), auto_workers };
                let out = train::train(&cfg, classes, &dev, &mut loader, val.as_ref(), &probe, signal::flag(), &hooks);
                drop(loader);
                out.map(|o| (o, total))
            })();
            let _ = done_tx.send(());
            result
        })?
    };

    // The live view needs a terminal to draw on and one to read keys from.
    let tui = !args.no_tui && std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    if tui {
        if let Err(e) = tui::run(latest.clone(), done_rx.clone(), signal::flag()) {
            eprintln!("warning: the live view failed ({e}); showing progress instead (--no-tui skips the view)");
            show_progress(&done_rx, &latest);
        }
    } else {
        show_progress(&done_rx, &latest);
    }
    // Whatever happened to training, the collector finishes: the trace gets closed and the
    // report covers what was measured.
    let outcome = trainer.join().map_err(|_| anyhow::anyhow!("the training thread panicked"));
    if let Some(s) = samplers {
        s.stop();
    }
    probe.send_blocking(Event::Finish);
    let summary = collector.join().map_err(|_| anyhow::anyhow!("the collector thread panicked"))?;
    clear_progress();

    print!("{}", report::render(&summary));
    if let Some(path) = &args.summary {
        let json = serde_json::to_string_pretty(&summary)?;
        std::fs::write(path, json).with_context(|| format!("cannot write the summary to {}", path.display()))?;
        eprintln!("pipeprof: summary written to {}", path.display());
    }
    let (outcome, _total) = outcome??;
    if outcome.interrupted {
        eprintln!("pipeprof: stopped early: the report covers the steps done so far");
    }
    // The loop's own count, not the events': those may have been dropped.
    if outcome.images == 0 && !outcome.interrupted {
        bail!(
            "no usable images in {}: {} files were skipped (see the list above)",
            summary.settings.data,
            summary.skipped_count
        );
    }
    if args.check_advice && !outcome.interrupted {
        let verdict = diagnose::diagnose(&summary);
        crate::check_advice::run(args, &dir, &summary, &verdict);
    }
    Ok(summary)
}

/// Drains events into the aggregate and the exporters until [`Event::Finish`], publishing
/// snapshots for the views; closes the exporters and returns the final summary. `dropped`
/// reads the sender side's dropped-events counter.
pub(crate) fn collect(
    rx: Receiver<Event>,
    mut agg: Aggregator,
    mut exporters: Vec<Box<dyn Exporter>>,
    latest: &Latest,
    dropped: &dyn Fn() -> u64,
) -> Summary {
    let mut since_publish = 0u32;
    let mut last_publish: Option<Instant> = None;
    let export = |ev: &Event, exporters: &mut Vec<Box<dyn Exporter>>| {
        exporters.retain_mut(|x| match x.event(ev) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("\nwarning: cannot write an export ({e}): that output stops here");
                false
            }
        });
    };
    while let Ok(ev) = rx.recv() {
        if ev == Event::Finish {
            break;
        }
        let publish = matches!(ev, Event::Step(_) | Event::Skipped { .. });
        export(&ev, &mut exporters);
        agg.push(&ev);
        since_publish += 1;
        // Publishing costs a summary and a copy of the recent series: do it on steps and skips
        // (at most every PUBLISH_EVERY), and every so many events.
        let due = last_publish.is_none_or(|t| t.elapsed() >= PUBLISH_EVERY);
        if (publish && due) || since_publish >= 4096 {
            since_publish = 0;
            last_publish = Some(Instant::now());
            publish_snapshot(&mut agg, latest, dropped);
        }
    }
    // The views' last look includes the final steps.
    publish_snapshot(&mut agg, latest, dropped);
    // Thread names whose events were dropped on a full channel are still in the registry.
    for (id, name) in probes::thread_names() {
        if !agg.has_thread(id) {
            let ev = Event::Thread { id, name: name.into_boxed_str() };
            export(&ev, &mut exporters);
            agg.push(&ev);
        }
    }
    agg.set_dropped(dropped());
    let mut summary = agg.summary();
    summary.verdict = Some(diagnose::diagnose(&summary));
    for x in &mut exporters {
        if let Err(e) = x.summary(&summary).and_then(|()| x.finish()) {
            eprintln!("warning: cannot close an export: {e}");
        }
    }
    summary
}

/// Publishes the aggregate for the views, with the verdict once there are steps to judge.
fn publish_snapshot(agg: &mut Aggregator, latest: &Latest, dropped: &dyn Fn() -> u64) {
    agg.set_dropped(dropped());
    let mut snap = agg.snapshot();
    if snap.summary.steps > 0 {
        snap.verdict = Some(diagnose::diagnose(&snap.summary));
    }
    // The lock is held only for the move, not while the snapshot is built.
    if let Ok(mut l) = latest.lock() {
        *l = snap;
    }
}

pub(crate) fn show_progress(done: &Receiver<()>, latest: &Latest) {
    let tty = std::io::stderr().is_terminal();
    let mut warned = 0usize;
    let mut last_line = std::time::Instant::now();
    loop {
        let finished = match done.recv_timeout(Duration::from_millis(200)) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => true,
            Err(RecvTimeoutError::Timeout) => false,
        };
        let Ok(s) = latest.lock().map(|l| l.summary.clone()) else { return };
        let mut err = std::io::stderr().lock();
        for k in s.skipped.iter().skip(warned) {
            let _ = writeln!(err, "\r\x1b[Kwarning: skipped {}: {}", k.path, k.reason);
        }
        warned = warned.max(s.skipped.len());
        let line = format!(
            "step {} · epoch {} · {:.1} images/s · loss {} · {:.1} s",
            s.steps,
            s.epochs.last().map(|e| e.epoch).unwrap_or(1),
            s.images_per_s,
            s.last_loss.map(|l| format!("{l:.4}")).unwrap_or_else(|| "-".into()),
            s.elapsed_s
        );
        if tty {
            let _ = write!(err, "\r\x1b[K{line}");
            let _ = err.flush();
        } else if last_line.elapsed() >= Duration::from_secs(10) {
            let _ = writeln!(err, "{line}");
            last_line = std::time::Instant::now();
        }
        if finished {
            return;
        }
    }
}

pub(crate) fn clear_progress() {
    if std::io::stderr().is_terminal() {
        eprint!("\r\x1b[K");
    }
}
