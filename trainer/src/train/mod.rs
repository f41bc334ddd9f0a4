//! The training loop: wait for a batch, transfer it, compute. Each phase is a span.

pub mod auto;
pub mod gpu_events;
pub mod kernels;
pub mod layerwise;
pub mod model;
pub mod optim;
/// Shape inference is pure (no tensor), so it lives with the schema in pipeprof-core.
pub use crate::config::shapes;
pub mod staging;
pub mod transfer;

use crate::config::ModelConfig;
use crate::data::{Dataset, Loader, LoaderConfig};
use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use model::Cnn;
use optim::Opt;
use probes::{clock, Event, LayerRecord, Probe, SpanRecord, Stage, StepRecord, NONE};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tracing::info_span;

/// `--device cpu | cuda | cuda:N`.
pub fn parse_device(s: &str) -> anyhow::Result<Device> {
    let s = s.trim();
    if s == "cpu" {
        return Ok(Device::Cpu);
    }
    let ordinal = match s.strip_prefix("cuda") {
        Some("") => 0,
        Some(rest) => rest
            .strip_prefix(':')
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| anyhow::anyhow!("bad --device {s:?}: use cpu, cuda or cuda:N"))?,
        None => anyhow::bail!("bad --device {s:?}: use cpu, cuda or cuda:N"),
    };
    cuda_device(ordinal)
}

