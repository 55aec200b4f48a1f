#!/usr/bin/env bash
# tests/chapters/test_08_gpt_cuda.sh - chapter 08's GPU model (gpt_cuda.cu) against the CPU model (gpt.h).
#
# 1. unit/test_gpt_cuda: everywhere, the host-side pieces (parameter layout,
#    gradient buckets, memory plan, MFU arithmetic); with a GPU, every layer's
#    forward and backward, the whole model's loss, gradients, clipping and
#    AdamW step, the bucket callbacks, bf16 and fp16 training against fp32,
#    and fp16's loss scale.
# 2. out of memory: a model far larger than the GPU stops with the size it
#    asked for, not a crash (GPU only).
# 3. compute-sanitizer memcheck over the parity checks on small shapes
#    (GPU and the tool needed).
# 4. the parity checks at shapes that give every kernel of gpt_cuda.cu two
#    or more blocks along each grid dimension it reads, under the race
#    checker on every launch, and the list of the grids each case gave each
#    kernel (the emulated GPU's launch log), which names a kernel no case spans.
# 5. the 16-bit conversions bit for bit (in 1; --mode rounding), with a
#    truncating one planted on the GPU and on the CPU.
source "$(dirname "$0")/../lib.sh"

if ! make -C "$ROOT/tests" -s >"$TMP/make_tests.log" 2>&1; then
    fail "gpt cuda tests build" "make -C tests failed: $(grep -m1 -i error "$TMP/make_tests.log")"
    exit 1
fi
bin="$ROOT/tests/unit/test_gpt_cuda"
if [[ ! -x "$bin" ]]; then
    fail "test_gpt_cuda" "not built (see make -C tests)"
    exit 1
fi

# run_unit NAME SECONDS ARGS...: the binary's PASS/FAIL/SKIP lines, plus a
# FAIL line if it died without saying why.
run_unit() {
    local name=$1 secs=$2; shift 2
    run_capture "$secs" "$TMP/$name.log" "$@"
    local status=$?
    grep -E '^(PASS|FAIL|SKIP|info:)' "$TMP/$name.log"
    if [[ $status -ne 0 ]] && ! grep -q '^FAIL ' "$TMP/$name.log"; then
        fail "$name" "exited with status $status: $(grep -v -E '^(PASS|SKIP|info:)' "$TMP/$name.log" | tail -n 3 | tr '\n' '|')"
    fi
}

# About 90 s of CPU on the emulated GPU (2026-11-28); 420 s leaves room for a machine
# shared with other work (at a load of 10 on 2 cores it needed over 300).
# In CI's repeat in another schedule, the parity checks only (--mode
# sanitize): the training tracks run 60 steps of kernels checked there.
mode=test
order_matters "gpt cuda bf16 and fp16 training track fp32 (60 steps each)" || mode=sanitize
run_unit test_gpt_cuda 420 "$bin" --mode "$mode"

cpu_only=false
grep -q 'CPU-only build' "$TMP/test_gpt_cuda.log" && cpu_only=true

if $cpu_only; then
    skip "gpt cuda out of memory" "this is a CPU-only build (CUDA=0 or no CUDA toolkit found)"
elif ! has_gpu; then
    skip "gpt cuda out of memory" "no GPU here (nvidia-smi lists none)"
else
    run_capture 60 "$TMP/oom.log" "$bin" --mode oom
    status=$?
    [[ $status -eq 1 ]] && grep -Eq 'needs [0-9.]+ GiB, the GPU has [0-9.]+ GiB free' "$TMP/oom.log"
    verdict $? "gpt cuda out of memory: one line with the size asked for" \
        "wanted exit 1 and 'needs X GiB, the GPU has Y GiB free'; got status $status: $(tail -n 2 "$TMP/oom.log" | tr '\n' '|')"
fi

