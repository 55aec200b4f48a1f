# The READMEs' commands, as a new student types them: each README's in a
# fresh copy of the course in which nothing was built or run (two
# exceptions, said where they are: the top README's figures, and its
# emulated-GPU commands, which go first in emu/README.md's copy), with
# nothing beside it (no ../shared, so no WikiText-2), each from the folder
# of the README that shows it, in the README's order.
# time limit: 1500 s (a fresh copy per chapter, each built as the student
# builds it: with nvcc found, chapters 08-11 each compile gpt_cuda.cu; on a
# busy 2-core machine that took longer than the default 600 s, 2026-11-25)
#
# Every command in a README's ```sh blocks must be run here (or skipped here
# with the reason): a command that is added or changed in a README and not
# here is a FAIL, so the READMEs and this test cannot drift apart. A few
# commands from the text are run too (the chapter map, make help, ...).
source "$(dirname "$0")/../lib.sh"

# ---------------------------------------------------------------- the fresh copies
# The files git would give a clone of this working tree (tracked and new,
# not ignored: no builds, no runs/), or, outside git, a copy made clean:
# packed once, unpacked anew for each README.
pristine=$TMP/fresh/course.tar
course=$TMP/fresh/course
mkdir -p "$course"
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$ROOT" && git ls-files -z -co --exclude-standard | while IFS= read -r -d '' f; do
        [[ -e "$f" ]] && printf '%s\0' "$f"; done | tar --null -T - -cf "$pristine")
else
    cp -a "$ROOT"/. "$course"/ && make -s -C "$course" clean >/dev/null 2>&1 && tar -C "$course" -cf "$pristine" .
fi
# The copies are built in the mode of the tree under test (CUDA=0, 1, ...).
mode=${CUDA:-$(cat "$ROOT/build/mode" 2>/dev/null)}
# fresh_copy NAME: $course becomes the course as a clone gives it, for the
# commands of one README (08's three READMEs, one chapter, share one).
# Nothing that another README's commands built is there, so a command that
# works only after another chapter's (08's ./rehearsal.sh needs
# tools/ddprun, which `make` in 05, 06 or 07 also builds) fails here, as it
# would for a student who starts at that chapter. Unpacking takes a
# fraction of a second; what two READMEs both build (ddprun, 04) is built
# twice. What each copy's commands built and wrote is kept (every file
# newer than the unpacking), for union_copy.
# The log notes how long each copy's commands took (not a test: timings vary).
copy_name="" copy_start=0 unpacked=$TMP/fresh/unpacked outputs=() union_made=""
fresh_copy() {
    [[ -n "$copy_name" ]] && echo "time: the commands of $copy_name took $(( $(date +%s) - copy_start )) s"
    if [[ -n "$copy_name" && -z "$union_made" ]]; then
        outputs+=("$TMP/fresh/outputs.${#outputs[@]}.tar")
        (cd "$course" && find . -newer "$unpacked" \( -type f -o -type l \) -print0 | tar --null -T - -cf "${outputs[-1]}")
    fi
    copy_name=$1 copy_start=$(date +%s)
    [[ -n "$copy_name" ]] || return 0
    rm -rf "$course" && mkdir -p "$course" && tar -C "$course" -xf "$pristine" && touch "$unpacked" ||
        { fail "README: a fresh copy of the course" "could not unpack $pristine into $course"; exit 1; }
    if [[ -n "$mode" && "${ASAN:-0}" != 1 ]]; then mkdir -p "$course/build" && echo "$mode" >"$course/build/mode"; fi
}
# union_copy NAME: a fresh copy with what every README's commands so far
# built and wrote, as a student has it after working through them: the
# top README's figures are drawn there. `make speedup` and `make plots`
# build all they need themselves (the `all` target), so nothing can hide
# behind the union; it saves building the whole course once more (minutes
# with nvcc) and measuring again what the chapters' benchmarks measured.
union_copy() {
    fresh_copy "$1 (the union)"
    union_made=1
    local tarball
    for tarball in "${outputs[@]}"; do tar -C "$course" -xf "$tarball" || fail "README: the union copy" "could not unpack $tarball"; done
}
# WikiText-2 of the tree under test, if it has one: only the one command
# that trains on it (08's tiny run) is given it.
wikitext=""
for d in "${WIKITEXT_DIR:-}" "$ROOT/../shared/data/wikitext-2" "$ROOT/data/wikitext-2"; do
    [[ -n "$d" && -r "$d/train.txt" ]] && { wikitext=$(cd "$d" && pwd); break; }
done
# A student's shell: no make of ours around, no test settings.
student_shell=(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u COURSE_DETECTED -u COURSE_MODE_SHOWN -u CUDA
               -u COURSE_RUNS_DIR -u WIKITEXT_DIR -u TEST_DIR -u COURSE_TIMEOUT -u COURSE_DEVICE)
student=("${student_shell[@]}")
# In the emulated-GPU build the READMEs' commands compute on the CPU: they
# are here to prove the commands work, and the emulator runs the big
# benchmarks thousands of times slower (its own commands run at the end).
[[ $mode == emu ]] && student+=(COURSE_DEVICE=cpu)

# ---------------------------------------------------------------- running commands
declare -A covered=()   # "README|command" -> 1, for the coverage check below

# run README DIR SECONDS COMMAND [REGEX]: COMMAND as the README shows it, typed
# in DIR (relative to the course); PASS when it exits 0 (and its output has a
# line matching REGEX). The output stays in $TMP/out.
run() {
    local readme=$1 dir=$2 secs=$3 command=$4 regex=${5:-}
    covered["$readme|$command"]=1
    (cd "$course/$dir" && timeout -k 5 "$secs" "${student[@]}" bash -c "$command") >"$TMP/out" 2>&1
    local status=$? why=""
    if [[ $status -ne 0 ]]; then why="exit status $status in $dir/: $(tail -n 2 "$TMP/out" | tr '\n' '|')"
    elif [[ -n "$regex" ]] && ! grep -Eq -- "$regex" "$TMP/out"; then why="no line matches /$regex/: $(tail -n 2 "$TMP/out" | tr '\n' '|')"
    fi
    [[ -z "$why" ]]; verdict $? "$readme: $command" "$why"
}

