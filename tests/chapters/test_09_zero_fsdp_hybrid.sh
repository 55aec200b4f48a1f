# Chapter 09, hybrid sharding (--replicate R, FSDP's HYBRID_SHARD): N ranks
# as R replicas of N/R that shard. Every stage trains the model one process
# trains with the same total batch - weights, validation loss and AdamW's
# moments, unclipped - on CPU ranks, on emulated GPUs over NCCL and under
# mpirun; each rank holds the ZeRO formula's bytes with N/R in place of N and
# sends, by group, what the formulas say; a hybrid run's snapshot resumes with
# another N and R. Each check has its planted bug beside it (tests/lib.sh, plant).
source "$(dirname "$0")/../lib.sh"
prog="$ROOT/09_zero_fsdp/09_zero_fsdp"
compare="$ROOT/tests/unit/test_gpt_compare"
[[ -x "$prog" && -x "$compare" ]] || { fail "hybrid: binaries" "build first (make all unit-tests)"; exit 1; }
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT COURSE_BACKEND
export OMP_NUM_THREADS=1

gpt_corpus "$TMP/corpus"
common=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000)
valid='validation after step [0-9]* .*: loss ([0-9.]*) '
moments='^final AdamW moments: l2 norm of m ([0-9.e+-]*), of v ([0-9.e+-]*)$'

# train NAME ARGS...: a run of $prog (or $prog_under_test), its output in
# $TMP/NAME, its model in $TMP/NAME.d; returns its status.
train() { local name=$1; shift; run_capture 300 "$TMP/$name" "${prog_under_test:-$prog}" "$@" --out_dir "$TMP/$name.d"; }