# Four bugs planted in one copy of gpt_cuda.cu, built once for the emulated
# GPU (only a CUDA=emu build runs it), each caught by its own test (they
# do not meet: the graph test trains in fp32, the scaler test has no graph
# and neither has two blocks of rows to add up, the rounding test runs no
# column sums):
# - the CUDA-graph step (gpt_cuda_graph_step) equals the step launched call
#   by call (the unit test checks it); planted: AdamW's learning rate and
#   bias corrections taken from the capture (the first step's host values,
#   baked in) instead of read from device memory at each replay;
# - fp16's loss scale: a step whose gradients overflowed must change nothing
#   (the scaler mode compares parameters and AdamW moments bit for bit);
#   planted: AdamW ignoring the skip flag, so an overflowed step writes inf
#   and NaN into the weights - what GradScaler exists to stop;
# - bf16 stores rounded to nearest even; planted: truncated (toward zero),
#   which every tolerance of the parity checks forgives (below);
# - the column sums of LayerNorm's and the biases' gradients add each
#   block's part with an atomicAdd; planted: a plain +=, which the grid
#   case's race checker finds (below, after that case).
gpu_bugs=""
if ! is_emu; then
    for what in "a graph step replaying the captured learning rate" "AdamW that ignores fp16's overflow" \
                "bf16 stores that truncate" "column sums without their atomicAdd"; do
        skip "planted: $what" "the planted copy is built for the emulated GPU (make CUDA=emu test)"
    done
else
    gpu_bugs=$(PLANT_CUDA=emu plant gpu_bugs gpt/gpt_cuda.cu 'g->graph && g->graph->capturing ? &g->scalars->step : NULL;' \
               '(const step_scalars *)NULL;' tests unit/test_gpt_cuda '    if (skip && *skip) return;' '' \
               'return __float2bfloat16(x);' 'return __float2bfloat16_rz(x);' 'atomicAdd(&dst[col], s);' 'dst[col] += s;')
    [[ -n $gpu_bugs ]] && { run_capture 300 "$TMP/graph_lr.log" "$gpu_bugs" --mode graph --seed 3; true; } &&
        grep -q '^FAIL gpt cuda graph step equals the uncaptured step' "$TMP/graph_lr.log"
    verdict $? "planted: a graph step replaying the captured learning rate fails the graph test ($(field "$TMP/graph_lr.log" 'FAIL gpt cuda graph step [^:]*: (losses differ .*) \(relative'))" \
        "$(planted_why gpu_bugs)$(grep -m2 -E '^(PASS|FAIL) gpt cuda graph' "$TMP/graph_lr.log" 2>/dev/null | tr '\n' '|')"
    [[ -n $gpu_bugs ]] && { run_capture 300 "$TMP/no_skip.log" "$gpu_bugs" --mode scaler --seed 3; true; } &&
        grep -q '^FAIL gpt cuda fp16 overflow: the step is skipped' "$TMP/no_skip.log"
    verdict $? "planted: AdamW that ignores fp16's overflow fails the scaler test ($(field "$TMP/no_skip.log" 'FAIL gpt cuda fp16 overflow: the step is skipped[^:]*: (.*)'))" \
        "$(planted_why gpu_bugs)$(grep -m2 -E '^(PASS|FAIL) gpt cuda fp16' "$TMP/no_skip.log" 2>/dev/null | tr '\n' '|')"
    # Truncating bf16 stores: the gradient buckets' and the activations' checks
    # fail, naming a value; fp16's stay green (only bf16 was planted).
    [[ -n $gpu_bugs ]] && { run_capture 120 "$TMP/truncated.log" "$gpu_bugs" --mode rounding; true; } &&
        grep -q '^FAIL gpt cuda rounding: bf16 of gradient buckets' "$TMP/truncated.log" &&
        grep -q '^FAIL gpt cuda rounding: bf16 activations' "$TMP/truncated.log" &&
        grep -q '^PASS gpt cuda rounding: fp16 activations' "$TMP/truncated.log"
    verdict $? "planted: bf16 stores that truncate fail the rounding checks ($(field "$TMP/truncated.log" '^FAIL gpt cuda rounding: bf16 activations.* values: (.*) \(unit'))" \
        "$(planted_why gpu_bugs)$(grep -m3 -E '^(PASS|FAIL) gpt cuda rounding' "$TMP/truncated.log" 2>/dev/null | tr '\n' '|')"
