#!/usr/bin/env bash
# bench/02_p2p.sh - ping-pong latency and bandwidth between two ranks (chapter 02_p2p).
#
# `make bench` runs it from the project root. It prints the table and writes
# runs/02_p2p/pingpong.csv (size_bytes, latency_us, bandwidth_GBps), which
# plots/02_p2p.gp draws. The sweep is the program's default: 8 B to 256 MiB,
# doubling; big sizes get fewer round trips, so it takes seconds, not minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x 02_p2p/02_p2p ]] || make --no-print-directory -s -C 02_p2p >/dev/null
echo "=== bench/02_p2p.sh: ./02_p2p --bench (2 ranks)"
02_p2p/02_p2p --bench --nprocs 2
