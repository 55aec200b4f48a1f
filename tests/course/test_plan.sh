# The planner (gpt/plan.h) held to the runs: for shapes of chapters 08-11,
# what --plan predicts for each pipeline stage's rank that holds the most -
# its bytes by kind (parameters, gradients, optimizer state, activations,
# communication buffers, other) and its bytes sent per step along dp, tp,
# pp - against the rows the chapter prints, measured, after training the
# same flags (09: zero.h's allocations and calls; 10 and 11: the model's
# buffers, the bytes of their all-reduces and messages). On CPU ranks the
# two must be the same bytes: both count every buffer and every message
# exactly. On (emulated) GPUs too: the planner mirrors the GPU model's
# memory plan buffer for buffer. --plan trains nothing: it needs no data,
# spawns no ranks, and ends at once. Planted bugs in the planner's
# formulas (a slice that forgets its 1/N, DDP's all-reduce without its
# 2(N-1)/N, hybrid sharding without the replicas' all-reduce, tensor
# parallelism without the backward pass's all-reduces, 1F1B holding every
# micro-batch, the tied embedding's all-reduce forgotten, the GPU's LM head
# without its padding) are each caught by the check they break.
source "$(dirname "$0")/../lib.sh"
p08="$ROOT/08_gpt_wikitext/08_gpt_wikitext" p09="$ROOT/09_zero_fsdp/09_zero_fsdp"
p10="$ROOT/10_tensor_parallel/10_tensor_parallel" p11="$ROOT/11_pipeline_parallel/11_pipeline_parallel"
for p in "$p08" "$p09" "$p10" "$p11"; do [[ -x $p ]] || { fail "plan: binaries" "build first (make): no $p"; exit 1; }; done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT COURSE_BACKEND COURSE_DEVICE
export OMP_NUM_THREADS=1

gpt_corpus "$TMP/corpus"
# The tokenizer reaches the 300 tokens --vocab_size asks for on this corpus
# (the "model:" line says so; --plan takes --vocab_size as the vocabulary).
common=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000
        --max_steps 2 --batch_size 2)

# rows FILE SOURCE : the memory and sent rows of SOURCE (plan or measured),
# the source's name left out, so that the two sides' rows read the same.
rows() { grep -E "^(memory|sent) $2 stage " "$1" | sed -E "s/^(memory|sent) $2 /\1 /"; }

# agree NAME PROG FLAGS... : PROG trains with FLAGS (its output $TMP/NAME)
# and prints its measured rows; PROG --plan with the same FLAGS prints the
# plan's ($TMP/NAME.plan); the rows must be the same, stage by stage.
# Sets diff_line: the first pair that differs.
agree() {
    local name=$1 prog=$2 status; shift 2
    run_capture 300 "$TMP/$name" "$prog" "${common[@]}" "$@" --out_dir "$TMP/$name.d"; status=$?
    run_capture 30 "$TMP/$name.plan" "$prog" "${common[@]}" "$@" --out_dir "$TMP/$name.d" --plan || return 1
    compare_rows "$TMP/$name" "$TMP/$name.plan" && [[ $status -eq 0 ]]
}

# compare_rows MEASURED PLAN [KIND] : the rows (only KIND's: memory or
# sent) agree, and there are some.
compare_rows() {
    local a b
    a=$(rows "$1" measured | grep -E "^${3:-}"); b=$(rows "$2" plan | grep -E "^${3:-}")
    diff_line=$(diff <(echo "$a") <(echo "$b") | grep -E '^[<>]' | head -n 2 | tr '\n' ' ')
    [[ -n $a && $a == "$b" ]]
}

# caught MEASURED-RUN PLANTED-PROG KIND FLAGS... : the planted copy's --plan
# rows of KIND (memory or sent) for FLAGS are not the run's measured rows.
caught() {
    local measured=$1 planted=$2 kind=$3; shift 3
    [[ -n $planted ]] || return 1
    run_capture 30 "$TMP/planted.plan" "$planted" "${common[@]}" "$@" --plan || return 1
    [[ -n $(rows "$TMP/planted.plan" plan) ]] && ! compare_rows "$measured" "$TMP/planted.plan" "$kind"
}

# ---------------------------------------------------------------- on GPUs
# One shape on (emulated) GPUs, in fp32 and bf16: two pipeline stages, each
# split over 2 tp ranks (4 GPUs, nccl): the GPU model's memory plan (its
# padded LM head, 16-bit activations and weight copy, flash attention's
# log-sum-exps, the cuBLAS workspace), 1F1B's slots, the activations'
# bytes on the wire (bf16: 2 a number) over tp and pp.
if ! has_gpu; then
    for p in fp32 bf16; do
        skip "plan gpu: 11 pp 2 x tp 2 on GPUs in $p, measured = --plan" "no GPU here (a CPU-only build, or no GPU: make CUDA=emu test runs this on the emulated GPU)"
    done
