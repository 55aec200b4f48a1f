#!/usr/bin/env bash
# plots/make_plots.sh - `make plots`: draw every figure with gnuplot into
# runs/plots/ (PNG), after measuring what has no CSV yet.
#
# A figure shows the CSV that is there: yours, if you ran the program
# yourself (./01_single_gpu --lr 0.1 writes runs/01_single_gpu/loss.csv),
# else a short default run measured here. Every CSV records the command that
# made it ("# command: ...") and the device, backend and date; every
# figure's subtitle repeats them, with the flags that differ from the
# defaults ("default flags" when there were none), so a figure always says
# which run it shows. Delete a CSV (or runs/) to measure again.
#
# COURSE_RUNS_DIR=DIR reads and writes DIR instead of runs/ (the tests use
# it). Without gnuplot the CSVs are still written, and one line says how to
# install it. Chapter 08's and 11's figures need WikiText-2 (make data):
# without it they are skipped, and the last lines say so.
set -u
cd "$(dirname "$0")/.." || exit 1
runs=${COURSE_RUNS_DIR:-runs}
mkdir -p "$runs/plots" || exit 1
export COURSE_RUNS_DIR=$(cd "$runs" && pwd)   # the programs write there too
have_gnuplot=1
command -v gnuplot >/dev/null || have_gnuplot=0
drawn=() failed=() skipped=()

# draw NAME SCRIPT ARGS : gnuplot SCRIPT into $runs/plots/NAME.png
draw() {
    local name=$1 script=$2 args=$3
    [[ $have_gnuplot -eq 1 ]] || return 0
    rm -f "$runs/plots/$name.png"
    if gnuplot -e "outfile='$runs/plots/$name.png'; $args" "plots/$script" >"$runs/plots/$name.log" 2>&1 &&
       [[ -s "$runs/plots/$name.png" ]]; then
        drawn+=("$runs/plots/$name.png")
    else failed+=("$name (see $runs/plots/$name.log)"); fi
}

# subtitle CSV... : two lines, "DEVICE | backend B | DATE" and the flags of
# the run(s) ("default flags" when none), from the CSVs' comment lines. The
# result goes inside a gnuplot "string" (\n is a line break; quotes dropped).
subtitle() {
    local info flags
    info=$(sed -n -e '/^# command:/d' -e 's/^# //p' "$1" | head -n 1)
    flags=$(for csv in "$@"; do [[ -r $csv ]] || continue; sed -n 's/^# command: [^ ]*//p' "$csv" | head -n 1 | sed 's/^ *//; s/^$/default flags/'; done |
            awk '!seen[$0]++' | paste -sd ';' | sed 's/;/; /g')
    printf '%s\\nrun: %s' "${info:-(no device line)}" "${flags:-default flags}" | tr -d "'\""
}

# --- 01: loss curve
csv01=$runs/01_single_gpu/loss.csv
if [[ ! -s $csv01 ]]; then
    echo "plots: measuring 01_single_gpu (10 epochs, default flags)"
    01_single_gpu/01_single_gpu >"$runs/plots/01_single_gpu.log" 2>&1 || failed+=("01 run (see $runs/plots/01_single_gpu.log)")
fi
[[ -s $csv01 ]] && draw 01_loss 01_loss.gp "infile='$csv01'; subtitle=\"$(subtitle "$csv01")\""

# --- 02: ping-pong latency and bandwidth; 03: busbw per collective.
csv02=$runs/02_p2p/pingpong.csv
if [[ ! -s $csv02 ]]; then
    echo "plots: measuring 02_p2p (bench/02_p2p.sh)"
    bash bench/02_p2p.sh >"$runs/plots/02_p2p.bench.log" 2>&1 || failed+=("02 benchmark (see $runs/plots/02_p2p.bench.log)")
fi
[[ -s $csv02 ]] && draw 02_p2p 02_p2p.gp "infile='$csv02'; subtitle=\"$(subtitle "$csv02")\""
dir03=$runs/03_collectives
if [[ ! -s $dir03/all_reduce.csv ]]; then
    echo "plots: measuring 03_collectives (bench/03_collectives.sh)"
    bash bench/03_collectives.sh >"$runs/plots/03_collectives.bench.log" 2>&1 || failed+=("03 benchmark (see $runs/plots/03_collectives.bench.log)")
