//! `pipeprof run [OPTIONS] -- CMD ARGS…`: start a program instrumented and watch it.
//!
//! One server per run, hosted here: this command listens on a private Unix socket and starts
//! CMD with the socket's address in its environment. Every process of the run that links
//! pipeprof (a Python script through the start-up hook below, its DataLoader workers, a Rust
//! program with the probes crate) connects to it as a producer and sends its spans, steps and
//! settings over the attach wire format; the relays put them on this process's channel, and the
//! collector, views and exporters are the ones `profile` and `attach` use. Nothing in the
//! profiled program waits on this side.
//!
//! Python children need no edit: `PYTHONPATH` starts with a folder holding a
//! `sitecustomize.py` (python/pipeprof/_bootstrap/) that imports `pipeprof._auto`, which hooks
//! PyTorch's DataLoader and Keras's `fit`, then hands over to any `sitecustomize` it shadows.
//!
//! The child runs in a process group of its own. In plain mode on a terminal it is given the
//! terminal (Ctrl-C reaches it and its workers as if run directly; `breakpoint()` works); in
//! the live view it gets no terminal, its output goes to a private log file, and `q` or Ctrl-C
//! is passed to it as SIGINT. A SIGINT or SIGTERM sent to pipeprof is passed on the same way, to
//! the program itself: its own shutdown stops its workers.
//!
//! Every ending goes through one way out ([`ending`]): the program's exit, `--stop-timeout`
//! passing after the interrupt, a second interrupt or a hang-up (the group gets SIGTERM now,
//! SIGKILL [`signal::KILL_AFTER`] later), processes of the group left running after the program
//! ended (SIGTERM, then SIGKILL), a closed stdout: the trace is closed, the summary written, the
//! socket and the start-up hook's folder removed, and the program's exit code is this command's.
//! SIGQUIT/USR1/USR2/ALRM end it as SIGTERM does; Ctrl-Z under `--once` stops pipeprof's job
//! with the program ([`follow_job_control`]); pipeprof killed outright, the program gets SIGTERM.

use crate::report;
use crate::session::{self, Out, Running, SecondInterrupt, Session, Stop, TraceSpec};
use pipeprof_core::aggregate::RunSettings;
use pipeprof_core::diagnose::Diagnosed;
use pipeprof_core::signal;
use pipeprof_trainer::progress;
pub mod check;
pub mod ending;
mod relay;
mod terminal;

use relay::{connection_cap, raise_open_files, serve, Relays};
use terminal::{follow_job_control, give_terminal, own_terminal};

use anyhow::{bail, Context};
use ending::{outcome, sig_name, Act, Ending, Look, Outcome, Why};
use probes::attach::accept::Acceptor;
use probes::Probe;
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use probes::attach::{PARENT_ENV as ADDRESS_ENV, PARENT_PID_ENV};
// Set by the first Python process of a run to its pid: processes that see another pid are its
// workers.
use probes::env::MAIN_PID_ENV;

/// The start-up hook Python children import (the same file the wheel ships).
const SITECUSTOMIZE: &str = include_str!("../../../python/pipeprof/_bootstrap/sitecustomize.py");

/// What `pipeprof run` was asked for.
#[derive(Debug, Clone)]
pub struct Options {
    /// The program and its arguments.
    pub command: Vec<OsString>,
    /// No live view: a progress line, then the report (also off a terminal).
    pub once: bool,
    pub summary: Option<PathBuf>,
    pub trace: Option<PathBuf>,
    /// `--html`: the report as an HTML page, written when the program ends.
    pub html: Option<PathBuf>,
    pub sample_hz: f64,
    pub no_gpu: bool,
    /// After an interrupt was passed on: how long before the group gets SIGTERM.
    pub stop_timeout: Duration,
    /// `--metrics-listen`: serve `/metrics` there while the program runs.
    pub metrics_listen: Option<String>,
    pub metrics_allow_remote: bool,
    /// The machine this run is on, within its job (`--node`, `--job`, the launcher's
    /// environment): in the summary's settings, so on every rank's line, trace and series.
    pub node: probes::NodeId,
}

/// Files this run made, removed on every way out (the listener's socket, the hook's folder,
/// the live view's log unless the run failed).
struct Scratch {
    socket: PathBuf,
    boot: PathBuf,
    log: Option<PathBuf>,
    /// The run failed: its log stays, and its path is said.
    keep_log: bool,
}

