#!/usr/bin/env bash
# rehearsal.sh - a two-node job on one machine, before you try two machines.
#
# Two network namespaces play the two nodes. Each has its own network stack
# (its own loopback, its own ports, its own routing table) and they are
# joined by a virtual cable, a veth pair:
#
#     namespace c07n0-PID                         namespace c07n1-PID
#     host rehearsal-node0                        host rehearsal-node1
#     10.77.0.1/24  [c07a-PID] ==== veth ==== [c07b-PID]  10.77.0.2/24
#     ddprun --node_rank=0 (2 workers)            ddprun --node_rank=1 (3 workers)
#     serves the store on 10.77.0.1:29500         joins it at 10.77.0.1:29500
#
# so everything between the nodes crosses a real (virtual) network, exactly
# as it would between two machines: the launchers' rendezvous, the workers'
# store traffic and their TCP connections for the all-reduces. Each node also
# gets its own host name (a UTS namespace), so the ranks do not mistake the
# other node for their own host. Nothing leaves the two namespaces.
#
# Namespaces need root (CAP_NET_ADMIN). Without it the same two-launcher job
# runs on 127.0.0.1 instead, and the script says so.
#
# Each node runs in a folder of its own, OUT/node0 and OUT/node1, as on two
# machines: a relative path in the program's arguments is each node's own.
#
# Usage: 07_multinode/rehearsal.sh [OPTIONS] [-- ARGS FOR 07_multinode]
#   --mode auto|netns|loopback   (auto: namespaces when allowed)
#   --program PATH               the workers' program (07_multinode); chapter 08's
#                                rehearsal runs its GPT this way
#   --launcher ddprun|slurm      ddprun on each node (default), or what srun does: each
#                                node starts its processes itself with SLURM_PROCID,
#                                SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, MASTER_ADDR and
#                                MASTER_PORT set, and rank 0 serves the store (env://)
#   --nproc0 N, --nproc1 N       workers on node 0 and node 1 (2 and 3)
#   --max_restarts K             given to both launchers (0)
#   --node1_env NAME=VALUE       an environment variable for node 1 only (repeatable),
#                                e.g. COURSE_VERSION_OVERRIDE=9.9.9 to rehearse a version mismatch
#   --kill_node1_at_epoch E      kill -9 node 1 (launcher and workers) once node 0 reports
#                                epoch E: rehearses a lost node
#   --kill_node1_on REGEX        the same once a line of node 0's output matches REGEX (grep)
#   --restart_node1_after S      S seconds after the kill, start node 1's launcher again
#                                (the host came back); its output goes to node1-again.log
#   --out DIR                    keep node0.log, node1.log and the snapshots in DIR
#                                (snapshots of an earlier rehearsal there are removed first)
#   --deadline S                 end everything after S seconds (300)
#   --quiet                      do not print the nodes' output at the end
#
# Exit status 0 when the rehearsal passed: the job trained and learned
# weight ~ 2 and bias ~ 3 (another --program: both launchers exited 0);
# with a kill, node 0's launcher noticed the lost node and ended the job by
# itself, non-zero, within the deadline; with a kill and
# --restart_node1_after, the job went on with node 1's new launcher and both
# launchers exited 0. Everything it started is removed at exit, even after a failure
# or Ctrl-C: the processes, the veth pair and the namespaces.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DDPRUN=$ROOT/tools/ddprun
PROGRAM=$ROOT/07_multinode/07_multinode

