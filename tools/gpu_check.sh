#!/usr/bin/env bash
# tools/gpu_check.sh - `make gpu-check`: the whole course on a real GPU, in one command.
#
#   1. preflight: nvidia-smi must list a GPU, and a CUDA build of chapter 01
#      must compute on it - a GPU that nvidia-smi shows but CUDA cannot use
#      (a driver older than the toolkit, say) fails here, loudly;
#   2. every test, in a CUDA build (make CUDA=1 test): with a GPU present
#      the GPU cases run instead of being skipped - chapter 01's kernels,
#      02-07 on the GPU (nccl with one rank, host-staged cpu with several:
#      a machine with one GPU cannot run two NCCL ranks), the CUDA exercise,
#      08's layer-by-layer parity in fp32 and bf16, the 300-step bf16 vs
#      fp32 curves, DDP, compute-sanitizer memcheck and racecheck;
#   3. make bench-gpt: tokens/s, step split, MFU, memory;
#   4. one report, runs/gpu-check/report.md: device, driver, versions,
#      every test's result, the benchmark table.
# Exits non-zero if anything failed. Takes a few minutes on a 16-core
# machine with an H100 (the tests build every chapter first).
set -uo pipefail
cd "$(dirname "$0")/.."
out=runs/gpu-check
mkdir -p "$out"
report=$out/report.md
log() { echo "gpu-check: $*"; }

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "gpu-check: error: nvidia-smi lists no GPU here; make gpu-check needs a real GPU" >&2
    echo "gpu-check: (without one, make CUDA=emu test runs the GPU code on the emulated GPU)" >&2
    exit 2
fi

start=$(date +%s)
{
    echo "# make gpu-check, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo '```'
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv 2>&1
    command -v nvcc >/dev/null && nvcc --version | tail -n 2
    echo "host: $(uname -srm), $(nproc) cores"
    echo '```'
} >"$report"

# ---- 1. build, then prove CUDA computes here
log "building (make CUDA=1)"
if ! make CUDA=1 >"$out/build.log" 2>&1; then
    grep -E '^\[build\]' "$out/build.log" | tee -a "$report"
    echo "gpu-check: error: the CUDA build failed (see $out/build.log; NCCL_HOME and CUDA_HOME point the build at NCCL and CUDA)" >&2
    exit 1
fi
grep -E '^\[build\]' "$out/build.log" | sort -u >>"$report"
if ! 01_single_gpu/01_single_gpu --device cuda --epochs 1 >"$out/preflight.log" 2>&1; then
    echo "gpu-check: error: nvidia-smi lists a GPU, but the CUDA build cannot compute on it:" >&2
    tail -n 3 "$out/preflight.log" >&2
    echo "gpu-check: (a driver older than the CUDA toolkit is the usual cause: compare nvidia-smi's driver with nvcc --version)" >&2
    { echo; echo "**preflight failed:**"; echo '```'; tail -n 3 "$out/preflight.log"; echo '```'; } >>"$report"
    exit 1
fi
log "preflight: $(head -n 1 "$out/preflight.log")"

# ---- 2. every test, GPU cases included
log "running every test (make CUDA=1 test)"
make CUDA=1 test >"$out/tests.log" 2>&1
tests_status=$?
{
    echo
    echo "## Tests (make CUDA=1 test)"
    echo
    echo '```'
    sed -n '/^test_/p; /^skipped:/,$p' "$out/tests.log"
    echo '```'
    echo
    echo "GPU cases that ran:"
    echo
    grep -h -E '^PASS .*(GPU|gpu|cuda|nccl|staged|compute-sanitizer)' runs/test-logs/*.log | sed 's/^/- /'
} >>"$report"

# ---- 3. the benchmark
log "benchmark (make bench-gpt)"
make bench-gpt >"$out/bench.log" 2>&1
bench_status=$?
{ echo; echo "## make bench-gpt"; echo; echo '```'; cat "$out/bench.log" | grep -v '^\[build\]'; echo '```'; } >>"$report"

secs=$(( $(date +%s) - start ))
{ echo; echo "Took ${secs} s. Tests exit status $tests_status, benchmark exit status $bench_status."; } >>"$report"
log "report: $report ($secs s)"
tail -n 1 "$out/tests.log"
[[ $tests_status -eq 0 && $bench_status -eq 0 ]]
