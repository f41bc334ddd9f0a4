#!/usr/bin/env bash
# Builds pipeprof with candle's CUDA backend, on a machine with or without a GPU.
#
#   scripts/build-cuda.sh [--compute-cap N]     (default 90: H100/H200)
#
# Uses an installed CUDA 13.0 toolkit (NVCC, PATH, CUDA_HOME, /usr/local/cuda) when there is
# one; otherwise installs the pinned PyPI toolkit wheels into target/cuda-toolkit and links
# against stand-in libraries with the real sonames, so the binary loads the GPU machine's own
# libcuda/cuBLAS/cuRAND at run time. Output: gpu-bin/pipeprof (stripped, git-ignored).
# Safe to run again: each step is skipped when its result is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

# The GPU machine's driver 580 speaks CUDA 13.0: PTX from a newer nvcc is refused there, and a
# CUDA 12 build would ask for libcublas.so.12, which a CUDA 13 install does not have.
CUDA_MAJOR=13
CUDA_MINOR=0
WHEELS=(
    nvidia-cuda-nvcc==13.0.88
    nvidia-nvvm==13.0.88
    nvidia-cuda-crt==13.0.88
    nvidia-cuda-runtime==13.0.96
    nvidia-cuda-cccl==13.0.85
)
TOOLKIT=$ROOT/target/cuda-toolkit
STUBS=$TOOLKIT/stubs
TARGET_DIR=$ROOT/target/cuda
OUT_DIR=$ROOT/gpu-bin
CAP=90

say() { printf 'build-cuda: %s\n' "$*" >&2; }
die() {
    printf 'build-cuda: error: %s\n' "$*" >&2
    exit 1
}
usage() {
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
}

while [[ $# -gt 0 ]]; do
    case $1 in
    --compute-cap)
        [[ $# -ge 2 ]] || die "--compute-cap needs a value, e.g. --compute-cap 90"
        CAP=$2
        shift 2
        ;;
    --compute-cap=*)
        CAP=${1#*=}
        shift
        ;;
    -h | --help)
        usage
        exit 0
        ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[[ $CAP =~ ^[0-9]{2,3}$ ]] || die "--compute-cap '$CAP': give the capability without the dot, e.g. 90 for 9.0, 89 for 8.9"

for tool in cargo python3 gcc strip readelf; do
    command -v "$tool" >/dev/null || die "'$tool' is not on PATH; install it and run again"
done

# "release 13.0, V13.0.88" -> "13 0"
nvcc_version() {
    "$1" --version 2>/dev/null | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1 \2/p' | head -n1
}

# 1. nvcc: an installed toolkit of the right version, else the pinned wheels.
find_installed_nvcc() {
    local c
    for c in "${NVCC:-}" "$(command -v nvcc || true)" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" /usr/local/cuda/bin/nvcc; do
        [[ -n $c && -x $c ]] || continue
        local v
        v=$(nvcc_version "$c")
        if [[ $v == "$CUDA_MAJOR $CUDA_MINOR" ]]; then
            echo "$c"
            return 0
        fi
        say "ignoring $c: CUDA ${v/ /.} (this build needs $CUDA_MAJOR.$CUDA_MINOR for driver 580)"
    done
    return 1
}

MODE=
if NVCC_BIN=$(find_installed_nvcc); then
    MODE=installed
    CU=$(cd "$(dirname "$NVCC_BIN")/.." && pwd)
    say "using the installed toolkit at $CU"
    # The toolkit's own lib64 has cuBLAS/cuRAND/cudart; lib64/stubs has libcuda.so.
    LIB_DIRS=("$CU/lib64" "$CU/lib64/stubs" "$CU/targets/x86_64-linux/lib" "$CU/targets/x86_64-linux/lib/stubs")
else
    MODE=wheels
    CU=$TOOLKIT/nvidia/cu$CUDA_MAJOR
    marker=$TOOLKIT/.installed
    if [[ -f $marker && "$(cat "$marker")" == "${WHEELS[*]}" && -x $CU/bin/nvcc ]]; then
        say "toolkit wheels already in $TOOLKIT"
    else
        say "no CUDA $CUDA_MAJOR.$CUDA_MINOR toolkit installed: installing the pinned wheels into $TOOLKIT"
        rm -rf "$TOOLKIT"
        mkdir -p "$TOOLKIT"
        # --no-deps: the wheels' own dependencies are unpinned and would pull a newer CUDA.
        python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$TOOLKIT" "${WHEELS[@]}" ||
            die "pip could not install ${WHEELS[*]}; check network access to PyPI"
        echo "${WHEELS[*]}" >"$marker"
    fi
    NVCC_BIN=$CU/bin/nvcc
    [[ -x $NVCC_BIN ]] || die "$NVCC_BIN is missing after installing the wheels; remove $TOOLKIT and run again"
    v=$(nvcc_version "$NVCC_BIN")
    [[ $v == "$CUDA_MAJOR $CUDA_MINOR" ]] || die "$NVCC_BIN reports CUDA '${v/ /.}', expected $CUDA_MAJOR.$CUDA_MINOR"
    # The runtime wheel ships only libcudart.so.13; the linker looks for libcudart.so.
    [[ -e $CU/lib/libcudart.so ]] || ln -s "libcudart.so.$CUDA_MAJOR" "$CU/lib/libcudart.so"
    LIB_DIRS=("$CU/lib" "$STUBS")
fi

# 2. Link-time stand-ins (wheel mode only): shared objects with the real sonames that define
# the symbols the link asks for. They never travel: at run time the loader finds the real
# libraries by soname. The symbol lists grow from the linker's "undefined symbol" errors.
declare -A SONAME=(
    [cuda]=libcuda.so.1
    [cublas]=libcublas.so.$CUDA_MAJOR
    [cublasLt]=libcublasLt.so.$CUDA_MAJOR
    [curand]=libcurand.so.10
    [nvrtc]=libnvrtc.so.$CUDA_MAJOR
)
make_stubs() {
    mkdir -p "$STUBS"
    local lib
    for lib in "${!SONAME[@]}"; do
        local syms=$STUBS/$lib.syms so=$STUBS/lib$lib.so
        [[ -e $syms ]] || : >"$syms"
        if [[ -f $so && $so -nt $syms ]]; then continue; fi
        sort -u "$syms" | sed 's/.*/int &(void) { return 0; }/' >"$STUBS/$lib.c"
        gcc -shared -fPIC -Wl,-soname,"${SONAME[$lib]}" -o "$so" "$STUBS/$lib.c"
    done
}
# Which library a symbol belongs to, by the CUDA naming conventions.
stub_for() {
    case $1 in
    cublasLt*) echo cublasLt ;;
    cublas*) echo cublas ;;
    curand*) echo curand ;;
    nvrtc*) echo nvrtc ;;
    cu[A-Z]*) echo cuda ;; # driver API: cuInit, cuMemAlloc_v2, …
    *) return 1 ;;
    esac
}

