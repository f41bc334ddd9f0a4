//! Ctrl-C, SIGTERM and SIGHUP ask the run to stop cleanly; a second interrupt, later, hurries.
//! SIGQUIT, SIGUSR1, SIGUSR2 and SIGALRM, whose default action would kill pipeprof with its
//! trace open and the program's group left running, end the run as SIGTERM does.
//!
//! Signals are received on a thread of their own (signal-hook), not in a handler: the code
//! that reacts may take its time and call anything. The live view's Ctrl-C key (raw mode
//! turns Ctrl-C into a key) comes through [`interrupt`] too: one path for both. A second
//! interrupt that arrives within [`GRACE`] of the first is the same interrupt — `timeout` and
//! a terminal's Ctrl-C deliver one to the process and again to its group, microseconds apart;
//! a nervous user presses twice — and is ignored. A later one is counted ([`interrupts`]).
//!
//! What a later one does depends on the command. `run` and `attach` end through their own
//! way out ([`end_through_the_run`]): they read the count and hurry (the program's group gets
//! SIGTERM now), and still close the trace and write the summary. `profile`, whose training
//! loop may be stuck in a read, exits at once: the terminal is restored, then the abort hooks
//! close the trace and write the summary marked failed. The hooks are disarmed once the run
//! has written its files ([`disarm_after`]): nothing is written twice.

use signal_hook::consts::{SIGALRM, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
use signal_hook::iterator::Signals;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

static STOP: AtomicBool = AtomicBool::new(false);
static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Interrupts taken (a repeat within [`GRACE`] is not one more).
static COUNT: AtomicU32 = AtomicU32::new(0);
/// SIGHUP came: the terminal is gone.
static HANGUP: AtomicBool = AtomicBool::new(false);
/// A later interrupt is counted for the command's own way out, not an immediate exit.
static THROUGH_THE_RUN: AtomicBool = AtomicBool::new(false);
static INSTALLED: OnceLock<()> = OnceLock::new();
/// When the first interrupt came.
static FIRST: Mutex<Option<Instant>> = Mutex::new(None);
/// Run just before an immediate exit on a second interrupt (close what must be closed).
static ON_ABORT: Mutex<Vec<Box<dyn Fn() + Send>>> = Mutex::new(Vec::new());
/// Puts the terminal back before an immediate exit (set by the live view).
static RESTORE_TERMINAL: OnceLock<fn()> = OnceLock::new();

/// How long an immediate exit waits for the run to finish writing its files (then its hooks
/// have nothing left to do).
const HOOKS_WAIT: Duration = Duration::from_secs(2);

/// How long a program started by `pipeprof run` has to end after an interrupt was passed on
/// to it, before its process group gets SIGTERM (`--stop-timeout`). Long enough for a script
/// that saves a checkpoint on KeyboardInterrupt; a program stuck in its shutdown (a worker
/// blocked writing to a pipe nobody reads any more) does not keep the run, and its report, waiting.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// After the SIGTERM to the group, how long before SIGKILL.
pub const KILL_AFTER: Duration = Duration::from_secs(5);

/// A repeat of the first interrupt within this time is the same interrupt.
pub const GRACE: Duration = Duration::from_millis(500);

/// What to do with the `n`-th interrupt (0-based), `since_first` after the first one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Response {
    /// Ask the run to stop cleanly.
    Stop,
    /// The same interrupt again: nothing to do.
    Ignore,
    /// The user means it: exit now.
    Exit,
}

/// The decision, pure: first → stop; a repeat within [`GRACE`] → ignore; later → exit.
pub fn respond(already_stopping: bool, since_first: Duration) -> Response {
    match (already_stopping, since_first < GRACE) {
        (false, _) => Response::Stop,
        (true, true) => Response::Ignore,
        (true, false) => Response::Exit,
    }
}

/// Signals that end the run as SIGTERM does (their default action would kill pipeprof on the
/// spot: trace open, no summary, the program's group left running).
pub const ENDS_AS_TERM: [i32; 4] = [SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM];

/// Starts the thread that receives SIGINT, SIGTERM, SIGHUP and [`ENDS_AS_TERM`] (once per process).
pub fn install() {
    INSTALLED.get_or_init(|| {
        let mut signals = match Signals::new([&[SIGINT, SIGTERM, SIGHUP][..], &ENDS_AS_TERM].concat()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("warning: cannot handle Ctrl-C ({e}): an interrupt will end the run without a report");
                return;
            }
        };
        let spawned = std::thread::Builder::new().name("pp-signals".into()).spawn(move || {
            for sig in signals.forever() {
                interrupt(sig);
            }
        });
        if let Err(e) = spawned {
            eprintln!("warning: cannot handle Ctrl-C ({e})");
        }
    });
}

