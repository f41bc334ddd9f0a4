//! The on-disk layout: header and metadata encoding, the per-image index, and the source
//! fingerprint. Pure. docs/packed-format.md documents it for readers written without pipeprof.

use crate::data::scan::Rules;
use crate::data::Dataset;
use pipeprof_core::model_source::ModelSource;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// First 8 bytes of every cache (PNG-style: catches text-mode and 7-bit transfers).
pub const MAGIC: [u8; 8] = *b"\x89PPK\r\n\x1a\n";
/// Format version this build writes. Version 1 (no per-image index, binary metadata) is still
/// read.
pub const VERSION: u32 = 2;
/// The oldest version this build reads.
pub const OLDEST_READ: u32 = 1;
/// Bytes of one per-image index entry (v2): pixel offset u64, height u32, width u32.
pub const ENTRY_LEN: usize = 16;
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
    /// Every image's height and width; both 0 when the sizes vary (v2: see the index).
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
    /// v2: where the per-image index starts (count × [`ENTRY_LEN`] bytes); 0 in v1.
    pub index_off: u64,
}

impl Header {
    /// Bytes of one image when all have the header's size (0 when they vary).
    fn image_len(&self) -> u64 {
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
            self.index_off,
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
            index_off: u64_at(88),
        };
        (h, u32_at(CRC_AT))
    }

    /// Where the per-image index is and its length (v1 has none: empty, just after the header).
    pub fn index_section(&self) -> (u64, u64) {
        if self.version == 1 {
            (HEADER_LEN as u64, 0)
        } else {
            (self.index_off, self.count.saturating_mul(ENTRY_LEN as u64))
        }
    }

    /// Why this header cannot describe a file of `len` bytes: a section outside it, or an
    /// impossible image shape. (The index itself is checked by [`decode_index`].)
    pub fn check_layout(&self, len: u64) -> Result<(), String> {
        let n = self.count;
        let v1 = self.version == 1;
        let (index_at, index_len) = self.index_section();
        let sections = [
            ("pixels", self.pixels_off, if v1 { n.checked_mul(self.image_len()) } else { Some(0) }),
            ("labels", self.labels_off, n.checked_mul(4)),
            ("checksums", self.crcs_off, n.checked_mul(4)),
            ("index", index_at, n.checked_mul(ENTRY_LEN as u64).map(|_| index_len)),
            ("metadata", self.meta_off, Some(self.meta_len)),
        ];
        for (name, off, size) in sections {
            if size.and_then(|s| s.checked_add(off)).is_none_or(|end| end > len) || off < HEADER_LEN as u64 {
                return Err(format!("the {name} section lies outside the file"));
            }
        }
        // v2 says 0×0 when the images' sizes vary (the index has each).
        let sized = self.image_len() != 0 || (!v1 && self.height == 0 && self.width == 0);
        if !sized || !matches!(self.channels, 1 | 3) {
            return Err(format!("impossible image shape {}×{}×{}", self.height, self.width, self.channels));
        }
        Ok(())
    }

    /// The header bytes with a zero CRC field, for computing the CRC.
    pub fn crc_input(bytes: &[u8; HEADER_LEN]) -> [u8; HEADER_LEN] {
        let mut b = *bytes;
        b[CRC_AT..].fill(0);
        b
    }
}

/// The size the images were stored at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(tag = "mode", rename_all = "kebab-case")]
pub enum Size {
    /// Every image resized to height × width, aspect not kept (torchvision's `Resize((h, w))`).
    Fixed { height: u32, width: u32 },
    /// The shorter side resized to this, aspect kept (torchvision's `Resize(s)`).
    Shorter { shorter: u32 },
    /// Not resized.
    AsStored,
    /// Not resized, and every image must have the first one's size (`pack` without a size).
    #[default]
    Common,
}

impl Size {
    /// (height, width) stored for an image of `height` × `width`: torchvision's
    /// `_compute_resized_output_size` for `Shorter` (the long side `int(s * long / short)`).
    pub fn output(self, height: u32, width: u32) -> (u32, u32) {
        match self {
            Size::Fixed { height, width } => (height, width),
            Size::Shorter { shorter } => {
                let (short, long) = if width <= height { (width, height) } else { (height, width) };
                let new_long = (u64::from(shorter) * u64::from(long)) as f64 / f64::from(short.max(1));
                let new_long = (new_long as u32).max(1);
                if width <= height {
                    (new_long, shorter)
                } else {
                    (shorter, new_long)
                }
            }
            Size::AsStored | Size::Common => (height, width),
        }
    }

