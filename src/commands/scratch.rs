//! A re-run's scratch: the private folder every `--check-advice` re-run writes into (removed
//! on every way out, and swept when a killed run left one), and the copy of the data set made
//! there on local disk. Shared by `profile --check-advice` and `run --check-advice`.

use super::rerun::{stop_check, NoRate, SCRATCH};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Headroom kept free when copying the data set: the copy may not fill the disk (it is made
/// only where the free space is over its size × this).
pub const COPY_HEADROOM: f64 = 1.2;

/// Whether a copy of `needed` bytes fits in `free` bytes, with [`COPY_HEADROOM`]; the message
/// says how much either way. Pure.
fn copy_fits(needed: u64, free: Option<u64>, dir: &Path) -> Result<String, String> {
    let mb = |b: u64| format!("{:.1} MB", b as f64 / 1e6);
    room_for("copy the data set", needed, free, dir)?;
    match free {
        Some(f) => Ok(format!("{} copied to {} ({} free there)", mb(needed), dir.display(), mb(f))),
        None => Ok(format!("{} copied to {}", mb(needed), dir.display())),
    }
}

/// Whether `needed` bytes fit in `free` bytes with [`COPY_HEADROOM`] (the copy's and the
/// pack's one margin); else why: "not enough space to VERB: … needed, … free in DIR". Pure.
pub fn room_for(verb: &str, needed: u64, free: Option<u64>, dir: &Path) -> Result<(), String> {
    let mb = |b: u64| format!("{:.1} MB", b as f64 / 1e6);
    match free {
        Some(f) if (needed as f64) * COPY_HEADROOM > f as f64 => {
            Err(format!("not enough space to {verb}: {} needed, {} free in {}", mb(needed), mb(f), dir.display()))
        }
        _ => Ok(()),
    }
}

/// Bytes free to this user under `dir` (`statvfs`), or `None` where it cannot be told.
pub fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| (st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// What [`walk_files`] calls per folder and file: (its path, its path below the top, its size).
type Each<'a> = dyn FnMut(&Path, &Path, Option<u64>) -> Result<(), String> + 'a;

/// Calls `each` with every folder and regular file under `dir` (its path, its path below the
/// top folder `rel`, and for a file its size: a folder's is `None`, so that an empty class
/// folder, a class to `ImageFolder`, is copied too), following symbolic links to files and
/// folders as torchvision's
/// `ImageFolder` does (`os.walk(followlinks=True)`: a class folder that is a link, a `train/`
/// of links); a link that leads nowhere is left out (there is nothing to read), a link back
/// into its own ancestors (a loop) refused ([`NoRate::Skipped`]). Stops at an interrupt
/// ([`stop_check`]). `above`: the folders above this one, by device and inode.
fn walk_files(dir: &Path, rel: &Path, above: &mut Vec<(u64, u64)>, each: &mut Each<'_>) -> Result<(), NoRate> {
    use std::os::unix::fs::MetadataExt;
    let io = |p: &Path, e: std::io::Error| format!("cannot read {} ({e})", p.display());
    let m = std::fs::metadata(dir).map_err(|e| io(dir, e))?;
    let key = (m.dev(), m.ino());
    if above.contains(&key) {
        return Err(NoRate::Skipped(format!(
            "{} is a link back into a folder above it (a loop): the data set has no end to copy",
            dir.display()
        )));
    }
    above.push(key);
    let mut entries: Vec<_> =
        std::fs::read_dir(dir).map_err(|e| io(dir, e))?.collect::<Result<_, _>>().map_err(|e| io(dir, e))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        stop_check()?;
        let path = e.path();
        let m = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(&path, e).into()),
        };
        let below = rel.join(e.file_name());
        if m.is_dir() {
            each(&path, &below, None)?;
            walk_files(&path, &below, above, each)?;
        } else if m.is_file() {
            each(&path, &below, Some(m.len()))?;
        }
    }
    above.pop();
    Ok(())
}

