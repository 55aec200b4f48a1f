#!/usr/bin/env bash
# bench/compare.sh - training tokens/s of the default GPT (B=8, T=128) in C
# (gpt.h with OpenBLAS and with the blocked C kernel, 2 threads and 1) and in
# a straightforward PyTorch CPU model (bench/bench_torch.py), each run ROUNDS
# times, interleaved so that a busy moment on the machine hits all of them.
# Prints every run's median step and, last, the best of each line. The C
# benchmark, like the chapter's program, sets GOMP_SPINCOUNT=1000 (see
# spin_briefly_in_openmp in 08_gpt_wikitext.c); one PyTorch line does too.
# Needs python3 with torch for the PyTorch lines (skipped without it).
#   bench/compare.sh [ROUNDS=3] [STEPS=20]      (from 08_gpt_wikitext/)
set -u
cd "$(dirname "$0")/.." || exit 1
rounds=${1:-3} steps=${2:-20}
make -s build/bench_gpt >/dev/null || exit 1
# The same program without OpenBLAS: gpt.h's own blocked kernel.
cc -std=c11 -D_GNU_SOURCE -O2 -fno-trapping-math -march=native -fopenmp -I../common \
   bench/bench_gpt.c -o build/bench_gpt_noblas -lm || exit 1
python=/usr/bin/python3
$python -c 'import torch' 2>/dev/null || python=""

declare -A best
record() { # record LABEL TOKENS_PER_S
    echo "$1: $2 tokens/s"
    local old=${best[$1]:-0}
    awk -v a="$2" -v b="$old" 'BEGIN { exit !(a > b) }' && best[$1]=$2
}
c_run() { "$@" 8 "$steps" default | sed -n 's/.*-> \([0-9]*\) tokens\/s/\1/p'; }
torch_run() { "$python" bench/bench_torch.py --steps "$steps" "$@" | sed -n 's/.*-> \([0-9]*\) tokens\/s.*/\1/p'; }
for r in $(seq "$rounds"); do
    echo "--- round $r"
    record "C gpt.h + OpenBLAS, 2 threads" "$(OMP_NUM_THREADS=2 c_run build/bench_gpt)"
    record "C gpt.h + OpenBLAS, 1 thread" "$(OMP_NUM_THREADS=1 c_run build/bench_gpt)"
    record "C gpt.h blocked kernel, 2 threads" "$(OMP_NUM_THREADS=2 c_run build/bench_gpt_noblas)"
    if [[ -n "$python" ]]; then
        record "PyTorch, torch threads 2 (OpenBLAS default)" "$(torch_run --threads 2)"
        record "PyTorch, torch threads 1, OpenBLAS 2" "$(OPENBLAS_NUM_THREADS=2 torch_run --threads 1)"
        record "PyTorch, torch threads 2, OpenBLAS 1" "$(OPENBLAS_NUM_THREADS=1 torch_run --threads 2)"
        record "PyTorch, 1 thread" "$(OPENBLAS_NUM_THREADS=1 torch_run --threads 1)"
        record "PyTorch, torch threads 2, OpenBLAS 1, GOMP_SPINCOUNT=1000" \
            "$(GOMP_SPINCOUNT=1000 OPENBLAS_NUM_THREADS=1 torch_run --threads 2)"
    fi
done
echo "--- best of $rounds rounds (median step of $steps after 2 warm-up steps each)"
for k in "${!best[@]}"; do printf '%8s tokens/s  %s\n' "${best[$k]}" "$k"; done | sort -rn
