//! Before training: the data (folder or cache, the validation set) and the run's settings.

use super::Options;
use anyhow::{bail, Context};
use pipeprof_core::aggregate::settings::{clean_name, shown, MAX_PATH_SHOWN};
use pipeprof_core::aggregate::RunSettings;
use pipeprof_core::config::ModelConfig;
use pipeprof_core::model_source::ModelSource;
use pipeprof_trainer::cache::DataSource;
use pipeprof_trainer::data::demo::DemoSpec;
use pipeprof_trainer::data::{self, Dataset};
use std::path::PathBuf;
use std::sync::Arc;

/// The data of a run, ready for the loaders.
pub struct Prepared {
    /// What `--data` named (or the demo set).
    pub dir: PathBuf,
    /// The training samples (the folder less its validation share, or the cache).
    pub train: DataSource,
    pub val: Option<Dataset>,
    /// Files in class folders that are not images, by extension ("3 .txt, 1 .heic").
    pub ignored: Option<String>,
}

/// `--data`, or the demo set (written on first use).
fn data_dir(opts: &Options) -> anyhow::Result<PathBuf> {
    if let Some(d) = &opts.data {
        return Ok(d.clone());
    }
    let spec = DemoSpec::default();
    let dir = DemoSpec::default_dir();
    if !spec.is_present(&dir) {
        pipeprof_trainer::progress::say(&format!(
            "pipeprof: no --data given: writing the demo data set to {} (first run only)…",
            dir.display()
        ));
        spec.write(&dir).with_context(|| format!("cannot write the demo data set to {}", dir.display()))?;
    } else {
        pipeprof_trainer::progress::say(&format!(
            "pipeprof: no --data given: using the demo data set in {}",
            dir.display()
        ));
    }
    Ok(dir)
}

/// Opens the data, says what it found, and holds out the validation set.
pub fn prepare(opts: &Options, cfg: &ModelConfig, model: &ModelSource) -> anyhow::Result<Prepared> {
    let dir = data_dir(opts)?;
    let src = DataSource::open(&dir)?;
    let mut ignored = None;
    let (train, val) = match src {
        DataSource::Folder(f) => {
            ignored = f.ignored_summary();
            if let Some(i) = &ignored {
                pipeprof_trainer::progress::warn(&format!("ignored in class folders (not images pipeprof reads): {i}"));
            }
            for p in &f.problems {
                pipeprof_trainer::progress::warn(&format!(
                    "{}: {}",
                    shown(&p.path),
                    clean_name(&p.reason, MAX_PATH_SHOWN)
                ));
            }
            for c in &f.empty_classes {
                pipeprof_trainer::progress::warn(&data::scan::empty_class_warning(&f.root, c));
            }
            let (train, val) = validation_set(opts, cfg, (*f).clone())?;
            (DataSource::Folder(Arc::new(train)), val)
        }
        DataSource::Packed(p) => {
            let i = &cfg.input;
            p.check_input(i.height as u32, i.width as u32, i.channels as u32, model)?;
            if cfg.augment.is_on() || cfg.data.validation_split > 0.0 || opts.val_data.is_some() {
                bail!(
                    "{}: [augment] and validation need the image folder (training from a packed cache supports neither yet): \
                     pass the folder as --data, or drop [augment] / validation_split / --val-data",
                    dir.display()
                )
            }
            if let Some(why) = pipeprof_trainer::cache::read_simulation_ignored(opts.throttle_read.as_ref(), &opts.slow)
            {
                pipeprof_trainer::progress::warn(&why);
            }
            let m = p.meta();
            let checked = if p.source_checked() {
                "matches its source".to_string()
            } else {
                format!("source {} is gone: not checked for staleness", shown(&m.source))
            };
            pipeprof_trainer::progress::say(&format!(
                "pipeprof: training from the packed cache {} ({} images, {}; {} files were skipped when it was built)",
                dir.display(),
                p.len(),
                checked,
                m.skipped.len()
            ));
            (DataSource::Packed(p), None)
        }
    };
    Ok(Prepared { dir, train, val, ignored })
}

