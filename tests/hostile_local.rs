#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Hostile local conditions: a neighbour on the same machine, hostile names, a closed stdout, a
//! cache changed under the run, an output path that cannot be written.

mod common;
use common::{output_within, text};

use pipeprof_trainer::cache::{build, BuildOptions, Packed};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pipeprof"))
}

/// A small data set and the tiny model in a fresh folder: (folder, data, model).
fn setup(classes: usize) -> (tempfile::TempDir, PathBuf, String) {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("imgs");
    common::demo(&data, classes, 8, 7);
    let model = common::write_tiny_model(d.path());
    (d, data, model)
}

/// A write end whose reader is gone: every write to it fails with EPIPE, as `| head -0` does
/// once `head` has exited. Deterministic: the reader is closed before the child starts.
fn closed_pipe() -> Stdio {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    drop(ours);
    Stdio::from(std::os::fd::OwnedFd::from(theirs))
}

fn profile_args<'a>(data: &'a Path, model: &'a str) -> Vec<&'a str> {
    let data = data.to_str().unwrap();
    vec!["profile", "--model", model, "--data", data, "--steps", "3", "--no-tui", "--no-gpu"]
}

/// Entries of `dir` whose name starts with `prefix`.
fn named(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect()
}

// ---- H1: temporary files in a shared folder ----

#[test]
fn run_check_advice_never_writes_its_summary_through_a_name_a_neighbour_planted() {
    let d = tempfile::tempdir().unwrap();
    let victim = d.path().join("victim");
    std::fs::write(&victim, "the victim's own file").unwrap();
    // The program waits until the links are planted (for this pipeprof's pid, known once it
    // started), then ends well.
    let child = bin()
        .env("TMPDIR", d.path())
        .env("XDG_RUNTIME_DIR", d.path())
        .current_dir(d.path())
        .args(["run", "--once", "--no-gpu", "--check-advice", "--"])
        .args(["sh", "-c", "while [ ! -e go ]; do sleep 0.01; done"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // The names pipeprof used before: the main run's summary, the re-runs' folder.
    let planted = d.path().join(format!("pipeprof-run-summary-{pid}.json"));
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    let theirs = d.path().join("neighbours");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::symlink(&theirs, d.path().join(format!("pipeprof-check-run-{pid}"))).unwrap();
    std::fs::write(d.path().join("go"), "").unwrap();
    let out = output_within(child, LIMIT, "run --check-advice");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "the victim's own file", "written through the link");
    assert_eq!(std::fs::read_dir(&theirs).unwrap().count(), 0, "nothing written in the planted folder");
    // Its own private folder is gone with the run.
    let left: Vec<PathBuf> = named(d.path(), "pipeprof-run-").into_iter().filter(|p| *p != planted).collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn profile_check_advice_works_in_a_private_folder_of_a_random_name() {
    use std::io::BufRead;
    let (d, data, model) = setup(3);
    let tmp = d.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let data = data.to_str().unwrap();
    let args = ["profile", "--model", &model, "--data", data, "--steps", "8", "--no-tui", "--no-gpu"];
    let args = [&args[..], &["--workers", "1", "--slow", "decode=+15ms", "--check-advice"]].concat();
    let mut child = bin().env("TMPDIR", &tmp).args(&args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    // A planted folder at the name pipeprof used before (`pipeprof-check-PID`), open to all.
    let planted = tmp.join(format!("pipeprof-check-{pid}"));
    std::fs::create_dir(&planted).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let (mut seen, mut line) = (String::new(), String::new());
    while !seen.contains("check-advice: run 1/") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "no follow-up run started:\n{seen}");
        seen.push_str(&line);
    }
    // While the follow-ups run: one folder of theirs, not the planted one, 0700, ours.
    let folders: Vec<PathBuf> = named(&tmp, "pipeprof-check-").into_iter().filter(|p| *p != planted).collect();
    assert_eq!(folders.len(), 1, "{folders:?}");
    let m = std::fs::symlink_metadata(&folders[0]).unwrap();
    assert!(m.is_dir() && m.mode() & 0o777 == 0o700, "{:o}", m.mode());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    assert!(child.wait().unwrap().success(), "{seen}{rest}");
    assert_eq!(std::fs::read_dir(&planted).unwrap().count(), 0, "nothing written in the planted folder");
    assert!(!folders[0].exists(), "its folder is removed when the follow-ups end");
}

#[test]
fn a_cache_is_never_written_through_a_link_planted_at_its_temporary_name() {
    let (d, data, _) = setup(2);
    let out = d.path().join("x.ppk");
    let victim = d.path().join("victim");
    std::fs::write(&victim, "keep me").unwrap();
    // This process builds it: the pid in the old name `.x.ppk.tmp-PID` is ours.
    std::os::unix::fs::symlink(&victim, d.path().join(format!(".x.ppk.tmp-{}", std::process::id()))).unwrap();
    let opts = BuildOptions {
        data,
        out: out.clone(),
        size: pipeprof_trainer::cache::Size::Fixed { height: 32, width: 32 },
        channels: 3,
        rules: pipeprof_trainer::data::scan::Rules::Pipeprof,
        exact_decode: false,
        model: "tiny.toml".into(),
        workers: 2,
        progress: false,
        fail_after: None,
        abort_after: None,
        panic_on: None,
    };
    build(&opts).unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert!(!std::fs::symlink_metadata(&out).unwrap().file_type().is_symlink(), "the cache is a file of its own");
    assert!(Packed::open(&out).is_ok());
}

// ---- M4: a closed stdout ----

#[test]
fn profile_and_cache_survive_a_closed_stdout_with_their_files_written() {
    let (d, data, model) = setup(2);
    let s = d.path().join("s.json");
    let mut args = profile_args(&data, &model);
    args.extend(["--summary", s.to_str().unwrap()]);
    let child = bin().args(&args).stdout(closed_pipe()).stderr(Stdio::piped()).spawn().unwrap();
    let out = output_within(child, LIMIT, "profile | head -0");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&s).unwrap()).unwrap();
    assert_eq!(summary["steps"], 3);

    let ppk = d.path().join("x.ppk");
    let child = bin()
        .args(["cache", "--model", &model, "--data", data.to_str().unwrap(), "--out", ppk.to_str().unwrap()])
        .stdout(closed_pipe())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = output_within(child, LIMIT, "cache | head -0");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(Packed::open(&ppk).is_ok());
}

