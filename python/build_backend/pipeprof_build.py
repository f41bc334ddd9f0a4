"""The wheel's build backend (PEP 517): maturin, after the `pipeprof` command is built.

`pip install ./python` (from a clone of the repository) builds the Python module with maturin,
and the wheel also carries the `pipeprof` command itself (maturin's data folder,
``pipeprof.data/scripts``), which is the repository's main crate, one folder up. This backend
builds that command with cargo and copies it there first, then hands over to maturin; it is
what ``scripts/build-wheel.sh`` does by hand. A source distribution cannot hold the main crate,
so only wheels are built here.
"""

import os
import shutil
import subprocess
from pathlib import Path

import maturin

PYTHON = Path(__file__).resolve().parent.parent
REPO = PYTHON.parent

get_requires_for_build_wheel = maturin.get_requires_for_build_wheel

# maturin checks that the data folder exists as early as the metadata step, which pip runs
# before any build: in a fresh clone (the folder is git-ignored) it must be made first.
SCRIPTS = PYTHON / "pipeprof.data" / "scripts"


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    SCRIPTS.mkdir(parents=True, exist_ok=True)
    return maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    SCRIPTS.mkdir(parents=True, exist_ok=True)
    prepare = getattr(maturin, "prepare_metadata_for_build_editable", maturin.prepare_metadata_for_build_wheel)
    return prepare(metadata_directory, config_settings)


def _build_command():
    if not (REPO / "Cargo.toml").is_file():
        raise RuntimeError(
            f"pipeprof's wheel is built from a clone of its repository: {REPO / 'Cargo.toml'} is missing "
            "(run `pip install ./python` from the repository's root, or scripts/build-wheel.sh)"
        )
    # The repository's own target folder: what cargo and scripts/build-wheel.sh built is reused.
    os.environ.setdefault("CARGO_TARGET_DIR", str(REPO / "target"))
    target = Path(os.environ["CARGO_TARGET_DIR"])
    cargo = shutil.which("cargo")
    if cargo is None:
        raise RuntimeError("building pipeprof from source needs Rust's cargo on PATH (https://rustup.rs)")
    subprocess.run(
        [cargo, "build", "--release", "--bin", "pipeprof", "--manifest-path", str(REPO / "Cargo.toml")], check=True
    )
    SCRIPTS.mkdir(parents=True, exist_ok=True)
    shutil.copy2(target / "release" / "pipeprof", SCRIPTS / "pipeprof")
    (SCRIPTS / "pipeprof").chmod(0o755)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _build_command()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _build_command()
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)


get_requires_for_build_editable = getattr(maturin, "get_requires_for_build_editable", maturin.get_requires_for_build_wheel)