#[cfg(feature = "cuda")]
fn cuda_device(ordinal: usize) -> anyhow::Result<Device> {
    Device::new_cuda(ordinal).map_err(|e| anyhow::anyhow!("cannot open cuda:{ordinal}: {e}"))
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(ordinal: usize) -> anyhow::Result<Device> {
    anyhow::bail!(
        "--device cuda:{ordinal}: this pipeprof was built without CUDA support; \
         rebuild with `cargo build --release --features cuda` on a machine with the CUDA toolkit"
    )
}

/// Keeps memory that candle frees in the process's heap for its next tensors. candle allocates
/// every result afresh, and glibc serves each allocation over its mmap threshold (128 KiB to
/// 32 MiB) with its own mmap and hands it back with munmap when freed: every step of a large
/// model then faults its activations and gradients in again, page by page, and the kernel zeroes
/// them. Measured on the large CNN (batch 8, 2 threads): 18 of 41 CPU-seconds in the kernel
/// before, 2.2 after. The cost: the heap keeps its peak size until the process exits. Only
/// for a CPU device, the only one whose tensors live in this heap; glibc only (other C
/// libraries' allocators have other rules). Call it before the process starts threads (the
/// profile command does; `train` calls it again, harmlessly).
pub fn keep_freed_memory(dev: &Device) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if dev.is_cpu() {
        // SAFETY: mallopt only changes allocator settings; it is safe to call at any time.
        unsafe {
            libc::mallopt(libc::M_MMAP_MAX, 0);
            // One arena: a thread's own arena lives in 64 MB heaps that glibc unmaps when they
            // empty, so the training thread faulted its tensors in again anyway (profile of
            // the large CNN, batch 32: 8.3 of 17 CPU-seconds in the kernel, 0.7 with one arena).
            libc::mallopt(libc::M_ARENA_MAX, 1);
            // -1: never trim (mallopt(3)).
            libc::mallopt(libc::M_TRIM_THRESHOLD, -1);
            libc::mallopt(libc::M_TOP_PAD, 256 << 20);
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = dev;
}

/// Where the loop waits for the device. CUDA returns from a kernel launch at once, so without a
/// wait a span measures only the launches and the next span absorbs the device time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuSync {
    /// At the end of transfer, forward, backward and optimizer: each span is device time.
    Phase,
    /// Only where the step reads its loss back: compute is right as a whole, its parts are not,
    /// and the CPU may queue the next phase's kernels while the device works (the cost of
    /// `Phase` is the difference between the two).
    Step,
    /// On CUDA, transfer, forward, backward and optimizer timed by events recorded on the
    /// stream and read once the step's loss is back (`gpu_events`): `Step`'s synchronisations
    /// only, each phase still device time. Steps timed layer by layer synchronise as `Phase`
    /// does. On a CPU device the same as `Phase` (the work is done when a phase returns).
    Events,
}

impl GpuSync {
    /// `PIPEPROF_GPU_SYNC=phase|step` (default phase); an environment variable so that a
    /// measurement of its cost needs no new command-line flag.
    pub fn from_env() -> anyhow::Result<GpuSync> {
        match std::env::var("PIPEPROF_GPU_SYNC") {
            Err(std::env::VarError::NotPresent) => Ok(GpuSync::Phase),
            Ok(v) => GpuSync::parse(&v),
            Err(e) => anyhow::bail!("PIPEPROF_GPU_SYNC: {e}; use phase, step or events"),
        }
    }

    fn parse(s: &str) -> anyhow::Result<GpuSync> {
        match s.trim() {
            "" | "phase" => Ok(GpuSync::Phase),
            "step" => Ok(GpuSync::Step),
            "events" => Ok(GpuSync::Events),
            other => anyhow::bail!("PIPEPROF_GPU_SYNC={other:?}: use phase, step or events"),
        }
    }
}

/// Ends a phase: on CUDA with [`GpuSync::Phase`], waits until the device has run everything
/// queued so far. On the CPU backend the work is already done and this costs one comparison.
fn phase_done(dev: &Device, sync: GpuSync) -> candle_core::Result<()> {
    if sync == GpuSync::Phase && dev.is_cuda() {
        dev.synchronize()?;
    }
    Ok(())
}

/// How a batch's pixels reach the device (`PIPEPROF_PINNED`; environment settings so that the
/// GPU check can measure each without a new flag; pageable is the default):
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UploadMode {
    /// `0`: `Tensor::from_vec`, which copies from pageable memory (the driver stages it through
    /// a pinned buffer of its own).
    Pageable,
    /// `1`: through a page-locked buffer of ours from a pool, reused while batches keep their
    /// size.
    Pinned,
    /// `u8`: as `Pinned`, the pixels packed to bytes (a quarter of the bytes over the link)
    /// and made f32 on the device, bit for bit the same values (`transfer`); a batch whose
    /// values are not all bytes' goes as f32.
    PinnedU8,
}

/// Uploads batches as its [`UploadMode`] says. Only CUDA has page-locked host memory; on other
/// devices every mode is pageable.
struct Upload {
    #[cfg(feature = "cuda")]
    mode: UploadMode,
    #[cfg(feature = "cuda")]
    staging: Option<pinned::Staging>,
}

impl Upload {
    fn new(dev: &Device) -> anyhow::Result<Upload> {
        let mode = Upload::parse_mode(std::env::var("PIPEPROF_PINNED"))?;
        #[cfg(not(feature = "cuda"))]
        let _ = (mode, dev);
        Ok(Upload {
            #[cfg(feature = "cuda")]
            mode,
            #[cfg(feature = "cuda")]
            staging: match dev {
                Device::Cuda(cuda) if mode != UploadMode::Pageable => Some(pinned::Staging::new(cuda)),
                _ => None,
            },
        })
    }

    fn parse_mode(v: Result<String, std::env::VarError>) -> anyhow::Result<UploadMode> {
        match v {
            Err(std::env::VarError::NotPresent) => Ok(UploadMode::Pageable),
            Ok(v) => match v.trim() {
                "" | "0" => Ok(UploadMode::Pageable),
                "1" => Ok(UploadMode::Pinned),
                "u8" => Ok(UploadMode::PinnedU8),
                _ => anyhow::bail!("PIPEPROF_PINNED={v:?}: use 1 (pinned), u8 (pinned bytes) or 0 (pageable)"),
            },
            Err(e) => anyhow::bail!("PIPEPROF_PINNED: {e}; use 1, u8 or 0"),
        }
    }

    /// The batch's pixels as a tensor on `dev` (see [`pageable`]; pinned: copied through a
    /// staging buffer, `pixels` left to go back to the loader's pool).
    fn pixels(
        &mut self,
        pixels: &mut Vec<f32>,
        shape: (usize, usize, usize, usize),
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        #[cfg(feature = "cuda")]
        if let (Some(staging), Device::Cuda(cuda)) = (self.staging.as_mut(), dev) {
            if self.mode == UploadMode::PinnedU8 {
                if let Some(xs) = staging.upload_u8(cuda, &pixels[..], shape)? {
                    return Ok(xs);
                }
            }
            if let Some(xs) = staging.upload_f32(cuda, &pixels[..], shape)? {
                return Ok(xs);
            }
        }
        pageable(pixels, shape, dev)
    }
}

/// A batch's pixels as a tensor on `dev` from pageable memory: on the CPU the buffer becomes the
/// tensor's (moved out of `pixels`); on a GPU it is copied from, and stays in `pixels` to go
/// back to the loader's pool with the batch.
fn pageable(pixels: &mut Vec<f32>, shape: (usize, usize, usize, usize), dev: &Device) -> candle_core::Result<Tensor> {
    if dev.is_cpu() {
        return Tensor::from_vec(std::mem::take(pixels), shape, dev);
    }
    Tensor::from_slice(&pixels[..], shape, dev)
}

/// Page-locked uploads (public for `cargo bench --bench cuda_step`).
#[cfg(feature = "cuda")]
pub mod pinned {
    use super::staging::{pinned::PinnedAlloc, StagingPool};
    use super::transfer;
    use candle_core::cuda::cudarc::driver::{DeviceRepr, PinnedHostSlice};
    use candle_core::cuda::{CudaDType, CudaDevice, CudaStorage, WrapErr};
    use candle_core::op::BackpropOp;
    use candle_core::{Shape, Storage, Tensor};
    use std::marker::PhantomData;

    /// Page-locked memory held for staging, per element type: many batches' worth (one is
    /// lent at a time today); a batch larger than this goes from pageable memory.
    const CAP_BYTES: usize = 512 << 20;

    /// Pools of page-locked buffers (allocating one costs milliseconds: not per batch).
    pub struct Staging {
        floats: StagingPool<PinnedAlloc<f32>>,
        bytes: StagingPool<PinnedAlloc<u8>>,
    }

    impl Staging {
        pub fn new(dev: &CudaDevice) -> Staging {
            let ctx = dev.cuda_stream().context().clone();
            Staging {
                floats: StagingPool::new(PinnedAlloc { ctx: ctx.clone(), elem: PhantomData }, CAP_BYTES),
                bytes: StagingPool::new(PinnedAlloc { ctx, elem: PhantomData }, CAP_BYTES),
            }
        }

        /// `data` copied into a pinned buffer, then to a new device buffer of `shape`. None:
        /// no pinned buffer could be had (the caller copies from pageable memory).
        pub fn upload_f32(
            &mut self,
            dev: &CudaDevice,
            data: &[f32],
            shape: impl Into<Shape>,
        ) -> candle_core::Result<Option<Tensor>> {
            let Ok(mut lease) = self.floats.take(data.len()) else { return Ok(None) };
            // Waits for the previous copy out of this buffer to finish before overwriting it.
            lease.as_mut_slice().w()?.copy_from_slice(data);
            send(dev, &*lease, shape).map(Some)
        }

        /// `data` packed to bytes in a pinned buffer, copied, and made f32 on the device. None:
        /// some value is not a byte's, or no pinned buffer could be had.
        pub fn upload_u8(
            &mut self,
            dev: &CudaDevice,
            data: &[f32],
            shape: impl Into<Shape>,
        ) -> candle_core::Result<Option<Tensor>> {
            let Ok(mut lease) = self.bytes.take(data.len()) else { return Ok(None) };
            if !transfer::pack_u8(data, lease.as_mut_slice().w()?) {
                return Ok(None);
            }
            let xs = send(dev, &*lease, shape)?;
            transfer::to_f32(&xs).map(Some)
        }
    }

    /// A new device tensor of `shape` with a copy of `host`, queued on candle's stream. The
    /// lease may go back to its pool at once: the buffer's own event makes the next write
    /// into it wait for this copy.
    fn send<T: CudaDType + DeviceRepr>(
        dev: &CudaDevice,
        host: &PinnedHostSlice<T>,
        shape: impl Into<Shape>,
    ) -> candle_core::Result<Tensor> {
        let stream = dev.cuda_stream();
        // SAFETY: the copy below overwrites every element.
        let mut dst = unsafe { stream.alloc::<T>(host.len()) }.w()?;
        stream.memcpy_htod(host, &mut dst).w()?;
        let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(dst, dev.clone()));
        Ok(Tensor::from_storage(storage, shape, BackpropOp::none(), false))
    }
}

