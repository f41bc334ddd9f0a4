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
//! the live view it gets no terminal, its output goes to a log file, and `q` or Ctrl-C is
//! passed to it as SIGINT. A SIGINT or SIGTERM sent to pipeprof is passed on the same way, to
//! the program itself: its own shutdown stops its workers. A second interrupt ends pipeprof
//! and sends SIGTERM to the program's whole group; so does `--stop-timeout` passing with the
//! program still running after the interrupt (then SIGKILL, [`signal::KILL_AFTER`] later). The
//! child's exit code is this command's.

use crate::aggregate::{Aggregator, RunSettings};
use crate::diagnose::Diagnosed;
use crate::export::chrome::ChromeTrace;
use crate::export::Exporter;
use crate::{progress, report, session, signal};
use anyhow::{bail, Context};
use probes::attach::wire;
use probes::{Event, Probe};
use std::ffi::OsString;
use std::io::{BufReader, IsTerminal};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use probes::attach::{PARENT_ENV as ADDRESS_ENV, PARENT_PID_ENV};
/// Set by the first Python process of a run to its pid: processes that see another pid are
/// its workers.
pub const MAIN_PID_ENV: &str = "PIPEPROF_MAIN_PID";

/// The start-up hook Python children import (the same file the wheel ships).
const SITECUSTOMIZE: &str = include_str!("../python/pipeprof/_bootstrap/sitecustomize.py");

/// How long, after the program exited, its processes' last frames may take to arrive: while
/// a process of the run is still connected and sent something in the last [`QUIET`], up to
/// [`DRAIN`] (a pool worker ended by SIGTERM sends its last spans from its handler).
const DRAIN: Duration = Duration::from_secs(10);
const QUIET: Duration = Duration::from_secs(1);

/// What `pipeprof run` was asked for.
#[derive(Debug, Clone)]
pub struct Options {
    /// The program and its arguments.
    pub command: Vec<OsString>,
    /// No live view: a progress line, then the report (also off a terminal).
    pub once: bool,
    pub summary: Option<PathBuf>,
    pub trace: Option<PathBuf>,
    pub sample_hz: f64,
    pub no_gpu: bool,
    /// After an interrupt was passed on: how long before the group gets SIGTERM.
    pub stop_timeout: Duration,
    /// `--metrics-listen`: serve `/metrics` there while the program runs.
    pub metrics_listen: Option<String>,
    pub metrics_allow_remote: bool,
}

/// How the program ended, in the run's terms.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    /// Exit code 0.
    Ok,
    /// Stopped by an interrupt (SIGINT/SIGTERM, or exit codes 130/143 after one).
    Interrupted(i32),
    /// Anything else: a failure, with this exit code.
    Failed { code: i32, why: String },
}

/// Reads an exit status: the code pipeprof exits with, and what it means. `interrupted` says
/// whether an interrupt was passed on to the program (then exit code 1 from Python's
/// KeyboardInterrupt traceback is an interruption too); `killed`, whether pipeprof then sent
/// its group SIGKILL (dying of it is the interruption the user asked for, not a failure).
pub fn ending(status: ExitStatus, program: &str, interrupted: bool, killed: bool) -> Ending {
    match (status.code(), status.signal()) {
        (Some(0), _) => Ending::Ok,
        (None, Some(libc::SIGKILL)) if killed => Ending::Interrupted(128 + libc::SIGKILL),
        (Some(c @ (130 | 143)), _) => Ending::Interrupted(c),
        (Some(1), _) if interrupted => Ending::Interrupted(1),
        (Some(c), _) => Ending::Failed { code: c, why: format!("{program} exited with status {c}") },
        (None, Some(s @ (libc::SIGINT | libc::SIGTERM))) => Ending::Interrupted(128 + s),
        (None, Some(s)) => Ending::Failed { code: 128 + s, why: format!("{program} was killed by signal {s}") },
        (None, None) => Ending::Failed { code: 1, why: format!("{program} ended without an exit status") },
    }
}

