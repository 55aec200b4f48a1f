# Chapter 09, sharded data parallelism: every ZeRO stage trains the model
# that DDP and one process with the same total batch train; each rank
# holds and sends what the formulas say; sharded snapshots resume bit for
# bit, reshard to another number of ranks without changing a byte, and
# consolidate into a model that chapter 08 loads.
source "$(dirname "$0")/../lib.sh"
prog="$ROOT/09_zero_fsdp/09_zero_fsdp"
p08="$ROOT/08_gpt_wikitext/08_gpt_wikitext"
ddprun="$ROOT/tools/ddprun"
[[ -x "$prog" && -x "$p08" && -x "$ddprun" ]] || { fail "zero: binaries" "build first (make)"; exit 1; }
export OMP_NUM_THREADS=1

# A small corpus in WikiText's layout (no real data needed).
small_corpus "$TMP/corpus"
common=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000
        --device cpu)
sum() { sed -n 's/.*checksum \([0-9a-f]*\),.*/\1/p' "$1" | tail -n 1; }

# diff_of A B: ||a - b|| / ||a|| over every number of two model files
# (safetensors: an 8-byte header length, the header, then the floats).
floats() { local h; h=$(od -An -tu8 -N8 "$1" | tr -d ' '); od -An -v -tf4 -j $((8 + h)) "$1" | tr -s ' ' '\n' | sed '/^$/d'; }
diff_of() {
    [[ -s "$1" && -s "$2" ]] || { echo "missing"; return; }
    paste <(floats "$1") <(floats "$2") | awk 'NF != 2 { bad = 1 } { d = $1 - $2; s += d * d; n += $1 * $1 }
        END { if (bad || NR == 0 || n == 0) print "unequal"; else printf "%.2g\n", sqrt(s / n) }'
}
below() { [[ "$1" =~ ^[0-9.e+-]+$ ]] && awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 <= b + 0) }'; }
# same_moments A B TOL: the l2 norms of AdamW's moments agree. Adam's step
# is nearly blind to gradients that are all N times too large (a sum where
# the mean belongs); its moments are not.
moments() { sed -n 's/^final AdamW moments: l2 norm of m \([0-9.e+-]*\), of v \([0-9.e+-]*\)$/\1 \2/p' "$1" | tail -n 1; }
same_moments() {
    local a b; a=($(moments "$1")); b=($(moments "$2"))
    [[ ${#a[@]} -eq 2 && ${#b[@]} -eq 2 ]] && rel_near "${a[0]}" "${b[0]}" "$3" && rel_near "${a[1]}" "${b[1]}" "$3"
}

# train NAME ARGS...: a run, its output in $TMP/NAME, its model in $TMP/NAME.d
train() { local name=$1; shift; run_capture 300 "$TMP/$name" "$prog" "$@" --out_dir "$TMP/$name.d"; }

# ---------------------------------------------------------------- the same model, whatever the stage (CPU, fp32)
# Every stage ends with DDP's parameters and with one process's over the
# same total batch, to 1e-6 of their norm. Not bit for bit in general: a
# reduce-scatter adds the ranks' gradients in another order than an
# all-reduce or one process's batch, and float addition is not associative.
# N = 3 pads every bucket (none of its sizes is a multiple of 3). The runs
# on 4 ranks do not clip: clipping to a norm hides gradients that are all
# N times too large (a sum where the mean belongs), as Adam's step does.
steps=(--max_steps 4)
train one8 "${common[@]}" "${steps[@]}" --batch_size 8 --shard 0
train one6 "${common[@]}" "${steps[@]}" --batch_size 6 --shard 0
train one8nc "${common[@]}" "${steps[@]}" --batch_size 8 --shard 0 --grad_clip 0
for case in "2 4 one8 1" "3 2 one6 1" "4 2 one8nc 0"; do
    set -- $case
    n=$1 batch=$2 ref=$3 clip=$4
    for s in 0 1 2 3; do
        train "n${n}s$s" "${common[@]}" "${steps[@]}" --batch_size "$batch" --nprocs "$n" --shard "$s" --grad_clip "$clip"; status=$?
        to_ddp=$(diff_of "$TMP/n${n}s0.d/model.safetensors" "$TMP/n${n}s$s.d/model.safetensors")
        to_one=$(diff_of "$TMP/$ref.d/model.safetensors" "$TMP/n${n}s$s.d/model.safetensors")
        if [[ $status -eq 0 ]] && below "$to_ddp" 1e-6 && below "$to_one" 1e-6 && same_moments "$TMP/$ref" "$TMP/n${n}s$s" 1e-6 &&
           same_moments "$TMP/n${n}s0" "$TMP/n${n}s$s" 1e-6; then
            pass "zero cpu: --shard $s, $n ranks x batch $batch (--grad_clip $clip) equal DDP ($to_ddp) and one process x batch $((n * batch)) ($to_one), AdamW's moments too"
        else fail "zero cpu: --shard $s with $n ranks equals DDP and one process" "status $status, differences $to_ddp (DDP), $to_one (one process); moments $(moments "$TMP/n${n}s$s") against $(moments "$TMP/$ref"): $(grep -m1 error "$TMP/n${n}s$s")"; fi
    done
done
# Micro-batches: ZeRO-3 reduce-scatters every one and adds them up.
train acc "${common[@]}" "${steps[@]}" --batch_size 2 --grad_accum 2 --nprocs 2 --shard 3; status=$?
d=$(diff_of "$TMP/one8.d/model.safetensors" "$TMP/acc.d/model.safetensors")
if [[ $status -eq 0 ]] && below "$d" 1e-6 && same_moments "$TMP/one8" "$TMP/acc" 1e-6; then pass "zero cpu: --shard 3 with 2 micro-batches of 2 on 2 ranks equals one process x batch 8 ($d)"
else fail "zero cpu: --shard 3 with micro-batches equals one process" "status $status, difference $d"; fi

# ---------------------------------------------------------------- memory and traffic, beside the formulas
# row FILE NAME COLUMN: a number from the tables (column 1: rank 0; the last: the formula's value).
row() { awk -v name="$2" -v col="$3" 'index($0, "  " name " ") == 1 { n = split(substr($0, length(name) + 3), f, " ");
        print (col == "last" ? f[n] : f[col]); exit }' "$1"; }
close_to() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 0.01 * b + 0.5) }'; }
f="$TMP/n4s3"
if close_to "$(row "$f" parameters 1)" "$(row "$f" parameters last)" && close_to "$(row "$f" "optimizer state" 1)" "$(row "$f" "optimizer state" last)" &&
   close_to "$(row "$TMP/n4s1" "optimizer state" 4)" "$(row "$TMP/n4s1" "optimizer state" last)" &&
   close_to "$(row "$TMP/n4s0" parameters 1)" "$(row "$TMP/n4s0" parameters last)"; then
    pass "zero memory: each rank holds the ZeRO paper's bytes (ZeRO-3: parameters $(row "$f" parameters 1) KiB = 4P/N; optimizer state 8P/N; DDP 4P)"
else fail "zero memory: each rank holds the ZeRO paper's bytes" "$(grep -A8 '^memory per rank' "$f" | tr '\n' '|')"; fi
g0=$(row "$TMP/n4s0" gradients 1) g2=$(row "$TMP/n4s2" gradients 1) g3=$(row "$TMP/n4s3" gradients 1)
if awk -v a="$g0" -v b="$g2" -v c="$g3" 'BEGIN { exit !(b > 0 && c > 0 && b < a && c < a) }'; then
    pass "zero memory: ZeRO-2 and 3 hold fewer gradient bytes than DDP on 4 ranks ($g2 and $g3 KiB against $g0)"
else fail "zero memory: ZeRO-2 and 3 hold fewer gradient bytes than DDP" "DDP $g0, ZeRO-2 $g2, ZeRO-3 $g3 KiB"; fi
# Traffic: DDP's all-reduce and ZeRO-1's pair send 2(N-1)/N B (padding
# aside); ZeRO-3 sends more, but less than 3(N-1)/N B: the embeddings and
# ln_f stay gathered from the forward pass to the backward pass.
t0=$(row "$TMP/n4s0" total 1) t1=$(row "$TMP/n4s1" total 1) t3=$(row "$TMP/n4s3" total 1)
th0=$(row "$TMP/n4s0" total last) th3=$(row "$TMP/n4s3" total last)
if close_to "$t0" "$th0" && close_to "$t1" "$th0" && awk -v t="$t3" -v a="$th0" -v b="$th3" 'BEGIN { exit !(t > a && t < b) }'; then
    pass "zero traffic: KiB sent per step: DDP $t0, ZeRO-1 $t1 (theory 2(N-1)/N B = $th0), ZeRO-3 $t3 (between that and 3(N-1)/N B = $th3)"
else fail "zero traffic: bytes sent per step beside the theory" "DDP $t0, ZeRO-1 $t1, theory $th0; ZeRO-3 $t3, theory $th3"; fi

# ---------------------------------------------------------------- sharded snapshots
# 4 ranks (ZeRO-3) save at the end of epoch 1; copies of that snapshot are
# resumed by 2 ranks (ZeRO-2), which save their own shards at once, and
# those by 3 ranks (ZeRO-1). Consolidating each gives the same state, to
# the byte: resharding changes nothing.
snap=(--epochs 1 --save_every 1 --batch_size 2)
train save4 "${common[@]}" "${snap[@]}" --nprocs 4 --shard 3 --snapshot_path "$TMP/s4/s.safetensors"
consolidated() { sed -n 's/^consolidated: \([0-9]*\) shard(s) .*: \(params .*\)/\1 \2/p' "$1"; }
run_capture 60 "$TMP/c4" "$prog" --consolidate --snapshot_path "$TMP/s4/s.safetensors" --out_dir "$TMP/c4.d"
cp -r "$TMP/s4" "$TMP/s2"
train load2 "${common[@]}" "${snap[@]}" --nprocs 2 --shard 2 --snapshot_path "$TMP/s2/s.safetensors"
run_capture 60 "$TMP/c2" "$prog" --consolidate --snapshot_path "$TMP/s2/s.safetensors" --out_dir "$TMP/c2.d"
cp -r "$TMP/s2" "$TMP/s3"
train load3 "${common[@]}" "${snap[@]}" --nprocs 3 --shard 1 --snapshot_path "$TMP/s3/s.safetensors"; status=$?
run_capture 60 "$TMP/c3" "$prog" --consolidate --snapshot_path "$TMP/s3/s.safetensors" --out_dir "$TMP/c3.d"
a=$(consolidated "$TMP/c4") b=$(consolidated "$TMP/c2") c=$(consolidated "$TMP/c3")
if [[ $status -eq 0 && "${a%% *}" == 4 && "${b%% *}" == 2 && "${c%% *}" == 3 && -n "${a#* }" && "${a#* }" == "${b#* }" &&
      "${a#* }" == "${c#* }" ]] && grep -q "resharded: the snapshot's 2 shard(s) loaded as 3" "$TMP/load3"; then
    pass "zero snapshot: 4 -> 2 -> 3 ranks reshards without changing a byte (${a#* })"
else fail "zero snapshot: 4 -> 2 -> 3 ranks reshards without changing a byte" "status $status; 4: '$a'; 2: '$b'; 3: '$c'"; fi
# The consolidated model is the model the 4 ranks saved at the end, and
# chapter 08 samples from it.
cp "$TMP/save4.d/tokenizer.json" "$TMP/c4.d/"
run_capture 60 "$TMP/gen" "$p08" --generate --out_dir "$TMP/c4.d" --device cpu --num_samples 1 --sample_tokens 8; status=$?
if cmp -s "$TMP/c4.d/model.safetensors" "$TMP/save4.d/model.safetensors" && [[ $status -eq 0 ]] && grep -q '^--- sample 1 ' "$TMP/gen"; then
    pass "zero snapshot: --consolidate writes the model the run saved, and 08 --generate samples from it"
else fail "zero snapshot: --consolidate writes the model the run saved, and 08 loads it" "status $status: $(tail -n 2 "$TMP/gen" | tr '\n' '|')"; fi

# A rank killed in epoch 2 under ddprun: the job restarts, every rank
# reloads its own shard, and the run ends with the same bytes as a run
# that was never killed.
kill_args=(--epochs 3 --save_every 1 --shard 3)
run_capture 300 "$TMP/clean" "$ddprun" --standalone --nproc_per_node=2 "$prog" "${common[@]}" "${kill_args[@]}" \
    --out_dir "$TMP/clean.d" --snapshot_path "$TMP/clean.d/s.safetensors"
steps1=$(sed -n 's/.*snapshot saved: Epoch 1 (step \([0-9]*\)).*/\1/p' "$TMP/clean")
COURSE_FAIL_RANK=1 COURSE_FAIL_STEP=$(( ${steps1:-10} + 5 )) run_capture 300 "$TMP/killed" "$ddprun" --standalone \
    --nproc_per_node=2 --max_restarts=1 "$prog" "${common[@]}" "${kill_args[@]}" --out_dir "$TMP/killed.d" \
    --snapshot_path "$TMP/killed.d/s.safetensors"; status=$?
a=$(sum "$TMP/clean"); b=$(sum "$TMP/killed")
if [[ $status -eq 0 && -n "$a" && "$a" == "$b" ]] && grep -q "Resuming training from snapshot at Epoch 1" "$TMP/killed" &&
   grep -q "fault injection: rank 1" "$TMP/killed"; then
    pass "zero snapshot: a rank killed in epoch 2 under ddprun, restarted, resumes from its shard and ends byte-identical ($a)"
else fail "zero snapshot: a rank killed in epoch 2 resumes from the sharded snapshot" "status $status, clean '$a', resumed '$b'"; fi

# Bad input: one line naming the flag, status 2.
run_capture 10 "$TMP/bad1" "$prog" --shard 4; s1=$?
run_capture 10 "$TMP/bad2" "$prog" --consolidate; s2=$?
if [[ $s1 -eq 2 && $s2 -eq 2 ]] && grep -q -- "--shard" "$TMP/bad1" && grep -q -- "--consolidate needs --snapshot_path" "$TMP/bad2"; then
    pass "zero flags: --shard 4 and --consolidate without --snapshot_path are refused (status 2)"
else fail "zero flags: bad values are refused" "status $s1, $s2: $(head -n 1 "$TMP/bad1") | $(head -n 1 "$TMP/bad2")"; fi

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
    elif [[ $status -eq 0 ]] && grep -q "backend mpi" "$TMP/mpi" && below "$d" 1e-6; then
        pass "zero mpi: --shard 3 on 2 ranks under mpirun equals the cpu backend ($d)"
    else fail "zero mpi: --shard 3 under mpirun equals the cpu backend" "status $status, difference $d: $(grep -m2 -i 'error\|backend' "$TMP/mpi" | tr '\n' '|')"; fi
fi

# ---------------------------------------------------------------- on GPUs
# The GPU model (real GPUs, or the 8 emulated ones of CUDA=emu, where the
# ranks talk NCCL): ZeRO-2 reduce-scatters while backward runs, ZeRO-3
# gathers the next bucket while this one computes.
if ! has_gpu; then
    for what in "fp32 stages equal one process" "bf16 within 08's tolerance" "snapshots move between GPUs and CPUs"; do
        skip "zero gpu: $what" "no GPU here (a CPU-only build, or no GPU: make CUDA=emu test runs these on the emulated GPU)"
    done
    no_leftovers "zero: no process left behind" "09_zero_fsdp/09_zero_fsdp"
    exit 0
fi
# Three blocks: the two block buffers are then reused within a pass (block
# 2's while block 0 computes), which a missing wait between the streams breaks.
gpu=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0 --log_every 1000
     --device cuda --block_size 16 --n_layer 3 "${steps[@]}")
