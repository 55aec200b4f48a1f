# Chapter 11, pipeline parallelism: S stages x M micro-batches under GPipe
# and 1F1B train the same model as chapter 08 with --grad_accum M in one
# process; the schedules run in their order and hold the activations they
# should; 08's flags work on a pipeline or are refused with the reason;
# snapshots go both ways between 08 and 11; a killed stage resumes.
# Two planted bugs (tests/lib.sh, plant) show that the checks see what they
# are for.
source "$(dirname "$0")/../lib.sh"
prog="$ROOT/11_pipeline_parallel/11_pipeline_parallel"
p08="$ROOT/08_gpt_wikitext/08_gpt_wikitext"
ddprun="$ROOT/tools/ddprun"
[[ -x "$prog" && -x "$p08" && -x "$ddprun" ]] || { fail "11: binaries" "build first (make)"; exit 1; }
export OMP_NUM_THREADS=1

# A small corpus in WikiText's layout (tests/lib.sh; no real data needed).
gpt_corpus "$TMP/corpus"
# Four blocks, so that four stages have one each. On the CPU, whatever the
# build: the GPU cases come first.
tiny=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000
      --device cpu --max_steps 8 --batch_size 4)
common=("${tiny[@]}" --n_layer 4)
l2='l2 norm ([0-9.e+-]*)' sum='checksum ([0-9a-f]*),' valid='validation after step [0-9]* .*: loss ([0-9.]*) '

# ---------------------------------------------------------------- on GPUs
# The stages on GPUs (real, or the emulated ones of a CUDA=emu build: 8,
# one per rank, talking NCCL), activations sent in the model's precision.
if ! has_gpu; then
    for what in "fp32 equals one GPU" "bf16 equals one GPU" ; do
        skip "11 gpu: $what" "no GPU here (a CPU-only build, or no GPU: make CUDA=emu test runs these on the emulated GPU)"
    done
else
    gpu=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --n_layer 4 --vocab_size 300 --num_samples 0
         --log_every 1000 --device cuda --block_size 16 --max_steps 5 --batch_size 4)
    # Two GPU runs agree to rounding (see test_08_gpt_ddp): l2 within 1e-5, the
    # validation loss to its last printed digit.
    run_capture 300 "$TMP/g08" "$p08" "${gpu[@]}" --precision fp32 --grad_accum 4 --out_dir "$TMP/g08.d"
    for case in "2 gpipe" "4 1f1b"; do
        set -- $case
        run_capture 300 "$TMP/g$1" "$prog" "${gpu[@]}" --precision fp32 --pp $1 --schedule $2 --grad_accum 4 \
            --out_dir "$TMP/g$1.d"; status=$?
        a=$(field "$TMP/g08" "$l2"); b=$(field "$TMP/g$1" "$l2"); va=$(field "$TMP/g08" "$valid"); vb=$(field "$TMP/g$1" "$valid")
        [[ $status -eq 0 && -n "$a" ]] && rel_near "$a" "$b" 1e-5 && near "$va" "$vb" 1.5e-4
        verdict $? "11 gpu: $1 stages ($2) in fp32 equal one GPU (l2 $b vs $a; $(grep -m1 -o 'backend [a-z]*' "$TMP/g$1"))" \
            "status $status, l2 '$b' vs '$a', validation $vb vs $va: $(grep -m1 error "$TMP/g$1")"
    done
    # bf16: activations and their gradients travel in bf16; within 2e-2.
    run_capture 300 "$TMP/h08" "$p08" "${gpu[@]}" --precision bf16 --grad_accum 4 --out_dir "$TMP/h08.d"
    run_capture 300 "$TMP/h11" "$prog" "${gpu[@]}" --precision bf16 --pp 2 --grad_accum 4 --out_dir "$TMP/h11.d"; status=$?
    a=$(field "$TMP/h08" "$l2"); b=$(field "$TMP/h11" "$l2"); va=$(field "$TMP/h08" "$valid"); vb=$(field "$TMP/h11" "$valid")
    [[ $status -eq 0 && -n "$a" ]] && rel_near "$a" "$b" 2e-2 && rel_near "$va" "$vb" 2e-2 && grep -q ', bf16 (' "$TMP/h11"
    verdict $? "11 gpu: 2 stages in bf16 equal one GPU within 2e-2 (l2 $b vs $a)" "status $status, l2 '$b' vs '$a', validation $vb vs $va"
