# Classroom exercises (NN_chapter/exercises/, tools/check_exercise.sh):
#   - every starter file, as handed out, compiles without warnings and FAILS
#     its check with the helpful message that the check promises. The tests
#     keep their own copy of the starters (tests/starters/): a student's
#     exercise file changes as they solve it, and their progress must never
#     turn the course's tests red;
#   - every reference solution (solutions/) passes;
#   - the checks catch what they claim to catch (a deadlock, a half-written
#     file, a sum where a mean belongs, ...): small broken versions written
#     here are fed to them with --file;
#   - the tool itself: bad names, compile errors, endless loops, crashes.
# The CUDA exercise can only run on a GPU: elsewhere its check compiles the
# file with nvcc (in a CUDA build) and says it cannot run, and this test
# prints SKIP with that reason.
source "$(dirname "$0")/../lib.sh"
check_ex="$ROOT/tools/check_exercise.sh"
export EXERCISE_DEADLINE=3   # short deadlocks: the broken versions below hang on purpose
have_solutions=true
[[ -d "$ROOT/solutions" ]] || have_solutions=false
tmp_dir=${TMPDIR:-/tmp}
scratch_before=$(ls -d "$tmp_dir"/check_atomic_save.* 2>/dev/null | wc -l)
# leftovers: nothing left behind (the last checks of this file).
leftovers() {
    no_leftovers "exercises: no check process left behind" "check_[a-z_]+"
    local scratch_after; scratch_after=$(ls -d "$tmp_dir"/check_atomic_save.* 2>/dev/null | wc -l)
    check "exercises: the atomic_save checks remove their scratch folders" test "$scratch_after" -le "$scratch_before"
}

# last_line FILE: the verdict line.
last_line() { tail -n 1 "$1"; }

# starter_copy EX: the kept copy of EX's starter, tests/starters/NN_chapter/name.c (or .cu).
starter_copy() { ls "$ROOT"/tests/starters/"${1%%/*}"_*/"${1#*/}".c* 2>/dev/null | head -n 1; }

# mine_differs EX: the exercise file in the chapter is no longer the starter
# (the student is solving it): said once, as a SKIP, since it is theirs to check.
mine_differs() {
    local ex=$1 copy; copy=$(starter_copy "$ex")
    local mine; mine=$(ls "$ROOT"/"${ex%%/*}"_*/exercises/"${ex#*/}".c* 2>/dev/null | head -n 1)
    if [[ -n "$mine" && -n "$copy" ]] && ! cmp -s "$mine" "$copy"; then
        skip "exercises: your $ex" "${mine#"$ROOT"/} differs from the starter (solved, or in progress): make check-exercise EX=$ex checks it; here the starter as handed out is checked"
    fi
}

# starter EX REGEX: the starter compiles warning-free, fails, and explains.
starter() {
    local ex=$1 regex=$2 out="$TMP/starter_${1//\//_}" copy
    copy=$(starter_copy "$ex")
    if [[ -z "$copy" ]]; then fail "exercises: starter $ex fails its check and says why" "no copy of it in tests/starters/"; return; fi
    mine_differs "$ex"
    run_capture 180 "$out" "$check_ex" "$ex" --file "$copy"; local status=$?
    if grep -q 'exercises/.*warning:' "$out"; then
        fail "exercises: starter $ex compiles without warnings" "$(grep -m1 'exercises/.*warning:' "$out")"; return
    fi
    [[ $status -eq 1 ]] && last_line "$out" | grep -q '^NOT YET: ' && grep -Eq -- "$regex" "$out"
    verdict $? "exercises: starter $ex fails its check and says why" "status $status, wanted 1 and /$regex/; last line: $(last_line "$out")"
}

