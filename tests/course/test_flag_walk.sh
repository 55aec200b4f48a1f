# The flag walk: every flag of chapter 08 works in every GPT chapter after
# it as it works in 08 - or the chapter refuses it in one line that says
# why. Each flag is given a value other than its default, in one short run
# of each chapter (one process unless the flag is about ranks), and what it
# should change is checked: the line it changes, the checksum it changes
# (or, for --num_workers, leaves alone), the file it writes. 08 walks too:
# it shows that each check sees its flag's effect at all.
#
# A refusal is a PASS only where it is expected (refused, below, with the
# words its reason must hold), so that a chapter cannot drop a flag quietly;
# an expected refusal that does not come is a FAIL too. On (emulated) GPUs
# the flags that only matter there are walked too: --precision fp16 with
# --loss_scale, and --cuda_graph.
source "$(dirname "$0")/../lib.sh"
chapters=(${FLAG_WALK_CHAPTERS:-08_gpt_wikitext 09_zero_fsdp 10_tensor_parallel 11_pipeline_parallel 12_context_parallel 13_expert_parallel 14_five_dimensions})
for c in "${chapters[@]}"; do
    [[ -x "$ROOT/$c/$c" ]] || { fail "flag walk: binaries" "build first (make): no $c/$c"; exit 1; }
done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT COURSE_BACKEND COURSE_DEVICE
export OMP_NUM_THREADS=1

# What a chapter refuses, and the words its one-line reason must hold:
# "CHAPTER FLAG=VALUE" -> words. Nothing else may be refused.
declare -A refused=(
    ["09_zero_fsdp --grad_compress=bf16"]="reduce-scatter"
    ["09_zero_fsdp --grad_compress=fp16"]="reduce-scatter"
    ["09_zero_fsdp --grad_compress=powersgd"]="reduce-scatter"
    ["09_zero_fsdp --precision=fp16"]="needs --shard 0"
    ["11_pipeline_parallel --precision=fp16"]="pipeline stage"
    ["13_expert_parallel --grad_compress=powersgd"]="PowerSGD factors the whole model"
    ["14_five_dimensions --precision=fp16"]="pipeline stage"
    ["14_five_dimensions --grad_compress=bf16"]="the dense and the expert gradients"
    ["14_five_dimensions --grad_compress=fp16"]="the dense and the expert gradients"
    ["14_five_dimensions --grad_compress=powersgd"]="the dense and the expert gradients"
)

# Each chapter walks in its own default layout (11: two stages), so 08's
# flags meet the chapter's idea - 12, whose default is one rank, walks with
# each sequence split over 2 (layout); the flags about data-parallel ranks
# walk with 2 replicas, which in 11 takes one stage per pipeline, in 12
# one rank per sequence (the last flag given wins) and in 13 experts spread
# over both (--ep 2).
declare -A layout=([12_context_parallel]="--cp 2")
declare -A replicas_layout=([11_pipeline_parallel]="--pp 1" [12_context_parallel]="--cp 1" [13_expert_parallel]="--ep 2"
                            [14_five_dimensions]="--pp 1 --ep 2")
# On the CPU, 13 walks as a mixture of experts (on a GPU it walks dense,
# 08's model: the GPU's mixture refuses fp16, which that walk takes, and
# test_13_expert_parallel runs it). Without the
# balancing loss: it is counted per micro-batch (as per rank), so 2
# micro-batches of 2 are a batch of 4 only without it
# (test_13_expert_parallel checks the groups).
declare -A cpu_layout=([13_expert_parallel]="--n_expert 4 --aux_loss_coef 0")
# 14 walks in 11's default two stages with 13's mixture on the CPU. On
# GPUs it runs 11's stages and 10's shards (test_14 runs pp 2 x dp 2 x tp 2
# there and checks the one-line refusals of the rest); its GPU flags are
# 11's step's, which the GPU walk walks in 11, so it skips 14 (CI's time:
# 35 s on the emulated GPU here, tried: they pass).
cpu_layout[14_five_dimensions]="--n_expert 4 --aux_loss_coef 0"

gpt_corpus "$TMP/corpus"
base=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --block_size 32 --batch_size 4
      --max_steps 3 --num_samples 0 --log_every 1 --eval_every 0 --device cpu --grad_accum 1)
