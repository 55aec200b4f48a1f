#!/usr/bin/env bash
# compare_mpi.sh - the cpu backend against MPI's shared-memory transport, side
# by side: the same benchmark (03's --bench, or 02's ping-pong for p2p), the
# same sizes and timing method, on this machine at the same time. Prints, per
# collective and number of ranks, both times and their ratio per size, with
# the spread of that ratio over the rounds. Not part of `make test`.
#
#   03_collectives/bench/compare_mpi.sh [-n "RANKS..."] [-c "COLLECTIVES..."]
#       [-b MIN] [-e MAX] [-f STEP] [-r ROUNDS] [-i ITERS] [-w WARMUP] [-o CSV]
#
# Defaults: 2 ranks, all_reduce (float32 sum), 8 B to 64 MiB, x4 per row, 3
# rounds, 1000 timed operations per size after 20 untimed ones (fewer for
# large sizes: at most 1 GiB per size; the benchmarks' own default of 20
# times a few microseconds at small sizes, which on a shared machine is
# mostly noise). -c p2p is chapter 02's ping-pong (one-way latency, ranks 0
# and 1; the others wait). When the steps skip MAX (8 B x4 never lands on
# 256 MiB), MAX is measured as one more row. Each size is measured by the
# two backends back to back, in its own pair of runs (cpu first in odd
# rounds, mpi first in even ones), not as two sweeps of all sizes: on a
# virtual machine the cost of moving a cache line between two cores can
# change threefold from one moment to the next, for both backends alike
# (the hypervisor moves the virtual cores; 03's README.bench.md shows it),
# and two sweeps measured a cell seconds apart, maybe in two such states. Each time shown is the median over the rounds of the
# benchmark's own time (slowest rank, n back-to-back operations after
# warm-up); the ratio is cpu / mpi of those medians, "spread" the lowest and
# highest ratio of a single round's pair, and "best" the ratio of the two
# backends' fastest rounds (what each costs when the machine leaves it
# alone). -o also writes every row to a CSV, which plots/03_cpu_vs_mpi.gp
# draws. The last lines sum it up: how many cells have a median ratio of
# at most 1.00, and which are slower in every round; and the load average
# at the start and at the end (a busy machine makes both backends noisy).
# cpu: ranks started by spawn (--nprocs); mpi: ranks started by mpirun.
# Needs a build with MPI (make finds mpicc).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
ranks_list=2 collectives=all_reduce min=8 max=64M step=4 rounds=3 iters=1000 warmup=20 csv=""
while getopts n:c:b:e:f:r:i:w:o: opt; do
    case $opt in
    n) ranks_list=$OPTARG ;; c) collectives=$OPTARG ;; b) min=$OPTARG ;; e) max=$OPTARG ;;
    f) step=$OPTARG ;; r) rounds=$OPTARG ;; i) iters=$OPTARG ;; w) warmup=$OPTARG ;;
    o) csv=$OPTARG ;;
    *) sed -n '8,9p' "$0" >&2; exit 2 ;;
    esac
done
command -v mpirun >/dev/null || { echo "compare_mpi.sh: mpirun not found (apt-get install openmpi-bin libopenmpi-dev, then make)" >&2; exit 1; }
for prog in "$here/03_collectives" "$here/../02_p2p/02_p2p"; do
    [[ -x $prog ]] || { echo "compare_mpi.sh: build $(basename "$prog") first (make)" >&2; exit 1; }
done
bytes() { numfmt --from=iec "$1"; }   # 64M -> 67108864
min_b=$(bytes "$min") max_b=$(bytes "$max")
sizes=($min_b)
while ((sizes[-1] * step <= max_b)); do sizes+=($((sizes[-1] * step))); done
if ((sizes[-1] < max_b)); then sizes+=($max_b); fi
unset RANK WORLD_SIZE MASTER_ADDR MASTER_PORT COURSE_BACKEND
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export COURSE_RUNS_DIR=$tmp/runs