# solution EX: the reference solution passes, warning-free.
solution() {
    local ex=$1 out="$TMP/solution_${1//\//_}"
    if ! $have_solutions; then skip "exercises: solution $ex passes" "solutions/ is absent (a student copy of the course)"; return; fi
    run_capture 180 "$out" "$check_ex" "$ex" --solution; local status=$?
    [[ $status -eq 0 ]] && last_line "$out" | grep -q '^PASSED: ' && ! grep -Eq '(exercises|solutions)/.*warning:' "$out"
    verdict $? "exercises: solution $ex passes" "status $status; $(grep -m1 -E 'WRONG|warning:|error' "$out") | last line: $(last_line "$out")"
}

# broken EX NAME FILE REGEX: a broken version (FILE, written below) fails with REGEX.
broken() {
    local ex=$1 name=$2 file=$3 regex=$4 out="$TMP/broken_$2"
    run_capture 120 "$out" "$check_ex" "$ex" --file "$file"; local status=$?
    [[ $status -eq 1 ]] && last_line "$out" | grep -q '^NOT YET: ' && grep -Eq -- "$regex" "$out"
    verdict $? "exercises: $ex catches $name" "status $status, wanted 1 and /$regex/; last line: $(last_line "$out")"
}

# ---------------------------------------------------------------- starters and solutions
starter 01/sgd_step "dL/dw\[0\]: got 777, expected -23: it was never written"
solution 01/sgd_step
starter 02/pingpong "rank 0, element 0: got 1, expected 11: rank 0's buffer never changed"
solution 02/pingpong
starter 03/ring_allreduce "rank 0, element 0: got 1, expected 9 \(the sum over 2 rank\(s\)\); it holds rank 0's value once, rank 1's value 0 times"
solution 03/ring_allreduce
starter 04/average_gradients "rank 0, element 0: got 1, expected 1.5 .*it still holds this rank's own gradient"
solution 04/average_gradients
starter 04/sync_batchnorm "1 rank\(s\): rank 0, feature 0: mean 0, var 1; the whole batch has mean"
solution 04/sync_batchnorm
starter 05/epoch_loss "rank 0 returned 1, expected 1.71429 .*that is this rank's own mean"
solution 05/epoch_loss
starter 06/atomic_save "file left half-written: after a crash halfway through the writing"
solution 06/atomic_save
starter 07/global_rank "global_rank\(node 1, local rank 0\) = 0, expected 2 .*that is the local rank"
solution 07/global_rank
starter 08/layernorm_backward "dinp\[row 0, channel 0\]: got 0.5, .*dinp was not changed at all"
solution 08/layernorm_backward
starter 09/zero1_step "1 rank\(s\): rank 0, parameter 0 \(slice 0\): got 0, expected .*the parameters never changed"
solution 09/zero1_step
starter 10/row_parallel "1 rank\(s\): out\[row 0, output 0\] on rank 0: got 777, .*out was never written"
solution 10/row_parallel
starter 11/one_f_one_b "stage 0 ran F0 F1 F2 F3 B0 B1 B2 B3; 1F1B runs F0 F1 B0 F2 B1 F3 B2 B3 .*that is GPipe's memory"
solution 11/one_f_one_b
starter 12/merge_partials "partial attention to block A .*: got lse 777, .*out or lse was never written"
solution 12/merge_partials
starter 13/route "dropless: choices: token 0, choice 0: got expert -1, expected 1"
solution 13/route
starter 14/mesh "mesh 2 x 2 x 2 x 2 x 2, rank 1: got coordinates \\(pp 0, dp 0, ep 0, cp 0, tp 0\\), expected \\(0, 0, 0, 0, 1\\)"
solution 14/mesh

