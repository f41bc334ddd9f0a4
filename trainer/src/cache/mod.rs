//! The packed file (`pipeprof pack`, and `pipeprof cache` for a cnn.toml model): every usable
//! image decoded once and stored as u8 pixels, at one size or at each image's own, in one file
//! that training reads image by image — pipeprof's loop (`profile --data FILE`), PyTorch
//! (`pipeprof.data.PackedImageFolder`) and Keras (`pipeprof.keras.packed_dataset`).
//!
//! # File format, version 2 (little-endian; docs/packed-format.md has every field)
//!
//! ```text
//! [0, 128)            header: magic "\x89PPK\r\n\x1a\n", version, H, W (0 when sizes vary), C,
//!                     image count, source fingerprint, offsets and lengths of the sections
//!                     below, file length, and a CRC-32 over the header, labels, checksums,
//!                     index and metadata
//! [4096, …)           pixels: each image H·W·C u8 bytes, HWC interleaved, one after another
//! labels_off          n × u32 class labels
//! crcs_off            n × u32 CRC-32 of each image's pixels
//! index_off           n × (u64 offset, u32 height, u32 width)
//! meta_off            JSON: source folder, layout (which files, in which order), size asked
//!                     for, resample filter, class names, each image's path relative to the
//!                     source, files skipped at build time with their reasons
//! ```
//!
//! Version 1 (written before `pack`) had no index (a fixed stride from H·W·C) and a binary
//! metadata block; it is still read.
//!
//! Pixels come first so the file is written in one pass while images are decoded; the index
//! and metadata follow, and the header is written last. The writer goes to a temporary name in
//! the same folder, fsyncs and renames: the final name never holds a half-written file.
//!
//! The source fingerprint is a 64-bit FNV-1a hash over (relative path, size, mtime) of every
//! image file the scan found, in scan order: adding, removing, renaming or touching a file
//! changes it. Opening a cache whose source folder still exists re-scans it (with the layout's
//! rules) and refuses a mismatch (stale); every checksum is verified at open (damaged).

mod build;
mod format;
mod open;
mod order;
mod source;

pub use build::{build, BuildOptions, BuildReport};
pub use format::{fingerprint, Entry, Exact, Header, Meta, Size, HEADER_LEN, MAGIC, OLDEST_READ, PIXELS_OFF, VERSION};
pub use open::Packed;
pub use source::{read_simulation_ignored, DataSource, SourceError};

use crate::data::scan::Rules;
use pipeprof_core::aggregate::settings::{clean_name, shown, MAX_PATH_SHOWN};
use pipeprof_core::model_source::ModelSource;
use std::path::PathBuf;

/// Why a cache cannot be written or used. Every message names the file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cannot read the cache {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot write the cache {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Scan(#[from] crate::data::scan::ScanError),
    #[error(
        "{path} is not a pipeprof cache (no PPK magic bytes): pass an image folder, or a file written by `{rerun}`"
    )]
    NotACache { path: PathBuf, rerun: String },
    #[error(
        "{path} is packed format version {found}, this pipeprof reads versions {OLDEST_READ} to {VERSION}: rebuild it with `{rerun}`"
    )]
    Version { path: PathBuf, found: u32, rerun: String },
    #[error("{path} is damaged ({what}): it was not used; delete it and re-run `{rerun}`")]
    Damaged { path: PathBuf, what: String, rerun: String },
    #[error(
        "{path} is stale: {what} in {} since it was written; it was not used: re-run `{rerun}`",
        shown(source_dir)
    )]
    Stale { path: PathBuf, source_dir: PathBuf, what: String, rerun: String },
    #[error("{path} holds {cache} images but the model's [input] is {model} ({which} differ): re-run `{rerun}` with this model")]
    Shape { path: PathBuf, cache: String, model: String, which: String, rerun: String },
    #[error(
        "{path} holds images of different sizes (packed with --shorter or --as-stored); the model's [input] is {height}×{width} (H×W): pack it for pipeprof's own loop with `pipeprof pack DIR {} --size {width}x{height}`",
        shown(path)
    )]
    Varying { path: PathBuf, height: u32, width: u32 },
    #[error(
        "the images in {} differ in size ({which}): choose the size to store them at: --size 224 (every image 224×224, as torchvision's Resize((224, 224))), --shorter 256 (the shorter side 256, as Resize(256)), or --as-stored; nothing was written",
        shown(dir)
    )]
    MixedSizes {
        dir: PathBuf,
        /// "a.jpg is 8×6, b.png is 10×20": the first image and the first of another size.
        which: String,
    },
    #[error(
        "no usable images in {dir}: all {skipped} files were skipped (see the warnings above); nothing was written"
    )]
    NoUsable { dir: PathBuf, skipped: usize },
    #[error(
        "class folder {}{more} has no image ImageFolder reads ({}): torchvision's ImageFolder(DIR) raises FileNotFoundError on it too; nothing was written: add images to it or remove it{hint}",
        shown(folder),
        crate::data::scan::IMAGEFOLDER_EXTENSIONS.join(" ")
    )]
    EmptyClass {
        folder: PathBuf,
        /// " (and 2 more: a, b)" or nothing.
        more: String,
        /// What to do for Keras when a hidden folder is among them, or nothing.
        hint: String,
    },
    #[error("interrupted: {} was not written (nothing was left behind)", shown(out))]
    Interrupted { out: PathBuf },
}

