#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The decoder on a hostile ImageFolder tree (cut JPEGs, every accepted format, a stray .txt),
//! and the scaled JPEG decode against a full decode + resize.

use pipeprof_trainer::data::image::{
    decode, decode_for, decode_for_keeping_gray, decode_for_reusing, DecodeWarning, ImageError, Resizer, LIBJPEG,
};
use pipeprof_trainer::data::scan;
use std::fs;
use std::path::Path;

/// A smooth photo-like frame with some texture: what the scaled-decode quality is about.
fn photo(w: u32, h: u32) -> image::RgbImage {
    image::RgbImage::from_fn(w, h, |x, y| {
        let (fx, fy) = (x as f32, y as f32);
        let t = (fx / 9.0).sin() * (fy / 13.0).cos() * 30.0;
        let disc = ((fx - w as f32 * 0.6).powi(2) + (fy - h as f32 * 0.4).powi(2)).sqrt() < h as f32 * 0.3;
        let base = if disc {
            [200.0, 90.0, 40.0]
        } else {
            [40.0 + 150.0 * fx / w as f32, 120.0, 60.0 + 100.0 * fy / h as f32]
        };
        image::Rgb(base.map(|c| (c + t).clamp(0.0, 255.0) as u8))
    })
}

fn jpeg(img: &image::RgbImage, quality: u8, progressive: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut enc = jpeg_encoder::Encoder::new(&mut out, quality);
    enc.set_progressive(progressive);
    enc.encode(img.as_raw(), img.width() as u16, img.height() as u16, jpeg_encoder::ColorType::Rgb).unwrap();
    out
}

fn save(img: &image::RgbImage, path: &Path, format: image::ImageFormat) {
    img.save_with_format(path, format).unwrap();
}

fn psnr(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len());
    let mse = a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum::<f64>() / a.len() as f64;
    10.0 * (255.0f64 * 255.0 / mse.max(1e-12)).log10()
}

#[test]
fn hostile_tree_each_entry_has_its_expected_outcome() {
    let d = tempfile::tempdir().unwrap();
    let class = d.path().join("things");
    fs::create_dir(&class).unwrap();
    let img = photo(96, 64);
    let good = jpeg(&img, 90, false);
    let progressive = jpeg(&img, 90, true);
    assert_eq!(&good[good.len() - 2..], &[0xFF, 0xD9]);
    fs::write(class.join("good.jpg"), &good).unwrap();
    fs::write(class.join("half.jpg"), &good[..good.len() / 2]).unwrap();
    fs::write(class.join("no_eoi.jpg"), &good[..good.len() - 2]).unwrap();
    fs::write(class.join("half_progressive.jpeg"), &progressive[..progressive.len() * 2 / 3]).unwrap();
    for (name, format) in [
        ("a.bmp", image::ImageFormat::Bmp),
        ("a.webp", image::ImageFormat::WebP),
        ("a.tiff", image::ImageFormat::Tiff),
        ("a.tif", image::ImageFormat::Tiff),
        ("a.ppm", image::ImageFormat::Pnm),
        ("a.gif", image::ImageFormat::Gif),
        ("a.png", image::ImageFormat::Png),
    ] {
        save(&img, &class.join(name), format);
    }
    let luma = image::DynamicImage::ImageRgb8(img.clone()).to_luma8();
    luma.save_with_format(class.join("g.pgm"), image::ImageFormat::Pnm).unwrap();
    let png = fs::read(class.join("a.png")).unwrap();
    fs::write(class.join("cut.png"), &png[..png.len() / 2]).unwrap();
    fs::write(class.join("notes.txt"), "not an image").unwrap();
    fs::write(class.join("IMG_1.HEIC"), "not decoded").unwrap();
    fs::write(class.join("Makefile"), "no extension").unwrap();

    let ds = scan(d.path()).unwrap();
    let names: Vec<String> = ds.samples.iter().map(|s| s.path.file_name().unwrap().to_string_lossy().into()).collect();
    assert_eq!(names.len(), 13, "{names:?}");
    assert_eq!(ds.ignored, 3);
    assert_eq!(ds.ignored_summary().as_deref(), Some("1 (none), 1 .heic, 1 .txt"));

    for name in &names {
        let got = decode_for(&fs::read(class.join(name)).unwrap(), 3, 40, 40);
        match name.as_str() {
            "half.jpg" | "half_progressive.jpeg" | "cut.png" => {
                let e = got.unwrap_err();
                assert!(matches!(e, ImageError::Truncated(_)), "{name}: {e:?}");
                assert!(e.to_string().starts_with("truncated"), "{name}: {e}");
            }
            "no_eoi.jpg" if !LIBJPEG => {
                // Without libjpeg there is no telling a cut scan from a lost marker: refused.
                assert!(matches!(got, Err(ImageError::Truncated(_))), "{name}: {got:?}");
            }
            "no_eoi.jpg" => {
                let px = got.unwrap();
                assert_eq!(px.warning, Some(DecodeWarning::MissingEndMarker), "{name}");
                assert!(px.warning.unwrap().to_string().contains("end-of-image"));
            }
            _ => {
                let px = got.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!((px.channels, px.warning), (3, None), "{name}");
                // 64 is less than twice 40: even the JPEG is decoded at full size.
                assert_eq!((px.width, px.height), (96, 64), "{name}");
                // Lossless formats give the source back exactly (GIF: palette; PGM: gray).
                if matches!(name.as_str(), "a.bmp" | "a.webp" | "a.tiff" | "a.tif" | "a.ppm" | "a.png") {
                    assert_eq!(px.data, img.as_raw().as_slice(), "{name}");
                } else if name == "g.pgm" {
                    let gray: Vec<u8> = luma.as_raw().iter().flat_map(|v| [*v; 3]).collect();
                    assert_eq!(px.data, gray, "{name}");
                } else {
                    assert!(psnr(&px.data, img.as_raw()) > 20.0, "{name}");
                }
            }
        }
    }
}

