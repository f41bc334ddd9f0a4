//! `pipeprof profile --check-advice`: after the verdict, short follow-up runs of this same
//! binary, one per piece of advice pipeprof can apply itself (`--workers`, `--batch-size`,
//! `--prefetch`, the packed cache, a copy of the data on local disk), plus one unchanged run
//! as the baseline, so predicted and
//! measured gains sit side by side. Every run is a child process with the parent's options
//! (one typed change made, written as flags by `profile::Options::to_args`), the same number
//! of steps and its own summary file; a failed run says why and the rest go on.

use super::Options as ProfileOptions;
use crate::commands::rerun::{self, run_watched, steady_rate, stop_check, FollowUp, Measured, NoRate, Outcome};
use crate::commands::scratch::{copy_local, rerun_setup};
use crate::report::json::Checked;
use pipeprof_core::aggregate::Summary;
use pipeprof_core::diagnose::{Change, Verdict};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Follow-up runs at most (besides the baseline): the top advice only.
pub const MAX_FOLLOW_UPS: usize = 3;

/// Whether pipeprof can make this change itself, in a follow-up run.
pub fn applicable(change: &Change) -> bool {
    // `--device cpu` always runs; another device only where this build and machine have one,
    // which the main run's own device already proved or did not.
    let cpu = matches!(change, Change::UseDevice(d) if d == "cpu");
    cpu || matches!(
        change,
        Change::Workers(_) | Change::BatchSize(_) | Change::Prefetch(_) | Change::Cache { .. } | Change::CopyLocal
    )
}

/// The baseline, then the top advice pipeprof can apply, best first. Pure.
pub fn plan(v: &Verdict) -> Vec<FollowUp> {
    let mut out = vec![FollowUp::baseline()];
    for a in &v.advice {
        let known = out.iter().any(|f| f.change.as_ref() == Some(&a.change));
        if !applicable(&a.change) || known || out.len() > MAX_FOLLOW_UPS {
            continue;
        }
        let label = match &a.change {
            Change::Cache { .. } => "pipeprof cache, then --data it".to_string(),
            Change::CopyLocal => "copy to a local temporary folder, then --data it".to_string(),
            _ => a.command.clone().unwrap_or_default(),
        };
        out.push(FollowUp::of(a, label));
    }
    out
}

/// Whether a change takes the data off the storage `--throttle-read` and `--slow read=…`
/// simulate: the packed cache and the local copy are local files (see docs/data-and-cache.md,
/// "Simulated slow storage and the cache"), so their follow-up runs read without the simulated
/// delay, as the prediction assumes.
fn moves_off_slow_storage(change: Option<&Change>) -> bool {
    matches!(change, Some(Change::Cache { .. } | Change::CopyLocal))
}

/// The options of a follow-up run: the parent's, with `change` made (the data from `cache`
/// for the packed cache or the local copy), `steps` steps, no live view, its own summary
/// file; never the parent's `--check-advice` (it would check advice itself), trace or HTML
/// page (it would overwrite them) or metrics port (taken). Pure.
fn child_options(
    parent: &ProfileOptions,
    change: Option<&Change>,
    steps: u64,
    summary: &Path,
    cache: Option<&Path>,
) -> ProfileOptions {
    let mut o = ProfileOptions {
        steps: Some(steps),
        no_tui: true,
        summary: Some(summary.to_path_buf()),
        check_advice: false,
        json: false,
        trace: None,
        html: None,
        metrics: Default::default(),
        ..parent.clone()
    };
    if moves_off_slow_storage(change) {
        o.throttle_read = None;
        o.slow.retain(|s| s.stage != probes::Stage::Read);
    }
    match change {
        Some(Change::Workers(w)) => o.workers = Some(pipeprof_core::config::Workers::Fixed(*w)),
        Some(Change::BatchSize(b)) => o.batch_size = Some(*b),
        Some(Change::Prefetch(p)) => o.prefetch = Some(*p),
        Some(Change::Cache { .. } | Change::CopyLocal) => {
            o.data = Some(cache.map(Path::to_path_buf).unwrap_or_default())
        }
        Some(Change::UseDevice(d)) => o.device = d.clone(),
        // The baseline, or not applicable (see `applicable`): the child runs unchanged.
        _ => {}
    }
    o
}