fi
# The CPU's conversion (common/pg_types.h) truncating: a CPU copy.
cpu_trunc=$(plant cpu_truncation common/pg_types.h 'bits += 0x7fffu + ((bits >> 16) & 1u);' 'bits &= 0xffff0000u;' \
            tests unit/test_gpt_cuda)
[[ -n $cpu_trunc ]] && { run_capture 120 "$TMP/cpu_truncated.log" "$cpu_trunc" --mode rounding; true; } &&
    grep -q '^FAIL gpt rounding: bf16 on the CPU' "$TMP/cpu_truncated.log" &&
    grep -q '^PASS gpt rounding: fp16 on the CPU' "$TMP/cpu_truncated.log"
verdict $? "planted: the CPU's f32_to_bf16 truncating fails its rounding check ($(field "$TMP/cpu_truncated.log" '^FAIL gpt rounding: bf16 on the CPU.* values: (.*) \(unit'))" \
    "$(planted_why cpu_truncation)$(grep -m2 -E '^(PASS|FAIL) gpt rounding' "$TMP/cpu_truncated.log" 2>/dev/null | tr '\n' '|')"

# The benchmark's own code (make bench-gpt), at the tests' tiny size: on a
# GPU (real or emulated) it must time a step of each kind and print one
# well-formed row; the row's numbers mean something only on a real GPU.
if $cpu_only; then
    skip "gpt cuda bench mode runs" "this is a CPU-only build"
elif ! has_gpu; then
    skip "gpt cuda bench mode runs" "no GPU here (nvidia-smi lists none)"
