#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The loader on awkward folders and files: every bad file is skipped with a reason, every
//! good one arrives with the right label and correctly scaled pixels.

use pipeprof_trainer::data::image::{decode, ImageError, Resizer};
use pipeprof_trainer::data::{scan, Loader, LoaderConfig};
use std::fs;
use std::path::Path;
use std::sync::Arc;

fn png_rgb(path: &Path, w: u32, h: u32, px: [u8; 3]) {
    image::RgbImage::from_pixel(w, h, image::Rgb(px)).save(path).unwrap();
}

fn jpeg_rgb(path: &Path, w: u32, h: u32, px: [u8; 3]) {
    image::RgbImage::from_pixel(w, h, image::Rgb(px)).save_with_format(path, image::ImageFormat::Jpeg).unwrap();
}

/// A PNG whose header claims `w`×`h` and that holds no pixel data.
fn png_header_only(w: u32, h: u32) -> Vec<u8> {
    let mut v = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = b"IHDR".to_vec();
    ihdr.extend(w.to_be_bytes());
    ihdr.extend(h.to_be_bytes());
    ihdr.extend([8, 2, 0, 0, 0]);
    v.extend(13u32.to_be_bytes());
    v.extend(&ihdr);
    v.extend(crc32fast::hash(&ihdr).to_be_bytes());
    // A tiny IDAT (a few compressed bytes would never fill the frame) and IEND.
    for (kind, data) in [(&b"IDAT"[..], &b"\x78\x9c\x03\x00\x00\x00\x00\x01"[..]), (&b"IEND"[..], &b""[..])] {
        let mut chunk = kind.to_vec();
        chunk.extend(data);
        v.extend((data.len() as u32).to_be_bytes());
        v.extend(&chunk);
        v.extend(crc32fast::hash(&chunk).to_be_bytes());
    }
    v
}