# equal ONE MANY TOL [STATUS]: MANY trained ONE's model: the saved models
# within TOL relative (L2 over all parameters, tests/unit/test_gpt_compare),
# the same validation loss and the same AdamW moments (their l2 norms), to
# TOL. Adam's step hardly changes when every gradient is R times too large
# (a sum over the replicas where the mean belongs); its moments do. Sets r,
# va, vb, ma, mb.
equal() {
    local status=${4:-0}
    r=$(models_apart "$TMP/$1.d/model.safetensors" "$TMP/$2.d/model.safetensors")
    va=$(field "$TMP/$1" "$valid") vb=$(field "$TMP/$2" "$valid")
    ma=($(field "$TMP/$1" "$moments" '\1 \2')) mb=($(field "$TMP/$2" "$moments" '\1 \2'))
    [[ $status -eq 0 && ${#ma[@]} -eq 2 && ${#mb[@]} -eq 2 ]] && near "$r" 0 "$3" && rel_near "$va" "$vb" "$3" &&
        rel_near "${ma[0]}" "${mb[0]}" "$3" && rel_near "${ma[1]}" "${mb[1]}" "$3"
}
# hybrid NAME: the line that says the run sharded as R replicas x N/R.
hybrid() { field "$TMP/$1" '^sharding: .*, hybrid: ([0-9]+ rank\(s\) = [0-9]+ replicas x [0-9]+ sharding)'; }

# ---------------------------------------------------------------- on GPUs
# 4 GPUs (real, or 4 of the 8 emulated ones of CUDA=emu) talking NCCL: two
# shard groups of 2, the slices all-reduced over the replicate groups {0,2},
# {1,3}; fp32, so chapter 08's GPU tolerance, 1e-5.
if ! has_gpu; then
    skip "hybrid gpu: --shard 3 --replicate 2 on 4 GPUs equals one GPU in fp32" \
        "no GPU here (a CPU-only build, or no GPU: make CUDA=emu test runs it on the emulated GPU)"
else
    gpu=("${common[@]}" --device cuda --precision fp32 --block_size 16 --max_steps 4 --grad_clip 0)
    train g_one "${gpu[@]}" --batch_size 8 --shard 0
    train g_hyb "${gpu[@]}" --batch_size 2 --nprocs 4 --shard 3 --replicate 2; status=$?
    grep -q 'backend nccl' "$TMP/g_hyb" || status=98
    equal g_one g_hyb 1e-5 $status
    verdict $? "hybrid gpu: --shard 3 --replicate 2 on 4 GPUs (nccl, $(hybrid g_hyb)) equals one GPU x batch 8 in fp32 (models $r apart, AdamW's moments too)" \
        "status $status, relative '$r', valid $va vs $vb, moments ${ma[*]} vs ${mb[*]}: $(grep -m1 -iE 'error|backend' "$TMP/g_hyb")"
fi

# ---------------------------------------------------------------- equal to one process (CPU, fp32)
cpu_paths "hybrid" || { no_leftovers "hybrid: no process left behind" "09_zero_fsdp/09_zero_fsdp"; exit 0; }
cpu=("${common[@]}" --device cpu --max_steps 4 --grad_clip 0)
train one "${cpu[@]}" --batch_size 8 --shard 0
# 4 ranks as 2 replicas of 2 (ZeRO-2 with 2 micro-batches: the slices add
# up over the micro-batches and cross the replicas once a step), and 8 ranks
# as 2 replicas of 4 (every bucket padded to a multiple of 4).
for case in "4 2 1 2 1" "4 2 2 1 2" "4 2 3 2 1" "8 2 3 1 1"; do
    set -- $case
    name=n$1r$2s$3
    train "$name" "${cpu[@]}" --nprocs "$1" --replicate "$2" --shard "$3" --batch_size "$4" --grad_accum "$5"; status=$?
    equal one "$name" 1e-6 $status
    verdict $? "hybrid cpu: --shard $3 on $1 ranks as $(hybrid "$name" | sed 's/.* = //') (x batch $4 x $5 micro-batch(es)) equals one process x batch 8 (models $r apart, validation $vb, AdamW's moments too)" \
        "status $status, relative '$r', valid $va vs $vb, moments ${ma[*]} vs ${mb[*]}: $(grep -m1 -i error "$TMP/$name")"
done
# Planted: the replicas never meet (the all-reduce of the slices left out):
# each replica trains on its half of the data alone.
planted=$(plant no_replicas gpt/zero.h '    if (z->replicas == 1) return;' '    if (z->replicas > 0) return;' \
    09_zero_fsdp 09_zero_fsdp)
[[ -n $planted ]] && prog_under_test=$planted train p_none "${cpu[@]}" --nprocs 4 --replicate 2 --shard 3 --batch_size 2 &&
    ! equal one p_none 1e-6
verdict $? "hybrid planted: the replicas' all-reduce left out is caught (models $r apart)" \
    "$(planted_why no_replicas)relative '$r', moments ${ma[*]} vs ${mb[*]}"
# Planted: the replicas' slices summed where their mean belongs: the
# gradients twice too large. Adam's step nearly hides it; the moments do not.
planted=$(plant replicas_sum gpt/zero.h 'z->shard_len, DTYPE_F32, OP_AVG);' 'z->shard_len, DTYPE_F32, OP_SUM);' \
    09_zero_fsdp 09_zero_fsdp)
[[ -n $planted ]] && prog_under_test=$planted train p_sum "${cpu[@]}" --nprocs 4 --replicate 2 --shard 1 --batch_size 2 &&
    ! equal one p_sum 1e-6 && near "$r" 0 1e-3
verdict $? "hybrid planted: the replicas' slices summed, not averaged, is caught by the moments (models only $r apart; m ${mb[0]} vs ${ma[0]})" \
    "$(planted_why replicas_sum)relative '$r', moments ${ma[*]} vs ${mb[*]}"

# ---------------------------------------------------------------- memory and traffic, by group
# row FILE NAME COLUMN: a number from the tables (column 1: rank 0's, or
# the KiB of a traffic row; last: the formula's value).
row() { awk -v name="$2" -v col="$3" 'index($0, "  " name " ") == 1 { n = split(substr($0, length(name) + 3), f, " ");
        print (col == "last" ? f[n] : f[col]); exit }' "$1" 2>/dev/null; }
close_to() { near "$1" "$2" 0.5 0.01; }
# ZeRO-3 on 4 ranks as 2 x 2: every rank (column 4: rank 3) holds 4P/(N/R)
# of parameters and 8P/(N/R) of optimizer state; over its shard group it
# reduce-scatters (n-1)/n B, over the replicate group it all-reduces its
# slices, 2(R-1)/R B/n: B/2 here. The sums are counted at the calls.
# kib FILE COLLECTIVE GROUP: the KiB column of that traffic row.
kib() { awk -v c="$2" -v g="$3" '$1 == c && $2 == g { print $5; exit }' "$1" 2>/dev/null; }
theory() { awk -v c="$2" -v g="$3" '$1 == c && $2 == g { print $NF; exit }' "$1" 2>/dev/null; }
tables_as_formula() {
    close_to "$(row "$1" parameters 4)" "$(row "$1" parameters last)" &&
        close_to "$(row "$1" "optimizer state" 4)" "$(row "$1" "optimizer state" last)" &&
        close_to "$(kib "$1" reduce_scatter shard)" "$(theory "$1" reduce_scatter shard)" &&
        close_to "$(kib "$1" all_reduce replicate)" "$(theory "$1" all_reduce replicate)" &&
        close_to "$(row "$1" "over replicate" 1)" "$(row "$1" "over replicate" last)"
}
tables_as_formula "$TMP/n4r2s3" && grep -q '4P/(N/R)' "$TMP/n4r2s3" &&
    awk -v a="$(row "$TMP/n4r2s3" parameters 1)" -v b="$(row "$TMP/n8r2s3" parameters 1)" 'BEGIN { exit !(b > 0 && a > 1.9 * b) }'
verdict $? "hybrid memory and traffic: 4 ranks as 2 x 2 hold 4P/(N/R) = $(row "$TMP/n4r2s3" parameters 1) KiB of parameters (8 as 2 x 4: $(row "$TMP/n8r2s3" parameters 1)), reduce-scatter $(kib "$TMP/n4r2s3" reduce_scatter shard) KiB over the shard group and all-reduce $(kib "$TMP/n4r2s3" all_reduce replicate) KiB of slices over the replicas, as the formulas say" \
    "$(grep -A20 '^memory per rank' "$TMP/n4r2s3" | tr '\n' '|')"
# Planted: the slices cut over the whole job instead of the shard group
# (zero_setup given the job's group): each rank holds 1/N, not 1/(N/R).
planted=$(plant cut_over_job 09_zero_fsdp/09_zero_fsdp.c 'zero_ops_for(&model), shard, replicate);' \
    'zero_ops_for(&model), dist.pg, replicate);' 09_zero_fsdp 09_zero_fsdp)
[[ -n $planted ]] && prog_under_test=$planted train p_cut "${cpu[@]}" --nprocs 4 --replicate 2 --shard 3 --batch_size 2 --max_steps 1 &&
    ! tables_as_formula "$TMP/p_cut"
verdict $? "hybrid planted: slices cut over the whole job fail the tables' check (parameters $(row "$TMP/p_cut" parameters 1) KiB, formula $(row "$TMP/p_cut" parameters last))" \
    "$(planted_why cut_over_job)$(grep -A3 '^memory per rank' "$TMP/p_cut" 2>/dev/null | tr '\n' '|')"

# ---------------------------------------------------------------- snapshots
# 4 ranks as 2 x 2 (ZeRO-3) save at the end of epoch 1: the first replica
# writes 2 shards. Copies are resumed by 6 ranks as 2 x 3 (ZeRO-2: the
# snapshot resharded from 2 slices to 3) and by 2 ranks, one group (ZeRO-1);
# each saves its own shards at once. Consolidated, all three are the same
# state, to the byte.
consolidated='^consolidated: ([0-9]*) shard\(s\) .*: (params .*)'
snap=("${common[@]}" --device cpu --epochs 1 --save_every 1 --batch_size 2 --max_steps 6)
train save "${snap[@]}" --nprocs 4 --replicate 2 --shard 3 --snapshot_path "$TMP/s/s.safetensors"; s0=$?
run_capture 60 "$TMP/c" "$prog" --consolidate --snapshot_path "$TMP/s/s.safetensors" --out_dir "$TMP/c.d"
shards=$(ls "$TMP/s" | grep -c 'shard.of2\.')
# resume NAME NPROCS REPLICATE SHARD: a copy of the snapshot resumed by
# $prog_under_test, then consolidated; sets status and c.
resume() {
    rm -rf "$TMP/$1.s" && cp -r "$TMP/s" "$TMP/$1.s"
    train "$1" "${snap[@]}" --nprocs "$2" --replicate "$3" --shard "$4" --snapshot_path "$TMP/$1.s/s.safetensors"; status=$?
    run_capture 60 "$TMP/$1.c" "$prog" --consolidate --snapshot_path "$TMP/$1.s/s.safetensors" --out_dir "$TMP/$1.c.d"
    c=$(field "$TMP/$1.c" "$consolidated" '\1 \2')
}
a=$(field "$TMP/c" "$consolidated" '\1 \2')
resume r6 6 2 2; s6=$status c6=$c
resume r2 2 1 1; s2=$status c2=$c
[[ $s0 -eq 0 && $s6 -eq 0 && $s2 -eq 0 && $shards -eq 2 && "${a%% *}" == 2 && "${c6%% *}" == 3 && "${c2%% *}" == 2 &&
   -n "${a#* }" && "${a#* }" == "${c6#* }" && "${a#* }" == "${c2#* }" ]] &&
    grep -q "resharded: the snapshot's 2 shard(s) loaded as 3" "$TMP/r6"
verdict $? "hybrid snapshot: 4 ranks as 2 x 2 write 2 shards; resumed as 6 ranks (2 x 3) and as 2, the state is the same to the byte (${a#* })" \
    "status $s0, $s6, $s2; $shards shard files; 2x2: '$a'; 2x3: '$c6'; 2: '$c2'"
# Planted: the index says the job's 4 ranks, not the shard group's 2: the
# resume looks for shards no rank wrote, and must stop, saying so.
planted=$(plant index_world 09_zero_fsdp/zero_snapshot.h '"world_size", "%d", z->world);' \
    '"world_size", "%d", z->dist->world_size);' 09_zero_fsdp 09_zero_fsdp)
if [[ -n $planted ]]; then
    prog_under_test=$planted train p_save "${snap[@]}" --nprocs 4 --replicate 2 --shard 3 --snapshot_path "$TMP/ps/s.safetensors"
    prog_under_test=$planted train p_load "${snap[@]}" --nprocs 2 --shard 1 --snapshot_path "$TMP/ps/s.safetensors"; status=$?
fi
[[ -n $planted && $status -ne 0 ]] && grep -q 'names 4 shards, but shard 0 is unusable' "$TMP/p_load"
verdict $? "hybrid planted: an index that names the job's ranks, not the shard group's, is caught on resume ($(grep -m1 -o 'names 4 shards.*unusable' "$TMP/p_load" 2>/dev/null))" \
    "$(planted_why index_world)status ${status:-}: $(grep -m1 -i error "$TMP/p_load" 2>/dev/null)"

# ---------------------------------------------------------------- flags
# What does not fit is refused in one line naming the flag (status 2).
run_capture 10 "$TMP/bad1" "$prog" "${cpu[@]}" --nprocs 3 --replicate 2; s1=$?
run_capture 10 "$TMP/bad2" "$prog" "${cpu[@]}" --nprocs 4 --replicate 2 --shard 0; s2=$?
run_capture 10 "$TMP/bad3" "$prog" "${cpu[@]}" --replicate 2; s3=$?
[[ $s1 -eq 2 && $s2 -eq 2 && $s3 -eq 2 ]] && grep -q -- "--replicate 2 does not divide the job's 3 ranks" "$TMP/bad1" &&
    grep -q -- "--replicate 2 needs --shard 1, 2 or 3" "$TMP/bad2" && grep -q -- "--replicate 2 does not divide the job's 1 ranks" "$TMP/bad3"
verdict $? "hybrid flags: --replicate that does not divide the ranks, or with --shard 0, is refused (status 2)" \
    "status $s1, $s2, $s3: $(head -n 1 "$TMP/bad1") | $(head -n 1 "$TMP/bad2") | $(head -n 1 "$TMP/bad3")"

# ---------------------------------------------------------------- the mpi backend
# Under mpirun the world size comes from MPI: 4 ranks as 2 x 2, ZeRO-3.
if ! command -v mpirun >/dev/null 2>&1; then
    skip "hybrid mpi: --replicate 2 under mpirun" "mpirun not found (apt-get install openmpi-bin libopenmpi-dev, then make)"
else
    mpi=(mpirun -np)
    mpirun --version 2>&1 | grep -q "Open MPI" && mpi=(mpirun --oversubscribe --allow-run-as-root -np)
    run_capture 180 "$TMP/mpi" "${mpi[@]}" 4 "$prog" "${cpu[@]}" --batch_size 2 --shard 3 --replicate 2 --backend mpi \
        --out_dir "$TMP/mpi.d"; status=$?
    if grep -q "this build has no MPI" "$TMP/mpi"; then skip "hybrid mpi: --replicate 2 under mpirun" "this build has no MPI (MPI=0, or no mpi.h)"
    else
        grep -q "backend mpi" "$TMP/mpi" || status=98
        equal one mpi 1e-6 $status
        verdict $? "hybrid mpi: --shard 3 --replicate 2 on 4 ranks under mpirun equals one process (models $r apart, AdamW's moments too)" \
            "status $status, relative '$r', moments ${ma[*]} vs ${mb[*]}: $(grep -m2 -i 'error\|backend' "$TMP/mpi" | tr '\n' '|')"
    fi
fi

no_leftovers "hybrid: no process left behind" "09_zero_fsdp/09_zero_fsdp"
