#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `pipeprof run -- CMD`: the program's exit code, its failure, an interrupt passed on, and a
//! Rust program (the example trainer) sending its spans to the run it was started in.
//! Python programs under `pipeprof run` are tested with real PyTorch and Keras in python/tests.

mod common;

use common::text;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

/// `pipeprof run` with a private runtime folder (its socket and start-up hook go there).
fn run_cmd(runtime: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pipeprof"));
    c.env("XDG_RUNTIME_DIR", runtime).arg("run").arg("--once").arg("--no-gpu");
    c
}

#[test]
fn the_programs_exit_code_is_pipeprofs_and_a_failure_is_marked() {
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("s.json");
    let out = run_cmd(dir.path())
        .arg("--summary")
        .arg(&s)
        .args(["--", "sh", "-c", "echo training; exit 3"])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(text(&out.stdout).contains("training"), "the program keeps its output");
    assert!(err.contains("RUN FAILED: sh exited with status 3"), "{err}");
    assert!(err.contains("no process of `sh -c echo training; exit 3` connected"), "{err}");
    assert_eq!(common::read_summary(&s)["failed"], "sh exited with status 3");
    // The run's scratch files are gone: the socket and the start-up hook's folder.
    let left: Vec<_> = std::fs::read_dir(dir.path().join("pipeprof")).unwrap().flatten().map(|e| e.path()).collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_clean_exit_is_no_failure() {
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("s.json");
    let out = run_cmd(dir.path()).arg("--summary").arg(&s).args(["--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(common::read_summary(&s).get("failed").is_none());
}

#[test]
fn the_programs_command_line_is_shown_without_its_control_characters() {
    // An argument with a newline or an escape code must not add a line or retitle the
    // terminal in pipeprof's own messages.
    let dir = tempfile::tempdir().unwrap();
    let out = run_cmd(dir.path())
        .args(["--", "sh", "-c", "exit 0", "x\nFAKE LINE: all good\u{1b}]0;PWNED\u{7}"])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("pipeprof: running `sh -c exit 0 x?FAKE LINE: all good?]0;PWNED?`"), "{err}");
    assert!(!err.lines().any(|l| l.starts_with("FAKE LINE")), "{err}");
    assert!(!err.contains('\u{1b}'), "{err}");
}

#[test]
fn a_program_that_does_not_exist_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_cmd(dir.path()).args(["--", "/no/such/trainer", "--epochs", "2"]).output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot start `/no/such/trainer`: not found"), "{err}");
}

#[test]
fn nothing_to_run_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_cmd(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("<CMD>"), "{}", text(&out.stderr));
}

/// Runs `sh -c script` under `pipeprof run` with `args`; once the script printed `started`,
/// sends pipeprof SIGINT. Returns (stdout after that line: the report, the run's output,
/// the summary).
fn interrupt_run(args: &[&str], script: &str) -> (String, std::process::Output, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("s.json");
    let mut child = run_cmd(dir.path())
        .args(args)
        .arg("--summary")
        .arg(&s)
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "started", "{script}");
    // SAFETY: a signal to the child we started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let mut report = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut report).unwrap();
    let out = child.wait_with_output().unwrap();
    (report, out, common::read_summary(&s))
}

#[test]
fn an_interrupt_is_passed_to_the_program_and_the_report_still_comes() {
    // The program says it started, then waits to be interrupted; pipeprof gets the SIGINT.
    let (report, out, s) = interrupt_run(&[], "echo started; while :; do sleep 0.05; done");
    let err = text(&out.stderr);
    assert!(report.contains("── pipeprof report"), "{report}");
    // sh dies of the SIGINT passed to its group: 128 + 2, an interruption, not a failure.
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("was interrupted (exit code 130)"), "{err}");
    assert!(
        err.contains("interrupt passed to `sh -c echo started;") && err.contains("in 30 s (--stop-timeout)"),
        "{err}"
    );
    assert!(!err.contains("after the interrupt: SIGTERM"), "{err}");
    assert!(s.get("failed").is_none());
}

