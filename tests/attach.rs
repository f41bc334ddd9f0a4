#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Attach end to end: the example trainer (a user's own candle loop) and `pipeprof attach`.

mod common;

use pipeprof_trainer::data::demo::{DemoFormat, DemoSpec};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

struct Env {
    dir: tempfile::TempDir,
    data: PathBuf,
}

fn setup() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("imgs");
    DemoSpec { classes: 3, per_class: 12, size: Some((40, 40)), format: DemoFormat::Mixed, seed: 4 }
        .write(&data)
        .unwrap();
    // A private runtime folder per test: runs of other tests are not found.
    std::fs::create_dir(dir.path().join("run")).unwrap();
    Env { dir, data }
}

impl Env {
    fn runtime(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    /// Starts the example; returns it and the address it prints first.
    fn start_example(&self, extra: &[&str]) -> (Child, String) {
        self.start_example_env(extra, &[])
    }

    /// [`Env::start_example`] with more environment variables.
    fn start_example_env(&self, extra: &[&str], vars: &[(&str, &str)]) -> (Child, String) {
        let mut child = Command::new(common::example())
            .args(["--data", self.data.to_str().unwrap(), "--batch-size", "8", "--size", "24"])
            .args(extra)
            .envs(vars.iter().copied())
            .env("XDG_RUNTIME_DIR", self.runtime())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        let addr =
            line.trim().strip_prefix("attach: ").unwrap_or_else(|| panic!("first line was {line:?}")).to_string();
        (child, addr)
    }

    fn attach(&self, args: &[&str]) -> Child {
        Command::new(env!("CARGO_BIN_EXE_pipeprof"))
            .arg("attach")
            .args(args)
            .env("XDG_RUNTIME_DIR", self.runtime())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn stage_count(s: &serde_json::Value, name: &str) -> u64 {
    s["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["stage"] == name)
        .map(|x| x["count"].as_u64().unwrap())
        .unwrap_or(0)
}

#[test]
fn attach_once_sees_every_stage_and_the_verdict() {
    let env = setup();
    let (example, addr) = env.start_example(&["--steps", "20", "--wait-for-clients", "1"]);
    assert!(addr.ends_with(".sock") && addr.starts_with(env.runtime().to_str().unwrap()), "{addr}");
    // Only the owner may connect.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&addr).unwrap().permissions().mode() & 0o777, 0o600);
    let out_json = env.dir.path().join("s.json");
    // No target: the one run in the runtime folder is found.
    let out = env.attach(&["--once", "--summary", out_json.to_str().unwrap()]).wait_with_output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("run ended"), "{stderr}");
    assert!(stdout.contains("verdict:"), "{stdout}");
    let s = common::read_summary(&out_json);
    assert_eq!(s["steps"], 20, "the example waited for us: every step arrived");
    for st in ["read", "decode", "resize", "wait", "transfer", "compute", "forward", "backward", "optimizer"] {
        assert!(stage_count(&s, st) > 0, "stage {st} missing: {s}");
    }
    assert_eq!(stage_count(&s, "compute"), 20);
    assert!(example.wait_with_output().unwrap().status.success());
    assert!(!Path::new(&addr).exists(), "the socket is removed when the run ends");
}

/// `attach --once --json`: the report goes to stderr, stdout is one document that holds
/// against the schema and says what the summary says.
#[test]
fn attach_json_prints_the_verdict_alone_on_stdout() {
    let env = setup();
    let (example, _) = env.start_example(&["--steps", "12", "--wait-for-clients", "1"]);
    let out_json = env.dir.path().join("s.json");
    let out = env.attach(&["--once", "--json", "--summary", out_json.to_str().unwrap()]).wait_with_output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("verdict:"), "the report goes to stderr: {stderr}");
    let doc: serde_json::Value = serde_json::from_str(&stdout).expect("stdout is one JSON document");
    assert_eq!(common::verdict_schema_errors(&doc), Vec::<String>::new());
    let s = common::read_summary(&out_json);
    assert_eq!(doc["numbers"]["steps"], 12);
    assert_eq!(doc["headline"], s["verdict"]["headline"]);
    assert!(example.wait_with_output().unwrap().status.success());
}

#[test]
fn two_clients_at_once_both_get_the_whole_run() {
    let env = setup();
    let (example, addr) = env.start_example(&["--steps", "15", "--wait-for-clients", "2"]);
    let (a, b) = (env.dir.path().join("a.json"), env.dir.path().join("b.json"));
    let ca = env.attach(&[&addr, "--once", "--summary", a.to_str().unwrap()]);
    let cb = env.attach(&[&addr, "--once", "--summary", b.to_str().unwrap()]);
    for c in [ca, cb] {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out).1);
    }
    assert_eq!(common::read_summary(&a)["steps"], 15);
    assert_eq!(common::read_summary(&b)["steps"], 15);
    assert!(example.wait_with_output().unwrap().status.success());
}

