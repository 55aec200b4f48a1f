# Chapter 02: a tensor travels from rank 0 to rank 1, blocking and
# non-blocking; the ping-pong benchmark prints a table and writes its CSV.
source "$(dirname "$0")/../lib.sh"
bin="$ROOT/02_p2p/02_p2p"
[[ -x "$bin" ]] || make --no-print-directory -s -C "$ROOT/02_p2p" >/dev/null 2>&1

# The benchmark writes <runs>/02_p2p/pingpong.csv; lib.sh points <runs> at
# this test's own fresh folder, so the file checked below is this run's.
csv="$COURSE_RUNS_DIR/02_p2p/pingpong.csv"

# --- the lesson, as a student first runs it
run_capture 60 "$TMP/lesson" "$bin"; status=$?
check "02: default run exits 0" test $status -eq 0
head -n 1 "$TMP/lesson" | grep -Eq '^02_p2p: 2 ranks \| device: .+ \(.+\) \| backend: .+'
verdict $? "02: first line names the device, why, and the backend" "first line: $(head -n 1 "$TMP/lesson")"
expect_output "02: blocking: Rank 1 has data 1.0" "$TMP/lesson" '^Rank 1 has data 1\.0 \(pg_recv returned\)$'
expect_output "02: non-blocking: Rank 1 has data 1.0" "$TMP/lesson" '^Rank 1 has data 1\.0 \(irecv completed after [0-9]+ polls'
# What the receiver got is what the sender had when it sent (both print the
# tensor's value read back from the device), and it is not rank 1's 0.0.
sent=$(field "$TMP/lesson" '^Rank 0 has data ([-0-9.]*) \(sending it to rank 1 with pg_send\)$')
got=$(field "$TMP/lesson" '^Rank 1 has data ([-0-9.]*) \(pg_recv returned\)$')
[[ -n "$sent" && "$got" == "$sent" && "$got" != 0.0 ]]
verdict $? "02: blocking: rank 1 received the $got that rank 0 sent" "rank 0 sent '$sent', rank 1 has '$got'"
sent=$(field "$TMP/lesson" '^Rank 0 has data ([-0-9.]*) and posts pg_isend')
got=$(field "$TMP/lesson" '^Rank 1 has data ([-0-9.]*) \(irecv completed')
posted=$(grep -n '^Rank 0 has data .* and posts pg_isend' "$TMP/lesson" | cut -d: -f1)
arrived=$(grep -n '^Rank 1 has data .* (irecv completed' "$TMP/lesson" | cut -d: -f1)
[[ -n "$sent" && "$got" == "$sent" && "$got" != 0.0 && -n "$posted" && -n "$arrived" && $arrived -gt $posted ]]
verdict $? "02: non-blocking: rank 1's irecv completed with the $got that rank 0 posted, after it was posted" \
    "rank 0 posted '$sent' (line $posted), rank 1 has '$got' (line $arrived)"
# The blocking part must finish before the non-blocking part starts.
order=$(grep -n -e '^--- 1\.' -e 'pg_recv returned' -e '^--- 2\.' -e 'irecv completed' "$TMP/lesson" | cut -d: -f1 | tr '\n' ' ')
[[ $(echo $order | tr ' ' '\n' | sort -n | tr '\n' ' ') == "$order" && $(echo $order | wc -w) -eq 4 ]]
verdict $? "02: part 1 (blocking) ends before part 2 (non-blocking) begins" "line numbers: $order"
# Rank 1 waited for rank 0 (which sleeps 20 ms), so it had to poll more than once.
polls=$(field "$TMP/lesson" 'irecv completed after ([0-9]*) polls')
[[ -n "$polls" && "$polls" -gt 1 ]]; verdict $? "02: rank 1 polled its irecv more than once ($polls polls)" "polls: '$polls'"

run_capture 60 "$TMP/three" "$bin" --nprocs 3 --device cpu; status=$?
[[ $status -eq 0 ]] && [[ $(grep -c '^Rank 1 has data 1\.0' "$TMP/three") -eq 2 ]] && grep -q '^(ranks 2\.\.2 take no part' "$TMP/three"
verdict $? "02: --nprocs 3 works (rank 2 takes no part)" "status $status: $(tail -n 3 "$TMP/three" | tr '\n' '|')"

