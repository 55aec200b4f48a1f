#!/usr/bin/env bash
# bench/longest_context.sh - the longest --block_size that a fixed memory
# budget per rank allows with cp 1, 2 and 4, found by RUNNING chapter 12:
# for each cp, block sizes from STEP up in steps of STEP, one training step
# each (batch 1), and the bytes each run's rank 0 reports holding (the
# activations and their gradients as the model allocated them, plus the cp
# buffers: 12's "held per rank" line). The longest block that fits the
# budget, per cp, goes to a table and a CSV (plots/12_longest_context.gp draws them).
#
#   bench/longest_context.sh [BUDGET_MIB] [STEP] [MAX]     (default 24 256 8192)
#
# The model is --preset tiny (2 layers, 2 heads, 64 channels: the budget is
# small so that the runs are short on a laptop's CPU); attention's T x T
# probabilities grow as the square of the block, the rest as the block, so
# one rank of cp holds 1/cp of both. It needs no WikiText-2: it trains on
# a made-up corpus written here (memory does not depend on the text).
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
ROOT=$(cd "$HERE/.." && pwd)
prog="$HERE/12_context_parallel"
[[ -x $prog ]] || { echo "build first: make 12_context_parallel (in $HERE)" >&2; exit 1; }
budget_mib=${1:-24} step=${2:-256} max=${3:-8192}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/longest.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
# A corpus long enough for one block of MAX tokens.
awk -v dir="$TMP/corpus" 'BEGIN { system("mkdir -p " dir); srand(3)
    split("the a one every some my your this that no", D, " "); split("cat dog bird river city king song train", N, " ")
    for (f = 1; f <= 3; f++) { file = dir "/" (f == 1 ? "train.txt" : f == 2 ? "valid.txt" : "test.txt")
        for (i = 0; i < (f == 1 ? 8000 : 300); i++)
            printf " %s %s sees %s %s . \n", D[int(rand() * 10) + 1], N[int(rand() * 8) + 1], D[int(rand() * 10) + 1],
                N[int(rand() * 8) + 1] > file } }'
# The CSVs go to runs/ (COURSE_RUNS_DIR, as every program writes), the runs' own files to the scratch folder.
out_csv="${COURSE_RUNS_DIR:-$ROOT/runs}/12_context_parallel/longest_context.csv"
export OMP_NUM_THREADS=1 COURSE_RUNS_DIR=$TMP/runs
mkdir -p "$(dirname "$out_csv")"
budget=$((budget_mib * 1048576))
table_csv="${out_csv%.csv}_table.csv"
echo "# CPU, $(getconf _NPROCESSORS_ONLN) cores ($(uname -n)) | backend cpu | budget $budget_mib MiB per rank | $(date -u +%Y-%m-%d)" >"$out_csv"
echo "# command: 12_context_parallel --preset tiny --batch_size 1 --max_steps 1 --cp 1,2,4 --block_size $step..$max" >>"$out_csv"
echo "# budget_bytes: $budget" >>"$out_csv"
echo "cp,block_size,held_bytes,fits" >>"$out_csv"
echo "cp,longest_block_size,held_bytes" >"$table_csv"
printf '%-4s %-12s %-22s %s\n' cp "longest block" "held there (MiB)" "first block over budget (MiB held)"
for cp in 1 2 4; do
    best=0 best_held=0 over="-"
    for ((T = step; T <= max; T += step)); do
        log=$TMP/cp$cp-$T.log
        "$prog" --data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --block_size "$T" \
            --batch_size 1 --max_steps 1 --num_samples 0 --device cpu --cp "$cp" --backend cpu \
            --out_dir "$TMP/out" >"$log" 2>&1 || { echo "cp $cp block $T failed: $(grep -m1 error "$log")" >&2; break; }
        held=$(sed -nE 's/^held per rank: ([0-9]+) bytes of activations and their gradients, ([0-9]+) bytes of cp buffers.*/\1 \2/p' "$log")
        [[ -n $held ]] || { echo "cp $cp block $T: no 'held per rank' line" >&2; break; }
        total=$(( ${held% *} + ${held#* } ))
        fits=$(( total <= budget ))
        echo "$cp,$T,$total,$fits" >>"$out_csv"
        if (( fits )); then best=$T best_held=$total; else over="$T ($(awk -v b="$total" 'BEGIN { printf "%.1f", b / 1048576 }'))"; break; fi
    done
    printf '%-4s %-12s %-22s %s\n' "$cp" "$best" "$(awk -v b="$best_held" 'BEGIN { printf "%.1f", b / 1048576 }')" "$over"
    echo "$cp,$best,$best_held" >>"$table_csv"
done
echo "(measured: rank 0 of each run, one training step of batch 1; CSV: $out_csv, $table_csv)"
