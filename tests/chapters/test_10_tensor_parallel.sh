# Chapter 10, tensor parallelism: each block split over --tp ranks (with
# data parallelism over --dp) trains the model one process trains with the
# same total batch; the replicated tensors are the same bytes on every rank;
# what a rank holds and sends matches the formulas; snapshots and the saved
# model are whole (chapter 08 samples from them, a run resumes with another
# --tp); bad layouts are refused; 08's flags work in the mesh (--nprocs,
# --num_workers, --grad_compress over the dp group) or are refused with
# their reason (fp16 with tp). On the CPU in every build, on (emulated)
# GPUs with nccl, and under mpirun. Three planted bugs (tests/lib.sh,
# plant) show that the checks see what they are for.
source "$(dirname "$0")/../lib.sh"
prog="$ROOT/10_tensor_parallel/10_tensor_parallel"
p08="$ROOT/08_gpt_wikitext/08_gpt_wikitext"
compare="$ROOT/tests/unit/test_gpt_compare"
ddprun="$ROOT/tools/ddprun"
[[ -x "$prog" && -x "$p08" && -x "$compare" && -x "$ddprun" ]] || { fail "tp: binaries" "build first (make)"; exit 1; }
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT COURSE_BACKEND
export OMP_NUM_THREADS=1

# A small corpus in WikiText's layout (tests/lib.sh; no real data needed).
gpt_corpus "$TMP/corpus"
common=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000)
cpu=("${common[@]}" --device cpu)
# What field reads from a run's output.
valid='validation after step [0-9]* .*: loss ([0-9.]*) ' sum='checksum ([0-9a-f]*),'

# same ONE MANY TOL [STATUS]: the run MANY (its output $TMP/MANY, its model
# $TMP/MANY.d) trained the model the run ONE did: the saved models differ
# by at most TOL relative (L2 over all parameters: tests/unit/test_gpt_compare),
# the validation losses too, and MANY's ranks found their replicas equal.
# Sets r (the relative difference), va and vb (the validation losses).
same() {
    local one=$1 many=$2 tol=$3 status=${4:-0}
    r=$(models_apart "$TMP/$one.d/model.safetensors" "$TMP/$many.d/model.safetensors")
    va=$(field "$TMP/$one" "$valid"); vb=$(field "$TMP/$many" "$valid")
    [[ $status -eq 0 ]] && near "$r" 0 "$tol" && rel_near "$va" "$vb" "$tol" && grep -q '^replicas: the replicated tensors' "$TMP/$many"
}

# ---------------------------------------------------------------- on GPUs
# The GPU model (gpt_cuda.cu) on real GPUs or the 8 emulated ones of a
# CUDA=emu build, one per rank, talking NCCL. Blocks of 16 tokens: the
# emulator is slow. Tolerances are chapter 08's: 1e-5 in fp32 (two GPU runs
# add in other orders), 2e-2 in bf16 (the partial sums are rounded to bf16
# before the all-reduce adds them).
if ! has_gpu; then
    for what in "tp 2 in fp32" "dp 2 x tp 2 in fp32" "dp 2 x tp 2 with --grad_compress bf16" "tp 4 in fp32" "dp 2 x tp 2 in bf16"; do
        skip "tp gpu: $what equals one GPU" "no GPU here (a CPU-only build, or no GPU: make CUDA=emu test runs these on the emulated GPU)"
    done