impl Scratch {
    /// The run's socket, listening, and the hook's folder, private to this user.
    ///
    /// Both are named in the program's environment (`PIPEPROF_PARENT`, first on `PYTHONPATH`)
    /// and so outlive the run in any process the program leaves behind. Both are made in the
    /// one private folder of `probes::attach::folder`, which is never removed: once this run
    /// removed them, nobody else can make either name again (issue 52 H1; the fallback folder
    /// of a random name used to go with the run, and a neighbour could make it again with a
    /// `sitecustomize.py` of theirs in it). The installed `_bootstrap` folder would do for the
    /// hook, but not for the socket, nor for a `pipeprof` built from source.
    fn create() -> anyhow::Result<(Scratch, UnixListener)> {
        let dir = probes::attach::runtime_dir()?;
        let pid = std::process::id();
        let scratch = Scratch {
            socket: dir.join(format!("run-{pid}.sock")),
            boot: dir.join(format!("run-{pid}-boot")),
            log: None,
            keep_log: false,
        };
        let _ = std::fs::remove_file(&scratch.socket);
        let listener = UnixListener::bind(&scratch.socket)
            .with_context(|| format!("cannot listen on {}", scratch.socket.display()))?;
        std::fs::set_permissions(&scratch.socket, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot make {} private", scratch.socket.display()))?;
        write_boot(&scratch.boot)
            .with_context(|| format!("cannot write the start-up hook in {}", scratch.boot.display()))?;
        Ok((scratch, listener))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_dir_all(&self.boot);
        if let (Some(log), false) = (&self.log, self.keep_log) {
            let _ = std::fs::remove_file(log);
        }
    }
}

/// Makes the start-up hook's folder `boot` (mode 0700, in the private runtime folder: made
/// anew, never reused) and writes the hook into it, exclusive: nothing there is followed.
fn write_boot(boot: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    // A folder left by an earlier run whose pid this one has (it was killed with -9).
    let _ = std::fs::remove_dir_all(boot);
    std::fs::DirBuilder::new().mode(0o700).create(boot)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(boot.join("sitecustomize.py"))?;
    std::io::Write::write_all(&mut f, SITECUSTOMIZE.as_bytes())
}

/// The live view's log of the program's output: an unpredictable name in the temp folder,
/// created exclusive (a planted file or link is never opened), mode 0600.
fn create_log(dir: &Path) -> std::io::Result<(std::fs::File, PathBuf)> {
    let f = tempfile::Builder::new().prefix("pipeprof-run-").suffix(".log").tempfile_in(dir)?;
    f.keep().map_err(|e| e.error)
}

/// `PYTHONPATH` with `first` in front of what the user had.
fn python_path(first: &Path, existing: Option<OsString>) -> OsString {
    let mut paths = vec![first.to_path_buf()];
    if let Some(e) = existing.filter(|e| !e.is_empty()) {
        paths.extend(std::env::split_paths(&e));
    }
    std::env::join_paths(paths).unwrap_or_else(|_| first.as_os_str().to_os_string())
}

/// The program's name for messages: `python train.py` → "train.py", else the command's first word.
fn program_name(command: &[OsString]) -> String {
    let words: Vec<String> = command.iter().map(|w| w.to_string_lossy().into_owned()).collect();
    let base = |w: &str| Path::new(w).file_name().map_or_else(|| w.to_string(), |n| n.to_string_lossy().into_owned());
    let Some(first) = words.first() else { return "program".into() };
    let is_python = base(first).starts_with("python");
    match words.get(1) {
        Some(m) if is_python && m == "-m" => words.get(2).map_or("python -m".into(), |x| format!("python -m {x}")),
        Some(script) if is_python && !script.starts_with('-') => base(script),
        _ => base(first),
    }
}

/// How `pipeprof run` ended: the run's summary with its verdict, and the exit code (the
/// program's).
#[derive(Debug)]
pub struct Ran {
    pub done: Diagnosed,
    pub code: i32,
}

/// The command as every message and the trace's title show it: a newline or escape code in
/// an argument is shown as `?`, never written to the terminal.
fn shown(command: &[OsString]) -> String {
    use pipeprof_core::aggregate::settings::{clean_name, MAX_PATH_SHOWN};
    command.iter().map(|w| clean_name(&w.to_string_lossy(), MAX_PATH_SHOWN)).collect::<Vec<_>>().join(" ")
}

/// Runs `pipeprof run`: the program, watched until it and its processes have ended.
pub fn run(opts: &Options) -> anyhow::Result<Ran> {
    let Some(first) = opts.command.first() else {
        bail!("nothing to run: give the command after --, e.g. `pipeprof run -- python train.py`")
    };
    let program = program_name(&opts.command);
    // Bound before anything starts: a taken port fails here, not mid-run.
    let metrics =
        opts.metrics_listen.as_deref().map(|a| crate::metrics::bind(a, opts.metrics_allow_remote)).transpose()?;
    let shown = shown(&opts.command);
    let live = session::live_view(opts.once);
    let (mut scratch, listener) = Scratch::create()?;
    let mut running = start_session(opts, &program, &shown, live, metrics)?;
    let feeds = Feeds::start(opts, listener, running.probe())?;
    let take_terminal = !live && own_terminal();
    let mut cmd = command(opts, &mut scratch, live, take_terminal)?;
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Err(cannot_start(first, &e, feeds)),
    };
    progress::say(&format!(
        "pipeprof: running `{shown}` (pid {}){}",
        child.id(),
        scratch.log.as_ref().map(|l| format!("; its output goes to {}", l.display())).unwrap_or_default()
    ));
    let watch = Watch {
        relays: feeds.relays.clone(),
        out: running.out(),
        stop: running.stop(),
        stop_timeout: opts.stop_timeout,
        shown: shown.clone(),
        socket: scratch.socket.clone(),
        take_terminal,
    };
    let waiter = spawn_waiter(watch, child, &running)?;
    running.show();
    let (status, end) = waiter.join().map_err(|_| anyhow::anyhow!("the thread waiting for the program panicked"))?;
    let relays = feeds.stop();
    let status = status.context("the program's end was not seen")?.context("cannot wait for the program")?;
    let end = outcome(status, &program, end.interrupted(), end.killed());
    // A failed run's log stays for the user to read; the others go with the run.
    scratch.keep_log = matches!(end, Outcome::Failed { .. });
    let why = match &end {
        Outcome::Failed { why, .. } => Some(why.clone()),
        _ => None,
    };
    let log = scratch.log.as_deref().map(|l| (l, scratch.keep_log));
    let ran = finish(opts, running.finish(why), &end, &shown, log, &relays);
    drop(scratch);
    ran
}

