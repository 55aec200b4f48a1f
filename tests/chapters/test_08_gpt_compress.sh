# Chapter 08 with --grad_compress bf16 and fp16 (DDP's bf16_ and
# fp16_compress_hook, common/ddp.h): the gradients travel in 16 bits, half
# the bytes of fp32, and the training is the fp32 one to rounding. On the
# CPU, then on GPUs, where each bucket is rounded on the GPU before its
# overlapped all-reduce.
source "$(dirname "$0")/../lib.sh"
prog="$ROOT/08_gpt_wikitext/08_gpt_wikitext"
[[ -x "$prog" ]] || { fail "gpt compress: binaries" "build first (make)"; exit 1; }
export OMP_NUM_THREADS=1

# A small corpus in WikiText's layout (no real data needed).
gpt_corpus "$TMP/corpus"
l2='l2 norm ([0-9.e+-]*)' sum='checksum ([0-9a-f]*),'
bytes='gradients all-reduced: ([0-9]*) bytes per step per rank \((fp32|bf16|fp16|powersgd)\), ([0-9]*) parameters'

# compare NAME LOG_NONE LOG_16 HOOK : the bf16 or fp16 run sent exactly 2
# bytes a parameter per step and the fp32 one 4; its weights differ from
# the fp32 run's (the hook did round) by less than 1e-5 of their norm
# (Adam's steps hardly notice 1 part in 256, or 2048, of each gradient).
compare() {
    local name=$1 none=$2 half=$3 hook=$4
    local bn bb pn a b
    bn=$(field "$none" "$bytes" '\1 \2'); bb=$(field "$half" "$bytes" '\1 \2'); pn=$(field "$none" "$bytes" '\3')
    [[ -n "$pn" && "$bn" == "$((4 * pn)) fp32" && "$bb" == "$((2 * pn)) $hook" ]]
    verdict $? "gpt compress ($name): $hook sends 2 bytes a parameter per step, fp32 4 ($pn parameters)" "fp32 run '$bn', $hook run '$bb'"
    a=$(field "$none" "$l2"); b=$(field "$half" "$l2")
    rel_near "$a" "$b" 1e-5 && [[ "$(field "$none" "$sum")" != "$(field "$half" "$sum")" ]]
    verdict $? "gpt compress ($name): $hook-compressed training is the fp32 one to rounding (l2 $a vs $b), not the same bytes" \
        "l2 '$a' vs '$b', checksums $(field "$none" "$sum") and $(field "$half" "$sum")"
}

# On the CPU: 2 ranks, gradients in 64 KiB buckets (each rounded and sent).
cpu=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000
     --device cpu --max_steps 15 --batch_size 4 --nprocs 2)
for c in none bf16 fp16; do
    COURSE_DDP_BUCKET_BYTES=65536 run_capture 120 "$TMP/cpu_$c" "$prog" "${cpu[@]}" --grad_compress $c --out_dir "$TMP/cpu_$c.d"
    verdict $? "gpt compress (CPU): 2 ranks with --grad_compress $c train" "$(tail -n 2 "$TMP/cpu_$c" | tr '\n' '|')"
done
compare CPU "$TMP/cpu_none" "$TMP/cpu_bf16" bf16
compare CPU "$TMP/cpu_none" "$TMP/cpu_fp16" fp16
# PowerSGD (DDP's powerSGD_hook, common/powersgd.h): at full rank (64, every
# matrix compressed: COURSE_POWERSGD_MIN_RATE=0) it is the exact average, so
# the run ends where fp32's does; at rank 1 it sends a small fraction of the
# bytes and still trains. (Its own algebra: tests/library/test_powersgd.sh.)
COURSE_DDP_BUCKET_BYTES=65536 COURSE_POWERSGD_MIN_RATE=0 run_capture 120 "$TMP/cpu_psgd_full" "$prog" "${cpu[@]}" \
    --grad_compress powersgd --powersgd_rank 64 --out_dir "$TMP/cpu_psgd_full.d"; status=$?
a=$(field "$TMP/cpu_none" "$l2"); b=$(field "$TMP/cpu_psgd_full" "$l2")
[[ $status -eq 0 ]] && rel_near "$a" "$b" 1e-6
verdict $? "gpt compress (CPU): PowerSGD at full rank is the exact average (l2 $a vs $b)" "status $status, l2 '$a' vs '$b'"
run_capture 120 "$TMP/cpu_psgd1" "$prog" "${cpu[@]}" --grad_compress powersgd --log_every 5 --out_dir "$TMP/cpu_psgd1.d"; status=$?
sent=$(field "$TMP/cpu_psgd1" "$bytes" '\1'); fp32=$(field "$TMP/cpu_none" "$bytes" '\1')
first=$(field "$TMP/cpu_psgd1" '^epoch [0-9]* \| step 5/[0-9]* \| loss ([0-9.]*) ')
last=$(field "$TMP/cpu_psgd1" '^epoch [0-9]* \| step 15/[0-9]* \| loss ([0-9.]*) ')
[[ $status -eq 0 && -n "$sent" && -n "$fp32" && -n "$last" ]] && (( sent * 10 < fp32 )) &&
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'
verdict $? "gpt compress (CPU): PowerSGD at rank 1 sends $sent bytes a step instead of $fp32, and trains (loss $first -> $last)" \
    "status $status, bytes '$sent' vs '$fp32', losses '$first' -> '$last'"

