//! The pipeline capacity model behind every predicted gain.
//!
//! The loader and the training loop run concurrently, joined by the prefetch queue, so in steady
//! state the run goes as fast as its slowest side. Capacities in images/s:
//!
//! ```text
//! loader latency   = workers / L            L = loader wall time per image (read+decode+resize+augment)
//! loader CPU       = K / c                  c = loader on-CPU time per image, K = cores free for this process
//! shared CPU       = K / (c + c_compute)    CPU device only: compute runs on the same cores
//! compute          = B / (m + transfer + compute per step)     m = the main process's serial work per batch
//! in the process   = B / (B·L + m + transfer + compute)         no workers: loading and training take turns
//! throughput       = min of the above, less the workers' start-up each epoch when they do not persist
//! ```
//!
//! `K` = min(cores, this process's CPU + the machine's idle CPU), from the host samples: cores
//! other programs keep busy are not available, and a core's second hyper-thread counts as
//! [`HYPER_THREAD_SHARE`] of a core. `m` is what the training process does per batch beside
//! its compute, serially, however many workers there are: receiving the batch from a worker
//! and the DataLoader's own iteration ([`main_per_batch_ms`](super::estimates::main_per_batch_ms)). Workers that do not persist
//! start again every epoch: each epoch of `E` batches pays their start-up
//! ([`Capacity::throughput`]). A part that is not measured directly is estimated from what
//! is ([`super::estimates`]). A prediction rebuilds the pipeline with one change (more
//! workers, a stage made cheaper, a bigger batch) and reports the ratio of the two
//! throughputs, so the model's constant errors cancel.

use super::thresholds::COLD_READ_SHARE;
use probes::stage::Stage;

/// Assumed per-image read from a local disk after a move off network storage, ms, its open
/// and system calls included (a small file from a local SSD or the page cache: a 17 KB JPEG
/// took 0.13 ms from the page cache, `docs/calibration-notes.md`).
pub const LOCAL_READ_MS: f64 = 0.25;
/// Share of resize time left after pre-resizing offline (a layout conversion remains).
pub const PRE_RESIZED_RESIZE_LEFT: f64 = 0.1;
/// Share of decode time left after pre-resizing offline: decode cost follows the pixel count,
/// which the summary does not know; half is a conservative guess for photos larger than the input.
pub const PRE_RESIZED_DECODE_LEFT: f64 = 0.5;
/// Bytes per second copied out of a memory-mapped packed cache (one memcpy, page-cache warm).
pub const CACHE_BYTES_PER_S: f64 = 2e9;
/// What a core's second hyper-thread adds, as a share of a core, when both run CPU-bound work:
/// SMT adds throughput to a core, not a second core. Assumed, not measured (see
/// `docs/calibration-notes.md`).
pub const HYPER_THREAD_SHARE: f64 = 0.3;

/// One loader stage's cost per image.
#[derive(Debug, Clone, PartialEq)]
pub struct StageCost {
    pub stage: Stage,
    /// Wall time per image, ms.
    pub wall_ms: f64,
    /// On-CPU time per image, ms (≤ wall).
    pub on_cpu_ms: f64,
    /// Time per image runnable but without a core (run-queue wait), ms (≤ wall − on-CPU); 0
    /// when not measured.
    pub core_wait_ms: f64,
    /// Whether the on-CPU share was measured; otherwise it is assumed from the stage's name
    /// (read: off-CPU, the others: on-CPU).
    pub measured: bool,
    /// Whether the run-queue wait was measured, so its off-CPU time splits into waiting for a
    /// core and blocked (otherwise a CPU stage's off-CPU time may be either).
    pub queue_measured: bool,
}

impl StageCost {
    /// The stage no longer runs.
    fn vanish(x: &mut StageCost) {
        x.wall_ms = 0.0;
        x.on_cpu_ms = 0.0;
        x.core_wait_ms = 0.0;
    }

    /// Wall time not spent on a CPU: blocked, or waiting for a core.
    pub fn off_cpu_ms(&self) -> f64 {
        (self.wall_ms - self.on_cpu_ms).max(0.0)
    }

    /// Off-CPU time not waiting for a core: blocked on storage, a lock, a page fault. All the
    /// off-CPU time when the run-queue wait was not measured.
    pub fn blocked_ms(&self) -> f64 {
        (self.off_cpu_ms() - self.core_wait_ms).max(0.0)
    }

    /// The blocked time that is reading files: read's (its off-CPU time, as the
    /// classification counts it), and decode's where its run-queue wait was measured (PIL
    /// reads the rest of a file as it decodes; unmeasured, its off-CPU time may be waiting for
    /// a core). Other stages block on other things (a lock, the GIL).
    pub fn storage_wait_ms(&self) -> f64 {
        match self.stage {
            Stage::Read => self.blocked_ms(),
            Stage::Decode if self.queue_measured => self.blocked_ms(),
            _ => 0.0,
        }
    }
}

