#!/usr/bin/env bash
# tests/tools/test_ddprun_elastic.sh - ddprun's c10d rendezvous: torchrun's
# --rdzv_backend/--rdzv_endpoint/--rdzv_id command lines, argparse-style
# prefixes, and an elastic job (--nnodes=2:3) that a node joins and another
# leaves while chapter 06 trains; its losses must be those of one process
# with the same global batch (06's README: elastic jobs).
source "$(dirname "$0")/../lib.sh"

DDPRUN=$ROOT/tools/ddprun
WORKER=$ROOT/tests/unit/test_ddprun_worker
PROGRAM=$ROOT/06_snapshot_resume/06_snapshot_resume
TAG=ddprun-elastic-$$   # on every worker's command line, to find leftovers
LIMIT=20

if ! make -C "$ROOT/tools" -s ddprun >"$TMP/build.log" 2>&1 ||
   ! make -C "$ROOT/tests" -s unit/test_ddprun_worker >>"$TMP/build.log" 2>&1 ||
   ! make -C "$ROOT/06_snapshot_resume" -s 06_snapshot_resume >>"$TMP/build.log" 2>&1; then
    fail "ddprun elastic: build" "make failed: $(grep -m3 -E 'error|Error' "$TMP/build.log" | tr '\n' '|')"
    exit 1
fi

# wait_for FILE... REGEX : until one of the files has a line matching REGEX (at most 20 s).
wait_for() {
    local regex=${*: -1}
    for _ in $(seq 200); do
        cat "${@:1:$#-1}" 2>/dev/null | grep -Eq -- "$regex" && return 0
        sleep 0.1
    done
    return 1
}
value() { field "$1" "^\[rank $2\]: $3=(.*)"; }

# ---------------------------------------------------------------- torchrun's c10d command line
# Two launchers given the same command, no --node_rank (as torchrun's
# multi-node examples): the rendezvous numbers the nodes. One is spelled with
# dashes, the other with prefixes (--nnode, --nproc, --rdzv_end).
# (Each launcher under `timeout`: a broken rendezvous fails in seconds.)
port=$(free_port)
timeout -k 5 $LIMIT "$DDPRUN" --nnodes=2 --nproc_per_node=2 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:$port --rdzv_id=job7 "$WORKER" env >"$TMP/c0.log" 2>&1 & n0=$!
timeout -k 5 $LIMIT "$DDPRUN" --nnode 2 --nproc 1 --rdzv-backend c10d --rdzv_end 127.0.0.1:$port --rdzv-id job7 "$WORKER" env >"$TMP/c1.log" 2>&1 & n1=$!
wait $n0; s0=$?; wait $n1; s1=$?
cat "$TMP/c0.log" "$TMP/c1.log" >"$TMP/c.log"
ranks=$(field --all "$TMP/c.log" '^\[rank [0-9]\]: RANK=(.*)' | sort | tr '\n' ' ')
[[ $s0 -eq 0 && $s1 -eq 0 && $ranks == "0 1 2 " ]]
verdict $? "ddprun: --rdzv_backend=c10d --rdzv_endpoint: two launchers without --node_rank get ranks 0-2" "statuses $s0 $s1, ranks '$ranks': $(grep ddprun "$TMP/c.log" | tr '\n' '|')"
ok=1
for r in 0 1 2; do
    [[ $(value "$TMP/c.log" $r WORLD_SIZE) == 3 && $(value "$TMP/c.log" $r TORCHELASTIC_RUN_ID) == job7 &&
       $(value "$TMP/c.log" $r MASTER_PORT) == "$port" ]] || ok=0
done
[[ $ok -eq 1 ]]
verdict $? "ddprun: c10d workers see WORLD_SIZE 3, the --rdzv_id as TORCHELASTIC_RUN_ID, the endpoint's port" "$(grep -E 'WORLD_SIZE|RUN_ID=|MASTER_PORT' "$TMP/c.log" | tr '\n' '|')"
grep -Eq '^ddprun: starting .*; network: .*address 127\.0\.0\.1, MTU [0-9]+$' "$TMP/c0.log" &&
   grep -Eq '^ddprun: round 0: 2 nodes joined .*node 0 \([^,]*, lo 127\.0\.0\.1 MTU [0-9]+\)' "$TMP/c0.log"
verdict $? "ddprun: the start-up lines name each node's interface, address and MTU" "$(grep ddprun "$TMP/c0.log" | tr '\n' '|')"

