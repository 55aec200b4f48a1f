#!/usr/bin/env bash
# tests/library/test_ddp_compress.sh - ddp.h's 16-bit communication hooks
# (--grad_compress bf16 and fp16, PyTorch's bf16_ and fp16_compress_hook):
# the average that comes back travelled in 16 bits (every value a number of
# that type), is the fp32 average within its rounding, is not simply the
# fp32 average, cost half the bytes, and is the same on every rank
# (unit/test_ddp_compress.c). With buckets of a few bytes, so that every
# bucket has to be rounded and sent.
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
    [[ $status -eq 0 && $oks -eq $((4 * n)) ]] && grep -q 'replicas equal after the [a-z0-9]* average' "$TMP/out"
}
# hook NAME ARGS... : the verdict of passes, with this build's program.
hook() { local name=$1; shift; passes "$bin" "$@"; verdict $? "$name" "$detail"; }
for h in bf16 fp16; do
    hook "ddp compress: 2 ranks, $h hook: $h values, within rounding of fp32, rounded, half the bytes, equal replicas" --nprocs 2 --hook $h
    hook "ddp compress: 3 ranks (a ring of 3), $h hook, the same" --nprocs 3 --hook $h
    if has_gpu && [[ $(gpu_count) -ge 2 ]]; then
        hook "ddp compress: gradients on 2 GPUs (nccl), $h hook, the same" --nprocs 2 --device cuda --hook $h
    else
        skip "ddp compress: gradients on GPUs, $h hook" "needs a GPU build with 2 GPUs (real, or make CUDA=emu)"
    fi
done
# Planted (tests/lib.sh, plant): the 16-bit buckets summed, not averaged.
planted=$(plant half_sum common/ddp.h 'pg_all_reduce(pg, wire + first, wire + first, n, wire_type, OP_AVG);' \
    'pg_all_reduce(pg, wire + first, wire + first, n, wire_type, OP_SUM);' tests unit/test_ddp_compress)
[[ -n $planted ]] && ! passes "$planted" --nprocs 2 --hook fp16 && grep -q '^rank 0: close FAILED' "$TMP/out"
verdict $? "planted: fp16 buckets summed instead of averaged fail 'within rounding of fp32' (close)" "$(planted_why half_sum)$detail"
no_leftovers "ddp compress: no process left behind" "tests/unit/test_ddp_compress"
