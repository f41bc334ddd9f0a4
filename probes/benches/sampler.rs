#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Sampling overhead: the cost of one host sample and one (fake) GPU sample, and the CPU the
//! sampler threads use at the default 5 Hz as a share of one core.
//!
//! `cargo bench -p pipeprof-probes --bench sampler` (`PIPEPROF_BENCH_SECS` sets the live run).

use probes::clock;
use probes::sampler::{self, io_accounting_here, GpuSampler, HostSampler, IoAccounting, SamplerConfig};
use probes::Probe;
use std::path::Path;
use std::time::Duration;

fn per_call_us(n: u32, mut f: impl FnMut()) -> (f64, f64) {
    let (w0, c0) = (clock::now_ns(), clock::thread_cpu_ns());
    for _ in 0..n {
        f();
    }
    let wall = (clock::now_ns() - w0) as f64 / n as f64 / 1e3;
    let cpu = (clock::thread_cpu_ns() - c0) as f64 / n as f64 / 1e3;
    (wall, cpu)
}

fn main() {
    let secs: u64 = std::env::var("PIPEPROF_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let lib = fake_nvml::build(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench")).expect("fake NVML builds");
    std::env::set_var("FAKE_NVML_DEVICES", "2");

    // Idle loader threads, so the per-thread path has something to read.
    let (_keep, parked): (Vec<_>, Vec<_>) = (0..8)
        .map(|i| {
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let h = std::thread::Builder::new()
                .name(format!("loader-{i}"))
                .spawn(move || {
                    probes::set_thread_role(probes::ThreadRole::loader(i));
                    rx.recv().ok()
                })
                .expect("spawn");
            (tx, h)
        })
        .unzip();

    let (wall, _) = per_call_us(1, || {
        io_accounting_here();
    });
    println!("io accounting probe (once per run): {:.0} µs wall", wall);

    let mut host = HostSampler::new(std::process::id(), true, IoAccounting::ASSUMED).expect("host sampler");
    host.sample();
    // Back-to-back calls skip sysinfo's CPU refresh (< 200 ms apart): procfs part only.
    let (w, c) = per_call_us(500, || {
        host.sample();
    });
    println!("host sample, no CPU refresh: {w:.1} µs wall, {c:.1} µs CPU");
    // With the CPU refresh, as at 5 Hz: 205 ms apart.
    let mut cpu_total = 0u64;
    let n = 5;
    for _ in 0..n {
        std::thread::sleep(Duration::from_millis(205));
        let c0 = clock::thread_cpu_ns();
        host.sample();
        cpu_total += clock::thread_cpu_ns() - c0;
    }
    println!("host sample with CPU refresh: {:.1} µs CPU", cpu_total as f64 / n as f64 / 1e3);

    let mut gpu =
        GpuSampler::open(Some(&lib), probes::sampler::Watch::Process(std::process::id())).expect("fake NVML opens");
    let (w, c) = per_call_us(2_000, || {
        gpu.sample();
    });
    println!("GPU sample, 2 fake devices (nvml-wrapper overhead only): {w:.1} µs wall, {c:.1} µs CPU");
    drop(gpu);

    let (probe, rx) = Probe::new(65_536);
    let cfg = SamplerConfig { nvml_lib: Some(lib), ..SamplerConfig::default() };
    let h = sampler::start(probe, cfg).expect("start");
    std::thread::sleep(Duration::from_secs(secs));
    let stats = h.stop();
    drop(rx);
    let wall = secs as f64 * 1e9;
    for (name, s) in [("host", stats.host), ("gpu (fake)", stats.gpu)] {
        println!(
            "live 5 Hz, {name}: {} samples, {} skipped, {:.1} µs CPU per sample, {:.3}% of one core",
            s.samples,
            s.skipped_ticks,
            s.cpu_ns as f64 / s.samples.max(1) as f64 / 1e3,
            s.cpu_ns as f64 * 100.0 / wall
        );
    }
    drop(_keep);
    for h in parked {
        h.join().ok();
    }
}
