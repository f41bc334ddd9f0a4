#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The loader alone at 150×150: from the photo folder (read → decode → resize) vs from a
//! packed cache of the same folder (one copy out of a memory map). Spans off.
//!
//! `cargo bench --bench cache [-- DIR]`. Without DIR, uses the 200 noisy 500×375 JPEGs the
//! loader bench writes to target/bench-photos.

use pipeprof_trainer::cache::{build, BuildOptions, Packed};
use pipeprof_trainer::data::demo::{DemoFormat, DemoSpec};
use pipeprof_trainer::data::{scan, Loader, LoaderConfig, SampleSource};
use probes::{clock, Probe};
use std::path::PathBuf;
use std::sync::Arc;

fn pass(src: &Arc<dyn SampleSource>, workers: usize, probe: &Probe) -> (f64, f64) {
    let cfg = LoaderConfig { height: 150, width: 150, workers, prefetch: 2 * workers, ..LoaderConfig::default() };
    let cpu0 = clock::process_cpu_ns();
    let t0 = clock::now_ns();
    let mut loader = Loader::start(src.clone(), cfg, probe.clone()).unwrap();
    let mut n = 0;
    while let Some(b) = loader.next_batch() {
        n += b.len();
    }
    drop(loader);
    let cpu = (clock::process_cpu_ns() - cpu0) as f64 / 1e9;
    let wall = (clock::now_ns() - t0) as f64 / 1e9;
    (n as f64 / cpu, n as f64 / wall)
}

fn best(src: &Arc<dyn SampleSource>, workers: usize, probe: &Probe) -> (f64, f64) {
    pass(src, workers, probe); // warm the page cache
    (0..5).map(|_| pass(src, workers, probe)).fold((0.0, 0.0), |a, b| (a.0.max(b.0), a.1.max(b.1)))
}

fn main() {
    let dir = std::env::args().skip(1).find(|a| !a.starts_with('-')).map(PathBuf::from).unwrap_or_else(|| {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-photos");
        let spec = DemoSpec { classes: 4, per_class: 50, size: Some((500, 375)), format: DemoFormat::Jpeg, seed: 9 };
        if !spec.is_present(&d) {
            spec.write(&d).unwrap();
        }
        d
    });
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-photos.ppk");
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let r = build(&BuildOptions {
        data: dir.clone(),
        out: out.clone(),
        size: pipeprof_trainer::cache::Size::Fixed { height: 150, width: 150 },
        channels: 3,
        rules: pipeprof_trainer::data::scan::Rules::Pipeprof,
        exact_decode: false,
        model: "bench".into(),
        workers: cores,
        progress: false,
        fail_after: None,
        abort_after: None,
        panic_on: None,
    })
    .unwrap();
    println!(
        "{} images in {}; cache built in {:.2} s with {cores} threads ({:.1} MB)",
        r.images,
        dir.display(),
        r.secs,
        r.bytes as f64 / 1e6
    );
    let folder: Arc<dyn SampleSource> = Arc::new(scan(&dir).unwrap());
    let packed: Arc<dyn SampleSource> = Arc::new(Packed::open(&out).unwrap());
    let (probe, rx) = Probe::new(probes::DEFAULT_CAPACITY);
    let drain = std::thread::spawn(move || rx.iter().count());
    for workers in [1, cores] {
        let f = best(&folder, workers, &probe);
        let c = best(&packed, workers, &probe);
        println!(
            "{workers} worker(s), 150×150: folder {:.0} images/s ({:.0}/CPU-s) · cache {:.0} images/s ({:.0}/CPU-s) · {:.1}× images/s",
            f.1,
            f.0,
            c.1,
            c.0,
            c.1 / f.1
        );
    }
    drop(probe);
    let _ = drain;
}