else
    gpu=("${common[@]}" --device cuda --block_size 16 --max_steps 15)
    run_capture 300 "$TMP/g_one" "$prog" "${gpu[@]}" --precision fp32 --batch_size 8 --out_dir "$TMP/g_one.d"
    run_capture 300 "$TMP/g_tp2" "$prog" "${gpu[@]}" --precision fp32 --batch_size 8 --tp 2 --out_dir "$TMP/g_tp2.d"
    same g_one g_tp2 1e-5 $?
    verdict $? "tp gpu: tp 2 equals one GPU in fp32 (models $r apart)" "relative '$r', valid $va vs $vb: $(grep -m1 error "$TMP/g_tp2")"
    run_capture 300 "$TMP/g_mesh" "$prog" "${gpu[@]}" --precision fp32 --batch_size 4 --dp 2 --tp 2 --out_dir "$TMP/g_mesh.d"
    status=$?
    grep -q 'backend nccl' "$TMP/g_mesh" || status=98
    same g_one g_mesh 1e-5 $status
    verdict $? "tp gpu: dp 2 x tp 2 (nccl) equals one GPU in fp32 (models $r apart)" "status $status, relative '$r', valid $va vs $vb"
    # --grad_compress over the dp group: each GPU rounds its shard's buckets
    # to bf16 before their all-reduce; the model is fp32's to rounding.
    run_capture 300 "$TMP/g_mesh_bf16" "$prog" "${gpu[@]}" --precision fp32 --batch_size 4 --dp 2 --tp 2 --grad_compress bf16 \
        --out_dir "$TMP/g_mesh_bf16.d"
    status=$?
    grep -q 'bytes per step per rank (bf16)' "$TMP/g_mesh_bf16" || status=96
    same g_mesh g_mesh_bf16 1e-3 $status && [[ "$(field "$TMP/g_mesh" "$sum")" != "$(field "$TMP/g_mesh_bf16" "$sum")" ]]
    verdict $? "tp gpu: dp 2 x tp 2 with --grad_compress bf16 trains the fp32 model to rounding (models $r apart)" \
        "status $status, relative '$r', valid $va vs $vb: $(grep -m1 error "$TMP/g_mesh_bf16")"
    run_capture 300 "$TMP/g_one4" "$prog" "${gpu[@]}" --precision fp32 --batch_size 8 --n_head 4 --out_dir "$TMP/g_one4.d"
    run_capture 300 "$TMP/g_tp4" "$prog" "${gpu[@]}" --precision fp32 --batch_size 8 --n_head 4 --tp 4 --out_dir "$TMP/g_tp4.d"
    same g_one4 g_tp4 1e-5 $?
    verdict $? "tp gpu: tp 4 equals one GPU in fp32 (models $r apart)" "relative '$r', valid $va vs $vb: $(grep -m1 error "$TMP/g_tp4")"
    run_capture 300 "$TMP/h_one" "$prog" "${gpu[@]}" --batch_size 8 --out_dir "$TMP/h_one.d"
    run_capture 300 "$TMP/h_mesh" "$prog" "${gpu[@]}" --batch_size 4 --dp 2 --tp 2 --out_dir "$TMP/h_mesh.d"
    status=$?
    grep -q 'bf16 (fp32 master' "$TMP/h_mesh" || status=97
    same h_one h_mesh 2e-2 $status
    verdict $? "tp gpu: dp 2 x tp 2 equals one GPU in bf16 (models $r apart)" "status $status, relative '$r', valid $va vs $vb"
fi

# ---------------------------------------------------------------- on CPU ranks, every build
# (CI's emulated-GPU pass stops here: CPU_PATHS=skip, tests/lib.sh.)
cpu_paths "tp" || { no_leftovers "tp: no process left behind" "10_tensor_parallel/10_tensor_parallel"; exit 0; }
# One process with batch 8 is the reference; tp 2 splits each block over 2
# ranks (the same batch), dp 2 x tp 2 gives each replica 4 of the 8
# sequences. --check_every 1 checks the replicas byte for byte after every step.
run_capture 120 "$TMP/one" "$prog" "${cpu[@]}" --max_steps 15 --batch_size 8 --out_dir "$TMP/one.d"
tp2=(--max_steps 15 --batch_size 8 --tp 2 --check_every 1)
run_capture 120 "$TMP/tp2" "$prog" "${cpu[@]}" "${tp2[@]}" --out_dir "$TMP/tp2.d"
same one tp2 1e-6 $?
verdict $? "tp: tp 2 equals one process after 15 steps (fp32, CPU: models $r apart, valid $vb)" "relative '$r' (at most 1e-6), valid $va vs $vb: $(grep -m1 error "$TMP/tp2")"
run_capture 120 "$TMP/mesh" "$prog" "${cpu[@]}" --max_steps 15 --batch_size 4 --dp 2 --tp 2 --check_every 1 --out_dir "$TMP/mesh.d"
same one mesh 1e-6 $?
verdict $? "tp: dp 2 x tp 2 (batch 4 each) equals one process with batch 8 (fp32, CPU: models $r apart)" "relative '$r', valid $va vs $vb: $(grep -m1 error "$TMP/mesh")"
# tp 4 needs 4 heads.
run_capture 120 "$TMP/one4" "$prog" "${cpu[@]}" --max_steps 15 --batch_size 8 --n_head 4 --out_dir "$TMP/one4.d"
run_capture 120 "$TMP/tp4" "$prog" "${cpu[@]}" --max_steps 15 --batch_size 8 --n_head 4 --tp 4 --check_every 1 --out_dir "$TMP/tp4.d"
same one4 tp4 1e-6 $?
verdict $? "tp: tp 4 (4 heads, one each) equals one process (fp32, CPU: models $r apart)" "relative '$r', valid $va vs $vb: $(grep -m1 error "$TMP/tp4")"
# With --tp 1 the program is chapter 08, bit for bit.
run_capture 120 "$TMP/ch08" "$p08" "${cpu[@]}" --max_steps 15 --batch_size 8 --out_dir "$TMP/ch08.d"
a=$(field "$TMP/one" "$sum"); b=$(field "$TMP/ch08" "$sum")
[[ -n "$a" && "$a" == "$b" ]]
verdict $? "tp: --tp 1 trains chapter 08's model bit for bit ($a)" "checksums '$a' vs '$b'"

