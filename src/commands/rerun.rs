//! The re-runs of `--check-advice`, `profile`'s (commands/profile/check.rs) and `run`'s
//! (commands/run/check.rs) alike: one driver makes them in turn ([`drive`]) as watched child
//! processes ([`run_child_summary`]: an interrupt passed on, never outliving pipeprof); what
//! each gave is typed ([`Outcome`]: a rate, or why none: skipped, failed, interrupted); one
//! table sets the predictions beside the measurements ([`render`]), saying which runs shared
//! the machine with other programs ([`Elsewhere`]).

use pipeprof_core::aggregate::Summary;
use pipeprof_core::diagnose::Change;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Steps per re-run when `--steps` is not given.
pub const DEFAULT_STEPS: u64 = 40;

/// A follow-up run: what it changes and what the diagnosis predicted.
#[derive(Debug, Clone, PartialEq)]
pub struct FollowUp {
    pub label: String,
    /// `None`: the run as it was, the baseline.
    pub change: Option<Change>,
    pub predicted: Option<f64>,
    /// The prediction as a range, where the model was off today's measured rate.
    pub range: Option<(f64, f64)>,
    /// The images/s the prediction is a ratio to (the main run's steady rate it was made on),
    /// when the advice says; else the main run's.
    pub against: Option<f64>,
    /// The prediction is a floor ([`pipeprof_core::diagnose::Basis::floor`]): shown as "≥".
    pub floor: bool,
}

impl FollowUp {
    /// The first row: the run as it was, re-run unchanged, the table's ×1.
    pub fn baseline() -> FollowUp {
        FollowUp {
            label: "as run (no change)".into(),
            change: None,
            predicted: Some(1.0),
            range: None,
            against: None,
            floor: false,
        }
    }

    /// The row of `a`, labelled `label`: its change and what it predicted.
    pub fn of(a: &pipeprof_core::diagnose::Advice, label: String) -> FollowUp {
        FollowUp {
            label,
            change: Some(a.change.clone()),
            predicted: a.predicted_speedup,
            range: a.basis.and_then(|b| b.range),
            against: a.basis.map(|b| b.now),
            floor: a.basis.is_some_and(|b| b.floor),
        }
    }
}

/// A run's rate as the predictions read it ([`pipeprof_core::diagnose::measured_now`]: a one-off
/// first compute and the pipelines before the last change of workers left out), else the
/// whole run's. Pure.
pub fn steady_rate(s: &Summary) -> Option<f64> {
    let ok = |x: f64| x.is_finite() && x > 0.0;
    pipeprof_core::diagnose::measured_now(s)
        .map(|n| n.rate)
        .filter(|x| ok(*x))
        .or(Some(s.images_per_s).filter(|x| ok(*x)))
}

/// Why a re-run gave no rate.
#[derive(Debug, Clone, PartialEq)]
pub enum NoRate {
    /// Not made, by choice, and why: no room for a copy, a change the program's own call
    /// cannot take, a re-run that never read the data it was given. The table says "skipped".
    Skipped(String),
    /// Ctrl-C stopped it: no more re-runs follow ([`drive`]).
    Interrupted,
    /// It failed, or ended well and measured nothing: why.
    Failed(String),
}

/// An error of the re-run's own making (a file unreadable, a child that failed to start):
/// a failure.
impl From<String> for NoRate {
    fn from(why: String) -> NoRate {
        NoRate::Failed(why)
    }
}

impl std::fmt::Display for NoRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoRate::Skipped(why) => write!(f, "skipped: {why}"),
            NoRate::Interrupted => f.write_str("interrupted"),
            NoRate::Failed(why) => write!(f, "failed: {why}"),
        }
    }
}

/// A re-run that measured a rate.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Measured {
    /// Its steady images/s ([`steady_rate`]).
    pub rate: f64,
    /// What its row adds in brackets: how the copy or the cache was made, what the re-run
    /// read from it.
    pub note: Option<String>,
    /// A copy or a pack made for it: what it is called in the cost line, and its seconds.
    pub cost: Option<(&'static str, f64)>,
    /// Its summary: who else held the machine's cores while it ran ([`Elsewhere`]).
    pub summary: Option<Box<Summary>>,
}

impl Measured {
    /// The rate a summary gives, or [`NoRate::Failed`] where it has none.
    pub fn of(s: Summary) -> Outcome {
        let rate = steady_rate(&s).ok_or_else(|| NoRate::Failed("no images/s in the summary".into()))?;
        Ok(Measured { rate, summary: Some(Box::new(s)), ..Measured::default() })
    }
}

/// What one re-run gave.
pub type Outcome = Result<Measured, NoRate>;