else
    # The emulator is slow: short validation and test splits (the tokenizer
    # still trains on the whole training split).
    mkdir -p "$TMP/gcorpus" && cp "$TMP/corpus/train.txt" "$TMP/gcorpus/"
    for f in valid test; do head -n 24 "$TMP/corpus/$f.txt" >"$TMP/gcorpus/$f.txt"; done
    for p in fp32 bf16; do
        agree "gpu_$p" "$p11" --data_dir "$TMP/gcorpus" --device cuda --precision "$p" --block_size 16 --pp 2 --tp 2 --grad_accum 2
        verdict $? "plan gpu: 11 pp 2 x tp 2 on GPUs in $p, measured = --plan (memory and bytes sent, each stage)" \
            "$diff_line$(grep -m1 -i error "$TMP/gpu_$p")"
    done
    # Planted: the GPU plan without the LM head's padding rows (--plan
    # needs no GPU: a CPU copy of the course plans the GPU model). CI's
    # emulated pass builds no CPU copies (PLANTED_BUGS=skip): this SKIPs
    # there and runs in a local make CUDA=emu test.
    planted=$(plant gpupad gpt/plan.h 'size_t pad = st->head ? (Vp - V) * C : 0;' 'size_t pad = 0;' \
        11_pipeline_parallel 11_pipeline_parallel)
    caught "$TMP/gpu_bf16" "$planted" memory --data_dir "$TMP/gcorpus" --device cuda --precision bf16 --block_size 16 \
        --pp 2 --tp 2 --grad_accum 2
    status=$?
    name="plan planted: the GPU plan without the LM head's padding is caught (11 pp 2 x tp 2, bf16, memory)"
    if [[ -z $planted && $(planted_why gpupad) == "$PLANT_SKIPPED"* ]]; then
        skip "$name" "no CPU copies in this pass (PLANTED_BUGS=skip), and CI's CPU-only pass has no GPU: it runs in a local make CUDA=emu test"
    else
        verdict $status "$name" "$(planted_why gpupad)"
    fi
fi

# The layout table of docs/choosing_a_layout.md is the planner's output
# (tools/plan_layouts), not numbers typed by hand: pasted, and still the same.
layouts="$ROOT/tools/plan_layouts" doc="$ROOT/docs/choosing_a_layout.md"
if [[ -x $layouts ]]; then
    "$layouts" >"$TMP/layouts" 2>&1; status=$?
    sed -n '/^<!-- plan_layouts: begin -->$/,/^<!-- plan_layouts: end -->$/p' "$doc" | grep -v '^<!--' | grep -v '^```' >"$TMP/layouts.doc"
    [[ $status -eq 0 && -s $TMP/layouts.doc ]] && diff -q "$TMP/layouts" "$TMP/layouts.doc" >/dev/null
    verdict $? "plan: docs/choosing_a_layout.md's table is tools/plan_layouts' output" \
        "status $status; $(diff "$TMP/layouts" "$TMP/layouts.doc" | head -n 3 | tr '\n' '|') (run make plan-layouts and paste it)"
else
    fail "plan: docs/choosing_a_layout.md's table is tools/plan_layouts' output" "no tools/plan_layouts (make tools)"
fi

cpu_paths "plan" || exit 0

# ---------------------------------------------------------------- on CPU ranks
cpu=(--device cpu)
# --plan alone: no data (the folder does not exist), no ranks, no training.
run_capture 30 "$TMP/alone" "$p11" --data_dir "$TMP/none" --preset tiny --pp 2 --dp 2 --plan; status=$?
[[ $status -eq 0 ]] && [[ $(grep -c '^memory plan stage [01]:' "$TMP/alone") -eq 2 ]] && ! grep -qE '^(ranks|data|epoch|training)' "$TMP/alone"
verdict $? "plan: --plan prints each stage's rows and trains nothing (no data, no ranks)" "status $status: $(head -c 300 "$TMP/alone")"
run_capture 30 "$TMP/bad" "$p10" --preset tiny --tp 3 --plan; status=$?
[[ $status -eq 2 ]] && grep -q 'plan.*tp must divide n_head' "$TMP/bad"
verdict $? "plan: --plan refuses a layout that cannot be built, in one line naming it" "status $status: $(head -c 300 "$TMP/bad")"