impl Ending {
    pub fn code(&self) -> i32 {
        match self {
            Ending::Ok => 0,
            Ending::Interrupted(c) => *c,
            Ending::Failed { code, .. } => *code,
        }
    }
}

/// A signal sent to the program's group because it did not end after the interrupt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Escalation {
    pub sig: libc::c_int,
    pub name: &'static str,
    /// How long after the interrupt it is due.
    pub after: Duration,
}

/// A program that has not ended `since` after the interrupt was passed on to it: the signal
/// its process group gets now, if any, when `sent` escalations were sent already. SIGTERM once
/// `stop_timeout` has passed, SIGKILL [`signal::KILL_AFTER`] later, then nothing more.
pub fn escalation(since: Duration, stop_timeout: Duration, sent: usize) -> Option<Escalation> {
    let (sig, name, after) = match sent {
        0 => (libc::SIGTERM, "SIGTERM", stop_timeout),
        1 => (libc::SIGKILL, "SIGKILL", stop_timeout + signal::KILL_AFTER),
        _ => return None,
    };
    (since >= after).then_some(Escalation { sig, name, after })
}

/// The producers relaying into this run: connections not yet ended, and who they were.
#[derive(Default)]
struct Relays {
    open: AtomicUsize,
    processes: Mutex<Vec<String>>,
    /// When bytes last arrived from any process of the run (monotonic ns).
    last_ns: AtomicU64,
}

/// A connection that notes when bytes arrive.
struct Noting<'a> {
    conn: &'a UnixStream,
    last: &'a AtomicU64,
}

impl std::io::Read for Noting<'_> {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        let n = (&mut &*self.conn).read(b)?;
        if n > 0 {
            self.last.store(probes::clock::now_ns(), Ordering::Relaxed);
        }
        Ok(n)
    }
}

