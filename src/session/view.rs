//! What a run shows while it goes: the live view or the progress line, `/metrics`, the lines
//! its threads say ([`Out`]), and the stop they all obey ([`Stop`]).

use super::Latest;
use crossbeam_channel::Receiver;
use pipeprof_core::signal;
use pipeprof_trainer::progress;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Whether the live view can show: asked for, with a terminal to draw on and one to read keys
/// from, and stdout not kept for `--json`'s document.
pub fn live_view(no_tui: bool) -> bool {
    !no_tui
        && !pipeprof_trainer::progress::stdout_for_json()
        && std::io::stdout().is_terminal()
        && std::io::stdin().is_terminal()
}

/// The live view on a terminal, else the progress line, until `done` fires.
pub fn show(no_tui: bool, latest: &Latest, done: &Receiver<()>, stop: Stop) {
    let summary = || Some(latest.lock().unwrap_or_else(|e| e.into_inner()).snap.summary.clone());
    if live_view(no_tui) {
        if let Err(e) = crate::tui::run(latest.clone(), done.clone(), stop.flag()) {
            progress::warn(&format!("the live view failed ({e}); showing progress instead (--no-tui skips the view)"));
            progress::watch(done, &summary);
        }
    } else {
        progress::watch(done, &summary);
    }
}

/// Serves `/metrics` (when `--metrics-listen` gave a listener) from the latest publication
/// until the returned guard drops. A scrape copies the summary under the lock (the collector
/// holds it only to move a snapshot in) and renders outside it. A scrape that cannot be served
/// is not worth stopping the run for: a warning, and the run goes on without it.
pub fn serve_metrics(
    listener: Option<crate::metrics::Listener>,
    latest: &Latest,
) -> Option<crate::metrics::serve::Serving> {
    let latest = latest.clone();
    listener?
        .serve(Arc::new(move || {
            let l = latest.lock().unwrap_or_else(|e| e.into_inner());
            crate::metrics::Scrape {
                summary: l.snap.summary.clone(),
                gpu: l.snap.gpu.last().cloned(),
                verdict: l.verdict.clone(),
                straggler: l.straggler.clone(),
            }
        }))
        .map_err(|e| progress::warn(&format!("cannot serve --metrics-listen ({e}); the run goes on without it")))
        .ok()
}

/// Where a run's threads say things on stderr. While the live view holds the terminal a line
/// printed there would be lost under it: [`Out::say`] holds it until the view lets go, and
/// [`Out::note`] leaves it to the view, which shows the same fact itself.
#[derive(Clone, Default)]
pub struct Out {
    held: Arc<Mutex<Vec<String>>>,
}

impl Out {
    /// Whether the live view holds the terminal now.
    fn view_holds_terminal(&self) -> bool {
        crate::tui::is_active()
    }

    /// Says `line` now, or once the live view has let go of the terminal.
    pub fn say(&self, line: String) {
        if self.view_holds_terminal() {
            self.held.lock().unwrap_or_else(|e| e.into_inner()).push(line);
        } else {
            progress::say(&line);
        }
    }

    /// Says `line` where the live view does not show it (on the progress line).
    pub fn note(&self, line: &str) {
        if !self.view_holds_terminal() {
            progress::say(line);
        }
    }

    /// Says what was held while the live view had the terminal.
    pub fn flush(&self) {
        let held = std::mem::take(&mut *self.held.lock().unwrap_or_else(|e| e.into_inner()));
        for line in held {
            progress::say(&line);
        }
    }
}

/// The run's stop: asked for by an interrupt (SIGINT, SIGTERM, SIGHUP, …), the live view's q,
/// or a command's own end (a detach, `--duration`); read by every thread that ends with the run.
#[derive(Clone, Copy)]
pub struct Stop {
    flag: &'static AtomicBool,
}

impl Default for Stop {
    fn default() -> Stop {
        Stop::of_signals()
    }
}

impl Stop {
    /// The process's stop, set by [`signal`]'s interrupts and the live view.
    pub fn of_signals() -> Stop {
        Stop { flag: signal::flag() }
    }

    /// Whether the run was asked to stop.
    pub fn requested(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Asks the run to stop (as the live view's q does).
    pub fn request(&self) {
        self.flag.store(true, Ordering::SeqCst);
    }

    /// The flag itself, for the loops that poll it (the training loop, the live view).
    pub fn flag(&self) -> &'static AtomicBool {
        self.flag
    }

    /// Interrupts so far; a stop asked for without one (the live view's q) counts as one.
    pub fn interrupts(&self) -> u32 {
        signal::interrupts().max(u32::from(self.requested()))
    }

    /// Whether the interrupt asks for a termination (SIGTERM and its kind), not SIGINT.
    pub fn terminating(&self) -> bool {
        signal::terminating()
    }

    /// Whether the terminal hung up.
    pub fn hung_up(&self) -> bool {
        signal::hung_up()
    }
}