/// Phase times from device events ([`GpuSync::Events`] on CUDA), sent as the training thread's
/// spans once the device has passed them; elsewhere it times nothing and the host spans do.
struct DeviceTimer {
    ring: Option<gpu_events::PhaseEvents<DeviceEvents>>,
}

#[cfg(feature = "cuda")]
type DeviceEvents = gpu_events::cuda::StreamEvents;
#[cfg(not(feature = "cuda"))]
type DeviceEvents = gpu_events::NoEvents;

/// Phases held at most: a few steps' (a step has four, and is read back within the step).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
const EVENT_RING: usize = 64;

impl DeviceTimer {
    fn new(dev: &Device, sync: GpuSync) -> DeviceTimer {
        #[cfg(feature = "cuda")]
        if let (Device::Cuda(cuda), GpuSync::Events) = (dev, sync) {
            let events = gpu_events::cuda::StreamEvents { stream: cuda.cuda_stream() };
            return DeviceTimer { ring: Some(gpu_events::PhaseEvents::new(events, EVENT_RING)) };
        }
        let _ = (dev, sync);
        DeviceTimer { ring: None }
    }

    /// Whether phases are timed on the device (their host spans are then not opened).
    fn on(&self) -> bool {
        self.ring.is_some()
    }

    fn begin(&mut self, stage: Stage, step: u64, bytes: u64) -> anyhow::Result<()> {
        if let Some(r) = self.ring.as_mut() {
            r.begin(stage, step, clock::now_ns(), bytes)?;
        }
        Ok(())
    }

