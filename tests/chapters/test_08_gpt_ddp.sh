# Chapter 08 data parallel and resumable: DDP equals one big batch, and a
# run whose rank dies resumes from its snapshot to the same bytes.
source "$(dirname "$0")/../lib.sh"
prog="$ROOT/08_gpt_wikitext/08_gpt_wikitext"
ddprun="$ROOT/tools/ddprun"
[[ -x "$prog" && -x "$ddprun" ]] || { fail "gpt ddp: binaries" "build first (make)"; exit 1; }
export OMP_NUM_THREADS=1

# A small corpus in WikiText's layout (no real data needed).
gpt_corpus "$TMP/corpus"
# On the CPU, whatever the build: what is tested here is data parallelism
# and snapshots; the GPU cases follow at the end.
common=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000
        --device cpu)
# What field reads from a run's output: the final parameters' l2 norm and
# checksum, and the last validation loss.
l2='l2 norm ([0-9.e+-]*)' sum='checksum ([0-9a-f]*),' valid='validation after step [0-9]* .*: loss ([0-9.]*) '

# DDP: 2 ranks x batch 4 against 1 rank x batch 8, over the same blocks.
# The gradients are averaged in 64 KiB buckets (the default 25 MiB would
# hold the whole tiny model), so that every bucket has to arrive.
run_capture 120 "$TMP/one" "$prog" "${common[@]}" --max_steps 15 --batch_size 8 --out_dir "$TMP/one.d"
# two_equal_one PROGRAM NAME: PROGRAM with 2 ranks x batch 4 into $TMP/NAME; sets
# status, a b (the l2 norms of one rank and two) and va vb (their validation
# losses); true when they agree. On the CPU a run adds in the same order
# every time: the printed validation losses are compared exactly (unlike
# two GPU runs' below).
two_equal_one() {
    run_capture 120 "$TMP/$2" "$1" "${common[@]}" --max_steps 15 --batch_size 4 --nprocs 2 --out_dir "$TMP/$2.d"; status=$?
    a=$(field "$TMP/one" "$l2"); b=$(field "$TMP/$2" "$l2"); va=$(field "$TMP/one" "$valid"); vb=$(field "$TMP/$2" "$valid")
    [[ $status -eq 0 && -n "$a" && -n "$b" ]] && rel_near "$a" "$b" 1e-5 && [[ "$va" == "$vb" ]]
}
COURSE_DDP_BUCKET_BYTES=65536 two_equal_one "$prog" two
verdict $? "gpt ddp: 2 ranks x batch 4 (64 KiB buckets) equal 1 rank x batch 8 after 15 steps (l2 $a vs $b)" \
    "status $status, l2 '$a' vs '$b', valid $va vs $vb"
# Planted (tests/lib.sh, plant): every bucket all-reduced from the start of
# the gradients. The copy passes with one bucket (the default 25 MiB holds
# the whole model) and must fail with the 8 buckets of 64 KiB.
planted=$(plant bucket_offset common/ddp.h 'pg_all_reduce(pg, grads + first, grads + first, n,' \
    'pg_all_reduce(pg, grads, grads, n,' 08_gpt_wikitext 08_gpt_wikitext)
[[ -n $planted ]] && two_equal_one "$planted" planted_one_bucket &&
    ! COURSE_DDP_BUCKET_BYTES=65536 two_equal_one "$planted" planted_buckets && [[ -n $b ]]
verdict $? "planted: buckets all-reduced at offset 0 pass with one bucket, fail with 64 KiB buckets (l2 $a vs $b)" \
    "$(planted_why bucket_offset)status $status, l2 '$a' vs '$b', valid $va vs $vb"
lines=$(grep -c '^test: ' "$TMP/two")
check "gpt ddp: rank 0 alone reports (one test line)" test "$lines" -eq 1

