# Chapter 12, context parallelism: each sequence split over --cp ranks
# (with data parallelism over --dp) trains the model one process trains
# with the same total batch - ring and ulysses attention, zigzag and
# contiguous slices, the weights and AdamW's moments (unclipped); what a
# rank holds, sends and computes matches the formulas; snapshots and the
# saved model are whole (a run resumes with another --cp, chapter 08
# samples from the saved model); bad layouts are refused. On CPU ranks in
# every build and under mpirun, and on (emulated) GPUs with nccl in fp32,
# bf16 and fp16. Planted bugs (tests/lib.sh, plant) show that each check
# sees what it is for.
source "$(dirname "$0")/../lib.sh"
prog="$ROOT/12_context_parallel/12_context_parallel"
p08="$ROOT/08_gpt_wikitext/08_gpt_wikitext"
compare="$ROOT/tests/unit/test_gpt_compare"
[[ -x "$prog" && -x "$p08" && -x "$compare" ]] || { fail "cp: binaries" "build first (make)"; exit 1; }
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT COURSE_BACKEND
export OMP_NUM_THREADS=1

gpt_corpus "$TMP/corpus"
common=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000)
cpu=("${common[@]}" --device cpu)
valid='validation after step [0-9]* .*: loss ([0-9.]*) ' sum='checksum ([0-9a-f]*),'

# same ONE MANY TOL [STATUS]: the run MANY (its output $TMP/MANY, its model
# $TMP/MANY.d) trained the model the run ONE did: the saved models differ
# by at most TOL relative (L2 over all parameters: tests/unit/test_gpt_compare),
# the validation losses too. Sets r, va and vb.
same() {
    local one=$1 many=$2 tol=$3 status=${4:-0}
    r=$(models_apart "$TMP/$one.d/model.safetensors" "$TMP/$many.d/model.safetensors")
    va=$(field "$TMP/$one" "$valid"); vb=$(field "$TMP/$many" "$valid")
    [[ $status -eq 0 ]] && near "$r" 0 "$tol" && rel_near "$va" "$vb" "$tol"
}

# ---------------------------------------------------------------- on GPUs
# The GPU model (gpt_cuda.cu with gpt_cuda_cp.cuh) on real GPUs or the
# emulated ones of a CUDA=emu build, one per rank, talking NCCL. Blocks of
# 16 tokens, 8 steps: the emulator is slow. Tolerances are chapter 08's:
# 1e-5 in fp32 (two GPU runs add in other orders), 2e-2 in bf16 and fp16
# (16-bit activations, rounded at other places: the merged output of
# ring attention is rounded once, after the merge). Ring over 2 and 4 GPUs
# (over 4, the last ranks' queries merge up to four partials), ulysses in
# fp32 and bf16; a bug planted in the GPU merge kernel shows that the fp32
# check sees it.
if ! has_gpu; then
    for what in "cp 2 ring in fp32" "cp 4 ring in fp32" "dp 2 x cp 2 ulysses in fp32" "cp 2 ring in bf16" \
                "cp 2 ulysses in bf16" "cp 2 ring (none) in fp16"; do
        skip "cp gpu: $what equals one GPU" "no GPU here (a CPU-only build, or no GPU: make CUDA=emu test runs these on the emulated GPU)"
    done
    skip "cp gpu planted: partials merged without their log-sum-exps in the GPU kernel" \
        "no GPU here (make CUDA=emu test runs it on the emulated GPU)"