    fn end(&mut self, stage: Stage, step: u64) -> anyhow::Result<()> {
        if let Some(r) = self.ring.as_mut() {
            r.end(stage, step)?;
        }
        Ok(())
    }

    /// Sends the phases the device has finished (never waits); with `all`, waits for the rest:
    /// the end of the run.
    fn send(&mut self, probe: &Probe, all: bool) -> anyhow::Result<()> {
        if let Some(r) = self.ring.as_mut() {
            let done = if all { r.flush()? } else { r.poll()? };
            for p in done {
                send_phase(probe, p);
            }
        }
        Ok(())
    }
}

/// A device-timed phase as a span of the calling thread (no CPU reading: it is device time).
fn send_phase(probe: &Probe, p: gpu_events::PhaseTime) {
    probes::layer::record(
        probe,
        SpanRecord {
            stage: p.stage,
            thread: 0,
            start_ns: p.start_ns,
            dur_ns: p.dur_ns,
            cpu_ns: NONE,
            queue_ns: NONE,
            step: p.step,
            sample: NONE,
            bytes: p.bytes,
        },
    );
}

/// The span `make` opens, or none when the phase is timed on the device.
fn host_span(device_timed: bool, make: impl FnOnce() -> tracing::Span) -> tracing::span::EnteredSpan {
    if device_timed {
        tracing::Span::none().entered()
    } else {
        make().entered()
    }
}

/// Bytes a batch moves to the device: f32 pixels and u32 labels.
fn batch_bytes(pixels: usize, labels: usize) -> u64 {
    (pixels * std::mem::size_of::<f32>() + labels * std::mem::size_of::<u32>()) as u64
}

/// Testing and simulation hooks of the loop.
#[derive(Debug, Clone, Default)]
pub struct Hooks {
    /// Panic at this step (proves the exit paths).
    pub panic_at_step: Option<u64>,
    /// Simulated extra time in transfer or compute (--slow).
    pub slow: Vec<crate::data::simulate::Slow>,
    /// `--workers auto`: the measured choice of loader workers.
    pub auto_workers: Option<auto::AutoWorkers>,
}

/// The held-out set and how to load it (shuffle off, one epoch, no augmentation).
#[derive(Debug, Clone)]
pub struct Validation {
    pub ds: Arc<Dataset>,
    pub loader: LoaderConfig,
}

/// Re-initialises every parameter from `seed` (candle's CPU generator cannot be seeded), so a
/// run is reproducible for a seed: weights ~ N(0, 2/fan_in) (Kaiming), biases ~ U(±1/√fan_in),
/// each variable from its own stream keyed by its name.
pub fn seed_weights(vm: &VarMap, seed: u64, dev: &Device) -> candle_core::Result<()> {
    use crate::data::rng::SplitMix;
    let data = vm.data().lock().map_err(|_| candle_core::Error::msg("the parameter map lock is poisoned"))?;
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    // Fan-in of a layer = its weight's elements per output unit.
    let fan_in = |prefix: &str| {
        data.get(&format!("{prefix}.weight")).map(|w| w.elem_count() / w.dims().first().copied().unwrap_or(1).max(1))
    };
    for name in names {
        let Some(var) = data.get(name) else { continue };
        let prefix = name.rsplit_once('.').map(|(p, _)| p).unwrap_or(name);
        let fan = fan_in(prefix).unwrap_or(1).max(1) as f64;
        let key = name.bytes().fold(seed ^ 0xA076_1D64_78BD_642F, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01B3));
        let mut rng = SplitMix::new(key);
        let n = var.elem_count();
        let values: Vec<f32> = if name.ends_with(".bias") {
            let bound = 1.0 / fan.sqrt();
            (0..n).map(|_| ((rng.unit() * 2.0 - 1.0) * bound) as f32).collect()
        } else {
            let std = (2.0 / fan).sqrt();
            (0..n)
                .map(|_| {
                    // Box–Muller.
                    let (u1, u2) = (rng.unit().max(1e-12), rng.unit());
                    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos() * std) as f32
                })
                .collect()
        };
        var.set(&Tensor::from_vec(values, var.shape(), dev)?)?;
    }
    Ok(())
}

