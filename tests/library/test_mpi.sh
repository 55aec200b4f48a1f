#!/usr/bin/env bash
# tests/library/test_mpi.sh - the mpi backend (common/pg_mpi.h): chapters 02-08 run
# unchanged under mpirun with 2 and 4 ranks and give what the cpu backend
# gives; a bad call ends the job with one line that names the rank; a
# program that cannot run under mpirun says so in one line.
source "$(dirname "$0")/../lib.sh"
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT COURSE_AGENT_STORE \
      COURSE_JOB_TOKEN COURSE_BACKEND COURSE_SHM
export OMP_NUM_THREADS=1
p02=$ROOT/02_p2p/02_p2p p03=$ROOT/03_collectives/03_collectives p04=$ROOT/04_ddp_spawn/04_ddp_spawn
p05=$ROOT/05_env_launch/05_env_launch p06=$ROOT/06_snapshot_resume/06_snapshot_resume
p07=$ROOT/07_multinode/07_multinode p08=$ROOT/08_gpt_wikitext/08_gpt_wikitext ddprun=$ROOT/tools/ddprun

if ! command -v mpirun >/dev/null 2>&1; then
    skip "mpi: chapters 02-08 under mpirun" "mpirun not found (apt-get install openmpi-bin libopenmpi-dev, then make)"
    exit 0
fi
# Started by hand, --backend mpi says in one line why it cannot run: no MPI
# in this build, or no MPI launcher.
"$p05" --backend mpi --device cpu --epochs 1 >"$TMP/hand" 2>&1; status=$?
if grep -q "this build has no MPI" "$TMP/hand"; then
    check "mpi: a build without MPI says so in one line" test "$status" -ne 0 -a "$(grep -c error "$TMP/hand")" -eq 1
    skip "mpi: chapters 02-08 under mpirun" "this build has no MPI (mpicc and mpi.h were not found, or MPI=0)"
    exit 0
fi
[[ $status -ne 0 && $(grep -c . "$TMP/hand") -eq 1 ]] && grep -q "error: --backend mpi needs a job started by an MPI launcher: mpirun" "$TMP/hand"
verdict $? "mpi: by hand, --backend mpi says in one line that it needs mpirun" "status $status: $(head -n 3 "$TMP/hand" | tr '\n' '|')"

# OpenMPI wants to be told that 4 ranks on 2 cores is fine, and that root may run them.
mpi=(mpirun -np)
if mpirun --version 2>&1 | grep -q "Open MPI"; then mpi=(mpirun --oversubscribe --allow-run-as-root -np); fi
strip() { sed 's/^\[rank 0\]: //' "$1"; }   # ddprun prefixes rank 0's lines; mpirun does not

# GPU buffers (a real GPU, or the emulated ones of make CUDA=emu): staged
# through host memory, as on the cpu backend; every dtype and op.
if has_gpu; then
    run_capture 300 "$TMP/gpu" "${mpi[@]}" 2 "$p03" --backend mpi --device cuda --bench -b 8 -e 1M -f 16 -c 1 -n 2 -w 1 \
        -d all -o all; status=$?
    rows=$(awk 'NF == 9 && $1 ~ /^[0-9]+$/' "$TMP/gpu" | wc -l)
    wrong=$(awk 'NF == 9 && $1 ~ /^[0-9]+$/ && $9 != 0 && $9 != "N/A"' "$TMP/gpu" | wc -l)
    [[ $status -eq 0 && $rows -ge 500 && $wrong -eq 0 ]] && grep -q "backend: mpi (GPU buffers staged through host memory" "$TMP/gpu"
    verdict $? "mpi: 03 --bench --device cuda -d all -o all, 2 ranks, staged: $rows rows, #wrong 0" "status $status, $rows rows, $wrong wrong: $(head -n 1 "$TMP/gpu")"
else skip "mpi: GPU buffers staged through host memory" "no GPU here (make CUDA=emu test runs it on the emulated GPU)"; fi
# The rest runs on CPU ranks (tests/lib.sh, cpu_paths).
cpu_paths "mpi" || { no_leftovers "mpi: no process left behind" "02_p2p/02_p2p|03_collectives/03_collectives|05_env_launch/05_env_launch|08_gpt_wikitext/08_gpt_wikitext"; exit 0; }

