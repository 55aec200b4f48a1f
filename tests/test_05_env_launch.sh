# Chapter 05: the worker reads its rank from the launcher's variables.
source "$(dirname "$0")/lib.sh"
bin="$ROOT/05_env_launch/05_env_launch"
ddprun="$ROOT/tools/ddprun"
final() { sed -n "s/.*final weight \([-0-9.]*\)  bias \([-0-9.]*\).*/\\$1/p" "$2" | tail -n 1; }

# Started by hand: a job of one rank, no launcher, no network needed.
env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT "$bin" --epochs 3 --device cpu >"$TMP/alone" 2>&1; status=$?
if [[ $status -eq 0 ]] && grep -q "^05_env_launch: 1 rank(s) (no launcher" "$TMP/alone" && near "$(final 1 "$TMP/alone")" 2 0.05; then
    pass "05: without launcher variables it runs as one process"
else fail "05: without launcher variables it runs as one process" "status $status: $(head -n 2 "$TMP/alone" | tr '\n' '|')"; fi

for n in 2 3; do
    run_capture 300 "$TMP/run$n" "$ddprun" --standalone --nproc_per_node=$n "$bin" --device cpu; status=$?
    w=$(final 1 "$TMP/run$n"); b=$(final 2 "$TMP/run$n")
    if [[ $status -eq 0 ]] && near "$w" 2 0.05 && near "$b" 3 0.05; then pass "05: $n ranks under ddprun learn weight 2, bias 3 ($w, $b)"
    else fail "05: $n ranks under ddprun learn weight 2, bias 3" "status $status, weight '$w', bias '$b'; $(tail -n 3 "$TMP/run$n" | tr '\n' '|')"; fi
    # Rank 0 alone reports: ten epoch lines, not ten per rank.
    lines=$(grep -c "epoch .* | loss .*mean over all ranks" "$TMP/run$n")
    if [[ "$lines" -eq 10 ]]; then pass "05: only rank 0 prints ($n ranks: $lines epoch lines)"
    else fail "05: only rank 0 prints" "$lines epoch lines with $n ranks, expected 10"; fi
done
expect_output "05: the launcher's variables are named as the source" "$TMP/run2" "05_env_launch: 2 rank\(s\) \(torchrun variables"
check "05: rank 0 writes the metrics CSV" test -s "$ROOT/runs/05_env_launch/train.csv"