# fails README DIR SECONDS COMMAND REGEX: a command the README shows failing
# on purpose; PASS when it exits non-zero with a line matching REGEX.
fails() {
    local readme=$1 dir=$2 secs=$3 command=$4 regex=$5
    covered["$readme|$command"]=1
    (cd "$course/$dir" && timeout -k 5 "$secs" "${student[@]}" bash -c "$command") >"$TMP/out" 2>&1
    local status=$?
    [[ $status -ne 0 && $status -ne 124 ]] && grep -Eq -- "$regex" "$TMP/out"
    verdict $? "$readme: $command (fails, as shown)" "wanted a non-zero exit and /$regex/; status $status: $(tail -n 2 "$TMP/out" | tr '\n' '|')"
}
# run_lines README DIR SECONDS REGEX LINE...: lines the README shows together
# (a rank in the background, then another), run as one script that waits.
run_lines() {
    local readme=$1 dir=$2 secs=$3 regex=$4; shift 4
    local line script=""
    for line in "$@"; do covered["$readme|$line"]=1; script+="$line"$'\n'; done
    run "$readme" "$dir" "$secs" "${script}wait" "$regex"
}
# not_here README COMMAND REASON: a README command this test cannot run.
not_here() { [[ -n "${covered["$1|$2"]:-}" ]] || skip "$1: $2" "$3"; covered["$1|$2"]=1; }

# exercise README DIR COMMAND: a make check-exercise command, from DIR. It
# works when the check ends with a verdict: PASSED (make exits 0), NOT YET
# (the starter as handed out, or work in progress) or CANNOT CHECK HERE (a
# GPU exercise without a GPU); make then exits non-zero, after the verdict.
exercise() {
    local readme=$1 dir=$2 command=$3
    covered["$readme|$command"]=1
    (cd "$course/$dir" && timeout -k 5 300 "${student[@]}" bash -c "$command") >"$TMP/out" 2>&1
    local status=$? said; said=$(grep -E '^(PASSED|NOT YET|CANNOT CHECK HERE): ' "$TMP/out" | tail -n 1)
    [[ ($status -eq 0 && $said == PASSED:*) || ($status -ne 0 && $status -ne 124 && $said == "NOT YET:"*) ||
       ($status -ne 0 && $status -ne 124 && $said == "CANNOT CHECK HERE:"*) ]]
    verdict $? "$readme: $command (${said%%:*})" "exit status $status in $dir/; verdict: '$said'; last line: $(tail -n 1 "$TMP/out")"
}

# emu_check README DIR SECONDS COMMAND REGEX: run, on the device the program
# chooses (run gives the commands COURSE_DEVICE=cpu in an emulated-GPU build).
emu_check() {
    local saved=("${student[@]}")
    student=("${student_shell[@]}")
    run "$@"
    student=("${saved[@]}")
}

# ---------------------------------------------------------------- README.md
fresh_copy README.md
# The two commands.
run README.md . 300 "cd 04_ddp_spawn && make 04_ddp_spawn && ./04_ddp_spawn" '^final weight [0-9.]+  bias [0-9.]+  \(true 2\.0, 3\.0\)'
not_here README.md "make test" "this test is part of what make test runs"
# (The chapter map's "try" column is run below, from each chapter's folder,
# with that chapter's README's commands.)
# A chapter's folder forwards the top folder's targets: make test there runs
# that chapter's tests (dry run here: the suite is already running).
run README.md 02_p2p 120 "make -n test" 'tests/run.sh p2p'
run README.md . 60 "make 04_ddp_spawn" '^built 04_ddp_spawn/04_ddp_spawn; run it from here with \./04_ddp_spawn/04_ddp_spawn'
exercise README.md . "make check-exercise EX=03/ring_allreduce"
# Read the diff first: make diffs exits 0 (diff's 1 is not a failure) after
# the diffs, 01 -> 04 -> 05 -> 06 -> 07, then 08 -> 09, 08 -> 10, 08 -> 11, 08 -> 12, 08 -> 13 and 11 -> 14, in that order.
run README.md . 60 "make diffs" '^\+\+\+ 14_five_dimensions/14_five_dimensions\.c$'
order=$(grep '^+++ ' "$TMP/out" | cut -c5- | tr '\n' ' ')
want="04_ddp_spawn/04_ddp_spawn.c 05_env_launch/05_env_launch.c 06_snapshot_resume/06_snapshot_resume.c 07_multinode/07_multinode.c "
want+="09_zero_fsdp/09_zero_fsdp.c 10_tensor_parallel/10_tensor_parallel.c 11_pipeline_parallel/11_pipeline_parallel.c "
want+="12_context_parallel/12_context_parallel.c 13_expert_parallel/13_expert_parallel.c 14_five_dimensions/14_five_dimensions.c "
[[ "$order" == "$want" ]]; verdict $? "README.md: make diffs prints the diffs in order" "got: $order"
run README.md . 60 "make help"
# make help: every target of the top Makefile, and every chapter with its line.
missing=""
for target in test asan bench bench-gpt speedup plots data diffs check-exercise clean; do
    grep -q "^  make $target " "$TMP/out" || missing+=" make $target"
done
for chapter in "$course"/[0-9][0-9]_*/; do
    chapter=$(basename "$chapter")
    grep -Eq "^  $chapter +[^ ]" "$TMP/out" || missing+=" $chapter (with its description)"
done
[[ -z "$missing" ]]; verdict $? "README.md: make help lists every target and every chapter with its description" "missing:$missing"

# ---------------------------------------------------------------- the chapters, each in a fresh copy
fresh_copy 01_single_gpu/README.md
run 01_single_gpu/README.md 01_single_gpu 120 "make 01_single_gpu && ./01_single_gpu" '^learned weight: '
exercise 01_single_gpu/README.md 01_single_gpu "make check-exercise EX=01/sgd_step"
exercise 01_single_gpu/README.md 01_single_gpu "make check-exercise EX=01/sgd_kernel"

