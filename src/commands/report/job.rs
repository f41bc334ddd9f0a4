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
    if l.summary.settings.node.is_none() && pipeprof_core::aggregate::ranks::nodes_of(&l.summary.ranks).len() > 1 {
        anyhow::bail!("{}: a job's summary (`pipeprof report DIR --summary`), not one node's run", p.display());
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

/// A node's summary added to `nodes`, unless that node is there already (its run trace repeats
/// its summary): the line that says what the file was. Refused: a file of another job, or
/// ranks another node already holds (two runs in one folder, two machines of one name).
fn add_node(nodes: &mut Vec<(PathBuf, Summary)>, p: &Path, s: Summary) -> anyhow::Result<String> {
    if let Some((other, o)) = nodes.iter().find(|(_, o)| job_of(o) != job_of(&s)) {
        anyhow::bail!(
            "{} is of job {} and {} of job {}: one job's files at a time",
            other.display(),
            job_of(o).unwrap_or("(none)"),
            p.display(),
            job_of(&s).unwrap_or("(none)")
        );
    }
    let name = s.settings.node.as_ref().map_or_else(|| "?".to_string(), |n| n.name.clone());
    let ranks: Vec<u32> = s.ranks.iter().map(|l| l.rank).collect();
    let same =
        |o: &Summary| o.settings.node == s.settings.node && o.ranks.iter().map(|l| l.rank).eq(ranks.iter().copied());
    if nodes.iter().any(|(_, o)| same(o)) {
        return Ok(format!("node {name} = {}  ({} ranks, already read)", p.display(), ranks.len()));
    }
    if let Some((other, _)) = nodes.iter().find(|(_, o)| o.ranks.iter().any(|l| ranks.contains(&l.rank))) {
        anyhow::bail!(
            "{} and {} both hold ranks of {}: two runs in one folder, or two machines of one name? \
             (`pipeprof run --node NAME` names each)",
            other.display(),
            p.display(),
            if name == "?" { "a node of no name".to_string() } else { format!("node {name}") }
        );
    }
    let line = format!("node {name} = {}  ({} ranks)", p.display(), ranks.len());
    nodes.push((p.to_path_buf(), s));
    Ok(line)
}

/// The files read and what each is, the job's ranks (each once, by global rank: a node
/// summary's line before a trace's) and its nodes' summaries, from `files`.
type Gathered = (Vec<String>, Vec<RankLine>, Vec<(PathBuf, Summary)>);

/// The job id a summary names, if any.
fn job_of(s: &Summary) -> Option<&str> {
    s.settings.node.as_ref()?.job.as_deref()
}

/// Reads `files` as one job. `from_folder`: a file that is not part of one (another tool's
/// JSON, a trace cut before its summary) is left out with a note naming it and why, rather
/// than ending the report; files named one by one must each be part of it.
fn gather(files: &[PathBuf], repair: bool, from_folder: bool) -> anyhow::Result<Gathered> {
    let mut traced: BTreeMap<u32, (RankLine, &PathBuf)> = BTreeMap::new();
    let mut nodes: Vec<(PathBuf, Summary)> = Vec::new();
    let mut read = Vec::new();
    for p in files {
        let got = match part(p, repair) {
            Err(e) if from_folder => {
                pipeprof_trainer::progress::say(&format!("pipeprof report: left out {e:#}"));
                continue;
            }
            got => got?,
        };
        match got {
            Part::Rank(l, model) => {
                if let Some((_, other)) = traced.get(&l.rank) {
                    anyhow::bail!(
                        "{} and {} are both rank {}: give each rank once (two runs in one folder?)",
                        other.display(),
                        p.display(),
                        l.rank
                    );
                }
                read.push(format!("rank {} = {}  ({model})", l.rank, p.display()));
                traced.insert(l.rank, (*l, p));
            }
            Part::Node(s) => read.push(add_node(&mut nodes, p, *s)?),
        }
    }
    let mut lines: BTreeMap<u32, RankLine> = traced.into_iter().map(|(r, (l, _))| (r, l)).collect();
    for (_, s) in &nodes {
        for l in &s.ranks {
            lines.insert(l.rank, l.clone());
        }
    }
    if lines.is_empty() {
        anyhow::bail!("no rank of a distributed run in {} files read", files.len());
    }
    if lines.len() > MAX_RANK_FILES {
        anyhow::bail!("{} ranks: pipeprof report reads at most {MAX_RANK_FILES} ranks at once", lines.len());
    }
    Ok((read, lines.into_values().collect(), nodes))
}

/// The ranks of a distributed run or job: their lines side by side, the straggler with its
/// node, each node's machine.
pub fn run(args: &Options, from_folder: bool) -> anyhow::Result<Option<Diagnosed>> {
    if !args.html().is_empty() {
        anyhow::bail!(
            "--html and --html-fragment report one run: a job's ranks have no page yet; the text, --summary or --json"
        );
    }
    let (read, lines, nodes) = gather(&args.files, args.repair, from_folder)?;
    let facts: Vec<NodeFacts> = nodes.iter().filter_map(|(_, s)| NodeFacts::of(s)).collect();
    let mut o = String::new();
    let job = nodes.iter().find_map(|(_, s)| job_of(s));
    let title = match (&job, facts.len()) {
        (Some(j), n) if n > 1 => format!("job {j} · {} ranks on {n} nodes", lines.len()),
        (None, n) if n > 1 => format!("{} ranks on {n} nodes", lines.len()),
        _ => format!("{} ranks", lines.len()),
    };
    let _ = writeln!(o, "── pipeprof report: {title} ─────────────────────────────────────");
    for r in &read {
        let _ = writeln!(o, "{r}");
    }
    let summary = Summary {
        schema_version: pipeprof_core::aggregate::SUMMARY_SCHEMA_VERSION,
        ranks: lines,
        ..Default::default()
    };
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
        super::write_summary(p, &d)?;
    }
    Ok(Some(d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipeprof_core::aggregate::SUMMARY_SCHEMA_VERSION;

    /// A node's summary file: `ranks` on node `name` of job `job`.
    fn node_file(dir: &Path, file: &str, name: Option<&str>, job: &str, ranks: &[u32]) -> PathBuf {
        let mut s = Summary { schema_version: SUMMARY_SCHEMA_VERSION, ..Default::default() };
        s.settings.node = name.map(|n| probes::NodeId { name: n.into(), job: Some(job.into()), node_rank: None });
        s.ranks = ranks
            .iter()
            .map(|&rank| RankLine {
                rank,
                node: name.map(String::from),
                world_size: 4,
                steps: 20,
                step_ms: 10.0,
                ..Default::default()
            })
            .collect();
        let p = dir.join(file);
        std::fs::write(&p, serde_json::to_string(&Diagnosed::new(s)).unwrap()).unwrap();
        p
    }

    #[test]
    fn a_folder_is_every_nodes_ranks_and_what_is_not_a_node_is_left_out() {
        let d = tempfile::tempdir().unwrap();
        let a = node_file(d.path(), "a.summary.json", Some("a"), "j1", &[0, 1]);
        node_file(d.path(), "b.summary.json", Some("b"), "j1", &[2, 3]);
        // The same node's run trace would say it again: read once.
        node_file(d.path(), "b.again.json", Some("b"), "j1", &[2, 3]);
        std::fs::write(d.path().join("trainer_state.json"), r#"{"epoch": 3}"#).unwrap();
        let files = expand(&[d.path().to_path_buf()]).unwrap();
        assert_eq!(files.len(), 4);
        let (read, lines, nodes) = gather(&files, false, true).unwrap();
        assert_eq!(
            lines.iter().map(|l| (l.rank, l.node.as_deref())).collect::<Vec<_>>(),
            [(0, Some("a")), (1, Some("a")), (2, Some("b")), (3, Some("b"))]
        );
        assert_eq!(nodes.len(), 2);
        assert!(read.iter().any(|r| r.ends_with("(2 ranks, already read)")), "{read:?}");
        // Named one by one, a file that is no part of a job ends the report, naming it.
        let e = gather(&[a, d.path().join("trainer_state.json")], false, false).unwrap_err().to_string();
        assert!(e.contains("trainer_state.json") && e.contains("neither a pipeprof trace nor a summary"), "{e}");
    }

    #[test]
    fn two_runs_or_two_jobs_in_one_folder_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let a = node_file(d.path(), "a.json", Some("a"), "j1", &[0, 1]);
        let c = node_file(d.path(), "c.json", Some("c"), "j1", &[1, 2]);
        let e = gather(&[a.clone(), c], false, true).unwrap_err().to_string();
        assert!(e.contains("both hold ranks of node c"), "{e}");
        let other = node_file(d.path(), "b.json", Some("b"), "j2", &[2, 3]);
        let e = gather(&[a, other], false, true).unwrap_err().to_string();
        assert!(e.contains("of job j1") && e.contains("of job j2"), "{e}");
    }

    #[test]
    fn a_summary_of_version_1_reads_with_no_node() {
        let d = tempfile::tempdir().unwrap();
        let p = node_file(d.path(), "old.json", None, "j", &[0, 1]);
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        v["schema_version"] = 1.into();
        std::fs::write(&p, v.to_string()).unwrap();
        let (_, lines, nodes) = gather(&[p], false, false).unwrap();
        assert_eq!((lines.len(), nodes.len()), (2, 1));
        assert!(lines.iter().all(|l| l.node.is_none()));
    }
}