# The CUDA exercise: checked on a GPU; elsewhere compiled (CUDA build) or not
# even that (CPU-only build), and skipped with the reason the check gives.
cuda_case() {
    local variant=$1 want=$2 out="$TMP/cuda_$1"; shift 2
    run_capture 300 "$out" "$check_ex" 01/sgd_kernel "$@"; local status=$?
    local name="exercises: $variant 01/sgd_kernel fails its check"
    [[ $want == 0 ]] && name="exercises: $variant 01/sgd_kernel passes"
    if grep -Eq '(exercises|solutions)/.*warning:' "$out"; then
        fail "exercises: $variant 01/sgd_kernel compiles without warnings" "$(grep -m1 'warning:' "$out")"
    elif [[ $status -eq 77 ]]; then
        if grep -q 'compiled with nvcc' "$out"; then pass "exercises: $variant 01/sgd_kernel compiles with nvcc"; fi
        if has_gpu && grep -q 'compiled with nvcc' "$out"; then fail "$name" "a GPU is here, but: $(last_line "$out")"
        else skip "$name" "$(last_line "$out" | sed 's/^CANNOT CHECK HERE: //')"; fi
    else
        [[ $status -eq $want ]]; verdict $? "$name" "status $status, wanted $want; last line: $(last_line "$out")"
    fi
}
mine_differs 01/sgd_kernel
cuda_case starter 1 --file "$(starter_copy 01/sgd_kernel)"
if $have_solutions; then cuda_case solution 0 --solution
else skip "exercises: solution 01/sgd_kernel passes" "solutions/ is absent"; fi

# Everything below feeds the checks and the tool broken files on CPU ranks:
# the same host code in every build. CI's emulated-GPU pass and `make test`
# pass (CPU_PATHS=skip) stop here, having built every check in their own
# mode and run the CUDA exercise; its CPU-only pass runs the rest.
cpu_paths "exercises" || { leftovers; exit 0; }

# ---------------------------------------------------------------- the checks catch mistakes
cat >"$TMP/sgd_step.c" <<'EOF'
#include "exercises.h"
float mse_gradient(const float *x, const float *y, int batch, int features, const float *params, float *grads) {
    for (int j = 0; j <= features; j++) grads[j] = 0;
    double loss = 0;
    for (int i = 0; i < batch; i++) {
        float r = y[i] - params[features];   /* y - prediction: the sign is flipped */
        for (int j = 0; j < features; j++) r -= x[i * features + j] * params[j];
        loss += (double)r * r;
        for (int j = 0; j < features; j++) grads[j] += 2 * r * x[i * features + j] / batch;
        grads[features] += 2 * r / batch;
    }
    return (float)(loss / batch);
}
void sgd_update(float *params, const float *grads, int count, float lr) {
    for (int j = 0; j < count; j++) params[j] -= lr * grads[j];
}
EOF
broken 01/sgd_step "a flipped sign" "$TMP/sgd_step.c" "got 23, expected -23: the sign is flipped"

# Every rank receives first: nobody ever sends.
cat >"$TMP/ring_allreduce.c" <<'EOF'
#include "exercises.h"
void ring_all_reduce(pg_t *pg, float *buf, size_t count) {
    int world = pg_world_size(pg), rank = pg_rank(pg);
    if (world == 1 || count == 0) return;
    pg_recv(pg, buf, count, DTYPE_F32, (rank + world - 1) % world);
    pg_send(pg, buf, count, DTYPE_F32, (rank + 1) % world);
}
EOF
start=$(date +%s)
EXERCISE_DEADLINE=2 broken 03/ring_allreduce "a deadlock" "$TMP/ring_allreduce.c" \
    "deadlock: no result after 2 s; rank\(s\) [0-9, ]+ were still inside ring_all_reduce"
took=$(( $(date +%s) - start ))
(( took < 60 )); verdict $? "exercises: a deadlock is reported within a minute" "took $took s"

