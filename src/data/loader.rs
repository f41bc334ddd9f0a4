//! The loader: worker threads read → decode → resize each sample into batches that wait in a
//! bounded prefetch queue. Every stage is a `tracing` span.
//!
//! Worker `w` builds steps `w, w+W, w+2W, …` into its own bounded queue and the training
//! loop takes step `k` from queue `k mod W`: batch order and contents are deterministic for
//! a seed whatever the thread timing, and memory is bounded by the prefetch depth.
//!
//! Samples come through [`SampleSource`]; this file also implements it for the ImageFolder
//! [`Dataset`] (read → decode → resize, each a span).

use super::augment;
use super::image::{decode, hwc_to_chw, Resizer};
use super::plan::{EpochOrder, LoaderConfig, Plan};
use super::scan::Dataset;
use super::simulate::{extra_for, SlowLink};
use super::source::{LoadCtx, SampleSource, Scratch};
use crossbeam_channel::{Receiver, Sender};
use probes::Stage;
use probes::{clock, Event, Probe};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use tracing::info_span;

/// One batch, ready for the device: f32 NCHW in [0, 1] and u32 labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub step: u64,
    pub epoch: u32,
    pub pixels: Vec<f32>,
    pub labels: Vec<u32>,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.labels.len()
    }
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

/// Files that failed, reported once each however many epochs touch them.
#[derive(Default)]
struct SkipLog {
    seen: Mutex<HashSet<u32>>,
}

/// The workers' batch-making time, summed over workers and generations (the send to the
/// queue, which blocks when the queue is full, is left out): what `--workers auto` reads to
/// tell workers waiting on storage from workers waiting for a core.
#[derive(Default)]
struct Production {
    busy_ns: AtomicU64,
    blocked_ns: AtomicU64,
}

pub struct Loader {
    src: Arc<dyn SampleSource>,
    production: Arc<Production>,
    /// Worker generations started so far: each has its own thread names.
    generation: u32,
    plan: Arc<Plan>,
    cfg: Arc<LoaderConfig>,
    skips: Arc<SkipLog>,
    link: Option<Arc<SlowLink>>,
    probe: Probe,
    queues: Vec<Receiver<Batch>>,
    handles: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    /// The step the current workers started from.
    first: u64,
    next: u64,
    total: u64,
    per_epoch: u64,
}

impl Loader {
    /// Starts `cfg.workers` named threads (`loader-0`, …) over `src` (a folder, a packed
    /// cache whose images must be the configured size, …).
    pub fn start(src: Arc<dyn SampleSource>, cfg: LoaderConfig, probe: Probe) -> std::io::Result<Loader> {
        src.check(&cfg).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let plan = Arc::new(Plan::new(src.len(), &cfg));
        let workers = cfg.workers.max(1);
        let mut l = Loader {
            src,
            production: Arc::new(Production::default()),
            generation: 0,
            total: plan.total_steps,
            per_epoch: plan.steps_per_epoch(),
            plan,
            link: cfg.throttle.map(|t| Arc::new(SlowLink::new(t))),
            cfg: Arc::new(cfg),
            skips: Arc::new(SkipLog::default()),
            probe,
            queues: Vec::new(),
            handles: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
            first: 0,
            next: 0,
        };
        l.spawn(workers)?;
        Ok(l)
    }

    /// Starts `workers` threads producing the plan from step `self.next` on.
    fn spawn(&mut self, workers: usize) -> std::io::Result<()> {
        let per_worker = self.cfg.prefetch.div_ceil(workers).max(1);
        self.stop = Arc::new(AtomicBool::new(false));
        self.first = self.next;
        // `loader-3` for the first generation, `loader-3.2` for the third: threads re-created
        // by `--workers auto` stay apart in the machine section (15 bytes fit any of them).
        let generation = self.generation;
        self.generation += 1;
        for w in 0..workers {
            let (tx, rx) = crossbeam_channel::bounded(per_worker);
            self.queues.push(rx);
            let production = self.production.clone();
            let (src, plan, cfg, stop, skips, probe, link) = (
                self.src.clone(),
                self.plan.clone(),
                self.cfg.clone(),
                self.stop.clone(),
                self.skips.clone(),
                self.probe.clone(),
                self.link.clone(),
            );
            let first = self.first + w as u64;
            let h = std::thread::Builder::new()
                .name(if generation == 0 { format!("loader-{w}") } else { format!("loader-{w}.{generation}") })
                .spawn(move || {
                    worker(first, workers, &*src, &plan, &cfg, &stop, &skips, &probe, link, tx, &production)
                })?;
            self.handles.push(h);
        }
        Ok(())
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.queues.clear();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }

