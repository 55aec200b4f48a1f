#!/usr/bin/env bash
# bench/gpt_gpu.sh - chapter 08's GPT on one GPU: speed, MFU, memory (`make bench-gpt`).
#
# Runs the benchmark mode of tests/unit/test_gpt_cuda on synthetic tokens:
#   default  the chapter's model: block 128, 4 layers, 4 heads, 256 channels, vocabulary 5000
#   large    GPT-2 small's shape: block 1024, 12 layers, 12 heads, 768 channels, vocabulary 50257
# each in fp32 and bf16. Per run: tokens/s; the step split into forward,
# backward, all-reduce (one rank: NCCL over a one-GPU communicator, launched
# bucket by bucket during backward; the column is what it adds after
# backward ends) and optimizer (clip + AdamW); achieved TFLOPS and MFU;
# the model's device memory and the whole process's; the same step as one
# CUDA graph launch (one process: no all-reduce; timed whole) and the
# launches per step each way (call by call: the graph's nodes - kernels,
# cuBLAS calls, memsets; as a graph: 1, besides the copies of the tokens
# and the step's scalars).
#
# FLOPs per step = 6 * (parameters - wpe) * tokens + 12 * n_layer * n_embd * T * tokens
#   (2 per multiply-add forward, twice that backward; wpe is only added; the
#    second term is attention's QK^T and PV, computed in full T x T).
# MFU = achieved FLOPS / the GPU's dense bf16 peak (H100 SXM and H200: 989
#   TFLOPS; COURSE_PEAK_TFLOPS=... for a GPU the table does not know), for
#   fp32 runs too, so the two precisions compare on one scale.
#
# Environment: BENCH_STEPS (default 10 timed steps, after 3 warm-up steps).
# Without a GPU it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
source tests/lib.sh >/dev/null

if ! has_real_gpu; then
    echo "bench/gpt_gpu.sh: needs a GPU (nvidia-smi lists none here); nothing measured"
    exit 0
fi
make --no-print-directory -s -C tests >/dev/null
bin=tests/unit/test_gpt_cuda
steps=${BENCH_STEPS:-10}
out_dir=runs/08_gpt_wikitext
mkdir -p "$out_dir"
csv="$out_dir/gpu_bench.csv"
header="gpu,config,dtype,attention,batch,block,params,tokens_per_s,step_ms,forward_ms,backward_ms,allreduce_ms,optimizer_ms,tflops,mfu_percent,model_mib,device_used_mib,graph_step_ms,launches_per_step,graph_launches_per_step"

rows=()
run() { # config dtype batch vocab attention (flash: the fused kernel; cublas: the reference path)
    local line
    line=$(GPT_CUDA_ATTENTION=$5 "$bin" --mode bench --config "$1" --dtype "$2" --batch_size "$3" --vocab_size "$4" \
           --steps "$steps" | grep '^BENCH ' || true)
    if [[ -z "$line" ]]; then
        GPT_CUDA_ATTENTION=$5 "$bin" --mode bench --config "$1" --dtype "$2" --batch_size "$3" --vocab_size "$4" --steps 1 | tail -n 3
        echo "bench/gpt_gpu.sh: the $1 $2 $5 run printed no result"
        exit 1
    fi
    rows+=("${line#BENCH }")
}

echo "=== bench/gpt_gpu.sh: GPT training step on one GPU ($steps timed steps per row)"
# Both attention paths in bf16: which is faster on this GPU is measured,
# not assumed (README.gpu.md, "Flash attention").
run default fp32 8 5000 flash
run default bf16 8 5000 flash
run default bf16 8 5000 cublas
run large fp32 8 50257 flash
run large bf16 8 50257 flash
run large bf16 8 50257 cublas

{ echo "$header"; printf '%s\n' "${rows[@]}"; } >"$csv.tmp"
mv "$csv.tmp" "$csv"
# The table: drop the GPU name column (it is the same on every row) and say it once.
echo "GPU: $(head -n 2 "$csv" | tail -n 1 | cut -d, -f1)"
if command -v column >/dev/null; then cut -d, -f2- "$csv" | column -t -s,; else cut -d, -f2- "$csv" | tr , '\t'; fi
echo
echo "CSV: $csv"
cat "$csv"

# ---- PyTorch, side by side (optional: needs python3 with a CUDA torch)
# The same model in PyTorch (08_gpt_wikitext/bench/bench_torch.py), bf16
# autocast, eager and torch.compile'd, the same batch and timing method.
py=${PYTHON:-python3}
if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo
    echo "PyTorch with CUDA not found ($py): no side-by-side rows (set PYTHON=... to point at one)"
    exit 0
fi
torch_csv="$out_dir/gpu_bench_torch.csv"
echo
echo "=== the same model in PyTorch (bench_torch.py: bf16 autocast; $steps timed steps after 3 warm-up)"
echo "config,implementation,tokens_per_s,step_ms" >"$torch_csv.tmp"
# The C model's best bf16 tokens/s for a config (either attention path).
c_tokens() { awk -F, -v c="$1" '$2 == c && $3 == "bf16" && $8 > best { best = $8 } END { print best + 0 }' "$csv"; }
for config in default large; do
    for mode in eager compiled; do
        flags=(--device cuda --precision bf16 --config "$config" --batch_size 8 --steps "$steps" --warmup 3)
        [[ $mode == compiled ]] && flags+=(--compile)
        line=$("$py" 08_gpt_wikitext/bench/bench_torch.py "${flags[@]}" 2>"$out_dir/torch_${config}_${mode}.err" | grep 'tokens/s' || true)
        tps=$(sed -n 's/.*-> \([0-9]*\) tokens\/s.*/\1/p' <<<"$line"); ms=$(sed -n 's/median step \([0-9.]*\) ms.*/\1/p' <<<"$line")
        if [[ -z "$tps" ]]; then echo "  $config $mode: did not run ($(tail -n 1 "$out_dir/torch_${config}_${mode}.err"))"; continue; fi
        echo "$config,pytorch $mode,$tps,$ms" >>"$torch_csv.tmp"
        echo "  $config, PyTorch $mode: $tps tokens/s; C bf16: $(c_tokens "$config") tokens/s (ratio C/PyTorch $(awk -v a="$(c_tokens "$config")" -v b="$tps" 'BEGIN { printf "%.2f", a / b }'))"
    done
done
mv "$torch_csv.tmp" "$torch_csv"
echo "CSV: $torch_csv"
