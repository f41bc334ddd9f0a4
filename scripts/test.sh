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

# tests/metrics.rs (its `prometheus` tests) scrapes a run with Debian's prometheus: installed here when missing
# (the test fails without it; it never skips).
if ! command -v prometheus >/dev/null && command -v apt-get >/dev/null; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get install -y -q --no-install-recommends prometheus >/dev/null \
        || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q --no-install-recommends prometheus >/dev/null; }
fi

# tests/html_report.rs loads the HTML report in Debian's headless chromium: installed here
# when missing (the test fails without it; it never skips).
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get install -y -q --no-install-recommends chromium fonts-liberation >/dev/null \
        || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q --no-install-recommends chromium fonts-liberation >/dev/null; }
fi

# python/tests/test_check_advice_fuse.py mounts a slow FUSE file system (python/tests/slowfs.py,
# on mfusepy): libfuse3 and fusermount3 from Debian's fuse3, installed here when missing.
if ! command -v fusermount3 >/dev/null && command -v apt-get >/dev/null; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get install -y -q --no-install-recommends fuse3 >/dev/null \
        || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q --no-install-recommends fuse3 >/dev/null; }
fi

# python/tests/test_multinode.py makes two network namespaces joined by a bridge (`ip`, iproute2)
# with a host name each (`unshare --uts`, util-linux): installed here when missing.
if ! { command -v ip && command -v unshare; } >/dev/null && command -v apt-get >/dev/null; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get install -y -q --no-install-recommends iproute2 util-linux >/dev/null \
        || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q --no-install-recommends iproute2 util-linux >/dev/null; }
fi

cargo test --release --workspace

# The frameworks the Python tests drive, in as little disk as they fit: PyPI's torch for Linux
# brings its CUDA libraries (≈ 4 GB installed), and pip, asked for everything at once, holds every
# download (≈ 3 GB) beside the installed files, and a second copy in its cache. So pip resolves
# the whole set once without installing (--dry-run --report), then each large package is
# installed alone from that resolution with no cache: at most one download sits beside what is
# installed. triton (torch.compile's GPU compiler, ≈ 1 GB) is left out: no test compiles.
# With everything already installed, the resolution lists nothing and nothing is fetched.
# pip() below runs the python of `venv`, this function's own when it is called.
install_python_deps() {
    local venv=$1 report
    shift
    report=$(mktemp)
    PIP_NO_CACHE_DIR=1 pip install --quiet --dry-run --report "$report" "$@"
    local resolved small=() pkg
    resolved=$("$venv/bin/python" -c '
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    print(item["metadata"]["name"] + "==" + item["metadata"]["version"])
' "$report")
    for pkg in $resolved; do
        case "$pkg" in
            triton==*) ;;
            nvidia-*|cuda-*|torch==*|torchvision==*|jaxlib==*|scipy==*|tensorflow*==*|keras==*|grpcio==*|h5py==*|libclang==*|ml_dtypes==*)
                PIP_NO_CACHE_DIR=1 pip install --quiet --no-deps "$pkg" ;;
            *) small+=("$pkg") ;;
        esac
    done
    if [ ${#small[@]} -gt 0 ]; then
        PIP_NO_CACHE_DIR=1 pip install --quiet --no-deps "${small[@]}"
    fi
    rm -f "$report"
}

venv="$PWD/target/pyvenv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
pip() { "$venv/bin/python" -m pip --disable-pip-version-check "$@"; }
# lightning: the corpus's Lightning script (python/corpus/) runs the real Trainer loop; it adds
# ≈ 40 MB of pure-Python packages (torchmetrics, aiohttp for fsspec[http]) and no CUDA extras.
# ipykernel, nbclient, nbformat: python/tests/test_notebook.py runs notebooks in a real kernel.
# mfusepy: python/tests/slowfs.py, the slow FUSE mount of the check-advice storage test.
# accelerate, datasets, opencv-python-headless, albumentations: the corpus's 🤗 accelerate, 🤗
# datasets and cv2 + albumentations scripts; ≈ 450 MB installed (pyarrow 170, opencv 150,
# pandas 85), CPU-only wheels.
# fastai: the corpus's DataBlock + vision_learner script (python/tests/test_fastai.py); ≈ 380 MB
# installed with what it pulls in (spacy 126, scikit-learn 51, blis 39, matplotlib 35; fastai's
# own packages 5), pure Python or CPU wheels, torch and torchvision kept as they are.
# jsonschema: the tests hold `--json`'s documents against docs/schema/verdict.schema.json with
# it. mcp: the official MCP Python SDK, the client python/tests/test_mcp.py drives `pipeprof mcp` with.
install_python_deps "$venv" numpy pillow pytest torch torchvision keras jax lightning ipykernel nbclient nbformat mfusepy \
    accelerate datasets opencv-python-headless albumentations fastai jsonschema mcp
wheel=$(bash scripts/build-wheel.sh)
pip install --quiet --force-reinstall --no-deps "$wheel"

# TensorFlow gets its own environment (the Keras-on-TensorFlow tests run their scripts with
# its python, under the pipeprof command above): tensorflow-cpu (≈ 1 GB installed) beside
# torch's CUDA libraries in one environment is what ran CI out of disk. tf-keras asks for
# `tensorflow`, the GPU build of the same module: tensorflow-cpu provides it, so tf-keras
# comes without its dependencies. scipy: ImageDataGenerator's transforms need it.
tfvenv="$PWD/target/tfvenv"
if [ ! -x "$tfvenv/bin/python" ]; then
    python3 -m venv "$tfvenv"
fi
install_python_deps "$tfvenv" tensorflow-cpu==2.21.* pillow scipy
tfpip() { "$tfvenv/bin/python" -m pip --disable-pip-version-check "$@"; }
PIP_NO_CACHE_DIR=1 tfpip install --quiet --no-deps tf-keras==2.21.*
tfpip install --quiet --force-reinstall --no-deps "$wheel"
# pytest exits 5 when it collected no tests: with `set -e` that fails the run, as it must.
# --durations: the 25 slowest tests listed at the end, where CI time goes.
PIPEPROF_BIN="$venv/bin/pipeprof" PIPEPROF_TF_PYTHON="$tfvenv/bin/python" "$venv/bin/python" -m pytest python/tests -q -p no:cacheprovider --durations=25
