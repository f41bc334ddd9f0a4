#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The packed cache: bit-identical pixels, refusal of damaged and stale files, atomic writes,
//! and the real binary training from it.

mod common;
use common::{pipeprof, text};

use pipeprof_trainer::cache::{build, BuildOptions, CacheError, Packed};
use pipeprof_trainer::data::image::{decode_for, Resizer};
use pipeprof_trainer::data::{scan, Loader, LoaderConfig, SampleSource};
use probes::Probe;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn demo(dir: &Path) {
    common::demo(dir, 3, 20, 5);
}

fn opts(data: &Path, out: &Path) -> BuildOptions {
    BuildOptions {
        data: data.to_path_buf(),
        out: out.to_path_buf(),
        size: pipeprof_trainer::cache::Size::Fixed { height: 32, width: 32 },
        channels: 3,
        rules: pipeprof_trainer::data::scan::Rules::Pipeprof,
        exact_decode: false,
        model: "tiny.toml".into(),
        workers: 3,
        progress: false,
        fail_after: None,
        abort_after: None,
        panic_on: None,
    }
}

fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("imgs");
    demo(&data);
    let out = d.path().join("imgs.ppk");
    (d, data, out)
}

fn loader_cfg() -> LoaderConfig {
    LoaderConfig { height: 32, width: 32, batch_size: 7, workers: 2, seed: 9, epochs: 2, ..LoaderConfig::default() }
}

fn all_batches(src: Arc<dyn SampleSource>) -> Vec<pipeprof_trainer::data::Batch> {
    let (probe, _rx) = Probe::new(1 << 16);
    let mut l = Loader::start(src, loader_cfg(), probe).unwrap();
    std::iter::from_fn(|| l.next_batch()).collect()
}

#[test]
fn cached_pixels_and_labels_are_bitwise_those_of_the_decode_path() {
    let (_d, data, out) = setup();
    let r = build(&opts(&data, &out)).unwrap();
    assert_eq!((r.images, r.skipped.len()), (60, 0));
    let p = Packed::open(&out).unwrap();
    let ds = scan(&data).unwrap();
    assert_eq!(p.len(), ds.samples.len());
    assert_eq!(p.classes(), &ds.classes[..]);
    let mut resizer = Resizer::new();
    for (i, s) in ds.samples.iter().enumerate() {
        let px = decode_for(&std::fs::read(&s.path).unwrap(), 3, 32, 32).unwrap();
        assert_eq!(p.pixels(i).unwrap(), resizer.resize_u8(&px, 32, 32).unwrap(), "image {i}");
        assert_eq!(p.label(i), s.label);
    }
    // The loader's f32 batches too: same order, same values, same labels.
    let from_folder = all_batches(Arc::new(ds));
    let from_cache = all_batches(Arc::new(p));
    assert_eq!(from_folder.len(), 18);
    assert_eq!(from_folder, from_cache);
}

#[test]
fn a_sample_whose_decoder_panics_is_skipped_and_named_and_the_build_finishes() {
    let (_d, data, out) = setup();
    let ds = scan(&data).unwrap();
    let victim = ds.samples[7].path.to_string_lossy().into_owned();
    let mut o = opts(&data, &out);
    o.panic_on = Some(victim.clone());
    let r = build(&o).unwrap();
    assert_eq!((r.images, r.skipped.len()), (59, 1), "every other sample is cached");
    let (path, reason) = &r.skipped[0];
    assert!(*path == victim && reason.contains("the decoder panicked"), "{path}: {reason}");
    assert_eq!(Packed::open(&out).unwrap().len(), 59);
}