train g_one "${gpu[@]}" --precision fp32 --batch_size 8 --shard 0
for case in "2 4 0" "2 4 1" "2 4 2" "2 4 3" "4 2 3"; do
    set -- $case
    train "g_n$1s$3" "${gpu[@]}" --precision fp32 --batch_size "$2" --nprocs "$1" --shard "$3"; status=$?
    d=$(diff_of "$TMP/g_one.d/model.safetensors" "$TMP/g_n$1s$3.d/model.safetensors")
    if [[ $status -eq 0 ]] && below "$d" 1e-6 && same_moments "$TMP/g_one" "$TMP/g_n$1s$3" 1e-6; then
        pass "zero gpu: --shard $3, $1 ranks x batch $2 equal one process x batch 8 in fp32 ($d, AdamW's moments too; $(grep -m1 -o 'backend [a-z]*' "$TMP/g_n$1s$3"))"
    else fail "zero gpu: --shard $3 on $1 ranks equals one process in fp32" "status $status, difference $d: $(grep -m1 error "$TMP/g_n$1s$3")"; fi
done
# bf16: 08's tolerance for DDP against one process (2e-2).
train h_one "${gpu[@]}" --precision bf16 --batch_size 8 --shard 0
train h_two "${gpu[@]}" --precision bf16 --batch_size 4 --nprocs 2 --shard 3; status=$?
d=$(diff_of "$TMP/h_one.d/model.safetensors" "$TMP/h_two.d/model.safetensors")
if [[ $status -eq 0 ]] && below "$d" 2e-2 && grep -q "parameters (.*), bf16" "$TMP/h_two"; then
    pass "zero gpu: --shard 3 in bf16, 2 ranks x batch 4, within 2e-2 of one process x batch 8 ($d)"
else fail "zero gpu: --shard 3 in bf16 within 2e-2 of one process" "status $status, difference $d"; fi
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
a=$(consolidated "$TMP/gc") b=$(consolidated "$TMP/gxc")
if [[ $status -eq 0 && "${a%% *}" == 2 && "${b%% *}" == 3 && -n "${a#* }" && "${a#* }" == "${b#* }" ]]; then
    pass "zero gpu: snapshots move between GPUs and CPUs: 2 GPU ranks' shards resume on 3 CPU ranks, the same state"
else fail "zero gpu: snapshots move between GPUs and CPUs" "status $status; GPU: '$a'; CPU: '$b'"; fi

no_leftovers "zero: no process left behind" "09_zero_fsdp/09_zero_fsdp"
