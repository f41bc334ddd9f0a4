//! The ranks of a distributed run kept apart: one aggregate per rank, fed the events its
//! processes sent ([`Event::Ranked`]), and one line per rank for the views and the straggler
//! verdict. Pure, like the rest of `aggregate`.

pub use super::summary::RankLine;

use super::machine::MachineSummary;
use super::{Aggregator, RunSettings, Summary};
use probes::{Event, Rank, Stage};
use std::collections::BTreeMap;

/// Ranks with their own statistics; events of later ones count for the run only (bounded
/// memory: each rank holds a whole aggregate).
pub const MAX_RANKS: usize = 64;

impl RankLine {
    /// The line for `rank` from that rank's own summary; the GPU from the run's machine
    /// summary (the device numbered like the local rank).
    pub fn of(rank: Rank, s: &Summary, machine: &MachineSummary) -> RankLine {
        let sp = &s.split;
        let backward = s.stages.iter().find(|x| x.is(Stage::Backward) && x.count > 0).map(|x| x.mean_ms);
        let gpu = machine.devices.iter().find(|d| d.index == rank.local_rank).and_then(|d| d.util_mean_pct);
        RankLine {
            rank: rank.rank,
            node: s.settings.node.as_ref().map(|n| n.name.clone()),
            local_rank: rank.local_rank,
            world_size: rank.world_size,
            steps: s.steps,
            images: s.images,
            images_per_s: s.images_per_s,
            step_ms: sp.mean_step_ms,
            wait_ms: sp.wait_ms,
            wait_share: sp.wait_share,
            transfer_ms: sp.transfer_ms,
            compute_ms: sp.compute_ms,
            backward_ms: backward,
            loader_busy: s.loader_busy,
            workers: s.settings.workers,
            batch_size: s.settings.batch_size,
            gpu_util_pct: gpu,
            stages: s.stages.clone(),
            failed: s.failed.clone(),
        }
    }

    /// The rank this line is of.
    pub fn id(&self) -> Rank {
        Rank { rank: self.rank, local_rank: self.local_rank, world_size: self.world_size }
    }
}

/// The nodes `lines` name (ranks of a run that knew its node), each once.
pub fn nodes_of<'a>(lines: impl IntoIterator<Item = &'a RankLine>) -> std::collections::BTreeSet<&'a str> {
    lines.into_iter().filter_map(|l| l.node.as_deref()).collect()
}

/// One aggregate per rank seen.
pub struct Ranks {
    settings: RunSettings,
    by_rank: BTreeMap<u32, (Rank, Aggregator)>,
    /// Events of ranks past [`MAX_RANKS`] (counted for the run only).
    pub unlisted: u64,
}

impl Ranks {
    /// Ranks whose aggregates start from `settings` (the run's: cores, program).
    pub fn new(settings: RunSettings) -> Ranks {
        Ranks { settings, by_rank: BTreeMap::new(), unlisted: 0 }
    }

    /// Counts `ev` for `rank`.
    pub fn push(&mut self, rank: Rank, ev: &Event) {
        if matches!(ev, Event::Ranked(..)) {
            return;
        }
        let full = self.by_rank.len() >= MAX_RANKS;
        match self.by_rank.get_mut(&rank.rank) {
            Some((_, a)) => a.push(ev),
            None if full => self.unlisted += 1,
            None => {
                let mut a = Aggregator::new(self.settings.clone());
                a.push(ev);
                self.by_rank.insert(rank.rank, (rank, a));
            }
        }
    }

    /// Each rank's summary, by rank.
    pub fn summaries(&self) -> Vec<(Rank, Summary)> {
        self.by_rank.values().map(|(r, a)| (*r, a.summary())).collect()
    }

    /// One line per rank, by rank.
    pub fn lines(&self, machine: &MachineSummary) -> Vec<RankLine> {
        self.by_rank.values().map(|(r, a)| RankLine::of(*r, &a.summary(), machine)).collect()
    }

