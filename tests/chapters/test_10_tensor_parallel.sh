# Chapter 10, tensor parallelism: each block split over --tp ranks (with
# data parallelism over --dp) trains the model one process trains with the
# same total batch; the replicated tensors are the same bytes on every rank;
# what a rank holds and sends matches the formulas; snapshots and the saved
# model are whole (chapter 08 samples from them, a run resumes with another
# --tp); bad layouts are refused. On the CPU in every build, on (emulated)
# GPUs with nccl, and under mpirun.
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
l2() { sed -n 's/.*l2 norm \([0-9.e+-]*\).*/\1/p' "$1" | tail -n 1; }
valid() { sed -n 's/.*validation after step [0-9]* .*: loss \([0-9.]*\) .*/\1/p' "$1" | tail -n 1; }
# relative A.d B.d: |a - b| / |a| of the two runs' saved models.
relative() { "$compare" "$1/model.safetensors" "$2/model.safetensors" 2>&1 | sed -n 's/^relative difference \([0-9.e+-]*\):.*/\1/p'; }

# same NAME ONE MANY TOL: the run MANY trained the model the run ONE did, to
# TOL relative (the saved models, parameter by parameter, in L2 norm), with
# the same validation loss (TOL relative too), and its ranks' replicated
# tensors were the same bytes.
same() {
    local name=$1 one=$2 many=$3 tol=$4 status=${5:-0} r
    r=$(relative "$TMP/$one.d" "$TMP/$many.d")
    if [[ $status -eq 0 && -n "$r" ]] && awk -v r="$r" -v t="$tol" 'BEGIN { exit !(r <= t) }' &&
       rel_near "$(valid "$TMP/$one")" "$(valid "$TMP/$many")" "$tol" &&
       grep -q '^replicas: the replicated tensors' "$TMP/$many"; then
        pass "$name (models differ by $r relative; valid loss $(valid "$TMP/$many"))"
    else fail "$name" "status $status, relative difference '$r' (at most $tol), valid $(valid "$TMP/$one") vs $(valid "$TMP/$many"): $(grep -m1 -E 'error' "$TMP/$many")"; fi
}

# ---------------------------------------------------------------- on CPU ranks, every build
# One process with batch 8 is the reference; tp 2 splits each block over 2
# ranks (the same batch), dp 2 x tp 2 gives each replica 4 of the 8
# sequences. --check_every 1 checks the replicas byte for byte after every step.
run_capture 120 "$TMP/one" "$prog" "${cpu[@]}" --max_steps 15 --batch_size 8 --out_dir "$TMP/one.d"
run_capture 120 "$TMP/tp2" "$prog" "${cpu[@]}" --max_steps 15 --batch_size 8 --tp 2 --check_every 1 --out_dir "$TMP/tp2.d"
same "tp: tp 2 equals one process after 15 steps (fp32, CPU)" one tp2 1e-6 $?
run_capture 120 "$TMP/mesh" "$prog" "${cpu[@]}" --max_steps 15 --batch_size 4 --dp 2 --tp 2 --check_every 1 --out_dir "$TMP/mesh.d"
same "tp: dp 2 x tp 2 (batch 4 each) equals one process with batch 8 (fp32, CPU)" one mesh 1e-6 $?
# tp 4 needs 4 heads.
run_capture 120 "$TMP/one4" "$prog" "${cpu[@]}" --max_steps 15 --batch_size 8 --n_head 4 --out_dir "$TMP/one4.d"
run_capture 120 "$TMP/tp4" "$prog" "${cpu[@]}" --max_steps 15 --batch_size 8 --n_head 4 --tp 4 --check_every 1 --out_dir "$TMP/tp4.d"
same "tp: tp 4 (4 heads, one each) equals one process (fp32, CPU)" one4 tp4 1e-6 $?
# With --tp 1 the program is chapter 08, bit for bit.
run_capture 120 "$TMP/ch08" "$p08" "${cpu[@]}" --max_steps 15 --batch_size 8 --out_dir "$TMP/ch08.d"
sum() { sed -n 's/.*checksum \([0-9a-f]*\),.*/\1/p' "$1" | tail -n 1; }
if [[ -n "$(sum "$TMP/one")" && "$(sum "$TMP/one")" == "$(sum "$TMP/ch08")" ]]; then
    pass "tp: --tp 1 trains chapter 08's model bit for bit ($(sum "$TMP/one"))"
else fail "tp: --tp 1 trains chapter 08's model bit for bit" "checksums '$(sum "$TMP/one")' vs '$(sum "$TMP/ch08")'"; fi

# The mesh: rank -> (dp, tp); tp groups are consecutive ranks.
if grep -q '^mesh: dp 2 x tp 2 (4 ranks' "$TMP/mesh" && grep -Eq '^ +2 +1 +0 ' "$TMP/mesh" && grep -Eq '^ +1 +0 +1 ' "$TMP/mesh"; then
    pass "tp: the mesh is printed, rank -> (dp, tp), tp fastest"