else
    gpu=("${common[@]}" --device cuda --block_size 16 --max_steps 8 --batch_size 4)
    for p in fp32 bf16 fp16; do
        run_capture 300 "$TMP/g_one_$p" "$prog" "${gpu[@]}" --precision $p --out_dir "$TMP/g_one_$p.d"
    done
    # dp 2 x cp 2: two replicas of batch 2, each sequence over 2 GPUs.
    for l in "g_ring:fp32:1e-5:--cp 2" "g_ring4:fp32:1e-5:--cp 4" \
             "g_uly:fp32:1e-5:--dp 2 --cp 2 --batch_size 2 --cp_attention ulysses" "g_bf16:bf16:2e-2:--cp 2" \
             "g_ulyb:bf16:2e-2:--cp 2 --cp_attention ulysses" "g_fp16:fp16:2e-2:--cp 2 --cp_balance none"; do
        IFS=: read -r name p tol flags <<<"$l"
        # shellcheck disable=SC2086
        run_capture 300 "$TMP/$name" "$prog" "${gpu[@]}" --precision $p $flags --out_dir "$TMP/$name.d"; status=$?
        grep -q 'backend nccl' "$TMP/$name" || status=98
        grep -q '^  cp rank 1: counted forward .*: the formula'"'"'s$' "$TMP/$name" || status=97
        same "g_one_$p" "$name" "$tol" $status
        verdict $? "cp gpu: $flags (nccl) equals one GPU in $p (models $r apart, at most $tol; traffic the formula's)" \
            "status $status, relative '$r', valid $va vs $vb: $(grep -m1 -E 'error|NOT the formula' "$TMP/$name")"
    done
    # Planted in the GPU merge kernel (a copy built for the emulated GPU, as
    # test_13 does): the partial outputs added, not weighed by their
    # log-sum-exps. cp 2 ring in fp32 must then differ from one GPU.
    r=
    planted=$(PLANT_CUDA=emu plant gpu_merge gpt/gpt_cuda_cp.cuh \
        'for (int c = 0; c < hs; c++) out[c] = (wa * out[c] + wb * in[c]) / sum;' \
        'for (int c = 0; c < hs; c++) out[c] = out[c] + in[c] + 0.0f * wa * wb * sum;' 12_context_parallel 12_context_parallel)
    [[ -n $planted ]] && { run_capture 300 "$TMP/pl_gmerge" "$planted" "${gpu[@]}" --precision fp32 --cp 2 \
                               --out_dir "$TMP/pl_gmerge.d"; ! same g_one_fp32 pl_gmerge 1e-5 $?; } && [[ -n $r ]]
    verdict $? "cp gpu planted: partials merged without their log-sum-exps in the GPU kernel make cp 2 ring in fp32 differ from one GPU (models $r apart)" \
        "$(planted_why gpu_merge)relative '$r'"
fi

# ---------------------------------------------------------------- on CPU ranks, every build
cpu_paths "cp" || { no_leftovers "cp: no process left behind" "12_context_parallel/12_context_parallel"; exit 0; }
# One process with batch 8 is the reference. cp N splits each sequence of
# 32 tokens over N ranks (the same batch); dp 2 x cp 2 gives each replica
# 4 of the 8 sequences, split over 2 ranks each.
base=(--max_steps 15 --batch_size 8)
run_capture 120 "$TMP/one" "$prog" "${cpu[@]}" "${base[@]}" --out_dir "$TMP/one.d"
layouts=("cp2:--cp 2" "cp4:--cp 4" "cp2u:--cp 2 --cp_attention ulysses" "cp2n:--cp 2 --cp_balance none"
         "cp4n:--cp 4 --cp_balance none" "cp2un:--cp 2 --cp_attention ulysses --cp_balance none"
         "mesh:--dp 2 --cp 2 --batch_size 4")