for n in 2 4; do
    # 02: the receiver holds the sender's value, blocking and non-blocking.
    run_capture 60 "$TMP/p2p$n" "${mpi[@]}" $n "$p02" --backend mpi --device cpu; status=$?
    [[ $status -eq 0 ]] && grep -q "^02_p2p: $n ranks .* backend: mpi" "$TMP/p2p$n" &&
       grep -q "^Rank 1 has data 1.0 (pg_recv returned)" "$TMP/p2p$n" &&
       grep -q "^Rank 1 has data 1.0 (irecv completed" "$TMP/p2p$n"
    verdict $? "mpi: 02 with $n ranks: rank 1 receives 1.0 (pg_recv and pg_irecv)" "status $status: $(tail -n 4 "$TMP/p2p$n" | tr '\n' '|')"

    # 03's lesson prints the same values as with the cpu backend (the
    # barrier's arrival times aside).
    run_capture 60 "$TMP/lesson_mpi$n" "${mpi[@]}" $n "$p03" --backend mpi --device cpu
    run_capture 60 "$TMP/lesson_cpu$n" "$p03" --backend cpu --device cpu --nprocs $n
    a=$(sed '1d; /times   rank\|^          rank [0-9]*: \[ *[0-9]* *[0-9]*\]$/d' "$TMP/lesson_mpi$n")
    b=$(sed '1d; /times   rank\|^          rank [0-9]*: \[ *[0-9]* *[0-9]*\]$/d' "$TMP/lesson_cpu$n")
    [[ -n "$a" && "$a" == "$b" ]] && grep -q "^== 10\." "$TMP/lesson_mpi$n"
    verdict $? "mpi: 03's lesson with $n ranks prints what the cpu backend prints" "$(diff <(echo "$a") <(echo "$b") | head -n 4 | tr '\n' '|')"

    # 03's benchmark: every collective, 8 B to 64 MiB, no wrong element.
    run_capture 300 "$TMP/bench$n" "${mpi[@]}" $n "$p03" --backend mpi --device cpu --bench -b 8 -e 64M -f 4 -c 1; status=$?
    rows=$(awk 'NF == 9 && $1 ~ /^[0-9]+$/' "$TMP/bench$n" | wc -l)
    wrong=$(awk 'NF == 9 && $1 ~ /^[0-9]+$/ && $9 != 0 && $9 != "N/A"' "$TMP/bench$n" | wc -l)
    ok=$(grep -c "^# Out of bounds values : 0 OK" "$TMP/bench$n")   # one per collective but the barrier
    [[ $status -eq 0 && $rows -ge 90 && $wrong -eq 0 && $ok -eq 9 ]]
    verdict $? "mpi: 03 --bench -b 8 -e 64M -f 4 -c 1 with $n ranks: $rows rows, #wrong 0" \
        "status $status, $rows rows, $wrong with #wrong > 0, $ok of 9 collectives OK: $(tail -n 3 "$TMP/bench$n" | tr '\n' '|')"

    # 05: the same losses, epoch by epoch, as the cpu backend under ddprun.
    args=(--device cpu --epochs 3 --samples 4000)
    run_capture 120 "$TMP/t05mpi$n" "${mpi[@]}" $n "$p05" --backend mpi "${args[@]}"; status=$?
    run_capture 120 "$TMP/t05cpu$n" "$ddprun" --standalone --nproc_per_node=$n "$p05" --backend cpu "${args[@]}"
    a=$(grep -E "^epoch|^final" "$TMP/t05mpi$n" | sed 's/ | [0-9.]* s$//'); b=$(strip "$TMP/t05cpu$n" | grep -E "^epoch|^final" | sed 's/ | [0-9.]* s$//')
    [[ $status -eq 0 && -n "$a" && "$a" == "$b" ]] && grep -q "backend mpi" "$TMP/t05mpi$n"
    verdict $? "mpi: 05 with $n ranks: the cpu backend's losses and final weights" "status $status: $(diff <(echo "$a") <(echo "$b") | head -n 4 | tr '\n' '|')"
done

# Every op and dtype of 03's benchmark, small sizes, 4 ranks: bf16 through
# MPI_Op_create, integers wrapping like the cpu backend, the bitwise ops.
run_capture 300 "$TMP/all" "${mpi[@]}" 4 "$p03" --backend mpi --device cpu --bench -b 8 -e 4K -f 8 -c 1 -n 2 -w 1 -d all -o all \
    --collective all_reduce; status=$?