# A gradient N times too large - the ranks' gradients summed where their
# mean belongs - barely moves AdamW's weights (its step is m / sqrt(v), the
# same for any scale), and not at all while clipping is active at every
# step, as above (a clipped gradient has the norm --grad_clip gives it,
# whatever its scale): the check above passes with it (planted below).
# AdamW's moments see it, m N times and v N^2 times larger. So the same
# pair again without clipping, each run saving its snapshot, and the
# moments compared too (chapter 09's tests compare them as well).
# snapshot_norms and norms_near: tests/lib.sh.
unclipped=(--grad_clip 0 --save_every 1)
run_capture 120 "$TMP/one_nc" "$prog" "${common[@]}" --max_steps 15 --batch_size 8 "${unclipped[@]}" --out_dir "$TMP/one_nc.d" \
    --snapshot_path "$TMP/one_nc.d/s.safetensors"
# moments_equal_one PROGRAM NAME: PROGRAM with 2 ranks x batch 4, unclipped, into
# $TMP/NAME; sets status, na nb (the norms of one rank and two); true when
# they agree within 1e-6.
moments_equal_one() {
    COURSE_DDP_BUCKET_BYTES=65536 run_capture 120 "$TMP/$2" "$1" "${common[@]}" --max_steps 15 --batch_size 4 --nprocs 2 \
        "${unclipped[@]}" --out_dir "$TMP/$2.d" --snapshot_path "$TMP/$2.d/s.safetensors"; status=$?
    na=$(snapshot_norms "$TMP/one_nc.d"); nb=$(snapshot_norms "$TMP/$2.d")
    [[ $status -eq 0 ]] && norms_near "$na" "$nb" 1e-6
}
moments_equal_one "$prog" two_nc
verdict $? "gpt ddp: without clipping, 2 ranks x batch 4 equal 1 rank x batch 8 in weights and AdamW's moments (l2 of p, m, v: $nb vs $na)" \
    "status $status, norms '$na' (1 rank) vs '$nb' (2 ranks): $(grep -m1 error "$TMP/two_nc")"
# Planted: the ranks' gradients summed, not averaged (the missing 1/N).
planted=$(plant sum_not_mean common/ddp.h 'grads + first, n, DTYPE_F32, OP_AVG);' 'grads + first, n, DTYPE_F32, OP_SUM);' \
    08_gpt_wikitext 08_gpt_wikitext)
[[ -n $planted ]] && COURSE_DDP_BUCKET_BYTES=65536 two_equal_one "$planted" planted_sum_clipped && clipped="$a vs $b" &&
    ! moments_equal_one "$planted" planted_sum && [[ -n $nb ]]
verdict $? "planted: gradients summed over the ranks, not averaged: the clipped check passes (l2 ${clipped:-}), the moments differ ($nb vs $na)" \
    "$(planted_why sum_not_mean)status $status, clipped l2 '${clipped:-}' (valid $va vs $vb), unclipped norms '$na' vs '$nb'"

# Bit-exact resume: rank 1 dies in epoch 2; ddprun restarts the job, which
# resumes from the end-of-epoch-1 snapshot and ends with the same bytes.
snapshots=(--epochs 3 --save_every 1)
run_capture 300 "$TMP/clean" "$ddprun" --standalone --nproc_per_node=2 "$prog" "${common[@]}" "${snapshots[@]}" \
    --out_dir "$TMP/clean.d" --snapshot_path "$TMP/clean.d/s.safetensors"
steps=$(field "$TMP/clean" 'snapshot saved: Epoch 1 \(step ([0-9]*)\)')
COURSE_FAIL_RANK=1 COURSE_FAIL_STEP=$(( ${steps:-10} + 5 )) run_capture 300 "$TMP/failed" "$ddprun" --standalone \
    --nproc_per_node=2 --max_restarts=1 "$prog" "${common[@]}" "${snapshots[@]}" --out_dir "$TMP/failed.d" \
    --snapshot_path "$TMP/failed.d/s.safetensors"; status=$?
