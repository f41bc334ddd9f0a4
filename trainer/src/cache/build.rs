//! Writing a cache: scan, decode + resize on every core, write in order to a temporary file,
//! fsync, rename.

use super::format::{
    encode_index, fingerprint, relative, Entry, Exact, Header, Meta, Size, ENTRY_LEN, HEADER_LEN, PIXELS_OFF, VERSION,
};
use super::CacheError;
use crate::data::image::{decode_for, Resizer};
use crate::data::scan::{scan_with, Rules};
use crate::data::Dataset;
use pipeprof_core::aggregate::settings::{clean_name, shown, MAX_NAME, MAX_PATH_SHOWN};
use pipeprof_core::model_source::ModelSource;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Images per decode task: big enough to amortise the hand-off, small enough to keep memory
/// bounded (at most 2 × workers tasks are in flight).
const CHUNK: usize = 16;

#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// The ImageFolder to read.
    pub data: PathBuf,
    /// The cache file to write.
    pub out: PathBuf,
    /// The size to store the images at.
    pub size: Size,
    /// 1 (luma) or 3 (RGB).
    pub channels: u32,
    /// Which files, in which order: ImageFolder's for `pack`, pipeprof's loader's for `cache`.
    pub rules: Rules,
    /// Decode every image at full resolution before resizing, as PIL does (`pack`: pixels as
    /// torchvision's). Off: a large JPEG is decoded at the loader's reduced DCT scale first, so
    /// the pixels are bit for bit those `profile --data DIR` trains on (`cache`).
    pub exact_decode: bool,
    /// The model (stored by name, for the rebuild command in messages); none (an empty
    /// program name) for `pack`.
    pub model: ModelSource,
    /// Decode threads.
    pub workers: usize,
    /// A progress line and warnings on stderr.
    pub progress: bool,
    /// Testing hook: fail with an I/O error after this many images are written.
    #[doc(hidden)]
    pub fail_after: Option<usize>,
    /// Testing hook: abort the process (as `kill -9` would stop it) after this many images.
    #[doc(hidden)]
    pub abort_after: Option<usize>,
    /// Testing hook: the decoder panics on a file whose name contains this.
    #[doc(hidden)]
    pub panic_on: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BuildReport {
    pub images: usize,
    pub classes: Vec<String>,
    /// (path, reason) of every file that could not be read or decoded.
    pub skipped: Vec<(String, String)>,
    /// Bytes of the written file.
    pub bytes: u64,
    pub secs: f64,
    /// Every image's (height, width) when they are all the same, else None.
    pub size: Option<(u32, u32)>,
}

/// The temporary file: removed on drop unless renamed into place.
struct Temp {
    path: PathBuf,
    keep: bool,
}

