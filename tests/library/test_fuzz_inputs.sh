#!/usr/bin/env bash
# tests/library/test_fuzz_inputs.sh - every fuzz target (tests/fuzz/) replays its
# seed corpus and every regression input: the inputs that once crashed a
# parser or broke a promise must keep being handled. Built with the course's
# compiler (no clang needed), with the sanitizers under `make asan`.
source "$(dirname "$0")/../lib.sh"
FUZZ=$ROOT/tests/fuzz
targets=(json snapshot tokenizer wikitext flags store gpt_weights)
replay=$FUZZ/build/replay$([[ ${ASAN:-} == 1 ]] && echo -asan)

if ! make -C "$FUZZ" -s replay >"$TMP/build.log" 2>&1; then
    fail "fuzz inputs: build" "make -C tests/fuzz replay failed: $(grep -m3 -E 'error|Error' "$TMP/build.log" | tr '\n' '|')"
    exit 1
fi
for t in "${targets[@]}"; do
    dirs=("$FUZZ/corpus/$t")
    [[ -d $FUZZ/regressions/$t ]] && dirs+=("$FUZZ/regressions/$t")
    seeds=$(find "$FUZZ/corpus/$t" -type f | wc -l)
    regressions=$(find "$FUZZ/regressions/$t" -type f 2>/dev/null | wc -l)
    FUZZ_REPLAY_VERBOSE=1 run_capture 120 "$TMP/$t.log" "$replay/fuzz_$t" "${dirs[@]}"
    status=$?
    [[ $status -eq 0 && $seeds -gt 0 ]] && grep -q "^fuzz_$t: replayed $((seeds + regressions)) inputs$" "$TMP/$t.log"
    verdict $? "fuzz inputs: $t handles its $seeds seeds and $regressions regression inputs" \
        "status $status on $(grep '^replaying ' "$TMP/$t.log" | tail -n 1 | cut -c11-): $(grep -v '^replaying ' "$TMP/$t.log" | grep -m2 -E 'ERROR|error|invariant|Abort' | tr '\n' '|')"
done