/// Makes the re-runs in turn, `each(k)` the k-th, each announced ("run k/n: label …"), until
/// the last or Ctrl-C (before a run, or one that was interrupted): then it says how many ran
/// and the rest are skipped. The outcomes of the runs made, in order; never
/// [`NoRate::Interrupted`].
pub fn drive(labels: &[&str], mut each: impl FnMut(usize) -> Outcome) -> Vec<Outcome> {
    let n = labels.len();
    let mut done = Vec::with_capacity(n);
    for (k, label) in labels.iter().enumerate() {
        if !pipeprof_core::signal::stopping() {
            pipeprof_trainer::progress::say(&format!("check-advice: run {}/{n}: {label} …", k + 1));
            match each(k) {
                Err(NoRate::Interrupted) => {}
                outcome => {
                    done.push(outcome);
                    continue;
                }
            }
        }
        pipeprof_trainer::progress::say(&format!("check-advice: interrupted: {k} of {n} runs done, the rest skipped"));
        break;
    }
    done
}

fn last_line(b: &[u8]) -> String {
    let t = String::from_utf8_lossy(b);
    t.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or(NO_OUTPUT).trim().to_string()
}

/// [`last_line`] of a child that wrote no error.
const NO_OUTPUT: &str = "no output";

/// The interrupt a child ended of (SIGINT/SIGTERM, or pipeprof's exit code after one), if
/// any: the interrupt hit this process's group, whether or not this process's own signal
/// thread has taken it yet.
fn interrupted_by(status: std::process::ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(130), _) | (_, Some(libc::SIGINT)) => Some(libc::SIGINT),
        (Some(143), _) | (_, Some(libc::SIGTERM)) => Some(libc::SIGTERM),
        _ => None,
    }
}

/// How long a re-run may take before it is stopped as hung: its steps at [`LIMIT_FACTOR`]
/// times the main run's time a step (`main`: its clock over its steps), plus [`LIMIT_START`]
/// for the program's start. A re-run changes one thing; one ten times slower than the run it
/// re-runs is not one to wait for. Pure.
pub fn time_limit(main: &Summary, steps: u64) -> Duration {
    let per_step = if main.steps > 0 && main.elapsed_s.is_finite() { main.elapsed_s / main.steps as f64 } else { 0.0 };
    LIMIT_START + Duration::from_secs_f64((per_step * steps as f64 * LIMIT_FACTOR).clamp(0.0, 86_400.0))
}

/// See [`time_limit`].
pub const LIMIT_FACTOR: f64 = 10.0;
/// See [`time_limit`]: a Python program's imports, its workers' start, a cold disk.
pub const LIMIT_START: Duration = Duration::from_secs(120);
/// How long a child stopped for its time has to end before it is killed: a child `pipeprof
/// run`'s own stop (its program's group ended after its stop timeout and the kill after it),
/// and a margin.
const LIMIT_STOP: Duration = pipeprof_core::signal::STOP_TIMEOUT
    .saturating_add(pipeprof_core::signal::KILL_AFTER)
    .saturating_add(Duration::from_secs(10));

/// Runs `exe args` with `env` added, no input and its output kept (the last line of its
/// errors says why it failed), then reads its summary file; stopped (then killed) after
/// `limit` ([`time_limit`]): a program hung in its re-run, a deadlocked loader, fails its row
/// instead of holding the check for ever.
pub fn run_child_summary(
    exe: &Path,
    args: &[OsString],
    env: &[(&str, String)],
    summary: &Path,
    limit: Duration,
) -> Result<Summary, NoRate> {
    let mut c = Command::new(exe);
    c.args(args).envs(env.iter().map(|(k, v)| (k, v)));
    let (status, err) = run_limited(c, exe, Some(limit))?;
    if !status.success() {
        return Err(NoRate::Failed(format!("exited with {status}: {err}")));
    }
    let text = std::fs::read(summary).map_err(|e| format!("no summary at {}: {e}", summary.display()))?;
    Ok(serde_json::from_slice(&text).map_err(|e| format!("unreadable summary: {e}"))?)
}

/// How long a child told to stop (the interrupt passed on) has to end before it is killed.
const CHILD_STOP: Duration = Duration::from_secs(5);
/// How often a waiting parent looks at its child and at the interrupts.
const LOOK_EVERY: Duration = Duration::from_millis(20);