mode=auto launcher=ddprun nproc0=2 nproc1=3 max_restarts=0 kill_epoch="" kill_on="" restart_after="" out=""
deadline=300 quiet=0
node1_env=() program_args=()
usage() { sed -n '/^# Usage:/,/^# Exit status/p' "$0" | sed '$d; s/^# \{0,1\}//' | sed '$d'; }
die_usage() {
    echo "rehearsal: error: $1" >&2
    echo "usage: $0 [OPTIONS] [-- ARGS FOR 07_multinode] (see --help)" >&2
    exit 2
}
set_option() {
    case $1 in
        --mode) mode=$2 ;;
        --launcher) launcher=$2 ;;
        --nproc0) nproc0=$2 ;;
        --nproc1) nproc1=$2 ;;
        --max_restarts) max_restarts=$2 ;;
        --node1_env) node1_env+=("$2") ;;
        --kill_node1_at_epoch) kill_epoch=$2 ;;
        --kill_node1_on) kill_on=$2 ;;
        --restart_node1_after) restart_after=$2 ;;
        --program) PROGRAM=$2 ;;
        --out) out=$2 ;;
        --deadline) deadline=$2 ;;
        *) die_usage "unknown option '$1'" ;;
    esac
}
while [[ $# -gt 0 ]]; do
    case $1 in
        --quiet) quiet=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; program_args=("$@"); break ;;
        --*=*) set_option "${1%%=*}" "${1#*=}"; shift ;;
        --*) [[ $# -ge 2 ]] || die_usage "$1 needs a value"; set_option "$1" "$2"; shift 2 ;;
        *) die_usage "unexpected argument '$1' (arguments for the program go after --)" ;;
    esac
done
[[ $mode =~ ^(auto|netns|loopback)$ ]] || die_usage "--mode must be auto, netns or loopback, got '$mode'"
[[ $launcher =~ ^(ddprun|slurm)$ ]] || die_usage "--launcher must be ddprun or slurm, got '$launcher'"
for v in "$nproc0" "$nproc1" "$max_restarts" "$deadline" ${kill_epoch:+"$kill_epoch"} ${restart_after:+"$restart_after"}; do
    [[ $v =~ ^[0-9]+$ ]] || die_usage "expected a non-negative integer, got '$v'"
done
((nproc0 >= 1 && nproc1 >= 1)) || die_usage "each node needs at least one worker"
[[ -n $kill_epoch ]] && kill_on="epoch +$kill_epoch \\|"
[[ -n $restart_after && -z $kill_on ]] && die_usage "--restart_node1_after needs --kill_node1_on or --kill_node1_at_epoch"
[[ -n $restart_after && $launcher == slurm ]] && die_usage "--restart_node1_after needs --launcher ddprun (a new launcher takes the lost one's place)"
[[ $PROGRAM == /* ]] || PROGRAM=$PWD/$PROGRAM
[[ $launcher == slurm && $max_restarts != 0 ]] && die_usage "--max_restarts needs --launcher ddprun (restarts are the launcher's job)"
for e in ${node1_env[@]+"${node1_env[@]}"}; do
    [[ $e =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die_usage "--node1_env expects NAME=VALUE, got '$e'"
done
for f in "$DDPRUN" "$PROGRAM"; do
    [[ -x $f ]] || { echo "rehearsal: error: $f is not built; run make in $ROOT first" >&2; exit 2; }
done

# ---------------------------------------------------------------- cleanup
tag=$$
ns0=c07n0-$tag ns1=c07n1-$tag veth0=c07a-$tag veth1=c07b-$tag
have_ns=0 pid0="" pid1="" keep_out=1
if [[ -z $out ]]; then out=$(mktemp -d "${TMPDIR:-/tmp}/rehearsal.XXXXXX"); keep_out=0; fi
mkdir -p "$out" || exit 2
rm -rf "$out/snapshots" "$out/node0" "$out/node1"   # each rehearsal trains from the start
mkdir -p "$out/node0" "$out/node1" || exit 2

# Kill what we started: each launcher's process group (its workers die with
# it: ddprun gives them PR_SET_PDEATHSIG), then anything still running in
# our namespaces, then the namespaces (which takes the veth pair with them).
cleanup() {
    local p
    for p in $pid0 $pid1; do kill -9 -- "-$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
    if ((have_ns)); then
        for ns in "$ns0" "$ns1"; do
            ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
        done
        # A killed process can hold its namespace's mount a moment longer
        # (then `ip netns del` fails: busy), so try again for up to 5 s.
        for _ in $(seq 25); do
            sleep 0.2
            for ns in "$ns0" "$ns1"; do
                [[ -e /run/netns/$ns ]] && ip netns del "$ns" 2>/dev/null
            done
            [[ -e /run/netns/$ns0 || -e /run/netns/$ns1 ]] || break
        done
    fi
    for p in $pid0 $pid1; do wait "$p" 2>/dev/null; done
    ((keep_out)) || rm -rf "$out"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- the network
setup_namespaces() {
    ip netns add "$ns0" 2>"$out/netns.err" || return 1
    have_ns=1
    ip netns add "$ns1" 2>>"$out/netns.err" &&
    ip link add "$veth0" type veth peer name "$veth1" 2>>"$out/netns.err" &&
    ip link set "$veth0" netns "$ns0" && ip link set "$veth1" netns "$ns1" &&
    ip -n "$ns0" addr add 10.77.0.1/24 dev "$veth0" && ip -n "$ns1" addr add 10.77.0.2/24 dev "$veth1" &&
    ip -n "$ns0" link set lo up && ip -n "$ns1" link set lo up &&
    ip -n "$ns0" link set "$veth0" up && ip -n "$ns1" link set "$veth1" up
}

free_port() {
    local port
    for _ in $(seq 50); do
        port=$((20000 + RANDOM % 20000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "$port"; return; fi
    done
    echo 29517
}

if [[ $mode != loopback ]] && setup_namespaces; then
    mode=netns master=10.77.0.1 port=29500
    # Each node its own host name too, if unshare can give it one.
    if ip netns exec "$ns0" unshare --uts true 2>/dev/null; then uts=1; else uts=0; fi
    echo "rehearsal: mode netns: node 0 in namespace $ns0 (10.77.0.1), node 1 in $ns1 (10.77.0.2), joined by veth $veth0-$veth1; store at $master:$port"
    ((uts)) || echo "rehearsal: note: unshare --uts failed, so both nodes keep this host's name (and may use shared memory between them)"
else
    [[ $mode == netns ]] && { echo "rehearsal: error: cannot create network namespaces: $(head -n 1 "$out/netns.err")" >&2; exit 1; }
    why="asked for"
    [[ $mode == auto ]] && why="network namespaces not allowed here: $(head -n 1 "$out/netns.err" 2>/dev/null)"
    mode=loopback master=127.0.0.1 port=$(free_port) uts=0
    echo "rehearsal: mode loopback ($why): both nodes on 127.0.0.1, store at port $port"
fi
rm -f "$out/netns.err"

# ---------------------------------------------------------------- the two nodes
# What srun does on one node, by hand: start NPROC processes with SLURM's
# variables, wait for them all, and fail if one failed.
# Arguments: HOSTNAME (or "") NODE NPROC FIRST_RANK TOTAL COMMAND...
slurm_node='[ -n "$1" ] && hostname "$1"; node=$2 nproc=$3 first=$4 total=$5; shift 5
pids=""
for local in $(seq 0 $((nproc - 1))); do
    SLURM_PROCID=$((first + local)) SLURM_LOCALID=$local SLURM_NODEID=$node SLURM_NTASKS=$total "$@" &
    pids="$pids $!"
done
status=0
for p in $pids; do wait "$p" || status=1; done
exit $status'

# start_node N NPROC LOG ENV... : node N's launcher (ddprun, or the srun
# stand-in), in its namespace and its folder, in a session of its own (so
# that a kill reaches all of it and not us). Sets pidN.
start_node() {
    local node=$1 nproc=$2 log=$3; shift 3
    local ns=$ns0 host=""
    ((node == 1)) && ns=$ns1
    ((uts)) && host=rehearsal-node$node
    local run=("$PROGRAM" --snapshot_path "$out/snapshots/snapshot.safetensors"
               ${program_args[@]+"${program_args[@]}"})
    local cmd
    if [[ $launcher == ddprun ]]; then
        cmd=(env "$@" "$DDPRUN" --nnodes=2 --node_rank="$node" --nproc_per_node="$nproc"
             --master_addr="$master" --master_port="$port" --max_restarts="$max_restarts" "${run[@]}")
        ((uts)) && cmd=(unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" "${cmd[@]}")
    else
        local first=$((node == 0 ? 0 : nproc0))
        cmd=(sh -c "$slurm_node" slurm-node "$host" "$node" "$nproc" "$first" $((nproc0 + nproc1))
             env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE -u GROUP_RANK
             -u COURSE_AGENT_STORE "$@" MASTER_ADDR="$master" MASTER_PORT="$port" "${run[@]}")
        ((uts)) && cmd=(unshare --uts "${cmd[@]}")
    fi
    [[ $mode == netns ]] && cmd=(ip netns exec "$ns" "${cmd[@]}")
    (cd "$out/node$node" && exec setsid "${cmd[@]}") </dev/null >"$out/$log" 2>&1 &
    if ((node == 0)); then pid0=$!; else pid1=$!; fi
}

start_node 0 "$nproc0" node0.log
start_node 1 "$nproc1" node1.log ${node1_env[@]+"${node1_env[@]}"}

# Wait for both launchers (and kill node 1 on cue), at most `deadline` seconds.
started=$SECONDS status0="" status1="" killed_at="" restarted=0
restart_pending() { [[ -n $restart_after && $restarted -eq 0 && -z $status0 ]]; }
while [[ -z $status0 || -z $status1 ]] || restart_pending; do
    if ((SECONDS - started > deadline)); then
        echo "rehearsal: FAIL: the job did not end within $deadline s (a hang); stopping it"
        exit 1
    fi
    if [[ -n $kill_on && -z $killed_at ]] && grep -qE -- "$kill_on" "$out/node0.log"; then
        kill -9 -- "-$pid1" 2>/dev/null
        ((have_ns)) && ip netns pids "$ns1" | xargs -r kill -9 2>/dev/null
        killed_at=$SECONDS
        echo "rehearsal: killed node 1 (launcher and workers, kill -9) after node 0 printed '$(grep -m1 -E -- "$kill_on" "$out/node0.log" | cut -c1-100)'"
    fi
    if restart_pending && [[ -n $killed_at && -n $status1 ]] && ((SECONDS - killed_at >= restart_after)); then
        start_node 1 "$nproc1" node1-again.log ${node1_env[@]+"${node1_env[@]}"}
        restarted=1 status1=""
        echo "rehearsal: started node 1's launcher again, $((SECONDS - killed_at)) s after the kill (output: node1-again.log)"
    fi
    if [[ -z $status0 ]] && ! kill -0 "$pid0" 2>/dev/null; then wait "$pid0"; status0=$?; fi
    if [[ -z $status1 ]] && ! kill -0 "$pid1" 2>/dev/null; then wait "$pid1"; status1=$?; fi
    sleep 0.1
done 2>/dev/null   # bash's own "Killed" notice for node 1 is no news here
pid0="" pid1=""   # both reaped
if [[ $mode == netns ]]; then
    # Proof that the nodes talked over the network: bytes node 0 received on its veth.
    bytes=$(ip -n "$ns0" -s link show dev "$veth0" 2>/dev/null | awk '/RX:/ { getline; print $1; exit }')
    echo "rehearsal: ${bytes:-?} bytes crossed the veth from node 1 to node 0"
fi

if ((quiet == 0)); then
    sed 's/^/node0| /' "$out/node0.log"
    sed 's/^/node1| /' "$out/node1.log"
    ((restarted)) && sed 's/^/node1 again| /' "$out/node1-again.log"
fi

# ---------------------------------------------------------------- verdict
if [[ -n $kill_on ]]; then
    if [[ -z $killed_at ]]; then
        echo "rehearsal: FAIL: node 0 never printed a line matching '$kill_on' (launcher status $status0)"; exit 1
    fi
    if [[ -n $restart_after ]]; then
        if ((restarted && status0 == 0 && status1 == 0)); then
            echo "rehearsal: PASS ($mode): node 1 killed and started again; the job went on and both launchers exited 0"
            exit 0
        fi
        echo "rehearsal: FAIL ($mode): node 1 killed$( ((restarted)) && echo " and started again" || echo ", never started again"); launchers exited ${status0:-?} (node 0) and ${status1:-?} (node 1)"
        exit 1
    fi
    if ((status0 != 0)); then
        echo "rehearsal: PASS ($mode): node 0's launcher ended the job with status $status0, $((SECONDS - killed_at)) s after node 1 was killed"
        exit 0
    fi
    echo "rehearsal: FAIL ($mode): node 0's launcher exited 0 although node 1 was killed"; exit 1
fi
if [[ $PROGRAM != "$ROOT/07_multinode/07_multinode" ]]; then
    if [[ $status0 -eq 0 && $status1 -eq 0 ]]; then echo "rehearsal: PASS ($mode): $nproc0 + $nproc1 workers of $(basename "$PROGRAM") on two nodes; both launchers exited 0"; exit 0; fi
    echo "rehearsal: FAIL ($mode): launchers exited $status0 (node 0) and $status1 (node 1)"; exit 1
fi
final=$(grep -o 'final weight [-0-9.e+]*  bias [-0-9.e+]*' "$out/node0.log" | tail -n 1)
weight=$(awk '{print $3}' <<<"$final") bias=$(awk '{print $5}' <<<"$final")
near() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.05) }'; }
if [[ $status0 -eq 0 && $status1 -eq 0 && -n $final ]] && near "$weight" 2 && near "$bias" 3; then
    echo "rehearsal: PASS ($mode): $nproc0 + $nproc1 workers on two nodes learned weight $weight, bias $bias (true 2, 3)"
    exit 0
fi
echo "rehearsal: FAIL ($mode): launchers exited $status0 (node 0) and $status1 (node 1); ${final:-no final weights}"
echo "rehearsal: logs: $( ((keep_out)) && echo "$out/node0.log, $out/node1.log" || echo "rerun with --out DIR to keep them")"
exit 1
