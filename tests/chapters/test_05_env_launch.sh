# Chapter 05: the worker reads its rank from the launcher's variables, and
# the ranks train as one: DDP under ddprun equals one process with the
# whole batch, and the replicas stay identical.
source "$(dirname "$0")/../lib.sh"
bin="$ROOT/05_env_launch/05_env_launch"
one="$ROOT/01_single_gpu/01_single_gpu"
ddprun="$ROOT/tools/ddprun"
# final N FILE: the weight (1) or the bias (2) of the last "final weight W  bias B" line
final() { field "$2" 'final weight ([-0-9.]*)  bias ([-0-9.]*)' "\\$1"; }

# Started by hand: a job of one rank, no launcher, no network needed.
env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT "$bin" --epochs 3 --device cpu >"$TMP/alone" 2>&1; status=$?
[[ $status -eq 0 ]] && grep -q "^05_env_launch: 1 rank(s) (no launcher" "$TMP/alone" && near "$(final 1 "$TMP/alone")" 2 0.05
verdict $? "05: without launcher variables it runs as one process" "status $status: $(head -n 2 "$TMP/alone" | tr '\n' '|')"

csv="$COURSE_RUNS_DIR/05_env_launch/train.csv"   # this test's own folder (lib.sh)
for n in 2 3; do
    rm -f "$csv"
    run_capture 300 "$TMP/run$n" "$ddprun" --standalone --nproc_per_node=$n "$bin" --device cpu; status=$?
    w=$(final 1 "$TMP/run$n"); b=$(final 2 "$TMP/run$n")
    [[ $status -eq 0 ]] && near "$w" 2 0.05 && near "$b" 3 0.05
    verdict $? "05: $n ranks under ddprun learn weight 2, bias 3 ($w, $b)" "status $status, weight '$w', bias '$b'; $(tail -n 3 "$TMP/run$n" | tr '\n' '|')"
    # Rank 0 alone reports: ten epoch lines, not ten per rank.
    lines=$(grep -c "epoch .* | loss .*mean over all ranks" "$TMP/run$n")
    [[ "$lines" -eq 10 ]]
    verdict $? "05: only rank 0 prints ($n ranks: $lines epoch lines)" "$lines epoch lines with $n ranks, expected 10"
done
expect_output "05: the launcher's variables are named as the source" "$TMP/run2" "05_env_launch: 2 rank\(s\) \(torchrun variables"
# The CSV of the 3-rank run (deleted before it): its header, the command
# that made it, and one row per epoch with the loss that rank 0 printed.
printed=$(field --all "$TMP/run3" 'epoch *([0-9]*) \| loss ([0-9.]*) \(mean over all ranks\)' '\1,\2' | tr '\n' ' ')
written=$(awk -F, '/^[0-9]/ { printf "%s,%.6f ", $1, $2 }' "$csv" 2>/dev/null)
[[ "$(head -n 1 "$csv" 2>/dev/null)" == "epoch,loss,seconds" ]] && grep -q '^# command: 05_env_launch --device cpu$' "$csv" &&
   [[ -n "$printed" && "$written" == "$printed" ]]
verdict $? "05: rank 0 writes the metrics CSV: the command and the ten epoch losses it printed" \
    "$csv: $(head -n 3 "$csv" 2>/dev/null | tr '\n' '|'); rows '$written', printed '$printed'"

# DDP = one process with the summed batch: N ranks x batch 16 (lr as given,
# --scale_lr false) against chapter 01 with batch N*16, one epoch over the
# same global order. 9600 samples divide evenly, so no rank's share is
# padded. A worker that skipped the gradient average would learn from its
# own 16 samples only, and end elsewhere; one that summed the ranks'
# gradients instead of averaging them takes SGD steps N times too long
# (SGD's step is lr x the gradient), and ends elsewhere too (planted below).
# ddp_equals_one PROGRAM N NAME : PROGRAM under ddprun with N ranks into
# $TMP/NAME, chapter 01 with batch 16N into $TMP/singleN (once per N); sets
# d_w d_b s_w s_b; true when they agree within 1e-5.
ddp_equals_one() {
    local prog=$1 n=$2 name=$3
    run_capture 300 "$TMP/$name" "$ddprun" --standalone --nproc_per_node=$n "$prog" --batch_size 16 --lr 0.03 --scale_lr false \
        --samples 9600 --epochs 1 --features 4 --device cpu
    [[ -s $TMP/single$n ]] ||
        run_capture 120 "$TMP/single$n" "$one" --batch_size $((16 * n)) --lr 0.03 --samples 9600 --epochs 1 --features 4 --device cpu
    d_w=$(final 1 "$TMP/$name"); d_b=$(final 2 "$TMP/$name")
    s_w=$(field "$TMP/single$n" '^learned weights: w\[0\] = ([-0-9.]*)'); s_b=$(field "$TMP/single$n" '^learned bias: ([-0-9.]*)')
    [[ -n "$d_w" && -n "$s_w" ]] && rel_near "$d_w" "$s_w" 1e-5 && rel_near "$d_b" "$s_b" 1e-5
}
for n in 2 3; do
    ddp_equals_one "$bin" $n ddp$n
    verdict $? "05: $n ranks x batch 16 under ddprun equal 1 process x batch $((16 * n)) within 1e-5 ($d_w/$s_w, $d_b/$s_b)" "DDP w=$d_w b=$d_b; single w=$s_w b=$s_b"
