#!/usr/bin/env bash
# bench/11_bubble.sh - chapter 11's bubble and activation memory, measured,
# against (S-1)/(M+S-1) and M vs S - s.
#
# `make bench` runs it from the project root (or: bash bench/11_bubble.sh
# [STAGES [STEPS]]). For S stages (default 2: one per core of a 2-core
# machine; more stages than cores measure the cores' sharing, not the
# schedule) and M = 1, 2, 4, 8 micro-batches, under GPipe and 1F1B, it
# trains a 4-block model (128 channels, batches of 8 x 64 tokens) for STEPS
# steps (default 6; the first is not counted) on a generated corpus (the
# tokens do not change the timing), and prints the bubble the program
# measured beside the formula and the micro-batches each stage held.
# Writes runs/11_pipeline_parallel/bubble.csv. A timing: run it on a quiet
# machine, and read the stages' range beside the mean.
set -euo pipefail
cd "$(dirname "$0")/.."
stages=${1:-2} steps=${2:-6}
prog=11_pipeline_parallel/11_pipeline_parallel
[[ -x $prog ]] || make --no-print-directory -s -C 11_pipeline_parallel >/dev/null
runs=${COURSE_RUNS_DIR:-runs}/11_pipeline_parallel
mkdir -p "$runs"
work=$(mktemp -d "${TMPDIR:-/tmp}/bench11.XXXXXX")
trap 'rm -rf "$work"' EXIT
awk -v dir="$work/corpus" 'BEGIN { system("mkdir -p " dir); srand(3)
    split("the a one every some my your this that no", D, " "); split("cat dog bird river city king song train", N, " ")
    split("sees likes finds eats builds sings", V, " ")
    for (f = 1; f <= 3; f++) {
        file = dir "/" (f == 1 ? "train.txt" : f == 2 ? "valid.txt" : "test.txt")
        for (i = 0; i < (f == 1 ? 20000 : 100); i++)
            printf " %s %s %s %s %s . \n", D[int(rand() * 10) + 1], N[int(rand() * 8) + 1], V[int(rand() * 6) + 1],
                D[int(rand() * 10) + 1], N[int(rand() * 8) + 1] > file } }'
export OMP_NUM_THREADS=1
csv=$runs/bubble.csv
{
    echo "stages,micro_batches,schedule,bubble_measured,bubble_low,bubble_high,bubble_formula,held_per_stage"
    echo "# command: bench/11_bubble.sh $stages $steps"
    echo "# $(uptime | sed 's/.*load/load/') at the start | $(date +%Y-%m-%d)"
} >"$csv"
echo "=== bench/11_bubble.sh: $stages stages, $steps steps each; load: $(uptime | sed 's/.*load average: //')"
printf '%-8s %3s %22s %10s   %s\n' schedule M "bubble measured (range)" formula "micro-batches held per stage (activations)"
for M in 1 2 4 8; do
    for schedule in gpipe 1f1b; do
        out=$work/run.$M.$schedule
        "$prog" --data_dir "$work/corpus" --verify_data=false --vocab_size 300 --n_layer 4 --n_embd 128 --n_head 4 \
            --block_size 64 --batch_size 8 --pp "$stages" --grad_accum "$M" --schedule "$schedule" \
            --max_steps "$steps" --num_samples 0 --device cpu --out_dir "$work/out" >"$out" 2>&1 ||
            { echo "bench/11_bubble.sh: the run failed:"; tail -n 5 "$out"; exit 1; }
        line=$(grep '^bubble: ' "$out")
        read -r measured low high formula < <(echo "$line" | sed -E 's/.*: ([0-9.]+)% of a step idle.*stages ([0-9.]+)% to ([0-9.]+)%.*= ([0-9.]+)%$/\1 \2 \3 \4/')
        held=$(sed -nE 's/^  stage [0-9]+: ([0-9]+) micro-batch\(es\), ([0-9.]+) MiB$/\1 (\2 MiB)/p' "$out" | paste -sd';' | sed 's/;/; /g')
        printf '%-8s %3d %10s%% (%s-%s%%) %9s%%   %s\n' "$schedule" "$M" "$measured" "$low" "$high" "$formula" "$held"
        echo "$stages,$M,$schedule,$measured,$low,$high,$formula,\"$held\"" >>"$csv"
    done
done
echo "bench/11_bubble.sh: wrote $csv; load at the end: $(uptime | sed 's/.*load average: //')"
