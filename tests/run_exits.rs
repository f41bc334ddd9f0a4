#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `pipeprof run`'s ways out through a terminal or a signal: Ctrl-Z under `--once` on a real
//! pty (an interactive bash drives it), SIGQUIT/USR1/USR2/ALRM, and pipeprof killed outright.

mod common;

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
        let r =
            unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), std::ptr::null()) };
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
        let (_group, sleeper) = (common::GroupKilledOnDrop(pids[0]), pids[1]);
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
        assert!(common::gone(sleeper), "signal {sig}: the program's group is still running");
    }
}

#[test]
fn the_program_does_not_outlive_a_pipeprof_killed_outright() {
    let dir = tempfile::tempdir().unwrap();
    // The program itself (pipeprof's child) prints its pid.
    let mut child = start_run(dir.path(), "echo $$; exec sleep 1000");
    let (pids, _rest) = first_pids(&mut child);
    let _group = common::GroupKilledOnDrop(pids[0]);
    child.kill().unwrap();
    child.wait().unwrap();
    // Before: the program went on, reparented, unseen. Now it gets SIGTERM when pipeprof dies.
    assert!(within(|| common::gone(pids[0])), "the program outlived pipeprof");
}

use std::os::unix::process::ExitStatusExt;
