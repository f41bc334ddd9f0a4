//! The order Python gives a folder's classes and files. torchvision's ImageFolder and Keras's
//! `index_directory` sort `str` names, which `os.fsdecode` makes from the bytes with each byte
//! that is not UTF-8 as a lone surrogate (U+DC80–U+DCFF): for UTF-8 names that is the bytes'
//! order (the scan's), for other names it is not, so the pack re-sorts before writing.

use super::format::relative;
use crate::data::scan::{Rules, Sample};
use crate::data::Dataset;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

/// The code points of `os.fsdecode(b)` (UTF-8, undecodable bytes as U+DC00 + byte): Python
/// orders `str` by them.
fn py_key(b: &[u8]) -> Vec<u32> {
    let mut out = Vec::with_capacity(b.len());
    for chunk in b.utf8_chunks() {
        out.extend(chunk.valid().chars().map(u32::from));
        out.extend(chunk.invalid().iter().map(|&x| 0xDC00 + u32::from(x)));
    }
    out
}

/// Each class folder's name as bytes: taken from its first sample's path (the scan's class
/// names are lossy); a class without samples keeps its (UTF-8) name.
fn class_bytes(ds: &Dataset) -> Vec<Vec<u8>> {
    let mut raw: Vec<Option<Vec<u8>>> = vec![None; ds.classes.len()];
    for s in &ds.samples {
        let l = s.label as usize;
        if raw.get(l).is_some_and(Option::is_none) {
            if let Some(Component::Normal(c)) = relative(&ds.root, &s.path).components().next() {
                raw[l] = Some(c.as_bytes().to_vec());
            }
        }
    }
    raw.into_iter().zip(&ds.classes).map(|(r, c)| r.unwrap_or_else(|| c.as_bytes().to_vec())).collect()
}

/// (folder, file name) of `p` in Python's order: `sorted(os.walk(class_dir))` then
/// `sorted(files)`.
fn file_key(p: &Path) -> (Vec<u32>, Vec<u32>) {
    let dir = p.parent().map(|d| py_key(d.as_os_str().as_bytes())).unwrap_or_default();
    (dir, p.file_name().map(|n| py_key(n.as_bytes())).unwrap_or_default())
}

/// `ds` with its classes and each class's files in Python's order (ImageFolder's and Keras's
/// rules; pipeprof's own are left as they are), labels renumbered to match; and each class
/// whose name is not UTF-8, with its index there and its bytes.
pub fn python_order(ds: Dataset, rules: Rules) -> (Dataset, Vec<(usize, Vec<u8>)>) {
    let raw = class_bytes(&ds);
    let mut order: Vec<usize> = (0..ds.classes.len()).collect();
    if rules != Rules::Pipeprof {
        order.sort_by_cached_key(|&c| py_key(&raw[c]));
    }
    let mut label = vec![0u32; order.len()];
    for (new, &old) in order.iter().enumerate() {
        label[old] = new as u32;
    }
    let classes = order.iter().map(|&c| ds.classes[c].clone()).collect();
    let exact = order
        .iter()
        .enumerate()
        .filter(|(_, &c)| std::str::from_utf8(&raw[c]).is_err())
        .map(|(new, &c)| (new, raw[c].clone()))
        .collect();
    let mut samples: Vec<Sample> = ds
        .samples
        .into_iter()
        .map(|s| Sample { label: label.get(s.label as usize).copied().unwrap_or(s.label), ..s })
        .collect();
    if rules != Rules::Pipeprof {
        samples.sort_by_cached_key(|s| (s.label, file_key(&s.path)));
    }
    (Dataset { classes, samples, ..ds }, exact)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_that_is_not_utf8_sorts_as_pythons_str() {
        // b"\x80" is U+DC80 to Python: after "é" (U+E9), though its byte is smaller; "\xff"
        // (U+DCFF) before U+E000 (b"\xee\x80\x80"), though its byte is larger.
        let mut names: [&[u8]; 6] = [b"\xee\x80\x80", b"\xff", b"caf\xc3\xa9", b"caf\x80", b"cafe", b"caf\xe9"];
        names.sort_by_cached_key(|n| py_key(n));
        let want: [&[u8]; 6] = [b"cafe", b"caf\xc3\xa9", b"caf\x80", b"caf\xe9", b"\xff", b"\xee\x80\x80"];
        assert_eq!(names, want);
        assert_eq!(py_key(b"a\xe9b"), vec![0x61, 0xDCE9, 0x62]);
    }
}
