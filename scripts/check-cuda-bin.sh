#!/usr/bin/env bash
# Checks a CUDA build of pipeprof before it travels to the GPU machine:
#
#   scripts/check-cuda-bin.sh BIN
#
# - it asks the GPU machine's loader only for the CUDA libraries (by their CUDA 13 sonames) and
#   the C/C++ runtime, nothing else the machine may lack;
# - it links libcuda.so.1 (a CUDA build);
# - libjpeg-turbo is inside it (its error message is in the binary), unless
#   PIPEPROF_NO_LIBJPEG is set.
# scripts/build-cuda.sh runs it on gpu-bin/pipeprof; tests/build_cuda.rs runs it on small
# binaries made to pass and fail each check.
set -euo pipefail
CUDA_MAJOR=${CUDA_MAJOR:-13}

say() { printf 'check-cuda-bin: %s\n' "$*" >&2; }
die() {
    printf 'check-cuda-bin: error: %s\n' "$*" >&2
    exit 1
}

[[ $# -eq 1 ]] || die "usage: scripts/check-cuda-bin.sh BIN"
BIN=$1
[[ -f $BIN ]] || die "$BIN: no such file"
for tool in readelf strings objdump; do
    command -v "$tool" >/dev/null || die "'$tool' is not on PATH; install binutils and run again"
done
readelf -h "$BIN" >/dev/null 2>&1 || die "$BIN is not an ELF binary"

mapfile -t needed < <(readelf -d "$BIN" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p')
expected=(
    libcuda.so.1 "libcublas.so.$CUDA_MAJOR" "libcublasLt.so.$CUDA_MAJOR" libcurand.so.10
    "libcudart.so.$CUDA_MAJOR" "libnvrtc.so.$CUDA_MAJOR"
    libstdc++.so.6 libgcc_s.so.1 libm.so.6 libc.so.6 libdl.so.2 libpthread.so.0 librt.so.1 ld-linux-x86-64.so.2
)
unexpected=()
for lib in "${needed[@]}"; do
    ok=0
    for e in "${expected[@]}"; do [[ $lib == "$e" ]] && ok=1; done
    [[ $ok == 1 ]] || unexpected+=("$lib")
done
say "NEEDED: ${needed[*]}"
[[ ${#unexpected[@]} -eq 0 ]] || die "unexpected shared libraries: ${unexpected[*]} (the GPU machine may lack them)"
# (No `| grep -q` under pipefail: grep leaving at the first match kills the writer with SIGPIPE,
# and the pipeline then fails although the line was there.)
cuda=0
for lib in "${needed[@]}"; do [[ $lib == libcuda.so.1 ]] && cuda=1; done
[[ $cuda == 1 ]] || die "$BIN does not link libcuda.so.1: not a CUDA build?"
# libjpeg-turbo inside (its own error message is in the binary), and not as a shared library.
if [[ -z ${PIPEPROF_NO_LIBJPEG:-} ]]; then
    found=$(strings "$BIN" | grep -c 'Premature end of JPEG file' || true)
    [[ $found -gt 0 ]] || die "$BIN has no libjpeg-turbo in it: was libjpeg.a found? (trainer/build.rs warns when not)"
fi
glibc=$(objdump -T "$BIN" | sed -n 's/.*GLIBC_\([0-9.]*\).*/\1/p' | sort -V | tail -n1)
size=$(stat -c %s "$BIN")
say "ok: $BIN ($((size / 1000000)) MB, needs glibc >= ${glibc:-?})"
