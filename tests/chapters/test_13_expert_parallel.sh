# Chapter 13, expert parallelism: a mixture of experts whose experts are
# spread over --ep ranks (with data parallelism over --dp) trains the model
# one process trains with the same total batch - dropless, and with drops
# when the one process counts capacity over the groups of tokens the ranks
# hold (--capacity_groups) - in weights, validation loss and, without
# clipping, AdamW's moments; the traffic the all-to-alls carry equals the
# formula; snapshots and the saved model are whole (a run resumes with
# another --ep, --generate samples); bad layouts are refused. On CPU ranks
# in every build and under mpirun; on GPUs (emulated, with NCCL) with every
# expert on each GPU and with the experts spread over the GPUs (ep 2, dp 2
# x ep 2). Each check comes with a planted bug (tests/lib.sh, plant) that
# it catches.
source "$(dirname "$0")/../lib.sh"
prog="$ROOT/13_expert_parallel/13_expert_parallel"
compare="$ROOT/tests/unit/test_gpt_compare"
unit="$ROOT/tests/unit/test_gpt_moe"
[[ -x "$prog" && -x "$compare" && -x "$unit" ]] || { fail "ep: binaries" "build first (make)"; exit 1; }
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT COURSE_BACKEND
export OMP_NUM_THREADS=1

# A small corpus in WikiText's layout (tests/lib.sh; no real data needed).
gpt_corpus "$TMP/corpus"
common=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000)
cpu=("${common[@]}" --device cpu --n_expert 4 --moe_top_k 2 --max_steps 15)
valid='validation after step [0-9]* .*: loss ([0-9.]*) ' sum='checksum ([0-9a-f]*),'
# The traffic line: ranks, numbers forward and backward, the formula's each way.
traffic='^traffic per step, all ([0-9]*) ranks: forward ([0-9]*) numbers .* backward ([0-9]*) .* ranks = ([0-9]*) each way'

# same ONE MANY TOL [STATUS]: the run MANY (its output $TMP/MANY, its model
# $TMP/MANY.d) trained the model the run ONE did: the saved models differ
# by at most TOL relative (tests/unit/test_gpt_compare), the validation
# losses too. Sets r, va and vb.
same() {
    local one=$1 many=$2 tol=$3 status=${4:-0}
    r=$(models_apart "$TMP/$one.d/model.safetensors" "$TMP/$many.d/model.safetensors")
    va=$(field "$TMP/$one" "$valid"); vb=$(field "$TMP/$many" "$valid")
    [[ $status -eq 0 && -n $r ]] && near "$r" 0 "$tol" && rel_near "$va" "$vb" "$tol"
}
run() { local name=$1; shift; run_capture 120 "$TMP/$name" "$prog" "${cpu[@]}" "$@" --out_dir "$TMP/$name.d"; }