    /// The `pipeprof pack` flag that asks for this size (`--size` takes width × height, as
    /// `demo-data --size`).
    pub fn flag(self) -> String {
        match self {
            Size::Fixed { height, width } if height == width => format!("--size {height}"),
            Size::Fixed { height, width } => format!("--size {width}x{height}"),
            Size::Shorter { shorter } => format!("--shorter {shorter}"),
            Size::AsStored => "--as-stored".into(),
            Size::Common => String::new(),
        }
    }
}

/// What the cache knows about where it came from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Meta {
    /// The source folder, absolute.
    pub source: PathBuf,
    /// The model given to `pipeprof cache` (or the built-in), stored by its name; none (an
    /// empty program name) for `pipeprof pack`.
    pub model: ModelSource,
    pub classes: Vec<String>,
    /// Each stored image's path relative to the source, in storage order.
    pub names: Vec<String>,
    /// Files skipped at build time: (path, reason).
    pub skipped: Vec<(String, String)>,
    /// Which files the scan took (v1: pipeprof's).
    pub rules: Rules,
    /// The size asked for (v1: fixed at the header's size).
    pub size: Size,
    /// The class and file names that are not UTF-8, exactly (`classes` and `names` hold them
    /// lossily); v2 keeps them, and the source folder's, in the metadata's `exact`.
    pub exact: Exact,
}

/// Names that are not UTF-8, as their bytes: Python readers give them as `os.fsdecode` does,
/// so a packed file's classes and paths are ImageFolder's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Exact {
    /// (index into [`Meta::classes`], the class folder's name).
    pub classes: Vec<(usize, Vec<u8>)>,
    /// (index into [`Meta::names`], the path relative to the source).
    pub names: Vec<(usize, Vec<u8>)>,
}

/// `exact` in the JSON: the source folder's path and each listed name as lowercase hex of its
/// bytes, indices increasing.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct ExactJson {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    classes: Vec<(u64, String)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    names: Vec<(u64, String)>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Lowercase hex back to bytes; `None` for anything else.
fn unhex(s: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let b = s.as_bytes();
    if b.len() % 2 != 0 {
        return None;
    }
    b.chunks_exact(2).map(|p| Some((digit(p[0])? << 4) | digit(p[1])?)).collect()
}

/// (index, bytes) pairs from the JSON's: indices increasing and below `len`, hex valid.
fn unhex_pairs(pairs: Vec<(u64, String)>, len: usize) -> Option<Vec<(usize, Vec<u8>)>> {
    let mut last = None;
    let mut out = Vec::with_capacity(pairs.len());
    for (i, h) in pairs {
        let i = usize::try_from(i).ok().filter(|i| *i < len && last.is_none_or(|l| l < *i))?;
        last = Some(i);
        out.push((i, unhex(&h)?));
    }
    Some(out)
}

impl ExactJson {
    /// `None` when every name is UTF-8 (older readers see the same file as before).
    fn of(m: &Meta) -> Option<ExactJson> {
        let pairs = |v: &[(usize, Vec<u8>)]| v.iter().map(|(i, b)| (*i as u64, hex(b))).collect::<Vec<_>>();
        let source = m.source.to_str().is_none().then(|| hex(m.source.as_os_str().as_bytes()));
        let j = ExactJson { source, classes: pairs(&m.exact.classes), names: pairs(&m.exact.names) };
        (j.source.is_some() || !j.classes.is_empty() || !j.names.is_empty()).then_some(j)
    }
}

/// The JSON metadata block of a v2 file, as docs/packed-format.md lists it.
#[derive(serde::Serialize, serde::Deserialize)]
struct MetaJson {
    format: String,
    source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    model: Option<String>,
    /// A file written without it (none of pipeprof's) reads as ImageFolder's, `pack`'s default.
    #[serde(default = "imagefolder")]
    layout: Rules,
    size: Size,
    resample: String,
    classes: Vec<String>,
    names: Vec<String>,
    skipped: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    exact: Option<ExactJson>,
}

fn imagefolder() -> Rules {
    Rules::ImageFolder
}