/// Runs a child pipeprof (a follow-up, a re-run, `pack`, `cache`) as this process's stand-in:
/// no input, no output but its errors (the last line returned), a process group of its own
/// (so an interrupt reaches it once, passed on from here), and SIGTERM when this process dies
/// (SIGKILL, the OOM killer: it never outlives pipeprof, as the main run's program does not).
/// The first interrupt is passed on ([`pipeprof_core::signal::received`]: SIGINT stays SIGINT, the
/// others are SIGTERM) and the child gets [`CHILD_STOP`] to end (then SIGKILL): [`NoRate::Interrupted`];
/// a second one ends this process at once ([`exit_at_once`]).
pub fn run_watched(c: Command, exe: &Path) -> Result<(std::process::ExitStatus, String), NoRate> {
    run_limited(c, exe, None)
}

/// [`run_watched`], with the child stopped as an interrupt would (SIGTERM to its group, then
/// SIGKILL after [`CHILD_STOP`]) once it has run `limit`: [`NoRate::Failed`] saying so.
fn run_limited(
    mut c: Command,
    exe: &Path,
    limit: Option<Duration>,
) -> Result<(std::process::ExitStatus, String), NoRate> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).process_group(0);
    // SAFETY: only async-signal-safe calls between fork and exec. Spawned from the main thread,
    // which lives as long as pipeprof does (the death signal follows the spawning thread).
    unsafe {
        c.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            if libc::getppid() != parent as libc::pid_t {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let mut child = c.spawn().map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let mut err = child.stderr.take();
    let reader = std::thread::Builder::new().name("pp-child-err".into()).spawn(move || {
        let mut b = Vec::new();
        if let Some(e) = err.as_mut() {
            let _ = e.read_to_end(&mut b);
        }
        b
    });
    let status = watch(&mut child, limit);
    let err = reader.ok().and_then(|r| r.join().ok()).unwrap_or_default();
    match status {
        Err(NoRate::Failed(why)) if limit.is_some() && why.is_empty() => {
            let secs = limit.map_or(0, |l| l.as_secs());
            let said = match last_line(&err) {
                l if l == NO_OUTPUT => String::new(),
                l => format!("; its last error line: {l}"),
            };
            Err(NoRate::Failed(format!(
                "stopped after {secs} s, over {LIMIT_FACTOR:.0}× the main run's time for its steps: hung?{said}"
            )))
        }
        status => Ok((status?, last_line(&err))),
    }
}

/// Waits for `child`, passing an interrupt on (see [`run_watched`]); past `limit`, stops it
/// and gives `NoRate::Failed` with no words ([`run_limited`] says why).
fn watch(child: &mut std::process::Child, limit: Option<Duration>) -> Result<std::process::ExitStatus, NoRate> {
    let pid = child.id() as libc::pid_t;
    let started = Instant::now();
    let mut told: Option<Instant> = None;
    let mut too_long = false;
    loop {
        // Read before the child is looked at: one that ends in between ended in time.
        let expired = limit.is_some_and(|l| started.elapsed() > l);
        let ended = child.try_wait().map_err(|e| format!("cannot wait for the child: {e}"))?;
        if let Some(status) = ended {
            if too_long {
                return Err(NoRate::Failed(String::new()));
            }
            if told.is_some() {
                return Err(NoRate::Interrupted);
            }
            if let Some(sig) = interrupted_by(status) {
                // Signalled by someone else while this process's signal thread has not seen
                // an interrupt: this run ends as interrupted too.
                if !pipeprof_core::signal::stopping() {
                    pipeprof_core::signal::interrupt(sig);
                }
                return Err(NoRate::Interrupted);
            }
            return Ok(status);
        }
        if pipeprof_core::signal::interrupts() >= 2 {
            // SAFETY: kill on the child's own process group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            exit_at_once();
        }
        if !too_long && told.is_none() && expired {
            // SAFETY: kill on the child's own process group, the child not yet reaped.
            unsafe { libc::kill(-pid, libc::SIGTERM) };
            (too_long, told) = (true, Some(Instant::now()));
        }
        match told {
            None if pipeprof_core::signal::stopping() => {
                let sig =
                    if pipeprof_core::signal::received() == Some(libc::SIGINT) { libc::SIGINT } else { libc::SIGTERM };
                // SAFETY: kill on the child, which is not yet reaped (its pid is still ours).
                unsafe { libc::kill(pid, sig) };
                told = Some(Instant::now());
            }
            // Stopped for its time, a child `pipeprof run` gets its own way out: the program it
            // runs (a group of its own, out of this one's reach) is passed the SIGTERM, then its
            // group is ended after the stop timeout; a SIGKILL here sooner would orphan it.
            Some(t) if t.elapsed() > if too_long { LIMIT_STOP } else { CHILD_STOP } => {
                // SAFETY: as above.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
            _ => {}
        }
        std::thread::sleep(LOOK_EVERY);
    }
}

/// The scratch folders of this process ([`TempDir`]), removed by [`exit_at_once`].
pub(crate) static SCRATCH: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// A second interrupt while the re-runs are made (`run --check-advice`, whose run ends its
/// own way): the scratch folders removed, exit now with 128 + the first signal.
fn exit_at_once() -> ! {
    pipeprof_trainer::progress::say("check-advice: second interrupt: exiting now");
    for d in SCRATCH.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        let _ = std::fs::remove_dir_all(d);
    }
    std::process::exit(128 + pipeprof_core::signal::received().unwrap_or(libc::SIGINT));
}

/// Stops a wait of this process's own (the copy, sizing the pack) at an interrupt: the first
/// gives [`NoRate::Interrupted`], a second exits at once.
pub fn stop_check() -> Result<(), NoRate> {
    if pipeprof_core::signal::interrupts() >= 2 {
        exit_at_once();
    }
    if pipeprof_core::signal::stopping() {
        return Err(NoRate::Interrupted);
    }
    Ok(())
}

/// Under the table where a prediction is a floor.
pub const FLOOR_NOTE: &str =
    "(≥: a floor: the CPU work between the slow reads was measured cold, and runs faster once they are gone)";

/// The table. Predicted and measured × have one base, the baseline follow-up (same length,
/// same conditions; the main run's rate if the baseline failed): a prediction is a gain over
/// the main run's steady rate, so it is turned into images/s first (that rate × the gain) and
/// read against the baseline as the measurement is. A right prediction then reads as right
/// even where the main run and the baseline ran at different rates (a longer run, workers
/// chosen by `--workers auto`). Every rate is a steady state's ([`steady_rate`]). Pure.
pub fn render(runs: &[FollowUp], results: &[Outcome], main_images_per_s: f64, elsewhere: &Elsewhere) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let base = baseline_rate(results, main_images_per_s);
    let w = runs.iter().map(|r| r.label.chars().count()).max().unwrap_or(6).max(6);
    let _ = writeln!(
        o,
        "{:<w$}  {:>17}  {:>11}  {:>17}  {:>10}",
        "advice", "predicted images/s", "predicted ×", "measured images/s", "measured ×"
    );
    for (k, (f, m)) in runs.iter().zip(results).enumerate() {
        let (rate, pred) = predicted_cells(k, f, main_images_per_s, base);
        let note = m.as_ref().ok().and_then(|m| m.note.as_ref()).map(|n| format!("  ({n})")).unwrap_or_default();
        match m.as_ref().map(|m| m.rate) {
            // A × measured beside other programs' load is not the change's alone: in brackets.
            Ok(x) if k > 0 && elsewhere.swamped(k) => {
                let times = format!("({:.2}×)", x / base);
                let _ = writeln!(o, "{:<w$}  {rate:>18}  {pred:>11}  {x:>17.1}  {times:>10}{note}", f.label);
            }
            Ok(x) => {
                let _ = writeln!(o, "{:<w$}  {rate:>18}  {pred:>11}  {x:>17.1}  {:>9.2}×{note}", f.label, x / base);
            }
            Err(e) => {
                // Why comes from a child's output: one line, cleaned.
                let clean = |w: &str| {
                    pipeprof_core::aggregate::settings::clean_name(
                        w,
                        pipeprof_core::aggregate::settings::MAX_PATH_SHOWN,
                    )
                };
                let e = match e {
                    NoRate::Failed(why) => format!("failed: {}", clean(why)),
                    other => clean(&other.to_string()),
                };
                let _ = writeln!(o, "{:<w$}  {rate:>18}  {pred:>11}  {:>17}  {:>10}  {e}", f.label, "-", "-");
            }
        }
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "(× against the baseline run; predicted images/s = the main run's {main_images_per_s:.1} images/s × the predicted gain)"
    );
    if runs.iter().take(results.len()).any(|f| f.floor) {
        let _ = writeln!(o, "{FLOOR_NOTE}");
    }
    if let Some(w) = elsewhere.warning(results.len()) {
        let _ = writeln!(o, "{w}");
    }
    o
}