// ---- M5: names printed raw ----

const HOSTILE_CLASS: &str = "cls\x1b]0;PWNED\x07\x1b[31mRED";

fn assert_clean(what: &str, out: &std::process::Output) {
    for (stream, b) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        let t = text(b);
        assert!(!t.contains('\x1b') && !t.contains('\x07') && !t.contains('\r'), "{what} {stream}: {t:?}");
        assert!(!t.lines().any(|l| l.trim_start().starts_with("FAKE LINE")), "{what} {stream}: {t}");
    }
}

#[test]
fn class_folder_and_file_names_are_printed_cleaned_by_profile_and_cache() {
    let (d, data, model) = setup(2);
    let first = std::fs::read_dir(&data).unwrap().flatten().map(|e| e.path()).filter(|p| p.is_dir()).min().unwrap();
    std::fs::rename(&first, data.join(HOSTILE_CLASS)).unwrap();
    // A file that is not an image: skipped, and named.
    std::fs::write(data.join(HOSTILE_CLASS).join("x\nFAKE LINE: all good.png"), b"not a png").unwrap();
    let out = bin().args(profile_args(&data, &model)).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).lines().next().unwrap().contains("cls?]0;PWNED??[31mRED"), "{}", text(&out.stdout));
    assert_clean("profile", &out);

    let ppk = d.path().join("x.ppk");
    let (i, o) = (data.to_str().unwrap(), ppk.to_str().unwrap());
    let out = bin().args(["cache", "--model", &model, "--data", i, "--out", o]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("x?FAKE LINE: all good.png"), "{}", text(&out.stderr));
    assert_clean("cache", &out);

    // The class names again, read from the cache this time.
    let out = bin().args(profile_args(&ppk, &model)).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).lines().next().unwrap().contains("cls?]0;PWNED??[31mRED"), "{}", text(&out.stdout));
    assert_clean("profile --data x.ppk", &out);
}

