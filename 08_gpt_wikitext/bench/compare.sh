#!/usr/bin/env bash
# bench/compare.sh - training tokens/s of the default GPT (B=8 per rank,
# T=128) in C (gpt.h with OpenBLAS and with the blocked C kernel, 2 threads,
# 1 thread, and 2 data-parallel ranks of 1 thread) and in a straightforward
# PyTorch CPU model (bench/bench_torch.py: thread settings, and DDP over gloo
# with 2 ranks of 1 thread), each run ROUNDS times, interleaved so that a
# busy moment on the machine hits all of them.
# Prints every run's median step, per round the best C and the best PyTorch
# configuration on 2 cores and their ratio, and, last, the best of each line
# and the ratios' spread. The C benchmark, like the chapter's program, sets
# GOMP_SPINCOUNT=1000 (see spin_briefly_in_openmp in 08_gpt_wikitext.c); one
# PyTorch line does too.
# Needs python3 with torch for the PyTorch lines (skipped without it).
#   bench/compare.sh [ROUNDS=3] [STEPS=20]      (from 08_gpt_wikitext/)
set -u
cd "$(dirname "$0")/.." || exit 1
rounds=${1:-3} steps=${2:-20}
[[ $rounds =~ ^[1-9][0-9]*$ && $steps =~ ^[1-9][0-9]*$ ]] || { echo "usage: bench/compare.sh [ROUNDS>=1] [STEPS>=1]" >&2; exit 2; }
make -s build/bench_gpt >/dev/null || exit 1
# The same program without OpenBLAS: gpt.h's own blocked kernel.
cc -std=c11 -D_GNU_SOURCE -O2 -fno-trapping-math -fno-math-errno -march=native -fopenmp -pthread -I../common \
   bench/bench_gpt.c -o build/bench_gpt_noblas -lm || exit 1
python=/usr/bin/python3
$python -c 'import torch' 2>/dev/null || python=""

declare -A best
round_best_c=0 round_best_torch=0 ratios=""
max() { awk -v a="$1" -v b="$2" 'BEGIN { print (a > b ? a : b) }'; }
# record LABEL TOKENS_PER_S [2core-c|2core-torch]: the third argument marks
# the configurations that use both cores, which the ratio compares.
record() {
    echo "$1: $2 tokens/s"
    [[ -n $2 ]] || return
    best[$1]=$(max "$2" "${best[$1]:-0}")
    case ${3:-} in
        2core-c) round_best_c=$(max "$2" "$round_best_c") ;;
        2core-torch) round_best_torch=$(max "$2" "$round_best_torch") ;;
    esac
}
c_run() { "$1" 8 "$steps" default "${2:-1}" | sed -n 's/.*-> \([0-9]*\) tokens\/s/\1/p'; }
torch_run() { "$python" bench/bench_torch.py --steps "$steps" "$@" | sed -n 's/.*-> \([0-9]*\) tokens\/s.*/\1/p'; }
for r in $(seq "$rounds"); do
    echo "--- round $r"
    round_best_c=0 round_best_torch=0
    record "C gpt.h + OpenBLAS, 2 threads" "$(OMP_NUM_THREADS=2 c_run build/bench_gpt)" 2core-c
    record "C gpt.h + OpenBLAS, 2 ranks x 1 thread" "$(OMP_NUM_THREADS=1 c_run build/bench_gpt 2)" 2core-c
    record "C gpt.h + OpenBLAS, 1 thread" "$(OMP_NUM_THREADS=1 c_run build/bench_gpt)"
    record "C gpt.h blocked kernel, 2 threads" "$(OMP_NUM_THREADS=2 c_run build/bench_gpt_noblas)" 2core-c
    if [[ -n "$python" ]]; then
        record "PyTorch, torch threads 2 (OpenBLAS default)" "$(torch_run --threads 2)" 2core-torch
        record "PyTorch, torch threads 1, OpenBLAS 2" "$(OPENBLAS_NUM_THREADS=2 torch_run --threads 1)" 2core-torch
        record "PyTorch, torch threads 2, OpenBLAS 1" "$(OPENBLAS_NUM_THREADS=1 torch_run --threads 2)" 2core-torch
        record "PyTorch, 1 thread" "$(OPENBLAS_NUM_THREADS=1 torch_run --threads 1)"
        record "PyTorch, torch threads 2, OpenBLAS 1, GOMP_SPINCOUNT=1000" \
            "$(GOMP_SPINCOUNT=1000 OPENBLAS_NUM_THREADS=1 torch_run --threads 2)" 2core-torch
        record "PyTorch DDP gloo, 2 ranks x 1 thread (OpenBLAS 1)" \
            "$(OPENBLAS_NUM_THREADS=1 torch_run --ddp 2 --threads 1)" 2core-torch
        ratio=$(awk -v c="$round_best_c" -v t="$round_best_torch" 'BEGIN { if (t > 0) printf "%.2f", c / t }')
        echo "round $r: best C on 2 cores $round_best_c, best PyTorch on 2 cores $round_best_torch tokens/s, ratio $ratio"
        ratios="$ratios $ratio"
    fi
done
echo "--- best of $rounds rounds (median step of $steps after 2 warm-up steps each)"
for k in "${!best[@]}"; do printf '%8s tokens/s  %s\n' "${best[$k]}" "$k"; done | sort -rn
if [[ -n $ratios ]]; then
    echo "best C / best PyTorch on 2 cores, per round:$ratios" \
         "(median $(tr ' ' '\n' <<<"$ratios" | sed '/^$/d' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'))"
fi
