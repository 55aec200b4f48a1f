# Chapter 08 data parallel and resumable: DDP equals one big batch, and a
# run whose rank dies resumes from its snapshot to the same bytes.
source "$(dirname "$0")/lib.sh"
prog="$ROOT/08_gpt_wikitext/08_gpt_wikitext"
ddprun="$ROOT/tools/ddprun"
[[ -x "$prog" && -x "$ddprun" ]] || { fail "gpt ddp: binaries" "build first (make)"; exit 1; }
export OMP_NUM_THREADS=1

# A small corpus in WikiText's layout (no real data needed).
awk -v dir="$TMP/corpus" 'BEGIN { system("mkdir -p " dir); srand(11)
    split("the a one every some my your this that no", D, " "); split("cat dog bird river city king song train", N, " ")
    split("sees likes finds eats builds sings", V, " ")
    for (f = 1; f <= 3; f++) {
        file = dir "/" (f == 1 ? "train.txt" : f == 2 ? "valid.txt" : "test.txt")
        for (i = 0; i < (f == 1 ? 2000 : 200); i++) {
            if (i % 40 == 0) printf " \n = Article %d = \n \n", i > file
            printf " %s %s %s %s %s . \n", D[int(rand() * 10) + 1], N[int(rand() * 8) + 1], V[int(rand() * 6) + 1],
                D[int(rand() * 10) + 1], N[int(rand() * 8) + 1] > file } } }'
common=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000)
l2() { sed -n 's/.*l2 norm \([0-9.e+-]*\).*/\1/p' "$1" | tail -n 1; }
sum() { sed -n 's/.*checksum \([0-9a-f]*\),.*/\1/p' "$1" | tail -n 1; }
valid() { sed -n 's/.*validation after step [0-9]* .*: loss \([0-9.]*\) .*/\1/p' "$1" | tail -n 1; }

# DDP: 2 ranks x batch 4 against 1 rank x batch 8, over the same blocks.
# The gradients are averaged in 64 KiB buckets (the default 25 MiB would
# hold the whole tiny model), so that every bucket has to arrive.
run_capture 120 "$TMP/one" "$prog" "${common[@]}" --max_steps 15 --batch_size 8 --out_dir "$TMP/one.d"
COURSE_DDP_BUCKET_BYTES=65536 run_capture 120 "$TMP/two" "$prog" "${common[@]}" --max_steps 15 --batch_size 4 --nprocs 2 \
    --out_dir "$TMP/two.d"; status=$?
a=$(l2 "$TMP/one"); b=$(l2 "$TMP/two")
if [[ $status -eq 0 && -n "$a" && -n "$b" ]] && rel_near "$a" "$b" 1e-5 && [[ "$(valid "$TMP/one")" == "$(valid "$TMP/two")" ]]; then
    pass "gpt ddp: 2 ranks x batch 4 (64 KiB buckets) equal 1 rank x batch 8 after 15 steps (l2 $a vs $b)"
else fail "gpt ddp: 2 ranks x batch 4 equal 1 rank x batch 8" "status $status, l2 '$a' vs '$b', valid $(valid "$TMP/one") vs $(valid "$TMP/two")"; fi
lines=$(grep -c '^test: ' "$TMP/two")
check "gpt ddp: rank 0 alone reports (one test line)" test "$lines" -eq 1

# Bit-exact resume: rank 1 dies in epoch 2; ddprun restarts the job, which
# resumes from the end-of-epoch-1 snapshot and ends with the same bytes.
snapshots=(--epochs 3 --save_every 1)
run_capture 300 "$TMP/clean" "$ddprun" --standalone --nproc_per_node=2 "$prog" "${common[@]}" "${snapshots[@]}" \
    --out_dir "$TMP/clean.d" --snapshot_path "$TMP/clean.d/s.safetensors"
steps=$(sed -n 's/.*snapshot saved: Epoch 1 (step \([0-9]*\)).*/\1/p' "$TMP/clean")
COURSE_FAIL_RANK=1 COURSE_FAIL_STEP=$(( ${steps:-10} + 5 )) run_capture 300 "$TMP/failed" "$ddprun" --standalone \
    --nproc_per_node=2 --max_restarts=1 "$prog" "${common[@]}" "${snapshots[@]}" --out_dir "$TMP/failed.d" \
    --snapshot_path "$TMP/failed.d/s.safetensors"; status=$?
a=$(sum "$TMP/clean"); b=$(sum "$TMP/failed")
if [[ $status -eq 0 && -n "$a" && "$a" == "$b" ]] && grep -q "Resuming training from snapshot at Epoch 1" "$TMP/failed"; then
    pass "gpt snapshot: a rank killed in epoch 2, restarted, ends byte-identical ($a)"
else fail "gpt snapshot: a rank killed in epoch 2, restarted, ends byte-identical" "status $status, clean '$a', resumed '$b'"; fi

# A snapshot of another model size is refused, naming both.
run_capture 60 "$TMP/other" "$prog" "${common[@]}" --n_embd 32 "${snapshots[@]}" --out_dir "$TMP/other.d" \
    --snapshot_path "$TMP/clean.d/s.safetensors"; status=$?
if [[ $status -ne 0 ]] && grep -q "snapshot has config=.*embd 64 but this run has config=.*embd 32" "$TMP/other"; then
    pass "gpt snapshot: another model size is refused with both values"
else fail "gpt snapshot: another model size is refused with both values" "status $status: $(grep -m1 error "$TMP/other")"; fi
no_leftovers "gpt ddp: no process left behind" "08_gpt_wikitext/08_gpt_wikitext"