a=$(field "$TMP/clean" "$sum"); b=$(field "$TMP/failed" "$sum")
[[ $status -eq 0 && -n "$a" && "$a" == "$b" ]] && grep -q "Resuming training from snapshot at Epoch 1" "$TMP/failed"
verdict $? "gpt snapshot: a rank killed in epoch 2, restarted, ends byte-identical ($a)" "status $status, clean '$a', resumed '$b'"

# A snapshot of another model size is refused, naming both.
run_capture 60 "$TMP/other" "$prog" "${common[@]}" --n_embd 32 "${snapshots[@]}" --out_dir "$TMP/other.d" \
    --snapshot_path "$TMP/clean.d/s.safetensors"; status=$?
[[ $status -ne 0 ]] && grep -q "snapshot has config=.*embd 64 but this run has config=.*embd 32" "$TMP/other"
verdict $? "gpt snapshot: another model size is refused with both values" "status $status: $(grep -m1 error "$TMP/other")"
# ---------------------------------------------------------------- on GPUs
# The same program on the GPU model (gpt_cuda.cu): real GPUs, or the
# emulated ones of a CUDA=emu build (8 of them: every rank has its own, and
# the ranks talk NCCL). With one real GPU, several ranks share it and the
# cpu backend stages through host memory.
if ! has_gpu; then
    for what in "trains in bf16, fp16 and fp32" "fp32 equals the CPU" "DDP 2 and 4 ranks" "bf16 DDP" \
                "fp16 loss scale: overflow skipped, DDP, snapshot" "resume across devices"; do
        skip "gpt gpu: $what" "no GPU here (a CPU-only build, or no GPU: make CUDA=emu test runs these on the emulated GPU)"
    done
    no_leftovers "gpt ddp: no process left behind" "08_gpt_wikitext/08_gpt_wikitext"
    exit 0
fi
# Blocks of 16 tokens: an emulated GPU is slow, and the comparisons need only a few steps.
gpu=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000
     --device cuda --block_size 16)
# Two GPU runs agree to rounding, not to the bit: a real GPU's atomicAdd
# adds in whatever order the threads arrive, and N ranks sum a gradient in
# another order than one rank. The validation loss is printed with 4
# decimals: 1.5e-4 lets its last digit differ by one (a rounding flip), no
# more. An all-reduce queued on the wrong stream, which lets the optimizer
# race the average, moved it by 2e-4 at 4 ranks on the emulated GPU (and
# the l2 norm by 4e-7, within its 1e-5): still caught.
valid_tol=1.5e-4

# Every precision trains: the loss of step 20 is below that of step 5.
# fp16 starts from a loss scale of 2^24: the loss's gradient (2^24 / 128
# tokens = 2^17) overflows fp16's 65504, so the first steps are skipped and
# the scale halves until it fits (checked below).
for precision in bf16 fp16 fp32; do
    scale=(); [[ $precision == fp16 ]] && scale=(--loss_scale 16777216)
    run_capture 300 "$TMP/g_$precision" "$prog" "${gpu[@]}" --precision "$precision" --max_steps 20 --log_every 5 \
        "${scale[@]}" --out_dir "$TMP/g_$precision.d"; status=$?
    first=$(field "$TMP/g_$precision" '^epoch [0-9]* \| step 5/[0-9]* \| loss ([0-9.]*) ')
    last=$(field "$TMP/g_$precision" '^epoch [0-9]* \| step 20/[0-9]* \| loss ([0-9.]*) ')
    [[ $status -eq 0 ]] && head -n 1 "$TMP/g_$precision" | grep -q 'running on GPU' &&
       grep -q "parameters (.*), ${precision}" "$TMP/g_$precision" &&
       [[ -n "$first" && -n "$last" ]] && awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'
    verdict $? "gpt gpu: trains in $precision on the GPU (loss $first at step 5, $last at step 20)" \
        "status $status, losses '$first' -> '$last': $(grep -m1 -E 'error|running' "$TMP/g_$precision")"
