//! Writing a cache: scan, decode + resize on every core, write in order to a temporary file,
//! fsync, rename.

use super::format::{fingerprint, relative, Header, Meta, HEADER_LEN, PIXELS_OFF, VERSION};
use super::CacheError;
use crate::aggregate::settings::{clean_name, shown, MAX_NAME, MAX_PATH_SHOWN};
use crate::data::image::{decode_for, Resizer};
use crate::data::{scan, Dataset};
use crate::model_source::ModelSource;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
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
    pub height: u32,
    pub width: u32,
    pub channels: u32,
    /// The model (stored by name, for the rebuild command in messages).
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

type Decoded = Vec<Result<Vec<u8>, String>>;

/// Decodes and resizes one sample to u8 HWC, exactly as the loader does before its f32
/// conversion; the error text matches the loader's skip reasons.
fn decode_one(path: &Path, opts: &BuildOptions, resizer: &mut Resizer) -> Result<Vec<u8>, String> {
    let bytes = crate::data::loader::read_capped(path, crate::data::loader::MAX_IMAGE_BYTES)?;
    #[allow(clippy::panic)]
    if opts.panic_on.as_deref().is_some_and(|p| path.to_string_lossy().contains(p)) {
        panic!("test hook: the decoder panics on {}", path.display());
    }
    let px = decode_for(&bytes, opts.channels as usize, opts.width, opts.height).map_err(|e| e.to_string())?;
    resizer.resize_u8(&px, opts.width, opts.height).map(<[u8]>::to_vec).map_err(|e| e.to_string())
}

/// [`decode_one`], with a panic in the decoder (a bug it has on some hostile file) caught:
/// that sample is skipped and named, and the build goes on. Without this the panicking
/// thread's chunk never reached the writer, which waited for it forever.
fn decode_guarded(path: &Path, opts: &BuildOptions, resizer: &mut Resizer) -> Result<Vec<u8>, String> {
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
    let ds = scan(&opts.data)?;
    if opts.progress {
        for p in &ds.problems {
            crate::progress::warn(&format!("{}: {}", shown(&p.path), clean_name(&p.reason, MAX_PATH_SHOWN)));
        }
        for c in &ds.empty_classes {
            crate::progress::warn(&crate::data::scan::empty_class_warning(&ds.root, c));
        }
    }
    let source = std::fs::canonicalize(&ds.root).unwrap_or_else(|_| ds.root.clone());
    let ds = Dataset { root: source.clone(), samples: rebase(&ds, &source), ..ds };
    remove_stale_temps(&opts.out);
    let (file, path) = create_temp(&opts.out).map_err(|source| CacheError::Write { path: opts.out.clone(), source })?;
    let tmp = Temp { path, keep: false };
    let werr = |source| CacheError::Write { path: tmp.path.clone(), source };
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    w.write_all(&vec![0u8; PIXELS_OFF as usize]).map_err(werr)?;
    let meta = Meta { source, model: opts.model.clone(), classes: ds.classes.clone(), ..Meta::default() };
    let mut out = Written { w, labels: Vec::new(), crcs: Vec::new(), meta };
    let mut progress = Progress::new(opts.progress, ds.samples.len());
    let written = write_pixels(opts, &ds, &mut out, &mut progress).map_err(werr);
    progress.finish();
    written?;
    if out.labels.is_empty() {
        return Err(CacheError::NoUsable { dir: opts.data.clone(), skipped: out.meta.skipped.len() });
    }
    if opts.progress {
        warn_classes_without_images(&out, &ds.root);
    }
    let header = write_index(opts, fingerprint(&ds), &mut out).map_err(werr)?;
    let mut file = out.w.into_inner().map_err(|e| werr(e.into_error()))?;
    file.seek(SeekFrom::Start(0)).map_err(werr)?;
    file.write_all(&header.1).map_err(werr)?;
    file.sync_all().map_err(werr)?;
    drop(file);
    std::fs::rename(&tmp.path, &opts.out).map_err(|source| CacheError::Write { path: opts.out.clone(), source })?;
    let mut tmp = tmp;
    tmp.keep = true;
    // The rename is durable once the folder's entry is on disk too.
    if let Some(dir) = opts.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(BuildReport {
        images: out.labels.len(),
        classes: ds.classes.clone(),
        skipped: out.meta.skipped,
        bytes: header.0.file_len,
        secs: t0.elapsed().as_secs_f64(),
    })
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
    meta: Meta,
}

