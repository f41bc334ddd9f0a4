//! `pipeprof profile --check-advice`: after the verdict, short follow-up runs of this same
//! binary, one per piece of advice pipeprof can apply itself (`--workers`, `--batch-size`,
//! `--prefetch`, the packed cache, a copy of the data on local disk), plus one unchanged run
//! as the baseline, so predicted and
//! measured gains sit side by side. Every run is a child process with the parent's options
//! (one typed change made, written as flags by `profile::Options::to_args`), the same number
//! of steps and its own summary file; a failed run says why and the rest go on.

use crate::profile::Options as ProfileOptions;
use crate::rerun::{self, run_watched, steady_rate, stop_check, FollowUp, Measured, NoRate, Outcome};
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
            c => c.command().unwrap_or_default(),
        };
        out.push(FollowUp::of(a, label));
    }
    out
}

/// Whether a change takes the data off the storage `--throttle-read` and `--slow read=…`
/// simulate: the packed cache and the local copy are local files (see docs/data-and-cache.md,
/// "Simulated slow storage and the cache"), so their follow-up runs read without the simulated
/// delay, as the prediction assumes.
pub fn moves_off_slow_storage(change: Option<&Change>) -> bool {
    matches!(change, Some(Change::Cache { .. } | Change::CopyLocal))
}

/// The options of a follow-up run: the parent's, with `change` made (the data from `cache`
/// for the packed cache or the local copy), `steps` steps, no live view, its own summary
/// file; never the parent's `--check-advice` (it would check advice itself), trace or HTML
/// page (it would overwrite them) or metrics port (taken). Pure.
pub fn child_options(
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

/// Headroom kept free when copying the data set: the copy may not fill the disk (it is made
/// only where the free space is over its size × this).
pub const COPY_HEADROOM: f64 = 1.2;

/// Whether a copy of `needed` bytes fits in `free` bytes, with [`COPY_HEADROOM`]; the message
/// says how much either way. Pure.
pub fn copy_fits(needed: u64, free: Option<u64>, dir: &Path) -> Result<String, String> {
    let mb = |b: u64| format!("{:.1} MB", b as f64 / 1e6);
    room_for("copy the data set", needed, free, dir)?;
    match free {
        Some(f) => Ok(format!("{} copied to {} ({} free there)", mb(needed), dir.display(), mb(f))),
        None => Ok(format!("{} copied to {}", mb(needed), dir.display())),
    }
}

/// Whether `needed` bytes fit in `free` bytes with [`COPY_HEADROOM`] (the copy's and the
/// pack's one margin); else why: "not enough space to VERB: … needed, … free in DIR". Pure.
pub fn room_for(verb: &str, needed: u64, free: Option<u64>, dir: &Path) -> Result<(), String> {
    let mb = |b: u64| format!("{:.1} MB", b as f64 / 1e6);
    match free {
        Some(f) if (needed as f64) * COPY_HEADROOM > f as f64 => {
            Err(format!("not enough space to {verb}: {} needed, {} free in {}", mb(needed), mb(f), dir.display()))
        }
        _ => Ok(()),
    }
}

/// Bytes free to this user under `dir` (`statvfs`), or `None` where it cannot be told.
pub fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| (st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// What [`walk_files`] calls per folder and file: (its path, its path below the top, its size).
type Each<'a> = dyn FnMut(&Path, &Path, Option<u64>) -> Result<(), String> + 'a;

/// Calls `each` with every folder and regular file under `dir` (its path, its path below the
/// top folder `rel`, and for a file its size: a folder's is `None`, so that an empty class
/// folder, a class to `ImageFolder`, is copied too), following symbolic links to files and
/// folders as torchvision's
/// `ImageFolder` does (`os.walk(followlinks=True)`: a class folder that is a link, a `train/`
/// of links); a link that leads nowhere is left out (there is nothing to read), a link back
/// into its own ancestors (a loop) refused ([`NoRate::Skipped`]). Stops at an interrupt
/// ([`stop_check`]). `above`: the folders above this one, by device and inode.
fn walk_files(dir: &Path, rel: &Path, above: &mut Vec<(u64, u64)>, each: &mut Each<'_>) -> Result<(), NoRate> {
    use std::os::unix::fs::MetadataExt;
    let io = |p: &Path, e: std::io::Error| format!("cannot read {} ({e})", p.display());
    let m = std::fs::metadata(dir).map_err(|e| io(dir, e))?;
    let key = (m.dev(), m.ino());
    if above.contains(&key) {
        return Err(NoRate::Skipped(format!(
            "{} is a link back into a folder above it (a loop): the data set has no end to copy",
            dir.display()
        )));
    }
    above.push(key);
    let mut entries: Vec<_> =
        std::fs::read_dir(dir).map_err(|e| io(dir, e))?.collect::<Result<_, _>>().map_err(|e| io(dir, e))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        stop_check()?;
        let path = e.path();
        let m = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(&path, e).into()),
        };
        let below = rel.join(e.file_name());
        if m.is_dir() {
            each(&path, &below, None)?;
            walk_files(&path, &below, above, each)?;
        } else if m.is_file() {
            each(&path, &below, Some(m.len()))?;
        }
    }
    above.pop();
    Ok(())
}