done

# fp32 on the GPU is the CPU model's arithmetic (up to the order of additions).
run_capture 120 "$TMP/g_cpu" "$prog" "${common[@]}" --block_size 16 --max_steps 15 --batch_size 8 --out_dir "$TMP/g_cpu.d"
run_capture 300 "$TMP/g_one" "$prog" "${gpu[@]}" --precision fp32 --max_steps 15 --batch_size 8 --out_dir "$TMP/g_one.d"
a=$(field "$TMP/g_cpu" "$l2"); b=$(field "$TMP/g_one" "$l2")
rel_near "$a" "$b" 1e-5; verdict $? "gpt gpu: fp32 equals the CPU after 15 steps (l2 $a vs $b)" "l2 '$a' (CPU) vs '$b' (GPU)"

# One rank on a GPU: each step is one CUDA graph launch (--cuda_graph, on by
# default), the run above; launched call by call, the same numbers. The
# schedule's learning rate changes every step of these 15 (warm-up, then
# the cosine): a graph replaying the first step's would end elsewhere.
run_capture 300 "$TMP/g_eager" "$prog" "${gpu[@]}" --precision fp32 --max_steps 15 --batch_size 8 --cuda_graph=false \
    --out_dir "$TMP/g_eager.d"; status=$?
c=$(field "$TMP/g_eager" "$l2"); va=$(field "$TMP/g_one" "$valid"); vb=$(field "$TMP/g_eager" "$valid")
[[ $status -eq 0 && -n "$c" ]] && grep -q '^step: one CUDA graph launch' "$TMP/g_one" &&
    grep -q '^step: launched call by call (no CUDA graph: --cuda_graph=false)' "$TMP/g_eager" &&
    rel_near "$b" "$c" 1e-5 && near "$va" "$vb" "$valid_tol"
verdict $? "gpt gpu: one CUDA graph per step equals the step launched call by call (l2 $b vs $c)" \
    "status $status, l2 '$b' (graph) vs '$c', valid $va vs $vb; $(grep -h -m1 '^step:' "$TMP/g_one" "$TMP/g_eager" | tr '\n' '|')"

# DDP on GPUs: N ranks x batch 8/N equal 1 rank x batch 8 (the gradients
# are averaged bucket by bucket while backward runs). 2 ranks without
# clipping against the CPU's one process, weights and AdamW's moments (a
# gradient summed over the ranks, not averaged, shows in the moments
# only: see the CPU's check above); 4 ranks with clipping against the GPU's.
run_capture 120 "$TMP/g_cpu_nc" "$prog" "${common[@]}" --block_size 16 --max_steps 15 --batch_size 8 "${unclipped[@]}" \
    --out_dir "$TMP/g_cpu_nc.d" --snapshot_path "$TMP/g_cpu_nc.d/s.safetensors"
run_capture 300 "$TMP/g_ddp2" "$prog" "${gpu[@]}" --precision fp32 --max_steps 15 --batch_size 4 --nprocs 2 "${unclipped[@]}" \
    --out_dir "$TMP/g_ddp2.d" --snapshot_path "$TMP/g_ddp2.d/s.safetensors"; status=$?
na=$(snapshot_norms "$TMP/g_cpu_nc.d"); nb=$(snapshot_norms "$TMP/g_ddp2.d")
va=$(field "$TMP/g_cpu_nc" "$valid"); vb=$(field "$TMP/g_ddp2" "$valid")
[[ $status -eq 0 ]] && grep -q '^step: launched call by call (no CUDA graph: several ranks' "$TMP/g_ddp2" &&
    norms_near "$na" "$nb" 1e-6 && near "$va" "$vb" "$valid_tol"
