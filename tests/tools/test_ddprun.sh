#!/usr/bin/env bash
# tests/tools/test_ddprun.sh - the launcher tools/ddprun: what workers see, how
# failures, signals and restarts end a job, several nodes on one host, and
# bad flags. The workers are tests/unit/test_ddprun_worker, which does what
# its arguments say (print its variables, fail, sleep, kill itself, ...).
source "$(dirname "$0")/../lib.sh"

DDPRUN=$ROOT/tools/ddprun
WORKER=$ROOT/tests/unit/test_ddprun_worker
TAG=ddprun-test-$$   # on every worker's command line, to find leftovers
# Every case below ends in about a second when ddprun works (a dead worker is
# noticed in ~0.1 s). Its deadline is a few seconds more than that, never
# the workers' `sleep 60`: a broken ddprun fails each case in seconds, and
# the whole file within a few minutes, instead of waiting out every sleep.
LIMIT=15

if ! make -C "$ROOT/tools" -s ddprun >"$TMP/build.log" 2>&1 ||
   ! make -C "$ROOT/tests" -s unit/test_ddprun_worker >>"$TMP/build.log" 2>&1; then
    fail "ddprun: build" "make failed: $(grep -m3 -E 'error|Error' "$TMP/build.log" | tr '\n' '|')"
    exit 1
fi


# wait_deadline PID SECONDS : wait for a background job, killing it after
# SECONDS; returns its status. (No guard subshell: it would inherit lib.sh's
# EXIT trap and remove $TMP when it ends.)
wait_deadline() {
    local pid=$1 ticks=$(($2 * 10))
    while ((ticks-- > 0)) && kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
    wait "$pid"
}

# value FILE RANK NAME : what rank RANK printed as NAME=value.
value() { field "$1" "^\[rank $2\]: $3=(.*)"; }

# ---------------------------------------------------------------- environment
out=$TMP/env.log
env -u OMP_NUM_THREADS timeout -k 5 $LIMIT "$DDPRUN" --standalone --nproc_per_node=2 "$WORKER" env >"$out" 2>&1
status=$?
port=$(field "$out" 'store at 127\.0\.0\.1:([0-9]*);')
ok=1
for r in 0 1; do
    [[ $(value "$out" $r RANK) == "$r" && $(value "$out" $r LOCAL_RANK) == "$r" &&
       $(value "$out" $r WORLD_SIZE) == 2 && $(value "$out" $r LOCAL_WORLD_SIZE) == 2 &&
       $(value "$out" $r GROUP_RANK) == 0 && $(value "$out" $r MASTER_ADDR) == 127.0.0.1 &&
       $(value "$out" $r COURSE_AGENT_STORE) == 1 && -n "$port" &&
       $(value "$out" $r MASTER_PORT) == "$port" ]] || ok=0
done
[[ $status -eq 0 && $ok -eq 1 ]]
verdict $? "ddprun: workers see RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT" "status $status; output: $(head -c 600 "$out" | tr '\n' '|')"

id0=$(value "$out" 0 TORCHELASTIC_RUN_ID); id1=$(value "$out" 1 COURSE_RUN_ID)
tok0=$(value "$out" 0 COURSE_JOB_TOKEN); tok1=$(value "$out" 1 COURSE_JOB_TOKEN)
check "ddprun: one run id and job token for all workers" \
    test -n "$id0" -a "$id0" != "(unset)" -a "$id0" = "$id1" -a -n "$tok0" -a "$tok0" = "$tok1"
[[ $(value "$out" 0 OMP_NUM_THREADS) == 1 && $(value "$out" 1 OMP_NUM_THREADS) == 1 ]] && grep -q '^ddprun: setting OMP_NUM_THREADS=1' "$out"
verdict $? "ddprun: OMP_NUM_THREADS=1 with a notice when unset" "workers saw '$(value "$out" 0 OMP_NUM_THREADS)'"

out=$TMP/omp.log
OMP_NUM_THREADS=7 timeout -k 5 $LIMIT "$DDPRUN" --standalone --nproc-per-node 2 "$WORKER" env >"$out" 2>&1
[[ $(value "$out" 1 OMP_NUM_THREADS) == 7 ]] && ! grep -q 'setting OMP_NUM_THREADS' "$out"
verdict $? "ddprun: an OMP_NUM_THREADS that is set passes through" "rank 1 saw '$(value "$out" 1 OMP_NUM_THREADS)'"

