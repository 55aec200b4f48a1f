#!/usr/bin/env bash
# tests/library/test_p2p.sh - point-to-point messages of the process group
# (common/pg.h), teardown and re-creation, and failures: a rank killed in
# the middle of a collective, a rank that never shows up, ranks that call
# different collectives. Each must end the job quickly with a message that
# names the rank and the operation (see unit/test_p2p.c).
source "$(dirname "$0")/../lib.sh"

if ! make -C "$ROOT/tests" -s unit/test_p2p >"$TMP/build.log" 2>&1; then
    fail "p2p: build" "make -C tests failed: $(grep -m3 -E 'error|Error' "$TMP/build.log" | tr '\n' '|')"
    exit 1
fi
BIN=$ROOT/tests/unit/test_p2p
# On every rank's command line, so that the leftover check below finds only
# this run's processes (another run of the suite may be going on).
TAG=--tag=pg-test-$$-run
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT COURSE_AGENT_STORE \
      COURSE_JOB_TOKEN COURSE_SHM COURSE_SINGLE_COPY COURSE_BIND

# run_cases NAME PREFIX ARGS...: the unit test's own PASS/FAIL lines, with
# PREFIX in their names; a crash or hang without a FAIL line is reported.
run_cases() {
    local name=$1 prefix=$2; shift 2
    run_capture 120 "$TMP/$name.log" "$BIN" "$TAG" "$@"
    local status=$?
    grep -E '^(PASS|FAIL|SKIP) ' "$TMP/$name.log" | sed "s/^\(PASS\|FAIL\|SKIP\) p2p: /\1 p2p$prefix: /"
    if [[ $status -ne 0 ]] && ! grep -q '^FAIL ' "$TMP/$name.log"; then
        fail "p2p$prefix: $name" "exit status $status: $(grep -v '^PASS' "$TMP/$name.log" | tail -n 4 | tr '\n' '|')"
    fi
}

run_cases basic "" --mode basic -n 3
COURSE_SHM=0 run_cases basic_tcp " (tcp)" --mode basic -n 2
COURSE_SINGLE_COPY=1 run_cases basic_single " (single copy)" --mode basic -n 2
run_cases reinit "" --mode reinit -n 3
COURSE_SHM=0 run_cases reinit_tcp " (tcp)" --mode reinit -n 2
# Binding to cores: as many ranks as this machine has cores (shares), one
# more (free), and shares turned off.
cores=$(nproc)
run_cases bind " ($cores ranks on $cores cores)" --mode bind -n "$cores"
run_cases bind_more " ($((cores + 1)) ranks on $cores cores)" --mode bind -n $((cores + 1))
COURSE_BIND=0 run_cases bind_off " (COURSE_BIND=0)" --mode bind -n "$cores"

# expect_failure NAME MAX_SECONDS REGEX ARGS...: the job must fail (not
# hang), within MAX_SECONDS, with a message matching REGEX.
expect_failure() {
    local name=$1 max=$2 want=$3; shift 3
    local start=$SECONDS
    run_capture 90 "$TMP/fail.log" "$BIN" "$TAG" "$@"
    local status=$? took=$((SECONDS - start)) why=""
    if [[ $status -eq 0 || $status -eq 124 ]]; then why="exit status $status (expected a failure): $(tail -n 3 "$TMP/fail.log" | tr '\n' '|')"
    elif [[ $took -gt $max ]]; then why="took ${took}s, more than ${max}s to notice"
    elif ! grep -Eq -- "$want" "$TMP/fail.log"; then why="no line matches /$want/: $(grep -v '^#' "$TMP/fail.log" | tail -n 4 | tr '\n' '|')"
    fi
    [[ -z "$why" ]]; verdict $? "$name" "$why"
}

# A long grace period: the survivors ignore spawn's SIGTERM, so only their
# own detection of the dead peer can end them before the SIGKILL 30 s later.
export COURSE_KILL_GRACE=30
# (A survivor notices the dead rank by its socket closing, or, when it was
# reading the dead rank's buffer straight from its memory - the large
# messages' single copy - by that read failing: either names rank 1.)
expect_failure "p2p: a rank killed mid all_reduce (shared memory) stops the others in seconds" 10 \
    'rank 1 closed the connection during all_reduce|from rank 1.s memory during all_reduce failed: No such process' --mode kill -n 3
grep -Eq 'spawn: rank [0-9]+ (exited with status|killed by signal)' "$TMP/fail.log"
verdict $? "p2p: spawn reports the failed rank" "$(grep spawn "$TMP/fail.log" | head -2 | tr '\n' '|')"
COURSE_SHM=0 expect_failure "p2p: a rank killed mid all_reduce (tcp) stops the others in seconds" 10 \
    'rank 1 closed the connection during all_reduce' --mode kill -n 3
export COURSE_KILL_GRACE=2
COURSE_TIMEOUT=2 expect_failure "p2p: a missing rank ends in a timeout naming the op and the rank" 20 \
    'timed out after 2 s in all_reduce: .* from rank [0-9]+' --mode stall -n 3
expect_failure "p2p: ranks in different collectives get a clear error" 20 \
    'rank 0 sent data for broadcast while this rank is in all_reduce' --mode mismatch -n 2

if has_gpu; then
    run_cases nccl " (nccl)" --mode nccl -n 1 --backend nccl --device cuda
else
    skip "p2p: nccl backend, one rank" "no GPU here (nvidia-smi lists none)"
fi

# Planted (tests/lib.sh, plant): a shared-memory record whose stamp does not
# say which lap of the ring wrote it. A reader that reaches a place the
# writer has not written in this lap yet takes the record left there by the
# lap before for a new one: the basic cases, whose 2 and 64 MiB go around
# the ring, must fail.
planted=$(plant stale_record common/pg_cpu_stream.h 'return (uint32_t)(pos / CPU_RECORD_WORD) + 1;' 'return 1;' \
    tests unit/test_p2p)
status=none
[[ -n $planted ]] && { run_capture 60 "$TMP/planted.log" "$planted" "$TAG" --mode basic -n 2; status=$?; }
[[ -n $planted && $status -ne 0 ]]
verdict $? "planted: records stamped without their lap fail the basic cases (exit $status: $(grep -m1 -E '^FAIL|error|not a message' "$TMP/planted.log" 2>/dev/null | cut -c1-120))" \
    "$(planted_why stale_record)the planted copy passed: $(tail -n 2 "$TMP/planted.log" 2>/dev/null | tr '\n' '|')"

no_leftovers "p2p: no rank left running" "${TAG#--tag=}"
no_shm_left "p2p: no shared memory left behind, even after kill -9"
