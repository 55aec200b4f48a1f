#!/usr/bin/env bash
# tests/tools/test_speedup.sh - `make speedup` (tools/speedup.sh), the
# baseline-vs-DDP comparison of chapters 04 and 05 measured as a benchmark.
# No time is asserted on: every number it reports is recomputed here from
# the runs it kept (each run's train.csv): a run's time is the median of its
# epoch times with the first epoch left out (the warm-up), the rounds run
# 1, 2, ... ranks in turn, and each row is the median over the rounds with
# its range, the speedup the median of the rounds' 1-rank/N-rank ratios.
source "$(dirname "$0")/../lib.sh"
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT COURSE_AGENT_STORE COURSE_JOB_TOKEN
out=$COURSE_RUNS_DIR/speedup

# recompute CHAPTER LOG : checks the table printed in LOG and the CSV against
# the kept runs; prints what differs and fails, or nothing.
recompute() {
    local chapter=$1 log=$2 w r
    for w in 1 2; do
        local mine="" printed
        for r in 1 2 3; do
            mine+=" $(awk -F, '/^[0-9]/ { if (n++ > 0) print $3 - last; last = $3 }' "$out/work/small-w$w-r$r/$chapter/train.csv" |
                      sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')"
        done
        printed=$(awk -v w=$w '$1 == w && NF > 5 { row = 1; next } row && /rounds:/ { sub(/.*s\/epoch /, ""); sub(/;.*/, ""); print; exit }' "$log")
        echo "$w|$mine|$printed|$(grep "^$w," "$out/speedup_small.csv")|$(awk -F, '/^[0-9]/ { l = $2 } END { print l }' "$out/work/small-w$w-r3/$chapter/train.csv")"
    done | awk -F'|' '
        function median(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
                                           return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
        function near(a, b, rel) { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; return d <= rel * m + 1e-12 }
        {
            w = $1; n = split($2, t, " "); split($3, p, " "); split($4, c, ",")
            if (n != 3) { printf "%d ranks: %d rounds kept, expected 3\n", w, n; bad = 1; next }
            for (i = 1; i <= 3; i++) { if (!near(t[i], p[i], 1e-5)) { printf "%d ranks, round %d: printed %s s/epoch, its train.csv gives %s\n", w, i, p[i], t[i]; bad = 1 }
                                       times[w, i] = t[i]; sorted[i] = t[i] }
            lo = sorted[1]; hi = sorted[1]; for (i = 2; i <= 3; i++) { if (sorted[i] < lo) lo = sorted[i]; if (sorted[i] > hi) hi = sorted[i] }
            if (!near(c[2], median(sorted, 3), 1e-6 / c[2]) || !near(c[7], lo, 1e-6 / c[7]) || !near(c[8], hi, 1e-6 / c[8])) {
                printf "%d ranks: CSV s/epoch %s (%s-%s), the rounds give %g (%g-%g)\n", w, c[2], c[7], c[8], median(sorted, 3), lo, hi; bad = 1 }
            for (i = 1; i <= 3; i++) q[i] = times[1, i] / times[w, i]
            qlo = q[1]; qhi = q[1]; for (i = 2; i <= 3; i++) { if (q[i] < qlo) qlo = q[i]; if (q[i] > qhi) qhi = q[i] }
            s = median(q, 3)
            if (!near(c[4], s, 2e-3) || !near(c[9], qlo, 2e-3) || !near(c[10], qhi, 2e-3) || !near(c[5], s / w, 2e-3)) {
                printf "%d ranks: CSV speedup %s (%s-%s), efficiency %s; the rounds give %g (%g-%g), %g\n", w, c[4], c[9], c[10], c[5], s, qlo, qhi, s / w; bad = 1 }
            if (c[6] != $5) { printf "%d ranks: CSV final loss %s, the last run ended at %s\n", w, c[6], $5; bad = 1 }
        }
        END { exit bad }'
}

# measure CHAPTER : a small measurement (2 world sizes, 3 rounds, the small model).
measure() {
    SPEEDUP_CHAPTER=$1 SPEEDUP_MODELS=small SPEEDUP_MAX_RANKS=2 SPEEDUP_ROUNDS=3 \
        run_capture 300 "$TMP/$1.log" bash "$ROOT/tools/speedup.sh"
}

measure 04; status=$?
[[ $status -eq 0 ]] && grep -q '^# command: speedup.sh 1\.\.2 ranks, 3 rounds of 6 epochs (the first untimed) of 04_ddp_spawn' "$out/speedup_small.csv" &&
   [[ $(grep -c '^[0-9]' "$out/speedup_small.csv") -eq 2 ]]
verdict $? "speedup: chapter 04 (spawned), 1 and 2 ranks, 3 rounds: a row per world size and the method" "status $status: $(tail -n 3 "$TMP/04.log" | tr '\n' '|') $(head -n 2 "$out/speedup_small.csv" 2>/dev/null | tr '\n' '|')"
# Each world size ran as many ranks as it says: the baseline one process,
# DDP two, with the learning rate scaled by 2.
grep -q '^04_ddp_spawn: 1 rank(s)' "$out/small_w1.log" && grep -q '^04_ddp_spawn: 2 rank(s)' "$out/small_w2.log" &&
   grep -q 'batch 32 per rank x 2 rank(s) = 64 per step; lr 0.02$' "$out/small_w2.log"
verdict $? "speedup: the baseline runs 1 rank, DDP 2 with lr x 2" "$(head -n 3 "$out/small_w2.log" | tr '\n' '|')"
recompute 04_ddp_spawn "$TMP/04.log" >"$TMP/why"
verdict $? "speedup: times, speedups, ranges and losses recomputed from chapter 04's kept runs (warm-up epoch left out)" "$(tr '\n' '|' <"$TMP/why")"

measure 05; status=$?
[[ $status -eq 0 ]] && grep -q 'of 05_env_launch: median' "$out/speedup_small.csv" &&
   grep -q '^\[rank 0\]: 05_env_launch: 2 rank(s) (torchrun variables' "$out/small_w2.log" && recompute 05_env_launch "$TMP/05.log" >"$TMP/why"
verdict $? "speedup: chapter 05 under ddprun (the default), recomputed from its kept runs" "status $status: $(tr '\n' '|' <"$TMP/why" 2>/dev/null) $(tail -n 2 "$TMP/05.log" | tr '\n' '|')"

SPEEDUP_CHAPTER=03 run_capture 30 "$TMP/bad" bash "$ROOT/tools/speedup.sh"; status=$?
[[ $status -eq 2 ]] && grep -q "SPEEDUP_CHAPTER must be 04 or 05, got '03'" "$TMP/bad"
verdict $? "speedup: another chapter is refused in one line, status 2" "status $status: $(head -n 2 "$TMP/bad" | tr '\n' '|')"
no_leftovers "speedup: no process left behind" "04_ddp_spawn/04_ddp_spawn|05_env_launch/05_env_launch"