# Nodes whose MTUs differ are warned about before their workers start.
# Node 1 is made to reach the others through another interface than
# node 0's loopback (COURSE_SOCKET_IFNAME, as on a host with two networks);
# the workers never talk, so the job runs either way.
other=$(ip -o -4 addr show 2>/dev/null | awk '$2 != "lo" { print $2; exit }')
lo_mtu=$(cat /sys/class/net/lo/mtu 2>/dev/null); other_mtu=$(cat "/sys/class/net/$other/mtu" 2>/dev/null)
if [[ -n "$other" && -n "$lo_mtu" && -n "$other_mtu" && "$lo_mtu" != "$other_mtu" ]]; then
    port=$(free_port)
    timeout -k 5 $LIMIT "$DDPRUN" --nnodes=2 --node_rank=0 --master_port=$port "$WORKER" env >"$TMP/m0.log" 2>&1 & n0=$!
    COURSE_SOCKET_IFNAME="=$other" timeout -k 5 $LIMIT "$DDPRUN" --nnodes=2 --node_rank=1 --master_port=$port "$WORKER" env >"$TMP/m1.log" 2>&1 & n1=$!
    wait $n0; s0=$?; wait $n1; s1=$?
    [[ $s0 -eq 0 && $s1 -eq 0 ]] && grep -q "^ddprun: warning: node 0 reaches the store with MTU $lo_mtu, node 1 with MTU $other_mtu: packets" "$TMP/m0.log" &&
       grep -q "^ddprun: starting .*; network: interface $other, chosen by COURSE_SOCKET_IFNAME=.*MTU $other_mtu$" "$TMP/m1.log"
    verdict $? "ddprun: nodes reaching each other with MTUs $lo_mtu (lo) and $other_mtu ($other) are warned about" \
        "statuses $s0 $s1: $(grep ddprun "$TMP/m0.log" "$TMP/m1.log" | tr '\n' '|')"
else
    skip "ddprun: a warning when the nodes' MTUs differ" "needs an interface with an IPv4 address and an MTU other than loopback's (${other:-none} here)"
fi

refused() {   # DDPRUN REGEX ARGS... : exit 2 and one error line matching REGEX
    local ddprun=$1 want=$2; shift 2
    run_capture $LIMIT "$TMP/bad.log" "$ddprun" "$@"
    status=$?
    [[ $status -eq 2 ]] && head -n 1 "$TMP/bad.log" | grep -Eq -- "^ddprun: error: $want"
}
bad_flag() {   # NAME REGEX ARGS... : refused by this build's ddprun
    local name=$1; shift
    refused "$DDPRUN" "$@"
    verdict $? "ddprun: $name" "status $status: $(head -n 2 "$TMP/bad.log" | tr '\n' '|')"
}
bad_flag "another rendezvous backend is a one-line error" "--rdzv_backend=etcd is not one ddprun has: c10d" --rdzv_backend=etcd --nnodes=2 "$WORKER"
bad_flag "an ambiguous prefix names the flags it could be" "ambiguous flag '--master': it could be --master_addr, --master_port" --master 1 "$WORKER"
# Planted (tests/lib.sh, plant): a prefix takes the first flag it begins.
planted=$(plant first_prefix common/flags.h 'if (ambiguous)' 'if (0 && ambiguous)' tools ddprun)
[[ -n $planted ]] && ! refused "$planted" "ambiguous flag '--master'" --master 1 "$WORKER" env
verdict $? "planted: a prefix taken as the first flag it begins fails the ambiguous-prefix check" \
    "$(planted_why first_prefix)status $status: $(head -n 2 "$TMP/bad.log" | tr '\n' '|')"
