# Chapter 04: DDP started with spawn learns the same model as one process.
source "$(dirname "$0")/lib.sh"
bin="$ROOT/04_ddp_spawn/04_ddp_spawn"
one="$ROOT/01_single_gpu/01_single_gpu"
# "DDP (2)  weight 1.997 bias 2.997 ..." -> the number after a word on a results line
field() { sed -n "s/^$1 *weight \([-0-9.]*\) *bias \([-0-9.]*\).*/\\$2/p" "$3" | tail -n 1; }

run_capture 300 "$TMP/two" "$bin" --nprocs 2 --device cpu; status=$?
check "04: 2 ranks with the baseline exit 0" test $status -eq 0
expect_output "04: per-rank start line of rank 0" "$TMP/two" '^\[CPU0\] Epoch 0 \| Batchsize: 32 \| Steps: 157$'
expect_output "04: per-rank start line of rank 1" "$TMP/two" '^\[CPU1\] Epoch 0 \| Batchsize: 32 \| Steps: 157$'
expect_output "04: rank 0 prints its loss every 100 steps" "$TMP/two" '^\[CPU0\] step   100 \| loss '
expect_output "04: speedup and efficiency are reported" "$TMP/two" '^speedup [0-9.]+x, parallel efficiency [0-9]+%'
for run in "baseline (1)" "DDP (2)"; do
    w=$(field "$run" 1 "$TMP/two"); b=$(field "$run" 2 "$TMP/two")
    if near "$w" 2 0.05 && near "$b" 3 0.05; then pass "04: $run learns weight 2, bias 3 ($w, $b)"
    else fail "04: $run learns weight 2, bias 3" "weight '$w', bias '$b'"; fi
done

run_capture 300 "$TMP/three" "$bin" --nprocs 3 --device cpu --no_baseline; status=$?
w=$(field 'DDP (3)' 1 "$TMP/three"); b=$(field 'DDP (3)' 2 "$TMP/three")
if [[ $status -eq 0 ]] && near "$w" 2 0.05 && near "$b" 3 0.05; then pass "04: 3 ranks learn weight 2, bias 3 ($w, $b)"
else fail "04: 3 ranks learn weight 2, bias 3" "status $status, weight '$w', bias '$b'"; fi

# DDP = one process with the summed batch: N ranks x batch 16 with lr L/N
# (scaled back to L by the linear rule) against chapter 01 with batch N*16
# and lr L, one epoch over the same global order. 9600 samples divide
# evenly, so no rank's share is padded.
for n in 1 2 3; do
    lr=$(awk -v n=$n 'BEGIN { printf "%.10g", 0.03 / n }')
    run_capture 300 "$TMP/ddp$n" "$bin" --nprocs $n --batch_size 16 --lr "$lr" --samples 9600 --epochs 1 --no_baseline --device cpu --features 4
    run_capture 120 "$TMP/single$n" "$one" --batch_size $((16 * n)) --lr 0.03 --samples 9600 --epochs 1 --device cpu --features 4
    # compare every parameter printed with full precision
    d_w=$(field "DDP ($n)" 1 "$TMP/ddp$n"); d_b=$(field "DDP ($n)" 2 "$TMP/ddp$n")
    s_w=$(sed -n 's/^learned weights: w\[0\] = \([-0-9.]*\).*/\1/p' "$TMP/single$n"); s_b=$(sed -n 's/^learned bias: \([-0-9.]*\).*/\1/p' "$TMP/single$n")
    if [[ -n "$d_w" && -n "$s_w" ]] && rel_near "$d_w" "$s_w" 1e-5 && rel_near "$d_b" "$s_b" 1e-5; then
        pass "04: $n rank(s) x batch 16 equal 1 process x batch $((16 * n)) within 1e-5 ($d_w/$s_w, $d_b/$s_b)"
    else fail "04: $n rank(s) x batch 16 equal 1 process x batch $((16 * n)) within 1e-5" "DDP w=$d_w b=$d_b; single w=$s_w b=$s_b"; fi
done

# Replicas stay bit-identical: the check runs every 10 steps and passes...
run_capture 300 "$TMP/replicas" "$bin" --nprocs 3 --epochs 2 --no_baseline --check_replicas 10 --device cpu; status=$?
check "04: replicas stay bit-identical (checked every 10 steps)" test $status -eq 0
# ...and it does catch a rank that drifts.
COURSE_DDP_PERTURB_RANK=2 run_capture 120 "$TMP/drift" "$bin" --nprocs 3 --epochs 1 --no_baseline --check_replicas 10 --device cpu; status=$?
if [[ $status -ne 0 ]] && grep -q "replicas diverged at step 10: the parameters of rank(s) 2 differ" "$TMP/drift"; then
    pass "04: a diverging replica is caught and named"
else fail "04: a diverging replica is caught and named" "status $status: $(grep -m1 -i 'diverged\|error' "$TMP/drift")"; fi

# NCCL's one-rank-per-GPU rule gets one clear explanation.
gpus=$(gpu_count)
run_capture 60 "$TMP/nccl" "$bin" --nprocs $((gpus + 1)) --backend nccl; status=$?
if [[ $status -ne 0 ]] && grep -q "needs one GPU per rank" "$TMP/nccl" && grep -q -- "--backend cpu" "$TMP/nccl"; then
    pass "04: more ranks than GPUs with --backend nccl is one clear error"
else fail "04: more ranks than GPUs with --backend nccl is one clear error" "status $status: $(head -n 2 "$TMP/nccl" | tr '\n' '|')"; fi

run_capture 10 "$TMP/bad" "$bin" --nprocs zero; status=$?
if [[ $status -eq 2 ]] && grep -q -- "--nprocs expects an integer" "$TMP/bad"; then pass "04: bad flag exits 2"
else fail "04: bad flag exits 2" "status $status"; fi
no_leftovers "04: no process left behind" "04_ddp_spawn/04_ddp_spawn"