/// Follow-up `k`'s predicted cells: (images/s, × over `base`), from its gain over the rate it
/// was predicted against (the main run's, `main_images_per_s`, unless it says). The baseline
/// (`k` 0) is ×1 by definition; a floor's low end is its promise; a range shows both ends.
fn predicted_cells(k: usize, f: &FollowUp, main_images_per_s: f64, base: f64) -> (String, String) {
    let on = f.against.filter(|x| x.is_finite() && *x > 0.0).unwrap_or(main_images_per_s);
    match (k, f.predicted, f.range) {
        (0, _, _) => ("-".to_string(), "1.00×".to_string()),
        (_, Some(p), range) if f.floor => {
            let p = range.map_or(p, |(lo, _)| lo);
            (format!("≥{:.1}", p * on), format!("≥{:.2}×", p * on / base))
        }
        (_, Some(_), Some((lo, hi))) => {
            (format!("{:.0}–{:.0}", lo * on, hi * on), format!("{:.1}–{:.1}×", lo * on / base, hi * on / base))
        }
        (_, Some(p), None) => (format!("{:.1}", p * on), format!("{:.2}×", p * on / base)),
        (_, None, _) => ("-".into(), "-".into()),
    }
}

/// The rate every measured × is over: the baseline re-run's (the program re-run unchanged),
/// else the main run's. Pure.
pub fn baseline_rate(results: &[Outcome], main_images_per_s: f64) -> f64 {
    match results.first() {
        Some(Ok(m)) => m.rate,
        _ => main_images_per_s,
    }
}