#[test]
fn truncated_and_bit_flipped_caches_are_refused_naming_the_file_and_the_fix() {
    let (d, data, out) = setup();
    build(&opts(&data, &out)).unwrap();
    let bytes = std::fs::read(&out).unwrap();

    let cut = d.path().join("cut.ppk");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = Packed::open(&cut).unwrap_err();
    assert!(matches!(e, CacheError::Damaged { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("cut.ppk") && msg.contains("truncated") && msg.contains("re-run `pipeprof pack DIR"), "{msg}");

    // One pixel byte (image 5), then one metadata byte (the last byte of the file).
    for (at, want) in
        [(4096 + 5 * 32 * 32 * 3 + 17, "checksum mismatch in image 5"), (bytes.len() - 1, "header checksum")]
    {
        let mut b = bytes.clone();
        b[at] ^= 0x01;
        let flipped = d.path().join("flip.ppk");
        std::fs::write(&flipped, &b).unwrap();
        let msg = Packed::open(&flipped).unwrap_err().to_string();
        assert!(msg.contains("flip.ppk") && msg.contains("damaged") && msg.contains(want), "{msg}");
        if want.contains("image") {
            // The metadata is intact: the rebuild command names the source folder.
            assert!(msg.contains(&format!("--data {}", std::fs::canonicalize(&data).unwrap().display())), "{msg}");
        }
    }

    let other = d.path().join("notes.ppk");
    std::fs::write(&other, "hello, not a cache at all").unwrap();
    assert!(matches!(Packed::open(&other), Err(CacheError::NotACache { .. })));
    let mut v9 = bytes.clone();
    v9[8] = 9;
    std::fs::write(&other, &v9).unwrap();
    assert!(Packed::open(&other).unwrap_err().to_string().contains("version 9, this pipeprof reads versions 1 to 2"));
}

#[test]
fn touching_or_adding_a_source_file_makes_the_cache_stale() {
    let (_d, data, out) = setup();
    build(&opts(&data, &out)).unwrap();
    assert!(Packed::open(&out).unwrap().source_checked());
    let victim = scan(&data).unwrap().samples[3].path.clone();
    let f = std::fs::File::options().write(true).open(&victim).unwrap();
    f.set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000)).unwrap();
    drop(f);
    let msg = Packed::open(&out).unwrap_err().to_string();
    assert!(msg.contains("stale") && msg.contains("modified") && msg.contains("re-run"), "{msg}");

    build(&opts(&data, &out)).unwrap();
    assert!(Packed::open(&out).is_ok());
    std::fs::copy(&victim, data.join("circle/extra.png")).unwrap();
    let msg = Packed::open(&out).unwrap_err().to_string();
    assert!(msg.contains("stale") && msg.contains("added or removed (60 then, 61 now)"), "{msg}");

    // Without its source folder, a cache is still usable (staleness cannot be checked).
    build(&opts(&data, &out)).unwrap();
    std::fs::remove_dir_all(&data).unwrap();
    assert!(!Packed::open(&out).unwrap().source_checked());
}

#[test]
fn a_write_that_fails_midway_leaves_no_file_under_the_final_name() {
    let (d, data, out) = setup();
    let mut o = opts(&data, &out);
    o.fail_after = Some(20);
    let e = build(&o).unwrap_err();
    assert!(e.to_string().contains("simulated failure"), "{e}");
    assert!(!out.exists());
    let left: Vec<_> = std::fs::read_dir(d.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("imgs")], "no temporary file is left either");

    // An existing good cache survives a failed rebuild untouched.
    build(&opts(&data, &out)).unwrap();
    let before = std::fs::read(&out).unwrap();
    assert!(build(&o).is_err());
    assert_eq!(std::fs::read(&out).unwrap(), before);
}

