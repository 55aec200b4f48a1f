#!/usr/bin/env bash
# tests/tools/test_nccl_tests.sh - an outside check of the emulated GPU:
# NVIDIA's nccl-tests, its sources unmodified, built against the emulated
# CUDA and NCCL (make -C emu nccl-tests), run on emulated GPUs with their
# own correctness check. Every row of every run must say #wrong 0, and the
# run must print one row per size (per type and operation, with -d all
# -o all) and end with its "Out of bounds values : 0 OK".
#
# nccl-tests is not part of the course (nor fetched by it): set
# NCCL_TESTS=/path/to/nccl-tests (a clone of github.com/NVIDIA/nccl-tests)
# to run this; without it the file says why it skips (CI has no network).
# A quick subset runs by default (all_reduce, all_gather, sendrecv on 2 and
# 4 GPUs of one thread, all_reduce on 2 threads, all_reduce with every type
# and operation on 2); with NCCL_TESTS_FULL=1 every collective runs on 2, 4
# and 8 GPUs, as GPUs of one thread and as threads of one GPU each, and
# all_reduce, reduce and reduce_scatter with every type and operation on 2
# and 4 (about 10 minutes: give it TEST_FILE_TIMEOUT=1800).
source "$(dirname "$0")/../lib.sh"

what="nccl-tests on the emulated GPU"
if [[ -z "${NCCL_TESTS:-}" ]]; then
    skip "$what" "NCCL_TESTS is not set (NCCL_TESTS=/path/to/nccl-tests, a clone of NVIDIA's nccl-tests; not fetched here)"
    exit 0
fi
if [[ ! -f "$NCCL_TESTS/src/common.cu" || ! -f "$NCCL_TESTS/verifiable/verifiable.cu" ]]; then
    skip "$what" "NCCL_TESTS=$NCCL_TESTS holds no nccl-tests sources (no src/common.cu, verifiable/verifiable.cu)"
    exit 0
fi
if [[ ${ASAN:-} == 1 ]]; then
    skip "$what" "nccl-tests is built with the race checker, which ASan builds go without (run it without ASAN=1)"
    exit 0
fi

full=${NCCL_TESTS_FULL:-0}
# The programs (empty: every collective of src/, as emu/Makefile builds by
# default), the GPU counts, and the programs run with every type and op.
if [[ $full == 1 ]]; then programs="" gpu_counts="2 4 8" every_type="all_reduce reduce reduce_scatter" every_type_gpus="2 4"
else programs="all_reduce all_gather sendrecv" gpu_counts="2 4" every_type="all_reduce" every_type_gpus="2"; fi
# build EMU_DIR OUT : nccl-tests' $programs built against the emulator in
# EMU_DIR, into OUT (never into the sources' folder).
build() {
    env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -s -C "$1" nccl-tests ASAN=0 \
        NCCL_TESTS="$NCCL_TESTS" NCCL_TESTS_OUT="$2" ${programs:+NCCL_TESTS_BINS="$programs"} >"$2.log" 2>&1
}
build "$ROOT/emu" "$TMP/nccl-tests"
verdict $? "nccl-tests builds against the emulated CUDA and NCCL" "$(grep -m3 -E 'error|Error' "$TMP/nccl-tests.log" | tr '\n' '|')"
[[ -x $TMP/nccl-tests/all_reduce_perf ]] || exit 1
[[ -n $programs ]] || programs=$(cd "$TMP/nccl-tests" && ls *_perf | sed 's/_perf$//' | tr '\n' ' ')

# rows_ok LOG ROWS : LOG, the output of one nccl-tests run, has ROWS result
# rows, each with #wrong 0 in every #wrong column that nccl-tests checked
# (it prints N/A where it checks nothing: sendrecv in place) and in one at
# least, and its summary line says 0 values out of bounds. Says what is
# wrong otherwise.
rows_ok() {
    awk -v want="$2" '
        # The columns counted from the end of the line: a row may leave a
        # field blank (hypercube has no redop).
        /^#/ && /#wrong/ { for (i = 2; i <= NF; i++) if ($i == "#wrong") from_end[++ncols] = NF - i; next }
        /^ *[0-9]+ / { rows++
            if (ncols == 0) { print "a result row before the header that names the #wrong columns"; bad = 1; exit }
            checked = 0
            for (c = 1; c <= ncols; c++) {
                wrong = $(NF - from_end[c])
                if (wrong == "N/A") continue
                if (wrong != "0") { print "#wrong is " wrong " in: " $0; bad = 1; exit }
                checked++ }
            if (!checked) { print "no #wrong column was checked in: " $0; bad = 1; exit } }
        /^# Out of bounds values : 0 OK/ { summary = 1 }
        END { if (bad) exit 1
              if (ncols < 2) { print "no header naming the #wrong columns (out-of-place and in-place)"; exit 1 }
              if (rows != want) { print rows + 0 " result rows, wanted " want; exit 1 }
              if (!summary) { print "no \"# Out of bounds values : 0 OK\" line"; exit 1 } }' "$1"
}

# sizes MIN MAX FACTOR : how many sizes nccl-tests steps through (MIN,
# MIN x FACTOR, ... up to MAX), one result row each.
sizes() { local n=0 s; for ((s = $1; s <= $2; s *= $3)); do n=$((n + 1)); done; echo "$n"; }

