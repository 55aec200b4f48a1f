#!/usr/bin/env bash
# tests/fuzz/run.sh - `make fuzz`: build every fuzz target with clang's
# libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer, and run each
# for FUZZ_SECONDS (default 180) from its seeds and regression inputs.
# Prints one line per target (executions, corpus size, result) and exits
# non-zero when a target found a crash, naming the file that reproduces it.
#
# Usage: tests/fuzz/run.sh [TARGET...]     (FUZZ_SECONDS=600, FUZZ_CC=clang-14)
set -u
cd "$(dirname "$0")" || exit 1
seconds=${FUZZ_SECONDS:-180}
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(json snapshot tokenizer wikitext flags store gpt_weights)
if ! [[ $seconds =~ ^[0-9]+$ ]] || [[ $seconds -lt 1 ]]; then
    echo "fuzz: FUZZ_SECONDS must be a whole number of seconds, got '$seconds'" >&2
    exit 2
fi

# A clang that can link libFuzzer: FUZZ_CC, else clang, else a versioned one.
links_libfuzzer() {
    printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' |
        "$1" -fsanitize=fuzzer,address,undefined -x c - -o /dev/null 2>/dev/null
}
cc=""
for candidate in ${FUZZ_CC:-} clang clang-19 clang-18 clang-17 clang-16 clang-15 clang-14; do
    if command -v "$candidate" >/dev/null && links_libfuzzer "$candidate"; then cc=$candidate; break; fi
done
if [[ -z $cc ]]; then
    echo "fuzz: no clang that links libFuzzer was found (on Debian 12: apt-get install clang-14 libclang-rt-14-dev; or set FUZZ_CC)" >&2
    exit 1
fi

if ! make -s libfuzzer FUZZ_CC="$cc" TARGETS="${targets[*]}" >build.log 2>&1; then
    echo "fuzz: building the targets with $cc failed:" >&2
    grep -m5 -E 'error|Error' build.log >&2
    exit 1
fi
rm -f build.log

# Per target: the longest input worth trying (text files need room for long lines).
max_len() {
    case $1 in
        tokenizer) echo 65536 ;;
        wikitext) echo 131072 ;;
        *) echo 8192 ;;
    esac
}

echo "fuzz: $cc, ${seconds} s per target; logs, corpora and crashes under tests/fuzz/build/"
printf '%-12s %12s %10s %8s  %s\n' target executions execs/s corpus result
crashed=0
for t in "${targets[@]}"; do
    work=build/corpus/$t artifacts=build/artifacts/$t log=build/logs/$t.log
    mkdir -p "$work" "$artifacts" build/logs regressions/"$t"
    # The first directory collects what the fuzzer finds; the others are only read.
    build/libfuzzer/fuzz_"$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="$(max_len "$t")" \
        -print_final_stats=1 -artifact_prefix="$artifacts/" "$work" corpus/"$t" regressions/"$t" >"$log" 2>&1
    status=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    units=$(find "$work" corpus/"$t" regressions/"$t" -type f | wc -l)
    if [[ $status -eq 0 ]]; then
        result=ok
    else
        crashed=$((crashed + 1))
        file=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
        why=$(grep -m1 -E 'ERROR: (AddressSanitizer|libFuzzer|UndefinedBehaviorSanitizer)|runtime error|fuzz invariant broken' "$log")
        result="FOUND: ${why:-exit status $status} -> tests/fuzz/${file:-$log} (log: tests/fuzz/$log)"
    fi
    printf '%-12s %12s %10s %8s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "$units" "$result"
done
if [[ $crashed -gt 0 ]]; then
    echo "fuzz: $crashed target(s) found a crash; reproduce with tests/fuzz/build/libfuzzer/fuzz_NAME FILE, fix it, and keep FILE in tests/fuzz/regressions/NAME/"
    exit 1
fi
echo "fuzz: no crash in ${#targets[@]} target(s)"
