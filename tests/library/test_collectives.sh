#!/usr/bin/env bash
# tests/library/test_collectives.sh - every collective of the process group
# (common/pg.h) against a locally computed reference, on world sizes 1-5:
# all dtypes and ops, counts 0 to 1048577, in place and out of place, other
# roots than 0, and identical bits on every rank (see unit/test_collectives.c).
# Then the same with single copy (COURSE_SINGLE_COPY=1), over TCP only
# (COURSE_SHM=0), the nccl backend and GPU
# staging where a GPU is present, and the error for nccl without one GPU per rank.
source "$(dirname "$0")/../lib.sh"

if ! make -C "$ROOT/tests" -s unit/test_collectives unit/test_p2p >"$TMP/build.log" 2>&1; then
    fail "collectives: build" "make -C tests failed: $(grep -m3 -E 'error|Error' "$TMP/build.log" | tr '\n' '|')"
    exit 1
fi
BIN=$ROOT/tests/unit/test_collectives
# On every rank's command line, so that the leftover check below finds only
# this run's processes (another run of the suite may be going on).
TAG=--tag=pg-test-$$-run
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT COURSE_AGENT_STORE \
      COURSE_JOB_TOKEN COURSE_SHM COURSE_SINGLE_COPY

# run_suite NAME SECONDS ARGS...: the unit test prints its own PASS/FAIL
# lines; a crash or a hang must not go unreported.
run_suite() {
    local name=$1 secs=$2; shift 2
    run_capture "$secs" "$TMP/$name.log" "$@"
    local status=$?
    grep -E '^(PASS|FAIL|SKIP) ' "$TMP/$name.log"
    if [[ $status -ne 0 ]] && ! grep -q '^FAIL ' "$TMP/$name.log"; then
        fail "collectives: $name" "exit status $status$( [[ $status -eq 124 ]] && echo ' (timed out)'): $(grep -v '^PASS' "$TMP/$name.log" | tail -n 4 | tr '\n' '|')"
    fi
}

# the_end: no rank and no shared memory left behind (the last checks).
the_end() {
    no_leftovers "collectives: no rank left running" "${TAG#--tag=}"
    no_shm_left "collectives: no shared memory left behind"
}

if has_gpu; then
    run_suite nccl 300 "$BIN" "$TAG" --worlds 1 --backend nccl --device cuda --label "nccl: "
    run_suite staged 300 "$BIN" "$TAG" --worlds 4 --backend cpu --device cuda --big=false --label "gpu staged: "
    expect_output "collectives: 4 ranks on the GPUs with the cpu backend say they stage" \
        "$TMP/staged.log" 'cpu \(.*(staged through host memory)'
else
    skip "collectives: nccl backend, one rank" "no GPU here (nvidia-smi lists none)"
    skip "collectives: cpu backend on GPU buffers, 4 ranks staged through host memory" "no GPU here"
fi

# Asking for nccl where it cannot run is one clear error, not a hang or a crash.
run_capture 60 "$TMP/nccl_refused.log" "$ROOT/tests/unit/test_p2p" "$TAG" --mode reinit -n 2 \
    --backend nccl --device cpu
status=$?
[[ $status -ne 0 && $status -ne 124 ]] &&
   grep -Eq 'backend nccl cannot run here: .*one rank per GPU; use --backend cpu' "$TMP/nccl_refused.log"
verdict $? "collectives: --backend nccl without one GPU per rank is a clear error" \
    "exit status $status: $(tail -n 3 "$TMP/nccl_refused.log" | tr '\n' '|')"

# The rest runs on CPU ranks (tests/lib.sh, cpu_paths): the cpu backend's transports.
cpu_paths "collectives" || { the_end; exit 0; }

# Shared memory between the ranks of this host (the default).
run_suite shm 400 "$BIN" "$TAG" --worlds 1,2,3,4,5
# Large payloads read straight from the sender's memory (off by default).
COURSE_SINGLE_COPY=1 run_suite single 300 "$BIN" "$TAG" --worlds 2,3 --label "single copy: "
# TCP sockets only, as between hosts.
COURSE_SHM=0 run_suite tcp 300 "$BIN" "$TAG" --worlds 2,3,5 --label "tcp: "
grep -q '# world 2: cpu (TCP sockets' "$TMP/tcp.log"
verdict $? "collectives: COURSE_SHM=0 runs over TCP" "pg_describe said: $(grep -m1 '^# world 2' "$TMP/tcp.log")"

the_end