done
# Planted (tests/lib.sh, plant): the ranks' gradients summed, not averaged.
planted=$(plant sum_not_mean common/ddp.h 'grads + first, n, DTYPE_F32, OP_AVG);' 'grads + first, n, DTYPE_F32, OP_SUM);' \
    05_env_launch 05_env_launch)
[[ -n $planted ]] && ! ddp_equals_one "$planted" 2 planted_sum && [[ -n $d_w ]]
verdict $? "planted: gradients summed over 2 ranks instead of averaged fail the equal-to-one-process check ($d_w/$s_w, $d_b/$s_b)" \
    "$(planted_why sum_not_mean)DDP w=$d_w b=$d_b; single w=$s_w b=$s_b"

# The replicas stay bit-identical (checked every 10 steps; that the check
# catches a replica that drifts is tested where it lives, library/test_ddp).
run_capture 300 "$TMP/replicas" "$ddprun" --standalone --nproc_per_node=3 "$bin" --epochs 2 --check_replicas 10 --device cpu; status=$?
[[ $status -eq 0 ]] && grep -q "final weight" "$TMP/replicas"
verdict $? "05: replicas stay bit-identical under ddprun (checked every 10 steps)" "status $status: $(grep -m1 -i 'diverged\|error' "$TMP/replicas")"
# 4 ranks x lr 0.3 (the linear scaling rule makes it 1.2): the loss blows
# up, and the job says so and what to use instead, rather than ending well.
run_capture 120 "$TMP/diverged" "$ddprun" --standalone --nproc_per_node=4 "$bin" --lr 0.3 --device cpu; status=$?
[[ $status -ne 0 && $status -ne 124 ]] && grep -q "error: training diverged: the loss went from .* lr 1.2 (lr x world size, the linear scaling rule) is too large.*Use --lr 0.125 or less" "$TMP/diverged"
verdict $? "05: a diverging run (lr 0.3 x 4 ranks) fails, saying which lr to use" "status $status: $(grep -m1 error "$TMP/diverged")"

# A rank killed from outside while the job trains (as the kernel's OOM
# killer would): ddprun names it, with its pid and the signal, stops the
# others and ends the job with status 1.
# killed_rank_named DDPRUN LOG: the run, rank 2 killed once rank 0 has
# printed its first epoch; sets killed (its pid) and status. True when
# ddprun named it as above, first and as the root cause.
killed_rank_named() {
    local launcher pid
    killed=""
    "$1" --standalone --nproc_per_node=3 "$bin" --epochs 100000 --device cpu >"$2" 2>&1 & launcher=$!
    for _ in $(seq 300); do grep -q '^\[rank 0\]: epoch  0 | loss' "$2" && break; sleep 0.1; done
    for pid in $(ours "05_env_launch/05_env_launch --epochs 100000"); do
        tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'RANK=2' && killed=$pid
    done
    [[ -n $killed ]] && kill -9 "$killed"
    for _ in $(seq 300); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$launcher" 2>/dev/null; wait "$launcher"; status=$?
    [[ -n $killed && $status -eq 1 ]] &&
        [[ $(grep -m1 '^ddprun: rank [0-9]* ' "$2") == "ddprun: rank 2 (local 2, pid $killed) was killed by signal 9 (SIGKILL); stopping the other workers" ]] &&
        grep -q "^ddprun: root cause (first failure): rank 2 (local 2, node 0, host .*, pid $killed) was killed by signal 9 (SIGKILL)" "$2"
}
killed_rank_named "$ddprun" "$TMP/killed"
verdict $? "05: rank 2 killed while training: ddprun names it (pid $killed, SIGKILL) and the job exits 1" \
    "status $status, killed '$killed': $(grep '^ddprun' "$TMP/killed" | tail -n 3 | tr '\n' '|')"
# Planted (tests/lib.sh, plant): ddprun counting only non-zero exits as
# failures, not deaths by a signal; the job then ends when the killed
# rank's peers fail, and names one of them.
planted=$(plant signal_ignored tools/ddprun.c 'bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;' \
    'bool failed = WIFEXITED(status) && WEXITSTATUS(status) != 0;' tools ddprun)
[[ -n $planted ]] && ! killed_rank_named "$planted" "$TMP/planted_killed" && [[ -n $killed ]]
verdict $? "planted: ddprun ignoring deaths by a signal fails the killed-rank check" \
    "$(planted_why signal_ignored)status $status: $(grep '^ddprun' "$TMP/planted_killed" 2>/dev/null | tail -n 3 | tr '\n' '|')"
no_leftovers "05: no process left behind" "05_env_launch/05_env_launch"