# ---------------------------------------------------------------- output relay
out=$TMP/output.log
timeout -k 5 $LIMIT "$DDPRUN" --standalone --nproc_per_node=2 --log_dir="$TMP/logs" "$WORKER" partial echo-err "on stderr" tail "no newline" >"$out" 2>&1
grep -qx '\[rank 1\]: first half, second half' "$out" && grep -qx '\[rank 0\]: no newline' "$out" && grep -qx '\[rank 1\]: on stderr' "$out"
verdict $? "ddprun: output prefixed per line, partial lines joined" "output: $(tr '\n' '|' <"$out")"
grep -qx 'on stderr' "$TMP/logs/attempt_0/1/stderr.log" 2>/dev/null &&
   grep -q 'first half, second half' "$TMP/logs/attempt_0/0/stdout.log" 2>/dev/null
verdict $? "ddprun: --log_dir keeps each rank's output in files" "files: $(find "$TMP/logs" -type f | tr '\n' ' ')"

# ---------------------------------------------------------------- standalone twice at once
"$DDPRUN" --standalone --nproc_per_node=2 "$WORKER" env sleep 1 >"$TMP/sa1.log" 2>&1 & p1=$!
"$DDPRUN" --standalone --nproc_per_node=2 "$WORKER" env sleep 1 >"$TMP/sa2.log" 2>&1 & p2=$!
wait_deadline $p1 $LIMIT; s1=$?; wait_deadline $p2 5; s2=$?
port1=$(value "$TMP/sa1.log" 0 MASTER_PORT); port2=$(value "$TMP/sa2.log" 0 MASTER_PORT)
[[ $s1 -eq 0 && $s2 -eq 0 && -n "$port1" && "$port1" != "$port2" ]]
verdict $? "ddprun: two --standalone jobs at once get their own ports" "statuses $s1 $s2, ports '$port1' '$port2'; $(tail -n 2 "$TMP/sa2.log" | tr '\n' '|')"

# ---------------------------------------------------------------- a folder for PROGRAM
# Every chapter is a folder holding a program of its own name: ddprun given
# the folder (as a path, or as a bare name that PATH does not know) runs
# the program inside and says so.
mkdir -p "$TMP/wk"
cp "$WORKER" "$TMP/wk/wk"
for given in wk ./wk/ "$TMP/wk"; do
    (cd "$TMP" && timeout -k 5 $LIMIT "$DDPRUN" --standalone --nproc_per_node=2 "$given" env) >"$TMP/folder.log" 2>&1; status=$?
    [[ $status -eq 0 ]] && grep -q "^ddprun: $given is a folder; running the program of the same name in it, ${given%/}/wk$" "$TMP/folder.log" &&
       [[ $(value "$TMP/folder.log" 1 RANK) == 1 ]]
    verdict $? "ddprun: PROGRAM '$given', a folder, runs the program of its name inside" "status $status: $(head -n 2 "$TMP/folder.log" | tr '\n' '|')"
done

# ---------------------------------------------------------------- a port in use
# A second job on the port of a running one is told how to pick another.
port=$(free_port)
"$DDPRUN" --master_port="$port" --nproc_per_node=1 "$WORKER" echo "$TAG" sleep 60 >"$TMP/holder.log" 2>&1 & holder=$!
for _ in $(seq 100); do grep -q "$TAG" "$TMP/holder.log" && break; sleep 0.1; done
run_capture $LIMIT "$TMP/inuse.log" "$DDPRUN" --master_port="$port" --nproc_per_node=1 "$WORKER" env; status=$?
kill -TERM $holder 2>/dev/null; wait_deadline $holder $LIMIT >/dev/null
[[ $status -ne 0 && $status -ne 124 ]] && grep -q "port $port is already in use on 127.0.0.1 (another job? use --master_port or --standalone)" "$TMP/inuse.log"
verdict $? "ddprun: a port in use is refused, suggesting --master_port or --standalone" "status $status: $(tail -n 2 "$TMP/inuse.log" | tr '\n' '|')"