fresh_copy 02_p2p/README.md
run 02_p2p/README.md 02_p2p 120 "make 02_p2p && ./02_p2p" '^Rank 1 has data 1\.0 \(pg_recv returned\)$'
run 02_p2p/README.md 02_p2p 300 "./02_p2p --bench" '^ +268435456 '
run 02_p2p/README.md 02_p2p 300 "./02_p2p --bench -b 1K -e 64M -f 4 -n 50" '^ +67108864 '
exercise 02_p2p/README.md 02_p2p "make check-exercise EX=02/pingpong"

fresh_copy 03_collectives/README.md
run 03_collectives/README.md 03_collectives 120 "make 03_collectives && ./03_collectives" '^== 9\. barrier'
run 03_collectives/README.md 03_collectives 300 "./03_collectives --bench -b 8 -e 64M -f 4 -c 1" '^# Out of bounds values : 0 OK$'
run 03_collectives/README.md 03_collectives 60 "./03_collectives --nprocs 2 --mismatch" 'rank 0 has 3, rank 1 has 2$'
fails 03_collectives/README.md 03_collectives 60 "COURSE_DEBUG=DETAIL ./03_collectives --nprocs 2 --mismatch" \
    'error: COURSE_DEBUG=DETAIL: collective #0 differs across ranks: rank 0 called all_reduce\(1000 x f32, sum\), rank 1 called all_reduce\(1000 x f32, max\)'
exercise 03_collectives/README.md 03_collectives "make check-exercise EX=03/ring_allreduce"

fresh_copy 04_ddp_spawn/README.md
run 04_ddp_spawn/README.md 04_ddp_spawn 300 "make 04_ddp_spawn && ./04_ddp_spawn" '^final weight [0-9.]+  bias [0-9.]+ '
exercise 04_ddp_spawn/README.md 04_ddp_spawn "make check-exercise EX=04/average_gradients"
exercise 04_ddp_spawn/README.md 04_ddp_spawn "make check-exercise EX=04/sync_batchnorm"

fresh_copy 05_env_launch/README.md
run 05_env_launch/README.md 05_env_launch 120 "make 05_env_launch"
run 05_env_launch/README.md 05_env_launch 120 "./05_env_launch" 'final weight'
run 05_env_launch/README.md 05_env_launch 120 "../tools/ddprun --standalone --nproc_per_node=2 ./05_env_launch" '^\[rank 0\]: final weight'
run_lines 05_env_launch/README.md 05_env_launch 60 '^final weight' \
    "RANK=1 WORLD_SIZE=2 ./05_env_launch --init_method tcp://127.0.0.1:29612 --epochs 2 &" \
    "RANK=0 WORLD_SIZE=2 ./05_env_launch --init_method tcp://127.0.0.1:29612 --epochs 2"
run_lines 05_env_launch/README.md 05_env_launch 60 '^final weight' \
    "RANK=1 WORLD_SIZE=2 ./05_env_launch --init_method file:///tmp/course-rdzv --epochs 2 &" \
    "RANK=0 WORLD_SIZE=2 ./05_env_launch --init_method file:///tmp/course-rdzv --epochs 2"
run 05_env_launch/README.md 05_env_launch 60 "../tools/ddprun --standalone --nproc_per_node=2 --pass_local_rank ./05_env_launch --epochs 2" '^\[rank 0\]: final weight'
exercise 05_env_launch/README.md 05_env_launch "make check-exercise EX=05/epoch_loss"

fresh_copy 06_snapshot_resume/README.md
run 06_snapshot_resume/README.md 06_snapshot_resume 120 "make 06_snapshot_resume"
run 06_snapshot_resume/README.md 06_snapshot_resume 300 "cd .. && tools/ddprun --standalone --nproc_per_node=2 --max_restarts=2 06_snapshot_resume/06_snapshot_resume --total_epochs 20 --save_every 2 --fail_rank 1 --fail_step 2000" \
    '^\[rank 0\]: Resuming training from snapshot at Epoch 12, sample 0 \(step 1884\)'
# Its From PyTorch table: the restart count is rank 0's second line.
second=$(grep '^\[rank 0\]: ' "$TMP/out" | sed -n 2p)
[[ $second == "[rank 0]: restart 0 of at most 2" ]]
verdict $? "06_snapshot_resume/README.md: rank 0's second line is the restart count" "it is '$second'"
exercise 06_snapshot_resume/README.md 06_snapshot_resume "make check-exercise EX=06/atomic_save"
not_here 06_snapshot_resume/README.md 'cd .. && mkdir -p runs && for node in a b c; do tools/ddprun --nnodes=2:3 --nproc_per_node=1 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:29400 --rdzv_id=elastic --max_restarts=1 --rdzv_conf=last_call_timeout=1 06_snapshot_resume/06_snapshot_resume --total_epochs 300 --samples 9600 --global_batch_size 96 --features 16 --lr 0.002 --device cpu > runs/elastic-$node.log 2>&1 & sleep 2; done; wait' \
    "its fixed port would join another test run's job of the same id; tests/tools/test_ddprun_elastic.sh runs it on a free port, kills the third node and checks the losses"

fresh_copy 07_multinode/README.md
run 07_multinode/README.md 07_multinode 120 "make 07_multinode"
# As root, two network namespaces; otherwise the same on 127.0.0.1.
run 07_multinode/README.md 07_multinode 300 "./rehearsal.sh" '^rehearsal: PASS'
checksum='final weight .*parameters checksum ([0-9a-f]*)'   # what field reads from the last line
two_nodes=$(field "$TMP/out" "$checksum")
for node in "0 8" "1 4"; do
    set -- $node
    not_here 07_multinode/README.md "export NCCL_SOCKET_IFNAME=eth0 NCCL_DEBUG=INFO" "needs two machines (the rehearsal above plays them)"
    not_here 07_multinode/README.md "../tools/ddprun --nnodes=2 --node_rank=$1 --nproc_per_node=$2 --master_addr=10.0.0.1 --master_port=29500 ./07_multinode --total_epochs 20" \
        "needs two machines (the rehearsal above plays them)"