/// The program would not start: nothing more to feed the run; why, with a hint when it was
/// not found.
fn cannot_start(first: &std::ffi::OsStr, e: &std::io::Error, feeds: Feeds) -> anyhow::Error {
    feeds.stop();
    let hint = if e.kind() == std::io::ErrorKind::NotFound { ": not found (is it on PATH?)" } else { "" };
    anyhow::anyhow!("cannot start `{}`{hint}: {e}", first.to_string_lossy())
}

/// The run's session, named for the program: a trace (and one per rank) if asked for, the
/// summary file, `/metrics`, the live view when `live`. A second interrupt or a hang-up still
/// ends the run here, through its one way out.
fn start_session(
    opts: &Options,
    program: &str,
    shown: &str,
    live: bool,
    metrics: Option<crate::metrics::Listener>,
) -> anyhow::Result<Running> {
    let settings = RunSettings {
        model: pipeprof_core::model_source::ModelSource::Program(program.to_string()),
        node: Some(opts.node.clone()),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        ..RunSettings::default()
    };
    let title = format!("pipeprof run: {shown}");
    let trace =
        opts.trace.as_deref().map(|path| TraceSpec { path, title: &title, level: Default::default(), per_rank: true });
    Session::new(settings, SecondInterrupt::EndsTheRun)
        .trace(trace)?
        .summary(opts.summary.clone())
        .html(opts.html.clone())
        .metrics(metrics)
        .no_tui(!live)
        .detect_data_fs(true)
        .start()
}

/// What feeds the run's channel besides its end: every process of the run, relayed through
/// the accept thread, and the machine's samples.
struct Feeds {
    acceptor: Acceptor,
    samplers: Option<probes::sampler::SamplerHandle>,
    relays: Arc<Relays>,
}

impl Feeds {
    fn start(opts: &Options, listener: UnixListener, probe: &Probe) -> anyhow::Result<Feeds> {
        let relays = Arc::new(Relays { cap: connection_cap(raise_open_files()), ..Relays::default() });
        let acceptor =
            serve(listener, probe.clone(), relays.clone()).context("cannot start accepting the run's processes")?;
        Ok(Feeds { acceptor, samplers: start_samplers(opts, probe), relays })
    }