/// What the loop did.
#[derive(Debug, Clone, Default)]
pub struct TrainOutcome {
    pub steps: u64,
    pub images: u64,
    pub interrupted: bool,
}

/// The model for `cfg`'s layers and `classes` outputs, its weights seeded from the run's seed,
/// and its optimizer.
fn build(cfg: &ModelConfig, classes: usize, dev: &Device) -> anyhow::Result<(Cnn, Opt)> {
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F32, dev);
    let model = Cnn::new(cfg, classes, vb)?;
    seed_weights(&vm, cfg.data.seed, dev)?;
    let opt = Opt::new(cfg.train.optimizer, cfg.train.learning_rate, vm.all_vars(), dev)?;
    Ok((model, opt))
}

/// Trains until the loader's plan is done or `stop` is set. Steps are reported on `probe`.
/// With `val`, a validation pass follows every epoch (and a run cut short by `--steps`).
#[allow(clippy::too_many_arguments)]
pub fn train(
    cfg: &ModelConfig,
    classes: usize,
    dev: &Device,
    loader: &mut Loader,
    val: Option<&Validation>,
    probe: &Probe,
    stop: &AtomicBool,
    hooks: &Hooks,
) -> anyhow::Result<TrainOutcome> {
    let slow = |stage| crate::data::simulate::extra_for(&hooks.slow, stage);
    let (slow_transfer, slow_compute) = (slow(Stage::Transfer), slow(Stage::Compute));
    keep_freed_memory(dev);
    let (model, mut opt) = build(cfg, classes, dev)?;
    let (c, h, w) = (cfg.input.channels, cfg.input.height, cfg.input.width);
    let mut out = TrainOutcome::default();
    let mut k = 0u64;
    let mut auto = hooks.auto_workers.clone();
    let sync = GpuSync::from_env()?;
    let mut upload = Upload::new(dev)?;
    let mut timer = DeviceTimer::new(dev, sync);
    // The loader's (blocked, busy) batch-making time at the previous step, for auto workers.
    let mut produced = loader.production();
    loop {
        let step_start = std::time::Instant::now();
        if stop.load(Ordering::Relaxed) {
            out.interrupted = true;
            break;
        }
        let queued = loader.queued() as u32;
        let batch = info_span!("wait", step = k).in_scope(|| loader.next_batch_until(stop));
        let waited = step_start.elapsed();
        let Some(mut batch) = batch else {
            out.interrupted |= stop.load(Ordering::Relaxed);
            break;
        };
        k = batch.step + 1;
        let epoch_end = k % loader.steps_per_epoch().max(1) == 0 || k == loader.total_steps();
        if batch.is_empty() {
            if let (Some(v), true) = (val, epoch_end) {
                validate(&model, v, batch.epoch, dev, probe, stop)?;
            }
            continue;
        }
        #[allow(clippy::panic)]
        if hooks.panic_at_step == Some(batch.step) {
            panic!("--panic-at-step {}: injected panic (testing hook)", batch.step);
        }
        let n = batch.len();
        let (xs, ys) = transfer(&mut batch, (c, h, w), dev, &mut upload, &mut timer, slow_transfer.as_ref())?;
        let (loss, correct) = compute_step(
            &model,
            &mut opt,
            probe,
            (&xs, &ys),
            dev,
            (sync, &mut timer),
            slow_compute.as_ref(),
            batch.step,
        )?;
        // The step's loss is back, so the device has passed its events: never a wait here.
        timer.send(probe, false)?;
        out.steps += 1;
        out.images += n as u64;
        probe.send(step_event(&batch, n, (loss, correct), queued));
        if let Some(a) = auto.as_mut() {
            let now = loader.production();
            a.observe_loader(now.0.saturating_sub(produced.0), now.1.saturating_sub(produced.1));
            produced = now;
            auto_step(a, loader, probe, waited, step_start.elapsed())?;
        }
        if let (Some(v), true) = (val, epoch_end) {
            validate(&model, v, batch.epoch, dev, probe, stop)?;
        }
    }
    timer.send(probe, true)?;
    // No more batches: the plan is done, or a worker died (then the run failed).
    loader.check()?;
    Ok(out)
}