done
not_here 07_multinode/README.md "sbatch sbatch_example.sh" "needs a SLURM cluster (the loop below plays srun)"
run 07_multinode/README.md 07_multinode 120 "for r in 0 1; do SLURM_PROCID=\$r SLURM_NTASKS=2 SLURM_LOCALID=\$r MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 ./07_multinode --total_epochs 2 & done; wait" \
    'final weight'
# The README's claim: the same training on one node ends with the same bytes.
run 07_multinode/README.md 07_multinode 120 "../tools/ddprun --standalone --nproc_per_node=5 ./07_multinode --snapshot_path ../runs/one-node/snapshot.safetensors" 'final weight'
one_node=$(field "$TMP/out" "$checksum")
[[ -n "$one_node" && "$one_node" == "$two_nodes" ]]
verdict $? "07_multinode/README.md: 5 ranks on one node end with the rehearsal's checksum ($one_node)" "one node '$one_node', two nodes '$two_nodes'"
exercise 07_multinode/README.md 07_multinode "make check-exercise EX=07/global_rank"

fresh_copy "08_gpt_wikitext/README*.md"
run 08_gpt_wikitext/README.md 08_gpt_wikitext 300 "make"
if [[ -n "$wikitext" ]]; then
    student+=(WIKITEXT_DIR="$wikitext")
    run 08_gpt_wikitext/README.md 08_gpt_wikitext 600 "./08_gpt_wikitext --preset tiny --max_steps 300" '^test: loss '
    run 08_gpt_wikitext/README.md 08_gpt_wikitext 120 './08_gpt_wikitext --generate --prompt "The king"' '^--- sample 1 '
    unset 'student[${#student[@]}-1]'
else
    # Without WikiText-2 the command must say so, and how to get it.
    covered["08_gpt_wikitext/README.md|./08_gpt_wikitext --preset tiny --max_steps 300"]=1
    (cd "$course/08_gpt_wikitext" && timeout -k 5 60 "${student[@]}" ./08_gpt_wikitext --preset tiny --max_steps 300) >"$TMP/out" 2>&1; status=$?
    [[ $status -eq 1 ]] && grep -q "^error: WikiText-2 not found: .*make data" "$TMP/out"
    verdict $? "08_gpt_wikitext/README.md: ./08_gpt_wikitext --preset tiny --max_steps 300 (no WikiText-2 here: one error line that says make data)" \
        "no WikiText-2 here; status $status: $(tail -n 2 "$TMP/out" | tr '\n' '|')"
    not_here 08_gpt_wikitext/README.md './08_gpt_wikitext --generate --prompt "The king"' "needs the model of a run on WikiText-2, which is not here"
fi
not_here 08_gpt_wikitext/README.md "./08_gpt_wikitext" "one epoch of the default model takes about 11 minutes (the tiny run above trains the same code)"
exercise 08_gpt_wikitext/README.md 08_gpt_wikitext "make check-exercise EX=08/layernorm_backward"
# README.finale.md: the rehearsal plays the two machines (as root in namespaces, else on 127.0.0.1).
run 08_gpt_wikitext/README.finale.md 08_gpt_wikitext 300 "./rehearsal.sh" '^rehearsal: PASS \((netns|loopback)\): 2 \+ 1 workers on two hosts trained the same model as one process'
two_machines="needs two machines (./rehearsal.sh above plays them)"
for c in "export WIKITEXT_DIR=/data/wikitext-2 NCCL_SOCKET_IFNAME=eth0" "export WIKITEXT_DIR=/data/wikitext-2 COURSE_SOCKET_IFNAME=eth0" \
         "../tools/ddprun --nnodes=2 --node_rank=0 --nproc_per_node=1 --master_addr=10.0.0.1 --master_port=29500 --max_restarts=3 ./08_gpt_wikitext --device cpu --backend cpu --save_every 1 --snapshot_path ../runs/gpt/snapshot.safetensors"; do
    not_here 08_gpt_wikitext/README.finale.md "$c" "$two_machines"
done
for node in 0 1; do
    not_here 08_gpt_wikitext/README.finale.md "../tools/ddprun --nnodes=2 --node_rank=$node --nproc_per_node=8 --master_addr=10.0.0.1 --master_port=29500 --max_restarts=3 ./08_gpt_wikitext --epochs 4 --batch_size 8 --save_every 1 --snapshot_path ../runs/gpt/snapshot.safetensors" \
        "needs two GPU servers (./rehearsal.sh above plays them)"
done
not_here 08_gpt_wikitext/README.finale.md "sbatch sbatch_gpt.sh" "needs a SLURM cluster (./rehearsal.sh above runs the same ddprun per node)"

run 08_gpt_wikitext/README.tokenizer.md 08_gpt_wikitext 120 "make -C ../tools bpe_tool"
tok_commands=("../tools/bpe_tool wikitext --tokenizer ../runs/tokenizer.json --cache_dir ../runs/cache"
              "../tools/bpe_tool encode -t ../runs/tokenizer.json -i some.txt -o some.u16"
              "../tools/bpe_tool decode -t ../runs/tokenizer.json -i some.u16 -o back.txt && cmp some.txt back.txt")
if [[ -n "$wikitext" ]]; then
    sed -n '1,/^## /p' "$course/08_gpt_wikitext/README.md" >"$course/08_gpt_wikitext/some.txt"   # "any text of yours"
    student+=(WIKITEXT_DIR="$wikitext")
    for c in "${tok_commands[@]}"; do run 08_gpt_wikitext/README.tokenizer.md 08_gpt_wikitext 120 "$c"; done
    unset 'student[${#student[@]}-1]'
else
    for c in "${tok_commands[@]}"; do not_here 08_gpt_wikitext/README.tokenizer.md "$c" "needs a tokenizer trained on WikiText-2, which is not here"; done
fi