#[test]
fn a_program_that_ignores_the_interrupt_is_ended_with_its_whole_group_and_the_report_comes() {
    // sh ignores SIGINT: after --stop-timeout its group gets SIGTERM. With SIGTERM ignored too,
    // and a background child that inherits both (it holds the test's stdout pipe open: were it
    // left running, reading to the end would never return), SIGKILL follows.
    for (script, code, signal) in [
        ("trap '' INT; echo started; while :; do sleep 0.05; done", 143, "SIGTERM"),
        ("trap '' INT TERM; sleep 1000 & echo started; wait", 137, "SIGKILL"),
    ] {
        let (report, out, s) = interrupt_run(&["--stop-timeout", "0.2"], script);
        let err = text(&out.stderr);
        assert!(report.contains("── pipeprof report"), "{script}: {report}");
        assert!(
            err.contains("has not ended 0.2 s after the interrupt: SIGTERM to its process group"),
            "{script}: {err}"
        );
        assert_eq!(err.contains("SIGKILL to its process group"), signal == "SIGKILL", "{script}: {err}");
        assert_eq!(out.status.code(), Some(code), "{script}: {err}");
        assert!(err.contains(&format!("was interrupted (exit code {code})")), "{script}: {err}");
        assert!(s.get("failed").is_none(), "{script}");
    }
}

#[test]
fn the_stop_timeout_must_be_a_positive_number_of_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_cmd(dir.path()).args(["--stop-timeout", "0", "--", "true"]).output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--stop-timeout") && err.contains("must be more than 0"), "{err}");
}

#[test]
fn a_rust_program_started_under_run_sends_its_stages_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("imgs");
    common::demo(&data, 3, 8, 5);
    let (s, t) = (dir.path().join("s.json"), dir.path().join("t.json"));
    let out = run_cmd(dir.path())
        .arg("--summary")
        .arg(&s)
        .arg("--trace")
        .arg(&t)
        .arg("--")
        .arg(common::example())
        .arg("--data")
        .arg(&data)
        .args(["--steps", "5", "--size", "16", "--workers", "1", "--batch-size", "4"])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let v = common::read_summary(&s);
    assert_eq!(v["steps"], 5, "{err}");
    assert_eq!(v["images"], 20);
    let stages: Vec<&str> = v["stages"].as_array().unwrap().iter().filter_map(|x| x["stage"].as_str()).collect();
    for st in ["read", "decode", "resize", "wait", "compute"] {
        assert!(stages.contains(&st), "{st} missing from {stages:?}");
    }
    // The program's own settings (its hello) are the run's.
    assert_eq!(v["settings"]["batch_size"], 4, "{}", v["settings"]);
    // Its loader thread is named as in the program, under its pid.
    let names: Vec<&str> = v["loader_threads"].as_array().unwrap().iter().filter_map(|x| x["name"].as_str()).collect();
    assert!(names.iter().any(|n| n.starts_with("loader")), "{names:?}");
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&t).unwrap()).expect("the trace parses");
    assert!(trace["traceEvents"].as_array().is_some_and(|e| e.len() > 20));
}

#[test]
fn rust_programs_started_per_rank_are_kept_apart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("imgs");
    common::demo(&data, 3, 8, 5);
    let (s, t) = (dir.path().join("s.json"), dir.path().join("t.json"));
    // A launcher of two ranks: each rank's process learns its RANK from its environment.
    let one = |rank: u32, steps: u32| {
        format!(
            "RANK={rank} LOCAL_RANK={rank} WORLD_SIZE=2 '{}' --data '{}' --steps {steps} --size 16 --workers 1 --batch-size 4",
            common::example().display(),
            data.display()
        )
    };
    let script = format!("{} & {}; wait", one(0, 6), one(1, 7));
    let out = run_cmd(dir.path())
        .arg("--summary")
        .arg(&s)
        .arg("--trace")
        .arg(&t)
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let v = common::read_summary(&s);
    assert_eq!(v["steps"], 13, "{err}");
    let ranks: Vec<(u64, u64, u64)> = v["ranks"]
        .as_array()
        .unwrap_or_else(|| panic!("no ranks: {v}"))
        .iter()
        .map(|r| (r["rank"].as_u64().unwrap(), r["steps"].as_u64().unwrap(), r["world_size"].as_u64().unwrap()))
        .collect();
    assert_eq!(ranks, vec![(0, 6, 2), (1, 7, 2)]);
    assert!(text(&out.stdout).contains("ranks: 2 of 2 reported"), "{}", text(&out.stdout));
    // A trace per rank beside the run's, each naming its rank.
    for r in 0..2 {
        let p = dir.path().join(format!("t.rank{r}.json"));
        let trace: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).expect("parses");
        assert_eq!(trace["distributedInfo"]["rank"], r);
        assert!(trace["traceEvents"].as_array().is_some_and(|e| e.len() > 10));
    }
}

