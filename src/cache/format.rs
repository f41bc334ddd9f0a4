//! The on-disk layout: header and metadata encoding, and the source fingerprint. Pure.

use crate::data::Dataset;
use crate::model_source::ModelSource;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// First 8 bytes of every cache (PNG-style: catches text-mode and 7-bit transfers).
pub const MAGIC: [u8; 8] = *b"\x89PPK\r\n\x1a\n";
/// Format version this build reads and writes.
pub const VERSION: u32 = 1;
/// Bytes of the fixed header.
pub const HEADER_LEN: usize = 128;
/// Where the pixels start: page-aligned.
pub const PIXELS_OFF: u64 = 4096;
/// Where the header's CRC-32 sits (it covers every header byte before it).
const CRC_AT: usize = HEADER_LEN - 4;

/// The fixed header. Offsets are absolute byte positions in the file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Header {
    pub version: u32,
    pub height: u32,
    pub width: u32,
    pub channels: u32,
    pub count: u64,
    pub fingerprint: u64,
    pub pixels_off: u64,
    pub labels_off: u64,
    pub crcs_off: u64,
    pub meta_off: u64,
    pub meta_len: u64,
    pub file_len: u64,
}

impl Header {
    /// Bytes of one image.
    pub fn image_len(&self) -> u64 {
        self.height as u64 * self.width as u64 * self.channels as u64
    }

    /// The header bytes; the CRC field holds `crc` (computed by the caller over the header
    /// with a zero CRC field, then the labels, checksums and metadata).
    pub fn encode(&self, crc: u32) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..8].copy_from_slice(&MAGIC);
        let mut at = 8;
        let mut put = |v: &[u8]| {
            b[at..at + v.len()].copy_from_slice(v);
            at += v.len();
        };
        for v in [self.version, self.height, self.width, self.channels] {
            put(&v.to_le_bytes());
        }
        for v in [
            self.count,
            self.fingerprint,
            self.pixels_off,
            self.labels_off,
            self.crcs_off,
            self.meta_off,
            self.meta_len,
            self.file_len,
        ] {
            put(&v.to_le_bytes());
        }
        b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses the fixed fields (magic and version are checked by the caller, who knows the
    /// file's name). Returns the header and its stored CRC.
    pub fn decode(b: &[u8; HEADER_LEN]) -> (Header, u32) {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        let h = Header {
            version: u32_at(8),
            height: u32_at(12),
            width: u32_at(16),
            channels: u32_at(20),
            count: u64_at(24),
            fingerprint: u64_at(32),
            pixels_off: u64_at(40),
            labels_off: u64_at(48),
            crcs_off: u64_at(56),
            meta_off: u64_at(64),
            meta_len: u64_at(72),
            file_len: u64_at(80),
        };
        (h, u32_at(CRC_AT))
    }

    /// The header bytes with a zero CRC field, for computing the CRC.
    pub fn crc_input(bytes: &[u8; HEADER_LEN]) -> [u8; HEADER_LEN] {
        let mut b = *bytes;
        b[CRC_AT..].fill(0);
        b
    }
}

/// What the cache knows about where it came from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Meta {
    /// The source folder, absolute.
    pub source: PathBuf,
    /// The model given to `pipeprof cache` (or the built-in), stored by its name.
    pub model: ModelSource,
    pub classes: Vec<String>,
    /// Each stored image's path relative to the source, in storage order.
    pub names: Vec<String>,
    /// Files skipped at build time: (path, reason).
    pub skipped: Vec<(String, String)>,
}

fn put_bytes(o: &mut Vec<u8>, b: &[u8]) {
    o.extend_from_slice(&(b.len() as u32).to_le_bytes());
    o.extend_from_slice(b);
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn u32(&mut self) -> Option<u32> {
        let (h, t) = self.0.split_first_chunk::<4>()?;
        self.0 = t;
        Some(u32::from_le_bytes(*h))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        if n > self.0.len() {
            return None;
        }
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        Some(h)
    }
    fn string(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }
}