fi

# ---------------------------------------------------------------- equal to one process
# (CI's emulated-GPU pass stops here: CPU_PATHS=skip, tests/lib.sh.)
cpu_paths "11" || { no_leftovers "11: no process left behind" "11_pipeline_parallel/11_pipeline_parallel|08_gpt_wikitext/08_gpt_wikitext"; exit 0; }
# S stages x M micro-batches of 4 against 08 with --grad_accum M: the same
# gradients, added in another order only where the two copies of wte meet.
# fp32 on the CPU: the final parameters' l2 norm within 1e-6, the printed
# validation loss exactly.
for M in 1 4; do
    run_capture 120 "$TMP/one$M" "$p08" "${common[@]}" --grad_accum $M --out_dir "$TMP/one$M.d"
    want=$(field "$TMP/one$M" "$l2") want_valid=$(field "$TMP/one$M" "$valid")
    for S in 2 4; do
        for schedule in gpipe 1f1b; do
            out=$TMP/pp$S.m$M.$schedule
            run_capture 120 "$out" "$prog" "${common[@]}" --pp $S --grad_accum $M --schedule $schedule \
                --out_dir "$out.d"; status=$?
            got=$(field "$out" "$l2") got_valid=$(field "$out" "$valid")
            [[ $status -eq 0 && -n "$want" && "$got_valid" == "$want_valid" ]] && rel_near "$got" "$want" 1e-6
            verdict $? "11: $S stages x $M micro-batches ($schedule) equal one process with --grad_accum $M (l2 $got vs $want)" \
                "status $status, l2 '$got' vs '$want', validation '$got_valid' vs '$want_valid': $(grep -m1 error "$out")"
        done
    done
done

# A gradient M times too large (the mean over micro-batches forgotten)
# barely moves AdamW's weights, and not at all while clipping is active:
# without clipping, AdamW's moments from each run's snapshot (tests/lib.sh,
# snapshot_norms) must equal one process's too. Planted: pipe_backward
# without the 1/M, which passes the l2 comparison above and fails this one.
unclipped=(--grad_clip 0 --save_every 1 --grad_accum 4)
run_capture 120 "$TMP/one_nc" "$p08" "${common[@]}" "${unclipped[@]}" --out_dir "$TMP/one_nc.d" \
    --snapshot_path "$TMP/one_nc.d/s.safetensors"
na=$(snapshot_norms "$TMP/one_nc.d")
run_capture 120 "$TMP/pp_nc" "$prog" "${common[@]}" "${unclipped[@]}" --pp 2 --out_dir "$TMP/pp_nc.d" \
    --snapshot_path "$TMP/pp_nc.d/s.safetensors"; status=$?
nb=$(snapshot_norms "$TMP/pp_nc.d")
[[ $status -eq 0 ]] && norms_near "$na" "$nb" 1e-6
verdict $? "11: without clipping, 2 stages x 4 micro-batches equal one process in weights and AdamW's moments (l2 of p, m, v: $nb vs $na)" \
    "status $status, norms '$nb' vs '$na': $(grep -m1 error "$TMP/pp_nc")"
np=
planted=$(plant no_mean 11_pipeline_parallel/11_pipeline_parallel.c 'model_backward(m, 1.0f / (float)p->micro_batches, NULL)' \
          'model_backward(m, 1.0f, NULL)' 11_pipeline_parallel 11_pipeline_parallel)
if [[ -n $planted ]]; then
    run_capture 120 "$TMP/pl_nc" "$planted" "${common[@]}" "${unclipped[@]}" --pp 2 --out_dir "$TMP/pl_nc.d" \
        --snapshot_path "$TMP/pl_nc.d/s.safetensors"
    np=$(snapshot_norms "$TMP/pl_nc.d")
    [[ -n $np ]] && ! norms_near "$na" "$np" 1e-6
