#!/usr/bin/env bash
# tests/chapters/test_08_gpt_cuda.sh - chapter 08's GPU model (gpt_cuda.cu) against the CPU model (gpt.h).
#
# 1. unit/test_gpt_cuda: everywhere, the host-side pieces (parameter layout,
#    gradient buckets, memory plan, MFU arithmetic); with a GPU, every layer's
#    forward and backward, the whole model's loss, gradients, clipping and
#    AdamW step, the bucket callbacks, and bf16 training against fp32.
# 2. out of memory: a model far larger than the GPU stops with the size it
#    asked for, not a crash (GPU only).
# 3. compute-sanitizer memcheck over the parity checks on small shapes
#    (GPU and the tool needed).
source "$(dirname "$0")/../lib.sh"

if ! make -C "$ROOT/tests" -s >"$TMP/make_tests.log" 2>&1; then
    fail "gpt cuda tests build" "make -C tests failed: $(grep -m1 -i error "$TMP/make_tests.log")"
    exit 1
fi
bin="$ROOT/tests/unit/test_gpt_cuda"
if [[ ! -x "$bin" ]]; then
    fail "test_gpt_cuda" "not built (see make -C tests)"
    exit 1
fi

# run_unit NAME SECONDS ARGS...: the binary's PASS/FAIL/SKIP lines, plus a
# FAIL line if it died without saying why.
run_unit() {
    local name=$1 secs=$2; shift 2
    run_capture "$secs" "$TMP/$name.log" "$@"
    local status=$?
    grep -E '^(PASS|FAIL|SKIP|info:)' "$TMP/$name.log"
    if [[ $status -ne 0 ]] && ! grep -q '^FAIL ' "$TMP/$name.log"; then
        fail "$name" "exited with status $status: $(grep -v -E '^(PASS|SKIP|info:)' "$TMP/$name.log" | tail -n 3 | tr '\n' '|')"
    fi
}

run_unit test_gpt_cuda 300 "$bin"

cpu_only=false
grep -q 'CPU-only build' "$TMP/test_gpt_cuda.log" && cpu_only=true

if $cpu_only; then
    skip "gpt cuda out of memory" "this is a CPU-only build (CUDA=0 or no CUDA toolkit found)"
elif ! has_gpu; then
    skip "gpt cuda out of memory" "no GPU here (nvidia-smi lists none)"
else
    run_capture 60 "$TMP/oom.log" "$bin" --mode oom
    status=$?
    [[ $status -eq 1 ]] && grep -Eq 'needs [0-9.]+ GiB, the GPU has [0-9.]+ GiB free' "$TMP/oom.log"
    verdict $? "gpt cuda out of memory: one line with the size asked for" \
        "wanted exit 1 and 'needs X GiB, the GPU has Y GiB free'; got status $status: $(tail -n 2 "$TMP/oom.log" | tr '\n' '|')"
fi

# The benchmark's own code (make bench-gpt), at the tests' tiny size: on a
# GPU (real or emulated) it must time a step of each kind and print one
# well-formed row; the row's numbers mean something only on a real GPU.
if $cpu_only; then
    skip "gpt cuda bench mode runs" "this is a CPU-only build"
elif ! has_gpu; then
    skip "gpt cuda bench mode runs" "no GPU here (nvidia-smi lists none)"
else
    run_capture 300 "$TMP/bench.log" "$bin" --mode bench --config tiny --vocab_size 211 --batch_size 4 --steps 2 --warmup 1
    status=$?
    row=$(field --all "$TMP/bench.log" '^BENCH (.*)')
    [[ $status -eq 0 ]] && awk -F, '{ exit !(NF == 17 && $2 == "tiny" && $8 > 0 && $9 > 0) }' <<<"$row"
    verdict $? "gpt cuda bench mode runs and prints a row ($(cut -d, -f2-4,8 <<<"$row"))" "status $status: $(tail -n 2 "$TMP/bench.log" | tr '\n' '|')"
fi

sanitizer=$(command -v compute-sanitizer 2>/dev/null || true)
for candidate in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" /usr/local/cuda/bin/compute-sanitizer; do
    [[ -z "$sanitizer" && -x "$candidate" ]] && sanitizer=$candidate
done
if $cpu_only; then
    skip "gpt cuda compute-sanitizer memcheck" "this is a CPU-only build"
elif is_emu; then
    skip "gpt cuda compute-sanitizer memcheck" "compute-sanitizer needs a real GPU; the emulated GPU checks memory itself (tests/tools/test_emu.sh, make CUDA=emu ASAN=1)"
elif ! has_gpu; then
    skip "gpt cuda compute-sanitizer memcheck" "no GPU here (nvidia-smi lists none)"
elif [[ -z "$sanitizer" ]]; then
    skip "gpt cuda compute-sanitizer memcheck" "compute-sanitizer not found (it ships with the CUDA toolkit, in \$CUDA_HOME/bin)"
else
    run_capture 300 "$TMP/memcheck.log" "$sanitizer" --tool memcheck --error-exitcode 99 "$bin" --mode sanitize
    status=$?
    [[ $status -eq 0 ]] && grep -q 'ERROR SUMMARY: 0 errors' "$TMP/memcheck.log" &&
       grep -q '^PASS gpt cuda model gradients' "$TMP/memcheck.log" && ! grep -q '^FAIL ' "$TMP/memcheck.log"
    verdict $? "gpt cuda compute-sanitizer memcheck: no errors in the parity checks" \
        "status $status: $(grep -m3 -E 'ERROR SUMMARY|Invalid|^FAIL|error' "$TMP/memcheck.log" | tr '\n' '|')"
    # racecheck: shared-memory hazards (a missing __syncthreads) in the kernels.
    run_capture 600 "$TMP/racecheck.log" "$sanitizer" --tool racecheck --error-exitcode 99 "$bin" --mode sanitize
    status=$?
    [[ $status -eq 0 ]] && grep -q 'ERROR SUMMARY: 0 ' "$TMP/racecheck.log" && ! grep -q '^FAIL ' "$TMP/racecheck.log"
    verdict $? "gpt cuda compute-sanitizer racecheck: no shared-memory hazards" \
        "status $status: $(grep -m3 -E 'ERROR SUMMARY|hazard|^FAIL|error' "$TMP/racecheck.log" | tr '\n' '|')"
fi
exit 0
