#!/usr/bin/env bash
# tests/tools/test_emu.sh - the emulated GPU catches what it claims to catch.
#
# Each planted_X program in tests/emu/ plants one GPU bug that a real GPU
# would usually forgive or report badly. Built against the emulated GPU
# (make CUDA=emu), each must fail with a clear message, and its --fixed
# version must pass. The check_X programs, and the --fixed side of the
# bit-exact bf16 test, test what must hold on any GPU: they run on the
# emulated GPU and, in a CUDA build on a machine with a GPU (make
# gpu-check), on the real one. Elsewhere the file says why it cannot run.
source "$(dirname "$0")/../lib.sh"

if ! is_emu && ! { has_real_gpu && [[ $(build_mode) == cuda ]]; }; then
    skip "emu: planted GPU bugs are caught" "this is neither the emulated-GPU build (make CUDA=emu test runs them) nor a CUDA build with a GPU"
    exit 0
fi
cuda_mode=$(is_emu && echo emu || echo 1)
if ! make --no-print-directory -s -C "$ROOT/tests/emu" CUDA="$cuda_mode" ASAN="${ASAN:-}" >"$TMP/make.log" 2>&1; then
    fail "emu: the planted-bug programs build" "$(grep -m3 -E 'error|Error' "$TMP/make.log" | tr '\n' '|')"
    exit 1
fi

# must_pass NAME WHAT [ARGS...]: tests/emu/NAME ARGS must exit 0 (or say
# "SKIP: why", where this machine cannot run it).
must_pass() {
    local name=$1 what=$2 status
    shift 2
    run_capture 60 "$TMP/$name.ok" "$ROOT/tests/emu/$name" "$@"; status=$?
    if [[ $status -eq 0 ]] && grep -q '^SKIP: ' "$TMP/$name.ok"; then
        skip "emu: $what" "$(sed -n 's/^SKIP: //p' "$TMP/$name.ok")"
        return
    fi
    [[ $status -eq 0 ]]; verdict $? "emu: $what" "status $status: $(tail -n 3 "$TMP/$name.ok" | tr '\n' '|')"
}

# What holds on every GPU, the emulated one and a real one.
must_pass planted_bf16_truncation "bf16 conversion rounds to nearest even, bit for bit (ties, NaN, overflow, subnormals)" --fixed
must_pass check_syncthreads_count "__syncthreads_count, __syncthreads_and and __syncthreads_or"
must_pass check_graphs "CUDA graphs: capture, instantiate, launch, update (and a refused update)"
must_pass check_launch_kernel "cudaLaunchKernel given only a template kernel's address"
must_pass check_nccl_threads "one process, two GPUs: grouped ncclCommInitRank, a PreMulSum all-reduce, ncclBcast"
if ! is_emu; then
    skip "emu: planted GPU bugs are caught" "they test the emulated GPU (make CUDA=emu test); this is a real GPU"
    exit 0
fi

# planted NAME WHAT REGEX [VAR=VALUE...]: with the emulator settings given
# (each case names the schedule and order it needs, whatever the caller's
# environment says), ./planted_NAME must fail and print REGEX, and
# ./planted_NAME --fixed must exit 0.
planted() {
    local name=$1 what=$2 regex=$3 bin="$ROOT/tests/emu/planted_$1" status
    shift 3
    local settings=(EMU_SCHEDULE=lazy EMU_ORDER=forward EMU_RACECHECK=1 "$@")
    run_capture 60 "$TMP/$name.bug" env "${settings[@]}" "$bin"; status=$?
    [[ $status -ne 0 && $status -ne 124 ]] && grep -Eq -- "$regex" "$TMP/$name.bug"
    verdict $? "emu: $what is caught" "status $status, wanted a failure saying /$regex/: $(tail -n 3 "$TMP/$name.bug" | tr '\n' '|')"
    run_capture 60 "$TMP/$name.fixed" env "${settings[@]}" "$bin" --fixed; status=$?
    [[ $status -eq 0 ]]; verdict $? "emu: $what, fixed, passes" "status $status: $(tail -n 3 "$TMP/$name.fixed" | tr '\n' '|')"
}