# Planted (tests/lib.sh, plant): the CPU model ignores --grad_compress and
# all-reduces fp32: 4 bytes a parameter, the fp32 run's very bytes.
planted=$(plant compress_ignored gpt/model.h \
    'ddp_average_gradients_with(pg, m->host.grads, m->host.num_params, m->grad_compress);' \
    'ddp_average_gradients_with(pg, m->host.grads, m->host.num_params, DDP_COMPRESS_NONE);' 08_gpt_wikitext 08_gpt_wikitext)
# Its fp32 run is the reference: the copy is built without this build's
# flags (plant), and an ASan build's -O1 rounds differently from -O2.
[[ -n $planted ]] && COURSE_DDP_BUCKET_BYTES=65536 run_capture 120 "$TMP/planted_bf16" "$planted" "${cpu[@]}" --grad_compress bf16 \
    --out_dir "$TMP/planted.d" && COURSE_DDP_BUCKET_BYTES=65536 run_capture 120 "$TMP/planted_none" "$planted" "${cpu[@]}" \
    --out_dir "$TMP/planted_none.d" && [[ "$(field "$TMP/planted_bf16" "$bytes" '\1 \2')" == "$(field "$TMP/cpu_none" "$bytes" '\1') bf16" ]] &&
    [[ -n "$(field "$TMP/planted_bf16" "$sum")" && "$(field "$TMP/planted_bf16" "$sum")" == "$(field "$TMP/planted_none" "$sum")" ]]
verdict $? "planted: a model that ignores --grad_compress sends fp32's bytes and trains fp32's bytes, which the CPU checks refuse" \
    "$(planted_why compress_ignored)$(field "$TMP/planted_bf16" "$bytes" '\1 \2' 2>/dev/null)"

# On GPUs (real, or the emulated ones of make CUDA=emu; fp32 so that the
# GPU model is the CPU's arithmetic): each bucket is rounded on the GPU and
# all-reduced while backward runs; the average is widened after the last.
if ! has_gpu || [[ $(gpu_count) -lt 2 ]]; then
    for what in "train" "bytes" "rounding" "bf16 and fp16 equal the CPU" "PowerSGD equals the CPU's"; do
        skip "gpt compress (GPU): $what" "needs 2 GPUs (a CUDA build with GPUs, or make CUDA=emu)"
    done
    no_leftovers "gpt compress: no process left behind" "08_gpt_wikitext/08_gpt_wikitext"
    exit 0
fi
gpu=("${cpu[@]}" --device cuda --precision fp32 --block_size 16)
cpu16=("${cpu[@]}" --block_size 16)
for c in none bf16 fp16; do
    run_capture 300 "$TMP/gpu_$c" "$prog" "${gpu[@]}" --grad_compress $c --out_dir "$TMP/gpu_$c.d"
    verdict $? "gpt compress (GPU): 2 ranks with --grad_compress $c train ($(grep -m1 -o 'backend [a-z]*' "$TMP/gpu_$c"))" "$(tail -n 2 "$TMP/gpu_$c" | tr '\n' '|')"
done
compare GPU "$TMP/gpu_none" "$TMP/gpu_bf16" bf16
compare GPU "$TMP/gpu_none" "$TMP/gpu_fp16" fp16
# The GPU's rounding is the CPU's: the same compressed run on the CPU ends
# where the GPU's does, to the GPU's order of additions (as fp32 runs do in
# test_08_gpt_ddp), far closer than a rank that kept its own gradient.
for c in bf16 fp16; do
    run_capture 120 "$TMP/cpu16_$c" "$prog" "${cpu16[@]}" --grad_compress $c --out_dir "$TMP/cpu16_$c.d"
    a=$(field "$TMP/cpu16_$c" "$l2"); b=$(field "$TMP/gpu_$c" "$l2")
    rel_near "$a" "$b" 1e-5
    verdict $? "gpt compress (GPU): the GPU's $c-compressed run equals the CPU's (l2 $a vs $b)" "l2 '$a' (CPU) vs '$b' (GPU)"
done
# PowerSGD on GPUs: the gradients go to the host and back (common/powersgd.h
# runs there), so the GPU run ends where the CPU's does; with fp16 it is
# refused (an overflowed step would leave inf in its error feedback).
run_capture 300 "$TMP/gpu_psgd" "$prog" "${gpu[@]}" --grad_compress powersgd --powersgd_rank 4 --out_dir "$TMP/gpu_psgd.d"
run_capture 120 "$TMP/cpu16_psgd" "$prog" "${cpu16[@]}" --grad_compress powersgd --powersgd_rank 4 --out_dir "$TMP/cpu16_psgd.d"
a=$(field "$TMP/cpu16_psgd" "$l2"); b=$(field "$TMP/gpu_psgd" "$l2")
rel_near "$a" "$b" 1e-5
verdict $? "gpt compress (GPU): PowerSGD (rank 4) on GPUs equals the CPU's (l2 $a vs $b)" "l2 '$a' (CPU) vs '$b' (GPU): $(grep -m1 error "$TMP/gpu_psgd")"
run_capture 300 "$TMP/gpu_psgd16" "$prog" "${gpu[@]/fp32/fp16}" --grad_compress powersgd --out_dir "$TMP/gpu_psgd16.d"; status=$?
[[ $status -ne 0 ]] && grep -q "error: --grad_compress powersgd with --precision fp16: " "$TMP/gpu_psgd16"
verdict $? "gpt compress (GPU): PowerSGD with fp16 training is refused in one line" "status $status: $(grep -m1 error "$TMP/gpu_psgd16")"
no_leftovers "gpt compress: no process left behind" "08_gpt_wikitext/08_gpt_wikitext"
