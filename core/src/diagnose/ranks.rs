//! The straggler verdict of a distributed run: which rank sets the pace, with evidence and
//! advice for that rank. Pure: per-rank lines in, a verdict out. [`decide`] reads the numbers
//! into a typed [`Decision`]; [`Decision::verdict`] puts it into words.
//!
//! # The rule
//! Ranks that synchronise every step (PyTorch DDP: the gradients' all-reduce ends every
//! backward pass) all take the slowest rank's time: the fast ones wait in the all-reduce, so
//! every rank looks busy. The ranks step together when their mean step times are within
//! [`SYNC_STEP_SPREAD`] of each other.
//!
//! 1. Fewer than two ranks with [`RANK_MIN_STEPS`] steps: no verdict.
//! 2. Not stepping together: the rank with the longest mean step is the slowest (no
//!    all-reduce wait is claimed).
//! 3. Stepping together, and the ranks' waits for their next batch differ by at least
//!    [`STRAGGLER_MIN_MS`] and [`STRAGGLER_STEP_SHARE`] of the step: the rank that waits longest
//!    for data is the straggler (cause: its input pipeline).
//! 4. Stepping together, the all-reduce wait measured, and it differs across the ranks by as
//!    much: the rank that waits least in the all-reduce is the one the others wait for (cause:
//!    its compute).
//! 5. Otherwise the ranks keep pace: no straggler.
//!
//! # The all-reduce wait
//! Measured where the program's hooks timed a `backward` span per step (`pipeprof run`'s torch
//! hooks do under `torch.distributed`: DDP reduces the gradients inside `backward()` and waits
//! for the last bucket before it returns): a rank's wait is its mean backward minus the
//! shortest rank's, the compute being the same model on the same batch size. Without it (or
//! when the backward spans hold no sync: their spread is under a quarter of the data waits'),
//! it is inferred from the step times: ranks that step together spend the difference between
//! the longest data wait and their own waiting for the others. The verdict says which.

use crate::aggregate::ranks::RankLine;
use crate::units::pct;
use serde::{Deserialize, Serialize};

/// Steps a rank needs before it is judged.
pub const RANK_MIN_STEPS: u64 = 5;
/// Ranks whose mean step times are within this share of each other step together.
pub const SYNC_STEP_SPREAD: f64 = 0.25;
/// Least difference of per-step waits (data or all-reduce) that names a straggler, ms.
pub const STRAGGLER_MIN_MS: f64 = 1.0;
/// … and as a share of the mean step.
pub const STRAGGLER_STEP_SHARE: f64 = 0.10;
/// Below this share of the data waits' spread, the backward spans' spread holds no sync.
const MEASURED_SYNC_SHARE: f64 = 0.25;

/// What makes the straggler slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Cause {
    /// Its input pipeline: it waits for its batches while the others wait for it.
    Input,
    /// Its compute: the others wait for it in the all-reduce while it does not.
    Compute,
    /// The ranks do not step together; this one is the slowest.
    Slowest,
}

/// How the all-reduce wait was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum SyncSource {
    /// From `backward` spans around DDP's gradient sync.
    Measured,
    /// From the ranks' data waits (ranks that step together).
    Inferred,
    /// The ranks do not step together: no all-reduce wait.
    None,
}

/// The verdict on a run's ranks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RanksVerdict {
    /// The rank that sets the pace, when one does.
    pub straggler: Option<u32>,
    /// The straggler's node, when the ranks ran on several (a job's files from each node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub cause: Option<Cause>,
    /// Whether the ranks step together.
    pub synchronised: bool,
    /// One line.
    pub headline: String,
    pub evidence: Vec<String>,
    /// For the straggler.
    pub advice: Vec<String>,
    pub sync: SyncSource,
    /// Each judged rank's wait in the all-reduce per step, ms: (rank, ms).
    pub sync_wait_ms: Vec<(u32, f64)>,
}

/// Who sets the pace, and why: the rule's outcome, before any words.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pace<'a> {
    /// The ranks do not step together: `slow` has the longest mean step, `fast` the shortest;
    /// `waiting_for_data`: `slow` waits for data a larger share of its step than `fast` by at
    /// least [`STRAGGLER_STEP_SHARE`] (else it is computing).
    Apart { slow: &'a RankLine, fast: &'a RankLine, waiting_for_data: bool },
    /// `straggler`'s input pipeline: it waits longest for data, `spread_ms` per step more than
    /// the rank that waits least; `in_all_reduce`, the other rank that waits least for data,
    /// spends the difference in the all-reduce.
    Input { straggler: &'a RankLine, in_all_reduce: Option<&'a RankLine>, spread_ms: f64 },
    /// `straggler`'s compute: it waits least in the measured all-reduce, the others up to
    /// `most_sync_ms` per step.
    Compute { straggler: &'a RankLine, most_sync_ms: f64 },
    /// No straggler: the ranks keep pace.
    Together,
}

