#!/usr/bin/env bash
# The finale: chapter 08's GPT trained by one job on two nodes
# (08_gpt_wikitext/rehearsal.sh on 07's two hosts: network namespaces where
# allowed, else two launchers on 127.0.0.1). Checked: the same validation
# losses as one process with the same global batch, 2 + 1 and 1 + 2 workers;
# node 1 killed mid-run and started again, the job resuming from rank 0's
# snapshot; rank 0 naming both nodes; a version or a corpus that differs on
# node 1 stops the job before training. No WikiText-2 needed: the rehearsal
# makes a small corpus.
source "$(dirname "$0")/../lib.sh"
prog=$ROOT/08_gpt_wikitext/08_gpt_wikitext
rehearsal=$ROOT/08_gpt_wikitext/rehearsal.sh
hosts=$ROOT/07_multinode/rehearsal.sh
[[ -x $prog && -x $ROOT/tools/ddprun ]] || { fail "gpt multinode: binaries" "build first (make)"; exit 1; }

probe=c08probe-$$
if ip netns add "$probe" 2>"$TMP/netns.err"; then ip netns del "$probe"; mode=netns
else mode=loopback; echo "note: network namespaces not allowed here ($(head -n 1 "$TMP/netns.err")): the rehearsal runs on 127.0.0.1"; fi

# "STEP ONE TWO" rows of the rehearsal's loss table.
table() { field --all "$1" '^ *([0-9][0-9]*)  *([0-9.]*)  *([0-9.]*)$' '\1 \2 \3'; }

# ---------------------------------------------------------------- 2 + 1 workers, node 1 lost and back
run_capture 200 "$TMP/kill.out" "$rehearsal" --mode "$mode" --quiet --out "$TMP/kill"; status=$?
rows=$(table "$TMP/kill.out" | wc -l) last=$(table "$TMP/kill.out" | tail -n 1)
[[ $status -eq 0 && $rows -ge 10 ]] && grep -q "^rehearsal: PASS ($mode): 2 + 1 workers on two hosts trained the same model as one process" "$TMP/kill.out" &&
   table "$TMP/kill.out" | awk '{ d = $2 - $3; if (d < 0) d = -d; if (d > 2e-4) bad++ } END { exit bad > 0 }'
verdict $? "gpt multinode: 2 + 1 workers on two nodes ($mode) have the validation losses of one process, batch 6 ($rows validations; last: step ${last// /, })" \
    "status $status, $rows rows: $(grep -E '^rehearsal: (PASS|FAIL)' "$TMP/kill.out" | tr '\n' '|')"
node0=$TMP/kill/hosts/node0.log
grep -q "^hosts: killed node 1 (launcher and workers, kill -9) after node 0 printed '\[rank 0\]: snapshot saved: Epoch 1 " "$TMP/kill.out" &&
   grep -q "^ddprun: node 1 has a new launcher, on .*; it rejoins the job" "$node0" &&
   grep -q "^ddprun: node 1's previous launcher has sent no heartbeat for 5 s: it is gone, and this launcher takes its place" "$TMP/kill/hosts/node1-again.log" &&
   grep -q "^\[rank 0\]: Resuming training from snapshot at Epoch [1-9]" "$node0" &&
   [[ -z $(find "$TMP/kill/hosts/node1" -name '*.safetensors') && -n $(find "$TMP/kill/hosts/node0/run/snapshots" -name '*.safetensors') ]]
verdict $? "gpt multinode: node 1 killed after the first snapshot, started again: the job resumes from rank 0's snapshot (none on node 1)" \
    "$(grep -h '^ddprun\|Resuming' "$node0" | tail -n 4 | tr '\n' '|')"
grep -q "^\[rank 0\]: ranks: 3 on 2 nodes, backend cpu$" "$node0" &&
   grep -q "^\[rank 0\]:   node 0 ([^)]*): ranks 0-1 on CPU ([0-9]* cores); cpu " "$node0" &&
   grep -q "^\[rank 0\]:   node 1 ([^)]*): rank 2 on CPU ([0-9]* cores); cpu " "$node0" &&
   [[ $(grep -m1 -n 'node 1 (' "$node0" | cut -d: -f1) -lt $(grep -m1 -n 'data: ' "$node0" | cut -d: -f1) ]]
verdict $? "gpt multinode: rank 0 names each node's host, ranks, device and backend before loading data" \
    "$(grep -h 'ranks: \|  node [01]' "$node0" | head -n 3 | tr '\n' '|')"

# ---------------------------------------------------------------- uneven the other way, on 127.0.0.1
run_capture 120 "$TMP/lo.out" "$rehearsal" --mode loopback --nproc0 1 --nproc1 2 --epochs 1 --no_kill --quiet; status=$?
[[ $status -eq 0 ]] && grep -q "^hosts: mode loopback" "$TMP/lo.out" &&
   grep -q "^rehearsal: PASS (loopback): 1 + 2 workers on two hosts trained the same model as one process" "$TMP/lo.out"
verdict $? "gpt multinode: 1 + 2 workers, two launchers on 127.0.0.1: the losses of one process" \
    "status $status: $(grep -E '^rehearsal: (PASS|FAIL)' "$TMP/lo.out" | tr '\n' '|')"