/// The pipeline as the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pipeline {
    /// Loader workers (at least one); a tf.data pipeline's parallel calls, one a core.
    pub workers: f64,
    /// The loader runs in the training process itself (PyTorch `num_workers=0`): each batch is
    /// loaded, then trained on, one after the other, never side by side.
    pub in_process: bool,
    /// Cores of the machine (or the process's limit), logical: hyper-threads count one each.
    pub cores: f64,
    /// Physical cores (`/sys/devices/system/cpu/*/topology`), at most `cores`; `cores` when
    /// not read.
    pub physical_cores: f64,
    /// Cores this process can use: its own use plus the machine's idle cores, at most `cores`
    /// (logical; [`Pipeline::cpu_cores`] turns them into cores' worth of CPU).
    pub free_cores: f64,
    /// The training process's serial work per batch beside its compute, ms: receiving the
    /// batch and the DataLoader's own iteration ([`main_per_batch_ms`](super::estimates::main_per_batch_ms)). More workers do not
    /// shorten it.
    pub main_per_batch_ms: f64,
    /// The workers stay between epochs (PyTorch `persistent_workers=True`, where a
    /// `DataLoader` restarts them every epoch unless told; pipeprof's own loader's threads
    /// always stay).
    pub persistent: bool,
    /// Batches per epoch (the data set over the batch), when the data set's size is known.
    pub epoch_batches: Option<f64>,
    /// Steps of the run the model describes: its workers start once in them (the measured
    /// rate counts the first wait); `None` when not known, or where the run's first wait was
    /// not measured (it says nothing of what starting costs).
    pub run_batches: Option<f64>,
    /// Starting one worker process, ms: the run's first wait less its first batch's loading,
    /// per worker, measured where the run had workers; 0 where it had none (not measured).
    pub worker_start_ms: f64,
    /// Training on the CPU: compute and the loader share the cores.
    pub cpu_device: bool,
    pub batch: f64,
    /// Loader stages with at least one span.
    pub loader: Vec<StageCost>,
    /// Host→device per step, ms.
    pub transfer_ms: f64,
    /// Forward + backward + optimizer per step, ms.
    pub compute_ms: f64,
    /// Optimizer step per step, ms, when measured: its cost follows the parameter count, not the
    /// batch size.
    pub optimizer_ms: Option<f64>,
    /// CPU device: compute CPU time per image, ms (from the compute and train threads' CPU use,
    /// else compute wall × free cores). 0 on a GPU.
    pub compute_cpu_ms_per_image: f64,
    /// Bytes of one decoded input image (C×H×W, u8), for the packed cache.
    pub input_bytes: f64,
    /// CPU device: the part of `compute_ms` its threads spent waiting for a core behind other
    /// programs, per step, ms (see [`compute_core_wait`](super::readings::compute_core_wait)): freeing the cores gives it back.
    pub compute_wait_others_ms: f64,
    /// CPU device, loader worker processes beside compute threads that already hold every core
    /// ([`oversubscribed`](super::readings::oversubscribed)): the part of `compute_ms` the loader's CPU beside it cost, ms per
    /// step ([`compute_beside_ms`]); 0 elsewhere. A change to the loader's CPU per image
    /// changes it in proportion ([`Pipeline::compute_step_ms`]).
    pub compute_beside_ms: f64,
    /// The loader's CPU per image `compute_beside_ms` and `compute_cpu_beside_ms` were
    /// measured at, ms.
    pub beside_loader_cpu_ms: f64,
    /// CPU device, pipeprof's own loop fed cold (its step measured longer than the fed step,
    /// [`fed_compute_ms`](super::readings::fed_compute_ms)): the compute's CPU per image beyond
    /// its fed cost (`compute_cpu_ms_per_image`), ms. It was spent beside the loader's CPU
    /// (its threads spin for cores the loader's threads hold, and run cold between waits), and
    /// stays in proportion to the loader's CPU per image
    /// ([`Pipeline::compute_cpu_now_ms`]): a worker more keeps all of it, a pack takes it away.
    pub compute_cpu_beside_ms: f64,
    /// CPU device, other programs holding cores: the compute's slow steps (p95 of the measured
    /// step), ms, when above `compute_ms`. Under contention they are not one-offs: which steps
    /// the scheduler slows is its choice, so a change that leaves compute the limit is
    /// predicted as a range from the typical step to these ([`Pipeline::slow_compute`]).
    pub compute_slow_ms: Option<f64>,
    /// How much more CPU the loader's work took between slow reads than it takes fed, where
    /// the hook measured it ([`crate::aggregate::settings::ColdCpu`]); 1 where not.
    pub cold_cpu: f64,
    /// The program's transform alone per image, fed, on images as the pack stores them, ms,
    /// where the hook measured it ([`crate::aggregate::settings::ColdCpu::packed_ms`]).
    pub packed_transform_ms: Option<f64>,
    /// The training loop waits for data ([`MODERATE_WAIT_SHARE`](super::thresholds::MODERATE_WAIT_SHARE) of its step or more): its
    /// own work runs between the waits, cold too.
    pub loop_waits: bool,
}

/// Cores' worth of CPU in `logical` cores of which `physical` are whole cores: each logical
/// core past the physical ones is a core's second hyper-thread, worth [`HYPER_THREAD_SHARE`].
/// `physical` of 0, or at least `logical`: `logical`. Pure.
pub fn cpu_cores(logical: f64, physical: f64) -> f64 {
    if physical.is_nan() || physical <= 0.0 || physical >= logical {
        return logical;
    }
    physical + (logical - physical) * HYPER_THREAD_SHARE
}

/// Images/s each side of the pipeline can sustain.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Capacity {
    /// workers / loader wall time per image.
    pub loader_latency: f64,
    /// free cores / loader CPU time per image.
    pub loader_cpu: f64,
    /// CPU device: free cores / (loader + compute CPU per image); infinite on a GPU.
    pub shared_cpu: f64,
    /// batch / (transfer + compute) per step.
    pub compute: f64,
    /// A loader in the training process: batch / (loading the batch + transfer + compute), the
    /// two in turn; infinite with workers.
    pub in_process: f64,
    /// Starting the workers, ms: each worker's process ([`Pipeline::worker_start_ms`]), then
    /// its first batch (`first_batch_ms`), paid once a run, or once an epoch when they do not
    /// persist: every `restart_every_images` images (∞: never, a loader in the process).
    pub spawn_ms: f64,
    pub first_batch_ms: f64,
    pub restart_every_images: f64,
}

/// Which term of the model binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    LoaderLatency,
    LoaderCpu,
    SharedCpu,
    Compute,
    InProcess,
}

impl Capacity {
    /// What the loader alone can supply.
    pub fn loader(&self) -> f64 {
        self.loader_latency.min(self.loader_cpu)
    }

    /// The steady state's throughput: the minimum of all capacities.
    pub fn steady(&self) -> f64 {
        self.loader().min(self.shared_cpu).min(self.compute).min(self.in_process)
    }

    /// The model's throughput: the steady state, less the workers' start-up, spread over the
    /// images between two starts. While the workers load their first batches nothing is ready:
    /// the loop waits for the first batch, except the part the workers would have made it wait
    /// anyway (a run as fast as its loader waits for every batch: its first costs no more).
    pub fn throughput(&self) -> f64 {
        let x = self.steady();
        let every = self.restart_every_images;
        if !(every.is_finite() && every > 0.0 && x > 0.0 && x.is_finite()) {
            return x;
        }
        let ahead = (1.0 - x / self.loader()).clamp(0.0, 1.0);
        let start_ms = self.spawn_ms.max(0.0) + self.first_batch_ms.max(0.0) * ahead;
        every / (every / x + start_ms / 1000.0)
    }