# raced NAME WHAT REGEX [VAR=VALUE...]: planted, for what only the race
# checker finds, which ASan builds go without (their instrumentation and
# the checker's do not mix).
raced() {
    if [[ ${ASAN:-} == 1 ]]; then
        skip "emu: $2 is caught" "the race checker is off in ASan builds (make CUDA=emu test runs it)"
        return
    fi
    planted "$@"
}

# Races, found by the race checker (emu/src/race.c) in every order.
raced missing_syncthreads "a shared-memory reduction missing __syncthreads (a race in shared memory)" \
    'data race: kernel block_sum \(launched at planted_missing_syncthreads.cu:[0-9]+\), block \(0,0,0\) thread \(1,0,0\), writes 4 bytes at byte 4 of the block.s __shared__ memory.*; block \(0,0,0\) thread \(0,0,0\) read it with no __syncthreads between them'
raced missing_syncthreads "a missing __syncthreads, in reverse order" \
    'data race: kernel block_sum .* of the block.s __shared__ memory.* with no __syncthreads between them' EMU_ORDER=reverse
raced race_same_block "+= where atomicAdd belongs, in one block (a race in global memory)" \
    'data race: kernel histogram \(launched at planted_race_same_block.cu:[0-9]+\), block \(0,0,0\) thread \(8,0,0\), reads 4 bytes at byte 0 of a 32-byte cudaMalloc allocation at 0x[0-9a-f]+.*; block \(0,0,0\) thread \(0,0,0\) wrote it with no __syncthreads between them'
raced race_blocks "+= where atomicAdd belongs, across blocks" \
    'data race: kernel total_sum .*, block \(1,0,0\) thread \(0,0,0\), reads 4 bytes at byte 0 of a 4-byte cudaMalloc allocation.*; block \(0,0,0\) thread \(0,0,0\) wrote it in another block'
raced race_blocks "+= across blocks, blocks shuffled" \
    'data race: kernel total_sum .* in another block' EMU_ORDER=shuffled:7
for schedule in lazy eager random:1 random:2; do
    raced wrong_stream_collective "an all-reduce on the legacy stream, its input made on another (EMU_SCHEDULE=$schedule)" \
        'data race: (ncclAllReduce on the legacy stream of device [01] .* bytes at byte 0 of a 4096-byte cudaMalloc allocation.*; kernel gradients \(launched at planted_wrong_stream_collective.cu:[0-9]+\) on stream 1 \(non-blocking\)|kernel gradients .* of a 4096-byte cudaMalloc allocation.*; ncclAllReduce on the legacy stream of device [01]) .* and nothing orders the two operations' \
        EMU_SCHEDULE=$schedule
done

# What the schedules and orders show when the race checker is off (as in ASan builds).
planted reader_below_writer "a missing __syncthreads whose reader runs before its writer (EMU_ORDER=reverse)" \
    '^63 of 63 neighbours wrong' EMU_RACECHECK=0 EMU_ORDER=reverse
planted fill_after_copy "pinned memory filled after its copy was queued (EMU_SCHEDULE=eager)" \
    '^1024 of 1024 values copied before the host wrote them' EMU_SCHEDULE=eager
# (random runs the copy at once with about one seed in four; 6 is one of them)
planted fill_after_copy "pinned memory filled after its copy was queued (EMU_SCHEDULE=random)" \
    'values copied before the host wrote them' EMU_SCHEDULE=random:6
planted stream_race "a kernel on a non-blocking stream, then a legacy-stream copy without an event" \
    '^4096 of 4096 values read before the kernel wrote them'

# What else a GPU enforces.
planted divergent_barrier "__syncthreads inside a branch only some threads take" \
    'thread 0 waits at __syncthreads \(planted_divergent_barrier.cu:[0-9]+\) but thread 32 has left the kernel' \
    EMU_RACECHECK=0 # (its threads also race, which the race checker would report first)
planted divergent_shuffle "a shuffle in two branches (a divergent warp operation)" \
    'the lanes of warp 0 meet at two different warp operations: thread 0 at __shfl_xor_sync \(planted_divergent_shuffle.cu:[0-9]+\), thread 1 at __shfl_xor_sync \(planted_divergent_shuffle.cu:[0-9]+\)'
