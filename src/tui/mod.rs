//! The live terminal view of a run: header, verdict, stage table and charts, redrawn ~10 times
//! a second from the collector's latest snapshot.
//!
//! [`state`] is plain data (tested without a terminal), [`view`] draws it (one function per
//! panel, snapshot-tested with ratatui's `TestBackend`), and [`run`] owns the terminal: raw
//! mode and the alternate screen are entered through a guard that restores them on drop, and
//! a panic hook restores them before the panic message prints.

pub mod state;
pub mod view;

pub use state::{Action, Focus, Live, State};

use crossbeam_channel::{Receiver, TryRecvError};
use crossterm::event::{self, Event};
use crossterm::terminal::{self, EnterAlternateScreen, LeaveAlternateScreen};
use crossterm::{cursor, execute};
use pipeprof_core::aggregate::Snapshot;
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;
use std::io::{self, Stdout};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

/// Redraw period (≈10 Hz): fresh enough to watch, cheap enough to leave training alone.
const TICK: Duration = Duration::from_millis(100);

/// Whether the terminal is in the live view's modes: the panic hook and the guard restore it
/// only then, and only once.
static ACTIVE: AtomicBool = AtomicBool::new(false);
static HOOK: Once = Once::new();

/// Whether the live view holds the terminal now (lines printed on stderr would be lost).
pub fn is_active() -> bool {
    ACTIVE.load(Ordering::SeqCst)
}

/// Leaves raw mode and the alternate screen, shows the cursor. Idempotent.
fn restore() {
    if ACTIVE.swap(false, Ordering::SeqCst) {
        let _ = terminal::disable_raw_mode();
        let _ = execute!(io::stdout(), LeaveAlternateScreen, cursor::Show);
    }
}

/// Restores the terminal before the panic message prints, whichever thread panics: the
/// message would otherwise be lost on the alternate screen, in raw mode.
fn install_panic_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
    });
}

/// Owns the terminal while the view is up; dropping it (return, `?`, unwinding) restores it.
struct Guard {
    terminal: Terminal<CrosstermBackend<Stdout>>,
}

impl Guard {
    fn enter() -> io::Result<Guard> {
        install_panic_hook();
        pipeprof_core::signal::on_exit_restore_terminal(restore);
        terminal::enable_raw_mode()?;
        ACTIVE.store(true, Ordering::SeqCst);
        let setup = (|| {
            execute!(io::stdout(), EnterAlternateScreen, cursor::Hide)?;
            let mut t = Terminal::new(CrosstermBackend::new(io::stdout()))?;
            t.clear()?;
            Ok(t)
        })();
        match setup {
            Ok(terminal) => Ok(Guard { terminal }),
            Err(e) => {
                restore();
                Err(e)
            }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        restore();
    }
}

/// Copies the collector's latest snapshot when it changed. The lock is held only for the
/// clone, so the collector never waits on drawing.
fn refresh(latest: &Mutex<Live>, st: &mut State, seen: &mut (u64, u64)) {
    let Ok(l) = latest.lock() else { return };
    let key = (l.snap.now_ns, l.snap.summary.events_received);
    if key == *seen {
        return;
    }
    *seen = key;
    let snap = l.clone();
    drop(l);
    st.update(snap);
}

/// Shows the live view until `done` fires (training finished, or stopped after q / Esc /
/// Ctrl-C set `stop`), then restores the terminal. Raw mode turns Ctrl-C into a key, so it
/// arrives here rather than as SIGINT, and is handed to `signal::interrupt`: the same grace
/// period, and the same immediate exit (terminal restored, trace closed, summary written).
pub fn run(latest: Arc<Mutex<Live>>, done: Receiver<()>, stop: &'static AtomicBool) -> io::Result<()> {
    let mut st = State::new(Snapshot::default());
    let mut seen = (u64::MAX, u64::MAX);
    refresh(&latest, &mut st, &mut seen);
    let mut guard = Guard::enter()?;
    loop {
        match done.try_recv() {
            Ok(()) | Err(TryRecvError::Disconnected) => return Ok(()),
            Err(TryRecvError::Empty) => {}
        }
        // A panic elsewhere restored the terminal: drawing now would scribble on the shell.
        if !ACTIVE.load(Ordering::SeqCst) {
            return Ok(());
        }
        // SIGTERM (or anything else) may have asked for the stop: show it.
        st.stop_requested |= stop.load(Ordering::SeqCst);
        refresh(&latest, &mut st, &mut seen);
        guard.terminal.draw(|f| view::render(f, &st))?;

        let deadline = Instant::now() + TICK;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            if !event::poll(left)? {
                break;
            }
            match event::read()? {
                Event::Key(k) => match st.on_key(k) {
                    Action::None => {}
                    Action::Redraw => break,
                    Action::Stop => {
                        stop.store(true, Ordering::SeqCst);
                        break;
                    }
                    Action::Interrupt => {
                        // The same path as SIGINT: may exit at once (terminal restored first).
                        pipeprof_core::signal::interrupt_key();
                        break;
                    }
                },
                Event::Resize(..) => {
                    guard.terminal.autoresize()?;
                    break;
                }
                _ => {}
            }
        }
    }
}
