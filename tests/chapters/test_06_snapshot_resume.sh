# Chapter 06: snapshots, restarts by ddprun, and bit-exact resume.
source "$(dirname "$0")/../lib.sh"
bin="$ROOT/06_snapshot_resume/06_snapshot_resume"
ddprun="$ROOT/tools/ddprun"
checksum='parameters checksum ([0-9a-f]*)'   # what field reads from the final line
common=(--total_epochs 3 --save_every_steps 40 --device cpu)

# Bit-exact resume: kill a rank mid-epoch, let ddprun restart the group, and
# compare the final parameters' bytes with a run that never failed.
for n in 2 3; do
    run_capture 300 "$TMP/clean$n" "$ddprun" --standalone --nproc_per_node=$n "$bin" "${common[@]}" --snapshot_path "$TMP/snaps_clean$n/s.safetensors"
    fail_step=$(( n == 2 ? 230 : 150 )) # mid-epoch, between two snapshots
    run_capture 300 "$TMP/fail$n" "$ddprun" --standalone --nproc_per_node=$n --max_restarts=1 "$bin" "${common[@]}" \
        --snapshot_path "$TMP/snaps_fail$n/s.safetensors" --fail_rank 1 --fail_step $fail_step --fail_mode kill; status=$?
    a=$(field "$TMP/clean$n" "$checksum"); b=$(field "$TMP/fail$n" "$checksum")
    [[ $status -eq 0 && -n "$a" && "$a" == "$b" ]] && grep -q "restarting workers (restart 1 of 1)" "$TMP/fail$n" &&
        grep -q "Resuming training from snapshot at Epoch" "$TMP/fail$n"
    verdict $? "06: $n ranks, rank 1 killed at step $fail_step, restarted: parameters byte-identical ($a)" "status $status, clean $a, resumed '$b'"
done
expect_output "06: the launcher names the killed rank" "$TMP/fail2" "rank 1 .*killed by signal SIGKILL|rank 1 .*SIGKILL"

# The restart budget runs out: the launcher gives up, non-zero, naming the rank.
run_capture 120 "$TMP/budget" "$ddprun" --standalone --nproc_per_node=2 --max_restarts=1 "$bin" "${common[@]}" \
    --snapshot_path "$TMP/snaps_budget/s.safetensors" --fail_rank 1 --fail_step 30 --fail_attempts 100; status=$?
[[ $status -ne 0 ]] && grep -qi "giving up after 1 restart" "$TMP/budget" && grep -q "rank 1" "$TMP/budget"
verdict $? "06: an exhausted restart budget ends the job, naming the rank" "status $status: $(tail -n 2 "$TMP/budget" | tr '\n' '|')"

# kill -9 while a snapshot is being written. COURSE_SNAPSHOT_PAUSE_MS makes
# the writer sleep halfway through the tensor bytes. An atomic write is
# then visible only as a hidden temporary file: the snapshot names hold the
# previous snapshot alone, before the kill and after it, and the next run
# resumes from it without having to reject anything. (A writer that wrote
# the final name in place would leave a half-written snapshot, which only
# the checksum would catch: that must not be needed.)
snap="$TMP/kill/s.safetensors"
"$bin" --total_epochs 1 --save_every 1 --device cpu --snapshot_path "$snap" >"$TMP/k1" 2>&1
# The epoch's line comes first, then its snapshot, which names the epoch
# the run goes on with (epochs count from 0, as the lines do).
order=$(grep -n -e '^epoch  0 | loss' -e '^snapshot saved at step 313: epoch 0 done, resumes at Epoch 1;' "$TMP/k1" | cut -d: -f1 | tr '\n' ' ')
[[ $(wc -w <<<"$order") -eq 2 && ${order%% *} -lt $(echo $order | cut -d' ' -f2) ]]
verdict $? "06: 'epoch 0 | loss' comes before its snapshot line, 'epoch 0 done, resumes at Epoch 1'" "$(head -n 4 "$TMP/k1" | tr '\n' '|')"
before=$(cd "$TMP/kill" && ls s.*.safetensors | tr '\n' ' ')
COURSE_SNAPSHOT_PAUSE_MS=20000 "$bin" --total_epochs 2 --save_every 1 --device cpu --snapshot_path "$snap" >"$TMP/k2" 2>&1 &
victim=$!
temp=""
for _ in $(seq 100); do
    temp=$(cd "$TMP/kill" && ls -A | grep '^\..*tmp$')
    [[ -n "$temp" ]] && break
    kill -0 $victim 2>/dev/null || break
    sleep 0.1
done
during=$(cd "$TMP/kill" && ls s.*.safetensors | tr '\n' ' ')
kill -9 $victim 2>/dev/null; wait $victim 2>/dev/null
after=$(cd "$TMP/kill" && ls s.*.safetensors | tr '\n' ' ')
[[ -n "$temp" && "$before" == "s.0000000313.safetensors " && "$during" == "$before" && "$after" == "$before" ]]
verdict $? "06: a snapshot being written is a hidden temporary file ($temp); the snapshot names hold only the previous one" \
    "temporary file: '${temp:-none within 10 s}'; snapshots before '$before', while writing '$during', after the kill '$after'"
run_capture 60 "$TMP/k3" "$bin" --total_epochs 2 --save_every 1 --device cpu --snapshot_path "$snap"; status=$?
[[ $status -eq 0 ]] && grep -q "Resuming training from snapshot at Epoch 1, sample 0 (step 313)" "$TMP/k3" && ! grep -qi "damaged\|older snapshot" "$TMP/k3"
verdict $? "06: killed during a snapshot write, the run resumes from the previous snapshot, with nothing to reject" "status $status: $(head -n 3 "$TMP/k3" | tr '\n' '|')"