# The right sum, but every rank adds in its own order: not the same bytes.
cat >"$TMP/ring_allreduce.c" <<'EOF'
#include <stdlib.h>
#include "exercises.h"
void ring_all_reduce(pg_t *pg, float *buf, size_t count) {
    int world = pg_world_size(pg), rank = pg_rank(pg);
    float *all = malloc((size_t)world * (count ? count : 1) * sizeof(float));
    pg_request_t *sends[8];
    int n = 0;
    for (int p = 0; p < world; p++) if (p != rank) sends[n++] = pg_isend(pg, buf, count, DTYPE_F32, p);
    for (int p = 0; p < world; p++) if (p != rank) pg_recv(pg, all + (size_t)p * count, count, DTYPE_F32, p);
    for (int k = 0; k < n; k++) pg_wait(sends[k]);
    for (int s = 1; s < world; s++)
        for (size_t j = 0; j < count; j++) buf[j] += all[(size_t)((rank + s) % world) * count + j];
    free(all);
}
EOF
broken 03/ring_allreduce "sums that differ between ranks" "$TMP/ring_allreduce.c" \
    "element [0-9]+ is .* on rank [0-9] but .* on rank 0: the sums must be the same bytes on every rank"

cat >"$TMP/average_gradients.c" <<'EOF'
#include "exercises.h"
void average_gradients(pg_t *pg, float *grads, size_t count) {
    pg_all_reduce(pg, grads, grads, count, DTYPE_F32, OP_SUM);
}
EOF
broken 04/average_gradients "a sum instead of a mean" "$TMP/average_gradients.c" \
    "rank 0, element 0: got 3, expected 1.5 .*that is the SUM over the ranks; divide it by the world size"

# SyncBatchNorm: a rank's own statistics; E[x^2] for the variance; the
# backward pass's sums left local.
sbn() {   # SLUG NAME REGEX, with the C file's functions on stdin
    { echo '#include "exercises.h"'; cat; } >"$TMP/sync_batchnorm_$1.c"
    broken 04/sync_batchnorm "$2" "$TMP/sync_batchnorm_$1.c" "$3"
}
stats_local='int sync_batch_stats(pg_t *pg, const float *x, int n, int c, float *mean, float *var) {
    (void)pg;
    for (int j = 0; j < c; j++) {
        double s = 0, q = 0;
        for (int i = 0; i < n; i++) s += x[i * c + j], q += (double)x[i * c + j] * x[i * c + j];
        mean[j] = (float)(s / n), var[j] = (float)(q / n - s / n * s / n);
    }
    return n;
}'
sums_right='void sync_grad_sums(pg_t *pg, const float *g, const float *xhat, int n, int c, float *sum_g, float *sum_gx) {
    double s[64] = {0};
    for (int i = 0; i < n; i++)
        for (int j = 0; j < c; j++) s[j] += g[i * c + j], s[c + j] += (double)g[i * c + j] * xhat[i * c + j];
    pg_all_reduce(pg, s, s, (size_t)(2 * c), DTYPE_F64, OP_SUM);
    for (int j = 0; j < c; j++) sum_g[j] = (float)s[j], sum_gx[j] = (float)s[c + j];
}'
printf '%s\n%s\n' "$stats_local" "$sums_right" |
    sbn own "a rank's own statistics" "2 rank\(s\): rank 0, feature 0: .*these are this rank's own statistics; nothing was exchanged"
printf '%s\n%s\n' "$(sed 's|q / n - s / n \* s / n|q / n|' <<<"$stats_local")" "$sums_right" |
    sbn square "E[x^2] for the variance" "1 rank\(s\): rank 0, feature 0: .*that is E\[x\^2\]; subtract the mean squared"
stats_right=$(sed -n '/^int sync_batch_stats/,/^}/p' "$ROOT/solutions/04_ddp_spawn/sync_batchnorm.c" 2>/dev/null)
if [[ -n "$stats_right" ]]; then
    printf '%s\n%s\n' "$stats_right" "$(sed 's|    pg_all_reduce(pg, s, s, (size_t)(2 \* c), DTYPE_F64, OP_SUM);|    (void)pg;|' <<<"$sums_right")" |
        sbn local_sums "backward sums left local" "2 rank\(s\): the input gradient of row [0-9]+, feature [0-9]+ .*check sync_grad_sums"
