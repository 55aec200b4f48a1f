# The course README's commands, one test each, as a student would type
# them (mirrored one to one, in the order the README shows them).
source "$(dirname "$0")/lib.sh"
cd "$ROOT" || exit 1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# readme NAME SECONDS DIR COMMAND... : run COMMAND in DIR; PASS on exit 0.
readme() {
    local name=$1 secs=$2 dir=$3; shift 3
    (cd "$dir" && timeout -k 5 "$secs" "$@") >"$TMP/out" 2>&1
    local status=$?
    if [[ $status -eq 0 ]]; then pass "README: $name"
    else fail "README: $name" "exit status $status: $(tail -n 2 "$TMP/out" | tr '\n' '|')"; fi
}

# The two commands.
readme "cd 04_ddp_spawn && make 04_ddp_spawn && ./04_ddp_spawn" 300 04_ddp_spawn \
    bash -c 'make -s 04_ddp_spawn >/dev/null && ./04_ddp_spawn'
grep -q '^speedup ' "$TMP/out" || fail "README: the main job prints the speedup" "no 'speedup' line"
skip "README: make test" "this test is part of what make test runs"

# The chapter map.
readme "./01_single_gpu" 120 01_single_gpu ./01_single_gpu
readme "./02_p2p" 120 02_p2p ./02_p2p
readme "./02_p2p --bench" 300 02_p2p ./02_p2p --bench
readme "./03_collectives" 120 03_collectives ./03_collectives
readme "./03_collectives --bench -b 8 -e 64M -f 4 -c 1" 300 03_collectives ./03_collectives --bench -b 8 -e 64M -f 4 -c 1
readme "./04_ddp_spawn" 300 04_ddp_spawn ./04_ddp_spawn
readme "../tools/ddprun --standalone --nproc_per_node=2 ./05_env_launch" 300 05_env_launch \
    ../tools/ddprun --standalone --nproc_per_node=2 ./05_env_launch
if [[ $(id -u) -eq 0 ]]; then
    readme "07_multinode/rehearsal.sh" 300 . 07_multinode/rehearsal.sh --quiet
else
    skip "README: 07_multinode/rehearsal.sh" "not root: the rehearsal's namespaces need root (its 127.0.0.1 mode is tested in test_07_multinode)"
fi
if [[ -r "$ROOT/../shared/data/wikitext-2/train.txt" || -n "${WIKITEXT_DIR:-}" ]]; then
    readme "./08_gpt_wikitext --preset tiny --max_steps 300" 600 08_gpt_wikitext \
        ./08_gpt_wikitext --preset tiny --max_steps 300 --out_dir "$TMP/gpt"
else
    skip "README: ./08_gpt_wikitext --preset tiny --max_steps 300" "WikiText-2 is not in ../shared/data (make data downloads it)"
fi

# Exercises: the starter is meant to fail its check, with a clear message.
(timeout 300 make --no-print-directory check-exercise EX=03/ring_allreduce) >"$TMP/ex" 2>&1; status=$?
if [[ $status -ne 0 ]] && grep -q "NOT YET" "$TMP/ex"; then pass "README: make check-exercise EX=03/ring_allreduce (the starter is not done yet)"
else fail "README: make check-exercise EX=03/ring_allreduce" "status $status: $(tail -n 2 "$TMP/ex" | tr '\n' '|')"; fi

readme "make help" 60 . make --no-print-directory help
if [[ "${ASAN:-0}" == 1 ]]; then
    # Measurements are meaningless and very slow under the sanitizers, and
    # `make speedup` / `make plots` would rebuild without them anyway.
    for c in "make speedup" "make plots" "make plots wrote every figure"; do
        skip "README: $c" "not measured in a sanitizer build (make asan)"
    done
    exit 0
fi
readme "make speedup" 600 . make --no-print-directory -s speedup
readme "make plots" 900 . make --no-print-directory -s plots
if command -v gnuplot >/dev/null; then
    missing=""
    for f in 01_loss 02_p2p 03_collectives speedup 08_gpt_loss 08_gpt_tokens; do
        [[ -s runs/plots/$f.png ]] || missing+=" $f"
    done
    if [[ -z $missing ]]; then pass "README: make plots wrote every figure"
    elif [[ $missing == " 08_gpt_loss 08_gpt_tokens" && ! -r "$ROOT/../shared/data/wikitext-2/train.txt" ]]; then
        skip "README: make plots wrote every figure" "08's figures need WikiText-2"
    else fail "README: make plots wrote every figure" "missing:$missing"; fi
else
    skip "README: make plots wrote every figure" "gnuplot is not installed"
fi
