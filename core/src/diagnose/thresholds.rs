//! Every number a rule compares against, in one place. The prose formats these same constants,
//! so the words can never disagree with the rule.

/// Steps needed before a verdict is given.
pub const MIN_STEPS: u64 = 5;
/// Steps after which slow steps get a provisional verdict (TensorFlow's profiler answers
/// after 3)…
pub const EARLY_STEPS: u64 = 3;
/// …when a step takes at least this long, ms: waiting for five 4-second steps is 20 s with
/// no answer.
pub const EARLY_STEP_MS: f64 = 1000.0;
/// Or after this much measured step time, ms, from [`EARLY_MIN_STEPS`] steps on: a few long
/// steps of a large model measure as much as many short ones.
pub const EARLY_TIME_MS: f64 = 5000.0;
/// Fewest steps a verdict is ever given on (a mean of one step is not a mean).
pub const EARLY_MIN_STEPS: u64 = 2;

/// Wait share at or above which the run is highly input-bound (TensorFlow's profiler).
pub const HIGH_WAIT_SHARE: f64 = 0.20;
/// Wait share at or above which the run is moderately input-bound (TensorFlow's profiler).
pub const MODERATE_WAIT_SHARE: f64 = 0.05;
/// Transfer share at or above which host→device copies limit (when ≥ the wait share).
pub const TRANSFER_SHARE: f64 = 0.20;
/// Share of the loader's wall time off-CPU in `read` at or above which an input-bound run is
/// I/O-bound.
pub const IO_OFF_CPU_SHARE: f64 = 0.5;
/// Machine iowait % that marks an uninstrumented loader as I/O-bound.
pub const IOWAIT_PCT: f64 = 20.0;
/// Compute per step under which fixed per-step costs dominate, ms.
pub const OVERHEAD_STEP_MS: f64 = 5.0;
/// Share of compute in the batch-independent optimizer step marking a per-step-overhead run
/// (for a model under [`SMALL_MODEL_PARAMS`]).
pub const FIXED_COST_SHARE: f64 = 0.5;
/// Parameters from which an optimizer step that dominates compute is the model's own work
/// (memory traffic per parameter), not a fixed per-step cost: such a run is compute-bound,
/// and its evidence is the optimizer's cost per parameter. 1 M parameters is ≈ 16 MB of Adam
/// state: far beyond any per-call overhead.
pub const SMALL_MODEL_PARAMS: usize = 1_000_000;
/// Mean GPU utilisation % under which a not-input-bound GPU run is overhead-bound.
pub const GPU_LOW_UTIL_PCT: f64 = 50.0;
/// Loader capacity / compute capacity under which the run is balanced.
pub const BALANCED_HEADROOM: f64 = 1.2;
/// Machine CPU % at or above which the CPU is saturated (also: this process at this % × cores).
pub const CPU_SATURATED_PCT: f64 = 90.0;
/// Machine CPU % under which cores count as idle (too few workers).
pub const CPU_IDLE_PCT: f64 = 75.0;
/// Loader share of the process's CPU per image at or above which it competes with CPU compute.
pub const COMPETE_SHARE: f64 = 0.10;
/// Training on the CPU beside a `tf.data` pipeline, the loader's share of the process's CPU
/// per image (its map and loading over those and the step's) from which the map limits the
/// run whatever the step's wait for its batch: its threads hold the cores the step needs, so
/// the step slows instead of waiting (the wait inside the step, `IteratorGetNext`, stays low
/// while tf.data keeps a few batches ahead). At 60% the map takes 1.5× the step's CPU:
/// measured on 2 cores (`python/corpus/tf_heavy_map_cpu.py`), a blur map at 70–84% ran the
/// script 1.3–3.3× slower than its identity map, which (loading alone) was at 34–45%.
pub const TF_MAP_CPU_SHARE: f64 = 0.6;
/// Share of wall time in validation passes from which it is flagged.
pub const VALIDATION_SHARE: f64 = 0.10;
/// Smallest predicted gain worth advising.
pub const MIN_GAIN: f64 = 1.10;