verdict $? "gpt gpu: DDP 2 ranks x batch 4 without clipping equal 1 CPU process x batch 8 in fp32, weights and AdamW's moments (l2 of p, m, v: $nb vs $na; $(grep -m1 -o 'backend [a-z]*' "$TMP/g_ddp2"))" \
    "status $status, norms '$na' (CPU) vs '$nb' (2 GPUs), valid $va vs $vb (tolerance $valid_tol)"
run_capture 300 "$TMP/g_ddp4" "$prog" "${gpu[@]}" --precision fp32 --max_steps 15 --batch_size 2 --nprocs 4 \
    --out_dir "$TMP/g_ddp4.d"; status=$?
c=$(field "$TMP/g_ddp4" "$l2"); va=$(field "$TMP/g_one" "$valid"); vb=$(field "$TMP/g_ddp4" "$valid")
[[ $status -eq 0 && -n "$c" ]] && grep -q '^step: launched call by call (no CUDA graph: several ranks' "$TMP/g_ddp4" &&
    rel_near "$b" "$c" 1e-5 && near "$va" "$vb" "$valid_tol"
verdict $? "gpt gpu: DDP 4 ranks x batch 2 equal 1 rank x batch 8 in fp32 (l2 $b vs $c; $(grep -m1 -o 'backend [a-z]*' "$TMP/g_ddp4"))" \
    "status $status, l2 '$b' vs '$c', valid $va vs $vb (tolerance $valid_tol)"

# bf16 rounds activations and weight copies: the same comparison within 2e-2.
run_capture 300 "$TMP/h_one" "$prog" "${gpu[@]}" --precision bf16 --max_steps 15 --batch_size 8 --out_dir "$TMP/h_one.d"
run_capture 300 "$TMP/h_two" "$prog" "${gpu[@]}" --precision bf16 --max_steps 15 --batch_size 4 --nprocs 2 \
    --out_dir "$TMP/h_two.d"; status=$?
a=$(field "$TMP/h_one" "$l2"); c=$(field "$TMP/h_two" "$l2"); va=$(field "$TMP/h_one" "$valid"); vb=$(field "$TMP/h_two" "$valid")
[[ $status -eq 0 && -n "$a" && -n "$c" ]] && rel_near "$a" "$c" 2e-2 && rel_near "$va" "$vb" 2e-2
verdict $? "gpt gpu: bf16 DDP 2 ranks x batch 4 equal 1 rank x batch 8 within 2e-2 (l2 $a vs $c)" "status $status, l2 '$a' vs '$c', valid $va vs $vb"

# fp16 with its loss scale (GradScaler). From 2^24 (the loop above) the
# first steps were skipped for overflow and the scale came down. At the
# default scale, 2 ranks x batch 4 end where 1 rank x batch 8 does, within
# fp16's rounding; the snapshot keeps the scale, and a run that resumes it
# with another --loss_scale goes on with the snapshot's.
fp16=("${gpu[@]}" --precision fp16 --max_steps 15 --log_every 5)
scale_re='loss scale ([0-9]+), ([0-9]+) step\(s\) skipped'
run_capture 300 "$TMP/q_one" "$prog" "${fp16[@]}" --batch_size 8 --out_dir "$TMP/q_one.d" --save_every 1 \
    --snapshot_path "$TMP/q_one.d/s.safetensors"
run_capture 300 "$TMP/q_two" "$prog" "${fp16[@]}" --batch_size 4 --nprocs 2 --out_dir "$TMP/q_two.d"; status=$?
a=$(field "$TMP/q_one" "$l2"); c=$(field "$TMP/q_two" "$l2"); scale=$(field "$TMP/q_one" "step 15/.*$scale_re")
[[ $status -eq 0 && -n "$a" && -n "$c" && $scale == 65536 ]] && rel_near "$a" "$c" 2e-2 &&
    grep -q "parameters (.*), fp16 (.*dynamic loss scale)" "$TMP/q_two"
