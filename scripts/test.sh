#!/usr/bin/env bash
# Every test, Rust and Python: README's test command, and what .ci/run runs after the lints.
#
# Rust: cargo test over the workspace. Python: the wheel users install (scripts/build-wheel.sh:
# the bindings and the pipeprof command) goes into a virtual environment under target/, with
# the real frameworks the tests drive (CPU PyTorch + torchvision, Keras on JAX; ≈ 2 minutes
# from the registries the first time), then pytest runs against that environment's
# `pipeprof` command.
set -euo pipefail
cd "$(dirname "$0")/.."

# tests/prometheus.rs scrapes a run with Debian's prometheus: installed here when missing
# (the test fails without it; it never skips).
if ! command -v prometheus >/dev/null && command -v apt-get >/dev/null; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get install -y -q --no-install-recommends prometheus >/dev/null \
        || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q --no-install-recommends prometheus >/dev/null; }
fi

cargo test --release --workspace

venv="$PWD/target/pyvenv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
pip() { "$venv/bin/python" -m pip --disable-pip-version-check "$@"; }
pip install --quiet numpy pillow pytest torch torchvision keras jax
wheel=$(bash scripts/build-wheel.sh)
pip install --quiet --force-reinstall --no-deps "$wheel"
# pytest exits 5 when it collected no tests: with `set -e` that fails the run, as it must.
PIPEPROF_BIN="$venv/bin/pipeprof" "$venv/bin/python" -m pytest python/tests -q -p no:cacheprovider
