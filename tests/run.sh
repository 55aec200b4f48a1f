#!/usr/bin/env bash
# tests/run.sh - run the test files and count the results.
#
# The tests live in folders named by what they test:
#   tests/chapters/  a chapter's program (test_NN_*.sh)
#   tests/library/   a header of common/ (the store, the process group, ...)
#   tests/tools/     ddprun, the emulated GPU
#   tests/course/    the course as a whole: the READMEs' commands, the
#                    exercises, the tables, this runner
# Usage: tests/run.sh [NAME...]   (make test TESTS="NAME...")
# With no NAME every test file runs. Each NAME picks the files whose path
# below tests/ contains it (flags -> library/test_flags.sh; gpt -> every
# chapters/test_08_gpt_*.sh; library -> the whole folder); a NAME that picks
# no file is an error, so a typo never looks like a green run.
# Each test file prints PASS/FAIL/SKIP lines (see tests/lib.sh). A test file
# that exits non-zero or times out without saying FAIL counts as one failure,
# so a crash can never look like a pass. The last line is the summary:
#   N passed, N failed, N skipped
# TEST_FILE_TIMEOUT (seconds; default 600, 1800 under make asan) bounds each file; TEST_DIR (default
# tests/) is where the files are looked for (the harness's own test uses it).
# TEST_JOBS=N runs N files at a time (see below).
# TEST_SKIP="NAME..." (matched as NAMEs are) leaves those files out of this
# run, each one SKIP line saying TEST_SKIP_WHY: CI runs a file whose code is
# the same in every build in one of its passes only (.ci/run).
set -u
cd "$(dirname "$0")/.." || exit 1
test_dir=${TEST_DIR:-tests}
default_limit=600; [[ "${ASAN:-0}" == 1 ]] && default_limit=1800   # sanitizers are ~5x slower
per_file_limit=${TEST_FILE_TIMEOUT:-$default_limit}
log_dir=${COURSE_RUNS_DIR:-runs}/test-logs
mkdir -p "$log_dir" || exit 1

# The files to run: every one, or those that some NAME picks, in order.
files=()
where() { local path=${1#"$test_dir"/}; echo "${path%.sh}"; }   # library/test_store
for file in "$test_dir"/test_*.sh "$test_dir"/{chapters,library,tools,course}/test_*.sh; do
    [[ -e "$file" ]] || continue
    if [[ $# -eq 0 ]]; then files+=("$file"); continue; fi
    for pattern in "$@"; do
        if [[ "$(where "$file")" == *"$pattern"* ]]; then files+=("$file"); break; fi
    done
done
for pattern in "$@"; do
    found=0
    for file in "${files[@]}"; do [[ "$(where "$file")" == *"$pattern"* ]] && found=1; done
    if [[ $found -eq 0 ]]; then
        echo "tests/run.sh: no test file in $test_dir/ matches '$pattern'; the files are:" >&2
        (cd "$test_dir" && ls test_*.sh */test_*.sh 2>/dev/null | sed 's/^/  /; s/\.sh$//') >&2
        exit 2
    fi
done

passed=0 failed=0 skipped=0
failures=() skips=()
skipped_here() {   # FILE: does TEST_SKIP name it?
    local pattern
    for pattern in ${TEST_SKIP:-}; do [[ "$(where "$1")" == *"$pattern"* ]] && return 0; done
    return 1
}
# A file may ask for more time with a line "# time limit: N s" (when
# TEST_FILE_TIMEOUT is not set): test_readme builds a fresh copy per chapter.
own_limit() { sed -n 's/^# time limit: \([0-9][0-9]*\) s.*/\1/p' "$1" | head -n 1; }
log_of() { echo "$log_dir/$(basename "$1" .sh).log"; }
limit_of() {
    local own; own=$(own_limit "$1")
    if [[ -z ${TEST_FILE_TIMEOUT:-} && -n $own ]] && (( own > per_file_limit )); then echo "$own"; else echo "$per_file_limit"; fi
}

# TEST_JOBS=N runs N files at a time (default 1). Most files wait more than
# they compute (ranks meeting, timeouts, processes killed on purpose), so two
# at a time on two cores take less time; results are still reported in
# order. Files that ask for a long limit start first.
jobs_max=${TEST_JOBS:-1}
[[ $jobs_max =~ ^[1-9][0-9]*$ ]] || { echo "tests/run.sh: TEST_JOBS must be a number from 1, not '$jobs_max'" >&2; exit 2; }
done_dir=$(mktemp -d) || exit 1
trap 'rm -rf "$done_dir"' EXIT
run_one() {   # INDEX FILE: runs it into its log, then leaves "STATUS SECONDS" in done_dir
    local start status
    start=$(date +%s)
    timeout -k 10 "$(limit_of "$2")" bash "$2" >"$(log_of "$2")" 2>&1
    status=$?
    echo "$status $(( $(date +%s) - start ))" >"$done_dir/$1.tmp" && mv "$done_dir/$1.tmp" "$done_dir/$1"
}
report() {   # INDEX: counts and prints a finished (or skipped) file
    local file=${files[$1]} name log status secs p f s line why limit
    name=$(where "$file")                        # e.g. library/test_store
    read -r status secs <"$done_dir/$1"
    if [[ $status == skip ]]; then
        skipped=$((skipped + 1))
        skips+=("$name: the whole file: ${TEST_SKIP_WHY:-TEST_SKIP names it}")
        printf '%-36s %3d passed %3d failed %3d skipped  (TEST_SKIP)\n' "$name" 0 0 1
        return
    fi
    log=$(log_of "$file") limit=$(limit_of "$file")
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log"); s=$(grep -c '^SKIP ' "$log")
    while IFS= read -r line; do failures+=("$name: ${line#FAIL }"); done < <(grep '^FAIL ' "$log")
    while IFS= read -r line; do skips+=("$name: ${line#SKIP }"); done < <(grep '^SKIP ' "$log")
    if [[ $status -ne 0 && $f -eq 0 ]]; then
        f=1
        why="exited with status $status"; [[ $status -eq 124 || $status -eq 137 ]] && why="timed out after ${limit}s"
        failures+=("$name: $why; see $log")
    fi
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    printf '%-36s %3d passed %3d failed %3d skipped  (%ds)\n' "$name" "$p" "$f" "$s" "$secs"
}
next=0
flush() {   # prints the finished files, in order, up to the first still running
    while (( next < ${#files[@]} )) && [[ -e $done_dir/$next ]]; do report "$next"; next=$((next + 1)); done
}
order=("${!files[@]}")
if (( jobs_max > 1 )); then
    order=()
    for i in "${!files[@]}"; do [[ -n $(own_limit "${files[$i]}") ]] && order+=("$i"); done
    for i in "${!files[@]}"; do [[ -z $(own_limit "${files[$i]}") ]] && order+=("$i"); done
fi
running=0
for i in "${order[@]}"; do
    if skipped_here "${files[$i]}"; then echo skip >"$done_dir/$i"; flush; continue; fi
    while (( running >= jobs_max )); do wait -n; running=$((running - 1)); flush; done
    run_one "$i" "${files[$i]}" &
    running=$((running + 1))
done
wait
flush

if [[ ${#skips[@]} -gt 0 ]]; then
    echo; echo "skipped:"; printf '  %s\n' "${skips[@]}"
fi
if [[ ${#failures[@]} -gt 0 ]]; then
    echo; echo "failed (logs in $log_dir/):"; printf '  %s\n' "${failures[@]}"
fi
echo
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
