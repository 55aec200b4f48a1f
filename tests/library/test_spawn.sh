#!/usr/bin/env bash
# tests/library/test_spawn.sh - spawn() (common/spawn.h): a job of forked ranks that
# meet through the parent's store; a failing or killed rank stops the others
# with a message naming it; Ctrl-C, SIGTERM or SIGKILL to the parent leaves no
# process behind.
source "$(dirname "$0")/../lib.sh"

if ! make -C "$ROOT/tests" -s unit/test_spawn_job >"$TMP/build.log" 2>&1; then
    fail spawn_build "make -C tests failed: $(grep -m3 -E 'error|Error' "$TMP/build.log" | tr '\n' '|')"
    exit 1
fi
JOB=$ROOT/tests/unit/test_spawn_job
unset RANK WORLD_SIZE MASTER_ADDR MASTER_PORT COURSE_AGENT_STORE COURSE_JOB_TOKEN \
      TORCHELASTIC_RESTART_COUNT LOCAL_RANK LOCAL_WORLD_SIZE
export COURSE_KILL_GRACE=1
# A failing or killed rank is noticed in ~0.1 s and the others are stopped
# within the 1 s grace: each case gets a deadline of seconds, so that a
# broken spawn fails each case quickly instead of waiting on ranks that
# wait forever.
LIMIT=10

# ------------------------------------------------------------------ all ranks succeed
run_capture $LIMIT "$TMP/ok.log" "$JOB" --mode ok --nprocs 3
status=$?
sums=$(grep -c 'of 3: sum 6$' "$TMP/ok.log")
[[ $status -eq 0 && $sums -eq 3 ]]; verdict $? spawn_all_ok "exit status $status, $sums of 3 ranks reported sum 6: $(tail -n 3 "$TMP/ok.log" | tr '\n' '|')"

# ------------------------------------------------------------------ one rank exits 3
run_capture $LIMIT "$TMP/fail.log" "$JOB" --mode fail --nprocs 3
status=$?
[[ $status -ne 0 && $status -ne 124 ]]; verdict $? spawn_failure_is_nonzero "exit status $status"
expect_output spawn_failure_names_rank "$TMP/fail.log" "rank 1 exited with status 3"
no_leftovers spawn_failure_stops_others "test_spawn_job --mode fail"

# ------------------------------------------------------------------ one rank killed by SIGKILL
run_capture $LIMIT "$TMP/kill.log" "$JOB" --mode kill --nprocs 3
status=$?
[[ $status -ne 0 && $status -ne 124 ]]; verdict $? spawn_killed_rank_is_nonzero "exit status $status"
expect_output spawn_killed_rank_names_signal "$TMP/kill.log" "rank 2 killed by signal SIGKILL"
no_leftovers spawn_kill_stops_others "test_spawn_job --mode kill"

# ------------------------------------------------------------------ ranks that ignore SIGTERM
run_capture $LIMIT "$TMP/stubborn.log" "$JOB" --mode stubborn --nprocs 3
status=$?
[[ $status -ne 0 && $status -ne 124 ]]; verdict $? spawn_sigkill_after_grace "exit status $status: $(tail -n 3 "$TMP/stubborn.log" | tr '\n' '|')"
expect_output spawn_sigkill_reported "$TMP/stubborn.log" "still running 1 s after being told to stop; sending SIGKILL"
no_leftovers spawn_stubborn_no_leftovers "test_spawn_job --mode stubborn"

# ------------------------------------------------------------------ signals to the parent
# signal_parent NAME SIGNAL : start a hanging job, wait until every rank is up,
# signal the parent alone, and check that nothing is left.
signal_parent() {
    local name=$1 sig=$2 log=$TMP/$1.log
    : >"$log"
    "$JOB" --mode hang --nprocs 3 >"$log" 2>&1 &
    local parent=$!
    for i in $(seq 100); do
        [[ $(grep -c 'sum 6$' "$log") -eq 3 ]] && break
        sleep 0.1
    done
    kill -"$sig" "$parent"
    for i in $(seq 50); do kill -0 "$parent" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$parent" 2>/dev/null; then
        fail "${name}_parent_exits" "the parent still runs 5 s after SIG$sig"
        kill -KILL "$parent"
    else
        wait "$parent" 2>/dev/null
        local status=$?
        [[ $status -ne 0 ]]; verdict $? "${name}_parent_exits" "exit status 0 after SIG$sig"
    fi
    no_leftovers "${name}_no_leftovers" "test_spawn_job --mode hang"
}
signal_parent spawn_sigint INT
expect_output spawn_sigint_reported "$TMP/spawn_sigint.log" "got SIGINT; stopping all 3 ranks"
signal_parent spawn_sigterm TERM
# SIGKILL cannot be caught: the children die through PR_SET_PDEATHSIG.
signal_parent spawn_parent_sigkill KILL 2>/dev/null   # (bash reports the killed job)