rows=$(awk 'NF == 9 && $1 ~ /^[0-9]+$/' "$TMP/all" | wc -l)
wrong=$(awk 'NF == 9 && $1 ~ /^[0-9]+$/ && $9 != 0' "$TMP/all" | wc -l)
bf16=$(awk 'NF == 9 && $3 == "bfloat16"' "$TMP/all" | wc -l); bits=$(awk 'NF == 9 && $4 == "bxor"' "$TMP/all" | wc -l)
[[ $status -eq 0 && $wrong -eq 0 && $bf16 -ge 20 && $bits -ge 12 ]]
verdict $? "mpi: all_reduce of every dtype x op with 4 ranks: $rows rows, #wrong 0" "status $status, $rows rows ($bf16 bf16, $bits bxor), $wrong wrong"

# Every collective x every dtype x every op it allows (counts 0 to 70001, in
# place and out of place, roots other than 0): unit/test_collectives, the
# cpu backend's own test, under mpirun. Its references are computed on each
# rank from the same inputs the cpu backend is checked with, exactly.
make -C "$ROOT/tests" -s unit/test_collectives >/dev/null 2>&1
for n in 2 4; do
    run_capture 300 "$TMP/coll$n" "${mpi[@]}" $n "$ROOT/tests/unit/test_collectives" --backend mpi --device cpu --big=false \
        --label "mpi: "; status=$?
    passed=$(grep -c '^PASS mpi: ' "$TMP/coll$n"); failed=$(grep '^FAIL ' "$TMP/coll$n" | head -n 2 | tr '\n' '|')
    [[ $status -eq 0 && $passed -eq 12 && -z "$failed" ]]
    verdict $? "mpi: every collective x dtype x op with $n ranks, against the references the cpu backend meets ($passed collectives)" "status $status, $passed of 12 passed: ${failed:-$(tail -n 2 "$TMP/coll$n" | tr '\n' '|')}"
done
# Planted (tests/lib.sh, plant): MPI_Alltoallv's displacements one peer off
# (each block placed after its own count, not before it): the uneven counts
# of all_to_all_v above must fail.
planted=$(plant mpi_displacements common/pg_mpi.h $'        displs[p] = (int)at;\n        at += counts[p];' \
    $'        at += counts[p];\n        displs[p] = (int)at;' tests unit/test_collectives)
[[ -n $planted ]] && run_capture 120 "$TMP/planted_mpi" "${mpi[@]}" 3 "$planted" --backend mpi --device cpu --only all_to_all_v \
    --label "planted: "
[[ -n $planted ]] && grep -q '^FAIL planted: all_to_all_v n=3: ' "$TMP/planted_mpi"
verdict $? "mpi planted: MPI_Alltoallv displacements one peer off fail all_to_all_v ($(grep -m1 '^FAIL' "$TMP/planted_mpi" 2>/dev/null | cut -c1-120))" \
    "$(planted_why mpi_displacements)the planted copy passed: $(grep -E '^(PASS|FAIL)|error' "$TMP/planted_mpi" 2>/dev/null | head -n 3 | tr '\n' '|')"

# auto under mpirun picks mpi.
run_capture 60 "$TMP/auto" "${mpi[@]}" 2 "$p05" --device cpu --epochs 1 --samples 1000
expect_output "mpi: --backend auto under mpirun picks mpi" "$TMP/auto" "backend mpi \(Open MPI|backend mpi \(MPICH|backend mpi \("

# 06 and 07 run once (mpirun restarts nothing): the cpu backend's result.
for ch in 06 07; do
    bin=p$ch; bin=${!bin}
    args=(--device cpu --total_epochs 2 --samples 4000)
    run_capture 120 "$TMP/t${ch}mpi" "${mpi[@]}" 2 "$bin" --backend mpi "${args[@]}" --snapshot_path "$TMP/s${ch}mpi/s.safetensors"; status=$?
    run_capture 120 "$TMP/t${ch}cpu" "$ddprun" --standalone --nproc_per_node=2 "$bin" --backend cpu "${args[@]}" \
        --snapshot_path "$TMP/s${ch}cpu/s.safetensors"
    a=$(grep "^final weight" "$TMP/t${ch}mpi"); b=$(strip "$TMP/t${ch}cpu" | grep "^final weight")
    [[ $status -eq 0 && -n "$a" && "$a" == "$b" ]]
    verdict $? "mpi: $ch with 2 ranks ends as with the cpu backend ($(echo "$a" | cut -c1-40))" "status $status: mpi '$a', cpu '$b'"
