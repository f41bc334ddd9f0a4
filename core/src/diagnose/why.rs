//! What a rule of [`super::advice`] decided, typed: the premises and the numbers a piece of
//! advice stands on, one variant per rule's case. A rule returns a [`Proposal`] (the change,
//! its gain, its [`Why`]) and says nothing in words; the words of the action and of the reason
//! are made last, once, in the user's terms ([`super::frameworks::in_user_terms`], the reason
//! by `Why::words` in [`super::words`]).

use super::{Basis, Change};
use crate::aggregate::settings::ColdCpu;

/// One piece of advice as a rule decides it: the change, its predicted gain with what the gain
/// stands on, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    pub change: Change,
    pub predicted_speedup: Option<f64>,
    pub basis: Option<Basis>,
    pub why: Why,
}

/// Today's rate as a reason quotes it: measured over the steady state, or, without a measured
/// rate, the model's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NowRate {
    Measured(f64),
    Modelled(f64),
}

/// What the training loop takes after a change to the loader: as today, or more, where its
/// compute threads wait less behind the workers for the cores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Training {
    Same(f64),
    Faster { then: f64, now: f64 },
}

/// Which of the loop's work the hook's fed measurement counts beside the loader's
/// ([`ColdCpu`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FedParts {
    Loader,
    LoaderAndLoop,
    LoaderLoopAndStep,
}

/// Whether the CPU work between slow reads ran cold, and what is known of it fed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fed {
    /// The reads were fast enough: nothing to say.
    Warm,
    /// Cold, and not measured fed: the prediction is a floor.
    Floor,
    /// Cold, measured fed by the hook (`packed`: its transform on packed images counted too).
    Measured { cpu: ColdCpu, parts: FedParts, packed: bool },
}

/// Why the GPU is advised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GpuCase {
    /// A tiny model: overhead dominates, and a GPU may be no faster.
    Tiny,
    /// The loader limits: the GPU frees the cores compute takes from it.
    LoaderLimits,
    /// Compute's share of the step on the CPU.
    Compute { share: f64 },
}

/// A bigger batch's case on a loop that batches in-memory samples itself: what grows with the
/// batch beyond the loader's part.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SerialRest {
    /// On the CPU forward+backward grows with the batch by up to `factor`.
    Cpu { compute_ms: f64, factor: usize },
    /// On a GPU a tiny model's kernels take as long for `to` images as for `from`.
    Gpu { compute_ms: f64, from: usize, to: usize },
}

/// The premises and numbers of one piece of advice (see the module's doc).
#[derive(Debug, Clone, PartialEq)]
pub enum Why {
    /// Other programs hold the cores this run waits for.
    FreeCores { holders: Vec<(String, f32)>, core_wait_share: f64, other_cores: f64, steal_pct: Option<f32> },
    /// More workers overlap the reads' waits (`then` the model's rate after).
    WorkersOverlapReads { n: usize, blocked_ms: f64, then: f64, now: NowRate, compute_cpu_ms: Option<f64> },
    /// More workers would overlap reads that ran cold: no number.
    WorkersColdReads { n: usize, blocked_ms: f64 },
    /// More workers bring the loader's CPU up to the loop's need.
    WorkersCpu {
        loader_cpu_ms: f64,
        loop_rate: f64,
        needed_cores: f64,
        free_cores: f64,
        then: f64,
        now: NowRate,
        compute_cpu_ms: Option<f64>,
    },
    /// Workers on cores the compute threads already hold: at most `best`, no prediction.
    WorkersOversubscribed { n: usize, threads: usize, cores: usize, best: f64 },
    /// The loader keeps up on average but stalls.
    Prefetch { loader: f64, needed: f64, p50_ms: f64, mean_ms: f64, p95_ms: f64, at_most: f64 },
    /// Reads blocked on a network or FUSE mount (`then` the rate after, a floor where `fed` is).
    CopyLocal { kind: String, fs_type: String, blocked_ms: f64, lazy_ms: Option<f64>, then: f64, fed: Fed },
    /// Packing takes read and decode (and resize, unless `keeps_resize`) off the loader.
    Pack { keeps_resize: bool, gone_ms: f64, loader: f64, training: Training, fed: Fed },
    /// Resize and decode shrink at the input size.
    PreResize { resize_ms: f64, decode_ms: f64 },
    /// Augmentation costs the loader.
    Augment { wall_ms: f64, on_cpu_ms: f64, loader: f64, training: Training },
    /// f32 batches are 4× the bytes of u8.
    U8Batches { transfer_ms: f64, after_ms: f64 },
    /// A loop batching in-memory samples itself: a fixed part per step.
    SerialBatch { fixed_ms: f64, step_ms: f64, optimizer_ms: Option<f64>, per_batch_ms: f64, rest: SerialRest },
    /// A tiny model's kernels on a GPU take as long for more images.
    BatchLaunchBound { kernels_ms: f64, from: usize, to: usize, then: f64, now: f64 },
    /// The optimizer step does not grow with the batch.
    BatchFixedStep { fixed_ms: f64, per_image_ms: f64, then: f64, now: f64, on_cpu: bool },
    /// More images per step spread a per-step cost this run did not measure.
    BatchUnmeasured { low_gpu_pct: Option<f64>, compute_ms: f64 },
    /// Per-step overhead on the GPU, which the CPU has none of.
    CpuDevice { compute_ms: f64 },
    /// The GPU is not used (`own_loop`: pipeprof's own loop, which needs a CUDA build).
    Gpu { case: GpuCase, own_loop: bool },
    /// PyTorch starts the workers anew each epoch.
    PersistentWorkers { startup_wait_ms: f64, workers: usize, epochs: f64 },
}