# A damaged newest snapshot: said so, and the older one is used.
newest=$(ls "$TMP/kill"/s.*.safetensors | sort | tail -n 1)
size=$(stat -c %s "$newest")
printf 'garbage' | dd of="$newest" bs=1 seek=$((size - 7)) conv=notrunc 2>/dev/null # in the tensor bytes
run_capture 60 "$TMP/damaged" "$bin" --total_epochs 3 --save_every 1 --device cpu --snapshot_path "$snap"; status=$?
[[ $status -eq 0 ]] && grep -qi "resuming from older snapshot" "$TMP/damaged" && grep -q "Resuming training from snapshot at Epoch 1, sample 0 (step 313)" "$TMP/damaged"
verdict $? "06: a damaged newest snapshot is reported and the older one used" "status $status: $(head -n 3 "$TMP/damaged" | tr '\n' '|')"

# A snapshot of another model is refused, naming both values.
run_capture 60 "$TMP/other" "$bin" --total_epochs 4 --features 2 --device cpu --snapshot_path "$snap"; status=$?
[[ $status -ne 0 ]] && grep -q "snapshot has features=1 but this run has features=2" "$TMP/other"
verdict $? "06: a snapshot of another configuration is refused with both values" "status $status: $(cat "$TMP/other" | tail -n 2 | tr '\n' '|')"

# Another world size resumes: the rest of the epoch is re-sharded.
"$ddprun" --standalone --nproc_per_node=2 "$bin" --total_epochs 1 --save_every_steps 50 --device cpu --snapshot_path "$TMP/ws/s.safetensors" >/dev/null 2>&1
rm -f "$(ls "$TMP/ws"/s.*.safetensors | sort | tail -n 1)" # drop the epoch-end one: resume mid-epoch
run_capture 120 "$TMP/ws3" "$ddprun" --standalone --nproc_per_node=3 "$bin" --total_epochs 2 --device cpu --snapshot_path "$TMP/ws/s.safetensors"; status=$?
w=$(field "$TMP/ws3" 'final weight ([-0-9.]*)')
[[ $status -eq 0 ]] && grep -q "written by 2 rank(s), this run has 3" "$TMP/ws3" && near "$w" 2 0.05
verdict $? "06: a snapshot of 2 ranks resumes on 3 (re-sharded), and still learns ($w)" "status $status: $(grep -m2 -i 'error\|written' "$TMP/ws3" | tr '\n' '|')"

# --global_batch_size (for elastic jobs, README): the batch of a step is the
# same on any number of ranks, each rank taking its share, so 3 ranks train
# the very steps of one process: the same weights to float rounding (the
# elastic test in tests/tools/test_ddprun_elastic.sh changes the number
# while a run goes on).
gbs=(--total_epochs 4 --samples 1920 --global_batch_size 96 --features 16 --lr 0.002 --device cpu --backend cpu)
global_batch() {   # BIN NAME : 1 process and 3 ranks end with the same weight and bias
    run_capture 60 "$TMP/gb1.$2" "$1" "${gbs[@]}" --snapshot_path "$TMP/gb1.$2.d/s.safetensors"; local s1=$?
    run_capture 60 "$TMP/gb3.$2" "$ddprun" --standalone --nproc_per_node=3 "$1" "${gbs[@]}" --snapshot_path "$TMP/gb3.$2.d/s.safetensors"; local s3=$?
    local one three; one=$(field "$TMP/gb1.$2" 'final weight ([-0-9.]+)  bias ([-0-9.]+)' '\1 \2')
    three=$(field "$TMP/gb3.$2" 'final weight ([-0-9.]+)  bias ([-0-9.]+)' '\1 \2')
    gb_detail="statuses $s1 $s3; one process '$one', 3 ranks '$three'"
    [[ $s1 -eq 0 && $s3 -eq 0 ]] && grep -q 'batch 32 per rank x 3 rank(s) = 96 per step' "$TMP/gb3.$2" &&
        near "${one% *}" "${three% *}" 2e-6 && near "${one#* }" "${three#* }" 2e-6
}
global_batch "$bin" ok
verdict $? "06: --global_batch_size 96 on 3 ranks (32 each) trains as one process does (weight and bias within 2e-6)" "$gb_detail"
# Planted (tests/lib.sh, plant): every rank takes the whole global batch.
planted=$(plant whole_batch common/ddp.h 'return global_batch_size / world_size;' \
    'return global_batch_size;' 06_snapshot_resume 06_snapshot_resume)
[[ -n $planted ]] && ! global_batch "$planted" planted && [[ -s $TMP/gb3.planted ]]
verdict $? "planted: every rank taking the whole --global_batch_size fails the 3-rank check" "$(planted_why whole_batch)$gb_detail"
# The check compares weights after SGD with momentum, whose step is linear
# in the gradient: a gradient 3 times too large (the ranks' gradients
# summed where their mean belongs) moves them. Planted:
planted=$(plant sum_not_mean common/ddp.h 'grads + first, n, DTYPE_F32, OP_AVG);' 'grads + first, n, DTYPE_F32, OP_SUM);' \
    06_snapshot_resume 06_snapshot_resume)
[[ -n $planted ]] && ! global_batch "$planted" planted_sum && [[ -s $TMP/gb3.planted_sum ]]
verdict $? "planted: gradients summed over the 3 ranks instead of averaged fail the 3-rank check" "$(planted_why sum_not_mean)$gb_detail"

run_capture 10 "$TMP/bad" "$bin" --fail_mode sometimes; status=$?
check "06: bad flag exits 2" test $status -eq 2
no_leftovers "06: no process left behind" "06_snapshot_resume/06_snapshot_resume"