    /// Ranks seen.
    pub fn len(&self) -> usize {
        self.by_rank.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_rank.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use probes::{SpanRecord, StepRecord, NONE};

    fn span(stage: Stage, step: u64, start_ms: u64, dur_ms: u64) -> Event {
        Event::Span(SpanRecord {
            stage,
            thread: 1,
            start_ns: start_ms * 1_000_000,
            dur_ns: dur_ms * 1_000_000,
            cpu_ns: NONE,
            queue_ns: NONE,
            step,
            sample: NONE,
            bytes: NONE,
        })
    }

    fn step(k: u64, end_ms: u64) -> Event {
        Event::Step(StepRecord {
            no_loss: false,
            step: k,
            epoch: 0,
            images: 8,
            loss: 1.0,
            correct: 0,
            end_ns: end_ms * 1_000_000,
            queued: 0,
            validation: false,
        })
    }

    /// `steps` steps of `wait_ms` + `compute_ms` each.
    fn rank_steps(steps: u64, wait_ms: u64, compute_ms: u64) -> Vec<Event> {
        let mut t = 0;
        let mut v = Vec::new();
        for k in 0..steps {
            v.push(span(Stage::Wait, k, t, wait_ms));
            t += wait_ms;
            v.push(span(Stage::Compute, k, t, compute_ms));
            t += compute_ms;
            v.push(step(k, t));
        }
        v
    }

    #[test]
    fn ranked_events_count_for_the_run_and_for_their_rank_only() {
        let mut a = Aggregator::new(RunSettings::default());
        let r0 = Rank { rank: 0, local_rank: 0, world_size: 2 };
        let r1 = Rank { rank: 1, local_rank: 1, world_size: 2 };
        for ev in rank_steps(10, 2, 8) {
            a.push(&Event::Ranked(r0, Box::new(ev)));
        }
        for ev in rank_steps(10, 6, 4) {
            a.push(&Event::Ranked(r1, Box::new(ev)));
        }
        let s = a.summary();
        assert_eq!(s.steps, 20, "the run counts both ranks' steps");
        assert_eq!(s.ranks.len(), 2);
        let (l0, l1) = (&s.ranks[0], &s.ranks[1]);
        assert_eq!((l0.rank, l0.steps, l1.rank, l1.steps), (0, 10, 1, 10));
        assert!((l0.wait_ms - 2.0).abs() < 1e-9 && (l1.wait_ms - 6.0).abs() < 1e-9, "{l0:?} {l1:?}");
        assert!((l0.step_ms - 10.0).abs() < 1e-9 && (l1.step_ms - 10.0).abs() < 1e-9);
        assert!((l1.wait_share - 0.6).abs() < 1e-9);
        assert_eq!(l0.backward_ms, None);
        // A run without ranks has no lines (and writes none).
        let mut plain = Aggregator::new(RunSettings::default());
        for ev in rank_steps(5, 1, 1) {
            plain.push(&ev);
        }
        assert!(plain.summary().ranks.is_empty());
        let json = serde_json::to_value(plain.summary()).expect("serialises");
        assert!(json.get("ranks").is_none());
    }

    #[test]
    fn a_ranks_gpu_is_the_device_numbered_like_its_local_rank() {
        use crate::aggregate::machine::gpu::DeviceSummary;
        let dev = |index, util| DeviceSummary { index, util_mean_pct: util, ..Default::default() };
        let machine = MachineSummary { devices: vec![dev(0, Some(90.0)), dev(1, Some(35.0))], ..Default::default() };
        let s = Summary::default();
        // Rank 3 of a two-machine run is the second GPU of its machine.
        let l = RankLine::of(Rank { rank: 3, local_rank: 1, world_size: 4 }, &s, &machine);
        assert_eq!((l.rank, l.gpu_util_pct), (3, Some(35.0)));
        let l = RankLine::of(Rank { rank: 2, local_rank: 2, world_size: 4 }, &s, &machine);
        assert_eq!(l.gpu_util_pct, None, "no such device here");
    }

    #[test]
    fn ranks_are_bounded_and_nesting_is_ignored() {
        let mut r = Ranks::new(RunSettings::default());
        for k in 0..(MAX_RANKS as u32 + 5) {
            r.push(Rank { rank: k, local_rank: 0, world_size: 1 << 16 }, &step(0, 1));
        }
        assert_eq!((r.len(), r.unlisted), (MAX_RANKS, 5));
        let r0 = Rank { rank: 0, local_rank: 0, world_size: 2 };
        r.push(r0, &Event::Ranked(r0, Box::new(step(1, 2))));
        assert_eq!(r.summaries()[0].1.steps, 1, "a nested event is not counted");
    }
}
