#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Filesystem detection on this machine.

use probes::fsinfo::{detect, FsKind};
use std::path::Path;

#[test]
fn dev_shm_is_memory() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("no /dev/shm here");
        return;
    }
    let info = detect(shm);
    assert_eq!(info.kind, FsKind::Memory, "{info:?}");
    assert_eq!(info.fs_type, "tmpfs");
    assert_eq!(info.mount_point.as_deref(), Some("/dev/shm"));
    assert_eq!(info.magic, Some(0x0102_1994));
}

#[test]
fn symlink_into_dev_shm_is_followed() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let link = dir.path().join("data");
    std::os::unix::fs::symlink(shm, &link).expect("symlink");
    assert_eq!(detect(&link).kind, FsKind::Memory);
}

#[test]
fn repo_dir_is_a_known_filesystem() {
    let info = detect(Path::new(env!("CARGO_MANIFEST_DIR")));
    assert_ne!(info.kind, FsKind::Unknown, "{info:?}");
    assert!(info.magic.is_some());
    assert!(info.mount_point.is_some());
}

#[test]
fn missing_path_does_not_panic() {
    let info = detect(Path::new("/no/such/path/for/pipeprof"));
    assert!(!info.fs_type.is_empty());
}