#[test]
fn a_killed_cache_command_leaves_only_a_temporary_file_which_the_next_run_removes() {
    let (d, data, out) = setup();
    let model = d.path().join("tiny.toml");
    std::fs::write(&model, common::tiny_model(1)).unwrap();
    let (m, i, o) = (model.to_str().unwrap(), data.to_str().unwrap(), out.to_str().unwrap());
    let r = pipeprof(&["cache", "--model", m, "--data", i, "--out", o, "--abort-after", "10"]);
    assert!(!r.status.success());
    assert!(!out.exists(), "the final name must not exist after an abort");
    let temps = |d: &Path| {
        std::fs::read_dir(d).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().contains(".tmp-")).count()
    };
    assert_eq!(temps(d.path()), 1, "the aborted write stays under its temporary name");
    let r = pipeprof(&["cache", "--model", m, "--data", i, "--out", o]);
    assert!(r.status.success(), "{}", text(&r.stderr));
    assert!(Packed::open(&out).is_ok());
    assert_eq!(temps(d.path()), 0, "the dead process's temporary file was removed");
}

#[test]
fn profile_trains_from_a_cache_without_decode_or_resize_and_checks_advice() {
    let (d, data, out) = setup();
    std::fs::write(data.join("circle/broken.jpg"), b"not a jpeg").unwrap();
    let model = d.path().join("tiny.toml");
    std::fs::write(&model, common::tiny_model(1)).unwrap();
    let (m, i, o) = (model.to_str().unwrap(), data.to_str().unwrap(), out.to_str().unwrap());
    let r = pipeprof(&["cache", "--model", m, "--data", i, "--out", o]);
    assert!(r.status.success(), "{}", text(&r.stderr));
    let err = text(&r.stderr);
    assert!(err.contains("warning: skipped") && err.contains("broken.jpg"), "{err}");

    let summary = d.path().join("s.json");
    let s = summary.to_str().unwrap();
    let r = pipeprof(&["profile", "--model", m, "--data", o, "--steps", "6", "--no-tui", "--summary", s]);
    assert!(r.status.success(), "{}", text(&r.stderr));
    let j: Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    assert_eq!(j["steps"], 6);
    let stages: Vec<&str> = j["stages"].as_array().unwrap().iter().map(|x| x["stage"].as_str().unwrap()).collect();
    assert!(stages.contains(&"read") && !stages.contains(&"decode") && !stages.contains(&"resize"), "{stages:?}");

    // A model of another input size is refused, saying which dimension differs.
    let other = d.path().join("other.toml");
    std::fs::write(&other, common::tiny_model(1).replacen("height = 32", "height = 40", 1)).unwrap();
    let r = pipeprof(&["profile", "--model", other.to_str().unwrap(), "--data", o, "--steps", "6", "--no-tui"]);
    assert!(!r.status.success());
    assert!(text(&r.stderr).contains("(height differ)"), "{}", text(&r.stderr));

    // --check-advice on a preprocess-bound run: a table with the baseline and one row per run.
    let r = pipeprof(&[
        "profile",
        "--model",
        m,
        "--data",
        i,
        "--steps",
        "8",
        "--workers",
        "1",
        "--slow",
        "decode=+15ms",
        "--no-tui",
        "--check-advice",
    ]);
    let stdout = text(&r.stdout);
    assert!(r.status.success(), "{stdout}\n{}", text(&r.stderr));
    let at = stdout.find("check-advice: 1 baseline + ").unwrap_or_else(|| panic!("{stdout}"));
    let tail = &stdout[at..];
    let n: usize = tail["check-advice: 1 baseline + ".len()..].split(' ').next().unwrap().parse().unwrap();
    assert!(n >= 1, "the cache advice applies to a decode-bound run: {stdout}");
    let lines: Vec<&str> = tail.lines().skip(1).take_while(|l| !l.trim().is_empty()).collect();
    assert!(lines[0].starts_with("advice") && lines[0].contains("predicted ×") && lines[0].contains("measured ×"));
    assert_eq!(lines.len(), 1 + 1 + n, "{tail}");
    assert!(lines[1].starts_with("as run (no change)"), "{tail}");
    assert!(lines.iter().any(|l| l.starts_with("pipeprof cache, then --data it")), "{tail}");
    // The children parse the arguments built for them: every run measured, none failed.
    assert!(!tail.contains("failed:"), "{tail}");
}
