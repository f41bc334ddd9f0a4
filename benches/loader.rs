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
    println!("{} images in {}", ds.samples.len(), dir.display());
    let (probe, rx) = Probe::new(probes::DEFAULT_CAPACITY);
    let drain = std::thread::spawn(move || rx.iter().count());
    pass(&ds, &probe); // warm the page cache
    let off: Vec<(f64, f64)> = (0..3).map(|_| pass(&ds, &probe)).collect();
    let sub = tracing_subscriber::registry().with(ProbeLayer::new(probe.clone()));
    let _ = tracing::subscriber::set_global_default(sub);
    let on: Vec<(f64, f64)> = (0..3).map(|_| pass(&ds, &probe)).collect();
    let best = |v: &[(f64, f64)], i: usize| v.iter().map(|x| if i == 0 { x.0 } else { x.1 }).fold(0.0, f64::max);
    println!("1 worker, 150×150, spans off: {:.0} images/CPU-s, {:.0} images/s", best(&off, 0), best(&off, 1));
    println!("1 worker, 150×150, spans on:  {:.0} images/CPU-s, {:.0} images/s", best(&on, 0), best(&on, 1));
    println!("spans cost: {:+.2}% images/s", (best(&on, 1) / best(&off, 1) - 1.0) * 100.0);
    println!("dropped events: {}", probe.dropped());
    drop(probe);
    let _ = drain;
}
