# The GPT chapter's tokenizer and data pipeline (gpt/bpe.h,
# wikitext.h, sha256.h): unit tests on a small corpus, the bpe_tool command
# line, the messages for missing or damaged data, the download script when
# offline, and the real WikiText-2 checksums where the data is present.
source "$(dirname "$0")/../lib.sh"
unit="$ROOT/tests/unit/test_gpt_tokenizer"
tool="$ROOT/tools/bpe_tool"

if ! make -C "$ROOT/tests" -s unit/test_gpt_tokenizer >"$TMP/build.log" 2>&1; then
    fail tokenizer_build "make -C tests failed: $(grep -m3 -E 'error|Error' "$TMP/build.log" | tr '\n' '|')"
    exit 1
fi
if ! make -C "$ROOT/tools" -s bpe_tool >"$TMP/build-tool.log" 2>&1; then
    fail tokenizer_build "make -C tools bpe_tool failed: $(grep -m3 -E 'error|Error' "$TMP/build-tool.log" | tr '\n' '|')"
    exit 1
fi

# The unit tests print their own PASS/FAIL lines.
run_capture 120 "$TMP/unit.out" "$unit" "$TMP"
status=$?
cat "$TMP/unit.out"
if [[ $status -ne 0 ]] && ! grep -q '^FAIL ' "$TMP/unit.out"; then
    fail "tokenizer unit tests" "exited with status $status: $(tail -n 3 "$TMP/unit.out" | tr '\n' '|')"
fi

# bpe_tool: train, encode, decode on a small corpus plus random bytes.
cat "$ROOT/tests/lib.sh" "$ROOT/gpt/sha256.h" >"$TMP/corpus.txt"
head -c 3000 /dev/urandom >"$TMP/junk.bin"
cat "$TMP/corpus.txt" "$TMP/junk.bin" >"$TMP/mixed.bin"
run_capture 60 "$TMP/train.out" "$tool" train --input "$TMP/corpus.txt" --vocab_size 400 --output "$TMP/tok.json" &&
   run_capture 60 "$TMP/enc.out" "$tool" encode -t "$TMP/tok.json" -i "$TMP/mixed.bin" -o "$TMP/mixed.u16" &&
   run_capture 60 "$TMP/dec.out" "$tool" decode -t "$TMP/tok.json" -i "$TMP/mixed.u16" -o "$TMP/mixed.back" &&
   cmp -s "$TMP/mixed.bin" "$TMP/mixed.back"
verdict $? "bpe_tool: train, encode, decode round-trip text and random bytes" \
    "$(cat "$TMP"/train.out "$TMP"/enc.out "$TMP"/dec.out 2>/dev/null | tail -n 3 | tr '\n' '|')"
expect_output "bpe_tool: train reports the vocabulary it learned" "$TMP/train.out" '^trained 400 tokens \([0-9]+ merges\)'

# expect_error NAME STATUS REGEX COMMAND... : exits with STATUS and says REGEX on one stderr line.
expect_error() {
    local name=$1 want_status=$2 regex=$3; shift 3
    run_capture 60 "$TMP/err.out" "$@"
    local status=$? why=""
    if [[ $status -ne $want_status ]]; then why="exit status $status, expected $want_status: $(head -c 300 "$TMP/err.out")"
    elif [[ $(wc -l <"$TMP/err.out") -ne 1 ]] && [[ $want_status -ne 2 ]]; then why="wanted one line, got: $(tr '\n' '|' <"$TMP/err.out")"
    elif ! grep -Eq -- "$regex" "$TMP/err.out"; then why="message lacks /$regex/: $(head -c 300 "$TMP/err.out")"
    fi
    [[ -z "$why" ]]; verdict $? "$name" "$why"
}

printf '{"model": {"type": "BPE"' >"$TMP/cut.json"
expect_error "bpe_tool: a truncated tokenizer file is refused in one line" 1 'cut.json: not valid JSON: JSON error at line 1, column 25' \
    "$tool" encode -t "$TMP/cut.json" -i "$TMP/corpus.txt" -o "$TMP/x.u16"
expect_error "bpe_tool: a vocabulary too small is a usage error" 2 '--vocab_size must be between 257 and 65536' \
    "$tool" train --input "$TMP/corpus.txt" --vocab_size 100 --output "$TMP/t.json"
printf 'abc' >"$TMP/odd.u16"
expect_error "bpe_tool: an odd-sized token file is refused" 1 'not a whole number of uint16' \
    "$tool" decode -t "$TMP/tok.json" -i "$TMP/odd.u16" -o "$TMP/x.txt"
expect_error "data: a missing --data_dir says how to get WikiText-2" 1 \
    'WikiText-2 not found.*--data_dir.*make data.*WIKITEXT_DIR' "$tool" verify --data_dir "$TMP/nowhere"
expect_error "data: a missing WIKITEXT_DIR says how to get WikiText-2" 1 \
    'WikiText-2 not found.*from WIKITEXT_DIR.*make data' env WIKITEXT_DIR="$TMP/nowhere" "$tool" wikitext

# The download script, pointed at a port where nothing listens: a clean
# failure with a message, and no partial files.
run_capture 60 "$TMP/dl.out" env WIKITEXT_URL=http://127.0.0.1:9/wikitext-2 bash "$ROOT/tools/get_wikitext.sh" "$TMP/dl/wikitext-2"
status=$?
[[ $status -ne 0 ]] && grep -q 'could not download .*WIKITEXT_DIR' "$TMP/dl.out" && [[ ! -e "$TMP/dl/wikitext-2" ]]
verdict $? "get_wikitext.sh: offline, it fails cleanly and leaves nothing behind" \
    "status $status, left: $(ls -A "$TMP/dl/wikitext-2" 2>/dev/null | tr '\n' ' '), said: $(tail -n 2 "$TMP/dl.out" | tr '\n' '|')"

# The real data, where it lies beside the project.
real="$ROOT/../shared/data/wikitext-2"
if [[ -f "$real/train.txt" ]]; then
    expect_error "data: the real WikiText-2 files have the published sha256" 0 'have the published sha256' \
        "$tool" verify --data_dir "$real"
    mkdir -p "$TMP/linked"
    for s in train valid test; do ln -s "$(cd "$real" && pwd)/$s.txt" "$TMP/linked/$s.txt"; done
    run_capture 60 "$TMP/have.out" env WIKITEXT_URL=http://127.0.0.1:9/x bash "$ROOT/tools/get_wikitext.sh" "$TMP/linked"
    expect_output "get_wikitext.sh: good files already there are kept, nothing downloaded" "$TMP/have.out" 'WikiText-2 is ready in'
else
    skip "data: the real WikiText-2 files have the published sha256" "no WikiText-2 in $real"
    skip "get_wikitext.sh: good files already there are kept, nothing downloaded" "no WikiText-2 in $real"
fi
