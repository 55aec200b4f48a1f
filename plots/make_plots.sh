#!/usr/bin/env bash
# plots/make_plots.sh - `make plots`: run the short measurements whose CSV
# is missing, then draw every figure with gnuplot into runs/plots/ (PNG).
# Without gnuplot the CSVs are still written, and one line says how to
# install it. Delete a CSV (or runs/) to measure again.
set -u
cd "$(dirname "$0")/.." || exit 1
mkdir -p runs/plots
today=$(date +%Y-%m-%d)
have_gnuplot=1
command -v gnuplot >/dev/null || have_gnuplot=0
drawn=() failed=()

# draw NAME SCRIPT ARGS : gnuplot SCRIPT into runs/plots/NAME.png
draw() {
    local name=$1 script=$2 args=$3
    [[ $have_gnuplot -eq 1 ]] || return 0
    if gnuplot -e "outfile='runs/plots/$name.png'; $args" "plots/$script" 2>runs/plots/$name.log; then
        drawn+=("runs/plots/$name.png")
    else failed+=("$name (see runs/plots/$name.log)"); fi
}

# The device a chapter ran on: its first line says "running on X; why: ...".
device_of() { sed -n 's/.*running on \([^;]*\);.*/\1/p; s/.*rank 0 on \([^:]*\):.*/\1/p' "$1" | head -n 1; }

# --- 01: loss curve
if [[ ! -s runs/01_single_gpu/loss.csv || ! -s runs/01_single_gpu/run.log ]]; then
    echo "plots: measuring 01_single_gpu (10 epochs)"
    mkdir -p runs/01_single_gpu
    01_single_gpu/01_single_gpu >runs/01_single_gpu/run.log 2>&1 || failed+=("01 run failed")
fi
draw 01_loss 01_loss.gp "infile='runs/01_single_gpu/loss.csv'; subtitle='$(device_of runs/01_single_gpu/run.log) | no communication (1 process) | $today'"

# --- 02: ping-pong latency and bandwidth; 03: busbw per collective. Their
# gnuplot scripts read device, backend and date from the CSVs' comment line.
if [[ ! -s runs/02_p2p/pingpong.csv ]]; then
    echo "plots: measuring 02_p2p (bench/02_p2p.sh)"
    bash bench/02_p2p.sh >runs/plots/02_p2p.bench.log 2>&1 || failed+=("02 benchmark (see runs/plots/02_p2p.bench.log)")
fi
draw 02_p2p 02_p2p.gp "infile='runs/02_p2p/pingpong.csv'"
if [[ ! -s runs/03_collectives/all_reduce.csv ]]; then
    echo "plots: measuring 03_collectives (bench/03_collectives.sh)"
    bash bench/03_collectives.sh >runs/plots/03_collectives.bench.log 2>&1 || failed+=("03 benchmark (see runs/plots/03_collectives.bench.log)")
fi
draw 03_collectives 03_collectives.gp ""

# --- 04/05: speedup against world size
if [[ ! -s runs/speedup/speedup_small.csv || ! -s runs/speedup/speedup_large.csv ]]; then
    echo "plots: measuring the speedup (tools/speedup.sh)"
    bash tools/speedup.sh || failed+=("speedup measurement failed")
fi
if [[ -s runs/speedup/speedup_small.csv ]]; then
    draw speedup speedup.gp "small='runs/speedup/speedup_small.csv'; large='runs/speedup/speedup_large.csv'; subtitle='$(cat runs/speedup/device.txt 2>/dev/null) | $today'"
fi

# --- 08: the GPT's loss curves and speed (a short run of the tiny preset
# on WikiText-2 when no run has written its metrics yet).
gpt_dir=runs/08_gpt_wikitext
if [[ ! -s $gpt_dir/metrics.csv ]]; then
    echo "plots: measuring 08_gpt_wikitext (--preset tiny --max_steps 300)"
    mkdir -p $gpt_dir
    08_gpt_wikitext/08_gpt_wikitext --preset tiny --max_steps 300 --eval_every 50 --num_samples 1 \
        >$gpt_dir/run.log 2>&1 || failed+=("08 run (see $gpt_dir/run.log; WikiText-2 missing? make data)")
fi
if [[ -s $gpt_dir/metrics.csv ]]; then
    [[ -s $gpt_dir/run.log ]] || echo "08_gpt_wikitext: running on an earlier run's machine; why: metrics from a previous run" >$gpt_dir/run.log
    gpt_title="$(device_of $gpt_dir/run.log) | backend $(sed -n 's/^ranks: [0-9]*, backend \([a-z]*\).*/\1/p' $gpt_dir/run.log | head -n 1) | $today"
    draw 08_gpt_loss 08_gpt_loss.gp "infile='$gpt_dir/metrics.csv'; subtitle='$gpt_title'"
    draw 08_gpt_tokens 08_gpt_tokens.gp "infile='$gpt_dir/metrics.csv'; subtitle='$gpt_title'"
fi

# On a GPU machine the measurements run on the GPU and through NCCL.
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "plots: no GPU here: on a GPU server 01 and 08 would run on the GPU, 02/03 would also measure the nccl backend, and 04/05 would scale over GPUs instead of CPU cores"
fi
if [[ $have_gnuplot -eq 0 ]]; then
    echo "plots: gnuplot not found, so only the CSVs under runs/ were written; install it with: apt-get install gnuplot-nox"
fi
for f in "${drawn[@]}"; do echo "plots: wrote $f"; done
for f in "${failed[@]}"; do echo "plots: FAILED $f"; done
[[ ${#failed[@]} -eq 0 ]]
