#!/usr/bin/env bash
# The calibration matrix: does each predicted gain come true? A fixed set of scenarios, each run
# with --check-advice (one baseline re-run plus one re-run per piece of advice pipeprof can apply)
# REPEATS times; one table: scenario, verdict (and in how many repeats it was the same), advice,
# predicted ×, measured × (median, min–max over the repeats), error (predicted over the median
# measured, −1). Goal: every error within ±25% and the same verdict in every repeat.
#
# Timings, not tests: run it on a quiet machine (other builds move every figure). On 2 cores it
# takes about 5 minutes. Its data sets and models are built here: nothing outside the repository.
#
#   bash scripts/calibrate.sh                 # the whole matrix, 3 repeats
#   REPEATS=1 ONLY=slow-open bash scripts/calibrate.sh
#
# Every run's output and summary stay in $OUT (default target/calibrate/latest) for a second look.
set -euo pipefail
cd "$(dirname "$0")/.."

REPEATS=${REPEATS:-3}
ONLY=${ONLY:-}
OUT=${OUT:-target/calibrate/latest}
BIN=${PIPEPROF_BIN:-target/release/pipeprof}
HERE=scripts/calibrate

if [ -z "${PIPEPROF_BIN:-}" ]; then
    cargo build --release --quiet
fi
rm -rf "$OUT"
mkdir -p "$OUT"
DATA="$OUT/data"
mkdir -p "$DATA"

# Data sets, deterministic: large PNGs (decode is the work), small mixed JPEG/PNG (reading and
# opening files is the work), and the large PNGs packed at the light model's input size.
"$BIN" demo-data "$DATA/png" --size 480x360 --format png --per-class 24 >/dev/null
"$BIN" demo-data "$DATA/small" --per-class 48 >/dev/null
"$BIN" cache --model "$HERE/light.toml" --data "$DATA/png" --out "$DATA/png.ppk" >/dev/null 2>&1

# Busy loops for the contention scenario: started and stopped by pid.
BUSY=()
start_busy() {
    for _ in 1 2; do
        (while :; do :; done) &
        BUSY+=("$!")
    done
}
stop_busy() {
    for p in "${BUSY[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${BUSY[@]}"; do wait "$p" 2>/dev/null || true; done
    BUSY=()
}
trap 'stop_busy; exit 130' INT TERM
trap 'stop_busy' EXIT

# name | profile arguments (each scenario sets its own workers, steps and data)
SCENARIOS=(
    "decode-1w|--model $HERE/light.toml --data $DATA/png --workers 1 --steps 30"
    "throttled-reads|--model $HERE/light.toml --data $DATA/small --workers 1 --steps 24 --batch-size 16 --throttle-read 40MB/s+4ms"
    "slow-opens|--model $HERE/light.toml --data $DATA/small --workers 1 --steps 16 --batch-size 8 --slow read=+30ms"
    "tiny-model|--model $HERE/tiny.toml --data $DATA/small --workers 2 --steps 3000"
    "compute-bound|--data $DATA/small --workers 1 --steps 30"
    "contention|--model $HERE/light.toml --data $DATA/png --workers 1 --steps 30"
    "packed-cache|--model $HERE/light.toml --data $DATA/png.ppk --workers 1 --steps 200"
)

echo "calibrate: $(date -u +%Y-%m-%d) · $(nproc) cores · load $(cut -d' ' -f1-3 /proc/loadavg) · $REPEATS repeats · runs in $OUT" >&2
for row in "${SCENARIOS[@]}"; do
    name=${row%%|*}
    args=${row#*|}
    if [ -n "$ONLY" ] && [ "$ONLY" != "$name" ]; then
        continue
    fi
    for r in $(seq 1 "$REPEATS"); do
        dir="$OUT/$name/$r"
        mkdir -p "$dir"
        echo "calibrate: $name, repeat $r/$REPEATS" >&2
        [ "$name" = contention ] && start_busy
        # shellcheck disable=SC2086 # the arguments are words
        "$BIN" profile --no-tui $args --summary "$dir/main.json" --check-advice >"$dir/out.txt" 2>"$dir/err.txt" \
            || echo "calibrate: $name repeat $r failed: $(tail -n 1 "$dir/err.txt")" >&2
        if [ "$name" = contention ]; then
            stop_busy
            # Freeing the cores is advice pipeprof cannot apply itself: the same run, without
            # the busy loops, measures it.
            # shellcheck disable=SC2086
            "$BIN" profile --no-tui $args --summary "$dir/quiet.json" >/dev/null 2>&1 || true
        fi
    done
done

python3 "$HERE/table.py" "$OUT"
