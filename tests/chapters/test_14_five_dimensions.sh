# Chapter 14, the finale: pp x dp x ep x cp x tp on one mesh trains the
# model one process trains with the same total batch - in weights (1e-6
# relative, tests/unit/test_gpt_compare), validation loss and, without
# clipping, AdamW's moments - on 32 CPU ranks (2 x 2 x 2 x 2 x 2) and on
# shapes with a 1 in some dimension, one of them under mpirun; snapshots are
# whole (a run killed in epoch 2 resumes in another layout and ends where it
# would have); with --shard 1 (chapter 09's ZeRO-1 over dp, --replicate as
# its hybrid) on 8 and 32 ranks, its whole snapshot resumed in another
# layout; on 8 (emulated) GPUs, pp 2 x dp 2 x tp 2 equal to one GPU; what
# is not composed is refused in one line. The mixture is
# dropless and without the balancing loss (--aux_loss_coef 0): that loss is
# a product of two means over a rank's tokens, and a cp rank holds half of
# each sequence, which no single process's groups of whole sequences can
# stand for (chapter 13 matches it with --capacity_groups when cp is 1).
# Each check comes with a planted bug (tests/lib.sh, plant) that it catches.
source "$(dirname "$0")/../lib.sh"
prog="$ROOT/14_five_dimensions/14_five_dimensions"
p08="$ROOT/08_gpt_wikitext/08_gpt_wikitext"
compare="$ROOT/tests/unit/test_gpt_compare"
[[ -x "$prog" && -x "$p08" && -x "$compare" ]] || { fail "finale: binaries" "build first (make)"; exit 1; }
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT COURSE_BACKEND
export OMP_NUM_THREADS=1

gpt_corpus "$TMP/corpus"
common=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000)
cpu=("${common[@]}" --device cpu --block_size 32 --grad_accum 2 --max_steps 4 --n_expert 4 --moe_top_k 2
     --aux_loss_coef 0 --capacity_factor 0)
valid='validation after step [0-9]* .*: loss ([0-9.]*) '

# same ONE MANY TOL [STATUS]: the run MANY trained the model the run ONE
# did (saved models within TOL relative, validation losses too). Sets r, va, vb.
same() {
    local one=$1 many=$2 tol=$3 status=${4:-0}
    r=$(models_apart "$TMP/$one.d/model.safetensors" "$TMP/$many.d/model.safetensors")
    va=$(field "$TMP/$one" "$valid"); vb=$(field "$TMP/$many" "$valid")
    [[ $status -eq 0 && -n $r ]] && near "$r" 0 "$tol" && rel_near "$va" "$vb" "$tol"
}
run() { local name=$1; shift; run_capture 300 "$TMP/$name" "$prog" "${cpu[@]}" "$@" --out_dir "$TMP/$name.d"; }

# ---------------------------------------------------------------- refused
bad() { # NAME PATTERN FLAGS...
    local name=$1 pattern=$2; shift 2
    run_capture 30 "$TMP/bad_$name" "$prog" "${common[@]}" "$@"; local status=$?
    [[ $status -eq 2 ]] && grep -q -- "$pattern" "$TMP/bad_$name"
    verdict $? "finale: $* is refused in one line (exit 2)" "status $status: $(head -n 2 "$TMP/bad_$name" | tr '\n' '|')"
}
bad zero2 "--shard 2 with --pp 2: a stage's gradients are final only after all its micro-batches" --device cpu --shard 2
bad zero3 "--shard 3: ZeRO-2 and 3 scatter and gather a whole model's buckets" --device cpu --pp 1 --shard 3
bad replicate "--replicate 2 needs --shard 1" --device cpu --replicate 2
bad zero_gpu "--shard 1 with --device cuda: ZeRO in the finale is written for CPU ranks" --device cuda --shard 1
bad gpu_ep "--device cuda with --ep 2: the finale does not compose 13's GPU expert exchanges" --device cuda --pp 1 --ep 2 \
    --n_expert 4
bad gpu_moe "--device cuda with --n_expert 4 and --tp 1 --pp 2 --cp 1: 13's GPU mixture runs in a whole model" \
    --device cuda --n_expert 4