/// The total size of the files [`walk_files`] finds under `dir`.
fn tree_bytes(dir: &Path) -> Result<u64, NoRate> {
    let mut total = 0u64;
    walk_files(dir, Path::new(""), &mut Vec::new(), &mut |_, _, len| {
        total = total.saturating_add(len.unwrap_or(0));
        Ok(())
    })?;
    Ok(total)
}

/// Copies what [`walk_files`] finds under `from` to `to`: the files behind links as files.
fn copy_tree(from: &Path, to: &Path) -> Result<(), NoRate> {
    std::fs::create_dir_all(to).map_err(|e| format!("cannot create {} ({e})", to.display()))?;
    walk_files(from, Path::new(""), &mut Vec::new(), &mut |path, rel, len| {
        let dst = to.join(rel);
        if len.is_none() {
            return std::fs::create_dir_all(&dst).map_err(|e| format!("cannot create {} ({e})", dst.display()));
        }
        std::fs::copy(path, &dst).map(|_| ()).map_err(|e| format!("copying {} failed: {e}", path.display()))
    })
}

/// Copies the data folder into `tmp` when it fits: (the copy, a note with the sizes and time).
/// A copy that does not fit is [`NoRate::Skipped`].
pub fn copy_local(data: &Path, tmp: &Path) -> Result<(PathBuf, String), NoRate> {
    if !data.is_dir() {
        return Err(NoRate::Failed("the data is not a folder".into()));
    }
    let needed = tree_bytes(data)?;
    let note = copy_fits(needed, free_bytes(tmp), tmp).map_err(NoRate::Skipped)?;
    let out = tmp.join("data-copy");
    let t0 = Instant::now();
    copy_tree(data, &out)?;
    Ok((out, format!("{note} in {:.1} s, removed afterwards", t0.elapsed().as_secs_f64())))
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
pub fn run(parent: &ProfileOptions, data: &Path, main: &Summary, verdict: &Verdict) {
    let runs = plan(verdict);
    pipeprof_trainer::progress::out("\n");
    if runs.len() == 1 {
        pipeprof_trainer::progress::out("check-advice: no advice pipeprof can apply itself (--workers, --batch-size, --prefetch, cache, local copy): nothing to check\n");
        return;
    }
    let Some((exe, tmp, _tmp_guard)) = rerun_setup("pipeprof-check") else { return };
    let steps = parent.steps.unwrap_or(rerun::DEFAULT_STEPS);
    pipeprof_trainer::progress::out(&format!(
        "check-advice: 1 baseline + {} follow-up runs of {steps} steps each (this run's settings, one change per run)\n",
        runs.len() - 1
    ));
    let labels: Vec<&str> = runs.iter().map(|f| f.label.as_str()).collect();
    let results = rerun::drive(&labels, |k| follow_up(&runs[k], k, parent, data, steps, &exe, &tmp));
    drop(_tmp_guard);
    let elsewhere = rerun::Elsewhere::of_outcomes(main, &results);
    let main_rate = steady_rate(main).unwrap_or(main.images_per_s);
    pipeprof_trainer::progress::out(&rerun::render(&runs[..results.len()], &results, main_rate, &elsewhere));
}

/// One follow-up: the data it reads made first (a copy, the cache), then this binary with
/// the parent's options and the follow-up's change.
fn follow_up(
    f: &FollowUp,
    k: usize,
    parent: &ProfileOptions,
    data: &Path,
    steps: u64,
    exe: &Path,
    tmp: &Path,
) -> Outcome {
    let summary = tmp.join(format!("run-{k}.json"));
    let (cache, note) = local_data(f.change.as_ref(), exe, parent, data, tmp)?;
    let child = child_args(parent, f.change.as_ref(), steps, &summary, cache.as_deref());
    // Interrupted while the copy or the cache was made: no run.
    stop_check()?;
    let m = Measured::of(rerun::run_child_summary(exe, &child, &[], &summary)?)?;
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

/// What every re-run needs, or `None` with why printed: this program's path and a private
/// scratch folder ([`TempDir::private`]) for the runs' summaries, a cache, a copy of the data
/// set; removed on every way out: return, panic (drop), an immediate exit (abort hook).
pub fn rerun_setup(prefix: &str) -> Option<(PathBuf, PathBuf, TempDir)> {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            pipeprof_trainer::progress::out(&format!(
                "check-advice: cannot find this program to re-run it ({e}): skipped\n"
            ));
            return None;
        }
    };
    for line in sweep(&std::env::temp_dir()) {
        pipeprof_trainer::progress::say(&format!("check-advice: {line}"));
    }
    match TempDir::private(prefix) {
        Ok(guard) => Some((exe, guard.path().to_path_buf(), guard)),
        Err(e) => {
            pipeprof_trainer::progress::out(&format!("check-advice: {e}: skipped\n"));
            None
        }
    }
}

