#!/usr/bin/env bash
# One wheel for Python users, no Rust toolchain needed to install it: the `pipeprof` Python
# module (bindings, `pipeprof run`'s start-up hook, the PyTorch and Keras hooks) and the
# `pipeprof` command itself, every subcommand.
#
# The command is the binary cargo builds, carried in the wheel's data folder
# (python/pipeprof.data/scripts/): pip installs it on the environment's PATH as it is, so
# `pipeprof` runs native code directly (no Python start-up in front of it, signals reach it
# unchanged), and `python -m pipeprof` finds it there. libjpeg is linked into it statically
# (trainer/build.rs), so it needs only the C library; this script checks that, and that its glibc
# symbols are no newer than the wheel's manylinux tag.
#
# Prints the wheel's path last. Uses target/wheel-venv for maturin (made here if missing).
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --bin pipeprof
bin=target/release/pipeprof
data=python/pipeprof.data/scripts
mkdir -p "$data"
cp "$bin" "$data/pipeprof"
chmod 755 "$data/pipeprof"

venv="$PWD/target/wheel-venv"
if [ ! -x "$venv/bin/maturin" ]; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "maturin>=1.5,<2"
fi
out="$PWD/target/wheels"
rm -f "$out"/pipeprof-*.whl
CARGO_TARGET_DIR="$PWD/target" "$venv/bin/maturin" build --release --quiet -m python/Cargo.toml -o "$out" >&2
wheel=$(ls "$out"/pipeprof-*.whl)

# The command must run where the wheel says it does: only the C library's own libraries,
# and glibc symbols no newer than the manylinux tag maturin gave the extension module.
libs=$(ldd "$bin" | awk '{print $1}' | grep -vE '^(linux-vdso|/lib64/ld-linux|libc\.so|libm\.so|libgcc_s\.so|libpthread\.so|libdl\.so|librt\.so)' || true)
if [ -n "$libs" ]; then
    echo "build-wheel: $bin needs libraries a manylinux wheel cannot assume: $libs" >&2
    exit 1
fi
tag=$(basename "$wheel" | grep -oE 'manylinux_[0-9]+_[0-9]+' | head -1 || true)
need=$(objdump -T "$bin" | grep -oE 'GLIBC_[0-9]+\.[0-9]+' | sed 's/GLIBC_//' | sort -V | tail -1)
if [ -n "$tag" ]; then
    have=$(echo "$tag" | sed -E 's/manylinux_([0-9]+)_([0-9]+)/\1.\2/')
    if [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | tail -1)" != "$have" ]; then
        echo "build-wheel: the command needs glibc $need, the wheel is tagged $tag" >&2
        exit 1
    fi
fi
echo "build-wheel: $(du -h "$wheel" | cut -f1) · the command needs glibc $need · ${tag:-linux}" >&2
echo "$wheel"
