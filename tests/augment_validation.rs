#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End to end: augmentation is a measured loader stage; validation adds Keras' val columns.

mod common;
use common::{pipeprof, text};

use pipeprof_trainer::data::demo::{DemoFormat, DemoSpec};
use serde_json::Value;
use std::path::Path;

/// 3 classes × 20 images and a model with `extra` appended.
fn setup(extra: &str) -> (tempfile::TempDir, String, String) {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("imgs");
    DemoSpec { classes: 3, per_class: 20, size: None, format: DemoFormat::Mixed, seed: 5 }.write(&data).unwrap();
    let model = d.path().join("tiny.toml");
    std::fs::write(&model, format!("{}{extra}", common::tiny_model(1))).unwrap();
    (d, model.display().to_string(), data.display().to_string())
}

fn run(model: &str, data: &str, summary: &Path, more: &[&str]) -> (String, Value) {
    let mut args =
        vec!["profile", "--no-tui", "--model", model, "--data", data, "--summary", summary.to_str().unwrap()];
    args.extend_from_slice(more);
    let out = pipeprof(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    (text(&out.stdout), serde_json::from_slice(&std::fs::read(summary).unwrap()).unwrap())
}

fn stage<'a>(s: &'a Value, name: &str) -> Option<&'a Value> {
    s["stages"].as_array().unwrap().iter().find(|x| x["stage"] == name)
}

#[test]
fn augmentation_is_a_measured_loader_stage_on_every_training_image() {
    let (d, model, data) = setup(
        "\n[augment]\nhorizontal_flip = true\nrotation_range = 20\nzoom_range = 0.2\nbrightness_range = [0.8, 1.2]\n",
    );
    let (stdout, s) = run(&model, &data, &d.path().join("s.json"), &["--epochs", "2"]);
    assert!(stdout.contains("Augmentation (training only): horizontal_flip, rotation ±20°"), "{stdout}");
    let aug = stage(&s, "augment").unwrap_or_else(|| panic!("no augment stage: {s}"));
    assert_eq!(aug["count"], 120, "60 images × 2 epochs");
    assert!(aug["total_ms"].as_f64().unwrap() > 0.0, "{aug}");
    assert!(stdout.lines().any(|l| l.starts_with("augment ")), "{stdout}");
    assert!(!stdout.contains("val_loss"), "no validation asked for: {stdout}");
}

#[test]
fn validation_split_prints_val_loss_and_accuracy_per_epoch_without_augmenting_it() {
    let (d, model, data) = setup("validation_split = 0.25\n\n[augment]\nvertical_flip = true\n");
    let (stdout, s) = run(&model, &data, &d.path().join("s.json"), &["--epochs", "2"]);
    assert!(stdout.contains("Validation: 15 images after every epoch, 45 for training"), "{stdout}");
    let header = stdout.lines().find(|l| l.starts_with("epoch ")).unwrap();
    for col in ["loss", "accuracy", "val_loss", "val_accuracy"] {
        assert!(header.contains(col), "{header}");
    }
    let epochs = s["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), 2);
    for e in epochs {
        assert_eq!(e["images"], 45, "training images only: {e}");
        let (vl, va) = (e["val_loss"].as_f64().unwrap(), e["val_accuracy"].as_f64().unwrap());
        assert!(vl.is_finite() && vl > 0.0 && (0.0..=1.0).contains(&va), "{e}");
    }
    // Forward-only passes are their own stage: 15 images / 16 = 1 batch per epoch.
    assert_eq!(stage(&s, "validate").unwrap()["count"], 2);
    assert_eq!(stage(&s, "compute").unwrap()["count"], 6, "45 / 16 = 3 steps × 2 epochs");
    // Training images are augmented, validation images never.
    assert_eq!(stage(&s, "augment").unwrap()["count"], 90);
    assert_eq!(stage(&s, "read").unwrap()["count"], 90 + 30);
    assert_eq!(s["images"], 90);
}

#[test]
fn val_data_folder_must_have_the_same_classes() {
    let (d, model, data) = setup("");
    let other = d.path().join("val");
    DemoSpec { classes: 2, per_class: 4, size: Some((16, 16)), format: DemoFormat::Png, seed: 1 }
        .write(&other)
        .unwrap();
    let out =
        pipeprof(&["profile", "--no-tui", "--model", &model, "--data", &data, "--val-data", other.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("the validation folder needs the same class sub-folders"),
        "{}",
        text(&out.stderr)
    );
}
