//! `pipeprof profile --check-advice`: after the verdict, short follow-up runs of this same
//! binary, one per piece of advice pipeprof can apply itself (`--workers`, `--batch-size`,
//! `--prefetch`, the packed cache), plus one unchanged run as the baseline, so predicted and
//! measured gains sit side by side. Every run is a child process with the parent's arguments,
//! the same number of steps and its own summary file; a failed run says why and the rest go on.

use crate::aggregate::Summary;
use crate::diagnose::Verdict;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// Follow-up runs at most (besides the baseline): the top advice only.
pub const MAX_FOLLOW_UPS: usize = 3;
/// Steps per follow-up when the main run did not set `--steps`.
pub const DEFAULT_STEPS: u64 = 40;

/// One change pipeprof can make to a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The run as it was: the baseline.
    None,
    Workers(usize),
    BatchSize(usize),
    Prefetch(usize),
    /// Build a packed cache of the data, then train from it.
    Cache,
}

/// A follow-up run: what it changes and what the diagnosis predicted.
#[derive(Debug, Clone, PartialEq)]
pub struct FollowUp {
    pub label: String,
    pub change: Change,
    pub predicted: Option<f64>,
}

fn parse_change(command: &str) -> Option<Change> {
    if command.starts_with("pipeprof cache ") {
        return Some(Change::Cache);
    }
    let (flag, value) = command.split_once(' ')?;
    let n: usize = value.trim().parse().ok().filter(|n| *n > 0)?;
    match flag {
        "--workers" => Some(Change::Workers(n)),
        "--batch-size" => Some(Change::BatchSize(n)),
        "--prefetch" => Some(Change::Prefetch(n)),
        _ => None,
    }
}

/// The baseline, then the top advice pipeprof can apply, best first. Pure.
pub fn plan(v: &Verdict) -> Vec<FollowUp> {
    let mut out = vec![FollowUp { label: "as run (no change)".into(), change: Change::None, predicted: Some(1.0) }];
    for a in &v.advice {
        let Some(cmd) = a.command.as_deref() else { continue };
        let Some(change) = parse_change(cmd) else { continue };
        if out.iter().any(|f| f.change == change) || out.len() > MAX_FOLLOW_UPS {
            continue;
        }
        let label =
            if change == Change::Cache { "pipeprof cache, then --data it".to_string() } else { cmd.to_string() };
        out.push(FollowUp { label, change, predicted: a.predicted_speedup });
    }
    out
}

/// Flags taking a value that the child sets itself.
fn replaced_flags(change: &Change) -> Vec<&'static str> {
    let mut v = vec!["--summary", "--trace", "--steps"];
    v.push(match change {
        Change::Workers(_) => "--workers",
        Change::BatchSize(_) => "--batch-size",
        Change::Prefetch(_) => "--prefetch",
        Change::Cache => "--data",
        Change::None => return v,
    });
    v
}

/// The child's arguments: the parent's `profile` arguments without `--check-advice`, the
/// live view, outputs, step count and the flag the change sets; then those set for the child.
/// Handles `--flag value` and `--flag=value`. Pure.
pub fn child_args(
    parent: &[OsString],
    change: &Change,
    steps: u64,
    summary: &Path,
    cache: Option<&Path>,
) -> Vec<OsString> {
    let drop_with_value = replaced_flags(change);
    let mut out: Vec<OsString> = vec!["profile".into()];
    let mut it = parent.iter().skip_while(|a| a.as_os_str() == OsStr::new("profile")).peekable();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if s == "--check-advice" || s == "--no-tui" {
            continue;
        }
        if drop_with_value.contains(&s.as_ref()) {
            it.next();
            continue;
        }
        if drop_with_value.iter().any(|f| s.starts_with(&format!("{f}="))) {
            continue;
        }
        out.push(a.clone());
    }
    out.extend(["--steps".into(), steps.to_string().into(), "--no-tui".into(), "--summary".into()]);
    out.push(summary.as_os_str().to_owned());
    let set = |flag: &str, n: &usize| [OsString::from(flag), OsString::from(n.to_string())];
    match change {
        Change::None => {}
        Change::Workers(n) => out.extend(set("--workers", n)),
        Change::BatchSize(n) => out.extend(set("--batch-size", n)),
        Change::Prefetch(n) => out.extend(set("--prefetch", n)),
        Change::Cache => {
            out.push("--data".into());
            out.push(cache.map(|c| c.as_os_str().to_owned()).unwrap_or_default());
        }
    }
    out
}