for l in "${layouts[@]}"; do
    name=${l%%:*} flags=${l#*:}
    # shellcheck disable=SC2086
    run_capture 120 "$TMP/$name" "$prog" "${cpu[@]}" "${base[@]}" $flags --out_dir "$TMP/$name.d"
    same one "$name" 1e-6 $?
    verdict $? "cp: $flags equals one process after 15 steps (fp32, CPU: models $r apart, valid $vb)" \
        "relative '$r' (at most 1e-6), valid $va vs $vb: $(grep -m1 error "$TMP/$name")"
done
# ulysses over 4 ranks needs 4 heads.
run_capture 120 "$TMP/one4" "$prog" "${cpu[@]}" "${base[@]}" --n_head 4 --out_dir "$TMP/one4.d"
run_capture 120 "$TMP/cp4u" "$prog" "${cpu[@]}" "${base[@]}" --n_head 4 --cp 4 --cp_attention ulysses --out_dir "$TMP/cp4u.d"
same one4 cp4u 1e-6 $?
verdict $? "cp: --cp 4 --cp_attention ulysses (4 heads, one each) equals one process (models $r apart)" \
    "relative '$r', valid $va vs $vb: $(grep -m1 error "$TMP/cp4u")"
# With --cp 1 the program is chapter 08, bit for bit.
run_capture 120 "$TMP/ch08" "$p08" "${cpu[@]}" "${base[@]}" --out_dir "$TMP/ch08.d"
a=$(field "$TMP/one" "$sum"); b=$(field "$TMP/ch08" "$sum")
[[ -n "$a" && "$a" == "$b" ]]
verdict $? "cp: --cp 1 trains chapter 08's model bit for bit ($a)" "checksums '$a' vs '$b'"

# Without clipping, AdamW's moments too (tests/lib.sh, snapshot_norms): a
# gradient cp times too large (the ranks' gradients summed, not averaged)
# passes a comparison of weights with clipping on, and fails this one.
unclipped=(--grad_clip 0 --save_every 1 --max_steps 15 --batch_size 8)
run_capture 120 "$TMP/one_nc" "$prog" "${cpu[@]}" "${unclipped[@]}" --out_dir "$TMP/one_nc.d" \
    --snapshot_path "$TMP/one_nc.d/s.safetensors"
na=$(snapshot_norms "$TMP/one_nc.d")
for l in "ring:--cp 2" "ulysses:--cp 2 --cp_attention ulysses --cp_balance none"; do
    name=nc_${l%%:*} flags=${l#*:}
    # shellcheck disable=SC2086
    run_capture 120 "$TMP/$name" "$prog" "${cpu[@]}" "${unclipped[@]}" $flags --out_dir "$TMP/$name.d" \
        --snapshot_path "$TMP/$name.d/s.safetensors"; status=$?
    nb=$(snapshot_norms "$TMP/$name.d")
    [[ $status -eq 0 ]] && norms_near "$na" "$nb" 1e-6
    verdict $? "cp: without clipping, $flags equals one process in weights and AdamW's moments (l2 of p, m, v: $nb vs $na)" \
        "status $status, norms '$nb' vs '$na': $(grep -m1 error "$TMP/$name")"
done

# Planted bugs in the model's attention (gpt/context_parallel.h), one copy
# built with each: every one still trains, and every one is caught.
# cp2 runs: "NAME|OLD|NEW|what it is"
plants=(
    "no_mask|int p = qs.first + t, visible = p - ks.first + 1;|int p = qs.first + t, visible = ks.count + 0 * p;|the diagonal block's causal mask forgotten"
    "no_rescale|for (int c = 0; c < n; c++) o[c] = (wa * o[c] + wb * o_b[c]) / sum;|for (int c = 0; c < n; c++) o[c] = o[c] + o_b[c] + 0 * wa * wb * sum;|partial results added without rescaling by their log-sum-exps"
)
for p in "${plants[@]}"; do
    IFS='|' read -r name old new what <<<"$p"
    planted=$(plant "$name" gpt/context_parallel.h "$old" "$new" 12_context_parallel 12_context_parallel)
    [[ -n $planted ]] && { run_capture 120 "$TMP/pl_$name" "$planted" "${cpu[@]}" "${base[@]}" --cp 2 --out_dir "$TMP/pl_$name.d"
                           ! same one "pl_$name" 1e-6 $?; } && [[ -n $r ]]
    verdict $? "cp planted: $what makes cp 2 differ from one process (models $r apart)" "$(planted_why "$name")relative '$r'"
done
planted=$(plant local_pos gpt/gpt.h 'gpt_tensor_in(m, embeddings, emb, 1), m->cp ? m->cp->pos : NULL,' \
    'gpt_tensor_in(m, embeddings, emb, 1), NULL,' 12_context_parallel 12_context_parallel)
[[ -n $planted ]] && { run_capture 120 "$TMP/pl_pos" "$planted" "${cpu[@]}" "${base[@]}" --cp 2 --out_dir "$TMP/pl_pos.d"
                       ! same one pl_pos 1e-6 $?; } && [[ -n $r ]]
verdict $? "cp planted: local positions for the position embedding make cp 2 differ from one process (models $r apart)" \
    "$(planted_why local_pos)relative '$r'"
np=
planted=$(plant cp_sum gpt/context_parallel.h 'return (double)B * cp->whole / cp->ways; }' \
    'return (double)B * cp->whole / cp->ways / cp->ways; }' 12_context_parallel 12_context_parallel)
if [[ -n $planted ]]; then
    run_capture 120 "$TMP/pl_sum" "$planted" "${cpu[@]}" "${base[@]}" --cp 2 --out_dir "$TMP/pl_sum.d"
    same one pl_sum 1e-6 $?; clipped=$?
    run_capture 120 "$TMP/pl_nc" "$planted" "${cpu[@]}" "${unclipped[@]}" --cp 2 --out_dir "$TMP/pl_nc.d" \
        --snapshot_path "$TMP/pl_nc.d/s.safetensors"
    np=$(snapshot_norms "$TMP/pl_nc.d")
    [[ -n $np ]] && ! norms_near "$na" "$np" 1e-6
else false; fi
verdict $? "cp planted: the cp ranks' gradients summed, not averaged, fails the moments check (clipped weights: $([[ ${clipped:-1} -eq 0 ]] && echo "passed, $r apart" || echo "failed too"); l2 of p, m, v: $np vs $na)" \
    "$(planted_why cp_sum)planted norms '$np' vs '$na'"

# The mesh: rank -> (dp, cp); cp groups are consecutive ranks.
grep -q '^mesh: dp 2 x cp 2 (4 ranks' "$TMP/mesh" && grep -Eq '^ +2 +1 +0 ' "$TMP/mesh" && grep -Eq '^ +1 +0 +1 ' "$TMP/mesh"
verdict $? "cp: the mesh is printed, rank -> (dp, cp), cp fastest" "$(grep -A5 '^mesh:' "$TMP/mesh" | tr '\n' '|')"

# What a rank holds, sends and computes, beside the formulas.
# memory FILE: each rank's "ATTENTION PER_TOKEN" ratios to one process's / cp.
memory() { sed -nE 's/^  cp rank [0-9]+: attention .* \(([0-9.]*) x formula\), per-token .* \(([0-9.]*) x formula\).*/\1 \2/p' "$1"; }
within10() { awk '{ for (i = 1; i <= NF; i++) if ($i < 0.9 || $i > 1.1) bad = 1 } END { exit (NR == 0 || bad) }'; }
for name in cp2 cp4 cp2u cp4n; do
    m=$(memory "$TMP/$name" | tr '\n' ' ')
    memory "$TMP/$name" | within10
    verdict $? "cp: $name's activations per rank are one process's / cp within 10% (attention, per-token ratios: $m)" "got '$m'"
done
# The line bench/longest_context.sh reads (any cp): cp 2's rank 0 holds
# half of one process's activations, cp 4's a quarter.
held='^held per rank: ([0-9]*) bytes of activations and their gradients, ([0-9]*) bytes of cp buffers'
h1=$(field "$TMP/one" "$held") h2=$(field "$TMP/cp2" "$held") h4=$(field "$TMP/cp4" "$held")
[[ -n $h1 && -n $h2 && -n $h4 ]] && awk -v a="$h1" -v b="$h2" -v c="$h4" 'BEGIN { exit !(b / a > 0.45 && b / a < 0.55 && c / a > 0.225 && c / a < 0.275) }'
verdict $? "cp: the bytes rank 0 holds (the longest-context bench's measure): cp 2 half of one process's, cp 4 a quarter ($h1, $h2, $h4)" "got '$h1' '$h2' '$h4'"
traffic() { grep -c '^  cp rank [0-9]*: counted forward .*: the formula'"'"'s$' "$1"; }
for name in cp2:2 cp4:4 cp2u:2 cp4u:4 mesh:2; do
    n=$(traffic "$TMP/${name%%:*}")
    [[ $n -eq ${name#*:} ]] && ! grep -q 'NOT the formula' "$TMP/${name%%:*}"
    verdict $? "cp: ${name%%:*}: the numbers each rank sent per step are the formula's ($(field "$TMP/${name%%:*}" '^traffic per rank and step \(([a-z]*).* = ([0-9]*), backward .* = ([0-9]*)$' '\1: forward \2, backward \3'))" \
        "$(grep -E '^traffic|counted forward' "$TMP/${name%%:*}" | tr '\n' '|')"
done
# Balance: the score pairs each rank computes equal the formula's; with
# zigzag every rank computes the same number, without it rank r computes
# r + 1 chunk pairs.
scores() { sed -nE 's/^  cp rank [0-9]+: attention scores ([0-9]*) a step \(formula ([0-9]*), equal\).*/\1/p' "$1" | tr '\n' ' '; }
z=$(scores "$TMP/cp4"); n=$(scores "$TMP/cp4n")
[[ $(wc -w <<<"$z") -eq 4 && $(tr ' ' '\n' <<<"$z" | sort -u | grep -c .) -eq 1 && $(wc -w <<<"$n") -eq 4 ]] &&
    awk -v n="$n" 'BEGIN { split(n, a, " "); exit !(a[2] == 2 * a[1] && a[3] == 3 * a[1] && a[4] == 4 * a[1]) }'
verdict $? "cp: attention's work per rank is the formula's: zigzag equal ($z), none 1:2:3:4 ($n)" \
    "$(grep -E 'attention scores|^balance' "$TMP/cp4" "$TMP/cp4n" | tr '\n' '|')"
# Three planted bugs in one copy (one build), each seen by its own check
# above, none by the model: a balance that gives rank r chunks r and cp + r
# (two chunks, not the mirrored ones: the work is uneven), a ring that
# sends its block once more than it must, and a ring rank that keeps its
# queries' probabilities against every position's row (T x T, one
# process's) - trained with cp 4.
planted=$(plant tables gpt/context_parallel.h 'int chunks = 2 * n, last = chunks - 1 - r;' \
    'int chunks = 2 * n, last = n + r;' 12_context_parallel 12_context_parallel \
    'if (i < N - 1) {
            pending = cp->comm.ring_start' 'if (i < N) {
            pending = cp->comm.ring_start' \
    'return B * NH * (size_t)cp->count * T;' 'return B * NH * T * T;')
m=
[[ -n $planted ]] && run_capture 120 "$TMP/pl_tab" "$planted" "${cpu[@]}" "${base[@]}" --cp 4 --out_dir "$TMP/pl_tab.d"
status=$?
[[ -n $planted && $status -eq 0 ]] && same one pl_tab 1e-6 && grep -q 'attention scores .*NOT equal' "$TMP/pl_tab"
verdict $? "cp planted: chunks r and cp+r in place of zigzag's r and 2cp-1-r train the same model and fail the balance check" \
    "$(planted_why tables)status $status, relative '$r': $(grep -m2 'attention scores' "$TMP/pl_tab" | tr '\n' '|')"
[[ -n $planted && $status -eq 0 ]] && grep -q 'NOT the formula' "$TMP/pl_tab"
verdict $? "cp planted: a ring that sends a block too many fails the traffic check" \
    "$(planted_why tables)status $status: $(grep -m2 'counted forward' "$TMP/pl_tab" | tr '\n' '|')"
[[ -n $planted && $status -eq 0 ]] && m=$(memory "$TMP/pl_tab" | tr '\n' ' ') && [[ -n $m ]] && ! memory "$TMP/pl_tab" | within10
verdict $? "cp planted: a ring rank keeping one process's attention memory fails the memory check ($m)" "$(planted_why tables)got '$m'"

# Snapshots are whole: a cp 2 run dies in epoch 2, a cp 4 run resumes from
# its epoch-1 snapshot and ends where an unbroken cp 2 run ends.
small=(--data_dir "$TMP/small" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000
       --device cpu --epochs 2 --save_every 1)
awk -v dir="$TMP/small" 'BEGIN { system("mkdir -p " dir); srand(5)
    for (f = 1; f <= 3; f++) { file = dir "/" (f == 1 ? "train.txt" : f == 2 ? "valid.txt" : "test.txt")
        for (i = 0; i < (f == 1 ? 240 : 60); i++) printf " the cat %d sees a dog %d . \n", i % 7, i % 5 > file } }'
run_capture 120 "$TMP/clean" "$prog" "${small[@]}" --cp 2 --out_dir "$TMP/clean.d" --snapshot_path "$TMP/clean.d/s.safetensors"
steps=$(field "$TMP/clean" 'snapshot saved: Epoch 1 \(step ([0-9]*)\)')
COURSE_FAIL_RANK=1 COURSE_FAIL_STEP=$(( ${steps:-5} + 2 )) run_capture 120 "$TMP/broken" "$prog" "${small[@]}" --cp 2 \
    --out_dir "$TMP/broken.d" --snapshot_path "$TMP/broken.d/s.safetensors"; died=$?
run_capture 120 "$TMP/resumed" "$prog" "${small[@]}" --cp 4 --out_dir "$TMP/resumed.d" \
    --snapshot_path "$TMP/broken.d/s.safetensors"; status=$?
r=$(models_apart "$TMP/clean.d/model.safetensors" "$TMP/resumed.d/model.safetensors")
[[ $died -ne 0 && $status -eq 0 ]] && grep -q 'Resuming training from snapshot at Epoch 1' "$TMP/resumed" && near "$r" 0 1e-6
verdict $? "cp: a cp 2 run killed in epoch 2 resumes with cp 4 from its whole snapshot and ends where cp 2 ends ($r apart)" \
    "killed run status $died, resumed status $status, relative '$r': $(grep -m1 -E 'error|Resuming' "$TMP/resumed")"

# Chapter 08 samples from the model a cp 2 run saved, and (greedy, the same
# prompt) writes what the cp 2 run wrote - whose ranks computed each
# token's logits together.
run_capture 120 "$TMP/greedy" "$prog" "${small[@]}" --cp 2 --epochs 1 --num_samples 1 --temperature 0 --sample_tokens 12 \
    --out_dir "$TMP/greedy.d"
run_capture 120 "$TMP/gen08" "$p08" --generate --device cpu --num_samples 1 --temperature 0 --sample_tokens 12 --out_dir "$TMP/greedy.d"
status=$?
a=$(first_sample "$TMP/greedy"); b=$(first_sample "$TMP/gen08")
[[ $status -eq 0 && -n "$a" && "$a" == "$b" ]]
verdict $? "cp: chapter 08 loads the whole model a cp 2 run saved and samples its text ('$(echo $a)')" \
    "status $status, cp 2 wrote '$a', 08 wrote '$b': $(grep -m1 error "$TMP/gen08")"

# Bad layouts, refused in one line naming the flags (exit 2).
run_capture 30 "$TMP/bad_zz" "$prog" "${cpu[@]}" --cp 3; status=$?
[[ $status -eq 2 ]] && grep -q -- "--cp 3 with --block_size 32.*multiple of 2 x --cp" "$TMP/bad_zz"
verdict $? "cp: --cp 3 with zigzag and blocks of 32 is refused (exit 2)" "status $status: $(head -n 2 "$TMP/bad_zz" | tr '\n' '|')"
run_capture 30 "$TMP/bad_u" "$prog" "${cpu[@]}" --cp 4 --cp_attention ulysses; status=$?
[[ $status -eq 2 ]] && grep -q -- "--n_head must be a multiple of --cp" "$TMP/bad_u"
verdict $? "cp: ulysses over 4 ranks with 2 heads is refused (exit 2)" "status $status: $(head -n 2 "$TMP/bad_u" | tr '\n' '|')"

# ---------------------------------------------------------------- under mpirun
if command -v mpirun >/dev/null 2>&1 && ! "$prog" --backend mpi --device cpu 2>&1 | grep -q "this build has no MPI"; then
    mpi=(mpirun -np)
    if mpirun --version 2>&1 | grep -q "Open MPI"; then mpi=(mpirun --oversubscribe --allow-run-as-root -np); fi
    for l in "mpi:--dp 2 --cp 2 --batch_size 4" "mpiu:--dp 2 --cp 2 --batch_size 4 --cp_attention ulysses"; do
        name=${l%%:*} flags=${l#*:}
        # shellcheck disable=SC2086
        run_capture 120 "$TMP/$name" "${mpi[@]}" 4 "$prog" "${cpu[@]}" --backend mpi --max_steps 15 $flags --out_dir "$TMP/$name.d"
        status=$?
        grep -q 'backend mpi' "$TMP/$name" || status=99
        same one "$name" 1e-6 $status
        verdict $? "cp: $flags under mpirun (backend mpi) equals one process (models $r apart)" \
            "status $status, relative '$r', valid $va vs $vb: $(grep -m1 error "$TMP/$name")"
    done
else
    skip "cp: dp 2 x cp 2 under mpirun" "no mpirun, or a build without MPI (apt-get install openmpi-bin libopenmpi-dev, then make)"
fi

no_leftovers "cp: no process left behind" "12_context_parallel/12_context_parallel"
