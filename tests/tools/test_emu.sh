#!/usr/bin/env bash
# tests/tools/test_emu.sh - the emulated GPU catches what it claims to catch.
#
# Each program in tests/emu/ plants one GPU bug that a real GPU would
# usually forgive or report badly. Built against the emulated GPU
# (make CUDA=emu), each must fail with a clear message, and its --fixed
# version must pass. Elsewhere the file says why it cannot run.
source "$(dirname "$0")/../lib.sh"

if ! is_emu; then
    skip "emu: planted GPU bugs are caught" "this is not the emulated-GPU build (make CUDA=emu test runs them)"
    exit 0
fi
if ! make --no-print-directory -s -C "$ROOT/tests/emu" CUDA=emu ASAN="${ASAN:-}" >"$TMP/make.log" 2>&1; then
    fail "emu: the planted-bug programs build" "$(grep -m3 -E 'error|Error' "$TMP/make.log" | tr '\n' '|')"
    exit 1
fi

# planted NAME WHAT REGEX: ./planted_NAME must fail and print REGEX;
# ./planted_NAME --fixed must exit 0.
planted() {
    local name=$1 what=$2 regex=$3 bin="$ROOT/tests/emu/planted_$1"
    run_capture 60 "$TMP/$name.bug" "$bin"; local status=$?
    [[ $status -ne 0 && $status -ne 124 ]] && grep -Eq -- "$regex" "$TMP/$name.bug"
    verdict $? "emu: $what is caught" "status $status, wanted a failure saying /$regex/: $(tail -n 3 "$TMP/$name.bug" | tr '\n' '|')"
    run_capture 60 "$TMP/$name.fixed" "$bin" --fixed; status=$?
    [[ $status -eq 0 ]]; verdict $? "emu: $what, fixed, passes" "status $status: $(tail -n 3 "$TMP/$name.fixed" | tr '\n' '|')"
}

planted missing_syncthreads "a shared-memory reduction missing __syncthreads" 'block sum -?nan, expected 32896'
planted divergent_barrier "__syncthreads inside a branch only some threads take" \
    'thread 0 waits at __syncthreads \(planted_divergent_barrier.cu:[0-9]+\) but thread 32 has left the kernel'
planted out_of_bounds "an out-of-bounds write in a kernel" \
    'kernel fill wrote outside a 4000-byte device allocation|AddressSanitizer.*planted_out_of_bounds.cu'
planted host_reads_device "a host read of a device pointer" \
    'host code touched device memory at 0x[0-9a-f]+ \(byte 0 of a 128-byte cudaMalloc allocation\)'
planted stream_race "a kernel on a non-blocking stream, then a legacy-stream copy without an event" \
    '^4096 of 4096 values read before the kernel wrote them'
planted gemm_leading_dimension "a GEMM with a wrong leading dimension" \
    'cublasSgemm: matrix A \(3 x 4, leading dimension 4\): .* run 12 bytes past the end'
planted block_too_large "a block of 2048 threads" \
    'launch of square refused \(cudaErrorInvalidConfiguration\): 2048 threads per block'
planted mismatched_collectives "ranks calling mismatched collectives" \
    'collective #1 differs between ranks: rank 0 called ncclAllReduce\(count 1024, float32, sum\), rank 1 called ncclBroadcast\(count 512, float32, root 0\)'

# The emulated NCCL's own test: two to eight processes, every collective,
# type and operation, groups, non-blocking communicators, and faults, with
# a stand-in for the rest of the emulator (emu/tests/stub_stream.c).
nccl_test="$TMP/nccl_emu_test"
if gcc -std=c11 -D_GNU_SOURCE -O1 -Wall -Wextra -I "$ROOT/emu/include" -I "$ROOT/emu/src" \
       "$ROOT/emu/src/nccl.c" "$ROOT/emu/tests/stub_stream.c" "$ROOT/emu/tests/nccl_emu_test.c" \
       -o "$nccl_test" -pthread -lrt -lm >"$TMP/nccl_build.log" 2>&1; then
    run_capture 120 "$TMP/nccl.log" "$nccl_test" quick; status=$?
    [[ $status -eq 0 ]] && grep -Eq '[0-9]+ passed, 0 failed' "$TMP/nccl.log"
    verdict $? "emu: the emulated NCCL's own test ($(grep -Eo '[0-9]+ passed, 0 failed' "$TMP/nccl.log"))" \
        "status $status: $(grep -E '^FAIL' "$TMP/nccl.log" | head -3 | tr '\n' '|')"
else
    fail "emu: the emulated NCCL's own test builds" "$(grep -m3 -E 'error' "$TMP/nccl_build.log" | tr '\n' '|')"
fi
