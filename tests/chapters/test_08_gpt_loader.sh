# Chapter 08's loader (gpt/loader.h, --num_workers): with a worker thread
# that makes the next batch while a step trains, the run trains on exactly
# the batches of one made in the loop: the same final bytes, over epochs,
# gradient accumulation and ranks.
source "$(dirname "$0")/../lib.sh"
prog="$ROOT/08_gpt_wikitext/08_gpt_wikitext"
[[ -x "$prog" ]] || { fail "gpt loader: binaries" "build first (make)"; exit 1; }
export OMP_NUM_THREADS=1

gpt_corpus "$TMP/corpus"
sum='checksum ([0-9a-f]*),'
common=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000
        --device cpu --block_size 16 --epochs 2 --grad_accum 2 --batch_size 4)

# same NAME ARGS... : --num_workers 0 and 1 end with the same parameters.
same() {
    local name=$1; shift
    run_capture 300 "$TMP/w0" "$prog" "${common[@]}" "$@" --num_workers 0 --out_dir "$TMP/w0.d"; local s0=$?
    run_capture 300 "$TMP/w1" "$prog" "${common[@]}" "$@" --num_workers 1 --out_dir "$TMP/w1.d"; local s1=$?
    local a b; a=$(field "$TMP/w0" "$sum"); b=$(field "$TMP/w1" "$sum")
    [[ $s0 -eq 0 && $s1 -eq 0 && -n "$a" && "$a" == "$b" ]] && grep -q 'validation after step .* (epoch 2)' "$TMP/w1"
    verdict $? "gpt loader: $name: a worker making batches ahead trains on the same batches ($a)" \
        "statuses $s0 $s1, checksums '$a' (no worker) vs '$b' (worker): $(tail -n 1 "$TMP/w1")"
}
same "1 rank, 2 epochs, 2 micro-batches a step"
same "2 ranks" --nprocs 2
run_capture 10 "$TMP/bad" "$prog" "${common[@]}" --num_workers 2; status=$?
[[ $status -eq 2 ]] && grep -q -- "--num_workers must be between 0 and 1, got '2'" "$TMP/bad"
verdict $? "gpt loader: --num_workers 2 is refused (one worker outpaces a step already)" "status $status: $(head -n 1 "$TMP/bad")"
no_leftovers "gpt loader: no process left behind" "08_gpt_wikitext/08_gpt_wikitext"