# ---------------------------------------------------------------- on GPUs
# The mixture on the GPU model (gpt/gpt_cuda_moe.cuh), on emulated GPUs
# whose ranks talk NCCL (or real ones): the experts spread over the GPUs
# (--ep 2: the counts and the rows exchanged on device buffers), and with
# every expert on each GPU (ep 1, one GPU). Each rank counts capacity over
# its own micro-batch, as one process does with --capacity_groups 2 (4 for
# 4 ranks). An emulated GPU is slow: blocks of 16 tokens, 6 steps, and a
# corpus whose validation and test splits are cut to a fifth (evaluating
# them was most of a run).
if has_gpu; then
    gpu_start=$SECONDS
    mkdir -p "$TMP/small"
    cp "$TMP/corpus/train.txt" "$TMP/small/"
    for split in valid test; do head -c 1200 "$TMP/corpus/$split.txt" >"$TMP/small/$split.txt"; done
    gpu=(--data_dir "$TMP/small" "${common[@]:2}" --n_expert 4 --moe_top_k 2 --max_steps 6 --block_size 16
         --capacity_factor 1 --grad_clip 0 --save_every 1)
    # fp32, with drops, unclipped: ep 2 (2 GPUs holding 2 of the 4 experts
    # each) x batch 4 against one CPU process x batch 8 counting capacity
    # over the same 2 groups: weights, validation loss and AdamW's moments
    # (a missing 1/N would pass the weights alone).
    grun() { local name=$1; shift; run_capture 300 "$TMP/$name" "$prog" "${gpu[@]}" "$@" --out_dir "$TMP/$name.d" \
        --snapshot_path "$TMP/$name.d/s.safetensors"; }
    grun g_cpu --device cpu --batch_size 8 --capacity_groups 2
    grun g_ep2 --device cuda --precision fp32 --batch_size 4 --ep 2; status=$?
    na=$(snapshot_norms "$TMP/g_cpu.d"); nb=$(snapshot_norms "$TMP/g_ep2.d")
    same g_cpu g_ep2 1e-5 $status && norms_near "$na" "$nb" 1e-5 && grep -Eq '\| dropped [0-9.]*[1-9][0-9.]*%' "$TMP/g_ep2" &&
        grep -q 'backend nccl' "$TMP/g_ep2"
    verdict $? "ep gpu: ep 2 (2 GPUs, 2 of 4 experts each) x batch 4 with drops, unclipped, equals one CPU process x batch 8 in fp32 within 1e-5: weights ($r), validation, AdamW's moments (l2 of p, m, v: $nb vs $na; $(grep -m1 -o 'backend [a-z]*' "$TMP/g_ep2"))" \
        "status $status, models '$r' apart, valid $va vs $vb, norms '$nb' vs '$na': $(grep -m1 error "$TMP/g_ep2")"
    # Its all-to-alls carried the formula less the dropped rows, as on the CPU.
    got=$(field "$TMP/g_ep2" "$traffic" '\2 \3') kept=$(field "$TMP/g_ep2" ' ([0-9]*) less the dropped rows' '\1')
    [[ -n $kept && $got == "$kept $kept" ]]
    verdict $? "ep gpu: the GPUs' exchanges carried the formula less the dropped rows, forward and backward ($got)" \
        "got '$got', kept '$kept'"
    # Planted in the GPU path: the experts' outputs sent back in expert
    # order, not in the order their rows came (the inverse permutation
    # applied the wrong way round).
    planted=$(PLANT_CUDA=emu plant gpu_order gpt/gpt_cuda_moe.cuh 'moe_permute(cx, xa, xb, y->order, R, C, false);' \
        'moe_permute(cx, xa, xb, y->order, R, C, true);' 13_expert_parallel 13_expert_parallel)
    [[ -n $planted ]] && run_capture 300 "$TMP/pl_order" "$planted" "${gpu[@]}" --device cuda --precision fp32 \
        --batch_size 4 --ep 2 --out_dir "$TMP/pl_order.d" && ! same g_cpu pl_order 1e-5 && [[ -n $r ]]
    verdict $? "ep gpu planted: the experts' outputs sent back in the wrong order (ep 2) are caught (models $r apart)" \
        "$(planted_why gpu_order)relative '$r'"
    # dp 2 x ep 2 on 4 GPUs, dropless, unclipped: dense gradients averaged
    # over all 4, each expert's over its 2 replicas (divided by 4).
    grun d_cpu --device cpu --batch_size 8 --capacity_groups 4 --capacity_factor 0
    grun d_gpu --device cuda --precision fp32 --batch_size 2 --dp 2 --ep 2 --capacity_factor 0; status=$?
    na=$(snapshot_norms "$TMP/d_cpu.d"); nb=$(snapshot_norms "$TMP/d_gpu.d")
    same d_cpu d_gpu 1e-5 $status && norms_near "$na" "$nb" 1e-5 && grep -q '| dropped 0.00%' "$TMP/d_gpu"
    verdict $? "ep gpu: dp 2 x ep 2 (4 GPUs) x batch 2, dropless, unclipped, equals one CPU process x batch 8 in fp32 within 1e-5: weights ($r), validation, AdamW's moments ($nb vs $na)" \
        "status $status, models '$r' apart, valid $va vs $vb, norms '$nb' vs '$na': $(grep -m1 error "$TMP/d_gpu")"
    # ep 4 on 4 GPUs, one expert each, with drops, unclipped: capacity
    # counted over each GPU's 2 sequences, as one process does over 4 groups.
    grun e_cpu --device cpu --batch_size 8 --capacity_groups 4
    grun e_gpu --device cuda --precision fp32 --batch_size 2 --ep 4; status=$?
    na=$(snapshot_norms "$TMP/e_cpu.d"); nb=$(snapshot_norms "$TMP/e_gpu.d")
    same e_cpu e_gpu 1e-5 $status && norms_near "$na" "$nb" 1e-5 && grep -Eq '\| dropped [0-9.]*[1-9][0-9.]*%' "$TMP/e_gpu"
    verdict $? "ep gpu: ep 4 (4 GPUs, 1 of 4 experts each) x batch 2 with drops, unclipped, equals one CPU process x batch 8 in fp32 within 1e-5: weights ($r), validation, AdamW's moments ($nb vs $na)" \
        "status $status, models '$r' apart, valid $va vs $vb, norms '$nb' vs '$na': $(grep -m1 error "$TMP/e_gpu")"
    # Planted in the GPU kernel: gates not renormalised (one GPU, every expert).
    planted=$(PLANT_CUDA=emu plant gpu_gates gpt/gpt_cuda_moe.cuh 'gate[(size_t)n * K + k] = (float)(p[ch[k]] / kept);' \
        'gate[(size_t)n * K + k] = p[ch[k]];' 13_expert_parallel 13_expert_parallel)
    [[ -n $planted ]] && run_capture 300 "$TMP/pl_gpu" "$planted" "${gpu[@]}" --device cuda --precision fp32 \
        --batch_size 8 --capacity_groups 2 --out_dir "$TMP/pl_gpu.d" && ! same g_cpu pl_gpu 1e-5 && [[ -n $r ]]
    verdict $? "ep gpu planted: gates not renormalised in the GPU kernel are caught (models $r apart)" \
        "$(planted_why gpu_gates)relative '$r'"
    # bf16, clipped: one GPU holding every expert x batch 8 against ep 2 x
    # batch 4, within 08's 2e-2.
    grun h_one --device cuda --precision bf16 --batch_size 8 --capacity_groups 2 --grad_clip 1
    grun h_ep2 --device cuda --precision bf16 --batch_size 4 --ep 2 --grad_clip 1; status=$?
    same h_one h_ep2 2e-2 $status
    verdict $? "ep gpu: bf16, clipped, ep 2 x batch 4 equals one GPU x batch 8 within 2e-2 (models $r apart, validation $va vs $vb)" \
        "status $status, models '$r' apart, valid $va vs $vb: $(grep -m1 error "$TMP/h_ep2")"
    echo "info: the GPU section took $((SECONDS - gpu_start)) s"
