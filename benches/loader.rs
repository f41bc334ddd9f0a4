#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Loader throughput at 150×150, 1 worker, images per CPU-second: pipeprof against the Pillow
//! peer (benches/peer_loader.py) on three sets, in alternating processes, with the ratio.
//!
//! `cargo bench --bench loader [-- DIR]`. Without DIR, writes once under target/ (all four, of
//! which `PIPEPROF_LOADER_SETS=d` picks some to measure):
//! (a) bench-photos: 200 noisy 500×375 JPEGs (q75, 4:2:0), as the other benches use;
//! (b) bench-camera: 24 photo-like 3000×2000 JPEGs (q90, 4:2:0, as a phone camera writes);
//! (c) bench-pngs: 100 noisy 500×375 PNGs;
//! (d) bench-small: 250 small photo-like images of the mix real data sets have (sizes around a
//! median of ≈ 305×302): 200 JPEGs (q90, 4:2:0, 1 in 5 grayscale) and 50 PNGs.
//! The peer runs when `python3 -c "import PIL, numpy"` works (`pip install pillow numpy`).
//! Then, in this process: decode + resize per image with the scaled JPEG decode vs at full
//! size, and the PSNR between the two results.

use pipeprof_trainer::data::demo::{DemoFormat, DemoSpec};
use pipeprof_trainer::data::image::{decode, decode_for, Pixels, Resizer};
use pipeprof_trainer::data::{scan, Dataset, Loader, LoaderConfig};
use probes::{clock, Probe, ProbeLayer};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use tracing_subscriber::layer::SubscriberExt;

const PEER: &str = include_str!("peer_loader.py");
const SIDE: u32 = 150;

fn pass(ds: &Arc<Dataset>, probe: &Probe) -> (f64, f64) {
    // PIPEPROF_BENCH_WORKERS: more loader threads in the child (for allocator checks by hand).
    let workers = std::env::var("PIPEPROF_BENCH_WORKERS").ok().and_then(|w| w.parse().ok()).unwrap_or(1);
    let cfg = LoaderConfig { height: SIDE, width: SIDE, shuffle: false, workers, ..LoaderConfig::default() };
    let cpu0 = clock::process_cpu_ns();
    let t0 = clock::now_ns();
    let mut loader = Loader::start(ds.clone(), cfg, probe.clone()).unwrap_or_else(|e| panic!("loader: {e}"));
    let mut n = 0;
    while let Some(b) = loader.next_batch() {
        n += b.len();
    }
    drop(loader);
    let cpu = (clock::process_cpu_ns() - cpu0) as f64 / 1e9;
    let wall = (clock::now_ns() - t0) as f64 / 1e9;
    (n as f64 / cpu, n as f64 / wall)
}

/// The child process: one warm pass (page cache), one timed; prints "per-CPU-s per-s dropped".
fn child(dir: &Path, spans: &str) {
    let ds = Arc::new(scan(dir).unwrap_or_else(|e| panic!("{e}")));
    let (probe, rx) = Probe::new(probes::DEFAULT_CAPACITY);
    let drain = std::thread::spawn(move || rx.iter().count());
    if spans == "on" {
        let sub = tracing_subscriber::registry().with(ProbeLayer::new(probe.clone()));
        let _ = tracing::subscriber::set_global_default(sub);
    }
    pass(&ds, &probe);
    let (cpu, wall) = pass(&ds, &probe);
    println!("{cpu} {wall} {}", probe.dropped());
    drop(probe);
    let _ = drain;
}

/// A photo-like frame: a lit gradient, 40 textured discs, sensor-like noise of ±`noise`.
fn camera_frame(w: usize, h: usize, seed: u64, noise: u64) -> Vec<u8> {
    let mut rng = pipeprof_trainer::data::rng::SplitMix::new(seed);
    let discs: Vec<(f32, f32, f32, [f32; 3], f32)> = (0..40)
        .map(|_| {
            let (x, y) = (rng.below(w as u64) as f32, rng.below(h as u64) as f32);
            let r = w as f32 * (0.03 + 0.2 * rng.unit() as f32);
            let c = [rng.below(256) as f32, rng.below(256) as f32, rng.below(256) as f32];
            (x, y, r, c, 3.0 + rng.below(30) as f32)
        })
        .collect();
    let mut img = vec![0u8; w * h * 3];
    for y in 0..h {
        for x in 0..w {
            let (fx, fy) = (x as f32, y as f32);
            let mut c = [60.0 + 100.0 * fx / w as f32, 80.0 + 60.0 * fy / h as f32, 120.0];
            for &(bx, by, r, col, period) in &discs {
                let (dx, dy) = (fx - bx, fy - by);
                if dx * dx + dy * dy < r * r {
                    let t = (fx / period).sin() * (fy / period).cos() * 25.0;
                    c = [col[0] + t, col[1] + t, col[2] + t];
                }
            }
            let n = rng.below(2 * noise + 1) as f32 - noise as f32;
            for k in 0..3 {
                img[(y * w + x) * 3 + k] = (c[k] + n).clamp(0.0, 255.0) as u8;
            }
        }
    }
    img
}

