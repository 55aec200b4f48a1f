#!/usr/bin/env bash
# tests/course/test_harness.sh - the test harness itself: tests/run.sh runs every
# name it is given and counts crashes and timeouts as failures; the build
# mode a make was given sticks, so that a test's own `make` never rebuilds
# the tree in another mode (see common/detect.mk).
source "$(dirname "$0")/../lib.sh"

# ---------------------------------------------------------------- tests/run.sh
# Stub test files in a folder of their own (TEST_DIR), logs under $TMP.
stubs=$TMP/stubs
mkdir -p "$stubs"
printf 'echo "PASS a1"\necho "PASS a2"\n' >"$stubs/test_alpha.sh"
printf 'echo "PASS b1"\necho "SKIP b2: not here"\n' >"$stubs/test_beta.sh"
printf 'echo "PASS c1"\nexit 3\n' >"$stubs/test_crash.sh"
printf 'echo "PASS h1"\nsleep 60\n' >"$stubs/test_hang.sh"
printf 'sleep 4\necho "PASS s1"\n' >"$stubs/test_slow1.sh"
printf 'sleep 3\necho "PASS s2"\necho "FAIL s3: planted"\n' >"$stubs/test_slow2.sh"
harness() { # OUT [ENV=VALUE ...] -- NAMES...
    local out=$1; shift
    local envs=()
    while [[ $1 != -- ]]; do envs+=("$1"); shift; done
    shift
    env TEST_DIR="$stubs" COURSE_RUNS_DIR="$TMP/runs" "${envs[@]}" timeout -k 5 60 "$ROOT/tests/run.sh" "$@" >"$out" 2>&1
}

harness "$TMP/two" -- alpha beta; status=$?
[[ $status -eq 0 && "$(tail -n 1 "$TMP/two")" == "3 passed, 0 failed, 1 skipped" ]] &&
   grep -q '^test_alpha ' "$TMP/two" && grep -q '^test_beta ' "$TMP/two" && ! grep -q '^test_crash ' "$TMP/two"
verdict $? "harness: run.sh alpha beta runs both files, and only them" "status $status: $(tr '\n' '|' <"$TMP/two")"

harness "$TMP/crash" -- crash; status=$?
[[ $status -ne 0 && "$(tail -n 1 "$TMP/crash")" == "1 passed, 1 failed, 0 skipped" ]] &&
   grep -q 'test_crash: exited with status 3' "$TMP/crash"
verdict $? "harness: a file that exits non-zero without FAIL counts as a failure" "status $status: $(tail -n 3 "$TMP/crash" | tr '\n' '|')"

start=$SECONDS
harness "$TMP/hang" TEST_FILE_TIMEOUT=2 -- hang; status=$?
took=$((SECONDS - start))
[[ $status -ne 0 && $took -lt 30 ]] && grep -q 'test_hang: timed out after 2s' "$TMP/hang" &&
   [[ "$(tail -n 1 "$TMP/hang")" == "1 passed, 1 failed, 0 skipped" ]]
verdict $? "harness: a file that hangs is stopped at TEST_FILE_TIMEOUT and fails" "status $status after $took s: $(tail -n 3 "$TMP/hang" | tr '\n' '|')"

harness "$TMP/typo" -- alpha no_such_test; status=$?
[[ $status -eq 2 ]] && grep -q "no test file in .* matches 'no_such_test'" "$TMP/typo" && ! grep -q '^test_alpha ' "$TMP/typo"
verdict $? "harness: a name that matches no test file is an error, not a green run" "status $status: $(head -n 2 "$TMP/typo" | tr '\n' '|')"