/// The total size of the files [`walk_files`] finds under `dir`.
fn tree_bytes(dir: &Path) -> Result<u64, NoRate> {
    let mut total = 0u64;
    walk_files(dir, Path::new(""), &mut Vec::new(), &mut |_, _, len| {
        total = total.saturating_add(len.unwrap_or(0));
        Ok(())
    })?;
    Ok(total)
}

/// Copies what [`walk_files`] finds under `from` to `to`: the files behind links as files.
fn copy_tree(from: &Path, to: &Path) -> Result<(), NoRate> {
    std::fs::create_dir_all(to).map_err(|e| format!("cannot create {} ({e})", to.display()))?;
    walk_files(from, Path::new(""), &mut Vec::new(), &mut |path, rel, len| {
        let dst = to.join(rel);
        if len.is_none() {
            return std::fs::create_dir_all(&dst).map_err(|e| format!("cannot create {} ({e})", dst.display()));
        }
        std::fs::copy(path, &dst).map(|_| ()).map_err(|e| format!("copying {} failed: {e}", path.display()))
    })
}

/// Copies the data folder into `tmp` when it fits: (the copy, a note with the sizes and time).
/// A copy that does not fit is [`NoRate::Skipped`].
pub fn copy_local(data: &Path, tmp: &Path) -> Result<(PathBuf, String), NoRate> {
    if !data.is_dir() {
        return Err(NoRate::Failed("the data is not a folder".into()));
    }
    let needed = tree_bytes(data)?;
    let note = copy_fits(needed, free_bytes(tmp), tmp).map_err(NoRate::Skipped)?;
    let out = tmp.join("data-copy");
    let t0 = Instant::now();
    copy_tree(data, &out)?;
    Ok((out, format!("{note} in {:.1} s, removed afterwards", t0.elapsed().as_secs_f64())))
}

/// What every re-run needs, or `None` with why printed: this program's path and a private
/// scratch folder ([`TempDir::private`]) for the runs' summaries, a cache, a copy of the data
/// set; removed on every way out: return, panic (drop), an immediate exit (abort hook).
pub fn rerun_setup(prefix: &str) -> Option<(PathBuf, PathBuf, TempDir)> {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            pipeprof_trainer::progress::out(&format!(
                "check-advice: cannot find this program to re-run it ({e}): skipped\n"
            ));
            return None;
        }
    };
    for line in sweep(&std::env::temp_dir()) {
        pipeprof_trainer::progress::say(&format!("check-advice: {line}"));
    }
    match TempDir::private(prefix) {
        Ok(guard) => Some((exe, guard.path().to_path_buf(), guard)),
        Err(e) => {
            pipeprof_trainer::progress::out(&format!("check-advice: {e}: skipped\n"));
            None
        }
    }
}

/// A scratch folder pipeprof made: removed when dropped, and by an immediate exit on a second
/// interrupt, which drops nothing.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new folder `PREFIX-PID-XXXXXX` in the temp folder (PID: this process's, so that
    /// the next run can tell one left by a killed run, [`sweep`]): a random name, made exclusively
    /// (mkdtemp: a name another user made first, or a link planted there, is never used),
    /// mode 0700, and checked once made (a folder, not a link, ours, closed to others). So
    /// nothing pipeprof writes in it can be redirected, read or swapped by another user.
    pub fn private(prefix: &str) -> Result<TempDir, String> {
        let within = std::env::temp_dir();
        let made = tempfile::Builder::new()
            .prefix(&format!("{prefix}-{}-", std::process::id()))
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir_in(&within)
            .map_err(|e| format!("cannot create a private folder in {} ({e})", within.display()))?;
        let guard = TempDir::new(&made.keep());
        check_private(guard.path())?;
        Ok(guard)
    }

    /// Removes `dir` (which the caller made) when dropped or on an immediate exit.
    fn new(dir: &Path) -> TempDir {
        SCRATCH.lock().unwrap_or_else(|e| e.into_inner()).push(dir.to_path_buf());
        let d = dir.to_path_buf();
        pipeprof_core::signal::on_abort(Box::new(move || {
            let _ = std::fs::remove_dir_all(&d);
        }));
        TempDir(dir.to_path_buf())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

/// `dir` is a folder (not a link), owned by this user, closed to everyone else.
fn check_private(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(dir).map_err(|e| format!("cannot check {} ({e})", dir.display()))?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if !m.file_type().is_dir() || m.uid() != me || m.mode() & 0o077 != 0 {
        return Err(format!("{} is not a private folder (a folder of ours, mode 0700)", dir.display()));
    }
    Ok(())
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        SCRATCH.lock().unwrap_or_else(|e| e.into_inner()).retain(|d| d != &self.0);
    }
}