    pub fn bound(&self) -> Bound {
        let x = self.steady();
        if x == self.in_process {
            Bound::InProcess
        } else if x == self.compute {
            Bound::Compute
        } else if x == self.loader_latency {
            Bound::LoaderLatency
        } else if x == self.loader_cpu {
            Bound::LoaderCpu
        } else {
            Bound::SharedCpu
        }
    }
}

/// `n` items per `ms` milliseconds, as a rate per second (infinite for free work).
pub fn per_s(n: f64, ms: f64) -> f64 {
    if ms > 0.0 {
        n * 1000.0 / ms
    } else {
        f64::INFINITY
    }
}

/// A step of a loop that makes its own batches (no workers) from samples already in memory:
/// taking the batch and computing it take turns, so a step is their sum, and each part either
/// grows with the batch or does not. All ms per step at today's batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SerialStep {
    /// Fetching and collating the batch's samples: grows with the batch.
    pub loader_per_batch_ms: f64,
    /// The rest of the wait: the DataLoader's own work per step (its iterator, the sampler's
    /// indices, the hand-over), whatever the batch.
    pub loader_fixed_ms: f64,
    /// Measured parts of compute that do not grow with the batch: the optimizer step.
    pub compute_fixed_ms: f64,
    /// The rest of compute (forward, backward, copies): on a GPU, a tiny model's kernels take
    /// the same time for 32 images as for 128 (launch-bound); on the CPU, between fixed and
    /// proportional, which one run cannot tell apart.
    pub compute_rest_ms: f64,
    /// Where compute runs.
    pub cpu_device: bool,
}

impl SerialStep {
    /// From a run's steady-state split and its per-image fetch + collate cost.
    pub fn new(
        wait_ms: f64,
        compute_ms: f64,
        optimizer_ms: Option<f64>,
        loader_ms_per_image: f64,
        batch: f64,
        cpu_device: bool,
    ) -> SerialStep {
        let loader_per_batch_ms = (loader_ms_per_image * batch).clamp(0.0, wait_ms.max(0.0));
        let compute_fixed_ms = optimizer_ms.unwrap_or(0.0).clamp(0.0, compute_ms.max(0.0));
        SerialStep {
            loader_per_batch_ms,
            loader_fixed_ms: (wait_ms - loader_per_batch_ms).max(0.0),
            compute_fixed_ms,
            compute_rest_ms: (compute_ms - compute_fixed_ms).max(0.0),
            cpu_device,
        }
    }

    fn step_ms(&self, k: f64, rest_grows: bool) -> f64 {
        let rest = if rest_grows { self.compute_rest_ms * k } else { self.compute_rest_ms };
        self.loader_fixed_ms + self.compute_fixed_ms + self.loader_per_batch_ms * k + rest
    }

    /// Images/s with the batch `k` times today's, over today's: (low, high). The low end has
    /// the rest of compute grow with the batch; the high end keeps it fixed (on a GPU both).
    pub fn batch_gain(&self, k: f64) -> Option<(f64, f64)> {
        let today = self.step_ms(1.0, false);
        if !(today.is_finite() && today > 0.0 && k > 0.0) {
            return None;
        }
        let high = k * today / self.step_ms(k, false);
        let low = if self.cpu_device { k * today / self.step_ms(k, true) } else { high };
        (low.is_finite() && high.is_finite()).then_some((low, high))
    }

    /// The part of today's step that does not grow with the batch, ms: at least the loader's
    /// fixed part and the optimizer; on a GPU also the rest of compute.
    pub fn fixed_ms(&self) -> f64 {
        self.loader_fixed_ms + self.compute_fixed_ms + if self.cpu_device { 0.0 } else { self.compute_rest_ms }
    }
}

pub(super) fn finite_pos(v: f64) -> Option<f64> {
    (v.is_finite() && v > 0.0).then_some(v)
}

/// What of a compute step one ms of the loader's CPU beside it costs, where compute threads
/// hold every core: a team of compute threads waits at each operation for its slowest member,
/// so a core a worker holds stalls the team for about as long (its other threads spin). Fitted
/// on the corpus's two scripts that train on the CPU with two workers and pack their images
/// (`dcgan`: 1.15, its convolutions parallel; `lightning_module`: 0.6, a tiny model whose step
/// is mostly one thread's Python): `docs/predictions-and-calibration.md`.
pub const BESIDE_STALL: f64 = 0.8;
/// At most this share of a measured compute step is put down to the loader beside it.
pub const BESIDE_MAX_SHARE: f64 = 0.6;

/// CPU device, loader worker processes beside compute threads on every core
/// ([`oversubscribed`](super::readings::oversubscribed)): the part of the measured compute step (`compute_ms`) that was the
/// loader's CPU beside it, ms per step: the loader's CPU per batch (`loader_cpu_ms` × `batch`)
/// in the compute's share of the step, × [`BESIDE_STALL`], at most [`BESIDE_MAX_SHARE`] of
/// the step. 0 without workers, for `tf.data` (its threads are the framework's own), or where
/// the cores are not oversubscribed. Pure.
pub fn compute_beside_ms(
    oversubscribed: bool,
    workers: usize,
    loader_cpu_ms: f64,
    batch: f64,
    compute_share: f64,
    compute_ms: f64,
) -> f64 {
    if !oversubscribed
        || workers == 0
        || ![loader_cpu_ms, batch, compute_share, compute_ms].iter().all(|x| x.is_finite() && *x > 0.0)
    {
        return 0.0;
    }
    (loader_cpu_ms * batch * compute_share.min(1.0) * BESIDE_STALL).min(compute_ms * BESIDE_MAX_SHARE)
}

impl Pipeline {
    /// The compute step at this pipeline's loader, ms: `compute_ms`, with the part the
    /// loader's CPU beside it cost ([`Pipeline::compute_beside_ms`]) in proportion to the
    /// loader's CPU per image now, and none of it with the loader in the training process
    /// (loading and training take turns there).
    pub fn compute_step_ms(&self) -> f64 {
        let beside = self.compute_beside_ms;
        if beside <= 0.0 {
            return self.compute_ms;
        }
        let now = if self.in_process { 0.0 } else { beside * self.loader_cpu_share() };
        (self.compute_ms - beside + now).max(0.0)
    }

