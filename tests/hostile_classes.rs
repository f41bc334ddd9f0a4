#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End to end: class folders with no usable image, in the training and the validation folder.
//! Each hostile entry has its expected outcome (docs/data-and-cache.md, "Bad input").

mod common;
use common::{pipeprof, text};

use pipeprof_trainer::data::demo::{DemoFormat, DemoSpec};
use serde_json::Value;
use std::path::Path;

const MODEL: &str = "[input]\nheight = 16\nwidth = 16\n[[layers]]\ntype = \"flatten\"\n\
                     [[layers]]\ntype = \"dense\"\nunits = \"classes\"\n[train]\nbatch_size = 4\n";

fn demo(dir: &Path, classes: usize) {
    DemoSpec { classes, per_class: 6, size: Some((20, 20)), format: DemoFormat::Png, seed: 4 }.write(dir).unwrap();
}

/// The image extensions as the warnings list them.
fn exts() -> String {
    pipeprof_trainer::data::scan::EXTENSIONS.join("/.")
}

fn model(d: &Path) -> String {
    let p = d.join("m.toml");
    std::fs::write(&p, MODEL).unwrap();
    p.display().to_string()
}

#[test]
fn empty_and_other_format_classes_are_left_out_and_an_all_bad_class_is_named() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("imgs");
    demo(&data, 2); // circle, cross: usable
                    // allbad: image names, no image inside.
    std::fs::create_dir(data.join("allbad")).unwrap();
    for i in 0..3 {
        std::fs::write(data.join(format!("allbad/{i}.jpg")), b"not an image at all").unwrap();
    }
    std::fs::create_dir(data.join("empty")).unwrap();
    std::fs::create_dir(data.join("textonly")).unwrap();
    std::fs::write(data.join("textonly/notes.txt"), "x").unwrap();
    std::fs::write(data.join("circle/readme.txt"), "x").unwrap();
    let summary = d.path().join("s.json");
    let m = model(d.path());
    let args = ["profile", "--no-tui", "--no-gpu", "--model", &m, "--data", data.to_str().unwrap()];
    let out = pipeprof(&[&args[..], &["--epochs", "2", "--summary", summary.to_str().unwrap()]].concat());
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    // empty, textonly: left out of the model's classes, each named in a warning.
    assert!(stdout.contains("3 classes: allbad, circle, cross"), "{stdout}");
    for c in ["empty", "textonly"] {
        let w = format!("class folder {} has no .{} image: it is left out", data.join(c).display(), exts());
        assert!(stderr.contains(&w), "{c}: {stderr}");
    }
    // allbad: only known after decoding; every file skipped by name, then the class named.
    for i in 0..3 {
        assert!(stdout.contains(&format!("allbad/{i}.jpg")), "the report lists it: {stdout}");
    }
    assert!(stderr.contains("class allbad: none of its images could be loaded (3 tried, all skipped"), "{stderr}");
    let s: Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    assert_eq!(s["settings"]["classes"], serde_json::json!(["allbad", "circle", "cross"]));
    assert_eq!(s["skipped_count"], 3);
    // The cache builder decodes every image: the same warnings, at build time.
    let out_file = d.path().join("c.ppk");
    let m = model(d.path());
    let out =
        pipeprof(&["cache", "--model", &m, "--data", data.to_str().unwrap(), "--out", out_file.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("class folder {} has no .{} image", data.join("empty").display(), exts())));
    assert!(stderr.contains("class allbad: none of its images could be decoded"), "{stderr}");
}

#[test]
fn a_validation_class_with_no_image_is_left_out_and_one_without_training_images_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let (train, val) = (d.path().join("train"), d.path().join("val"));
    demo(&train, 3);
    demo(&val, 3);
    // val/square has no image: validated on the other two classes, with a warning.
    for f in std::fs::read_dir(val.join("square")).unwrap() {
        std::fs::remove_file(f.unwrap().path()).unwrap();
    }
    let m = model(d.path());
    let run = |train: &Path, val: &Path| {
        pipeprof(&[
            "profile",
            "--no-tui",
            "--no-gpu",
            "--model",
            &m,
            "--data",
            train.to_str().unwrap(),
            "--val-data",
            val.to_str().unwrap(),
        ])
    };
    let out = run(&train, &val);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let w = format!("class folder {} has no .{} image", val.join("square").display(), exts());
    assert!(text(&out.stderr).contains(&w), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("3 classes: circle, cross, square"));
    // The other way round: square has validation images but no training image.
    let out = run(&val, &train);
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(e.contains("class folders [square] have validation images but no training image"), "{e}");
}

#[test]
fn a_tree_whose_every_class_is_empty_is_refused() {
    let d = tempfile::tempdir().unwrap();
    for c in ["a", "b"] {
        std::fs::create_dir_all(d.path().join("imgs").join(c)).unwrap();
    }
    std::fs::write(d.path().join("imgs/a/x.txt"), "x").unwrap();
    let data = d.path().join("imgs");
    let out = pipeprof(&["profile", "--no-tui", "--no-gpu", "--data", data.to_str().unwrap()]);
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(e.contains("no images") && e.contains(data.to_str().unwrap()), "{e}");
}