/// Files this run made, removed on every way out (the listener's socket, the hook's folder).
struct Scratch {
    socket: PathBuf,
    boot: PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_dir_all(&self.boot);
    }
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
pub fn program_name(command: &[OsString]) -> String {
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

fn serve(listener: UnixListener, probe: Probe, relays: Arc<Relays>, stop: Arc<AtomicBool>) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut conn) = conn else { continue };
        relays.open.fetch_add(1, Ordering::SeqCst);
        let (probe, mine) = (probe.clone(), relays.clone());
        let spawned = std::thread::Builder::new().name("pp-relay".into()).spawn(move || {
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            match wire::check_peer_hello(&mut conn) {
                Ok(wire::Peer::Producer) => {
                    let _ = conn.set_read_timeout(None);
                    let noting = Noting { conn: &conn, last: &mine.last_ns };
                    let r = probes::attach::producer::relay(&mut BufReader::new(noting), &probe);
                    if let Ok(mut p) = mine.processes.lock() {
                        p.push(format!("{} (pid {})", r.hello.program, r.hello.pid));
                    }
                    if let Some(e) = r.error.filter(|e| *e != wire::WireError::Closed) {
                        progress::warn(&format!(
                            "{} (pid {}) stopped sending: {e}; its later spans are missing",
                            r.hello.program, r.hello.pid
                        ));
                    }
                }
                Ok(wire::Peer::Viewer) => progress::warn(
                    "a viewer tried to attach to `pipeprof run`'s socket: this run is shown here, not served",
                ),
                Err(e) => progress::warn(&format!("refused a connection to the run's socket: {e}")),
            }
            let _ = conn.shutdown(std::net::Shutdown::Both);
            mine.open.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            relays.open.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Gives the terminal to the process group `pgid` (0: ours), ignoring the SIGTTOU a background
/// group gets for asking.
fn give_terminal(pgid: libc::pid_t) {
    // SAFETY: plain libc calls on fd 0; the previous SIGTTOU disposition is put back.
    unsafe {
        let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
        let target = if pgid == 0 { libc::getpgrp() } else { pgid };
        libc::tcsetpgrp(0, target);
        libc::signal(libc::SIGTTOU, old);
    }
}

/// Whether this process's group owns the terminal on stdin.
fn own_terminal() -> bool {
    // SAFETY: read-only libc queries.
    std::io::stdin().is_terminal() && unsafe { libc::tcgetpgrp(0) == libc::getpgrp() }
}

pub fn run(opts: &Options) -> anyhow::Result<i32> {
    let Some(first) = opts.command.first() else {
        bail!("nothing to run: give the command after --, e.g. `pipeprof run -- python train.py`")
    };
    let program = program_name(&opts.command);
    // Bound before anything starts: a taken port fails here, not mid-run.
    let metrics =
        opts.metrics_listen.as_deref().map(|a| crate::metrics::bind(a, opts.metrics_allow_remote)).transpose()?;
    let shown = opts.command.iter().map(|w| w.to_string_lossy()).collect::<Vec<_>>().join(" ");
    let live = !opts.once && std::io::stdout().is_terminal() && std::io::stdin().is_terminal();

    // The socket and the hook's folder, private to this user.
    let dir = probes::attach::runtime_dir()?;
    let pid = std::process::id();
    let scratch = Scratch { socket: dir.join(format!("run-{pid}.sock")), boot: dir.join(format!("run-{pid}-boot")) };
    let _ = std::fs::remove_file(&scratch.socket);
    let listener = UnixListener::bind(&scratch.socket)
        .with_context(|| format!("cannot listen on {}", scratch.socket.display()))?;
    std::fs::set_permissions(&scratch.socket, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot make {} private", scratch.socket.display()))?;
    std::fs::create_dir_all(&scratch.boot).with_context(|| format!("cannot create {}", scratch.boot.display()))?;
    std::fs::write(scratch.boot.join("sitecustomize.py"), SITECUSTOMIZE)
        .with_context(|| format!("cannot write the start-up hook in {}", scratch.boot.display()))?;

    let settings = RunSettings {
        model: program.clone(),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        ..RunSettings::default()
    };
    let agg = Aggregator::new(settings.clone());
    let mut exporters: Vec<Box<dyn Exporter>> = Vec::new();
    if let Some(p) = &opts.trace {
        let mut t = ChromeTrace::create(p, &format!("pipeprof run: {shown}"), Default::default())
            .with_context(|| format!("cannot create {}", p.display()))?;
        t.settings(&settings)?;
        exporters.push(Box::new(t));
        // A distributed run's ranks also get a trace each, beside this one.
        let mut per_rank =
            crate::export::ranks::RankTraces::new(p, &format!("pipeprof run: {shown}"), Default::default());
        per_rank.settings(&settings)?;
        exporters.push(Box::new(per_rank));
    }

    let (probe, rx) = Probe::new(probes::DEFAULT_CAPACITY);
    let relays = Arc::new(Relays::default());
    let stop_serving = Arc::new(AtomicBool::new(false));
    let acceptor = {
        let (probe, relays, stop) = (probe.clone(), relays.clone(), stop_serving.clone());
        std::thread::Builder::new().name("pp-accept".into()).spawn(move || serve(listener, probe, relays, stop))?
    };
    let samplers = probes::sampler::start(
        probe.clone(),
        probes::sampler::SamplerConfig {
            hz: opts.sample_hz,
            gpu: !opts.no_gpu,
            // The GPU is the program's, its workers' and its ranks': every process below this one.
            gpu_tree: true,
            ..probes::sampler::SamplerConfig::default()
        },
    )
    .map_err(|e| progress::warn(&format!("machine sampling is off: {e}")))
    .ok();

    // The program, in a process group of its own.
    let log = live.then(|| std::env::temp_dir().join(format!("pipeprof-run-{pid}.log")));
    let mut cmd = Command::new(first);
    cmd.args(&opts.command[1..])
        .env(ADDRESS_ENV, &scratch.socket)
        .env(PARENT_PID_ENV, pid.to_string())
        .env_remove(MAIN_PID_ENV)
        .env("PYTHONPATH", python_path(&scratch.boot, std::env::var_os("PYTHONPATH")));
    let take_terminal = !live && own_terminal();
    if let Some(log) = &log {
        let f =
            std::fs::File::create(log).with_context(|| format!("cannot create the program's log {}", log.display()))?;
        cmd.stdin(Stdio::null()).stdout(f.try_clone()?).stderr(f);
    }
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::setpgid(0, 0);
            if take_terminal {
                let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                libc::tcsetpgrp(0, libc::getpid());
                libc::signal(libc::SIGTTOU, old);
            }
            Ok(())
        });
    }
    signal::install();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            stop_serving.store(true, Ordering::SeqCst);
            let _ = UnixStream::connect(&scratch.socket);
            let _ = acceptor.join();
            if let Some(s) = samplers {
                s.stop();
            }
            let hint = if e.kind() == std::io::ErrorKind::NotFound { ": not found (is it on PATH?)" } else { "" };
            bail!("cannot start `{}`{hint}: {e}", first.to_string_lossy());
        }
    };
    let child_pid = child.id() as libc::pid_t;
    progress::say(&format!(
        "pipeprof: running `{shown}` (pid {child_pid}){}",
        log.as_ref().map(|l| format!("; its output goes to {}", l.display())).unwrap_or_default()
    ));
    // A second interrupt exits pipeprof at once: the program's group must not run on unseen.
    signal::on_abort(Box::new(move || {
        // SAFETY: kill on a process group we started.
        unsafe { libc::kill(-child_pid, libc::SIGTERM) };
    }));

    let latest = session::latest(&agg);
    let _metrics = session::serve_metrics(metrics, &latest);
    let collector = {
        let (latest, probe) = (latest.clone(), probe.clone());
        std::thread::Builder::new()
            .name("pp-collector".into())
            .spawn(move || session::collect(rx, agg, exporters, &latest, &move || probe.dropped()))?
    };

    // Waits for the program, passing interrupts on; then for its processes' last frames.
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
    let forwarded = Arc::new(AtomicBool::new(false));
    // What the waiter has to say while the live view holds the terminal waits for its end.
    let held: Arc<Mutex<Vec<String>>> = Arc::default();
    let waiter = {
        let (relays, forwarded, probe) = (relays.clone(), forwarded.clone(), probe.clone());
        let (stop_timeout, shown, held) = (opts.stop_timeout, shown.clone(), held.clone());
        std::thread::Builder::new().name("pp-child".into()).spawn(move || {
            let say = |line: String| {
                if crate::tui::is_active() {
                    held.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                } else {
                    progress::say(&line);
                }
            };
            let mut passed_on: Option<Instant> = None;
            let mut escalated = 0;
            let status = loop {
                match child.try_wait() {
                    Ok(Some(s)) => break Ok(s),
                    Ok(None) => {}
                    Err(e) => break Err(e),
                }
                if signal::flag().load(Ordering::SeqCst) && !forwarded.swap(true, Ordering::SeqCst) {
                    let sig = match signal::received() {
                        Some(libc::SIGTERM) => libc::SIGTERM,
                        _ => libc::SIGINT,
                    };
                    // To the program, not its whole group: its own shutdown stops its workers
                    // (a KeyboardInterrupt inside a multiprocessing worker that is writing a
                    // result can hang Python's Pool at exit). A second interrupt stops the group.
                    // SAFETY: kill on the process we started.
                    unsafe { libc::kill(child_pid, sig) };
                    passed_on = Some(Instant::now());
                    say(format!(
                        "pipeprof: interrupt passed to `{shown}`; if it has not ended in {} s (--stop-timeout), \
                         its process group gets SIGTERM (an interrupt again does that now)",
                        stop_timeout.as_secs_f64()
                    ));
                }
                // A program stuck in its own shutdown does not keep the report waiting.
                if let Some(e) = passed_on.and_then(|t| escalation(t.elapsed(), stop_timeout, escalated)) {
                    say(format!(
                        "warning: `{shown}` has not ended {} s after the interrupt: {} to its process group{}",
                        e.after.as_secs_f64(),
                        e.name,
                        if e.sig == libc::SIGTERM { " (--stop-timeout)" } else { "" }
                    ));
                    // SAFETY: kill on a process group we started.
                    unsafe { libc::kill(-child_pid, e.sig) };
                    escalated += 1;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            if take_terminal {
                give_terminal(0);
            }
            let exited = Instant::now();
            let deadline = exited + DRAIN;
            let quiet = || {
                let last = relays.last_ns.load(Ordering::Relaxed);
                probes::clock::now_ns().saturating_sub(last) >= QUIET.as_nanos() as u64
            };
            // Connected processes get QUIET after the program's end in any case, and longer
            // while they still send.
            while relays.open.load(Ordering::SeqCst) > 0
                && Instant::now() < deadline
                && (exited.elapsed() < QUIET || !quiet())
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            probe.send_blocking(Event::Finish);
            let _ = done_tx.send(());
            // Two escalations sent: the second was SIGKILL.
            (status, escalated == 2)
        })?
    };
    session::show(!live, &latest, &done_rx);
    let (status, killed) = waiter.join().map_err(|_| anyhow::anyhow!("the thread waiting for the program panicked"))?;
    for line in held.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
        progress::say(&line);
    }
    stop_serving.store(true, Ordering::SeqCst);
    let _ = UnixStream::connect(&scratch.socket);
    let _ = acceptor.join();
    if let Some(s) = samplers {
        s.stop();
    }
    let mut done = collector.join().map_err(|_| anyhow::anyhow!("the collector panicked"))?;
    let status = status.context("cannot wait for the program")?;
    // Our own interrupt was passed on: the program's exit code says how it ended, not ours.
    let interrupted = forwarded.load(Ordering::SeqCst);
    signal::clear();
    let end = ending(status, &program, interrupted, killed);
    finish(opts, &mut done, &end, &shown, log.as_deref(), &relays)?;
    drop(scratch);
    Ok(end.code())
}

