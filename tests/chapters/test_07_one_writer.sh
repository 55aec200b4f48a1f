#!/usr/bin/env bash
# Chapter 07's pitfall "every node saves": LOCAL_RANK 0 exists on every
# node, so a program that saves on local rank 0 writes one snapshot per node
# (several writers of one file on a shared filesystem, a different snapshot
# on each node's own disk). The chapter saves on global rank 0 only. Two
# nodes on 127.0.0.1, each given its own --snapshot_path as if it had its
# own disk: node 0 writes every snapshot, node 1 writes nothing.
source "$(dirname "$0")/../lib.sh"
bin=$ROOT/07_multinode/07_multinode
ddprun=$ROOT/tools/ddprun
if [[ ! -x $bin || ! -x $ddprun ]] && ! { make -C "$ROOT/07_multinode" -s && make -C "$ROOT/tools" -s ddprun; } >"$TMP/build.log" 2>&1; then
    fail "07: build" "make failed: $(grep -m3 -E 'error|Error' "$TMP/build.log" | tr '\n' '|')"
    exit 1
fi
train=(--total_epochs 3 --save_every 1 --keep 5 --device cpu --backend cpu)
# two_nodes BIN NAME : 2 nodes of 2 ranks each, each node its own disk; sets
# s0 s1 (statuses), on0 (snapshots on node 0's disk), on1 (files on node 1's), saved.
two_nodes() {
    local bin=$1 d=$TMP/$2 port n pids=() status=()
    port=$(free_port)
    for n in 0 1; do
        "$ddprun" --nnodes=2 --node_rank=$n --nproc_per_node=2 --master_port="$port" "$bin" "${train[@]}" \
            --snapshot_path "$d/disk$n/snapshots/snapshot.safetensors" >"$d.node$n.log" 2>&1 &
        pids[$n]=$!
    done
    for n in 0 1; do   # each within 120 s, or killed
        for _ in $(seq 1200); do kill -0 "${pids[$n]}" 2>/dev/null || break; sleep 0.1; done
        kill -9 "${pids[$n]}" 2>/dev/null; wait "${pids[$n]}"; status[$n]=$?
    done
    s0=${status[0]} s1=${status[1]}
    on0=$(ls "$d/disk0/snapshots" 2>/dev/null | grep -c '^snapshot\.[0-9]*\.safetensors$')
    on1=$(find "$d/disk1" -type f 2>/dev/null | wc -l)
    saved=$(grep -c '^\[rank 0\]: snapshot saved at step' "$d.node0.log")
    [[ $s0 -eq 0 && $s1 -eq 0 && $saved -eq 3 && $on0 -eq 3 && $on1 -eq 0 ]] && [[ -f "$d/disk0/snapshots/model.safetensors" ]]
}
two_nodes "$bin" run
verdict $? "07: across 2 nodes only global rank 0 writes: 3 snapshots and the model on node 0's disk, no file on node 1's" \
    "statuses $s0 $s1; rank 0 said 'saved' $saved times; node 0's disk has $on0 snapshots, node 1's $on1 files: $(find "$TMP/run/disk1" -type f 2>/dev/null | head -n 3 | tr '\n' ' ')"
# Planted (tests/lib.sh, plant): the pitfall itself, the epoch's snapshot
# saved on local rank 0 (every node's first worker).
planted=$(plant local_saves 07_multinode/07_multinode.c \
    $'step % opt.save_every_steps == 0);\n        if (save && dist.rank == 0)' \
    $'step % opt.save_every_steps == 0);\n        if (save && dist.env.local_rank == 0)' 07_multinode 07_multinode)
[[ -n $planted ]] && ! two_nodes "$planted" planted && [[ $on1 -gt 0 ]]
verdict $? "planted: snapshots saved on local rank 0 fail the one-writer check ($on1 files on node 1's disk)" \
    "$(planted_why local_saves)statuses $s0 $s1, node 1's disk has $on1 files"
no_leftovers "07: no process left behind" "07_multinode/07_multinode"