    /// Worker threads now.
    pub fn workers(&self) -> usize {
        self.queues.len()
    }

    /// Changes the number of workers at the current step boundary. Batches already prepared
    /// are dropped and prepared again by the new workers: the plan is deterministic, so the
    /// steps' contents do not change.
    pub fn set_workers(&mut self, workers: usize) -> std::io::Result<()> {
        let workers = workers.max(1);
        if workers == self.workers() {
            return Ok(());
        }
        self.halt();
        self.spawn(workers)
    }

    /// Steps this loader will produce.
    pub fn total_steps(&self) -> u64 {
        self.total
    }

    /// Steps in one full epoch (the last step of an epoch is `k` with `(k + 1) % this == 0`).
    pub fn steps_per_epoch(&self) -> u64 {
        self.per_epoch
    }

    /// The workers' batch-making time so far: (blocked ns, all ns). Blocked = off-CPU and not
    /// waiting for a core (0 where the kernel does not report run-queue wait).
    pub fn production(&self) -> (u64, u64) {
        (self.production.blocked_ns.load(Ordering::Relaxed), self.production.busy_ns.load(Ordering::Relaxed))
    }

    /// Batches ready in the queues now.
    pub fn queued(&self) -> usize {
        self.queues.iter().map(|q| q.len()).sum()
    }

