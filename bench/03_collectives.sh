#!/usr/bin/env bash
# bench/03_collectives.sh - the collectives, nccl-tests style (chapter 03_collectives).
#
# `make bench` runs it from the project root. Two sweeps of 2 ranks, a minute
# at most on a 2-core machine:
#   1. every collective, 8 B to 64 MiB, the size x4 per row;
#   2. all_reduce (what DDP calls once per step), 8 B to 256 MiB, fewer
#      iterations; it replaces sweep 1's runs/03_collectives/all_reduce.csv.
# Each prints its tables; the CSVs under runs/03_collectives/ feed
# plots/03_collectives.gp. A wrong value anywhere makes the script fail.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x 03_collectives/03_collectives ]] || make --no-print-directory -s -C 03_collectives >/dev/null
echo "=== bench/03_collectives.sh: every collective, 2 ranks, 8 B to 64 MiB"
03_collectives/03_collectives --bench --nprocs 2 -b 8 -e 64M -f 4 -c 1
echo
echo "=== bench/03_collectives.sh: all_reduce, 2 ranks, 8 B to 256 MiB"
03_collectives/03_collectives --bench --nprocs 2 --collective all_reduce -b 8 -e 256M -f 2 -n 10 -w 2 -c 1
