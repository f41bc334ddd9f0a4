//! `pipeprof report DIR` (or one trace per rank): the ranks of a distributed job as one, from
//! every node's files. A rank trace (`--trace`'s `.rankN.json`) gives its rank's line; a
//! node's summary gives the lines of its ranks and the node's machine. The straggler is
//! judged across every node's ranks and carried to its node ([`diagnose::job`]).

use super::{load, Options};
use crate::report;
use anyhow::Context;
use pipeprof_core::aggregate::ranks::RankLine;
use pipeprof_core::aggregate::Summary;
use pipeprof_core::diagnose::{self, job::NodeFacts, Diagnosed};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Most files `pipeprof report` reads as ranks of one run.
pub const MAX_RANK_FILES: usize = pipeprof_core::aggregate::ranks::MAX_RANKS;

/// Most files read from one folder (a job's shared folder: a summary and traces per node).
pub const MAX_FOLDER_FILES: usize = 4 * MAX_RANK_FILES;

/// Each folder in `paths` as the `.json` files in it (sorted; sub-folders not read), files as
/// they are.
pub fn expand(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for p in paths {
        if !p.is_dir() {
            files.push(p.clone());
            continue;
        }
        let mut found: Vec<PathBuf> = std::fs::read_dir(p)
            .with_context(|| format!("cannot read the folder {}", p.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|f| f.is_file() && f.extension().is_some_and(|e| e == "json"))
            .collect();
        if found.is_empty() {
            anyhow::bail!("{}: no .json file in it (the summaries and traces `pipeprof run` wrote)", p.display());
        }
        if found.len() > MAX_FOLDER_FILES {
            anyhow::bail!(
                "{}: {} .json files; pipeprof report reads at most {MAX_FOLDER_FILES}",
                p.display(),
                found.len()
            );
        }
        found.sort();
        files.extend(found);
    }
    Ok(files)
}

/// What one file gave the job.
enum Part {
    /// One rank's trace: its line, and the program it ran.
    Rank(Box<RankLine>, String),
    /// A node's summary: its ranks' lines and its machine.
    Node(Box<Summary>),
}

/// A file read as part of a job, or why it is not one.
fn part(p: &Path, repair: bool) -> anyhow::Result<Part> {
    let l = load(p, repair)?;
    if let Some(rank) = l.summary.rank {
        let line = RankLine::of(rank, &l.summary, &l.summary.machine);
        return Ok(Part::Rank(Box::new(line), l.summary.settings.model.to_string()));
    }
    if !l.summary.ranks.is_empty() {
        return Ok(Part::Node(Box::new(l.summary)));
    }
    anyhow::bail!(
        "{}: not part of a distributed run (no rank, no ranks): pipeprof report reads one file, two to compare, one \
         trace per rank (the .rankN.json files `pipeprof run --trace` writes), or a job's folder of them",
        p.display()
    )
}

/// The files read and what each is, the job's ranks (each once, by global rank: a node
/// summary's line before a trace's) and its nodes' summaries, from `files`.
type Gathered = (Vec<String>, Vec<RankLine>, Vec<(PathBuf, Summary)>);

fn gather(files: &[PathBuf], repair: bool) -> anyhow::Result<Gathered> {
    let mut traced: BTreeMap<u32, (RankLine, &PathBuf)> = BTreeMap::new();
    let mut nodes: Vec<(PathBuf, Summary)> = Vec::new();
    let mut read = Vec::new();
    for p in files {
        match part(p, repair)? {
            Part::Rank(l, model) => {
                if let Some((_, other)) = traced.get(&l.rank) {
                    anyhow::bail!(
                        "{} and {} are both rank {}: give each rank once",
                        other.display(),
                        p.display(),
                        l.rank
                    );
                }
                read.push(format!("rank {} = {}  ({model})", l.rank, p.display()));
                traced.insert(l.rank, (*l, p));
            }
            Part::Node(s) => {
                let name = s.settings.node.as_ref().map(|n| n.name.clone());
                let shown = name.clone().unwrap_or_else(|| "?".into());
                // A node's run trace holds what its summary does: the first file of a node counts.
                let again = name.is_some()
                    && nodes.iter().any(|(_, o)| o.settings.node.as_ref().map(|n| &n.name) == name.as_ref());
                let note = if again { ", already read" } else { "" };
                read.push(format!("node {shown} = {}  ({} ranks{note})", p.display(), s.ranks.len()));
                if !again {
                    nodes.push((p.clone(), *s));
                }
            }
        }
    }
    let mut lines: BTreeMap<u32, RankLine> = traced.into_iter().map(|(r, (l, _))| (r, l)).collect();
    for (_, s) in &nodes {
        for l in &s.ranks {
            lines.insert(l.rank, l.clone());
        }
    }
    if lines.len() > MAX_RANK_FILES {
        anyhow::bail!("{} ranks: pipeprof report reads at most {MAX_RANK_FILES} ranks at once", lines.len());
    }
    Ok((read, lines.into_values().collect(), nodes))
}

/// The ranks of a distributed run or job: their lines side by side, the straggler with its
/// node, each node's machine.
pub fn run(args: &Options) -> anyhow::Result<Option<Diagnosed>> {
    let (read, lines, nodes) = gather(&args.files, args.repair)?;
    let facts: Vec<NodeFacts> = nodes.iter().filter_map(|(_, s)| NodeFacts::of(s)).collect();
    let mut o = String::new();
    let job = nodes.iter().find_map(|(_, s)| s.settings.node.as_ref()?.job.clone());
    let title = match (&job, facts.len()) {
        (Some(j), n) if n > 1 => format!("job {j} · {} ranks on {n} nodes", lines.len()),
        (None, n) if n > 1 => format!("{} ranks on {n} nodes", lines.len()),
        _ => format!("{} ranks", lines.len()),
    };
    let _ = writeln!(o, "── pipeprof report: {title} ─────────────────────────────────────");
    for r in &read {
        let _ = writeln!(o, "{r}");
    }
    let summary = Summary { ranks: lines, ..Default::default() };
    let straggler = diagnose::ranks::judge(&summary.ranks).map(|v| diagnose::job::on_nodes(v, &summary.ranks, &facts));
    o.push_str(&report::render_ranks(&summary, straggler.as_ref()));
    if facts.len() > 1 {
        for (_, s) in &nodes {
            o.push_str(&report::render_node(s));
        }
    }
    pipeprof_trainer::progress::out(&o);
    let d = Diagnosed { summary, verdict: None, straggler };
    if let Some(p) = &args.summary {
        std::fs::write(p, serde_json::to_string_pretty(&d)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(Some(d))
}