#[test]
fn the_gpu_is_the_runs_when_nvml_lists_a_process_started_below_it() {
    // The program's own child (as a DataLoader worker or a rank would be) writes its pid where
    // the fake driver lists it, then waits until the driver has listed it in two process-list
    // calls (one full sample after another): it was sampled alive.
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_nvml::build(Path::new(env!("CARGO_TARGET_TMPDIR"))).unwrap();
    let (pids, seen, s) = (dir.path().join("pids"), dir.path().join("seen"), dir.path().join("s.json"));
    let inner = format!(
        "echo $$ > {p}; while [ \"$(wc -c < {seen} 2>/dev/null || echo 0)\" -lt 4 ]; do :; done",
        p = pids.display(),
        seen = seen.display()
    );
    let out = Command::new(env!("CARGO_BIN_EXE_pipeprof"))
        .env("XDG_RUNTIME_DIR", dir.path())
        .env("PIPEPROF_NVML_LIB", &lib)
        .env("FAKE_NVML_PID_FILE", &pids)
        .env("FAKE_NVML_SEEN_FILE", &seen)
        .env("FAKE_NVML_PID_MEM_MIB", "520")
        .args(["run", "--once", "--sample-hz", "50", "--summary"])
        .arg(&s)
        .args(["--", "sh", "-c"])
        .arg(format!("sh -c '{inner}'"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = text(&out.stdout);
    let child: u32 = std::fs::read_to_string(&pids).unwrap().trim().parse().unwrap();
    assert!(report.contains(&format!("the run uses it: sh pid {child} 520 MiB")), "{report}");
    assert!(!report.contains("unused"), "{report}");
    let v = common::read_summary(&s);
    let d = &v["machine"]["devices"][0];
    assert_eq!(d["this_process_on_gpu"], true, "{d}");
    assert_eq!(d["run_processes"][0]["pid"], child, "{d}");
    assert_eq!(d["process_mem_peak_bytes"], 520u64 << 20, "{d}");
}

#[test]
fn a_run_whose_socket_file_was_removed_still_ends_with_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("s.json");
    // A temp cleaner (or logout emptying /run/user/UID) removes the socket while the run goes on.
    let child = run_cmd(dir.path())
        .arg("--summary")
        .arg(&s)
        .args(["--", "sh", "-c", "rm \"$PIPEPROF_PARENT\"; echo removed"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Before, the end woke the accept thread by connecting to the removed file: it waited forever.
    let out = common::output_within(child, std::time::Duration::from_secs(60), "pipeprof run");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("── pipeprof report"), "{}", text(&out.stdout));
    assert!(common::read_summary(&s).get("failed").is_none());
}

/// `pipeprof run` of `sh -c script` with a trace and a summary, stderr read line by line into
/// a channel. Returns the child (stdout piped), the lines, and the temp dir.
fn start_run(script: &str) -> (std::process::Child, std::sync::mpsc::Receiver<String>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut child = run_cmd(dir.path())
        .arg("--summary")
        .arg(dir.path().join("s.json"))
        .arg("--trace")
        .arg(dir.path().join("t.json"))
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let err = BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || err.lines().map_while(Result::ok).for_each(|l| drop(tx.send(l))));
    (child, rx, dir)
}

/// Lines from `rx` until one contains `needle` (bounded: a run that never says it fails).
fn until(rx: &std::sync::mpsc::Receiver<String>, needle: &str, seen: &mut Vec<String>) {
    while let Ok(l) = rx.recv_timeout(std::time::Duration::from_secs(60)) {
        let hit = l.contains(needle);
        seen.push(l);
        if hit {
            return;
        }
    }
    panic!("never said {needle:?}: {seen:#?}");
}

/// The run's files after it ended: the trace parses, the summary is JSON, and the socket and
/// the start-up hook's folder are gone.
fn files_kept_and_scratch_gone(dir: &Path) {
    let t = std::fs::read_to_string(dir.join("t.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&t).expect("the trace parses");
    assert!(v["traceEvents"].is_array());
    common::read_summary(&dir.join("s.json"));
    let left: Vec<_> = std::fs::read_dir(dir.join("pipeprof")).unwrap().flatten().map(|e| e.path()).collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_second_sigterm_ends_a_group_that_ignores_it_and_still_writes_everything() {
    // The acceptance case: a program whose group ignores SIGTERM (sleep inherits the trap).
    let (child, rx, dir) = start_run("trap '' TERM; sleep 1000 & echo $!; echo started; wait");
    let mut child = child;
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut pid = String::new();
    out.read_line(&mut pid).unwrap();
    let sleeper: i32 = pid.trim().parse().unwrap();
    let mut started = String::new();
    out.read_line(&mut started).unwrap();
    let mut seen = Vec::new();
    // SAFETY: signals to the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    until(&rx, "interrupt passed to", &mut seen);
    // Again, until it counts as a second interrupt (a repeat within the grace period is the
    // same one): before, pipeprof exited here with the trace open and no summary.
    loop {
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        if let Ok(l) = rx.recv_timeout(std::time::Duration::from_millis(100)) {
            let second = l.contains("second interrupt");
            seen.push(l);
            if second {
                break;
            }
        }
    }
    let stdout = std::thread::spawn(move || std::io::Read::read_to_string(&mut out, &mut String::new()));
    let status = child.wait().unwrap();
    let _ = stdout.join();
    seen.extend(rx.try_iter());
    // sh ignored SIGTERM, so SIGKILL ended the group: the interruption asked for.
    assert_eq!(status.code(), Some(137), "{seen:#?}");
    assert!(seen.iter().any(|l| l.contains("SIGKILL to its process group")), "{seen:#?}");
    files_kept_and_scratch_gone(dir.path());
    assert!(common::gone(sleeper), "the program's group is still running");
}

#[test]
fn a_hangup_ends_the_group_and_still_writes_everything() {
    let (child, rx, dir) = start_run("sleep 1000 & echo $!; echo started; wait");
    let mut child = child;
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut pid = String::new();
    out.read_line(&mut pid).unwrap();
    let sleeper: i32 = pid.trim().parse().unwrap();
    out.read_line(&mut String::new()).unwrap();
    // The terminal closed: before, SIGHUP killed pipeprof with the trace open, the group running.
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    let stdout = std::thread::spawn(move || std::io::Read::read_to_string(&mut out, &mut String::new()));
    let status = child.wait().unwrap();
    let _ = stdout.join();
    let seen: Vec<String> = rx.try_iter().collect();
    assert_eq!(status.code(), Some(143), "sh died of the SIGTERM sent to its group: {seen:#?}");
    assert!(seen.iter().any(|l| l.contains("the terminal hung up: SIGTERM")), "{seen:#?}");
    files_kept_and_scratch_gone(dir.path());
    assert!(common::gone(sleeper), "the program's group is still running");
}

#[test]
fn a_closed_stdout_costs_neither_the_summary_nor_the_programs_exit_code() {
    // `pipeprof run … | head`: the reader is gone before the report is printed.
    let (child, rx, dir) = start_run("read x; exit 3");
    let mut child = child;
    drop(child.stdout.take());
    drop(child.stdin.take());
    let status = child.wait().unwrap();
    let seen: Vec<String> = rx.try_iter().collect();
    // Before: a panic printing the report (exit 101), and no summary.
    assert_eq!(status.code(), Some(3), "{seen:#?}");
    assert!(!seen.iter().any(|l| l.contains("panicked")), "{seen:#?}");
    assert_eq!(common::read_summary(&dir.path().join("s.json"))["failed"], "sh exited with status 3");
}
