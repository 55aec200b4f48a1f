#!/usr/bin/env bash
# tests/library/test_collectives.sh - every collective of the process group
# (common/pg.h) against a locally computed reference, on world sizes 1-5:
# all dtypes and ops, counts 0 to 1048577, in place and out of place, other
# roots than 0, and identical bits on every rank (see unit/test_collectives.c).
# Then the same with single copy (COURSE_SINGLE_COPY=1), over TCP only
# (COURSE_SHM=0), the nccl backend and GPU
# staging where a GPU is present, and the error for nccl without one GPU per rank.
# all_to_all_v (counts per peer, zeros included) runs in every suite, and on
# 2-4 GPUs with nccl where there are 4 (the emulated GPU has 8); a count
# that disagrees between two ranks is named, not hung on; planted bugs (a
# displacement taken one peer off, a debug check that looks away) fail.
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
    # all_to_all_v between GPUs: grouped ncclSend/ncclRecv, one rank per GPU.
    if [[ $(gpu_count) -ge 4 ]]; then
        run_suite nccl_v 300 "$BIN" "$TAG" --worlds 2,3,4 --backend nccl --device cuda --only all_to_all_v --label "nccl: "
        COURSE_DEBUG=DETAIL run_capture 120 "$TMP/nccl_mismatch.log" "$BIN" "$TAG" --worlds 2 --backend nccl \
            --device cuda --mismatch
        grep -q 'error: COURSE_DEBUG=DETAIL: collective #0, all_to_all_v(f32): rank 0 sends 5 to rank 1, which expects 4' \
            "$TMP/nccl_mismatch.log"
        verdict $? "collectives: COURSE_DEBUG=DETAIL names the mismatched all_to_all_v count on the nccl backend" \
            "$(grep -v COURSE_DEBUG: "$TMP/nccl_mismatch.log" | tail -n 3 | tr '\n' '|')"
    else
        skip "collectives: all_to_all_v on 2-4 GPUs with nccl" "needs 4 GPUs (real, or make CUDA=emu), $(gpu_count) here"
        skip "collectives: COURSE_DEBUG=DETAIL names the mismatched all_to_all_v count on the nccl backend" "needs 2 GPUs"
    fi
else
    skip "collectives: nccl backend, one rank" "no GPU here (nvidia-smi lists none)"
    skip "collectives: all_to_all_v on 2-4 GPUs with nccl" "no GPU here"
    skip "collectives: COURSE_DEBUG=DETAIL names the mismatched all_to_all_v count on the nccl backend" "no GPU here"
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

# all_to_all_v whose counts disagree (--mismatch: rank 0 sends 5 elements to
# rank 1, which expects 4): without COURSE_DEBUG the cpu backend's message
# header gives the sizes away; with DETAIL every rank that checks names the
# pair in the counts' own words, before any byte moves.
mismatch_line='COURSE_DEBUG=DETAIL: collective #0, all_to_all_v\(f32\): rank 0 sends 5 to rank 1, which expects 4'
run_capture 60 "$TMP/mismatch.log" "$BIN" "$TAG" --worlds 2 --mismatch; status=$?
grep -q 'error: rank 0 sent 20 bytes for all_to_all_v but this rank expected 16' "$TMP/mismatch.log" &&
    grep -q 'the job stopped' "$TMP/mismatch.log"
verdict $? "collectives: all_to_all_v counts that disagree stop the cpu backend with the sizes (rank 0 sent 20 bytes, 16 expected)" \
    "status $status: $(tail -n 3 "$TMP/mismatch.log" | tr '\n' '|')"
# mismatch_named LOG: how many ranks named the pair.
mismatch_named() { grep -Ec "^\[rank [0-9]+\] error: $mismatch_line" "$1"; }
COURSE_DEBUG=DETAIL run_capture 60 "$TMP/mismatch_detail.log" "$BIN" "$TAG" --worlds 3 --mismatch
named=$(mismatch_named "$TMP/mismatch_detail.log")
[[ $named -ge 1 ]] && ! grep -q 'sent 20 bytes' "$TMP/mismatch_detail.log"
verdict $? "collectives: COURSE_DEBUG=DETAIL names the all_to_all_v pair that disagrees, 3 ranks ($named said 'rank 0 sends 5 to rank 1, which expects 4')" \
    "$(grep -v COURSE_DEBUG: "$TMP/mismatch_detail.log" | tail -n 3 | tr '\n' '|')"

# Planted (tests/lib.sh, plant): the cpu backend's displacements one peer
# off (block p placed after p's own count instead of p-1's): every all_to_all
# with equal counts still passes, the uneven counts of all_to_all_v fail.
planted=$(plant v_displacement common/pg_cpu_algorithms.h 'at[p] = at[p - 1] + counts[p - 1];' \
    'at[p] = at[p - 1] + counts[p];' tests unit/test_collectives)
[[ -n $planted ]] && run_capture 60 "$TMP/planted_v.log" "$planted" "$TAG" --worlds 3 --only all_to_all_v --label "planted: "
[[ -n $planted ]] && grep -q '^FAIL planted: all_to_all_v n=3: ' "$TMP/planted_v.log"
verdict $? "collectives planted: all_to_all_v displacements one peer off fail ($(grep -m1 '^FAIL' "$TMP/planted_v.log" 2>/dev/null | cut -c1-150))" \
    "$(planted_why v_displacement)the planted copy passed: $(grep -E '^(PASS|FAIL)' "$TMP/planted_v.log" 2>/dev/null | tr '\n' '|')"
# Planted: a debug mode that compares the calls but not the counts.
planted=$(plant v_counts_unchecked common/pg_debug.h 'if (sends_ab == expects) continue;' \
    'if (sends_ab == expects || sends_ab != expects) continue;' tests unit/test_collectives)
[[ -n $planted ]] && COURSE_DEBUG=DETAIL run_capture 60 "$TMP/planted_debug.log" "$planted" "$TAG" --worlds 3 --mismatch
[[ -n $planted && $(mismatch_named "$TMP/planted_debug.log") -eq 0 ]]
verdict $? "collectives planted: a DETAIL that does not compare the counts names no pair ($(grep -m1 'error:' "$TMP/planted_debug.log" 2>/dev/null | cut -c1-110))" \
    "$(planted_why v_counts_unchecked)the planted copy named the pair: $(grep -m1 'error:' "$TMP/planted_debug.log" 2>/dev/null)"

the_end
