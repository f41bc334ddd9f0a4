//! The trace's vocabulary, one place: the names of the events and counters pipeprof writes
//! ([`super::chrome`]) and reads back ([`super::read`]: `pipeprof report` on a trace), and the
//! keys of their arguments. A name changed here changes in both; the round-trip tests in
//! [`super::read`] write each kind of event and read it back.

/// Metadata (`"ph":"M"`): a thread's name (its `args`: [`NAME`], and [`ROLE`] where it has one).
pub const THREAD_NAME: &str = "thread_name";
/// Metadata: a thread's place among the tracks (`args`: `sort_index`).
pub const THREAD_SORT: &str = "thread_sort_index";
/// Metadata: the process's name.
pub const PROCESS_NAME: &str = "process_name";
/// A thread's or the process's name, in a metadata event's `args`.
pub const NAME: &str = "name";
/// A thread's role ([`probes::ThreadRole`] as JSON), in a `thread_name` event's `args`.
pub const ROLE: &str = "role";

/// A stage span's arguments (`"ph":"X"`, named for its stage): its CPU time, its wait for a
/// core and the rest of its time off-CPU (µs), and the step, sample and bytes it belongs to.
pub mod span {
    pub const CPU_US: &str = "cpu_us";
    pub const CORE_WAIT_US: &str = "core_wait_us";
    pub const BLOCKED_US: &str = "blocked_us";
    pub const STEP: &str = "step";
    pub const SAMPLE: &str = "sample";
    pub const BYTES: &str = "bytes";
}

/// Counter (`"ph":"C"`): one training step, at its end.
pub mod step {
    pub const EVENT: &str = "step";
    pub const STEP: &str = "step";
    pub const EPOCH: &str = "epoch";
    pub const IMAGES: &str = "images";
    /// Left out where the loss was not finite ([`super::LOSS_NOT_FINITE`] marks it).
    pub const LOSS: &str = "loss";
    pub const CORRECT: &str = "correct";
    /// Batches waiting in the prefetch queue when the step took its own.
    pub const BATCHES_READY: &str = "batches_ready";
}

/// Counter: images/s since the step before (its one argument has the same name).
pub const RATE: &str = "images/s";

/// Counter: CPU use, % of one core: this process's and the machine's.
pub mod cpu {
    pub const EVENT: &str = "CPU %";
    pub const PROCESS: &str = "process";
    pub const MACHINE: &str = "machine";
}

/// Counter: the process's resident memory, MB.
pub mod rss {
    pub const EVENT: &str = "RSS MB";
    pub const RSS: &str = "rss";
}

/// Counter: bytes read and written from storage, MB/s.
pub mod storage {
    pub const EVENT: &str = "storage MB/s";
    pub const READ: &str = "read";
    pub const WRITE: &str = "write";
}

/// Counter per GPU, named [`gpu::PREFIX`] and its index: what NVML measured of it.
pub mod gpu {
    pub const PREFIX: &str = "GPU ";
    pub const UTIL: &str = "util %";
    pub const MEMORY_GB: &str = "memory GB";
    pub const PCIE_TO_GPU: &str = "PCIe to GPU MB/s";
    pub const PCIE_FROM_GPU: &str = "PCIe from GPU MB/s";

    /// The counter of GPU `index`.
    pub fn counter(index: u32) -> String {
        format!("{PREFIX}{index}")
    }

    /// The GPU a counter's name is of, if it is a GPU's.
    pub fn index_of(counter: &str) -> Option<u32> {
        counter.strip_prefix(PREFIX)?.parse().ok()
    }
}

/// Instants (`"ph":"i"`), each with its arguments.
/// The run's settings (its `args`: the settings as JSON, with [`TRACE_VERSION_KEY`]).
pub const SETTINGS: &str = "settings";
/// Key of the trace's version in the first `settings` instant.
pub const TRACE_VERSION_KEY: &str = "trace_version";
/// The run's summary, written at its end (its `args`: the summary).
pub const SUMMARY: &str = "summary";
/// GPU sampling stopped or never started (`args`: [`REASON`]).
pub const GPU_OFF: &str = "GPU sampling off";
/// A file the loader could not use (`args`: [`PATH`], [`REASON`]).
pub const SKIPPED: &str = "skipped file";
/// Per-sample spans stopped at the cap (`args`: `message`).
pub const CAPPED: &str = "trace capped";
/// A step whose loss was NaN or infinite (`args`: `step`, `loss` as a word).
pub const LOSS_NOT_FINITE: &str = "loss not finite";
pub const REASON: &str = "reason";
pub const PATH: &str = "path";