    /// Stops accepting and sampling; the relays say who connected.
    fn stop(self) -> Arc<Relays> {
        self.acceptor.stop();
        if let Some(s) = self.samplers {
            s.stop();
        }
        self.relays
    }
}

/// Host and GPU sampling (the GPU is the program's, its workers' and its ranks': every process
/// below this one), or a warning and none.
fn start_samplers(opts: &Options, probe: &Probe) -> Option<probes::sampler::SamplerHandle> {
    let cfg = probes::sampler::SamplerConfig {
        hz: opts.sample_hz,
        gpu: !opts.no_gpu,
        gpu_tree: true,
        program_below: true,
        ..probes::sampler::SamplerConfig::default()
    };
    probes::sampler::start(probe.clone(), cfg)
        .map_err(|e| progress::warn(&format!("machine sampling is off: {e}")))
        .ok()
}

/// The program, in a process group of its own, with the run's address and the start-up hook
/// in its environment; its output in a private log while the live view holds the terminal, or
/// the terminal itself when `take_terminal`.
fn command(opts: &Options, scratch: &mut Scratch, live: bool, take_terminal: bool) -> anyhow::Result<Command> {
    let pid = std::process::id();
    let mut cmd = Command::new(&opts.command[0]);
    cmd.args(&opts.command[1..])
        .env(ADDRESS_ENV, &scratch.socket)
        .env(PARENT_PID_ENV, pid.to_string())
        .env_remove(MAIN_PID_ENV)
        .env("PYTHONPATH", python_path(&scratch.boot, std::env::var_os("PYTHONPATH")));
    if live {
        let (f, path) = create_log(&std::env::temp_dir())
            .with_context(|| format!("cannot create the program's log in {}", std::env::temp_dir().display()))?;
        scratch.log = Some(path);
        cmd.stdin(Stdio::null()).stdout(f.try_clone()?).stderr(f);
    } else if pipeprof_trainer::progress::stdout_for_json() {
        // `--json`: stdout is the document's alone; what the program prints goes to stderr.
        use std::os::fd::AsFd;
        cmd.stdout(Stdio::from(std::io::stderr().as_fd().try_clone_to_owned()?));
    }
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::setpgid(0, 0);
            // pipeprof killed outright (SIGKILL, the OOM killer) must not leave the program
            // training unseen: it gets SIGTERM, its own shutdown (and handlers) end it. Spawned
            // from the main thread, which lives as long as pipeprof does.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            if libc::getppid() != pid as libc::pid_t {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            if take_terminal {
                let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                libc::tcsetpgrp(0, libc::getpid());
                libc::signal(libc::SIGTTOU, old);
            }
            Ok(())
        });
    }
    Ok(cmd)
}

/// The thread waiting for the program and its processes (`pp-child`), doing what the ending
/// says at each look; closes the run's events and fires the session's `done` at the end.
#[allow(clippy::type_complexity)]
fn spawn_waiter(
    watch: Watch,
    child: std::process::Child,
    running: &Running,
) -> std::io::Result<std::thread::JoinHandle<(Option<std::io::Result<ExitStatus>>, Ending)>> {
    let (closer, done) = (running.closer(), running.done());
    std::thread::Builder::new().name("pp-child".into()).spawn(move || {
        let child_pid = child.id() as libc::pid_t;
        let ended = watch.until_the_end(child, child_pid);
        closer.close();
        let _ = done.send(());
        ended
    })
}

/// What the thread waiting for the program needs.
struct Watch {
    relays: Arc<Relays>,
    /// Where its lines go (held while the live view holds the terminal).
    out: Out,
    stop: Stop,
    stop_timeout: Duration,
    shown: String,
    socket: PathBuf,
    take_terminal: bool,
}