/// A scratch folder pipeprof made: removed when dropped, and by an immediate exit on a second
/// interrupt, which drops nothing.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new folder `PREFIX-PID-XXXXXX` in the temp folder (PID: this process's, so that
    /// the next run can tell one left by a killed run, [`sweep`]): a random name, made exclusively
    /// (mkdtemp: a name another user made first, or a link planted there, is never used),
    /// mode 0700, and checked once made (a folder, not a link, ours, closed to others). So
    /// nothing pipeprof writes in it can be redirected, read or swapped by another user.
    pub fn private(prefix: &str) -> Result<TempDir, String> {
        let within = std::env::temp_dir();
        let made = tempfile::Builder::new()
            .prefix(&format!("{prefix}-{}-", std::process::id()))
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir_in(&within)
            .map_err(|e| format!("cannot create a private folder in {} ({e})", within.display()))?;
        let guard = TempDir::new(&made.keep());
        check_private(guard.path())?;
        Ok(guard)
    }

    /// Removes `dir` (which the caller made) when dropped or on an immediate exit.
    fn new(dir: &Path) -> TempDir {
        rerun::SCRATCH.lock().unwrap_or_else(|e| e.into_inner()).push(dir.to_path_buf());
        let d = dir.to_path_buf();
        pipeprof_core::signal::on_abort(Box::new(move || {
            let _ = std::fs::remove_dir_all(&d);
        }));
        TempDir(dir.to_path_buf())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

/// `dir` is a folder (not a link), owned by this user, closed to everyone else.
fn check_private(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(dir).map_err(|e| format!("cannot check {} ({e})", dir.display()))?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if !m.file_type().is_dir() || m.uid() != me || m.mode() & 0o077 != 0 {
        return Err(format!("{} is not a private folder (a folder of ours, mode 0700)", dir.display()));
    }
    Ok(())
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        rerun::SCRATCH.lock().unwrap_or_else(|e| e.into_inner()).retain(|d| d != &self.0);
    }
}