sum='final parameters checksum ([0-9a-f]*),' l2='l2 norm ([0-9.e+-]*)'
n=0

# walk CHAPTER NAME FLAG... : one run of CHAPTER with the base flags and
# these; its output in $out, its folder $dir, its status in $status.
walk() {
    local chapter=$1 name=$2; shift 2
    n=$((n + 1)); dir=$TMP/$chapter-$name-$n.d; out=$TMP/$chapter-$n
    [[ $name == base ]] && dir=$TMP/$chapter-base.d
    # shellcheck disable=SC2086
    run_capture 180 "$out" "$ROOT/$chapter/$chapter" "${base[@]}" ${layout[$chapter]:-} --out_dir "$dir" \
        ${on_cpu:+${cpu_layout[$chapter]:-}} "$@"
    status=$?
}

# expect CHAPTER FLAG=VALUE CONDITION-STATUS DETAIL : the verdict, or the
# refusal's when the run was refused (status 1 or 2 with a line naming it).
expect() {
    local chapter=$1 what=$2 ok=$3 detail=$4 key="$1 $2" words line
    words=${refused[$key]:-}
    line=$(grep -m1 -iE 'error|refus|cannot|needs|not ' "$out" | head -c 300)
    if [[ -n $words ]]; then
        [[ $status -ne 0 ]] && grep -q -- "$words" "$out" && [[ $(grep -c -- "${what%%=*}" "$out") -ge 1 ]]
        verdict $? "flag walk: $chapter refuses $what, saying why" "status $status; expected a refusal with '$words': $line"
        return
    fi
    [[ $status -eq 0 && $ok -eq 0 ]]
    verdict $? "flag walk: $chapter $what: $detail" "status $status: ${line:-$(tail -n 2 "$out" | tr '\n' '|')}"
}

field_of() { field "$out" "$1"; }

# ---------------------------------------------------------------- on GPUs
# The flags that matter on a GPU only, in short runs of blocks of 16 tokens
# (the emulated GPU is slow). They come first: CI's emulated-GPU pass runs
# only them (CPU_PATHS=skip), the rest ran in its CPU-only pass.
if ! has_gpu; then
    skip "flag walk: --precision fp16, --loss_scale and --cuda_graph on a GPU" "no GPU here (make CUDA=emu test runs them on the emulated GPU)"
else
  base_cpu=("${base[@]}")
  base+=(--device cuda --block_size 16 --max_steps 2)
  for c in "${chapters[@]}"; do
    [[ $c == 14_five_dimensions ]] && continue # 11's GPU step (above)
    walk "$c" x --precision fp16 --loss_scale 1024
    grep -Eq 'loss scale (1024|512|2048)' "$out" && grep -q '^step: ' "$out"
    expect "$c" --precision=fp16 $? "fp16 with its loss scale from --loss_scale; the step line says how it launches"
    # --cuda_graph (on by default): 08's one process steps in one graph
    # launch; a chapter whose step is not 08's says why it cannot.
    if [[ $c == 08_gpt_wikitext || -n ${refused["$c --precision=fp16"]:-} ]]; then
        walk "$c" x --precision bf16
    fi
    if [[ $c == 08_gpt_wikitext ]]; then grep -q '^step: one CUDA graph launch' "$out"
    else grep -Eq '^step: (one CUDA graph launch|launched call by call \(no CUDA graph: [a-zA-Z].{8,}\))' "$out"; fi
    expect "$c" --cuda_graph $? "$(grep -m1 '^step: ' "$out" | cut -c7-)"
    walk "$c" x --cuda_graph=false
    grep -q 'no CUDA graph: --cuda_graph=false' "$out"; expect "$c" --cuda_graph=false $? "launched call by call"
  done
  base=("${base_cpu[@]}")
fi

# ---------------------------------------------------------------- on the CPU, every build
# (CI's emulated-GPU pass stops here: the same host code ran in its
# CPU-only pass. A CUDA build without a GPU walks it: its device choice differs.)
if is_emu; then cpu_paths "flag walk" || exit 0; fi
on_cpu=1