#[test]
fn scaled_jpeg_decode_matches_full_decode_and_resize() {
    let img = photo(1200, 800);
    let bytes = jpeg(&img, 90, false);
    let scaled = decode_for(&bytes, 3, 150, 150).unwrap();
    let full = decode(&bytes, 3).unwrap();
    assert_eq!((full.width, full.height), (1200, 800));
    if LIBJPEG {
        // 800 / 4 = 200 ≥ 150 but 800 / 8 = 100 < 150: a quarter of each side.
        assert_eq!((scaled.width, scaled.height), (300, 200));
    }
    let mut rz = Resizer::new();
    let a = rz.resize_u8(&full, 150, 150).unwrap().to_vec();
    let b = rz.resize_u8(&scaled, 150, 150).unwrap().to_vec();
    let max = a.iter().zip(&b).map(|(x, y)| x.abs_diff(*y)).max().unwrap();
    let q = psnr(&a, &b);
    eprintln!("scaled vs full decode, then resized to 150×150: PSNR {q:.1} dB, max error {max}");
    assert!(q > 38.0, "PSNR {q:.1} dB, max error {max}");
    // Same for grayscale output, and a target the image does not cover twice is not scaled.
    let gray = decode_for(&bytes, 1, 150, 150).unwrap();
    assert_eq!((gray.channels, gray.data.len()), (1, (scaled.width * scaled.height) as usize));
    let near = decode_for(&bytes, 3, 700, 150).unwrap();
    assert_eq!((near.width, near.height), (1200, 800));
}

#[test]
fn a_reused_buffer_decodes_to_the_same_pixels() {
    // A loader worker hands back the previous image's buffer, larger and full of old pixels
    // (and a smaller one, which must grow).
    let big = jpeg(&photo(320, 300), 90, false);
    let small = jpeg(&photo(64, 48), 90, true);
    for (bytes, (w, h)) in [(&big, (150, 150)), (&small, (150, 150)), (&big, (0, 0))] {
        let fresh = decode_for(bytes, 3, w, h).unwrap();
        for reuse in [vec![0xA5u8; 400_000], vec![7u8; 10]] {
            let px = decode_for_reusing(bytes, 3, w, h, reuse).unwrap();
            assert_eq!(px, fresh);
        }
    }
}