// ---- M8: an output path that cannot be written, refused at the start ----

#[test]
fn an_output_file_in_a_folder_that_does_not_exist_is_refused_before_anything_starts() {
    let (d, data, model) = setup(2);
    let data = data.to_str().unwrap();
    let ran = d.path().join("ran");
    let script = format!("touch {}; exit 7", ran.display());
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("--summary", vec!["run", "--once", "--no-gpu", "--summary", "/nonexistent/s.json", "--", "sh", "-c", &script]),
        ("--trace", vec!["run", "--once", "--no-gpu", "--trace", "/nonexistent/t.json", "--", "sh", "-c", &script]),
        (
            "--summary",
            vec!["profile", "--model", &model, "--data", data, "--steps", "1", "--summary", "/nonexistent/s.json"],
        ),
        (
            "--trace",
            vec!["profile", "--model", &model, "--data", data, "--steps", "1", "--trace", "/nonexistent/t.json"],
        ),
        ("--summary", vec!["attach", "--once", "--summary", "/nonexistent/s.json", "127.0.0.1:9"]),
        ("--summary", vec!["run", "--once", "--no-gpu", "--summary", "/", "--", "sh", "-c", &script]),
    ];
    for (flag, args) in cases {
        let out = bin().env("XDG_RUNTIME_DIR", d.path()).env("HOME", d.path()).args(&args).output().unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag) && (err.contains("/nonexistent") || err.contains("is a folder")), "{args:?}: {err}");
        assert!(!ran.exists(), "{args:?}: the program was started");
        assert!(!err.contains("Model:") && text(&out.stdout).is_empty(), "{args:?}: the run started");
    }
}

// ---- Low: the run's socket folder ----

#[test]
fn run_goes_on_when_a_neighbour_took_its_socket_folder_or_tmpdir_is_too_long_for_a_socket() {
    let d = tempfile::tempdir().unwrap();
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    // Made first by a neighbour (here: a folder open to all), and TMPDIR too long for a socket.
    let taken = d.path().join("taken");
    std::fs::create_dir_all(taken.join(format!("pipeprof-{uid}"))).unwrap();
    std::fs::set_permissions(taken.join(format!("pipeprof-{uid}")), std::fs::Permissions::from_mode(0o777)).unwrap();
    let long = d.path().join("y".repeat(100));
    std::fs::create_dir(&long).unwrap();
    for tmp in [&taken, &long] {
        let out = bin()
            .env_remove("XDG_RUNTIME_DIR")
            .env("TMPDIR", tmp)
            .args(["run", "--once", "--no-gpu", "--", "sh", "-c", "exit 3"])
            .output()
            .unwrap();
        // Before: refused ("not a private folder"), or unable to listen (path too long): exit 1.
        assert_eq!(out.status.code(), Some(3), "{}: {}", tmp.display(), text(&out.stderr));
    }
}

// ---- Issue 52 H1: a neighbour makes a path the program's environment names ----

/// The uid and gid a second user of the machine has in these tests (no account needed).
const NEIGHBOUR: &str = "4242";

/// `cmd` run as a second user of the machine: root plays one with `setpriv`. These tests need
/// root and `setpriv` (util-linux): without them they fail, never skip.
fn as_neighbour(cmd: &[&std::ffi::OsStr]) -> std::process::Output {
    // SAFETY: geteuid cannot fail.
    assert_eq!(unsafe { libc::geteuid() }, 0, "run as root: a second uid (setpriv) plays the neighbour");
    Command::new("setpriv")
        .args(["--reuid", NEIGHBOUR, "--regid", NEIGHBOUR, "--clear-groups", "--"])
        .args(cmd)
        .output()
        .expect("setpriv (util-linux) plays the neighbour: install it")
}

