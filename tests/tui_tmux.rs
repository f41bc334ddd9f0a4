#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End to end in a real pseudo-terminal: tmux runs `pipeprof profile`, the live view shows the
//! header and the stage table, `q` stops the run, and the report prints on the restored
//! normal screen with the terminal back in cooked mode. Skipped (passing) without tmux.

mod common;

use pipeprof_trainer::data::demo::{DemoFormat, DemoSpec};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A private tmux server (its own socket), killed on drop whatever the test's outcome.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux").args(["-L", &self.socket, "-f", "/dev/null"]).args(args).output().expect("tmux runs")
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "pp"]).stdout).into_owned()
    }

    /// The visible screen and the scrollback: the report is longer than the pane.
    fn history(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-S", "-", "-t", "pp"]).stdout).into_owned()
    }

    /// Polls until `ok(screen)` holds; panics with the last screen at the deadline.
    fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        capture: impl Fn(&Tmux) -> String,
        ok: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let s = capture(self);
            if ok(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}; the pane shows:\n{s}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

fn tmux_installed() -> bool {
    Command::new("tmux").arg("-V").output().is_ok_and(|o| o.status.success())
}

/// Starts `pipeprof profile` on a tiny generated run in a detached 100×30 tmux pane and
/// waits until the live view shows a filled stage table; returns the server and that screen.
/// None when tmux is not installed.
fn start_live_view(tmp: &std::path::Path) -> Option<(Tmux, String)> {
    start_live_view_with(tmp, "", FILLED)
}

/// What a filled live view shows: the tests assert on all of it.
const FILLED: &[&str] = &["per s", "read", "decode", "wait", "transfer", "compute", "verdict", "CPU", "queue", "step "];

/// [`start_live_view`] with `extra` arguments for `pipeprof profile` (shell words), waiting
/// until the view shows every word of `ready`.
fn start_live_view_with(tmp: &std::path::Path, extra: &str, ready: &[&str]) -> Option<(Tmux, String)> {
    if !tmux_installed() {
        eprintln!("skipped: tmux is not installed (the live view's end-to-end test needs a real terminal)");
        return None;
    }
    let data = tmp.join("data");
    DemoSpec { classes: 2, per_class: 24, size: Some((40, 40)), format: DemoFormat::Mixed, seed: 5 }
        .write(&data)
        .unwrap();
    let model = tmp.join("tiny.toml");
    std::fs::write(&model, common::tiny_model(1)).unwrap();

    // Far more steps than the test waits for: only the key can end the run, so the test
    // proves the key stops it. After pipeprof, the shell reports its exit status and whether
    // the terminal is back in cooked mode (raw mode shows as -icanon -echo).
    let script = format!(
        "sh -c 'echo $$ > \"{pid}\"; exec \"{bin}\" profile --model \"{model}\" --data \"{data}\" --steps 100000 {extra}'; \
         echo \"pipeprof-exit=$?\"; \
         echo \"tty: $(stty -a | tr -s ' ;' '\\n\\n' | grep -xE -- '-?(icanon|echo)' | tr '\\n' ' ')\"; \
         echo test-done; sleep 600",
        bin = env!("CARGO_BIN_EXE_pipeprof"),
        model = model.display(),
        data = data.display(),
        pid = tmp.join("pid").display(),
    );
    let name = tmp.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmux = Tmux { socket: format!("pipeprof-test-{}-{name}", std::process::id()) };
    let out = tmux.run(&["new-session", "-d", "-s", "pp", "-x", "100", "-y", "30", &script]);
    assert!(out.status.success(), "tmux new-session failed: {}", String::from_utf8_lossy(&out.stderr));
    let live = tmux.wait_for("the live view with a filled stage table", Duration::from_secs(120), Tmux::screen, |s| {
        // Everything the tests assert, so a screen drawn before the loader's first spans
        // arrived (they travel in per-thread batches) is waited past, not failed on.
        s.contains("pipeprof ") && s.contains("? help") && ready.iter().all(|w| s.contains(w))
    });
    Some((tmux, live))
}

/// Waits for the shell after pipeprof and checks the run stopped cleanly on a normal screen,
/// with exit status `status` (0 after q, 130 after Ctrl-C: an interrupt, as SIGINT is).
fn assert_stopped_cleanly(tmux: &Tmux, status: i32) -> String {
    let after = tmux.wait_for("pipeprof to exit", Duration::from_secs(60), Tmux::history, |s| s.contains("test-done"));
    assert!(after.contains(&format!("pipeprof-exit={status}")), "exit status {status}:\n{after}");
    assert!(after.contains("── pipeprof report"), "the report printed after the view:\n{after}");
    assert!(after.contains("stopped early"), "the key stopped the run:\n{after}");
    assert!(after.contains("tty: icanon echo"), "raw mode is off again:\n{after}");
    assert!(!after.contains("? help"), "the live view's screen is gone (alternate screen left):\n{after}");
    let alt = tmux.run(&["display-message", "-p", "-t", "pp", "#{alternate_on}"]);
    assert_eq!(String::from_utf8_lossy(&alt.stdout).trim(), "0", "back on the normal screen");
    after
}

