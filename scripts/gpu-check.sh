#!/usr/bin/env bash
# The GPU check of issue 15: every scenario with one pipeprof binary, in one go, then a table.
#
#   scripts/gpu-check.sh [--cpu-only] [--out DIR] [--data-dir DIR] [--budget SECONDS] BINARY
#
# Scenarios (data made by the binary's own demo-data):
#   mlp-*         784-128-10 MLP on 28×28 digits, batch 32, from a packed cache: CPU vs GPU
#                 (the GPU run with --check-advice), and the GPU run with PIPEPROF_GPU_SYNC=step
#                 (what timing each phase costs: the default times them with CUDA events)
#                 ...and the CNN with PIPEPROF_PINNED=1 (page-locked staging vs pageable copies),
#                 PIPEPROF_PINNED=u8 (bytes over the link, made f32 on the device) and
#                 PIPEPROF_GPU_SYNC=phase (a wait for the device after every phase)
#   decode-*      1024×768 JPEG photos into a small CNN: 1 loader worker, then --workers auto
#   cnn-large-*   a 42.5 M-parameter CNN at 150×150 (examples/cnn_large.toml): CPU vs GPU
#   io-throttled  --throttle-read 1MB/s: I/O-bound, GPU idle
#   gpu-unused    a CPU run on a machine with a GPU: the idle GPU must be flagged
# Each run writes DIR/NAME.summary.json and DIR/NAME.log; the table is also in DIR/table.txt.
# --cpu-only: the "gpu" rows run on the CPU too, with fewer steps (tests this script without a
# GPU). --budget: seconds for all runs (default 480, under the GPU machine's 10 minutes per
# command); each run's time limit is cut to what is left, and runs past it are skipped.
# DIR defaults to $OUT when set, else ./gpu-check-out. The generated images (≈ 40 MB) go to
# --data-dir (default: a folder under ${TMPDIR:-/tmp}), not DIR, so that DIR stays small enough
# to come back from the GPU machine. Needs python3 for the table.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CPU_ONLY=0
OUT_DIR=${OUT:-$PWD/gpu-check-out}
BIN=
BUDGET=480
DATA=
START=$(date +%s)

die() {
    printf 'gpu-check: error: %s\n' "$*" >&2
    exit 1
}
say() { printf 'gpu-check: %s\n' "$*" >&2; }