impl Drop for Temp {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A new file `DIR/.NAME.tmp-PID-XXXXXX` next to `out` (so the rename stays on one
/// filesystem): a random name created exclusively, so a file or link another user put there
/// first is never opened (`--out /tmp/x.ppk` writes in a shared folder). The mode is what a
/// plain create gives (0666 less the umask), as the cache had before.
fn create_temp(out: &Path) -> std::io::Result<(File, PathBuf)> {
    use std::os::unix::fs::PermissionsExt;
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "cache.ppk".into());
    let dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let made = tempfile::Builder::new()
        .prefix(&format!(".{name}.tmp-{}-", std::process::id()))
        .permissions(std::fs::Permissions::from_mode(0o666))
        .tempfile_in(dir)?;
    let (file, path) = made.into_parts();
    Ok((file, path.keep().map_err(|e| e.error)?))
}

/// Removes temporary files a killed `pipeprof cache` left next to `out` (their process is gone).
fn remove_stale_temps(out: &Path) {
    let (Some(dir), Some(name)) = (out.parent(), out.file_name()) else { return };
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    let prefix = format!(".{}.tmp-", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let f = e.file_name().to_string_lossy().into_owned();
        let pid = f.strip_prefix(&prefix).and_then(|p| p.split('-').next()).and_then(|p| p.parse::<i32>().ok());
        let Some(pid) = pid else { continue };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// One image's u8 HWC pixels and its (height, width).
type Image = (Vec<u8>, u32, u32);
type Decoded = Vec<Result<Image, String>>;

/// Decodes and resizes one sample to u8 HWC at the size asked for (bilinear, antialiased:
/// PIL's `Image.BILINEAR`); the error text matches the loader's skip reasons.
fn decode_one(path: &Path, opts: &BuildOptions, resizer: &mut Resizer) -> Result<Image, String> {
    let bytes = crate::data::folder::read_capped(path, crate::data::folder::MAX_IMAGE_BYTES)?;
    #[allow(clippy::panic)]
    if opts.panic_on.as_deref().is_some_and(|p| path.to_string_lossy().contains(p)) {
        panic!("test hook: the decoder panics on {}", path.display());
    }
    let (tw, th) = match opts.size {
        Size::Fixed { height, width } if !opts.exact_decode => (width, height),
        _ => (0, 0),
    };
    let px = decode_for(&bytes, opts.channels as usize, tw, th).map_err(|e| e.to_string())?;
    let (h, w) = opts.size.output(px.height, px.width);
    let out = resizer.resize_u8(&px, w, h).map(<[u8]>::to_vec).map_err(|e| e.to_string())?;
    Ok((out, h, w))
}

/// [`decode_one`], with a panic in the decoder (a bug it has on some hostile file) caught:
/// that sample is skipped and named, and the build goes on. Without this the panicking
/// thread's chunk never reached the writer, which waited for it forever.
fn decode_guarded(path: &Path, opts: &BuildOptions, resizer: &mut Resizer) -> Result<Image, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode_one(path, opts, resizer))) {
        Ok(r) => r,
        Err(p) => {
            // The resizer may be half-way through: start afresh.
            *resizer = Resizer::new();
            Err(format!("the decoder panicked on it ({}): skipped", crate::data::loader::panic_message(&*p)))
        }
    }
}

/// Builds the cache described by `opts`. The final name appears only once the file is
/// complete and on disk.
pub fn build(opts: &BuildOptions) -> Result<BuildReport, CacheError> {
    let t0 = Instant::now();
    let ds = scan_with(&opts.data, opts.rules)?;
    if let Some(e) = empty_class_refusal(&ds, opts.rules) {
        return Err(e);
    }
    if pipeprof_core::signal::stopping() {
        return Err(CacheError::Interrupted { out: opts.out.clone() });
    }
    if opts.progress {
        warn_scan_problems(&ds, opts.rules);
    }
    let source = std::fs::canonicalize(&ds.root).unwrap_or_else(|_| ds.root.clone());
    let ds = Dataset { root: source.clone(), samples: rebase(&ds, &source), ..ds };
    // In the scan's order: what opening the file compares with a new scan.
    let fp = fingerprint(&ds);
    let (ds, exact_classes) = super::order::python_order(ds, opts.rules);
    remove_stale_temps(&opts.out);
    let (file, path) = create_temp(&opts.out).map_err(|source| CacheError::Write { path: opts.out.clone(), source })?;
    let tmp = Temp { path, keep: false };
    // A second interrupt exits at once, without unwinding: the temporary goes with it.
    let doomed = tmp.path.clone();
    pipeprof_core::signal::on_abort(Box::new(move || {
        let _ = std::fs::remove_file(&doomed);
    }));
    let werr = |source| CacheError::Write { path: tmp.path.clone(), source };
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    w.write_all(&vec![0u8; PIXELS_OFF as usize]).map_err(werr)?;
    let meta = Meta {
        source,
        model: opts.model.clone(),
        classes: ds.classes.clone(),
        rules: opts.rules,
        size: opts.size,
        exact: Exact { classes: exact_classes, names: Vec::new() },
        ..Meta::default()
    };
    let mut out = Written { w, labels: Vec::new(), crcs: Vec::new(), entries: Vec::new(), meta };
    let verb = if opts.model.is_empty() { "packing" } else { "caching" };
    let mut progress = Progress::new(opts.progress, ds.samples.len(), verb);
    let written = write_pixels(opts, &ds, &mut out, &mut progress, &tmp.path);
    progress.finish();
    // Interrupted: `tmp` drops on the way out and removes the temporary.
    written?;
    if out.labels.is_empty() {
        return Err(CacheError::NoUsable { dir: opts.data.clone(), skipped: out.meta.skipped.len() });
    }
    if opts.progress {
        warn_classes_without_images(&out, &ds.root);
    }
    let header = write_index(opts, fp, &mut out).map_err(werr)?;
    let mut file = out.w.into_inner().map_err(|e| werr(e.into_error()))?;
    file.seek(SeekFrom::Start(0)).map_err(werr)?;
    file.write_all(&header.1).map_err(werr)?;
    file.sync_all().map_err(werr)?;
    drop(file);
    rename_durably(tmp, &opts.out)?;
    let size = (header.0.height != 0).then_some((header.0.height, header.0.width));
    Ok(BuildReport {
        images: out.labels.len(),
        classes: ds.classes.clone(),
        skipped: out.meta.skipped,
        bytes: header.0.file_len,
        secs: t0.elapsed().as_secs_f64(),
        size,
    })
}

