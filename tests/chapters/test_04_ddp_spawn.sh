# Chapter 04: DDP started with spawn learns the same model as one process.
source "$(dirname "$0")/../lib.sh"
bin="$ROOT/04_ddp_spawn/04_ddp_spawn"
one="$ROOT/01_single_gpu/01_single_gpu"
# final N FILE: the weight (1) or the bias (2) of the last "final weight W  bias B" line
final() { field "$2" 'final weight ([-0-9.]*)  bias ([-0-9.]*)' "\\$1"; }

run_capture 300 "$TMP/two" "$bin" --nprocs 2 --device cpu; status=$?
check "04: 2 ranks exit 0" test $status -eq 0
expect_output "04: main says how many ranks it spawns" "$TMP/two" '^04_ddp_spawn: [0-9]+ GPU\(s\) visible; spawning 2 rank\(s\)$'
expect_output "04: per-rank start line of rank 0" "$TMP/two" '^\[CPU0\] Epoch 0 \| Batchsize: 32 \| Steps: 157$'
expect_output "04: per-rank start line of rank 1" "$TMP/two" '^\[CPU1\] Epoch 0 \| Batchsize: 32 \| Steps: 157$'
expect_output "04: rank 0 prints the epoch's loss over all ranks" "$TMP/two" '^epoch  0 \| loss [0-9.]+ \(mean over all ranks\) \| 157 steps \| '
w=$(final 1 "$TMP/two"); b=$(final 2 "$TMP/two")
near "$w" 2 0.05 && near "$b" 3 0.05
verdict $? "04: 2 ranks learn weight 2, bias 3 ($w, $b)" "weight '$w', bias '$b'"

run_capture 300 "$TMP/three" "$bin" --nprocs 3 --device cpu; status=$?
w=$(final 1 "$TMP/three"); b=$(final 2 "$TMP/three")
[[ $status -eq 0 ]] && near "$w" 2 0.05 && near "$b" 3 0.05
verdict $? "04: 3 ranks learn weight 2, bias 3 ($w, $b)" "status $status, weight '$w', bias '$b'"

# DDP = one process with the summed batch: N ranks x batch 16 with lr L/N
# (scaled back to L by the linear rule) against chapter 01 with batch N*16
# and lr L, one epoch over the same global order. 9600 samples divide
# evenly, so no rank's share is padded. The optimizer is plain SGD, whose
# step is lr x the gradient: a gradient N times too large (a sum over the
# ranks where their mean belongs) is a step N times too long, and the
# weights end elsewhere (planted below), unlike AdamW's, which a uniform
# scale barely moves.
# ddp_equals_one PROGRAM N NAME : runs PROGRAM (chapter 04) with N ranks x
# batch 16 and chapter 01 with batch 16N (once per N), into $TMP/NAME and
# $TMP/singleN; sets d_w d_b (DDP's weight and bias) and s_w s_b (one
# process's); true when they agree within 1e-5, every digit printed.
ddp_equals_one() {
    local prog=$1 n=$2 name=$3 lr
    lr=$(awk -v n="$n" 'BEGIN { printf "%.10g", 0.03 / n }')
    run_capture 300 "$TMP/$name" "$prog" --nprocs "$n" --batch_size 16 --lr "$lr" --samples 9600 --epochs 1 --device cpu --features 4
    [[ -s $TMP/single$n ]] ||
        run_capture 120 "$TMP/single$n" "$one" --batch_size $((16 * n)) --lr 0.03 --samples 9600 --epochs 1 --device cpu --features 4
    d_w=$(final 1 "$TMP/$name"); d_b=$(final 2 "$TMP/$name")
    s_w=$(field "$TMP/single$n" '^learned weights: w\[0\] = ([-0-9.]*)'); s_b=$(field "$TMP/single$n" '^learned bias: ([-0-9.]*)')
    [[ -n "$d_w" && -n "$s_w" ]] && rel_near "$d_w" "$s_w" 1e-5 && rel_near "$d_b" "$s_b" 1e-5
}
for n in 1 2 3; do
    ddp_equals_one "$bin" $n ddp$n
    verdict $? "04: $n rank(s) x batch 16 equal 1 process x batch $((16 * n)) within 1e-5 ($d_w/$s_w, $d_b/$s_b)" "DDP w=$d_w b=$d_b; single w=$s_w b=$s_b"
