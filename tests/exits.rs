#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Every way a run can end leaves a loadable trace and the report: normal end, Ctrl-C,
//! SIGTERM, a panic in training, `kill -9` (then `report --repair`); and `pipeprof run`'s
//! ways out through a terminal or a signal.

mod common;

use pipeprof_trainer::data::demo::{DemoFormat, DemoSpec};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MODEL: &str = "[input]\nheight = 16\nwidth = 16\n[[layers]]\ntype = \"flatten\"\n\
                     [[layers]]\ntype = \"dense\"\nunits = \"classes\"\n[train]\nbatch_size = 4\n";

struct Run {
    _dir: tempfile::TempDir,
    model: PathBuf,
    data: PathBuf,
    trace: PathBuf,
    summary: PathBuf,
}

fn setup() -> Run {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("imgs");
    DemoSpec { classes: 2, per_class: 8, size: Some((24, 24)), format: DemoFormat::Png, seed: 2 }.write(&data).unwrap();
    let model = d.path().join("m.toml");
    std::fs::write(&model, MODEL).unwrap();
    let (trace, summary) = (d.path().join("t.json"), d.path().join("s.json"));
    Run { _dir: d, model, data, trace, summary }
}

fn start(r: &Run, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_pipeprof"))
        .args(["profile", "--model", r.model.to_str().unwrap(), "--data", r.data.to_str().unwrap()])
        .args(["--trace", r.trace.to_str().unwrap(), "--summary", r.summary.to_str().unwrap(), "--no-gpu"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits (bounded) until the streamed trace shows training steps on disk.
fn wait_until_training(trace: &Path) {
    wait_for_span(trace, "compute");
}

/// Waits (bounded) until the streamed trace shows a `name` span on disk.
fn wait_for_span(trace: &Path, name: &str) {
    let needle = format!("\"name\":\"{name}\"");
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if std::fs::read_to_string(trace).map(|t| t.contains(&needle)).unwrap_or(false) {
            return;
        }
        std::thread::yield_now();
    }
    panic!("the run never wrote a {name} span to {}", trace.display());
}

fn trace_events(trace: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(trace).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).expect("a closed, valid JSON trace");
    v["traceEvents"].as_array().unwrap().clone()
}

fn stop_with(sig: i32) {
    let r = setup();
    let child = start(&r, &["--steps", "100000000"]);
    wait_until_training(&r.trace);
    unsafe { libc::kill(child.id() as i32, sig) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + sig), "{}", String::from_utf8_lossy(&out.stderr));
    let evs = trace_events(&r.trace);
    assert!(evs.iter().any(|e| e["name"] == "compute"));
    assert!(evs.iter().any(|e| e["name"] == "summary"), "the final summary is in the trace");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("pipeprof report"), "{report}");
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&r.summary).unwrap()).unwrap();
    assert!(s["steps"].as_u64().unwrap() >= 1);
}

#[test]
fn ctrl_c_stops_cleanly_with_report_and_closed_trace() {
    stop_with(libc::SIGINT);
}

#[test]
fn sigterm_stops_cleanly_with_report_and_closed_trace() {
    stop_with(libc::SIGTERM);
}

#[test]
fn a_panic_in_training_still_closes_the_trace() {
    let r = setup();
    let out = start(&r, &["--epochs", "3", "--panic-at-step", "2"]).wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("training thread panicked"));
    let evs = trace_events(&r.trace);
    assert_eq!(evs.iter().filter(|e| e["name"] == "compute").count(), 2, "steps 0 and 1 ran");
}

#[test]
fn a_panic_in_a_loader_worker_fails_the_run_and_says_where() {
    let r = setup();
    let out = start(&r, &["--epochs", "3", "--panic-in-loader-at-step", "2"]).wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("RUN FAILED: loader thread loader-0 died in stage decode: --panic-in-loader-at-step 2"),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("pipeprof report"), "the report is still printed");
    let evs = trace_events(&r.trace);
    let failed = evs.iter().find(|e| e["name"] == "run failed").expect("the trace says the run failed");
    assert!(failed["args"]["error"].as_str().unwrap().contains("loader-0"));
    let summary = evs.iter().find(|e| e["name"] == "summary").unwrap();
    assert!(summary["args"]["failed"].as_str().unwrap().contains("stage decode"));
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&r.summary).unwrap()).unwrap();
    assert!(s["failed"].as_str().unwrap().contains("loader thread loader-0"));
    assert!(s["steps"].as_u64().unwrap() < 12, "the run stopped at the failure, not after 3 epochs");
}