#[test]
fn a_grayscale_jpeg_kept_as_luma_resizes_to_the_same_planes_as_its_rgb_replica() {
    let luma = image::GrayImage::from_fn(333, 301, |x, y| {
        let t = ((x as f32 / 7.0).sin() * (y as f32 / 5.0).cos() * 40.0) as i32;
        image::Luma([(60 + (x * 100 / 333) as i32 + t).clamp(0, 255) as u8])
    });
    let mut bytes = Vec::new();
    jpeg_encoder::Encoder::new(&mut bytes, 90).encode(luma.as_raw(), 333, 301, jpeg_encoder::ColorType::Luma).unwrap();
    let colour = jpeg(&photo(333, 301), 90, false);
    let mut rz = Resizer::new();
    for (file, side) in [(&bytes, 150u32), (&bytes, 100), (&bytes, 200), (&colour, 150)] {
        let plane = (side * side) as usize;
        let rgb = decode_for(file, 3, side, side).unwrap();
        let mut want = vec![0f32; 3 * plane];
        rz.resize_into(&rgb, side, side, &mut want).unwrap();
        let kept = decode_for_keeping_gray(file, side, side, Vec::new()).unwrap();
        if LIBJPEG {
            assert_eq!(kept.channels, if std::ptr::eq(file, &bytes) { 1 } else { 3 });
        }
        let mut got = vec![-1f32; 3 * plane];
        rz.resize_into_rgb(&kept, side, side, &mut got).unwrap();
        assert_eq!(got, want, "{side}");
    }
}

#[test]
fn grayscale_jpeg_is_replicated_to_rgb_and_kept_as_luma() {
    let luma = image::GrayImage::from_fn(64, 64, |x, y| image::Luma([(x * 2 + y) as u8]));
    let mut bytes = Vec::new();
    jpeg_encoder::Encoder::new(&mut bytes, 95).encode(luma.as_raw(), 64, 64, jpeg_encoder::ColorType::Luma).unwrap();
    let rgb = decode(&bytes, 3).unwrap();
    assert_eq!(rgb.channels, 3);
    assert!(rgb.data.chunks_exact(3).all(|p| p[0] == p[1] && p[1] == p[2]));
    let gray = decode(&bytes, 1).unwrap();
    assert_eq!(gray.channels, 1);
    assert!(gray.data.iter().zip(luma.as_raw()).all(|(a, b)| a.abs_diff(*b) <= 3));
}

#[test]
fn hostile_jpegs_cut_between_scans_cut_cmyk_and_endless_scans_are_refused_with_a_reason() {
    use pipeprof_trainer::data::image::MAX_JPEG_SCANS;
    let img = photo(64, 48);
    // A progressive file cut just before its last scan: no error inside a scan, but not all
    // its pixel data.
    let progressive = jpeg(&img, 90, true);
    let last_scan = progressive.windows(2).rposition(|w| w == [0xFF, 0xDA]).unwrap();
    assert!(decode_for(&progressive, 3, 0, 0).is_ok(), "the whole file decodes");
    let cut = decode_for(&progressive[..last_scan], 3, 0, 0);
    assert!(matches!(cut, Err(ImageError::Truncated(_))), "{cut:?}");

    // CMYK (decoded by the image crate, not libjpeg): whole is fine, cut is refused.
    let cmyk: Vec<u8> = img.as_raw().chunks(3).flat_map(|p| [255 - p[0], 255 - p[1], 255 - p[2], 0]).collect();
    let mut whole = Vec::new();
    jpeg_encoder::Encoder::new(&mut whole, 90).encode(&cmyk, 64, 48, jpeg_encoder::ColorType::Cmyk).unwrap();
    assert!(decode_for(&whole, 3, 0, 0).is_ok(), "a whole CMYK JPEG decodes");
    let cut = decode_for(&whole[..whole.len() * 2 / 3], 3, 0, 0);
    assert!(matches!(cut, Err(ImageError::Truncated(_))), "{cut:?}");

    // Thousands of scans: refused before any decoding, saying why.
    let mut endless = vec![0xFF, 0xD8];
    for _ in 0..MAX_JPEG_SCANS + 1 {
        endless.extend([0xFF, 0xDA, 0x00, 0x02]);
    }
    endless.extend([0xFF, 0xD9]);
    let e = decode_for(&endless, 3, 0, 0).unwrap_err().to_string();
    assert!(e.contains(&format!("{} scans", MAX_JPEG_SCANS + 1)), "{e}");
}