/// A child's outcome: images/s, or why it failed.
type Measured = Result<f64, String>;

fn last_line(b: &[u8]) -> String {
    let t = String::from_utf8_lossy(b);
    t.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output").trim().to_string()
}

fn run_child(exe: &Path, args: &[OsString], summary: &Path) -> Measured {
    let out = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    if !out.status.success() {
        return Err(format!("exited with {}: {}", out.status, last_line(&out.stderr)));
    }
    let text = std::fs::read(summary).map_err(|e| format!("no summary at {}: {e}", summary.display()))?;
    let s: serde_json::Value = serde_json::from_slice(&text).map_err(|e| format!("unreadable summary: {e}"))?;
    s["images_per_s"].as_f64().filter(|x| x.is_finite() && *x > 0.0).ok_or_else(|| "no images/s in the summary".into())
}

fn build_cache(exe: &Path, model: Option<&Path>, data: &Path, out: &Path) -> Result<f64, String> {
    let t0 = Instant::now();
    let mut c = Command::new(exe);
    c.arg("cache").arg("--data").arg(data).arg("--out").arg(out);
    if let Some(m) = model {
        c.arg("--model").arg(m);
    }
    let o = c.stdin(Stdio::null()).output().map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    if !o.status.success() {
        return Err(format!("pipeprof cache failed: {}", last_line(&o.stderr)));
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// Runs the follow-ups and prints the table. Never fails the main run: problems are printed.
/// `model` and `steps` are the main run's `--model` and `--steps`.
pub fn run(model: Option<&Path>, steps: Option<u64>, data: &Path, main: &Summary, verdict: &Verdict) {
    let runs = plan(verdict);
    println!();
    if runs.len() == 1 {
        println!("check-advice: no advice pipeprof can apply itself (--workers, --batch-size, --prefetch, cache): nothing to check");
        return;
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            println!("check-advice: cannot find this program to re-run it ({e}): skipped");
            return;
        }
    };
    let tmp = std::env::temp_dir().join(format!("pipeprof-check-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&tmp) {
        println!("check-advice: cannot create {} ({e}): skipped", tmp.display());
        return;
    }
    let steps = steps.unwrap_or(DEFAULT_STEPS);
    let parent: Vec<OsString> = std::env::args_os().skip(1).collect();
    println!(
        "check-advice: 1 baseline + {} follow-up runs of {steps} steps each (this run's settings, one change per run)",
        runs.len() - 1
    );
    let mut results: Vec<(Measured, Option<String>)> = Vec::new();
    for (k, f) in runs.iter().enumerate() {
        eprintln!("check-advice: run {}/{}: {} …", k + 1, runs.len(), f.label);
        let summary = tmp.join(format!("run-{k}.json"));
        let mut note = None;
        let cache: Option<PathBuf> = if f.change == Change::Cache {
            let out = tmp.join("data.ppk");
            if data.is_file() {
                results.push((Err("the data is already a packed cache".into()), None));
                continue;
            }
            match build_cache(&exe, model, data, &out) {
                Ok(secs) => note = Some(format!("cache built once in {secs:.1} s")),
                Err(e) => {
                    results.push((Err(e), None));
                    continue;
                }
            }
            Some(out)
        } else {
            None
        };
        let child = child_args(&parent, &f.change, steps, &summary, cache.as_deref());
        results.push((run_child(&exe, &child, &summary), note));
    }
    let _ = std::fs::remove_dir_all(&tmp);
    print!("{}", render(&runs, &results, main.images_per_s));
}

/// The table. Measured × is against the baseline follow-up (same length, same conditions),
/// or against the main run if the baseline failed. Pure.
pub fn render(runs: &[FollowUp], results: &[(Measured, Option<String>)], main_images_per_s: f64) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let base = match results.first() {
        Some((Ok(x), _)) => *x,
        _ => main_images_per_s,
    };
    let w = runs.iter().map(|r| r.label.chars().count()).max().unwrap_or(6).max(6);
    let _ = writeln!(o, "{:<w$}  {:>11}  {:>17}  {:>10}", "advice", "predicted ×", "measured images/s", "measured ×");
    for (f, (m, note)) in runs.iter().zip(results) {
        let pred = f.predicted.map(|p| format!("{p:.2}×")).unwrap_or_else(|| "-".into());
        let note = note.as_ref().map(|n| format!("  ({n})")).unwrap_or_default();
        match m {
            Ok(x) => {
                let _ = writeln!(o, "{:<w$}  {pred:>11}  {x:>17.1}  {:>9.2}×{note}", f.label, x / base);
            }
            Err(e) => {
                let _ = writeln!(o, "{:<w$}  {pred:>11}  {:>17}  {:>10}  failed: {e}", f.label, "-", "-");
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::{Advice, Limiter, Severity};

    fn advice(cmd: Option<&str>, gain: Option<f64>) -> Advice {
        Advice { action: "x".into(), command: cmd.map(str::to_string), predicted_speedup: gain, reason: "y".into() }
    }

    fn verdict(advice: Vec<Advice>) -> Verdict {
        Verdict {
            limiter: Limiter::Preprocess,
            severity: Severity::High,
            headline: String::new(),
            evidence: Vec::new(),
            flags: Vec::new(),
            advice,
        }
    }

    #[test]
    fn plan_keeps_applicable_advice_in_order_after_the_baseline() {
        let v = verdict(vec![
            advice(Some("--workers 4"), Some(1.8)),
            advice(None, Some(2.0)),
            advice(Some("pipeprof cache --model m --data d --out data.ppk"), Some(3.0)),
            advice(Some("--device cuda"), None),
            advice(Some("--batch-size 128"), Some(1.2)),
            advice(Some("--prefetch 6"), Some(1.1)),
        ]);
        let p = plan(&v);
        let changes: Vec<Change> = p.iter().map(|f| f.change.clone()).collect();
        assert_eq!(changes, vec![Change::None, Change::Workers(4), Change::Cache, Change::BatchSize(128)]);
        assert_eq!(p[2].predicted, Some(3.0));
    }

    #[test]
    fn child_args_replace_outputs_steps_and_the_changed_flag() {
        let parent: Vec<OsString> = [
            "profile",
            "--workers",
            "1",
            "--summary=s.json",
            "--check-advice",
            "--trace",
            "t.json",
            "--trace-level",
            "stage",
            "--data",
            "imgs",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let a = child_args(&parent, &Change::Workers(3), 40, Path::new("/tmp/r.json"), None);
        let a: Vec<String> = a.iter().map(|x| x.to_string_lossy().into_owned()).collect();
        assert_eq!(
            a,
            [
                "profile",
                "--trace-level",
                "stage",
                "--data",
                "imgs",
                "--steps",
                "40",
                "--no-tui",
                "--summary",
                "/tmp/r.json",
                "--workers",
                "3"
            ]
        );
        let c = child_args(&parent, &Change::Cache, 40, Path::new("r.json"), Some(Path::new("x.ppk")));
        let c: Vec<String> = c.iter().map(|x| x.to_string_lossy().into_owned()).collect();
        assert!(c.ends_with(&["--data".to_string(), "x.ppk".to_string()]), "{c:?}");
        assert!(c.contains(&"--workers".to_string()) && !c.contains(&"imgs".to_string()), "{c:?}");
    }

    #[test]
    fn render_has_one_row_per_run_and_says_why_a_run_failed() {
        let runs = plan(&verdict(vec![advice(Some("--workers 2"), Some(1.5)), advice(Some("--prefetch 4"), None)]));
        let results = vec![(Ok(100.0), None), (Ok(150.0), None), (Err("exited with 1: boom".into()), None)];
        let t = render(&runs, &results, 90.0);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(lines[0].contains("predicted ×") && lines[0].contains("measured images/s"));
        assert!(lines[2].contains("1.50×") && lines[2].contains("150.0"), "{t}");
        assert!(lines[3].contains("failed: exited with 1: boom"), "{t}");
    }
}