else
    skip "exercises: 04/sync_batchnorm catches backward sums left local" "solutions/ is absent (a student copy of the course)"
fi

# Every rank waits for the others' numbers before sending its own: nobody sends.
cat >"$TMP/epoch_loss.c" <<'EOF'
#include "exercises.h"
double epoch_mean_loss(dist_t *d, double loss_sum, double batches) {
    double totals[2] = {loss_sum, batches}, theirs[2], mine[2] = {loss_sum, batches};
    for (int p = 0; p < d->world_size; p++) {
        if (p == d->rank) continue;
        pg_recv(d->pg, theirs, 2, DTYPE_F64, p);
        totals[0] += theirs[0];
        totals[1] += theirs[1];
    }
    for (int p = 0; p < d->world_size; p++)
        if (p != d->rank) pg_send(d->pg, mine, 2, DTYPE_F64, p);
    return totals[0] / totals[1];
}
EOF
EXERCISE_DEADLINE=2 broken 05/epoch_loss "a deadlock" "$TMP/epoch_loss.c" \
    "2 rank\(s\): deadlock: after 2 s rank\(s\) [0-9, ]+ were still inside epoch_mean_loss"

# Rank 0 alone all-reduces: the process group notices the mismatch.
cat >"$TMP/epoch_loss.c" <<'EOF'
#include "exercises.h"
double epoch_mean_loss(dist_t *d, double loss_sum, double batches) {
    double totals[2] = {loss_sum, batches};
    if (d->rank == 0) dist_all_reduce_host(d, totals, 2, OP_SUM);
    return totals[0] / totals[1];
}
EOF
broken 05/epoch_loss "an all-reduce on rank 0 only" "$TMP/epoch_loss.c" \
    "2 rank\(s\): rank\(s\) 0 stopped inside epoch_mean_loss while rank\(s\) 1 had returned from it"

# Atomic, but without the directory fsync, and deaf to a failing fsync.
cat >"$TMP/atomic_save.c" <<'EOF'
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "exercises.h"
bool atomic_save(const char *path, const void *data, size_t bytes, char *err, size_t errlen) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { snprintf(err, errlen, "cannot create %s", tmp); return false; }
    const char *p = data;
    while (bytes > 0) {
        ssize_t w = write(fd, p, bytes);
        if (w <= 0) { snprintf(err, errlen, "cannot write %s", tmp); close(fd); unlink(tmp); return false; }
        p += w; bytes -= (size_t)w;
    }
    fsync(fd);
    close(fd);
    return rename(tmp, path) == 0;
}
EOF
broken 06/atomic_save "a missing directory fsync" "$TMP/atomic_save.c" "the directory was not fsynced after the rename"
broken 06/atomic_save "an ignored fsync failure" "$TMP/atomic_save.c" "fsync\(\) failing with EIO: atomic_save returned true"

cat >"$TMP/global_rank.c" <<'EOF'
#include "exercises.h"
int global_rank(int node_rank, int local_rank, const int *nproc_per_node, int nnodes) {
    (void)nnodes;
    return node_rank * nproc_per_node[node_rank] + local_rank;
}
void rank_location(int rank, const int *nproc_per_node, int nnodes, int *node_rank, int *local_rank) {
    (void)nnodes;
    *node_rank = rank / nproc_per_node[0];
    *local_rank = rank % nproc_per_node[0];
}
EOF
broken 07/global_rank "equal-sized nodes assumed" "$TMP/global_rank.c" \
    "global_rank\(node 1, local rank 0\) = 3, expected 2 .*add up the counts of the nodes BEFORE this one"

