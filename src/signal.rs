//! Ctrl-C and SIGTERM ask the run to stop cleanly; a second one, later, exits at once.
//!
//! Signals are received on a thread of their own (signal-hook), not in a handler: the code
//! that reacts may take its time and call anything. A second signal that arrives within
//! [`GRACE`] of the first is the same interrupt — `timeout` and a terminal's Ctrl-C deliver one
//! to the process and again to its group, microseconds apart — and is ignored.

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

static STOP: AtomicBool = AtomicBool::new(false);
static SIGNAL: AtomicI32 = AtomicI32::new(0);
static INSTALLED: OnceLock<()> = OnceLock::new();
/// Run just before an immediate exit on a second interrupt (close what must be closed).
static ON_ABORT: Mutex<Vec<Box<dyn Fn() + Send>>> = Mutex::new(Vec::new());

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

/// Starts the thread that receives SIGINT and SIGTERM (once per process).
pub fn install() {
    INSTALLED.get_or_init(|| {
        let mut signals = match Signals::new([SIGINT, SIGTERM]) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("warning: cannot handle Ctrl-C ({e}): an interrupt will end the run without a report");
                return;
            }
        };
        let spawned = std::thread::Builder::new().name("pp-signals".into()).spawn(move || {
            let mut first: Option<Instant> = None;
            for sig in signals.forever() {
                // The live view's q sets STOP too: a signal after it is a second interrupt.
                let stopping = STOP.load(Ordering::SeqCst);
                let since = first.map(|t| t.elapsed()).unwrap_or(Duration::MAX);
                match respond(stopping, since) {
                    Response::Stop => {
                        first = Some(Instant::now());
                        SIGNAL.store(sig, Ordering::SeqCst);
                        STOP.store(true, Ordering::SeqCst);
                    }
                    Response::Ignore => {}
                    Response::Exit => {
                        eprintln!("\npipeprof: second interrupt: closing the trace and exiting now");
                        // try_lock: a registration in progress must not hold up the exit.
                        if let Ok(hooks) = ON_ABORT.try_lock() {
                            hooks.iter().for_each(|h| h());
                        }
                        std::process::exit(128 + sig);
                    }
                }
            }
        });
        if let Err(e) = spawned {
            eprintln!("warning: cannot handle Ctrl-C ({e})");
        }
    });
}

/// Registers `f` to run before an immediate exit on a second interrupt.
pub fn on_abort(f: Box<dyn Fn() + Send>) {
    ON_ABORT.lock().unwrap_or_else(|e| e.into_inner()).push(f);
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