fi
[[ -s $dir03/all_reduce.csv ]] && draw 03_collectives 03_collectives.gp "indir='$dir03'; subtitle=\"$(subtitle "$dir03"/{broadcast,all_reduce}.csv)\""

# --- 04/05: speedup against world size
sp=$runs/speedup
if ! head -n 1 "$sp/speedup_small.csv" "$sp/speedup_large.csv" 2>/dev/null | grep -c speedup_max | grep -q 2; then
    # missing, or written by an older speedup.sh without the ranges
    echo "plots: measuring the speedup (tools/speedup.sh)"
    bash tools/speedup.sh || failed+=("speedup measurement failed")
fi
if [[ -s $sp/speedup_small.csv && -s $sp/speedup_large.csv ]]; then
    draw speedup speedup.gp "small='$sp/speedup_small.csv'; large='$sp/speedup_large.csv'; subtitle=\"$(subtitle "$sp/speedup_small.csv" "$sp/speedup_large.csv")\""
fi

# --- 08: the GPT's loss curves and speed. Measured, when no run has written
# its metrics yet, by a short run of the tiny preset on WikiText-2.
gpt_dir=$runs/08_gpt_wikitext
wikitext=""
for d in "${WIKITEXT_DIR:-}" ../shared/data/wikitext-2 data/wikitext-2; do
    [[ -n "$d" && -r "$d/train.txt" ]] && { wikitext=$d; break; }
done
if [[ ! -s $gpt_dir/metrics.csv && -z $wikitext ]]; then
    skipped+=("08_gpt_loss, 08_gpt_tokens: WikiText-2 is not here (WIKITEXT_DIR, ../shared/data/wikitext-2, data/wikitext-2); make data downloads it")
elif [[ ! -s $gpt_dir/metrics.csv ]]; then
    echo "plots: measuring 08_gpt_wikitext (--preset tiny --max_steps 300)"
    08_gpt_wikitext/08_gpt_wikitext --preset tiny --max_steps 300 --eval_every 50 --num_samples 1 \
        >"$runs/plots/08_gpt_wikitext.log" 2>&1 || failed+=("08 run (see $runs/plots/08_gpt_wikitext.log)")
fi
if [[ -s $gpt_dir/metrics.csv ]]; then
    draw 08_gpt_loss 08_gpt_loss.gp "infile='$gpt_dir/metrics.csv'; subtitle=\"$(subtitle "$gpt_dir/metrics.csv")\""
    draw 08_gpt_tokens 08_gpt_tokens.gp "infile='$gpt_dir/metrics.csv'; subtitle=\"$(subtitle "$gpt_dir/metrics.csv")\""
fi

# --- 08: the same training with the gradients all-reduced as fp32 and as
# bf16 (--grad_compress): 2 ranks, the tiny preset, 300 steps each.
cdir=$runs/08_gpt_compress
if [[ -n $wikitext ]]; then
    for c in none bf16; do
        [[ -s $cdir/$c/metrics.csv ]] && continue
        echo "plots: measuring 08_gpt_wikitext with --grad_compress $c (--preset tiny --max_steps 300 --nprocs 2)"
        08_gpt_wikitext/08_gpt_wikitext --preset tiny --max_steps 300 --eval_every 50 --num_samples 0 --nprocs 2 \
            --grad_compress $c --data_dir "$wikitext" --out_dir "$cdir/$c" >"$runs/plots/08_gpt_compress_$c.log" 2>&1 ||
            failed+=("08 --grad_compress $c run (see $runs/plots/08_gpt_compress_$c.log)")
    done
fi
if [[ -s $cdir/none/metrics.csv && -s $cdir/bf16/metrics.csv ]]; then
    draw 08_gpt_compress 08_gpt_compress.gp "fp32='$cdir/none/metrics.csv'; bf16='$cdir/bf16/metrics.csv'; subtitle=\"$(subtitle "$cdir/none/metrics.csv"), and bf16\""
elif [[ -z $wikitext ]]; then
    skipped+=("08_gpt_compress: WikiText-2 is not here (make data downloads it)")