fn camera_set(dir: &Path) {
    const MARK: &str = ".camera-v1";
    if dir.join(MARK).exists() {
        return;
    }
    for i in 0..24u64 {
        let sub = dir.join(["day", "night"][(i % 2) as usize]);
        std::fs::create_dir_all(&sub).unwrap();
        let px = camera_frame(3000, 2000, i, 6);
        let mut out = Vec::new();
        let mut enc = jpeg_encoder::Encoder::new(&mut out, 90);
        enc.set_sampling_factor(jpeg_encoder::SamplingFactor::F_2_2);
        enc.encode(&px, 3000, 2000, jpeg_encoder::ColorType::Rgb).unwrap();
        std::fs::write(sub.join(format!("img_{i:03}.jpg")), out).unwrap();
    }
    std::fs::write(dir.join(MARK), "").unwrap();
}

/// The small real-photo mix: 250 images of 265–345 × 262–342 px, 4 classes; every 5th is a
/// PNG, every 5th of the rest a grayscale JPEG. Deterministic.
fn small_set(dir: &Path) {
    const MARK: &str = ".small-v2";
    if dir.join(MARK).exists() {
        return;
    }
    for i in 0..250u64 {
        let sub = dir.join(format!("class_{}", i % 4));
        std::fs::create_dir_all(&sub).unwrap();
        let (w, h) = (265 + (i * 37 % 81) as usize, 262 + (i * 53 % 81) as usize);
        let px = camera_frame(w, h, 1000 + i, 8);
        if i % 5 == 4 {
            let img = image::RgbImage::from_raw(w as u32, h as u32, px).unwrap();
            img.save(sub.join(format!("img_{i:03}.png"))).unwrap();
            continue;
        }
        let mut out = Vec::new();
        let mut enc = jpeg_encoder::Encoder::new(&mut out, 90);
        enc.set_sampling_factor(jpeg_encoder::SamplingFactor::F_2_2);
        if (i / 5) % 5 == 2 {
            let luma: Vec<u8> = px
                .chunks_exact(3)
                .map(|p| ((p[0] as u32 * 77 + p[1] as u32 * 150 + p[2] as u32 * 29) >> 8) as u8)
                .collect();
            enc.encode(&luma, w as u16, h as u16, jpeg_encoder::ColorType::Luma).unwrap();
        } else {
            enc.encode(&px, w as u16, h as u16, jpeg_encoder::ColorType::Rgb).unwrap();
        }
        std::fs::write(sub.join(format!("img_{i:03}.jpg")), out).unwrap();
    }
    std::fs::write(dir.join(MARK), "").unwrap();
}

fn demo_set(dir: &Path, per_class: usize, format: DemoFormat) {
    let spec = DemoSpec { classes: 4, per_class, size: Some((500, 375)), format, seed: 9 };
    if !spec.is_present(dir) {
        spec.write(dir).unwrap_or_else(|e| panic!("cannot write {}: {e}", dir.display()));
    }
}

