//! A process's I/O counters (`/proc/<pid>/io`: [`ProcIo`]) and whether the kernel counts its
//! storage bytes here ([`IoAccounting`]): a scratch file written, dropped from the page cache
//! and read back on a local disk, the counters read before and after. Storage figures are
//! shown only where they can be measured.

use crate::clock;
use crate::fsinfo::{self, FsKind};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Whether the kernel accounts storage bytes per process here (see [`probe_io_accounting`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoAccounting {
    /// Reads that reach storage show up in `read_bytes` of `/proc/<pid>/io`.
    pub reads: bool,
    /// Writes show up in `write_bytes`.
    pub writes: bool,
}

impl IoAccounting {
    /// Not checked: trust the counters when they are readable.
    pub const ASSUMED: IoAccounting = IoAccounting { reads: true, writes: true };
}

/// Checks, with a scratch file in `dir`, whether the kernel counts this process's storage
/// reads and writes: write and fsync 256 KiB, drop it from the page cache
/// (`posix_fadvise(DONTNEED)`), read it back, and see whether `/proc/self/io` moved.
///
/// `dir` must be on a block-device filesystem: tmpfs, FUSE and network filesystems never
/// reach a block device, so they would say "no" about a kernel that does count.
pub fn probe_io_accounting(dir: &Path) -> std::io::Result<IoAccounting> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(format!(".pipeprof-io-probe-{}-{}", std::process::id(), clock::now_ns()));
    // Created exclusive and private: a file or link someone else put at this name in a shared
    // temp folder is never opened, written or removed.
    let f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
    let result = probe_with_file(f, &path);
    // Best effort: the file is ours and small; a failure to remove it changes no verdict.
    let _ = std::fs::remove_file(&path);
    result
}

fn probe_with_file(mut f: std::fs::File, path: &Path) -> std::io::Result<IoAccounting> {
    let unreadable = || std::io::Error::other("/proc/self/io is not readable");
    let data = vec![0x5Au8; 256 * 1024];
    let before_write = read_proc_io(std::process::id()).ok_or_else(unreadable)?;
    f.write_all(&data)?;
    f.sync_all()?;
    drop_from_page_cache(&f);
    drop(f);
    let before_read = read_proc_io(std::process::id()).ok_or_else(unreadable)?;
    let mut buf = Vec::with_capacity(data.len());
    std::fs::File::open(path)?.read_to_end(&mut buf)?;
    let after = read_proc_io(std::process::id()).ok_or_else(unreadable)?;
    Ok(IoAccounting {
        reads: after.read_bytes > before_read.read_bytes,
        writes: before_read.write_bytes > before_write.write_bytes,
    })
}

#[cfg(target_os = "linux")]
fn drop_from_page_cache(f: &std::fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open descriptor; the advice only affects cached pages of this file.
    // A failure (unsupported) leaves the pages cached and the probe answers "no reads seen".
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

#[cfg(not(target_os = "linux"))]
fn drop_from_page_cache(_f: &std::fs::File) {}

/// Probes I/O accounting in the first local-disk scratch directory (the temp dir, then
/// `/var/tmp`). Without `/proc/self/io` nothing is measurable; with it but no local scratch
/// directory (temp on tmpfs, `/var/tmp` missing), the counters are trusted unverified.
pub fn io_accounting_here() -> IoAccounting {
    if read_proc_io(std::process::id()).is_none() {
        return IoAccounting { reads: false, writes: false };
    }
    let candidates: [PathBuf; 2] = [std::env::temp_dir(), PathBuf::from("/var/tmp")];
    for dir in &candidates {
        if fsinfo::detect(dir).kind != FsKind::Local {
            continue;
        }
        if let Ok(acc) = probe_io_accounting(dir) {
            return acc;
        }
    }
    IoAccounting::ASSUMED
}

/// Whether storage reads of this process can be measured here ([`io_accounting_here`]).
pub fn storage_reads_measurable() -> bool {
    io_accounting_here().reads
}

/// Cumulative counters of `/proc/<pid>/io`, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcIo {
    /// Returned by read system calls (any source).
    pub rchar: u64,
    /// Written by write system calls.
    pub wchar: u64,
    /// Fetched from storage.
    pub read_bytes: u64,
    /// Sent (or to be sent) to storage.
    pub write_bytes: u64,
}

/// Parses `/proc/<pid>/io`; `None` unless all four byte counters are present.
pub fn parse_proc_io(text: &str) -> Option<ProcIo> {
    let (mut rchar, mut wchar, mut read_bytes, mut write_bytes) = (None, None, None, None);
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim().parse::<u64>().ok();
        match key {
            "rchar" => rchar = value,
            "wchar" => wchar = value,
            "read_bytes" => read_bytes = value,
            "write_bytes" => write_bytes = value,
            _ => {}
        }
    }
    Some(ProcIo { rchar: rchar?, wchar: wchar?, read_bytes: read_bytes?, write_bytes: write_bytes? })
}

pub(super) fn read_proc_io(pid: u32) -> Option<ProcIo> {
    parse_proc_io(&std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_io_needs_all_byte_counters() {
        let text = "rchar: 6976\nwchar: 10\nsyscr: 10\nsyscw: 0\nread_bytes: 4096\nwrite_bytes: 8192\ncancelled_write_bytes: 0\n";
        assert_eq!(parse_proc_io(text), Some(ProcIo { rchar: 6976, wchar: 10, read_bytes: 4096, write_bytes: 8192 }));
        assert_eq!(parse_proc_io("rchar: 1\nwchar: 2\n"), None);
        assert_eq!(parse_proc_io(""), None);
    }
}
