#!/usr/bin/env bash
# Issue 56's GPU run: every user case beside its plain run (the ground truth), `pipeprof run`'s
# overhead, and pipeprof's own CUDA loop, in ONE call of the device tool; one results file.
#
#   scripts/gpu-truth.sh --prepare             here: builds nothing, packs gpu-truth-carry/
#   scripts/gpu-truth.sh [OPTIONS] BINARY WHEEL the run (options: scripts/gpu-truth.sh --help)
#
# 1. HERE, before the GPU day (CPU-heavy: run them when the 2 cores are free):
#      bash scripts/build-cuda.sh        # gpu-bin/pipeprof, the CUDA build (≈ 13 min cold, 62 MB)
#      bash scripts/build-wheel.sh       # target/wheels/pipeprof-*.whl (abi3: Python 3.12 there)
#      bash scripts/gpu-truth.sh --prepare
#    --prepare checks the CUDA binary (scripts/check-cuda-bin.sh) and fills the git-ignored
#    folder gpu-truth-carry/ (≈ 18 MB; it prints the size, with the working tree's ≈ 5 MB):
#      pipeprof.xz      gpu-bin/pipeprof compressed with xz -6 (62 MB → ≈ 8 MB): raw, it would
#                       take most of the 64 MiB a call may carry; the driver decompresses it there
#      pipeprof-*.whl   the wheel, installed there with pip --no-index --no-deps --target
#      wheels/          keras, namex, optree for cp312 manylinux (the GPU machine has no Keras
#                       and no network; Keras's other needs are installed there)
# 2. THE ONE CALL (device tool `run`), carry exactly ONE path: ["gpu-truth-carry"]
#      timeout_s: 480      (the cases' budget is 420 s; install, header and logs ≈ 30 s)
#      command:   bash scripts/gpu-truth.sh gpu-truth-carry/pipeprof.xz gpu-truth-carry/pipeprof-*.whl --extra-wheels gpu-truth-carry/wheels
#    It writes to $OUT: gpu-truth.tsv (one row per case, appended as each ends, so a run cut
#    short keeps what it measured) and gpu-truth-logs.tar.gz (every run's log and summary,
#    refreshed after each case); the summary table also ends the printed output.
#    Device time: a start (1–2 min) + ≤ 8 min leaves ≈ 5 min of the 15 for ONE re-run, on the
#    still-warm machine (it goes back after 30 s idle): the output's last line is that re-run's
#    command (failed and budget-skipped cases only, --budget 200, timeout_s 240). Then give_back.
#
# Cases, in this order (a case starts only with ≥ 15 s of the budget left; later ones are then
# "skipped: budget spent"): mlp-b32/b128 on cpu and gpu (in-memory TensorDataset), cnn-w0/4/8/16
# (ImageFolder, decode + augment, persistent workers), overhead-2ms/40ms (plain and pipeprof runs
# alternating), own-gpu-check (scripts/gpu-check.sh) and what it measures: own-cnn-step (beside
# benches/peer_train.py), own-h2d (beside PyTorch's pageable/pinned copy), own-workers-auto,
# own-cuda-step-bench (only with --bench); keras-mlp/cnn on jax and torch, cnn-w0-check-advice,
# mlp-b32-gpu-check-advice (the batch advice of a tiny model on the GPU, re-run).
# --cpu-only: every case on the CPU with tiny data, the GPU-only ones "skipped: needs a GPU …";
# python/tests/test_gpu_truth.py runs it so in CI. Exit: 0 all ok, 1 a case failed, 2 bad
# arguments (the message names the file and why).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY=$ROOT/gpu-truth-carry
# Keras 3 and the two packages of its needs the GPU machine lacks; pinned (their versions are
# the ones python/tests run with), each for CPython 3.12 on x86-64.
KERAS_WHEELS=(keras==3.15.1 namex==0.1.0 optree==0.20.0)

say() { printf 'gpu-truth: %s\n' "$*" >&2; }
die() {
    printf 'gpu-truth: error: %s\n' "$*" >&2
    exit "${2:-1}"
}

prepare() {
    [[ $# -eq 0 ]] || die "--prepare takes no other argument (got '$*')" 2
    local bin=$ROOT/gpu-bin/pipeprof wheels
    [[ -f $bin ]] || die "$bin: no such file: build it first with bash scripts/build-cuda.sh"
    shopt -s nullglob
    wheels=("$ROOT"/target/wheels/pipeprof-*.whl)
    shopt -u nullglob
    [[ ${#wheels[@]} -eq 1 ]] ||
        die "target/wheels: ${#wheels[@]} pipeprof-*.whl (expected one): build it with bash scripts/build-wheel.sh"
    bash "$ROOT/scripts/check-cuda-bin.sh" "$bin"
    mkdir -p "$CARRY/wheels"
    if [[ ! $CARRY/pipeprof.xz -nt $bin ]]; then
        say "xz -6 $bin → $CARRY/pipeprof.xz"
        xz -6 -c "$bin" >"$CARRY/pipeprof.xz.part"
        mv "$CARRY/pipeprof.xz.part" "$CARRY/pipeprof.xz"
    fi
    rm -f "$CARRY"/pipeprof-*.whl
    cp "${wheels[0]}" "$CARRY/"
    rm -f "$CARRY"/wheels/*.whl
    say "pip download ${KERAS_WHEELS[*]} (cp312, manylinux x86-64)"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$CARRY/wheels" "${KERAS_WHEELS[@]}" ||
        die "pip download of ${KERAS_WHEELS[*]} failed (it needs the network, here only)"
    local carried tree
    carried=$(du -sb "$CARRY" | cut -f1)
    tree=$(cd "$ROOT" && git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
    (cd "$ROOT" && ls -l gpu-truth-carry gpu-truth-carry/wheels) >&2
    say "carried $((carried / 1048576)) MiB + working tree $((tree / 1048576)) MiB (the limit: 64 MiB)"
    [[ $((carried + tree)) -lt $((60 * 1048576)) ]] || die "over 60 MiB: the call would be refused"
    say "ready. The one call: carry [\"gpu-truth-carry\"], timeout_s 480, command:"
    echo "bash scripts/gpu-truth.sh gpu-truth-carry/pipeprof.xz gpu-truth-carry/pipeprof-*.whl --extra-wheels gpu-truth-carry/wheels"
}

case ${1:-} in
--prepare)
    shift
    prepare "$@"
    ;;
-h | --help)
    sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'
    echo
    exec python3 "$ROOT/scripts/gpu_truth.py" --help
    ;;
*)
    command -v python3 >/dev/null || die "python3 is needed (the driver is scripts/gpu_truth.py)" 2
    exec python3 "$ROOT/scripts/gpu_truth.py" "$@"
    ;;
esac
