//! The loader: worker threads read → decode → resize each sample into batches that wait in a
//! bounded prefetch queue. Every stage is a `tracing` span.
//!
//! Worker `w` builds steps `w, w+W, w+2W, …` into its own bounded queue and the training
//! loop takes step `k` from queue `k mod W`: batch order and contents are deterministic for
//! a seed whatever the thread timing, and memory is bounded by the prefetch depth.
//!
//! From a packed cache ([`Source::Packed`]) there is nothing to decode or resize: the `read`
//! span covers the copy out of the memory map, which is also the u8 HWC → f32 CHW conversion
//! (one pass over the bytes); no `decode` or `resize` spans are emitted.

use super::augment;
use super::image::{decode_for, hwc_to_chw, Resizer};
use super::scan::Dataset;
use super::simulate::{extra_for, SlowLink};
use super::source::Source;
use crate::cache::Packed;
use crossbeam_channel::{Receiver, Sender};
use probes::Stage;
use probes::{Event, Probe};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use tracing::info_span;

#[derive(Debug, Clone)]
pub struct LoaderConfig {
    pub height: u32,
    pub width: u32,
    pub channels: usize,
    pub batch_size: usize,
    pub workers: usize,
    /// Batches waiting in the queue, over all workers.
    pub prefetch: usize,
    pub shuffle: bool,
    pub seed: u64,
    pub epochs: usize,
    /// Stop after this many steps (over all epochs).
    pub max_steps: Option<u64>,
    /// Simulated slow storage (--throttle-read).
    pub throttle: Option<super::simulate::Throttle>,
    /// Simulated extra work per stage (--slow).
    pub slow: Vec<super::simulate::Slow>,
    /// Random augmentations (off by default; never on for validation).
    pub augment: crate::config::Augment,
}

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

/// Which samples (dataset indices) make up each step: deterministic for a seed. Orders are
/// computed per epoch on demand, so memory does not grow with the number of epochs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub n: usize,
    pub batch_size: usize,
    pub shuffle: bool,
    pub seed: u64,
    pub total_steps: u64,
}

/// One epoch's sample order, cached by whoever walks the plan.
#[derive(Debug, Default)]
pub struct EpochOrder {
    epoch: Option<u32>,
    order: Vec<u32>,
}

impl Plan {
    pub fn new(n: usize, cfg: &LoaderConfig) -> Plan {
        let batch_size = cfg.batch_size.max(1);
        let per_epoch = n.div_ceil(batch_size) as u64;
        // --steps wins over epochs: the run goes over the data as often as the budget needs.
        let total_steps = match cfg.max_steps {
            Some(s) if per_epoch > 0 => s,
            _ => per_epoch * cfg.epochs as u64,
        };
        Plan { n, batch_size, shuffle: cfg.shuffle, seed: cfg.seed, total_steps }
    }

    pub fn steps_per_epoch(&self) -> u64 {
        self.n.div_ceil(self.batch_size) as u64
    }

    /// The epoch of `step` and its sample indices (the last batch of an epoch may be short).
    pub fn step<'a>(&self, step: u64, cache: &'a mut EpochOrder) -> (u32, &'a [u32]) {
        let spe = self.steps_per_epoch().max(1);
        let epoch = (step / spe) as u32;
        if cache.epoch != Some(epoch) {
            cache.order.clear();
            cache.order.extend(0..self.n as u32);
            if self.shuffle {
                shuffle(&mut cache.order, self.seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            }
            cache.epoch = Some(epoch);
        }
        let start = ((step % spe) as usize) * self.batch_size;
        let end = (start + self.batch_size).min(self.n);
        (epoch, &cache.order[start..end])
    }

    /// Every step's (epoch, samples): for tests and small plans.
    pub fn all(&self) -> Vec<(u32, Vec<u32>)> {
        let mut cache = EpochOrder::default();
        (0..self.total_steps)
            .map(|k| {
                let (e, s) = self.step(k, &mut cache);
                (e, s.to_vec())
            })
            .collect()
    }
}

/// SplitMix64: tiny, deterministic across platforms and crate versions.
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Fisher–Yates with SplitMix64.
pub fn shuffle<T>(xs: &mut [T], seed: u64) {
    let mut rng = SplitMix::new(seed);
    for i in (1..xs.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        xs.swap(i, j);
    }
}

/// Files that failed, reported once each however many epochs touch them.
#[derive(Default)]
struct SkipLog {
    seen: Mutex<HashSet<u32>>,
}

pub struct Loader {
    src: Arc<Source>,
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
    /// Starts `cfg.workers` named threads (`loader-0`, …) over `ds`.
    pub fn start(ds: Arc<Dataset>, cfg: LoaderConfig, probe: Probe) -> std::io::Result<Loader> {
        Self::start_source(Source::Folder(ds), cfg, probe)
    }