#[test]
fn two_interrupts_1ms_apart_are_one_and_leave_a_strictly_loadable_trace() {
    let r = setup();
    let child = start(&r, &["--steps", "100000000"]);
    wait_until_training(&r.trace);
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    // The stimulus itself (what `timeout` or a terminal does), not a wait for something.
    std::thread::sleep(Duration::from_millis(1));
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + libc::SIGINT), "{}", String::from_utf8_lossy(&out.stderr));
    let evs = trace_events(&r.trace);
    assert!(evs.iter().any(|e| e["name"] == "summary"), "a clean stop, with the final summary");
}

#[test]
fn a_second_interrupt_after_the_grace_period_exits_at_once_with_trace_and_summary_closed() {
    let r = setup();
    // A step that takes 20 s: the first interrupt cannot finish the run before the second.
    let page = r.summary.with_file_name("report.html");
    let child = start(&r, &["--steps", "100000000", "--slow", "compute=+20s", "--html", page.to_str().unwrap()]);
    // Loader spans on disk: the loader runs, and the loop's first step (20 s) is under way
    // (the loop's own spans are sent in batches, later).
    wait_for_span(&r.trace, "read");
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    // The stimulus: a user pressing Ctrl-C again well after the grace period. The grace is
    // timed from when pipeprof's signal thread takes the first interrupt, not from when it
    // was sent: on a loaded machine that thread ran over 100 ms late once, and a second
    // interrupt sent 100 ms after the grace was then the same interrupt (no exit at once).
    std::thread::sleep(pipeprof_core::signal::GRACE + Duration::from_millis(1500));
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + libc::SIGINT), "{stderr}");
    assert!(stderr.contains("second interrupt: closing the trace and exiting now"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("pipeprof report"), "no report: it exited at once");
    let evs = trace_events(&r.trace);
    assert!(evs.iter().any(|e| e["name"] == "settings"));
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&r.summary).unwrap()).unwrap();
    assert!(s["failed"].as_str().unwrap().contains("interrupted twice"), "{s}");
    // The page too, from the same snapshot and saying so (an earlier run's page would have
    // stayed, looking current).
    let html = std::fs::read_to_string(&page).expect("the HTML page is written on the way out");
    assert!(html.contains("interrupted twice"), "{}", &html[..html.len().min(2000)]);
}