#[test]
fn classes_are_sorted_folders_and_only_images_count() {
    let d = tempfile::tempdir().unwrap();
    for c in ["zebra", "ant", ".hidden_class"] {
        fs::create_dir(d.path().join(c)).unwrap();
    }
    png_rgb(&d.path().join("zebra/a.png"), 4, 4, [1, 2, 3]);
    jpeg_rgb(&d.path().join("zebra/B.JPG"), 4, 4, [1, 2, 3]);
    jpeg_rgb(&d.path().join("ant/c.Jpeg"), 4, 4, [1, 2, 3]);
    fs::create_dir(d.path().join("ant/nested")).unwrap();
    png_rgb(&d.path().join("ant/nested/d.png"), 4, 4, [1, 2, 3]);
    png_rgb(&d.path().join("ant/.e.png"), 4, 4, [1, 2, 3]);
    png_rgb(&d.path().join(".hidden_class/f.png"), 4, 4, [1, 2, 3]);
    fs::write(d.path().join("ant/notes.txt"), "hi").unwrap();
    fs::write(d.path().join("README"), "top-level file").unwrap();
    let ds = scan(d.path()).unwrap();
    assert_eq!(ds.classes, vec!["ant", "zebra"]);
    assert_eq!(ds.class_counts(), vec![2, 2]);
    let names: Vec<String> =
        ds.samples.iter().map(|s| s.path.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert!(names.contains(&"B.JPG".to_string()) && names.contains(&"d.png".to_string()));
    assert!(!names.iter().any(|n| n.starts_with('.')));
    assert_eq!(ds.ignored, 2);
}

#[test]
fn symlink_loop_is_walked_once_and_reported() {
    let d = tempfile::tempdir().unwrap();
    fs::create_dir_all(d.path().join("cats/inner")).unwrap();
    png_rgb(&d.path().join("cats/inner/a.png"), 4, 4, [9, 9, 9]);
    std::os::unix::fs::symlink(d.path().join("cats"), d.path().join("cats/inner/loop")).unwrap();
    std::os::unix::fs::symlink(d.path().join("nowhere"), d.path().join("cats/broken.png")).unwrap();
    let ds = scan(d.path()).unwrap();
    assert_eq!(ds.samples.len(), 1);
    assert!(ds.problems.iter().any(|p| p.reason.contains("already visited")), "{:?}", ds.problems);
    assert!(ds.problems.iter().any(|p| p.path.ends_with("broken.png")), "{:?}", ds.problems);
}

#[test]
fn empty_and_missing_folders_are_clear_errors() {
    let d = tempfile::tempdir().unwrap();
    let e = scan(&d.path().join("nope")).unwrap_err().to_string();
    assert!(e.contains("does not exist") && e.contains("demo-data"), "{e}");
    let e = scan(d.path()).unwrap_err().to_string();
    assert!(e.contains("no class folders"), "{e}");
    fs::create_dir(d.path().join("cls")).unwrap();
    fs::write(d.path().join("cls/x.txt"), "").unwrap();
    let e = scan(d.path()).unwrap_err().to_string();
    assert!(e.contains("no images (.jpg .jpeg .png") && e.contains("1 other files"), "{e}");
}

#[test]
fn bad_files_give_reasons_without_panicking() {
    let d = tempfile::tempdir().unwrap();
    let good = d.path().join("good.png");
    png_rgb(&good, 40, 30, [10, 20, 30]);
    let bytes = fs::read(&good).unwrap();
    assert_eq!(decode(&[], 3), Err(ImageError::Empty));
    assert_eq!(decode(b"definitely not an image, just some text", 3), Err(ImageError::UnknownFormat));
    let truncated = decode(&bytes[..bytes.len() / 2], 3).unwrap_err();
    assert!(matches!(truncated, ImageError::Truncated(_)), "{truncated:?}");
    let bomb = decode(&png_header_only(100_000, 100_000), 3).unwrap_err();
    assert!(matches!(bomb, ImageError::TooLarge { width: 100_000, .. }), "{bomb:?}");
    assert!(bomb.to_string().contains("decompression bomb"));
}

#[test]
fn sixteen_bit_gray_alpha_and_cmyk_are_converted_with_correct_scaling() {
    let d = tempfile::tempdir().unwrap();
    // 16-bit RGB: 65535 → 255, 32896 (= 128·257) → 128.
    let p16 = d.path().join("deep.png");
    image::ImageBuffer::<image::Rgb<u16>, _>::from_pixel(3, 2, image::Rgb([65535u16, 32896, 0])).save(&p16).unwrap();
    let px = decode(&fs::read(&p16).unwrap(), 3).unwrap();
    assert_eq!(&px.data[..3], &[255, 128, 0]);
    // Grayscale → RGB replicates; RGB → 1 channel is luma.
    let pg = d.path().join("gray.png");
    image::GrayImage::from_pixel(2, 2, image::Luma([77u8])).save(&pg).unwrap();
    let px = decode(&fs::read(&pg).unwrap(), 3).unwrap();
    assert_eq!((px.channels, &px.data[..3]), (3, &[77u8, 77, 77][..]));
    let px = decode(&fs::read(&pg).unwrap(), 1).unwrap();
    assert_eq!((px.channels, px.data.len()), (1, 4));
    // RGBA: alpha dropped, colour kept.
    let pa = d.path().join("alpha.png");
    image::RgbaImage::from_pixel(2, 2, image::Rgba([200u8, 100, 50, 0])).save(&pa).unwrap();
    assert_eq!(&decode(&fs::read(&pa).unwrap(), 3).unwrap().data[..3], &[200, 100, 50]);
    // CMYK JPEG (pure red: C=0 M=255 Y=255 K=0) comes out red.
    let mut cmyk = Vec::new();
    let enc = jpeg_encoder::Encoder::new(&mut cmyk, 95);
    let pixels: Vec<u8> = [0u8, 255, 255, 0].repeat(16 * 16);
    enc.encode(&pixels, 16, 16, jpeg_encoder::ColorType::Cmyk).unwrap();
    let px = decode(&cmyk, 3).unwrap();
    let (r, g, b) = (px.data[0], px.data[1], px.data[2]);
    assert!(r > 200 && g < 60 && b < 60, "CMYK red decoded as {r},{g},{b}");
}

#[test]
fn resize_fills_chw_planes_in_unit_range() {
    let px = pipeprof_trainer::data::image::Pixels {
        width: 4,
        height: 2,
        channels: 3,
        data: [255u8, 0, 51].repeat(8),
        warning: None,
    };
    let mut out = vec![0f32; 3 * 3 * 3];
    Resizer::new().resize_into(&px, 3, 3, &mut out).unwrap();
    assert!(out[..9].iter().all(|v| (*v - 1.0).abs() < 1e-6));
    assert!(out[9..18].iter().all(|v| v.abs() < 1e-6));
    assert!(out[18..].iter().all(|v| (*v - 0.2).abs() < 1e-6));
}

#[test]
fn loader_skips_bad_files_once_and_delivers_the_rest_in_step_order() {
    let d = tempfile::tempdir().unwrap();
    for c in ["a", "b"] {
        fs::create_dir(d.path().join(c)).unwrap();
        for i in 0..3 {
            png_rgb(&d.path().join(format!("{c}/{i}.png")), 8 + i, 6, [if c == "a" { 0 } else { 255 }; 3]);
        }
    }
    fs::write(d.path().join("a/zero.png"), b"").unwrap();
    fs::write(d.path().join("b/garbage.jpg"), b"\xff\xd8\xff garbage").unwrap();
    let ds = Arc::new(scan(d.path()).unwrap());
    assert_eq!(ds.samples.len(), 8);
    let cfg =
        LoaderConfig { height: 4, width: 4, batch_size: 3, workers: 2, seed: 1, epochs: 2, ..LoaderConfig::default() };
    let (probe, rx) = probes::Probe::new(1024);
    let mut loader = Loader::start(ds, cfg, probe).unwrap();
    assert_eq!(loader.total_steps(), 6);
    let mut steps = Vec::new();
    let mut images = 0;
    while let Some(b) = loader.next_batch() {
        assert_eq!(b.pixels.len(), b.len() * 3 * 16);
        for (k, label) in b.labels.iter().enumerate() {
            // Class a is black, class b white: the label travels with its pixels.
            let v = b.pixels[k * 48];
            assert_eq!(v, if *label == 0 { 0.0 } else { 1.0 });
        }
        images += b.len();
        steps.push(b.step);
    }
    drop(loader);
    assert_eq!(steps, (0..6).collect::<Vec<_>>());
    assert_eq!(images, 12, "6 good images × 2 epochs");
    let skipped: Vec<String> = rx
        .try_iter()
        .filter_map(|e| match e {
            probes::Event::Skipped { path, reason } => Some(format!("{path}: {reason}")),
            _ => None,
        })
        .collect();
    assert_eq!(skipped.len(), 2, "reported once each over two epochs: {skipped:?}");
    assert!(skipped.iter().any(|s| s.contains("zero.png: empty file")), "{skipped:?}");
    assert!(skipped.iter().any(|s| s.contains("garbage.jpg")), "{skipped:?}");
}

#[test]
fn changing_workers_mid_run_keeps_every_batch_and_its_order() {
    let d = tempfile::tempdir().unwrap();
    for c in ["a", "b"] {
        fs::create_dir(d.path().join(c)).unwrap();
        for i in 0..10u8 {
            png_rgb(&d.path().join(format!("{c}/{i}.png")), 6, 6, [i * 20, if c == "a" { 0 } else { 255 }, 7]);
        }
    }
    let ds = Arc::new(scan(d.path()).unwrap());
    let cfg = |workers| LoaderConfig {
        height: 3,
        width: 3,
        batch_size: 3,
        workers,
        seed: 9,
        epochs: 2,
        ..LoaderConfig::default()
    };
    let (probe, _rx) = probes::Probe::new(1 << 16);
    let mut fixed = Loader::start(ds.clone(), cfg(1), probe.clone()).unwrap();
    let want: Vec<_> = std::iter::from_fn(|| fixed.next_batch()).collect();
    let mut changing = Loader::start(ds, cfg(1), probe).unwrap();
    let mut got = Vec::new();
    for (k, n) in [(2, 2), (5, 1), (7, 2)] {
        while got.len() < k {
            got.push(changing.next_batch().unwrap());
        }
        changing.set_workers(n).unwrap();
        assert_eq!(changing.workers(), n);
    }
    got.extend(std::iter::from_fn(|| changing.next_batch()));
    assert_eq!(got.len(), want.len());
    assert_eq!(got, want, "same steps, same contents, same order");
}
