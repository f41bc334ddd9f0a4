//! `pipeprof run --check-advice [--steps N] -- CMD`: after the report, the user's own program
//! runs again, briefly, once as it was and once per piece of advice the start-up hook can
//! apply without an edit to it (a typed [`Change::Loader`]: `DataLoader` `num_workers`,
//! `persistent_workers`, `prefetch_factor`, `pin_memory`, `batch_size`; Keras `PyDataset`
//! workers), so predicted and measured gains sit side by side in `profile --check-advice`'s
//! table.
//!
//! Each re-run is `pipeprof run --once --summary FILE -- CMD` with [`ENV`] set to the
//! arguments to change and the steps to run: `pipeprof._override` (loaded by the hook) sets
//! them on every `DataLoader` the program builds and ends the program (`SystemExit(0)`) when
//! it asks for the batch after the last step. The program's output is kept from the terminal
//! (the last line of its errors says why a re-run failed); its side effects are its own.

use crate::aggregate::Summary;
use crate::check_advice::{self, FollowUp, Measured, INTERRUPTED, MAX_FOLLOW_UPS};
use crate::diagnose::{Change, LoaderKnobs, Verdict};
use std::ffi::OsString;
use std::path::Path;

/// The environment variable a re-run's hook reads: JSON, the [`LoaderKnobs`] to set and
/// `steps`, the training steps after which the program is stopped.
pub use probes::env::CHECK_ENV as ENV;
/// Steps per re-run when `--steps` is not given.
pub const DEFAULT_STEPS: u64 = 40;

/// What `pipeprof run --check-advice` needs of the run.
#[derive(Debug, Clone)]
pub struct Options {
    pub command: Vec<OsString>,
    pub steps: u64,
    pub sample_hz: f64,
    pub no_gpu: bool,
}

/// A re-run: its row, and the arguments it sets (none: the baseline).
#[derive(Debug, Clone, PartialEq)]
pub struct ReRun {
    pub row: FollowUp,
    pub set: Option<LoaderKnobs>,
}

/// The baseline, then the top advice the hook can apply, best first. Pure.
pub fn plan(v: &Verdict) -> Vec<ReRun> {
    let baseline =
        FollowUp { label: "as run (no change)".into(), change: None, predicted: Some(1.0), range: None, against: None };
    let mut out = vec![ReRun { row: baseline, set: None }];
    for a in &v.advice {
        let Change::Loader { code, set } = &a.change else { continue };
        if out.len() > MAX_FOLLOW_UPS || out.iter().any(|r| r.set.as_ref() == Some(set)) {
            continue;
        }
        // The learning rate is the program's: a larger batch runs with its own, as the
        // advice's words say to change it too.
        let label = if set.batch_size.is_some() { format!("{code} (learning rate as it was)") } else { code.clone() };
        let row = FollowUp {
            label,
            change: Some(a.change.clone()),
            predicted: a.predicted_speedup,
            range: a.basis.and_then(|b| b.range),
            against: a.basis.map(|b| b.now),
        };
        out.push(ReRun { row, set: Some(set.clone()) });
    }
    out
}

/// The value of [`ENV`] for a re-run. Pure.
pub fn env_value(set: Option<&LoaderKnobs>, steps: u64) -> String {
    let mut v = serde_json::to_value(set.cloned().unwrap_or_default()).unwrap_or_else(|_| serde_json::json!({}));
    if let Some(m) = v.as_object_mut() {
        m.insert("steps".into(), steps.into());
    }
    v.to_string()
}

/// `pipeprof run` arguments of a re-run. Pure.
pub fn child_args(opts: &Options, summary: &Path) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["run".into(), "--once".into(), "--summary".into(), summary.as_os_str().into()];
    a.extend(["--sample-hz".into(), opts.sample_hz.to_string().into()]);
    if opts.no_gpu {
        a.push("--no-gpu".into());
    }
    a.push("--".into());
    a.extend(opts.command.iter().cloned());
    a
}

/// Why the program's input cannot be given to it again, if so: standard input is a pipe, a
/// socket or a file (a terminal or `/dev/null` gives nothing that is used up).
pub fn stdin_refusal() -> Option<String> {
    // SAFETY: fstat on fd 0 into a zeroed, writable stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(0, &mut st) } != 0 {
        return None;
    }
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFIFO => "a pipe",
        libc::S_IFSOCK => "a socket",
        libc::S_IFREG => "a file",
        _ => return None,
    };
    Some(format!(
        "--check-advice runs the program again, several times, and its standard input here is {kind}, which can be read only once: give the program its input as a file it opens itself, or run without --check-advice"
    ))
}

