//! The one progress line (profile, attach, cache) and the warnings printed above it.
//!
//! On a terminal the line redraws in place (indicatif); into a file or pipe it becomes a plain
//! line every few seconds, and no escape code is written. Warnings go above the line from any
//! thread, and text that came from outside (file names, reasons, names sent by other
//! processes) loses its control characters, so neither a terminal nor a log file can be made
//! to show what it does not say. Nothing here panics when stderr or stdout is gone.

use crossbeam_channel::{Receiver, RecvTimeoutError};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pipeprof_core::aggregate::Summary;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The line being shown now, if any: warnings print above it.
static ACTIVE: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// How often the live run's line is refreshed.
const REFRESH: Duration = Duration::from_millis(200);
/// How often a plain (non-terminal) line is written.
const PLAIN_EVERY: Duration = Duration::from_secs(10);

/// `text` with control characters (escape codes among them) replaced by `?`: what pipeprof
/// prints carries names and paths from files and other processes, and none of them may move
/// the cursor, retitle the terminal or hide a line, on a terminal or in a log.
pub fn clean(text: &str) -> String {
    use pipeprof_core::aggregate::settings::printable;
    text.chars().map(|c| if printable(c) || c == '\n' || c == '\t' { c } else { '?' }).collect()
}

/// Writes `text` to stderr; a closed terminal or pipe is not worth a panic (the run's files
/// are written whatever happens to its output).
fn err_out(text: &str) {
    let _ = std::io::Write::write_all(&mut std::io::stderr(), text.as_bytes());
}

/// Set once `--json` asks for stdout: the report and every other line [`out`] prints go to
/// stderr, and stdout holds the one JSON document ([`json_out`]).
static STDOUT_FOR_JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on stdout is the JSON document's alone: what [`out`] prints goes to stderr.
pub fn keep_stdout_for_json() {
    STDOUT_FOR_JSON.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether `--json` holds stdout ([`keep_stdout_for_json`]).
pub fn stdout_for_json() -> bool {
    STDOUT_FOR_JSON.load(std::sync::atomic::Ordering::SeqCst)
}

/// Writes `text` to stdout (to stderr when `--json` holds stdout); `pipeprof run … | head`
/// closing the pipe is not worth a panic.
pub fn out(text: &str) {
    if stdout_for_json() {
        err_out(text);
        return;
    }
    json_out(text);
}

/// Writes `text` to stdout, whoever else is kept off it: the `--json` document.
pub fn json_out(text: &str) {
    let mut o = std::io::stdout().lock();
    let _ = std::io::Write::write_all(&mut o, text.as_bytes()).and_then(|()| std::io::Write::flush(&mut o));
}

/// Prints `warning: {msg}` on stderr, above the progress line if one is shown.
pub fn warn(msg: &str) {
    say(&format!("warning: {msg}"));
}

/// Prints one line on stderr, above the progress line if one is shown.
pub fn say(line: &str) {
    let line = clean(line);
    let bar = ACTIVE.lock().unwrap_or_else(|e| e.into_inner()).clone();
    match bar {
        Some(b) if !b.is_hidden() => b.println(line),
        _ => err_out(&format!("{line}\n")),
    }
}

/// A progress line on stderr.
pub struct Line {
    bar: ProgressBar,
    tty: bool,
    plain_every: Duration,
    last_plain: Option<Instant>,
}

impl Line {
    /// A line that, off a terminal, is written at most every `plain_every`.
    pub fn new(plain_every: Duration) -> Line {
        let tty = std::io::stderr().is_terminal();
        let bar = if tty {
            let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            b.set_style(ProgressStyle::with_template("{msg}").unwrap_or_else(|_| ProgressStyle::default_spinner()));
            b
        } else {
            ProgressBar::hidden()
        };
        *ACTIVE.lock().unwrap_or_else(|e| e.into_inner()) = Some(bar.clone());
        Line { bar, tty, plain_every, last_plain: Some(Instant::now()) }
    }

    /// Shows `text`; off a terminal only when `plain_every` has passed, or when `force`.
    pub fn set(&mut self, text: String, force: bool) {
        if self.tty {
            self.bar.set_message(text);
            return;
        }
        let due = self.last_plain.is_none_or(|t| t.elapsed() >= self.plain_every);
        if due || force {
            self.last_plain = Some(Instant::now());
            err_out(&format!("{}\n", clean(&text)));
        }
    }

    /// Removes the line from the terminal (the report follows).
    pub fn finish(self) {}
}

impl Drop for Line {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
        *ACTIVE.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Shows the run's progress until `done` fires, with a warning for each newly skipped file;
/// `latest` reads the collector's newest summary.
pub fn watch(done: &Receiver<()>, latest: &dyn Fn() -> Option<Summary>) {
    let mut line = Line::new(PLAIN_EVERY);
    let mut warned = 0usize;
    loop {
        let finished = match done.recv_timeout(REFRESH) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => true,
            Err(RecvTimeoutError::Timeout) => false,
        };
        let Some(s) = latest() else { return };
        for k in s.skipped.iter().skip(warned) {
            warn(&format!("skipped {}: {}", k.path, k.reason));
        }
        warned = warned.max(s.skipped.len());
        let text = format!(
            "step {} · epoch {} · {:.1} images/s · loss {} · {:.1} s",
            s.steps,
            s.epochs.last().map(|e| e.epoch).unwrap_or(1),
            s.images_per_s,
            s.last_loss.map(|l| format!("{l:.4}")).unwrap_or_else(|| "-".into()),
            s.elapsed_s
        );
        line.set(text, false);
        if finished {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_never_reach_the_terminal_or_a_log() {
        let hostile = "a\x1b[31mred\x07\rb\tc";
        assert_eq!(clean(hostile), "a?[31mred??b\tc");
    }
}
