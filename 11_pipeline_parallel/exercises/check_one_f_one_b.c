// check_one_f_one_b.c - checks exercise 11/one_f_one_b.
//
// Run it with `make check-exercise EX=11/one_f_one_b` from the top folder.
// For pipelines of S stages and M micro-batches it starts one thread per
// stage, each calling your one_f_one_b, and implements the calls of
// exercises.h on a small model: stage s multiplies its input by a weight
// w_s, the last stage's loss is (y - t)^2 / 2 per micro-batch, and the
// gradient of w_s is known exactly. Messages behave as NCCL's do: a send
// completes when its receiver receives (both have posted), so a loop in
// which two neighbours both send first deadlocks - and the check says
// which stages wait for what, instead of hanging. Then it compares, per
// stage, the gradients with the sequential computation and the order of
// forward (F) and backward (B) passes with 1F1B's, which holds at most
// S - s micro-batches at once.
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exercise_check.h"
#include "exercises.h"

enum { MAX_STAGES = 4, MAX_MICRO = 8, ORDER_CHARS = 4 * 2 * MAX_MICRO + 1 };

struct pipe_stage {
    int s;                                   // this stage
    double w, dw;                            // its weight and the gradient it added up
    double in[MAX_MICRO], out[MAX_MICRO];    // activations entering / leaving, per micro-batch
    double grad_in[MAX_MICRO], grad_out[MAX_MICRO];
    bool have_in[MAX_MICRO], have_grad[MAX_MICRO], done_f[MAX_MICRO], done_b[MAX_MICRO];
    int held, most_held, forwards, backwards;
    char order[ORDER_CHARS];                 // "F0 F1 B0 ..."
    char problem[300];                       // the first misuse this stage made
    // Communication: what this stage has posted and is waiting for.
    int outstanding;                         // posted operations not yet matched
    bool waiting, finished;
    char waits_for[160];
};

// A posted operation: a send (value) or a receive (into *dst), keyed by who
// sends to whom, what (activation or gradient) and which micro-batch.
typedef struct {
    bool used, is_send;
    int from, to, micro;
    char what;                               // 'A' activation, 'G' gradient
    double value, *dst;
    bool *arrived;                           // the receiver's flag
} posted_op;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t moved;
    int S, M;
    struct pipe_stage stage[MAX_STAGES];
    posted_op ops[4 * MAX_STAGES];
    bool deadlock;
    char deadlock_text[800];
} net = {.lock = PTHREAD_MUTEX_INITIALIZER, .moved = PTHREAD_COND_INITIALIZER};

static double input_of(int i) { return 1.0 + 0.25 * i; }
static double target_of(int i) { return 0.5 - 0.125 * i; }
static double weight_of(int s) { return 0.75 + 0.125 * s; }

// The first call that broke the rules on this stage, for the verdict.
__attribute__((format(printf, 2, 3)))
static void misuse(struct pipe_stage *p, const char *fmt, ...) {
    if (p->problem[0]) return;
    int n = snprintf(p->problem, sizeof p->problem, "stage %d: ", p->s);
    va_list args;
    va_start(args, fmt);
    vsnprintf(p->problem + n, sizeof p->problem - (size_t)n, fmt, args);
    va_end(args);
}

static void note(struct pipe_stage *p, char kind, int micro) {
    size_t n = strlen(p->order);
    snprintf(p->order + n, sizeof p->order - n, "%s%c%d", n ? " " : "", kind, micro);
}

static bool valid_micro(struct pipe_stage *p, int micro, const char *call) {
    if (micro >= 0 && micro < net.M) return true;
    misuse(p, "%s(%d) names no micro-batch (there are %d)", call, micro, net.M);
    return false;
}

// ---------------------------------------------------------------- the model
void forward(pipe_stage *p, int i) {
    pthread_mutex_lock(&net.lock);
    if (valid_micro(p, i, "forward")) {
        if (p->done_f[i]) misuse(p, "forward(%d) ran twice", i);
        else if (p->s > 0 && !p->have_in[i]) misuse(p, "forward(%d) before its input arrived (recv_forward(%d))", i, i);
        p->out[i] = p->w * (p->s == 0 ? input_of(i) : p->in[i]);
        if (p->s == 0) p->in[i] = input_of(i);
        p->done_f[i] = true, p->forwards++;
        if (++p->held > p->most_held) p->most_held = p->held;
        note(p, 'F', i);
    }
    pthread_mutex_unlock(&net.lock);
}

void backward(pipe_stage *p, int i) {
    pthread_mutex_lock(&net.lock);
    if (valid_micro(p, i, "backward")) {
        bool last = p->s == net.S - 1;
        if (!p->done_f[i]) misuse(p, "backward(%d) before forward(%d)", i, i);
        else if (p->done_b[i]) misuse(p, "backward(%d) ran twice", i);
        else if (!last && !p->have_grad[i]) misuse(p, "backward(%d) before its gradient arrived (recv_backward(%d))", i, i);
        // d(loss)/d(out): from the loss (the mean over micro-batches) or from the next stage.
        double g = last ? (p->out[i] - target_of(i)) / net.M : p->grad_out[i];
        p->dw += g * p->in[i];
        p->grad_in[i] = g * p->w;
        p->done_b[i] = true, p->backwards++, p->held--;
        note(p, 'B', i);
    }
    pthread_mutex_unlock(&net.lock);
}

