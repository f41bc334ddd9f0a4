#!/usr/bin/env bash
# Every test, Rust and Python: README's test command, and what .ci/run runs after the lints.
#
# The Python bindings (python/) are not in the cargo workspace: they are built with maturin
# into a virtual environment under target/ made here from the registries (maturin, numpy,
# Pillow, pytest), then tested with pytest against the pipeprof binary cargo just built.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --release --workspace

venv="$PWD/target/pyvenv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check maturin numpy pillow pytest
VIRTUAL_ENV="$venv" CARGO_TARGET_DIR="$PWD/target" "$venv/bin/maturin" develop --release --quiet -m python/Cargo.toml
# pytest exits 5 when it collected no tests: with `set -e` that fails the run, as it must.
PIPEPROF_BIN="$PWD/target/release/pipeprof" "$venv/bin/python" -m pytest python/tests -q -p no:cacheprovider