#[test]
fn an_interrupt_through_timeout_leaves_a_strictly_loadable_trace() {
    let r = setup();
    // `timeout` sends its signal to the run and then to its whole process group: two SIGINTs
    // microseconds apart. SIGALRM makes it act now (it is how its own timer fires).
    let child = Command::new("timeout")
        .args(["-s", "INT", "3600", env!("CARGO_BIN_EXE_pipeprof")])
        .args(["profile", "--model", r.model.to_str().unwrap(), "--data", r.data.to_str().unwrap()])
        .args(["--trace", r.trace.to_str().unwrap(), "--no-gpu", "--steps", "100000000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("GNU timeout (coreutils) is installed");
    wait_until_training(&r.trace);
    unsafe { libc::kill(child.id() as i32, libc::SIGALRM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(124), "timed out: {}", String::from_utf8_lossy(&out.stderr));
    let evs = trace_events(&r.trace);
    assert!(evs.iter().any(|e| e["name"] == "summary"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn kill_9_leaves_a_prefix_that_report_repair_closes() {
    let r = setup();
    let mut child = start(&r, &["--steps", "100000000"]);
    wait_until_training(&r.trace);
    child.kill().unwrap();
    child.wait().unwrap();
    let text = std::fs::read_to_string(&r.trace).unwrap();
    assert!(serde_json::from_str::<serde_json::Value>(&text).is_err(), "not closed after kill -9");
    let out = Command::new(env!("CARGO_BIN_EXE_pipeprof"))
        .args(["report", "--repair", r.trace.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("compute"));
    let evs = trace_events(&r.trace);
    assert!(evs.iter().any(|e| e["ph"] == "X" && e["name"] == "compute"));
}

#[test]
fn a_read_that_never_returns_is_named_and_sigterm_ends_the_run_without_waiting_for_it() {
    use std::io::BufRead;
    let r = setup();
    // Every read takes an hour (a hung network drive): the run never gets its first batch.
    let mut child = start(&r, &["--steps", "100", "--slow", "read=+3599s", "--stall-after", "0.5"]);
    // The watchdog names the stuck read on stderr: read lines until it does.
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let mut line = String::new();
    while !seen.contains("has been reading") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "stderr ended before the stall was named:\n{seen}");
        seen.push_str(&line);
    }
    assert!(seen.contains("loader-0 has been reading") && seen.contains("imgs/"), "{seen}");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM), "{seen}{rest}");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("was still reading") && report.contains("left behind"), "{report}");
    let evs = trace_events(&r.trace);
    let stalled = evs.iter().find(|e| e["name"] == "stalled").expect("the trace names the stall");
    assert!(stalled["args"]["file"].as_str().unwrap().contains("imgs/"), "{stalled}");
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&r.summary).unwrap()).unwrap();
    let stalls = s["stalls"].as_array().unwrap();
    assert!(stalls.iter().any(|x| x["abandoned"] == true && x["stage"] == "read"), "{s}");
}

#[test]
fn a_fifo_named_like_an_image_is_skipped_at_scan_and_named() {
    let r = setup();
    let fifo =
        r.data.join(std::fs::read_dir(&r.data).unwrap().next().unwrap().unwrap().file_name()).join("zz_pipe.png");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", fifo.display());
    let out = start(&r, &["--steps", "3"]).wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("zz_pipe.png") && stderr.contains("not a regular file"), "{stderr}");
    assert!(trace_events(&r.trace).iter().any(|e| e["name"] == "compute"));
}

#[test]
fn ctrl_c_during_check_advice_stops_the_follow_ups_and_removes_their_temporary_folder() {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let r = setup();
    // A preprocess-bound run, so there is advice to check; its own process group, as a
    // terminal's, so that Ctrl-C reaches the follow-up run too.
    // A temp folder of the test's own: the follow-ups' folder has a random name in it.
    let tmp_dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pipeprof"))
        .env("TMPDIR", tmp_dir.path())
        .args(["profile", "--model", r.model.to_str().unwrap(), "--data", r.data.to_str().unwrap()])
        .args(["--steps", "8", "--workers", "1", "--slow", "decode=+15ms", "--no-tui", "--no-gpu", "--check-advice"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let (mut seen, mut line) = (String::new(), String::new());
    while !seen.contains("check-advice: run 1/") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "no follow-up run started:\n{seen}");
        seen.push_str(&line);
    }
    let folders: Vec<_> = std::fs::read_dir(tmp_dir.path()).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(folders.len(), 1, "the follow-ups' folder exists while they run: {folders:?}");
    let tmp = &folders[0];
    assert!(tmp.is_dir() && tmp.file_name().unwrap().to_string_lossy().starts_with("pipeprof-check-"), "{folders:?}");
    // Ctrl-C: SIGINT to the whole foreground process group.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGINT) };
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + libc::SIGINT), "{seen}{rest}");
    assert!(rest.contains("check-advice: interrupted"), "{seen}{rest}");
    assert!(!rest.contains("check-advice: run 2/"), "no follow-up started after the interrupt:\n{rest}");
    assert!(!tmp.exists(), "{} removed", tmp.display());
}

#[test]
fn a_worker_busy_with_a_slow_batch_at_the_stop_is_not_called_stuck() {
    let r = setup();
    // Each decode spins 600 ms: a batch of 4 takes 2.4 s, longer than the stop waits for a
    // worker, but every stage ends well within that wait.
    let child = start(&r, &["--steps", "100", "--slow", "decode=+600ms"]);
    wait_for_span(&r.trace, "decode");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let (report, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM), "{stderr}");
    assert!(report.contains("pipeprof report") && !report.contains("left behind"), "{report}");
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&r.summary).unwrap()).unwrap();
    assert_eq!(s["stalls"], serde_json::json!([]), "{s}");
}