done

# Several buckets: the 5 parameters of --features 4 in buckets of 8 bytes
# are averaged by three all-reduces (2, 2 and 1 floats), not one: a bucket
# averaged at the wrong offset, or left out, ends elsewhere.
COURSE_DDP_BUCKET_BYTES=8 ddp_equals_one "$bin" 3 buckets
verdict $? "04: 3 ranks averaging in 3 buckets (8 bytes each) equal 1 process x batch 48 within 1e-5 ($d_w/$s_w, $d_b/$s_b)" "DDP w=$d_w b=$d_b; single w=$s_w b=$s_b"
# Planted (tests/lib.sh, plant): every bucket all-reduced from the start of
# the gradients, so that only the first two parameters are ever averaged.
# The copy passes with one bucket (the default 25 MiB) and must fail with three.
planted=$(plant bucket_offset common/ddp.h 'pg_all_reduce(pg, grads + first, grads + first, n,' \
    'pg_all_reduce(pg, grads, grads, n,' 04_ddp_spawn 04_ddp_spawn)
[[ -n $planted ]] && ddp_equals_one "$planted" 3 planted_one_bucket &&
    ! COURSE_DDP_BUCKET_BYTES=8 ddp_equals_one "$planted" 3 planted_buckets && [[ -n $d_w ]]
verdict $? "planted: buckets all-reduced at offset 0 pass with one bucket, fail with three ($d_w/$s_w, $d_b/$s_b)" "$(planted_why bucket_offset)DDP w=$d_w b=$d_b; single w=$s_w b=$s_b"

# Planted: the ranks' gradients summed, not averaged (the missing 1/N),
# with 2 ranks: each step twice as long as one process's.
planted=$(plant sum_not_mean common/ddp.h 'grads + first, n, DTYPE_F32, OP_AVG);' 'grads + first, n, DTYPE_F32, OP_SUM);' \
    04_ddp_spawn 04_ddp_spawn)
[[ -n $planted ]] && ! ddp_equals_one "$planted" 2 planted_sum && [[ -n $d_w ]]
verdict $? "planted: gradients summed over 2 ranks instead of averaged fail the equal-to-one-process check ($d_w/$s_w, $d_b/$s_b)" \
    "$(planted_why sum_not_mean)DDP w=$d_w b=$d_b; single w=$s_w b=$s_b"

# Replicas stay bit-identical: the check runs every 10 steps and passes (that
# it catches a replica that drifts is tested where it lives, library/test_ddp).
run_capture 300 "$TMP/replicas" "$bin" --nprocs 3 --epochs 2 --check_replicas 10 --device cpu; status=$?
check "04: replicas stay bit-identical (checked every 10 steps)" test $status -eq 0

# --grad_compress bf16 (DDP's bf16_compress_hook, common/ddp.h): the 2
# gradients (weight, bias) travel as bf16, 4 bytes a step instead of 8, the
# replicas stay identical, and the model still learns.
run_capture 300 "$TMP/bf16" "$bin" --nprocs 2 --epochs 2 --check_replicas 10 --grad_compress bf16 --device cpu; status=$?
w=$(final 1 "$TMP/bf16"); b=$(final 2 "$TMP/bf16")
[[ $status -eq 0 ]] && near "$w" 2 0.05 && near "$b" 3 0.05 && grep -q '^gradients all-reduced: 4 bytes per step per rank (bf16)$' "$TMP/bf16" &&
   grep -q '^gradients all-reduced: 8 bytes per step per rank (fp32)$' "$TMP/two"
verdict $? "04: --grad_compress bf16 sends 4 bytes a step (fp32: 8), keeps replicas equal and learns ($w, $b)" \
    "status $status, weight '$w', bias '$b': $(grep 'gradients all-reduced' "$TMP/bf16" "$TMP/two" | tr '\n' '|')"

# NCCL's one-rank-per-GPU rule gets one clear explanation.
gpus=$(gpu_count)
run_capture 60 "$TMP/nccl" "$bin" --nprocs $((gpus + 1)) --backend nccl; status=$?
[[ $status -ne 0 ]] && grep -q "needs one GPU per rank" "$TMP/nccl" && grep -q -- "--backend cpu" "$TMP/nccl"
verdict $? "04: more ranks than GPUs with --backend nccl is one clear error" "status $status: $(head -n 2 "$TMP/nccl" | tr '\n' '|')"