# ---------------------------------------------------------------- what must match before training
corpus=$TMP/kill/corpus   # the rehearsal's, kept by --out
other=$TMP/other; mkdir -p "$other"
cp "$corpus"/*.txt "$other"/ && echo ' the king sees a bird . ' >>"$other/valid.txt"
short=(--data_dir "$corpus" --verify_data=false --preset tiny --vocab_size 300 --max_steps 5 --num_samples 0 --device cpu --out_dir run)
run_capture 120 "$TMP/vm.out" "$hosts" --program "$prog" --nproc0 2 --nproc1 1 --node1_env COURSE_VERSION_OVERRIDE=9.9.9 --quiet --out "$TMP/vm" -- "${short[@]}"; status=$?
[[ $status -ne 0 ]] && grep -q "version check: the ranks of this job run different software; column 'course' differs" "$TMP/vm/node0.log" &&
   grep -q "error: version mismatch: course [0-9.]* on rank 0 (node 0, [^)]*) but 9\.9\.9 on rank 2 (node 1" "$TMP/vm/node1.log" &&
   ! grep -q "^\[rank 0\]: data: " "$TMP/vm/node0.log"
verdict $? "gpt multinode: another course version on node 1 stops the job before it loads data, with the version table" \
    "status $status: $(grep -h 'error' "$TMP"/vm/node*.log | head -n 2 | tr '\n' '|')"
# Two launchers by hand on 127.0.0.1, each in its own folder whose data/ is
# its own copy of the corpus, as on two machines: node 1's valid.txt has one more line.
mkdir -p "$TMP/dm0" "$TMP/dm1" && cp -r "$corpus" "$TMP/dm0/data" && cp -r "$other" "$TMP/dm1/data"
short[1]=data
port=$(free_port)
launch() { (cd "$TMP/dm$1" && timeout -k 5 100 "$ROOT/tools/ddprun" --nnodes=2 --node_rank="$1" --nproc_per_node=1 \
                --master_port="$port" "$prog" "${short[@]}") >"$TMP/dm$1.log" 2>&1; }
launch 1 & p1=$!
launch 0; status=$?
wait $p1
[[ $status -ne 0 ]] && grep -q "error: data check: rank 1 (node 1, [^)]*) has another valid split (.*): every node needs the same train.txt, valid.txt and test.txt and the same --vocab_size" "$TMP/dm1.log" &&
   ! grep -q "^\[rank 0\]: training: " "$TMP/dm0.log"
verdict $? "gpt multinode: another valid.txt on node 1 stops every rank before training, naming the split and the node" \
    "status $status: $(grep -h 'error' "$TMP"/dm[01].log | head -n 2 | tr '\n' '|')"

# ---------------------------------------------------------------- on GPUs, NCCL between the nodes
# Node 0's ranks take GPUs 0 and 1, node 1's rank (CUDA_VISIBLE_DEVICES=2)
# the third: emulated GPUs (CUDA=emu, 8 of them), or a real machine with 3.
gpus=$( (is_emu && echo 8) || (has_real_gpu && nvidia-smi -L | grep -c '^GPU') || echo 0)
if has_gpu && [[ $gpus -ge 3 ]]; then
    gpu=(--data_dir "$corpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --block_size 16
         --max_steps 4 --log_every 2 --precision fp32 --device cuda --out_dir run)
    mkdir -p "$TMP/g1" "$TMP/g0" "$TMP/gone"
    (cd "$TMP/gone" && run_capture 300 "$TMP/gone.log" "$prog" "${gpu[@]}" --batch_size 6)
    port=$(free_port)
    glaunch() { (cd "$TMP/g$1" && timeout -k 5 300 "$ROOT/tools/ddprun" --nnodes=2 --node_rank="$1" --nproc_per_node="$2" \
                   --master_port="$port" "$prog" "${gpu[@]}" --batch_size 2) >"$TMP/g$1.log" 2>&1; }
    CUDA_VISIBLE_DEVICES=2 glaunch 1 1 & p1=$!
    glaunch 0 2; status=$?
    wait $p1
    l2='l2 norm ([0-9.e+-]*)' valid='validation after step 4 .*: loss ([0-9.]*) '
    a=$(field "$TMP/gone.log" "$l2") b=$(field "$TMP/g0.log" "$l2") va=$(field "$TMP/gone.log" "$valid") vb=$(field "$TMP/g0.log" "$valid")
    # Two GPU runs agree to rounding, not to the bit (a real GPU's atomicAdd
    # adds in any order): the validation losses' last printed digit may
    # differ by one (why 1.5e-4: tests/chapters/test_08_gpt_ddp.sh).
    [[ $status -eq 0 && -n $a && -n $va ]] && rel_near "$a" "${b:-0}" 1e-6 && near "$va" "$vb" 1.5e-4 &&
       grep -q "^\[rank 0\]: ranks: 3 on 2 nodes, backend nccl$" "$TMP/g0.log" &&
       grep -q "^\[rank 0\]:   node 0 ([^)]*): ranks 0-1 on GPUs 0,1 (.*); nccl" "$TMP/g0.log" &&
       grep -q "^\[rank 0\]:   node 1 ([^)]*): rank 2 on GPU 0 (.*); nccl" "$TMP/g0.log"
    verdict $? "gpt multinode: on GPUs, NCCL between two nodes (2 + 1, fp32) equals one GPU with the whole batch (validation $vb, l2 $b vs $a)" \
        "status $status, validation '$va' vs '$vb', l2 '$a' vs '$b': $(grep -h 'error\|  node' "$TMP"/g[01].log | head -n 3 | tr '\n' '|')"
else
    skip "gpt multinode: on GPUs, NCCL between two nodes" "needs 3 GPUs (make CUDA=emu test emulates 8)"
fi

no_leftovers "gpt multinode: no process left behind" "08_gpt_wikitext/08_gpt_wikitext"
left=$(ip netns list 2>/dev/null | grep -o '^c07n[01]-[0-9]*' | while read -r ns; do kill -0 "${ns##*-}" 2>/dev/null || echo "$ns"; done)
[[ -z $left ]]; verdict $? "gpt multinode: no network namespace left behind" "left: $left"