    /// The next batch in step order, blocking; `None` when the plan is done.
    pub fn next_batch(&mut self) -> Option<Batch> {
        if self.next >= self.total || self.queues.is_empty() {
            return None;
        }
        let q = &self.queues[((self.next - self.first) % self.queues.len() as u64) as usize];
        let b = q.recv().ok()?;
        self.next += 1;
        Some(b)
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The calling thread's clocks at one instant: wall, on-CPU, run-queue wait (ns).
fn thread_clocks() -> (u64, u64, u64) {
    (clock::now_ns(), clock::thread_cpu_ns(), clock::thread_queue_ns().unwrap_or(0))
}

#[allow(clippy::too_many_arguments)]
fn worker(
    first: u64,
    workers: usize,
    src: &dyn SampleSource,
    plan: &Plan,
    cfg: &LoaderConfig,
    stop: &AtomicBool,
    skips: &SkipLog,
    probe: &Probe,
    link: Option<Arc<SlowLink>>,
    tx: Sender<Batch>,
    production: &Production,
) {
    let link = link.as_deref();
    let mut scratch = Scratch::default();
    let plane = cfg.height as usize * cfg.width as usize;
    let per_image = plane * cfg.channels;
    let mut order = EpochOrder::default();
    for step in (first..plan.total_steps).step_by(workers) {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        // Read once per batch (≈ 2 µs), not per image: the spans have the per-stage split.
        let t0 = thread_clocks();
        let (epoch, indices) = plan.step(step, &mut order);
        let mut pixels = vec![0f32; indices.len() * per_image];
        let mut labels = Vec::with_capacity(indices.len());
        for &i in indices.iter() {
            let slot = labels.len();
            let out = &mut pixels[slot * per_image..(slot + 1) * per_image];
            let mut ctx = LoadCtx { step, epoch, cfg, link, scratch: &mut scratch };
            match src.load(i, &mut ctx, out) {
                Ok(()) => labels.push(src.label(i as usize)),
                Err(reason) => {
                    let first = skips.seen.lock().map(|mut s| s.insert(i)).unwrap_or(true);
                    if first {
                        probe.send_blocking(Event::Skipped {
                            path: src.name(i as usize).into_boxed_str(),
                            reason: reason.into_boxed_str(),
                        });
                    }
                }
            }
        }
        pixels.truncate(labels.len() * per_image);
        let t1 = thread_clocks();
        let busy = t1.0.saturating_sub(t0.0);
        let on_cpu = t1.1.saturating_sub(t0.1).min(busy);
        let queued = t1.2.saturating_sub(t0.2).min(busy - on_cpu);
        production.busy_ns.fetch_add(busy, Ordering::Relaxed);
        production.blocked_ns.fetch_add(busy - on_cpu - queued, Ordering::Relaxed);
        let batch = Batch { step, epoch, pixels, labels };
        if tx.send(batch).is_err() {
            return;
        }
    }
}

/// Which sample a worker is loading, for spans and augmentation seeds.
#[derive(Clone, Copy)]
struct Where {
    step: u64,
    epoch: u32,
    sample: u32,
}

fn load_one(
    link: Option<&SlowLink>,
    path: &std::path::Path,
    Where { step, epoch, sample }: Where,
    cfg: &LoaderConfig,
    resizer: &mut Resizer,
    aug: Option<&mut Vec<u8>>,
    out: &mut [f32],
) -> Result<(), String> {
    let bytes = {
        let span = info_span!("read", step, sample, bytes = tracing::field::Empty);
        let _g = span.enter();
        let bytes = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
        span.record("bytes", bytes.len() as u64);
        if let Some(link) = link {
            link.read(bytes.len());
        }
        if let Some(s) = extra_for(&cfg.slow, Stage::Read) {
            s.apply();
        }
        bytes
    };
    let px = {
        let _g = info_span!("decode", step, sample).entered();
        if let Some(s) = extra_for(&cfg.slow, Stage::Decode) {
            s.apply();
        }
        decode(&bytes, cfg.channels).map_err(|e| e.to_string())?
    };
    let Some(buf) = aug else {
        let _g = info_span!("resize", step, sample).entered();
        if let Some(s) = extra_for(&cfg.slow, Stage::Resize) {
            s.apply();
        }
        return resizer.resize_into(&px, cfg.width, cfg.height, out).map_err(|e| e.to_string());
    };
    let hwc = {
        let _g = info_span!("resize", step, sample).entered();
        if let Some(s) = extra_for(&cfg.slow, Stage::Resize) {
            s.apply();
        }
        resizer.resize_u8(&px, cfg.width, cfg.height).map_err(|e| e.to_string())?
    };
    // The f32 conversion resize does otherwise happens here, on the augmented pixels.
    let _g = info_span!("augment", step, sample).entered();
    if let Some(s) = extra_for(&cfg.slow, Stage::Augment) {
        s.apply();
    }
    let (w, h, c) = (cfg.width as usize, cfg.height as usize, px.channels);
    buf.resize(hwc.len(), 0);
    let p = augment::sample(&cfg.augment, cfg.seed, epoch, sample);
    augment::apply(hwc, w, h, c, &p, buf);
    hwc_to_chw(buf, c, w * h, out);
    Ok(())
}

impl SampleSource for Dataset {
    fn len(&self) -> usize {
        self.samples.len()
    }
    fn classes(&self) -> &[String] {
        &self.classes
    }
    fn label(&self, i: usize) -> u32 {
        self.samples[i].label
    }
    fn name(&self, i: usize) -> String {
        self.samples[i].path.display().to_string()
    }
    fn load(&self, i: u32, ctx: &mut LoadCtx<'_>, out: &mut [f32]) -> Result<(), String> {
        let at = Where { step: ctx.step, epoch: ctx.epoch, sample: i };
        let Scratch { resizer, augment } = &mut *ctx.scratch;
        let aug = ctx.cfg.augment.is_on().then_some(augment);
        load_one(ctx.link, &self.samples[i as usize].path, at, ctx.cfg, resizer, aug, out)
    }
}