/// The `format` field of the JSON metadata.
pub const FORMAT_NAME: &str = "pipeprof-packed-images";
/// How images were resized: PIL's `Image.BILINEAR` (a triangle filter widened by the scale
/// when shrinking, i.e. antialiased), which torchvision's `Resize` uses on PIL images.
pub const RESAMPLE: &str = "bilinear";

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
    /// The v2 metadata: UTF-8 JSON.
    pub fn encode_json(&self) -> Vec<u8> {
        let j = MetaJson {
            format: FORMAT_NAME.into(),
            source: self.source.to_string_lossy().into_owned(),
            model: (!self.model.is_empty()).then(|| self.model.name().into_owned()),
            layout: self.rules,
            size: self.size,
            resample: RESAMPLE.into(),
            classes: self.classes.clone(),
            names: self.names.clone(),
            skipped: self.skipped.clone(),
            exact: ExactJson::of(self),
        };
        serde_json::to_vec(&j).unwrap_or_default()
    }

    /// The v2 metadata; `None` when it does not parse or is not this format's: strict UTF-8
    /// JSON (serde_json's: nested at most 127 deep, numbers inside a double's range, no lone
    /// surrogate escapes, the last of duplicate keys counts), an object whose `size` is an
    /// object and whose `exact`, when there is one, an object or null; then the keys' types.
    /// `python/pipeprof/data.py` (`parse_meta`) refuses exactly the same (python/tests/
    /// test_packed_hostile.py runs one table of hostile files through both).
    pub fn decode_json(b: &[u8]) -> Option<Meta> {
        let v: serde_json::Value = serde_json::from_slice(b).ok()?;
        let o = v.as_object()?;
        let size_ok = o.get("size").is_none_or(serde_json::Value::is_object);
        if !size_ok || o.get("exact").is_some_and(|e| !(e.is_object() || e.is_null())) {
            return None;
        }
        let j: MetaJson = serde_json::from_value(v).ok()?;
        if j.format != FORMAT_NAME {
            return None;
        }
        let e = j.exact.unwrap_or_default();
        let exact =
            Exact { classes: unhex_pairs(e.classes, j.classes.len())?, names: unhex_pairs(e.names, j.names.len())? };
        let source = match e.source {
            Some(h) => PathBuf::from(std::ffi::OsString::from_vec(unhex(&h)?)),
            None => PathBuf::from(j.source),
        };
        Some(Meta {
            source,
            model: j.model.map(|m| ModelSource::from_name(&m)).unwrap_or_default(),
            classes: j.classes,
            names: j.names,
            skipped: j.skipped,
            rules: j.layout,
            size: j.size,
            exact,
        })
    }

    /// The v1 metadata (binary, length-prefixed strings).
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
        Some(Meta { source, model, classes, names, skipped, ..Meta::default() })
    }
}

/// Where one image's pixels are and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub offset: u64,
    pub height: u32,
    pub width: u32,
}

/// The v2 index bytes.
pub fn encode_index(entries: &[Entry]) -> Vec<u8> {
    let mut o = Vec::with_capacity(entries.len() * ENTRY_LEN);
    for e in entries {
        o.extend_from_slice(&e.offset.to_le_bytes());
        o.extend_from_slice(&e.height.to_le_bytes());
        o.extend_from_slice(&e.width.to_le_bytes());
    }
    o
}

