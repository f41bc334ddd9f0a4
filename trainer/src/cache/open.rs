//! Opening a cache: read and check everything, then read each image when the loader asks.
//!
//! Read with `pread`, never memory-mapped: a map faults (SIGBUS, pipeprof killed) when the
//! file is truncated or rewritten in place under the run (`cp new.ppk X.ppk`, `truncate`).
//! Read, such a change is an error, and each image is checked against the checksum verified at
//! open, so an image rewritten in place is skipped with why, never trained on. Memory stays one
//! image per loader thread whatever the cache's size.

use super::format::{decode_index, fingerprint, Entry, Header, Meta, Size, HEADER_LEN, MAGIC, OLDEST_READ, VERSION};
use super::{rerun_command, CacheError};
use pipeprof_core::aggregate::settings::{clean_name, shown, MAX_NAME};
use pipeprof_core::model_source::ModelSource;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Bytes each checking thread reads at a time while verifying at open.
const VERIFY_CHUNK: u64 = 4 << 20;

/// An opened, verified cache.
pub struct Packed {
    file: File,
    header: Header,
    meta: Meta,
    path: PathBuf,
    labels: Vec<u32>,
    /// Each image's checksum, verified at open and again at every read.
    crcs: Vec<u32>,
    /// Where each image is and its size.
    entries: Vec<Entry>,
    /// The command that rebuilds it, for messages.
    rerun: String,
    /// Whether the source folder was there to be compared with (else staleness is unknown).
    source_checked: bool,
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packed").field("path", &self.path).field("header", &self.header).finish()
    }
}

fn u32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// `size` bytes at `off` (inside the file: checked by the caller).
fn read_at(file: &File, off: u64, size: u64) -> std::io::Result<Vec<u8>> {
    let mut b = vec![0u8; size as usize];
    file.read_exact_at(&mut b, off)?;
    Ok(b)
}

/// The header of `file` (`len` bytes, read from `path`): its bytes, decoded, and its stored
/// checksum; an error when it is not a cache, of a version not read here, or its lengths do
/// not fit the file.
fn read_header(file: &File, len: u64, path: &Path) -> Result<([u8; HEADER_LEN], Header, u32), CacheError> {
    let generic = rerun_command(None, path);
    let damaged = |what: String| CacheError::Damaged { path: path.to_path_buf(), what, rerun: generic.clone() };
    let mut head = [0u8; HEADER_LEN];
    let got = read_at(file, 0, len.min(HEADER_LEN as u64))
        .map_err(|source| CacheError::Read { path: path.to_path_buf(), source })?;
    head[..got.len()].copy_from_slice(&got);
    if got.len() < 8 || head[..8] != MAGIC {
        return Err(CacheError::NotACache { path: path.to_path_buf(), rerun: generic });
    }
    if got.len() < HEADER_LEN {
        return Err(damaged(format!("truncated: {len} bytes, shorter than the {HEADER_LEN}-byte header")));
    }
    let (h, stored_crc) = Header::decode(&head);
    if !(OLDEST_READ..=VERSION).contains(&h.version) {
        return Err(CacheError::Version { path: path.to_path_buf(), found: h.version, rerun: generic });
    }
    if h.file_len != len {
        let how = if len < h.file_len { "truncated" } else { "longer than written" };
        return Err(damaged(format!("{how}: {len} bytes, the header says {}", h.file_len)));
    }
    h.check_layout(len).map_err(damaged)?;
    Ok((head, h, stored_crc))
}