while [[ $# -gt 0 ]]; do
    case $1 in
    --cpu-only)
        CPU_ONLY=1
        shift
        ;;
    --out)
        [[ $# -ge 2 ]] || die "--out needs a folder"
        OUT_DIR=$2
        shift 2
        ;;
    --data-dir)
        [[ $# -ge 2 ]] || die "--data-dir needs a folder"
        DATA=$2
        shift 2
        ;;
    --budget)
        [[ $# -ge 2 && $2 =~ ^[0-9]+$ ]] || die "--budget needs a number of seconds"
        BUDGET=$2
        shift 2
        ;;
    -h | --help)
        sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *)
        [[ -z $BIN ]] || die "one binary only (got '$BIN' and '$1')"
        BIN=$1
        shift
        ;;
    esac
done
[[ -n $BIN ]] || die "usage: scripts/gpu-check.sh [--cpu-only] [--out DIR] [--data-dir DIR] [--budget SECONDS] BINARY"
[[ -x $BIN ]] || die "'$BIN' is not an executable file"
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
command -v python3 >/dev/null || die "python3 is needed for the table"
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
if [[ $CPU_ONLY == 1 ]]; then SCALE=4; else SCALE=1; fi
# The scale is in the name: --cpu-only makes smaller sets, and each set is made once.
DATA=${DATA:-${TMPDIR:-/tmp}/pipeprof-gpu-check-data-$SCALE}
mkdir -p "$DATA"

# The CUDA libraries: PyTorch's pip wheels (nvidia/cu13/lib in site-packages) and the toolkit.
libdirs=()
while IFS= read -r sp; do
    [[ -d $sp/nvidia/cu13/lib ]] && libdirs+=("$sp/nvidia/cu13/lib")
done < <(python3 -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null || true)
[[ -d /usr/local/cuda/lib64 ]] && libdirs+=(/usr/local/cuda/lib64)
if [[ ${#libdirs[@]} -gt 0 ]]; then
    LD_LIBRARY_PATH=$(
        IFS=:
        echo "${libdirs[*]}"
    )${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LD_LIBRARY_PATH
fi
say "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
missing=$(ldd "$BIN" | grep "not found" || true)
if [[ -n $missing ]]; then
    [[ $CPU_ONLY == 1 ]] || die "libraries not found for $BIN:"$'\n'"$missing"
    say "libraries not found (ignored with --cpu-only): $(echo "$missing" | awk '{print $1}' | tr '\n' ' ')"
fi

# What ran where, for docs/gpu.md.
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "host: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
    echo "binary: $BIN ($(stat -c %s "$BIN") bytes)"
    if command -v nvidia-smi >/dev/null; then
        echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max,compute_cap --format=csv,noheader 2>&1 | head -n1)"
    else
        echo "gpu: none (no nvidia-smi)"
    fi
} | tee "$OUT_DIR/machine.txt" >&2

# Data, made once per output folder.
demo() {
    local dir=$1
    shift
    [[ -f $dir/.done ]] && return 0
    say "demo-data $dir $*"
    rm -rf "$dir"
    "$BIN" demo-data "$dir" "$@" >/dev/null
    touch "$dir/.done"
}
# Ten digit classes for 784-128-10 from two demo sets (demo-data draws at most 6 shapes): the
# second set's folders are renamed, so the same shapes carry other labels. Timing does not care.
if [[ ! -f $DATA/digits/.done ]]; then
    demo "$DATA/digits-a" --classes 6 --per-class $((1000 / SCALE)) --size 28x28 --format png --seed 2
    demo "$DATA/digits-b" --classes 4 --per-class $((1000 / SCALE)) --size 28x28 --format png --seed 5
    rm -rf "$DATA/digits"
    mkdir -p "$DATA/digits"
    for c in "$DATA/digits-a"/*/; do mv "$c" "$DATA/digits/"; done
    for c in "$DATA/digits-b"/*/; do mv "$c" "$DATA/digits/$(basename "$c")-b"; done
    rm -rf "$DATA/digits-a" "$DATA/digits-b" "$DATA/digits.ppk"
    touch "$DATA/digits/.done"
fi
demo "$DATA/photos" --classes 4 --per-class $((120 / SCALE)) --size 1024x768 --format jpeg --seed 3
demo "$DATA/shapes150" --classes 4 --per-class $((300 / SCALE)) --size 150x150 --format jpeg --seed 4
if [[ ! -f $DATA/digits.ppk ]]; then
    say "cache of the digits for the MLP"
    "$BIN" cache --model "$ROOT/examples/mlp_mnist.toml" --data "$DATA/digits" --out "$DATA/digits.ppk" >/dev/null
fi

if [[ $CPU_ONLY == 1 ]]; then GPU=cpu; else GPU=cuda; fi
RUNS=$OUT_DIR/runs.tsv
: >"$RUNS"

# pick VALUE_ON_A_GPU VALUE_WITH_CPU_ONLY
pick() { if [[ $CPU_ONLY == 1 ]]; then echo "$2"; else echo "$1"; fi; }

# run NAME DEVICE TIMEOUT_S [VAR=VALUE ...] -- PROFILE_ARGS...
run() {
    local name=$1 device=$2 limit=$3
    shift 3
    local left=$((BUDGET - ($(date +%s) - START)))
    if [[ $left -lt 15 ]]; then
        say "$name skipped: the ${BUDGET}s budget is spent"
        printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$device" skipped 0 "" >>"$RUNS"
        return 0
    fi
    [[ $limit -le $left ]] || limit=$left
    local envs=()
    while [[ $1 != -- ]]; do
        envs+=("$1")
        shift
    done
    shift
    local summary=$OUT_DIR/$name.summary.json log=$OUT_DIR/$name.log
    rm -f "$summary"
    say "$name ($device): $*"
    local start rc=0
    start=$(date +%s)
    env "${envs[@]}" timeout --kill-after=10 "$limit" "$BIN" profile --no-tui --device "$device" \
        --summary "$summary" "$@" >"$log" 2>&1 </dev/null || rc=$?
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$device" "$rc" "$(($(date +%s) - start))" "${envs[*]}" >>"$RUNS"
    [[ $rc == 0 ]] || say "$name failed (exit $rc; 124 = timed out): see $log"
}

MLP=(--model "$ROOT/examples/mlp_mnist.toml" --data "$DATA/digits.ppk" --batch-size 32)
SMALL=(--model "$ROOT/examples/cnn.toml")
LARGE=(--model "$ROOT/examples/cnn_large.toml" --data "$DATA/shapes150" --workers 8)
T=(--trace-level stage)

# Row names say the role; the device column says where it ran (cpu for all with --cpu-only).
run mlp-cpu cpu 90 -- "${MLP[@]}" --steps "$(pick 1500 300)"
run mlp-gpu $GPU 150 -- "${MLP[@]}" --steps "$(pick 1500 300)" --check-advice --trace "$OUT_DIR/mlp-gpu.trace.json" "${T[@]}"
run mlp-gpu-sync-step $GPU 60 PIPEPROF_GPU_SYNC=step -- "${MLP[@]}" --steps "$(pick 1500 300)"
run decode-1worker $GPU 90 -- "${SMALL[@]}" --data "$DATA/photos" --workers 1 --steps "$(pick 30 6)"
run decode-auto $GPU 90 -- "${SMALL[@]}" --data "$DATA/photos" --workers auto --steps "$(pick 150 30)"
run cnn-large-cpu cpu 120 -- "${LARGE[@]}" --steps "$(pick 8 2)"
run cnn-large-gpu $GPU 90 -- "${LARGE[@]}" --steps "$(pick 200 2)" --trace "$OUT_DIR/cnn-large-gpu.trace.json" "${T[@]}"
run cnn-large-gpu-sync-step $GPU 60 PIPEPROF_GPU_SYNC=step -- "${LARGE[@]}" --steps "$(pick 200 2)"
run cnn-large-gpu-pinned $GPU 60 PIPEPROF_PINNED=1 -- "${LARGE[@]}" --steps "$(pick 200 2)"
run cnn-large-gpu-u8 $GPU 60 PIPEPROF_PINNED=u8 -- "${LARGE[@]}" --steps "$(pick 200 2)"
run cnn-large-gpu-sync-phase $GPU 60 PIPEPROF_GPU_SYNC=phase -- "${LARGE[@]}" --steps "$(pick 200 2)"
run io-throttled $GPU 60 -- "${SMALL[@]}" --data "$DATA/shapes150" --workers 4 --throttle-read 1MB/s --steps "$(pick 30 6)"
run gpu-unused cpu 60 -- "${SMALL[@]}" --data "$DATA/shapes150" --workers 4 --steps "$(pick 60 15)"
say "all runs done in $(($(date +%s) - START))s"

python3 - "$OUT_DIR" "$RUNS" <<'PY' | tee "$OUT_DIR/table.txt"
import json, os, sys

out, runs = sys.argv[1], sys.argv[2]

def name_of(v):
    # serde's enum encodings: "Io" or {"NotEnoughData": {...}}.
    if isinstance(v, dict):
        return next(iter(v), "?")
    return str(v)

def pct(x):
    return "-" if x is None else f"{100 * x:.0f}"

rows, notes, ips, h2ds, links = [], [], {}, {}, {}
for line in open(runs):
    name, device, rc, secs, envs = (line.rstrip("\n").split("\t") + [""] * 5)[:5]
    path = os.path.join(out, name + ".summary.json")
    if rc == "skipped":
        rows.append([name, device, "SKIPPED (time budget spent)"] + [""] * 6)
        continue
    if rc != "0" or not os.path.exists(path):
        rows.append([name, device, f"FAILED (exit {rc}{', timed out' if rc == '124' else ''}, {secs}s)"] + [""] * 6)
        continue
    s = json.load(open(path))
    sp = s.get("split") or {}
    stages = {st["stage"]: st for st in s.get("stages", [])}
    tr = stages.get("transfer")
    h2d = "-"
    if device != "cpu" and tr and tr.get("total_ms", 0) > 0 and tr.get("bytes", 0) > 0:
        h2ds[name] = tr["bytes"] / (tr["total_ms"] / 1e3) / 1e9
        h2d = f"{h2ds[name]:.2f}"
    m = s.get("machine") or {}
    devs = m.get("devices") or []
    gpu = "-"
    if devs:
        d = devs[0]
        util, idle = d.get("util_mean_pct"), d.get("util_idle_share")
        gpu = "-" if util is None else f"{util:.0f}% (idle {pct(idle)}%)"
        mem = d.get("process_mem_peak_bytes")
        link = ""
        if d.get("pcie_gen_max"):
            link = f" PCIe gen {d.get('pcie_gen_current_peak')}/{d['pcie_gen_max']} x{d.get('pcie_width_current_peak')}/{d.get('pcie_width_max')}"
            if d.get("pcie_link_max_bytes_per_s"):
                links[name] = d["pcie_link_max_bytes_per_s"] / 1e9
                link += f" = {links[name]:.1f} GB/s"
        notes.append(f"{name}: GPU {d.get('name')}: this process on it {d.get('this_process_on_gpu')}"
                     f" ({d.get('process_match')}), its memory peak "
                     f"{'-' if mem is None else f'{mem / 1e6:.0f} MB'};{link}")
    elif m.get("gpu_status"):
        gpu = "off"
    v = s.get("verdict") or {}
    flags = [name_of(f) for f in v.get("flags", [])]
    verdict = name_of(v.get("limiter", "-")) + (" [" + ", ".join(flags) + "]" if flags else "")
    split = f"{pct(sp.get('wait_share'))}/{pct(sp.get('transfer_share'))}/{pct(sp.get('compute_share'))}"
    ips[name] = s.get("images_per_s") or 0.0
    rows.append([name + (f" ({envs})" if envs else ""), device, f"{ips[name]:.0f}",
                 f"{sp.get('mean_step_ms', 0):.2f}", split, h2d, gpu, verdict, secs + "s"])
    if v.get("headline"):
        notes.append(f"{name}: {v['headline']}")

head = ["scenario", "device", "images/s", "step ms", "wait/xfer/compute %", "H2D GB/s", "GPU util", "verdict", "wall"]
widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
fmt = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
print(fmt(head))
print(fmt(["-" * w for w in widths]))
for r in rows:
    print(fmt(r))

def ratio(a, b, what):
    if ips.get(a) and ips.get(b):
        print(f"{what}: {ips[a] / ips[b]:.2f}× ({a} {ips[a]:.0f} vs {b} {ips[b]:.0f} images/s)")

print()
ratio("mlp-gpu", "mlp-cpu", "MLP, gpu row over cpu row")
ratio("cnn-large-gpu", "cnn-large-cpu", "42.5 M CNN, gpu row over cpu row")
ratio("decode-auto", "decode-1worker", "decode-bound, --workers auto over 1")
ratio("mlp-gpu", "mlp-gpu-sync-step", "MLP, device events per phase (default) over one sync per step (1 = free)")
ratio("cnn-large-gpu", "cnn-large-gpu-sync-step", "CNN, device events per phase (default) over one sync per step (1 = free; goal ≥ 0.98)")
ratio("cnn-large-gpu-sync-phase", "cnn-large-gpu-sync-step", "CNN, a sync per phase over one sync per step (1 = free)")
for n in ("cnn-large-gpu", "cnn-large-gpu-pinned", "cnn-large-gpu-u8", "cnn-large-gpu-sync-phase"):
    if n in h2ds:
        link = f" of the link's {links[n]:.1f} GB/s" if n in links else ""
        # The span's bytes are the f32 batch's: for u8 this is the f32-equivalent rate.
        print(f"host→device, {n}: {h2ds[n]:.2f} GB/s{link} (f32 batch bytes over the transfer span)")
print()
for n in notes:
    print(n)
PY

# --check-advice's table, from the log of the run that asked for it.
adv=$OUT_DIR/mlp-gpu.log
if [[ -f $adv ]] && grep -q "predicted" "$adv"; then
    echo
    echo "mlp-gpu --check-advice:"
    sed -n '/predicted/,$p' "$adv"
fi | tee -a "$OUT_DIR/table.txt"