/// The batch to the device (`transfer`): its pixels and labels as tensors, timed on the
/// device when the timer is on, else on the host after a wait for the copy; then `slow`'s
/// simulated extra time.
fn transfer(
    batch: &mut crate::data::Batch,
    (c, h, w): (usize, usize, usize),
    dev: &Device,
    upload: &mut Upload,
    timer: &mut DeviceTimer,
    slow: Option<&crate::data::simulate::Slow>,
) -> anyhow::Result<(Tensor, Tensor)> {
    let n = batch.len();
    // `bytes` over the span's duration is the achieved host→device bandwidth.
    let bytes = batch_bytes(batch.pixels.len(), batch.labels.len());
    // A step timed layer by layer is timed on the host throughout (see compute_step).
    let timed = timer.on() && !times_layers(batch.step);
    let _g = host_span(timed, || info_span!("transfer", step = batch.step, bytes));
    if timed {
        timer.begin(Stage::Transfer, batch.step, bytes)?;
    }
    let xs = upload.pixels(&mut batch.pixels, (n, c, h, w), dev)?;
    let ys = Tensor::from_vec(std::mem::take(&mut batch.labels), n, dev)?;
    if timed {
        timer.end(Stage::Transfer, batch.step)?;
    } else {
        // From pageable memory the copy may still be in flight when from_vec returns: always
        // wait here (not only with GpuSync::Phase) so transfer is the whole copy.
        dev.synchronize()?;
    }
    if let Some(s) = slow {
        s.apply();
    }
    Ok((xs, ys))
}

/// The record of the step of `batch` (its `n` images, gone to the device), sent once its loss
/// is back.
fn step_event(batch: &crate::data::Batch, n: usize, (loss, correct): (f32, f32), queued: u32) -> Event {
    Event::Step(StepRecord {
        no_loss: false,
        step: batch.step,
        epoch: batch.epoch,
        images: n as u32,
        loss,
        correct: correct as u32,
        end_ns: clock::now_ns(),
        queued,
        validation: false,
    })
}

/// Steps between two steps timed layer by layer. Cutting the graph between layers copies each
/// activation and runs one backward call per layer: 1.0–1.1× the step on the large CNN but up
/// to ≈ 1.5× on the small ones in `cargo bench --bench train`, so only some steps pay it.
pub const LAYER_EVERY: u64 = 10;

/// Whether step `step` is timed layer by layer: steps 1–3 (step 0 also pays for first-touch
/// allocations) and every [`LAYER_EVERY`]th after.
pub fn times_layers(step: u64) -> bool {
    (1..=3).contains(&step) || (step > 0 && step % LAYER_EVERY == 0)
}

/// Forward, backward and optimizer for one batch, each a span inside `compute` (or, with
/// device events, a phase of `timer`); the loss and the number of correct predictions. Some
/// steps ([`times_layers`]) run layer by layer and send each layer's forward and backward time.
#[allow(clippy::too_many_arguments)]
fn compute_step(
    model: &Cnn,
    opt: &mut Opt,
    probe: &Probe,
    (xs, ys): (&Tensor, &Tensor),
    dev: &Device,
    (sync, timer): (GpuSync, &mut DeviceTimer),
    slow: Option<&crate::data::simulate::Slow>,
    step: u64,
) -> anyhow::Result<(f32, f32)> {
    let _g = info_span!("compute", step).entered();
    // Layer by layer, each layer waits for the device (its time is device time): those steps
    // synchronise as GpuSync::Phase does, with host spans.
    let timed = timer.on() && !times_layers(step);
    let sync = if timer.on() && !timed { GpuSync::Phase } else { sync };
    if let Some(s) = slow {
        s.apply();
    }
    // Each layer's part of each pass goes to the probe as it ends (one record per layer and
    // pass: a step's handful, not a hot path).
    let layer_time = |backward: bool| {
        move |i: usize, start_ns: u64, dur_ns: u64| {
            probe.send(Event::Layer(LayerRecord { layer: model.name(i).into(), backward, step, start_ns, dur_ns }));
        }
    };
    let done = || phase_done(dev, sync);
    let (logits, loss, grads) = if times_layers(step) {
        let (logits, loss, tape) = {
            let _g = info_span!("forward", step).entered();
            let (logits, tape) = layerwise::forward(model, xs, true, done, layer_time(false))?;
            let loss = candle_nn::loss::cross_entropy(&logits, ys)?;
            phase_done(dev, sync)?;
            (logits, loss, tape)
        };
        let _g = info_span!("backward", step).entered();
        let grads = layerwise::backward(model, tape, &loss, done, layer_time(true))?;
        phase_done(dev, sync)?;
        (logits, loss, grads)
    } else {
        let (logits, loss) = {
            let _g = host_span(timed, || info_span!("forward", step));
            timer_begin(timer, timed, Stage::Forward, step)?;
            let logits = model.forward(xs, true)?;
            let loss = candle_nn::loss::cross_entropy(&logits, ys)?;
            timer_end(timer, timed, Stage::Forward, step)?;
            phase_done(dev, sync)?;
            (logits, loss)
        };
        let _g = host_span(timed, || info_span!("backward", step));
        timer_begin(timer, timed, Stage::Backward, step)?;
        let mut grads = loss.backward()?;
        model.take_grads(&mut grads)?;
        timer_end(timer, timed, Stage::Backward, step)?;
        phase_done(dev, sync)?;
        (logits, loss, grads)
    };
    {
        let _g = host_span(timed, || info_span!("optimizer", step));
        timer_begin(timer, timed, Stage::Optimizer, step)?;
        opt.step(&grads)?;
        timer_end(timer, timed, Stage::Optimizer, step)?;
        phase_done(dev, sync)?;
    }
    // Reading the values back waits for the device: the span covers the real work.
    let correct = logits.argmax(1)?.eq(ys)?.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()?;
    Ok((loss.to_scalar::<f32>()?, correct))
}