planted launch_bounds "a launch over the kernel's __launch_bounds__" \
    'launch of square refused \(cudaErrorLaunchOutOfResources\): 256 threads per block, above the 128 of its __launch_bounds__'
raced misaligned_vector "a float4 load from an address not a multiple of 16" \
    'misaligned access: kernel copy4 .* reads 16 bytes at 0x[0-9a-f]+, which is not a multiple of 16'
planted kernel_reads_host "a kernel given a pointer to host memory" \
    'kernel scale, launched at planted_kernel_reads_host.cu:[0-9]+: argument 1 is a pointer to host memory'
planted sync_in_capture "a cudaStreamSynchronize inside a stream capture" \
    'stream capture invalidated: cudaStreamSynchronize of a stream that is being captured'
planted bf16_truncation "bf16 by truncation instead of rounding" \
    'truncation\(0x3F818000\) gave 0x3F81, round-to-nearest-even is 0x3F82'
planted out_of_bounds "an out-of-bounds write in a kernel" \
    'kernel fill wrote outside a 4000-byte device allocation|AddressSanitizer.*planted_out_of_bounds.cu'
planted host_reads_device "a host read of a device pointer" \
    'host code touched device memory at 0x[0-9a-f]+ \(byte 0 of a 128-byte cudaMalloc allocation\)'
planted gemm_leading_dimension "a GEMM with a wrong leading dimension" \
    'cublasSgemm: matrix A \(3 x 4, leading dimension 4\): .* run 12 bytes past the end'
planted block_too_large "a block of 2048 threads" \
    'launch of square refused \(cudaErrorInvalidConfiguration\): 2048 threads per block'
planted mismatched_collectives "ranks calling mismatched collectives" \
    'collective #1 differs between ranks: rank 0 called ncclAllReduce\(count 1024, float32, sum\), rank 1 called ncclBroadcast\(count 512, float32, root 0\)'

# A bad setting is a one-line error naming it.
run_capture 30 "$TMP/bad_schedule.log" env EMU_SCHEDULE=sometimes "$ROOT/tests/emu/check_syncthreads_count"; status=$?
[[ $status -ne 0 ]] && grep -q 'EMU_SCHEDULE=sometimes: expected lazy, eager, random or random:SEED' "$TMP/bad_schedule.log"
verdict $? "emu: a bad EMU_SCHEDULE is named" "status $status: $(tail -n 2 "$TMP/bad_schedule.log" | tr '\n' '|')"

# The emulated NCCL's own test: two to eight processes, every collective,
# type and operation, groups, non-blocking communicators, and faults, with
# a stand-in for the rest of the emulator (tests/emu/stub_stream.c). (The
# split, nccl_split.c, is built on the public calls, the stub's too few.)
nccl_test="$TMP/nccl_emu_test"
nccl_sources=$(ls "$ROOT"/emu/src/nccl_*.c | grep -v '/nccl_split\.c$')
# shellcheck disable=SC2086 # one word per file
if gcc -std=c11 -D_GNU_SOURCE -O1 -Wall -Wextra -I "$ROOT/emu/include" -I "$ROOT/emu/src" \
       $nccl_sources "$ROOT/tests/emu/stub_stream.c" "$ROOT/tests/emu/nccl_emu_test.c" \
       -o "$nccl_test" -pthread -lrt -lm >"$TMP/nccl_build.log" 2>&1; then
    run_capture 120 "$TMP/nccl.log" "$nccl_test" quick; status=$?
    [[ $status -eq 0 ]] && grep -Eq '[0-9]+ passed, 0 failed' "$TMP/nccl.log"
    verdict $? "emu: the emulated NCCL's own test ($(grep -Eo '[0-9]+ passed, 0 failed' "$TMP/nccl.log"))" \
        "status $status: $(grep -E '^FAIL' "$TMP/nccl.log" | head -3 | tr '\n' '|')"
else
    fail "emu: the emulated NCCL's own test builds" "$(grep -m3 -E 'error' "$TMP/nccl_build.log" | tr '\n' '|')"
fi