else fail "tp: the mesh is printed, rank -> (dp, tp), tp fastest" "$(grep -A5 '^mesh:' "$TMP/mesh" | tr '\n' '|')"; fi

# What a rank holds and sends, measured, equals the formulas (dp 2 x tp 2,
# 2 layers, batch 4 x 32, C 64: 4 x 2 x 4 x 32 x 64 = 65536 numbers all-reduced
# over tp per step).
params=$(sed -n 's/^per rank: parameters \([0-9]*\) numbers; formula .* = \([0-9]*\);.*/\1 \2/p' "$TMP/mesh")
acts=$(sed -n 's/^per rank: activations and their gradients \([0-9.]*\) MiB (measured.* = \([0-9.]*\) MiB$/\1 \2/p' "$TMP/mesh")
traffic=$(sed -n 's/^per rank and step: tp all-reduces of \([0-9]*\) numbers .* = \([0-9]*\); dp all-reduce .*/\1 \2/p' "$TMP/mesh")
set -- $params $acts $traffic
if [[ $# -eq 6 && $1 == "$2" && $3 == "$4" && $5 == "$6" && $5 -eq 65536 ]]; then
    pass "tp: per rank, parameters ($1), activations ($3 MiB) and numbers all-reduced per step ($5) equal the formulas"
else fail "tp: per rank, measured memory and traffic equal the formulas" "got '$params' '$acts' '$traffic'"; fi

# Snapshots are whole: a tp 2 run dies in epoch 2, and a tp 1 run resumes
# from its epoch-1 snapshot and ends where an unbroken tp 2 run ends.
small=(--data_dir "$TMP/small" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000
       --device cpu --epochs 2 --save_every 1)
awk -v dir="$TMP/small" 'BEGIN { system("mkdir -p " dir); srand(5)
    for (f = 1; f <= 3; f++) { file = dir "/" (f == 1 ? "train.txt" : f == 2 ? "valid.txt" : "test.txt")
        for (i = 0; i < (f == 1 ? 240 : 60); i++) printf " the cat %d sees a dog %d . \n", i % 7, i % 5 > file } }'
run_capture 120 "$TMP/clean" "$prog" "${small[@]}" --tp 2 --out_dir "$TMP/clean.d" --snapshot_path "$TMP/clean.d/s.safetensors"
steps=$(sed -n 's/.*snapshot saved: Epoch 1 (step \([0-9]*\)).*/\1/p' "$TMP/clean")
COURSE_FAIL_RANK=1 COURSE_FAIL_STEP=$(( ${steps:-5} + 2 )) run_capture 120 "$TMP/broken" "$prog" "${small[@]}" --tp 2 \
    --out_dir "$TMP/broken.d" --snapshot_path "$TMP/broken.d/s.safetensors"; died=$?
run_capture 120 "$TMP/resumed" "$prog" "${small[@]}" --tp 1 --out_dir "$TMP/resumed.d" --snapshot_path "$TMP/broken.d/s.safetensors"
status=$?; r=$(relative "$TMP/clean.d" "$TMP/resumed.d")
if [[ $died -ne 0 && $status -eq 0 && -n "$r" ]] && grep -q 'Resuming training from snapshot at Epoch 1' "$TMP/resumed" &&
   awk -v r="$r" 'BEGIN { exit !(r <= 1e-6) }'; then
    pass "tp: a tp 2 run killed in epoch 2 resumes with tp 1 from its whole snapshot, and ends where tp 2 ends ($r relative)"
else fail "tp: resume with another tp" "killed run status $died, resumed status $status, relative '$r': $(grep -m1 -E 'error|Resuming' "$TMP/resumed")"; fi

# Chapter 08 samples from the model a tp 2 run saved, and (greedy, the same
# prompt) writes what the tp 2 run wrote.
run_capture 120 "$TMP/greedy" "$prog" "${small[@]}" --tp 2 --epochs 1 --num_samples 1 --temperature 0 --sample_tokens 12 \
    --out_dir "$TMP/greedy.d"
run_capture 120 "$TMP/gen08" "$p08" --generate --device cpu --num_samples 1 --temperature 0 --sample_tokens 12 --out_dir "$TMP/greedy.d"
status=$?
# The sample: the lines after its header, up to the next line the programs print.
sample() { awk '/^--- sample 1 /{on=1; next} on && /^(saved: |final parameters|metrics: |--- sample)/{exit} on' "$1"; }
a=$(sample "$TMP/greedy"); b=$(sample "$TMP/gen08")
if [[ $status -eq 0 && -n "$a" && "$a" == "$b" ]]; then pass "tp: chapter 08 loads the whole model a tp 2 run saved and samples its text ('$(echo $a)')"
else fail "tp: chapter 08 samples from a tp 2 run's model" "status $status, tp 2 wrote '$a', 08 wrote '$b': $(grep -m1 error "$TMP/gen08")"; fi

# Bad layouts: a tp that does not divide the heads (exit 2, the flag named),
# and a mesh that is not the job's ranks.
run_capture 30 "$TMP/bad_tp" "$prog" "${cpu[@]}" --tp 3; status=$?
if [[ $status -eq 2 ]] && grep -q -- "--tp 3: tp must divide n_head" "$TMP/bad_tp"; then pass "tp: --tp 3 with 2 heads is refused (exit 2)"
else fail "tp: --tp 3 with 2 heads is refused (exit 2)" "status $status: $(head -n 2 "$TMP/bad_tp" | tr '\n' '|')"; fi
run_capture 60 "$TMP/bad_mesh" "$ddprun" --standalone --nproc_per_node=4 "$prog" "${cpu[@]}" --dp 3 --tp 2 --out_dir "$TMP/bad.d"
status=$?
if [[ $status -ne 0 ]] && grep -q -- "--dp 3 x --tp 2 is 6 ranks, and the job has 4" "$TMP/bad_mesh"; then
    pass "tp: --dp 3 --tp 2 on 4 ranks is refused, naming both"
else fail "tp: --dp 3 --tp 2 on 4 ranks is refused" "status $status: $(grep -m1 error "$TMP/bad_mesh")"; fi

# ---------------------------------------------------------------- under mpirun
if command -v mpirun >/dev/null 2>&1 && ! "$prog" --backend mpi --device cpu 2>&1 | grep -q "this build has no MPI"; then
    mpi=(mpirun -np)
    if mpirun --version 2>&1 | grep -q "Open MPI"; then mpi=(mpirun --oversubscribe --allow-run-as-root -np); fi
    run_capture 120 "$TMP/mpi" "${mpi[@]}" 4 "$prog" "${cpu[@]}" --backend mpi --max_steps 15 --batch_size 4 --dp 2 --tp 2 \
        --out_dir "$TMP/mpi.d"
    status=$?
    grep -q 'backend mpi' "$TMP/mpi" || status=99
    same "tp: dp 2 x tp 2 under mpirun (backend mpi) equals one process" one mpi 1e-6 $status
else
    skip "tp: dp 2 x tp 2 under mpirun" "no mpirun, or a build without MPI (apt-get install openmpi-bin libopenmpi-dev, then make)"
fi

# ---------------------------------------------------------------- on GPUs
# The GPU model (gpt_cuda.cu) on real GPUs or the 8 emulated ones of a
# CUDA=emu build, one per rank, talking NCCL. Blocks of 16 tokens: the
# emulator is slow.
if ! has_gpu; then
    for what in "tp 2 in fp32" "dp 2 x tp 2 in fp32" "tp 4 in fp32" "dp 2 x tp 2 in bf16"; do
        skip "tp gpu: $what equals one GPU" "no GPU here (a CPU-only build, or no GPU: make CUDA=emu test runs these on the emulated GPU)"
    done
else
    gpu=("${common[@]}" --device cuda --block_size 16 --max_steps 15)
    run_capture 300 "$TMP/g_one" "$prog" "${gpu[@]}" --precision fp32 --batch_size 8 --out_dir "$TMP/g_one.d"
    run_capture 300 "$TMP/g_tp2" "$prog" "${gpu[@]}" --precision fp32 --batch_size 8 --tp 2 --out_dir "$TMP/g_tp2.d"
    same "tp gpu: tp 2 equals one GPU in fp32 (08's 1e-5)" g_one g_tp2 1e-5 $?
    run_capture 300 "$TMP/g_mesh" "$prog" "${gpu[@]}" --precision fp32 --batch_size 4 --dp 2 --tp 2 --out_dir "$TMP/g_mesh.d"
    status=$?
    grep -q 'backend nccl' "$TMP/g_mesh" || status=98
    same "tp gpu: dp 2 x tp 2 (nccl) equals one GPU in fp32" g_one g_mesh 1e-5 $status
    run_capture 300 "$TMP/g_one4" "$prog" "${gpu[@]}" --precision fp32 --batch_size 8 --n_head 4 --out_dir "$TMP/g_one4.d"
    run_capture 300 "$TMP/g_tp4" "$prog" "${gpu[@]}" --precision fp32 --batch_size 8 --n_head 4 --tp 4 --out_dir "$TMP/g_tp4.d"
    same "tp gpu: tp 4 equals one GPU in fp32" g_one4 g_tp4 1e-5 $?
    # bf16 rounds the partial sums before they are added: 08's bf16 tolerance.
    run_capture 300 "$TMP/h_one" "$prog" "${gpu[@]}" --batch_size 8 --out_dir "$TMP/h_one.d"
    run_capture 300 "$TMP/h_mesh" "$prog" "${gpu[@]}" --batch_size 4 --dp 2 --tp 2 --out_dir "$TMP/h_mesh.d"
    status=$?
    grep -q 'bf16 (fp32 master' "$TMP/h_mesh" || status=97
    same "tp gpu: dp 2 x tp 2 equals one GPU in bf16 (08's 2e-2)" h_one h_mesh 2e-2 $status
fi

no_leftovers "tp: no process left behind" "10_tensor_parallel/10_tensor_parallel"