    /// The compute's CPU per image at this pipeline's loader: its threads spin while a worker
    /// holds a core, so it follows the step ([`Pipeline::compute_step_ms`]); and the part of
    /// it spent beside the loader's CPU ([`Pipeline::compute_cpu_beside_ms`]) in proportion to
    /// the loader's CPU per image now (none of it with the loader's CPU gone).
    pub fn compute_cpu_now_ms(&self) -> f64 {
        let fed = if self.compute_ms > 0.0 {
            self.compute_cpu_ms_per_image * self.compute_step_ms() / self.compute_ms
        } else {
            self.compute_cpu_ms_per_image
        };
        fed + self.compute_cpu_beside_ms.max(0.0) * self.loader_cpu_share()
    }

    /// The loader's CPU per image now over what it was where the parts beside it were
    /// measured (`beside_loader_cpu_ms`): what those parts are scaled by; 0 where not measured.
    fn loader_cpu_share(&self) -> f64 {
        if self.beside_loader_cpu_ms > 0.0 {
            self.loader_cpu_ms() / self.beside_loader_cpu_ms
        } else {
            0.0
        }
    }

    /// Loader wall time per image, ms.
    pub fn loader_wall_ms(&self) -> f64 {
        self.loader.iter().map(|x| x.wall_ms).sum()
    }

    /// Loader time per image waiting for a core, ms.
    pub fn loader_core_wait_ms(&self) -> f64 {
        self.loader.iter().map(|x| x.core_wait_ms).sum()
    }

    /// Loader on-CPU time per image, ms.
    pub fn loader_cpu_ms(&self) -> f64 {
        self.loader.iter().map(|x| x.on_cpu_ms).sum()
    }

    pub fn stage(&self, stage: Stage) -> Option<&StageCost> {
        self.loader.iter().find(|x| x.stage == stage)
    }

    /// Cores' worth of CPU this process can use: its free cores, hyper-threads counted as
    /// [`HYPER_THREAD_SHARE`] of a core.
    pub fn cpu_cores(&self) -> f64 {
        cpu_cores(self.free_cores, self.physical_cores.min(self.free_cores.max(0.0)))
    }

    /// Batches between two starts of the workers: the run's (`run_batches`), or an epoch's
    /// when they do not persist and an epoch is shorter; `None` for a loader in the process or
    /// where neither is known.
    fn batches_per_start(&self) -> Option<f64> {
        if self.in_process {
            return None;
        }
        let epoch = if self.persistent { None } else { self.epoch_batches };
        match (epoch, self.run_batches) {
            (Some(e), Some(r)) => Some(e.min(r)),
            (e, r) => e.or(r),
        }
        .filter(|b| b.is_finite() && *b > 0.0)
    }

    pub fn capacity(&self) -> Capacity {
        let c = self.loader_cpu_ms();
        let k = self.cpu_cores();
        // With workers, the training process still receives each batch, serially: the loop's
        // side of the pipeline is that and the step, however many workers load.
        let main = if self.in_process { 0.0 } else { self.main_per_batch_ms };
        Capacity {
            loader_latency: per_s(self.workers, self.loader_wall_ms()),
            loader_cpu: per_s(k, c),
            shared_cpu: if self.cpu_device { per_s(k, c + self.compute_cpu_now_ms()) } else { f64::INFINITY },
            compute: per_s(self.batch, main + self.transfer_ms + self.compute_step_ms()),
            in_process: if self.in_process {
                per_s(
                    self.batch,
                    self.batch * self.loader_wall_ms()
                        + self.main_per_batch_ms
                        + self.transfer_ms
                        + self.compute_step_ms(),
                )
            } else {
                f64::INFINITY
            },
            spawn_ms: self.workers * self.worker_start_ms,
            // The workers load their first batches side by side: slower when more than the cores.
            first_batch_ms: self.batch * self.loader_wall_ms() * (self.workers / k.max(0.1)).max(1.0),
            restart_every_images: self.batches_per_start().map_or(f64::INFINITY, |b| b * self.batch),
        }
    }

    /// Predicted throughput of `after` over this one's, when both are finite.
    pub fn speedup(&self, after: &Pipeline) -> Option<f64> {
        let before = finite_pos(self.capacity().throughput())?;
        let after = finite_pos(after.capacity().throughput())?;
        Some(after / before)
    }

    fn map_stage(mut self, stage: Stage, f: impl Fn(&mut StageCost)) -> Pipeline {
        for x in self.loader.iter_mut().filter(|x| x.stage == stage) {
            f(x);
        }
        self
    }

    /// With `n` loader workers. From a loader in the process, the workers persist (the advice
    /// says `persistent_workers=True` with them); otherwise they persist as they did.
    pub fn with_workers(&self, n: usize) -> Pipeline {
        let persistent = self.persistent || self.in_process;
        Pipeline { workers: n.max(1) as f64, in_process: n == 0, persistent, ..self.clone() }
    }

    /// Images stored at the model's input size: resize nearly vanishes, decode shrinks.
    pub fn pre_resized(&self) -> Pipeline {
        let scale = |k: f64| {
            move |x: &mut StageCost| {
                x.wall_ms *= k;
                x.on_cpu_ms *= k;
                x.core_wait_ms *= k;
            }
        };
        self.clone()
            .map_stage(Stage::Resize, scale(PRE_RESIZED_RESIZE_LEFT))
            .map_stage(Stage::Decode, scale(PRE_RESIZED_DECODE_LEFT))
    }

    /// Decoded, resized images packed in one local memory-mapped file: read is a copy, decode
    /// and resize are gone; augment stays.
    pub fn cached(&self) -> Pipeline {
        self.packed(true)
    }

    /// Images packed as they are stored: read is a copy, decode is gone, the program's own
    /// resize stays. The copy is priced at the model's input size: a stored image is larger,
    /// but copying even a 12-megapixel one costs a small fraction of decoding it.
    pub fn packed_as_stored(&self) -> Pipeline {
        self.packed(false)
    }

