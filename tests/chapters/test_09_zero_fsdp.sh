# Chapter 09, sharded data parallelism: every ZeRO stage trains the model
# that DDP and one process with the same total batch train; each rank
# holds and sends what the formulas say; sharded snapshots resume bit for
# bit, reshard to another number of ranks without changing a byte, and
# consolidate into a model that chapter 08 loads. Four checks keep their
# planted bug beside them (tests/lib.sh, plant).
source "$(dirname "$0")/../lib.sh"
prog="$ROOT/09_zero_fsdp/09_zero_fsdp"
p08="$ROOT/08_gpt_wikitext/08_gpt_wikitext"
ddprun="$ROOT/tools/ddprun"
[[ -x "$prog" && -x "$p08" && -x "$ddprun" ]] || { fail "zero: binaries" "build first (make)"; exit 1; }
export OMP_NUM_THREADS=1

# A small corpus in WikiText's layout (no real data needed).
gpt_corpus "$TMP/corpus"
common=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000
        --device cpu)
# What field reads from a run's output.
sum='final parameters checksum ([0-9a-f]*),' moments='^final AdamW moments: l2 norm of m ([0-9.e+-]*), of v ([0-9.e+-]*)$'

# diff_of A B: ||a - b|| / ||a|| over every number of two model files
# (safetensors: an 8-byte header length, the header, then the floats).
floats() { local h; h=$(od -An -tu8 -N8 "$1" | tr -d ' '); od -An -v -tf4 -j $((8 + h)) "$1" | tr -s ' ' '\n' | sed '/^$/d'; }
diff_of() {
    [[ -s "$1" && -s "$2" ]] || { echo "missing"; return; }
    paste <(floats "$1") <(floats "$2") | awk 'NF != 2 { bad = 1 } { d = $1 - $2; s += d * d; n += $1 * $1 }
        END { if (bad || NR == 0 || n == 0) print "unequal"; else printf "%.2g\n", sqrt(s / n) }'
}
below() { is_number "$1" && awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 <= b + 0) }'; }
# same_moments A B TOL: the l2 norms of AdamW's moments agree. Adam's step
# is nearly blind to gradients that are all N times too large (a sum where
# the mean belongs); its moments are not.
same_moments() {
    local a b
    a=($(field "$1" "$moments" '\1 \2')) b=($(field "$2" "$moments" '\1 \2'))
    [[ ${#a[@]} -eq 2 && ${#b[@]} -eq 2 ]] && rel_near "${a[0]}" "${b[0]}" "$3" && rel_near "${a[1]}" "${b[1]}" "$3"
}

# train NAME ARGS...: a run of $prog, its output in $TMP/NAME, its model in $TMP/NAME.d
train() { local name=$1; shift; run_capture 300 "$TMP/$name" "${prog_under_test:-$prog}" "$@" --out_dir "$TMP/$name.d"; }
steps=(--max_steps 4)
consolidated='^consolidated: ([0-9]*) shard\(s\) .*: (params .*)'

# ---------------------------------------------------------------- on GPUs
# The GPU model (real GPUs, or the 8 emulated ones of CUDA=emu, where the
# ranks talk NCCL): ZeRO-2 reduce-scatters while backward runs, ZeRO-3
# gathers the next bucket while this one computes.
if ! has_gpu; then
    for what in "fp32 stages equal one process" "bf16 within 08's tolerance" "08's CUDA graph with --shard 0" \
                "fp16 with --shard 0, its loss scale resumed" "snapshots move between GPUs and CPUs"; do
        skip "zero gpu: $what" "no GPU here (a CPU-only build, or no GPU: make CUDA=emu test runs these on the emulated GPU)"
    done
else
    # Three blocks: the two block buffers are then reused within a pass (block
    # 2's while block 0 computes), which a missing wait between the streams breaks.
    gpu0=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000
          --device cuda --block_size 16 --n_layer 3)
    gpu=("${gpu0[@]}" "${steps[@]}")
    train g_one "${gpu[@]}" --precision fp32 --batch_size 8 --shard 0
    for case in "2 4 0" "2 4 1" "2 4 2" "2 4 3" "4 2 3"; do
        set -- $case
        train "g_n$1s$3" "${gpu[@]}" --precision fp32 --batch_size "$2" --nprocs "$1" --shard "$3"; status=$?
        d=$(diff_of "$TMP/g_one.d/model.safetensors" "$TMP/g_n$1s$3.d/model.safetensors")
        [[ $status -eq 0 ]] && below "$d" 1e-6 && same_moments "$TMP/g_one" "$TMP/g_n$1s$3" 1e-6
        verdict $? "zero gpu: --shard $3, $1 ranks x batch $2 equal one process x batch 8 in fp32 ($d, AdamW's moments too; $(grep -m1 -o 'backend [a-z]*' "$TMP/g_n$1s$3"))" \
            "status $status, difference $d: $(grep -m1 error "$TMP/g_n$1s$3")"
    done
    # bf16: 08's tolerance for DDP against one process (2e-2).
    train h_one "${gpu[@]}" --precision bf16 --batch_size 8 --shard 0
    train h_two "${gpu[@]}" --precision bf16 --batch_size 4 --nprocs 2 --shard 3; status=$?
    d=$(diff_of "$TMP/h_one.d/model.safetensors" "$TMP/h_two.d/model.safetensors")
    [[ $status -eq 0 ]] && below "$d" 2e-2 && grep -q "parameters (.*), bf16" "$TMP/h_two"
    verdict $? "zero gpu: --shard 3 in bf16, 2 ranks x batch 4, within 2e-2 of one process x batch 8 ($d)" "status $status, difference $d"
    # One GPU: --shard 0 is 08's step, one CUDA graph launch (--cuda_graph);
    # a sharded stage steps its slices outside the model's step, says so,
    # and trains the same model.
    train g_one3 "${gpu[@]}" --precision fp32 --batch_size 8 --shard 3; status=$?
    d=$(diff_of "$TMP/g_one.d/model.safetensors" "$TMP/g_one3.d/model.safetensors")
    [[ $status -eq 0 ]] && below "$d" 1e-6 && grep -q "^step: one CUDA graph launch" "$TMP/g_one" &&
        grep -q "no CUDA graph: ZeRO clips and steps its slices" "$TMP/g_one3"
    verdict $? "zero gpu: 08's CUDA graph with --shard 0 on one GPU; --shard 3 steps without it, saying why, to the same model ($d)" \
        "status $status, difference $d: $(grep -h '^step:' "$TMP/g_one" "$TMP/g_one3" | tr '\n' '|')"
    # fp16, 08's loss scale, with --shard 0 (08's step): it trains on 2 GPUs,
    # and a resume (its snapshot ends epoch 1) goes on with the snapshot's
    # scale, not --loss_scale.
    fp16=("${gpu0[@]}" --precision fp16 --batch_size 4 --nprocs 2 --shard 0 --save_every 1
          --snapshot_path "$TMP/gf.d/s.safetensors")
    train gf "${fp16[@]}" --max_steps 4; s1=$?
    train gf2 "${fp16[@]}" --epochs 2 --max_steps 6 --loss_scale 1024; s2=$?
    a=$(field "$TMP/gf" 'loss scale ([0-9]+),') b=$(field "$TMP/gf2" 'loss scale ([0-9]+),')
    [[ $s1 -eq 0 && $s2 -eq 0 && -n "$a" && -n "$b" ]] && grep -q "Resuming training from snapshot" "$TMP/gf2" &&
        awk -v b="$b" 'BEGIN { exit !(b > 1024) }'
    verdict $? "zero gpu: fp16 with --shard 0 trains on 2 GPUs (loss scale $a) and resumes with the snapshot's scale ($b, not --loss_scale 1024)" \
        "status $s1, $s2; scales '$a', '$b': $(grep -m1 -h error "$TMP/gf" "$TMP/gf2")"
    # A GPU run's shards resume on CPU ranks, resharded, with the same state.
    awk -v dir="$TMP/small" 'BEGIN { system("mkdir -p " dir); srand(5)
        for (f = 1; f <= 3; f++) { file = dir "/" (f == 1 ? "train.txt" : f == 2 ? "valid.txt" : "test.txt")
            for (i = 0; i < (f == 1 ? 240 : 60); i++) printf " the cat %d sees a dog %d . \n", i % 7, i % 5 > file } }'
    small=(--data_dir "$TMP/small" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000
           --precision fp32 --block_size 16 --epochs 1 --save_every 1 --batch_size 4)
    run_capture 300 "$TMP/gs" "$prog" "${small[@]}" --device cuda --nprocs 2 --shard 3 --out_dir "$TMP/gs.d" \
        --snapshot_path "$TMP/gs.d/s.safetensors"
    run_capture 60 "$TMP/gc" "$prog" --consolidate --snapshot_path "$TMP/gs.d/s.safetensors" --out_dir "$TMP/gc.d"
    cp -r "$TMP/gs.d" "$TMP/gx.d"
    run_capture 120 "$TMP/gx" "$prog" "${small[@]}" --device cpu --nprocs 3 --shard 2 --out_dir "$TMP/gx.d" \
        --snapshot_path "$TMP/gx.d/s.safetensors"; status=$?
    run_capture 60 "$TMP/gxc" "$prog" --consolidate --snapshot_path "$TMP/gx.d/s.safetensors" --out_dir "$TMP/gxc.d"
    a=$(field "$TMP/gc" "$consolidated" '\1 \2') b=$(field "$TMP/gxc" "$consolidated" '\1 \2')
    [[ $status -eq 0 && "${a%% *}" == 2 && "${b%% *}" == 3 && -n "${a#* }" && "${a#* }" == "${b#* }" ]]
    verdict $? "zero gpu: snapshots move between GPUs and CPUs: 2 GPU ranks' shards resume on 3 CPU ranks, the same state" \
        "status $status; GPU: '$a'; CPU: '$b'"
fi

# ---------------------------------------------------------------- the same model, whatever the stage (CPU, fp32)
# (CI's emulated-GPU pass stops here: CPU_PATHS=skip, tests/lib.sh.)
cpu_paths "zero" || { no_leftovers "zero: no process left behind" "09_zero_fsdp/09_zero_fsdp"; exit 0; }
# Every stage ends with DDP's parameters and with one process's over the
# same total batch, to 1e-6 of their norm. Not bit for bit in general: a
# reduce-scatter adds the ranks' gradients in another order than an
# all-reduce or one process's batch, and float addition is not associative.
# N = 3 pads every bucket (none of its sizes is a multiple of 3). The runs
# on 4 ranks do not clip: clipping to a norm hides gradients that are all
# N times too large (a sum where the mean belongs), as Adam's step does.
train one8 "${common[@]}" "${steps[@]}" --batch_size 8 --shard 0
train one6 "${common[@]}" "${steps[@]}" --batch_size 6 --shard 0
train one8nc "${common[@]}" "${steps[@]}" --batch_size 8 --shard 0 --grad_clip 0
# stage_equal NAME N BATCH SHARD CLIP REF: the run NAME (of $prog_under_test)
# against DDP's run on N ranks (n${N}s0) and the one-process run REF; sets
# status, to_ddp, to_one; true when all three agree, AdamW's moments too.
stage_equal() {
    train "$1" "${common[@]}" "${steps[@]}" --batch_size "$3" --nprocs "$2" --shard "$4" --grad_clip "$5"; status=$?
    to_ddp=$(diff_of "$TMP/n${2}s0.d/model.safetensors" "$TMP/$1.d/model.safetensors")
    to_one=$(diff_of "$TMP/$6.d/model.safetensors" "$TMP/$1.d/model.safetensors")
    [[ $status -eq 0 ]] && below "$to_ddp" 1e-6 && below "$to_one" 1e-6 && same_moments "$TMP/$6" "$TMP/$1" 1e-6 &&
        same_moments "$TMP/n${2}s0" "$TMP/$1" 1e-6
}
for case in "2 4 one8 1" "3 2 one6 1" "4 2 one8nc 0"; do
    set -- $case
    n=$1 batch=$2 ref=$3 clip=$4
    for s in 0 1 2 3; do
        stage_equal "n${n}s$s" "$n" "$batch" "$s" "$clip" "$ref"
        verdict $? "zero cpu: --shard $s, $n ranks x batch $batch (--grad_clip $clip) equal DDP ($to_ddp) and one process x batch $((n * batch)) ($to_one), AdamW's moments too" \
            "status $status, differences $to_ddp (DDP), $to_one (one process); moments $(field "$TMP/n${n}s$s" "$moments" '\1 \2') against $(field "$TMP/$ref" "$moments" '\1 \2'): $(grep -m1 error "$TMP/n${n}s$s")"
    done
done
# Planted: the reduce-scatter sums where the mean belongs (every stage's
# gradients N times too large). The 4 unclipped ranks of ZeRO-2 must differ.
planted=$(plant rs_sum gpt/zero.h 'count, DTYPE_F32, OP_AVG);' 'count, DTYPE_F32, OP_SUM);' 09_zero_fsdp 09_zero_fsdp)
[[ -n $planted ]] && ! prog_under_test=$planted stage_equal planted_sum 4 2 2 0 one8nc && [[ $status -eq 0 ]]
verdict $? "planted: a reduce-scatter that sums instead of averaging fails the 4-rank ZeRO-2 check (difference $to_one)" \
    "$(planted_why rs_sum)status $status, differences $to_ddp (DDP), $to_one (one process)"

# Micro-batches: ZeRO-3 reduce-scatters every one and adds them up.
accumulates() {
    train "$1" "${common[@]}" "${steps[@]}" --batch_size 2 --grad_accum 2 --nprocs 2 --shard 3; status=$?
    d=$(diff_of "$TMP/one8.d/model.safetensors" "$TMP/$1.d/model.safetensors")
    [[ $status -eq 0 ]] && below "$d" 1e-6 && same_moments "$TMP/one8" "$TMP/$1" 1e-6
}
accumulates acc
verdict $? "zero cpu: --shard 3 with 2 micro-batches of 2 on 2 ranks equals one process x batch 8 ($d)" "status $status, difference $d"
# Planted: the second micro-batch's slice replaces the first's instead of adding to it.
planted=$(plant micro_copy gpt/zero.h 'z->ops->add(z, mine, z->scratch, b->slice);' \
    'z->ops->copy(z, mine, z->scratch, b->slice);' 09_zero_fsdp 09_zero_fsdp)
[[ -n $planted ]] && ! prog_under_test=$planted accumulates planted_acc && [[ $status -eq 0 ]]
verdict $? "planted: a micro-batch's gradient slice that overwrites the last one fails the micro-batch check ($d)" \
    "$(planted_why micro_copy)status $status, difference $d"

# ---------------------------------------------------------------- memory and traffic, beside the formulas
# row FILE NAME COLUMN: a number from the tables (column 1: rank 0; the last: the formula's value).
row() { awk -v name="$2" -v col="$3" 'index($0, "  " name " ") == 1 { n = split(substr($0, length(name) + 3), f, " ");
        print (col == "last" ? f[n] : f[col]); exit }' "$1" 2>/dev/null; }   # no output (a planted copy not run): empty
close_to() { near "$1" "$2" 0.5 0.01; }
# ZeRO-3 holds 4P/N of parameters and 8P/N of optimizer state per rank, ZeRO-1 8P/N of
# optimizer state on every rank (column 4: rank 3), DDP 4P of parameters.
memory_as_formula() {
    close_to "$(row "$1" parameters 1)" "$(row "$1" parameters last)" &&
        close_to "$(row "$1" "optimizer state" 1)" "$(row "$1" "optimizer state" last)"
}
memory_as_formula "$TMP/n4s3" && close_to "$(row "$TMP/n4s1" "optimizer state" 4)" "$(row "$TMP/n4s1" "optimizer state" last)" &&
    close_to "$(row "$TMP/n4s0" parameters 1)" "$(row "$TMP/n4s0" parameters last)"
verdict $? "zero memory: each rank holds the ZeRO paper's bytes (ZeRO-3: parameters $(row "$TMP/n4s3" parameters 1) KiB = 4P/N; optimizer state 8P/N; DDP 4P)" \
    "$(grep -A8 '^memory per rank' "$TMP/n4s3" | tr '\n' '|')"
# Planted: ZeRO-3 holds a whole parameter array beside its slices (the model's, allocated again).
planted=$(plant keeps_params gpt/zero.h 'm->host.params = NULL;' 'm->host.params = xmalloc(z->num_params * sizeof(float));' \
    09_zero_fsdp 09_zero_fsdp)
[[ -n $planted ]] && run_capture 120 "$TMP/planted_mem" "$planted" "${common[@]}" --max_steps 1 --batch_size 2 --nprocs 4 --shard 3 \
    --out_dir "$TMP/planted_mem.d" && ! memory_as_formula "$TMP/planted_mem"
verdict $? "planted: ZeRO-3 keeping the whole parameters fails the memory check (parameters $(row "$TMP/planted_mem" parameters 1) KiB, formula $(row "$TMP/planted_mem" parameters last))" \
    "$(planted_why keeps_params)$(grep -A3 '^memory per rank' "$TMP/planted_mem" 2>/dev/null | tr '\n' '|')"
g0=$(row "$TMP/n4s0" gradients 1) g2=$(row "$TMP/n4s2" gradients 1) g3=$(row "$TMP/n4s3" gradients 1)
awk -v a="$g0" -v b="$g2" -v c="$g3" 'BEGIN { exit !(b > 0 && c > 0 && b < a && c < a) }'
verdict $? "zero memory: ZeRO-2 and 3 hold fewer gradient bytes than DDP on 4 ranks ($g2 and $g3 KiB against $g0)" \
    "DDP $g0, ZeRO-2 $g2, ZeRO-3 $g3 KiB"
# Traffic: DDP's all-reduce and ZeRO-1's pair send 2(N-1)/N B (padding
# aside); ZeRO-3 sends more, but less than 3(N-1)/N B: the embeddings and
# ln_f stay gathered from the forward pass to the backward pass.
t0=$(row "$TMP/n4s0" total 1) t1=$(row "$TMP/n4s1" total 1) t3=$(row "$TMP/n4s3" total 1)
th0=$(row "$TMP/n4s0" total last) th3=$(row "$TMP/n4s3" total last)
close_to "$t0" "$th0" && close_to "$t1" "$th0" && awk -v t="$t3" -v a="$th0" -v b="$th3" 'BEGIN { exit !(t > a && t < b) }'
verdict $? "zero traffic: KiB sent per step: DDP $t0, ZeRO-1 $t1 (theory 2(N-1)/N B = $th0), ZeRO-3 $t3 (between that and 3(N-1)/N B = $th3)" \
    "DDP $t0, ZeRO-1 $t1, theory $th0; ZeRO-3 $t3, theory $th3"

# ---------------------------------------------------------------- sharded snapshots
# 4 ranks (ZeRO-3) save at the end of epoch 1; copies of that snapshot are
# resumed by 2 ranks (ZeRO-2), which save their own shards at once, and
# those by 3 ranks (ZeRO-1). Consolidating each gives the same state, to
# the byte: resharding changes nothing.
snap=(--epochs 1 --save_every 1 --batch_size 2)
train save4 "${common[@]}" "${snap[@]}" --nprocs 4 --shard 3 --snapshot_path "$TMP/s4/s.safetensors"
run_capture 60 "$TMP/c4" "$prog" --consolidate --snapshot_path "$TMP/s4/s.safetensors" --out_dir "$TMP/c4.d"
cp -r "$TMP/s4" "$TMP/s2"
train load2 "${common[@]}" "${snap[@]}" --nprocs 2 --shard 2 --snapshot_path "$TMP/s2/s.safetensors"
run_capture 60 "$TMP/c2" "$prog" --consolidate --snapshot_path "$TMP/s2/s.safetensors" --out_dir "$TMP/c2.d"
# reshard3 NAME: 3 ranks of $prog_under_test resume a copy of the 2 ranks'
# snapshot, and it is consolidated; sets status and c (shards, state).
reshard3() {
    rm -rf "$TMP/$1.s" && cp -r "$TMP/s2" "$TMP/$1.s"
    train "$1" "${common[@]}" "${snap[@]}" --nprocs 3 --shard 1 --snapshot_path "$TMP/$1.s/s.safetensors"; status=$?
    run_capture 60 "$TMP/$1.c" "$prog" --consolidate --snapshot_path "$TMP/$1.s/s.safetensors" --out_dir "$TMP/$1.c.d"
    c=$(field "$TMP/$1.c" "$consolidated" '\1 \2')
}
reshard3 load3
a=$(field "$TMP/c4" "$consolidated" '\1 \2') b=$(field "$TMP/c2" "$consolidated" '\1 \2')
[[ $status -eq 0 && "${a%% *}" == 4 && "${b%% *}" == 2 && "${c%% *}" == 3 && -n "${a#* }" && "${a#* }" == "${b#* }" &&
   "${a#* }" == "${c#* }" ]] && grep -q "resharded: the snapshot's 2 shard(s) loaded as 3" "$TMP/load3"
verdict $? "zero snapshot: 4 -> 2 -> 3 ranks reshards without changing a byte (${a#* })" "status $status; 4: '$a'; 2: '$b'; 3: '$c'"
# Planted: each shard read from the start of the writer's slice, not from
# where this rank's range begins in it. The same number of ranks never
# notices (each reads whole slices); 3 ranks reading 2's must.
planted=$(plant reshard_offset 09_zero_fsdp/zero_snapshot.h 'data[i] + pos + (lo - first)' 'data[i] + pos' 09_zero_fsdp 09_zero_fsdp)
[[ -n $planted ]] && prog_under_test=$planted reshard3 planted_load3 && [[ $status -eq 0 && "${c%% *}" == 3 && "${c#* }" != "${b#* }" ]]
verdict $? "planted: shards read at the writer's slice start fail the 2 -> 3 resharding check (${c#* })" \
    "$(planted_why reshard_offset)status $status; 2: '$b'; 3: '$c'"
# The consolidated model is the model the 4 ranks saved at the end, and
# chapter 08 samples from it.
cp "$TMP/save4.d/tokenizer.json" "$TMP/c4.d/"
run_capture 60 "$TMP/gen" "$p08" --generate --out_dir "$TMP/c4.d" --device cpu --num_samples 1 --sample_tokens 8; status=$?
cmp -s "$TMP/c4.d/model.safetensors" "$TMP/save4.d/model.safetensors" && [[ $status -eq 0 ]] && grep -q '^--- sample 1 ' "$TMP/gen"
verdict $? "zero snapshot: --consolidate writes the model the run saved, and 08 --generate samples from it" \
    "status $status: $(tail -n 2 "$TMP/gen" | tr '\n' '|')"

# A rank killed in epoch 2 under ddprun: the job restarts, every rank
# reloads its own shard (the same number of ranks), and the run ends with
# the same bytes as a run that was never killed.
kill_args=(--epochs 3 --save_every 1 --shard 3)
run_capture 300 "$TMP/clean" "$ddprun" --standalone --nproc_per_node=2 "$prog" "${common[@]}" "${kill_args[@]}" \
    --out_dir "$TMP/clean.d" --snapshot_path "$TMP/clean.d/s.safetensors"
steps1=$(field "$TMP/clean" 'snapshot saved: Epoch 1 \(step ([0-9]*)\)')
COURSE_FAIL_RANK=1 COURSE_FAIL_STEP=$(( ${steps1:-10} + 5 )) run_capture 300 "$TMP/killed" "$ddprun" --standalone \
    --nproc_per_node=2 --max_restarts=1 "$prog" "${common[@]}" "${kill_args[@]}" --out_dir "$TMP/killed.d" \
    --snapshot_path "$TMP/killed.d/s.safetensors"; status=$?
a=$(field "$TMP/clean" "$sum"); b=$(field "$TMP/killed" "$sum")
[[ $status -eq 0 && -n "$a" && "$a" == "$b" ]] && grep -q "Resuming training from snapshot at Epoch 1" "$TMP/killed" &&
   grep -q "fault injection: rank 1" "$TMP/killed"
verdict $? "zero snapshot: a rank killed in epoch 2 under ddprun, restarted, resumes from its shard and ends byte-identical ($a)" \
    "status $status, clean '$a', resumed '$b'"

# Bad input: one line naming the flag, status 2.
run_capture 10 "$TMP/bad1" "$prog" --shard 4; s1=$?
run_capture 10 "$TMP/bad2" "$prog" --consolidate; s2=$?
[[ $s1 -eq 2 && $s2 -eq 2 ]] && grep -q -- "--shard" "$TMP/bad1" && grep -q -- "--consolidate needs --snapshot_path" "$TMP/bad2"
verdict $? "zero flags: --shard 4 and --consolidate without --snapshot_path are refused (status 2)" \
    "status $s1, $s2: $(head -n 1 "$TMP/bad1") | $(head -n 1 "$TMP/bad2")"

# ---------------------------------------------------------------- 08's flags
# Every flag of 08 works here as in 08, or is refused saying why. --shard 0
# is 08's DDP: DDP's compression hook, accumulation and the loader's
# worker thread give 08's run, byte for byte.
flags08=(--max_steps 4 --batch_size 4 --nprocs 2)
for how in "--grad_compress bf16" "--grad_compress powersgd --powersgd_rank 2" "--grad_accum 2 --num_workers 1"; do
    name=f$(echo "$how" | tr -dc 'a-z0-9')
    run_capture 120 "$TMP/$name.08" "$p08" "${common[@]}" "${flags08[@]}" $how --out_dir "$TMP/$name.08.d"
    train "$name" "${common[@]}" "${flags08[@]}" $how --shard 0; status=$?
    a=$(field "$TMP/$name.08" "$sum") b=$(field "$TMP/$name" "$sum")
    [[ $status -eq 0 && -n "$a" && "$a" == "$b" ]]
    verdict $? "zero flags: --shard 0 $how on 2 ranks is 08's run, byte for byte ($a)" "status $status: 08 '$a', 09 '$b'"
done
# The loader's worker thread makes the same batches for ZeRO-3 too.
train w2s3 "${common[@]}" "${steps[@]}" --batch_size 4 --nprocs 2 --shard 3 --num_workers 1; status=$?
a=$(field "$TMP/n2s3" "$sum") b=$(field "$TMP/w2s3" "$sum")
[[ $status -eq 0 && -n "$a" && "$a" == "$b" ]]
verdict $? "zero flags: --shard 3 with --num_workers 1 trains the same bytes as without ($a)" "status $status: '$a', '$b'"
# What acts on DDP's all-reduce or on the model's whole-model step cannot
# apply to a sharded stage: refused, saying why.
run_capture 10 "$TMP/bad3" "$prog" --shard 2 --grad_compress bf16; s3=$?
run_capture 10 "$TMP/bad4" "$prog" --shard 1 --precision fp16; s4=$?
[[ $s3 -eq 2 && $s4 -eq 2 ]] && grep -q -- "--grad_compress bf16 needs --shard 0: .*ZeRO reduce-scatters" "$TMP/bad3" &&
    grep -q -- "--precision fp16 needs --shard 0: its loss scale" "$TMP/bad4"
verdict $? "zero flags: --grad_compress and --precision fp16 with a sharded stage are refused, saying why (status 2)" \
    "status $s3, $s4: $(head -n 1 "$TMP/bad3") | $(head -n 1 "$TMP/bad4")"

# ---------------------------------------------------------------- the mpi backend
if ! command -v mpirun >/dev/null 2>&1; then
    skip "zero mpi: --shard 3 under mpirun" "mpirun not found (apt-get install openmpi-bin libopenmpi-dev, then make)"
else
    mpi=(mpirun -np)
    mpirun --version 2>&1 | grep -q "Open MPI" && mpi=(mpirun --oversubscribe --allow-run-as-root -np)
    (unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT COURSE_BACKEND
     run_capture 120 "$TMP/mpi" "${mpi[@]}" 2 "$prog" "${common[@]}" "${steps[@]}" --batch_size 4 --shard 3 --backend mpi \
         --out_dir "$TMP/mpi.d"); status=$?
    d=$(diff_of "$TMP/n2s3.d/model.safetensors" "$TMP/mpi.d/model.safetensors")
    if grep -q "this build has no MPI" "$TMP/mpi"; then skip "zero mpi: --shard 3 under mpirun" "this build has no MPI (MPI=0, or no mpi.h)"
    else
        [[ $status -eq 0 ]] && grep -q "backend mpi" "$TMP/mpi" && below "$d" 1e-6
        verdict $? "zero mpi: --shard 3 on 2 ranks under mpirun equals the cpu backend ($d)" \
            "status $status, difference $d: $(grep -m2 -i 'error\|backend' "$TMP/mpi" | tr '\n' '|')"
    fi
fi

no_leftovers "zero: no process left behind" "09_zero_fsdp/09_zero_fsdp"
