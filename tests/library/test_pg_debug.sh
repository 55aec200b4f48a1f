# COURSE_DEBUG (common/pg_debug.h), the course's TORCH_DISTRIBUTED_DEBUG:
# INFO lists each rank's collectives; DETAIL compares them across ranks
# before each one and stops every rank, naming the calls, when they differ.
# 03's --mismatch plants the bug (rank 1 reduces with max, the others sum).
source "$(dirname "$0")/../lib.sh"
bin="$ROOT/03_collectives/03_collectives"
[[ -x "$bin" ]] || make --no-print-directory -s -C "$ROOT/03_collectives" >/dev/null 2>&1

# Without the check the bug is silent: exit 0, and the ranks disagree.
run_capture 60 "$TMP/silent" "$bin" --nprocs 2 --device cpu --mismatch; status=$?
[[ $status -eq 0 ]] && grep -q 'rank 0 has 3, rank 1 has 2$' "$TMP/silent"
verdict $? "pg_debug: the planted mismatch passes silently without COURSE_DEBUG (rank 0 has 3, rank 1 has 2)" "status $status: $(tail -n 3 "$TMP/silent" | tr '\n' '|')"

# DETAIL names both calls, and the job stops fast: the first rank to see the
# difference stops, and the launcher (spawn) stops the others, which may or
# may not have printed the same line by then.
for ranks in 2 4; do
    start=$(date +%s.%N)
    COURSE_DEBUG=DETAIL run_capture 60 "$TMP/detail$ranks" "$bin" --nprocs $ranks --device cpu --mismatch; status=$?
    took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    want='collective #0 differs across ranks: rank [0-9] called all_reduce\(1000 x f32, (sum|max)\), rank [0-9] called all_reduce\(1000 x f32, (sum|max)\)'
    told=$(grep -Ec "^\[rank [0-9]+\] error: COURSE_DEBUG=DETAIL: $want" "$TMP/detail$ranks")
    named=$(grep -Ec "rank 1 called all_reduce\(1000 x f32, max\)" "$TMP/detail$ranks")
    [[ $status -ne 0 && $told -ge 1 && $named -ge 1 ]] && ! grep -q 'has 3' "$TMP/detail$ranks" && near "$took" 0 20
    verdict $? "pg_debug: DETAIL stops $ranks ranks before the mismatched all_reduce, naming rank 1's max ($told ranks said so, ${took} s)" "status $status, $told lines, $named name rank 1, ${took} s: $(tail -n 4 "$TMP/detail$ranks" | tr '\n' '|')"
done

# DETAIL on a correct program changes nothing: the lesson's output is the same.
run_capture 180 "$TMP/plain" "$bin" --nprocs 3 --device cpu; s1=$?
COURSE_DEBUG=DETAIL run_capture 180 "$TMP/checked" "$bin" --nprocs 3 --device cpu; s2=$?
# (part 9 prints times, which differ from run to run: left out)
lesson_cut() { grep -v 'COURSE_DEBUG: collective' "$1" | awk '/^== 9\./ { skip = 1 } /^== 10\./ { skip = 0 } !skip'; }
lesson_cut "$TMP/plain" >"$TMP/plain.cut"
lesson_cut "$TMP/checked" >"$TMP/checked.cut"
calls=$(grep -c '^\[rank 2\] COURSE_DEBUG: collective #' "$TMP/checked")
[[ $s1 -eq 0 && $s2 -eq 0 && $calls -ge 20 ]] && diff -q "$TMP/plain.cut" "$TMP/checked.cut" >/dev/null
verdict $? "pg_debug: DETAIL on the correct lesson (3 ranks, $calls collectives each) passes, output unchanged" "status $s1/$s2, $calls calls: $(diff "$TMP/plain.cut" "$TMP/checked.cut" | head -n 4 | tr '\n' '|')"

# INFO lists every rank's calls in order, with what the ranks must agree on.
COURSE_DEBUG=INFO run_capture 60 "$TMP/info" "$bin" --nprocs 2 --device cpu; status=$?
first0=$(grep -m1 '^\[rank 0\] COURSE_DEBUG: collective #0: ' "$TMP/info" | sed 's/^\[rank 0\] //')
first1=$(grep -m1 '^\[rank 1\] COURSE_DEBUG: collective #0: ' "$TMP/info" | sed 's/^\[rank 1\] //')
[[ $status -eq 0 && -n "$first0" && "$first0" == "$first1" ]] && grep -q 'COURSE_DEBUG: collective #[0-9]*: all_reduce(2 x i32, bor)' "$TMP/info" \
    && grep -q 'COURSE_DEBUG: collective #[0-9]*: barrier()' "$TMP/info"
verdict $? "pg_debug: INFO lists each rank's collectives ($first0)" "status $status: '$first0' / '$first1'"

# A DDP run with hundreds of checked all-reduces: no false alarm, same weights.
ddp="$ROOT/04_ddp_spawn/04_ddp_spawn"
run_capture 120 "$TMP/ddp_plain" "$ddp" --nprocs 2 --device cpu --epochs 2; s1=$?
COURSE_DEBUG=DETAIL run_capture 120 "$TMP/ddp" "$ddp" --nprocs 2 --device cpu --epochs 2; s2=$?
w1=$(field "$TMP/ddp_plain" 'final (weight [-0-9.]* *bias [-0-9.]*)')
w2=$(field "$TMP/ddp" 'final (weight [-0-9.]* *bias [-0-9.]*)')
calls=$(grep -c '^\[rank 1\] COURSE_DEBUG: collective #' "$TMP/ddp")
[[ $s1 -eq 0 && $s2 -eq 0 && -n "$w1" && "$w1" == "$w2" && $calls -ge 100 ]]
verdict $? "pg_debug: DETAIL on 04's DDP training (2 ranks, $calls checked collectives) passes with the same $w2" "status $s1/$s2, '$w1' vs '$w2', $calls calls"

# A bad value is one line and a non-zero exit.
COURSE_DEBUG=LOUD run_capture 30 "$TMP/bad" "$bin" --nprocs 2 --device cpu; status=$?
[[ $status -ne 0 ]] && grep -q "COURSE_DEBUG must be OFF, INFO or DETAIL, got 'LOUD'" "$TMP/bad"
verdict $? "pg_debug: COURSE_DEBUG=LOUD is refused in one line" "status $status: $(head -n 3 "$TMP/bad" | tr '\n' '|')"

# On GPUs the nccl backend gets the same check (the emulated GPU runs it in CI).
if is_emu && [[ $(gpu_count) -ge 2 ]]; then
    COURSE_DEBUG=DETAIL run_capture 120 "$TMP/nccl" "$bin" --nprocs 2 --backend nccl --mismatch; status=$?
    [[ $status -ne 0 ]] && grep -q 'rank 1 called all_reduce(1000 x f32, max)' "$TMP/nccl"
    verdict $? "pg_debug: DETAIL catches the mismatch on the nccl backend" "status $status: $(tail -n 3 "$TMP/nccl" | tr '\n' '|')"
else skip "pg_debug: DETAIL on the nccl backend" "needs a GPU build with 2 GPUs (real, or make CUDA=emu)"; fi