cat >"$TMP/layernorm_backward.c" <<'EOF'
#include "exercises.h"
void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, const float *mean, const float *rstd, int N, int C) {
    for (int n = 0; n < N; n++) {
        float gm = 0, gxm = 0;
        for (int c = 0; c < C; c++) {
            float xhat = (inp[n * C + c] - mean[n]) * rstd[n], g = dout[n * C + c] * weight[c];
            gm += g / C;
            gxm += g * xhat / C;
            dweight[c] += dout[n * C + c] * xhat;
            dbias[c] += dout[n * C + c];
        }
        for (int c = 0; c < C; c++) {   /* = instead of +=: the residual stream's gradient is lost */
            float xhat = (inp[n * C + c] - mean[n]) * rstd[n];
            dinp[n * C + c] = rstd[n] * (dout[n * C + c] * weight[c] - gm - xhat * gxm);
        }
    }
}
EOF
broken 08/layernorm_backward "an overwritten dinp" "$TMP/layernorm_backward.c" "it REPLACED dinp's old contents: add it"

# ZeRO-1 with a sum where the mean belongs: Adam's step hides it, its moments do not.
if $have_solutions; then
    sed 's/OP_AVG/OP_SUM/' "$ROOT/solutions/09_zero_fsdp/zero1_step.c" >"$TMP/zero1_step.c"
    broken 09/zero1_step "a sum instead of a mean" "$TMP/zero1_step.c" "N and N\^2 times too large, the moments of the SUM"
fi
# The bias added on every rank before the sum: it counts once per rank.
if $have_solutions; then
    sed -e 's/out\[n \* OC + o\] = s;/out[n * OC + o] = s + bias[o];/' -e 's/out\[n \* OC + o\] += bias\[o\];/out[n * OC + o] += 0;/' \
        "$ROOT/solutions/10_tensor_parallel/row_parallel.c" >"$TMP/row_parallel.c"
    broken 10/row_parallel "a bias added before the sum" "$TMP/row_parallel.c" \
        "2 rank\(s\): out\[row 0, output 0\] on rank 0: got .*the bias was added on every rank BEFORE the sum"
else skip "exercises: 10/row_parallel catches a bias added before the sum" "solutions/ is absent (the broken version is made from it)"; fi
# An all-reduce in the backward pass, where nothing needs one.
if $have_solutions; then
    awk '/^    \(void\)tp;$/ { next } { print } /dinp\[n \* Ks \+ k\] = s;/ { getline; print
         print "    pg_all_reduce(tp, dinp, dinp, (size_t)N * Ks, DTYPE_F32, OP_SUM);" }' \
        "$ROOT/solutions/10_tensor_parallel/row_parallel.c" >"$TMP/row_parallel.c"
    broken 10/row_parallel "an input gradient summed over the ranks" "$TMP/row_parallel.c" \
        "dinp\[row 0, channel 0\] on rank 0: got .*dinp was summed over the ranks"
else skip "exercises: 10/row_parallel catches an input gradient summed over the ranks" "solutions/ is absent (the broken version is made from it)"; fi
# Ring attention's merge and partials, with the usual slips: partial
# results added without rescaling, the diagonal block's causal mask
# forgotten, positions taken as local, and the empty side's NaN.
if $have_solutions; then
    sol="$ROOT/solutions/12_context_parallel/merge_partials.c"
    sed 's|out\[i \* hs + c\] = (wa \* out\[i \* hs + c\] + wb \* out_b\[i \* hs + c\]) / sum;|out[i * hs + c] = out[i * hs + c] + out_b[i * hs + c] + 0 * wa * wb * sum;|' \
        "$sol" >"$TMP/merge_sum.c"
    broken 12/merge_partials "partial results added without rescaling" "$TMP/merge_sum.c" "the partial results were ADDED"
    sed 's|if (kpos\[j\] > qpos\[i\]) continue;.*|(void)kpos;|' "$sol" >"$TMP/merge_nomask.c"
    broken 12/merge_partials "the diagonal block's causal mask forgotten" "$TMP/merge_nomask.c" \
        "block B .*the causal mask is forgotten"
    sed 's|kpos\[j\] > qpos\[i\]|j > i|g' "$sol" >"$TMP/merge_local.c"
    broken 12/merge_partials "positions taken as local" "$TMP/merge_local.c" "places in the BLOCK \(j <= i\)"
    awk '/if \(lse_b\[i\] == -INFINITY\) continue;/ { next } /if \(lse\[i\] == -INFINITY\) \{/ { skip = 1 }
         skip { if ($0 ~ /^        }$/) skip = 0; next } { print }' "$sol" >"$TMP/merge_nan.c"
    broken 12/merge_partials "NaN from an empty side" "$TMP/merge_nan.c" "NaN: a block whose lse is -INFINITY"
