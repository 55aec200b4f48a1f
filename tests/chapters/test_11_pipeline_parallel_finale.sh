# The course's finale (chapter 11): a 3D mesh, dp x tp x pp = 2 x 2 x 2 on
# 8 ranks - two pipelines of two stages, each stage's blocks split over two
# tensor-parallel ranks - trains the model one process trains with the same
# step, on CPU ranks and on 8 (emulated) GPUs with nccl; and the same run
# on two hosts (11_pipeline_parallel/rehearsal.sh), one killed and
# restarted, resumes from its snapshot and ends as one process. One planted
# bug (tests/lib.sh, plant) shows that the comparison sees a wrong norm.
source "$(dirname "$0")/../lib.sh"
prog="$ROOT/11_pipeline_parallel/11_pipeline_parallel"
p08="$ROOT/08_gpt_wikitext/08_gpt_wikitext"
[[ -x "$prog" && -x "$p08" && -x "$ROOT/tools/ddprun" ]] || { fail "finale: binaries" "build first (make)"; exit 1; }
export OMP_NUM_THREADS=1

# A small corpus (tests/lib.sh), and a validation split of a few lines: 8
# emulated GPUs validate slowly.
gpt_corpus "$TMP/corpus"
head -n 12 "$TMP/corpus/valid.txt" >"$TMP/valid" && mv "$TMP/valid" "$TMP/corpus/valid.txt"
common=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --n_layer 4 --vocab_size 300 --num_samples 0
        --log_every 1000)
l2='l2 norm ([0-9.e+-]*)' valid='validation after step [0-9]* .*: loss ([0-9.]*) '
# The mesh's step: 2 replicas x 2 micro-batches x 2 sequences; one process: 4 sequences x 2 micro-batches.
mesh=(--nprocs 8 --pp 2 --tp 2 --grad_accum 2 --batch_size 2)
one=(--batch_size 4 --grad_accum 2)

# ---------------------------------------------------------------- 8 GPUs, nccl
if ! has_gpu || [[ $(gpu_count) -lt 8 ]]; then
    skip "finale gpu: 2 x 2 x 2 on 8 GPUs with nccl" "needs 8 GPUs (make CUDA=emu test runs it on the emulated GPU, which has 8)"
else
    gpu=("${common[@]}" --device cuda --block_size 16 --max_steps 3 --precision fp32)
    run_capture 300 "$TMP/g_one" "$p08" "${gpu[@]}" "${one[@]}" --out_dir "$TMP/g_one.d"
    run_capture 600 "$TMP/g_mesh" "$prog" "${gpu[@]}" "${mesh[@]}" --out_dir "$TMP/g_mesh.d"; status=$?
    a=$(field "$TMP/g_one" "$l2") b=$(field "$TMP/g_mesh" "$l2") va=$(field "$TMP/g_one" "$valid") vb=$(field "$TMP/g_mesh" "$valid")
    [[ $status -eq 0 && -n "$a" ]] && rel_near "$a" "$b" 1e-5 && near "$va" "$vb" 1.5e-4 && grep -q 'backend nccl' "$TMP/g_mesh"
    verdict $? "finale gpu: 2 x 2 x 2 on 8 GPUs with nccl equals one GPU in fp32 (l2 $b vs $a)" \
        "status $status, l2 '$b' vs '$a', validation '$vb' vs '$va': $(grep -m1 -E 'error|backend' "$TMP/g_mesh")"
fi

# ---------------------------------------------------------------- CPU ranks
# (CI's emulated-GPU pass stops here: CPU_PATHS=skip, tests/lib.sh.)
cpu_paths "finale" || { no_leftovers "finale: no process left behind" "11_pipeline_parallel/11_pipeline_parallel|08_gpt_wikitext/08_gpt_wikitext"; exit 0; }
run_capture 120 "$TMP/one" "$p08" "${common[@]}" --device cpu --max_steps 8 "${one[@]}" --out_dir "$TMP/one.d"
run_capture 300 "$TMP/mesh" "$prog" "${common[@]}" --device cpu --max_steps 8 "${mesh[@]}" --out_dir "$TMP/mesh.d"; status=$?
a=$(field "$TMP/one" "$l2") b=$(field "$TMP/mesh" "$l2") va=$(field "$TMP/one" "$valid") vb=$(field "$TMP/mesh" "$valid")
[[ $status -eq 0 && -n "$a" && "$va" == "$vb" ]] && rel_near "$a" "$b" 1e-6 && grep -q '^mesh: pp 2 x dp 2 x tp 2 (8 ranks' "$TMP/mesh"
verdict $? "finale: dp x tp x pp = 2 x 2 x 2 on 8 CPU ranks equals one process (l2 $b vs $a)" \
    "status $status, l2 '$b' vs '$a', validation '$vb' vs '$va': $(grep -m1 error "$TMP/mesh")"

# Planted: the gradient norm for clipping counts the tensors every tp rank
# holds whole (embeddings, LayerNorms, row-parallel biases) once per tp
# rank instead of once: the clipping, and so the run, differ from one process.
c=""   # set by the planted run (none with PLANTED_BUGS=skip)
planted=$(plant norm_twice gpt/model.h 'bool replicated = !m->tp_group || pg_rank(m->tp_group) == 0;' \
    'bool replicated = true;' 11_pipeline_parallel 11_pipeline_parallel)
[[ -n $planted ]] && run_capture 300 "$TMP/planted" "$planted" "${common[@]}" --device cpu --max_steps 8 "${mesh[@]}" \
    --out_dir "$TMP/planted.d" && c=$(field "$TMP/planted" "$l2") && [[ -n $c && -n $a ]] && ! rel_near "$a" "$c" 1e-6
verdict $? "planted: replicated tensors counted on every tp rank in the clipping norm: 2 x 2 x 2 differs from one process (l2 $c vs $a)" \
    "$(planted_why norm_twice)l2 '$c' vs '$a': $(grep -m1 error "$TMP/planted" 2>/dev/null)"

# ---------------------------------------------------------------- two hosts, one lost
# As root, two network namespaces; otherwise two launchers on 127.0.0.1.
run_capture 300 "$TMP/rehearsal" "$ROOT/11_pipeline_parallel/rehearsal.sh" --quiet; status=$?
[[ $status -eq 0 ]] &&
    grep -Eq '^rehearsal: PASS \((netns|loopback)\): 4 \+ 4 workers on two hosts trained the same model as one process .*host 1 was killed, came back, and the job resumed' "$TMP/rehearsal"
verdict $? "finale: 2 x 2 x 2 on two hosts, host 1 killed and restarted, resumes and ends as one process" \
    "status $status: $(grep -E '^rehearsal: (PASS|FAIL)' "$TMP/rehearsal" | tail -n 2 | tr '\n' '|')"

no_leftovers "finale: no process left behind" "11_pipeline_parallel/11_pipeline_parallel|08_gpt_wikitext/08_gpt_wikitext"
