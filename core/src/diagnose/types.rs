//! The diagnosis's types: what limits a run, how much, the traps flagged, the advice with its
//! typed change and predicted gain, and the verdict that holds them. Their words are in
//! [`super::words`], [`super::evidence`] and [`super::advice`].

use serde::{Deserialize, Serialize};

/// Declares [`Limiter`] and [`LimiterKind`] from one list, each limiter's name and meaning
/// written once, and [`Limiter::kind`] between them.
macro_rules! limiters {
    ($($(#[doc = $doc:literal])+ $name:ident,)+) => {
        /// What limits the run.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
        pub enum Limiter {
            $($(#[doc = $doc])+ $name,)+
            /// Too few steps measured yet.
            NotEnoughData { steps_needed: u64 },
        }

        /// [`Limiter`] as a program reads it (`--json`): the same limiters in snake case,
        /// without `NotEnoughData` (the document's `status` says that).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum LimiterKind {
            $($(#[doc = $doc])+ $name,)+
        }

        impl Limiter {
            /// The limiter as a program reads it; `None` for `NotEnoughData`.
            pub fn kind(&self) -> Option<LimiterKind> {
                match self {
                    $(Limiter::$name => Some(LimiterKind::$name),)+
                    Limiter::NotEnoughData { .. } => None,
                }
            }
        }
    };
}

limiters! {
    /// Storage: the loader waits on reads.
    Io,
    /// The loader's threads wait for a core that other programs hold.
    Contention,
    /// CPU decode / resize / augment in the loader.
    Preprocess,
    /// Host → device copies.
    Transfer,
    /// The model's own computation (GPU, or CPU when training on the CPU).
    Compute,
    /// Per-step fixed cost of a tiny model.
    Overhead,
    /// Nothing stands out.
    Balanced,
}

/// How input-bound the run is, from the share of step time spent waiting for data
/// (TensorFlow's profiler: ≥ 20% high, ≥ 5% moderate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Severity {
    High,
    Moderate,
    Low,
}

/// The classic traps, flagged whatever the limiter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Flag {
    /// A GPU is present but this process does not use it.
    GpuUnused,
    /// The data folder is on a network or FUSE filesystem.
    NetworkStorage { fs_type: String },
    /// The CPU is saturated: more workers will not help.
    CpuSaturated,
    /// Cores are idle while preprocessing limits.
    TooFewWorkers { workers: usize, cores: usize },
    /// Step time barely depends on work: per-step overhead dominates.
    TinyModel,
    /// Training on the CPU: compute and the loader share the same cores.
    ComputeCompetesWithLoader,
    /// A simulated slowdown (--throttle-read, --slow) is active.
    Simulated { what: String },
    /// Validation passes take a large share of the run's wall time.
    ValidationHeavy { share: f64 },
    /// The run's threads wait for a core this share of the time they are ready to run: other
    /// programs (named, busiest first) hold the cores or, without `external`, the run's own
    /// threads outnumber them.
    CoreContention { share: f64, others: Vec<String>, external: bool },
    /// The loss stopped being a number (NaN, ±inf): training diverged. The timings are still
    /// measured right.
    Diverged { first_nan: Option<u64>, first_inf: Option<u64> },
    /// A stage has been open past the stall threshold: a read that does not return.
    Stalled(crate::aggregate::Stall),
}

/// What an [`Advice`] changes, typed: views render it, `--check-advice` applies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Change {
    /// `--workers N`.
    Workers(usize),
    /// `--batch-size N`.
    BatchSize(usize),
    /// `--prefetch N`.
    Prefetch(usize),
    /// Pack the data into a cache with `pipeprof cache`, then train from it.
    Cache {
        /// The model file whose input size the images are resized to.
        model: String,
        /// The image folder to pack.
        data: String,
    },
    /// `--device D`.
    UseDevice(String),
    /// Pack decoded, resized samples into one memory-mapped file the program's own loader
    /// reads (an attached program that is not a pipeprof `cnn.toml` run: no command for it).
    PackOwnLoader,
    /// A PyTorch or Keras program's image folder packed with `pipeprof pack` and read by
    /// `pipeprof.data.PackedImageFolder` / `pipeprof.keras.packed_dataset` in place of
    /// `ImageFolder` / `image_dataset_from_directory`. From the run's settings: `data` the folder
    /// (empty when unknown), `size` what the pixels are stored at.
    PackFolder { keras: bool, data: String, size: PackSize },
    /// Copy the data set off a network/FUSE mount to a local disk.
    CopyLocal,
    /// Stop, or lower the priority of, the programs that hold the cores.
    FreeCores,
    /// Resize the images offline to the model's input size.
    PreResize { width: usize, height: usize },
    /// Cheaper augmentation, or augmentation on the device.
    CheaperAugment,
    /// Send batches as u8, convert to f32 on the device.
    U8Batches,
    /// Keep a PyTorch `DataLoader`'s workers between epochs (`persistent_workers=True`).
    PersistentWorkers,
    /// Advice read back from a summary file: only its words were saved ([`Advice::command`]
    /// among them), so it is shown as written and never applied.
    Saved,
}

/// The size `pipeprof pack` stores the pixels at, as the program would see them before its
/// own transforms go on: a Keras program's `image_size` (what `image_dataset_from_directory`
/// resizes to), a PyTorch program's leading `Resize`, else the images as stored (a program
/// that crops first, `RandomResizedCrop`, must crop from the full image).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum PackSize {
    /// `--size W×H` (`--size S` when square).
    Exact { height: usize, width: usize },
    /// `--shorter S`: torchvision's `Resize(S)`.
    Shorter(usize),
    /// `--as-stored`: the program's own resize stays.
    AsStored,
    /// The run did not say: `--size S` for the user to fill in.
    Unknown,
}

impl PackSize {
    /// The `pipeprof pack` flag that stores this size.
    pub fn flag(self) -> String {
        match self {
            PackSize::Exact { height, width } if height == width => format!("--size {height}"),
            PackSize::Exact { height, width } => format!("--size {width}x{height}"),
            PackSize::Shorter(s) => format!("--shorter {s}"),
            PackSize::AsStored => "--as-stored".into(),
            PackSize::Unknown => "--size S".into(),
        }
    }

    /// Whether the program's own resize is left with nothing to do on the stored pixels.
    pub fn replaces_resize(self) -> bool {
        !matches!(self, PackSize::AsStored)
    }
}

/// Loader arguments a `pipeprof run` program's start-up hook can set without an edit to it
/// (`pipeprof._override`); `None` leaves the program's own. Keras `PyDataset`: `num_workers`
/// sets `workers` (with `use_multiprocessing`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LoaderKnobs {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_workers: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_workers: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefetch_factor: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pin_memory: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<usize>,
}

