# PowerSGD (common/powersgd.h): low-rank gradient compression on 2 and 3 ranks.
source "$(dirname "$0")/../lib.sh"
make -C "$ROOT/tests" -s unit/test_powersgd >"$TMP/build.log" 2>&1 ||
    { fail "powersgd: build" "make -C tests failed: $(grep -m3 -E 'error|Error' "$TMP/build.log" | tr '\n' '|')"; exit 1; }
"$ROOT/tests/unit/test_powersgd"
# Planted (tests/lib.sh, plant): P not all-reduced, each rank keeps its own.
planted=$(plant p_local common/powersgd.h 'powersgd_all_reduce(s, pg, buf, s->p_total);' \
    '(void)0;' tests unit/test_powersgd)
[[ -n $planted ]] && ! "$planted" >"$TMP/planted.log" 2>&1 &&
    grep -q '^FAIL powersgd: 2 ranks, rank 1: one power-iteration step of the mean' "$TMP/planted.log"
verdict $? "planted: P left unaveraged fails the rank-1 reference" "$(planted_why p_local)$(grep -m3 '^FAIL' "$TMP/planted.log" 2>/dev/null | tr '\n' '|')"
no_leftovers "powersgd: no process left behind" "tests/unit/test_powersgd"