bad gpu_cp "--device cuda with --cp 2 and --tp 2 --pp 1: 12's GPU attention across cp ranks takes" --device cuda \
    --pp 1 --tp 2 --cp 2 --block_size 32
bad noexperts "--ep 2 spreads experts over ranks: give --n_expert" --device cpu --ep 2
bad compress "--grad_compress bf16: the dense and the expert gradients" --device cpu --grad_compress bf16
bad ulysses "--cp 4 with --block_size 32, 1 heads per tp rank, --cp_attention ulysses: ulysses gives each rank whole heads" --device cpu --pp 1 \
    --block_size 32 --tp 2 --cp 4 --cp_attention ulysses

# ---------------------------------------------------------------- on 8 GPUs, nccl
# 10's tensor-parallel blocks and 11's stages on GPUs, two pipelines side
# by side, against one GPU (08) with the same total batch, in fp32 (the
# tolerance of 10's and 11's GPU checks). Dense: 13's GPU mixture takes no
# stage (refused above). Blocks of 16 tokens, 3 steps: the emulator is slow.
if ! has_gpu || [[ $(gpu_count) -lt 8 ]]; then
    skip "finale gpu: pp 2 x dp 2 x tp 2 on 8 GPUs with nccl" "needs 8 GPUs (make CUDA=emu test runs it on the emulated GPU, which has 8)"
else
    gpt_corpus "$TMP/gcorpus"
    head -n 12 "$TMP/gcorpus/valid.txt" >"$TMP/gvalid" && mv "$TMP/gvalid" "$TMP/gcorpus/valid.txt"
    gpu=(--data_dir "$TMP/gcorpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000
         --n_layer 4 --device cuda --block_size 16 --max_steps 3 --precision fp32 --grad_accum 2)
    run_capture 300 "$TMP/g_one" "$p08" "${gpu[@]}" --batch_size 4 --out_dir "$TMP/g_one.d"
    run_capture 600 "$TMP/g_mesh" "$prog" "${gpu[@]}" --nprocs 8 --pp 2 --tp 2 --batch_size 2 --out_dir "$TMP/g_mesh.d"
    status=$?
    grep -q 'backend nccl' "$TMP/g_mesh" && grep -q '^mesh: pp 2 x dp 2 x tp 2 (8 ranks' "$TMP/g_mesh" || status=99
    same g_one g_mesh 1e-5 $status
    verdict $? "finale gpu: pp 2 x dp 2 x tp 2 on 8 GPUs with nccl equals one GPU in fp32 (models $r apart, valid $vb)" \
        "status $status, relative '$r', valid $va vs $vb: $(grep -m1 -E 'error|die|backend' "$TMP/g_mesh")"
fi

# ---------------------------------------------------------------- on CPU ranks, every build
cpu_paths "finale" || { no_leftovers "finale: no process left behind" "14_five_dimensions/14_five_dimensions"; exit 0; }

# One process holding everything, batch 8, is the reference; each layout
# reads 8 sequences a micro-batch over its dp x ep replicas.
# The 32 ranks also shard each part's AdamW moments over dp (--shard 1).
run one --pp 1 --batch_size 8
run five --pp 2 --dp 2 --ep 2 --cp 2 --tp 2 --batch_size 2 --shard 1
same one five 1e-6 $? && grep -q '^sharding: ZeRO-1' "$TMP/five"
verdict $? "finale: pp 2 x dp 2 x ep 2 x cp 2 x tp 2 (32 CPU ranks) with --shard 1 equals one process (models $r apart, valid $vb)" \
    "relative '$r', valid $va vs $vb: $(grep -m1 -E 'error|die' "$TMP/five")"
