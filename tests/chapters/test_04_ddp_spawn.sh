# Chapter 04: DDP started with spawn learns the same model as one process.
source "$(dirname "$0")/../lib.sh"
bin="$ROOT/04_ddp_spawn/04_ddp_spawn"
one="$ROOT/01_single_gpu/01_single_gpu"
# learned RUN FILE: "WEIGHT BIAS" of a results line, "DDP (2)  weight 1.997 bias 2.997 ..."
learned() { local run=${1//(/\\(}; run=${run//)/\\)}; field "$2" "^$run *weight ([-0-9.]*) *bias ([-0-9.]*)" '\1 \2'; }

run_capture 300 "$TMP/two" "$bin" --nprocs 2 --device cpu; status=$?
check "04: 2 ranks with the baseline exit 0" test $status -eq 0
expect_output "04: per-rank start line of rank 0" "$TMP/two" '^\[CPU0\] Epoch 0 \| Batchsize: 32 \| Steps: 157$'
expect_output "04: per-rank start line of rank 1" "$TMP/two" '^\[CPU1\] Epoch 0 \| Batchsize: 32 \| Steps: 157$'
expect_output "04: rank 0 prints the epoch's loss over all ranks" "$TMP/two" '^epoch  0 \| loss [0-9.]+ \(mean over all ranks\) \| 157 steps \| '
# The timing: --repeats (5) more runs of each, whose times are listed; the
# speedup is the median of the pairs' ratios (baseline / DDP), the range their
# min and max, the efficiency the speedup over 2 ranks, and each result line's
# time the median of its list. All recomputed here from the printed numbers.
awk '
    function median(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
                                       return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
    function near(a, b, tol) { return (a - b < tol && b - a < tol) }
    /^=== timing: 5 more run/ { timing = 1 }
    timing && /^baseline \(1\) +[0-9.]+ / { for (i = 3; i < NF; i++) base[++nb] = $i }
    timing && /^DDP \(2\) +[0-9.]+ / { for (i = 3; i < NF; i++) ddp[++nd] = $i }
    /^baseline \(1\) +weight .* \(median of 5\)/ { tb = $8 }
    /^DDP \(2\) +weight .* \(median of 5\)/ { td = $8 }
    /^speedup / { s = $2; sub(/x$/, "", s); lo = $7; sub(/;?$/, "", lo); split(lo, r, "-"); sub(/x\)?,?$/, "", r[2]); eff = $10; sub(/%/, "", eff) }
    END {
        if (nb != 5 || nd != 5 || s == "") { print "5 times each and a speedup line expected"; exit 1 }
        min = 1e30; max = 0
        for (i = 1; i <= 5; i++) { q[i] = base[i] / ddp[i]; if (q[i] < min) min = q[i]; if (q[i] > max) max = q[i] }
        m = median(q, 5)
        # 3 significant digits printed; the times have 6 decimals
        if (!near(s, m, 0.006 * m)) { printf "speedup %s, median of the ratios %.5f\n", s, m; exit 1 }
        if (!near(r[1], min, 0.006 * min) || !near(r[2], max, 0.006 * max)) { printf "range %s-%s, ratios %.5f-%.5f\n", r[1], r[2], min, max; exit 1 }
        if (!near(eff, 100 * s / 2, 0.51 + 0.05 * s)) { printf "efficiency %s%%, speedup %s / 2 ranks\n", eff, s; exit 1 }
        if (!near(tb, median(base, 5), 1e-6) || !near(td, median(ddp, 5), 1e-6)) { printf "result times %s %s are not the medians\n", tb, td; exit 1 }
    }' "$TMP/two" >"$TMP/speedup.why"
verdict $? "04: speedup = median of 5 interleaved baseline/DDP ratios, with their range and the efficiency" \
    "$(cat "$TMP/speedup.why"): $(grep -A2 '^=== timing' "$TMP/two" | tr '\n' '|') $(grep '^speedup' "$TMP/two")"
for run in "baseline (1)" "DDP (2)"; do
    read -r w b < <(learned "$run" "$TMP/two")
    near "$w" 2 0.05 && near "$b" 3 0.05; verdict $? "04: $run learns weight 2, bias 3 ($w, $b)" "weight '$w', bias '$b'"
done

run_capture 300 "$TMP/three" "$bin" --nprocs 3 --device cpu --no_baseline; status=$?
read -r w b < <(learned 'DDP (3)' "$TMP/three")
[[ $status -eq 0 ]] && near "$w" 2 0.05 && near "$b" 3 0.05
verdict $? "04: 3 ranks learn weight 2, bias 3 ($w, $b)" "status $status, weight '$w', bias '$b'"

# DDP = one process with the summed batch: N ranks x batch 16 with lr L/N
# (scaled back to L by the linear rule) against chapter 01 with batch N*16
# and lr L, one epoch over the same global order. 9600 samples divide
# evenly, so no rank's share is padded.
for n in 1 2 3; do
    lr=$(awk -v n=$n 'BEGIN { printf "%.10g", 0.03 / n }')
    run_capture 300 "$TMP/ddp$n" "$bin" --nprocs $n --batch_size 16 --lr "$lr" --samples 9600 --epochs 1 --no_baseline --device cpu --features 4
    run_capture 120 "$TMP/single$n" "$one" --batch_size $((16 * n)) --lr 0.03 --samples 9600 --epochs 1 --device cpu --features 4
    # compare every parameter printed with full precision
    read -r d_w d_b < <(learned "DDP ($n)" "$TMP/ddp$n")
    s_w=$(field "$TMP/single$n" '^learned weights: w\[0\] = ([-0-9.]*)'); s_b=$(field "$TMP/single$n" '^learned bias: ([-0-9.]*)')
    [[ -n "$d_w" && -n "$s_w" ]] && rel_near "$d_w" "$s_w" 1e-5 && rel_near "$d_b" "$s_b" 1e-5
    verdict $? "04: $n rank(s) x batch 16 equal 1 process x batch $((16 * n)) within 1e-5 ($d_w/$s_w, $d_b/$s_b)" \
        "DDP w=$d_w b=$d_b; single w=$s_w b=$s_b"
done

# Replicas stay bit-identical: the check runs every 10 steps and passes...
run_capture 300 "$TMP/replicas" "$bin" --nprocs 3 --epochs 2 --no_baseline --check_replicas 10 --device cpu; status=$?
check "04: replicas stay bit-identical (checked every 10 steps)" test $status -eq 0
# ...and it does catch a rank that drifts.
COURSE_DDP_PERTURB_RANK=2 run_capture 120 "$TMP/drift" "$bin" --nprocs 3 --epochs 1 --no_baseline --check_replicas 10 --device cpu; status=$?
[[ $status -ne 0 ]] && grep -q "replicas diverged at step 10: the parameters of rank(s) 2 differ" "$TMP/drift"
verdict $? "04: a diverging replica is caught and named" "status $status: $(grep -m1 -i 'diverged\|error' "$TMP/drift")"

# NCCL's one-rank-per-GPU rule gets one clear explanation.
gpus=$(gpu_count)
run_capture 60 "$TMP/nccl" "$bin" --nprocs $((gpus + 1)) --backend nccl; status=$?
[[ $status -ne 0 ]] && grep -q "needs one GPU per rank" "$TMP/nccl" && grep -q -- "--backend cpu" "$TMP/nccl"
verdict $? "04: more ranks than GPUs with --backend nccl is one clear error" "status $status: $(head -n 2 "$TMP/nccl" | tr '\n' '|')"

# Too large a learning rate (the linear rule makes it 8 x 0.2 = 1.6) is
# caught and explained, not printed as a result of -nan.
run_capture 120 "$TMP/diverged" "$bin" --nprocs 8 --lr 0.2 --no_baseline --device cpu; status=$?
[[ $status -eq 1 ]] && grep -q "error: training diverged: the loss went from .* lr 1.6 (lr x world size, the linear scaling rule) is too large.*Use --lr 0.0625 or less" "$TMP/diverged"
verdict $? "04: a diverging run (lr 0.2 x 8 ranks) is reported with the lr to use" "status $status: $(tail -n 1 "$TMP/diverged")"
run_capture 120 "$TMP/stable" "$bin" --nprocs 8 --lr 0.06 --no_baseline --device cpu; status=$?
read -r w _ < <(learned "DDP (8)" "$TMP/stable")
[[ $status -eq 0 ]] && near "$w" 2 0.05; verdict $? "04: the suggested lr (0.06 x 8 ranks) learns ($w)" "status $status, weight '$w': $(tail -n 1 "$TMP/stable")"

# Ctrl-C in a terminal reaches the whole foreground process group: the job
# stops with status 130 (128 + SIGINT), as spawn says, without an error.
setsid "$bin" --nprocs 2 --epochs 100000 --no_baseline --device cpu >"$TMP/ctrlc" 2>&1 & leader=$!
for _ in $(seq 100); do grep -q 'epoch .* | loss' "$TMP/ctrlc" && break; sleep 0.1; done
kill -INT -- -"$leader" 2>/dev/null
for _ in $(seq 100); do kill -0 "$leader" 2>/dev/null || break; sleep 0.1; done
kill -KILL -- -"$leader" 2>/dev/null; wait "$leader"; status=$?
[[ $status -eq 130 ]] && grep -q '^spawn: got SIGINT; stopping all 2 ranks' "$TMP/ctrlc" && ! grep -q 'error' "$TMP/ctrlc"
verdict $? "04: Ctrl-C stops the job with status 130 and no error message" "status $status: $(grep -v 'steps\|Epoch' "$TMP/ctrlc" | tail -n 3 | tr '\n' '|')"

run_capture 10 "$TMP/bad" "$bin" --nprocs zero; status=$?
[[ $status -eq 2 ]] && grep -q -- "--nprocs expects an integer" "$TMP/bad"; verdict $? "04: bad flag exits 2" "status $status"
no_leftovers "04: no process left behind" "04_ddp_spawn/04_ddp_spawn"