/// The training set and the validation set, if any: `--val-data` (same classes required), or
/// `[data] validation_split` held out of `ds` per class.
fn validation_set(opts: &Options, cfg: &ModelConfig, ds: Dataset) -> anyhow::Result<(Dataset, Option<Dataset>)> {
    if let Some(dir) = &opts.val_data {
        let v = data::scan(dir).with_context(|| format!("--val-data {}", dir.display()))?;
        for c in &v.empty_classes {
            pipeprof_trainer::progress::warn(&data::scan::empty_class_warning(dir, c));
        }
        let v = relabel_validation(v, &ds).with_context(|| format!("--val-data {}", dir.display()))?;
        return Ok((ds, Some(v)));
    }
    let f = cfg.data.validation_split;
    if f <= 0.0 {
        return Ok((ds, None));
    }
    let (train, val) = data::split::split(&ds, f, cfg.data.seed);
    if val.samples.is_empty() || train.samples.is_empty() {
        pipeprof_trainer::progress::warn(&format!(
            "validation_split = {f} of {} images leaves {} for validation and {} for training: no validation pass",
            ds.samples.len(),
            val.samples.len(),
            train.samples.len()
        ));
        return Ok((ds, None));
    }
    Ok((train, Some(val)))
}

/// The validation set with the training set's labels. Both folders need the same class
/// sub-folders; a validation class with no image is left out (warned at the scan), a class
/// with validation images but no training image is refused (the model has no output for it).
fn relabel_validation(mut v: Dataset, train: &Dataset) -> anyhow::Result<Dataset> {
    let folders = |d: &Dataset| {
        let mut f: Vec<String> = d.classes.iter().chain(&d.empty_classes).cloned().collect();
        f.sort();
        f
    };
    if folders(&v) != folders(train) {
        bail!(
            "it has class folders [{}] but --data has [{}]: the validation folder needs the same class sub-folders",
            folders(&v).join(", "),
            folders(train).join(", ")
        );
    }
    let unknown: Vec<&str> = v.classes.iter().filter(|c| !train.classes.contains(c)).map(String::as_str).collect();
    if !unknown.is_empty() {
        bail!(
            "class folders [{}] have validation images but no training image, so the model has no output for them: \
             add training images, or move them out of the validation folder",
            unknown.join(", ")
        );
    }
    let map: Vec<u32> =
        v.classes.iter().map(|c| train.classes.iter().position(|t| t == c).unwrap_or_default() as u32).collect();
    for s in &mut v.samples {
        s.label = map[s.label as usize];
    }
    v.classes = train.classes.clone();
    Ok(v)
}

/// What the report and summary echo of this run.
pub fn settings(
    opts: &Options,
    cfg: &ModelConfig,
    model: ModelSource,
    data: &Prepared,
    workers: usize,
    cores: usize,
    params: usize,
) -> RunSettings {
    let samples = data.train.samples();
    RunSettings {
        model,
        data: data.dir.display().to_string(),
        images: samples.len(),
        classes: samples.classes().to_vec(),
        device: opts.device.as_str().into(),
        workers,
        cores,
        batch_size: cfg.train.batch_size,
        prefetch: cfg.data.prefetch,
        epochs: cfg.train.epochs,
        max_steps: opts.steps,
        seed: cfg.data.seed,
        input: [cfg.input.channels, cfg.input.height, cfg.input.width],
        params,
        simulated: match &data.train {
            // Read simulations model the image folder's storage, not a local packed file.
            DataSource::Packed(_) => {
                opts.slow.iter().filter(|s| s.stage != probes::Stage::Read).map(|s| s.describe()).collect()
            }
            DataSource::Folder(_) => opts.simulated(),
        },
        auto_workers: Vec::new(),
        ignored: data.ignored.clone().unwrap_or_default(),
        // candle computes on the global rayon pool.
        compute_threads: Some(rayon::current_num_threads()),
        ..RunSettings::default()
    }
}

/// Refuses a model that cannot fit: its parameter count overflows, or (on the CPU) training
/// needs more than the machine's memory, estimated before anything is allocated.
pub fn check_memory(
    shapes: &[pipeprof_trainer::train::shapes::ShapedLayer],
    cfg: &ModelConfig,
    device: &str,
    model_name: &str,
) -> anyhow::Result<()> {
    let batch = cfg.train.batch_size;
    let Some(need) = pipeprof_trainer::train::shapes::memory_estimate(shapes, &cfg.input, batch) else {
        bail!("{model_name}: the model's memory need cannot even be counted (over 2^64 bytes): use fewer or smaller layers");
    };
    // On a GPU the limit is the device's memory, which candle reports only by failing.
    if device != "cpu" {
        return Ok(());
    }
    if let Some(total) = memory_total() {
        if need > total {
            bail!(
                "{model_name}: training needs at least {:.1} GB (weights, gradients, optimizer state and one batch of {batch} activations) \
                 but this machine has {:.1} GB: use fewer filters/units, a smaller [input] or a smaller batch_size",
                need as f64 / 1e9,
                total as f64 / 1e9
            );
        }
    }
    Ok(())
}

/// Physical memory, from /proc/meminfo (None where it cannot be read).
fn memory_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}
