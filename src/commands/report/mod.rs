//! `pipeprof report FILE [FILE2]`: the report of a saved run, or a before/after comparison.

pub mod job;

use crate::export::read::{self, Loaded};
use crate::report;
use anyhow::Context;
use pipeprof_core::diagnose::{self, Diagnosed};
use std::path::{Path, PathBuf};

/// What `pipeprof report` was asked for.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// One file, or two (before, after).
    pub files: Vec<PathBuf>,
    /// Close a trace cut short in place, then report it.
    pub repair: bool,
    /// Also write the recomputed summary JSON here.
    pub summary: Option<PathBuf>,
    /// Also write the report as an HTML page here (`-`: stdout, instead of the text report).
    pub html: Option<PathBuf>,
    /// Also write the HTML report's body alone here (`-`: stdout, instead of the text report).
    pub html_fragment: Option<PathBuf>,
    /// `--json`: the caller prints the verdict's document; two runs have none.
    pub json: bool,
}

impl Options {
    /// The HTML files asked for, with their form.
    fn html(&self) -> Vec<(&Path, crate::html::Form)> {
        let page = self.html.as_deref().map(|p| (p, crate::html::Form::Page));
        let fragment = self.html_fragment.as_deref().map(|p| (p, crate::html::Form::Fragment));
        page.into_iter().chain(fragment).collect()
    }
}

/// A trace or summary file read (`repair`: a trace cut short closed in place first), with a
/// warning where it was cut short or its per-sample spans capped.
pub fn load(path: &Path, repair: bool) -> anyhow::Result<Loaded> {
    if repair {
        let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        if serde_json::from_slice::<serde_json::Value>(&bytes).is_ok() {
            pipeprof_trainer::progress::say(&format!(
                "pipeprof: {} is already a complete JSON file: nothing to repair",
                path.display()
            ));
        } else {
            // Cut at any byte, even inside a character: the cut line is dropped anyway.
            let text = String::from_utf8_lossy(&bytes);
            let (fixed, kept) = read::repair_text(&text).with_context(|| {
                format!("{} does not start like a pipeprof trace: cannot repair it", path.display())
            })?;
            crate::export::replace_file(path, fixed.as_bytes())
                .with_context(|| format!("cannot replace {} with its repaired copy", path.display()))?;
            pipeprof_trainer::progress::say(&format!(
                "pipeprof: repaired {}: kept {kept} complete events and closed the file",
                path.display()
            ));
        }
    }
    let l = read::load(path)?;
    if !l.complete {
        eprintln!(
            "warning: {} was not closed (the run was killed?): read its {} complete events; \
             `pipeprof report --repair {}` closes the file for other viewers",
            path.display(),
            l.events,
            path.display()
        );
    }
    if l.capped {
        eprintln!(
            "note: {} has capped per-sample spans: loader statistics come from the run's own summary",
            path.display()
        );
    }
    Ok(l)
}

/// `--summary`: the recomputed summary, with its verdict, as JSON at `p`.
fn write_summary(p: &Path, d: &Diagnosed) -> anyhow::Result<()> {
    std::fs::write(p, serde_json::to_string_pretty(d)?).with_context(|| format!("cannot write {}", p.display()))
}

pub fn run(args: &Options) -> anyhow::Result<Option<Diagnosed>> {
    if args.files.iter().any(|p| p.is_dir()) {
        let files = job::expand(&args.files)?;
        return job::run(&Options { files, ..args.clone() }, true);
    }
    let Some(first) = args.files.first() else { anyhow::bail!("pipeprof report needs a trace or summary file") };
    let html = args.html();
    if args.files.len() > 1 && !html.is_empty() {
        anyhow::bail!("--html and --html-fragment report one run: give one trace or summary file");
    }
    if html.iter().filter(|(p, _)| *p == Path::new("-")).count() > 1 {
        anyhow::bail!("--html - and --html-fragment -: stdout takes one of them");
    }
    if args.files.len() > 2
        || (args.files.len() == 2 && {
            // Two files are before/after, unless both are ranks of one run.
            let ranked = |p: &PathBuf| read::load(p).map(|l| l.summary.rank.is_some()).unwrap_or(false);
            ranked(first) && ranked(&args.files[1])
        })
    {
        return job::run(args, false);
    }
    let a = load(first, args.repair)?;
    match args.files.get(1) {
        None => {
            // Judged again, whatever the file says: the rules may be newer than the run.
            let d = Diagnosed::new(a.summary);
            // The HTML on stdout stands in for the text report there.
            if !html.iter().any(|(p, _)| *p == Path::new("-")) {
                pipeprof_trainer::progress::out(&report::render(&d));
            }
            if let Some(p) = &args.summary {
                write_summary(p, &d)?;
            }
            for (p, form) in html {
                crate::html::save(p, &d, form)?;
            }
            Ok(Some(d))
        }
        Some(_) if args.json => anyhow::bail!(
            "--json reports one run (or the ranks of one): two runs compare with `pipeprof compare --json BASE NEW`"
        ),
        Some(second) => {
            let b = load(second, args.repair)?;
            let c = diagnose::compare::Comparison::of(&a.summary, &b.summary);
            pipeprof_trainer::progress::out(&report::render_comparison(&c, first, second));
            Ok(None)
        }
    }
}
