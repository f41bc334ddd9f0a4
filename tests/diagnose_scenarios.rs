//! Events → aggregate → diagnose, on a simulated pipeline: loader workers with per-stage wall
//! and on-CPU costs, a training loop that waits for each batch. Timestamps are computed, never
//! read from a clock, so every verdict is exact and repeatable.

use pipeprof_core::aggregate::{Aggregator, RunSettings, Summary};
use pipeprof_core::diagnose::{diagnose, Change, Flag, Limiter, Severity};
use probes::{Event, SpanRecord, Stage, StepRecord, ThreadRole, NONE};

const MS: f64 = 1e6;

/// One simulated run.
struct Sim {
    workers: usize,
    batch: usize,
    steps: u64,
    /// Per image: (stage, wall ms, on-CPU share).
    loader: Vec<(Stage, f64, f64)>,
    transfer_ms: f64,
    compute_ms: f64,
}

impl Sim {
    fn new(workers: usize, loader: &[(Stage, f64, f64)], compute_ms: f64) -> Sim {
        Sim { workers, batch: 8, steps: 50, loader: loader.to_vec(), transfer_ms: 0.1, compute_ms }
    }

    /// Worker `k % workers` builds batch `k` whole, its batches back to back (the prefetch bound
    /// never binds a loader slower than the loop, and cannot slow one that is faster).
    fn run(&self) -> Summary {
        let mut agg = Aggregator::new(RunSettings {
            workers: self.workers,
            cores: 2,
            batch_size: self.batch,
            prefetch: 2,
            device: "cuda:0".into(),
            input: [3, 32, 32],
            ..Default::default()
        });
        for w in 0..self.workers {
            let role = ThreadRole::loader(w as u32);
            agg.push(&Event::Thread { id: w as u32 + 1, name: role.thread_name().into(), role });
        }
        let train = 100;
        agg.push(&Event::Thread { id: train, name: "train".into(), role: ThreadRole::Train });
        let per_image: f64 = self.loader.iter().map(|(_, ms, _)| ms).sum();
        let span = |stage, thread, start: f64, ms: f64, cpu: Option<f64>, step| {
            Event::Span(SpanRecord {
                stage,
                thread,
                start_ns: start as u64,
                dur_ns: (ms * MS) as u64,
                cpu_ns: cpu.map_or(NONE, |c| (c * ms * MS) as u64),
                queue_ns: NONE,
                step,
                sample: NONE,
                bytes: NONE,
            })
        };
        let mut t = 0.0;
        for k in 0..self.steps {
            let w = (k as usize) % self.workers;
            let round = (k as usize / self.workers) as f64;
            let mut at = round * self.batch as f64 * per_image * MS;
            for _ in 0..self.batch {
                for &(stage, ms, on) in &self.loader {
                    agg.push(&span(stage, w as u32 + 1, at, ms, Some(on), NONE));
                    at += ms * MS;
                }
            }
            let wait_ms = ((at - t) / MS).max(0.0);
            agg.push(&span(Stage::Wait, train, t, wait_ms, None, k));
            t += wait_ms * MS;
            agg.push(&span(Stage::Transfer, train, t, self.transfer_ms, Some(1.0), k));
            t += self.transfer_ms * MS;
            agg.push(&span(Stage::Compute, train, t, self.compute_ms, None, k));
            t += self.compute_ms * MS;
            agg.push(&Event::Step(StepRecord {
                no_loss: false,
                step: k,
                epoch: 0,
                images: self.batch as u32,
                loss: 1.0,
                correct: 0,
                end_ns: t as u64,
                queued: 0,
                validation: false,
            }));
        }
        agg.summary()
    }
}

#[test]
fn simulated_slow_storage_gives_io_verdict() {
    // 20 ms per read, 1% of it on a CPU: a throttled or network disk.
    let s = Sim::new(2, &[(Stage::Read, 20.0, 0.01), (Stage::Decode, 1.0, 1.0)], 5.0).run();
    let v = diagnose(&s);
    assert_eq!(v.limiter, Limiter::Io, "{v:#?}");
    assert_eq!(v.severity, Severity::High);
    assert!(v.evidence.iter().any(|e| e.contains("read is 99% blocked off-CPU")), "{:#?}", v.evidence);
}

#[test]
fn simulated_cpu_decode_gives_preprocess_verdict_with_too_few_workers() {
    let s = Sim::new(1, &[(Stage::Read, 0.2, 0.5), (Stage::Decode, 6.0, 1.0), (Stage::Resize, 4.0, 1.0)], 5.0).run();
    let v = diagnose(&s);
    assert_eq!(v.limiter, Limiter::Preprocess, "{v:#?}");
    assert!(v.flags.contains(&Flag::TooFewWorkers { workers: 1, cores: 2 }), "{:?}", v.flags);
}

#[test]
fn same_wall_time_split_differently_on_cpu_gives_different_verdicts() {
    // Identical stage names and wall times; only read's on-CPU share differs.
    let slow_disk = Sim::new(1, &[(Stage::Read, 10.0, 0.02), (Stage::Decode, 2.0, 1.0)], 5.0).run();
    let busy_read = Sim::new(1, &[(Stage::Read, 10.0, 0.98), (Stage::Decode, 2.0, 1.0)], 5.0).run();
    assert_eq!(diagnose(&slow_disk).limiter, Limiter::Io);
    assert_eq!(diagnose(&busy_read).limiter, Limiter::Preprocess);
}

#[test]
fn predicted_worker_gain_matches_a_simulated_rerun() {
    let loader = [(Stage::Read, 0.2, 0.5), (Stage::Decode, 6.0, 1.0), (Stage::Resize, 4.0, 1.0)];
    let one = Sim::new(1, &loader, 5.0).run();
    let v = diagnose(&one);
    let predicted =
        v.advice.iter().find(|a| a.change == Change::Workers(2)).and_then(|a| a.predicted_speedup).unwrap_or(0.0);
    let two = Sim::new(2, &loader, 5.0).run();
    let measured = two.images_per_s / one.images_per_s;
    // The rerun also pays one batch of pipeline fill: within 5%.
    assert!((predicted / measured - 1.0).abs() < 0.05, "predicted {predicted:.3}×, simulated {measured:.3}×");
}

#[test]
fn simulated_heavy_compute_gives_compute_verdict_without_advice() {
    let s = Sim::new(2, &[(Stage::Read, 0.1, 0.5), (Stage::Decode, 1.0, 1.0)], 40.0).run();
    let v = diagnose(&s);
    assert_eq!(v.limiter, Limiter::Compute, "{v:#?}");
    assert_eq!(v.severity, Severity::Low);
    assert!(v.advice.is_empty(), "{:?}", v.advice);
}