/// Where the scratch folders of `--check-advice` begin (`pipeprof-check-PID-…`, and
/// `pipeprof-check-run-PID-…` for `run`'s).
const SCRATCH_PREFIX: &str = "pipeprof-check-";

/// The pid in a scratch folder's name (`pipeprof-check-PID-XXXXXX`,
/// `pipeprof-check-run-PID-XXXXXX`), or `None`: not a name [`TempDir::private`] makes. Pure.
pub fn scratch_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(SCRATCH_PREFIX)?;
    let rest = rest.strip_prefix("run-").unwrap_or(rest);
    let (pid, random) = rest.split_once('-')?;
    let digits = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
    (digits && !random.is_empty() && !random.contains('/')).then(|| pid.parse().ok()).flatten()
}

/// Removes the scratch folders in `within` that a `--check-advice` killed outright (SIGKILL,
/// the OOM killer: it removed nothing) left behind, and only those provably so: a folder (not
/// a link) owned by this user, named as [`TempDir::private`] names them, whose pid is dead
/// and not this process. One of another user's is named, never touched. Returns what it did,
/// a line each.
pub fn sweep(within: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(within) else { return Vec::new() };
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let mut said = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(scratch_pid) else { continue };
        let path = e.path();
        let Ok(m) = std::fs::symlink_metadata(&path) else { continue };
        if !m.file_type().is_dir() || pid == std::process::id() || alive(pid) {
            continue;
        }
        if m.uid() != me {
            said.push(format!(
                "{} was left by a --check-advice of another user (uid {}) that was killed: not ours, left alone",
                path.display(),
                m.uid()
            ));
        } else if std::fs::remove_dir_all(&path).is_ok() {
            said.push(format!("removed {}, left by a --check-advice (pid {pid}) that was killed", path.display()));
        }
    }
    said
}

