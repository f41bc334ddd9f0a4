#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Loader throughput at 150×150 on photo-sized JPEGs: images per CPU-second, spans off vs on.
//!
//! `cargo bench --bench loader [-- DIR]`. Without DIR, writes 200 noisy 500×375 JPEGs (4
//! classes) to target/bench-photos once. Compare with the Python peer on the same folder:
//! `python3 ../shared/tools/peer_loader.py --root DIR --workers 0`.

use pipeprof::data::demo::{DemoFormat, DemoSpec};
use pipeprof::data::{scan, Dataset, Loader, LoaderConfig};
use probes::{clock, Probe, ProbeLayer};
use std::path::PathBuf;
use std::sync::Arc;
use tracing_subscriber::layer::SubscriberExt;

fn pass(ds: &Arc<Dataset>, probe: &Probe) -> (f64, f64) {
    let cfg = LoaderConfig {
        height: 150,
        width: 150,
        channels: 3,
        batch_size: 32,
        workers: 1,
        prefetch: 2,
        shuffle: false,
        seed: 0,
        epochs: 1,
        max_steps: None,
        throttle: None,
        slow: Vec::new(),
        augment: Default::default(),
    };
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

fn main() {
    let dir = std::env::args().skip(1).find(|a| !a.starts_with('-')).map(PathBuf::from).unwrap_or_else(|| {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-photos");
        let spec = DemoSpec { classes: 4, per_class: 50, size: Some((500, 375)), format: DemoFormat::Jpeg, seed: 9 };
        if !spec.is_present(&d) {
            spec.write(&d).unwrap_or_else(|e| panic!("cannot write {}: {e}", d.display()));
        }
        d
    });
    let ds = Arc::new(scan(&dir).unwrap_or_else(|e| panic!("{e}")));
    // A process can install its global subscriber only once, and passes run one after the
    // other drift (caches, clocks): so each pass is its own process, spans off and on
    // alternating, and each mode reports its median pass. On a shared VM identical passes
    // differ by ±20%: read the span cost from the overhead bench (ns per span × spans per
    // image), and this A/B only as a check that nothing is grossly off.
    if let Ok(mode) = std::env::var("PIPEPROF_BENCH_SPANS") {
        let (probe, rx) = Probe::new(probes::DEFAULT_CAPACITY);
        let drain = std::thread::spawn(move || rx.iter().count());
        if mode == "on" {
            let sub = tracing_subscriber::registry().with(ProbeLayer::new(probe.clone()));
            let _ = tracing::subscriber::set_global_default(sub);
        }
        pass(&ds, &probe); // warm the page cache
        let (cpu, wall) = pass(&ds, &probe);
        println!("{cpu} {wall} {}", probe.dropped());
        drop(probe);
        let _ = drain;
        return;
    }
    println!("{} images in {}", ds.samples.len(), dir.display());
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let mut runs: [Vec<(f64, f64)>; 2] = [Vec::new(), Vec::new()];
    let mut dropped = 0.0;
    for round in 0..10 {
        let mode = if round % 2 == 0 { "off" } else { "on" };
        let out = std::process::Command::new(&exe)
            .arg(&dir)
            .env("PIPEPROF_BENCH_SPANS", mode)
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        let v: Vec<f64> = text.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        if v.len() < 3 {
            panic!("bench child printed {text:?}");
        }
        runs[round % 2].push((v[0], v[1]));
        dropped += v[2];
    }
    let median = |v: &[(f64, f64)], pick: fn(&(f64, f64)) -> f64| {
        let mut x: Vec<f64> = v.iter().map(pick).collect();
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    };
    let spread = |v: &[(f64, f64)]| {
        let lo = v.iter().map(|x| x.1).fold(f64::MAX, f64::min);
        let hi = v.iter().map(|x| x.1).fold(0.0, f64::max);
        (hi / lo - 1.0) * 100.0
    };
    for (name, r) in [("off", &runs[0]), ("on ", &runs[1])] {
        println!(
            "1 worker, 150×150, spans {name}: {:.0} images/CPU-s, {:.0} images/s (median of 5; spread {:.0}%)",
            median(r, |x| x.0),
            median(r, |x| x.1),
            spread(r)
        );
    }
    let (off, on) = (median(&runs[0], |x| x.1), median(&runs[1], |x| x.1));
    println!("spans on vs off: {:+.2}% images/s", (on / off - 1.0) * 100.0);
    println!(
        "loader time per image: {:.0} µs (3 CPU-timed spans per image: see `cargo bench --bench overhead`)",
        1e6 / off
    );
    println!("dropped events: {dropped}");
}