/// Runs the re-runs and prints the table. Never fails the run: problems are printed.
pub fn run(opts: &Options, main: &Summary, verdict: &Verdict) {
    let runs = plan(verdict);
    crate::progress::out("\n");
    if runs.len() == 1 {
        crate::progress::out("check-advice: no advice the start-up hook can apply to this program (DataLoader num_workers, persistent_workers, prefetch_factor, pin_memory, batch_size; Keras PyDataset workers): nothing to check\n");
        return;
    }
    let Some((exe, tmp, _tmp_guard)) = check_advice::rerun_setup("pipeprof-check-run") else { return };
    crate::progress::out(&format!(
        "check-advice: running the program again: 1 baseline + {} runs of {} steps each, one change per run (its output hidden; its side effects are its own)\n",
        runs.len() - 1,
        opts.steps
    ));
    let mut results: Vec<(Measured, Option<String>)> = Vec::new();
    for (k, r) in runs.iter().enumerate() {
        if crate::signal::stopping() {
            crate::progress::say(&format!(
                "check-advice: interrupted: {} of {} runs done, the rest skipped",
                k,
                runs.len()
            ));
            break;
        }
        crate::progress::say(&format!("check-advice: run {}/{}: {} …", k + 1, runs.len(), r.row.label));
        let summary = tmp.join(format!("run-{k}.json"));
        let env = [(ENV, env_value(r.set.as_ref(), opts.steps))];
        let measured = check_advice::run_child(&exe, &child_args(opts, &summary), &env, &summary);
        if matches!(&measured, Err(e) if e == INTERRUPTED) {
            crate::progress::say(&format!(
                "check-advice: interrupted: {} of {} runs done, the rest skipped",
                k,
                runs.len()
            ));
            break;
        }
        results.push((measured, None));
    }
    drop(_tmp_guard);
    let rows: Vec<FollowUp> = runs.iter().map(|r| r.row.clone()).collect();
    let main_rate = check_advice::steady_rate(main).unwrap_or(main.images_per_s);
    crate::progress::out(&check_advice::render(&rows[..results.len()], &results, main_rate));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check_advice::verdict_with as verdict;
    use crate::diagnose::{Advice, Basis};

    fn loader(code: &str, set: LoaderKnobs, gain: f64) -> Advice {
        Advice {
            action: "x".into(),
            change: Change::Loader { code: code.into(), set },
            predicted_speedup: Some(gain),
            reason: "y".into(),
            basis: Some(Basis {
                now: 100.0,
                from_step: 1,
                to_step: 30,
                predicted: 100.0 * gain,
                model_now: 100.0,
                range: None,
                slow_steps: false,
                compute_split_unknown: false,
            }),
        }
    }

    #[test]
    fn only_loader_arguments_are_re_run_after_the_baseline_and_each_once() {
        let w2 = LoaderKnobs { num_workers: Some(2), persistent_workers: Some(true), ..LoaderKnobs::default() };
        let b = LoaderKnobs { batch_size: Some(128), ..LoaderKnobs::default() };
        let v = verdict(vec![
            loader("DataLoader(..., num_workers=2, persistent_workers=True)", w2.clone(), 1.9),
            Advice { change: Change::Code("device = \"cpu\"".into()), ..loader("c", LoaderKnobs::default(), 1.2) },
            loader("DataLoader(..., num_workers=2, persistent_workers=True)", w2.clone(), 1.8),
            loader("DataLoader(..., batch_size=128)", b.clone(), 1.3),
        ]);
        let p = plan(&v);
        let sets: Vec<Option<LoaderKnobs>> = p.iter().map(|r| r.set.clone()).collect();
        assert_eq!(sets, vec![None, Some(w2), Some(b)]);
        assert_eq!(p[1].row.predicted, Some(1.9));
        assert_eq!(p[1].row.against, Some(100.0));
        assert_eq!(p[2].row.label, "DataLoader(..., batch_size=128) (learning rate as it was)");
        // pipeprof's own flags are never re-run here: that is `profile --check-advice`.
        assert_eq!(plan(&verdict(vec![Advice { change: Change::Workers(4), ..loader("c", w2_(), 2.0) }])).len(), 1);
    }

    fn w2_() -> LoaderKnobs {
        LoaderKnobs { num_workers: Some(2), ..LoaderKnobs::default() }
    }

    #[test]
    fn the_hook_is_told_the_arguments_to_set_and_the_steps() {
        let v: serde_json::Value = serde_json::from_str(&env_value(Some(&w2_()), 30)).unwrap();
        assert_eq!(v, serde_json::json!({"num_workers": 2, "steps": 30}));
        let v: serde_json::Value = serde_json::from_str(&env_value(None, 12)).unwrap();
        assert_eq!(v, serde_json::json!({"steps": 12}), "the baseline sets nothing");
    }

    #[test]
    fn a_re_run_is_the_same_program_under_pipeprof_run_with_its_own_summary() {
        let opts = Options {
            command: vec!["python".into(), "train.py".into(), "--lr".into(), "0.1".into()],
            steps: 30,
            sample_hz: 4.0,
            no_gpu: true,
        };
        let a: Vec<String> =
            child_args(&opts, Path::new("/tmp/r.json")).iter().map(|x| x.to_string_lossy().into_owned()).collect();
        assert_eq!(
            a,
            [
                "run",
                "--once",
                "--summary",
                "/tmp/r.json",
                "--sample-hz",
                "4",
                "--no-gpu",
                "--",
                "python",
                "train.py",
                "--lr",
                "0.1"
            ]
        );
    }
}