/// Whether process `pid` exists (alive, or a zombie not yet reaped; another user's too).
fn alive(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 checks only; no signal is sent.
    let rc = unsafe { libc::kill(p, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// A verdict that says only `advice` (what the plans read), for the re-run plans' tests here
/// and in `check_run`.
#[cfg(test)]
pub(crate) fn verdict_with(advice: Vec<pipeprof_core::diagnose::Advice>) -> Verdict {
    use pipeprof_core::diagnose::{Limiter, Severity};
    Verdict {
        limiter: Limiter::Preprocess,
        severity: Severity::High,
        headline: String::new(),
        evidence: Vec::new(),
        flags: Vec::new(),
        advice,
        provisional: false,
        now: None,
    }
}

#[cfg(test)]
mod tests {
    use super::verdict_with as verdict;
    use super::*;
    use pipeprof_core::diagnose::Advice;

    fn advice(change: Change, gain: Option<f64>) -> Advice {
        Advice { action: "x".into(), change, predicted_speedup: gain, reason: "y".into(), basis: None }
    }

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
        let v = verdict(vec![advice(Change::Saved(Some("--workers 4".into())), Some(2.0))]);
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
    fn a_local_copy_is_made_only_when_it_fits_and_says_how_much() {
        let dir = Path::new("/tmp/x");
        assert!(copy_fits(100, Some(1_000), dir).is_ok_and(|n| n.contains("0.0 MB copied to /tmp/x")));
        let e = copy_fits(2_000_000, Some(2_100_000), dir).unwrap_err();
        assert!(e.contains("2.0 MB needed, 2.1 MB free in /tmp/x"), "{e}");
        assert!(copy_fits(5, None, dir).is_ok());

        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("cat")).unwrap();
        std::fs::write(src.path().join("cat/a.png"), [7u8; 300]).unwrap();
        std::fs::write(src.path().join("b.jpg"), [1u8; 200]).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let (copy, note) = copy_local(src.path(), tmp.path()).unwrap();
        assert_eq!(std::fs::read(copy.join("cat/a.png")).unwrap(), [7u8; 300]);
        assert_eq!(tree_bytes(&copy).unwrap(), 500);
        assert!(note.contains("removed afterwards"), "{note}");
        assert!(copy_local(&src.path().join("b.jpg"), tmp.path()).is_err(), "a packed file is not a folder");
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

    #[test]
    fn the_copy_follows_links_as_imagefolder_does_and_refuses_a_loop() {
        use std::os::unix::fs::symlink;
        let d = tempfile::tempdir().unwrap();
        let (src, store) = (d.path().join("train"), d.path().join("store"));
        std::fs::create_dir_all(src.join("circle")).unwrap();
        std::fs::create_dir_all(store.join("cross")).unwrap();
        std::fs::write(src.join("circle/a.png"), [1u8; 100]).unwrap();
        std::fs::write(store.join("cross/b.png"), [2u8; 50]).unwrap();
        std::fs::write(store.join("c.png"), [3u8; 20]).unwrap();
        // A class folder that is a link (DVC, git-annex), a file that is a link, one to nowhere.
        symlink(store.join("cross"), src.join("cross")).unwrap();
        symlink(store.join("c.png"), src.join("circle/c.png")).unwrap();
        symlink(d.path().join("gone.png"), src.join("circle/gone.png")).unwrap();
        // A class folder with no image is a class to ImageFolder all the same.
        std::fs::create_dir(src.join("empty")).unwrap();
        assert_eq!(tree_bytes(&src).unwrap(), 170);
        let tmp = tempfile::tempdir().unwrap();
        let (copy, _) = copy_local(&src, tmp.path()).unwrap();
        assert_eq!(std::fs::read(copy.join("cross/b.png")).unwrap(), [2u8; 50]);
        assert_eq!(std::fs::read(copy.join("circle/c.png")).unwrap(), [3u8; 20]);
        assert!(!std::fs::symlink_metadata(copy.join("cross")).unwrap().file_type().is_symlink(), "copied, not linked");
        assert!(!copy.join("circle/gone.png").exists());
        assert!(copy.join("empty").is_dir(), "the empty class is kept");
        // A link back into its own ancestors: ImageFolder's walk has no end; the row is skipped.
        symlink(&src, src.join("circle/again")).unwrap();
        let e = copy_local(&src, tempfile::tempdir().unwrap().path()).unwrap_err();
        assert!(matches!(&e, NoRate::Skipped(why) if why.contains("(a loop)")), "{e}");
    }

    #[test]
    fn a_scratch_folder_names_its_pid_and_one_left_by_a_killed_run_is_removed_if_ours() {
        let t = TempDir::private("pipeprof-check-run").unwrap();
        let name = t.path().file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(scratch_pid(&name), Some(std::process::id()), "{name}");
        for (name, want) in [
            ("pipeprof-check-123-abcdef", Some(123)),
            ("pipeprof-check-run-45-x1y2z3", Some(45)),
            ("pipeprof-check-run-abcdef", None),
            ("pipeprof-check-12", None),
            ("pipeprof-run-12-abc", None),
            ("pipeprof-check--abc", None),
        ] {
            assert_eq!(scratch_pid(name), want, "{name}");
        }
        let within = tempfile::tempdir().unwrap();
        // A pid that cannot be alive (over the kernel's pid_max, 2^22).
        let dead = within.path().join("pipeprof-check-run-99999999-abcdef");
        std::fs::create_dir_all(dead.join("data-copy")).unwrap();
        let live = within.path().join(format!("pipeprof-check-{}-abcdef", std::process::id()));
        std::fs::create_dir(&live).unwrap();
        let other = within.path().join("pipeprof-check-99999998-abcdef");
        std::os::unix::fs::symlink(&live, &other).unwrap();
        let said = sweep(within.path());
        assert!(!dead.exists(), "{said:?}");
        assert!(live.exists() && std::fs::symlink_metadata(&other).is_ok(), "a live run's and a link are left");
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].contains("removed") && said[0].contains("pid 99999999"), "{said:?}");
    }
}
