#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The off-CPU split on real runs: busy programs beside a run on small page-cached images are
//! named as contention, never as storage or transfer; reads that wait on (simulated) storage
//! grow `--workers auto` past the cores. One test function: the runs never overlap another
//! test's training or burners.

mod common;

use pipeprof_trainer::data::demo::{DemoFormat, DemoSpec};
use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Stdio};

const TINY: &str = "[input]\nheight = 16\nwidth = 16\n[[layers]]\ntype = \"flatten\"\n\
                    [[layers]]\ntype = \"dense\"\nunits = \"classes\"\n[train]\nbatch_size = 8\n";

/// Busy-loop processes (`sh`), each bounded by `timeout` and stopped by id when dropped, even
/// when an assertion fails.
struct Burners(Vec<Child>);

impl Burners {
    fn start(n: usize) -> Burners {
        let spawn = || {
            Command::new("timeout")
                .args(["120", "sh", "-c", "while :; do :; done"])
                .stdin(Stdio::null())
                .spawn()
                .expect("timeout and sh exist")
        };
        let mut b = Burners((0..n).map(|_| spawn()).collect());
        // Running before the run starts: `timeout` has started its busy loop (a child), so the
        // sampler's first listing already sees it. Under load the exec can lag the spawn. Stops
        // waiting if the kernel cannot say, or `timeout` is gone.
        for c in &mut b.0 {
            let children = format!("/proc/{0}/task/{0}/children", c.id());
            while std::fs::read_to_string(&children).is_ok_and(|t| t.trim().is_empty())
                && c.try_wait().is_ok_and(|s| s.is_none())
            {
                std::thread::yield_now();
            }
        }
        b
    }
}

impl Drop for Burners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            // SIGTERM to `timeout` is passed on to its busy loop (SIGKILL would orphan it).
            let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
            let _ = c.wait();
        }
    }
}

fn summary(dir: &Path, args: &[&str]) -> Value {
    let m = dir.join("m.toml");
    std::fs::write(&m, TINY).unwrap();
    let s = dir.join("s.json");
    let out = Command::new(env!("CARGO_BIN_EXE_pipeprof"))
        .args(["profile", "--model", m.to_str().unwrap(), "--data", dir.join("imgs").to_str().unwrap()])
        .args(["--no-gpu", "--no-tui", "--summary", s.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    serde_json::from_slice(&std::fs::read(&s).unwrap()).unwrap()
}

#[test]
fn busy_neighbours_are_contention_and_blocked_reads_grow_auto_workers_past_the_cores() {
    let d = tempfile::tempdir().unwrap();
    // Just written: every file is in the page cache, reads never reach storage.
    DemoSpec { classes: 2, per_class: 24, size: Some((28, 28)), format: DemoFormat::Png, seed: 9 }
        .write(&d.path().join("imgs"))
        .unwrap();
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());

    // One busy loop more than there are cores, beside a 2-worker run long enough for the
    // sampler to list the other programs more than once: 4 ms of compute per step makes it
    // last over a second however fast the machine is.
    let s = {
        let _burn = Burners::start(cores + 1);
        summary(d.path(), &["--steps", "300", "--workers", "2", "--slow", "compute=+4ms"])
    };
    let v = &s["verdict"];
    assert!(!["Io", "Transfer"].contains(&v["limiter"].as_str().unwrap()), "{v}");
    let contention = v["flags"].as_array().unwrap().iter().find_map(|f| f.get("CoreContention")).cloned();
    let contention = contention.unwrap_or_else(|| panic!("contention is named: {v}"));
    assert_eq!(contention["external"], true, "{v}");
    let others = s["machine"]["others"].to_string();
    assert!(others.contains("\"sh\""), "the busy loops are named: {others}");
    let read = s["stages"].as_array().unwrap().iter().find(|x| x["stage"] == "read").unwrap();
    // Measured per span (tiny here: 12 µs reads rarely hold a preemption), and per thread.
    assert!(read["core_wait"].is_f64(), "{read}");
    assert!(v["evidence"].to_string().contains("of the time they were ready to run"), "{v}");

    // Every read waits 30 ms off-CPU: auto workers grow past the cores (doubling, each change
    // needs its warm-up, as many steps as workers, and a window of steps).
    let steps = (7 * (cores + 4) + 20).to_string();
    let s = summary(d.path(), &["--steps", &steps, "--workers", "auto", "--throttle-read", "+30ms"]);
    let log = s["settings"]["auto_workers"].to_string();
    let workers = s["settings"]["workers"].as_u64().unwrap() as usize;
    assert!(workers > cores, "{workers} workers on {cores} cores: {log}");
    assert!(log.contains("blocked"), "the reason says why: {log}");
    assert_ne!(s["verdict"]["limiter"], "Transfer", "{}", s["verdict"]);
}