/// The straggler decision and what it rests on: the ranks judged, the least and most
/// waiting for data, and each rank's all-reduce wait with how it was found.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision<'a> {
    pub pace: Pace<'a>,
    /// The ranks judged (at least two), in the order given.
    pub ranks: Vec<&'a RankLine>,
    /// The ranks that wait least and most for data (the first of equals).
    pub least: &'a RankLine,
    pub most: &'a RankLine,
    pub sync: SyncSource,
    /// Each judged rank's wait in the all-reduce per step, ms: (rank, ms); empty for
    /// [`SyncSource::None`].
    pub sync_wait_ms: Vec<(u32, f64)>,
    /// The ranks ran on more than one node: the words name each rank's node.
    pub across_nodes: bool,
}

/// Judges the ranks; `None` with fewer than two ranks of [`RANK_MIN_STEPS`] steps.
pub fn judge(lines: &[RankLine]) -> Option<RanksVerdict> {
    decide(lines).map(|d| d.verdict())
}

/// The rank with the largest (`max`) or the smallest `f`; ties go to the first (the lower
/// rank, as the lines come).
fn pick<'a>(ranks: &[&'a RankLine], f: impl Fn(&RankLine) -> f64, max: bool) -> Option<&'a RankLine> {
    ranks.iter().copied().reduce(|a, b| {
        let (x, y) = (f(a), f(b));
        if (max && y > x) || (!max && y < x) {
            b
        } else {
            a
        }
    })
}

/// Each rank's all-reduce wait per step, in the ranks' order: measured from the backward
/// spans when every rank has them and their spread holds the sync (at least
/// [`MEASURED_SYNC_SHARE`] of the data waits' `data_spread`), else inferred from the data
/// waits (`most_wait_ms` less each rank's).
fn sync_waits(ranks: &[&RankLine], most_wait_ms: f64, data_spread: f64) -> (SyncSource, Vec<f64>) {
    let backward: Option<Vec<f64>> = ranks.iter().map(|l| l.backward_ms).collect();
    let measured = backward.and_then(|b| {
        let min = b.iter().copied().fold(f64::INFINITY, f64::min);
        let waits: Vec<f64> = b.iter().map(|x| x - min).collect();
        let spread = waits.iter().copied().fold(0.0, f64::max);
        (spread >= MEASURED_SYNC_SHARE * data_spread).then_some(waits)
    });
    match measured {
        Some(w) => (SyncSource::Measured, w),
        None => (SyncSource::Inferred, ranks.iter().map(|l| most_wait_ms - l.wait_ms).collect()),
    }
}

/// The rule (see the module docs), on the ranks with [`RANK_MIN_STEPS`] steps and a
/// measured step; `None` with fewer than two. Pure.
pub fn decide(lines: &[RankLine]) -> Option<Decision<'_>> {
    let ranks: Vec<&RankLine> =
        lines.iter().filter(|l| l.steps >= RANK_MIN_STEPS && l.step_ms.is_finite() && l.step_ms > 0.0).collect();
    if ranks.len() < 2 {
        return None;
    }
    let (slow, fast) = (pick(&ranks, |l| l.step_ms, true)?, pick(&ranks, |l| l.step_ms, false)?);
    let (most, least) = (pick(&ranks, |l| l.wait_ms, true)?, pick(&ranks, |l| l.wait_ms, false)?);
    if slow.step_ms > fast.step_ms * (1.0 + SYNC_STEP_SPREAD) {
        let waiting_for_data = slow.wait_share > fast.wait_share + STRAGGLER_STEP_SHARE;
        let pace = Pace::Apart { slow, fast, waiting_for_data };
        return Some(Decision {
            pace,
            across_nodes: across_nodes(&ranks),
            ranks,
            least,
            most,
            sync: SyncSource::None,
            sync_wait_ms: vec![],
        });
    }
    let mean_step = ranks.iter().map(|l| l.step_ms).sum::<f64>() / ranks.len() as f64;
    let matters = |d: f64| d >= STRAGGLER_MIN_MS && d >= STRAGGLER_STEP_SHARE * mean_step;
    let data_spread = most.wait_ms - least.wait_ms;
    let (sync, waits) = sync_waits(&ranks, most.wait_ms, data_spread);
    let sync_wait_ms: Vec<(u32, f64)> = ranks.iter().zip(&waits).map(|(l, w)| (l.rank, *w)).collect();
    let (lo, hi) = waits.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), w| (lo.min(*w), hi.max(*w)));
    let pace = if matters(data_spread) {
        let others: Vec<&RankLine> = ranks.iter().copied().filter(|l| l.rank != most.rank).collect();
        Pace::Input { straggler: most, in_all_reduce: pick(&others, |l| l.wait_ms, false), spread_ms: data_spread }
    } else if sync == SyncSource::Measured && matters(hi - lo) {
        let pair = ranks.iter().zip(&waits).reduce(|a, b| if b.1 < a.1 { b } else { a });
        Pace::Compute { straggler: pair.map(|(l, _)| *l)?, most_sync_ms: hi }
    } else {
        Pace::Together
    };
    Some(Decision { pace, across_nodes: across_nodes(&ranks), ranks, least, most, sync, sync_wait_ms })
}