/// Where the scratch folders of `--check-advice` begin (`pipeprof-check-PID-…`, and
/// `pipeprof-check-run-PID-…` for `run`'s).
const SCRATCH_PREFIX: &str = "pipeprof-check-";

/// The pid in a scratch folder's name (`pipeprof-check-PID-XXXXXX`,
/// `pipeprof-check-run-PID-XXXXXX`), or `None`: not a name [`TempDir::private`] makes. Pure.
fn scratch_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(SCRATCH_PREFIX)?;
    let rest = rest.strip_prefix("run-").unwrap_or(rest);
    let (pid, random) = rest.split_once('-')?;
    let digits = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
    (digits && !random.is_empty() && !random.contains('/')).then(|| pid.parse().ok()).flatten()
}

/// Removes the scratch folders in `within` that a `--check-advice` killed outright (SIGKILL,
/// the OOM killer: it removed nothing) left behind, and only those provably so: a folder (not
/// a link) owned by this user, named as [`TempDir::private`] names them, whose pid is dead
/// and not this process. One of another user's is named, never touched. Returns what it did,
/// a line each.
fn sweep(within: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(within) else { return Vec::new() };
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let mut said = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(scratch_pid) else { continue };
        let path = e.path();
        let Ok(m) = std::fs::symlink_metadata(&path) else { continue };
        if !m.file_type().is_dir() || pid == std::process::id() || alive(pid) {
            continue;
        }
        if m.uid() != me {
            said.push(format!(
                "{} was left by a --check-advice of another user (uid {}) that was killed: not ours, left alone",
                path.display(),
                m.uid()
            ));
        } else if std::fs::remove_dir_all(&path).is_ok() {
            said.push(format!("removed {}, left by a --check-advice (pid {pid}) that was killed", path.display()));
        }
    }
    said
}