# TEST_JOBS=2: two files at a time (the 4 s and the 3 s sleeper overlap),
# reported in the files' order, not the order they finish in.
start=$SECONDS
harness "$TMP/jobs" TEST_JOBS=2 -- slow alpha; status=$?
took=$((SECONDS - start))
[[ $status -ne 0 && $took -lt 7 && "$(tail -n 1 "$TMP/jobs")" == "4 passed, 1 failed, 0 skipped" ]] &&
   [[ "$(grep -o '^test_[a-z0-9]*' "$TMP/jobs" | tr '\n' ' ')" == "test_alpha test_slow1 test_slow2 " ]] &&
   grep -q 'test_slow2: s3: planted' "$TMP/jobs"
verdict $? "harness: TEST_JOBS=2 runs two files at once and reports them in order ($took s for sleeps of 4 and 3 s)" "status $status after $took s: $(tr '\n' '|' <"$TMP/jobs")"

harness "$TMP/skipfile" TEST_SKIP=beta "TEST_SKIP_WHY=ran elsewhere" -- alpha beta; status=$?
[[ $status -eq 0 && "$(tail -n 1 "$TMP/skipfile")" == "2 passed, 0 failed, 1 skipped" ]] &&
   grep -q 'test_beta: the whole file: ran elsewhere' "$TMP/skipfile" && ! grep -q 'test_beta: b2' "$TMP/skipfile"
verdict $? "harness: TEST_SKIP leaves a file out as one SKIP with TEST_SKIP_WHY" "status $status: $(tr '\n' '|' <"$TMP/skipfile")"

# PLANTED_BUGS=skip: a planted-bug case SKIPs with the reason, builds
# nothing, and never passes; any other failing case still fails.
got=$(PLANTED_BUGS=skip; bin=$(plant none tests/Makefile x y tests no_target); [[ -n $bin ]]
      verdict $? "planted case" "$(planted_why none)more"; verdict 1 "other case" "why"; ls "$TMP/plant-none" 2>&1 | head -c 0)
[[ "$(tr '\n' '|' <<<"$got")" == "SKIP planted case: $PLANT_SKIPPED|FAIL other case: why|" ]]
verdict $? "harness: PLANTED_BUGS=skip turns a planted-bug case into a SKIP saying why, and nothing else" "got: $(tr '\n' '|' <<<"$got")"

# ---------------------------------------------------------------- lib.sh's verdicts
# The helpers every test file states its cases with, on inputs whose answers
# are known: a helper that passed what it should fail would turn whole
# test files green.
# verdict's own case is reported with pass and fail: a verdict that passed
# everything would pass its own case.
got=$(verdict 0 "case a" "why a"; verdict 1 "case b" "why b"; verdict "case c" "why c"; echo "returned $?")
want="PASS case a|FAIL case b: why b|FAIL case c: verdict's first argument must be the condition's exit status (\$?), before the name|returned 0|"
if [[ "$(tr '\n' '|' <<<"$got")" == "$want" ]]; then pass "harness: verdict says PASS or FAIL with the detail, and refuses a first argument that is not \$?"
else fail "harness: verdict says PASS or FAIL with the detail, and refuses a first argument that is not \$?" "got: $(tr '\n' '|' <<<"$got")"; fi

# near_case WANT A B ATOL [RTOL]: adds to $wrong when near A B ... does not answer WANT.
wrong=""
near_case() { local want=$1 got=no; shift; near "$@" && got=yes; [[ $got == "$want" ]] || wrong+=" near $*: $got;"; }
near_case yes 1.96 2 0.05            # absolute
near_case no  1.94 2 0.05
near_case yes 2.04 2 0.05
near_case no  2.06 2 0.05
near_case yes 100.1 100 0 1e-3       # relative, to the larger
near_case no  100.2 100 0 1e-3
near_case yes -100.1 -100 0 1e-3
near_case yes 100.2 100 0.1 1e-3     # both: 0.1 + 0.1002
near_case no  100.3 100 0.1 1e-3
near_case yes -1e-05 1.5e-05 3e-5    # signs and exponents
near_case no  -1 1 1.5
near_case no  "" 0 1                 # a missing value is never near
near_case no  nan nan 1
near_case no  1.0x 1 1
[[ -z "$wrong" ]]; verdict $? "harness: near with an absolute, a relative and both tolerances; never near for no number" "wrong:$wrong"
got=$(expect_near "w" 1.93 2.0 0.05; expect_near "v" 1.99 2.0 0.05; expect_near "r" 101 100 0 1e-3)
want="FAIL w: got '1.93', wanted 2.0 within 0.05|PASS v|FAIL r: got '101', wanted 100 within 0 + 1e-3 x the larger|"
[[ "$(tr '\n' '|' <<<"$got")" == "$want" ]]; verdict $? "harness: expect_near says what it got and wanted" "got: $(tr '\n' '|' <<<"$got")"