# run_nccl NAME ROWS PROGRAM ARGS... : one run; it must exit 0 with ROWS
# good rows. Its output goes to $log (run1.log, run2.log, ...). -p 1: the
# threads create their communicators and buffers in parallel, what an
# emulated NCCL before 2.19 needs (emu/README.md).
runs=0
run_nccl() {
    local name=$1 rows=$2 program=$3 status why
    shift 3
    runs=$((runs + 1)) log=$TMP/run$runs.log
    local start=$SECONDS
    run_capture 300 "$log" "$TMP/nccl-tests/${program}_perf" -p 1 -w 1 -n 2 "$@"; status=$?
    echo "time: $program $* took $((SECONDS - start)) s, $(grep -cE '^ *[0-9]+ ' "$log") rows"   # a note, not a test
    why=$(rows_ok "$log" "$rows")
    [[ $status -eq 0 && -z $why ]]
    verdict $? "nccl-tests $name" "status $status, ${why:-}: $(tail -n 2 "$log" | tr '\n' '|')"
}

sized=(-b 8 -e 64K -f 4)
rows=$(sizes 8 65536 4)
for gpus in $gpu_counts; do
    for program in $programs; do
        # hypercube's rounds depend on each other (each sends on what the
        # last received; 2 ranks have one round). With several GPUs in one
        # thread nccl-tests puts all of them in one group, where NCCL orders
        # sends and receives only between the same two ranks; the emulator
        # runs them in another legal order, and the check fails. One GPU
        # per thread keeps the rounds apart.
        if [[ $program == hypercube && $gpus -gt 2 ]]; then
            skip "nccl-tests hypercube, $gpus GPUs in one thread" "its rounds, which depend on each other, fall into one group, where NCCL promises an order only per pair of ranks (it runs with one GPU per thread)"
        else
            run_nccl "$program, $gpus GPUs in one thread, #wrong 0" "$rows" "$program" "${sized[@]}" -g "$gpus"
        fi
        [[ $full == 1 ]] && run_nccl "$program, $gpus threads of one GPU each, #wrong 0" "$rows" "$program" "${sized[@]}" -t "$gpus" -g 1
    done
done
[[ $full == 1 ]] || run_nccl "all_reduce, 2 threads of one GPU each, #wrong 0" "$rows" all_reduce "${sized[@]}" -t 2 -g 1

# Every type and every operation: as many rows as sizes x types x
# operations, and the types and operations NCCL 2.18 has all among them.
types="int8 uint8 int32 uint32 int64 uint64 half float double bfloat16"
ops="sum prod max min avg mulsum"
for gpus in $every_type_gpus; do
    for program in $every_type; do
        run_nccl "$program, every type and operation, $gpus GPUs, #wrong 0" \
            $(( $(sizes 8 128 4) * $(wc -w <<<"$types") * $(wc -w <<<"$ops") )) "$program" -b 8 -e 128 -f 4 -d all -o all -g "$gpus"
        seen=$(awk '/^ *[0-9]+ / { print $3; print $4 }' "$log" | sort -u | tr '\n' ' ')
        missing=""
        for name in $types $ops; do [[ " $seen" == *" $name "* ]] || missing+=" $name"; done
        [[ -z $missing ]]; verdict $? "nccl-tests $program -d all -o all on $gpus GPUs covers every type and operation" "missing:$missing (seen: $seen)"
    done
done

# ---------------------------------------------------------------- planted bugs
# The row check must see a row gone (a run cut short): the first run's log
# with one result row dropped fails it.
awk '/^ *[0-9]+ / && !dropped { dropped = 1; next } 1' "$TMP/run1.log" >"$TMP/dropped.log"
why=$(rows_ok "$TMP/dropped.log" "$rows")
[[ $why == *"result rows, wanted $rows"* ]]
verdict $? "nccl-tests planted: a missing result row is caught" "rows_ok said '$why'"

# The emulated NCCL's reduction leaving out the last rank (a copy of emu/
# with the bug planted, nccl-tests built against it): nccl-tests' own check
# must count wrong values, and this test must fail the run.
planted=$TMP/planted-emu
mkdir -p "$planted" && cp -r "$ROOT/emu/src" "$ROOT/emu/include" "$ROOT/emu/tools" "$ROOT/emu/Makefile" "$planted/"
old='for (int r = 1; r < comm->nranks; r++) red->combine'
new='for (int r = 1; r < comm->nranks - 1; r++) red->combine'
count=$(grep -cF -- "$old" "$planted/src/nccl_reduce.c")
if [[ $count -ne 1 ]]; then
    fail "nccl-tests planted: a reduction that leaves out the last rank is caught" \
        "the planted bug's text occurs $count times in emu/src/nccl_reduce.c, not once: move the planted bug with the code"
else
    sed -i "s/r < comm->nranks; r++) red->combine/r < comm->nranks - 1; r++) red->combine/" "$planted/src/nccl_reduce.c"
    grep -qF -- "$new" "$planted/src/nccl_reduce.c" && programs=all_reduce build "$planted" "$TMP/planted-out"
    status=$?
    log=$TMP/planted.log
    if [[ $status -ne 0 ]]; then
        fail "nccl-tests planted: a reduction that leaves out the last rank is caught" \
            "the planted copy did not build: $(grep -m3 -E 'error|Error' "$TMP/planted-out.log" | tr '\n' '|')"
    else
        run_capture 300 "$log" "$TMP/planted-out/all_reduce_perf" -p 1 -w 1 -n 2 "${sized[@]}" -g 2; status=$?
        why=$(rows_ok "$log" "$rows")
        [[ $status -ne 0 && $why == "#wrong is "[1-9]* ]]
        verdict $? "nccl-tests planted: a reduction that leaves out the last rank is caught" \
            "status $status, rows_ok said '$why': $(tail -n 2 "$log" | tr '\n' '|')"
    fi
fi
no_leftovers "nccl-tests: no process left behind" "$TMP/"
