#!/usr/bin/env bash
# Chapter 07: one job on two nodes. The nodes are two network namespaces
# joined by a veth pair (07_multinode/rehearsal.sh), or, where namespaces are
# not allowed, two launchers on 127.0.0.1. Checked: the result equals a
# 5-rank run on one node, every rank knows its node/rank/local rank, a lost
# node ends the job, restarts resume on both nodes, a version mismatch
# refuses to start, SLURM's and OpenMPI's variables work without ddprun,
# the address a rank advertises, and a node that never arrives is named.
source "$(dirname "$0")/../lib.sh"
bin=$ROOT/07_multinode/07_multinode
ddprun=$ROOT/tools/ddprun
rehearsal=$ROOT/07_multinode/rehearsal.sh
train=(--total_epochs 3 --device cpu --backend cpu)

if [[ ! -x $bin || ! -x $ddprun ]] && ! { make -C "$ROOT/07_multinode" -s && make -C "$ROOT/tools" -s ddprun; } >"$TMP/build.log" 2>&1; then
    fail "07: build" "make failed: $(grep -m3 -E 'error|Error' "$TMP/build.log" | tr '\n' '|')"
    exit 1
fi

# "WEIGHT BIAS CHECKSUM" from the final line of a log.
result() { field "$1" 'final weight ([-0-9.e+]*)  bias ([-0-9.e+]*) .*checksum ([0-9a-f]*)' '\1 \2 \3'; }
# same_result NAME LOG STATUS: PASS when the run succeeded and matches the 5-rank reference within 1e-5.
same_result() {
    local r w b
    r=$(result "$2"); read -r w b _ <<<"$r"
    [[ $3 -eq 0 && -n "$r" ]] && rel_near "$w" "$ref_w" 1e-5 && rel_near "$b" "$ref_b" 1e-5 && near "$w" 2 0.05 && near "$b" 3 0.05
    verdict $? "$1 (weight $w, bias $b)" "status $3, got '${r:-no final line}', 5 ranks on one node got $ref_w $ref_b: $(grep -m2 -E 'error|FAIL' "${2%/*}"/*.log "$2" 2>/dev/null | tr '\n' '|')"
}

# Can this machine make network namespaces? (root with CAP_NET_ADMIN)
probe=c07probe-$$
if ip netns add "$probe" 2>"$TMP/netns.err"; then ip netns del "$probe"; netns=1
else netns=0; why_no_ns="network namespaces not allowed here ($(head -n 1 "$TMP/netns.err")): the loopback variant covers the rest"; fi
mode=$([[ $netns -eq 1 ]] && echo netns || echo loopback)

# ---------------------------------------------------------------- reference: 5 ranks, one node
run_capture 120 "$TMP/ref.log" "$ddprun" --standalone --nproc_per_node=5 "$bin" "${train[@]}" --snapshot_path "$TMP/ref/s.safetensors"
read -r ref_w ref_b ref_sum <<<"$(result "$TMP/ref.log")"
if [[ -z "${ref_w:-}" ]]; then
    fail "07: 5 ranks on one node (the reference)" "no final line: $(tail -n 3 "$TMP/ref.log" | tr '\n' '|')"
    exit 1
fi

# ---------------------------------------------------------------- two nodes in namespaces
if [[ $netns -eq 1 ]]; then
    run_capture 120 "$TMP/ns.out" "$rehearsal" --mode netns --quiet --out "$TMP/ns" -- "${train[@]}"; status=$?
    same_result "07: two nodes in network namespaces, 2 + 3 workers, match 5 ranks on one node" "$TMP/ns/node0.log" $status
    ok=1
    for r in 0 1 2 3 4; do
        node=$((r < 2 ? 0 : 1)) local=$((r < 2 ? r : r - 2))
        grep -q "^\[rank $r\]: \[node $node | rank $r | local $local\] host " "$TMP/ns/node$node.log" || { ok=0; echo "missing start line of rank $r"; }
    done
    [[ $ok -eq 1 ]] && grep -q "^\[rank 0\]:   node 0 ([^)]*): ranks 0-1 on " "$TMP/ns/node0.log" && grep -q "^\[rank 0\]:   node 1 ([^)]*): ranks 2-4 on " "$TMP/ns/node0.log"
    verdict $? "07: start lines [node N | rank R | local L] right for all 5 ranks, and rank 0's layout" "$(grep -h '\[node' "$TMP"/ns/node*.log | cut -c1-60 | tr '\n' '|')"
    grep -q "^\[rank 3\]: \[node 1 | rank 3 | local 1\].* advertises 10\.77\.0\.2 (interface c07b-[0-9]*, the route to MASTER_ADDR 10\.77\.0\.1)" "$TMP/ns/node1.log" &&
       grep -q "^\[rank 0\]: \[node 0 | rank 0 | local 0\].* advertises 10\.77\.0\.1 " "$TMP/ns/node0.log"
    verdict $? "07: each node advertises its own namespace's address (the route to MASTER_ADDR)" "$(grep -h 'advertises' "$TMP"/ns/node*.log | sed 's/.*advertises//' | head -n 2 | tr '\n' '|')"
    bytes=$(field "$TMP/ns.out" '^rehearsal: ([0-9]*) bytes crossed the veth')
    [[ -n "$bytes" && "$bytes" -gt 10000 ]] && grep -q "TCP with 3" "$TMP/ns/node0.log"
    verdict $? "07: the nodes talked over the veth ($bytes bytes), TCP between nodes" "bytes '${bytes:-?}'; $(grep -h 'backend' "$TMP/ns/node0.log" | tr '\n' '|')"
else
    skip "07: two nodes in network namespaces" "$why_no_ns"
fi

# ---------------------------------------------------------------- two launchers on 127.0.0.1
run_capture 120 "$TMP/lo.out" "$rehearsal" --mode loopback --quiet --out "$TMP/lo" -- "${train[@]}"; status=$?
same_result "07: two launchers on 127.0.0.1, 2 + 3 workers, match 5 ranks on one node" "$TMP/lo/node0.log" $status
read -r _ _ same_mode_sum <<<"$(result "$TMP/$([[ $netns -eq 1 ]] && echo ns || echo lo)/node0.log")"

# ---------------------------------------------------------------- a lost node
COURSE_TIMEOUT=20 run_capture 120 "$TMP/kill.out" "$rehearsal" --quiet --deadline 60 --kill_node1_at_epoch 3 --out "$TMP/kill" -- \
    --total_epochs 100000 --save_every 100000 --device cpu --backend cpu; status=$?
[[ $status -eq 0 ]] && grep -q "node 0's launcher ended the job with status [1-9]" "$TMP/kill.out" &&
   grep -qE "rank [234] closed the connection|rank [234] .*(died|lost|closed)|node 1 .*heartbeat" "$TMP/kill/node0.log" &&
   grep -q "^ddprun: root cause\|^ddprun: .*node 1" "$TMP/kill/node0.log"
verdict $? "07: node 1 killed (kill -9) mid-run: node 0's launcher ends non-zero, naming the lost rank ($mode)" "status $status: $(tail -n 2 "$TMP/kill.out" | tr '\n' '|') $(grep -h -E 'error|ddprun: root' "$TMP/kill/node0.log" | head -n 2 | tr '\n' '|')"

# ---------------------------------------------------------------- restarts on both nodes
# Rank 3 (on node 1) fails at step 150, in epoch 2; the snapshot of epoch 2
# was written at step 126. Node 1's launcher restarts its workers and tells
# node 0's, which restarts too; both resume and end bit-identical to the
# uninterrupted run.
run_capture 120 "$TMP/rs.out" "$rehearsal" --quiet --max_restarts 1 --out "$TMP/rs" -- "${train[@]}" --fail_rank 3 --fail_step 150; status=$?
read -r _ _ rs_sum <<<"$(result "$TMP/rs/node0.log")"
[[ $status -eq 0 && -n "${rs_sum:-}" && "$rs_sum" == "${same_mode_sum:-x}" ]] &&
   grep -q "^ddprun: restarting workers (restart 1 of 1)" "$TMP/rs/node0.log" &&
   grep -q "^ddprun: restarting workers (restart 1 of 1)" "$TMP/rs/node1.log" &&
   grep -q "fault injection: rank 3 on node 1" "$TMP/rs/node1.log" &&
   grep -q "Resuming training from snapshot at Epoch 2, sample 0 (step 126)" "$TMP/rs/node0.log"
verdict $? "07: a worker of node 1 fails: both nodes restart and resume, parameters byte-identical ($rs_sum, $mode)" "status $status, checksum '${rs_sum:-}' vs '${same_mode_sum:-}': $(grep -h '^ddprun' "$TMP"/rs/node*.log | tail -n 3 | tr '\n' '|')"

# ---------------------------------------------------------------- version mismatch
run_capture 120 "$TMP/vm.out" "$rehearsal" --quiet --node1_env COURSE_VERSION_OVERRIDE=9.9.9 --out "$TMP/vm" -- "${train[@]}"; status=$?
errors=$(cat "$TMP"/vm/node*.log | grep -c "^\[rank [0-4]\]: \[rank [0-4]\] error: version mismatch: course 0\.1\.0 on rank 0 (node 0, [^)]*) but 9\.9\.9 on rank 2 (node 1")
tables=$(cat "$TMP"/vm/node*.log | grep -c "version check: the ranks of this job run different software; column 'course' differs")
[[ $status -ne 0 && $errors -eq 5 && $tables -eq 1 ]] &&
   grep -qE "^\[rank 0\]: +4 +1 +[^ ]+ +9\.9\.9 .*<- differs from rank 0" "$TMP/vm/node0.log" &&
   grep -qE "^\[rank 0\]: +1 +0 +[^ ]+ +0\.1\.0 " "$TMP/vm/node0.log" &&
   ! grep -q "epoch  *0 |" "$TMP/vm/node0.log"
verdict $? "07: a version mismatch on node 1 stops all 5 ranks before training, one table naming the column" "status $status, $errors error lines of 5, $tables tables: $(grep -h 'rank 0\]' "$TMP/vm/node0.log" | head -n 4 | tr '\n' '|')"

# ---------------------------------------------------------------- SLURM and OpenMPI, no launcher
# No ddprun: the processes get SLURM's (or OpenMPI's) variables and
# MASTER_ADDR/PORT, as srun or mpirun would set them, and rank 0 serves the
# store itself (env://). Both must equal a 2-rank ddprun run.
run_capture 60 "$TMP/two.log" "$ddprun" --standalone --nproc_per_node=2 "$bin" "${train[@]}" --snapshot_path "$TMP/two/s.safetensors"
read -r _ _ two_sum <<<"$(result "$TMP/two.log")"
hand_run() {   # hand_run NAME VARS-FOR-RANK-0 -- VARS-FOR-RANK-1
    local name=$1 port; port=$(free_port); shift
    local vars0=() vars1=()
    while [[ $1 != -- ]]; do vars0+=("$1"); shift; done; shift; vars1=("$@")
    env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u COURSE_AGENT_STORE MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "${vars1[@]}" \
        timeout -k 5 60 "$bin" "${train[@]}" --snapshot_path "$TMP/$name/s.safetensors" >"$TMP/$name.1.log" 2>&1 & local p1=$!
    env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u COURSE_AGENT_STORE MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "${vars0[@]}" \
        timeout -k 5 60 "$bin" "${train[@]}" --snapshot_path "$TMP/$name/s.safetensors" >"$TMP/$name.0.log" 2>&1; local s0=$?
    wait $p1; local s1=$?
    echo "$s0 $s1"
}
read -r s0 s1 <<<"$(hand_run slurm SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_LOCALID=0 SLURM_NODEID=0 -- SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=1 SLURM_NODEID=0)"
read -r _ _ sum <<<"$(result "$TMP/slurm.0.log")"
[[ $s0 -eq 0 && $s1 -eq 0 && -n "${two_sum:-}" && "${sum:-}" == "$two_sum" ]] && grep -q "started by SLURM variables" "$TMP/slurm.0.log" &&
   grep -q "^\[node 0 | rank 1 | local 1\]" "$TMP/slurm.1.log"
verdict $? "07: SLURM variables set by hand, rank 0 serving the store: same parameters as ddprun ($sum)" "statuses $s0 $s1, checksum '${sum:-}' vs '${two_sum:-}': $(tail -n 2 "$TMP/slurm.1.log" | tr '\n' '|')"
read -r s0 s1 <<<"$(hand_run ompi OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=0 OMPI_COMM_WORLD_LOCAL_SIZE=2 -- \
                                  OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=1 OMPI_COMM_WORLD_LOCAL_SIZE=2)"
read -r _ _ sum <<<"$(result "$TMP/ompi.0.log")"
[[ $s0 -eq 0 && $s1 -eq 0 && "${sum:-}" == "${two_sum:-x}" ]] && grep -q "started by OpenMPI variables" "$TMP/ompi.0.log"
verdict $? "07: OpenMPI variables set by hand: same parameters as ddprun" "statuses $s0 $s1, checksum '${sum:-}' vs '${two_sum:-}': rank 0: $(tail -n 2 "$TMP/ompi.0.log" | tr '\n' '|') rank 1: $(tail -n 2 "$TMP/ompi.1.log" | tr '\n' '|')"
# Variables set by hand name the ranks, but no mpirun serves the job: joining
# MPI would make each process a job of its own (MPI rank 0 of 1), so the
# program does not join it, and --backend mpi says why in one line.
ompi_mpi() {   # ompi_mpi PROGRAM LOG : PASS-able when PROGRAM refuses --backend mpi in one line
    run_capture 30 "$2" env -u RANK -u WORLD_SIZE -u PMIX_RANK -u PMI_SIZE OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=1 \
        MASTER_ADDR=127.0.0.1 MASTER_PORT="$(free_port)" "$1" --total_epochs 1 --device cpu --backend mpi --snapshot_path "${2%.log}/s.safetensors"; status=$?
    [[ $status -eq 1 && $(grep -c . "$2") -eq 1 ]] && grep -q "error: --backend mpi needs a job started by an MPI launcher" "$2"
}
ompi_mpi "$bin" "$TMP/ompi_mpi.log"
verdict $? "07: OpenMPI variables set by hand, --backend mpi: one line, no MPI launcher started this job" "status $status: $(head -c 300 "$TMP/ompi_mpi.log")"
# Planted (tests/lib.sh, plant): OMPI_COMM_WORLD_SIZE alone taken for mpirun.
planted=$(plant ompi_by_hand common/launch_env.h 'return launch_env_has("PMIX_RANK")' \
    'return launch_env_has("OMPI_COMM_WORLD_SIZE") || launch_env_has("PMIX_RANK")' 07_multinode 07_multinode)
[[ -n $planted ]] && ! ompi_mpi "$planted" "$TMP/ompi_planted.log" && [[ -s $TMP/ompi_planted.log ]]
verdict $? "07 planted: OMPI_COMM_WORLD_SIZE alone taken for mpirun fails the check above (a job of its own joins MPI)" "$(planted_why ompi_by_hand)status $status: $(head -c 200 "$TMP/ompi_planted.log" 2>/dev/null)"

if [[ $netns -eq 1 ]]; then
    run_capture 120 "$TMP/sl.out" "$rehearsal" --mode netns --launcher slurm --quiet --out "$TMP/sl" -- "${train[@]}"; status=$?
    same_result "07: SLURM-style start on two namespaces (rank 0 serves the store on 10.77.0.1) matches 5 ranks" "$TMP/sl/node0.log" $status
else
    skip "07: SLURM-style start on two namespaces" "$why_no_ns"
fi

# ---------------------------------------------------------------- which address a rank advertises
run_capture 30 "$TMP/if1.log" env COURSE_SOCKET_IFNAME==nosuch0 "$bin" --total_epochs 1 --snapshot_path "$TMP/if/s.safetensors"; status=$?
[[ $status -eq 1 && $(wc -l <"$TMP/if1.log") -eq 1 ]] &&
   grep -q "^error: COURSE_SOCKET_IFNAME='=nosuch0' matches no interface .*; interfaces here: .*lo (127\.0\.0\.1" "$TMP/if1.log"
verdict $? "07: an interface spec that matches nothing: one line listing the interfaces" "status $status: $(head -c 300 "$TMP/if1.log")"
run_capture 30 "$TMP/if2.log" env -u COURSE_SOCKET_IFNAME GLOO_SOCKET_IFNAME=lo NCCL_SOCKET_IFNAME=nosuch "$bin" --total_epochs 1 --snapshot_path "$TMP/if/s.safetensors"; status=$?
[[ $status -eq 0 ]] && grep -q "advertises 127\.0\.0\.1 (interface lo, chosen by GLOO_SOCKET_IFNAME=lo)" "$TMP/if2.log"
verdict $? "07: GLOO_SOCKET_IFNAME wins over NCCL_SOCKET_IFNAME; a named loopback is used" "status $status: $(head -n 1 "$TMP/if2.log")"
if [[ $netns -eq 1 ]]; then
    run_capture 120 "$TMP/if3.out" "$rehearsal" --mode netns --quiet --node1_env 'NCCL_SOCKET_IFNAME=^docker,lo' --out "$TMP/if3" -- --total_epochs 1 --device cpu; status=$?
    [[ $status -eq 0 ]] && grep -q "^\[rank 2\]: .* advertises 10\.77\.0\.2 (interface c07b-[0-9]*, chosen by NCCL_SOCKET_IFNAME=^docker,lo)" "$TMP/if3/node1.log"
    verdict $? "07: NCCL_SOCKET_IFNAME=^docker,lo on node 1 picks its veth address" "status $status: $(grep -h 'advertises\|error' "$TMP/if3/node1.log" | head -n 2 | tr '\n' '|')"
else
    skip "07: NCCL_SOCKET_IFNAME=^docker,lo on node 1 picks its veth address" "$why_no_ns"
fi

# ---------------------------------------------------------------- a node that never arrives
port=$(free_port)
COURSE_TIMEOUT=6 run_capture 60 "$TMP/alone.log" "$ddprun" --nnodes=2 --node_rank=0 --nproc_per_node=2 --master_port="$port" "$bin" "${train[@]}"; status=$?
[[ $status -eq 1 ]] && grep -q "^ddprun: waiting for nodes: 1 of 2 joined (node 0: 2 workers); missing: node 1" "$TMP/alone.log" &&
   grep -q "missing: node 1\. The store is at 127\.0\.0\.1:$port .*firewall blocking port $port.*wrong network interface" "$TMP/alone.log"
verdict $? "07: a node that never arrives: waiting lines, then the missing node, address, port and causes" "status $status: $(tail -n 2 "$TMP/alone.log" | tr '\n' '|')"

# ---------------------------------------------------------------- nothing left behind
no_leftovers "07: no process left behind" "$ROOT/07_multinode/07_multinode"
left=""
for ns in $(ip netns list 2>/dev/null | grep -o '^c07n[01]-[0-9]*'); do
    kill -0 "${ns##*-}" 2>/dev/null || left="$left $ns"   # its rehearsal is gone, the namespace is not
done
[[ -z "$left" ]]
verdict $? "07: no network namespace left behind" "left:$left"; for ns in $left; do ip netns del "$ns"; done