else false; fi
verdict $? "11 planted: stages that sum their micro-batches' gradients fail the moments check (l2 of p, m, v: $np vs $na)" \
    "$(planted_why no_mean)planted norms '$np' vs '$na'"

# Planted: the tied embedding's all-reduce left out. Each end of the
# pipeline then steps its copy of wte with half of its gradient (the
# embedding's, or the LM head's); only the comparison with one process sees it.
planted=$(plant tie_skipped 11_pipeline_parallel/11_pipeline_parallel.c 'if (p->tie) model_all_reduce_grads' \
    'if (0 && p->tie) model_all_reduce_grads' 11_pipeline_parallel 11_pipeline_parallel)
[[ -n $planted ]] && run_capture 120 "$TMP/planted_tie" "$planted" "${common[@]}" --pp 2 --grad_accum 4 \
    --out_dir "$TMP/planted_tie.d" && got=$(field "$TMP/planted_tie" "$l2") && want=$(field "$TMP/one4" "$l2") &&
    [[ -n $got && -n $want ]] && ! rel_near "$got" "$want" 1e-6
verdict $? "planted: without the tied embedding's all-reduce, 2 stages differ from one process (l2 $got vs $want)" \
    "$(planted_why tie_skipped)l2 '$got' vs '$want': $(grep -m1 error "$TMP/planted_tie" 2>/dev/null)"

# Data parallel x pipeline: 2 pipelines of 2 stages, 2 micro-batches of 2,
# against one process with 2 micro-batches of 4.
run_capture 120 "$TMP/one_dp" "$p08" "${common[@]}" --batch_size 4 --grad_accum 2 --out_dir "$TMP/one_dp.d"
run_capture 120 "$TMP/dp" "$prog" "${common[@]}" --batch_size 2 --grad_accum 2 --pp 2 --nprocs 4 \
    --out_dir "$TMP/dp.d"; status=$?
a=$(field "$TMP/one_dp" "$l2"); b=$(field "$TMP/dp" "$l2")
[[ $status -eq 0 && -n "$a" ]] && rel_near "$a" "$b" 1e-6 && grep -q '^mesh: pp 2 x dp 2' "$TMP/dp"
verdict $? "11: 2 pipelines x 2 stages (dp x pp, 4 ranks) equal one process (l2 $b vs $a)" "status $status, l2 '$b' vs '$a'"

# 08's flags on that layout: --num_workers 1 makes the micro-batches in a
# thread, in the same order (0 .. M-1 on every stage, both schedules): the
# same bytes. --grad_compress bf16 averages each stage over its replicas
# through 08's hook, in half the bytes, and says so. --precision fp16 is
# refused in one line, with the reason.
run_capture 120 "$TMP/workers" "$prog" "${common[@]}" --batch_size 2 --grad_accum 2 --pp 2 --nprocs 4 --num_workers 1 \
    --out_dir "$TMP/workers.d"; status=$?
a=$(field "$TMP/dp" "$sum"); b=$(field "$TMP/workers" "$sum")
[[ $status -eq 0 && -n "$a" && "$a" == "$b" ]]
verdict $? "11: --num_workers 1 ends with the bytes of --num_workers 0 ($b)" "status $status, checksum '$b' vs '$a'"
run_capture 120 "$TMP/bf16wire" "$prog" "${common[@]}" --batch_size 2 --grad_accum 2 --pp 2 --nprocs 4 --grad_compress bf16 \
    --out_dir "$TMP/bf16wire.d"; status=$?
a=$(field "$TMP/dp" "$l2"); b=$(field "$TMP/bf16wire" "$l2")
[[ $status -eq 0 && -n "$a" ]] && rel_near "$a" "$b" 1e-4 &&
    grep -Eq '^gradients all-reduced: [0-9]+ bytes per step per rank \(bf16\)' "$TMP/bf16wire"
verdict $? "11: --grad_compress bf16 averages the stages' replicas in bf16 (l2 $b vs $a in fp32)" \
    "status $status, l2 '$b' vs '$a': $(grep -m1 -E 'error|gradients all-reduced' "$TMP/bf16wire")"