fresh_copy 09_zero_fsdp/README.md
run 09_zero_fsdp/README.md 09_zero_fsdp 300 "make 09_zero_fsdp"
zero_snap="--preset tiny --max_steps 50 --save_every 1 --snapshot_path ../runs/zero/snapshot.safetensors"
zero_cmds=("./09_zero_fsdp --shard 3 --nprocs 4 --preset tiny --max_steps 50"
           "./09_zero_fsdp --shard 1 --nprocs 4 $zero_snap" "./09_zero_fsdp --shard 3 --nprocs 3 $zero_snap"
           "./09_zero_fsdp --consolidate --snapshot_path ../runs/zero/snapshot.safetensors --out_dir ../runs/zero/model"
           "./09_zero_fsdp --shard 3 --nprocs 4 --replicate 2 --preset tiny --max_steps 50")
if [[ -n "$wikitext" ]]; then
    student+=(WIKITEXT_DIR="$wikitext")
    run 09_zero_fsdp/README.md 09_zero_fsdp 600 "${zero_cmds[0]}" '^  model states \(1-3\) '
    run 09_zero_fsdp/README.md 09_zero_fsdp 600 "${zero_cmds[1]}" '^snapshot saved: .*: 4 shard\(s\) and an index'
    run 09_zero_fsdp/README.md 09_zero_fsdp 600 "${zero_cmds[2]}" "^resharded: the snapshot's 4 shard\(s\) loaded as 3"
    run 09_zero_fsdp/README.md 09_zero_fsdp 120 "${zero_cmds[3]}" '^consolidated: 3 shard\(s\) of step 50'
    run 09_zero_fsdp/README.md 09_zero_fsdp 600 "${zero_cmds[4]}" '^  over replicate +[0-9.]+ +2\(R-1\)/R B/n'
    unset 'student[${#student[@]}-1]'
else
    # Without WikiText-2 the first command says so, as 08's does; the others need its snapshot.
    covered["09_zero_fsdp/README.md|${zero_cmds[0]}"]=1
    (cd "$course/09_zero_fsdp" && timeout -k 5 60 "${student[@]}" bash -c "${zero_cmds[0]}") >"$TMP/out" 2>&1; status=$?
    [[ $status -eq 1 ]] && grep -Eq "^(\[rank 0\] )?error: WikiText-2 not found: .*make data" "$TMP/out"
    verdict $? "09_zero_fsdp/README.md: ${zero_cmds[0]} (no WikiText-2 here: one error line that says make data)" \
        "no WikiText-2 here; status $status: $(tail -n 2 "$TMP/out" | tr '\n' '|')"
    for c in "${zero_cmds[@]:1}"; do not_here 09_zero_fsdp/README.md "$c" "needs WikiText-2 (make data), which is not here"; done
fi
exercise 09_zero_fsdp/README.md 09_zero_fsdp "make check-exercise EX=09/zero1_step"

fresh_copy 10_tensor_parallel/README.md
run 10_tensor_parallel/README.md 10_tensor_parallel 300 "make 10_tensor_parallel"
if [[ -n "$wikitext" ]]; then
    student+=(WIKITEXT_DIR="$wikitext")
    run 10_tensor_parallel/README.md 10_tensor_parallel 600 "./10_tensor_parallel --dp 2 --tp 2 --preset tiny --max_steps 50" \
        '^mesh: dp 2 x tp 2 \(4 ranks'
    mesh_valid=$(sed -n 's/^validation after step 50 .*: loss \([0-9.]*\) .*/\1/p' "$TMP/out")
    run 10_tensor_parallel/README.md 10_tensor_parallel 600 "./10_tensor_parallel --preset tiny --max_steps 50 --batch_size 16" '^test: loss '
    one_valid=$(sed -n 's/^validation after step 50 .*: loss \([0-9.]*\) .*/\1/p' "$TMP/out")
    if [[ -n "$mesh_valid" && "$mesh_valid" == "$one_valid" ]]; then
        pass "10_tensor_parallel/README.md: dp 2 x tp 2 and one process end with the same validation loss ($one_valid)"
    else fail "10_tensor_parallel/README.md: dp 2 x tp 2 and one process end with the same validation loss" "'$mesh_valid' vs '$one_valid'"; fi
    run 10_tensor_parallel/README.md 10_tensor_parallel 120 './10_tensor_parallel --generate --prompt "The king"' '^--- sample 1 '
    unset 'student[${#student[@]}-1]'
else
    covered["10_tensor_parallel/README.md|./10_tensor_parallel --dp 2 --tp 2 --preset tiny --max_steps 50"]=1
    (cd "$course/10_tensor_parallel" && timeout -k 5 60 "${student[@]}" ./10_tensor_parallel --dp 2 --tp 2 --preset tiny --max_steps 50) \
        >"$TMP/out" 2>&1; status=$?
    if [[ $status -ne 0 ]] && grep -q "error: WikiText-2 not found: .*make data" "$TMP/out"; then
        pass "10_tensor_parallel/README.md: ./10_tensor_parallel --dp 2 --tp 2 --preset tiny --max_steps 50 (no WikiText-2 here: an error that says make data)"
    else fail "10_tensor_parallel/README.md: ./10_tensor_parallel --dp 2 --tp 2 ..." "no WikiText-2 here; status $status: $(tail -n 2 "$TMP/out" | tr '\n' '|')"; fi
    not_here 10_tensor_parallel/README.md "./10_tensor_parallel --preset tiny --max_steps 50 --batch_size 16" "needs WikiText-2, which is not here"
    not_here 10_tensor_parallel/README.md './10_tensor_parallel --generate --prompt "The king"' "needs the model of a run on WikiText-2, which is not here"
fi
exercise 10_tensor_parallel/README.md 10_tensor_parallel "make check-exercise EX=10/row_parallel"

fresh_copy 13_expert_parallel/README.md
run 13_expert_parallel/README.md 13_expert_parallel 300 "make 13_expert_parallel"
ep_cmds=("./13_expert_parallel --ep 4 --n_expert 8 --moe_top_k 2 --preset tiny --max_steps 20"
         "./13_expert_parallel --n_expert 8 --moe_top_k 2 --capacity_groups 4 --batch_size 32 --preset tiny --max_steps 20"
         './13_expert_parallel --generate --prompt "The king"')
