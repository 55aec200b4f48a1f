# tests/library/test_subgroups.sh - process sub-groups (pg_split,
# pg_new_group in common/pg.h) on every backend: the ranks a split gives,
# all nine collectives and point-to-point on the groups, a group made
# inside a group, disjoint groups that run at the same time, and
# COURSE_DEBUG=DETAIL checking each group's calls (unit/test_subgroups.c).
source "$(dirname "$0")/../lib.sh"

if ! make -C "$ROOT/tests" -s unit/test_subgroups >"$TMP/build.log" 2>&1; then
    fail "subgroups: build" "make -C tests failed: $(grep -m3 -E 'error|Error' "$TMP/build.log" | tr '\n' '|')"
    exit 1
fi
BIN=$ROOT/tests/unit/test_subgroups
TAG=--tag=subgroups-test-$$-run
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT COURSE_AGENT_STORE COURSE_JOB_TOKEN COURSE_SHM

# run_suite NAME SECONDS ARGS...: the unit test prints its own PASS/FAIL
# lines; a crash or a hang must not go unreported.
run_suite() {
    local name=$1 secs=$2; shift 2
    run_capture "$secs" "$TMP/$name.log" "$@"
    local status=$?
    grep -E '^(PASS|FAIL|SKIP) ' "$TMP/$name.log"
    if [[ $status -ne 0 ]] && ! grep -q '^FAIL ' "$TMP/$name.log"; then
        fail "subgroups: $name" "exit status $status$( [[ $status -eq 124 ]] && echo ' (timed out)'): $(grep -v '^PASS' "$TMP/$name.log" | tail -n 4 | tr '\n' '|')"
    fi
}

# cpu: every world size from 1 (groups of one rank) to 5 (groups of 3 and
# 2), and 8 (a 2 x 2 x 2 mesh).
for n in 1 2 3 4 5 8; do run_suite "cpu$n" 300 "$BIN" "$TAG" --world $n; done
# The mesh as rank 0 prints it: rank -> coordinates -> host and device.
grep -q '^mesh: dp 2 x tp 2 x pp 2 (8 ranks, the last dimension fastest)$' "$TMP/cpu8.log" &&
   grep -Eq '^ +6 +1 +1 +0  [^ ]+  CPU' "$TMP/cpu8.log"
verdict $? "subgroups: the mesh table names each rank's coordinates and device" "$(grep -A3 '^mesh' "$TMP/cpu8.log" | tr '\n' '|')"
# A mesh that does not fit the job: one line that says why.
run_capture 60 "$TMP/badmesh" "$BIN" "$TAG" --world 4 --mesh 3x2; status=$?
[[ $status -ne 0 ]] && grep -q 'error: mesh dp 3 x tp 2 needs 6 ranks, and the job has 4' "$TMP/badmesh"
verdict $? "subgroups: a mesh of 6 ranks on a job of 4 is one clear error" "status $status: $(grep -m2 error "$TMP/badmesh" | tr '\n' '|')"
# Planted: groups_split's inner groups made of consecutive ranks, as if dp
# were the fastest dimension. On dp 4 x tp 2 (8 ranks) they mix tp ranks.
planted=$(plant split_consecutive common/groups.h \
    '*inner_pg = g->joined[g->num_joined++] = pg_split(g->dist->pg, groups_rank_of(g, coord), g->rank);' \
    '*inner_pg = g->joined[g->num_joined++] = pg_split(g->dist->pg, g->rank - g->rank % inner, g->rank);' tests unit/test_subgroups)
[[ -n $planted ]] && run_capture 300 "$TMP/planted_split" "$planted" "$TAG" --world 8
[[ -n $planted ]] && grep -q '^FAIL subgroups: groups_split: .*the inner group of dp 4 = 2 x 2 (tp 2)' "$TMP/planted_split"
verdict $? "subgroups planted: inner groups of consecutive ranks (dp taken for the fastest dimension) fail the groups_split check" \
    "$(planted_why split_consecutive)$(grep -m1 'groups_split' "$TMP/planted_split" 2>/dev/null)"
COURSE_SHM=0 run_suite tcp 300 "$BIN" "$TAG" --world 4 --label "tcp: "
expect_output "subgroups: with COURSE_SHM=0 the groups use TCP" "$TMP/tcp.log" 'color group: cpu \(TCP sockets'

# nccl: ncclCommSplit, one rank per GPU (the emulated GPU has 8); and the
# cpu backend staging GPU buffers, 4 ranks on one GPU.
if has_gpu && (( $(gpu_count) >= 4 )); then
    run_suite nccl 300 "$BIN" "$TAG" --world 4 --backend nccl --device cuda --label "nccl: "
    expect_output "subgroups: the nccl backend's groups are nccl" "$TMP/nccl.log" 'color group: nccl'
else skip "subgroups: nccl backend, 4 ranks" "needs 4 GPUs (real, or make CUDA=emu)"; fi
if has_gpu; then
    EMU_GPUS=1 CUDA_VISIBLE_DEVICES=0 run_suite staged 300 "$BIN" "$TAG" --world 4 --backend cpu --device cuda --label "gpu staged: "
    expect_output "subgroups: GPU buffers staged through host memory in the groups" "$TMP/staged.log" 'color group: cpu \(.*staged through host memory'
else skip "subgroups: cpu backend on GPU buffers" "no GPU here (make CUDA=emu test runs it on the emulated GPU)"; fi

# mpi: MPI_Comm_split, under mpirun.
mpi=(mpirun -np)
if mpirun --version 2>&1 | grep -q "Open MPI"; then mpi=(mpirun --oversubscribe --allow-run-as-root -np); fi
if ! command -v mpirun >/dev/null 2>&1; then skip "subgroups: mpi backend" "mpirun not found (apt-get install openmpi-bin libopenmpi-dev, then make)"
elif "$BIN" --world 1 --backend mpi 2>&1 | grep -q "this build has no MPI"; then skip "subgroups: mpi backend" "this build has no MPI"
else
    for n in 3 4; do run_suite "mpi$n" 300 "${mpi[@]}" $n "$BIN" "$TAG" --backend mpi --label "mpi: "; done
fi

# COURSE_DEBUG=DETAIL compares the calls of each group among that group's
# ranks: group 1's mismatch stops its ranks with the group's ranks named.
COURSE_DEBUG=DETAIL run_capture 120 "$TMP/detail" "$BIN" "$TAG" --world 4 --mismatch; status=$?
[[ $status -ne 0 ]] && grep -Eq 'error: COURSE_DEBUG=DETAIL: collective #0 differs across ranks: rank 0 called all_reduce\(2 x f32, sum\), rank 1 called all_reduce\(1 x f32, sum\)' "$TMP/detail"
verdict $? "subgroups: COURSE_DEBUG=DETAIL catches a mismatch inside a group, naming the group's ranks" "status $status: $(grep -m2 error "$TMP/detail" | tr '\n' '|')"
COURSE_DEBUG=DETAIL run_suite detail_ok 300 "$BIN" "$TAG" --world 4 --label "DETAIL: "

no_leftovers "subgroups: no process left behind" "subgroups-test-$$-run"