/// The command that rebuilds `out` as `meta` says it was made: `pipeprof pack` (no model) or
/// `pipeprof cache`; with no metadata (a damaged file), `pipeprof pack` with placeholders.
pub fn rerun_command(meta: Option<&Meta>, out: &std::path::Path) -> String {
    match meta {
        Some(m) if !m.model.is_empty() => cache_command(Some(&m.model), Some(&m.source), out),
        Some(m) => {
            let layout = if m.rules == Rules::Keras { " --layout keras" } else { "" };
            let cmd = format!("pipeprof pack {} {} {}", shown(&m.source), shown(out), m.size.flag());
            format!("{}{layout}", cmd.trim_end())
        }
        None => format!("pipeprof pack DIR {} --size S", shown(out)),
    }
}

/// The `pipeprof cache` command that rebuilds `out` from `source` with `model` (placeholders
/// when unknown; no `--model` for the built-in, `pipeprof cache`'s default).
pub fn cache_command(model: Option<&ModelSource>, source: Option<&std::path::Path>, out: &std::path::Path) -> String {
    let model = match model {
        Some(ModelSource::BuiltIn) => String::new(),
        Some(m) if m.is_empty() => String::new(),
        Some(m) => format!("--model {m} "),
        None => "--model cnn.toml ".into(),
    };
    // The source folder comes from the cache file: shown cleaned, as every name.
    let data = source.map(shown).unwrap_or_else(|| "DIR".into());
    format!("pipeprof cache {model}--data {data} --out {}", shown(out))
}

/// What `pipeprof cache` was asked for.
#[derive(Debug, Clone, Default)]
pub struct CacheOptions {
    /// The model whose [input] size the images are resized to; None = the built-in one.
    pub model: Option<PathBuf>,
    pub data: PathBuf,
    pub out: PathBuf,
    /// Decode threads; None = one per core.
    pub workers: Option<usize>,
    /// Testing hook: abort (as kill -9 would) after N images are written.
    pub abort_after: Option<usize>,
}

/// What `pipeprof pack` was asked for.
#[derive(Debug, Clone)]
pub struct PackOptions {
    /// The image folder (one sub-folder per class).
    pub data: PathBuf,
    pub out: PathBuf,
    pub size: Size,
    /// Whose files, classes and order: ImageFolder's (the default) or Keras's.
    pub layout: Rules,
    /// Decode threads; None = one per core.
    pub workers: Option<usize>,
}

/// Decode threads: `asked`, range-checked, or one per core.
fn threads(asked: Option<usize>) -> anyhow::Result<usize> {
    if let Some(w) = asked {
        use pipeprof_core::limits::{in_range, MAX_WORKERS};
        in_range("--workers", w, 1, MAX_WORKERS).map_err(anyhow::Error::msg)?;
    }
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    Ok(asked.unwrap_or(cores).max(1))
}

/// [`build`] with Ctrl-C handled: an interrupt stops the writing, the temporary is removed,
/// and `None` comes back (the process then exits 128 + the signal, as shells expect).
fn build_interruptible(opts: &BuildOptions, verb: &str) -> anyhow::Result<Option<BuildReport>> {
    pipeprof_core::signal::install();
    match build(opts) {
        Ok(r) => Ok(Some(r)),
        Err(e @ CacheError::Interrupted { .. }) => {
            crate::progress::say(&format!("pipeprof {verb}: {e}"));
            Ok(None)
        }
        Err(e) => {
            Err(anyhow::Error::new(e).context(format!("pipeprof {verb}: {} was not written", opts.out.display())))
        }
    }
}