# A rank that fails at start-up: rank 0 writes the metrics CSV, and where
# COURSE_RUNS_DIR is a file, not a folder, it cannot; it stops before the
# first step, while the other ranks wait for it in the barrier that starts
# training. spawn names it, stops the others and ends the job with status 1.
touch "$TMP/not-a-folder"
# startup_fails PROGRAM LOG: the run; true when it ended as described above.
startup_fails() {
    COURSE_RUNS_DIR=$TMP/not-a-folder run_capture 60 "$2" "$1" --nprocs 3 --device cpu; status=$?
    [[ $status -eq 1 ]] && grep -q '^spawn: rank 0 exited with status 1; stopping the other 2 ranks$' "$2" &&
        grep -q "^\[rank 0\] error: cannot create directory $TMP/not-a-folder/04_ddp_spawn: Not a directory" "$2" &&
        ! grep -q 'Epoch' "$2"
}
startup_fails "$bin" "$TMP/startup"
verdict $? "04: rank 0 failing at start-up (no folder for its CSV) is named by spawn, and the job exits 1" \
    "status $status: $(tail -n 3 "$TMP/startup" | tr '\n' '|')"
# Planted: spawn counting only deaths by a signal as failures (an exit
# status of 1 passes for success).
planted=$(plant exit_ignored common/spawn.h 'bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;' \
    'bool failed = !WIFEXITED(status);' 04_ddp_spawn 04_ddp_spawn)
[[ -n $planted ]] && ! startup_fails "$planted" "$TMP/planted_startup" && [[ -s $TMP/planted_startup ]]
verdict $? "planted: spawn ignoring exit statuses fails the start-up failure check (status $status)" \
    "$(planted_why exit_ignored)$(tail -n 3 "$TMP/planted_startup" 2>/dev/null | tr '\n' '|')"

# Too large a learning rate (the linear rule makes it 8 x 0.2 = 1.6) is
# caught and explained, not printed as a result of -nan.
run_capture 120 "$TMP/diverged" "$bin" --nprocs 8 --lr 0.2 --device cpu; status=$?
[[ $status -eq 1 ]] && grep -q "error: training diverged: the loss went from .* lr 1.6 (lr x world size, the linear scaling rule) is too large.*Use --lr 0.0625 or less" "$TMP/diverged"
verdict $? "04: a diverging run (lr 0.2 x 8 ranks) is reported with the lr to use" "status $status: $(tail -n 1 "$TMP/diverged")"
run_capture 120 "$TMP/stable" "$bin" --nprocs 8 --lr 0.06 --device cpu; status=$?
w=$(final 1 "$TMP/stable")
[[ $status -eq 0 ]] && near "$w" 2 0.05
verdict $? "04: the suggested lr (0.06 x 8 ranks) learns ($w)" "status $status, weight '$w': $(tail -n 1 "$TMP/stable")"

# Ctrl-C in a terminal reaches the whole foreground process group: the job
# stops with status 130 (128 + SIGINT), as spawn says, without an error.
setsid "$bin" --nprocs 2 --epochs 100000 --device cpu >"$TMP/ctrlc" 2>&1 & leader=$!
for _ in $(seq 100); do grep -q 'epoch .* | loss' "$TMP/ctrlc" && break; sleep 0.1; done
kill -INT -- -"$leader" 2>/dev/null
for _ in $(seq 100); do kill -0 "$leader" 2>/dev/null || break; sleep 0.1; done
kill -KILL -- -"$leader" 2>/dev/null; wait "$leader"; status=$?
[[ $status -eq 130 ]] && grep -q '^spawn: got SIGINT; stopping all 2 ranks' "$TMP/ctrlc" && ! grep -q 'error' "$TMP/ctrlc"
verdict $? "04: Ctrl-C stops the job with status 130 and no error message" "status $status: $(grep -v 'steps\|Epoch' "$TMP/ctrlc" | tail -n 3 | tr '\n' '|')"

run_capture 10 "$TMP/bad" "$bin" --nprocs zero; status=$?
[[ $status -eq 2 ]] && grep -q -- "--nprocs expects an integer" "$TMP/bad"
verdict $? "04: bad flag exits 2" "status $status"
no_leftovers "04: no process left behind" "04_ddp_spawn/04_ddp_spawn"
