//! What travels on the channel: small, fixed-size records.

use crate::stage::Stage;

/// Marks a field that was not recorded.
pub const NONE: u64 = u64::MAX;

/// One closed stage span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanRecord {
    /// Which stage.
    pub stage: Stage,
    /// The probes thread id (see [`Event::Thread`]).
    pub thread: u32,
    /// Start, monotonic ns ([`crate::clock::now_ns`]).
    pub start_ns: u64,
    /// Wall-clock duration, ns.
    pub dur_ns: u64,
    /// On-CPU time of the thread during the span, ns; [`NONE`] when not measured.
    pub cpu_ns: u64,
    /// Time the thread was runnable but had no core during the span (run-queue wait), ns;
    /// [`NONE`] when not measured. Off-CPU time beyond it was blocked (storage, locks, page
    /// faults, sleeping on a queue).
    pub queue_ns: u64,
    /// The training step this span belongs to (field `step`), or [`NONE`].
    pub step: u64,
    /// The sample index (field `sample`), or [`NONE`].
    pub sample: u64,
    /// Bytes handled (field `bytes`), or [`NONE`].
    pub bytes: u64,
}

impl SpanRecord {
    /// End of the span, monotonic ns.
    pub fn end_ns(&self) -> u64 {
        self.start_ns + self.dur_ns
    }
}

/// One finished training (or validation) step, sent by the training loop.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepRecord {
    /// Global step index, from 0.
    pub step: u64,
    /// Epoch, from 0.
    pub epoch: u32,
    /// Images in the batch.
    pub images: u32,
    /// Mean loss over the batch (NaN or ±inf when training diverged: written as words).
    #[serde(with = "crate::nonfinite")]
    pub loss: f32,
    /// Correct predictions in the batch.
    pub correct: u32,
    /// End of the step, monotonic ns.
    pub end_ns: u64,
    /// Batches waiting in the prefetch queue when the step took its batch.
    pub queued: u32,
    /// Whether this was a validation step.
    pub validation: bool,
    /// The loss was not measured for this step (a program whose loss pipeprof did not see):
    /// `loss` means nothing then, and is left out of every mean.
    #[serde(default)]
    pub no_loss: bool,
}

/// One layer's part of a forward or backward pass of the model pipeprof trains (sent by its
/// training loop; a program of the user's own sends none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerRecord {
    /// The layer's name in the model (`dense_1`).
    pub layer: Box<str>,
    /// The backward pass (else the forward pass).
    pub backward: bool,
    /// The training step.
    pub step: u64,
    /// Start, monotonic ns.
    pub start_ns: u64,
    /// Wall-clock duration, ns.
    pub dur_ns: u64,
}

/// Where a process stands in a distributed run (PyTorch `torchrun`, any launcher that sets
/// `RANK`, `LOCAL_RANK` and `WORLD_SIZE`): read from its environment when it connects.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct Rank {
    /// Global rank, from 0.
    pub rank: u32,
    /// Rank on this machine (the GPU it uses, by convention).
    #[serde(default)]
    pub local_rank: u32,
    /// Ranks in the run.
    pub world_size: u32,
}

/// Largest world size read from an environment (a bound on hostile input).
pub const MAX_WORLD_SIZE: u32 = 1 << 20;

impl Rank {
    /// This process's rank from its environment (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`), if a
    /// launcher set one.
    pub fn from_env() -> Option<Rank> {
        Rank::from_vars(|k| std::env::var(k).ok())
    }

    /// The rank `get` describes: `RANK` and `WORLD_SIZE` must both read as numbers with
    /// `RANK < WORLD_SIZE ≤` [`MAX_WORLD_SIZE`]; `LOCAL_RANK` defaults to `RANK`. Anything else
    /// is no rank (a process outside a distributed run, or a launcher's own process).
    fn from_vars(get: impl Fn(&str) -> Option<String>) -> Option<Rank> {
        let num = |k: &str| get(k).and_then(|v| v.trim().parse::<u32>().ok());
        let (rank, world_size) = (num("RANK")?, num("WORLD_SIZE")?);
        if world_size == 0 || world_size > MAX_WORLD_SIZE || rank >= world_size {
            return None;
        }
        Some(Rank { rank, local_rank: num("LOCAL_RANK").unwrap_or(rank), world_size })
    }
}