/// A program that kept less than this % of a core busy is not named as one holding the cores
/// (a kernel worker at 0–1%: nothing to stop).
pub const NAMED_OTHER_PCT: f64 = 5.0;

/// Share of the loader's wall time spent waiting for a core (off-CPU outside `read` when the
/// run-queue wait is not measured) from which the evidence mentions it.
pub const CORE_WAIT_SHARE: f64 = 0.2;
/// Share of the time this run's threads were ready to run that they spent waiting for a core
/// (run-queue wait) from which contention is a finding: flagged, and the limiter when the
/// run is input-bound, other programs hold cores and read is not blocked on storage.
pub const CONTENTION_SHARE: f64 = 0.15;
/// Cores other programs keep busy (median) from which contention is theirs, not this run's
/// own threads outnumbering the cores.
pub const OTHER_CORES: f64 = 0.5;
/// Steal % from which the hypervisor's other guests count as competing load.
pub const STEAL_PCT: f64 = 5.0;
/// Evidence lines at most: the numbers that decided, not everything measured.
pub const MAX_EVIDENCE: usize = 5;

/// Loader workers per core worth trying for I/O: threads waiting on storage need no core.
pub const IO_WORKERS_PER_CORE: usize = 4;
/// The fewest workers reaching this share of the best predicted throughput are advised: more
/// threads for the last few percent cost memory and contention the model does not see.
pub const NEAR_BEST_SHARE: f64 = 0.97;
/// The wait is spiky when its median is at most this share of its mean…
pub const SPIKY_MEDIAN_SHARE: f64 = 0.25;
/// …or its p95 at least this many times its mean.
pub const SPIKY_P95_RATIO: f64 = 3.0;
/// A stall longer than this many times the p95 (or the mean) is an outlier the prefetch queue
/// is not sized for.
pub const MAX_SPIKE_RATIO: f64 = 4.0;
/// Prefetch depths advised, in batches.
pub const PREFETCH_DEPTH: std::ops::RangeInclusive<usize> = 2..=64;
/// Loader cost per image, ms, under which a loader that only fetches and collates (no read,
/// decode, resize or augment seen) is taking samples already in memory: indexing a tensor
/// costs microseconds, decoding even a 28×28 PNG costs more.
pub const IN_MEMORY_IMAGE_MS: f64 = 0.02;
/// Factor the batch size is raised by for a per-step-overhead run.
pub const BATCH_GROWTH: usize = 4;
/// The model's estimate of today's rate may be off the measured rate by this share (either
/// way) before the evidence says so and every predicted gain becomes a range.
pub const MODEL_OFF_SHARE: f64 = 0.25;
/// Training on the CPU with a framework's compute threads already on every core, more loader
/// workers oversubscribe the cores: the capacity model's gain is an upper bound there (it
/// shares the cores perfectly; OpenMP's spinning threads and the workers' hand-over do not;
/// measured: `docs/calibration-notes.md`). Below this bound workers are not advised at all;
/// above it they are advised with no number, for `--check-advice` to measure.
pub const OVERSUBSCRIBED_TRY_GAIN: f64 = 1.25;
/// A PyTorch or Keras program whose image reads are blocked at least this share of its
/// loader's time per image: the copy to a local disk and the packed file are advised with no
/// number, for `--check-advice` to measure. The CPU work measured between slow reads runs
/// cold, and how much faster it runs once the reads are fast is not in the run: on a FUSE
/// mount with 12.5 ms blocked a read (`docs/calibration-notes.md`), the loader's CPU stages
/// took 1.5× and the step 1.7× what they took on the local copy, and the model's figures
/// (×4.6 copy, ×6.9 pack) were half of what the re-runs measured (×8.9, ×18).
pub const COLD_READ_SHARE: f64 = 0.5;

/// Blocked time per image in a stage after read worth naming in the copy advice, ms: on a
/// slow mount, a decoder reading the rest of the file as it decodes (PIL) waits there.
pub const LAZY_READ_MS: f64 = 0.5;