/// What each piece of `advice` measured when re-run (`None`: not re-run), for `--json`: a
/// row's change is its advice's (the first with it); × over the baseline row's rate, else
/// the main run's. Pure.
pub fn checked(
    rows: &[FollowUp],
    results: &[Outcome],
    main_images_per_s: f64,
    elsewhere: &Elsewhere,
    advice: &[pipeprof_core::diagnose::Advice],
) -> Vec<Option<crate::report::json::Checked>> {
    use crate::report::json::{CheckStatus, Checked};
    let base = baseline_rate(results, main_images_per_s);
    let mut out: Vec<Option<Checked>> = vec![None; advice.len()];
    for (k, (row, result)) in rows.iter().zip(results).enumerate().skip(1) {
        let Some(i) = advice.iter().position(|a| Some(&a.change) == row.change.as_ref()) else { continue };
        if out[i].is_some() {
            continue;
        }
        let shared_machine = elsewhere.swamped(k);
        out[i] = Some(match result {
            Ok(m) => Checked {
                status: CheckStatus::Measured,
                images_per_s: Some(m.rate),
                speedup: (base > 0.0).then(|| m.rate / base),
                shared_machine,
                why: None,
            },
            Err(e) => Checked {
                status: if matches!(e, NoRate::Skipped(_)) { CheckStatus::Skipped } else { CheckStatus::Failed },
                images_per_s: None,
                speedup: None,
                shared_machine,
                why: Some(match e {
                    NoRate::Skipped(w) | NoRate::Failed(w) => w.clone(),
                    NoRate::Interrupted => "interrupted".into(),
                }),
            },
        });
    }
    out
}

/// Who else held this machine's cores during each run, where anyone did ([`busy_elsewhere`]):
/// the main run (the predictions' basis) and each re-run, the baseline first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Elsewhere {
    pub main: Option<String>,
    pub runs: Vec<Option<String>>,
}

impl Elsewhere {
    /// The main run's load and each re-run's, from their summaries (`None`: no summary).
    pub fn of(main: &Summary, runs: &[Option<&Summary>]) -> Elsewhere {
        Elsewhere { main: busy_elsewhere(main), runs: runs.iter().map(|s| s.and_then(busy_elsewhere)).collect() }
    }

    /// The same, from the re-runs' outcomes.
    pub fn of_outcomes(main: &Summary, runs: &[Outcome]) -> Elsewhere {
        let loads: Vec<Option<&Summary>> =
            runs.iter().map(|o| o.as_ref().ok().and_then(|m| m.summary.as_deref())).collect();
        Elsewhere::of(main, &loads)
    }

    /// Re-run `k`'s × is not the change's alone: other programs shared it or its baseline.
    fn swamped(&self, k: usize) -> bool {
        let busy = |k: usize| self.runs.get(k).is_some_and(Option::is_some);
        busy(0) || busy(k)
    }

    /// Under the table, where any run shared the machine: which runs, who, and what to do.
    fn warning(&self, shown: usize) -> Option<String> {
        let mut during: Vec<String> = Vec::new();
        if let Some(w) = &self.main {
            during.push(format!("the main run ({w})"));
        }
        for (k, w) in self.runs.iter().take(shown).enumerate() {
            if let Some(w) = w {
                let run = if k == 0 { "the baseline".to_string() } else { format!("run {}", k + 1) };
                during.push(format!("{run} ({w})"));
            }
        }
        if during.is_empty() {
            return None;
        }
        let rows = if (0..shown).any(|k| self.swamped(k)) {
            " A × measured beside them is not the change's alone: it is shown in brackets."
        } else {
            " The predictions were made on a run they shared, the re-runs on a quieter machine."
        };
        Some(format!(
            "check-advice: unreliable on this machine: other programs held cores during {}.{rows} Check again when the machine is quiet.",
            during.join(", ")
        ))
    }
}