fn timer_begin(timer: &mut DeviceTimer, timed: bool, stage: Stage, step: u64) -> anyhow::Result<()> {
    if timed {
        timer.begin(stage, step, NONE)?;
    }
    Ok(())
}

fn timer_end(timer: &mut DeviceTimer, timed: bool, stage: Stage, step: u64) -> anyhow::Result<()> {
    if timed {
        timer.end(stage, step)?;
    }
    Ok(())
}

/// `--workers auto`: the step's wait and length go to the controller; a change of workers is
/// applied at this step boundary and announced.
fn auto_step(
    a: &mut auto::AutoWorkers,
    loader: &mut Loader,
    probe: &Probe,
    waited: std::time::Duration,
    step: std::time::Duration,
) -> anyhow::Result<()> {
    let (workers, reason, settled) = match a.observe(waited.as_nanos() as u64, step.as_nanos() as u64) {
        auto::Decision::Keep => return Ok(()),
        auto::Decision::Set { workers, reason } => (workers, reason, false),
        auto::Decision::Settle { workers, reason } => (workers, reason, true),
    };
    if workers > 0 {
        loader.set_workers(workers)?;
        probe.send_blocking(Event::Workers { workers: workers as u32, reason: reason.into_boxed_str(), settled });
    }
    Ok(())
}

