//! The loader: worker threads read → decode → resize each sample into batches that wait in a
//! bounded prefetch queue. Every stage is a `tracing` span.
//!
//! Worker `w` builds steps `w, w+W, w+2W, …` into its own bounded queue and the training
//! loop takes step `k` from queue `k mod W`: batch order and contents are deterministic for
//! a seed whatever the thread timing, and memory is bounded by the prefetch depth.
//!
//! Samples come through [`SampleSource`]; this file also implements it for the ImageFolder
//! [`Dataset`] (read → decode → resize, each a span).

use super::plan::{EpochOrder, LoaderConfig, Plan};
use super::simulate::SlowLink;
use super::source::{LoadCtx, SampleSource, Scratch};
use super::watch;
use crossbeam_channel::{Receiver, Sender};
use probes::{clock, Event, Probe};
use probes::{Stage, ThreadRole};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long stopping the workers waits for each to end. A worker still inside a read that
/// never returns (a FIFO, a hung network drive) is left behind after it, named: the run's
/// end must not wait on it.
const HALT_WAIT: Duration = Duration::from_millis(1000);

/// How often a training loop waiting for its batch looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(50);

/// One batch, ready for the device: f32 NCHW in [0, 1] and u32 labels.
///
/// Dropping a batch gives its `pixels` buffer back to the loader that made it, for a worker
/// to fill again (a consumer that keeps the pixels takes them out with `std::mem::take`).
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub step: u64,
    pub epoch: u32,
    pub pixels: Vec<f32>,
    pub labels: Vec<u32>,
    home: Home,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.labels.len()
    }
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if let Some(pool) = &self.home.0 {
            pool.put(std::mem::take(&mut self.pixels));
        }
    }
}

/// The pool a batch's pixel buffer returns to. Not part of a batch's value: batches compare
/// equal whatever loader made them.
#[derive(Clone, Default)]
struct Home(Option<Arc<Pool>>);

impl PartialEq for Home {
    fn eq(&self, _: &Home) -> bool {
        true
    }
}

impl std::fmt::Debug for Home {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Home")
    }
}

/// Pixel buffers of dropped batches, for the workers to fill again. A fresh 8.6 MB buffer per
/// batch (32 × 150×150 RGB f32) cost its page faults, and glibc handing the freed memory back
/// to the kernel and zero-filling it again: ≈ 10% of a worker's CPU on small photos. In the
/// steady state (each batch dropped before the next but a few are asked for) the workers
/// allocate nothing.
///
/// A reused buffer still holds an older batch's pixels: every [`SampleSource::load`] writes
/// all of its `out` (in debug builds a reused buffer is filled with NaN first, so that a
/// source that does not shows in the tests).
struct Pool {
    free: Mutex<Vec<Vec<f32>>>,
    /// Most buffers kept; 0 once the loader is gone (its batches' buffers are then freed).
    keep: AtomicUsize,
    /// Buffers the workers had to allocate (none was free).
    allocated: AtomicU64,
}

/// Asks Linux to back the whole 2 MB pages inside a new batch buffer with transparent huge
/// pages where it does so on request (`enabled = madvise`, the common default): one page fault
/// per 2 MB instead of 512. A buffer this large comes zeroed from a fresh mapping that nothing
/// has touched yet (glibc's calloc), so the advice is taken before the first fault. Advice
/// only: nothing changes where it is not taken.
fn huge_pages(v: &[f32]) {
    const HUGE: usize = 2 << 20;
    let start = v.as_ptr() as usize;
    let end = start + std::mem::size_of_val(v);
    let (a, b) = (start.next_multiple_of(HUGE), end / HUGE * HUGE);
    if b > a {
        // SAFETY: [a, b) lies inside v's allocation and is page-aligned; MADV_HUGEPAGE changes
        // no contents (an error, e.g. EINVAL on a kernel without THP, is ignored).
        #[cfg(target_os = "linux")]
        unsafe {
            libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_HUGEPAGE)
        };
    }
}