else
    run_capture 300 "$TMP/bench.log" "$bin" --mode bench --config tiny --vocab_size 211 --batch_size 4 --steps 2 --warmup 1
    status=$?
    row=$(field --all "$TMP/bench.log" '^BENCH (.*)')
    [[ $status -eq 0 ]] && awk -F, '{ exit !(NF == 20 && $2 == "tiny" && $8 > 0 && $9 > 0 && $18 > 0) }' <<<"$row"
    verdict $? "gpt cuda bench mode runs and prints a row ($(cut -d, -f2-4,8 <<<"$row"))" "status $status: $(tail -n 2 "$TMP/bench.log" | tr '\n' '|')"
    # Launches per step, as the bench prints them: one graph launch, and
    # (the emulator's own count) one launch counted for it.
    launches=$(cut -d, -f19,20 <<<"$row")
    emu_count=$(field "$TMP/bench.log" 'counted by the emulated GPU .*: [0-9]+ call by call, ([0-9]+) as a graph')
    [[ $status -eq 0 && ${launches#*,} == 1 ]] && awk -F, '{ exit !($1 > 10) }' <<<"$launches" &&
        { ! is_emu || [[ $emu_count == 1 ]]; }
    verdict $? "gpt cuda bench: launches per step, call by call and as a CUDA graph ($launches; the emulator counted ${emu_count:-n/a} for the graph)" \
        "row's launches '$launches', emulator's count '$emu_count': $(grep -m2 'launches per step' "$TMP/bench.log" | tr '\n' '|')"
fi

# ---------------------------------------------------------------- shapes that span the grid
# The parity checks above run small shapes, where many kernels get a
# single block along some grid dimension: blocks that add into the same
# numbers without an atomic never meet there. --mode grid runs them at
# shapes that give every kernel two or more blocks along each dimension it
# reads (tests/unit/test_gpt_cuda.c says which), with the race checker on
# every launch. On the emulated GPU its launch log (EMU_LAUNCH_LOG) lists
# each kernel's grids, case by case, against what gpt_cuda.cu's source
# says each kernel reads: blockIdx or gridDim along x, y, z, itself or
# through the __device__ functions it calls (kernel_dims). A kernel that no
# case spans in every dimension it reads, one no case launches, and one
# launched with blocks along a dimension it does not read (each such block
# doing the same work) are named.
kernel_dims() {   # FILE.cu: "NAME DIMS" per __global__ kernel (DIMS: x, xy, ... or - for none)
    awk '{ line = $0; sub(/\/\/.*/, "", line); src = src line "\n" }
    END {
        n = 0; rest = src
        while (match(rest, /__(global|device)__/)) {
            kind = substr(rest, RSTART + 2, 6); rest = substr(rest, RSTART + RLENGTH)
            head_end = match(rest, /[{;]/)
            if (!head_end || substr(rest, head_end, 1) == ";") continue   # a declaration
            head = substr(rest, 1, head_end - 1)
            gsub(/__launch_bounds__[ \t\n]*\([^)]*\)/, "", head)
            if (!match(head, /[A-Za-z_][A-Za-z0-9_]*[ \t\n]*(<[^>()]*>)?[ \t\n]*\(/)) continue
            name = substr(head, RSTART, RLENGTH); sub(/[ \t\n]*(<[^>()]*>)?[ \t\n]*\($/, "", name)
            depth = 0
            for (i = head_end; i <= length(rest); i++) {
                ch = substr(rest, i, 1)
                if (ch == "{") depth++
                else if (ch == "}" && --depth == 0) break
            }
            n++; fname[n] = name; fkind[n] = kind; fbody[n] = substr(rest, head_end, i - head_end + 1)
            for (d = 1; d <= 3; d++) { c = substr("xyz", d, 1); if (fbody[n] ~ ("(blockIdx|gridDim)\\." c)) dims[name] = dims[name] c }
            if (kind == "device") device[name] = 1
        }
        do {   # what the __device__ functions called read, to a fixed point
            changed = 0
            for (k = 1; k <= n; k++)
                for (f in device)
                    if (fbody[k] ~ ("[^A-Za-z0-9_]" f "[ \t\n]*(<[^>()]*>)?[ \t\n]*\\("))
                        for (d = 1; d <= 3; d++) {
                            c = substr("xyz", d, 1)
                            if (index(dims[f], c) && !index(dims[fname[k]], c)) { dims[fname[k]] = dims[fname[k]] c; changed = 1 }
                        }
        } while (changed)
        for (k = 1; k <= n; k++) {
            if (fkind[k] != "global" || seen[fname[k]]++) continue
            d = ""; for (j = 1; j <= 3; j++) { c = substr("xyz", j, 1); if (index(dims[fname[k]], c)) d = d c }
            print fname[k], (d == "" ? "-" : d)
        }
    }' "$1"
}
# grid_listing DIMS LOG: an "info: grid:" line per kernel (its grid, the
# largest, in each case that launched it), then NOT SPANNED, NEVER
# LAUNCHED and IDLE BLOCKS lines for what is wrong.
grid_listing() {
    awk 'FNR == NR { dims[$1] = $2; order[++nk] = $1; next }
    /^note case / { c = substr($0, 11); cases[++nc] = c; next }
    /^launch / {
        name = $0; sub(/^launch [^ ]+ [^ ]+ [^ ]+ /, "", name); sub(/<.*/, "", name)
        if (!(name in dims)) next
        split($2, g, "x"); size = g[1] * g[2] * g[3]; launched[name] = 1; launches++
        key = name SUBSEP nc
        if (size > best[key]) { best[key] = size; grid[key] = $2 }
        all = 1
        for (d = 1; d <= 3; d++) {
            c = substr("xyz", d, 1)
            if (index(dims[name], c) && g[d] < 2) all = 0
            if (!index(dims[name], c) && g[d] > 1 && !(name in idle)) idle[name] = $2 " in case " cases[nc]
        }
        if (all && dims[name] != "-" && !(name in spanned)) spanned[name] = cases[nc] " " $2
    }
    END {
        for (k = 1; k <= nk; k++) {
            name = order[k]; line = ""
            for (c = 1; c <= nc; c++) if ((name SUBSEP c) in grid) line = line (line == "" ? "" : ", ") cases[c] " " grid[name SUBSEP c]
            reads = dims[name] == "-" ? "reads no blockIdx: one block by design" : "reads blockIdx " dims[name]
            printf "info: grid: %s (%s): %s\n", name, reads, line == "" ? "never launched" : line
            if (!(name in launched)) print "NEVER LAUNCHED " name
            else if (dims[name] != "-" && !(name in spanned)) print "NOT SPANNED " name " (" dims[name] ")"
            if (name in idle) print "IDLE BLOCKS " name ": " idle[name]
        }
        printf "CASES %d LAUNCHES %d\n", nc, launches
    }' "$1" "$2"
}
if $cpu_only; then
    skip "gpt cuda grid shapes" "this is a CPU-only build"
elif ! has_gpu; then
    skip "gpt cuda grid shapes" "no GPU here (nvidia-smi lists none)"
elif order_matters "gpt cuda grid shapes: the parity checks where every kernel spans 2+ blocks"; then
    start=$SECONDS
    EMU_RACECHECK=all EMU_LAUNCH_LOG=$TMP/launches.log run_capture 300 "$TMP/grid.log" "$bin" --mode grid; status=$?
    sed -nE 's/^(PASS|FAIL|SKIP) gpt cuda /\1 gpt cuda grid shapes: /p; /^info: grid case/p' "$TMP/grid.log"
    [[ $status -eq 0 ]] || grep -q '^FAIL ' "$TMP/grid.log" ||
        fail "gpt cuda grid shapes" "exited with status $status: $(grep -m1 -E 'error' "$TMP/grid.log" | cut -c1-400)"
    echo "info: the grid cases took $((SECONDS - start)) s (EMU_RACECHECK=all)"
    if ! is_emu; then
        skip "gpt cuda grid: every kernel spans 2+ blocks in each dimension it reads" \
            "the list of launches is the emulated GPU's (EMU_LAUNCH_LOG; make CUDA=emu test)"
    else
        kernel_dims "$ROOT/gpt/gpt_cuda.cu" >"$TMP/dims"
        grid_listing "$TMP/dims" "$TMP/launches.log" >"$TMP/listing"
        grep '^info: grid:' "$TMP/listing"
        kernels=$(grep -c . "$TMP/dims"); read -r _ cases _ launches < <(grep '^CASES' "$TMP/listing")
        problems=$(grep -E '^(NEVER LAUNCHED|NOT SPANNED|IDLE BLOCKS)' "$TMP/listing")
        checker="the race checker on each"; [[ ${ASAN:-0} == 1 ]] && checker="no race checker: it is off in ASan builds"
        [[ $status -eq 0 && $kernels -ge 30 && -z $problems ]]
        verdict $? "gpt cuda grid: every one of gpt_cuda.cu's $kernels kernels gets 2+ blocks along each grid dimension it reads in some case ($cases cases, $launches launches, $checker)" \
            "status $status, $kernels kernels found in gpt_cuda.cu; $(tr '\n' '|' <<<"${problems:-no kernel named}")"
        # The listing on doctored copies of the log: LayerNorm's column sums
        # cut to one block of rows, the tensor-parallel cases left out, the
        # mean loss launched with two blocks. Each must name its kernel.
        sed -E '/layernorm_backward_params_kernel/s/^launch ([0-9]+)x[0-9]+x/launch \1x1x/' "$TMP/launches.log" >"$TMP/one_row_block.log"
        awk '/^note case/ { skip = /tensor-parallel/ } !skip' "$TMP/launches.log" >"$TMP/no_tp.log"
        sed -E '/ mean_loss_kernel$/s/^launch 1x/launch 2x/' "$TMP/launches.log" >"$TMP/two_blocks.log"
        grid_listing "$TMP/dims" "$TMP/one_row_block.log" | grep -qx 'NOT SPANNED layernorm_backward_params_kernel (xy)' &&
            grid_listing "$TMP/dims" "$TMP/no_tp.log" | grep -qx 'NEVER LAUNCHED residual_bias_forward_kernel' &&
            grid_listing "$TMP/dims" "$TMP/two_blocks.log" | grep -q '^IDLE BLOCKS mean_loss_kernel: 2x1x1'
        verdict $? "gpt cuda grid: the listing names a kernel no case spans, one no case launches, one whose blocks would repeat each other (doctored logs)" \
            "$(grid_listing "$TMP/dims" "$TMP/one_row_block.log" | grep -v '^info' | tr '\n' '|')"
    fi
fi
# The planted column sums without their atomicAdd (the copy above): the
# grid case stops at the race, naming the kernel; the small shapes of
# --mode test never put two blocks on one column.
if is_emu; then
    [[ -n $gpu_bugs ]] && { EMU_RACECHECK=all run_capture 300 "$TMP/no_atomic.log" "$gpu_bugs" --mode grid; status=$?; true; } &&
        [[ $status -ne 0 ]] && grep -Eq 'data race: kernel (layernorm_backward_params|bias_backward)_kernel' "$TMP/no_atomic.log"
    verdict $? "planted: column sums without their atomicAdd are a race the grid case finds ($(grep -m1 -oE 'data race: kernel [a-z_]+' "$TMP/no_atomic.log" 2>/dev/null))" \
        "$(planted_why gpu_bugs)status ${status:-}: $(grep -m2 -E 'error|^FAIL' "$TMP/no_atomic.log" 2>/dev/null | cut -c1-300 | tr '\n' '|')"
fi

sanitizer=$(command -v compute-sanitizer 2>/dev/null || true)
for candidate in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" /usr/local/cuda/bin/compute-sanitizer; do
    [[ -z "$sanitizer" && -x "$candidate" ]] && sanitizer=$candidate
done
if $cpu_only; then
    skip "gpt cuda compute-sanitizer memcheck" "this is a CPU-only build"
elif is_emu; then
    skip "gpt cuda compute-sanitizer memcheck" "compute-sanitizer needs a real GPU; the emulated GPU checks memory itself (tests/tools/test_emu.sh, make CUDA=emu ASAN=1)"
elif ! has_gpu; then
    skip "gpt cuda compute-sanitizer memcheck" "no GPU here (nvidia-smi lists none)"
elif [[ -z "$sanitizer" ]]; then
    skip "gpt cuda compute-sanitizer memcheck" "compute-sanitizer not found (it ships with the CUDA toolkit, in \$CUDA_HOME/bin)"
else
    run_capture 300 "$TMP/memcheck.log" "$sanitizer" --tool memcheck --error-exitcode 99 "$bin" --mode sanitize
    status=$?
    [[ $status -eq 0 ]] && grep -q 'ERROR SUMMARY: 0 errors' "$TMP/memcheck.log" &&
       grep -q '^PASS gpt cuda model gradients' "$TMP/memcheck.log" && ! grep -q '^FAIL ' "$TMP/memcheck.log"
    verdict $? "gpt cuda compute-sanitizer memcheck: no errors in the parity checks" \
        "status $status: $(grep -m3 -E 'ERROR SUMMARY|Invalid|^FAIL|error' "$TMP/memcheck.log" | tr '\n' '|')"
    # racecheck: shared-memory hazards (a missing __syncthreads) in the kernels.
    run_capture 600 "$TMP/racecheck.log" "$sanitizer" --tool racecheck --error-exitcode 99 "$bin" --mode sanitize
    status=$?
    [[ $status -eq 0 ]] && grep -q 'ERROR SUMMARY: 0 ' "$TMP/racecheck.log" && ! grep -q '^FAIL ' "$TMP/racecheck.log"
    verdict $? "gpt cuda compute-sanitizer racecheck: no shared-memory hazards" \
        "status $status: $(grep -m3 -E 'ERROR SUMMARY|hazard|^FAIL|error' "$TMP/racecheck.log" | tr '\n' '|')"
fi
exit 0