if [[ -n "$wikitext" ]]; then
    student+=(WIKITEXT_DIR="$wikitext")
    run 13_expert_parallel/README.md 13_expert_parallel 600 "${ep_cmds[0]}" '^traffic per step, all 4 ranks'
    ep_valid=$(sed -n 's/^validation after step 20 .*: loss \([0-9.]*\) .*/\1/p' "$TMP/out")
    run 13_expert_parallel/README.md 13_expert_parallel 600 "${ep_cmds[1]}" '^test: loss '
    one_valid=$(sed -n 's/^validation after step 20 .*: loss \([0-9.]*\) .*/\1/p' "$TMP/out")
    if [[ -n "$ep_valid" && "$ep_valid" == "$one_valid" ]]; then
        pass "13_expert_parallel/README.md: ep 4 and one process with 4 capacity groups end with the same validation loss ($one_valid)"
    else fail "13_expert_parallel/README.md: ep 4 and one process end with the same validation loss" "'$ep_valid' vs '$one_valid'"; fi
    run 13_expert_parallel/README.md 13_expert_parallel 120 "${ep_cmds[2]}" '^--- sample 1 '
    unset 'student[${#student[@]}-1]'
else
    covered["13_expert_parallel/README.md|${ep_cmds[0]}"]=1
    (cd "$course/13_expert_parallel" && timeout -k 5 60 "${student[@]}" bash -c "${ep_cmds[0]}") >"$TMP/out" 2>&1; status=$?
    if [[ $status -ne 0 ]] && grep -q "error: WikiText-2 not found: .*make data" "$TMP/out"; then
        pass "13_expert_parallel/README.md: ${ep_cmds[0]} (no WikiText-2 here: an error that says make data)"
    else fail "13_expert_parallel/README.md: ${ep_cmds[0]}" "no WikiText-2 here; status $status: $(tail -n 2 "$TMP/out" | tr '\n' '|')"; fi
    not_here 13_expert_parallel/README.md "${ep_cmds[1]}" "needs WikiText-2, which is not here"
    not_here 13_expert_parallel/README.md "${ep_cmds[2]}" "needs the model of a run on WikiText-2, which is not here"
fi
# The GPU command needs a (real or emulated) GPU build of a fresh copy: the
# same layout is test_13_expert_parallel's GPU section (ep 2 on 2 emulated GPUs).
not_here 13_expert_parallel/README.md "./13_expert_parallel --device cuda --ep 2 --n_expert 8 --moe_top_k 2 --preset tiny --max_steps 20" \
    "a GPU command: test_13_expert_parallel's GPU section runs ep 2 (and dp 2 x ep 2) on (emulated) GPUs"
exercise 13_expert_parallel/README.md 13_expert_parallel "make check-exercise EX=13/route"

fresh_copy 14_five_dimensions/README.md
run 14_five_dimensions/README.md 14_five_dimensions 300 "make 14_five_dimensions"
fd_cmds=("./14_five_dimensions --pp 2 --dp 2 --ep 2 --cp 2 --tp 2 --n_expert 4 --moe_top_k 2 --preset tiny --block_size 32 --batch_size 2 --grad_accum 2 --max_steps 20 --device cpu"
         "./14_five_dimensions --pp 1 --n_expert 4 --moe_top_k 2 --preset tiny --block_size 32 --batch_size 8 --grad_accum 2 --max_steps 20 --device cpu"
         "./14_five_dimensions --pp 2 --dp 2 --tp 2 --shard 1 --preset tiny --batch_size 4 --grad_accum 2 --max_steps 20 --device cpu")
if [[ -n "$wikitext" ]]; then
    student+=(WIKITEXT_DIR="$wikitext")
    run 14_five_dimensions/README.md 14_five_dimensions 600 "${fd_cmds[0]}" '^mesh: pp 2 x dp 2 x ep 2 x cp 2 x tp 2 \(32 ranks'
    run 14_five_dimensions/README.md 14_five_dimensions 600 "${fd_cmds[1]}" '^test: loss '
    run 14_five_dimensions/README.md 14_five_dimensions 600 "${fd_cmds[2]}" '^sharding: ZeRO-1'
    unset 'student[${#student[@]}-1]'
else
    covered["14_five_dimensions/README.md|${fd_cmds[0]}"]=1
    (cd "$course/14_five_dimensions" && timeout -k 5 60 "${student[@]}" bash -c "${fd_cmds[0]}") >"$TMP/out" 2>&1; status=$?
    [[ $status -ne 0 ]] && grep -q "error: WikiText-2 not found: .*make data" "$TMP/out"
    verdict $? "14_five_dimensions/README.md: ${fd_cmds[0]} (no WikiText-2 here: an error that says make data)" \
        "no WikiText-2 here; status $status: $(tail -n 2 "$TMP/out" | tr '\n' '|')"
    not_here 14_five_dimensions/README.md "${fd_cmds[1]}" "needs WikiText-2, which is not here"
    not_here 14_five_dimensions/README.md "${fd_cmds[2]}" "needs WikiText-2, which is not here"
fi
# The GPU command: test_14_five_dimensions's GPU section runs this shape (tiny
# blocks, 3 steps) on 8 (emulated) GPUs against one GPU.
not_here 14_five_dimensions/README.md "./14_five_dimensions --pp 2 --dp 2 --tp 2 --device cuda --preset tiny --batch_size 4 --grad_accum 2 --max_steps 20" \
    "a GPU command: test_14_five_dimensions's GPU section runs pp 2 x dp 2 x tp 2 on (emulated) GPUs"
run 14_five_dimensions/README.md 14_five_dimensions 300 "./rehearsal.sh" \
    '^rehearsal: PASS \((netns|loopback)\): 8 \+ 8 workers on two hosts trained the same model as one process'
exercise 14_five_dimensions/README.md 14_five_dimensions "make check-exercise EX=14/mesh"