/// A shared temp folder as `/tmp` is (mode 1777), in `/tmp`, where the neighbour can reach it.
fn shared_tmp() -> tempfile::TempDir {
    let d = tempfile::Builder::new().prefix("pp-shared-").tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    d
}

#[test]
fn no_path_in_the_run_programs_environment_can_be_made_by_a_neighbour_after_the_run() {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let shared = shared_tmp();
    // The neighbour makes `pipeprof-<uid>` first; `pipeprof run` (no XDG_RUNTIME_DIR: ssh, cron,
    // a Slurm job) falls back to another folder.
    let squat = shared.path().join(format!("pipeprof-{uid}"));
    let made = as_neighbour(&["mkdir".as_ref(), "-m".as_ref(), "0777".as_ref(), squat.as_os_str()]);
    assert!(made.status.success(), "the neighbour's folder: {}", text(&made.stderr));
    let d = tempfile::tempdir().unwrap();
    let env = d.path().join("env");
    let out = bin()
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("PYTHONPATH")
        .env("TMPDIR", shared.path())
        .args(["run", "--once", "--no-gpu", "--", "sh", "-c"])
        .arg(r#"printf '%s\n%s\n' "$PYTHONPATH" "$PIPEPROF_PARENT" > "$0""#)
        .arg(&env)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let named = std::fs::read_to_string(&env).unwrap();
    let paths: Vec<PathBuf> = named.lines().flat_map(|l| std::env::split_paths(l).collect::<Vec<_>>()).collect();
    assert_eq!(paths.len(), 2, "the hook's folder and the socket: {named}");
    for p in &paths {
        assert!(!p.starts_with(&squat), "{} is in the neighbour's folder", p.display());
        assert!(std::fs::symlink_metadata(p).is_err(), "{} outlived the run", p.display());
        // A process the program left behind starts Python with this environment: before, the
        // neighbour could make the hook's folder again (the fallback folder went with the run),
        // with a sitecustomize.py of theirs in it, run as us.
        let tried = as_neighbour(&["mkdir".as_ref(), "-p".as_ref(), p.as_os_str()]);
        if tried.status.success() {
            // What the neighbour made, taken away again (the folders of theirs on its path).
            let theirs = p.ancestors().filter(|a| std::fs::metadata(a).is_ok_and(|m| m.uid().to_string() == NEIGHBOUR));
            if let Some(top) = theirs.last() {
                let _ = std::fs::remove_dir_all(top);
            }
        }
        assert!(!tried.status.success(), "the neighbour made {}", p.display());
        assert!(std::fs::symlink_metadata(p).is_err(), "{}", p.display());
    }
}

// ---- M7: a cache changed under the run ----

#[test]
fn a_cache_truncated_or_rewritten_under_the_run_skips_images_with_why_never_sigbus() {
    let (d, data, _) = setup(2);
    let out = d.path().join("x.ppk");
    let opts = BuildOptions {
        data,
        out: out.clone(),
        size: pipeprof_trainer::cache::Size::Fixed { height: 32, width: 32 },
        channels: 3,
        rules: pipeprof_trainer::data::scan::Rules::Pipeprof,
        exact_decode: false,
        model: "tiny.toml".into(),
        workers: 2,
        progress: false,
        fail_after: None,
        abort_after: None,
        panic_on: None,
    };
    build(&opts).unwrap();
    let p = Packed::open(&out).unwrap();
    let (first, last) = (p.pixels(0).unwrap(), p.len() - 1);
    // `cp other.ppk x.ppk` rewrites the same file in place: here, image 0's bytes change.
    let f = std::fs::OpenOptions::new().write(true).open(&out).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &vec![!first[0]; first.len()], p.header().pixels_off).unwrap();
    let why = p.pixels(0).unwrap_err();
    assert!(why.contains("changed on disk") && why.contains("pipeprof cache"), "{why}");
    // `truncate`: before, reading a page past the new end killed pipeprof with SIGBUS.
    f.set_len(p.header().pixels_off + 1).unwrap();
    let why = p.pixels(last).unwrap_err();
    assert!(why.contains("changed on disk") && why.contains("shorter"), "{why}");
}