// ---------------------------------------------------------------- messages (rendezvous)

// Every stage still in your function is waiting, and none has a matched
// operation: nobody can move again. Called with the lock held.
static bool everyone_stuck(void) {
    for (int s = 0; s < net.S; s++)
        if (!net.stage[s].finished && !(net.stage[s].waiting && net.stage[s].outstanding > 0)) return false;
    return true;
}

static void describe_deadlock(void) {
    size_t n = (size_t)snprintf(net.deadlock_text, sizeof net.deadlock_text, "deadlock:");
    for (int s = 0; s < net.S && n < sizeof net.deadlock_text; s++)
        if (!net.stage[s].finished)
            n += (size_t)snprintf(net.deadlock_text + n, sizeof net.deadlock_text - n, " stage %d waits in %s;", s,
                                  net.stage[s].waits_for);
}

// Posts one operation; if its partner is posted already, both complete.
static void post(struct pipe_stage *p, bool is_send, int peer, char what, int micro, double value, double *dst,
                 bool *arrived) {
    int from = is_send ? p->s : peer, to = is_send ? peer : p->s;
    for (size_t k = 0; k < sizeof net.ops / sizeof net.ops[0]; k++) {
        posted_op *o = &net.ops[k];
        if (!o->used || o->is_send == is_send || o->from != from || o->to != to || o->what != what) continue;
        if (o->micro != micro) continue;
        const posted_op *send = is_send ? NULL : o;
        double v = is_send ? value : send->value;
        double *into = is_send ? o->dst : dst;
        bool *flag = is_send ? o->arrived : arrived;
        *into = v, *flag = true;
        o->used = false;
        net.stage[peer].outstanding--;
        pthread_cond_broadcast(&net.moved);
        return;
    }
    for (size_t k = 0; k < sizeof net.ops / sizeof net.ops[0]; k++)
        if (!net.ops[k].used) {
            net.ops[k] = (posted_op){true, is_send, from, to, micro, what, value, dst, arrived};
            p->outstanding++;
            return;
        }
    die("check_one_f_one_b: too many operations posted at once");
}

// Waits until everything this stage posted has been matched.
static void wait_all(struct pipe_stage *p) {
    p->waiting = true;
    while (p->outstanding > 0 && !net.deadlock) {
        if (everyone_stuck()) {
            net.deadlock = true;
            describe_deadlock();
            pthread_cond_broadcast(&net.moved);
            break;
        }
        pthread_cond_wait(&net.moved, &net.lock);
    }
    p->waiting = false;
}

// One call of exercises.h: up to one send and one receive, posted together.
static void exchange(pipe_stage *p, const char *call, int send_kind, int send_micro, int recv_kind, int recv_micro) {
    pthread_mutex_lock(&net.lock);
    bool ok = true;
    if (send_kind && !valid_micro(p, send_micro, call)) ok = false;
    if (recv_kind && !valid_micro(p, recv_micro, call)) ok = false;
    if (send_kind && recv_kind) snprintf(p->waits_for, sizeof p->waits_for, "%s(%d, %d)", call, send_micro, recv_micro);
    else snprintf(p->waits_for, sizeof p->waits_for, "%s(%d)", call, send_kind ? send_micro : recv_micro);
    if (ok && !net.deadlock) {
        // send_kind 'A': output to s+1; 'G': input gradient to s-1. recv_kind likewise.
        if (send_kind == 'A' && p->s < net.S - 1) {
            if (!p->done_f[send_micro]) misuse(p, "%s sends micro-batch %d before forward(%d)", call, send_micro, send_micro);
            post(p, true, p->s + 1, 'A', send_micro, p->out[send_micro], NULL, NULL);
        }
        if (send_kind == 'G' && p->s > 0) {
            if (!p->done_b[send_micro]) misuse(p, "%s sends micro-batch %d before backward(%d)", call, send_micro, send_micro);
            post(p, true, p->s - 1, 'G', send_micro, p->grad_in[send_micro], NULL, NULL);
        }
        if (recv_kind == 'A' && p->s > 0)
            post(p, false, p->s - 1, 'A', recv_micro, 0, &p->in[recv_micro], &p->have_in[recv_micro]);
        if (recv_kind == 'G' && p->s < net.S - 1)
            post(p, false, p->s + 1, 'G', recv_micro, 0, &p->grad_out[recv_micro], &p->have_grad[recv_micro]);
        wait_all(p);
    }
    pthread_mutex_unlock(&net.lock);
}

