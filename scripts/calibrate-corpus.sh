#!/usr/bin/env bash
# The corpus calibration: each training script of python/corpus/ (written the way the common
# public scripts are) runs N times under `pipeprof run --once --check-advice`; one table:
# script, verdict (and in how many runs it was the same), each piece of advice pipeprof could
# apply, its predicted ×, the measured × (median, min–max over the runs; against the same run's
# unchanged baseline re-run) and the error (predicted over the median measured, − 1). Then the
# rows outside ±25%, and every failed run with the last lines of its errors.
#
# Timings, not tests: run it on a quiet machine. The scripts' images are generated once into
# the run's own folder (python/corpus/_data.py): nothing is downloaded.
#
#   bash scripts/calibrate-corpus.sh                       # every script, 3 runs each
#   bash scripts/calibrate-corpus.sh 1 dcgan mnist_in_memory
#
# A script's header line `# corpus: python=torch|jax|tf steps=S` says which Python runs it
# (torch and jax: target/pyvenv, or PIPEPROF_PYTHON; tf: target/tfvenv, or PIPEPROF_TF_PYTHON)
# and the steps of each re-run (STEPS overrides). The pipeprof command: PIPEPROF_BIN, else the
# one the wheel installed in target/pyvenv; both Pythons need the wheel installed. Every run's
# output and summary stay in OUT (default: a new private folder, printed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."

N=3
if [[ ${1:-} =~ ^[0-9]+$ ]]; then
    N=$1
    shift
fi
CORPUS=python/corpus
if [ $# -gt 0 ]; then
    NAMES=("$@")
else
    NAMES=()
    for f in "$CORPUS"/[!_]*.py; do
        NAMES+=("$(basename "$f" .py)")
    done
fi
BIN=${PIPEPROF_BIN:-target/pyvenv/bin/pipeprof}
PY=${PIPEPROF_PYTHON:-target/pyvenv/bin/python}
TFPY=${PIPEPROF_TF_PYTHON:-target/tfvenv/bin/python}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/pipeprof-corpus.XXXXXX")}
# Absolute paths: the data is made from inside the corpus folder.
abs() { case $1 in /*) echo "$1" ;; */*) echo "$PWD/$1" ;; *) command -v "$1" || echo "$1" ;; esac; }
BIN=$(abs "$BIN")
PY=$(abs "$PY")
TFPY=$(abs "$TFPY")
for x in "$BIN" "$PY" "$TFPY"; do
    [ -x "$x" ] || { echo "calibrate-corpus: $x missing: scripts/test.sh makes the environments and installs the wheel" >&2; exit 2; }
done
mkdir -p "$OUT"

# The generated images, made once, before any run is timed.
export CORPUS_DATA="$OUT/data"
(cd "$CORPUS" && "$PY" -c 'import _data; _data.image_folder(); _data.segmentation_folder()')

header() { sed -n 's/^# corpus: //p;q' "$CORPUS/$1.py"; }
field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }

echo "calibrate-corpus: $(date -u '+%Y-%m-%d %H:%M') UTC · $(nproc) cores · load $(cut -d' ' -f1-3 /proc/loadavg) · $N runs each · in $OUT" >&2
for name in "${NAMES[@]}"; do
    name=${name%.py}
    name=${name##*/}
    if [ ! -f "$CORPUS/$name.py" ]; then
        echo "calibrate-corpus: no script $CORPUS/$name.py" >&2
        mkdir -p "$OUT/runs/$name/1"
        echo "no script $CORPUS/$name.py" >"$OUT/runs/$name/1/err.txt"
        echo 2 >"$OUT/runs/$name/1/rc"
        continue
    fi
    h=$(header "$name")
    python=$PY
    [ "$(field "$h" python)" = tf ] && python=$TFPY
    steps=${STEPS:-$(field "$h" steps)}
    steps=${steps:-40}
    for r in $(seq 1 "$N"); do
        dir="$OUT/runs/$name/$r"
        mkdir -p "$dir"
        echo "calibrate-corpus: $name, run $r/$N ($steps steps a re-run)" >&2
        rc=0
        "$BIN" run --once --check-advice --steps "$steps" --summary "$dir/main.json" \
            -- "$python" "$CORPUS/$name.py" </dev/null >"$dir/out.txt" 2>"$dir/err.txt" || rc=$?
        echo "$rc" >"$dir/rc"
        [ "$rc" = 0 ] || echo "calibrate-corpus: $name run $r failed ($rc): $(tail -n 1 "$dir/err.txt")" >&2
    done
done

python3 scripts/calibrate/corpus_table.py "$OUT/runs"
echo "calibrate-corpus: every run's output and summary are in $OUT" >&2
