# The flags parser: good input in every spelling (unit test), bad input
# gives one error line naming the flag, a usage line, and exit status 2.
source "$(dirname "$0")/../lib.sh"
bin="$ROOT/tests/unit/test_flags"
"$bin"

bad_input() { # NAME EXPECTED-REGEX ARGS...
    local name=$1 want=$2; shift 2
    "$bin" "$@" >"$TMP/out" 2>"$TMP/err"
    local status=$? why=""
    if [[ $status -ne 2 ]]; then why="exit status $status, expected 2"
    elif ! head -n 1 "$TMP/err" | grep -Eq -- "$want"; then why="first error line '$(head -n 1 "$TMP/err")' does not match /$want/"
    elif ! sed -n 2p "$TMP/err" | grep -q '^usage:'; then why="no usage line after the error"
    fi
    [[ -z "$why" ]]; verdict $? "$name" "$why"
}
bad_input "flags: non-numeric value" "--epochs expects an integer, got 'abc'" --epochs abc
bad_input "flags: trailing junk in a number" "--epochs expects an integer" --epochs=12x
bad_input "flags: out of range" "--epochs must be between 1 and 1000" --epochs 0
# Upper bounds, of every kind of number, just above the largest value allowed.
bad_input "flags: above the upper bound (integer)" "--epochs must be between 1 and 1000, got '1001'" --epochs 1001
bad_input "flags: above the upper bound (number)" "--lr must be between 0 and 10, got '10.001'" --lr 10.001
bad_input "flags: above the upper bound (size)" "--minbytes must be between 1 and 1073741824, got '1025M'" -b 1025M
bad_input "flags: below the lower bound (size)" "--minbytes must be between 1 and 1073741824, got '0'" -b 0
# ...and the bounds themselves are allowed.
"$bin" --epochs 1000 --lr 10 -b 1G >"$TMP/out" 2>"$TMP/err"
[[ $? -eq 0 ]] && grep -q '^epochs=1000 lr=10 .* bytes=1073741824$' "$TMP/out"
verdict $? "flags: values equal to the bounds are accepted" "$(head -n 1 "$TMP/err")$(cat "$TMP/out")"
bad_input "flags: unknown flag, with the flag it resembles" "unknown flag '--epoch' \(did you mean --epochs\?\)$" --epoch 3
bad_input "flags: a mistyped flag in the other spelling" "unknown flag '--verbose-ouptut' \(did you mean --verbose_output\?\)$" --verbose-ouptut
bad_input "flags: unknown flag like no other: no guess" "unknown flag '--frobnicate'$" --frobnicate
bad_input "flags: missing value" "--lr needs a value" --lr
bad_input "flags: bad choice" "--device must be one of auto\|cpu\|cuda" --device tpu
bad_input "flags: bad bool" "--verbose_output expects true or false" --verbose-output=maybe
bad_input "flags: bad size" "--minbytes expects a size" -b 12Q
bad_input "flags: stray positional" "unexpected argument 'foo'" foo
TEST_FLAGS_DEVICE=gpu "$bin" --epochs 2 2>&1 | grep -q "from TEST_FLAGS_DEVICE"
verdict $? "flags: a bad environment default names the variable" "message does not name TEST_FLAGS_DEVICE"
"$bin" --help >"$TMP/help" 2>&1
[[ $? -eq 0 ]] && grep -q -- "--epochs" "$TMP/help" && grep -q "default 10" "$TMP/help"
verdict $? "flags: --help lists flags with defaults" "$(head -3 "$TMP/help")"
# --help lists the flags in the order the program added them, each with
# what its adder and setters gave it: help, default, choices, short name, variable.
"$bin" --help >"$TMP/help" 2>&1
cat >"$TMP/want" <<'EOF'
test_flags - flags parser test
usage: test_flags [--flag value ...] (see --help)

flags (both --a_b and --a-b spellings work):
      --epochs             passes over the data (default 10)
      --lr                 learning rate (default 0.01)
      --device             where to compute (default auto; one of auto|cpu|cuda; env TEST_FLAGS_DEVICE)
      --verbose_output     say more (default false)
  -b,--minbytes            smallest size (default 8)
     --help                print this help
EOF
diff "$TMP/want" "$TMP/help" >"$TMP/diff"
verdict $? "flags: --help lists the flags in the order they were added, with short names and variables" "$(tr '\n' '|' <"$TMP/diff")"
# A set holds FLAGS_MAX flags (read from flags.h, so raising it moves the
# test too); one more stops the program with a message that says what to
# change, instead of writing past the end. The test program adds 5 flags.
max=$(sed -n 's/^#define FLAGS_MAX \([0-9][0-9]*\).*/\1/p' "$ROOT/common/flags.h")
TEST_FLAGS_EXTRA=$((max - 5)) "$bin" --epochs 2 >"$TMP/out" 2>&1; s_full=$?
TEST_FLAGS_EXTRA=$((max - 4)) "$bin" --epochs 2 >"$TMP/out_over" 2>&1; s_over=$?
[[ -n "$max" && $s_full -eq 0 && $s_over -ne 0 && $s_over -ne 2 ]] && grep -q "flags: test_flags has more than $max flags; raise FLAGS_MAX in flags.h" "$TMP/out_over"
verdict $? "flags: FLAGS_MAX (${max:-?}) flags fit, one more is a clear error" "status $s_full with $max, $s_over with one more: $(head -n 2 "$TMP/out_over" | tr '\n' '|')"