verdict $? "gpt gpu: fp16 DDP 2 ranks x batch 4 equal 1 rank x batch 8 within 2e-2 (l2 $a vs $c, loss scale $scale)" \
    "status $status, l2 '$a' vs '$c', scale '$scale': $(grep -m1 -E 'error|step 15/' "$TMP/q_two")"
saved=$(cat "$TMP/q_one.d"/s*.safetensors 2>/dev/null | head -c 4096 | grep -a -o '"loss_scale":"[0-9]*"' | grep -o '[0-9][0-9]*')
run_capture 300 "$TMP/q_resume" "$prog" "${gpu[@]}" --precision fp16 --loss_scale 2 --max_steps 20 --log_every 5 \
    --batch_size 8 --epochs 2 --out_dir "$TMP/q_resume.d" --snapshot_path "$TMP/q_one.d/s.safetensors"; status=$?
resumed=$(field "$TMP/q_resume" "step 20/.*$scale_re")
[[ $status -eq 0 && -n "$saved" && $saved == "$scale" && $resumed == "$saved" ]] &&
    grep -q 'Resuming training from snapshot' "$TMP/q_resume"
verdict $? "gpt gpu: fp16's snapshot keeps the loss scale ($saved); the resumed run goes on with it, not --loss_scale 2" \
    "status $status, printed '$scale', saved '$saved', after resuming '$resumed': $(grep -m1 -E 'error|Resuming' "$TMP/q_resume")"
skipped=$(field "$TMP/g_fp16" "step 20/.*$scale_re" '\2'); scale=$(field "$TMP/g_fp16" "step 20/.*$scale_re")
[[ -n "$skipped" && -n "$scale" ]] && (( skipped >= 1 && skipped < 10 && scale < 16777216 ))
verdict $? "gpt gpu: fp16 from loss scale 2^24: $skipped step(s) skipped for overflow, scale $scale, and it trained (above)" \
    "skipped '$skipped', scale '$scale': $(grep -m2 -E 'error|step 20/' "$TMP/g_fp16" | tr '\n' '|')"

# Snapshots move between devices: a run on one resumes the end-of-epoch
# snapshot of the other and, with no step left to take, saves exactly the
# state it loaded (the final checksums are equal, bit for bit).
awk -v dir="$TMP/small" 'BEGIN { system("mkdir -p " dir); srand(5)
    for (f = 1; f <= 3; f++) { file = dir "/" (f == 1 ? "train.txt" : f == 2 ? "valid.txt" : "test.txt")
        for (i = 0; i < (f == 1 ? 240 : 60); i++) printf " the cat %d sees a dog %d . \n", i % 7, i % 5 > file } }'
small=(--data_dir "$TMP/small" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000
       --precision fp32 --save_every 1)
cross_resume() { # FROM TO
    local snap="$TMP/x_$1.d/s.safetensors"
    run_capture 300 "$TMP/x_$1" "$prog" "${small[@]}" --device "$1" --epochs 1 --out_dir "$TMP/x_$1.d" --snapshot_path "$snap"
    run_capture 300 "$TMP/x_$1_$2" "$prog" "${small[@]}" --device "$2" --epochs 1 --out_dir "$TMP/x_$1_$2.d" \
        --snapshot_path "$snap"; local status=$?
    local a b; a=$(field "$TMP/x_$1" "$sum"); b=$(field "$TMP/x_$1_$2" "$sum")
    # Exact on purpose: with no step left to take, nothing is computed.
    [[ $status -eq 0 && -n "$a" && "$a" == "$b" ]] && grep -q 'Resuming training from snapshot at Epoch 1' "$TMP/x_$1_$2"
    verdict $? "gpt gpu: resume across devices: a $2 run loads a $1 snapshot bit for bit ($a)" \
        "status $status, checksums '$a' vs '$b': $(grep -m1 -E 'error|Resuming' "$TMP/x_$1_$2")"
}
cross_resume cpu cuda
cross_resume cuda cpu

no_leftovers "gpt ddp: no process left behind" "08_gpt_wikitext/08_gpt_wikitext"
