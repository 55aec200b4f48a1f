#!/usr/bin/env bash
# tools/speedup.sh - `make speedup`: measure what data parallelism buys.
#
# Trains chapter 05 under ddprun with 1, 2, ... ranks (up to the GPUs, or
# the CPU cores, or SPEEDUP_MAX_RANKS), for two models:
#   small: the chapter 01 model (1 feature): communication dominates;
#   large: 2048 features, 32768 samples, batch 256: computation matters.
# Writes runs/speedup/speedup_{small,large}.csv with
#   world_size,seconds_per_epoch,samples_per_s,speedup,efficiency,final_loss
# and prints the tables. The time is measured by rank 0 between two
# barriers around the training loop (start-up is not counted).
set -u
cd "$(dirname "$0")/.." || exit 1
out=runs/speedup
mkdir -p "$out"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
cores=$(nproc)
max=${SPEEDUP_MAX_RANKS:-$(( gpus > 0 ? gpus : cores ))}
(( max < 2 )) && max=2
launcher=tools/ddprun
program=05_env_launch/05_env_launch
[[ -x $launcher && -x $program ]] || { echo "speedup: build first (make)"; exit 1; }

measure() { # NAME EPOCHS SAMPLES ARGS...
    local name=$1 epochs=$2 samples=$3; shift 3
    local csv="$out/speedup_$name.csv" t1=""
    echo "world_size,seconds_per_epoch,samples_per_s,speedup,efficiency,final_loss" >"$csv.tmp"
    printf '\n%s model (%s), %s epochs:\n%6s %14s %14s %9s %11s %12s\n' "$name" "$*" "$epochs" \
        ranks "s/epoch" "samples/s" speedup efficiency "final loss"
    for (( w = 1; w <= max; w++ )); do
        local log="$out/${name}_w$w.log"
        if ! timeout 600 "$launcher" --standalone --nproc_per_node="$w" "$program" \
                --epochs "$epochs" --samples "$samples" "$@" >"$log" 2>&1; then
            echo "speedup: the run with $w rank(s) failed; see $log"; return 1
        fi
        local secs loss
        secs=$(sed -n 's/.*training time \([0-9.]*\) s.*/\1/p' "$log" | tail -n 1)
        loss=$(sed -n 's/.*| loss \([0-9.e+-]*\) .*/\1/p' "$log" | tail -n 1)
        [[ -z $t1 ]] && t1=$secs
        awk -v w="$w" -v s="$secs" -v t1="$t1" -v e="$epochs" -v n="$samples" -v l="$loss" 'BEGIN {
            sp = t1 / s; printf "%d,%.6f,%.1f,%.4f,%.4f,%s\n", w, s / e, n * e / s, sp, sp / w, l }' >>"$csv.tmp"
        tail -n 1 "$csv.tmp" | awk -F, '{ printf "%6d %14.4f %14.0f %8.2fx %10.0f%% %12s\n", $1, $2, $3, $4, 100 * $5, $6 }'
    done
    mv "$csv.tmp" "$csv"
}

echo "speedup: method: chapter 05 under ddprun --standalone, 1..$max ranks, time from rank 0 between barriers"
measure small 5 10000 || exit 1
measure large 3 32768 --features 2048 --batch_size 256 || exit 1
device=$(sed -n 's/.*rank 0 on \([^:]*\):.*/\1/p' "$out/small_w1.log" | head -n 1)
backend=$(sed -n 's/.*backend \([a-z]*\).*/\1/p' "$out/small_w2.log" | head -n 1)
echo "$device, backend $backend, $(nproc) cores" >"$out/device.txt"
echo; echo "speedup: device: $(cat "$out/device.txt"); CSV in $out/"
