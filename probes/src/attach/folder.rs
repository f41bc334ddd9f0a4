//! The one private folder of this user's runs: where a program serving its spans puts its
//! socket (`pipeprof.init`, `%%pipeprof`, `pipeprof.profile()`, a Rust program's
//! [`init`](super::init)), where `pipeprof run` puts its socket and its start-up hook's folder,
//! and where `pipeprof attach` looks for runs. One rule for all of them (issue 52 L2).
//!
//! Every path a run hands the program it starts (the socket in `PIPEPROF_PARENT`, the hook's
//! folder first on `PYTHONPATH`) lies inside this folder, and **this folder is never removed**.
//! A run removes its own names when it ends, but a program can leave processes behind that
//! inherited its environment (a `nohup` job, a detached helper, a shell): a Python started by
//! them later imports whatever `sitecustomize.py` is found at that `PYTHONPATH`. Since the
//! folder stays, is ours and open to nobody else, no other user can ever make a name inside it
//! (issue 52 H1: before, the fallback was a random folder removed with the run, whose known
//! name a neighbour could make again, with a hook of theirs in it). The installed `_bootstrap`
//! folder would also do for the hook, but not for the socket, and not for a `pipeprof` built
//! from source: one rule covers both.
//!
//! The candidates, in order, the first that passes [`private`] and leaves room for a socket's
//! name (`sun_path`):
//! 1. `$XDG_RUNTIME_DIR/pipeprof`, when `XDG_RUNTIME_DIR` is a folder;
//! 2. `$TMPDIR/pipeprof-<uid>`;
//! 3. the first `$TMPDIR/pipeprof-<uid>-XXXXXXXX` that is ours, else a new one of a random name
//!    (mkdtemp: exclusive, 0700; nobody could make it first), kept as 2 is: a neighbour who made
//!    `pipeprof-<uid>` first costs one folder of ours, not one per run;
//! 4. 2 and 3 in `/tmp`, when `$TMPDIR` is unusable (a path too long for a socket's address).

use super::AttachError;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Longest path a Unix socket's address holds (`sun_path`, less its NUL).
pub const MAX_SOCKET_PATH: usize = 107;
/// Longest name made in the folder (`run-PID.sock`, `run-PID-boot`, `PID.sock`).
pub const LONGEST_NAME: usize = "run-4294967295.sock".len();

/// The private folder of `uid`'s runs, by the rule of this module: `xdg` is
/// `$XDG_RUNTIME_DIR`, `tmp` the temp folder, `fallback` the last resort (`/tmp`).
pub fn private_dir_in(xdg: Option<&Path>, tmp: &Path, fallback: &Path, uid: u32) -> Result<PathBuf, AttachError> {
    let mut last = None;
    if let Some(x) = xdg.filter(|d| d.is_dir()) {
        match usable(private(&x.join("pipeprof"), uid)) {
            Ok(d) => return Ok(d),
            Err(e) => last = Some(e),
        }
    }
    for base in [tmp, fallback] {
        // A name of the longest kind made here must fit: checked before anything is made.
        let longest = base.join(format!("pipeprof-{uid}-XXXXXXXX"));
        if longest.as_os_str().len() + 1 + LONGEST_NAME > MAX_SOCKET_PATH {
            last = Some(AttachError::TooLong(base.to_path_buf()));
            continue;
        }
        match usable(in_temp(base, uid)) {
            Ok(d) => return Ok(d),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| AttachError::UnsafeDir(fallback.to_path_buf())))
}

/// `dir` if a socket's path in it fits in a socket's address.
fn usable(dir: Result<PathBuf, AttachError>) -> Result<PathBuf, AttachError> {
    let dir = dir?;
    if dir.as_os_str().len() + 1 + LONGEST_NAME > MAX_SOCKET_PATH {
        return Err(AttachError::TooLong(dir));
    }
    Ok(dir)
}

/// Candidates 2 and 3 in the temp folder `base`.
fn in_temp(base: &Path, uid: u32) -> Result<PathBuf, AttachError> {
    let named = private(&base.join(format!("pipeprof-{uid}")), uid);
    if named.is_ok() {
        return named;
    }
    let prefix = format!("pipeprof-{uid}-");
    let mut found: Vec<PathBuf> = std::fs::read_dir(base)
        .map_err(super::io(format!("read {}", base.display())))?
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix)))
        .map(|e| e.path())
        .collect();
    found.sort();
    // Checked without creating: a name someone else made (a folder or a link) is passed over.
    if let Some(d) = found.iter().find_map(|p| check(p, uid).ok()) {
        return Ok(d);
    }
    let made = tempfile::Builder::new()
        .prefix(&prefix)
        .rand_bytes(8)
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(base)
        .map_err(super::io(format!("create a private folder in {}", base.display())))?
        .keep();
    check(&made, uid)
}

/// `dir`, made mode 0700 if missing, when it is private: see [`check`].
pub fn private(dir: &Path, uid: u32) -> Result<PathBuf, AttachError> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(super::io(format!("create {}", dir.display()))(e)),
    }
    check(dir, uid)
}