#[test]
fn detaching_leaves_the_run_going_and_a_later_client_sees_its_end() {
    let env = setup();
    let (example, addr) = env.start_example(&["--steps", "100000000", "--wait-for-clients", "1"]);
    // First client: detaches after a moment (as `q` would).
    let out = env.attach(&[&addr, "--once", "--duration", "0.5"]).wait_with_output().unwrap();
    let (_, stderr) = text(&out);
    assert!(out.status.success() && stderr.contains("detached; the run goes on"), "{stderr}");
    // The run is still there: a second client attaches to it.
    let second = env.attach(&[&addr, "--once", "--duration", "0.5"]).wait_with_output().unwrap();
    assert!(second.status.success(), "{}", text(&second).1);
    assert!(text(&second).0.contains("compute"), "the second client saw steps");
    let mut example = example;
    example.kill().unwrap();
    example.wait().unwrap();
}

#[test]
fn nothing_to_attach_to_and_remote_listen_are_explained() {
    let env = setup();
    let out = env.attach(&["--once"]).wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).1.contains("no instrumented run to attach to"), "{}", text(&out).1);
    let out = Command::new(common::example())
        .args(["--data", env.data.to_str().unwrap(), "--steps", "1"])
        .env("PIPEPROF_LISTEN", "0.0.0.0:0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out).1.contains("not a loopback address"), "{}", text(&out).1);
}

#[test]
fn attach_to_several_ranks_at_once_keeps_them_apart() {
    let env = setup();
    // Two ranks of one "distributed run", each serving its own socket; their RANK says which.
    let (r1, a1) = env.start_example_env(
        &["--steps", "12", "--wait-for-clients", "1"],
        &[("RANK", "1"), ("LOCAL_RANK", "1"), ("WORLD_SIZE", "2")],
    );
    let (r0, a0) = env.start_example_env(
        &["--steps", "10", "--wait-for-clients", "1"],
        &[("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "2")],
    );
    let out_json = env.dir.path().join("s.json");
    // Given in the other order: the ranks come from the processes.
    let out = env.attach(&[&a1, &a0, "--once", "--summary", out_json.to_str().unwrap()]).wait_with_output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("as rank 1") && stderr.contains("as rank 0"), "{stderr}");
    let s = common::read_summary(&out_json);
    assert_eq!(s["steps"], 22, "both ranks' steps count for the run");
    let ranks: Vec<(u64, u64)> = s["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["rank"].as_u64().unwrap(), r["steps"].as_u64().unwrap()))
        .collect();
    assert_eq!(ranks, vec![(0, 10), (1, 12)]);
    // Both programs number their threads from 1: each rank's loader threads are still its own.
    let loaders = s["loader_threads"].as_array().unwrap();
    assert_eq!(loaders.len(), 4, "two workers per rank: {loaders:?}");
    assert!(stdout.contains("ranks: 2 of 2 reported") && stdout.contains("  rank 1 · 12 steps · "), "{stdout}");
    for c in [r0, r1] {
        assert!(c.wait_with_output().unwrap().status.success());
    }
}