/// The report, the program's fate, the summary file.
fn finish(
    opts: &Options,
    done: &mut Diagnosed,
    end: &Ending,
    shown: &str,
    log: Option<&Path>,
    relays: &Relays,
) -> anyhow::Result<()> {
    if let Ending::Failed { why, .. } = end {
        // What the program said (an exception) comes first; the exit status after it.
        let said = done.summary.failed.take();
        done.summary.failed = Some(match said {
            Some(s) => format!("{s} ({why})"),
            None => why.clone(),
        });
    }
    if let Some(log) = log {
        print_log_tail(log);
    }
    print!("{}", report::render(&done.summary, &done.verdict()));
    let processes = relays.processes.lock().map(|p| p.len()).unwrap_or(0);
    if processes == 0 {
        progress::warn(&format!(
            "no process of `{shown}` connected: only the machine was sampled. A Python program needs the \
             pipeprof package in the interpreter it runs (pip install pipeprof); a Rust one links the probes crate"
        ));
    }
    match end {
        Ending::Ok => eprintln!("pipeprof: `{shown}` finished"),
        Ending::Interrupted(c) => {
            eprintln!("pipeprof: `{shown}` was interrupted (exit code {c}): the report covers what ran")
        }
        Ending::Failed { why, .. } => {
            progress::say(&format!("pipeprof: RUN FAILED: {}", done.summary.failed.as_deref().unwrap_or(why)));
            eprintln!("pipeprof: the report above covers the steps done before the failure");
        }
    }
    if let (Some(t), false) = (&opts.trace, done.summary.ranks.is_empty()) {
        let files: Vec<String> = done
            .summary
            .ranks
            .iter()
            .map(|l| crate::export::ranks::rank_path(t, l.rank).display().to_string())
            .collect();
        eprintln!("pipeprof: a trace per rank written to {}", files.join(", "));
    }
    if let Some(p) = &opts.summary {
        std::fs::write(p, serde_json::to_string_pretty(&*done)?)
            .with_context(|| format!("cannot write the summary to {}", p.display()))?;
        eprintln!("pipeprof: summary written to {}", p.display());
    }
    Ok(())
}

