"""`pipeprof run --check-advice` on a torchvision ImageFolder script whose folder is on a slow FUSE
mount (slowfs.py: latency per open and per read, as a network drive): the verdict is storage and
names the mount, and the re-runs read the folder from a local copy and from the packed file
(pipeprof._redirect), each a row of the table with its cost on a line of its own; the copy is gone
after, and the mount's files are as they were."""

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import slowfs
from conftest import HANG_S, pipeprof_bin
from test_frameworks import env_for

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_torchvision.py"
COPY_ROW = "copy the folder to a local temporary folder"
PACK_ROW = "pipeprof pack (size 64), read by PackedImageFolder"


def fingerprint(root):
    """Every file under ``root``: its path, size, modification time and content hash."""
    out = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            out.append((os.path.relpath(path, root), st.st_size, st.st_mtime_ns, digest))
    return sorted(out)


def row(out, label):
    """The table's line for ``label`` (a row starts with its label)."""
    lines = [line for line in out.splitlines() if line.startswith(label)]
    assert len(lines) == 1, f"no single row {label!r} in:\n{out}"
    return lines[0]


def test_check_advice_reads_a_slow_mount_from_a_local_copy_and_from_the_pack(tmp_path):
    src, mnt, scratch = tmp_path / "src", tmp_path / "mnt", tmp_path / "tmp"
    scratch.mkdir()
    made = subprocess.run(
        [pipeprof_bin(), "demo-data", src, "--classes", "2", "--per-class", "64", "--size", "250x250", "--format", "jpeg"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert made.returncode == 0, made.stderr
    before = fingerprint(src)
    env = env_for(tmp_path)
    # The re-runs' private folder (the copy, the pack) is made here, to be looked at after.
    env["TMPDIR"] = str(scratch)
    cmd = [pipeprof_bin(), "run", "--once", "--no-gpu", "--check-advice", "--steps", "8", "--"]
    cmd += [sys.executable, EXAMPLE, "--data", mnt, "--epochs", "6"]
    with slowfs.mounted(src, mnt):
        p = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=env, timeout=6 * HANG_S, cwd=tmp_path)
        through_mount = fingerprint(mnt)
    assert p.returncode == 0, p.stderr + p.stdout
    out = p.stdout
    # Storage, on the FUSE mount the program named.
    assert "verdict: I/O (storage)" in out, out
    assert re.search(rf"^\s+data\s+{re.escape(str(mnt))} on fuse", out, re.M), out
    assert "data on a network/FUSE filesystem (fuse)" in out, out
    # A row each, measured (not skipped, not failed): the hook really read the copy and the pack.
    for label in (COPY_ROW, PACK_ROW):
        line = row(out, label)
        assert not re.search(r"skipped|failed", line), line
        assert re.search(r"\d+\.\d\s+\d+\.\d\d×", line), line
    # The copy's and the pack's cost, each on its own line, with when it pays.
    assert re.search(r"^the copy took \d+\.\d s: (worth it after \d+ epochs?|never worth it)", out, re.M), out
    assert re.search(r"^the pack took \d+\.\d s: (worth it after \d+ epochs?|never worth it)", out, re.M), out
    # The private folder, the copy and the pack in it, are gone; the mount's files untouched.
    assert not [x.name for x in scratch.iterdir() if x.name.startswith("pipeprof-check-run-")]
    assert fingerprint(src) == before
    assert through_mount == before
    assert not slowfs.is_mounted(mnt)