    /// Read from a packed file ([`Pipeline::cached`], `resized`: at the input size, else
    /// [`Pipeline::packed_as_stored`]), without the waits ([`Pipeline::without_waits`]); the
    /// transform stages left cost what the hook measured of the program's transform on packed
    /// images, where it did ([`Pipeline::packed_transform_ms`]): with no decode between them
    /// they run hotter than the run's figures, measured after a decode, say.
    fn packed(&self, resized: bool) -> Pipeline {
        let copy_ms = self.input_bytes / CACHE_BYTES_PER_S * 1000.0;
        let mut p = self
            .without_waits()
            .map_stage(Stage::Read, |x| {
                x.wall_ms = copy_ms;
                x.on_cpu_ms = copy_ms;
                x.core_wait_ms = 0.0;
            })
            .map_stage(Stage::Decode, StageCost::vanish);
        if resized {
            p = p.map_stage(Stage::Resize, StageCost::vanish);
        }
        if let Some(ms) = self.packed_transform_ms {
            p.set_transform_cpu(ms);
        }
        p
    }

    /// The transform stages' CPU per image set to `ms` in all, shared as they shared it.
    fn set_transform_cpu(&mut self, ms: f64) {
        let is_transform = |s: Stage| matches!(s, Stage::Resize | Stage::Augment | Stage::Convert | Stage::Transform);
        let now: f64 = self.loader.iter().filter(|x| is_transform(x.stage)).map(|x| x.on_cpu_ms).sum();
        if !(now > 0.0 && ms.is_finite() && ms >= 0.0) {
            return;
        }
        for x in self.loader.iter_mut().filter(|x| is_transform(x.stage)) {
            x.on_cpu_ms *= ms / now;
            x.wall_ms = x.on_cpu_ms + x.core_wait_ms;
        }
    }

    /// The loader without its waits for storage: the stages that read files block no more
    /// ([`StageCost::storage_wait_ms`]), and the CPU work done between the waits runs at its
    /// fed cost, its cost measured cold over [`Pipeline::cold_cpu`]: the loader's and, where
    /// the training loop waited for it, the loop's own per batch and, training on the CPU,
    /// its step's (a loop that waits computes cold too: [`hot_compute_ms`](super::readings::hot_compute_ms)). Where the factor
    /// was not measured the cold cost stays, and what is predicted from it is a floor.
    fn without_waits(&self) -> Pipeline {
        let f = self.cold_cpu;
        let mut p = self.clone();
        for x in &mut p.loader {
            let gone = x.storage_wait_ms() + x.on_cpu_ms * (1.0 - 1.0 / f);
            x.on_cpu_ms /= f;
            x.wall_ms = (x.wall_ms - gone).max(x.on_cpu_ms + x.core_wait_ms);
        }
        if p.loop_waits {
            p.main_per_batch_ms /= f;
            if p.cpu_device {
                p.compute_ms /= f;
                p.compute_cpu_ms_per_image /= f;
            }
        }
        p.cold_cpu = 1.0;
        p
    }

    /// Augmentation off the loader (done on the device, or dropped): its per-image cost is gone.
    pub fn without_augment(&self) -> Pipeline {
        self.clone().map_stage(Stage::Augment, StageCost::vanish)
    }

    /// Data on a local disk: a read (its open, its system calls and its wait, and the rest
    /// of the file read lazily while decoding: [`Pipeline::without_waits`]) takes
    /// [`LOCAL_READ_MS`] at most; a wait for a core stays (a local disk frees no core). A network mount's read spends CPU of its own (its round trip through
    /// the kernel): on a FUSE mount 0.39 ms on-CPU of a 17 KB JPEG's read, 0.13 ms in all on
    /// the local disk.
    pub fn local_storage(&self) -> Pipeline {
        let read = self.stage(Stage::Read).map_or(0.0, |r| r.wall_ms);
        self.without_waits().map_stage(Stage::Read, |x| {
            x.wall_ms = read.min(LOCAL_READ_MS).max(x.core_wait_ms);
            x.on_cpu_ms = x.on_cpu_ms.min(x.wall_ms - x.core_wait_ms);
        })
    }

    /// The read's blocked time per image, ms, when it is [`COLD_READ_SHARE`] or more of the
    /// loader's wall time: the CPU work between such reads runs cold (a thread that slept
    /// finds its caches refilled by others: `docs/calibration-notes.md`), by a factor the run
    /// does not show. `None` otherwise.
    pub fn cold_read_wait_ms(&self) -> Option<f64> {
        let wall = self.loader_wall_ms();
        let blocked = self.stage(Stage::Read)?.blocked_ms();
        (wall > 0.0 && blocked / wall >= COLD_READ_SHARE).then_some(blocked)
    }

    /// The other programs stopped: no loader stage waits for a core, and the cores they kept
    /// busy are free.
    pub fn without_contention(&self, other_cores: f64) -> Pipeline {
        let mut p = self.clone();
        for x in &mut p.loader {
            x.wall_ms -= x.core_wait_ms;
            x.core_wait_ms = 0.0;
        }
        p.free_cores = (p.free_cores + other_cores.max(0.0)).min(p.cores);
        p.compute_ms = (p.compute_ms - p.compute_wait_others_ms).max(0.0);
        p.compute_wait_others_ms = 0.0;
        p.compute_slow_ms = None;
        p
    }

    /// The same pipeline with the compute's slow steps ([`Pipeline::compute_slow_ms`]) as its
    /// step; `None` where there are none.
    pub fn slow_compute(&self) -> Option<Pipeline> {
        let slow = self.compute_slow_ms?;
        // The slow steps waited for a core: their CPU is the typical step's.
        Some(Pipeline { compute_ms: slow, compute_slow_ms: None, ..self.clone() })
    }

    /// The per-step fixed cost (the optimizer step) when measured.
    pub fn fixed_step_ms(&self) -> Option<f64> {
        self.optimizer_ms.map(|o| o.clamp(0.0, self.compute_ms))
    }

    /// With batch size `b`: the optimizer step stays, forward + backward and transfer scale
    /// with the batch. `None` when the fixed part is unknown.
    pub fn with_batch(&self, b: usize) -> Option<Pipeline> {
        let fixed = self.fixed_step_ms()?;
        let k = b.max(1) as f64 / self.batch;
        Some(Pipeline {
            optimizer_ms: Some(fixed),
            ..self.with_batch_computing(b, fixed + (self.compute_ms - fixed) * k)
        })
    }

    /// `b` images a step on a GPU whose step is launch-bound (a tiny model): its kernels take
    /// about as long for `b` images as now, so the compute stays; the copy and the loader's
    /// CPU beside the step grow with the batch. Measured on an H200 (2026-11-28): the MNIST
    /// MLP's batch 32 → 128 gave ×3.7–4.1 on pipeprof's own loop, where growing the compute
    /// with the batch predicted ×1.1–1.7.
    pub fn with_batch_launch_bound(&self, b: usize) -> Pipeline {
        self.with_batch_computing(b, self.compute_ms)
    }