# ---------------------------------------------------------------- failures
out=$TMP/fail.log
run_capture $LIMIT "$out" "$DDPRUN" --standalone --nproc_per_node=3 "$WORKER" echo "$TAG" exit-if-rank 1 3 sleep 60
status=$?
[[ $status -ne 0 && $status -ne 124 ]] && grep -q '^ddprun: rank 1 (local 1, pid [0-9]*) exited with status 3; stopping the other workers' "$out" &&
   grep -q '^ddprun: root cause (first failure): rank 1 .* exited with status 3' "$out"
verdict $? "ddprun: a failing worker ends the job, naming its rank and status" "status $status; output: $(tail -n 4 "$out" | tr '\n' '|')"
no_leftovers "ddprun: the other workers are stopped after a failure" "$TAG"

out=$TMP/signal.log
run_capture $LIMIT "$out" "$DDPRUN" --standalone --nproc_per_node=2 "$WORKER" echo "$TAG" kill-if-rank 1 9 sleep 60
status=$?
[[ $status -ne 0 && $status -ne 124 ]] && grep -q 'rank 1 (local 1, pid [0-9]*) was killed by signal 9 (SIGKILL)' "$out"
verdict $? "ddprun: a worker killed by a signal is named with the signal" "status $status; output: $(tail -n 3 "$out" | tr '\n' '|')"
no_leftovers "ddprun: no workers left after a killed worker" "$TAG"

out=$TMP/stubborn.log
COURSE_KILL_GRACE=1 run_capture $LIMIT "$out" "$DDPRUN" --standalone --nproc_per_node=2 "$WORKER" ignore-term echo "$TAG" sleep 0.5 exit-if-rank 0 4 sleep 60
status=$?
[[ $status -eq 1 ]] && grep -q 'still running 1 s after SIGTERM; sending SIGKILL' "$out"
verdict $? "ddprun: a worker that ignores SIGTERM gets SIGKILL after COURSE_KILL_GRACE" "status $status; output: $(tail -n 3 "$out" | tr '\n' '|')"
no_leftovers "ddprun: no worker left after SIGKILL" "$TAG"

# A worker that fails at once gets its siblings SIGTERMed while some are still
# between fork and exec; that must neither look like a signal to the launcher
# nor need SIGKILL.
bad=0 runs=0
for _ in $(seq 10); do
    runs=$((runs + 1))
    COURSE_KILL_GRACE=2 run_capture $LIMIT "$TMP/race.log" "$DDPRUN" --standalone --nproc_per_node=8 "$WORKER" echo "$TAG" exit-if-rank 1 5 sleep 60
    status=$?
    if [[ $status -ne 1 ]] || grep -qE '^ddprun: got SIG|sending SIGKILL' "$TMP/race.log"; then bad=1; break; fi   # one is enough
done
[[ $bad -eq 0 ]]
verdict $? "ddprun: workers stopped right after their start die by SIGTERM" "run $runs of 10 went wrong (status $status): $(grep ddprun "$TMP/race.log" | tail -n 2 | tr '\n' '|')"
no_leftovers "ddprun: no workers left after quick failures" "$TAG"

# ---------------------------------------------------------------- signals to the launcher
# wait_for_lines FILE COUNT: until FILE has COUNT lines with the tag (at most 10 s).
wait_for_lines() {
    for _ in $(seq 100); do
        [[ $(grep -c "$TAG" "$1" 2>/dev/null) -ge $2 ]] && return 0
        sleep 0.1
    done
    return 1
}

out=$TMP/ctrlc.log
"$DDPRUN" --standalone --nproc_per_node=2 "$WORKER" echo "$TAG" sleep 60 >"$out" 2>&1 & launcher=$!
wait_for_lines "$out" 2
kill -INT $launcher
wait_deadline $launcher $LIMIT; status=$?
[[ $status -eq 130 ]] && grep -q '^ddprun: got SIGINT; passing it to the workers' "$out"
verdict $? "ddprun: Ctrl-C (SIGINT) stops the job with status 130" "status $status; output: $(tail -n 3 "$out" | tr '\n' '|')"
no_leftovers "ddprun: no process left after Ctrl-C" "$TAG"

