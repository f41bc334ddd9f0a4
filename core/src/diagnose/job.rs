//! A training job on several nodes: the straggler verdict of its ranks ([`super::ranks`])
//! carried to the machine the straggler runs on. Pure: the verdict and each node's facts in,
//! evidence and advice added.
//!
//! # The rule
//! When one rank's input pipeline sets the job's pace, and every rank of its node waits for
//! data longer than every rank of the other nodes (by [`STRAGGLER_MIN_MS`] at least), the node
//! is the cause: it is set against the others, first difference found:
//! 1. its data on a network or FUSE file system while another node reads from a local one;
//! 2. fewer cores than every other node;
//! 3. its CPUs busier than every other node's by [`BUSIER_CPU_PTS`] points or more
//!    (other programs on it, or more work);
//!
//! else none of these, said so. When a rank of the same node waits no longer than the other
//! nodes' ranks, the cause is the straggler's own (its shard, its transforms), not its node.
//! When no rank sets the pace and every rank waits for data
//! [`HIGH_WAIT_SHARE`] of its step or more, the job's input pipeline as a whole is the limit:
//! every node alike.

use super::ranks::{Cause, RanksVerdict, RANK_MIN_STEPS, STRAGGLER_MIN_MS};
use super::thresholds::HIGH_WAIT_SHARE;
use crate::aggregate::ranks::RankLine;
use crate::aggregate::Summary;
use crate::units::pct;

/// Points of machine CPU by which the straggler's node must be busier than every other.
pub const BUSIER_CPU_PTS: f32 = 20.0;

/// What the rule reads of one node: its summary's machine and data.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeFacts {
    pub name: String,
    pub cores: usize,
    /// The whole machine's mean CPU, %.
    pub cpu_pct: Option<f32>,
    /// The data folder's file system, when found.
    pub data_fs: Option<probes::fsinfo::FsInfo>,
}

impl NodeFacts {
    /// A node's facts from its summary; `None` for a summary that names no node.
    pub fn of(s: &Summary) -> Option<NodeFacts> {
        let node = s.settings.node.as_ref()?;
        Some(NodeFacts {
            name: node.name.clone(),
            cores: s.machine.cores,
            cpu_pct: s.machine.global_cpu_mean_pct,
            data_fs: s.data_fs.clone(),
        })
    }
}

/// `v` with what its straggler's node shows against the others (see the module docs), and
/// the job-wide input limit when no rank sets the pace.
pub fn on_nodes(mut v: RanksVerdict, lines: &[RankLine], nodes: &[NodeFacts]) -> RanksVerdict {
    if v.straggler.is_none() {
        let judged = lines.iter().filter(|l| l.steps > 0);
        if nodes.len() > 1 && judged.clone().count() > 1 && judged.clone().all(|l| l.wait_share >= HIGH_WAIT_SHARE) {
            let least = judged.map(|l| l.wait_share).fold(f64::INFINITY, f64::min);
            v.evidence.push(format!(
                "every rank on every node waits for data {} of its step or more: the job's input pipeline as a whole \
                 is the limit, on all {} nodes alike",
                pct(least),
                nodes.len()
            ));
            v.advice.push(
                "apply each node's own verdict (`pipeprof report` on a node's summary): they share the cause".into(),
            );
        }
        return v;
    }
    let (Some(name), Some(Cause::Input), Some(rank)) = (v.node.clone(), v.cause, v.straggler) else { return v };
    let Some(me) = nodes.iter().find(|n| n.name == name) else { return v };
    let others: Vec<&NodeFacts> = nodes.iter().filter(|n| n.name != name).collect();
    if others.is_empty() {
        return v;
    }
    let judged = lines.iter().filter(|l| l.steps >= RANK_MIN_STEPS);
    let on = |l: &&RankLine| l.node.as_deref() == Some(name.as_str());
    let elsewhere = judged.clone().filter(|l| !on(l)).map(|l| l.wait_ms).reduce(f64::max);
    let calm = judged
        .filter(|l| on(l) && l.rank != rank)
        .find(|l| elsewhere.is_some_and(|e| l.wait_ms < e + STRAGGLER_MIN_MS));
    if let (Some(sib), Some(e)) = (calm, elsewhere) {
        v.evidence.push(format!(
            "rank {} on node {name} waits {:.1} ms per step for data, as the other nodes' ranks do (at most {e:.1} ms): \
             the cause is rank {rank}'s own (its shard, its transforms), not node {name}",
            sib.rank, sib.wait_ms
        ));
        return v;
    }
    let (evidence, advice) = node_difference(me, &others);
    v.evidence.push(evidence);
    v.advice.extend(advice);
    v
}

