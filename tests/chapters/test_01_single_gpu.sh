# Chapter 01: the baseline learns y = 2x + 3; the GPU path matches the CPU.
source "$(dirname "$0")/../lib.sh"
bin="$ROOT/01_single_gpu/01_single_gpu"
# Every number this test reads is printed by the chapter: a regression in the
# output format fails here, as a student would notice it.

run_capture 120 "$TMP/default" "$bin" --device cpu
check "01: default run exits 0" test $? -eq 0
w=$(field "$TMP/default" '^learned weight: ([-0-9.e+]*)'); b=$(field "$TMP/default" '^learned bias: ([-0-9.e+]*)')
loss=$(field "$TMP/default" '^\[.*loss: (.*)')
expect_near "01: weight within 0.05 of 2.0 ($w)" "$w" 2.0 0.05
expect_near "01: bias within 0.05 of 3.0 ($b)" "$b" 3.0 0.05
awk -v l="$loss" 'BEGIN { exit !(l >= 0.008 && l <= 0.013) }'
verdict $? "01: final loss at the noise floor ($loss)" "got '$loss', expected 0.008..0.013"
expect_output "01: prints [epoch, batch] loss every 100 batches" "$TMP/default" '^\[1,   100\] loss: '
# The time line: a positive time, the samples per second that 10 epochs of
# 10000 samples in that time make, and the device of the first line.
read -r secs rate on < <(field "$TMP/default" '^training time: ([0-9.]*) s \(([0-9]*) samples/s\) on (.*)$' '\1 \2 \3')
device=$(field "$TMP/default" '^01_single_gpu: running on (.*); why: ')
[[ -n "$secs" ]] && awk -v t="$secs" -v r="$rate" 'BEGIN { exit !(t > 0 && r > 0 && (r - 100000 / t)^2 <= (1e-3 * r + 1)^2 + (100000 / t * 1e-6 / t)^2 * 4) }' &&
   [[ -n "$device" && "$on" == "$device" ]]
verdict $? "01: training time $secs s, and samples/s = 10 x 10000 / time, on the device of the first line" \
    "$(grep '^training time' "$TMP/default"); first line's device '$device'"

run_capture 120 "$TMP/wide" "$bin" --device cpu --features 64
err=$(field "$TMP/wide" 'largest error vs w_true: ([-0-9.e+]*)')
[[ -n "$err" ]] && awk -v e="$err" 'BEGIN { exit !(e <= 0.05) }'
verdict $? "01: --features 64 finds every weight within 0.05 ($err)" "largest error '$err'"

# The first line names the device and why it was chosen.
run_capture 60 "$TMP/auto" "$bin" --epochs 1
head -n 1 "$TMP/auto" | grep -Eq '^01_single_gpu: running on .*; why: '
verdict $? "01: first line names the device and why" "first line: $(head -n 1 "$TMP/auto")"

if has_gpu; then
    skip "01: CUDA build without a driver falls back to the CPU" "a GPU is present here"
    run_capture 120 "$TMP/gpu" "$bin" --device cuda
    run_capture 120 "$TMP/cpu" "$bin" --device cpu
    why=""
    for key in "learned weight" "learned bias"; do
        g=$(field "$TMP/gpu" "^$key: ([-0-9.e+]*)"); c=$(field "$TMP/cpu" "^$key: ([-0-9.e+]*)")
        rel_near "$g" "$c" 1e-4 || why+="$key: GPU $g, CPU $c; "
    done
    [[ -z "$why" ]]; verdict $? "01: GPU and CPU agree to 1e-4 relative" "$why"
else
    if ldd "$bin" 2>/dev/null | grep -q libcudart; then
        head -n 1 "$TMP/auto" | grep -q 'no usable GPU' && grep -q '^learned bias' "$TMP/auto"
        verdict $? "01: CUDA build without a driver falls back to the CPU" "$(head -n 2 "$TMP/auto" | tr '\n' '|')"
        run_capture 30 "$TMP/nocuda" "$bin" --device cuda; status=$?
        [[ $status -eq 1 ]] && [[ $(wc -l <"$TMP/nocuda") -eq 1 ]] && grep -q "no GPU can be used" "$TMP/nocuda"
        verdict $? "01: --device cuda without a GPU is one clear error" "status $status: $(cat "$TMP/nocuda" | tr '\n' '|')"
    else
        skip "01: CUDA build without a driver falls back to the CPU" "this is a CPU-only build"
    fi
    skip "01: GPU and CPU agree to 1e-4 relative" "no GPU on this machine"
fi

run_capture 10 "$TMP/bad" "$bin" --batch_size abc; status=$?
[[ $status -eq 2 ]] && head -n 1 "$TMP/bad" | grep -q -- "--batch_size expects an integer"
verdict $? "01: --batch_size abc exits 2 with a one-line error" "status $status: $(head -n 1 "$TMP/bad")"
