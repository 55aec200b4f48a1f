#!/usr/bin/env bash
# tests/run.sh - run every tests/test_*.sh and count the results.
#
# Usage: tests/run.sh [PATTERN]   (PATTERN picks test files by name)
# Each test file prints PASS/FAIL/SKIP lines (see tests/lib.sh). A test file
# that exits non-zero or times out without saying FAIL counts as one failure,
# so a crash can never look like a pass. The last line is the summary:
#   N passed, N failed, N skipped
set -u
cd "$(dirname "$0")/.." || exit 1
pattern=${1:-}
per_file_limit=${TEST_FILE_TIMEOUT:-900}
log_dir=runs/test-logs
mkdir -p "$log_dir"

passed=0 failed=0 skipped=0
failures=() skips=()
for file in tests/test_*.sh; do
    name=$(basename "$file" .sh)
    [[ -n "$pattern" && "$name" != *$pattern* ]] && continue
    log="$log_dir/$name.log"
    start=$(date +%s)
    timeout -k 10 "$per_file_limit" bash "$file" >"$log" 2>&1
    status=$?
    secs=$(( $(date +%s) - start ))
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log"); s=$(grep -c '^SKIP ' "$log")
    while IFS= read -r line; do failures+=("$name: ${line#FAIL }"); done < <(grep '^FAIL ' "$log")
    while IFS= read -r line; do skips+=("$name: ${line#SKIP }"); done < <(grep '^SKIP ' "$log")
    if [[ $status -ne 0 && $f -eq 0 ]]; then
        f=1
        why="exited with status $status"; [[ $status -eq 124 ]] && why="timed out after ${per_file_limit}s"
        failures+=("$name: $why; see $log")
    fi
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    printf '%-28s %3d passed %3d failed %3d skipped  (%ds)\n' "$name" "$p" "$f" "$s" "$secs"
done

if [[ ${#skips[@]} -gt 0 ]]; then
    echo; echo "skipped:"; printf '  %s\n' "${skips[@]}"
fi
if [[ ${#failures[@]} -gt 0 ]]; then
    echo; echo "failed (logs in $log_dir/):"; printf '  %s\n' "${failures[@]}"
fi
echo
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