fi
# --- 11: the pipeline schedules as they ran, GPipe and 1F1B (4 stages x 8
# micro-batches of the tiny preset), measured when no run has written them.
dir11=$runs/11_pipeline_parallel
for schedule in gpipe 1f1b; do
    csv11=$dir11/timeline-$schedule.csv
    if [[ ! -s $csv11 && -z $wikitext ]]; then
        skipped+=("11_timeline_$schedule: WikiText-2 is not here (WIKITEXT_DIR, ../shared/data/wikitext-2, data/wikitext-2); make data downloads it")
        continue
    elif [[ ! -s $csv11 ]]; then
        echo "plots: measuring 11_pipeline_parallel (--schedule $schedule --pp 4 --grad_accum 8 --preset tiny --max_steps 20)"
        11_pipeline_parallel/11_pipeline_parallel --schedule "$schedule" --pp 4 --grad_accum 8 --preset tiny \
            --max_steps 20 --num_samples 0 >"$runs/plots/11_pipeline_parallel.$schedule.log" 2>&1 ||
            failed+=("11 run (see $runs/plots/11_pipeline_parallel.$schedule.log)")
    fi
    [[ -s $csv11 ]] && draw "11_timeline_$schedule" 11_timeline.gp "infile='$csv11'; subtitle=\"$(subtitle "$csv11")\""
done
# --- 13: the balancing loss at work (8 experts, top 2, without and with
# the loss, 300 steps of the tiny preset), and the assignments dropped
# against the capacity factor (50 steps each, one process counting
# capacity over 4 groups: what 4 ranks drop). One process trains the model
# ep ranks train (tests/chapters/test_13_expert_parallel.sh), in less time
# on few cores. Measured when no run has written them.
dir13=$runs/13_expert_parallel
moe13=(--n_expert 8 --moe_top_k 2 --preset tiny --eval_every 0 --num_samples 0)
if [[ -n $wikitext ]]; then
    for a in 0 0.01; do
        [[ -s $dir13/balance/aux$a/routing.csv ]] && continue
        echo "plots: measuring 13_expert_parallel (--n_expert 8 --moe_top_k 2 --aux_loss_coef $a --preset tiny --max_steps 300)"
        13_expert_parallel/13_expert_parallel "${moe13[@]}" --aux_loss_coef $a --max_steps 300 --log_every 10 \
            --data_dir "$wikitext" --out_dir "$dir13/balance/aux$a" >"$runs/plots/13_balance_$a.log" 2>&1 ||
            failed+=("13 --aux_loss_coef $a run (see $runs/plots/13_balance_$a.log)")
    done
    if [[ ! -s $dir13/capacity.csv ]]; then
        mkdir -p "$dir13"
        echo "capacity_factor,layer,dropped" >"$dir13/capacity.csv.part"
        for f in 1 1.25 1.5 2; do
            echo "plots: measuring 13_expert_parallel (--capacity_factor $f --capacity_groups 4 --batch_size 32 --max_steps 50)"
            13_expert_parallel/13_expert_parallel "${moe13[@]}" --capacity_factor $f --capacity_groups 4 --batch_size 32 \
                --max_steps 50 --data_dir "$wikitext" --out_dir "$dir13/capacity/f$f" >"$runs/plots/13_capacity_$f.log" 2>&1 ||
                failed+=("13 --capacity_factor $f run (see $runs/plots/13_capacity_$f.log)")
            sed -n "s/^  layer \([0-9]*\): .*dropped \([0-9.]*\)%$/$f,\1,\2/p" "$runs/plots/13_capacity_$f.log" |
                awk -F, '{ printf "%s,%s,%.6f\n", $1, $2, $3 / 100 }' >>"$dir13/capacity.csv.part"
        done
        mv "$dir13/capacity.csv.part" "$dir13/capacity.csv"
    fi
fi
if [[ -s $dir13/balance/aux0/routing.csv && -s $dir13/balance/aux0.01/routing.csv ]]; then
    draw 13_balance 13_balance.gp "aux0='$dir13/balance/aux0/routing.csv'; aux1='$dir13/balance/aux0.01/routing.csv'; subtitle=\"$(subtitle "$dir13/balance/aux0/metrics.csv" "$dir13/balance/aux0.01/metrics.csv")\""
