//! Which filesystem holds a path, and whether it is local, network, FUSE or memory.
//!
//! A data folder on a FUSE or network mount (a mounted cloud drive, NFS, SMB) is the most
//! common reason an input pipeline is slow: every image read is a round trip. `statfs` gives
//! the filesystem's magic number; `/proc/self/mountinfo` gives its name (`fuse.rclone`,
//! `nfs4`), mount point and source, which the magic number alone cannot tell apart.

use std::path::{Path, PathBuf};

/// Where a filesystem's bytes live, as far as read latency is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub enum FsKind {
    /// A block device on this machine (ext4, xfs, btrfs, zfs, overlay, squashfs, ...).
    Local,
    /// Another machine or the VM host: NFS, SMB/CIFS, Ceph, Lustre, 9p, virtiofs, ...
    Network,
    /// A userspace filesystem (`fuse.*`): often a cloud drive (rclone, gcsfuse, s3fs, sshfs).
    Fuse,
    /// RAM-backed: tmpfs, ramfs.
    Memory,
    /// Not in the tables.
    Unknown,
}

impl FsKind {
    /// Whether reads may each pay a network or userspace round trip: worth a warning for
    /// a data folder.
    pub const fn is_remote_or_fuse(self) -> bool {
        matches!(self, FsKind::Network | FsKind::Fuse)
    }

    /// A short lowercase label for reports.
    pub const fn label(self) -> &'static str {
        match self {
            FsKind::Local => "local",
            FsKind::Network => "network",
            FsKind::Fuse => "FUSE",
            FsKind::Memory => "memory",
            FsKind::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for FsKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// The filesystem under a path.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct FsInfo {
    /// Filesystem type name: from mountinfo when found (`ext4`, `fuse.rclone`), else from
    /// the magic number, else `unknown (0x…)`.
    pub fs_type: String,
    /// Local, network, FUSE, memory or unknown.
    pub kind: FsKind,
    /// The mount point containing the path, when mountinfo was readable.
    pub mount_point: Option<String>,
    /// The mount's source (`/dev/sda1`, `server:/export`, `gdrive:`), when known.
    pub source: Option<String>,
    /// `statfs` magic number, when `statfs` succeeded.
    pub magic: Option<u32>,
}

/// One magic number: (magic, name, kind). Values from the kernel's `include/uapi/linux/magic.h`
/// and the filesystems' own sources.
const MAGICS: &[(u32, &str, FsKind)] = &[
    (0xEF53, "ext4", FsKind::Local), // ext2/3/4 share it
    (0x5846_5342, "xfs", FsKind::Local),
    (0x9123_683E, "btrfs", FsKind::Local),
    (0x2FC1_2FC1, "zfs", FsKind::Local),
    (0xF2F5_2010, "f2fs", FsKind::Local),
    (0xCA45_1A4E, "bcachefs", FsKind::Local),
    (0x794C_7630, "overlay", FsKind::Local),
    (0x7371_7368, "squashfs", FsKind::Local),
    (0xE0F5_E1E2, "erofs", FsKind::Local),
    (0x4D44, "vfat", FsKind::Local),
    (0x2011_BAB0, "exfat", FsKind::Local),
    (0x5346_544E, "ntfs", FsKind::Local),
    (0x9660, "iso9660", FsKind::Local),
    (0x1501_3346, "udf", FsKind::Local),
    (0x3153_464A, "jfs", FsKind::Local),
    (0x5265_4973, "reiserfs", FsKind::Local),
    (0x482B, "hfsplus", FsKind::Local),
    (0x2846_3D45, "cramfs", FsKind::Local),
    (0x0102_1994, "tmpfs", FsKind::Memory),
    (0x8584_58F6, "ramfs", FsKind::Memory),
    (0x6969, "nfs", FsKind::Network),
    (0xFF53_4D42, "cifs", FsKind::Network),
    (0xFE53_4D42, "smb2", FsKind::Network),
    (0x517B, "smbfs", FsKind::Network),
    (0x00C3_6400, "ceph", FsKind::Network),
    (0x0BD0_0BD0, "lustre", FsKind::Network),
    (0x4750_4653, "gpfs", FsKind::Network),
    (0x5346_414F, "afs", FsKind::Network),
    (0x0116_1970, "gfs2", FsKind::Network),
    (0x0102_1997, "9p", FsKind::Network),
    (0x6573_5546, "fuse", FsKind::Fuse),
];

/// Filesystem names (as in mountinfo) that the magic table cannot tell apart or lacks.
const NAMES: &[(&str, FsKind)] = &[
    ("ext2", FsKind::Local),
    ("ext3", FsKind::Local),
    ("ext4", FsKind::Local),
    ("xfs", FsKind::Local),
    ("btrfs", FsKind::Local),
    ("zfs", FsKind::Local),
    ("f2fs", FsKind::Local),
    ("bcachefs", FsKind::Local),
    ("overlay", FsKind::Local),
    ("squashfs", FsKind::Local),
    ("erofs", FsKind::Local),
    ("vfat", FsKind::Local),
    ("msdos", FsKind::Local),
    ("exfat", FsKind::Local),
    ("ntfs", FsKind::Local),
    ("ntfs3", FsKind::Local),
    ("iso9660", FsKind::Local),
    ("udf", FsKind::Local),
    ("tmpfs", FsKind::Memory),
    ("ramfs", FsKind::Memory),
    ("devtmpfs", FsKind::Memory),
    ("nfs", FsKind::Network),
    ("nfs4", FsKind::Network),
    ("cifs", FsKind::Network),
    ("smb3", FsKind::Network),
    ("smbfs", FsKind::Network),
    ("ceph", FsKind::Network),
    ("lustre", FsKind::Network),
    ("gpfs", FsKind::Network),
    ("afs", FsKind::Network),
    ("gfs2", FsKind::Network),
    ("glusterfs", FsKind::Network),
    ("beegfs", FsKind::Network),
    ("9p", FsKind::Network),
    // virtiofs reports FUSE's magic but is a folder shared by the VM host.
    ("virtiofs", FsKind::Network),
    // ntfs-3g and friends: FUSE in userspace on a local block device, still FUSE-slow.
    ("fuseblk", FsKind::Fuse),
    ("fuse", FsKind::Fuse),
];

/// Classifies a filesystem from its `statfs` magic number and its mountinfo name (either may
/// be unknown: pass 0 or ""). The name wins: it tells `fuse.sshfs` from `virtiofs`, which share
/// a magic number.
pub fn classify(magic: u32, fs_type: &str) -> FsKind {
    if fs_type.starts_with("fuse.") {
        return FsKind::Fuse;
    }
    if let Some((_, kind)) = NAMES.iter().find(|(n, _)| *n == fs_type) {
        return *kind;
    }
    match MAGICS.iter().find(|(m, _, _)| *m == magic) {
        Some((_, _, kind)) => *kind,
        None => FsKind::Unknown,
    }
}

/// The name of a magic number, when it is in the table.
fn magic_name(magic: u32) -> Option<&'static str> {
    MAGICS.iter().find(|(m, _, _)| *m == magic).map(|(_, n, _)| *n)
}