    /// With batch size `b` and a step's compute of `compute_ms`: the copy and the loader's CPU
    /// beside the step grow with the batch; the compute's CPU per image and its slow part
    /// follow the compute.
    fn with_batch_computing(&self, b: usize, compute_ms: f64) -> Pipeline {
        let k = b.max(1) as f64 / self.batch;
        let per_image_before = self.compute_ms / self.batch;
        let per_image_after = compute_ms / (self.batch * k);
        let cpu = if per_image_before > 0.0 {
            self.compute_cpu_ms_per_image * per_image_after / per_image_before
        } else {
            self.compute_cpu_ms_per_image
        };
        Pipeline {
            batch: self.batch * k,
            compute_ms,
            transfer_ms: self.transfer_ms * k,
            compute_cpu_ms_per_image: cpu,
            compute_slow_ms: self.compute_slow_ms.map(|x| x * compute_ms / self.compute_ms.max(1e-9)),
            // The loader's CPU per batch beside the step grows with the batch.
            compute_beside_ms: self.compute_beside_ms * k,
            ..self.clone()
        }
    }

    /// Batches sent as u8 instead of f32 (4× fewer bytes; copy time follows bytes).
    pub fn u8_transfer(&self) -> Pipeline {
        Pipeline { transfer_ms: self.transfer_ms / 4.0, ..self.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A simulated loader: `cores` cores (`physical` of them whole), `workers` workers, each
    /// image `loader_ms` of CPU (decode), batch 32, a GPU step of `compute_ms`, and the
    /// training process's serial `main_ms` per batch (receiving it).
    fn sim(cores: f64, physical: f64, workers: usize, loader_ms: f64, compute_ms: f64, main_ms: f64) -> Pipeline {
        Pipeline {
            workers: workers.max(1) as f64,
            in_process: workers == 0,
            cores,
            physical_cores: physical,
            free_cores: cores,
            main_per_batch_ms: main_ms,
            persistent: true,
            epoch_batches: None,
            run_batches: None,
            worker_start_ms: 0.0,
            cpu_device: false,
            batch: 32.0,
            loader: vec![StageCost {
                stage: Stage::Decode,
                wall_ms: loader_ms,
                on_cpu_ms: loader_ms,
                core_wait_ms: 0.0,
                measured: true,
                queue_measured: true,
            }],
            transfer_ms: 0.0,
            compute_ms,
            optimizer_ms: None,
            compute_cpu_ms_per_image: 0.0,
            input_bytes: 3.0 * 150.0 * 150.0,
            compute_wait_others_ms: 0.0,
            compute_beside_ms: 0.0,
            beside_loader_cpu_ms: 0.0,
            compute_cpu_beside_ms: 0.0,
            compute_slow_ms: None,
            cold_cpu: 1.0,
            packed_transform_ms: None,
            loop_waits: false,
        }
    }

    #[test]
    fn the_main_process_serial_cost_caps_the_rate_however_many_workers_on_1_to_32_cores() {
        // 4 ms of decode per image; the loop's step 10 ms; receiving a batch 20 ms. Workers add
        // 250 images/s each up to the cores; the loop's side takes 32 per 30 ms (1067/s) at
        // most, whatever the workers; without the receive it would take 3200/s.
        for cores in [1usize, 2, 4, 8, 16, 32] {
            for workers in [1usize, 2, 4, 8, 16, 32].into_iter().filter(|&w| w <= cores) {
                let p = sim(cores as f64, cores as f64, workers, 4.0, 10.0, 20.0);
                let loader = workers as f64 * 1000.0 / 4.0;
                let want = loader.min(32.0 * 1000.0 / 30.0);
                let got = p.capacity().throughput();
                assert!((got - want).abs() < 1e-6, "{cores} cores, {workers} workers: {got} vs {want}");
                let unreceived = Pipeline { main_per_batch_ms: 0.0, ..p.clone() }.capacity().throughput();
                assert!((unreceived - loader.min(3200.0)).abs() < 1e-6, "{unreceived}");
                let bound = p.capacity().bound();
                assert_eq!(bound == Bound::Compute, loader > 32.0 * 1000.0 / 30.0, "{cores}/{workers}: {bound:?}");
            }
        }
        // The serial cost is the loop's, not the loader's: a loader in the process pays it too,
        // in turn with loading the batch (32 × 4 ms) and the step.
        let in_process = sim(8.0, 8.0, 0, 4.0, 10.0, 20.0).capacity();
        assert!((in_process.throughput() - 32.0 * 1000.0 / (128.0 + 20.0 + 10.0)).abs() < 1e-6);
    }

    #[test]
    fn non_persistent_workers_pay_their_start_up_every_epoch() {
        // 12 workers, 50 ms to start each, 13 batches an epoch (the issue's 42.5 M CNN case),
        // 1 ms of decode per image on 16 cores, a 10 ms step: steady 32 per 10 ms = 3200/s,
        // the loader 12000/s: the first batch (32 ms, loaded by each worker at once) is all
        // waited for, on top of the 600 ms of starting, every 13 × 32 images.
        let persistent =
            Pipeline { epoch_batches: Some(13.0), worker_start_ms: 50.0, ..sim(16.0, 16.0, 12, 1.0, 10.0, 0.0) };
        let steady = persistent.capacity().throughput();
        assert!((steady - 3200.0).abs() < 1e-6, "persistent workers start once, and no run length is known: {steady}");
        let restarting = Pipeline { persistent: false, ..persistent.clone() };
        let ahead = 1.0 - 3200.0 / 12000.0;
        let epoch_s = 13.0 * 32.0 / 3200.0 + (12.0 * 50.0 + 32.0 * ahead) / 1000.0;
        let want = 13.0 * 32.0 / epoch_s;
        let got = restarting.capacity().throughput();
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        assert!(got < 0.25 * steady, "start-up dominates 13-batch epochs: {got}");
        // Longer epochs spread it: 10× the batches, a smaller loss.
        let long = Pipeline { epoch_batches: Some(130.0), ..restarting.clone() }.capacity().throughput();
        assert!(long > got && long < steady, "{long}");
        // A run shorter than an epoch starts its workers once in its own steps.
        let short = Pipeline { run_batches: Some(5.0), ..restarting.clone() }.capacity().throughput();
        let want = 5.0 * 32.0 / (5.0 * 32.0 / 3200.0 + (600.0 + 32.0 * ahead) / 1000.0);
        assert!((short - want).abs() < 1e-6, "{short} vs {want}");
        // Workers advised to a loader in the process persist (the advice says so).
        let from_none = Pipeline { persistent: false, ..sim(16.0, 16.0, 0, 1.0, 10.0, 0.0) }.with_workers(12);
        assert!(from_none.persistent);
        assert!(!restarting.with_workers(16).persistent, "workers that restarted still do");
    }

    #[test]
    fn a_loader_bound_run_loses_only_its_workers_start_not_the_first_batch() {
        // 2 workers at 10 ms per image (200/s) under a 1 ms step: the loop waits for every
        // batch anyway, so the first one costs no more than the others; starting does.
        let p = Pipeline { run_batches: Some(20.0), worker_start_ms: 30.0, ..sim(4.0, 4.0, 2, 10.0, 1.0, 0.0) };
        let want = 20.0 * 32.0 / (20.0 * 32.0 / 200.0 + 60.0 / 1000.0);
        assert!((p.capacity().throughput() - want).abs() < 1e-6, "{}", p.capacity().throughput());
    }

    #[test]
    fn hyper_threads_count_as_less_than_a_core() {
        // A CPU-bound loader (4 ms per image), 16 workers, a fast loop. 16 whole cores: 4000/s;
        // 8 cores with two hyper-threads each: 8 + 8 × HYPER_THREAD_SHARE cores' worth.
        let whole = sim(16.0, 16.0, 16, 4.0, 1.0, 0.0).capacity().throughput();
        assert!((whole - 4000.0).abs() < 1e-6, "{whole}");
        let ht = sim(16.0, 8.0, 16, 4.0, 1.0, 0.0);
        let want = (8.0 + 8.0 * HYPER_THREAD_SHARE) * 1000.0 / 4.0;
        assert!((ht.capacity().throughput() - want).abs() < 1e-6, "{}", ht.capacity().throughput());
        assert_eq!(ht.capacity().bound(), Bound::LoaderCpu);
        // Up to the physical cores, workers scale as on whole cores.
        let eight = sim(16.0, 8.0, 8, 4.0, 1.0, 0.0).capacity().throughput();
        assert!((eight - 2000.0).abs() < 1e-6, "{eight}");
        let table = [
            (2.0, 2.0, 2.0),
            (2.0, 1.0, 1.0 + HYPER_THREAD_SHARE),
            (16.0, 8.0, 10.4),
            (4.0, 0.0, 4.0),
            (4.0, 8.0, 4.0),
        ];
        for (logical, physical, want) in table {
            assert!((cpu_cores(logical, physical) - want).abs() < 1e-9, "{logical}/{physical}");
        }
    }

    fn stage(stage: Stage, wall_ms: f64, on_cpu_ms: f64) -> StageCost {
        StageCost { stage, wall_ms, on_cpu_ms, core_wait_ms: 0.0, measured: true, queue_measured: true }
    }

    /// A PIL loader on a FUSE mount: the open and read blocked 12.6 ms with 0.4 ms of the
    /// kernel's CPU, decode 5 ms of which 4.2 ms is the rest of the file read as it decodes,
    /// the transforms 0.9 ms; no workers, training on the CPU.
    fn on_a_mount() -> Pipeline {
        let mut p = sim(2.0, 2.0, 0, 0.0, 28.0, 8.0);
        p.cpu_device = true;
        p.loop_waits = true;
        p.compute_cpu_ms_per_image = 1.5;
        p.loader = vec![
            stage(Stage::Read, 13.0, 0.4),
            stage(Stage::Decode, 5.0, 0.8),
            stage(Stage::Resize, 0.4, 0.4),
            stage(Stage::Augment, 0.15, 0.15),
            stage(Stage::Convert, 0.35, 0.35),
        ];
        p
    }

    #[test]
    fn a_local_copy_takes_the_waits_of_every_stage_away_and_a_read_costs_the_local_read() {
        let local = on_a_mount().local_storage();
        let wall = |s: Stage| local.stage(s).unwrap().wall_ms;
        // Decode's lazy reads are gone with the read's own; its CPU stays (not measured fed).
        assert!((wall(Stage::Decode) - 0.8).abs() < 1e-9, "{local:#?}");
        // The read: open, system calls and wait, at most the local disk's.
        assert!((wall(Stage::Read) - LOCAL_READ_MS).abs() < 1e-9, "{local:#?}");
        assert!(local.stage(Stage::Read).unwrap().on_cpu_ms <= LOCAL_READ_MS);
        assert_eq!((local.compute_ms, local.main_per_batch_ms), (28.0, 8.0));
        // Blocked time elsewhere is not storage (a lock, the GIL): it stays; so does decode's
        // where its run-queue wait was not measured (it may be waiting for a core).
        let mut other = on_a_mount();
        other.loader[3] = stage(Stage::Augment, 0.5, 0.15);
        other.loader[1].queue_measured = false;
        let l = other.local_storage();
        assert!((l.stage(Stage::Augment).unwrap().wall_ms - 0.5).abs() < 1e-9, "{l:#?}");
        assert!((l.stage(Stage::Decode).unwrap().wall_ms - 5.0).abs() < 1e-9, "{l:#?}");
        // A read already faster than the local disk's stays as it was.
        let mut fast = on_a_mount();
        fast.loader[0] = stage(Stage::Read, 0.1, 0.1);
        assert!((fast.local_storage().stage(Stage::Read).unwrap().wall_ms - 0.1).abs() < 1e-9);
    }

    #[test]
    fn the_fed_factor_divides_the_cpu_work_between_the_reads_and_the_packed_transform_replaces_the_transforms() {
        // (cold factor, CPU device, the loop waits) → decode's CPU, the loop's own per batch,
        // the step: a loop that does not wait was never cold.
        let table = [
            (1.0, true, true, 0.8, 8.0, 28.0),
            (1.6, true, true, 0.5, 5.0, 17.5),
            (1.6, false, true, 0.5, 5.0, 28.0),
            (1.6, true, false, 0.5, 8.0, 28.0),
        ];
        for (f, cpu, waits, decode, main, compute) in table {
            let mut p = on_a_mount();
            p.cold_cpu = f;
            p.cpu_device = cpu;
            p.loop_waits = waits;
            let l = p.local_storage();
            let got = (l.stage(Stage::Decode).unwrap().on_cpu_ms, l.main_per_batch_ms, l.compute_ms);
            let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
            assert!(close(got.0, decode) && close(got.1, main) && close(got.2, compute), "{f} {cpu} {waits}: {got:?}");
            assert_eq!(l.cold_cpu, 1.0, "applied once");
        }
        // Packed at the input size: resize goes, augment and convert share the 0.1 ms measured
        // on packed images as they shared their 0.5 ms.
        let mut p = on_a_mount();
        p.packed_transform_ms = Some(0.1);
        let c = p.cached();
        let cpu = |s: Stage| c.stage(s).unwrap().on_cpu_ms;
        assert_eq!(cpu(Stage::Resize), 0.0);
        assert!((cpu(Stage::Augment) - 0.03).abs() < 1e-9 && (cpu(Stage::Convert) - 0.07).abs() < 1e-9, "{c:#?}");
        // As stored, the program's resize is one of the transform stages that cost it.
        let a = p.packed_as_stored();
        let total: f64 =
            [Stage::Resize, Stage::Augment, Stage::Convert].iter().map(|&s| a.stage(s).unwrap().on_cpu_ms).sum();
        assert!((total - 0.1).abs() < 1e-9, "{a:#?}");
    }

    #[test]
    fn the_loaders_cpu_beside_compute_threads_on_every_core_is_part_of_the_step() {
        // (case, oversubscribed, workers, loader CPU ms/image, compute share, compute ms, part)
        let table = [
            (
                "beside: its CPU per batch in compute's share, × the stall",
                true,
                2,
                1.5,
                0.9,
                100.0,
                1.5 * 32.0 * 0.9 * BESIDE_STALL,
            ),
            ("cores not oversubscribed", false, 2, 1.5, 0.9, 100.0, 0.0),
            ("no workers: the loader takes turns with the step", true, 0, 1.5, 0.9, 100.0, 0.0),
            ("at most a share of the step", true, 2, 10.0, 1.0, 100.0, 100.0 * BESIDE_MAX_SHARE),
            ("nothing measured", true, 2, f64::NAN, 0.9, 100.0, 0.0),
        ];
        for (what, over, workers, loader, share, compute, want) in table {
            let got = compute_beside_ms(over, workers, loader, 32.0, share, compute);
            assert!((got - want).abs() < 1e-9, "{what}: {got} ≠ {want}");
        }
    }

    #[test]
    fn a_lighter_loader_gives_the_compute_back_what_its_cpu_beside_it_cost() {
        // CPU training, 2 workers of 1.5 ms CPU an image beside a 100 ms step, 40 ms of it theirs.
        let mut p = sim(2.0, 2.0, 2, 1.5, 100.0, 0.0);
        p.cpu_device = true;
        p.compute_cpu_ms_per_image = 4.0;
        p.compute_beside_ms = 40.0;
        p.beside_loader_cpu_ms = p.loader_cpu_ms();
        // As measured: the step is the step.
        assert_eq!(p.compute_step_ms(), 100.0);
        // A loader of a third the CPU: a third of their part stays.
        let lighter = p.clone().map_stage(Stage::Decode, |x| {
            x.on_cpu_ms = 0.5;
            x.wall_ms = 0.5;
        });
        assert!((lighter.compute_step_ms() - (60.0 + 40.0 / 3.0)).abs() < 1e-9);
        assert!((lighter.compute_cpu_now_ms() - 4.0 * lighter.compute_step_ms() / 100.0).abs() < 1e-9);
        assert!(lighter.capacity().compute > p.capacity().compute);
        // The loader moved onto the training thread: it no longer runs beside the step.
        assert_eq!(p.with_workers(0).compute_step_ms(), 60.0);
        // Twice the batch: twice the loader's CPU beside each step.
        let big = Pipeline { optimizer_ms: Some(0.0), ..p.clone() }.with_batch(64).unwrap();
        assert!((big.compute_step_ms() - 200.0).abs() < 1e-9 && big.compute_beside_ms == 80.0, "{big:#?}");
        // Without the part, the pack predicts less: the loop's ceiling stays.
        let none = Pipeline { compute_beside_ms: 0.0, ..p.clone() };
        assert!(p.speedup(&p.cached()).unwrap() > none.speedup(&none.cached()).unwrap());
    }

    #[test]
    fn the_computes_cpu_spent_beside_the_loader_stays_with_the_loaders_cpu() {
        // pipeprof's own loop on 2 cores: 1 worker of 9 ms CPU an image, the compute's CPU
        // 3 ms an image measured, 1.2 of it beyond its fed cost.
        let mut p = sim(2.0, 2.0, 1, 9.0, 60.0, 0.0);
        p.cpu_device = true;
        p.compute_cpu_ms_per_image = 1.8;
        p.compute_cpu_beside_ms = 1.2;
        p.beside_loader_cpu_ms = p.loader_cpu_ms();
        let cpu = |q: &Pipeline| q.compute_cpu_now_ms();
        // (case, pipeline, compute CPU per image it predicts)
        let table = [
            ("as measured", p.clone(), 3.0),
            ("a worker more: the loader's CPU stays on the cores, and all of it", p.with_workers(2), 3.0),
            ("packed: the loader's CPU gone, and with it the part beside it", p.cached(), 1.8),
            (
                "a loader of a third the CPU: a third of the part",
                p.clone().map_stage(Stage::Decode, |x| {
                    x.on_cpu_ms = 3.0;
                    x.wall_ms = 3.0;
                }),
                1.8 + 1.2 / 3.0,
            ),
        ];
        for (what, q, want) in table {
            assert!((cpu(&q) - want).abs() < 1e-6, "{what}: {} ≠ {want}", cpu(&q));
        }
        // More workers share the cores with all of it: less than sharing them with the fed cost.
        let fed = Pipeline { compute_cpu_beside_ms: 0.0, ..p.clone() };
        assert!(p.with_workers(2).capacity().shared_cpu < fed.with_workers(2).capacity().shared_cpu);
        assert!((p.with_workers(2).capacity().shared_cpu - 2.0 / (9.0 + 3.0) * 1000.0).abs() < 1e-6);
    }
}