    /// Starts the workers over a folder or a packed cache (whose images must be the
    /// configured size).
    pub fn start_source(src: Source, cfg: LoaderConfig, probe: Probe) -> std::io::Result<Loader> {
        if let Source::Packed(p) = &src {
            let want = (cfg.height, cfg.width, cfg.channels as u32);
            if p.shape() != want {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{} holds {:?} (H, W, C) images, the loader wants {want:?}", p.path().display(), p.shape()),
                ));
            }
        }
        let plan = Arc::new(Plan::new(src.len(), &cfg));
        let workers = cfg.workers.max(1);
        let mut l = Loader {
            src: Arc::new(src),
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
        for w in 0..workers {
            let (tx, rx) = crossbeam_channel::bounded(per_worker);
            self.queues.push(rx);
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
                .name(format!("loader-{w}"))
                .spawn(move || worker(first, workers, &src, &plan, &cfg, &stop, &skips, &probe, link, tx))?;
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

#[allow(clippy::too_many_arguments)]
fn worker(
    first: u64,
    workers: usize,
    src: &Source,
    plan: &Plan,
    cfg: &LoaderConfig,
    stop: &AtomicBool,
    skips: &SkipLog,
    probe: &Probe,
    link: Option<Arc<SlowLink>>,
    tx: Sender<Batch>,
) {
    let link = link.as_deref();
    let mut resizer = Resizer::new();
    let mut aug = cfg.augment.is_on().then(Vec::<u8>::new);
    let plane = cfg.height as usize * cfg.width as usize;
    let per_image = plane * cfg.channels;
    let mut order = EpochOrder::default();
    for step in (first..plan.total_steps).step_by(workers) {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let (epoch, indices) = plan.step(step, &mut order);
        let mut pixels = vec![0f32; indices.len() * per_image];
        let mut labels = Vec::with_capacity(indices.len());
        for &i in indices.iter() {
            let slot = labels.len();
            let out = &mut pixels[slot * per_image..(slot + 1) * per_image];
            let at = Where { step, epoch, sample: i };
            let loaded = match src {
                Source::Folder(ds) => {
                    load_one(link, &ds.samples[i as usize].path, at, cfg, &mut resizer, aug.as_mut(), out)
                }
                // A cache with augmentation is refused before the loader starts.
                Source::Packed(p) => load_packed(p, link, step, i, cfg, out),
            };
            match loaded {
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
        decode_for(&bytes, cfg.channels, cfg.width, cfg.height).map_err(|e| e.to_string())?
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

/// One cached image: a slice of the mapped file converted straight into the batch. Cannot
/// fail: the cache was verified when it was opened.
fn load_packed(
    p: &Packed,
    link: Option<&SlowLink>,
    step: u64,
    sample: u32,
    cfg: &LoaderConfig,
    out: &mut [f32],
) -> Result<(), String> {
    let px = p.pixels(sample as usize);
    let span = info_span!("read", step, sample, bytes = tracing::field::Empty);
    let _g = span.enter();
    span.record("bytes", px.len() as u64);
    if let Some(link) = link {
        link.read(px.len());
    }
    if let Some(s) = extra_for(&cfg.slow, Stage::Read) {
        s.apply();
    }
    hwc_to_chw(px, cfg.channels, cfg.height as usize * cfg.width as usize, out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(batch: usize, epochs: usize, steps: Option<u64>, shuffle: bool) -> LoaderConfig {
        LoaderConfig {
            height: 8,
            width: 8,
            channels: 3,
            batch_size: batch,
            workers: 2,
            prefetch: 2,
            shuffle,
            seed: 7,
            epochs,
            max_steps: steps,
            throttle: None,
            slow: Vec::new(),
            augment: Default::default(),
        }
    }

    #[test]
    fn plan_covers_every_sample_once_per_epoch_keeping_the_last_partial_batch() {
        let p = Plan::new(10, &cfg(4, 2, None, true)).all();
        assert_eq!(p.len(), 6);
        assert_eq!(p[2].1.len(), 2);
        for e in 0..2 {
            let mut all: Vec<u32> = p.iter().filter(|s| s.0 == e).flat_map(|s| s.1.clone()).collect();
            all.sort();
            assert_eq!(all, (0..10).collect::<Vec<_>>());
        }
        assert_ne!(p[0].1, p[3].1, "each epoch has its own order");
    }

    #[test]
    fn plan_is_deterministic_per_seed_and_steps_override_epochs() {
        let a = Plan::new(50, &cfg(8, 1, None, true)).all();
        assert_eq!(a, Plan::new(50, &cfg(8, 1, None, true)).all());
        let mut other = cfg(8, 1, None, true);
        other.seed = 8;
        assert_ne!(a, Plan::new(50, &other).all());
        let s = Plan::new(10, &cfg(4, 1, Some(7), false)).all();
        assert_eq!(s.len(), 7);
        assert_eq!(s[3], (1, vec![0, 1, 2, 3]));
    }

    #[test]
    fn shuffle_is_a_permutation() {
        let mut v: Vec<u32> = (0..100).collect();
        shuffle(&mut v, 1);
        assert_ne!(v, (0..100).collect::<Vec<_>>());
        v.sort();
        assert_eq!(v, (0..100).collect::<Vec<_>>());
    }
}