/// `pipeprof pack`: the folder as torchvision's ImageFolder (or Keras's
/// `image_dataset_from_directory`, `--layout keras`) sees it, RGB, at the size asked for, each
/// image decoded at full resolution first (as PIL does).
pub fn pack(args: &PackOptions) -> anyhow::Result<()> {
    let opts = BuildOptions {
        data: args.data.clone(),
        out: args.out.clone(),
        size: args.size,
        channels: 3,
        rules: args.layout,
        exact_decode: true,
        model: ModelSource::default(),
        workers: threads(args.workers)?,
        progress: true,
        fail_after: None,
        abort_after: None,
        panic_on: None,
    };
    let Some(r) = build_interruptible(&opts, "pack")? else { return Ok(()) };
    let size = match (r.size, args.size) {
        (Some((h, w)), _) => format!("{h}×{w}×3"),
        (None, Size::Shorter { shorter }) => format!("shorter side {shorter}, 3 channels"),
        (None, _) => "sizes as stored, 3 channels".into(),
    };
    summarise("packed", &r, &size, &args.data, &args.out, opts.workers);
    let out = args.out.display().to_string();
    crate::progress::out(&match args.layout {
        Rules::Keras => format!(
            "read it: pipeprof.keras.packed_dataset({out:?}, batch_size=32) in place of \
             keras.utils.image_dataset_from_directory(DIR, ...)\n"
        ),
        _ => format!(
            "read it: pipeprof.data.PackedImageFolder({out:?}, transform=...) in place of ImageFolder(DIR, ...); \
             for Keras, pack with --layout keras (its files, classes and order)\n"
        ),
    });
    Ok(())
}

/// The summary line and the skipped files, on stderr, each written so that a closed pipe
/// (`| head -0`) costs nothing (the file is written).
fn summarise(verb: &str, r: &BuildReport, size: &str, data: &std::path::Path, out: &std::path::Path, workers: usize) {
    crate::progress::say(&format!(
        "pipeprof: {verb} {} images ({size}, {:.1} MB) from {} in {:.1} s with {workers} threads → {}",
        r.images,
        r.bytes as f64 / 1e6,
        data.display(),
        r.secs,
        out.display()
    ));
    if !r.skipped.is_empty() {
        crate::progress::say(&format!("skipped files: {}", r.skipped.len()));
        for (p, why) in &r.skipped {
            // File names and reasons come from the data: one line each, no escape codes.
            crate::progress::say(&format!("  {}: {}", clean_name(p, MAX_PATH_SHOWN), clean_name(why, MAX_PATH_SHOWN)));
        }
    }
}

/// `pipeprof cache`: `pack` at the model's input size and channels, the files pipeprof's own
/// loader takes (its scan rules, its reduced-scale JPEG decode), so `profile --data FILE` trains
/// on the pixels `profile --data DIR` would.
pub fn run(args: &CacheOptions) -> anyhow::Result<()> {
    let (cfg, model) = pipeprof_core::config::load_model(args.model.as_deref())?;
    let (height, width) = (cfg.input.height as u32, cfg.input.width as u32);
    let opts = BuildOptions {
        data: args.data.clone(),
        out: args.out.clone(),
        size: Size::Fixed { height, width },
        channels: cfg.input.channels as u32,
        rules: crate::data::scan::Rules::Pipeprof,
        exact_decode: false,
        model,
        workers: threads(args.workers)?,
        progress: true,
        fail_after: None,
        abort_after: args.abort_after,
        panic_on: None,
    };
    let Some(r) = build_interruptible(&opts, "cache")? else { return Ok(()) };
    let size = format!("{height}×{width}×{}", opts.channels);
    summarise("cached", &r, &size, &args.data, &args.out, opts.workers);
    crate::progress::out(&format!(
        "train from it: pipeprof profile {}--data {}\n",
        model_flag(args),
        args.out.display()
    ));
    Ok(())
}

fn model_flag(args: &CacheOptions) -> String {
    args.model.as_ref().map(|m| format!("--model {} ", m.display())).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_rerun_command_names_the_model_unless_it_is_the_built_in() {
        let out = Path::new("/tmp/x.ppk");
        let data = Some(Path::new("/data/imgs"));
        let table: [(Option<ModelSource>, &str); 5] = [
            (Some(ModelSource::BuiltIn), "pipeprof cache --data /data/imgs --out /tmp/x.ppk"),
            (
                Some(ModelSource::File("m/my model.toml".into())),
                "pipeprof cache --model m/my model.toml --data /data/imgs --out /tmp/x.ppk",
            ),
            (
                Some(ModelSource::Program("train.py".into())),
                "pipeprof cache --model train.py --data /data/imgs --out /tmp/x.ppk",
            ),
            (Some(ModelSource::default()), "pipeprof cache --data /data/imgs --out /tmp/x.ppk"),
            (None, "pipeprof cache --model cnn.toml --data /data/imgs --out /tmp/x.ppk"),
        ];
        for (model, want) in table {
            assert_eq!(cache_command(model.as_ref(), data, out), want, "{model:?}");
        }
        // A cache written before the type (its model saved as the built-in's name) reads back
        // as the built-in.
        let saved = ModelSource::from_name("built-in examples/cnn.toml");
        assert_eq!(cache_command(Some(&saved), data, out), "pipeprof cache --data /data/imgs --out /tmp/x.ppk");
    }
}