run_capture 30 "$TMP/fp16" "$prog" "${common[@]}" --device auto --precision fp16 --pp 2; status=$?
[[ $status -eq 2 ]] && grep -q "error: --precision fp16: the GPU model keeps fp16's loss scale in chapter 08's whole-model step only" "$TMP/fp16"
verdict $? "11: --precision fp16 is refused in one line, with the reason, exit 2" "status $status: $(grep -m1 error "$TMP/fp16")"

# ---------------------------------------------------------------- the schedules, as measured
# The order of forward (F) and backward (B) passes each stage ran, from the
# timeline of 4 stages x 4 micro-batches: GPipe runs every forward first;
# 1F1B's stage s runs 3-s forwards, then alternates.
order() { # CSV STAGE -> "F0 F1 ... B3", the stage's compute events by start time
    awk -F, -v s="$2" '$2 == s && ($5 == "F" || $5 == "B") { print $7, $5 $6 }' "$1" | sort -n | cut -d' ' -f2 | paste -sd' '
}
declare -A want_order=(
    [gpipe0]="F0 F1 F2 F3 B0 B1 B2 B3" [gpipe3]="F0 F1 F2 F3 B0 B1 B2 B3"
    [1f1b0]="F0 F1 F2 F3 B0 B1 B2 B3" [1f1b1]="F0 F1 F2 B0 F3 B1 B2 B3"
    [1f1b2]="F0 F1 B0 F2 B1 F3 B2 B3" [1f1b3]="F0 B0 F1 B1 F2 B2 F3 B3")
for key in gpipe0 gpipe3 1f1b0 1f1b1 1f1b2 1f1b3; do
    schedule=${key%?} stage=${key: -1}
    got=$(order "$TMP/pp4.m4.$schedule.d/timeline-$schedule.csv" "$stage")
    [[ "$got" == "${want_order[$key]}" ]]
    verdict $? "11: $schedule, stage $stage of 4 ran ${want_order[$key]}" "the timeline says '$got'"
done

# Activation memory, measured as the slots a stage allocated: GPipe holds
# all M = 4 micro-batches on every stage, 1F1B at most S - s.
for schedule in gpipe 1f1b; do
    got=$(field --all "$TMP/pp4.m4.$schedule" '^  stage ([0-3]): ([0-9]*) micro-batch' '\2' | paste -sd' ')
    want="4 4 4 4"; [[ $schedule == 1f1b ]] && want="4 3 2 1"
    [[ "$got" == "$want" ]]
    verdict $? "11: $schedule holds $want micro-batches on stages 0-3" "it printed '$got'"
done

# Planted: 1F1B's warm-up as long on every stage as on the first (S - 1
# forwards). The gradients stay the same - only the order and the memory
# checks see that the later stages no longer alternate and hold every
# micro-batch.
got="" held=""   # set by the planted run (none with PLANTED_BUGS=skip)
planted=$(plant warmup_same 11_pipeline_parallel/11_pipeline_parallel.c 'int warmup = S - p->stage - 1 < M ? S - p->stage - 1 : M' \
    'int warmup = S - 1 < M ? S - 1 : M' 11_pipeline_parallel 11_pipeline_parallel)
[[ -n $planted ]] && run_capture 120 "$TMP/planted_w" "$planted" "${common[@]}" --pp 4 --grad_accum 4 --schedule 1f1b \
    --out_dir "$TMP/planted_w.d" && got=$(order "$TMP/planted_w.d/timeline-1f1b.csv" 3) &&
    held=$(field --all "$TMP/planted_w" '^  stage ([0-3]): ([0-9]*) micro-batch' '\2' | paste -sd' ') &&
    [[ -n $got && $got != "${want_order[1f1b3]}" && -n $held && $held != "4 3 2 1" ]]
verdict $? "planted: a warm-up of S - 1 on every stage is seen by the order ('$got') and memory ('$held') checks" \
    "$(planted_why warmup_same)stage 3 ran '$got', held '$held': $(grep -m1 error "$TMP/planted_w" 2>/dev/null)"