# --- the benchmark on a small range: 8, 64, 512, 4096, 32768 bytes
run_capture 90 "$TMP/bench" "$bin" --bench -b 8 -e 32K -f 8 -n 20 -w 2; status=$?
check "02: --bench exits 0" test $status -eq 0
expect_output "02: --bench header states the method" "$TMP/bench" '^# +latency = median round-trip time / 2 \(one way\); mean = mean round trip / 2;'
expect_output "02: --bench header defines bandwidth and GB" "$TMP/bench" '^# +bandwidth = size / latency; GB = 1e9 bytes'
expect_output "02: --bench header names device and backend" "$TMP/bench" '^# device: .+ \| backend: .+'
rows=$(grep -Ec '^ +[0-9]+ +20 +[0-9.]+ +[0-9.]+ +[0-9.]+$' "$TMP/bench")
check "02: --bench prints one row per size (5)" test "$rows" -eq 5
[[ -f "$csv" ]] && [[ $(head -n 1 "$csv") == "size_bytes,latency_us,bandwidth_GBps" ]]
verdict $? "02: pingpong.csv has the columns size_bytes,latency_us,bandwidth_GBps" "header: $(head -n 1 "$csv" 2>/dev/null)"
# bandwidth = size / latency on every row, sizes 8 .. 32768 in order.
awk -F, 'NR > 1 && !/^#/ { n++; want = n == 1 ? 8 : want * 8
        if ($1 != want || $2 <= 0) bad = 1
        # latency has 3 decimals: allow its rounding (0.0005 us) in the division
        bw = $1 / ($2 * 1e3); d = bw - $3; if (d < 0) d = -d; if (d > 1e-6 + bw * (1e-3 + 6e-4 / $2)) bad = 1 }
        END { exit !(n == 5 && !bad) }' "$csv"
verdict $? "02: CSV rows: sizes 8..32K and bandwidth = size / latency" "$(tr '\n' '|' <"$csv")"
grep -q '^# .* | backend [a-z]* | [0-9-]*$' "$csv"; verdict $? "02: CSV has the comment line the plot title reads" "$(sed -n 2p "$csv")"
# Big sizes get fewer round trips: at most 1 GiB each way, so 16 MiB gets 64 of the 100 asked.
run_capture 90 "$TMP/big" "$bin" --bench -b 16M -e 16M -n 100 -w 1; status=$?
[[ $status -eq 0 ]] && grep -Eq '^ +16777216 +64 ' "$TMP/big"
verdict $? "02: --bench -n 100 at 16 MiB runs 64 round trips (1 GiB cap)" "status $status: $(grep -E '^ +[0-9]' "$TMP/big")"

# --- GPUs
if has_gpu; then
    run_capture 60 "$TMP/gpu" "$bin" --device cuda; status=$?
    [[ $status -eq 0 ]] && [[ $(grep -c '^Rank 1 has data 1\.0' "$TMP/gpu") -eq 2 ]]
    verdict $? "02: --device cuda: rank 1 gets 1.0 twice" "status $status: $(tail -n 3 "$TMP/gpu" | tr '\n' '|')"
    # 4 ranks (2 and 3 take no part): each on its own GPU with nccl, or sharing one.
    run_capture 60 "$TMP/gpu4" "$bin" --device cuda --nprocs 4; status=$?
    [[ $status -eq 0 ]] && [[ $(grep -c '^Rank 1 has data 1\.0' "$TMP/gpu4") -eq 2 ]] && grep -q '^(ranks 2\.\.3 take no part' "$TMP/gpu4"
    verdict $? "02: --device cuda --nprocs 4: rank 1 gets 1.0 twice ($(head -n 1 "$TMP/gpu4" | field - '\| backend: ([a-z]*)' 'backend \1'))" \
        "status $status: $(tail -n 3 "$TMP/gpu4" | tr '\n' '|')"
else
    skip "02: --device cuda: rank 1 gets 1.0 twice" "no GPU on this machine"
    skip "02: --device cuda --nprocs 4" "no GPU on this machine"
fi

# --- bad input: one line naming the flag, exit status 2
bad_flag() {
    local name=$1; shift
    run_capture 10 "$TMP/bad" "$bin" "$@"; local status=$?
    [[ $status -eq 2 ]] && grep -q "^02_p2p: error: " "$TMP/bad"; verdict $? "02: $name exits 2" "status $status: $(head -n 1 "$TMP/bad")"
}
bad_flag "--nprocs 1 (needs two ranks)" --nprocs 1
bad_flag "-b 1M -e 1K (min above max)" --bench -b 1M -e 1K
bad_flag "-e 12Q (not a size)" --bench -e 12Q
bad_flag "--backend gloo" --backend gloo
bad_flag "--frobnicate (unknown flag)" --frobnicate

no_leftovers "02: no processes left behind" "$bin"