grep -q '^mesh: pp 2 x dp 2 x ep 2 x cp 2 x tp 2 (32 ranks' "$TMP/five"
verdict $? "finale: the mesh is printed, rank -> (pp, dp, ep, cp, tp)" "$(grep -A3 '^mesh:' "$TMP/five" | tr '\n' '|')"
for shape in "pp1:--pp 1 --dp 2 --ep 2 --cp 2 --tp 2 --batch_size 2" "ep1:--pp 2 --dp 2 --cp 2 --tp 2 --batch_size 4" \
             "tp1cp1:--pp 2 --dp 2 --ep 2 --batch_size 2" "dp1:--pp 2 --ep 2 --cp 2 --tp 2 --batch_size 4 --schedule gpipe"; do
    name=${shape%%:*} flags=${shape#*:}
    # shellcheck disable=SC2086
    run "$name" $flags
    same one "$name" 1e-6 $?
    verdict $? "finale: $flags equals one process (models $r apart)" "relative '$r', valid $va vs $vb: $(grep -m1 -E 'error|die' "$TMP/$name")"
done

# Planted: the dense gradients averaged over dp x cp, not over ep too: the
# ep ranks read different batches, and their dense weights drift apart.
planted=$(plant dense_group 14_five_dimensions/14_five_dimensions.c 'o->shard ? "ep cp" : "dp ep cp")' \
    'o->shard ? "ep cp" : "dp cp")' 14_five_dimensions 14_five_dimensions)
[[ -n $planted ]] && run_capture 300 "$TMP/pl_group" "$planted" "${cpu[@]}" --pp 1 --dp 2 --ep 2 --cp 2 --tp 2 \
    --batch_size 2 --out_dir "$TMP/pl_group.d" && ! same one pl_group 1e-6 && [[ -n $r ]]
verdict $? "finale planted: the dense gradients averaged over the wrong group (dp x cp) is caught (models $r apart)" \
    "$(planted_why dense_group)relative '$r'"
# Planted: every gradient, the experts' too, averaged over dp x ep x cp as
# the dense ones are: each expert gets the others' gradients mixed in.
planted=$(plant expert_avg gpt/model.h 'model_average_experts(m, pg); // chapter 13' \
    'ddp_average_gradients_with(pg, m->host.grads, m->host.num_params, m->grad_compress);' 14_five_dimensions \
    14_five_dimensions)
[[ -n $planted ]] && run_capture 300 "$TMP/pl_avg" "$planted" "${cpu[@]}" --pp 2 --dp 2 --ep 2 --cp 2 --tp 2 \
    --batch_size 2 --out_dir "$TMP/pl_avg.d" && ! same one pl_avg 1e-6 && [[ -n $r ]]
verdict $? "finale planted: an expert's gradient averaged with the dense ones is caught (models $r apart)" \
    "$(planted_why expert_avg)relative '$r'"
# Planted: a pipeline stage that keeps one routing for all its micro-batches
# in flight (the first backward pass reads the second forward's routing).
planted=$(plant moe_slots gpt/gpt.h '    if (m->moe) { // a mixture of experts keeps' '    if (0 && m->moe) { //' \
    14_five_dimensions 14_five_dimensions)
[[ -n $planted ]] && run_capture 300 "$TMP/pl_slot" "$planted" "${cpu[@]}" --pp 2 --ep 2 --batch_size 4 \
    --out_dir "$TMP/pl_slot.d" && ! same one pl_slot 1e-6 && [[ -n $r ]]
verdict $? "finale planted: a stage's micro-batches sharing one routing is caught (models $r apart)" \
    "$(planted_why moe_slots)relative '$r'"

# Planted: a dimension order mismatch between two parts of the group
# layer - groups_rank_of reading the coordinates tp slowest while the mesh's
# groups (common/mesh.h) put tp fastest: the whole model is gathered from
# the wrong ranks (a snapshot or the saved model of another layout's parts).
planted=$(plant order common/groups.h 'rank = rank * g->size[k] + coord[k];' \
    'rank = rank * g->size[DIMS - 1 - k] + coord[DIMS - 1 - k];' 14_five_dimensions 14_five_dimensions)
[[ -n $planted ]] && { COURSE_TIMEOUT=20 run_capture 300 "$TMP/pl_order" "$planted" "${cpu[@]}" --pp 2 --ep 2 --tp 2 \
    --batch_size 4 --out_dir "$TMP/pl_order.d"; ! same one pl_order 1e-6; }
verdict $? "finale planted: a dimension order mismatch between the mesh's groups and groups_rank_of is caught (models '$r' apart)" \
    "$(planted_why order)relative '$r'"

# Without clipping, AdamW's moments too (an expert gradient divided by the
# wrong count passes a weights check while clipping is on), from the
# snapshots (tests/lib.sh snapshot_norms): the 32 ranks against one process.
unclipped=(--grad_clip 0 --save_every 1 --epochs 1)
run nc_one --pp 1 --batch_size 8 "${unclipped[@]}" --snapshot_path "$TMP/nc_one.d/s.safetensors"
na=$(snapshot_norms "$TMP/nc_one.d")
run nc_five --pp 2 --dp 2 --ep 2 --cp 2 --tp 2 --batch_size 2 "${unclipped[@]}" \
    --snapshot_path "$TMP/nc_five.d/s.safetensors"; status=$?
nb=$(snapshot_norms "$TMP/nc_five.d")
[[ $status -eq 0 && -n $na ]] && norms_near "$na" "$nb" 1e-6
verdict $? "finale: without clipping, the 32 ranks equal one process in weights and AdamW's moments (l2 of p, m, v: $nb vs $na)" \
    "status $status, norms '$nb' vs '$na': $(grep -m1 -E 'error|die' "$TMP/nc_five")"
# Planted: an expert's gradient divided by its replicas (dp x cp) only, not
# by every rank whose tokens it added up (dp x ep x cp): twice too large.
np=
planted=$(plant expert_div gpt/model.h 'buf[1][i] /= (gpt_real)pg_world_size(all);' \
    'buf[1][i] /= (gpt_real)pg_world_size(m->expert_replicas);' 14_five_dimensions 14_five_dimensions)
if [[ -n $planted ]]; then
    run_capture 300 "$TMP/pl_div" "$planted" "${cpu[@]}" --pp 2 --dp 2 --ep 2 --cp 2 --tp 2 --batch_size 2 \
        "${unclipped[@]}" --out_dir "$TMP/pl_div.d" --snapshot_path "$TMP/pl_div.d/s.safetensors"
    np=$(snapshot_norms "$TMP/pl_div.d")
    [[ -n $np ]] && ! norms_near "$na" "$np" 1e-6
else false; fi
verdict $? "finale planted: an expert's gradient divided by its replicas only fails the moments check ($np vs $na)" \
    "$(planted_why expert_div)planted norms '$np' vs '$na'"

# ZeRO-1 over dp (--shard 1, finale.h): each rank keeps AdamW's moments of
# 1/dp of its part, the gradients averaged over ep x cp first (experts
# summed over cp), then reduce-scattered over dp. On two 8-rank shapes
# that use every dimension between them, and hybrid (--replicate 2: slices
# over 2 of the 4 dp ranks, averaged across the 2 replicas): in weights
# with clipping (against `one`), and unclipped in AdamW's moments too
# (against nc_one).
for shape in "z_tp_pp:--pp 2 --dp 2 --tp 2 --batch_size 4" "z_ep_cp:--pp 1 --dp 2 --ep 2 --cp 2 --batch_size 2" \
             "z_hybrid:--pp 1 --dp 4 --tp 2 --batch_size 2 --replicate 2"; do
    name=${shape%%:*} flags=${shape#*:}
    # shellcheck disable=SC2086
    run "$name" $flags --shard 1
    same one "$name" 1e-6 $?
    verdict $? "finale: $flags --shard 1 equals one process (models $r apart)" "relative '$r', valid $va vs $vb: $(grep -m1 -E 'error|die' "$TMP/$name")"
    # shellcheck disable=SC2086
    run "nc_$name" $flags --shard 1 "${unclipped[@]}" --snapshot_path "$TMP/nc_$name.d/s.safetensors"; status=$?
    nz=$(snapshot_norms "$TMP/nc_$name.d")
    [[ $status -eq 0 && -n $na ]] && norms_near "$na" "$nz" 1e-6
    verdict $? "finale: $flags --shard 1, unclipped, equals one process in weights and AdamW's moments ($nz vs $na)" \
        "status $status, norms '$nz' vs '$na': $(grep -m1 -E 'error|die' "$TMP/nc_$name")"
done
# Planted: the slices cut over cp instead of dp (groups_split's dimension
# in finale.h): the gradient slices are reduced over the wrong group, and
# the dp replicas, which read different batches, never average.
r=
planted=$(plant zero_group 14_five_dimensions/finale.h 'groups_split(&p->g, DIM_DP, o->replicate' \
    'groups_split(&p->g, DIM_CP, o->replicate' 14_five_dimensions 14_five_dimensions)
[[ -n $planted ]] && run_capture 300 "$TMP/pl_zero" "$planted" "${cpu[@]}" --pp 1 --dp 2 --ep 2 --cp 2 --batch_size 2 \
    --shard 1 --out_dir "$TMP/pl_zero.d" && ! same one pl_zero 1e-6 && [[ -n $r ]]
verdict $? "finale planted (ZeRO): the gradient slices reduced over cp instead of dp is caught (models $r apart)" \
    "$(planted_why zero_group)relative '$r'"

# Snapshots are whole: a 16-rank run (pp 2 x ep 2 x cp 2 x tp 2) dies in
# epoch 2 (its rank 5 before step 2 of the epoch: the step before it needs rank 0,
# so rank 0 has written the epoch-1 snapshot); a run of another layout (pp 1 x dp 2 x ep 2 x tp 2) resumes from
# its epoch-1 snapshot and ends where the unbroken 16-rank run ends.
small=("${cpu[@]}" --max_steps 0 --epochs 2 --save_every 1 --batch_size 4)
awk -v dir="$TMP/small" 'BEGIN { system("mkdir -p " dir); srand(5)
    for (f = 1; f <= 3; f++) { file = dir "/" (f == 1 ? "train.txt" : f == 2 ? "valid.txt" : "test.txt")
        for (i = 0; i < (f == 1 ? 400 : 60); i++) printf " the cat %d sees a dog %d . \n", i % 7, i % 5 > file } }'
small+=(--data_dir "$TMP/small")
run_capture 300 "$TMP/clean" "$prog" "${small[@]}" --pp 2 --ep 2 --cp 2 --tp 2 --out_dir "$TMP/clean.d" \
    --snapshot_path "$TMP/clean.d/s.safetensors"
steps=$(field "$TMP/clean" 'snapshot saved: Epoch 1 \(step ([0-9]*)\)')
COURSE_FAIL_RANK=5 COURSE_FAIL_STEP=$(( ${steps:-5} + 2 )) run_capture 300 "$TMP/broken" "$prog" "${small[@]}" --pp 2 \
    --ep 2 --cp 2 --tp 2 --out_dir "$TMP/broken.d" --snapshot_path "$TMP/broken.d/s.safetensors"; died=$?
run_capture 300 "$TMP/resumed" "$prog" "${small[@]}" --pp 1 --dp 1 --ep 2 --tp 2 --batch_size 4 --out_dir "$TMP/resumed.d" \
    --snapshot_path "$TMP/broken.d/s.safetensors"; status=$?
r=$(models_apart "$TMP/clean.d/model.safetensors" "$TMP/resumed.d/model.safetensors")
[[ -n $steps && $died -ne 0 && $status -eq 0 ]] && grep -q 'Resuming training from snapshot at Epoch 1' "$TMP/resumed" &&
    near "$r" 0 1e-6
verdict $? "finale: a 16-rank run killed in epoch 2 resumes as pp 1 x ep 2 x tp 2 from its whole snapshot and ends where it would have ($r apart)" \
    "epoch-1 step '$steps', killed run status $died, resumed status $status, relative '$r': $(grep -m1 -E 'error|Resuming' "$TMP/resumed")"

# With ZeRO the snapshot is still whole: each part's moments are gathered
# from its slices first (finale_gather_whole). A --shard 1 run (pp 2 x dp 2
# x tp 2) dies in epoch 2 (rank 1, as above); a --shard 1 run of another
# layout (pp 1 x dp 2 x cp 2) resumes from its epoch-1 snapshot and ends
# where the unbroken 16-rank run ends - only if the moments were saved
# whole and each rank took its slices of them back.
COURSE_FAIL_RANK=1 COURSE_FAIL_STEP=$(( ${steps:-5} + 2 )) run_capture 300 "$TMP/zbroken" "$prog" "${small[@]}" --pp 2 \
    --dp 2 --tp 2 --shard 1 --out_dir "$TMP/zbroken.d" --snapshot_path "$TMP/zbroken.d/s.safetensors"; died=$?
cp -r "$TMP/zbroken.d" "$TMP/zbroken2.d" # the resumed run writes its own snapshots beside them; the planted one resumes here
run_capture 300 "$TMP/zresumed" "$prog" "${small[@]}" --pp 1 --dp 2 --cp 2 --shard 1 --out_dir "$TMP/zresumed.d" \
    --snapshot_path "$TMP/zbroken.d/s.safetensors"; status=$?
r=$(models_apart "$TMP/clean.d/model.safetensors" "$TMP/zresumed.d/model.safetensors")
[[ -n $steps && $died -ne 0 && $status -eq 0 ]] && grep -q 'Resuming training from snapshot at Epoch 1' "$TMP/zresumed" &&
    near "$r" 0 1e-6
verdict $? "finale: a --shard 1 run killed in epoch 2 resumes as --shard 1 pp 1 x dp 2 x cp 2 from its whole snapshot and ends where it would have ($r apart)" \
    "epoch-1 step '$steps', killed run status $died, resumed status $status, relative '$r': $(grep -m1 -E 'error|Resuming' "$TMP/zresumed")"
# Planted: the resumed run drops the moments it read instead of taking its
# slices of them (AdamW starts again from zeros, its step count kept).
r=
planted=$(plant zero_resume 14_five_dimensions/finale.h '    zero_moments_from_host(z);' '    zero_drop_host_moments(z);' \
    14_five_dimensions 14_five_dimensions)
[[ -n $planted ]] && run_capture 300 "$TMP/pl_zresumed" "$planted" "${small[@]}" --pp 1 --dp 2 --cp 2 --shard 1 \
    --out_dir "$TMP/pl_zresumed.d" --snapshot_path "$TMP/zbroken2.d/s.safetensors" &&
    r=$(models_apart "$TMP/clean.d/model.safetensors" "$TMP/pl_zresumed.d/model.safetensors") && [[ -n $r ]] &&
    ! near "$r" 0 1e-6
verdict $? "finale planted (ZeRO): a resumed run that drops the snapshot's moments is caught (models $r apart)" \
    "$(planted_why zero_resume)relative '$r'"

# Two hosts, one lost (14_five_dimensions/rehearsal.sh: 07's network
# namespaces as root, else two launchers on 127.0.0.1): pp 2 x ep 2 x cp 2
# x tp 2, stage 0 on host 0 and stage 1 on host 1; host 1 is killed after
# the first snapshot, comes back, and the job resumes and ends as one process.
run_capture 300 "$TMP/rehearsal" "$ROOT/14_five_dimensions/rehearsal.sh" --quiet --out "$TMP/rehearsal.d"; status=$?
[[ $status -eq 0 ]] &&
    grep -Eq '^rehearsal: PASS \((netns|loopback)\): 8 \+ 8 workers on two hosts trained the same model as one process .*host 1 was killed, came back, and the job resumed' "$TMP/rehearsal"
verdict $? "finale: pp 2 x ep 2 x cp 2 x tp 2 on two hosts, host 1 killed and restarted, resumes and ends as one process" \
    "status $status: $(grep -E '^rehearsal: (PASS|FAIL)' "$TMP/rehearsal" | tail -n 2 | tr '\n' '|')"

# ---------------------------------------------------------------- under mpirun
if command -v mpirun >/dev/null 2>&1 && ! "$prog" --backend mpi --device cpu 2>&1 | grep -q "this build has no MPI"; then
    mpi=(mpirun -np)
    if mpirun --version 2>&1 | grep -q "Open MPI"; then mpi=(mpirun --oversubscribe --allow-run-as-root -np); fi
    run_capture 300 "$TMP/mpi" "${mpi[@]}" 8 "$prog" "${cpu[@]}" --backend mpi --pp 2 --ep 2 --cp 2 --batch_size 4 \
        --out_dir "$TMP/mpi.d"
    status=$?
    grep -q 'backend mpi' "$TMP/mpi" || status=99
    same one mpi 1e-6 $status
    verdict $? "finale: pp 2 x ep 2 x cp 2 under mpirun (backend mpi) equals one process (models $r apart)" \
        "status $status, relative '$r', valid $va vs $vb: $(grep -m1 -E 'error|die' "$TMP/mpi")"
else
    skip "finale: pp 2 x ep 2 x cp 2 under mpirun" "no mpirun, or a build without MPI (apt-get install openmpi-bin libopenmpi-dev, then make)"
fi

no_leftovers "finale: no process left behind" "14_five_dimensions/14_five_dimensions"