else skip "exercises: 12/merge_partials catches its slips" "solutions/ is absent (the broken versions are made from it)"; fi
# Chapter 13's usual slips in top-k routing with capacity, each named.
if $have_solutions; then
    sol="$ROOT/solutions/13_expert_parallel/route.c"
    sed 's|(float)(p\[ch\[k\]\] / sum)|p[ch[k]]|' "$sol" >"$TMP/route.c"
    broken 13/route "gates not renormalised" "$TMP/route.c" "gates not renormalised: they are the probabilities"
    sed 's|int g = (n / T) % G, e = choice|int g = n * G / N, e = choice|' "$sol" >"$TMP/route.c"
    broken 13/route "capacity counted over the wrong tokens" "$TMP/route.c" "capacity counted over contiguous blocks of sequences"
    sed 's|        memcpy(o, res + (size_t)n \* C, sizeof(float) \* (size_t)C);|        memset(o, 0, sizeof(float) * (size_t)C); if (kept[(size_t)n * K]) memcpy(o, res + (size_t)n * C, sizeof(float) * (size_t)C);|' \
        "$sol" >"$TMP/route.c"
    broken 13/route "dropped tokens losing their residual" "$TMP/route.c" "whose every choice was dropped, left without its residual stream"
else skip "exercises: 13/route catches the usual slips" "solutions/ is absent (the broken versions are made from it)"; fi
# 1F1B with its steady state unpaired: a send, then a receive, on both
# neighbours at once. The check's sends wait for their receiver, as NCCL's.
cat >"$TMP/one_f_one_b.c" <<'EOF'
#include "exercises.h"
void one_f_one_b(pipe_stage *p, int stage, int stages, int micro_batches) {
    int M = micro_batches, warmup = stages - stage - 1 < M ? stages - stage - 1 : M;
    for (int i = 0; i < warmup; i++) { recv_forward(p, i); forward(p, i); send_forward(p, i); }
    for (int j = 0; j < M - warmup; j++) {
        recv_forward(p, warmup + j); forward(p, warmup + j); send_forward(p, warmup + j);
        recv_backward(p, j); backward(p, j); send_backward(p, j);
    }
    for (int i = M - warmup; i < M; i++) { recv_backward(p, i); backward(p, i); send_backward(p, i); }
}
EOF
broken 11/one_f_one_b "a deadlock (sends not paired with receives)" "$TMP/one_f_one_b.c" \
    "deadlock: stage 0 waits in send_forward\(1\); stage 1 waits in send_backward\(0\)"
# One forward too many in the warm-up: the order, and the memory, are not 1F1B's.
sed 's/stages - stage - 1 < M ? stages - stage - 1 : M/stages - stage < M ? stages - stage : M/' \
    "$ROOT/solutions/11_pipeline_parallel/one_f_one_b.c" >"$TMP/one_f_one_b.c"
if $have_solutions; then
    broken 11/one_f_one_b "a warm-up one forward too long" "$TMP/one_f_one_b.c" \
        "stage 0 ran F0 F1 F2 B0 F3 B1 B2 B3; 1F1B runs F0 F1 B0 F2 B1 F3 B2 B3 \(it held 3 micro-batches at once, 1F1B at most S - s = 2\)"
else skip "exercises: 11/one_f_one_b catches a warm-up one forward too long" "solutions/ is absent (the broken version is made from it)"; fi