/// ImageFolder's rules and a class folder without images: torchvision's `ImageFolder(DIR)`
/// raises `FileNotFoundError` on it, so no pack that claims its classes can hold it.
fn empty_class_refusal(ds: &Dataset, rules: Rules) -> Option<CacheError> {
    if rules != Rules::ImageFolder {
        return None;
    }
    let first = ds.empty_classes.first()?;
    let more = match ds.empty_classes.len() - 1 {
        0 => String::new(),
        n => format!(" (and {n} more: {})", clean_name(&ds.empty_classes[1..].join(", "), MAX_PATH_SHOWN)),
    };
    let hint = if ds.empty_classes.iter().any(|c| c.starts_with('.')) {
        "; for Keras, `--layout keras` skips hidden folders (such as Jupyter's .ipynb_checkpoints) as \
         image_dataset_from_directory does"
    } else {
        ""
    };
    Some(CacheError::EmptyClass { folder: ds.root.join(first), more, hint: hint.into() })
}

/// The scan's unreadable entries and empty classes, as warnings.
fn warn_scan_problems(ds: &Dataset, rules: Rules) {
    for p in &ds.problems {
        crate::progress::warn(&format!("{}: {}", shown(&p.path), clean_name(&p.reason, MAX_PATH_SHOWN)));
    }
    for c in &ds.empty_classes {
        crate::progress::warn(&match rules {
            Rules::Keras => crate::data::scan::kept_empty_class_warning(&ds.root, c),
            _ => crate::data::scan::empty_class_warning(&ds.root, c),
        });
    }
}

