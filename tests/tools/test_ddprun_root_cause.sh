#!/usr/bin/env bash
# tests/tools/test_ddprun_root_cause.sh - the root cause of a failed multi-node job
# is named the same on every node, even when a later failure happens on
# another node, where it is noticed first. Two launchers on this host play
# two nodes: node 1 runs ranks 1-2; rank 2 exits with status 6 after 0.5 s,
# and rank 1 ignores SIGTERM, so node 1 needs COURSE_KILL_GRACE (3 s) to
# stop. Node 0 runs rank 0, which exits with status 1 after 1.5 s, as a peer
# of a dead rank does. Node 0 gives up first (the old launcher named its own
# rank 0 then), but the first failure is rank 2's on node 1.
source "$(dirname "$0")/../lib.sh"

DDPRUN=$ROOT/tools/ddprun
WORKER=$ROOT/tests/unit/test_ddprun_worker
TAG=ddprun-root-$$
if ! make -C "$ROOT/tools" -s ddprun >"$TMP/build.log" 2>&1 ||
   ! make -C "$ROOT/tests" -s unit/test_ddprun_worker >>"$TMP/build.log" 2>&1; then
    fail "ddprun root cause: build" "make failed: $(grep -m3 -E 'error|Error' "$TMP/build.log" | tr '\n' '|')"
    exit 1
fi


port=$(free_port)
export COURSE_KILL_GRACE=3
timeout -k 5 60 "$DDPRUN" --nnodes=2 --node_rank=0 --nproc_per_node=1 --master_port="$port" \
    "$WORKER" echo "$TAG" sleep 1.5 exit-if-rank 0 1 sleep 60 >"$TMP/node0.log" 2>&1 & n0=$!
timeout -k 5 60 "$DDPRUN" --nnodes=2 --node_rank=1 --nproc_per_node=2 --master_port="$port" \
    "$WORKER" echo "$TAG" ignore-term sleep 0.5 exit-if-rank 2 6 sleep 60 >"$TMP/node1.log" 2>&1 & n1=$!
wait $n0; s0=$?
wait $n1; s1=$?

want='^ddprun: root cause \(first failure\): rank 2 \(local 1, node 1, host [^,]*, pid [0-9]+\) exited with status 6 at '
for node in 0 1; do
    status=$([[ $node -eq 0 ]] && echo $s0 || echo $s1)
    [[ $status -eq 1 ]] && grep -Eq "$want" "$TMP/node$node.log"
    verdict $? "ddprun root cause: node $node names rank 2 on node 1, the first failure" \
        "status $status; it said: $(grep -E 'root cause|exited|failed' "$TMP/node$node.log" | tr '\n' '|')"
done
grep -q '^ddprun: rank 0 (node 0, local 0, pid [0-9]*) exited with status 1' "$TMP/node0.log"
verdict $? "ddprun root cause: node 0 gave up on its own failure first (the case that misled the old launcher)" \
    "the scenario did not happen: $(grep ddprun "$TMP/node0.log" | tr '\n' '|')"
no_leftovers "ddprun root cause: no workers left on either node" "$TAG"
