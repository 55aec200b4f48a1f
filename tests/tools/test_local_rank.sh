# torch.distributed.launch compatibility: the old launcher passed the local
# rank as an argument, --local_rank=N (or --local-rank N), instead of
# LOCAL_RANK. ddprun --pass_local_rank sends it; every chapter accepts it
# (common/flags.h) and checks it against LOCAL_RANK.
source "$(dirname "$0")/../lib.sh"
ddprun="$ROOT/tools/ddprun"
bin="$ROOT/05_env_launch/05_env_launch"
[[ -x "$bin" && -x "$ddprun" ]] || make --no-print-directory -s -C "$ROOT/05_env_launch" >/dev/null 2>&1

# ddprun hands each worker its --local_rank; the program would stop at an
# unknown flag if it did not accept it.
run_capture 60 "$TMP/pass" "$ddprun" --standalone --nproc_per_node=2 --pass_local_rank "$bin" --device cpu --epochs 2; status=$?
[[ $status -eq 0 ]] && grep -q '^\[rank 0\]: final weight' "$TMP/pass"
verdict $? "local_rank: ddprun --pass_local_rank runs 05 on 2 ranks" "status $status: $(tail -n 3 "$TMP/pass" | tr '\n' '|')"

# What the worker receives: a program that prints its arguments stands in for one.
printf '#!/bin/sh\necho "args: $* LOCAL_RANK=$LOCAL_RANK"\n' >"$TMP/show_args"
chmod +x "$TMP/show_args"
run_capture 30 "$TMP/args" "$ddprun" --standalone --nproc_per_node=2 --pass_local_rank "$TMP/show_args" --lr 1; status=$?
[[ $status -eq 0 ]] && grep -q '^\[rank 0\]: args: --lr 1 --local_rank=0 LOCAL_RANK=0$' "$TMP/args" &&
    grep -q '^\[rank 1\]: args: --lr 1 --local_rank=1 LOCAL_RANK=1$' "$TMP/args"
verdict $? "local_rank: each worker gets --local_rank=N last, and LOCAL_RANK=N as well" "status $status: $(cat "$TMP/args" | tr '\n' '|')"
run_capture 30 "$TMP/plain" "$ddprun" --standalone --nproc_per_node=1 --use_env "$TMP/show_args" --lr 1; status=$?
[[ $status -eq 0 ]] && grep -q '^\[rank 0\]: args: --lr 1 LOCAL_RANK=0$' "$TMP/plain"
verdict $? "local_rank: without the switch (--use_env is accepted) the arguments are untouched" "status $status: $(cat "$TMP/plain" | tr '\n' '|')"

# Started by a launcher that only passes the argument: it becomes LOCAL_RANK.
# Two ranks of 05, each told its local rank by argument alone, LOCAL_RANK unset.
port=$(free_port)
one_rank() {   # RANK FLAG... : one rank of 2, told its local rank by argument only
    local rank=$1; shift
    ( unset LOCAL_RANK; export RANK=$rank WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
      run_capture 60 "$TMP/r$rank" "$bin" --epochs 2 "$@" )
}
one_rank 1 --device cpu --local-rank 1 &
one_rank 0 --device cpu --local_rank=0; status=$?
wait
[[ $status -eq 0 ]] && grep -q '^final weight' "$TMP/r0"
verdict $? "local_rank: two ranks started with --local_rank only (no LOCAL_RANK) train" "status $status: $(tail -n 2 "$TMP/r0" "$TMP/r1" | tr '\n' '|')"

# On GPUs the local rank picks the GPU: NCCL needs rank 1 on GPU 1, which it
# only knows from the argument (were it ignored, both would take GPU 0).
if is_emu && [[ $(gpu_count) -ge 2 ]]; then
    port=$(free_port)
    one_rank 1 --backend nccl --local_rank=1 &
    one_rank 0 --backend nccl --local_rank=0; status=$?
    wait
    [[ $status -eq 0 ]] && grep -q 'backend nccl' "$TMP/r0" && grep -q '^final weight' "$TMP/r0"
    verdict $? "local_rank: with --local_rank only, two ranks take GPUs 0 and 1 (nccl runs)" "status $status: $(tail -n 2 "$TMP/r0" "$TMP/r1" | tr '\n' '|')"
else skip "local_rank: --local_rank picks the GPU" "needs a GPU build with 2 GPUs (real, or make CUDA=emu)"; fi

# Wrong values: one line, exit status 2.
LOCAL_RANK=1 run_capture 30 "$TMP/disagree" "$bin" --local_rank=0; status=$?
[[ $status -eq 2 ]] && grep -q -- '--local_rank=0 disagrees with LOCAL_RANK=1' "$TMP/disagree"
verdict $? "local_rank: an argument that contradicts LOCAL_RANK is refused" "status $status: $(head -n 2 "$TMP/disagree" | tr '\n' '|')"
run_capture 30 "$TMP/bad" "$bin" --local_rank=two; status=$?
[[ $status -eq 2 ]] && grep -q -- "--local_rank expects a local rank from 0 to 4095, got 'two'" "$TMP/bad"
verdict $? "local_rank: --local_rank=two is refused in one line" "status $status: $(head -n 2 "$TMP/bad" | tr '\n' '|')"
for prog in 01_single_gpu 02_p2p 03_collectives 04_ddp_spawn 06_snapshot_resume 07_multinode 08_gpt_wikitext; do
    run_capture 30 "$TMP/$prog" "$ROOT/$prog/$prog" --local_rank=0 --help; status=$?
    [[ $status -eq 0 ]]; verdict $? "local_rank: $prog accepts --local_rank" "status $status: $(head -n 2 "$TMP/$prog" | tr '\n' '|')"
done