/// Why a run's measurement is not the change's alone: other programs kept cores busy
/// ([`pipeprof_core::diagnose::OTHER_CORES`] or more, the median sampled) or the hypervisor took them
/// (steal [`pipeprof_core::diagnose::STEAL_PCT`]% or more); `None` on a quiet machine. Pure.
fn busy_elsewhere(s: &Summary) -> Option<String> {
    let m = &s.machine;
    let mut why = Vec::new();
    if let Some(c) = m.other_cores_median.map(f64::from).filter(|c| *c >= pipeprof_core::diagnose::OTHER_CORES) {
        let names: Vec<String> = m
            .others
            .iter()
            .filter(|o| f64::from(o.cpu_pct) >= pipeprof_core::diagnose::NAMED_OTHER_PCT)
            .take(3)
            .map(|o| format!("{} {:.0}%", o.name, o.cpu_pct))
            .collect();
        let names = if names.is_empty() { String::new() } else { format!(": {}", names.join(", ")) };
        why.push(format!("{c:.1} of {} cores busy{names}", m.cores));
    }
    if let Some(st) = m.steal_mean_pct.map(f64::from).filter(|s| *s >= pipeprof_core::diagnose::STEAL_PCT) {
        why.push(format!("{st:.0}% of the CPU stolen by the hypervisor"));
    }
    (!why.is_empty()).then(|| why.join(", "))
}

/// A verdict that says only `advice` (what the plans read), for the re-run plans' tests here
/// in both checks.
#[cfg(test)]
pub(crate) fn verdict_with(advice: Vec<pipeprof_core::diagnose::Advice>) -> pipeprof_core::diagnose::Verdict {
    use pipeprof_core::diagnose::{Limiter, Severity, Verdict};
    Verdict {
        limiter: Limiter::Preprocess,
        severity: Severity::High,
        headline: String::new(),
        evidence: Vec::new(),
        measures: Vec::new(),
        flags: Vec::new(),
        advice,
        provisional: false,
        now: None,
    }
}

/// Advice to `change` with gain `gain` and no basis, its command pipeprof's own, for the
/// re-run plans' tests here and in both checks.
#[cfg(test)]
pub(crate) fn advice_with(
    change: pipeprof_core::diagnose::Change,
    gain: Option<f64>,
) -> pipeprof_core::diagnose::Advice {
    pipeprof_core::diagnose::Advice {
        action: "x".into(),
        command: change.command(),
        change,
        predicted_speedup: gain,
        reason: "y".into(),
        basis: None,
    }
}

#[cfg(test)]
mod tests {
    use super::advice_with as advice;
    use super::*;
    use pipeprof_core::diagnose::{Advice, Change};

    #[test]
    fn a_re_run_may_take_ten_times_the_main_runs_steps_and_a_start() {
        let main = Summary { steps: 100, elapsed_s: 50.0, ..Summary::default() };
        assert_eq!(time_limit(&main, 40), LIMIT_START + Duration::from_secs(200));
        // A main run with no step (or no clock): the start alone.
        assert_eq!(time_limit(&Summary::default(), 40), LIMIT_START);
        let odd = Summary { steps: 3, elapsed_s: f64::NAN, ..Summary::default() };
        assert_eq!(time_limit(&odd, 40), LIMIT_START);
    }

    #[test]
    fn a_re_run_past_its_limit_is_stopped_and_its_row_says_so() {
        // A program that never ends (a loader deadlocked in its re-run), given no time at all.
        let mut c = Command::new("sh");
        c.args(["-c", "echo waiting for a batch >&2; exec sleep 1000"]);
        let e = run_limited(c, Path::new("sh"), Some(Duration::ZERO)).unwrap_err();
        let NoRate::Failed(why) = &e else { panic!("{e}") };
        assert!(why.starts_with("stopped after 0 s, over 10× the main run's time for its steps: hung?"), "{why}");
        // Its last words, when it wrote any before it was stopped.
        assert!(why.ends_with("hung?") || why.ends_with("hung?; its last error line: waiting for a batch"), "{why}");
        // Without a limit (a pack, a cache), a child that ends is waited for.
        let (status, last) = run_watched(Command::new("true"), Path::new("true")).unwrap();
        assert!(status.success(), "{status} {last:?}");
    }