#[test]
fn live_view_shows_the_run_and_q_stops_it_with_the_terminal_restored() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((tmux, live)) = start_live_view(tmp.path()) else { return };
    assert!(live.contains("verdict"), "the verdict banner shows:\n{live}");
    assert!(live.contains("step "), "the header shows progress:\n{live}");
    assert!(live.contains("data ") && live.contains("tiny.toml"), "the header names the data and model:\n{live}");
    for stage in ["read", "decode", "wait", "transfer", "compute"] {
        assert!(live.contains(stage), "the stage table lists {stage}:\n{live}");
    }
    assert!(live.contains("CPU") && live.contains("queue"), "the charts show:\n{live}");
    tmux.run(&["send-keys", "-t", "pp", "q"]);
    assert_stopped_cleanly(&tmux, 0);
}

#[test]
fn ctrl_c_in_the_live_view_stops_like_q() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((tmux, _)) = start_live_view(tmp.path()) else { return };
    // Raw mode: Ctrl-C reaches the view as a key, not as SIGINT.
    tmux.run(&["send-keys", "-t", "pp", "C-c"]);
    assert_stopped_cleanly(&tmux, 130);
}

#[test]
fn two_ctrl_c_50_ms_apart_in_the_live_view_are_one_interrupt_with_trace_and_summary_written() {
    let tmp = tempfile::tempdir().unwrap();
    let (trace, summary) = (tmp.path().join("t.json"), tmp.path().join("s.json"));
    let extra = format!("--trace \"{}\" --summary \"{}\"", trace.display(), summary.display());
    let Some((tmux, _)) = start_live_view_with(tmp.path(), &extra, FILLED) else { return };
    // The stimulus: a nervous user (or key repeat) pressing Ctrl-C twice, 50 ms apart.
    tmux.run(&["send-keys", "-t", "pp", "C-c"]);
    std::thread::sleep(Duration::from_millis(50));
    tmux.run(&["send-keys", "-t", "pp", "C-c"]);
    let after = assert_stopped_cleanly(&tmux, 130);
    let text = std::fs::read_to_string(&trace).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).expect("the trace is closed, strictly valid JSON");
    assert!(v["traceEvents"].as_array().unwrap().iter().any(|e| e["name"] == "summary"), "a clean stop:\n{after}");
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    assert!(s["steps"].as_u64().unwrap() >= 1 && s.get("failed").is_none(), "{s}");
}

#[test]
fn a_ctrl_c_after_the_grace_period_exits_at_once_with_the_terminal_restored_and_files_closed() {
    let tmp = tempfile::tempdir().unwrap();
    let (trace, summary) = (tmp.path().join("t.json"), tmp.path().join("s.json"));
    // The first step never ends (its compute takes an hour): the first Ctrl-C cannot end the
    // run before the second.
    let extra = format!("--trace \"{}\" --summary \"{}\" --slow compute=+3599s", trace.display(), summary.display());
    // The view refreshes without steps too (on time): the loader's spans show.
    let Some((tmux, _)) = start_live_view_with(tmp.path(), &extra, &["read", "decode"]) else { return };
    tmux.run(&["send-keys", "-t", "pp", "C-c"]);
    std::thread::sleep(pipeprof_core::signal::GRACE + Duration::from_millis(100));
    tmux.run(&["send-keys", "-t", "pp", "C-c"]);
    let after = tmux.wait_for("pipeprof to exit", Duration::from_secs(60), Tmux::history, |s| s.contains("test-done"));
    assert!(after.contains("pipeprof-exit=130"), "{after}");
    assert!(after.contains("tty: icanon echo"), "raw mode is off again:\n{after}");
    let alt = tmux.run(&["display-message", "-p", "-t", "pp", "#{alternate_on}"]);
    assert_eq!(String::from_utf8_lossy(&alt.stdout).trim(), "0", "back on the normal screen");
    let text = std::fs::read_to_string(&trace).unwrap();
    serde_json::from_str::<serde_json::Value>(&text).expect("the trace is closed, strictly valid JSON");
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    assert!(s.get("failed").is_some(), "an immediate exit marks the summary failed: {s}");
}

#[test]
fn two_sigterms_apart_while_the_view_is_up_exit_at_once_with_the_terminal_restored() {
    let tmp = tempfile::tempdir().unwrap();
    let (trace, summary) = (tmp.path().join("t.json"), tmp.path().join("s.json"));
    let extra = format!("--trace \"{}\" --summary \"{}\" --slow compute=+3599s", trace.display(), summary.display());
    let Some((tmux, _)) = start_live_view_with(tmp.path(), &extra, &["read", "decode"]) else { return };
    // `sh` wrote its pid, then exec'd pipeprof in place: that pid is pipeprof's.
    let pid: i32 = std::fs::read_to_string(tmp.path().join("pid")).unwrap().trim().parse().unwrap();
    // The stimulus: `docker stop` twice, or a supervisor that insists.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    std::thread::sleep(pipeprof_core::signal::GRACE + Duration::from_millis(100));
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let after = tmux.wait_for("pipeprof to exit", Duration::from_secs(60), Tmux::history, |s| s.contains("test-done"));
    assert!(after.contains("pipeprof-exit=143"), "{after}");
    assert!(after.contains("tty: icanon echo"), "raw mode is off again:\n{after}");
    let alt = tmux.run(&["display-message", "-p", "-t", "pp", "#{alternate_on}"]);
    assert_eq!(String::from_utf8_lossy(&alt.stdout).trim(), "0", "back on the normal screen");
    let text = std::fs::read_to_string(&trace).unwrap();
    serde_json::from_str::<serde_json::Value>(&text).expect("the trace is closed, strictly valid JSON");
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    assert!(s.get("failed").is_some(), "an immediate exit marks the summary failed: {s}");
}