/// One line of `/proc/self/mountinfo`, the fields this module needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Where it is mounted (octal escapes decoded).
    pub mount_point: String,
    /// Filesystem type, with subtype: `fuse.rclone`.
    pub fs_type: String,
    /// Mount source.
    pub source: String,
}

/// Parses `/proc/self/mountinfo` text; malformed lines are skipped.
///
/// Format (proc(5)): `id parent major:minor root mount_point options [optional...] - type
/// source super_options`.
fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split(' ').nth(4)?;
            let mut right = right.split(' ');
            let fs_type = right.next()?;
            let source = right.next().unwrap_or("");
            Some(MountEntry {
                mount_point: unescape(mount_point),
                fs_type: fs_type.to_string(),
                source: unescape(source),
            })
        })
        .collect()
}

/// Decodes mountinfo's `\040`-style octal escapes (space, tab, newline, backslash).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') as u32 * 64 + (b[i + 2] - b'0') as u32 * 8 + (b[i + 3] - b'0') as u32;
            if let Ok(byte) = u8::try_from(v) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount holding `path` (absolute, canonical): the longest mount point that is `path`
/// or one of its ancestors. Among equal mount points the last one wins: a later mount hides
/// an earlier one on the same directory.
fn find_mount<'a>(mounts: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    let mut best: Option<&MountEntry> = None;
    for m in mounts {
        // Path::starts_with compares whole components: /data does not contain /database.
        if path.starts_with(&m.mount_point) && best.is_none_or(|b| m.mount_point.len() >= b.mount_point.len()) {
            best = Some(m);
        }
    }
    best
}

/// Detects the filesystem under `path`. Never fails: what cannot be read is left unknown.
pub fn detect(path: &Path) -> FsInfo {
    // Symlinks (a `data -> /mnt/gdrive/...` link is common) must be followed to the real mount.
    let real: PathBuf = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let magic = statfs_magic(&real);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").map(|t| parse_mountinfo(&t)).unwrap_or_default();
    let mount = find_mount(&mounts, &real);
    let fs_type = match (mount, magic) {
        (Some(m), _) => m.fs_type.clone(),
        (None, Some(mg)) => match magic_name(mg) {
            Some(n) => n.to_string(),
            None => format!("unknown (0x{mg:X})"),
        },
        (None, None) => "unknown".to_string(),
    };
    FsInfo {
        kind: classify(magic.unwrap_or(0), &fs_type),
        fs_type,
        mount_point: mount.map(|m| m.mount_point.clone()),
        source: mount.map(|m| m.source.clone()).filter(|s| !s.is_empty()),
        magic,
    }
}