impl Packed {
    /// Opens `path`: magic, version, lengths, header CRC, every image's CRC, and — when the
    /// source folder still exists — its fingerprint. Anything wrong is an error naming the
    /// file and the command that rebuilds it.
    pub fn open(path: &Path) -> Result<Packed, CacheError> {
        let read_err = |source| CacheError::Read { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(read_err)?;
        let len = file.metadata().map_err(read_err)?.len();
        let generic = rerun_command(None, path);
        let damaged = |what: String, rerun: &str| CacheError::Damaged {
            path: path.to_path_buf(),
            what,
            rerun: rerun.to_string(),
        };
        let (head, h, stored_crc) = read_header(&file, len, path)?;
        let (n, v1, (index_at, index_len)) = (h.count, h.version == 1, h.index_section());
        // A read that fails now (the file shrank since its length was taken) is a read error.
        let labels_b = read_at(&file, h.labels_off, n * 4).map_err(read_err)?;
        let crcs_b = read_at(&file, h.crcs_off, n * 4).map_err(read_err)?;
        let index_b = read_at(&file, index_at, index_len).map_err(read_err)?;
        let meta_b = read_at(&file, h.meta_off, h.meta_len).map_err(read_err)?;
        let mut hasher = crc32fast::Hasher::new();
        for part in [&Header::crc_input(&head)[..], &labels_b, &crcs_b, &index_b, &meta_b] {
            hasher.update(part);
        }
        if hasher.finalize() != stored_crc {
            return Err(damaged("header checksum mismatch".into(), &generic));
        }
        let meta = if v1 {
            Meta::decode(&meta_b).map(|m| Meta { size: Size::Fixed { height: h.height, width: h.width }, ..m })
        } else {
            Meta::decode_json(&meta_b)
        };
        let Some(meta) = meta else {
            return Err(damaged("unreadable metadata".into(), &generic));
        };
        let rerun = rerun_command(Some(&meta), path);
        let labels = u32s(&labels_b);
        if meta.names.len() as u64 != n || labels.iter().any(|l| *l as usize >= meta.classes.len()) {
            return Err(damaged("index does not match the metadata".into(), &rerun));
        }
        let entries = decode_index(&h, &index_b).map_err(|what| damaged(what, &rerun))?;
        let crcs = u32s(&crcs_b);
        if let Some(bad) = first_bad_image(&file, &h, &entries, &crcs).map_err(read_err)? {
            let name = clean_name(&meta.names[bad], MAX_NAME);
            return Err(damaged(format!("checksum mismatch in image {bad} ({name})"), &rerun));
        }
        let source_checked = meta.source.is_dir();
        if source_checked {
            check_fresh(path, &meta, &h, &rerun)?;
        }
        Ok(Packed { file, header: h, meta, path: path.to_path_buf(), labels, crcs, entries, rerun, source_checked })
    }

    /// Image `i`'s u8 HWC pixels, read into `buf` and checked against its checksum; why not
    /// when the file changed since it was opened (truncated, or rewritten in place): that
    /// image is skipped, never trained on. Panics if `i` ≥ [`Self::len`].
    pub fn read_pixels(&self, i: usize, buf: &mut Vec<u8>) -> Result<(), String> {
        let e = self.entries[i];
        buf.resize(self.entry_len(&e) as usize, 0);
        let what = match self.file.read_exact_at(buf, e.offset) {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => "it is shorter now".to_string(),
            Err(e) => e.to_string(),
            Ok(()) if crc32fast::hash(buf) != self.crcs[i] => "this image's bytes differ".to_string(),
            Ok(()) => return Ok(()),
        };
        Err(format!(
            "{} changed on disk while in use ({what}): skipped; rebuild it with `{}` (pipeprof cache replaces a file by renaming, so a run reading it is not disturbed)",
            shown(&self.path),
            self.rerun
        ))
    }

    /// [`Self::read_pixels`] into a new buffer.
    pub fn pixels(&self, i: usize) -> Result<Vec<u8>, String> {
        let mut b = Vec::new();
        self.read_pixels(i, &mut b).map(|()| b)
    }

    /// Bytes of the image `e` describes.
    fn entry_len(&self, e: &Entry) -> u64 {
        u64::from(e.height) * u64::from(e.width) * u64::from(self.header.channels)
    }

    /// Image `i`'s (height, width).
    pub fn size_of(&self, i: usize) -> (u32, u32) {
        (self.entries[i].height, self.entries[i].width)
    }

    /// Refuses a cache whose images are not the model's input size.
    pub fn check_input(&self, height: u32, width: u32, channels: u32, model: &ModelSource) -> Result<(), CacheError> {
        let h = &self.header;
        if h.height == 0 {
            return Err(CacheError::Varying { path: self.path.clone(), height, width });
        }
        let mut which = Vec::new();
        if h.height != height {
            which.push("height");
        }
        if h.width != width {
            which.push("width");
        }
        if h.channels != channels {
            which.push("channels");
        }
        if which.is_empty() {
            return Ok(());
        }
        Err(CacheError::Shape {
            path: self.path.clone(),
            cache: format!("{}×{}×{} (H×W×C)", h.height, h.width, h.channels),
            model: format!("{height}×{width}×{channels}"),
            which: which.join(" and "),
            rerun: super::cache_command(Some(model), Some(&self.meta.source), &self.path),
        })
    }

    pub fn len(&self) -> usize {
        self.header.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.header.count == 0
    }

    /// (height, width, channels); height and width are 0 when the images' sizes vary.
    pub fn shape(&self) -> (u32, u32, u32) {
        (self.header.height, self.header.width, self.header.channels)
    }

    pub fn label(&self, i: usize) -> u32 {
        self.labels[i]
    }

    pub fn labels(&self) -> &[u32] {
        &self.labels
    }

    pub fn classes(&self) -> &[String] {
        &self.meta.classes
    }

    /// Image `i`'s path relative to the source folder.
    pub fn name(&self, i: usize) -> &str {
        &self.meta.names[i]
    }

    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the source folder existed and matched; `false` when it is gone (staleness
    /// could not be checked).
    pub fn source_checked(&self) -> bool {
        self.source_checked
    }
}

/// The first image whose CRC does not match, checked on every core, each thread reading its
/// share a few MB at a time (images are contiguous: [`decode_index`] checked).
fn first_bad_image(file: &File, h: &Header, entries: &[Entry], crcs: &[u32]) -> std::io::Result<Option<usize>> {
    let c = u64::from(h.channels);
    let len = |e: &Entry| u64::from(e.height) * u64::from(e.width) * c;
    let threads = std::thread::available_parallelism().map(|t| t.get()).unwrap_or(1).min(crcs.len().max(1));
    let per = crcs.len().div_ceil(threads).max(1);
    let check = |start: usize, part: &[Entry]| -> std::io::Result<Option<usize>> {
        let mut buf = Vec::new();
        let mut first = 0;
        while first < part.len() {
            // As many whole images as fit in VERIFY_CHUNK, at least one.
            let (mut end, mut bytes) = (first, 0);
            while end < part.len() && (end == first || bytes + len(&part[end]) <= VERIFY_CHUNK) {
                bytes += len(&part[end]);
                end += 1;
            }
            buf.resize(bytes as usize, 0);
            file.read_exact_at(&mut buf, part[first].offset)?;
            let mut at = 0usize;
            for (k, e) in part[first..end].iter().enumerate() {
                let n = len(e) as usize;
                if crc32fast::hash(&buf[at..at + n]) != crcs[start + first + k] {
                    return Ok(Some(start + first + k));
                }
                at += n;
            }
            first = end;
        }
        Ok(None)
    };
    std::thread::scope(|s| {
        let handles: Vec<_> =
            entries.chunks(per).enumerate().map(|(t, part)| s.spawn(move || check(t * per, part))).collect();
        let mut first_bad: Option<usize> = None;
        for (t, h) in handles.into_iter().enumerate() {
            // A panicked checker counts as a mismatch at its first image: never use unchecked data.
            if let Some(bad) = h.join().unwrap_or(Ok(Some(t * per)))? {
                first_bad = Some(first_bad.map_or(bad, |b| b.min(bad)));
            }
        }
        Ok(first_bad)
    })
}

/// Refuses a cache whose source folder changed since it was written (stale).
fn check_fresh(path: &Path, meta: &Meta, h: &Header, rerun: &str) -> Result<(), CacheError> {
    let stale = |what: String| CacheError::Stale {
        path: path.to_path_buf(),
        source_dir: meta.source.clone(),
        what,
        rerun: rerun.to_string(),
    };
    let ds = crate::data::scan::scan_with(&meta.source, meta.rules)
        .map_err(|e| stale(format!("the folder cannot be scanned any more ({e})")))?;
    if fingerprint(&ds) != h.fingerprint {
        let then = meta.names.len() + meta.skipped.len();
        let now = ds.samples.len();
        return Err(stale(if then == now {
            format!("image files were modified, renamed or touched ({now} files, as before)")
        } else {
            format!("image files were added or removed ({then} then, {now} now)")
        }));
    }
    Ok(())
}