/// The index of a file whose header says `h`: read from `bytes` (v2) or made from the fixed
/// stride (v1). Why not, when an entry is impossible: images must follow each other from
/// `pixels_off` without gaps, each with a non-zero size, the header's size when it has one,
/// the last ending by `labels_off`.
pub fn decode_index(h: &Header, bytes: &[u8]) -> Result<Vec<Entry>, String> {
    let c = u64::from(h.channels);
    let entries: Vec<Entry> = if h.version == 1 {
        (0..h.count)
            .map(|i| Entry { offset: h.pixels_off + i * h.image_len(), height: h.height, width: h.width })
            .collect()
    } else {
        bytes
            .chunks_exact(ENTRY_LEN)
            .map(|b| {
                let mut o = [0u8; 8];
                o.copy_from_slice(&b[..8]);
                let u = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
                Entry { offset: u64::from_le_bytes(o), height: u(8), width: u(12) }
            })
            .collect()
    };
    if entries.len() as u64 != h.count {
        return Err(format!("the index has {} entries for {} images", entries.len(), h.count));
    }
    let mut next = h.pixels_off;
    for (i, e) in entries.iter().enumerate() {
        let fixed = h.height != 0 || h.width != 0;
        if e.height == 0 || e.width == 0 || (fixed && (e.height, e.width) != (h.height, h.width)) {
            return Err(format!("image {i} has an impossible size {}×{}", e.height, e.width));
        }
        if e.offset != next {
            return Err(format!("image {i} does not start where image {} ends", i.saturating_sub(1)));
        }
        next = (u64::from(e.height) * u64::from(e.width))
            .checked_mul(c)
            .and_then(|n| n.checked_add(next))
            .ok_or_else(|| format!("image {i} is larger than any file"))?;
    }
    if next > h.labels_off {
        return Err("the pixels run past the labels".into());
    }
    Ok(entries)
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
            index_off: 6,
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
            ..Meta::default()
        };
        let b = m.encode();
        assert_eq!(Meta::decode(&b), Some(m.clone()));
        assert_eq!(Meta::decode(&b[..b.len() - 1]), None);
        assert_eq!(Meta::decode(&[0xFF; 3]), None);
        // v2: JSON, with the layout and size.
        let m =
            Meta { rules: Rules::ImageFolder, size: Size::Shorter { shorter: 64 }, model: ModelSource::default(), ..m };
        let j = m.encode_json();
        assert_eq!(Meta::decode_json(&j), Some(m.clone()));
        let v: serde_json::Value = serde_json::from_slice(&j).unwrap_or_default();
        assert_eq!(v["size"], serde_json::json!({"mode": "shorter", "shorter": 64}));
        assert_eq!(
            (v["layout"].as_str(), v["resample"].as_str(), v.get("model")),
            (Some("imagefolder"), Some("bilinear"), None)
        );
        assert_eq!(Meta::decode_json(&j[..j.len() - 1]), None);
        // Keras's layout round-trips; a file that names none is ImageFolder's.
        let k = Meta { rules: Rules::Keras, ..m.clone() };
        let kj = k.encode_json();
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&kj).unwrap_or_default()["layout"], "keras");
        assert_eq!(Meta::decode_json(&kj), Some(k));
        let mut v = v;
        if let Some(o) = v.as_object_mut() {
            o.remove("layout");
        }
        let without = serde_json::to_vec(&v).unwrap_or_default();
        assert_eq!(Meta::decode_json(&without).map(|m| m.rules), Some(Rules::ImageFolder));
        assert_eq!(Meta::decode_json(br#"{"format": "other"}"#), None);
    }

    #[test]
    fn names_that_are_not_utf8_round_trip_exactly_and_only_an_object_is_metadata() {
        let m = Meta {
            source: PathBuf::from(std::ffi::OsString::from_vec(b"/data/caf\xe9".to_vec())),
            classes: vec!["caf\u{fffd}".into(), "dog".into()],
            names: vec!["dog/1.jpg".into(), "caf\u{fffd}/\u{fffd}.jpg".into()],
            exact: Exact { classes: vec![(0, b"caf\xe9".to_vec())], names: vec![(1, b"caf\xe9/\xff.jpg".to_vec())] },
            ..Meta::default()
        };
        let j = m.encode_json();
        assert_eq!(Meta::decode_json(&j), Some(m.clone()));
        let v: serde_json::Value = serde_json::from_slice(&j).unwrap_or_default();
        assert_eq!(v["exact"]["names"], serde_json::json!([[1, "636166e92fff2e6a7067"]]));
        // All UTF-8: no `exact` (the file is what older readers read).
        let plain = Meta { source: "/data".into(), exact: Exact::default(), ..m };
        let pj = serde_json::from_slice::<serde_json::Value>(&plain.encode_json()).unwrap_or_default();
        assert_eq!(pj.get("exact"), None);
        // The fields as a list parse as a struct to serde: refused, as the Python reader does.
        let fields: Vec<serde_json::Value> =
            ["format", "source", "model", "layout", "size", "resample", "classes", "names", "skipped"]
                .iter()
                .map(|k| pj.get(*k).cloned().unwrap_or(serde_json::Value::Null))
                .collect();
        let list = serde_json::to_vec(&fields).unwrap_or_default();
        assert!(serde_json::from_slice::<MetaJson>(&list).is_ok(), "serde reads a struct from a list");
        assert_eq!(Meta::decode_json(&list), None);
    }

    #[test]
    fn a_header_must_place_every_section_inside_the_file() {
        // 2 images of 2×2×3 at 4096, then labels, checksums, index (v2), metadata of 10 bytes.
        let good = Header {
            version: 2,
            height: 2,
            width: 2,
            channels: 3,
            count: 2,
            pixels_off: PIXELS_OFF,
            labels_off: PIXELS_OFF + 24,
            crcs_off: PIXELS_OFF + 32,
            index_off: PIXELS_OFF + 40,
            meta_off: PIXELS_OFF + 72,
            meta_len: 10,
            ..Header::default()
        };
        let len = PIXELS_OFF + 82;
        assert_eq!(good.check_layout(len), Ok(()));
        let table: [(Header, &str); 6] = [
            (Header { meta_len: 11, ..good.clone() }, "metadata section"),
            (Header { index_off: len - 8, ..good.clone() }, "index section"),
            (Header { labels_off: 7, ..good.clone() }, "labels section"),
            (Header { count: u64::MAX, ..good.clone() }, "labels section"),
            (Header { channels: 4, ..good.clone() }, "impossible image shape"),
            (Header { height: 0, ..good.clone() }, "impossible image shape"),
        ];
        for (h, want) in table {
            assert!(h.check_layout(len).unwrap_err().contains(want), "{h:?}");
        }
        // Sizes that vary: 0×0 is allowed in v2 only.
        assert_eq!(Header { height: 0, width: 0, ..good.clone() }.check_layout(len), Ok(()));
        let v1 = Header { version: 1, height: 0, width: 0, ..good };
        assert!(v1.check_layout(len).unwrap_err().contains("impossible image shape"));
    }

    #[test]
    fn shorter_side_sizes_are_torchvisions() {
        // (image h, w, S) → torchvision.transforms.Resize(S)'s output (h, w).
        let table = [
            ((100, 200), 50, (50, 100)),
            ((200, 100), 50, (100, 50)),
            ((3, 10), 2, (2, 6)), // int(2 * 10 / 3) = int(6.67) = 6: truncated, not rounded
            ((480, 640), 224, (224, 298)),
            ((77, 77), 32, (32, 32)),
            ((1, 1000), 1, (1, 1000)),
        ];
        for ((h, w), s, want) in table {
            assert_eq!(Size::Shorter { shorter: s }.output(h, w), want, "{h}×{w} → {s}");
        }
        assert_eq!(Size::Fixed { height: 20, width: 30 }.output(7, 9), (20, 30));
        assert_eq!(Size::AsStored.output(7, 9), (7, 9));
    }

    #[test]
    fn the_index_must_describe_contiguous_images_inside_the_pixels() {
        let h = Header {
            version: 2,
            channels: 3,
            count: 2,
            pixels_off: PIXELS_OFF,
            labels_off: PIXELS_OFF + 12 + 24,
            ..Header::default()
        };
        let good =
            [Entry { offset: PIXELS_OFF, height: 2, width: 2 }, Entry { offset: PIXELS_OFF + 12, height: 2, width: 4 }];
        assert_eq!(decode_index(&h, &encode_index(&good)), Ok(good.to_vec()));
        let gap = [good[0], Entry { offset: PIXELS_OFF + 13, ..good[1] }];
        let empty = [good[0], Entry { height: 0, ..good[1] }];
        let long = [good[0], Entry { width: 5, ..good[1] }];
        for (bad, why) in [
            (&gap[..], "does not start"),
            (&empty[..], "impossible size"),
            (&long[..], "run past"),
            (&good[..1], "1 entries for 2"),
        ] {
            let e = decode_index(&h, &encode_index(bad)).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
        // A header size is every image's size.
        let fixed = Header { height: 2, width: 2, ..h.clone() };
        assert!(decode_index(&fixed, &encode_index(&good)).unwrap_err().contains("image 1"));
        // v1: made from the stride.
        let v1 = Header { version: 1, height: 2, width: 2, count: 2, labels_off: PIXELS_OFF + 24, ..h };
        assert_eq!(decode_index(&v1, &[]).map(|e| e[1].offset), Ok(PIXELS_OFF + 12));
    }
}