# The bubble is measured (not asserted: a timing) and printed beside the
# formula, (S-1)/(M+S-1) = 3/7 for 4 stages x 4 micro-batches.
line=$(grep '^bubble: ' "$TMP/pp4.m4.1f1b")
[[ $line =~ ^bubble:\ 1f1b,\ 4\ stages\ x\ 4\ micro-batches:\ [0-9.]+%\ of\ a\ step\ idle,\ measured.*\(S-1\)/\(M\+S-1\)\ =\ 42\.9%$ ]]
verdict $? "11: the measured bubble is printed beside (S-1)/(M+S-1) = 42.9%" "the line was '$line'"

# ---------------------------------------------------------------- snapshots: 08 <-> 11, a killed stage
awk -v dir="$TMP/small" 'BEGIN { system("mkdir -p " dir); srand(5)
    for (f = 1; f <= 3; f++) { file = dir "/" (f == 1 ? "train.txt" : f == 2 ? "valid.txt" : "test.txt")
        for (i = 0; i < (f == 1 ? 480 : 60); i++) printf " the cat %d sees a dog %d . \n", i % 7, i % 5 > file } }'
small=(--data_dir "$TMP/small" --verify_data=false --preset tiny --n_layer 4 --vocab_size 300 --num_samples 0
       --log_every 1000 --device cpu --batch_size 2 --save_every 1)
# A pipelined run dies in epoch 2 (COURSE_FAIL_*, as in chapter 06);
# 08 resumes its end-of-epoch-1 snapshot and ends where 08 alone does
# after 2 epochs. Then the other way round: 4 stages resume 08's.
run_capture 120 "$TMP/s08" "$p08" "${small[@]}" --grad_accum 4 --epochs 2 --out_dir "$TMP/s08.d"
steps=$(field "$TMP/s08" 'validation after step ([0-9]*) \(epoch 1\)')
COURSE_FAIL_RANK=1 COURSE_FAIL_STEP=$(( ${steps:-10} + 2 )) run_capture 120 "$TMP/s11" "$prog" "${small[@]}" \
    --grad_accum 4 --pp 2 --epochs 2 --out_dir "$TMP/s11.d" --snapshot_path "$TMP/s11.d/s.safetensors"
run_capture 120 "$TMP/s11_08" "$p08" "${small[@]}" --grad_accum 4 --epochs 2 --out_dir "$TMP/s11_08.d" \
    --snapshot_path "$TMP/s11.d/s.safetensors"; status=$?
a=$(field "$TMP/s08" "$l2"); b=$(field "$TMP/s11_08" "$l2")
[[ $status -eq 0 && -n "$a" ]] && rel_near "$a" "$b" 1e-6 && grep -q "Resuming training from snapshot at Epoch 1" "$TMP/s11_08"
verdict $? "11: 08 resumes the snapshot of a pipelined run that died, and ends as 08 alone (l2 $b vs $a)" \
    "status $status, l2 '$b' vs '$a': $(grep -m1 -E 'error|Resuming' "$TMP/s11_08")"
COURSE_FAIL_RANK=0 COURSE_FAIL_STEP=$(( ${steps:-10} + 2 )) run_capture 120 "$TMP/s08e" "$p08" "${small[@]}" \
    --grad_accum 4 --epochs 2 --out_dir "$TMP/s08e.d" --snapshot_path "$TMP/s08e.d/s.safetensors"
run_capture 120 "$TMP/s08_11" "$prog" "${small[@]}" --grad_accum 4 --pp 4 --schedule gpipe --epochs 2 \
    --out_dir "$TMP/s08_11.d" --snapshot_path "$TMP/s08e.d/s.safetensors"; status=$?
b=$(field "$TMP/s08_11" "$l2")
[[ $status -eq 0 && -n "$a" ]] && rel_near "$a" "$b" 1e-6 && grep -q "Resuming training from snapshot at Epoch 1" "$TMP/s08_11"
verdict $? "11: 4 stages resume the snapshot of an 08 run that died, and end as 08 alone (l2 $b vs $a)" \
    "status $status, l2 '$b' vs '$a': $(grep -m1 -E 'error|Resuming' "$TMP/s08_11")"