/// Whether process `pid` exists (alive, or a zombie not yet reaped; another user's too).
fn alive(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 checks only; no signal is sent.
    let rc = unsafe { libc::kill(p, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_copy_is_made_only_when_it_fits_and_says_how_much() {
        let dir = Path::new("/tmp/x");
        assert!(copy_fits(100, Some(1_000), dir).is_ok_and(|n| n.contains("0.0 MB copied to /tmp/x")));
        let e = copy_fits(2_000_000, Some(2_100_000), dir).unwrap_err();
        assert!(e.contains("2.0 MB needed, 2.1 MB free in /tmp/x"), "{e}");
        assert!(copy_fits(5, None, dir).is_ok());

        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("cat")).unwrap();
        std::fs::write(src.path().join("cat/a.png"), [7u8; 300]).unwrap();
        std::fs::write(src.path().join("b.jpg"), [1u8; 200]).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let (copy, note) = copy_local(src.path(), tmp.path()).unwrap();
        assert_eq!(std::fs::read(copy.join("cat/a.png")).unwrap(), [7u8; 300]);
        assert_eq!(tree_bytes(&copy).unwrap(), 500);
        assert!(note.contains("removed afterwards"), "{note}");
        assert!(copy_local(&src.path().join("b.jpg"), tmp.path()).is_err(), "a packed file is not a folder");
    }

    #[test]
    fn the_copy_follows_links_as_imagefolder_does_and_refuses_a_loop() {
        use std::os::unix::fs::symlink;
        let d = tempfile::tempdir().unwrap();
        let (src, store) = (d.path().join("train"), d.path().join("store"));
        std::fs::create_dir_all(src.join("circle")).unwrap();
        std::fs::create_dir_all(store.join("cross")).unwrap();
        std::fs::write(src.join("circle/a.png"), [1u8; 100]).unwrap();
        std::fs::write(store.join("cross/b.png"), [2u8; 50]).unwrap();
        std::fs::write(store.join("c.png"), [3u8; 20]).unwrap();
        // A class folder that is a link (DVC, git-annex), a file that is a link, one to nowhere.
        symlink(store.join("cross"), src.join("cross")).unwrap();
        symlink(store.join("c.png"), src.join("circle/c.png")).unwrap();
        symlink(d.path().join("gone.png"), src.join("circle/gone.png")).unwrap();
        // A class folder with no image is a class to ImageFolder all the same.
        std::fs::create_dir(src.join("empty")).unwrap();
        assert_eq!(tree_bytes(&src).unwrap(), 170);
        let tmp = tempfile::tempdir().unwrap();
        let (copy, _) = copy_local(&src, tmp.path()).unwrap();
        assert_eq!(std::fs::read(copy.join("cross/b.png")).unwrap(), [2u8; 50]);
        assert_eq!(std::fs::read(copy.join("circle/c.png")).unwrap(), [3u8; 20]);
        assert!(!std::fs::symlink_metadata(copy.join("cross")).unwrap().file_type().is_symlink(), "copied, not linked");
        assert!(!copy.join("circle/gone.png").exists());
        assert!(copy.join("empty").is_dir(), "the empty class is kept");
        // A link back into its own ancestors: ImageFolder's walk has no end; the row is skipped.
        symlink(&src, src.join("circle/again")).unwrap();
        let e = copy_local(&src, tempfile::tempdir().unwrap().path()).unwrap_err();
        assert!(matches!(&e, NoRate::Skipped(why) if why.contains("(a loop)")), "{e}");
    }

    #[test]
    fn a_scratch_folder_names_its_pid_and_one_left_by_a_killed_run_is_removed_if_ours() {
        let t = TempDir::private("pipeprof-check-run").unwrap();
        let name = t.path().file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(scratch_pid(&name), Some(std::process::id()), "{name}");
        for (name, want) in [
            ("pipeprof-check-123-abcdef", Some(123)),
            ("pipeprof-check-run-45-x1y2z3", Some(45)),
            ("pipeprof-check-run-abcdef", None),
            ("pipeprof-check-12", None),
            ("pipeprof-run-12-abc", None),
            ("pipeprof-check--abc", None),
        ] {
            assert_eq!(scratch_pid(name), want, "{name}");
        }
        let within = tempfile::tempdir().unwrap();
        // A pid that cannot be alive (over the kernel's pid_max, 2^22).
        let dead = within.path().join("pipeprof-check-run-99999999-abcdef");
        std::fs::create_dir_all(dead.join("data-copy")).unwrap();
        let live = within.path().join(format!("pipeprof-check-{}-abcdef", std::process::id()));
        std::fs::create_dir(&live).unwrap();
        let other = within.path().join("pipeprof-check-99999998-abcdef");
        std::os::unix::fs::symlink(&live, &other).unwrap();
        let said = sweep(within.path());
        assert!(!dead.exists(), "{said:?}");
        assert!(live.exists() && std::fs::symlink_metadata(&other).is_ok(), "a live run's and a link are left");
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].contains("removed") && said[0].contains("pid 99999999"), "{said:?}");
    }
}