/// Everything the collector receives.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A stage span closed.
    Span(SpanRecord),
    /// Several closed stage spans from one thread, in the order they closed (the Layer
    /// batches them; readers handle them like that many [`Event::Span`]s).
    Spans(Vec<SpanRecord>),
    /// A thread sent its first span: its probes id, name and role.
    Thread {
        /// Probes thread id.
        id: u32,
        /// OS thread name, or `thread-N`.
        name: Box<str>,
        /// What the thread does, as set where it was made ([`crate::set_thread_role`]).
        role: crate::role::ThreadRole,
    },
    /// A training step finished.
    Step(StepRecord),
    /// One layer's forward or backward time in a step.
    Layer(LayerRecord),
    /// A file was skipped (unreadable or undecodable).
    Skipped {
        /// The path, as given.
        path: Box<str>,
        /// Why.
        reason: Box<str>,
    },
    /// A host (CPU, memory, disk) sample.
    Host(Box<crate::sample::HostSample>),
    /// A GPU sample (all devices), or the reason GPU sampling is off.
    Gpu(Box<crate::sample::GpuSample>),
    /// The loader's worker count changed (`--workers auto`), and why.
    Workers {
        /// Workers from now on.
        workers: u32,
        /// Why, in words.
        reason: Box<str>,
        /// Whether this is the final choice.
        settled: bool,
    },
    /// Run settings learned while the run goes (free-form JSON object: the keys of the
    /// collector's run settings; a Python run's DataLoader arguments). Later keys win.
    Settings(Box<serde_json::Value>),
    /// The profiled program failed (an uncaught exception, a crashed worker): why, in words.
    Failed(Box<str>),
    /// A stage has been open longer than the stall threshold (a read that does not return):
    /// sent by the watchdog while it lasts, and once more for a thread left behind.
    Stalled {
        /// Thread name.
        thread: Box<str>,
        /// The stage it is in.
        stage: Stage,
        /// The file (or sample) it is working on.
        file: Box<str>,
        /// How long the stage has been open, ns.
        open_ns: u64,
        /// The run ended without it: the thread was left behind, still stuck.
        abandoned: bool,
    },
    /// An event from one rank of a distributed run (relayed from a producer whose hello named
    /// its rank, or from one of several runs attached at once): the collector counts it for the
    /// run and for that rank. Never nested.
    Ranked(Rank, Box<Event>),
    /// The producer is done: everything it sent before this has arrived.
    Finish,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_reads_from_a_launchers_environment_or_not_at_all() {
        // (RANK, WORLD_SIZE, LOCAL_RANK) → rank
        type Row<'a> = (Option<&'a str>, Option<&'a str>, Option<&'a str>, Option<Rank>);
        let table: [Row; 8] = [
            (Some("1"), Some("2"), Some("1"), Some(Rank { rank: 1, local_rank: 1, world_size: 2 })),
            (Some("3"), Some("8"), Some("1"), Some(Rank { rank: 3, local_rank: 1, world_size: 8 })),
            // No LOCAL_RANK: the rank.
            (Some(" 0 "), Some("2"), None, Some(Rank { rank: 0, local_rank: 0, world_size: 2 })),
            // A launcher's own process, or no launcher.
            (None, Some("2"), None, None),
            (Some("0"), None, None, None),
            // Hostile or damaged values.
            (Some("2"), Some("2"), None, None),
            (Some("-1"), Some("2"), None, None),
            (Some("0"), Some("99999999999"), None, None),
        ];
        for (rank, world, local, want) in table {
            let got = Rank::from_vars(|k| match k {
                "RANK" => rank.map(String::from),
                "WORLD_SIZE" => world.map(String::from),
                "LOCAL_RANK" => local.map(String::from),
                _ => None,
            });
            assert_eq!(got, want, "{rank:?} {world:?} {local:?}");
        }
    }
}