/// Decodes every sample on `opts.workers` threads and writes the pixels in sample order.
fn write_pixels(opts: &BuildOptions, ds: &Dataset, out: &mut Written, progress: &mut Progress) -> std::io::Result<()> {
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
            std::thread::Builder::new().name(format!("cache-{t}")).spawn_scoped(s, move || {
                let mut resizer = Resizer::new();
                for c in task_rx.iter() {
                    let part = &ds.samples[c * CHUNK..((c + 1) * CHUNK).min(ds.samples.len())];
                    let decoded = part.iter().map(|x| decode_guarded(&x.path, opts, &mut resizer)).collect();
                    if done_tx.send((c, decoded)).is_err() {
                        return;
                    }
                }
            })?;
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
            let Ok((c, decoded)) = done_rx.recv() else { break };
            ready.insert(c, decoded);
            while let Some(decoded) = ready.remove(&next_write) {
                write_chunk(opts, ds, next_write * CHUNK, decoded, out, progress)?;
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

/// Writes one decoded chunk (samples from `base` on), skipping what failed with a warning.
fn write_chunk(
    opts: &BuildOptions,
    ds: &Dataset,
    base: usize,
    decoded: Decoded,
    out: &mut Written,
    progress: &mut Progress,
) -> std::io::Result<()> {
    for (k, r) in decoded.into_iter().enumerate() {
        let sample = &ds.samples[base + k];
        match r {
            Ok(px) => {
                out.w.write_all(&px)?;
                out.crcs.push(crc32fast::hash(&px));
                out.labels.push(sample.label);
                out.meta.names.push(relative(&ds.root, &sample.path).display().to_string());
                if opts.fail_after == Some(out.labels.len()) {
                    return Err(std::io::Error::other("test hook: simulated failure mid-write"));
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

/// Appends labels, checksums and metadata; returns the header and its encoded bytes (with the
/// CRC over header, labels, checksums and metadata), to be written at offset 0.
fn write_index(opts: &BuildOptions, fp: u64, out: &mut Written) -> std::io::Result<(Header, [u8; HEADER_LEN])> {
    let image_len = opts.height as u64 * opts.width as u64 * opts.channels as u64;
    let labels_off = PIXELS_OFF + out.labels.len() as u64 * image_len;
    let labels_b: Vec<u8> = out.labels.iter().flat_map(|l| l.to_le_bytes()).collect();
    let crcs_b: Vec<u8> = out.crcs.iter().flat_map(|c| c.to_le_bytes()).collect();
    let meta_b = out.meta.encode();
    let crcs_off = labels_off + labels_b.len() as u64;
    let meta_off = crcs_off + crcs_b.len() as u64;
    let header = Header {
        version: VERSION,
        height: opts.height,
        width: opts.width,
        channels: opts.channels,
        count: out.labels.len() as u64,
        fingerprint: fp,
        pixels_off: PIXELS_OFF,
        labels_off,
        crcs_off,
        meta_off,
        meta_len: meta_b.len() as u64,
        file_len: meta_off + meta_b.len() as u64,
    };
    for part in [&labels_b, &crcs_b, &meta_b] {
        out.w.write_all(part)?;
    }
    let zero_crc = header.encode(0);
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&Header::crc_input(&zero_crc));
    hasher.update(&labels_b);
    hasher.update(&crcs_b);
    hasher.update(&meta_b);
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
}

impl Progress {
    fn new(on: bool, total: usize) -> Progress {
        let line = on.then(|| crate::progress::Line::new(std::time::Duration::from_secs(5)));
        Progress { line, total, t0: Instant::now() }
    }

    fn update(&mut self, done: usize, skipped: usize) {
        let Some(line) = &mut self.line else { return };
        let secs = self.t0.elapsed().as_secs_f64().max(1e-9);
        let text = format!(
            "caching {done}/{} images ({:.0}%) · {skipped} skipped · {:.0} images/s",
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