else
    for what in "ep 2 with drops equals one CPU process in fp32" "the exchanges carried the formula" \
                "planted: outputs sent back in the wrong order" "dp 2 x ep 2 dropless equals one CPU process in fp32" \
                "ep 4 with drops equals one CPU process in fp32" "planted: gates not renormalised" "bf16, ep 2 equals one GPU"; do
        skip "ep gpu: $what" "no GPU here (make CUDA=emu test runs it on the emulated GPU)"
    done
fi

# ---------------------------------------------------------------- on CPU ranks, every build
cpu_paths "ep" || { no_leftovers "ep: no process left behind" "13_expert_parallel/13_expert_parallel"; exit 0; }

# The layer's own rules (tests/unit/test_gpt_moe.c): renormalised gates,
# dropped tokens on the residual stream, capacity per group, the shards.
"$unit" >"$TMP/unit" 2>&1; status=$?
sed 's/^PASS /PASS ep unit: /; s/^FAIL /FAIL ep unit: /' "$TMP/unit" | grep -E '^(PASS|FAIL)'
[[ $status -eq 0 ]] || fail "ep unit: test_gpt_moe" "exited with status $status"
# Planted in the unit's copy: gates not renormalised; a dropped token
# leaving the block with nothing instead of its residual stream.
for bug in gates residual; do
    if [[ $bug == gates ]]; then
        old='y->gate[(size_t)n * K + k] = (gpt_real)(p[ch[k]] / kept);' new='y->gate[(size_t)n * K + k] = p[ch[k]];'
        want='every token.s top-2 gates add up to 1' what='gates not renormalised'
    else
        old='memcpy(o, res + (size_t)n * C, sizeof(gpt_real) * C); // the residual'
        new='memset(o, 0, sizeof(gpt_real) * C); if (y->slot[(size_t)n * K] >= 0) memcpy(o, res + (size_t)n * C, sizeof(gpt_real) * C); // the residual'
        want='whose every choice was dropped leave the block' what='dropped tokens losing their residual'
    fi
    planted=$(plant "moe_$bug" gpt/moe.h "$old" "$new" tests unit/test_gpt_moe)
    [[ -n $planted ]] && ! "$planted" >"$TMP/unit_$bug" 2>&1 && grep -q "^FAIL moe: .*$want" "$TMP/unit_$bug"
    verdict $? "ep planted: $what is caught by test_gpt_moe" "$(planted_why "moe_$bug")$(grep -m1 FAIL "$TMP/unit_$bug" 2>/dev/null)"