/// The first difference of `me` from every node of `others` (see the module docs), as
/// evidence and advice.
fn node_difference(me: &NodeFacts, others: &[&NodeFacts]) -> (String, Option<String>) {
    let n = &me.name;
    if let Some(fs) = me.data_fs.as_ref().filter(|f| f.kind.is_remote_or_fuse()) {
        let local = others
            .iter()
            .find_map(|o| o.data_fs.as_ref().filter(|f| !f.kind.is_remote_or_fuse()).map(|f| (&o.name, f)));
        if let Some((other, local)) = local {
            let from = fs.source.as_ref().map(|s| format!(", {s}")).unwrap_or_default();
            return (
                format!(
                    "node {n} reads its data from a {} file system ({}{from}), node {other} from a {} one ({})",
                    fs.kind, fs.fs_type, local.kind, local.fs_type
                ),
                Some(format!("on node {n}: copy the data set to a local disk, as the other nodes have it")),
            );
        }
    }
    let fewest = others.iter().map(|o| o.cores).min().unwrap_or(0);
    if me.cores > 0 && me.cores < fewest {
        return (
            format!("node {n} has {} cores, every other node {fewest} or more", me.cores),
            Some(format!(
                "on node {n}: fewer ranks or DataLoader workers, so each worker has a core, or a node like the others"
            )),
        );
    }
    let busiest_other = others.iter().filter_map(|o| o.cpu_pct).reduce(f32::max);
    if let (Some(mine), Some(theirs)) = (me.cpu_pct, busiest_other) {
        if mine >= theirs + BUSIER_CPU_PTS {
            return (
                format!("node {n}'s CPUs are {mine:.0}% busy, the other nodes' {theirs:.0}% at most"),
                Some(format!(
                    "on node {n}: find what else runs there (`pipeprof report` on its summary names other programs)"
                )),
            );
        }
    }
    (
        format!("node {n} shows no storage, core or CPU difference from the others: look at its ranks' shards and transforms"),
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cores: usize, cpu: f32, fs: Option<(&str, bool)>) -> NodeFacts {
        use probes::fsinfo::{FsInfo, FsKind};
        let data_fs = fs.map(|(t, remote)| FsInfo {
            fs_type: t.into(),
            kind: if remote { FsKind::Fuse } else { FsKind::Local },
            mount_point: None,
            source: remote.then(|| "slowfs".into()),
            magic: None,
        });
        NodeFacts { name: name.into(), cores, cpu_pct: Some(cpu), data_fs }
    }

    fn straggling(node: &str) -> RanksVerdict {
        RanksVerdict {
            straggler: Some(3),
            node: Some(node.into()),
            cause: Some(Cause::Input),
            synchronised: true,
            headline: String::new(),
            evidence: vec![],
            advice: vec![],
            sync: super::super::ranks::SyncSource::Inferred,
            sync_wait_ms: vec![],
        }
    }

    #[test]
    fn the_straggler_node_is_set_against_the_others_first_difference_first() {
        let ext4 = Some(("ext4", false));
        let fuse = Some(("fuse.slowfs", true));
        let table: Vec<(Vec<NodeFacts>, &str)> = vec![
            (
                vec![node("a", 8, 30.0, ext4), node("b", 8, 30.0, fuse)],
                "node b reads its data from a FUSE file system (fuse.slowfs, slowfs), node a from a local one (ext4)",
            ),
            // Every node on the same network file system: not a difference.
            (vec![node("a", 8, 30.0, fuse), node("b", 8, 30.0, fuse)], "node b shows no storage"),
            (vec![node("a", 8, 30.0, ext4), node("b", 4, 30.0, ext4)], "node b has 4 cores, every other node 8"),
            (vec![node("a", 8, 30.0, ext4), node("b", 8, 55.0, ext4)], "node b's CPUs are 55% busy"),
            (vec![node("a", 8, 30.0, ext4), node("b", 8, 45.0, ext4)], "node b shows no storage"),
        ];
        // Node b's ranks 2 and 3 both wait longer than node a's: the node is the cause.
        let line = |rank, node: &str, wait_ms| RankLine {
            rank,
            node: Some(node.into()),
            steps: 20,
            wait_ms,
            ..Default::default()
        };
        let lines = [line(0, "a", 4.0), line(1, "a", 4.0), line(2, "b", 40.0), line(3, "b", 60.0)];
        for (nodes, want) in table {
            let v = on_nodes(straggling("b"), &lines, &nodes);
            assert!(v.evidence.last().is_some_and(|e| e.starts_with(want)), "{nodes:?}: {:?}", v.evidence);
        }
        // A node the files do not describe, or one node alone: nothing added.
        assert!(on_nodes(straggling("c"), &lines, &[node("a", 8, 30.0, ext4)]).evidence.is_empty());
        assert!(on_nodes(straggling("b"), &lines, &[node("b", 8, 30.0, fuse)]).evidence.is_empty());
        // Rank 2 on node b waits like node a's ranks: rank 3's own cause, whatever node b's storage.
        let alone = [line(0, "a", 4.0), line(1, "a", 4.0), line(2, "b", 4.5), line(3, "b", 60.0)];
        let v = on_nodes(straggling("b"), &alone, &[node("a", 8, 30.0, ext4), node("b", 8, 30.0, fuse)]);
        assert_eq!(v.evidence.len(), 1, "{:?}", v.evidence);
        assert!(v.evidence[0].starts_with("rank 2 on node b waits 4.5 ms per step for data"), "{:?}", v.evidence);
        assert!(
            v.evidence[0].ends_with("the cause is rank 3's own (its shard, its transforms), not node b"),
            "{:?}",
            v.evidence
        );
        assert!(v.advice.is_empty(), "{:?}", v.advice);
    }

    #[test]
    fn every_node_waiting_alike_is_the_jobs_input_pipeline() {
        let line = |rank, wait_share| RankLine { rank, steps: 20, wait_share, ..Default::default() };
        let nodes = [node("a", 8, 30.0, None), node("b", 8, 30.0, None)];
        let none = RanksVerdict { straggler: None, node: None, cause: None, ..straggling("b") };
        let v = on_nodes(none.clone(), &[line(0, 0.4), line(1, 0.5)], &nodes);
        assert!(v.evidence[0].contains("the job's input pipeline as a whole"), "{:?}", v.evidence);
        let v = on_nodes(none, &[line(0, 0.4), line(1, 0.1)], &nodes);
        assert!(v.evidence.is_empty(), "{:?}", v.evidence);
    }
}