out=$TMP/killed.log
"$DDPRUN" --standalone --nproc_per_node=2 "$WORKER" echo "$TAG" sleep 60 >"$out" 2>&1 & launcher=$!
wait_for_lines "$out" 2
kill -9 $launcher; wait $launcher 2>/dev/null
no_leftovers "ddprun: workers die with a SIGKILLed launcher" "$TAG"

# ---------------------------------------------------------------- bad flags
bad_flag() {
    local name=$1; shift
    run_capture $LIMIT "$TMP/bad.log" "$DDPRUN" "$@"
    local status=$?
    [[ $status -eq 2 ]] && grep -q '^ddprun: error: ' "$TMP/bad.log"
    verdict $? "ddprun: $name exits 2" "status $status; output: $(head -n 2 "$TMP/bad.log" | tr '\n' '|')"
}
bad_flag "an unknown flag" --nproc_per_node=2 --bogus=1 "$WORKER"
bad_flag "a non-numeric --nproc_per_node" --nproc_per_node=two "$WORKER"
bad_flag "a missing program" --nproc_per_node=2
bad_flag "--node_rank not below --nnodes" --nnodes=2 --node_rank=2 "$WORKER"
bad_flag "a program not found" --nproc_per_node=1 "./no-such-program-$TAG"
bad_flag "a folder without a program of its name" --nproc_per_node=1 "$ROOT/common"

# ---------------------------------------------------------------- restarts
out=$TMP/restart.log
run_capture $LIMIT "$out" "$DDPRUN" --standalone --nproc_per_node=2 --max_restarts=1 "$WORKER" exit-if-first 1 5 env
status=$?
[[ $status -eq 0 ]] && grep -q '^ddprun: restarting workers (restart 1 of 1)' "$out" && grep -q '^\[rank 1\]: TORCHELASTIC_RESTART_COUNT=1$' "$out"
verdict $? "ddprun: --max_restarts=1 restarts after a first failure and succeeds" "status $status; output: $(grep ddprun "$out" | tr '\n' '|')"

out=$TMP/giveup.log
run_capture $LIMIT "$out" "$DDPRUN" --standalone --nproc_per_node=2 --max_restarts=2 "$WORKER" echo "$TAG" exit-if-rank 1 5 sleep 60
status=$?
[[ $status -ne 0 && $status -ne 124 ]] && [[ $(grep -c '^ddprun: restarting workers' "$out") -eq 2 ]] &&
   grep -q '^ddprun: giving up after 2 restarts; last failure: rank 1 exited with status 5' "$out"
verdict $? "ddprun: gives up after --max_restarts, naming the rank" "status $status; output: $(grep ddprun "$out" | tr '\n' '|')"
no_leftovers "ddprun: no worker left after giving up" "$TAG"

# ---------------------------------------------------------------- two nodes on this host
port=$(free_port)
"$DDPRUN" --nnodes=2 --node_rank=0 --nproc_per_node=2 --master_port="$port" "$WORKER" env >"$TMP/node0.log" 2>&1 & n0=$!
"$DDPRUN" --nnodes=2 --node-rank=1 --nproc-per-node=3 --master-port="$port" "$WORKER" env >"$TMP/node1.log" 2>&1 & n1=$!
wait_deadline $n0 $LIMIT; s0=$?; wait_deadline $n1 5; s1=$?
ok=1
for r in 0 1; do
    [[ $(value "$TMP/node0.log" $r RANK) == "$r" && $(value "$TMP/node0.log" $r WORLD_SIZE) == 5 &&
       $(value "$TMP/node0.log" $r GROUP_RANK) == 0 ]] || ok=0
done
for r in 2 3 4; do
    [[ $(value "$TMP/node1.log" $r RANK) == "$r" && $(value "$TMP/node1.log" $r WORLD_SIZE) == 5 &&
       $(value "$TMP/node1.log" $r LOCAL_RANK) == $((r - 2)) && $(value "$TMP/node1.log" $r GROUP_RANK) == 1 &&
       $(value "$TMP/node1.log" $r LOCAL_WORLD_SIZE) == 3 ]] || ok=0
