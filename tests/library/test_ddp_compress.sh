#!/usr/bin/env bash
# tests/library/test_ddp_compress.sh - ddp.h's bf16 communication hook
# (--grad_compress bf16, PyTorch's bf16_compress_hook): the average that
# comes back travelled as bf16 (every value a bf16 number), is the fp32
# average within bf16's rounding, is not simply the fp32 average, cost half
# the bytes, and is the same on every rank (unit/test_ddp_compress.c). With
# buckets of a few bytes, so that every bucket has to be rounded and sent.
source "$(dirname "$0")/../lib.sh"

if ! make -C "$ROOT/tests" -s unit/test_ddp_compress >"$TMP/build.log" 2>&1; then
    fail "ddp compress: build" "make -C tests failed: $(grep -m3 -E 'error|Error' "$TMP/build.log" | tr '\n' '|')"
    exit 1
fi
bin=$ROOT/tests/unit/test_ddp_compress
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT COURSE_AGENT_STORE COURSE_JOB_TOKEN

# passes BIN ARGS... : every rank's four checks pass and the replicas are equal.
passes() {
    local bin=$1; shift
    COURSE_DDP_BUCKET_BYTES=400 run_capture 120 "$TMP/out" "$bin" "$@"
    local status=$? n=${2:-2}
    local oks; oks=$(grep -c '^rank [0-9]*: [a-z0-9]* ok$' "$TMP/out")
    detail="status $status, $oks of $((4 * n)) checks ok: $(grep -E 'FAILED|error' "$TMP/out" | head -n 3 | tr '\n' '|')"
    [[ $status -eq 0 && $oks -eq $((4 * n)) ]] && grep -q 'replicas equal after the bf16 average' "$TMP/out"
}
# hook NAME ARGS... : the verdict of passes, with this build's program.
hook() { local name=$1; shift; passes "$bin" "$@"; verdict $? "$name" "$detail"; }
hook "ddp compress: 2 ranks, bf16 hook: bf16 values, within rounding of fp32, rounded, half the bytes, equal replicas" --nprocs 2
hook "ddp compress: 3 ranks (a ring of 3), the same" --nprocs 3
if has_gpu && [[ $(gpu_count) -ge 2 ]]; then
    hook "ddp compress: gradients on 2 GPUs (nccl), the same" --nprocs 2 --device cuda
else
    skip "ddp compress: gradients on GPUs" "needs a GPU build with 2 GPUs (real, or make CUDA=emu)"
fi
# Planted (tests/lib.sh, plant): the bf16 buckets summed, not averaged.
planted=$(plant bf16_sum common/ddp.h 'pg_all_reduce(pg, wire + first, wire + first, n, DTYPE_BF16, OP_AVG);' \
    'pg_all_reduce(pg, wire + first, wire + first, n, DTYPE_BF16, OP_SUM);' tests unit/test_ddp_compress)
[[ -n $planted ]] && ! passes "$planted" --nprocs 2 && grep -q '^rank 0: close FAILED' "$TMP/out"
verdict $? "planted: bf16 buckets summed instead of averaged fail 'within rounding of fp32' (close)" "$(planted_why bf16_sum)$detail"
no_leftovers "ddp compress: no process left behind" "tests/unit/test_ddp_compress"