impl Pool {
    fn new(keep: usize) -> Pool {
        Pool { free: Mutex::default(), keep: AtomicUsize::new(keep), allocated: AtomicU64::new(0) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<f32>>> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A buffer of `len` values: a returned one if there is one, else a new one of zeros.
    fn take(&self, len: usize) -> Vec<f32> {
        let Some(mut v) = self.lock().pop() else {
            self.allocated.fetch_add(1, Ordering::Relaxed);
            let v = vec![0f32; len];
            huge_pages(&v);
            return v;
        };
        // Only the part beyond the old length is written here (a shorter batch's buffer).
        v.resize(len, 0.0);
        if cfg!(debug_assertions) {
            v.fill(f32::NAN);
        }
        v
    }

    fn put(&self, v: Vec<f32>) {
        if v.capacity() == 0 {
            return;
        }
        let mut free = self.lock();
        if free.len() < self.keep.load(Ordering::Relaxed) {
            free.push(v);
        }
    }

    fn close(&self) {
        self.keep.store(0, Ordering::Relaxed);
        self.lock().clear();
    }
}

/// A loader thread that died: which, in which stage, and why. A dead worker ends the run as
/// a failure, never as "the data ran out".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("loader thread {thread} died in stage {stage}: {why}")]
pub struct WorkerFailure {
    pub thread: String,
    pub stage: &'static str,
    pub why: String,
}

thread_local! {
    /// The stage this loader thread is in, for the failure report if it panics.
    static STAGE: std::cell::Cell<&'static str> = const { std::cell::Cell::new("start") };
    /// This worker's slot for the stall watchdog, and the sample it is loading.
    static SLOT: std::cell::RefCell<Option<Arc<watch::Slot>>> = const { std::cell::RefCell::new(None) };
    static SAMPLE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Testing hook (`--panic-in-loader-at-step`): a worker panics while decoding this step.
static PANIC_AT_STEP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

/// Makes a loader worker panic in the decode stage of `step` (proves the failure path).
pub fn inject_panic_at_step(step: Option<u64>) {
    PANIC_AT_STEP.store(step.unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// Whether a panic was injected at `step` ([`inject_panic_at_step`]).
pub(super) fn panic_injected_at(step: u64) -> bool {
    PANIC_AT_STEP.load(Ordering::Relaxed) == step
}

/// The stage this worker thread is in, for a panic's message and the stall watch.
pub(super) fn at(stage: Stage) {
    STAGE.with(|s| s.set(stage.name()));
    SLOT.with_borrow(|slot| {
        if let Some(slot) = slot {
            slot.enter(stage, SAMPLE.get(), clock::now_ns());
        }
    });
}

/// The text of a panic payload.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panicked (no message)".into())
}

/// Files that failed, reported once each however many epochs touch them.
/// And which samples loaded at least once, to name the classes that never did.
struct SkipLog {
    seen: Mutex<HashSet<u32>>,
    ok: Vec<std::sync::atomic::AtomicBool>,
}

impl SkipLog {
    fn new(samples: usize) -> SkipLog {
        SkipLog { seen: Mutex::default(), ok: (0..samples).map(|_| AtomicBool::new(false)).collect() }
    }

    /// Sample `i` loaded.
    fn loaded(&self, i: u32) {
        if let Some(ok) = self.ok.get(i as usize) {
            ok.store(true, Ordering::Relaxed);
        }
    }

    /// Sample `i` failed for `reason`: reported on `probe` the first time only.
    fn failed(&self, i: u32, src: &dyn SampleSource, reason: String, probe: &Probe) {
        let first = self.seen.lock().map(|mut s| s.insert(i)).unwrap_or(true);
        if first {
            probe.send_blocking(Event::Skipped {
                path: src.name(i as usize).into_boxed_str(),
                reason: reason.into_boxed_str(),
            });
        }
    }
}

/// The workers' batch-making time, summed over workers and generations (the send to the
/// queue, which blocks when the queue is full, is left out): what `--workers auto` reads to
/// tell workers waiting on storage from workers waiting for a core.
#[derive(Default)]
struct Production {
    busy_ns: AtomicU64,
    blocked_ns: AtomicU64,
}

impl Production {
    /// A batch made between two [`thread_clocks`] readings: its time, and the part of it
    /// blocked (off-CPU and not waiting for a core).
    fn add(&self, t0: (u64, u64, u64), t1: (u64, u64, u64)) {
        let busy = t1.0.saturating_sub(t0.0);
        let on_cpu = t1.1.saturating_sub(t0.1).min(busy);
        let queued = t1.2.saturating_sub(t0.2).min(busy - on_cpu);
        self.busy_ns.fetch_add(busy, Ordering::Relaxed);
        self.blocked_ns.fetch_add(busy - on_cpu - queued, Ordering::Relaxed);
    }
}

pub struct Loader {
    src: Arc<dyn SampleSource>,
    production: Arc<Production>,
    /// Pixel buffers of dropped batches.
    pool: Arc<Pool>,
    /// Worker generations started so far: each has its own thread names.
    generation: u32,
    plan: Arc<Plan>,
    cfg: Arc<LoaderConfig>,
    skips: Arc<SkipLog>,
    link: Option<Arc<SlowLink>>,
    probe: Probe,
    queues: Vec<Receiver<Batch>>,
    handles: Vec<JoinHandle<Result<(), WorkerFailure>>>,
    /// The first worker that died, once the training loop has run into its closed queue.
    failure: Option<WorkerFailure>,
    stop: Arc<AtomicBool>,
    /// Workers left behind by a halt, stuck or still finishing a batch (their threads end
    /// on their own or with the process).
    abandoned: Vec<String>,
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
        let skips = Arc::new(SkipLog::new(src.len()));
        // Enough for every batch queued, being made and being used at once (more than the
        // steady state needs): never more memory than without the pool.
        let keep = cfg.prefetch.div_ceil(workers).max(1) * workers + workers + 1;
        let mut l = Loader {
            src,
            production: Arc::new(Production::default()),
            pool: Arc::new(Pool::new(keep)),
            generation: 0,
            total: plan.total_steps,
            per_epoch: plan.steps_per_epoch(),
            plan,
            link: cfg.throttle.map(|t| Arc::new(SlowLink::new(t))),
            cfg: Arc::new(cfg),
            skips,
            probe,
            queues: Vec::new(),
            handles: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
            first: 0,
            next: 0,
            failure: None,
            abandoned: Vec::new(),
        };
        l.spawn(workers)?;
        Ok(l)
    }

    /// Starts `workers` threads producing the plan from step `self.next` on.
    fn spawn(&mut self, workers: usize) -> std::io::Result<()> {
        let per_worker = self.cfg.prefetch.div_ceil(workers).max(1);
        self.stop = Arc::new(AtomicBool::new(false));
        self.first = self.next;
        // Worker 3 is `loader-3` in its first generation, `loader-3.2` in its third (its role
        // says which): threads re-created by `--workers auto` stay apart by name, one worker
        // by role.
        let generation = self.generation;
        self.generation += 1;
        for w in 0..workers {
            let (tx, rx) = crossbeam_channel::bounded(per_worker);
            self.queues.push(rx);
            let (production, pool) = (self.production.clone(), self.pool.clone());
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
            let role = ThreadRole::Loader { worker: w as u32, generation };
            let name = role.thread_name();
            let h = std::thread::Builder::new().name(name.clone()).spawn(move || {
                probes::set_thread_role(role);
                let slot = watch::register(&name, src.clone());
                SLOT.with_borrow_mut(|s| *s = Some(slot.clone()));
                // The panic is caught here, with the stage it happened in, so that the run can
                // say which thread died where; the default hook has already printed it.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    worker(first, workers, &*src, &plan, &cfg, &stop, &skips, &probe, link, tx, &production, &pool)
                }));
                watch::retire(&slot);
                r.map_err(|p| WorkerFailure { thread: name, stage: STAGE.with(|s| s.get()), why: panic_message(&*p) })
            })?;
            self.handles.push(h);
        }
        Ok(())
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.queues.clear();
        let deadline = Instant::now() + HALT_WAIT;
        for h in self.handles.drain(..) {
            while !h.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if !h.is_finished() {
                // Left behind: it ends with the process. Named as stuck only when its current
                // stage was open the whole wait (a read that does not return), not when it is
                // busy finishing a slow batch.
                let thread = h.thread().name().unwrap_or("loader").to_string();
                let now = clock::now_ns();
                let stuck = |w: &watch::OpenWork| now.saturating_sub(w.since_ns) >= HALT_WAIT.as_nanos() as u64;
                for w in watch::open_work().into_iter().filter(|w| w.thread == thread && stuck(w)) {
                    self.probe.send_blocking(Event::Stalled {
                        thread: w.thread.into_boxed_str(),
                        stage: w.stage,
                        file: w.file.into_boxed_str(),
                        open_ns: now.saturating_sub(w.since_ns),
                        abandoned: true,
                    });
                }
                self.abandoned.push(thread);
                continue;
            }
            // A worker that died after the loop stopped asking (e.g. while halting for a new
            // worker count) is a failure too; the first one is kept.
            let died = match h.join() {
                Ok(r) => r.err(),
                Err(p) => Some(WorkerFailure { thread: "loader".into(), stage: "unknown", why: panic_message(&*p) }),
            };
            if self.failure.is_none() {
                self.failure = died;
            }
        }
    }