done
[[ $s0 -eq 0 && $s1 -eq 0 && $ok -eq 1 ]]
verdict $? "ddprun: two nodes with 2 and 3 workers get ranks 0-1 and 2-4 of 5" \
    "statuses $s0 $s1; node 1 said: $(grep -E 'ddprun|error|RANK=' "$TMP/node1.log" | head -n 5 | tr '\n' '|')"

port=$(free_port)
"$DDPRUN" --nnodes=2 --node_rank=0 --nproc_per_node=1 --master_port="$port" "$WORKER" echo "$TAG" sleep 60 >"$TMP/node0.log" 2>&1 & n0=$!
"$DDPRUN" --nnodes=2 --node_rank=1 --nproc_per_node=2 --master_port="$port" "$WORKER" echo "$TAG" sleep 0.5 exit-if-rank 2 6 sleep 60 >"$TMP/node1.log" 2>&1 & n1=$!
wait_deadline $n0 $LIMIT; s0=$?; wait_deadline $n1 5; s1=$?
[[ $s0 -eq 1 && $s1 -eq 1 ]] && grep -q 'the job failed on node 1 .*rank 2 exited with status 6' "$TMP/node0.log"
verdict $? "ddprun: a failure on node 1 stops node 0 too, naming the rank" "statuses $s0 $s1; node 0 said: $(grep ddprun "$TMP/node0.log" | tail -n 2 | tr '\n' '|')"
no_leftovers "ddprun: no workers left on either node" "$TAG"

out=$TMP/missing.log
port=$(free_port)
COURSE_TIMEOUT=3 run_capture $LIMIT "$out" "$DDPRUN" --nnodes=2 --node_rank=0 --nproc_per_node=2 --master_port="$port" "$WORKER" env
status=$?
[[ $status -eq 1 ]] && grep -q "within 3 s: 1 of 2 joined (node 0: 2 workers); missing: node 1\. The store is at 127\.0\.0\.1:$port" "$out"
verdict $? "ddprun: a node that never arrives is named after COURSE_TIMEOUT" "status $status; output: $(tail -n 2 "$out" | tr '\n' '|')"

# ---------------------------------------------------------------- a lost node replaced
# Node 1's launcher and workers are killed at once (a crashed host) while
# node 0's worker, which does not talk to them, keeps running. A new launcher
# for node 1 finds the old one's heartbeat silent, takes its place and asks
# for a restart: the job runs again on both nodes and succeeds.
first_attempt_sleeps='[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && sleep 60; echo "attempt $TORCHELASTIC_RESTART_COUNT"'
node() {   # node NODE_RANK NPROC MAX_RESTARTS: the launcher's command line
    launcher=("$DDPRUN" --nnodes=2 --node_rank="$1" --nproc_per_node="$2" --master_port="$port" --max_restarts="$3"
              /bin/sh -c "$first_attempt_sleeps" "$TAG")
}
port=$(free_port)
node 0 1 1; "${launcher[@]}" >"$TMP/r0.log" 2>&1 & n0=$!
node 1 2 1; setsid "${launcher[@]}" >"$TMP/r1.log" 2>&1 & n1=$!
for _ in $(seq 100); do grep -q '^ddprun: starting' "$TMP/r1.log" && break; sleep 0.1; done
for p in $(ps -o pid= -s "$n1"); do kill -9 "$p" 2>/dev/null; done   # its session: launcher and workers
wait "$n1" 2>/dev/null
run_capture $LIMIT "$TMP/r2.log" "${launcher[@]}"; s2=$?
wait_deadline $n0 5; s0=$?
[[ $s0 -eq 0 && $s2 -eq 0 ]] && grep -q "^ddprun: node 1's previous launcher has sent no heartbeat for 5 s: it is gone, and this launcher takes its place" "$TMP/r2.log" &&
   grep -q "^ddprun: node 1 has a new launcher, on .*; it rejoins the job" "$TMP/r0.log" &&
   grep -q '^\[rank 0\]: attempt 1$' "$TMP/r0.log" && [[ $(grep -c '^\[rank [12]\]: attempt 1$' "$TMP/r2.log") -eq 2 ]]
verdict $? "ddprun: a killed node's new launcher takes its place; both nodes restart (attempt 1) and succeed" \
    "statuses $s0 $s2; node 0: $(grep ddprun "$TMP/r0.log" | tail -n 3 | tr '\n' '|') new node 1: $(tail -n 3 "$TMP/r2.log" | tr '\n' '|')"