/// One concrete action with its predicted effect.
///
/// The change is typed whoever runs it: more workers are [`Change::Workers`] for pipeprof's own
/// loop and for a PyTorch `DataLoader` alike; what the user types or edits for it, in the run's
/// own terms, is [`Advice::command`]. In JSON the change is written as that `command` (the
/// summary's schema), and read back as [`Change::Saved`]: verdicts are recomputed from
/// statistics, never from text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(into = "AdviceJson", from = "AdviceJson")]
pub struct Advice {
    /// What to do, in words.
    pub action: String,
    /// The change that does it.
    pub change: Change,
    /// What makes the change in the run's own terms, when there is something to copy:
    /// pipeprof's flags or command for its own loop ([`Change::command`]), the framework's code
    /// for a PyTorch or Keras program (`DataLoader(..., num_workers=6)`). Written last, once,
    /// for every piece of advice ([`super::frameworks::in_user_terms`]): a rule leaves it `None`.
    pub command: Option<String>,
    /// Predicted images/s after / before (e.g. 1.8 = 1.8× faster), when the model can say.
    pub predicted_speedup: Option<f64>,
    /// Why this should help, with the number behind the prediction.
    pub reason: String,
    /// What the predicted gain is measured against: today's measured rate and the model's rate
    /// after the change. `None` for advice whose gain is not the capacity model's.
    pub basis: Option<Basis>,
}

/// A predicted gain and what it stands on: `predicted_speedup` = `predicted` / `now`, never
/// over the model's own estimate of today's rate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Basis {
    /// Images/s measured now, over the steady state (steps `from_step`–`to_step`: after the
    /// start-up and the last change of workers).
    pub now: f64,
    pub from_step: u64,
    pub to_step: u64,
    /// Images/s the model predicts after the change.
    pub predicted: f64,
    /// The model's own estimate of today's rate, images/s.
    pub model_now: f64,
    /// Where the model's estimate of today is off the measured rate by more than
    /// [`MODEL_OFF_SHARE`](super::MODEL_OFF_SHARE): the gain as a range (low, high), whose ends read the prediction
    /// against the measured rate and against the model's.
    pub range: Option<(f64, f64)>,
    /// The range takes in the compute's slow steps: other programs hold cores, and which
    /// steps the scheduler slows is theirs to decide ([`widen_for_slow_steps`](super::widen_for_slow_steps)).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub slow_steps: bool,
    /// The range is how much of compute grows with the batch, which one run on the CPU
    /// cannot tell (from none of it to all of it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compute_split_unknown: bool,
    /// The prediction is a floor, not an estimate: it keeps CPU costs measured cold, between
    /// slow reads, which run faster once the reads are gone, by a factor the run does not show.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub floor: bool,
}
/// [`Advice`] as the summary JSON stores it.
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct AdviceJson {
    action: String,
    command: Option<String>,
    predicted_speedup: Option<f64>,
    reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    basis: Option<Basis>,
}

impl From<Advice> for AdviceJson {
    fn from(a: Advice) -> AdviceJson {
        AdviceJson {
            command: a.command,
            action: a.action,
            predicted_speedup: a.predicted_speedup,
            reason: a.reason,
            basis: a.basis,
        }
    }
}

impl From<AdviceJson> for Advice {
    fn from(a: AdviceJson) -> Advice {
        Advice {
            action: a.action,
            change: Change::Saved,
            command: a.command,
            predicted_speedup: a.predicted_speedup,
            reason: a.reason,
            basis: a.basis,
        }
    }
}

/// The diagnosis of one window (or the whole run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Verdict {
    pub limiter: Limiter,
    pub severity: Severity,
    /// One line: what limits the run and how much.
    pub headline: String,
    /// The 3–5 numbers that decided it, in words.
    pub evidence: Vec<String>,
    /// The figure each line of `evidence` stands on, as data: `measures[i]` is line `i`'s
    /// (empty in summaries written before they were kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measures: Vec<super::measures::Measure>,
    pub flags: Vec<Flag>,
    /// Best first.
    pub advice: Vec<Advice>,
    /// Given early before [`MIN_STEPS`](super::MIN_STEPS) (≥ [`EARLY_STEPS`](super::EARLY_STEPS) steps of ≥ [`EARLY_STEP_MS`](super::EARLY_STEP_MS), or ≥
    /// [`EARLY_MIN_STEPS`](super::EARLY_MIN_STEPS) steps and [`EARLY_TIME_MS`](super::EARLY_TIME_MS) measured): may change once the usual
    /// window fills.
    #[serde(default)]
    pub provisional: bool,
    /// The training rate this verdict read ([`super::measured_now`]); none before a step.
    #[serde(default)]
    pub now: Option<super::Now>,
}