/// The child's command line: its options ([`child_options`]) as flags. Pure.
pub fn child_args(
    parent: &ProfileOptions,
    change: Option<&Change>,
    steps: u64,
    summary: &Path,
    cache: Option<&Path>,
) -> Vec<OsString> {
    child_options(parent, change, steps, summary, cache).to_args()
}

fn build_cache(exe: &Path, model: Option<&Path>, data: &Path, out: &Path) -> Result<f64, NoRate> {
    let t0 = Instant::now();
    let mut c = Command::new(exe);
    use pipeprof_core::flags::{long, DATA, MODEL, OUT};
    c.arg("cache").arg(long(DATA)).arg(data).arg(long(OUT)).arg(out);
    if let Some(m) = model {
        c.arg(long(MODEL)).arg(m);
    }
    let (status, err) = run_watched(c, exe)?;
    if !status.success() {
        return Err(NoRate::Failed(format!("pipeprof cache failed: {err}")));
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// Runs the follow-ups and prints the table. Never fails the main run: problems are printed.
/// `parent` is the main run's options, `data` the data it read.
pub fn run(parent: &ProfileOptions, data: &Path, main: &Summary, verdict: &Verdict) -> Vec<Option<Checked>> {
    let runs = plan(verdict);
    pipeprof_trainer::progress::out("\n");
    if runs.len() == 1 {
        pipeprof_trainer::progress::out("check-advice: no advice pipeprof can apply itself (--workers, --batch-size, --prefetch, cache, local copy): nothing to check\n");
        return Vec::new();
    }
    let Some((exe, tmp, _tmp_guard)) = rerun_setup("pipeprof-check") else { return Vec::new() };
    let steps = parent.steps.unwrap_or(rerun::DEFAULT_STEPS);
    pipeprof_trainer::progress::out(&format!(
        "check-advice: 1 baseline + {} follow-up runs of {steps} steps each (this run's settings, one change per run)\n",
        runs.len() - 1
    ));
    let labels: Vec<&str> = runs.iter().map(|f| f.label.as_str()).collect();
    let each = Each { parent, data, steps, limit: rerun::time_limit(main, steps), exe: &exe, tmp: &tmp };
    let results = rerun::drive(&labels, |k| follow_up(&runs[k], k, &each));
    drop(_tmp_guard);
    let elsewhere = rerun::Elsewhere::of_outcomes(main, &results);
    let main_rate = steady_rate(main).unwrap_or(main.images_per_s);
    pipeprof_trainer::progress::out(&rerun::render(&runs[..results.len()], &results, main_rate, &elsewhere));
    rerun::checked(&runs, &results, main_rate, &elsewhere, &verdict.advice)
}

/// What every follow-up shares: the main run's options and the data it read, the steps each
/// runs and how long one may take ([`rerun::time_limit`]), this program and the scratch folder.
struct Each<'a> {
    parent: &'a ProfileOptions,
    data: &'a Path,
    steps: u64,
    limit: std::time::Duration,
    exe: &'a Path,
    tmp: &'a Path,
}

/// One follow-up: the data it reads made first (a copy, the cache), then this binary with
/// the parent's options and the follow-up's change.
fn follow_up(f: &FollowUp, k: usize, e: &Each) -> Outcome {
    let summary = e.tmp.join(format!("run-{k}.json"));
    let (cache, note) = local_data(f.change.as_ref(), e.exe, e.parent, e.data, e.tmp)?;
    let child = child_args(e.parent, f.change.as_ref(), e.steps, &summary, cache.as_deref());
    // Interrupted while the copy or the cache was made: no run.
    stop_check()?;
    let m = Measured::of(rerun::run_child_summary(e.exe, &child, &[], &summary, e.limit)?)?;
    Ok(Measured { note, ..m })
}

/// The data a follow-up reads instead of the main run's, made in `tmp` (the packed cache, a
/// copy on local disk), with a note of what making it took; none for the other changes.
fn local_data(
    change: Option<&Change>,
    exe: &Path,
    parent: &ProfileOptions,
    data: &Path,
    tmp: &Path,
) -> Result<(Option<PathBuf>, Option<String>), NoRate> {
    match change {
        Some(Change::CopyLocal) => copy_local(data, tmp).map(|(copy, note)| (Some(copy), Some(note))),
        Some(Change::Cache { .. }) if data.is_file() => {
            Err(NoRate::Failed("the data is already a packed cache".into()))
        }
        Some(Change::Cache { .. }) => {
            let out = tmp.join("data.ppk");
            let secs = build_cache(exe, parent.model.as_deref(), data, &out)?;
            Ok((Some(out), Some(format!("cache built once in {secs:.1} s"))))
        }
        _ => Ok((None, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::rerun::{advice_with as advice, verdict_with as verdict};
    use pipeprof_core::diagnose::Advice;

    fn strings(args: &[OsString]) -> Vec<String> {
        args.iter().map(|x| x.to_string_lossy().into_owned()).collect()
    }

    fn cache() -> Change {
        Change::Cache { model: "m.toml".into(), data: "imgs".into() }
    }

    #[test]
    fn plan_keeps_applicable_advice_in_order_after_the_baseline() {
        let v = verdict(vec![
            advice(Change::Workers(4), Some(1.8)),
            advice(Change::PreResize { width: 64, height: 64 }, Some(2.0)),
            advice(cache(), Some(3.0)),
            advice(Change::UseDevice("cuda".into()), None),
            advice(Change::Workers(4), Some(1.7)),
            advice(Change::BatchSize(128), Some(1.2)),
            advice(Change::Prefetch(6), Some(1.1)),
        ]);
        let p = plan(&v);
        let changes: Vec<Option<Change>> = p.iter().map(|f| f.change.clone()).collect();
        assert_eq!(changes, vec![None, Some(Change::Workers(4)), Some(cache()), Some(Change::BatchSize(128))]);
        assert_eq!(p[2].predicted, Some(3.0));
        let labels: Vec<&str> = p.iter().map(|f| f.label.as_str()).collect();
        assert_eq!(labels, ["as run (no change)", "--workers 4", "pipeprof cache, then --data it", "--batch-size 128"]);
    }

    #[test]
    fn staying_on_the_cpu_is_checked_but_another_device_is_not_assumed() {
        assert!(applicable(&Change::UseDevice("cpu".into())));
        assert!(!applicable(&Change::UseDevice("cuda".into())));
    }

    #[test]
    fn advice_read_back_from_a_file_is_never_applied() {
        let saved = Advice { command: Some("--workers 4".into()), ..advice(Change::Saved, Some(2.0)) };
        let v = verdict(vec![saved]);
        assert_eq!(plan(&v).len(), 1, "only the baseline");
    }

    /// Options with `--slow` values, as the command line gives them.
    fn slowed(specs: &[&str]) -> Vec<pipeprof_trainer::data::simulate::Slow> {
        specs.iter().map(|s| pipeprof_trainer::data::simulate::parse_slow(s).unwrap()).collect()
    }

    #[test]
    fn each_typed_change_sets_its_own_flag_in_the_child() {
        let parent = ProfileOptions { seed: Some(7), ..ProfileOptions::default() };
        let table = [
            (Change::Workers(3), vec!["--workers", "3"]),
            (Change::BatchSize(128), vec!["--batch-size", "128"]),
            (Change::Prefetch(6), vec!["--prefetch", "6"]),
            (cache(), vec!["--data", "x.ppk"]),
            (Change::UseDevice("cpu".into()), vec!["--device", "cpu"]),
            (Change::CopyLocal, vec!["--data", "x.ppk"]),
        ];
        let base = ProfileOptions { steps: Some(40), no_tui: true, summary: Some("r.json".into()), ..parent.clone() };
        for (change, pair) in table {
            let got = child_options(&parent, Some(&change), 40, Path::new("r.json"), Some(Path::new("x.ppk")));
            let a = strings(&got.to_args());
            let at = a.iter().position(|w| w == pair[0]);
            // `--device cpu` is the default: the child runs on the CPU with or without it.
            let want = if pair[1] == "cpu" { None } else { Some(pair[1]) };
            assert_eq!(at.map(|i| a[i + 1].as_str()), want, "{change:?}: {a:?}");
            // Nothing else changed.
            let mut unchanged = got.clone();
            (unchanged.workers, unchanged.batch_size, unchanged.prefetch) = (None, None, None);
            (unchanged.data, unchanged.device) = (None, base.device.clone());
            assert_eq!(unchanged, base, "{change:?}");
        }
        let baseline = child_args(&parent, None, 40, Path::new("r.json"), None);
        assert_eq!(strings(&baseline), ["profile", "--steps", "40", "--seed", "7", "--summary", "r.json", "--no-tui"]);
    }

    #[test]
    fn child_args_replace_outputs_steps_and_the_changed_flag() {
        let parent = ProfileOptions {
            workers: Some(pipeprof_core::config::Workers::Fixed(1)),
            summary: Some("s.json".into()),
            check_advice: true,
            trace: Some("t.json".into()),
            html: Some("r.html".into()),
            trace_level: crate::export::chrome::TraceLevel::Stage,
            data: Some("imgs".into()),
            slow: slowed(&["decode=+1ms", "read=+2ms"]),
            no_tui: true,
            no_gpu: true,
            metrics: crate::metrics::MetricsArgs { metrics_listen: Some("127.0.0.1:0".into()), ..Default::default() },
            ..ProfileOptions::default()
        };
        let a = child_args(&parent, Some(&Change::Workers(3)), 40, Path::new("/tmp/r.json"), None);
        assert_eq!(
            strings(&a),
            [
                "profile",
                "--data",
                "imgs",
                "--steps",
                "40",
                "--workers",
                "3",
                "--summary",
                "/tmp/r.json",
                "--trace-level",
                "stage",
                "--no-gpu",
                "--slow",
                "decode=+1ms",
                "--slow",
                "read=+2ms",
                "--no-tui",
            ]
        );
        let c = child_args(&parent, Some(&cache()), 40, Path::new("r.json"), Some(Path::new("x.ppk")));
        let c = strings(&c);
        assert!(c.windows(2).any(|w| w == ["--data", "x.ppk"]), "{c:?}");
        assert!(c.contains(&"--workers".to_string()) && !c.contains(&"imgs".to_string()), "{c:?}");
    }

    #[test]
    fn runs_off_the_slow_storage_leave_its_simulation_behind() {
        // The cache and the local copy are local files: the simulated slow storage (per-file
        // latency, bandwidth, slow reads) is not theirs, as the prediction assumes. CPU-stage
        // slowdowns stay; every other change keeps the whole simulation.
        let parent = ProfileOptions {
            data: Some("imgs".into()),
            throttle_read: Some(pipeprof_trainer::data::simulate::parse_throttle("2MB/s+20ms").unwrap()),
            slow: slowed(&["read=+30ms", "decode=+1ms"]),
            ..ProfileOptions::default()
        };
        let x = Some(Path::new("x"));
        for (change, kept) in
            [(cache(), false), (Change::CopyLocal, false), (Change::Workers(8), true), (Change::Prefetch(4), true)]
        {
            let a = strings(&child_args(&parent, Some(&change), 40, Path::new("r.json"), x));
            assert_eq!(a.contains(&"--throttle-read".to_string()), kept, "{change:?}: {a:?}");
            assert_eq!(a.contains(&"read=+30ms".to_string()), kept, "{change:?}: {a:?}");
            assert!(a.contains(&"decode=+1ms".to_string()), "{change:?}: {a:?}");
        }
        assert!(moves_off_slow_storage(Some(&Change::CopyLocal)) && !moves_off_slow_storage(None));
    }
}
