//! Helpers shared by the end-to-end tests: the real binary, a tiny model, small data sets.
// Each test crate uses its own subset.
#![allow(dead_code)]

use pipeprof_trainer::data::demo::{DemoFormat, DemoSpec};
use std::path::Path;
use std::process::{Command, Output};

/// A model small enough for tests: 32×32 input, `convs` conv + pool blocks, a softmax head.
pub fn tiny_model(convs: usize) -> String {
    let mut m = String::from("[input]\nheight = 32\nwidth = 32\n");
    for k in 0..convs {
        let filters = 8 << k;
        m.push_str(&format!(
            "\n[[layers]]\ntype = \"conv2d\"\nfilters = {filters}\nkernel_size = 3\nactivation = \"relu\"\n\n[[layers]]\ntype = \"max_pooling2d\"\n"
        ));
    }
    m.push_str("\n[[layers]]\ntype = \"flatten\"\n\n[[layers]]\ntype = \"dense\"\nunits = \"classes\"\nactivation = \"softmax\"\n");
    m.push_str("\n[train]\nbatch_size = 16\nlearning_rate = 0.003\n\n[data]\nworkers = 2\nseed = 3\n");
    m
}

/// Writes [`tiny_model`] with one conv block to `dir/tiny.toml` and returns its path.
pub fn write_tiny_model(dir: &Path) -> String {
    let p = dir.join("tiny.toml");
    std::fs::write(&p, tiny_model(1)).expect("the temp dir is writable");
    p.display().to_string()
}

/// The built `pipeprof` binary with `args`, to completion.
pub fn pipeprof(args: &[&str]) -> Output {
    pipeprof_env(args, &[])
}

/// [`pipeprof`] with extra environment variables.
pub fn pipeprof_env(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pipeprof"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("the binary runs")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A generated ImageFolder of `classes` × `per_class` mixed JPEG/PNG images.
pub fn demo(dir: &Path, classes: usize, per_class: usize, seed: u64) {
    DemoSpec { classes, per_class, size: None, format: DemoFormat::Mixed, seed }.write(dir).expect("demo data written");
}

/// Waits for `child` to end and collects its output, up to `limit`: a run that hangs (the bug
/// some tests guard against) is killed and fails the test instead of hanging it.
pub fn output_within(child: std::process::Child, limit: std::time::Duration, what: &str) -> Output {
    let pid = child.id() as libc::pid_t;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("the binary's output"),
        Err(_) => {
            // SAFETY: a signal to the child this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("{what}: still running after {} s", limit.as_secs())
        }
    }
}

/// The example Rust training program `pipeprof run` drives (built by `cargo test --workspace`).
pub fn example() -> std::path::PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_pipeprof")).parent().unwrap().join("examples/train_cnn");
    assert!(
        p.exists(),
        "{} missing: run the tests with `cargo test --release --workspace` (it builds examples)",
        p.display()
    );
    p
}

/// A summary file (`--summary`) as JSON, held against docs/schema/summary.schema.json: every
/// summary a test reads is checked by a real validator.
pub fn read_summary(p: &Path) -> serde_json::Value {
    let v = serde_json::from_slice(&std::fs::read(p).expect("summary written")).expect("summary is JSON");
    let errors = summary_schema_errors(&v);
    assert!(errors.is_empty(), "{}: does not hold against the summary's schema: {errors:?}", p.display());
    v
}

/// Whether `pid` is gone (or a zombie: it runs no more).
pub fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// A child killed (and reaped) when the test ends, passed or not.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process group killed when the test ends, passed or not (a failed test leaves nothing).
pub struct GroupKilledOnDrop(pub i32);

impl Drop for GroupKilledOnDrop {
    fn drop(&mut self) {
        // SAFETY: a signal to a process group the test started (harmless when gone).
        unsafe { libc::kill(-self.0, libc::SIGKILL) };
    }
}

/// A JSON Schema of docs/schema/.
fn schema_of(name: &str) -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/schema").join(name);
    serde_json::from_slice(&std::fs::read(&p).expect("the schema file")).expect("the schema is JSON")
}

fn errors_against(schema: &serde_json::Value, doc: &serde_json::Value) -> Vec<String> {
    let v = jsonschema::validator_for(schema).expect("the schema is a valid JSON Schema");
    v.iter_errors(doc).map(|e| format!("{} at {}", e, e.instance_path())).collect()
}

/// What a real validator finds wrong with `--json`'s document `doc` against
/// docs/schema/verdict.schema.json: empty when it holds.
pub fn verdict_schema_errors(doc: &serde_json::Value) -> Vec<String> {
    errors_against(&schema_of("verdict.schema.json"), doc)
}

/// The same for a summary file, against docs/schema/summary.schema.json.
pub fn summary_schema_errors(doc: &serde_json::Value) -> Vec<String> {
    errors_against(&schema_of("summary.schema.json"), doc)
}