export PATH=$(dirname "$NVCC_BIN"):$PATH
export CUDA_HOME=$CU
export NVCC=$NVCC_BIN
export CUDA_COMPUTE_CAP=$CAP
export CUDARC_CUDA_VERSION=$((CUDA_MAJOR * 1000 + CUDA_MINOR * 10))
export CUDAFORGE_THREADS=${CUDAFORGE_THREADS:-$(nproc)}
LIBRARY_PATH=$(
    IFS=:
    echo "${LIB_DIRS[*]}"
)${LIBRARY_PATH:+:$LIBRARY_PATH}
export LIBRARY_PATH

# The scaled JPEG decode (libjpeg-turbo) is linked in statically by trainer/build.rs, as in every other
# build: the GPU machine needs no libjpeg, and the build that most needs a fast loader has it.
# PIPEPROF_NO_LIBJPEG=1 still turns it off (the image crate decodes at full size).
if [[ ${PIPEPROF_NO_LIBJPEG:-0} == 0 ]]; then
    unset PIPEPROF_NO_LIBJPEG
    [[ -f /usr/include/jpeglib.h ]] || die "libjpeg-turbo's headers are missing (Debian: apt-get install libjpeg62-turbo-dev), or set PIPEPROF_NO_LIBJPEG=1 for the slower decoder"
fi

# 3. Build; in wheel mode, a failed link teaches the stubs their symbols and the link runs again
# (only the final link repeats: everything else is cached).
say "cargo build --release --features cuda (compute capability $CAP, CUDA $CUDA_MAJOR.$CUDA_MINOR) into $TARGET_DIR"
start=$(date +%s)
log=$TARGET_DIR/build-cuda.log
mkdir -p "$TARGET_DIR"
# lld stops at 20 errors per link, so a cold build may need several rounds.
for attempt in $(seq 1 30); do
    [[ $MODE == wheels ]] && make_stubs
    if cargo build --release --features cuda --target-dir "$TARGET_DIR" --bin pipeprof 2>&1 | tee "$log" >&2; then
        break
    fi
    [[ $MODE == wheels ]] || die "the build failed (log: $log)"
    # GNU ld: "undefined reference to `cuInit'"; lld: "undefined symbol: cuInit".
    missing=$(sed -n -e "s/.*undefined reference to \`\([A-Za-z0-9_]*\)'.*/\1/p" \
        -e 's/.*undefined symbol: \([A-Za-z0-9_]*\).*/\1/p' "$log" | sort -u)
    [[ -n $missing ]] || die "the build failed, and not for missing CUDA symbols (log: $log)"
    added=0
    for sym in $missing; do
        lib=$(stub_for "$sym") || die "undefined symbol '$sym' belongs to no CUDA library this script stubs (log: $log)"
        if ! grep -qx "$sym" "$STUBS/$lib.syms"; then
            echo "$sym" >>"$STUBS/$lib.syms"
            added=$((added + 1))
        fi
    done
    [[ $added -gt 0 ]] || die "the link still fails after stubbing its symbols (log: $log)"
    say "link attempt $attempt: $added symbols were missing; stubbing them and linking again"
done
[[ -x $TARGET_DIR/release/pipeprof ]] || die "no binary at $TARGET_DIR/release/pipeprof (log: $log)"
say "built in $(($(date +%s) - start)) s"

# 4. Strip into gpu-bin/, then check what it will ask the GPU machine's loader for, and that
# libjpeg-turbo is in it (scripts/check-cuda-bin.sh, tested without a GPU by tests/build_cuda.rs).
mkdir -p "$OUT_DIR"
strip -o "$OUT_DIR/pipeprof.tmp" "$TARGET_DIR/release/pipeprof"
mv -f "$OUT_DIR/pipeprof.tmp" "$OUT_DIR/pipeprof"
BIN=$OUT_DIR/pipeprof

CUDA_MAJOR=$CUDA_MAJOR bash "$ROOT/scripts/check-cuda-bin.sh" "$BIN"
say "ok: $BIN (compute capability $CAP)"
say "on the GPU machine: LD_LIBRARY_PATH=<site-packages>/nvidia/cu$CUDA_MAJOR/lib:/usr/local/cuda/lib64 $BIN --help"
