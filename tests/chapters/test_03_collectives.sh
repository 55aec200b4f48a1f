# Chapter 03: the nine collectives drawn rank by rank, and the nccl-tests
# style benchmark: exact results (#wrong 0), busbw = algbw x factor.
source "$(dirname "$0")/../lib.sh"
bin="$ROOT/03_collectives/03_collectives"
[[ -x "$bin" ]] || make --no-print-directory -s -C "$ROOT/03_collectives" >/dev/null 2>&1

# The benchmark writes <runs>/03_collectives/*.csv; lib.sh points <runs> at
# this test's own fresh folder, so the files checked below are this run's.
csv_dir="$COURSE_RUNS_DIR/03_collectives"

# after_of SECTION RANK FILE [LABEL]: what rank RANK holds after SECTION
# (or in the block LABEL: before, after, times), spaces squeezed: "[600 604 608 612]".
after_of() {
    awk -v name="$1" -v r="$2" -v label="${4:-after}" '
        /^== [0-9]+\. / { n = $3; sub(/:$/, "", n); in_section = (n == name); in_block = 0; next }
        in_section && /^  [a-z]/ { in_block = ($1 == label) }
        in_section && in_block && $0 ~ ("rank " r ": ") { sub(/.*rank [0-9]+: /, ""); print; exit }' "$3" |
        sed 's/\[ */[/; s/  */ /g'
}
expect_after() {
    local what=$1 section=$2 rank=$3 want=$4 file=$5 label=${6:-after}
    local got; got=$(after_of "$section" "$rank" "$file" "$label")
    [[ "$got" == "$want" ]]; verdict $? "03: $what" "$section, rank $rank, $label: got '$got', expected '$want'"
}

# --- the lesson: 4 ranks on the CPU
run_capture 90 "$TMP/lesson" "$bin" --device cpu; status=$?
check "03: the lesson exits 0" test $status -eq 0
head -n 1 "$TMP/lesson" | grep -Eq '^03_collectives: 4 ranks \| device: .+ \(.+\) \| backend: .+'
verdict $? "03: first line names 4 ranks, the device, why, and the backend" "first line: $(head -n 1 "$TMP/lesson")"
sections=$(grep -Eo '^== [0-9]\. [a-z_]+' "$TMP/lesson" | awk '{ print $3 }' | tr '\n' ' ')
want_sections="broadcast reduce all_reduce gather all_gather scatter reduce_scatter all_to_all barrier "
[[ "$sections" == "$want_sections" ]]; verdict $? "03: the nine collectives, in order" "got: $sections"
# Each picture lists every rank in rank order, before and after.
awk '/^== [1-8]\. / { if (s && seen != "01230123") bad = 1; s = 1; seen = "" }
     / rank [0-9]: / { r = $0; sub(/.* rank /, "", r); seen = seen substr(r, 1, 1) }
     /^== 9\. / { if (seen != "01230123") bad = 1; exit }
     END { exit bad }' "$TMP/lesson"
verdict $? "03: every picture shows ranks 0-3 before and after, in rank order" "see the lesson output"

expect_after "broadcast: rank 2 ends with the root's [0 1 2 3]" broadcast 2 "[0 1 2 3]" "$TMP/lesson"
expect_after "reduce: the root holds the sum [600 604 608 612]" reduce 0 "[600 604 608 612]" "$TMP/lesson"
expect_after "reduce: rank 1 receives nothing" reduce 1 "-" "$TMP/lesson"
expect_after "all_reduce: rank 3 holds the sum [600 604 608 612]" all_reduce 3 "[600 604 608 612]" "$TMP/lesson"
expect_after "gather: the root holds every rank's buffer" gather 0 \
    "[0 1 2 3 100 101 102 103 200 201 202 203 300 301 302 303]" "$TMP/lesson"
expect_after "all_gather: rank 2 holds every rank's buffer" all_gather 2 \
    "[0 1 2 3 100 101 102 103 200 201 202 203 300 301 302 303]" "$TMP/lesson"
expect_after "scatter: rank 1 has no send buffer" scatter 1 "-" "$TMP/lesson" before
expect_after "scatter: rank 2 gets chunk 2 of the root's buffer" scatter 2 "[8 9 10 11]" "$TMP/lesson"
expect_after "reduce_scatter: rank 1 gets chunk 1 of the sum" reduce_scatter 1 "[616 620 624 628]" "$TMP/lesson"
expect_after "all_to_all: rank 1 gets chunk 1 of every rank" all_to_all 1 \
    "[4 5 6 7 104 105 106 107 204 205 206 207 304 305 306 307]" "$TMP/lesson"