printf 'learned weight: 1.5 (true 2)\nother\nlearned weight: 2.5\n[rank 0]: final weight 1.99  bias 3.01 | step 2/4\n' >"$TMP/field.txt"
got="$(field "$TMP/field.txt" '^learned weight: ([-0-9.]*)')|$(field --all "$TMP/field.txt" '^learned weight: ([-0-9.]*)' | tr '\n' ' ')"
got+="|$(field "$TMP/field.txt" 'final weight ([0-9.]*)  bias ([0-9.]*) \| step 2/4' '\2 \1')|$(field "$TMP/field.txt" 'no (such) line')"
got+="|$(echo 'a (b) c' | field - '\((.)\)')"
want="2.5|1.5 2.5 |3.01 1.99||b"
[[ "$got" == "$want" ]]; verdict $? "harness: field reads the last match (--all: each), its groups as the template puts them, nothing when none" "got '$got', wanted '$want'"

# ---------------------------------------------------------------- the build mode sticks
# A small project built by common/course.mk: `make CUDA=0`, then `make` and
# `make -C sub` that name no mode must keep the CPU-only build: nothing may
# be rebuilt or deleted. (Where CUDA is not found, CPU-only is what make
# detects anyway, so a mode that does not stick could not show.)
proj=$TMP/proj
mkdir -p "$proj/sub"
cp -r "$ROOT/common" "$proj/common"
printf 'int main(void) { return 0; }\n' >"$proj/sub/hello.c"
printf 'PROGRAMS := hello\ninclude ../common/course.mk\n' >"$proj/sub/Makefile"
# The environment of a student's shell: no make of ours around this one.
plain_make() { env -u CUDA -u ASAN -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u COURSE_DETECTED -u COURSE_MODE_SHOWN make "$@"; }
detected=$(plain_make -C "$proj/sub" -n 2>&1 | field - '^\[build\] mode: *(.*)')
if [[ "$detected" != "CUDA build"* ]]; then
    skip "harness: the build mode sticks" "no CUDA toolkit here: make detects the CPU-only mode anyway"
elif ! plain_make -s -C "$proj/sub" CUDA=0 >"$TMP/mode0.log" 2>&1; then
    fail "harness: make CUDA=0 builds a small project" "$(tail -n 3 "$TMP/mode0.log" | tr '\n' '|')"
else
    # Everything built is made old (sources older still): a rebuild would show as a new date.
    touch -d '2019-01-01' "$proj/sub/hello.c" "$proj/common"/*
    touch -d '2020-01-01' "$proj/sub/hello" "$proj/sub/build"/*
    plain_make -C "$proj/sub" >"$TMP/mode-again.log" 2>&1; status=$?
    [[ $status -eq 0 && -x "$proj/sub/hello" && $(stat -c %Y "$proj/sub/hello") -eq $(date -d '2020-01-01' +%s) ]] &&
       grep -q '^\[build\] mode: *CPU-only build (CUDA=0 kept from an earlier make' "$TMP/mode-again.log"
    verdict $? "harness: after make CUDA=0, a make that names no mode keeps the CPU-only build" \
        "status $status; $(grep -E '^\[build\] mode|^cc|rm ' "$TMP/mode-again.log" | head -n 3 | tr '\n' '|')"
fi