# 08, dp 2: its line "gradients all-reduced: B bytes per step per rank" is
# what entered the all-reduce; a ring over 2 ranks sends 2(2-1)/2 B = B.
run_capture 120 "$TMP/d08" "$p08" "${common[@]}" "${cpu[@]}" --nprocs 2 --out_dir "$TMP/d08.d"; status=$?
run_capture 30 "$TMP/d08.plan" "$p08" "${common[@]}" "${cpu[@]}" --nprocs 2 --plan
got=$(field "$TMP/d08" '^gradients all-reduced: ([0-9]+) bytes per step') want=$(field "$TMP/d08.plan" '^sent plan stage 0: dp ([0-9]+) ')
[[ $status -eq 0 && -n $got && $got == "$want" ]]
verdict $? "plan: 08 dp 2 sends the bytes --plan says ($got)" "status $status, measured '$got', plan '$want'"

# 09: DDP, ZeRO-1, 2, 3 on 4 ranks (2 micro-batches: ZeRO-2 and 3
# reduce-scatter, and ZeRO-3 gathers, on each).
agree z0 "$p09" "${cpu[@]}" --nprocs 4 --shard 0
verdict $? "plan: 09 DDP (dp 4) measured = --plan" "$diff_line"
agree z1 "$p09" "${cpu[@]}" --nprocs 4 --shard 1
verdict $? "plan: 09 ZeRO-1 on 4 ranks measured = --plan" "$diff_line"
agree z2 "$p09" "${cpu[@]}" --nprocs 4 --shard 2 --grad_accum 2
verdict $? "plan: 09 ZeRO-2 on 4 ranks, 2 micro-batches, measured = --plan" "$diff_line"
agree z3 "$p09" "${cpu[@]}" --nprocs 4 --shard 3 --grad_accum 2
verdict $? "plan: 09 ZeRO-3 on 4 ranks, 2 micro-batches, measured = --plan" "$diff_line"

# 09's hybrid sharding (--replicate 2: 2 replicas x 2 ranks sharing the
# slices): ZeRO-1, 2 and 3 over pairs, the slices all-reduced over the
# replicas once a step.
for z in 1 2 3; do
    flags=(--nprocs 4 --replicate 2 --shard $z); [[ $z -gt 1 ]] && flags+=(--grad_accum 2)
    agree "h$z" "$p09" "${cpu[@]}" "${flags[@]}"
    verdict $? "plan: 09 hybrid ZeRO-$z, 2 replicas x 2 ranks${flags[6]:+, 2 micro-batches}, measured = --plan" "$diff_line"
done

# 10: tp 2, and dp 2 x tp 2 with 2 micro-batches.
agree t2 "$p10" "${cpu[@]}" --tp 2
verdict $? "plan: 10 tp 2 measured = --plan" "$diff_line"
agree t22 "$p10" "${cpu[@]}" --dp 2 --tp 2 --grad_accum 2
verdict $? "plan: 10 dp 2 x tp 2, 2 micro-batches, measured = --plan" "$diff_line"

# 11: pp 2, and pp 2 x dp 2, in both schedules (4 micro-batches: GPipe
# holds 4, 1F1B 2 on stage 0 and 1 on stage 1).
for s in gpipe 1f1b; do
    agree "p2_$s" "$p11" "${cpu[@]}" --pp 2 --schedule "$s"
    verdict $? "plan: 11 pp 2 ($s) measured = --plan, each stage" "$diff_line"
    agree "p22_$s" "$p11" "${cpu[@]}" --pp 2 --dp 2 --schedule "$s"
    verdict $? "plan: 11 pp 2 x dp 2 ($s) measured = --plan, each stage" "$diff_line"
done

# The same under mpirun (--backend mpi, tests/library/test_mpi.sh): the
# rows do not depend on the backend that carries the bytes.
if ! command -v mpirun >/dev/null 2>&1; then
    skip "plan: 11 pp 2 x dp 2 under mpirun measured = --plan" "mpirun not found"
else
    mpi=(mpirun -np); mpirun --version 2>&1 | grep -q "Open MPI" && mpi=(mpirun --oversubscribe --allow-run-as-root -np)
    run_capture 300 "$TMP/mpi" "${mpi[@]}" 4 "$p11" "${common[@]}" "${cpu[@]}" --backend mpi --pp 2 --dp 2 --out_dir "$TMP/mpi.d"
    status=$?
    if grep -q "this build has no MPI" "$TMP/mpi"; then
        skip "plan: 11 pp 2 x dp 2 under mpirun measured = --plan" "this build has no MPI"
    else
        compare_rows "$TMP/mpi" "$TMP/p22_1f1b.plan" && [[ $status -eq 0 ]]
        verdict $? "plan: 11 pp 2 x dp 2 under mpirun (--backend mpi) measured = --plan, each stage" "status $status: $diff_line"
    fi