# Stage 1 dies in epoch 2; ddprun restarts the job, which resumes from the
# end-of-epoch-1 snapshot and ends with the same bytes as a run that never
# failed.
run_capture 200 "$TMP/clean" "$ddprun" --standalone --nproc_per_node=2 "$prog" "${small[@]}" --grad_accum 4 \
    --epochs 2 --out_dir "$TMP/clean.d" --snapshot_path "$TMP/clean.d/s.safetensors"
steps=$(field "$TMP/clean" 'snapshot saved: Epoch 1 \(step ([0-9]*)\)')
COURSE_FAIL_RANK=1 COURSE_FAIL_STEP=$(( ${steps:-10} + 2 )) run_capture 200 "$TMP/failed" "$ddprun" --standalone \
    --nproc_per_node=2 --max_restarts=1 "$prog" "${small[@]}" --grad_accum 4 --epochs 2 --out_dir "$TMP/failed.d" \
    --snapshot_path "$TMP/failed.d/s.safetensors"; status=$?
a=$(field "$TMP/clean" "$sum"); b=$(field "$TMP/failed" "$sum")
[[ $status -eq 0 && -n "$a" && "$a" == "$b" ]] && grep -q "Resuming training from snapshot at Epoch 1" "$TMP/failed"
verdict $? "11: stage 1 killed in epoch 2, restarted, ends byte-identical ($a)" "status $status, clean '$a', resumed '$b'"

# ---------------------------------------------------------------- bad input
run_capture 30 "$TMP/bad_pp" "$prog" "${common[@]}" --n_layer 2 --pp 3; status=$?
[[ $status -eq 2 ]] && grep -q "error: --pp 3: every stage needs a block of its own: at most n_layer stages (the model has 2; use --n_layer)" "$TMP/bad_pp"
verdict $? "11: --pp 3 with 2 blocks: one line naming the flag, exit 2" "status $status: $(grep -m1 error "$TMP/bad_pp")"
run_capture 30 "$TMP/bad_n" "$prog" "${common[@]}" --pp 2 --nprocs 3; status=$?
[[ $status -eq 2 ]] && grep -q "error: --nprocs 3 is not a multiple of --pp 2" "$TMP/bad_n"
verdict $? "11: --nprocs 3 with --pp 2: one line naming both, exit 2" "status $status: $(grep -m1 error "$TMP/bad_n")"
# The tiny preset has 2 blocks: --pp 4 without --n_layer gets 4 and says so.
run_capture 120 "$TMP/preset" "$prog" "${tiny[@]}" --pp 4 --max_steps 2 --out_dir "$TMP/preset.d"; status=$?
[[ $status -eq 0 ]] && grep -q "4 layers: one per stage, more than the preset's" "$TMP/preset"
verdict $? "11: --pp 4 on the 2-block tiny preset gets 4 blocks and says so" "status $status: $(grep -m1 -E 'error|model:' "$TMP/preset")"

# ---------------------------------------------------------------- mpi
if command -v mpirun >/dev/null 2>&1 && "$prog" --help 2>&1 | grep -q 'mpi'; then
    mpi=(mpirun -np); mpirun --version 2>&1 | grep -q "Open MPI" && mpi=(mpirun --oversubscribe --allow-run-as-root -np)
    run_capture 120 "$TMP/mpi" "${mpi[@]}" 2 "$prog" "${common[@]}" --backend mpi --pp 2 --grad_accum 4 \
        --out_dir "$TMP/mpi.d"; status=$?
    a=$(field "$TMP/one4" "$l2"); b=$(field "$TMP/mpi" "$l2")
    [[ $status -eq 0 && -n "$a" ]] && rel_near "$a" "$b" 1e-6 && grep -q 'backend mpi' "$TMP/mpi"
    verdict $? "11: 2 stages under mpirun (--backend mpi) equal one process (l2 $b vs $a)" "status $status: $(grep -m1 error "$TMP/mpi")"
else
    skip "11: 2 stages under mpirun" "mpirun not found, or a build without MPI"
fi

no_leftovers "11: no process left behind" "11_pipeline_parallel/11_pipeline_parallel|08_gpt_wikitext/08_gpt_wikitext"