# A second launcher for a node whose launcher is alive is refused.
port=$(free_port)
node 0 1 0; "${launcher[@]}" >"$TMP/d0.log" 2>&1 & n0=$!
node 1 1 0; "${launcher[@]}" >"$TMP/d1.log" 2>&1 & n1=$!
for _ in $(seq 100); do grep -q '^ddprun: starting' "$TMP/d1.log" && break; sleep 0.1; done
run_capture $LIMIT "$TMP/d2.log" "${launcher[@]}"; s2=$?
kill -TERM "$n0" "$n1" 2>/dev/null; wait_deadline $n0 10; wait_deadline $n1 10
[[ $s2 -eq 1 ]] && grep -q "error: another launcher already joined as node 1 and is still running: give every node its own --node_rank" "$TMP/d2.log"
verdict $? "ddprun: a second launcher for a live node is refused" \
    "status $s2: $(tail -n 2 "$TMP/d2.log" | tr '\n' '|') node 0: $(tail -n 2 "$TMP/d0.log" | tr '\n' '|') first node 1: $(tail -n 2 "$TMP/d1.log" | tr '\n' '|')"
no_leftovers "ddprun: no worker left after the replaced node" "$TAG"

# ---------------------------------------------------------------- the restart budget across nodes (issue 33)
# Node 1's launcher and workers are killed at once (a crashed host) while
# node 0's worker runs on. Node 0 takes node 1 for dead after SILENCE s
# without a heartbeat (--rdzv_timeout, under 30 s), checked once a second;
# then it waits up to SILENCE s more for the failure records of the nodes
# (node 1 will write none) and exits. The deadline is that, plus 6 s.
SILENCE=4
DEADLINE=$((2 * SILENCE + 1 + 6))
# budget_node NODE_RANK MAX_RESTARTS [DDPRUN]: a launcher whose one worker prints its attempt and sleeps.
budget_node() {
    launcher=("${3:-$DDPRUN}" --nnodes=2 --node_rank="$1" --nproc_per_node=1 --master_port="$port"
              --max_restarts="$2" --rdzv_timeout=$SILENCE /bin/sh -c 'echo "attempt $TORCHELASTIC_RESTART_COUNT"; sleep 60' "$TAG")
}
# kill_node PID: the launcher started with setsid, and every process of its session.
kill_node() {
    for p in $(ps -o pid= -s "$1"); do kill -9 "$p" 2>/dev/null; done
    wait "$1" 2>/dev/null
}
# wait_for FILE REGEX: until FILE has a line matching REGEX (at most 10 s).
wait_for() {
    for _ in $(seq 100); do grep -Eq -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    return 1
}

# budget_zero LOG [DDPRUN]: --max_restarts=0, node 1 killed once its worker runs;
# sets s0 (node 0's status) and secs (from the kill to node 0's exit).
budget_zero() {
    port=$(free_port)
    budget_node 0 0 "${2:-}"; "${launcher[@]}" >"$1" 2>&1 & n0=$!
    budget_node 1 0 "${2:-}"; setsid "${launcher[@]}" >"$1.node1" 2>&1 & n1=$!
    wait_for "$1" '^\[rank 0\]: attempt 0$'; wait_for "$1.node1" '^\[rank 1\]: attempt 0$'
    local start=$(date +%s)
    kill_node "$n1"
    wait_deadline $n0 $DEADLINE; s0=$?
    secs=$(( $(date +%s) - start ))
}
# What node 0 says when it gives up on node 1: no restart asked for, no wait for a new launcher.
gave_up="^ddprun: node 1 (.*) has sent no heartbeat for $SILENCE s: its launcher died or the network between the nodes failed; stopping this node's workers$"
budget_zero "$TMP/budget0.log"
[[ $s0 -eq 1 ]] && grep -q "$gave_up" "$TMP/budget0.log"
verdict $? "ddprun: --max_restarts=0, node 1's launcher killed: node 0 exits 1 naming node 1 (after ${secs}s, deadline ${DEADLINE}s)" \
    "status $s0 after ${secs}s: $(grep ddprun "$TMP/budget0.log" | tail -n 4 | tr '\n' '|')"