else skipped+=("13_balance: WikiText-2 is not here (make data downloads it)"); fi
if [[ -s $dir13/capacity.csv ]]; then
    draw 13_capacity 13_capacity.gp "infile='$dir13/capacity.csv'; subtitle=\"$(subtitle "$dir13/capacity/f1/metrics.csv")\""
else skipped+=("13_capacity: WikiText-2 is not here (make data downloads it)"); fi
# --- 09: the bytes each rank holds against N, for DDP and the three ZeRO
# stages. Memory does not depend on the text, so this needs no WikiText-2:
# a few steps of the tiny preset on a small generated corpus, one run per
# stage and number of ranks, each writing its memory.csv; their rows
# together are the figure's table.
zero_dir=$runs/09_zero_fsdp
zero_csv=$zero_dir/memory.csv
if [[ ! -s $zero_csv ]]; then
    echo "plots: measuring 09_zero_fsdp (--preset tiny, 2 steps; --shard 0-3 on 1, 2, 4, 8 ranks)"
    mkdir -p "$zero_dir/corpus"
    for f in train valid test; do
        awk -v n=$([[ $f == train ]] && echo 400 || echo 40) 'BEGIN { srand(7); for (i = 0; i < n; i++)
            printf " the %s cat %d sees a dog %d . \n", (i % 3 ? "small" : "big"), i % 7, i % 5 }' >"$zero_dir/corpus/$f.txt"
    done
    ok=1
    for n in 1 2 4 8; do
        for s in 0 1 2 3; do
            OMP_NUM_THREADS=1 09_zero_fsdp/09_zero_fsdp --data_dir "$zero_dir/corpus" --verify_data=false --preset tiny \
                --vocab_size 300 --max_steps 2 --batch_size 1 --num_samples 0 --device cpu --shard $s --nprocs $n \
                --out_dir "$zero_dir/memory/s${s}n$n" >"$runs/plots/09_zero_fsdp.s${s}n$n.log" 2>&1 || ok=0
        done
    done
    if [[ $ok == 1 ]]; then
        { head -n 1 "$zero_dir/memory/s0n1/memory.csv"
          echo "# command: 09_zero_fsdp --preset tiny --max_steps 2 --shard 0-3 --nprocs 1,2,4,8"
          grep '^# [^c]' "$zero_dir/memory/s0n1/memory.csv"
          for d in "$zero_dir"/memory/*/; do grep '^[0-9]' "$d/memory.csv"; done | sort -t, -k1,1n -k2,2n; } >"$zero_csv"
    else failed+=("09 runs (see $runs/plots/09_zero_fsdp.*.log)"); fi
fi
[[ -s $zero_csv ]] && draw 09_zero_memory 09_zero_memory.gp "infile='$zero_csv'; subtitle=\"$(subtitle "$zero_csv")\""

# --- 12: the longest context a memory budget per rank allows, cp 1, 2, 4:
# the chapter run at growing block sizes (its bench, a made-up corpus).
csv12=$runs/12_context_parallel/longest_context.csv
if [[ ! -s $csv12 ]]; then
    echo "plots: measuring 12_context_parallel (bench/longest_context.sh: --preset tiny, one step per block size, cp 1, 2, 4)"
    bash 12_context_parallel/bench/longest_context.sh >"$runs/plots/12_longest_context.bench.log" 2>&1 ||
        failed+=("12 benchmark (see $runs/plots/12_longest_context.bench.log)")
fi
[[ -s $csv12 ]] && draw 12_longest_context 12_longest_context.gp "infile='$csv12'; subtitle=\"$(subtitle "$csv12")\""

# On a GPU machine the measurements run on the GPU and through NCCL.
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "plots: no GPU here: on a GPU server 01 would run on the GPU, 02/03 would also measure the nccl backend, and 04/05 would scale over GPUs instead of CPU cores"
fi
if [[ $have_gnuplot -eq 0 ]]; then
    echo "plots: gnuplot not found, so only the CSVs under $runs/ were written; install it with: apt-get install gnuplot-nox"
fi
for f in "${drawn[@]}"; do echo "plots: wrote $f"; done
for f in "${skipped[@]}"; do echo "plots: skipped $f"; done
for f in "${failed[@]}"; do echo "plots: FAILED $f"; done
[[ ${#failed[@]} -eq 0 ]]
