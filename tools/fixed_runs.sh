#!/usr/bin/env bash
# tools/fixed_runs.sh - the final checksums of a fixed set of CPU runs of
# chapters 08-11 (fp32, pinned seeds, the tests' small corpus), one line a run.
#
# For a move that must not change behaviour (code moved into headers, a
# chapter rebuilt as 08 plus its idea): run it before, run it after, diff.
#   tools/fixed_runs.sh > /tmp/before.txt     # on the old commit, built
#   tools/fixed_runs.sh > /tmp/after.txt      # on the new one, built
#   diff /tmp/before.txt /tmp/after.txt       # nothing: the same numbers
# FIXED_RUNS=SUBSTRING runs only the runs whose names contain it. Each
# line: name, final parameters checksum, l2 norm, last validation loss.
# It needs the chapters built (make CUDA=0, or any build: --device cpu).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/fixed-runs.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
export COURSE_RUNS_DIR=$TMP/runs OMP_NUM_THREADS=1 COURSE_TIMEOUT=${COURSE_TIMEOUT:-60}
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT COURSE_BACKEND COURSE_DEVICE
source "$ROOT/tests/lib.sh" >/dev/null # gpt_corpus: the tests' made-up corpus
gpt_corpus "$TMP/corpus"
common=(--data_dir "$TMP/corpus" --verify_data=false --preset tiny --vocab_size 300 --num_samples 0
        --log_every 1000 --device cpu --max_steps 12 --seed 7)

one() { # NAME CHAPTER FLAGS...
    local name=$1 chapter=$2; shift 2
    [[ -n ${FIXED_RUNS:-} && $name != *"$FIXED_RUNS"* ]] && return 0
    local out=$TMP/$name.log args=() a
    # 11 called 08's --grad_accum --micro_batches once: MICRO is whichever it has.
    for a in "$@"; do
        if [[ $a == MICRO ]]; then
            if "$ROOT/$chapter/$chapter" --help 2>&1 | grep -q -- '--micro_batches'; then args+=(--micro_batches)
            else args+=(--grad_accum); fi
        else args+=("$a"); fi
    done
    set -- "${args[@]}"
    timeout -k 5 300 "$ROOT/$chapter/$chapter" "${common[@]}" --out_dir "$TMP/$name.d" "$@" >"$out" 2>&1
    local status=$? sum l2 valid
    sum=$(sed -nE 's/.*final parameters checksum ([0-9a-f]+),.*/\1/p' "$out" | tail -n 1)
    l2=$(sed -nE 's/.*final parameters checksum [0-9a-f]+, l2 norm ([0-9.e+-]+).*/\1/p' "$out" | tail -n 1)
    valid=$(sed -nE 's/^validation after step [0-9]+ .*: loss ([0-9.]+) .*/\1/p' "$out" | tail -n 1)
    printf '%-28s %s %s %s%s\n' "$name" "${sum:--}" "${l2:--}" "${valid:--}" \
        "$([[ $status -ne 0 ]] && echo " exit $status: $(grep -m1 -iE 'error|die|fail' "$out")")"
}

# 08: one process, accumulation, data parallel, compressed gradients.
one 08-one 08_gpt_wikitext --batch_size 8
one 08-accum2 08_gpt_wikitext --batch_size 4 --grad_accum 2
one 08-nprocs2 08_gpt_wikitext --batch_size 4 --nprocs 2
one 08-nprocs2-bf16wire 08_gpt_wikitext --batch_size 4 --nprocs 2 --grad_compress bf16
one 08-nprocs2-powersgd 08_gpt_wikitext --batch_size 4 --nprocs 2 --grad_compress powersgd
one 08-clip 08_gpt_wikitext --batch_size 8 --grad_clip 0.05
# 09: the three ZeRO stages and DDP, 2 and 3 ranks.
one 09-one 09_zero_fsdp --batch_size 8
for s in 0 1 2 3; do one "09-shard$s-nprocs2" 09_zero_fsdp --batch_size 4 --nprocs 2 --shard "$s"; done
one 09-shard3-nprocs3-accum2 09_zero_fsdp --batch_size 2 --nprocs 3 --shard 3 --grad_accum 2
# 10: tensor parallel, with data parallel beside it.
one 10-one 10_tensor_parallel --batch_size 8
one 10-tp2 10_tensor_parallel --batch_size 8 --tp 2
one 10-dp2-tp2 10_tensor_parallel --batch_size 4 --dp 2 --tp 2
one 10-tp2-accum2 10_tensor_parallel --batch_size 4 --tp 2 --grad_accum 2
# 11: pipelines (two stages by default, so 11-one is one pipeline of two
# stages, not one process); its micro-batches are 08's accumulation steps.
one 11-one 11_pipeline_parallel --batch_size 8 MICRO 1
one 11-pp2-gpipe 11_pipeline_parallel --batch_size 2 MICRO 4 --pp 2 --schedule gpipe
one 11-pp2-1f1b 11_pipeline_parallel --batch_size 2 MICRO 4 --pp 2 --schedule 1f1b
one 11-pp2-tp2 11_pipeline_parallel --batch_size 4 MICRO 2 --pp 2 --tp 2
one 11-dp2-pp2 11_pipeline_parallel --batch_size 2 MICRO 2 --nprocs 4 --pp 2