! grep -q 'restart' "$TMP/budget0.log"
verdict $? "ddprun: --max_restarts=0, node 1's launcher killed: no restart is asked for" "$(grep restart "$TMP/budget0.log" | head -n 3 | tr '\n' '|')"
no_leftovers "ddprun: no worker left after the budget of 0 restarts" "$TAG"

# --max_restarts=1: node 1 is killed, a new launcher takes its place, and
# both nodes restart (attempt 1); node 1 is killed again: no restart is left,
# and node 0 exits 1 naming it.
port=$(free_port)
budget_node 0 1; "${launcher[@]}" >"$TMP/budget1.log" 2>&1 & n0=$!
budget_node 1 1; setsid "${launcher[@]}" >"$TMP/budget1.node1" 2>&1 & n1=$!
wait_for "$TMP/budget1.log" '^\[rank 0\]: attempt 0$'; wait_for "$TMP/budget1.node1" '^\[rank 1\]: attempt 0$'
kill_node "$n1"
setsid "${launcher[@]}" >"$TMP/budget1.node1b" 2>&1 & n1=$!
# The new launcher watches the old one's heartbeat for 5 s before it takes over; node 0
# waits SILENCE s for it, from when it finds node 1 silent (after SILENCE s).
wait_for "$TMP/budget1.node1b" '^\[rank 1\]: attempt 1$' || wait_for "$TMP/budget1.node1b" '^\[rank 1\]: attempt 1$'
wait_for "$TMP/budget1.log" '^\[rank 0\]: attempt 1$'
start=$(date +%s)
kill_node "$n1"
wait_deadline $n0 $DEADLINE; s0=$?
secs=$(( $(date +%s) - start ))
restarts=$(grep -c '^ddprun: restarting workers' "$TMP/budget1.log")
# What node 0 said after its restart: a second request, even one that no
# new launcher answers (so that no 'restarting workers' follows), is one too many.
sed -n '/^ddprun: restarting workers/,$p' "$TMP/budget1.log" | tail -n +2 >"$TMP/budget1.after"
[[ $restarts -eq 1 ]] && grep -q '^ddprun: restarting workers (restart 1 of 1)$' "$TMP/budget1.log" &&
   grep -q '^\[rank 0\]: attempt 1$' "$TMP/budget1.log" && ! grep -q 'restart' "$TMP/budget1.after"
verdict $? "ddprun: --max_restarts=1, node 1 killed twice: exactly one restart (attempt 1 ran on node 0)" \
    "$restarts restart(s): $(grep -E 'ddprun|attempt' "$TMP/budget1.log" | tail -n 6 | tr '\n' '|')"
[[ $s0 -eq 1 ]] && grep -q "$gave_up" "$TMP/budget1.after"
verdict $? "ddprun: --max_restarts=1, node 1 killed again after the restart: node 0 exits 1 naming node 1 (after ${secs}s, deadline ${DEADLINE}s)" \
    "status $s0 after ${secs}s: $(grep ddprun "$TMP/budget1.log" | tail -n 4 | tr '\n' '|')"
no_leftovers "ddprun: no worker left after the budget of 1 restart" "$TAG"

# Planted (tests/lib.sh, plant): a silent node restarts the job while
# restarts <= max_restarts, one restart too many. With --max_restarts=0
# node 0 then asks for a restart and waits for a new launcher of node 1.
ddprun_planted=$(plant restart_budget tools/ddprun.c 'if (watch_restart && job->restarts < job->opt.max_restarts) {' \
    'if (watch_restart && job->restarts <= job->opt.max_restarts) {' tools ddprun)
[[ -n $ddprun_planted ]] && { budget_zero "$TMP/planted_budget.log" "$ddprun_planted"; grep -q 'restart' "$TMP/planted_budget.log"; }
verdict $? "planted: a restart budget off by one (restarts <= max_restarts) fails 'no restart is asked for'" \
    "$(planted_why restart_budget)$(grep ddprun "$TMP/planted_budget.log" 2>/dev/null | tail -n 3 | tr '\n' '|')"
no_leftovers "ddprun: no worker left after the planted restart budget" "$TAG"
exit 0