fresh_copy 11_pipeline_parallel/README.md
run 11_pipeline_parallel/README.md 11_pipeline_parallel 300 "make"
for schedule in 1f1b gpipe; do
    c="./11_pipeline_parallel --pp 4 --grad_accum 8 --schedule $schedule --preset tiny --max_steps 50"
    if [[ -n "$wikitext" ]]; then
        student+=(WIKITEXT_DIR="$wikitext")
        run 11_pipeline_parallel/README.md 11_pipeline_parallel 900 "$c" \
            "^bubble: $schedule, 4 stages x 8 micro-batches: [0-9.]+% of a step idle, measured .*= 27\\.3%$"
        unset 'student[${#student[@]}-1]'
    else
        # Without WikiText-2 the command must say so, and how to get it.
        covered["11_pipeline_parallel/README.md|$c"]=1
        (cd "$course/11_pipeline_parallel" && timeout -k 5 60 "${student[@]}" $c) >"$TMP/out" 2>&1; status=$?
        [[ $status -ne 0 && $status -ne 124 ]] && grep -q "error: WikiText-2 not found: .*make data" "$TMP/out"
        verdict $? "11_pipeline_parallel/README.md: $c (no WikiText-2 here: an error line that says make data)" \
            "no WikiText-2 here; status $status: $(tail -n 2 "$TMP/out" | tr '\n' '|')"
    fi
done
# The finale: dp x tp x pp = 2 x 2 x 2 on two hosts, one killed (its own corpus: no WikiText-2 needed).
run 11_pipeline_parallel/README.md 11_pipeline_parallel 400 "make -C ../08_gpt_wikitext 08_gpt_wikitext && ./rehearsal.sh" \
    '^rehearsal: PASS \((netns|loopback)\): 4 \+ 4 workers on two hosts trained the same model as one process .*host 1 was killed, came back, and the job resumed'
exercise 11_pipeline_parallel/README.md 11_pipeline_parallel "make check-exercise EX=11/one_f_one_b"

fresh_copy 12_context_parallel/README.md
run 12_context_parallel/README.md 12_context_parallel 300 "make 12_context_parallel"
cp_cmds=("./12_context_parallel --cp 4 --preset tiny --block_size 256 --max_steps 20"
         "./12_context_parallel --cp 4 --preset tiny --block_size 256 --max_steps 20 --cp_balance none"
         "./12_context_parallel --cp 4 --n_head 4 --preset tiny --block_size 256 --max_steps 20 --cp_attention ulysses"
         "./12_context_parallel --preset tiny --block_size 256 --max_steps 20")
if [[ -n "$wikitext" ]]; then
    student+=(WIKITEXT_DIR="$wikitext")
    run 12_context_parallel/README.md 12_context_parallel 600 "${cp_cmds[0]}" '^balance \(ring, zigzag\)'
    cp_valid=$(sed -n 's/^validation after step 20 .*: loss \([0-9.]*\) .*/\1/p' "$TMP/out")
    run 12_context_parallel/README.md 12_context_parallel 600 "${cp_cmds[1]}" '^balance \(ring, none\)'
    run 12_context_parallel/README.md 12_context_parallel 600 "${cp_cmds[2]}" '^traffic per rank and step \(ulysses'
    run 12_context_parallel/README.md 12_context_parallel 600 "${cp_cmds[3]}" '^test: loss '
    one_valid=$(sed -n 's/^validation after step 20 .*: loss \([0-9.]*\) .*/\1/p' "$TMP/out")
    [[ -n "$cp_valid" && "$cp_valid" == "$one_valid" ]]
    verdict $? "12_context_parallel/README.md: cp 4 and one process end with the same validation loss ($one_valid)" "'$cp_valid' vs '$one_valid'"
    unset 'student[${#student[@]}-1]'
else
    covered["12_context_parallel/README.md|${cp_cmds[0]}"]=1
    (cd "$course/12_context_parallel" && timeout -k 5 60 "${student[@]}" ${cp_cmds[0]}) >"$TMP/out" 2>&1; status=$?
    [[ $status -ne 0 ]] && grep -q "error: WikiText-2 not found: .*make data" "$TMP/out"
    verdict $? "12_context_parallel/README.md: ${cp_cmds[0]} (no WikiText-2 here: an error that says make data)" \
        "no WikiText-2 here; status $status: $(tail -n 2 "$TMP/out" | tr '\n' '|')"
    for c in "${cp_cmds[@]:1}"; do not_here 12_context_parallel/README.md "$c" "needs WikiText-2, which is not here"; done
fi
# The longest context per budget: some 20 one-step runs of the tiny model (seconds), its own corpus.
run 12_context_parallel/README.md 12_context_parallel 300 "bench/longest_context.sh" '^4 +[0-9]+ +[0-9.]+ +[0-9]+ \('
exercise 12_context_parallel/README.md 12_context_parallel "make check-exercise EX=12/merge_partials"

fresh_copy tools/README.md
run tools/README.md tools 120 "make ddprun && make -C ../05_env_launch"
run tools/README.md tools 120 "./ddprun --standalone --nproc_per_node=4 ../05_env_launch/05_env_launch --epochs 2" '^\[rank 0\]: final weight'
for node in "0 8" "1 4"; do
    set -- $node
    not_here tools/README.md "./ddprun --nnodes=2 --node_rank=$1 --nproc_per_node=$2 --master_addr=node0 --master_port=29500 ../05_env_launch/05_env_launch" \
        "needs two machines (test_ddprun runs two nodes on one host)"
done
not_here tools/README.md "./ddprun --nnodes=2:3 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=10.0.0.1:29400 --rdzv_id=job42 --max_restarts=3 ../06_snapshot_resume/06_snapshot_resume --global_batch_size 1536" \
    "needs two or three machines (test_ddprun_elastic runs three nodes of 2:3 on one host)"

# ---------------------------------------------------------------- the figures, the data
# After the chapters, in the union of what their commands built and wrote.
union_copy README.md
if [[ "${ASAN:-0}" == 1 ]]; then
    # Measurements are meaningless and very slow under the sanitizers.
    for c in "make speedup" "make plots" "make plots drew every figure"; do skip "README.md: $c" "not measured in a sanitizer build (make asan)"; done