impl Meta {
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::new();
        put_bytes(&mut o, self.source.as_os_str().as_bytes());
        put_bytes(&mut o, self.model.name().as_bytes());
        o.extend_from_slice(&(self.classes.len() as u32).to_le_bytes());
        for c in &self.classes {
            put_bytes(&mut o, c.as_bytes());
        }
        o.extend_from_slice(&(self.names.len() as u32).to_le_bytes());
        for n in &self.names {
            put_bytes(&mut o, n.as_bytes());
        }
        o.extend_from_slice(&(self.skipped.len() as u32).to_le_bytes());
        for (p, r) in &self.skipped {
            put_bytes(&mut o, p.as_bytes());
            put_bytes(&mut o, r.as_bytes());
        }
        o
    }

    /// `None` when the bytes do not parse (the caller reports the file as damaged).
    pub fn decode(b: &[u8]) -> Option<Meta> {
        let mut c = Cursor(b);
        let source = PathBuf::from(std::ffi::OsStr::from_bytes(c.bytes()?));
        let model = ModelSource::from_name(&c.string()?);
        let list = |c: &mut Cursor| -> Option<Vec<String>> {
            let n = c.u32()? as usize;
            // Every entry takes at least 4 bytes: a corrupt count cannot allocate much.
            let mut v = Vec::with_capacity(n.min(c.0.len() / 4));
            for _ in 0..n {
                v.push(c.string()?);
            }
            Some(v)
        };
        let classes = list(&mut c)?;
        let names = list(&mut c)?;
        let n = c.u32()? as usize;
        let mut skipped = Vec::with_capacity(n.min(c.0.len() / 8));
        for _ in 0..n {
            skipped.push((c.string()?, c.string()?));
        }
        Some(Meta { source, model, classes, names, skipped })
    }
}

/// FNV-1a, 64 bits: stable across Rust versions and platforms (std's hasher is not promised
/// to be). For change detection, not adversaries.
struct Fnv(u64);

impl Fnv {
    fn eat(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01B3);
        }
    }
}

/// Hash over (relative path, size, mtime in ns) of every image file in the scan, in scan
/// order. A file that cannot be stat'ed counts with size and mtime 0.
pub fn fingerprint(ds: &Dataset) -> u64 {
    let mut h = Fnv(0xCBF2_9CE4_8422_2325);
    for s in &ds.samples {
        let rel = relative(&ds.root, &s.path);
        h.eat(rel.as_os_str().as_bytes());
        h.eat(&[0]);
        let (size, mtime) = std::fs::metadata(&s.path)
            .map(|m| (m.size(), m.mtime().wrapping_mul(1_000_000_000).wrapping_add(m.mtime_nsec())))
            .unwrap_or((0, 0));
        h.eat(&size.to_le_bytes());
        h.eat(&mtime.to_le_bytes());
        h.eat(&s.label.to_le_bytes());
    }
    h.0
}

/// `path` relative to `root` (itself when it is not below `root`).
pub fn relative<'a>(root: &Path, path: &'a Path) -> &'a Path {
    path.strip_prefix(root).unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_with_its_crc() {
        let h = Header {
            version: VERSION,
            height: 150,
            width: 120,
            channels: 3,
            count: 7,
            fingerprint: 0xDEAD_BEEF_0123,
            pixels_off: PIXELS_OFF,
            labels_off: 1,
            crcs_off: 2,
            meta_off: 3,
            meta_len: 4,
            file_len: 5,
        };
        let b = h.encode(0x1234_5678);
        assert_eq!(&b[..8], &MAGIC);
        assert_eq!(Header::decode(&b), (h, 0x1234_5678));
        assert_eq!(&Header::crc_input(&b)[CRC_AT..], &[0, 0, 0, 0]);
    }

    #[test]
    fn meta_round_trips_and_garbage_does_not_parse() {
        let m = Meta {
            source: "/data/imgs".into(),
            model: "cnn.toml".into(),
            classes: vec!["cat".into(), "dög".into()],
            names: vec!["cat/1.jpg".into()],
            skipped: vec![("dög/x.png".into(), "empty file (0 bytes)".into())],
        };
        let b = m.encode();
        assert_eq!(Meta::decode(&b), Some(m));
        assert_eq!(Meta::decode(&b[..b.len() - 1]), None);
        assert_eq!(Meta::decode(&[0xFF; 3]), None);
    }
}