/// The complete temporary file to its final name `out`, kept from then on; the rename is
/// durable once the folder's entry is on disk too.
fn rename_durably(mut tmp: Temp, out: &Path) -> Result<(), CacheError> {
    std::fs::rename(&tmp.path, out).map_err(|source| CacheError::Write { path: out.to_path_buf(), source })?;
    tmp.keep = true;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Every image was decoded: a class none of whose images made it is known now.
fn warn_classes_without_images(out: &Written, root: &Path) {
    let mut cached = vec![0usize; out.meta.classes.len()];
    for &l in &out.labels {
        if let Some(c) = cached.get_mut(l as usize) {
            *c += 1;
        }
    }
    for (class, _) in out.meta.classes.iter().zip(&cached).filter(|(_, n)| **n == 0) {
        crate::progress::warn(&format!(
            "class {}: none of its images could be decoded (see the skipped files): a model trained \
             from this cache has an output it never sees; fix or remove {}",
            clean_name(class, MAX_NAME),
            shown(&root.join(class))
        ));
    }
}

/// The file being written and the index of what is in it so far.
struct Written {
    w: std::io::BufWriter<File>,
    labels: Vec<u32>,
    crcs: Vec<u32>,
    entries: Vec<Entry>,
    meta: Meta,
}

/// Decodes every sample on `opts.workers` threads and writes the pixels in sample order.
fn write_pixels(
    opts: &BuildOptions,
    ds: &Dataset,
    out: &mut Written,
    progress: &mut Progress,
    tmp: &Path,
) -> Result<(), CacheError> {
    let werr = |source| CacheError::Write { path: tmp.to_path_buf(), source };
    let chunks = ds.samples.len().div_ceil(CHUNK);
    let workers = opts.workers.clamp(1, chunks.max(1));
    let (task_tx, task_rx) = crossbeam_channel::unbounded::<usize>();
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<(usize, Decoded)>();
    std::thread::scope(|s| {
        // Owned by this closure: dropped when it returns, on every path, so the workers' task
        // loops end before the scope joins them.
        let task_tx = task_tx;
        for t in 0..workers {
            let (task_rx, done_tx) = (task_rx.clone(), done_tx.clone());
            std::thread::Builder::new()
                .name(format!("cache-{t}"))
                .spawn_scoped(s, move || {
                    let mut resizer = Resizer::new();
                    for c in task_rx.iter() {
                        let part = &ds.samples[c * CHUNK..((c + 1) * CHUNK).min(ds.samples.len())];
                        let decoded = part.iter().map(|x| decode_guarded(&x.path, opts, &mut resizer)).collect();
                        if done_tx.send((c, decoded)).is_err() {
                            return;
                        }
                    }
                })
                .map_err(werr)?;
        }
        drop(done_tx);
        // At most 2 × workers chunks decoded ahead of the writer.
        let mut next_task = 0;
        while next_task < chunks.min(2 * workers) {
            let _ = task_tx.send(next_task);
            next_task += 1;
        }
        let mut ready: BTreeMap<usize, Decoded> = BTreeMap::new();
        let mut next_write = 0;
        while next_write < chunks {
            // Ctrl-C (or SIGTERM): stop between chunks; the caller's temporary is removed.
            if pipeprof_core::signal::stopping() {
                return Err(CacheError::Interrupted { out: opts.out.clone() });
            }
            let Ok((c, decoded)) = done_rx.recv() else { break };
            ready.insert(c, decoded);
            while let Some(decoded) = ready.remove(&next_write) {
                write_chunk(opts, ds, next_write * CHUNK, decoded, out, progress).map_err(|e| match e {
                    ChunkError::Io(e) => werr(e),
                    ChunkError::Cache(e) => *e,
                })?;
                next_write += 1;
                if next_task < chunks {
                    let _ = task_tx.send(next_task);
                    next_task += 1;
                }
            }
        }
        Ok(())
    })
}

/// Why a chunk was not written: the file, or the data (sizes that differ without a size).
enum ChunkError {
    Io(std::io::Error),
    Cache(Box<CacheError>),
}

impl From<std::io::Error> for ChunkError {
    fn from(e: std::io::Error) -> Self {
        ChunkError::Io(e)
    }
}

/// With no size asked for, an image whose size is not the first one's: nothing can be written.
fn size_differs(ds: &Dataset, out: &Written, path: &Path, h: u32, w: u32) -> Option<ChunkError> {
    let first = out.entries.first()?;
    if (first.height, first.width) == (h, w) {
        return None;
    }
    let which = format!(
        "{} is {}×{}, {} is {w}×{h}",
        clean_name(&out.meta.names[0], MAX_NAME),
        first.width,
        first.height,
        clean_name(&relative(&ds.root, path).display().to_string(), MAX_NAME)
    );
    Some(ChunkError::Cache(Box::new(CacheError::MixedSizes { dir: ds.root.clone(), which })))
}

/// Writes one decoded chunk (samples from `base` on), skipping what failed with a warning.
fn write_chunk(
    opts: &BuildOptions,
    ds: &Dataset,
    base: usize,
    decoded: Decoded,
    out: &mut Written,
    progress: &mut Progress,
) -> Result<(), ChunkError> {
    for (k, r) in decoded.into_iter().enumerate() {
        let sample = &ds.samples[base + k];
        match r {
            Ok((px, height, width)) => {
                if opts.size == Size::Common {
                    if let Some(e) = size_differs(ds, out, &sample.path, height, width) {
                        return Err(e);
                    }
                }
                let offset = out.entries.last().map_or(PIXELS_OFF, |e| {
                    e.offset + u64::from(e.height) * u64::from(e.width) * u64::from(opts.channels)
                });
                out.w.write_all(&px)?;
                out.crcs.push(crc32fast::hash(&px));
                out.labels.push(sample.label);
                out.entries.push(Entry { offset, height, width });
                let name = relative(&ds.root, &sample.path);
                if name.to_str().is_none() {
                    out.meta.exact.names.push((out.meta.names.len(), name.as_os_str().as_bytes().to_vec()));
                }
                out.meta.names.push(name.display().to_string());
                if opts.fail_after == Some(out.labels.len()) {
                    return Err(std::io::Error::other("test hook: simulated failure mid-write").into());
                }
                if opts.abort_after == Some(out.labels.len()) {
                    let _ = out.w.flush();
                    std::process::abort();
                }
            }
            Err(reason) => {
                progress.warn(&sample.path, &reason);
                out.meta.skipped.push((sample.path.display().to_string(), reason));
            }
        }
    }
    progress.update(out.labels.len() + out.meta.skipped.len(), out.meta.skipped.len());
    Ok(())
}

/// Appends labels, checksums, the index and the metadata; returns the header and its encoded
/// bytes (with the CRC over header, labels, checksums, index and metadata), to be written at
/// offset 0.
fn write_index(opts: &BuildOptions, fp: u64, out: &mut Written) -> std::io::Result<(Header, [u8; HEADER_LEN])> {
    let end = out
        .entries
        .last()
        .map_or(PIXELS_OFF, |e| e.offset + u64::from(e.height) * u64::from(e.width) * u64::from(opts.channels));
    let first = out.entries.first().map(|e| (e.height, e.width)).unwrap_or_default();
    let same = out.entries.iter().all(|e| (e.height, e.width) == first);
    let (height, width) = if same { first } else { (0, 0) };
    let labels_b: Vec<u8> = out.labels.iter().flat_map(|l| l.to_le_bytes()).collect();
    let crcs_b: Vec<u8> = out.crcs.iter().flat_map(|c| c.to_le_bytes()).collect();
    let index_b = encode_index(&out.entries);
    debug_assert_eq!(index_b.len(), out.entries.len() * ENTRY_LEN);
    let meta_b = out.meta.encode_json();
    let labels_off = end;
    let crcs_off = labels_off + labels_b.len() as u64;
    let index_off = crcs_off + crcs_b.len() as u64;
    let meta_off = index_off + index_b.len() as u64;
    let header = Header {
        version: VERSION,
        height,
        width,
        channels: opts.channels,
        count: out.labels.len() as u64,
        fingerprint: fp,
        pixels_off: PIXELS_OFF,
        labels_off,
        crcs_off,
        meta_off,
        meta_len: meta_b.len() as u64,
        file_len: meta_off + meta_b.len() as u64,
        index_off,
    };
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&Header::crc_input(&header.encode(0)));
    for part in [&labels_b, &crcs_b, &index_b, &meta_b] {
        out.w.write_all(part)?;
        hasher.update(part);
    }
    let head = header.encode(hasher.finalize());
    Ok((header, head))
}