# A gradient M times too large (the mean over micro-batches forgotten)
# barely moves AdamW's weights, and not at all while clipping is active:
# without clipping, AdamW's moments from each run's snapshot (tests/lib.sh,
# snapshot_norms) must equal one process's too. Planted: 10's step without
# the 1/M, which a comparison of weights with clipping on does not see.
unclipped=(--grad_clip 0 --save_every 1 --max_steps 15)
run_capture 120 "$TMP/one_nc" "$prog" "${cpu[@]}" "${unclipped[@]}" --batch_size 8 --out_dir "$TMP/one_nc.d" \
    --snapshot_path "$TMP/one_nc.d/s.safetensors"
na=$(snapshot_norms "$TMP/one_nc.d")
run_capture 120 "$TMP/tp_nc" "$prog" "${cpu[@]}" "${unclipped[@]}" --batch_size 4 --grad_accum 2 --tp 2 \
    --out_dir "$TMP/tp_nc.d" --snapshot_path "$TMP/tp_nc.d/s.safetensors"; status=$?
nb=$(snapshot_norms "$TMP/tp_nc.d")
[[ $status -eq 0 ]] && norms_near "$na" "$nb" 1e-6
verdict $? "tp: without clipping, tp 2 x 2 micro-batches of 4 equal one process in weights and AdamW's moments (l2 of p, m, v: $nb vs $na)" \
    "status $status, norms '$nb' vs '$na': $(grep -m1 error "$TMP/tp_nc")"
np=
planted=$(plant no_mean 10_tensor_parallel/10_tensor_parallel.c 'model_backward(m, 1.0f / (float)o->grad_accum,' \
          'model_backward(m, 1.0f,' 10_tensor_parallel 10_tensor_parallel)
if [[ -n $planted ]]; then
    run_capture 120 "$TMP/pl_nc" "$planted" "${cpu[@]}" "${unclipped[@]}" --batch_size 4 --grad_accum 2 --tp 2 \
        --out_dir "$TMP/pl_nc.d" --snapshot_path "$TMP/pl_nc.d/s.safetensors"
    np=$(snapshot_norms "$TMP/pl_nc.d")
    [[ -n $np ]] && ! norms_near "$na" "$np" 1e-6
else false; fi
verdict $? "tp planted: a step that sums its micro-batches' gradients fails the moments check (l2 of p, m, v: $np vs $na)" \
    "$(planted_why no_mean)planted norms '$np' vs '$na'"

# Planted: the f all-reduce of c_fc's input gradient skipped. Each rank's
# LayerNorm gradient then sees only its own hidden units: the replicas
# check must stop the run after its first step.
planted=$(plant f_skipped gpt/gpt.h 'gpt_tp_sum(m, g.dtmp, (size_t)N * C);                           // f: all-reduce' \
    '' 10_tensor_parallel 10_tensor_parallel)
[[ -n $planted ]] && { run_capture 120 "$TMP/planted_f" "$planted" "${cpu[@]}" "${tp2[@]}" --out_dir "$TMP/planted_f.d"; [[ $? -ne 0 ]]; } &&
    grep -q 'after step 1 the gradient of .*, a replicated tensor, differs between tp ranks 0 and 1' "$TMP/planted_f"
verdict $? "planted: without the backward all-reduce (f), the replicas check stops the run after step 1" \
    "$(planted_why f_skipped)$(grep -m1 -E 'error|final' "$TMP/planted_f" 2>/dev/null)"