done

# Dropless. One process holding every expert with batch 8 is the reference;
# it counts the balancing loss over the groups of sequences the ranks hold
# (--capacity_groups: 2 for ep 2 with 4 sequences each, 4 for 4 ranks).
run one2 --batch_size 8 --capacity_groups 2
run ep2 --batch_size 4 --ep 2
same one2 ep2 1e-6 $?
verdict $? "ep: ep 2 equals one process, dropless (fp32, CPU: models $r apart, valid $vb)" "relative '$r', valid $va vs $vb: $(grep -m1 error "$TMP/ep2")"
run one4 --batch_size 8 --capacity_groups 4
run ep4 --batch_size 2 --ep 4
same one4 ep4 1e-6 $?
verdict $? "ep: ep 4 equals one process, dropless (models $r apart)" "relative '$r', valid $va vs $vb: $(grep -m1 error "$TMP/ep4")"
run mesh --batch_size 2 --dp 2 --ep 2
same one4 mesh 1e-6 $?
verdict $? "ep: dp 2 x ep 2 equals one process, dropless (models $r apart)" "relative '$r', valid $va vs $vb: $(grep -m1 error "$TMP/mesh")"
# Planted: every gradient, the experts' too, averaged over all the ranks as
# the dense ones are: each expert gets the others' gradients mixed in.
planted=$(plant expert_avg gpt/model.h 'model_average_experts(m, pg); // chapter 13' \
    'ddp_average_gradients_with(pg, m->host.grads, m->host.num_params, m->grad_compress);' 13_expert_parallel 13_expert_parallel)
[[ -n $planted ]] && run_capture 120 "$TMP/pl_avg" "$planted" "${cpu[@]}" --batch_size 2 --dp 2 --ep 2 --out_dir "$TMP/pl_avg.d" &&
    ! same one4 pl_avg 1e-6 && [[ -n $r ]]
verdict $? "ep planted: the experts' gradients averaged with the dense ones is caught (models $r apart)" "$(planted_why expert_avg)relative '$r'"

# With drops (--capacity_factor 1): the ranks drop the tokens past each
# expert's capacity of their own micro-batch; one process with
# --capacity_groups 4 counts over the same tokens and drops the same ones.
run d_one4 --batch_size 8 --capacity_groups 4 --capacity_factor 1
run d_ep4 --batch_size 2 --ep 4 --capacity_factor 1
same d_one4 d_ep4 1e-6 $?; equal=$?
drops=$(field "$TMP/d_ep4" '^  layer 0: .*dropped ([0-9.]*)%')
[[ $equal -eq 0 && -n $drops && $drops != 0.00 ]]
verdict $? "ep: ep 4 with drops ($drops% of layer 0's assignments) equals one process counting capacity over the same groups (models $r apart)" \
    "relative '$r', valid $va vs $vb, drops '$drops': $(grep -m1 error "$TMP/d_ep4")"