# ---------------------------------------------------------------- the tool itself
run_capture 30 "$TMP/bad_name" "$check_ex" 03/no_such_exercise; status=$?
[[ $status -eq 2 ]] && grep -q "there is no exercise '03/no_such_exercise'" "$TMP/bad_name" && grep -q '03/ring_allreduce' "$TMP/bad_name"
verdict $? "exercises: an unknown exercise is refused with the list (exit 2)" "status $status: $(head -n 1 "$TMP/bad_name")"

printf '#include "exercises.h"\nint global_rank(int node_rank) { return node_rank }\n' >"$TMP/global_rank.c"
broken 07/global_rank "a compile error" "$TMP/global_rank.c" "NOT YET: global_rank.c does not compile; the compiler's messages are above"

cat >"$TMP/global_rank.c" <<'EOF'
#include "exercises.h"
int global_rank(int node_rank, int local_rank, const int *nproc_per_node, int nnodes) {
    int before = 0;
    for (int n = 0; n < node_rank; n += 0) before += nproc_per_node[n % nnodes];   /* never ends */
    return before + local_rank;
}
void rank_location(int rank, const int *nproc_per_node, int nnodes, int *node_rank, int *local_rank) {
    (void)rank; (void)nproc_per_node; (void)nnodes; (void)node_rank; (void)local_rank;
}
EOF
EXERCISE_TIME_LIMIT=3 broken 07/global_rank "an endless loop" "$TMP/global_rank.c" "the check got no answer within 3 s"

cat >"$TMP/global_rank.c" <<'EOF'
#include <stddef.h>
#include "exercises.h"
int global_rank(int node_rank, int local_rank, const int *nproc_per_node, int nnodes) {
    (void)nproc_per_node; (void)nnodes;
    return node_rank + local_rank;
}
void rank_location(int rank, const int *nproc_per_node, int nnodes, int *node_rank, int *local_rank) {
    (void)rank; (void)nproc_per_node; (void)nnodes; (void)local_rank;
    int *nowhere = NULL;
    *node_rank = *nowhere;
}
EOF
broken 07/global_rank "a crash" "$TMP/global_rank.c" \
    "the check crashed with signal SEGV|the check stopped \\(status 1\\) before its verdict: your code crashed"

run_capture 120 "$TMP/make_target" make -s -C "$ROOT" check-exercise EX=07/global_rank SOLUTION=1; status=$?
if ! $have_solutions; then skip "exercises: make check-exercise EX=07/global_rank SOLUTION=1" "solutions/ is absent"
else
    [[ $status -eq 0 ]] && last_line "$TMP/make_target" | grep -q '^PASSED: '
    verdict $? "exercises: make check-exercise EX=07/global_rank SOLUTION=1 passes" "status $status: $(last_line "$TMP/make_target")"
fi

# The finale's mesh with pp read as the fastest dimension (the order of
# another chapter's groups), and a group that lets a held dimension vary.
if $have_solutions; then
    sol="$ROOT/solutions/14_five_dimensions/mesh.c"
    sed 's|for (int d = MESH_DIMS - 1; d >= 0; d--) { // tp is the lowest digit|for (int d = 0; d < MESH_DIMS; d++) {|' \
        "$sol" >"$TMP/mesh_order.c"
    broken 14/mesh "pp read as the fastest dimension" "$TMP/mesh_order.c" "that is pp read as the fastest dimension"
    sed 's|if (!(dims \& (1u << d)) \&\& c\[d\] != mine\[d\]) same = 0;|if (d != MESH_PP \&\& !(dims \& (1u << d)) \&\& c[d] != mine[d]) same = 0;|' \
        "$sol" >"$TMP/mesh_loose.c"
    broken 14/mesh "a group that varies pp too" "$TMP/mesh_loose.c" "differs in a dimension outside the group"
else skip "exercises: 14/mesh catches its slips" "solutions/ is absent (the broken versions are made from it)"; fi

leftovers