# sweep BACKEND RANKS COLLECTIVE MIN MAX: "SIZE TIME_US" per row of one run
# (the sizes MIN, MIN * STEP, ... up to MAX).
sweep() {
    local backend=$1 n=$2 c=$3 lo=$4 hi=$5 out=$tmp/run column
    local launch=("--nprocs" "$n")
    local mpi=(mpirun -np "$n")
    mpirun --version 2>&1 | grep -q "Open MPI" && mpi=(mpirun --oversubscribe --allow-run-as-root -np "$n")
    local timing=(-n "$iters" -w "$warmup")
    local args=(--bench --device cpu --collective "$c" -b "$lo" -e "$hi" -f "$step" -c 0 "${timing[@]}")
    local prog=$here/03_collectives
    column=6   # 03's table: size count type redop root time algbw busbw #wrong
    if [[ $c == p2p ]]; then
        prog=$here/../02_p2p/02_p2p args=(--bench --device cpu -b "$lo" -e "$hi" -f "$step" "${timing[@]}")
        column=3   # 02's table: size iters latency mean bandwidth
    fi
    if [[ $backend == cpu ]]; then "$prog" --backend cpu "${launch[@]}" "${args[@]}" >"$out" 2>&1
    else "${mpi[@]}" "$prog" --backend mpi "${args[@]}" >"$out" 2>&1; fi ||
        { echo "compare_mpi.sh: $backend $c on $n ranks failed: $(tail -n 2 "$out")" >&2; exit 1; }
    if [[ $backend == mpi ]]; then grep -m1 -o 'backend: mpi.*' "$out" | sed 's/backend: //' >"$tmp/mpi_name"; fi
    awk -v t=$column '(NF == 9 || NF == 5) && $1 ~ /^[0-9]+$/ && $1 > 0 { print $1, $t }' "$out"
}

# One table per collective and number of ranks; rows also go to $tmp/csv.
compare() {
    local c=$1 n=$2
    for i in $(seq "$rounds"); do
        local order=(cpu mpi)
        if ((i % 2 == 0)); then order=(mpi cpu); fi
        for s in "${sizes[@]}"; do
            for b in "${order[@]}"; do sweep $b "$n" "$c" "$s" "$s" | sed "s/^/$b $i /"; done
        done
    done >"$tmp/rows"
    echo "# $c, $n ranks: median of $rounds rounds; spread = lowest and highest ratio of one round"
    printf '%12s %12s %12s %8s %13s %6s\n' "size (B)" "cpu (us)" "mpi (us)" "cpu/mpi" "spread" "best"
    awk -v c="$c" -v n="$n" -v csv="$tmp/csv" '
        { t[$1, $3, $2] = $4; sizes[$3] = 1; if ($2 > rounds) rounds = $2 }
        function median(v, m,   i, j, x) {
            for (i = 2; i <= m; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
            return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
        }
        END {
            k = 0; for (s in sizes) order[++k] = s + 0
            for (i = 2; i <= k; i++) { x = order[i]; for (j = i - 1; j >= 1 && order[j] > x; j--) order[j + 1] = order[j]; order[j + 1] = x }
            for (i = 1; i <= k; i++) {
                s = order[i]; lo = 1e30; hi = 0; fc = 1e30; fm = 1e30
                for (r = 1; r <= rounds; r++) {
                    a[r] = t["cpu", s, r]; b[r] = t["mpi", s, r]
                    q = b[r] > 0 ? a[r] / b[r] : 0; if (q < lo) lo = q; if (q > hi) hi = q
                    if (a[r] < fc) fc = a[r]; if (b[r] < fm) fm = b[r]
                }
                mc = median(a, rounds); mm = median(b, rounds); ratio = mm > 0 ? mc / mm : 0
                best = fm > 0 ? fc / fm : 0
                printf "%12d %12.2f %12.2f %8.2f %6.2f-%-6.2f %6.2f\n", s, mc, mm, ratio, lo, hi, best
                printf "%s,%d,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n", c, n, s, mc, mm, ratio, lo, hi,
                       fc, fm, best >> csv
            }
        }' "$tmp/rows"
}

echo "# cpu backend vs $(mpirun --version 2>&1 | head -n 1) shared memory; $(nproc) cores," \
     "$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'); $(date -u '+%Y-%m-%d %H:%M') UTC"
echo "# load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
: >"$tmp/csv"
for c in $collectives; do
    for n in $ranks_list; do
        compare "$c" "$n"
        echo
    done
done
# The verdict in one line: the cells whose median ratio is at most 1, and
# the cells slower than MPI in every round (the lowest round's ratio above
# 1: no amount of noise explains those). Each is named as collective/ranks/size.
awk -F, '{ cells++; cell = $1 "/" $2 "/" $3
           if ($6 <= 1.0) fast++
           if ($7 > 1.0) { slow++; names = names " " cell } }
     END { printf "# summary: %d of %d cells with a median cpu/mpi <= 1.00; %d slower in every round%s\n",
                  fast, cells, slow, slow ? ":" names : "" }' "$tmp/csv"
echo "# load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ -n $csv ]]; then
    { echo "collective,ranks,size_bytes,cpu_us,mpi_us,ratio,ratio_min,ratio_max,cpu_best_us,mpi_best_us,ratio_best"
      echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //') | $(cat "$tmp/mpi_name") | $rounds rounds of $iters operations | $(date -u '+%Y-%m-%d')"
      cat "$tmp/csv"; } >"$csv.tmp" && mv "$csv.tmp" "$csv"
    echo "# rows written to $csv"
fi