# torchrun's flags for Python programs: -m and --run_path are refused with
# the reason, --start_method is accepted (workers start as fork + exec),
# --role reaches the workers as ROLE_NAME.
bad_flag "torchrun's -m is refused with the reason" "-m/--module runs a Python module under torchrun; ddprun runs a program" -m pkg.train
bad_flag "torchrun's --run_path is refused with the reason" "--run_path runs a Python file by path under torchrun" --run_path train.py "$WORKER"
run_capture $LIMIT "$TMP/role.log" "$DDPRUN" --standalone --nproc_per_node=2 --start_method=fork --role=trainer env; status=$?
[[ $status -eq 0 && $(grep -c '^\[rank [01]\]: ROLE_NAME=trainer$' "$TMP/role.log") -eq 2 ]]
verdict $? "ddprun: --start_method is accepted and --role reaches every worker as ROLE_NAME" "status $status: $(grep -m2 -E 'ROLE_NAME|error' "$TMP/role.log" | tr '\n' '|')"
run_capture $LIMIT "$TMP/filter.log" "$DDPRUN" --standalone --nproc_per_node=3 --local-ranks-filter=0,2 env; status=$?
[[ $status -eq 0 && $(grep -c '^\[rank [02]\]: ROLE_NAME=default$' "$TMP/filter.log") -eq 2 ]] && ! grep -q '^\[rank 1\]' "$TMP/filter.log"
verdict $? "ddprun: --local-ranks-filter=0,2 shows the lines of local ranks 0 and 2 only" "status $status: $(grep -c '^\[rank' "$TMP/filter.log") rank lines, rank 1's: $(grep -c '^\[rank 1\]' "$TMP/filter.log")"
# --local_addr (torchrun's): the address this node's workers give their
# peers (COURSE_LOCAL_ADDR, common/netif.h). 127.0.0.2 is this machine's
# (all of 127/8 is loopback); 203.0.113.77 (an address kept for
# documentation) is not, and is refused before any worker starts. A worker
# started with it by hand stops in its process group, naming it (planted:
# a process group that ignores the variable trains instead).
run_capture $LIMIT "$TMP/addr.log" "$DDPRUN" --standalone --nproc_per_node=2 --local-addr=127.0.0.2 env; status=$?
[[ $status -eq 0 && $(grep -c '^\[rank [01]\]: COURSE_LOCAL_ADDR=127.0.0.2$' "$TMP/addr.log") -eq 2 ]]
verdict $? "ddprun: --local-addr=127.0.0.2 reaches every worker as COURSE_LOCAL_ADDR" "status $status: $(grep -m2 -E 'LOCAL_ADDR|error' "$TMP/addr.log" | tr '\n' '|')"
nowhere=203.0.113.77
if ip -o addr show 2>/dev/null | grep -q " $nowhere/"; then
    skip "ddprun: --local_addr that is not this machine's" "$nowhere is an address of this machine"
else
    bad_flag "--local_addr that is not this machine's is refused, listing the interfaces" "--local_addr $nowhere is not an address of this machine \(.*\); interfaces here: lo " --standalone --local_addr $nowhere env
    p05=$ROOT/05_env_launch/05_env_launch
    addr_stops() {   # PROGRAM: a job of 2 whose workers were given $nowhere stops, naming it
        COURSE_LOCAL_ADDR=$nowhere run_capture 60 "$TMP/addr05.log" "$DDPRUN" --standalone --nproc_per_node=2 "$1" \
            --backend cpu --device cpu --epochs 1 --samples 1000
        local s=$?
        [[ $s -ne 0 ]] && grep -q "error: COURSE_LOCAL_ADDR=$nowhere is not an address of this machine" "$TMP/addr05.log"
    }
    make -C "$ROOT/05_env_launch" -s 05_env_launch >/dev/null 2>&1
    addr_stops "$p05"
    verdict $? "05's process group publishes COURSE_LOCAL_ADDR: an address not on this machine stops it in one line" "$(grep -m2 -E 'error|epoch' "$TMP/addr05.log" | tr '\n' '|')"
    planted=$(plant addr_ignored common/pg_cpu_setup.h '*given = netif_given_from_env();' '*given = NULL;' 05_env_launch 05_env_launch)
    [[ -n $planted ]] && ! addr_stops "$planted"
    verdict $? "planted: a process group that ignores COURSE_LOCAL_ADDR trains on, which the check above refuses" "$(planted_why addr_ignored)$(grep -m2 -E 'error|epoch' "$TMP/addr05.log" | tr '\n' '|')"
fi
bad_flag "a --local_ranks_filter beyond the node's ranks is refused" "--local_ranks_filter=0,5: give local ranks 0 to 2" --standalone --nproc_per_node=3 --local_ranks_filter=0,5 env
bad_flag "an elastic range with the static rendezvous is refused" "--nnodes=1:3 asks for an elastic job, which needs --rdzv_backend=c10d" --nnodes=1:3 --rdzv_backend=static "$WORKER"
bad_flag "an unknown --rdzv_conf key is named" "--rdzv_conf: ddprun knows join_timeout, last_call_timeout and is_host, not 'read_timeout'" --nnodes=1:2 --rdzv_conf=read_timeout=5 "$WORKER"

