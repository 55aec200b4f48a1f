# The 16-bit floats (common/pg_types.h): bf16 and fp16 to and from float32.
source "$(dirname "$0")/../lib.sh"
make -C "$ROOT/tests" -s unit/test_float16 >"$TMP/build.log" 2>&1 ||
    { fail "float16: build" "make -C tests failed: $(grep -m3 -E 'error|Error' "$TMP/build.log" | tr '\n' '|')"; exit 1; }
"$ROOT/tests/unit/test_float16"
# Planted (tests/lib.sh, plant): ties rounded up instead of to even.
planted=$(plant ties_up common/pg_types.h 'if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;' \
    'if (rest >= 0x1000u) h++;' tests unit/test_float16)
[[ -n $planted ]] && ! "$planted" >"$TMP/planted.log" 2>&1 &&
    grep -q '^FAIL float16: fp16 rounding at the edges' "$TMP/planted.log"
verdict $? "planted: fp16 ties rounded up instead of to even fail the edge cases" \
    "$(planted_why ties_up)$(grep -m3 -E '^(FAIL|info)' "$TMP/planted.log" 2>/dev/null | tr '\n' '|')"
