//! Outputs written while the run goes: one `Exporter` per format.

pub mod chrome;
pub mod guard;
pub mod ranks;
pub mod read;
pub mod schema;

use pipeprof_core::aggregate::RunSettings;
use pipeprof_core::diagnose::{Diagnosed, Verdict};
use probes::Event;
use std::path::{Path, PathBuf};

/// Creates (or truncates) a file pipeprof names itself beside the user's (a rank's trace next
/// to `--trace`): a symbolic link at that name is refused, not followed, so a link planted
/// there cannot make pipeprof truncate its target.
pub fn create_beside(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().write(true).create(true).truncate(true).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// Replaces `path` with `text` through a temporary file of an unpredictable name in the same
/// folder, created exclusive, then renamed over it (never a fixed `X.tmp` that a planted link
/// could redirect). A replaced file keeps its permissions; a new one gets what `fs::write`
/// would give it (0666 less the umask), not the temporary's private 0600: a report is made to
/// be shared.
pub fn replace_file(path: &Path, text: &[u8]) -> std::io::Result<PathBuf> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    use std::os::unix::fs::PermissionsExt;
    let mut tmp = tempfile::Builder::new()
        .prefix(".pipeprof-")
        .suffix(".tmp")
        .permissions(std::fs::Permissions::from_mode(0o666))
        .tempfile_in(dir)?;
    std::io::Write::write_all(&mut tmp, text)?;
    // Keep the replaced file's permissions (the temporary one is 0600).
    if let Ok(m) = std::fs::metadata(path) {
        let _ = std::fs::set_permissions(tmp.path(), m.permissions());
    }
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(path.to_path_buf())
}

/// Receives every event in arrival order and writes it somewhere; `finish` closes the output
/// so that it is valid on its own.
pub trait Exporter: Send {
    /// Called once, before any event.
    fn settings(&mut self, _s: &RunSettings) -> std::io::Result<()> {
        Ok(())
    }
    fn event(&mut self, ev: &Event) -> std::io::Result<()>;
    /// The live verdict changed (at monotonic `t_ns`).
    fn verdict(&mut self, _t_ns: u64, _v: &Verdict) -> std::io::Result<()> {
        Ok(())
    }
    /// The final summary and verdict, just before `finish`.
    fn summary(&mut self, _s: &Diagnosed) -> std::io::Result<()> {
        Ok(())
    }
    fn finish(&mut self) -> std::io::Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_made_beside_the_users_never_follow_a_planted_link() {
        let dir = tempfile::tempdir().expect("temp dir");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep me").expect("victim");
        // A rank's trace name, planted as a link: refused, the target untouched.
        let rank = dir.path().join("t.rank0.json");
        std::os::unix::fs::symlink(&victim, &rank).expect("link");
        assert!(create_beside(&rank).is_err());
        // `--repair`'s old temporary name, planted: not used at all any more.
        let trace = dir.path().join("t.json");
        std::fs::write(&trace, "cut").expect("trace");
        std::os::unix::fs::symlink(&victim, dir.path().join("t.repair.tmp")).expect("link");
        replace_file(&trace, b"fixed").expect("replace");
        assert_eq!(std::fs::read_to_string(&trace).expect("trace"), "fixed");
        assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "keep me");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("dir")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp") && e.file_name() != "t.repair.tmp")
            .collect();
        assert!(left.is_empty(), "no temporary file is left");
    }

    #[test]
    fn a_new_file_gets_the_mode_fs_write_gives_and_a_replaced_one_keeps_its_own() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let mode = |p: &Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
        let plain = dir.path().join("plain.html");
        std::fs::write(&plain, "x").expect("plain");
        let new = dir.path().join("report.html");
        replace_file(&new, b"page").expect("new");
        assert_eq!(mode(&new), mode(&plain), "as fs::write under the same umask");
        std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        replace_file(&new, b"page 2").expect("replace");
        assert_eq!(mode(&new), 0o640);
    }
}