fi

# ---------------------------------------------------------------- planted bugs
# Each in the planner (gpt/plan.h), each caught by the check of the shape it
# breaks: its --plan rows no longer match that run's measured rows.
# Two bugs in one copy of 09, each in a part of the plan the other leaves
# alone: ZeRO's slices without their 1/N, DDP's all-reduce counted as the
# bytes it sums rather than the 2(N-1)/N of them a ring sends (on 2 ranks
# the two are the same: the DDP shape has 4).
planted=$(plant plan09 gpt/plan.h 'double slice = (double)((b.count + (size_t)n - 1) / (size_t)n);' \
    'double slice = (double)b.count;' 09_zero_fsdp 09_zero_fsdp \
    'if (z == 0) sent[PLAN_DP] = plan_ring_all_reduce(l->wire_bytes * P, dp * l->cp);' \
    'if (z == 0) sent[PLAN_DP] = l->wire_bytes * P;')
for z in 1 2 3; do
    flags=(--nprocs 4 --shard $z); [[ $z -gt 1 ]] && flags+=(--grad_accum 2)
    caught "$TMP/z$z" "$planted" sent "${cpu[@]}" "${flags[@]}"
    verdict $? "plan planted: ZeRO's slices without their 1/N are caught (09 ZeRO-$z, bytes sent)" "$(planted_why plan09)"
done
caught "$TMP/z0" "$planted" sent "${cpu[@]}" --nprocs 4 --shard 0
verdict $? "plan planted: DDP's all-reduce without its 2(N-1)/N is caught (09 DDP on 4 ranks, bytes sent)" "$(planted_why plan09)"
planted=$(plant hybrid09 gpt/plan.h 'return plan_ring_all_reduce(4 * sl.shard, l->replicate);' 'return 0;' \
    09_zero_fsdp 09_zero_fsdp)
caught "$TMP/h3" "$planted" sent "${cpu[@]}" --nprocs 4 --replicate 2 --shard 3 --grad_accum 2
verdict $? "plan planted: hybrid sharding without the replicas' all-reduce is caught (09 hybrid ZeRO-3, bytes sent)" \
    "$(planted_why hybrid09)"
# Three bugs in one copy of 11, each in a part of the plan that the
# others leave alone: tp's traffic (no pipeline), 1F1B's memory, GPipe's
# traffic (its memory holds every micro-batch anyway).
planted=$(plant plan11 gpt/plan.h 'sent[PLAN_TP] = plan_ring_all_reduce(4 * L * M * N * C * act, l->tp);' \
    'sent[PLAN_TP] = plan_ring_all_reduce(2 * L * M * N * C * act, l->tp);' 11_pipeline_parallel 11_pipeline_parallel \
    'l->gpipe ? l->M : (l->pp - s < l->M ? l->pp - s : l->M);' 'l->M;' \
    'if (st.embedding || st.head) sent[PLAN_PP] +=' 'if (false) sent[PLAN_PP] +=')
caught "$TMP/t2" "$planted" sent "${cpu[@]}" --pp 1 --tp 2 --grad_accum 1
verdict $? "plan planted: tp without the backward pass's all-reduces is caught (10 tp 2, bytes sent)" "$(planted_why plan11)"
caught "$TMP/t22" "$planted" sent "${cpu[@]}" --pp 1 --dp 2 --tp 2 --grad_accum 2
verdict $? "plan planted: tp without the backward pass's all-reduces is caught (10 dp 2 x tp 2, bytes sent)" "$(planted_why plan11)"
for d in "" 2; do
    caught "$TMP/p${d:-2}${d}_1f1b" "$planted" memory "${cpu[@]}" --pp 2 ${d:+--dp $d} --schedule 1f1b
    verdict $? "plan planted: 1F1B holding every micro-batch is caught (11 pp 2${d:+ x dp $d}, memory)" "$(planted_why plan11)"
    caught "$TMP/p${d:-2}${d}_gpipe" "$planted" sent "${cpu[@]}" --pp 2 ${d:+--dp $d} --schedule gpipe
    verdict $? "plan planted: the tied wte's all-reduce forgotten is caught (11 pp 2${d:+ x dp $d} gpipe, bytes sent)" "$(planted_why plan11)"
done
