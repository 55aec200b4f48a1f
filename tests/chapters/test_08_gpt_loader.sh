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

# same BIN ARGS... : --num_workers 0 (this build's program) and 1 (BIN's)
# end with the same parameters.
same() {
    local bin=$1; shift
    run_capture 300 "$TMP/w0" "$prog" "${common[@]}" "$@" --num_workers 0 --out_dir "$TMP/w0.d"; s0=$?
    run_capture 300 "$TMP/w1" "$bin" "${common[@]}" "$@" --num_workers 1 --out_dir "$TMP/w1.d"; s1=$?
    local a b; a=$(field "$TMP/w0" "$sum"); b=$(field "$TMP/w1" "$sum")
    detail="statuses $s0 $s1, checksums '$a' (no worker) vs '$b' (worker): $(tail -n 1 "$TMP/w1")"
    [[ $s0 -eq 0 && $s1 -eq 0 && -n "$a" && "$a" == "$b" ]] && grep -q 'validation after step .* (epoch 2)' "$TMP/w1"
}
same "$prog"
verdict $? "gpt loader: 1 rank, 2 epochs, 2 micro-batches a step: a worker making batches ahead trains on the same batches" "$detail"
same "$prog" --nprocs 2
verdict $? "gpt loader: 2 ranks: a worker making batches ahead trains on the same batches" "$detail"
# Planted (tests/lib.sh, plant): the worker makes the batch before the one
# it was asked for (an index off by one), and labels it as asked.
planted=$(plant batch_behind gpt/loader.h 'loader_fill(l, &l->slot[s], index);' \
    'loader_fill(l, &l->slot[s], index > 0 ? index - 1 : 0); l->slot[s].index = index;' 08_gpt_wikitext 08_gpt_wikitext)
[[ -n $planted ]] && ! same "$planted" && [[ $s0 -eq 0 && $s1 -eq 0 ]]
verdict $? "planted: a worker one batch behind fails the same-batches check" "$(planted_why batch_behind)$detail"
run_capture 10 "$TMP/bad" "$prog" "${common[@]}" --num_workers 2; status=$?
[[ $status -eq 2 ]] && grep -q -- "--num_workers must be between 0 and 1, got '2'" "$TMP/bad"
verdict $? "gpt loader: --num_workers 2 is refused (one worker outpaces a step already)" "status $status: $(head -n 1 "$TMP/bad")"
no_leftovers "gpt loader: no process left behind" "08_gpt_wikitext/08_gpt_wikitext"