/// The samples with paths under the canonical root (so relative names and the fingerprint do
/// not depend on how the folder was named on the command line).
fn rebase(ds: &Dataset, root: &Path) -> Vec<crate::data::scan::Sample> {
    ds.samples
        .iter()
        .map(|s| crate::data::scan::Sample { path: root.join(relative(&ds.root, &s.path)), label: s.label })
        .collect()
}

/// The cache's progress line (shared with the other commands), or nothing.
struct Progress {
    line: Option<crate::progress::Line>,
    total: usize,
    t0: Instant,
    verb: &'static str,
}

impl Progress {
    fn new(on: bool, total: usize, verb: &'static str) -> Progress {
        let line = on.then(|| crate::progress::Line::new(std::time::Duration::from_secs(5)));
        Progress { line, total, t0: Instant::now(), verb }
    }

    fn update(&mut self, done: usize, skipped: usize) {
        let Some(line) = &mut self.line else { return };
        let secs = self.t0.elapsed().as_secs_f64().max(1e-9);
        let text = format!(
            "{} {done}/{} images ({:.0}%) · {skipped} skipped · {:.0} images/s",
            self.verb,
            self.total,
            100.0 * done as f64 / self.total.max(1) as f64,
            done as f64 / secs
        );
        line.set(text, done >= self.total);
    }

    /// The loader's warning format, one line per file.
    fn warn(&mut self, path: &Path, reason: &str) {
        if self.line.is_some() {
            crate::progress::warn(&format!("skipped {}: {}", shown(path), clean_name(reason, MAX_PATH_SHOWN)));
        }
    }

    fn finish(&mut self) {
        self.line = None;
    }
}