void recv_forward(pipe_stage *p, int i) { exchange(p, "recv_forward", 0, 0, 'A', i); }
void send_forward(pipe_stage *p, int i) { exchange(p, "send_forward", 'A', i, 0, 0); }
void recv_backward(pipe_stage *p, int i) { exchange(p, "recv_backward", 0, 0, 'G', i); }
void send_backward(pipe_stage *p, int i) { exchange(p, "send_backward", 'G', i, 0, 0); }
void send_forward_recv_backward(pipe_stage *p, int send_micro, int recv_micro) {
    exchange(p, "send_forward_recv_backward", 'A', send_micro, 'G', recv_micro);
}
void send_backward_recv_forward(pipe_stage *p, int send_micro, int recv_micro) {
    exchange(p, "send_backward_recv_forward", 'G', send_micro, 'A', recv_micro);
}

// ---------------------------------------------------------------- a case

static void *run_stage(void *arg) {
    struct pipe_stage *p = arg;
    one_f_one_b(p, p->s, net.S, net.M);
    pthread_mutex_lock(&net.lock);
    p->finished = true;
    pthread_cond_broadcast(&net.moved); // those waiting for this stage see that it has gone
    pthread_mutex_unlock(&net.lock);
    return NULL;
}

// 1F1B's order on stage s, as 11_pipeline_parallel.c's schedule_1f1b runs it.
static void reference_order(int s, int S, int M, char *out, size_t size) {
    int warmup = S - s - 1 < M ? S - s - 1 : M, n = 0;
    out[0] = '\0';
#define ADD(k, i) n += snprintf(out + n, size - (size_t)n, "%s%c%d", n ? " " : "", k, i)
    for (int i = 0; i < warmup; i++) ADD('F', i);
    for (int j = 0; j < M - warmup; j++) ADD('F', warmup + j), ADD('B', j);
    for (int b = M - warmup; b < M; b++) ADD('B', b);
#undef ADD
}

static void check_case(int S, int M) {
    memset(net.stage, 0, sizeof net.stage);
    memset(net.ops, 0, sizeof net.ops);
    net.S = S, net.M = M, net.deadlock = false;
    pthread_t threads[MAX_STAGES];
    for (int s = 0; s < S; s++) {
        net.stage[s].s = s, net.stage[s].w = weight_of(s);
        if (pthread_create(&threads[s], NULL, run_stage, &net.stage[s]) != 0) die("pthread_create failed");
    }
    for (int s = 0; s < S; s++) pthread_join(threads[s], NULL);
    char name[64];
    snprintf(name, sizeof name, "%d stage(s) x %d micro-batches", S, M);
    if (net.deadlock) {
        verdict(false, "%s: %s (a send completes only when its receiver receives that micro-batch: post the send with the receive it waits for, in one paired call)", name, net.deadlock_text);
        return;
    }
    for (int s = 0; s < S; s++) {
        struct pipe_stage *p = &net.stage[s];
        if (p->problem[0]) {
            verdict(false, "%s: %s", name, p->problem);
            return;
        }
        if (p->forwards != M || p->backwards != M) {
            verdict(false, "%s: stage %d ran %d forward and %d backward passes, not %d of each", name, s, p->forwards,
                    p->backwards, M);
            return;
        }
    }
    // The gradients: the sequential computation, micro-batch by micro-batch.
    double want[MAX_STAGES] = {0};
    for (int i = 0; i < M; i++) {
        double act[MAX_STAGES + 1];
        act[0] = input_of(i);
        for (int s = 0; s < S; s++) act[s + 1] = weight_of(s) * act[s];
        double g = (act[S] - target_of(i)) / M;
        for (int s = S - 1; s >= 0; s--) want[s] += g * act[s], g *= weight_of(s);
    }
    for (int s = 0; s < S; s++)
        if (fabs(net.stage[s].dw - want[s]) > 1e-12 * (1 + fabs(want[s]))) {
            verdict(false, "%s: stage %d's gradient is %.6f, the sequential computation's %.6f", name, s,
                    net.stage[s].dw, want[s]);
            return;
        }
    verdict(true, "%s: no deadlock, every message for the right micro-batch, the gradients of the sequential "
            "computation", name);
    for (int s = 0; s < S; s++) {
        char ref[ORDER_CHARS];
        reference_order(s, S, M, ref, sizeof ref);
        const struct pipe_stage *p = &net.stage[s];
        int most = S - s < M ? S - s : M;
        if (strcmp(p->order, ref) != 0) {
            verdict(false, "%s: stage %d ran %s; 1F1B runs %s (it held %d micro-batches at once, 1F1B at most S - s = "
                    "%d%s)", name, s, p->order, ref, p->most_held, most,
                    p->most_held == M && M > most ? ": that is GPipe's memory" : "");
            return;
        }
    }
    verdict(true, "%s: every stage ran 1F1B's order, holding at most S - s micro-batches", name);
}

int main(void) {
    printf("check 11/one_f_one_b: one stage's loop under the 1F1B schedule (one_f_one_b.c)\n");
    int cases[][2] = {{2, 4}, {4, 8}, {4, 2}, {3, 3}, {1, 3}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) check_case(cases[k][0], cases[k][1]);
    return check_finish("every stage runs 1F1B's order without deadlock, holds at most S - s micro-batches, and "
                        "the gradients are the sequential computation's");
}
