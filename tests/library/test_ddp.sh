#!/usr/bin/env bash
# tests/library/test_ddp.sh - ddp_check_replicas (common/ddp.h): equal
# replicas pass, and a replica that drifts, by as little as one unit in the
# last place, stops the job with a message naming exactly the ranks that
# differ (unit/test_ddp_replicas.c). Chapters 04-07 run it with
# --check_replicas N; their tests show that the replicas stay equal.
source "$(dirname "$0")/../lib.sh"

if ! make -C "$ROOT/tests" -s unit/test_ddp_replicas >"$TMP/build.log" 2>&1; then
    fail "ddp: build" "make -C tests failed: $(grep -m3 -E 'error|Error' "$TMP/build.log" | tr '\n' '|')"
    exit 1
fi
bin=$ROOT/tests/unit/test_ddp_replicas
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT COURSE_AGENT_STORE COURSE_JOB_TOKEN

# replicas NAME WANT-STATUS WANT-REGEX ARGS... : the job's status (0 or not)
# and a line of its output; rank 0 says "replicas equal at step S" after each
# check that passed.
replicas() {
    local name=$1 want=$2 regex=$3; shift 3
    run_capture 120 "$TMP/out" "$bin" "$@"
    local status=$?
    [[ ( $want == 0 && $status -eq 0 ) || ( $want != 0 && $status -ne 0 && $status -ne 124 ) ]] &&
       grep -Eq -- "$regex" "$TMP/out"
    verdict $? "$name" "status $status (wanted $( [[ $want == 0 ]] && echo 0 || echo 'not 0')), output lacks /$regex/: $(grep -v '^\[rank 0\]: replicas equal' "$TMP/out" | tail -n 3 | tr '\n' '|')"
}

for n in 1 2 4; do
    replicas "ddp: $n rank(s) with equal replicas pass 3 checks" 0 'replicas equal at step 3$' --nprocs $n
done
replicas "ddp: one ulp of drift on rank 2 is caught at the next check and rank 2 is named" 1 \
    'replicas diverged at step 2: the parameters of rank\(s\) 2 differ from rank 0' --nprocs 3 --drift 2
expect_output "ddp: the checks before the drift passed" "$TMP/out" 'replicas equal at step 1$'
! grep -q 'replicas equal at step 2' "$TMP/out"
verdict $? "ddp: the job stops at the check that fails" "rank 0 went on: $(grep 'equal at step' "$TMP/out" | tr '\n' '|')"
replicas "ddp: two drifting ranks of 4 are both named, and no other" 1 \
    'replicas diverged at step 3: the parameters of rank\(s\) 1, 3 differ from rank 0' --nprocs 4 --drift 1,3 --drift_step 3 --drift_by one
# Rank 0 is the reference: when it alone drifts, every other rank differs from it.
replicas "ddp: when rank 0 drifts, the others are named" 1 \
    'replicas diverged at step 2: the parameters of rank\(s\) 1, 2 differ from rank 0' --nprocs 3 --drift 0

# Parameters on the GPU: the check copies them to the host to hash, then
# all-gathers the hashes through the process group (nccl, one GPU per rank).
if has_gpu && [[ $(gpu_count) -ge 3 ]]; then
    replicas "ddp: on GPUs, equal replicas pass" 0 'replicas equal at step 3$' --nprocs 3 --device cuda
    replicas "ddp: on GPUs, one ulp of drift on rank 1 is caught" 1 \
        'replicas diverged at step 2: the parameters of rank\(s\) 1 differ' --nprocs 3 --device cuda --drift 1
else
    skip "ddp: the check with parameters on GPUs" "needs a GPU build with 3 GPUs (real, or make CUDA=emu)"
fi
no_leftovers "ddp: no process left behind" "tests/unit/test_ddp_replicas"