    /// `Err` when a worker died: the batches stopped because of it, not because the plan was
    /// done. Call when [`Loader::next_batch`] returns `None`.
    pub fn check(&mut self) -> Result<(), WorkerFailure> {
        match self.failure.clone() {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }

    /// Classes of which no image loaded although some were tried (every one tried failed),
    /// with how many failed: the model has an output for them that it never trained.
    pub fn classes_never_loaded(&self) -> Vec<(String, usize)> {
        let classes = self.src.classes();
        let mut ok = vec![false; classes.len()];
        let mut failed = vec![0usize; classes.len()];
        for (i, loaded) in self.skips.ok.iter().enumerate() {
            if let (true, Some(o)) = (loaded.load(Ordering::Relaxed), ok.get_mut(self.src.label(i) as usize)) {
                *o = true;
            }
        }
        let seen = self.skips.seen.lock().unwrap_or_else(|e| e.into_inner());
        for &i in seen.iter() {
            if let Some(f) = failed.get_mut(self.src.label(i as usize) as usize) {
                *f += 1;
            }
        }
        classes
            .iter()
            .zip(ok.iter().zip(&failed))
            .filter(|(_, (ok, failed))| !**ok && **failed > 0)
            .map(|(c, (_, failed))| (c.clone(), *failed))
            .collect()
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
        static NEVER: AtomicBool = AtomicBool::new(false);
        self.next_batch_until(&NEVER)
    }

    /// Workers left behind by a halt: still running when its wait (`HALT_WAIT`) ran out.
    pub fn abandoned(&self) -> &[String] {
        &self.abandoned
    }

    /// The next batch in step order, blocking until it comes or `stop` is set (then `None`):
    /// a worker stuck in a read must not keep the training loop from seeing a stop.
    pub fn next_batch_until(&mut self, stop: &AtomicBool) -> Option<Batch> {
        if self.next >= self.total || self.queues.is_empty() {
            return None;
        }
        let i = ((self.next - self.first) % self.queues.len() as u64) as usize;
        let got = loop {
            match self.queues[i].recv_timeout(STOP_POLL) {
                Ok(b) => break Ok(b),
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break Err(()),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) if stop.load(Ordering::Relaxed) => return None,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            }
        };
        match got {
            Ok(b) => {
                self.next += 1;
                Some(b)
            }
            Err(_) => {
                // The worker's queue closed before the plan was done: it died. Stop the others
                // and keep why, for `check`.
                self.halt();
                if self.failure.is_none() {
                    self.failure = Some(WorkerFailure {
                        thread: ThreadRole::loader(i as u32).thread_name(),
                        stage: "unknown",
                        why: "stopped before its work was done".into(),
                    });
                }
                None
            }
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.halt();
        self.pool.close();
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
    pool: &Arc<Pool>,
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
        let mut pixels = pool.take(indices.len() * per_image);
        let mut labels = Vec::with_capacity(indices.len());
        for &i in indices.iter() {
            let slot = labels.len();
            let out = &mut pixels[slot * per_image..(slot + 1) * per_image];
            SAMPLE.set(i);
            at(Stage::Read);
            let mut ctx = LoadCtx { step, epoch, cfg, link, scratch: &mut scratch };
            let loaded = src.load(i, &mut ctx, out);
            SLOT.with_borrow(|slot| {
                if let Some(s) = slot {
                    s.leave();
                }
            });
            match loaded {
                Ok(()) => {
                    skips.loaded(i);
                    labels.push(src.label(i as usize))
                }
                Err(reason) => skips.failed(i, src, reason, probe),
            }
        }
        pixels.truncate(labels.len() * per_image);
        production.add(t0, thread_clocks());
        let batch = Batch { step, epoch, pixels, labels, home: Home(Some(pool.clone())) };
        if tx.send(batch).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Sample `i` is the value `i + 1` in every pixel (0 never occurs); samples whose index is
    /// ≡ 3 (mod 7) fail, so that batches come out short and samples move between slots.
    #[derive(Debug)]
    struct Numbers {
        n: usize,
        classes: Vec<String>,
    }

    impl Numbers {
        fn new(n: usize) -> Arc<Numbers> {
            Arc::new(Numbers { n, classes: vec!["a".into(), "b".into()] })
        }
    }

    impl SampleSource for Numbers {
        fn len(&self) -> usize {
            self.n
        }
        fn classes(&self) -> &[String] {
            &self.classes
        }
        fn label(&self, i: usize) -> u32 {
            i as u32
        }
        fn name(&self, i: usize) -> String {
            format!("n{i}")
        }
        fn load(&self, i: u32, _: &mut LoadCtx<'_>, out: &mut [f32]) -> Result<(), String> {
            if i % 7 == 3 {
                return Err("refused".into());
            }
            out.fill(i as f32 + 1.0);
            Ok(())
        }
    }

    fn numbers_cfg(workers: usize) -> LoaderConfig {
        // 45 samples in batches of 8: the last batch of each epoch is short (5, fewer after
        // failures), then full-sized batches come again in the next epoch.
        LoaderConfig { height: 5, width: 4, batch_size: 8, workers, seed: 3, epochs: 4, ..LoaderConfig::default() }
    }

    fn probe() -> Probe {
        let (probe, rx) = Probe::new(1 << 12);
        std::mem::forget(rx);
        probe
    }

    #[test]
    fn dropped_batches_give_their_pixel_buffers_back_and_the_workers_reuse_them() {
        for workers in [1, 3] {
            let mut l = Loader::start(Numbers::new(45), numbers_cfg(workers), probe()).unwrap();
            let mut steps = 0;
            while let Some(b) = l.next_batch() {
                assert!(!b.is_empty());
                steps += 1;
            }
            // Each worker: its queue, the batch it is making, and the one the consumer holds.
            let most = (2usize.div_ceil(workers) + 1) * workers + 1;
            let allocated = l.pool.allocated.load(Ordering::Relaxed) as usize;
            assert_eq!(steps, 24);
            assert!(allocated <= most, "{workers} workers: {allocated} buffers allocated for {steps} batches");
        }
    }

    #[test]
    fn a_reused_buffer_never_shows_a_previous_batchs_pixels() {
        let per_image = 3 * 5 * 4;
        // Kept: every batch has its own buffer. Dropped: buffers go round the pool.
        let mut kept = Loader::start(Numbers::new(45), numbers_cfg(2), probe()).unwrap();
        let want: Vec<Batch> = std::iter::from_fn(|| kept.next_batch()).collect();
        let mut recycled = Loader::start(Numbers::new(45), numbers_cfg(2), probe()).unwrap();
        let mut got = 0;
        while let Some(b) = recycled.next_batch() {
            assert_eq!(b, want[got], "step {}", b.step);
            assert_eq!(b.pixels.len(), b.len() * per_image, "step {}", b.step);
            for (slot, &label) in b.labels.iter().enumerate() {
                let px = &b.pixels[slot * per_image..(slot + 1) * per_image];
                assert!(px.iter().all(|&v| v == label as f32 + 1.0), "step {} slot {slot}: {px:?}", b.step);
            }
            got += 1;
        }
        assert_eq!(got, want.len());
        assert!(recycled.pool.allocated.load(Ordering::Relaxed) < got as u64);
        // A clone compares equal to its original; dropping both returns nothing twice.
        let c = want[0].clone();
        assert_eq!(c, want[0]);
    }

    #[test]
    fn the_pool_is_bounded_and_freed_with_its_loader() {
        let mut l = Loader::start(Numbers::new(45), numbers_cfg(1), probe()).unwrap();
        let keep = l.pool.keep.load(Ordering::Relaxed);
        let mut held: Vec<Batch> = std::iter::from_fn(|| l.next_batch()).collect();
        let last = held.pop().unwrap();
        drop(held);
        assert_eq!(l.pool.lock().len(), keep, "{keep} kept of the 23 returned");
        let pool = l.pool.clone();
        drop(l);
        assert!(pool.lock().is_empty(), "a finished loader keeps no buffers");
        // A batch that outlives its loader is simply freed.
        drop(last);
        assert!(pool.lock().is_empty());
    }
}