port=$(free_port)
run_capture $LIMIT "$TMP/alone.log" "$DDPRUN" --nnodes=2:3 --rdzv_endpoint=127.0.0.1:$port --rdzv_conf=join_timeout=2 "$WORKER" env
status=$?
[[ $status -eq 1 ]] && grep -q "error: round 0 did not form within 2 s: 1 launcher(s) joined, at least 2 needed" "$TMP/alone.log"
verdict $? "ddprun: an elastic round that never gets MIN nodes ends after join_timeout, saying so" "status $status: $(tail -n 2 "$TMP/alone.log" | tr '\n' '|')"

# ---------------------------------------------------------------- a node that leaves on a signal
# An elastic job of 1 to 2 nodes whose workers never fail (they sleep), and
# no restarts at all: a node that joins and then leaves on SIGTERM makes
# two new memberships, and the store's node goes on alone.
# leave_case DDPRUN LOG : the two launchers' run; true when the store's node
# went on alone without counting a restart, and each exited by its signal.
leave_case() {
    local ddprun=$1 log=$2 nh nl
    local port; port=$(free_port)
    local e=(--nnodes=1:2 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:$port --rdzv_id="$TAG" --rdzv_conf=last_call_timeout=1
             --max_restarts=0 "$WORKER" echo "$TAG" sleep 60)
    timeout -k 5 60 "$ddprun" "${e[@]}" >"$log.h" 2>&1 & nh=$!
    wait_for "$log.h" '^ddprun: round 0: 1 node joined'
    timeout -k 5 60 "$ddprun" "${e[@]}" >"$log.l" 2>&1 & nl=$!
    wait_for "$log.l" '^ddprun: starting 1 worker'
    kill -TERM $nl; wait $nl; sl=$?
    wait_for "$log.h" '^ddprun: round 2: 1 node joined'
    kill -INT $nh; wait $nh; sh=$?
    grep -q "^ddprun: restart requested by node 1 (.*): it leaves the job (stopped by SIGTERM); stopping this node's workers" "$log.h" &&
       grep -q '^ddprun: restarting workers in round 2 (0 restarts after failures so far, at most 0)' "$log.h"
}
leave_case "$DDPRUN" "$TMP/leave"
verdict $? "ddprun: a node stopped by SIGTERM leaves an elastic job, which goes on without it (no restart counted)" \
    "statuses: leaver $sl, host $sh: $(grep ddprun "$TMP/leave.h" | tail -n 4 | tr '\n' '|')"
[[ $sl -eq 143 && $sh -eq 130 ]]
verdict $? "ddprun: the leaving launcher exits 128+SIGTERM, the store's 128+SIGINT" "leaver $sl, store's launcher $sh"
no_leftovers "ddprun: no worker left after the nodes left" "$TAG"
# Planted (tests/lib.sh, plant): a node that leaves is counted as a failure.
# With --max_restarts=0 the job then ends instead of going on without it.
planted=$(plant leave_is_failure tools/ddprun.c \
    'snprintf(job->reason, sizeof job->reason, "it leaves the job (stopped by %s)", signal_name(sig));' \
    'snprintf(job->reason, sizeof job->reason, "it leaves the job (stopped by %s)", signal_name(sig)); post_failure_restart(job);' \
    tools ddprun)
[[ -n $planted ]] && ! leave_case "$planted" "$TMP/planted_leave" && [[ -s $TMP/planted_leave.h ]]
verdict $? "planted: a leaving node counted as a failure fails 'goes on without it'" \
    "$(planted_why leave_is_failure)$(grep ddprun "$TMP/planted_leave.h" 2>/dev/null | tail -n 3 | tr '\n' '|')"
no_leftovers "ddprun: no worker left after the planted leave" "$TAG"

# ---------------------------------------------------------------- an elastic job: join, then leave
# Chapter 06 with --global_batch_size 96: whatever the number of ranks, a
# step trains on the same 96 samples, so the run's losses and weights are
# those of one process with batch 96 (to float rounding; README of 06).
# Launchers A and B start (round 0: 2 ranks); C joins (round 1: 3 ranks,
# batch 32 each); C's host "crashes" (launcher and worker killed at once);
# A and B go on (round 2: 2 ranks) and finish.
args=(--total_epochs 300 --samples 9600 --global_batch_size 96 --features 16 --lr 0.002
      --device cpu --backend cpu --snapshot_path "$TMP/elastic/snapshot.safetensors")