    /// The table's rows for `advice`: the baseline, then a row each.
    fn plan(advice: Vec<Advice>) -> Vec<FollowUp> {
        std::iter::once(FollowUp::baseline())
            .chain(advice.iter().enumerate().map(|(k, a)| FollowUp::of(a, format!("advice {}", k + 1))))
            .collect()
    }

    fn ok(rate: f64) -> Outcome {
        Ok(Measured { rate, ..Measured::default() })
    }

    #[test]
    fn a_re_run_without_a_rate_says_why_skipped_or_failed() {
        assert_eq!(NoRate::Skipped("no room".into()).to_string(), "skipped: no room");
        assert_eq!(NoRate::from("exited with 1".to_string()).to_string(), "failed: exited with 1");
        assert!(
            Measured::of(Summary::default()).is_err_and(|e| e == NoRate::Failed("no images/s in the summary".into()))
        );
        let s = Summary { images_per_s: 12.5, ..Summary::default() };
        assert_eq!(Measured::of(s).map(|m| m.rate), Ok(12.5));
    }

    #[test]
    fn a_follow_up_ended_by_the_groups_interrupt_is_told_from_a_failure() {
        use std::os::unix::process::ExitStatusExt;
        let code = |c: i32| std::process::ExitStatus::from_raw(c << 8);
        let sig = std::process::ExitStatus::from_raw;
        for (status, want) in [
            (code(0), None),
            (code(1), None),
            (code(130), Some(libc::SIGINT)),
            (code(143), Some(libc::SIGTERM)),
            (sig(libc::SIGINT), Some(libc::SIGINT)),
            (sig(libc::SIGTERM), Some(libc::SIGTERM)),
            (sig(libc::SIGKILL), None),
        ] {
            assert_eq!(interrupted_by(status), want, "{status:?}");
        }
    }

    #[test]
    fn a_prediction_the_model_was_unsure_of_is_shown_as_its_range() {
        let mut a = advice(Change::Workers(4), Some(7.9));
        a.basis = Some(pipeprof_core::diagnose::Basis {
            now: 23.4,
            from_step: 1,
            to_step: 40,
            predicted: 185.0,
            model_now: 121.0,
            range: Some((1.53, 7.91)),
            slow_steps: false,
            compute_split_unknown: false,
            floor: false,
        });
        let runs = plan(vec![a]);
        assert_eq!(runs[1].range, Some((1.53, 7.91)));
        // The main run measured 23.4 images/s, the baseline re-run 20: the range in images/s
        // is 36–185, read against the baseline 1.8–9.3×.
        let t = render(&runs, &[ok(20.0), ok(60.0)], 20.0, &Elsewhere::default());
        assert!(
            t.lines().nth(2).is_some_and(|l| l.contains("36–185") && l.contains("1.8–9.3×") && l.contains("3.00×")),
            "{t}"
        );
    }