/// Whether the ranks name more than one node.
fn across_nodes(ranks: &[&RankLine]) -> bool {
    crate::aggregate::ranks::nodes_of(ranks.iter().copied()).len() > 1
}

impl Decision<'_> {
    /// The decision in words: the headline, the evidence and the advice for the straggler.
    pub fn verdict(&self) -> RanksVerdict {
        let (straggler, cause) = match self.pace {
            Pace::Apart { slow, .. } => (Some(slow.rank), Some(Cause::Slowest)),
            Pace::Input { straggler, .. } => (Some(straggler.rank), Some(Cause::Input)),
            Pace::Compute { straggler, .. } => (Some(straggler.rank), Some(Cause::Compute)),
            Pace::Together => (None, None),
        };
        let node = match self.pace {
            Pace::Apart { slow: s, .. } | Pace::Input { straggler: s, .. } | Pace::Compute { straggler: s, .. } => {
                s.node.clone().filter(|_| self.across_nodes)
            }
            Pace::Together => None,
        };
        RanksVerdict {
            straggler,
            node,
            cause,
            synchronised: !matches!(self.pace, Pace::Apart { .. }),
            headline: self.headline(),
            evidence: self.evidence(),
            advice: self.advice(),
            sync: self.sync,
            sync_wait_ms: self.sync_wait_ms.clone(),
        }
    }

    /// A rank as the words name it: `rank 3`, or `rank 3 on node b` across nodes.
    fn who(&self, l: &RankLine) -> String {
        match l.node.as_deref().filter(|_| self.across_nodes) {
            Some(n) => format!("rank {} on node {n}", l.rank),
            None => format!("rank {}", l.rank),
        }
    }

    /// `rank`'s all-reduce wait per step, ms (0 where not known).
    fn sync_of(&self, rank: u32) -> f64 {
        self.sync_wait_ms.iter().find(|(r, _)| *r == rank).map_or(0.0, |(_, w)| *w)
    }

    /// How the all-reduce wait was found, for the evidence.
    fn how(&self) -> &'static str {
        match self.sync {
            SyncSource::Measured => {
                "measured: its backward pass, which holds DDP's gradient all-reduce, is that much longer"
            }
            _ => "inferred: the ranks step together, so the difference in data wait is spent waiting for the others",
        }
    }

    fn headline(&self) -> String {
        match self.pace {
            Pace::Apart { slow, fast, .. } => format!(
                "{} is the slowest: {:.1} ms per step against {:.1} ms on {} (the ranks do not step together)",
                self.who(slow),
                slow.step_ms,
                fast.step_ms,
                self.who(fast)
            ),
            Pace::Input { straggler: s, .. } => format!(
                "{}'s input pipeline sets the pace: it waits for data {} of each step, the other ranks wait for it",
                self.who(s),
                pct(s.wait_share)
            ),
            Pace::Compute { straggler: s, .. } => {
                format!("{}'s compute sets the pace: the other ranks wait for it in the all-reduce", self.who(s))
            }
            Pace::Together => format!(
                "no straggler: the ranks keep pace (data wait {} to {} of each step)",
                pct(self.least.wait_share),
                pct(self.most.wait_share)
            ),
        }
    }

    fn evidence(&self) -> Vec<String> {
        match self.pace {
            Pace::Apart { slow, fast, waiting_for_data } => vec![
                format!(
                    "{} spends {} of its steps {} ({:.1} ms of {:.1} ms wait for data); {} {}",
                    self.who(slow),
                    pct(if waiting_for_data { slow.wait_share } else { 1.0 - slow.wait_share }),
                    if waiting_for_data { "waiting for data" } else { "computing" },
                    slow.wait_ms,
                    slow.step_ms,
                    self.who(fast),
                    pct(fast.wait_share)
                ),
                "the ranks' step times differ by more than a synchronised run allows: no all-reduce wait is claimed"
                    .to_string(),
            ],
            Pace::Input { straggler, in_all_reduce, .. } => self.input_evidence(straggler, in_all_reduce),
            Pace::Compute { straggler: s, most_sync_ms } => vec![
                format!(
                    "data waits are alike ({} to {} of each step)",
                    pct(self.least.wait_share),
                    pct(self.most.wait_share)
                ),
                format!(
                    "{} waits least in the all-reduce ({:.1} ms per step), the others up to {most_sync_ms:.1} ms ({})",
                    self.who(s),
                    self.sync_of(s.rank),
                    self.how()
                ),
            ],
            Pace::Together => vec![],
        }
    }

    /// The straggler's data wait against the others', who waits in the all-reduce, and its
    /// loader where the rank reported one.
    fn input_evidence(&self, s: &RankLine, in_all_reduce: Option<&RankLine>) -> Vec<String> {
        let others: Vec<String> = self
            .ranks
            .iter()
            .filter(|l| l.rank != s.rank)
            .map(|l| format!("{} {}", self.who(l), pct(l.wait_share)))
            .collect();
        let mut evidence = vec![format!(
            "{} waits for data {} of each step ({:.1} ms of {:.1} ms), {}",
            self.who(s),
            pct(s.wait_share),
            s.wait_ms,
            s.step_ms,
            others.join(", ")
        )];
        if let Some(w) = in_all_reduce {
            evidence.push(format!(
                "{} spends the difference waiting in the all-reduce: {:.1} ms per step ({})",
                self.who(w),
                self.sync_of(w.rank),
                self.how()
            ));
        }
        if s.workers > 0 || s.loader_busy > 0.0 {
            evidence.push(format!(
                "{}'s loader: {} worker{}, busy {}",
                self.who(s),
                s.workers,
                if s.workers == 1 { "" } else { "s" },
                pct(s.loader_busy)
            ));
        }
        evidence
    }

    fn advice(&self) -> Vec<String> {
        match self.pace {
            Pace::Apart { slow, .. } => vec![format!(
                "if the ranks should step together (DDP), check that {} trains the same model on the same batch size",
                self.who(slow)
            )],
            Pace::Input { straggler: s, spread_ms, .. } => vec![
                format!(
                    "speed up {}'s input pipeline: every rank's step would shrink by up to {spread_ms:.1} ms ({}), as the \
                     others stop waiting for it",
                    self.who(s),
                    pct(spread_ms / s.step_ms.max(f64::MIN_POSITIVE))
                ),
                format!(
                    "on {}: more DataLoader workers (now {}), or find what makes its data slower (its shard's files, \
                     storage, a transform only it runs); with a DistributedSampler, check that the shards are alike",
                    self.who(s), s.workers
                ),
            ],
            Pace::Compute { straggler: s, .. } => vec![format!(
                "look at {}'s device (GPU {}: its clocks, another process on it) and at anything only it computes",
                self.who(s), s.local_rank
            )],
            Pace::Together => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(rank: u32, wait_ms: f64, compute_ms: f64, backward_ms: Option<f64>) -> RankLine {
        let step = wait_ms + compute_ms;
        RankLine {
            rank,
            local_rank: rank,
            world_size: 2,
            steps: 20,
            step_ms: step,
            wait_ms,
            wait_share: wait_ms / step,
            compute_ms,
            backward_ms,
            workers: 2,
            ..Default::default()
        }
    }

    #[test]
    fn ranks_of_one_node_read_as_ranks_of_no_node_and_nodes_are_named_only_across_several() {
        let plain = vec![line(0, 6.0, 94.0, None), line(1, 41.0, 59.0, None)];
        let on = |node: &str, mut l: RankLine| {
            l.node = Some(node.into());
            l
        };
        let one: Vec<RankLine> = plain.iter().cloned().map(|l| on("a", l)).collect();
        assert_eq!(judge(&one), judge(&plain), "one node: the same words, no node named");
        let two = vec![on("a", plain[0].clone()), on("b", plain[1].clone())];
        let v = judge(&two).unwrap();
        assert_eq!((v.straggler, v.node.as_deref()), (Some(1), Some("b")));
        assert!(v.headline.starts_with("rank 1 on node b's input pipeline sets the pace"), "{}", v.headline);
        assert!(v.evidence[0].ends_with("rank 0 on node a 6%"), "{:?}", v.evidence);
    }

    #[test]
    fn the_rank_that_sets_the_pace_is_named_with_how_the_sync_wait_was_found() {
        // (lines, straggler, cause, sync source, rank 0's all-reduce wait)
        type Row = (Vec<RankLine>, Option<u32>, Option<Cause>, SyncSource, f64);
        let table: Vec<Row> = vec![
            // The issue's example: rank 1 waits 41% for data, rank 0 6%, steps alike.
            (
                vec![line(0, 6.0, 94.0, None), line(1, 41.0, 59.0, None)],
                Some(1),
                Some(Cause::Input),
                SyncSource::Inferred,
                35.0,
            ),
            // The same, the all-reduce measured in rank 0's longer backward.
            (
                vec![line(0, 6.0, 94.0, Some(50.0)), line(1, 41.0, 59.0, Some(15.0))],
                Some(1),
                Some(Cause::Input),
                SyncSource::Measured,
                35.0,
            ),
            // Backward spans that hold no sync (no DDP): inferred after all.
            (
                vec![line(0, 6.0, 94.0, Some(15.0)), line(1, 41.0, 59.0, Some(15.5))],
                Some(1),
                Some(Cause::Input),
                SyncSource::Inferred,
                35.0,
            ),
            // Rank 0 is the slow one; three ranks.
            (
                vec![line(0, 30.0, 70.0, None), line(1, 2.0, 98.0, None), line(2, 3.0, 97.0, None)],
                Some(0),
                Some(Cause::Input),
                SyncSource::Inferred,
                0.0,
            ),
            // Data waits alike, rank 1 waits least in the all-reduce: its compute is slow.
            (
                vec![line(0, 2.0, 98.0, Some(60.0)), line(1, 2.0, 98.0, Some(30.0))],
                Some(1),
                Some(Cause::Compute),
                SyncSource::Measured,
                30.0,
            ),
            // Balanced.
            (vec![line(0, 2.0, 98.0, None), line(1, 2.5, 97.5, None)], None, None, SyncSource::Inferred, 0.5),
            // Not stepping together: the slowest rank, no sync claimed.
            (
                vec![line(0, 1.0, 49.0, None), line(1, 60.0, 40.0, None)],
                Some(1),
                Some(Cause::Slowest),
                SyncSource::None,
                f64::NAN,
            ),
        ];
        for (i, (lines, straggler, cause, sync, rank0_wait)) in table.into_iter().enumerate() {
            let v = judge(&lines).unwrap_or_else(|| panic!("row {i}: a verdict"));
            assert_eq!((v.straggler, v.cause, v.sync), (straggler, cause, sync), "row {i}: {v:?}");
            if rank0_wait.is_nan() {
                assert!(v.sync_wait_ms.is_empty(), "row {i}");
            } else {
                let w = v.sync_wait_ms.iter().find(|(r, _)| *r == 0).map(|x| x.1).unwrap_or(f64::NAN);
                assert!((w - rank0_wait).abs() < 1e-9, "row {i}: {w} {v:?}");
            }
            match straggler {
                Some(r) => assert!(v.headline.contains(&format!("rank {r}")), "row {i}: {}", v.headline),
                None => assert!(v.headline.starts_with("no straggler"), "row {i}"),
            }
            assert_eq!(v.advice.is_empty(), straggler.is_none(), "row {i}: advice for the straggler only");
        }
    }

    #[test]
    fn the_evidence_reads_like_the_issue_asks() {
        let v = judge(&[line(0, 6.0, 94.0, None), line(1, 41.0, 59.0, None)]).expect("a verdict");
        assert_eq!(v.evidence[0], "rank 1 waits for data 41% of each step (41.0 ms of 100.0 ms), rank 0 6%");
        assert!(v.evidence[1]
            .starts_with("rank 0 spends the difference waiting in the all-reduce: 35.0 ms per step (inferred"));
        assert!(v.advice[0].contains("35.0 ms (35%)"), "{:?}", v.advice);
    }

    #[test]
    fn too_few_ranks_or_steps_get_no_verdict() {
        assert!(judge(&[]).is_none());
        assert!(judge(&[line(0, 6.0, 94.0, None)]).is_none());
        let mut short = line(1, 41.0, 59.0, None);
        short.steps = RANK_MIN_STEPS - 1;
        assert!(judge(&[line(0, 6.0, 94.0, None), short]).is_none());
        let mut nan = line(1, 41.0, 59.0, None);
        nan.step_ms = f64::NAN;
        assert!(judge(&[line(0, 6.0, 94.0, None), nan]).is_none(), "a damaged line is not judged");
    }
}
