//! Opening a cache: map it, check everything, then hand out per-image slices.

use super::format::{fingerprint, Header, Meta, HEADER_LEN, MAGIC, VERSION};
use super::{rerun_command, CacheError};
use std::fs::File;
use std::path::{Path, PathBuf};

/// A read-only memory map of a whole file.
///
/// Invariant that makes the one `unsafe` sound: the mapped file is not truncated or written
/// while it is mapped. pipeprof writes caches only through a temporary name and a rename,
/// which gives the final name a new inode and leaves any mapping of the old file intact.
/// Another program truncating the file in place would make reads fault (SIGBUS), the known
/// limit of any file mapping; a cache is not something users edit.
struct Mapped(memmap2::Mmap);

impl Mapped {
    fn new(file: &File) -> std::io::Result<Mapped> {
        // SAFETY: see the type's invariant; the map is only ever read through `&[u8]`.
        #[allow(unsafe_code)]
        let map = unsafe { memmap2::Mmap::map(file)? };
        Ok(Mapped(map))
    }

    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// An opened, verified cache.
pub struct Packed {
    map: Mapped,
    header: Header,
    meta: Meta,
    path: PathBuf,
    labels: Vec<u32>,
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

impl Packed {
    /// Opens `path`: magic, version, lengths, header CRC, every image's CRC, and — when the
    /// source folder still exists — its fingerprint. Anything wrong is an error naming the
    /// file and the command that rebuilds it.
    pub fn open(path: &Path) -> Result<Packed, CacheError> {
        let read_err = |source| CacheError::Read { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(read_err)?;
        let len = file.metadata().map_err(read_err)?.len();
        let generic = rerun_command(None, None, path);
        let damaged = |what: String, rerun: &str| CacheError::Damaged {
            path: path.to_path_buf(),
            what,
            rerun: rerun.to_string(),
        };
        if len < 8 {
            return Err(CacheError::NotACache { path: path.to_path_buf(), rerun: generic });
        }
        let map = Mapped::new(&file).map_err(read_err)?;
        let b = map.bytes();
        if b[..8] != MAGIC {
            return Err(CacheError::NotACache { path: path.to_path_buf(), rerun: generic });
        }
        let Some(head) = b.first_chunk::<HEADER_LEN>() else {
            return Err(damaged(
                format!("truncated: {len} bytes, shorter than the {HEADER_LEN}-byte header"),
                &generic,
            ));
        };
        let (h, stored_crc) = Header::decode(head);
        if h.version != VERSION {
            return Err(CacheError::Version { path: path.to_path_buf(), found: h.version, rerun: generic });
        }
        if h.file_len != len {
            let how = if len < h.file_len { "truncated" } else { "longer than written" };
            return Err(damaged(format!("{how}: {len} bytes, the header says {}", h.file_len), &generic));
        }
        let n = h.count;
        let sections = [
            ("pixels", h.pixels_off, n.checked_mul(h.image_len())),
            ("labels", h.labels_off, n.checked_mul(4)),
            ("checksums", h.crcs_off, n.checked_mul(4)),
            ("metadata", h.meta_off, Some(h.meta_len)),
        ];
        for (name, off, size) in sections {
            if size.and_then(|s| s.checked_add(off)).is_none_or(|end| end > len) || off < HEADER_LEN as u64 {
                return Err(damaged(format!("the {name} section lies outside the file"), &generic));
            }
        }
        if h.image_len() == 0 || !matches!(h.channels, 1 | 3) {
            return Err(damaged(format!("impossible image shape {}×{}×{}", h.height, h.width, h.channels), &generic));
        }
        let slice = |off: u64, size: u64| &b[off as usize..(off + size) as usize];
        let labels_b = slice(h.labels_off, n * 4);
        let crcs_b = slice(h.crcs_off, n * 4);
        let meta_b = slice(h.meta_off, h.meta_len);
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&Header::crc_input(head));
        hasher.update(labels_b);
        hasher.update(crcs_b);
        hasher.update(meta_b);
        if hasher.finalize() != stored_crc {
            return Err(damaged("header checksum mismatch".into(), &generic));
        }
        let Some(meta) = Meta::decode(meta_b) else {
            return Err(damaged("unreadable metadata".into(), &generic));
        };
        let rerun = rerun_command(Some(&meta.model), Some(&meta.source), path);
        let labels = u32s(labels_b);
        if meta.names.len() as u64 != n || labels.iter().any(|l| *l as usize >= meta.classes.len()) {
            return Err(damaged("index does not match the metadata".into(), &rerun));
        }
        let crcs = u32s(crcs_b);
        if let Some(bad) = first_bad_image(b, &h, &crcs) {
            return Err(damaged(format!("checksum mismatch in image {bad} ({})", meta.names[bad]), &rerun));
        }
        let source_checked = meta.source.is_dir();
        if source_checked {
            let ds = crate::data::scan(&meta.source).map_err(|e| CacheError::Stale {
                path: path.to_path_buf(),
                source_dir: meta.source.clone(),
                what: format!("the folder cannot be scanned any more ({e})"),
                rerun: rerun.clone(),
            })?;
            if fingerprint(&ds) != h.fingerprint {
                let then = meta.names.len() + meta.skipped.len();
                let now = ds.samples.len();
                let what = if then == now {
                    format!("image files were modified, renamed or touched ({now} files, as before)")
                } else {
                    format!("image files were added or removed ({then} then, {now} now)")
                };
                return Err(CacheError::Stale {
                    path: path.to_path_buf(),
                    source_dir: meta.source.clone(),
                    what,
                    rerun,
                });
            }
        }
        Ok(Packed { map, header: h, meta, path: path.to_path_buf(), labels, source_checked })
    }

    /// Refuses a cache whose images are not the model's input size.
    pub fn check_input(&self, height: u32, width: u32, channels: u32, model: &str) -> Result<(), CacheError> {
        let h = &self.header;
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
            rerun: rerun_command(Some(model), Some(&self.meta.source), &self.path),
        })
    }

    pub fn len(&self) -> usize {
        self.header.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.header.count == 0
    }

    /// (height, width, channels).
    pub fn shape(&self) -> (u32, u32, u32) {
        (self.header.height, self.header.width, self.header.channels)
    }

    /// Image `i`'s u8 HWC pixels, a slice of the mapped file. Panics if `i` ≥ [`Self::len`].
    pub fn pixels(&self, i: usize) -> &[u8] {
        let n = self.header.image_len() as usize;
        let at = self.header.pixels_off as usize + i * n;
        &self.map.bytes()[at..at + n]
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

/// The first image whose CRC does not match, checked on every core.
fn first_bad_image(b: &[u8], h: &Header, crcs: &[u32]) -> Option<usize> {
    let n = h.image_len() as usize;
    let pixels = &b[h.pixels_off as usize..h.pixels_off as usize + crcs.len() * n];
    let threads = std::thread::available_parallelism().map(|t| t.get()).unwrap_or(1).min(crcs.len().max(1));
    let per = crcs.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = crcs
            .chunks(per)
            .enumerate()
            .map(|(t, part)| {
                let start = t * per;
                s.spawn(move || {
                    part.iter()
                        .enumerate()
                        .find(|(k, crc)| {
                            let i = start + k;
                            crc32fast::hash(&pixels[i * n..(i + 1) * n]) != **crc
                        })
                        .map(|(k, _)| start + k)
                })
            })
            .collect();
        // A panicked checker counts as a mismatch at its first image: never use unchecked data.
        handles.into_iter().enumerate().filter_map(|(t, h)| h.join().unwrap_or(Some(t * per))).min()
    })
}