/// `dir` with its parent's real path, when it is private to `uid`: checked with `lstat`,
/// which follows no link (a link, another user's and re-pointed after any check that follows
/// it, is refused), a folder of `uid`'s with no permission for others; and every folder above
/// it owned by root or `uid` and open to nobody else for writing unless sticky, so nobody else
/// can rename it away or swap a folder on its path (`TMPDIR` through a neighbour's link or in
/// a neighbour's folder is refused).
pub fn check(dir: &Path, uid: u32) -> Result<PathBuf, AttachError> {
    let unsafe_dir = || AttachError::UnsafeDir(dir.to_path_buf());
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else { return Err(unsafe_dir()) };
    let parent = std::fs::canonicalize(if parent.as_os_str().is_empty() { Path::new(".") } else { parent })
        .map_err(super::io(format!("resolve {}", parent.display())))?;
    let dir = parent.join(name);
    let m = std::fs::symlink_metadata(&dir).map_err(super::io(format!("stat {}", dir.display())))?;
    if !m.file_type().is_dir() || m.uid() != uid || m.mode() & 0o077 != 0 {
        return Err(AttachError::UnsafeDir(dir));
    }
    for above in parent.ancestors() {
        let m = std::fs::symlink_metadata(above).map_err(super::io(format!("stat {}", above.display())))?;
        let sticky = m.mode() & 0o1000 != 0;
        let owner_ok = m.uid() == 0 || m.uid() == uid || m.uid() == unmapped_uid();
        if !m.file_type().is_dir() || !owner_ok || (m.mode() & 0o022 != 0 && !sticky) {
            return Err(AttachError::UnsafeParent { dir, above: above.to_path_buf() });
        }
    }
    Ok(dir)
}

/// The owner shown for a file whose owner this user namespace does not map (a container's view
/// of the host's `/tmp`: root's, on the host): taken as root's, else such a container could use
/// no temp folder at all.
fn unmapped_uid() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/overflowuid").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(65534)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid() -> u32 {
        // SAFETY: getuid cannot fail.
        unsafe { libc::getuid() }
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).expect("stat").mode() & 0o7777
    }

    #[test]
    fn a_folder_that_is_a_link_or_not_private_is_refused() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let (uid, dir) = (uid(), tmp.path().join("mine"));
        // Missing: made, private.
        let made = private(&dir, uid).expect("made");
        assert_eq!(mode(&made), 0o700);
        assert_eq!(private(&dir, uid).expect("again"), made);
        // A link to a private folder of ours passed before (the check followed it), and could
        // be re-pointed at another user's folder between the check and the socket's creation.
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&made, &link).expect("link");
        assert!(matches!(private(&link, uid), Err(AttachError::UnsafeDir(_))));
        // Open to others, or someone else's.
        std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert!(matches!(private(&dir, uid), Err(AttachError::UnsafeDir(_))));
        std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        assert!(matches!(private(&dir, uid + 1), Err(AttachError::UnsafeDir(_))));
        // In a folder others may write to and that is not sticky: they could rename it away.
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).expect("open");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert!(matches!(private(&open.join("x"), uid), Err(AttachError::UnsafeParent { .. })));
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        assert!(private(&open.join("x"), uid).is_ok(), "sticky, as /tmp is");
    }

    #[test]
    fn the_one_rule_xdg_then_tmp_then_a_kept_private_folder_then_slash_tmp() {
        let uid = uid();
        let (tmp, fallback) = (tempfile::tempdir().expect("temp dir"), tempfile::tempdir().expect("temp dir"));
        // XDG_RUNTIME_DIR first, when it exists.
        let xdg = tempfile::tempdir().expect("temp dir");
        let d = private_dir_in(Some(xdg.path()), tmp.path(), fallback.path(), uid).expect("xdg");
        assert_eq!(d, xdg.path().join("pipeprof"));
        // Else the temp folder's pipeprof-<uid>.
        let d = private_dir_in(None, tmp.path(), fallback.path(), uid).expect("tmp");
        assert_eq!(d, tmp.path().join(format!("pipeprof-{uid}")));
        // Taken first by someone else (here: open to all): a private folder of a random name,
        // kept, and found again by the next run.
        let taken = tempfile::tempdir().expect("temp dir");
        let theirs = taken.path().join(format!("pipeprof-{uid}"));
        std::fs::create_dir(&theirs).expect("planted");
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        // A planted name of the fallback's pattern, theirs: passed over.
        let decoy = taken.path().join(format!("pipeprof-{uid}-00000000"));
        std::fs::create_dir(&decoy).expect("decoy");
        std::fs::set_permissions(&decoy, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let d = private_dir_in(None, taken.path(), fallback.path(), uid).expect("fallback");
        assert!(d.starts_with(taken.path()) && d != theirs && d != decoy, "{}", d.display());
        assert_eq!(mode(&d), 0o700);
        assert_eq!(private_dir_in(None, taken.path(), fallback.path(), uid).expect("again"), d);
        // A TMPDIR so long that a socket's address would not hold the path: the fallback.
        let long = tmp.path().join("x".repeat(100));
        std::fs::create_dir(&long).expect("long");
        let d = private_dir_in(None, &long, fallback.path(), uid).expect("fallback");
        assert_eq!(d, fallback.path().join(format!("pipeprof-{uid}")));
        assert!(d.as_os_str().len() + 1 + LONGEST_NAME <= MAX_SOCKET_PATH, "{}", d.display());
    }
}
