//! The device side of the loop: which device (`--device`), where the loop waits for it
//! ([`GpuSync`]), how a batch's pixels reach it ([`Upload`], page-locked or not), device-timed
//! phases ([`DeviceTimer`]) and the host's spans around them, and the CPU heap kept for
//! candle's tensors.

use super::gpu_events;
use candle_core::{Device, Tensor};
use probes::{clock, Probe, SpanRecord, Stage, NONE};

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
    /// `PIPEPROF_GPU_SYNC=events|phase|step` (default events: on an H200, 2026-11-28, waiting
    /// per phase cost the 42.5 M CNN 15% of its images/s against one wait per step, and events
    /// cost nothing measurable, docs/gpu.md); an environment variable so that a measurement of
    /// its cost needs no new command-line flag.
    pub fn from_env() -> anyhow::Result<GpuSync> {
        match std::env::var("PIPEPROF_GPU_SYNC") {
            Err(std::env::VarError::NotPresent) => Ok(GpuSync::Events),
            Ok(v) => GpuSync::parse(&v),
            Err(e) => anyhow::bail!("PIPEPROF_GPU_SYNC: {e}; use phase, step or events"),
        }
    }

    fn parse(s: &str) -> anyhow::Result<GpuSync> {
        match s.trim() {
            "phase" => Ok(GpuSync::Phase),
            "step" => Ok(GpuSync::Step),
            "" | "events" => Ok(GpuSync::Events),
            other => anyhow::bail!("PIPEPROF_GPU_SYNC={other:?}: use phase, step or events"),
        }
    }
}

/// Ends a phase: on CUDA with [`GpuSync::Phase`], waits until the device has run everything
/// queued so far. On the CPU backend the work is already done and this costs one comparison.
pub(super) fn phase_done(dev: &Device, sync: GpuSync) -> candle_core::Result<()> {
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
pub(super) struct Upload {
    #[cfg(feature = "cuda")]
    mode: UploadMode,
    #[cfg(feature = "cuda")]
    staging: Option<pinned::Staging>,
}

impl Upload {
    pub(super) fn new(dev: &Device) -> anyhow::Result<Upload> {
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
    pub(super) fn pixels(
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
pub(super) fn pageable(
    pixels: &mut Vec<f32>,
    shape: (usize, usize, usize, usize),
    dev: &Device,
) -> candle_core::Result<Tensor> {
    if dev.is_cpu() {
        return Tensor::from_vec(std::mem::take(pixels), shape, dev);
    }
    Tensor::from_slice(&pixels[..], shape, dev)
}

/// Page-locked uploads (public for `cargo bench --bench cuda_step`).
#[cfg(feature = "cuda")]
pub mod pinned {
    use crate::train::staging::{pinned::PinnedAlloc, StagingPool};
    use crate::train::transfer;
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
pub(super) struct DeviceTimer {
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
    pub(super) fn new(dev: &Device, sync: GpuSync) -> DeviceTimer {
        #[cfg(feature = "cuda")]
        if let (Device::Cuda(cuda), GpuSync::Events) = (dev, sync) {
            let events = gpu_events::cuda::StreamEvents { stream: cuda.cuda_stream() };
            return DeviceTimer { ring: Some(gpu_events::PhaseEvents::new(events, EVENT_RING)) };
        }
        let _ = (dev, sync);
        DeviceTimer { ring: None }
    }

    /// Whether phases are timed on the device (their host spans are then not opened).
    pub(super) fn on(&self) -> bool {
        self.ring.is_some()
    }

    pub(super) fn begin(&mut self, stage: Stage, step: u64, bytes: u64) -> anyhow::Result<()> {
        if let Some(r) = self.ring.as_mut() {
            r.begin(stage, step, clock::now_ns(), bytes)?;
        }
        Ok(())
    }

    pub(super) fn end(&mut self, stage: Stage, step: u64) -> anyhow::Result<()> {
        if let Some(r) = self.ring.as_mut() {
            r.end(stage, step)?;
        }
        Ok(())
    }

    /// Sends the phases the device has finished (never waits); with `all`, waits for the rest:
    /// the end of the run.
    pub(super) fn send(&mut self, probe: &Probe, all: bool) -> anyhow::Result<()> {
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
pub(super) fn send_phase(probe: &Probe, p: gpu_events::PhaseTime) {
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
pub(super) fn host_span(device_timed: bool, make: impl FnOnce() -> tracing::Span) -> tracing::span::EnteredSpan {
    if device_timed {
        tracing::Span::none().entered()
    } else {
        make().entered()
    }
}

/// Bytes a batch moves to the device: f32 pixels and u32 labels.
pub(super) fn batch_bytes(pixels: usize, labels: usize) -> u64 {
    (pixels * std::mem::size_of::<f32>() + labels * std::mem::size_of::<u32>()) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use probes::Event;

    #[test]
    fn gpu_sync_parses_phase_step_and_events_and_rejects_the_rest() {
        assert_eq!(GpuSync::parse("").unwrap(), GpuSync::Events, "the default");
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