for c in "${chapters[@]}"; do
    walk "$c" base; cp "$out" "$TMP/$c.base"; base_sum=$(field "$TMP/$c.base" "$sum") base_l2=$(field "$TMP/$c.base" "$l2")
    [[ $status -eq 0 && -n $base_sum ]]; verdict $? "flag walk: $c trains with the base flags" "status $status: $(tail -n 3 "$out" | tr '\n' '|')"

    walk "$c" x --epochs 2 --max_steps 0 --batch_size 64
    s=$(field_of 'training: ([0-9]*) step'); p=$(field_of 'step\(s\) \(([0-9]*) per epoch')
    [[ -n $s && -n $p && $s -eq $((2 * p)) ]]; expect "$c" --epochs=2 $? "two epochs of steps ($s = 2 x $p)"
    walk "$c" x --batch_size 2
    grep -q 'x batch 2 x block 32' "$out"; expect "$c" --batch_size=2 $? "micro-batches of 2"
    # Two micro-batches of 2 are the base run's batch of 4: the same model
    # (in fp32, to rounding), by another road.
    walk "$c" x --grad_accum 2 --batch_size 2
    grep -q 'x 2 x batch 2 x block' "$out" && rel_near "$(field_of "$l2")" "$base_l2" 1e-6
    expect "$c" --grad_accum=2 $? "2 micro-batches of 2 a step train the base run's model (l2 $(field_of "$l2") vs $base_l2)"
    walk "$c" x --lr 0.003 --min_lr 0.0002
    grep -q 'lr 0.003 -> 0.0002,' "$out" && [[ $(field_of "$sum") != "$base_sum" ]]
    expect "$c" --lr=0.003 $? "the schedule's ends, and another model"
    walk "$c" x --warmup_steps 1 --max_steps 10
    grep -q 'warm-up 1$' "$out" && grep -q 'step 1/10 .* lr 1.00e-03' "$out"; expect "$c" --warmup_steps=1 $? "one warm-up step"
    walk "$c" x --weight_decay 0.5
    [[ $(field_of "$sum") != "$base_sum" ]]; expect "$c" --weight_decay=0.5 $? "another model"
    walk "$c" x --grad_clip 0.01
    [[ $(field_of "$sum") != "$base_sum" ]]; expect "$c" --grad_clip=0.01 $? "clipped steps: another model"
    walk "$c" x --max_steps 2
    grep -q '^training: 2 step(s)' "$out"; expect "$c" --max_steps=2 $? "2 steps"
    walk "$c" x --eval_every 1
    [[ $(grep -c '^validation after step' "$out") -eq 3 ]]; expect "$c" --eval_every=1 $? "a validation after every step"
    walk "$c" x --log_every 2
    [[ $(grep -c '^epoch 1 | step' "$out") -eq 2 ]]; expect "$c" --log_every=2 $? "a progress line every 2 steps (and the last)"
    walk "$c" x --num_workers 1
    [[ $(field_of "$sum") == "$base_sum" ]]; expect "$c" --num_workers=1 $? "the same batches, made a step ahead: the same model"
    walk "$c" x --save_every 1
    [[ $(grep -c '^saved: ' "$out") -eq 2 ]]; expect "$c" --save_every=1 $? "the model saved after the epoch too"
    walk "$c" x --save_every 1 --snapshot_path "$TMP/$c-snap/s.safetensors"
    grep -q '^snapshot saved' "$out" && ls "$TMP/$c-snap/" | grep -q safetensors
    expect "$c" --snapshot_path $? "a snapshot written"
    walk "$c" x --nprocs 2 --backend cpu --timeout 30 ${replicas_layout[$c]:-}
    grep -q '(2 replica(s)' "$out" && grep -q 'backend cpu' "$out"; expect "$c" --nprocs=2 $? "2 ranks, 2 replicas, over the cpu backend"
    cp "$out" "$TMP/$c.two"; two_sum=$(field "$TMP/$c.two" "$sum")
    for wire in bf16 fp16; do
        walk "$c" x --nprocs 2 --grad_compress "$wire" ${replicas_layout[$c]:-}
        s=$(field_of "$sum"); [[ -n $s && $s != "$two_sum" ]]
        expect "$c" --grad_compress=$wire $? "gradients rounded to $wire on the wire: another model"
    done
    walk "$c" x --nprocs 2 --grad_compress powersgd ${replicas_layout[$c]:-}; p1=$(field_of "$sum")
    walk "$c" x --nprocs 2 --grad_compress powersgd --powersgd_rank 2 ${replicas_layout[$c]:-}
    s=$(field_of "$sum"); [[ -n $s && -n $p1 && $s != "$p1" && $s != "$two_sum" ]]
    expect "$c" --grad_compress=powersgd $? "low-rank gradients, another model with --powersgd_rank 2"
    walk "$c" x --seed 5
    [[ $(field_of "$sum") != "$base_sum" ]]; expect "$c" --seed=5 $? "other weights"
    walk "$c" x --preset default --block_size 16 --max_steps 1
    grep -q '^model: .*block 16, 4 layers, 4 heads, 256 channels' "$out"; expect "$c" --preset=default $? "the default model's size"
    walk "$c" x --vocab_size 280 --n_layer 3 --n_head 4 --n_embd 48 --block_size 16
    grep -q '^model: .*vocabulary 280, block 16, 3 layers, 4 heads, 48 channels' "$out"
    expect "$c" --vocab_size,--n_layer,--n_head,--n_embd,--block_size $? "the model's size"
    walk "$c" x --verify_data=true
    [[ $status -ne 0 ]] && grep -qi 'wikitext' "$out"; s=$?; status=0
    expect "$c" --verify_data $s "a corpus that is not WikiText-2 is refused when checked"
    walk "$c" x --num_samples 2 --sample_tokens 6 --temperature 0.5 --top_k 5 --prompt "the cat"
    [[ $(grep -c -- '^--- sample [12] (temperature 0.5, top_k 5' "$out") -eq 2 ]] && grep -q '^the cat' "$out"
    expect "$c" --num_samples,--temperature,--top_k,--prompt $? "2 samples of the prompt, as asked"
    run_capture 120 "$TMP/$c.gen" "$ROOT/$c/$c" --generate --out_dir "$TMP/$c-base.d" --num_samples 1 --sample_tokens 4
    status=$?; out=$TMP/$c.gen
    grep -q '^--- sample 1' "$out" && grep -q "$c-base.d/model.safetensors" "$out"
    expect "$c" --generate,--out_dir $? "samples from the model the base run saved in its --out_dir"
    walk "$c" x --device cpu --precision fp32 --cuda_graph=false --loss_scale 1024
    head -n 1 "$out" | grep -q 'running on CPU'; expect "$c" --device=cpu $? "the CPU (fp32; --cuda_graph and --loss_scale matter on GPUs only)"
    walk "$c" x --device cpu --precision bf16
    [[ $status -eq 2 ]] && grep -q 'needs a GPU' "$out"; s=$?; status=0
    expect "$c" --precision=bf16 $s "refused on the CPU, saying why"
    walk "$c" x --loss_scale 1000
    [[ $status -eq 2 ]] && grep -q 'not a power of two' "$out"; s=$?; status=0
    expect "$c" --loss_scale=1000 $s "refused: not a power of two"
    walk "$c" x --plan
    [[ $status -eq 0 ]] && grep -q '^memory plan stage 0: parameters [0-9]' "$out" && grep -q '^sent plan stage 0: dp ' "$out" &&
        ! grep -qE '^(epoch|training|data):' "$out"
    expect "$c" --plan $? "the planner's rows (gpt/plan.h), and no training"
done

# A planted bug: a chapter whose step takes one micro-batch whatever
# --grad_accum says still trains, still prints "2 x batch 2" - and is caught
# by the check above, which wants the model of the same total batch.
planted=$(plant one_micro 08_gpt_wikitext/08_gpt_wikitext.c 'micro < o->grad_accum; micro++' 'micro < 1; micro++' \
          08_gpt_wikitext 08_gpt_wikitext)
a= b=
if [[ -n $planted ]]; then
    run_capture 120 "$TMP/planted" "$planted" "${base[@]}" --out_dir "$TMP/planted.d" --grad_accum 2 --batch_size 2
    a=$(field "$TMP/planted" "$l2"); b=$(field "$TMP/08_gpt_wikitext.base" "$l2")
    [[ -n $a && -n $b ]] && ! rel_near "$a" "$b" 1e-6
else false; fi
verdict $? "flag walk planted: a step that ignores --grad_accum fails the --grad_accum check" "$(planted_why one_micro)l2 '$a' vs '$b'"