# Planted: c_proj's bias added on every rank before the all-reduce (tp
# times in all). The ranks still agree with each other: only the
# comparison with one process sees it.
planted=$(plant bias_twice gpt/gpt.h 'matmul_forward(scratch, a.atty, p.attproj_w, NULL, N, Cs, C);' \
    'matmul_forward(scratch, a.atty, p.attproj_w, p.attproj_b, N, Cs, C);' 10_tensor_parallel 10_tensor_parallel)
[[ -n $planted ]] && { run_capture 120 "$TMP/planted_b" "$planted" "${cpu[@]}" "${tp2[@]}" --out_dir "$TMP/planted_b.d"
                       ! same one planted_b 1e-6 $?; } && [[ -n $r ]]
verdict $? "planted: a row-parallel bias added before the sum makes tp 2 differ from one process (models $r apart)" \
    "$(planted_why bias_twice)relative '$r', valid $va vs $vb"

# The mesh: rank -> (dp, tp); tp groups are consecutive ranks.
grep -q '^mesh: dp 2 x tp 2 (4 ranks' "$TMP/mesh" && grep -Eq '^ +2 +1 +0 ' "$TMP/mesh" && grep -Eq '^ +1 +0 +1 ' "$TMP/mesh"
verdict $? "tp: the mesh is printed, rank -> (dp, tp), tp fastest" "$(grep -A5 '^mesh:' "$TMP/mesh" | tr '\n' '|')"