/// One pass over the validation set: forward only, never augmented. Each batch is one
/// `validate` span, from asking the loader for it to its metrics, so the spans add up to the
/// pass's wall time and stay out of the training stages.
fn validate(
    model: &Cnn,
    val: &Validation,
    epoch: u32,
    dev: &Device,
    probe: &Probe,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let mut loader = Loader::start(val.ds.clone(), val.loader.clone(), probe.clone())?;
    let (c, h, w) = (val.loader.channels, val.loader.height as usize, val.loader.width as usize);
    for step in 0..loader.total_steps() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let _g = info_span!("validate", step, epoch).entered();
        let Some(mut batch) = loader.next_batch_until(stop) else { break };
        if batch.is_empty() {
            continue;
        }
        let n = batch.len();
        let xs = pageable(&mut batch.pixels, (n, c, h, w), dev)?;
        let ys = Tensor::from_vec(std::mem::take(&mut batch.labels), n, dev)?;
        let logits = model.forward(&xs, false)?.detach();
        let loss = candle_nn::loss::cross_entropy(&logits, &ys)?.to_scalar::<f32>()?;
        let correct = logits.argmax(1)?.eq(&ys)?.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()?;
        probe.send(Event::Step(StepRecord {
            no_loss: false,
            step,
            epoch,
            images: n as u32,
            loss,
            correct: correct as u32,
            end_ns: clock::now_ns(),
            queued: 0,
            validation: true,
        }));
    }
    loader.check()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_reproducible_for_a_seed() {
        let cfg = ModelConfig::parse(crate::config::DEFAULT_MODEL, "cnn.toml").unwrap();
        let dev = Device::Cpu;
        let values = |seed| {
            let vm = VarMap::new();
            let _m = Cnn::new(&cfg, 4, VarBuilder::from_varmap(&vm, DType::F32, &dev)).unwrap();
            seed_weights(&vm, seed, &dev).unwrap();
            let data = vm.data().lock().unwrap();
            let w = data.get("conv2d_1.weight").unwrap().as_tensor().flatten_all().unwrap();
            w.to_vec1::<f32>().unwrap()
        };
        let (a, b, c) = (values(7), values(7), values(8));
        assert_eq!(a, b);
        assert_ne!(a, c);
        // Kaiming: std ≈ sqrt(2 / (3·3·3)) ≈ 0.27 for the first conv.
        let std = (a.iter().map(|v| v * v).sum::<f32>() / a.len() as f32).sqrt();
        assert!((0.2..0.35).contains(&std), "{std}");
    }

    #[test]
    fn gpu_sync_parses_phase_step_and_events_and_rejects_the_rest() {
        assert_eq!(GpuSync::parse("").unwrap(), GpuSync::Phase);
        assert_eq!(GpuSync::parse("phase").unwrap(), GpuSync::Phase);
        assert_eq!(GpuSync::parse(" step ").unwrap(), GpuSync::Step);
        assert_eq!(GpuSync::parse("events").unwrap(), GpuSync::Events);
        let e = GpuSync::parse("kernel").unwrap_err().to_string();
        assert!(e.contains("PIPEPROF_GPU_SYNC") && e.contains("phase, step or events"), "{e}");
    }

    #[test]
    fn device_events_time_nothing_on_the_cpu() {
        // The host spans stay: on a CPU device a phase's work is done when it returns.
        assert!(!DeviceTimer::new(&Device::Cpu, GpuSync::Events).on());
    }

    #[test]
    fn a_device_timed_phase_arrives_as_a_span_of_this_thread_with_no_cpu_reading() {
        let (probe, rx) = Probe::new(64);
        let p = gpu_events::PhaseTime { stage: Stage::Transfer, step: 7, start_ns: 1_000, dur_ns: 250, bytes: 4096 };
        // Run on a thread of its own: the thread's span batch is then flushed at its exit.
        std::thread::spawn(move || send_phase(&probe, p)).join().unwrap();
        let spans: Vec<SpanRecord> = rx
            .try_iter()
            .flat_map(|e| match e {
                Event::Span(s) => vec![s],
                Event::Spans(v) => v,
                _ => vec![],
            })
            .collect();
        assert_eq!(spans.len(), 1, "{spans:?}");
        let s = spans[0];
        assert_eq!((s.stage, s.step, s.start_ns, s.dur_ns, s.bytes), (Stage::Transfer, 7, 1_000, 250, 4096));
        assert_eq!((s.cpu_ns, s.queue_ns, s.sample), (NONE, NONE, NONE));
        assert_ne!(s.thread, 0, "the calling thread's probes id");
    }

    #[test]
    fn pinned_setting_is_1_u8_or_0_and_pageable_by_default() {
        use std::env::VarError;
        assert_eq!(Upload::parse_mode(Err(VarError::NotPresent)).unwrap(), UploadMode::Pageable);
        assert_eq!(Upload::parse_mode(Ok("1".into())).unwrap(), UploadMode::Pinned);
        assert_eq!(Upload::parse_mode(Ok(" u8".into())).unwrap(), UploadMode::PinnedU8);
        assert_eq!(Upload::parse_mode(Ok("0".into())).unwrap(), UploadMode::Pageable);
        let e = Upload::parse_mode(Ok("yes".into())).unwrap_err().to_string();
        assert!(e.contains("PIPEPROF_PINNED") && e.contains("use 1") && e.contains("u8"), "{e}");
    }

    #[test]
    fn pageable_upload_on_the_cpu_keeps_the_pixels_and_shape() {
        let mut up = Upload::new(&Device::Cpu).unwrap();
        let xs = up.pixels(&mut (0..24).map(|v| v as f32).collect(), (2, 3, 2, 2), &Device::Cpu).unwrap();
        assert_eq!(xs.dims(), &[2, 3, 2, 2]);
        assert_eq!(xs.flatten_all().unwrap().to_vec1::<f32>().unwrap()[23], 23.0);
    }

    #[test]
    fn batch_bytes_count_f32_pixels_and_u32_labels() {
        // 32 images of 3×150×150 and their labels.
        assert_eq!(batch_bytes(32 * 3 * 150 * 150, 32), 32 * 3 * 150 * 150 * 4 + 32 * 4);
        assert_eq!(batch_bytes(0, 0), 0);
    }

    #[test]
    fn device_names_parse_and_cuda_needs_the_feature() {
        assert!(matches!(parse_device("cpu"), Ok(Device::Cpu)));
        assert!(parse_device("gpu").unwrap_err().to_string().contains("cpu, cuda or cuda:N"));
        assert!(parse_device("cuda:x").is_err());
        if !cfg!(feature = "cuda") {
            let e = parse_device("cuda:1").unwrap_err().to_string();
            assert!(e.contains("without CUDA") && e.contains("--features cuda"), "{e}");
        }
    }
}