run d_mesh --batch_size 2 --dp 2 --ep 2 --capacity_factor 1
same d_one4 d_mesh 1e-6 $?
verdict $? "ep: dp 2 x ep 2 with drops equals one process (models $r apart)" "relative '$r', valid $va vs $vb: $(grep -m1 error "$TMP/d_mesh")"
# Planted: capacity counted over contiguous quarters of the one process's
# batch, not the sequences each rank holds (j mod 4).
planted=$(plant capacity_group gpt/moe.h 'int g = (n / T) % G, e = y->choice[(size_t)n * K + k];' \
    'int g = n * G / N, e = y->choice[(size_t)n * K + k];' 13_expert_parallel 13_expert_parallel)
[[ -n $planted ]] && run_capture 120 "$TMP/pl_cap" "$planted" "${cpu[@]}" --batch_size 8 --capacity_groups 4 --capacity_factor 1 \
    --out_dir "$TMP/pl_cap.d" && ! same pl_cap d_ep4 1e-6 && [[ -n $r ]]
verdict $? "ep planted: capacity counted over the wrong tokens is caught (models $r apart)" "$(planted_why capacity_group)relative '$r'"

# Without clipping, AdamW's moments too (a gradient scaled by a constant
# passes the weights check while clipping is on): dp 2 x ep 2 against one
# process, from the snapshots (tests/lib.sh snapshot_norms).
unclipped=(--grad_clip 0 --save_every 1 --capacity_factor 1)
run nc_one --batch_size 8 --capacity_groups 4 "${unclipped[@]}" --snapshot_path "$TMP/nc_one.d/s.safetensors"
na=$(snapshot_norms "$TMP/nc_one.d")
run nc_mesh --batch_size 2 --dp 2 --ep 2 "${unclipped[@]}" --snapshot_path "$TMP/nc_mesh.d/s.safetensors"; status=$?
nb=$(snapshot_norms "$TMP/nc_mesh.d")
[[ $status -eq 0 ]] && norms_near "$na" "$nb" 1e-6
verdict $? "ep: without clipping, dp 2 x ep 2 with drops equals one process in weights and AdamW's moments (l2 of p, m, v: $nb vs $na)" \
    "status $status, norms '$nb' vs '$na': $(grep -m1 error "$TMP/nc_mesh")"
# Planted: an expert's gradient divided by its replicas (dp) only, not by
# all the ranks whose tokens it added up: twice too large.
np=
planted=$(plant expert_dp gpt/model.h 'buf[1][i] /= (gpt_real)pg_world_size(all);' \
    'buf[1][i] /= (gpt_real)pg_world_size(m->expert_replicas);' 13_expert_parallel 13_expert_parallel)
if [[ -n $planted ]]; then
    run_capture 120 "$TMP/pl_dp" "$planted" "${cpu[@]}" --batch_size 2 --dp 2 --ep 2 "${unclipped[@]}" \
        --out_dir "$TMP/pl_dp.d" --snapshot_path "$TMP/pl_dp.d/s.safetensors"
    np=$(snapshot_norms "$TMP/pl_dp.d")
    [[ -n $np ]] && ! norms_near "$na" "$np" 1e-6
else false; fi
verdict $? "ep planted: an expert's gradient averaged over dp only fails the moments check (l2 of p, m, v: $np vs $na)" \
    "$(planted_why expert_dp)planted norms '$np' vs '$na'"