# What a rank holds and sends, measured, equals the formulas (dp 2 x tp 2,
# 2 layers, batch 4 x 32, C 64: 4 x 2 x 4 x 32 x 64 = 65536 numbers
# all-reduced over tp per step).
# formulas FILE: "PARAMS PARAMS_FORMULA ACTS ACTS_FORMULA SENT SENT_FORMULA" from a run's report.
formulas() {
    echo "$(field "$1" '^per rank: parameters ([0-9]*) numbers; formula .* = ([0-9]*);' '\1 \2')" \
         "$(field "$1" '^per rank: activations and their gradients ([0-9.]*) MiB \(measured.* = ([0-9.]*) MiB$' '\1 \2')" \
         "$(field "$1" '^per rank and step: tp all-reduces of ([0-9]*) numbers .* = ([0-9]*); dp all-reduce' '\1 \2')"
}
agree() { [[ $# -eq 6 && $1 == "$2" && $3 == "$4" && $5 == "$6" && $5 -eq 65536 ]]; }
got=$(formulas "$TMP/mesh")
agree $got
verdict $? "tp: per rank, parameters, activations and numbers all-reduced per step equal the formulas ($got)" "got '$got'"
# Planted: the layout table keeps each rank's attention output whole (N x C
# instead of N x C/tp): the measured memory no longer matches the formula.
planted=$(plant atty_whole gpt/gpt_layout.h 'case A_ATTY: return N * C / ways;' 'case A_ATTY: return N * C;' \
    10_tensor_parallel 10_tensor_parallel)
[[ -n $planted ]] && run_capture 120 "$TMP/planted_a" "$planted" "${cpu[@]}" --max_steps 15 --batch_size 4 --dp 2 --tp 2 \
    --out_dir "$TMP/planted_a.d" && got=$(formulas "$TMP/planted_a") && ! agree $got && [[ $got == *.* ]]
verdict $? "planted: a layout that keeps a split activation whole is seen by the memory check ($got)" "$(planted_why atty_whole)got '$got'"

# Snapshots are whole: a tp 2 run dies in epoch 2, and a tp 1 run resumes
# from its epoch-1 snapshot and ends where an unbroken tp 2 run ends.
small=(--data_dir "$TMP/small" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000
       --device cpu --epochs 2 --save_every 1)
awk -v dir="$TMP/small" 'BEGIN { system("mkdir -p " dir); srand(5)
    for (f = 1; f <= 3; f++) { file = dir "/" (f == 1 ? "train.txt" : f == 2 ? "valid.txt" : "test.txt")
        for (i = 0; i < (f == 1 ? 240 : 60); i++) printf " the cat %d sees a dog %d . \n", i % 7, i % 5 > file } }'
run_capture 120 "$TMP/clean" "$prog" "${small[@]}" --tp 2 --out_dir "$TMP/clean.d" --snapshot_path "$TMP/clean.d/s.safetensors"
steps=$(field "$TMP/clean" 'snapshot saved: Epoch 1 \(step ([0-9]*)\)')
COURSE_FAIL_RANK=1 COURSE_FAIL_STEP=$(( ${steps:-5} + 2 )) run_capture 120 "$TMP/broken" "$prog" "${small[@]}" --tp 2 \
    --out_dir "$TMP/broken.d" --snapshot_path "$TMP/broken.d/s.safetensors"; died=$?
run_capture 120 "$TMP/resumed" "$prog" "${small[@]}" --tp 1 --out_dir "$TMP/resumed.d" --snapshot_path "$TMP/broken.d/s.safetensors"
status=$?
r=$(models_apart "$TMP/clean.d/model.safetensors" "$TMP/resumed.d/model.safetensors")
[[ $died -ne 0 && $status -eq 0 ]] && grep -q 'Resuming training from snapshot at Epoch 1' "$TMP/resumed" && near "$r" 0 1e-6
verdict $? "tp: a tp 2 run killed in epoch 2 resumes with tp 1 from its whole snapshot and ends where tp 2 ends ($r apart)" \
    "killed run status $died, resumed status $status, relative '$r': $(grep -m1 -E 'error|Resuming' "$TMP/resumed")"

# Chapter 08 samples from the model a tp 2 run saved, and (greedy, the same
# prompt) writes what the tp 2 run wrote.
run_capture 120 "$TMP/greedy" "$prog" "${small[@]}" --tp 2 --epochs 1 --num_samples 1 --temperature 0 --sample_tokens 12 \
    --out_dir "$TMP/greedy.d"
run_capture 120 "$TMP/gen08" "$p08" --generate --device cpu --num_samples 1 --temperature 0 --sample_tokens 12 --out_dir "$TMP/greedy.d"
status=$?
a=$(first_sample "$TMP/greedy"); b=$(first_sample "$TMP/gen08")
[[ $status -eq 0 && -n "$a" && "$a" == "$b" ]]
verdict $? "tp: chapter 08 loads the whole model a tp 2 run saved and samples its text ('$(echo $a)')" \
    "status $status, tp 2 wrote '$a', 08 wrote '$b': $(grep -m1 error "$TMP/gen08")"

# Bad layouts: a tp that does not divide the heads (exit 2, the flag named),
# and a mesh that is not the job's ranks.
run_capture 30 "$TMP/bad_tp" "$prog" "${cpu[@]}" --tp 3; status=$?
[[ $status -eq 2 ]] && grep -q -- "--tp 3: tp must divide n_head" "$TMP/bad_tp"
verdict $? "tp: --tp 3 with 2 heads is refused (exit 2)" "status $status: $(head -n 2 "$TMP/bad_tp" | tr '\n' '|')"
run_capture 60 "$TMP/bad_mesh" "$ddprun" --standalone --nproc_per_node=4 "$prog" "${cpu[@]}" --dp 3 --tp 2 --out_dir "$TMP/bad.d"
status=$?
[[ $status -ne 0 ]] && grep -q -- "dp 3 x ep 1 x cp 1 x tp 2 is 6 ranks, and the job has 4" "$TMP/bad_mesh"
verdict $? "tp: --dp 3 --tp 2 on 4 ranks is refused, naming both" "status $status: $(grep -m1 error "$TMP/bad_mesh")"

# 08's flags in the mesh (gpt/options.h). --nprocs 4 --tp 2 is dp 2 x tp 2,
# the run above; --num_workers 1 makes the same batches a step ahead.
run_capture 120 "$TMP/nprocs" "$prog" "${cpu[@]}" --max_steps 15 --batch_size 4 --nprocs 4 --tp 2 --num_workers 1 \
    --out_dir "$TMP/nprocs.d"; status=$?
a=$(field "$TMP/mesh" "$sum"); b=$(field "$TMP/nprocs" "$sum")
[[ $status -eq 0 && -n "$a" && "$a" == "$b" ]] && grep -q '^mesh: dp 2 x tp 2 (4 ranks' "$TMP/nprocs"
verdict $? "tp: --nprocs 4 --tp 2 --num_workers 1 is dp 2 x tp 2, the same bytes ($b)" "status $status, checksums '$a' vs '$b'"
# --grad_compress over the dp group: each rank rounds its shard's gradients
# (2 bytes a number, fp32's 4), the tp ranks still agree byte for byte
# (--check_every 1), and the model is the uncompressed run's to rounding.
bytes='gradients all-reduced: ([0-9]*) bytes per step per rank \((fp32|bf16|fp16|powersgd)\), ([0-9]*) parameters'
for c in bf16 fp16; do
    run_capture 120 "$TMP/mesh_$c" "$prog" "${cpu[@]}" --max_steps 15 --batch_size 4 --dp 2 --tp 2 --check_every 1 \
        --grad_compress $c --out_dir "$TMP/mesh_$c.d"
    same mesh mesh_$c 1e-3 $? && n=$(field "$TMP/mesh" "$bytes" '\3') &&
        [[ "$(field "$TMP/mesh" "$bytes" '\1 \2')" == "$((4 * n)) fp32" && "$(field "$TMP/mesh_$c" "$bytes" '\1 \2')" == "$((2 * n)) $c" ]] &&
        [[ "$(field "$TMP/mesh" "$sum")" != "$(field "$TMP/mesh_$c" "$sum")" ]]
    verdict $? "tp: dp 2 x tp 2 with --grad_compress $c sends 2 bytes a number of the shard and trains the fp32 model to rounding ($r apart)" \
        "relative '$r', valid $va vs $vb, bytes '$(field "$TMP/mesh_$c" "$bytes" '\1 \2')': $(grep -m1 error "$TMP/mesh_$c")"
done
# PowerSGD on the shards' matrices: at full rank (64, every matrix
# compressed) the exact average; at rank 1 a fraction of the bytes.
COURSE_POWERSGD_MIN_RATE=0 run_capture 120 "$TMP/mesh_psgd" "$prog" "${cpu[@]}" --max_steps 15 --batch_size 4 --dp 2 --tp 2 \
    --check_every 1 --grad_compress powersgd --powersgd_rank 64 --out_dir "$TMP/mesh_psgd.d"
same mesh mesh_psgd 1e-4 $?
verdict $? "tp: dp 2 x tp 2 with PowerSGD at full rank trains the fp32 model ($r apart)" "relative '$r', valid $va vs $vb: $(grep -m1 error "$TMP/mesh_psgd")"
run_capture 120 "$TMP/mesh_psgd1" "$prog" "${cpu[@]}" --max_steps 15 --batch_size 4 --dp 2 --tp 2 --check_every 1 \
    --grad_compress powersgd --out_dir "$TMP/mesh_psgd1.d"; status=$?
sent=$(field "$TMP/mesh_psgd1" "$bytes" '\1'); fp32=$(field "$TMP/mesh" "$bytes" '\1')
[[ $status -eq 0 && -n "$sent" && -n "$fp32" ]] && (( sent * 10 < fp32 )) && grep -q '^replicas: the replicated' "$TMP/mesh_psgd1"
verdict $? "tp: dp 2 x tp 2 with PowerSGD at rank 1 sends $sent bytes a step instead of $fp32, the replicas equal" \
    "status $status, bytes '$sent' vs '$fp32': $(grep -m1 error "$TMP/mesh_psgd1")"
# fp16 with tp: refused, saying why (its loss scaler is the whole model's).
run_capture 30 "$TMP/fp16" "$prog" "${common[@]}" --tp 2 --precision fp16; status=$?
[[ $status -eq 2 ]] && grep -q -- "--precision fp16 with --tp 2: fp16's loss scaler" "$TMP/fp16"
verdict $? "tp: --precision fp16 with --tp 2 is refused with its reason (exit 2)" "status $status: $(head -n 1 "$TMP/fp16")"

# ---------------------------------------------------------------- under mpirun
if command -v mpirun >/dev/null 2>&1 && ! "$prog" --backend mpi --device cpu 2>&1 | grep -q "this build has no MPI"; then
    mpi=(mpirun -np)
    if mpirun --version 2>&1 | grep -q "Open MPI"; then mpi=(mpirun --oversubscribe --allow-run-as-root -np); fi
    run_capture 120 "$TMP/mpi" "${mpi[@]}" 4 "$prog" "${cpu[@]}" --backend mpi --max_steps 15 --batch_size 4 --dp 2 --tp 2 \
        --out_dir "$TMP/mpi.d"
    status=$?
    grep -q 'backend mpi' "$TMP/mpi" || status=99
    same one mpi 1e-6 $status
    verdict $? "tp: dp 2 x tp 2 under mpirun (backend mpi) equals one process (models $r apart)" \
        "status $status, relative '$r', valid $va vs $vb: $(grep -m1 error "$TMP/mpi")"
else
    skip "tp: dp 2 x tp 2 under mpirun" "no mpirun, or a build without MPI (apt-get install openmpi-bin libopenmpi-dev, then make)"
fi

no_leftovers "tp: no process left behind" "10_tensor_parallel/10_tensor_parallel"