impl Watch {
    /// Looks at the run every 20 ms and does what its [`Ending`] says, until it says finish.
    /// Returns the program's exit status (None if never seen) and the ending.
    fn until_the_end(
        &self,
        mut child: std::process::Child,
        child_pid: libc::pid_t,
    ) -> (Option<std::io::Result<ExitStatus>>, Ending) {
        let started = Instant::now();
        let mut end = Ending::new(self.stop_timeout);
        let mut status: Option<std::io::Result<ExitStatus>> = None;
        let mut socket_gone = false;
        // Set by SIGCONT: pipeprof stopped with its program (Ctrl-Z) was continued.
        let continued = Arc::new(AtomicBool::new(false));
        let job_control = self.take_terminal && signal_hook::flag::register(libc::SIGCONT, continued.clone()).is_ok();
        loop {
            if status.is_none() {
                status = child.try_wait().transpose();
                if status.is_some() && self.take_terminal {
                    give_terminal(0);
                }
            }
            if status.is_none() && job_control {
                follow_job_control(child_pid, &continued);
            }
            if !socket_gone && std::fs::symlink_metadata(&self.socket).is_err() {
                socket_gone = true;
                self.out.say(format!(
                    "warning: the run's socket {} was removed (a temp cleaner?): processes started from \
                     now on cannot send their spans; the run goes on",
                    self.socket.display()
                ));
            }
            let look = self.look(started.elapsed(), status.is_some(), child_pid);
            if self.act(end.step(&look), child_pid) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (status, end)
    }

    /// What the ending decides on, now.
    fn look(&self, now: Duration, exited: bool, child_pid: libc::pid_t) -> Look {
        let last = self.relays.last_ns.load(Ordering::Relaxed);
        Look {
            now,
            // The live view's q stops the run like an interrupt.
            interrupts: self.stop.interrupts(),
            terminated: self.stop.terminating(),
            hangup: self.stop.hung_up(),
            exited,
            group_alive: group_alive(child_pid),
            connected: self.relays.open.load(Ordering::SeqCst) > 0,
            quiet_for: Duration::from_nanos(probes::clock::now_ns().saturating_sub(last)),
        }
    }

    /// Does what the ending said; whether it said finish.
    fn act(&self, acts: Vec<Act>, child_pid: libc::pid_t) -> bool {
        let mut finished = false;
        for act in acts {
            match act {
                Act::PassOn(sig) => {
                    // To the program, not its whole group: its own shutdown stops its workers
                    // (a KeyboardInterrupt inside a multiprocessing worker that is writing a
                    // result can hang Python's Pool at exit).
                    // SAFETY: kill on the process we started, not yet reaped.
                    unsafe { libc::kill(child_pid, sig) };
                    self.out.say(format!(
                        "pipeprof: interrupt passed to `{}`; if it has not ended in {} s \
                         (--stop-timeout), its process group gets SIGTERM (an interrupt again does that now)",
                        self.shown,
                        self.stop_timeout.as_secs_f64()
                    ));
                }
                Act::Group { sig, why } => {
                    self.out.say(group_message(&self.shown, sig, why, self.stop_timeout));
                    // SAFETY: kill on the process group we started.
                    unsafe { libc::kill(-child_pid, sig) };
                }
                Act::Finish => finished = true,
            }
        }
        finished
    }
}

/// Whether any process of the group `pgid` is alive (a zombie not yet reaped counts).
fn group_alive(pgid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the group exists.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

/// What is said when the program's group gets `sig`.
fn group_message(shown: &str, sig: libc::c_int, why: Why, stop_timeout: Duration) -> String {
    let name = sig_name(sig);
    let kill_after = signal::KILL_AFTER.as_secs();
    match why {
        Why::StopTimeout => format!(
            "warning: `{shown}` has not ended {} s after the interrupt: {name} to its process group (--stop-timeout)",
            stop_timeout.as_secs_f64()
        ),
        Why::Again => format!(
            "pipeprof: second interrupt: {name} to `{shown}`'s process group (SIGKILL {kill_after} s later, or at \
             a third interrupt); the trace and the summary are written once it has ended"
        ),
        Why::Hangup => format!(
            "pipeprof: the terminal hung up: {name} to `{shown}`'s process group (SIGKILL {kill_after} s later); \
             the trace and the summary are written once it has ended"
        ),
        Why::Leftovers => format!(
            "pipeprof: `{shown}` ended, processes it started did not: {name} to its process group \
             (SIGKILL {kill_after} s later)"
        ),
        Why::StillRunning => {
            format!("warning: `{shown}` has not ended {kill_after} s after SIGTERM: {name} to its process group")
        }
    }
}

/// The report and the program's fate, after the summary file (written by the session first:
/// a closed stdout (`pipeprof run … | head`) or terminal must not cost it, and nothing printed
/// can panic).
fn finish(
    opts: &Options,
    fin: session::Finished,
    end: &Outcome,
    shown: &str,
    log: Option<(&Path, bool)>,
    relays: &Relays,
) -> anyhow::Result<Ran> {
    let session::Finished { mut done, failed, collector_died, written } = fin;
    // What the program said (an exception) comes first; the exit status after it.
    done.summary.failed = failed;
    if let Some((log, kept)) = log {
        print_log_tail(log, kept);
    }
    progress::out(&report::render(&done));
    let processes = relays.processes.lock().map(|p| p.len()).unwrap_or(0);
    if processes == 0 {
        progress::warn(&format!(
            "no process of `{shown}` connected: only the machine was sampled. A Python program needs the \
             pipeprof package in the interpreter it runs (pip install pipeprof); a Rust one links the probes crate"
        ));
    }
    match end {
        Outcome::Ok => progress::say(&format!("pipeprof: `{shown}` finished")),
        Outcome::Interrupted(c) => {
            progress::say(&format!("pipeprof: `{shown}` was interrupted (exit code {c}): the report covers what ran"))
        }
        Outcome::Failed { why, .. } => {
            progress::say(&format!("pipeprof: RUN FAILED: {}", done.summary.failed.as_deref().unwrap_or(why)));
            progress::say("pipeprof: the report above covers the steps done before the failure");
        }
    }
    if let (Some(t), false) = (&opts.trace, done.summary.ranks.is_empty()) {
        let files: Vec<String> = done
            .summary
            .ranks
            .iter()
            .map(|l| crate::export::ranks::rank_path(t, l.rank).display().to_string())
            .collect();
        progress::say(&format!("pipeprof: a trace per rank written to {}", files.join(", ")));
    }
    written?;
    match collector_died {
        Some(why) => Err(anyhow::anyhow!(why)),
        None => Ok(Ran { done, code: end.code() }),
    }
}

/// The last lines the program printed while the live view had the terminal; where the whole
/// log is when it is `kept` (a failed run's), else it is removed with the run.
fn print_log_tail(log: &Path, kept: bool) {
    const LINES: usize = 20;
    let Ok(text) = std::fs::read(log) else { return };
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    if lines.is_empty() {
        return;
    }
    if kept {
        progress::say(&format!("pipeprof: the program's output is kept in {} ; its last lines:", log.display()));
    } else {
        progress::say("pipeprof: the program's last lines:");
    }
    for l in &lines[lines.len().saturating_sub(LINES)..] {
        progress::say(&format!("  | {l}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn the_program_is_named_by_its_script() {
        for (cmd, name) in [
            ("python train.py --workers 2", "train.py"),
            ("/usr/bin/python3.11 /home/u/proj/train.py", "train.py"),
            ("python -m mypkg.train", "python -m mypkg.train"),
            ("python -u train.py", "python"),
            ("./target/release/examples/train_cnn --data x", "train_cnn"),
            ("torchrun --nproc_per_node 2 train.py", "torchrun"),
        ] {
            assert_eq!(program_name(&words(cmd)), name, "{cmd}");
        }
        assert_eq!(program_name(&[]), "program");
    }

    #[test]
    fn the_log_is_private_unpredictable_and_never_opened_through_a_planted_link() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().expect("temp dir");
        // Before, the name was pipeprof-run-<pid>.log: a link planted there was followed and its
        // target truncated. Now a fresh name each time, created exclusive, mode 0600.
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "keep me").expect("victim");
        std::os::unix::fs::symlink(&victim, tmp.path().join(format!("pipeprof-run-{}.log", std::process::id())))
            .expect("link");
        let (_f, a) = create_log(tmp.path()).expect("log");
        let (_g, b) = create_log(tmp.path()).expect("log");
        assert_ne!(a, b);
        assert_eq!(std::fs::metadata(&a).expect("stat").permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "keep me");
        // The hook's folder: 0700, and a link planted as its hook is not followed.
        let boot = tmp.path().join("boot");
        write_boot(&boot).expect("boot");
        assert_eq!(std::fs::metadata(&boot).expect("stat").permissions().mode() & 0o777, 0o700);
        assert!(std::fs::read_to_string(boot.join("sitecustomize.py")).expect("hook").contains("pipeprof"));
        write_boot(&boot).expect("made anew over a stale one");
    }

    #[test]
    fn the_hook_goes_first_on_pythonpath() {
        let p = python_path(Path::new("/run/boot"), Some(OsString::from("/a:/b")));
        assert_eq!(p, OsString::from("/run/boot:/a:/b"));
        assert_eq!(python_path(Path::new("/run/boot"), Some(OsString::new())), OsString::from("/run/boot"));
        assert_eq!(python_path(Path::new("/run/boot"), None), OsString::from("/run/boot"));
    }
}