else
    run README.md . 600 "make speedup" '^speedup: CSV in runs/speedup/'
    rows=$(grep -c '^[0-9]' "$course/runs/speedup/speedup_large.csv" 2>/dev/null)
    [[ "$(head -n 1 "$course/runs/speedup/speedup_large.csv" 2>/dev/null)" == *",speedup_min,speedup_max" && ${rows:-0} -ge 2 ]] &&
       grep -q '^# command: speedup.sh 1\.\.[0-9]* ranks, 3 rounds of ' "$course/runs/speedup/speedup_large.csv"
    verdict $? "README.md: make speedup writes the median and range per world size, and how it measured" \
        "$(head -n 3 "$course/runs/speedup/speedup_large.csv" 2>/dev/null | tr '\n' '|')"
    run README.md . 600 "make plots"
    if command -v gnuplot >/dev/null; then
        missing="" want="01_loss 02_p2p 03_collectives speedup 09_zero_memory 12_longest_context"
        [[ -n "$wikitext" ]] || expect_output "README.md: make plots says why 08's figures are skipped" "$TMP/out" '^plots: skipped 08_gpt_loss, 08_gpt_tokens: WikiText-2 is not here'
        for f in $want; do [[ -s "$course/runs/plots/$f.png" ]] || missing+=" $f"; done
        [[ -z $missing ]]; verdict $? "README.md: make plots drew every figure ($want) in the fresh copy" "missing:$missing"
    else
        skip "README.md: make plots drew every figure" "gnuplot is not installed"
    fi
fi
# make data without a network (a mirror that refuses): one error, and no
# empty data/ folder left behind.
(cd "$course" && WIKITEXT_URL=http://127.0.0.1:9 timeout -k 5 120 "${student[@]}" make data) >"$TMP/out" 2>&1; status=$?
[[ $status -ne 0 ]] && grep -q '^get_wikitext: error: could not download' "$TMP/out" && [[ ! -e "$course/data" ]]
verdict $? "README.md: make data, offline: one error saying what to do, and no data/ folder left" \
    "status $status, data/ $( [[ -e $course/data ]] && echo exists || echo absent): $(tail -n 1 "$TMP/out")"


# ---------------------------------------------------------------- the emulated GPU
# The top README's commands for it, then emu/README.md's, in one fresh copy:
# both build the emulator (emu/), and building it once saves a minute; the
# top README's run first, so they meet a copy in which nothing was built,
# and emu/README.md's first command builds the whole course for it anyway.
fresh_copy "README.md (the emulated GPU) and emu/README.md"
emu_check README.md . 300 "cd 01_single_gpu && make CUDA=emu 01_single_gpu && ./01_single_gpu" \
    '^01_single_gpu: running on GPU 0: emulated GPU \(CPU, for testing\)'
exercise README.md . "make CUDA=emu check-exercise EX=01/sgd_kernel"
not_here README.md "make CUDA=emu test" "this test is part of what make test runs (CI runs make CUDA=emu test)"
emu_check emu/README.md emu 300 "cd .. && make CUDA=emu"
emu_check emu/README.md emu 120 "cd ../01_single_gpu && make CUDA=emu 01_single_gpu && ./01_single_gpu --device cuda" \
    'emulated GPU \(CPU, for testing\)'
covered["emu/README.md|cd ../tests/emu && make CUDA=emu && ./planted_missing_syncthreads"]=1
if [[ ${ASAN:-} == 1 ]]; then   # as in tests/tools/test_emu.sh (raced)
    skip "emu/README.md: cd ../tests/emu && make CUDA=emu && ./planted_missing_syncthreads (the bug is caught)" \
        "the race checker is off in ASan builds (make CUDA=emu test runs it)"
else
    (cd "$course/emu" && timeout -k 5 300 "${student_shell[@]}" bash -c "cd ../tests/emu && make CUDA=emu && ./planted_missing_syncthreads") \
        >"$TMP/out" 2>&1
    status=$?
    [[ $status -eq 1 ]] && grep -Eq '^emulated GPU: error: data race: kernel block_sum \(launched at planted_missing_syncthreads.cu:29\)' "$TMP/out"
    verdict $? "emu/README.md: cd ../tests/emu && make CUDA=emu && ./planted_missing_syncthreads (the bug is caught)" "status $status: $(tail -n 2 "$TMP/out" | tr '\n' '|')"
fi
not_here emu/README.md "cd .. && make CUDA=emu test" "this test is part of what make test runs"
not_here emu/README.md "cd .. && EMU_SCHEDULE=random:1 EMU_ORDER=shuffled:1 make CUDA=emu test" "CI's second pass (.ci/run) runs it"
not_here emu/README.md "cd .. && make CUDA=emu ASAN=1 test" "make asan's job; tests/tools/test_emu.sh runs the planted bugs under ASan's build too"

fresh_copy ""   # (the time of the last copy's commands)

# ---------------------------------------------------------------- coverage
# Every line of every ```sh block in the READMEs (continuations joined,
# comments dropped) must be a command run or skipped above.
uncovered=0
for readme in README.md [0-9][0-9]_*/README*.md tools/README.md emu/README.md; do
    [[ -f "$course/$readme" ]] || continue
    while IFS= read -r command; do
        [[ -n "${covered["$readme|$command"]:-}" ]] && continue
        fail "README coverage: $readme" "the command '$command' is not run by tests/course/test_readme.sh"
        uncovered=$((uncovered + 1))
    done < <(awk '/^ *```sh *$/ { on = 1; next } /^ *```/ { on = 0 } on' "$course/$readme" |
             sed 's/^ *//; s/ *#.*$//' | awk '/\\$/ { sub(/ *\\$/, " "); line = line $0; next } { print line $0; line = "" }' |
             sed 's/  */ /g; s/ *$//' | grep -v '^$')
done
[[ $uncovered -eq 0 ]] && pass "README coverage: every command in the READMEs' sh blocks is run or skipped here"
no_leftovers "README: no process left behind" "$course/"
