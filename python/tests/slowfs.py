"""A read-only FUSE passthrough that answers like a network drive: each open and each read of a
file waits a fixed latency first (a NAS, a mounted bucket, Google Drive in Colab).

    python slowfs.py SOURCE MOUNTPOINT [--open-ms 8] [--read-ms 4]   # foreground; Ctrl-C unmounts

Needs libfuse3 (Debian's ``fuse3``, which gives ``fusermount3``) and ``mfusepy``. The mount's
type in /proc/mounts is ``fuse`` (``fuse.SlowFS`` in mountinfo), as a real FUSE drive's is.
The kernel's page cache is dropped at every open (no ``keep_cache``), so each epoch reads
through the latency again, as it would over the network. Writes are refused (EROFS).

Tests use :func:`mounted`, which unmounts (``fusermount3 -u``) and ends the process on every
way out.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import shutil
import subprocess
import sys
import time

#: Latency added before each open, ms (a network round trip and a metadata look-up).
OPEN_MS = 8.0
#: Latency added before each read of a block (the kernel reads up to 128 KiB at once), ms.
READ_MS = 4.0


def _operations(source, open_ms, read_ms):
    import mfusepy as fuse

    class SlowFS(fuse.Operations):
        """Passthrough of ``source``, read only, with ``open_ms`` and ``read_ms`` of latency."""

        use_ns = True

        def _real(self, path):
            return os.path.join(source, path.lstrip("/"))

        def getattr(self, path, fh=None):
            try:
                st = os.lstat(self._real(path))
            except OSError as e:
                raise fuse.FuseOSError(e.errno) from None
            keys = ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_atime_ns", "st_mtime_ns", "st_ctime_ns")
            out = {k.replace("_ns", ""): getattr(st, k) for k in keys}
            # Read only: no write bits, whatever the source's.
            out["st_mode"] &= ~0o222
            return out

        def readlink(self, path):
            # A link is passed through as it is (a class folder linked elsewhere: DVC, git-annex).
            return os.readlink(self._real(path))

        def readdir(self, path, fh):
            return [".", "..", *sorted(os.listdir(self._real(path)))]

        def open(self, path, flags):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC | os.O_CREAT):
                raise fuse.FuseOSError(errno.EROFS)
            time.sleep(open_ms / 1000.0)
            return os.open(self._real(path), os.O_RDONLY)

        def read(self, path, size, offset, fh):
            time.sleep(read_ms / 1000.0)
            return os.pread(fh, size, offset)

        def release(self, path, fh):
            os.close(fh)
            return 0

        def statfs(self, path):
            st = os.statvfs(self._real(path))
            keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")
            return {k: getattr(st, k) for k in keys}

    return fuse, SlowFS()


def serve(source, mountpoint, open_ms=OPEN_MS, read_ms=READ_MS):
    """Mounts and serves until unmounted (``fusermount3 -u MOUNTPOINT``) or interrupted."""
    fuse, ops = _operations(os.path.abspath(source), open_ms, read_ms)
    fuse.FUSE(ops, mountpoint, foreground=True, ro=True, fsname="slowfs")


def is_mounted(mountpoint):
    """Whether ``mountpoint`` is a mount point now (read from /proc/self/mounts)."""
    target = os.path.realpath(mountpoint)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == target for line in f if len(line.split()) > 1)


def unmount(mountpoint):
    """``fusermount3 -u`` (lazily if busy); True when nothing is mounted there after."""
    for args in (["-u"], ["-uz"]):
        if not is_mounted(mountpoint):
            return True
        subprocess.run(["fusermount3", *args, mountpoint], capture_output=True, timeout=30)
    return not is_mounted(mountpoint)


@contextlib.contextmanager
def mounted(source, mountpoint, open_ms=OPEN_MS, read_ms=READ_MS, timeout_s=30.0):
    """``source`` served slowly at ``mountpoint`` in a child process for the ``with`` block;
    unmounted and the process ended on every way out (an error in the block, a failed mount)."""
    if shutil.which("fusermount3") is None:
        raise RuntimeError("fusermount3 not found: install Debian's fuse3 (scripts/test.sh does)")
    os.makedirs(mountpoint, exist_ok=True)
    cmd = [sys.executable, __file__, source, mountpoint, "--open-ms", str(open_ms), "--read-ms", str(read_ms)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        # Polled: the mount appears in /proc/self/mounts once libfuse has it, or the process ends.
        while not is_mounted(mountpoint):
            if proc.poll() is not None:
                raise RuntimeError(f"slowfs exited with {proc.returncode}: {proc.stdout.read().decode(errors='replace')}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"slowfs did not mount {mountpoint} in {timeout_s} s")
            time.sleep(0.05)
        yield mountpoint
    finally:
        try:
            unmount(mountpoint)
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            proc.stdout.close()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source")
    p.add_argument("mountpoint")
    p.add_argument("--open-ms", type=float, default=OPEN_MS)
    p.add_argument("--read-ms", type=float, default=READ_MS)
    a = p.parse_args(argv)
    serve(a.source, a.mountpoint, a.open_ms, a.read_ms)


if __name__ == "__main__":
    main()