# The traffic: what the all-to-alls carried per step, measured, equals
# K x tokens x C each way per layer (dispatch and return; forward and
# backward): 2 x 2 layers x 2 x 8 x 32 x 64 = 131072 numbers, dropless.
got=$(field "$TMP/ep4" "$traffic" '\2 \3 \4')
[[ $got == "131072 131072 131072" ]]
verdict $? "ep: the all-to-alls carried the formula's numbers each way, forward and backward ($got)" "got '$got'"
# Planted: a counter that leaves out each rank's block to itself (it
# crosses no wire, but the all-to-all still carries it): short of the formula.
got_pl=
planted=$(plant self_block gpt/moe.h 'for (int p = 0; count && p < P; p++) s->sent[pass] += (double)out[p];' \
    'for (int p = 0; count && p < P; p++) s->sent[pass] += p == m->ep_rank ? 0 : (double)out[p];' 13_expert_parallel 13_expert_parallel)
[[ -n $planted ]] && run_capture 120 "$TMP/pl_self" "$planted" "${cpu[@]}" --batch_size 2 --ep 4 --out_dir "$TMP/pl_self.d" &&
    got_pl=$(field "$TMP/pl_self" "$traffic" '\2 \3 \4') && [[ -n $got_pl && $got_pl != "131072 131072 131072" ]]
verdict $? "ep planted: traffic counted without each rank's own block is caught ($got_pl)" "$(planted_why self_block)got '$got_pl'"
got=$(field "$TMP/d_ep4" "$traffic" '\2 \3 \4'); kept=$(field "$TMP/d_ep4" ' ([0-9]*) less the dropped rows' '\1')
read -r f b w <<<"$got"
[[ -n $f && $f == "$b" && $f == "$kept" && $f -lt $w ]]
verdict $? "ep: with drops they carry the formula less the dropped rows ($f of $w)" "got '$got', kept '$kept'"
# Memory: a rank holds E/ep of the experts.
got=$(field "$TMP/ep4" '^per rank: ([0-9]*) expert parameters \(1 of 4 experts per layer\); formula .* = ([0-9]*);' '\1 \2')
[[ -n $got && ${got% *} == "${got#* }" ]]
verdict $? "ep: each of 4 ranks holds 1 of 4 experts per layer, the formula's parameters ($got)" "got '$got'"

# The mesh: rank -> (dp, ep), ep fastest.
grep -q '^mesh: dp 2 x ep 2 (4 ranks' "$TMP/mesh"
verdict $? "ep: the mesh is printed, rank -> (dp, ep)" "$(grep -A5 '^mesh:' "$TMP/mesh" | tr '\n' '|')"

# Snapshots are whole: an ep 2 run dies in epoch 2; an ep 4 run resumes from
# its epoch-1 snapshot and ends where an unbroken ep 2 run ends.
small=(--data_dir "$TMP/small" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000
       --device cpu --epochs 2 --save_every 1 --n_expert 4 --moe_top_k 2 --batch_size 2)
awk -v dir="$TMP/small" 'BEGIN { system("mkdir -p " dir); srand(5)
    for (f = 1; f <= 3; f++) { file = dir "/" (f == 1 ? "train.txt" : f == 2 ? "valid.txt" : "test.txt")
        for (i = 0; i < (f == 1 ? 240 : 60); i++) printf " the cat %d sees a dog %d . \n", i % 7, i % 5 > file } }'
run_capture 120 "$TMP/clean" "$prog" "${small[@]}" --dp 2 --ep 2 --out_dir "$TMP/clean.d" --snapshot_path "$TMP/clean.d/s.safetensors"
steps=$(field "$TMP/clean" 'snapshot saved: Epoch 1 \(step ([0-9]*)\)')
COURSE_FAIL_RANK=1 COURSE_FAIL_STEP=$(( ${steps:-5} + 2 )) run_capture 120 "$TMP/broken" "$prog" "${small[@]}" --dp 2 --ep 2 \
    --out_dir "$TMP/broken.d" --snapshot_path "$TMP/broken.d/s.safetensors"; died=$?
