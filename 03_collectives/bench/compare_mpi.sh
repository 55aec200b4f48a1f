#!/usr/bin/env bash
# compare_mpi.sh - 03's benchmark on the cpu backend and on the mpi backend,
# the same sizes, the same timing method, on this machine at the same time;
# prints both times and their ratio per size. Not part of `make test`.
#
#   03_collectives/bench/compare_mpi.sh [-n RANKS] [-c COLLECTIVE] [-b MIN] [-e MAX] [-f STEP] [-r REPEATS]
#
# Defaults: 2 ranks, all_reduce of float32 (sum), 8 B to 64 MiB, x4 per row,
# 3 repeats. -c p2p runs chapter 02's ping-pong instead (one-way latency,
# ranks 0 and 1; the others wait). The two backends take turns (cpu, mpi, cpu, mpi, ...) so that a
# busy moment on the machine hits both alike; each time shown is the median
# over the repeats of the benchmark's own time (slowest rank, n back-to-back
# operations after warm-up). cpu: ranks started by spawn (--nprocs); mpi:
# ranks started by mpirun. Needs a build with MPI (make finds mpicc).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
prog=$here/03_collectives
ranks=2 collective=all_reduce min=8 max=64M step=4 repeats=3
while getopts n:c:b:e:f:r: opt; do
    case $opt in
    n) ranks=$OPTARG ;; c) collective=$OPTARG ;; b) min=$OPTARG ;; e) max=$OPTARG ;;
    f) step=$OPTARG ;; r) repeats=$OPTARG ;; *) sed -n '5p' "$0" >&2; exit 2 ;;
    esac
done
command -v mpirun >/dev/null || { echo "compare_mpi.sh: mpirun not found (apt-get install openmpi-bin libopenmpi-dev, then make)" >&2; exit 1; }
bench=(--bench --device cpu --collective "$collective" -b "$min" -e "$max" -f "$step" -c 0)
time_column=6   # 03's table: size count type redop root time algbw busbw #wrong
if [[ $collective == p2p ]]; then
    prog=$here/../02_p2p/02_p2p
    bench=(--bench --device cpu -b "$min" -e "$max" -f "$step")
    time_column=3   # 02's table: size iters latency mean bandwidth
fi
[[ -x $prog ]] || { echo "compare_mpi.sh: build $(basename "$prog") first (make)" >&2; exit 1; }
mpi=(mpirun -np "$ranks")
if mpirun --version 2>&1 | grep -q "Open MPI"; then mpi=(mpirun --oversubscribe --allow-run-as-root -np "$ranks"); fi
unset RANK WORLD_SIZE MASTER_ADDR MASTER_PORT COURSE_BACKEND
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# rows FILE BACKEND: "BACKEND SIZE TIME_US" for each row of a benchmark's output.
rows() { awk -v b="$2" -v t=$time_column '(NF == 9 || NF == 5) && $1 ~ /^[0-9]+$/ { print b, $1, $t }' "$1"; }
for i in $(seq "$repeats"); do
    COURSE_RUNS_DIR=$tmp/runs "$prog" --backend cpu --nprocs "$ranks" "${bench[@]}" >"$tmp/cpu$i" 2>&1 ||
        { echo "cpu run failed: $(tail -n 2 "$tmp/cpu$i")" >&2; exit 1; }
    COURSE_RUNS_DIR=$tmp/runs "${mpi[@]}" "$prog" --backend mpi "${bench[@]}" >"$tmp/mpi$i" 2>&1 ||
        { echo "mpi run failed: $(tail -n 2 "$tmp/mpi$i")" >&2; exit 1; }
    rows "$tmp/cpu$i" cpu; rows "$tmp/mpi$i" mpi
done >"$tmp/all"

what="$collective, float32 sum"
[[ $collective == p2p ]] && what="p2p ping-pong, one-way latency"
echo "# $what, $ranks ranks, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end; $(date -u '+%Y-%m-%d %H:%M') UTC"
echo "# $(grep -m1 'backend: mpi' "$tmp/mpi1" | sed 's/.*backend: //'); median of $repeats runs each, taking turns"
printf '%12s %12s %12s %10s\n' "size (B)" "cpu (us)" "mpi (us)" "cpu/mpi"
awk '
    { t[$1, $2, ++n[$1, $2]] = $3; sizes[$2] = 1 }
    function median(b, s,   k, m, i, j, v, x) {
        m = n[b, s]; for (i = 1; i <= m; i++) v[i] = t[b, s, i]
        for (i = 2; i <= m; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
        return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
    }
    END {
        k = 0; for (s in sizes) order[++k] = s + 0
        for (i = 2; i <= k; i++) { x = order[i]; for (j = i - 1; j >= 1 && order[j] > x; j--) order[j + 1] = order[j]; order[j + 1] = x }
        for (i = 1; i <= k; i++) {
            s = order[i]; c = median("cpu", s); m = median("mpi", s)
            printf "%12d %12.2f %12.2f %10.2f\n", s, c, m, (m > 0 ? c / m : 0)
        }
    }' "$tmp/all"