fn numbers(out: &std::process::Output, who: &str) -> Vec<f64> {
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<f64> = text.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    if !out.status.success() || v.len() < 2 {
        panic!("{who} printed {text:?}; stderr: {}", String::from_utf8_lossy(&out.stderr));
    }
    v
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn spread(v: &[f64]) -> f64 {
    let lo = v.iter().copied().fold(f64::MAX, f64::min);
    let hi = v.iter().copied().fold(0.0, f64::max);
    (hi / lo - 1.0) * 100.0
}

/// The decoder before this one: the `image` crate (zune-jpeg, png), full size, RGB copy.
fn decode_image_crate(bytes: &[u8]) -> Pixels {
    let img = image::load_from_memory(bytes).unwrap().to_rgb8();
    Pixels { width: img.width(), height: img.height(), channels: 3, data: img.into_raw(), warning: None }
}

/// Decode + resize per image (thread CPU): the `image` crate, pipeprof's decoder at full size,
/// and scaled, in rotation; and the PSNR of the scaled result against the full one.
fn scaled_vs_full(name: &str, dir: &Path) {
    let ds = scan(dir).unwrap_or_else(|e| panic!("{e}"));
    let files: Vec<Vec<u8>> = ds.samples.iter().map(|s| std::fs::read(&s.path).unwrap()).collect();
    let mut rz = Resizer::new();
    let mut ns: [Vec<f64>; 3] = Default::default();
    let (mut sq, mut n) = (0f64, 0usize);
    for round in 0..9 {
        let t0 = clock::thread_cpu_ns();
        for f in &files {
            let px = match round % 3 {
                0 => decode_image_crate(f),
                1 => decode(f, 3).unwrap(),
                _ => decode_for(f, 3, SIDE, SIDE).unwrap(),
            };
            std::hint::black_box(rz.resize_u8(&px, SIDE, SIDE).unwrap());
        }
        ns[round % 3].push((clock::thread_cpu_ns() - t0) as f64 / files.len() as f64);
    }
    for f in &files {
        let a = rz.resize_u8(&decode(f, 3).unwrap(), SIDE, SIDE).unwrap().to_vec();
        let b = rz.resize_u8(&decode_for(f, 3, SIDE, SIDE).unwrap(), SIDE, SIDE).unwrap();
        sq += a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum::<f64>();
        n += a.len();
    }
    let mse = sq / n as f64;
    let psnr = if mse == 0.0 { f64::INFINITY } else { 10.0 * (255.0f64 * 255.0 / mse).log10() };
    let [old, full, scaled] = ns.map(median);
    println!(
        "{name}: decode+resize per image: image crate {:.2} ms, pipeprof full size {:.2} ms, scaled {:.2} ms \
         ({:.1}× the image crate, {:.1}× full size); PSNR scaled vs full {psnr:.1} dB",
        old / 1e6,
        full / 1e6,
        scaled / 1e6,
        old / scaled,
        full / scaled
    );
}

fn main() {
    if let Ok(spans) = std::env::var("PIPEPROF_BENCH_CHILD") {
        let dir = std::env::args().nth(1).map(PathBuf::from).unwrap();
        return child(&dir, &spans);
    }
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
    let sets: Vec<(String, PathBuf, usize)> = match std::env::args().skip(1).find(|a| !a.starts_with('-')) {
        Some(d) => vec![(d.clone(), PathBuf::from(d), 5)],
        None => {
            let (a, b, c) = (target.join("bench-photos"), target.join("bench-camera"), target.join("bench-pngs"));
            let d = target.join("bench-small");
            demo_set(&a, 50, DemoFormat::Jpeg);
            camera_set(&b);
            demo_set(&c, 25, DemoFormat::Png);
            small_set(&d);
            let only = std::env::var("PIPEPROF_LOADER_SETS").unwrap_or_else(|_| "abcd".into());
            let all: Vec<(String, PathBuf, usize)> = vec![
                ("(a) 200 JPEGs 500×375 q75".into(), a, 5),
                ("(b) 24 JPEGs 3000×2000 q90".into(), b, 3),
                ("(c) 100 PNGs 500×375".into(), c, 5),
                ("(d) 250 small photos ≈305×302: 160 JPEGs, 40 grayscale JPEGs, 50 PNGs".into(), d, 7),
            ];
            all.into_iter().filter(|(name, ..)| only.contains(&name[1..2])).collect()
        }
    };
    let peer = std::env::temp_dir().join(format!("pipeprof-peer-{}.py", std::process::id()));
    std::fs::write(&peer, PEER).unwrap();
    let python = Command::new("python3").args(["-c", "import PIL, numpy"]).output().is_ok_and(|o| o.status.success());
    if !python {
        println!("Pillow peer: not run (needs python3 with Pillow and numpy: pip install pillow numpy)");
    }
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    println!("1 worker, {SIDE}×{SIDE}, images per CPU-second, median of the rounds (alternating processes)");
    for (name, dir, rounds) in &sets {
        let (mut off, mut on, mut py) = (Vec::new(), Vec::new(), Vec::new());
        let mut dropped = 0.0;
        for _ in 0..*rounds {
            for spans in ["off", "on"] {
                let out = Command::new(&exe).arg(dir).env("PIPEPROF_BENCH_CHILD", spans).output().unwrap();
                let v = numbers(&out, "bench child");
                if spans == "off" { &mut off } else { &mut on }.push(v[0]);
                dropped += v.get(2).copied().unwrap_or(0.0);
            }
            if python {
                let out = Command::new("python3").arg(&peer).arg(dir).output().unwrap();
                py.push(numbers(&out, "Pillow peer")[0]);
            }
        }
        let (spread_off, spread_on) = (spread(&off), spread(&on));
        let (off, on) = (median(off), median(on));
        print!(
            "{name}: pipeprof {off:.0} (spans on {on:.0}, {:+.1}%; spread {spread_off:.0}%/{spread_on:.0}%)",
            (on / off - 1.0) * 100.0
        );
        if python {
            let spread_py = spread(&py);
            let py = median(py);
            print!(", Pillow {py:.0} (spread {spread_py:.0}%): {:.2}×", off / py);
        }
        println!("; dropped events {dropped}");
    }
    let _ = std::fs::remove_file(&peer);
    for (name, dir, _) in &sets {
        scaled_vs_full(name, dir);
    }
}