run_capture 120 "$TMP/resumed" "$prog" "${small[@]}" --ep 4 --out_dir "$TMP/resumed.d" --snapshot_path "$TMP/broken.d/s.safetensors"
status=$?
r=$(models_apart "$TMP/clean.d/model.safetensors" "$TMP/resumed.d/model.safetensors")
[[ $died -ne 0 && $status -eq 0 ]] && grep -q 'Resuming training from snapshot at Epoch 1' "$TMP/resumed" && near "$r" 0 1e-6
verdict $? "ep: a dp 2 x ep 2 run killed in epoch 2 resumes with ep 4 from its whole snapshot and ends where it would have ($r apart)" \
    "killed run status $died, resumed status $status, relative '$r': $(grep -m1 -E 'error|Resuming' "$TMP/resumed")"

# --generate reloads the whole model an ep 2 run saved and writes (greedy,
# the same prompt) what the ep 2 run wrote.
run_capture 120 "$TMP/greedy" "$prog" "${small[@]}" --ep 2 --epochs 1 --num_samples 1 --temperature 0 --sample_tokens 12 \
    --out_dir "$TMP/greedy.d"
run_capture 120 "$TMP/gen" "$prog" --generate --device cpu --num_samples 1 --temperature 0 --sample_tokens 12 --out_dir "$TMP/greedy.d"
status=$?
a=$(first_sample "$TMP/greedy"); b=$(first_sample "$TMP/gen")
[[ $status -eq 0 && -n "$a" && "$a" == "$b" ]] && grep -q '4 experts\|n_expert' "$TMP/greedy.d/model.safetensors"
verdict $? "ep: --generate loads the whole mixture an ep 2 run saved and samples its text ('$(echo $a)')" \
    "status $status, ep 2 wrote '$a', --generate wrote '$b': $(grep -m1 error "$TMP/gen")"

# Bad layouts and settings: one line naming the flag, exit 2.
bad() { # NAME PATTERN FLAGS...
    local name=$1 pattern=$2; shift 2
    run_capture 30 "$TMP/bad_$name" "$prog" "${common[@]}" --device cpu "$@"; local status=$?
    [[ $status -eq 2 ]] && grep -q -- "$pattern" "$TMP/bad_$name"
    verdict $? "ep: $* is refused (exit 2)" "status $status: $(head -n 2 "$TMP/bad_$name" | tr '\n' '|')"
}
bad indivisible "n_expert must be a multiple of ep" --n_expert 6 --ep 4
bad topk "top_k must be 1..n_expert" --n_expert 2 --moe_top_k 3
bad noexperts "--ep 2 spreads experts over ranks: give --n_expert" --ep 2
bad groups "--capacity_groups 9: more groups than the 8 sequences" --n_expert 4 --capacity_groups 9
bad powersgd "--grad_compress powersgd with --ep 2" --n_expert 4 --ep 2 --grad_compress powersgd

# ---------------------------------------------------------------- under mpirun
if command -v mpirun >/dev/null 2>&1 && ! "$prog" --backend mpi --device cpu 2>&1 | grep -q "this build has no MPI"; then
    mpi=(mpirun -np)
    if mpirun --version 2>&1 | grep -q "Open MPI"; then mpi=(mpirun --oversubscribe --allow-run-as-root -np); fi
    run_capture 120 "$TMP/mpi" "${mpi[@]}" 4 "$prog" "${cpu[@]}" --backend mpi --batch_size 2 --dp 2 --ep 2 \
        --capacity_factor 1 --out_dir "$TMP/mpi.d"
    status=$?
    grep -q 'backend mpi' "$TMP/mpi" || status=99
    same d_one4 mpi 1e-6 $status
    verdict $? "ep: dp 2 x ep 2 with drops under mpirun (backend mpi) equals one process (models $r apart)" \
        "status $status, relative '$r', valid $va vs $vb: $(grep -m1 error "$TMP/mpi")"
else
    skip "ep: dp 2 x ep 2 under mpirun" "no mpirun, or a build without MPI (apt-get install openmpi-bin libopenmpi-dev, then make)"
fi

no_leftovers "ep: no process left behind" "13_expert_parallel/13_expert_parallel"