# 10: bitwise reductions on integers agree on flags.
expect_after "all_reduce bor: every rank learns which ranks are ready (13: rank 1 is not)" all_reduce 2 "[13 15]" "$TMP/lesson" bor
expect_after "all_reduce band: the features every rank supports (3)" all_reduce 1 "[0 3]" "$TMP/lesson" band
# 11: sub-groups: the even ranks sum over the even ones, the odd over the odd.
expect_after "sub-groups: rank 2 holds the sum over ranks 0 and 2, as group rank 1" sub-groups 2 "[2 1]" "$TMP/lesson"
expect_after "sub-groups: rank 1 holds the sum over ranks 1 and 3" sub-groups 1 "[4 1]" "$TMP/lesson"
# 12: all_to_all_v: rank r sends (2r + p + 1) mod 3 numbers to rank p, the
# counts first. Rank 1 gets 1 2 from rank 0, its own 100, nothing from rank
# 2, 301 302 from rank 3; rank 2 gets nothing from ranks 0 and 3.
expect_after "all_to_all_v: rank 2 learns the counts it will get [0 2 1 0]" all_to_all_v 2 "[0 2 1 0]" "$TMP/lesson" gets
expect_after "all_to_all_v: rank 1 gets each rank's block for it, in rank order" all_to_all_v 1 \
    "[1 2 100 301 302]" "$TMP/lesson"
expect_after "all_to_all_v: rank 2 gets 101 102 from rank 1 and its own 202" all_to_all_v 2 "[101 102 202]" "$TMP/lesson"
# barrier: rank 3 arrives 300 ms late; nobody leaves before (50 ms slack for
# the ranks' clocks starting a little apart).
times=$(for r in 0 1 2 3; do after_of barrier $r "$TMP/lesson" times; done | tr -d '[]' | tr '\n' ';')
awk -v t="$times" 'BEGIN { n = split(t, rows, ";"); late = 0
        for (i = 1; i < n; i++) { split(rows[i], v, " "); if (v[1] > late) late = v[1] }
        ok = late >= 290
        for (i = 1; i < n; i++) { split(rows[i], v, " "); if (v[2] < late - 50) ok = 0 }
        exit !(ok && n == 5) }'
verdict $? "03: barrier: no rank leaves before the last one arrives" "arrived, left per rank: $times"

run_capture 90 "$TMP/three" "$bin" --nprocs 3 --device cpu; status=$?
check "03: --nprocs 3 exits 0" test $status -eq 0
expect_after "--nprocs 3: all_reduce on rank 2 is [300 303 306 309]" all_reduce 2 "[300 303 306 309]" "$TMP/three"
expect_after "--nprocs 3: all_to_all on rank 2" all_to_all 2 "[8 9 10 11 108 109 110 111 208 209 210 211]" "$TMP/three"
expect_after "--nprocs 3: all_to_all_v on rank 0" all_to_all_v 0 "[0 200 201]" "$TMP/three"

