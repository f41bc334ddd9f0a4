//! `pipeprof report FILE [FILE2]`: the report of a saved run, or a before/after comparison.

use crate::aggregate::Summary;
use crate::diagnose::{self, Diagnosed};
use crate::export::read::{self, Loaded};
use crate::report;
use anyhow::Context;
use std::fmt::Write;
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
}

fn load(path: &Path, repair: bool) -> anyhow::Result<Loaded> {
    if repair {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        if serde_json::from_str::<serde_json::Value>(&text).is_ok() {
            eprintln!("pipeprof: {} is already a complete JSON file: nothing to repair", path.display());
        } else {
            let (fixed, kept) = read::repair_text(&text).with_context(|| {
                format!("{} does not start like a pipeprof trace: cannot repair it", path.display())
            })?;
            let tmp = path.with_extension("repair.tmp");
            std::fs::write(&tmp, fixed).with_context(|| format!("cannot write {}", tmp.display()))?;
            std::fs::rename(&tmp, path).with_context(|| format!("cannot replace {}", path.display()))?;
            eprintln!("pipeprof: repaired {}: kept {kept} complete events and closed the file", path.display());
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

pub fn run(args: &Options) -> anyhow::Result<()> {
    let Some(first) = args.files.first() else { anyhow::bail!("pipeprof report needs a trace or summary file") };
    let a = load(first, args.repair)?;
    match args.files.get(1) {
        None => {
            // Judged again, whatever the file says: the rules may be newer than the run.
            let d = Diagnosed::new(a.summary);
            print!("{}", report::render(&d.summary, &d.verdict()));
            if let Some(p) = &args.summary {
                std::fs::write(p, serde_json::to_string_pretty(&d)?)
                    .with_context(|| format!("cannot write {}", p.display()))?;
            }
        }
        Some(second) => {
            let b = load(second, args.repair)?;
            print!("{}", compare(&a.summary, &b.summary, first, second));
        }
    }
    Ok(())
}

fn ratio(a: f64, b: f64) -> String {
    if a > 0.0 && b > 0.0 {
        format!("{:.2}×", b / a)
    } else {
        "-".into()
    }
}

/// Before/after table: images/s, step split and per-stage means, verdict before → after.
pub fn compare(a: &Summary, b: &Summary, pa: &Path, pb: &Path) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "── pipeprof compare ─────────────────────────────────────────────");
    let _ = writeln!(o, "A = {}  ({})", pa.display(), a.settings.model);
    let _ = writeln!(o, "B = {}  ({})", pb.display(), b.settings.model);
    let _ = writeln!(o);
    let _ = writeln!(o, "{:<22} {:>12} {:>12} {:>9}", "", "A", "B", "B / A");
    let row = |o: &mut String, name: &str, x: f64, y: f64, unit: &str| {
        let _ = writeln!(
            o,
            "{name:<22} {:>12} {:>12} {:>9}",
            format!("{x:.2}{unit}"),
            format!("{y:.2}{unit}"),
            ratio(x, y)
        );
    };
    row(&mut o, "images/s", a.images_per_s, b.images_per_s, "");
    row(&mut o, "step time", a.split.mean_step_ms, b.split.mean_step_ms, " ms");
    row(&mut o, "  wait for data", a.split.wait_ms, b.split.wait_ms, " ms");
    row(&mut o, "  transfer", a.split.transfer_ms, b.split.transfer_ms, " ms");
    row(&mut o, "  compute", a.split.compute_ms, b.split.compute_ms, " ms");
    let _ = writeln!(
        o,
        "{:<22} {:>12} {:>12}",
        "workers · batch",
        format!("{} · {}", a.settings.workers, a.settings.batch_size),
        format!("{} · {}", b.settings.workers, b.settings.batch_size)
    );
    let _ = writeln!(o);
    let _ = writeln!(o, "mean per stage");
    let mut names: Vec<&str> = a.stages.iter().map(|s| s.stage.as_str()).collect();
    for s in &b.stages {
        if !names.contains(&s.stage.as_str()) {
            names.push(&s.stage);
        }
    }
    for n in names {
        let get = |s: &Summary| s.stages.iter().find(|x| x.stage == n).map(|x| x.mean_ms).unwrap_or(0.0);
        row(&mut o, &format!("  {n}"), get(a), get(b), " ms");
    }
    let (va, vb) = (diagnose::diagnose(a), diagnose::diagnose(b));
    let _ = writeln!(o);
    let _ = writeln!(o, "verdict: {}  →  {}", va.headline, vb.headline);
    o
}