    #[test]
    fn render_has_one_row_per_run_and_says_why_a_run_failed() {
        let runs = plan(vec![advice(Change::Workers(2), Some(1.5)), advice(Change::Prefetch(4), None)]);
        let results = vec![ok(100.0), ok(150.0), Err(NoRate::Failed("exited with 1: boom".into()))];
        let t = render(&runs, &results, 90.0, &Elsewhere::default());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 6, "{t}");
        assert!(lines[0].contains("predicted ×") && lines[0].contains("measured images/s"));
        // 1.5 × the main run's 90 = 135 images/s predicted, 1.35× the baseline's 100.
        assert!(lines[2].contains("135.0") && lines[2].contains("1.35×") && lines[2].contains("150.0"), "{t}");
        assert!(lines[3].contains("failed: exited with 1: boom"), "{t}");
    }

    #[test]
    fn a_floor_reads_as_one_in_the_table_and_says_why_under_it() {
        let floor = |floor, range| {
            let mut a = advice(Change::Workers(2), Some(1.5));
            a.basis = Some(pipeprof_core::diagnose::Basis {
                now: 90.0,
                from_step: 1,
                to_step: 40,
                predicted: 135.0,
                model_now: 90.0,
                range,
                slow_steps: false,
                compute_split_unknown: false,
                floor,
            });
            render(&plan(vec![a]), &[ok(100.0), ok(150.0)], 90.0, &Elsewhere::default())
        };
        let (t, plain) = (floor(true, None), floor(false, None));
        let row = t.lines().nth(2).unwrap_or_default();
        assert!(row.contains("≥135.0") && row.contains("≥1.35×"), "{t}");
        // With a range (the model off today's rate), its low end: the high end is no ceiling.
        let ranged = floor(true, Some((1.2, 1.8)));
        let row = ranged.lines().nth(2).unwrap_or_default();
        assert!(row.contains("≥108.0") && row.contains("≥1.08×") && !row.contains('–'), "{ranged}");
        assert!(ranged.contains(FLOOR_NOTE), "{ranged}");
        assert!(t.contains(FLOOR_NOTE), "{t}");
        assert!(!plain.contains('≥') && !plain.contains(FLOOR_NOTE), "{plain}");
    }

    #[test]
    fn a_right_prediction_reads_as_right_when_the_baseline_ran_faster_than_the_main_run() {
        // The run: the main run measured 420 images/s, the baseline re-run 686;
        // --workers 16 was predicted ×17.15 (7204 images/s) and measured 7474.
        let mut a = advice(Change::Workers(16), Some(17.15));
        a.basis = Some(pipeprof_core::diagnose::Basis {
            now: 420.0,
            from_step: 1,
            to_step: 40,
            predicted: 7203.0,
            model_now: 420.0,
            range: None,
            slow_steps: false,
            compute_split_unknown: false,
            floor: false,
        });
        let runs = plan(vec![a]);
        let t = render(&runs, &[ok(686.0), ok(7474.0)], 420.0, &Elsewhere::default());
        let row = t.lines().nth(2).unwrap_or_default();
        // 7203 / 686 = 10.50× predicted, 7474 / 686 = 10.90× measured: one base.
        assert!(row.contains("7203.0") && row.contains("10.50×") && row.contains("10.90×"), "{t}");
    }

    #[test]
    fn a_run_shared_with_other_programs_has_its_times_in_brackets_and_a_warning() {
        use probes::sample::OtherCpu;
        let load = |cores: Option<f32>, steal: Option<f32>| {
            let mut s = Summary::default();
            s.machine.cores = 2;
            s.machine.other_cores_median = cores;
            s.machine.steal_mean_pct = steal;
            s.machine.others = vec![OtherCpu { name: "stress".into(), processes: 2, cpu_pct: 180.0 }];
            s
        };
        // The machine's own thresholds decide: 0.5 cores of others, 5% steal.
        for (cores, steal, want) in [
            (None, None, None),
            (Some(0.4), Some(4.0), None),
            (Some(1.8), None, Some("1.8 of 2 cores busy: stress 180%")),
            (None, Some(12.0), Some("12% of the CPU stolen by the hypervisor")),
        ] {
            assert_eq!(busy_elsewhere(&load(cores, steal)).as_deref(), want, "{cores:?} {steal:?}");
        }
        // A program under 5% is no one's competitor: not named.
        let mut idle = load(Some(1.8), None);
        idle.machine.others.push(OtherCpu { name: "kworker".into(), processes: 1, cpu_pct: 1.0 });
        assert!(busy_elsewhere(&idle).is_some_and(|w| !w.contains("kworker")));
        let runs = plan(vec![advice(Change::Workers(2), Some(0.8)), advice(Change::Prefetch(4), Some(1.1))]);
        let results = vec![ok(100.0), ok(185.0), ok(110.0)];
        let (quiet, busy) = (load(None, None), load(Some(1.8), None));
        // Run 2 (workers 2) shared the machine: its × is in brackets; the others are clean.
        let e = Elsewhere::of(&quiet, &[Some(&quiet), Some(&busy), Some(&quiet)]);
        let t = render(&runs, &results, 100.0, &e);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[2].contains("(1.85×)") && lines[3].contains("1.10×") && !lines[3].contains('('), "{t}");
        assert!(
            t.contains("unreliable on this machine") && t.contains("run 2 (1.8 of 2 cores busy: stress 180%)"),
            "{t}"
        );
        // A shared baseline makes every × unreliable.
        let t = render(&runs, &results, 100.0, &Elsewhere::of(&quiet, &[Some(&busy), Some(&quiet), Some(&quiet)]));
        assert!(t.contains("(1.85×)") && t.contains("(1.10×)") && t.contains("the baseline (1.8"), "{t}");
        // The baseline itself is ×1 by definition: never bracketed.
        assert!(t.lines().nth(1).is_some_and(|l| l.contains("1.00×") && !l.contains("(1.00×)")), "{t}");
        // Only the main run shared it: the × stand, the warning names the predictions' run.
        let t = render(&runs, &results, 100.0, &Elsewhere::of(&busy, &[Some(&quiet), Some(&quiet), Some(&quiet)]));
        assert!(t.contains("1.85×") && !t.contains("(1.85×)") && t.contains("the main run (1.8"), "{t}");
        // A quiet machine: no warning.
        let t = render(&runs, &results, 100.0, &Elsewhere::of(&quiet, &[Some(&quiet), None, Some(&quiet)]));
        assert!(!t.contains("unreliable"), "{t}");
    }
}