/// `pipeprof run`'s ways out through a terminal or a signal: Ctrl-Z under `--once` on a real
/// pty (an interactive bash drives it), SIGQUIT/USR1/USR2/ALRM, and pipeprof killed outright.
mod run_through_a_terminal_or_a_signal {

    use std::io::{Read, Write};
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    use std::path::Path;
    use std::process::{Command, Stdio};
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::{Duration, Instant};

    /// A failure bound, not a synchronisation: every wait below ends on what the terminal shows.
    const BOUND: Duration = Duration::from_secs(60);

    /// An interactive bash on a pty of its own (its session's controlling terminal).
    /// Without line editing: readline flushes input typed before it set the terminal up.
    struct Shell {
        bash: std::process::Child,
        master: std::fs::File,
        screen: Arc<(Mutex<String>, Condvar)>,
        /// How far the screen has been read by [`Shell::expect`].
        seen: usize,
    }

    impl Shell {
        fn start() -> Shell {
            let (mut master, mut slave) = (0, 0);
            // SAFETY: openpty fills two descriptors we then own.
            let r = unsafe {
                libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), std::ptr::null())
            };
            assert_eq!(r, 0, "openpty");
            // SAFETY: fresh descriptors from openpty, owned here.
            let (master, slave) = unsafe { (std::fs::File::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
            let mut cmd = Command::new("bash");
            cmd.args(["--norc", "--noprofile", "--noediting", "-i"])
                .env("PS1", "PROMPT> ")
                .env("TERM", "dumb")
                .stdin(Stdio::from(slave.try_clone().unwrap()))
                .stdout(Stdio::from(slave.try_clone().unwrap()))
                .stderr(Stdio::from(slave));
            // SAFETY: async-signal-safe calls only: a new session whose terminal is the pty.
            unsafe {
                cmd.pre_exec(|| {
                    libc::setsid();
                    libc::ioctl(0, libc::TIOCSCTTY, 0);
                    Ok(())
                });
            }
            let bash = cmd.spawn().expect("bash runs");
            let screen: Arc<(Mutex<String>, Condvar)> = Arc::default();
            let mut reader = master.try_clone().unwrap();
            let s = screen.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = reader.read(&mut buf) {
                    s.0.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
                    s.1.notify_all();
                }
            });
            Shell { bash, master, screen, seen: 0 }
        }

        fn type_in(&mut self, keys: &str) {
            self.master.write_all(keys.as_bytes()).unwrap();
        }

        /// Waits until the screen, past what was already expected, shows `needle`.
        fn expect(&mut self, needle: &str) {
            let deadline = Instant::now() + BOUND;
            let mut screen = self.screen.0.lock().unwrap();
            loop {
                if let Some(at) = screen[self.seen..].find(needle) {
                    self.seen += at + needle.len();
                    return;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                assert!(!left.is_zero(), "the terminal never showed {needle:?}; it shows:\n{}", &*screen);
                screen = self.screen.1.wait_timeout(screen, left).unwrap().0;
            }
        }
    }

    impl Drop for Shell {
        fn drop(&mut self) {
            // The session leader gone, its terminal's foreground group gets SIGHUP.
            let _ = self.bash.kill();
            let _ = self.bash.wait();
        }
    }

    #[test]
    fn ctrl_z_under_once_stops_the_program_and_pipeprof_and_fg_continues_both() {
        let runtime = tempfile::tempdir().unwrap();
        let mut sh = Shell::start();
        sh.expect("PROMPT> ");
        // The typed line's echo shows ST""ARTED and GOT$x: only the program prints STARTED, GOThi.
        sh.type_in(&format!(
            "XDG_RUNTIME_DIR={} {} run --once --no-gpu -- sh -c 'echo ST\"\"ARTED; read x; echo GOT$x; exec sleep 300'\n",
            runtime.path().display(),
            env!("CARGO_BIN_EXE_pipeprof"),
        ));
        sh.expect("STARTED");
        // Ctrl-Z: before, the program stopped and pipeprof did not, and the prompt never came.
        sh.type_in("\x1a");
        sh.expect("Stopped");
        sh.expect("PROMPT> ");
        // fg continues both, and the program has the terminal again: it reads the line typed.
        sh.type_in("fg\n");
        sh.type_in("hi\n");
        sh.expect("GOThi");
        // Ctrl-C reaches the program as before (the sleeper itself: a sh waiting for a foreground
        // child defers its own SIGINT); pipeprof ends with its code and the shell is back.
        sh.type_in("\x03");
        sh.expect("── pipeprof report");
        sh.expect("PROMPT> ");
        sh.type_in("echo EXIT=$?\n");
        sh.expect("EXIT=130");
    }

    /// `pipeprof run --once` of `sh -c script`, with a trace and a summary in `dir`.
    fn start_run(dir: &Path, script: &str) -> std::process::Child {
        Command::new(env!("CARGO_BIN_EXE_pipeprof"))
            .env("XDG_RUNTIME_DIR", dir)
            .args(["run", "--once", "--no-gpu", "--summary"])
            .arg(dir.join("s.json"))
            .arg("--trace")
            .arg(dir.join("t.json"))
            .args(["--", "sh", "-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// The first line of `child`'s stdout: pids the script printed. The rest is read on a thread.
    fn first_pids(child: &mut std::process::Child) -> (Vec<i32>, std::thread::JoinHandle<String>) {
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        let rest = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        (line.split_whitespace().map(|p| p.parse().expect("the script printed pids")).collect(), rest)
    }

    /// Whether `done` holds within [`BOUND`] (looked at every 20 ms: a bound, not a wait).
    fn within(mut done: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + BOUND;
        while !done() {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    #[test]
    fn quit_usr1_usr2_and_alrm_end_the_run_as_sigterm_does() {
        for sig in [libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2, libc::SIGALRM] {
            let dir = tempfile::tempdir().unwrap();
            // The program's group: sh and a sleeper it started; it prints both pids first.
            let mut child = start_run(dir.path(), "sleep 1000 & echo $$ $!; wait");
            let (pids, rest) = first_pids(&mut child);
            let (_group, sleeper) = (super::common::GroupKilledOnDrop(pids[0]), pids[1]);
            // Before: pipeprof died of the signal, the trace open, no summary, the group running.
            // SAFETY: a signal to the child this test started.
            unsafe { libc::kill(child.id() as i32, sig) };
            let mut status = None;
            assert!(within(|| {
                status = child.try_wait().unwrap();
                status.is_some()
            }));
            assert_eq!(status.unwrap().signal(), None, "signal {sig}: pipeprof died of it");
            let report = rest.join().unwrap();
            assert!(report.contains("── pipeprof report"), "signal {sig}: {report}");
            let t = std::fs::read_to_string(dir.path().join("t.json")).unwrap();
            let v: serde_json::Value = serde_json::from_str(&t).expect("the trace is closed");
            assert!(v["traceEvents"].is_array());
            let s: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(dir.path().join("s.json")).unwrap()).unwrap();
            assert!(s.is_object());
            let left: Vec<_> =
                std::fs::read_dir(dir.path().join("pipeprof")).unwrap().flatten().map(|e| e.path()).collect();
            assert!(left.is_empty(), "signal {sig}: {left:?}");
            assert!(super::common::gone(sleeper), "signal {sig}: the program's group is still running");
        }
    }

    #[test]
    fn the_program_does_not_outlive_a_pipeprof_killed_outright() {
        let dir = tempfile::tempdir().unwrap();
        // The program itself (pipeprof's child) prints its pid.
        let mut child = start_run(dir.path(), "echo $$; exec sleep 1000");
        let (pids, _rest) = first_pids(&mut child);
        let _group = super::common::GroupKilledOnDrop(pids[0]);
        child.kill().unwrap();
        child.wait().unwrap();
        // Before: the program went on, reparented, unseen. Now it gets SIGTERM when pipeprof dies.
        assert!(within(|| super::common::gone(pids[0])), "the program outlived pipeprof");
    }

    use std::os::unix::process::ExitStatusExt;
}