# --- the benchmark. check_table FILE NAME: every row of every table has
# #wrong 0 and busbw = algbw x factor and algbw = size / time, where the
# factor comes from nccl-tests' table, not from the program's own header.
check_table() {
    local file=$1 why
    why=$(awk '
        /^# world size / { n = $4 }
        /^# [a-z_]+: (S = |no data)/ { c = $2; sub(/:$/, "", c); tables++ }
        /^# Out of bounds values : 0 OK/ { ok++ }
        /^ +[0-9]+ +[0-9]+ / {
            rows++; size = $1; t = $6; alg = $7; bus = $8; wrong = $9
            f = (n - 1) / n
            if (c == "all_reduce") f = 2 * (n - 1) / n
            if (c == "broadcast" || c == "reduce" || c == "all_to_all_v") f = 1
            if (c == "barrier") { f = 0; if (wrong != "N/A") printf "barrier #wrong %s; ", wrong; next }
            if (wrong != "0") printf "%s size %s: #wrong %s; ", c, size, wrong
            d = bus - alg * f; if (d < 0) d = -d
            if (d > 0.011 + 0.001 * bus) printf "%s size %s: busbw %s != algbw %s x %g; ", c, size, bus, alg, f
            # time has 2 decimals: allow its rounding (0.005 us) in the division
            want = t > 0 ? size / (t * 1e3) : 0; d = alg - want; if (d < 0) d = -d
            if (t > 0 && d > 0.006 + want * (0.002 + 0.006 / t)) printf "%s size %s: algbw %s != size / time = %g; ", c, size, alg, want
        }
        END { if (!rows) printf "no rows; "; printf "|%d tables %d OK", tables, ok }' "$file")
    echo "$why"
}

run_capture 120 "$TMP/bench" "$bin" --bench -b 8 -e 1M -f 8 -c 1 -n 5 -w 1 --nprocs 4; status=$?
check "03: --bench (all collectives, 4 ranks) exits 0" test $status -eq 0
result=$(check_table "$TMP/bench")
[[ "$result" == "|10 tables 9 OK" ]]; verdict $? "03: --bench: 10 tables, #wrong 0 everywhere, busbw = algbw x factor, algbw = size / time" "$result"
for line in "all_reduce 64 16" "all_gather 64 4" "reduce_scatter 64 4" "all_to_all 64 4" "gather 512 32" "broadcast 512 128"; do
    set -- $line
    awk -v c="$1" -v s="$2" -v k="$3" '/^# [a-z_]+: (S = |no data)/ { n = $2; sub(/:$/, "", n) }
        n == c && $1 == s && $2 == k { found = 1 } END { exit !found }' "$TMP/bench"
    verdict $? "03: $1 counts as nccl-tests does: size $2 B has count $3" "no such row"
done
# all_to_all_v, 4 ranks, count 4: rank r sends 2k/3 x 4 to rank r+k, rounded
# down, 0 + 2 + 5 + 8 = 15 elements, 60 B; busbw = algbw (every byte leaves).
awk '/^# [a-z_]+: (S = |no data)/ { n = $2; sub(/:$/, "", n) }
     n == "all_to_all_v" && $1 == 60 && $2 == 4 && $7 == $8 { found = 1 } END { exit !found }' "$TMP/bench"
verdict $? "03: all_to_all_v's uneven counts: size 64 B gives count 4, 0 + 2 + 5 + 8 = 15 floats sent (60 B), busbw = algbw" "no such row"
expect_output "03: --bench preamble states the method" "$TMP/bench" '^# method: per size, [0-9]+ warm-up ops, a barrier, then a host timer'
expect_output "03: --bench footer: average bus bandwidth" "$TMP/bench" '^# Avg bus bandwidth +: [0-9.e+-]+$'
[[ $(head -n 1 "$csv_dir/all_reduce.csv" 2>/dev/null) == "size_bytes,count,type,redop,root,time_us,algbw_GBps,busbw_GBps,wrong" ]] &&
   [[ $(grep -c '^[0-9]' "$csv_dir/all_reduce.csv") -eq 6 ]]
verdict $? "03: runs/03_collectives/all_reduce.csv has the columns and 6 rows" "$(head -n 3 "$csv_dir/all_reduce.csv" 2>/dev/null | tr '\n' '|')"

# The check itself: one wrong element on rank 1 per checked operation
# (COURSE_BENCH_CORRUPT_RANK) must show as #wrong = the check rounds on every
# row, FAILED in the footer, and a non-zero exit status.
corrupt_case() {
    local what=$1 want_rows=$2; shift 2
    COURSE_BENCH_CORRUPT_RANK=1 run_capture 60 "$TMP/corrupt" "$bin" --bench --nprocs 2 -b 64 -e 4K -f 8 -c 2 -n 2 -w 1 "$@"; local status=$?
    local wrongs; wrongs=$(awk '/^ +[0-9]+ +[0-9]+ / { printf "%s ", $9 }' "$TMP/corrupt")
    [[ $status -ne 0 && $status -ne 124 && "$wrongs" == "$want_rows" ]] &&
       grep -q '^# Out of bounds values : 6 FAILED$' "$TMP/corrupt" && grep -q '^# FAILED: 6 wrong values in all$' "$TMP/corrupt"
    verdict $? "03: --bench $what: a wrong element on rank 1 is counted in #wrong, and the run fails" \
        "status $status, #wrong per row '$wrongs' (want '$want_rows'): $(grep -E 'Out of bounds|FAILED' "$TMP/corrupt" | tr '\n' '|')"
}
corrupt_case "all_reduce" "2 2 2 " --collective all_reduce
corrupt_case "all_to_all" "2 2 2 " --collective all_to_all
corrupt_case "all_to_all_v" "2 2 2 " --collective all_to_all_v

# Other types, reductions, roots and world sizes: still exact.
bench_case() {
    local what=$1; shift
    run_capture 60 "$TMP/case" "$bin" --bench -b 8 -e 64K -f 16 -c 2 -n 2 -w 1 "$@"; local status=$?
    local result; result=$(check_table "$TMP/case")
    [[ $status -eq 0 && "$result" == \|* ]] && ! grep -q FAILED "$TMP/case"; verdict $? "03: --bench $what: #wrong 0" "status $status: $result"
}
bench_case "-d bfloat16 -o avg, 3 ranks" -d bfloat16 -o avg --nprocs 3
bench_case "-d half -o avg, 3 ranks" -d half -o avg --nprocs 3
bench_case "-d uint8 -o prod, 2 ranks" -d uint8 -o prod --nprocs 2 --collective all_reduce
bench_case "-d int32 -o avg (integer division), 3 ranks" -d int32 -o avg --nprocs 3 --collective reduce_scatter
bench_case "-d int64 -o max -r 2, 3 ranks" -d int64 -o max -r 2 --nprocs 3 --collective reduce
bench_case "-d double -o min -r 1, 2 ranks" -d double -o min -r 1 --nprocs 2 --collective scatter
bench_case "-d all -o all, 3 ranks: a row for each type and reduction" -d all -o all --nprocs 3
bench_case "-d uint8 -o bxor, 4 ranks" -d uint8 -o bxor --nprocs 4 --collective reduce_scatter
bench_case "-d int64 -o band -r 1, 3 ranks" -d int64 -o band -r 1 --nprocs 3 --collective reduce

# --- GPUs
if has_gpu; then
    run_capture 120 "$TMP/gpu" "$bin" --device cuda --nprocs 4 --bench -b 8 -e 1M -f 8 -n 5 -w 1; status=$?
    result=$(check_table "$TMP/gpu")
    [[ $status -eq 0 && "$result" == "|10 tables 9 OK" ]]; verdict $? "03: --device cuda --bench: #wrong 0 everywhere" "status $status: $result"
    # Every type and reduction, 2 and 4 ranks: each on its own GPU with nccl
    # (the emulated GPU has 8), or sharing one with the cpu backend, staged.
    for n in 2 4; do
        run_capture 300 "$TMP/gpu_all$n" "$bin" --device cuda --nprocs $n --bench -b 8 -e 64K -f 32 -c 1 -n 1 -w 0 \
            -d all -o all; status=$?
        result=$(check_table "$TMP/gpu_all$n")
        backend=$(head -n 1 "$TMP/gpu_all$n" | field - '\| backend: ([a-z]*)')
        rows=$(grep -cE '^ +[0-9]+ +[0-9]+ ' "$TMP/gpu_all$n")
        [[ $status -eq 0 && "$result" == "|10 tables 9 OK" && $rows -eq 523 ]]
        verdict $? "03: --device cuda --bench -d all -o all, $n ranks ($backend): $rows rows, #wrong 0 everywhere" "status $status, $rows rows: $result"
    done
    # Planted (tests/lib.sh, plant; a copy for the emulated GPU): the nccl
    # backend's all_to_all_v places the blocks it receives by the send
    # counts. Where every rank sends what it receives (all_to_all) nothing
    # shows; with the benchmark's uneven counts the small sizes must give
    # #wrong > 0, and the largest runs past the end of the receive buffer,
    # which the emulated GPU stops.
    if is_emu && [[ $(gpu_count) -ge 3 ]]; then
        planted=$(PLANT_CUDA=emu plant nccl_v_displacement common/pg_nccl.h 'recv_at += recv_counts[p];' \
            'recv_at += send_counts[p];' 03_collectives 03_collectives)
        status=none
        [[ -n $planted ]] && { run_capture 120 "$TMP/planted_nccl" "$planted" --device cuda --backend nccl --nprocs 3 \
            --bench -b 1K -e 64K -f 8 -c 1 -n 1 -w 0 --collective all_to_all_v; status=$?; }
        wrong=$(awk 'NF == 9 && $1 ~ /^[0-9]+$/ && $9 != 0' "$TMP/planted_nccl" 2>/dev/null | wc -l)
        [[ -n $planted && $status -ne 0 && $wrong -ge 1 ]]
        verdict $? "03 planted: nccl's all_to_all_v receive displacements from the send counts fail ($wrong rows with #wrong > 0, exit $status)" \
            "$(planted_why nccl_v_displacement)$(grep -E 'Out of bounds|error' "$TMP/planted_nccl" 2>/dev/null | head -n 2 | tr '\n' '|')"
    else
        skip "03 planted: nccl's all_to_all_v receive displacements from the send counts" "needs the emulated GPU (make CUDA=emu)"
    fi
else
    skip "03: --device cuda --bench: #wrong 0 everywhere" "no GPU on this machine"
    skip "03: --device cuda --bench -d all -o all, 2 and 4 ranks" "no GPU on this machine"
    skip "03 planted: nccl's all_to_all_v receive displacements from the send counts" "no GPU on this machine"
fi

# --- bad input: one line naming the flag, exit status 2
bad_flag() {
    local name=$1; shift
    run_capture 10 "$TMP/bad" "$bin" "$@"; local status=$?
    [[ $status -eq 2 ]] && grep -q "^03_collectives: error: " "$TMP/bad"; verdict $? "03: $name exits 2" "status $status: $(head -n 1 "$TMP/bad")"
}
bad_flag "-o xor" --bench -o xor
bad_flag "-o band -d float (bitwise needs integers)" --bench -o band -d float
bad_flag "-d float8" --bench -d float8
bad_flag "--collective allreduce" --bench --collective allreduce
bad_flag "-r 4 with 4 ranks" --bench --nprocs 4 -r 4
bad_flag "-b 0" --bench -b 0
bad_flag "-c -1" --bench -c -1

no_leftovers "03: no processes left behind" "$bin"