/// An interrupt: signal `sig` arrived, or the live view's Ctrl-C key (`SIGINT`). The first
/// asks the run to stop; a repeat within [`GRACE`] is ignored; a later one is counted, and
/// exits at once unless the command ends [`end_through_the_run`].
pub fn interrupt(sig: i32) {
    if sig == SIGHUP {
        HANGUP.store(true, Ordering::SeqCst);
    }
    // The live view's q sets STOP too: a signal after it is a second interrupt.
    let stopping = STOP.load(Ordering::SeqCst);
    let mut first = FIRST.lock().unwrap_or_else(|e| e.into_inner());
    let since = first.map(|t| t.elapsed()).unwrap_or(Duration::MAX);
    match respond(stopping, since) {
        Response::Stop => {
            *first = Some(Instant::now());
            SIGNAL.store(sig, Ordering::SeqCst);
            COUNT.fetch_add(1, Ordering::SeqCst);
            STOP.store(true, Ordering::SeqCst);
        }
        Response::Ignore => {}
        Response::Exit => {
            COUNT.fetch_add(1, Ordering::SeqCst);
            if !THROUGH_THE_RUN.load(Ordering::SeqCst) {
                drop(first);
                exit_now(sig)
            }
        }
    }
}

/// `run` and `attach`: a later interrupt is counted for the command to hurry its own end
/// (which closes the trace and writes the summary), never an immediate exit.
pub fn end_through_the_run() {
    THROUGH_THE_RUN.store(true, Ordering::SeqCst);
}

/// Interrupts taken so far (a repeat within [`GRACE`] is the same one).
pub fn interrupts() -> u32 {
    COUNT.load(Ordering::SeqCst)
}

/// Whether SIGHUP came (the terminal was closed).
pub fn hung_up() -> bool {
    HANGUP.load(Ordering::SeqCst)
}

/// The immediate exit: terminal restored, abort hooks run (after the run's own writing, if
/// it is at it, for at most [`HOOKS_WAIT`]), status 128 + `sig`.
fn exit_now(sig: i32) -> ! {
    if let Some(restore) = RESTORE_TERMINAL.get() {
        restore();
    }
    // stderr may be gone (a closed terminal): never a panic here.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        b"\npipeprof: second interrupt: closing the trace and exiting now\n",
    );
    let deadline = Instant::now() + HOOKS_WAIT;
    loop {
        match ON_ABORT.try_lock() {
            Ok(hooks) => {
                hooks.iter().for_each(|h| h());
                break;
            }
            Err(std::sync::TryLockError::Poisoned(p)) => {
                p.into_inner().iter().for_each(|h| h());
                break;
            }
            // The run is writing its files (or registering a hook): wait, boundedly.
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(std::sync::TryLockError::WouldBlock) => break,
        }
    }
    std::process::exit(128 + sig);
}

/// Registers `f` to run before an immediate exit on a second interrupt.
pub fn on_abort(f: Box<dyn Fn() + Send>) {
    ON_ABORT.lock().unwrap_or_else(|e| e.into_inner()).push(f);
}

/// Runs `write` (the run writing its own files) with the abort hooks held back, then
/// disarms them: an immediate exit meanwhile waits for `write`, and after it finds nothing
/// to do, so a complete file is never overwritten by one marked failed.
pub fn disarm_after<R>(write: impl FnOnce() -> R) -> R {
    let mut hooks = ON_ABORT.lock().unwrap_or_else(|e| e.into_inner());
    let r = write();
    hooks.clear();
    r
}

/// Sets what puts the terminal back before an immediate exit (the live view's restore).
pub fn on_exit_restore_terminal(restore: fn()) {
    let _ = RESTORE_TERMINAL.set(restore);
}

/// The live view's Ctrl-C key: an interrupt like SIGINT.
pub fn interrupt_key() {
    interrupt(SIGINT);
}

/// Whether a stop was asked for (an interrupt, or the live view's q).
pub fn stopping() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// The flag the training loop polls (also set by the live view's `q`).
pub fn flag() -> &'static AtomicBool {
    &STOP
}

/// The signal that stopped the run, if one did: the process exits with 128 + it, after
/// writing the report and closing its files, as shells expect.
pub fn received() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Whether the signal that stopped the run asks for a termination (SIGTERM or one of
/// [`ENDS_AS_TERM`]): `run` passes SIGTERM on, not SIGINT.
pub fn terminating() -> bool {
    received().is_some_and(|s| s == SIGTERM || ENDS_AS_TERM.contains(&s))
}

/// Forgets a received signal (after a clean detach, which is not an interruption).
pub fn clear() {
    SIGNAL.store(0, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeat_within_the_grace_period_is_the_same_interrupt() {
        assert_eq!(respond(false, Duration::MAX), Response::Stop);
        assert_eq!(respond(true, Duration::from_micros(3)), Response::Ignore);
        assert_eq!(respond(true, GRACE - Duration::from_millis(1)), Response::Ignore);
        assert_eq!(respond(true, GRACE), Response::Exit);
        // Stopped by q in the live view (no signal yet): a signal then exits.
        assert_eq!(respond(true, Duration::MAX), Response::Exit);
    }
}