run_capture 120 "$TMP/ref.log" "$PROGRAM" "${args[@]}" --snapshot_path "$TMP/ref/snapshot.safetensors"
ref_status=$?
port=$(free_port)
launcher=(timeout -k 5 150 "$DDPRUN" --nnodes=2:3 --nproc_per_node=1 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:$port
          --rdzv_id="$TAG" --max_restarts=1 --rdzv_conf=last_call_timeout=1 "$PROGRAM" "${args[@]}")
"${launcher[@]}" >"$TMP/a.log" 2>&1 & na=$!
"${launcher[@]}" >"$TMP/b.log" 2>&1 & nb=$!
wait_for "$TMP/a.log" "$TMP/b.log" '^ddprun: serving the store'
# Rank 0 runs on the store's launcher, A or B, whichever served first.
host=$TMP/a.log; grep -q '^ddprun: serving the store' "$TMP/b.log" && host=$TMP/b.log
wait_for "$host" '^\[rank 0\]: epoch  2 '
setsid "${launcher[@]}" >"$TMP/c.log" 2>&1 & nc=$!
for _ in $(seq 200); do   # until rank 0 has trained an epoch on 3 ranks
    sed -n '/x 3 rank/,$p' "$host" | grep -q '^\[rank 0\]: epoch ' && break
    sleep 0.1
done
for p in $(ps -o pid= -s "$nc"); do kill -9 "$p" 2>/dev/null; done   # its session: launcher and worker
wait "$nc" 2>/dev/null
wait $na; sa=$?; wait $nb; sb=$?
sizes=$(field --all "$host" '^\[rank 0\]: batch [0-9]+ per rank x ([0-9]+) rank' | uniq | tr '\n' ' ')
[[ $sa -eq 0 && $sb -eq 0 && $sizes == "2 3 2 " ]]
verdict $? "ddprun: an elastic job runs on 2, then 3 nodes (one joins), then 2 (one is lost), and finishes" \
    "statuses $sa $sb; world sizes '$sizes'; A: $(grep ddprun "$TMP/a.log" | tail -n 4 | tr '\n' '|') C: $(grep ddprun "$TMP/c.log" | tail -n 2 | tr '\n' '|')"
grep -q '^ddprun: restarting workers in round 1 (0 restarts after failures so far, at most 1)' "$host" &&
   grep -q '^ddprun: restarting workers in round 2 (1 restart after failures so far, at most 1)' "$host"
verdict $? "ddprun: a node joining costs no restart, a node lost costs one" "$(grep 'ddprun: restarting' "$host" | tr '\n' '|')"

# For each epoch, the loss the finished run printed last (a round that
# resumed from a snapshot prints the epochs after it again).
field --all "$host" '^\[rank 0\]: epoch +([0-9]+) \| loss ([0-9.]+)' '\1 \2' |
    awk '{ last[$1] = $2 } END { for (e in last) print e, last[e] }' | sort -n >"$TMP/elastic.losses"
field --all "$TMP/ref.log" '^epoch +([0-9]+) \| loss ([0-9.]+)' '\1 \2' >"$TMP/ref.losses"
bad=$(join "$TMP/ref.losses" "$TMP/elastic.losses" | awk '{ d = $2 - $3; if (d < 0) d = -d; if (d > 2e-6) { print "epoch " $1 ": " $3 " (one process: " $2 ")"; exit } }')
[[ $ref_status -eq 0 && $(wc -l <"$TMP/ref.losses") -eq 300 && $(wc -l <"$TMP/elastic.losses") -eq 300 && -z "$bad" ]]
verdict $? "ddprun + 06: the elastic run's 300 epoch losses equal one process's with the same global batch (within 2e-6)" \
    "reference status $ref_status, $(wc -l <"$TMP/ref.losses") and $(wc -l <"$TMP/elastic.losses") epochs; ${bad:-}"
got=$(field "$host" '^\[rank 0\]: final weight ([-0-9.]+)  bias ([-0-9.]+)' '\1 \2')
want=$(field "$TMP/ref.log" '^final weight ([-0-9.]+)  bias ([-0-9.]+)' '\1 \2')
near "${got% *}" "${want% *}" 2e-6 && near "${got#* }" "${want#* }" 2e-6
verdict $? "ddprun + 06: the elastic run ends with one process's weight and bias" "elastic '$got', one process '$want'"
no_leftovers "ddprun: no worker left after the elastic job" "$TMP/elastic/snapshot"
exit 0