#[cfg(target_os = "linux")]
fn statfs_magic(path: &Path) -> Option<u32> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: all-zero is a valid `statfs` (plain integers); the kernel fills it.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a writable statfs.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return None;
    }
    // f_type is a signed word whose width varies by architecture; magic numbers are 32-bit.
    #[allow(clippy::unnecessary_cast)]
    Some((st.f_type as u64 & 0xFFFF_FFFF) as u32)
}

#[cfg(not(target_os = "linux"))]
fn statfs_magic(_path: &Path) -> Option<u32> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_table_covers_common_filesystems() {
        let cases: &[(u32, &str, FsKind)] = &[
            (0xEF53, "", FsKind::Local),
            (0xEF53, "ext4", FsKind::Local),
            (0x5846_5342, "", FsKind::Local),
            (0x9123_683E, "btrfs", FsKind::Local),
            (0x794C_7630, "overlay", FsKind::Local),
            (0x7371_7368, "", FsKind::Local),
            (0x2FC1_2FC1, "zfs", FsKind::Local),
            (0x0102_1994, "tmpfs", FsKind::Memory),
            (0x0102_1994, "", FsKind::Memory),
            (0x6969, "nfs4", FsKind::Network),
            (0x6969, "", FsKind::Network),
            (0xFF53_4D42, "cifs", FsKind::Network),
            (0xFE53_4D42, "", FsKind::Network),
            (0x00C3_6400, "ceph", FsKind::Network),
            (0x0102_1997, "9p", FsKind::Network),
            (0x6573_5546, "fuse.rclone", FsKind::Fuse),
            (0x6573_5546, "fuse.sshfs", FsKind::Fuse),
            (0x6573_5546, "", FsKind::Fuse),
            (0x6573_5546, "virtiofs", FsKind::Network),
            (0x6573_5546, "fuseblk", FsKind::Fuse),
            (0, "fuse.gcsfuse", FsKind::Fuse),
            (0, "nfs", FsKind::Network),
            (0x1234_5678, "", FsKind::Unknown),
            (0, "", FsKind::Unknown),
        ];
        for &(magic, name, want) in cases {
            assert_eq!(classify(magic, name), want, "magic 0x{magic:X} name {name:?}");
        }
    }

    #[test]
    fn remote_or_fuse_flags_network_and_fuse_only() {
        assert!(FsKind::Network.is_remote_or_fuse());
        assert!(FsKind::Fuse.is_remote_or_fuse());
        assert!(!FsKind::Local.is_remote_or_fuse());
        assert!(!FsKind::Memory.is_remote_or_fuse());
        assert!(!FsKind::Unknown.is_remote_or_fuse());
    }

    const MOUNTINFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
25 22 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=1k
30 25 0:27 / /dev/shm rw,relatime - tmpfs shm rw,size=2k
40 22 0:50 / /mnt/gdrive rw,nosuid,nodev shared:5 - fuse.rclone gdrive: rw,user_id=0
41 22 0:51 / /mnt/my\\040data rw - nfs4 server:/export rw
malformed line
";

    #[test]
    fn mountinfo_parses_type_source_and_escaped_spaces() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.len(), 5);
        assert_eq!(m[3].fs_type, "fuse.rclone");
        assert_eq!(m[3].source, "gdrive:");
        assert_eq!(m[4].mount_point, "/mnt/my data");
    }

    #[test]
    fn longest_mount_point_wins_and_later_mount_hides_earlier() {
        let m = parse_mountinfo(MOUNTINFO);
        let f = |p: &str| find_mount(&m, Path::new(p)).map(|e| (e.mount_point.as_str(), e.source.as_str()));
        assert_eq!(f("/mnt/gdrive/train/cat.jpg"), Some(("/mnt/gdrive", "gdrive:")));
        assert_eq!(f("/mnt/gdrive"), Some(("/mnt/gdrive", "gdrive:")));
        assert_eq!(f("/mnt/gdrivex/a"), Some(("/", "/dev/vda")));
        assert_eq!(f("/dev/shm/x"), Some(("/dev/shm", "shm")));
        assert_eq!(f("/mnt/my data/x"), Some(("/mnt/my data", "server:/export")));
        assert_eq!(find_mount(&[], Path::new("/x")), None);
    }

    #[test]
    fn unescape_leaves_plain_backslashes_alone() {
        assert_eq!(unescape("a\\134b"), "a\\b");
        assert_eq!(unescape("a\\x"), "a\\x");
        assert_eq!(unescape("tail\\04"), "tail\\04");
    }
}