/// The last lines the program printed while the live view had the terminal.
fn print_log_tail(log: &Path) {
    const LINES: usize = 20;
    let Ok(text) = std::fs::read(log) else { return };
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    if lines.is_empty() {
        return;
    }
    eprintln!("pipeprof: the program's output is in {} ; its last lines:", log.display());
    for l in &lines[lines.len().saturating_sub(LINES)..] {
        eprintln!("  | {l}");
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
    fn a_program_stuck_after_the_interrupt_gets_sigterm_then_sigkill_once_each() {
        let s = Duration::from_secs_f64;
        let t = s(30.0);
        for (since, sent, want) in [
            (0.0, 0, None),
            (29.9, 0, None),
            (30.0, 0, Some(libc::SIGTERM)),
            (31.0, 1, None),
            (34.9, 1, None),
            (35.0, 1, Some(libc::SIGKILL)),
            (400.0, 2, None),
            // A late look sends one step at a time: SIGTERM first, even when SIGKILL is due.
            (400.0, 0, Some(libc::SIGTERM)),
        ] {
            assert_eq!(escalation(s(since), t, sent).map(|e| e.sig), want, "{since} s, {sent} sent");
        }
        assert_eq!(
            escalation(s(1.0), s(1.0), 0),
            Some(Escalation { sig: libc::SIGTERM, name: "SIGTERM", after: s(1.0) })
        );
        assert_eq!(
            escalation(s(6.0), s(1.0), 1),
            Some(Escalation { sig: libc::SIGKILL, name: "SIGKILL", after: s(6.0) })
        );
    }

    #[test]
    fn exit_statuses_read_as_the_run_ended() {
        let code = |c: i32| ExitStatus::from_raw(c << 8);
        let sig = ExitStatus::from_raw;
        assert_eq!(ending(code(0), "t", false, false), Ending::Ok);
        assert_eq!(
            ending(code(3), "t", false, false),
            Ending::Failed { code: 3, why: "t exited with status 3".into() }
        );
        // Python's KeyboardInterrupt traceback exits 1: an interruption when we passed one on.
        assert_eq!(ending(code(1), "t", true, false), Ending::Interrupted(1));
        assert_eq!(ending(code(1), "t", false, false).code(), 1);
        assert_eq!(ending(code(130), "t", false, false), Ending::Interrupted(130));
        assert_eq!(ending(sig(libc::SIGINT), "t", false, false), Ending::Interrupted(130));
        assert_eq!(ending(sig(libc::SIGTERM), "t", false, false).code(), 143);
        assert_eq!(
            ending(sig(libc::SIGKILL), "t", false, false),
            Ending::Failed { code: 137, why: "t was killed by signal 9".into() }
        );
        // Our own SIGKILL, sent when the program did not stop after the interrupt: as asked.
        assert_eq!(ending(sig(libc::SIGKILL), "t", true, true), Ending::Interrupted(137));
        assert_eq!(ending(code(3), "t", true, true).code(), 3);
    }

    #[test]
    fn the_hook_goes_first_on_pythonpath() {
        let p = python_path(Path::new("/run/boot"), Some(OsString::from("/a:/b")));
        assert_eq!(p, OsString::from("/run/boot:/a:/b"));
        assert_eq!(python_path(Path::new("/run/boot"), Some(OsString::new())), OsString::from("/run/boot"));
        assert_eq!(python_path(Path::new("/run/boot"), None), OsString::from("/run/boot"));
    }
}