done
expect_output "mpi: 07 under mpirun names OpenMPI's variables as its launcher" "$TMP/t07mpi" "started by (OpenMPI|MPICH) variables"

# 08, the tiny GPT: 2 ranks x batch 4 under mpirun equal 1 rank x batch 8.
awk -v dir="$TMP/corpus" 'BEGIN { system("mkdir -p " dir); srand(11)
    split("the a one every some my", D, " "); split("cat dog bird river city king", N, " ")
    for (f = 1; f <= 3; f++) {
        file = dir "/" (f == 1 ? "train.txt" : f == 2 ? "valid.txt" : "test.txt")
        for (i = 0; i < (f == 1 ? 1000 : 100); i++) {
            if (i % 40 == 0) printf " \n = Article %d = \n \n", i > file
            printf " %s %s sees %s %s . \n", D[int(rand() * 6) + 1], N[int(rand() * 6) + 1], D[int(rand() * 6) + 1], N[int(rand() * 6) + 1] > file } } }'
gpt=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000 --device cpu --max_steps 8)
run_capture 120 "$TMP/g1" "$p08" "${gpt[@]}" --batch_size 8 --out_dir "$TMP/g1.d"
run_capture 120 "$TMP/g2" "${mpi[@]}" 2 "$p08" "${gpt[@]}" --backend mpi --batch_size 4 --out_dir "$TMP/g2.d"; status=$?
a=$(field "$TMP/g1" 'l2 norm ([0-9.e+-]*)'); b=$(field "$TMP/g2" 'l2 norm ([0-9.e+-]*)')
[[ $status -eq 0 && -n "$a" && -n "$b" ]] && rel_near "$a" "$b" 1e-5 && grep -q "backend mpi" "$TMP/g2"
verdict $? "mpi: 08 tiny GPT, 2 ranks x batch 4 under mpirun equal 1 rank x batch 8 (l2 $a vs $b)" \
    "status $status, l2 '$a' vs '$b': $(grep -m2 -i 'error\|backend' "$TMP/g2" | tr '\n' '|')"

# A bad call: rank 0 all-reduces 16 floats, rank 1 32 (two programs, one
# job). MPI finds the truncated message; the job ends with one line that
# names the rank, the call and MPI's reason, not with MPI's abort.
run_capture 60 "$TMP/bad" "${mpi[@]}" 1 "$p03" --backend mpi --device cpu --bench -b 64 -e 64 --collective all_reduce : \
    -np 1 "$p03" --backend mpi --device cpu --bench -b 128 -e 128 --collective all_reduce; status=$?
[[ $status -ne 0 && $(grep -c "error" "$TMP/bad") -ge 1 ]] &&
   grep -qE "^\[rank [01]\] error: MPI_Allreduce \(all_reduce\) failed: .*(TRUNCATE|truncat)" "$TMP/bad"
verdict $? "mpi: mismatched counts end the job with one line naming the rank ($(grep -m1 "^\[rank" "$TMP/bad" | cut -c1-60)...)" \
    "status $status: $(grep -v '^#' "$TMP/bad" | head -n 4 | tr '\n' '|')"

# 04 starts its own ranks (spawn): under mpirun it says so and stops.
run_capture 60 "$TMP/t04" "${mpi[@]}" 2 "$p04" --backend mpi --device cpu; status=$?
[[ $status -ne 0 ]] && grep -q "error: spawn: this program starts its own .* but mpirun (or srun) started it" "$TMP/t04"
verdict $? "mpi: 04 (spawns its ranks) under mpirun stops with one line saying why" "status $status: $(head -n 3 "$TMP/t04" | tr '\n' '|')"
no_leftovers "mpi: no process left behind" "02_p2p/02_p2p|03_collectives/03_collectives|05_env_launch/05_env_launch|08_gpt_wikitext/08_gpt_wikitext"
