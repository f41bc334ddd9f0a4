//! The packed cache (`pipeprof cache`): every usable image decoded and resized once, stored as
//! u8 pixels at the model's input size in one file that training reads image by image.
//!
//! # File format, version 1 (little-endian)
//!
//! ```text
//! [0, 128)            header: magic "\x89PPK\r\n\x1a\n", version, H, W, C, image count,
//!                     source fingerprint, offsets and lengths of the sections below, file
//!                     length, and a CRC-32 over the header, labels, checksums and metadata
//! [4096, +n·H·W·C)    pixels: image i is H·W·C u8 bytes, HWC interleaved, at 4096 + i·H·W·C
//!                     (page-aligned start; the stride is fixed, so no per-image offsets)
//! labels_off          n × u32 class labels
//! crcs_off            n × u32 CRC-32 of each image's pixels
//! meta_off            source folder, model, class names, each image's path (relative to the
//!                     source), files skipped at build time with their reasons
//! ```
//!
//! Pixels come first so the file is written in one pass while images are decoded; the index
//! and metadata follow, and the header is written last. The writer goes to a temporary name in
//! the same folder, fsyncs and renames: the final name never holds a half-written file.
//!
//! The source fingerprint is a 64-bit FNV-1a hash over (relative path, size, mtime) of every
//! image file the scan found, in scan order: adding, removing, renaming or touching a file
//! changes it. Opening a cache whose source folder still exists re-scans it and refuses a
//! mismatch (stale); every checksum is verified at open (damaged).

mod build;
mod format;
mod open;
mod source;

pub use build::{build, BuildOptions, BuildReport};
pub use format::{fingerprint, Header, Meta, HEADER_LEN, MAGIC, PIXELS_OFF, VERSION};
pub use open::Packed;
pub use source::{read_simulation_ignored, DataSource, SourceError};

use crate::aggregate::settings::{clean_name, shown, MAX_PATH_SHOWN};
use crate::model_source::ModelSource;
use anyhow::Context;
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
        "{path} is cache format version {found}, this pipeprof reads version {VERSION}: rebuild it with `{rerun}`"
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
        "no usable images in {dir}: all {skipped} files were skipped (see the warnings above); nothing was written"
    )]
    NoUsable { dir: PathBuf, skipped: usize },
}

/// The command that rebuilds `out` from `source` with `model` (`-` parts when unknown; no
/// `--model` for the built-in, `pipeprof cache`'s default).
pub fn rerun_command(model: Option<&ModelSource>, source: Option<&std::path::Path>, out: &std::path::Path) -> String {
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

/// `pipeprof cache`.
pub fn run(args: &CacheOptions) -> anyhow::Result<()> {
    let (cfg, model) = crate::config::load_model(args.model.as_deref())?;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    if let Some(w) = args.workers {
        use crate::limits::{in_range, MAX_WORKERS};
        in_range("--workers", w, 1, MAX_WORKERS).map_err(anyhow::Error::msg)?;
    }
    let opts = BuildOptions {
        data: args.data.clone(),
        out: args.out.clone(),
        height: cfg.input.height as u32,
        width: cfg.input.width as u32,
        channels: cfg.input.channels as u32,
        model,
        workers: args.workers.unwrap_or(cores).max(1),
        progress: true,
        fail_after: None,
        abort_after: args.abort_after,
        panic_on: None,
    };
    let r = build(&opts).with_context(|| format!("pipeprof cache: {} was not written", args.out.display()))?;
    // The summary line and the command to train from it: stderr first, then stdout, each
    // written so that a closed pipe (`| head -0`) costs nothing (the cache is written).
    crate::progress::say(&format!(
        "pipeprof: cached {} images ({}×{}×{}, {:.1} MB) from {} in {:.1} s with {} threads → {}",
        r.images,
        opts.height,
        opts.width,
        opts.channels,
        r.bytes as f64 / 1e6,
        args.data.display(),
        r.secs,
        opts.workers,
        args.out.display()
    ));
    if !r.skipped.is_empty() {
        crate::progress::say(&format!("skipped files: {}", r.skipped.len()));
        for (p, why) in &r.skipped {
            // File names and reasons come from the data: one line each, no escape codes.
            crate::progress::say(&format!("  {}: {}", clean_name(p, MAX_PATH_SHOWN), clean_name(why, MAX_PATH_SHOWN)));
        }
    }
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
            assert_eq!(rerun_command(model.as_ref(), data, out), want, "{model:?}");
        }
        // A cache written before the type (its model saved as the built-in's name) reads back
        // as the built-in.
        let saved = ModelSource::from_name("built-in examples/cnn.toml");
        assert_eq!(rerun_command(Some(&saved), data, out), "pipeprof cache --data /data/imgs --out /tmp/x.ppk");
    }
}
