// fault.h - planned failures: how chapters 06-08 show that a job survives a
// crash, and how the tests prove it.
//
// A real crash comes when it likes; a lesson and a test need one at a step
// they choose: rank R dies at global step S, by exit(3) or SIGKILL, in the
// first N attempts only (so that a restarted job can finish). Chapters 06
// and 07 call fault_maybe_die right after the backward pass and before the
// gradients are averaged, 08 before each step: the other ranks are then
// waiting in the all-reduce of step S, as after a real crash. The plan comes
// from --fail_rank R --fail_step S --fail_mode exit|kill --fail_attempts N
// (fault_add_flags), or from the variables COURSE_FAIL_RANK,
// COURSE_FAIL_STEP, COURSE_FAIL_MODE, COURSE_FAIL_ATTEMPTS (fault_from_env).
// The training code itself (ddp.h, the models) holds no test hooks.
#ifndef COURSE_FAULT_H
#define COURSE_FAULT_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dist.h"
#include "flags.h"
#include "launch_env.h"

typedef struct {
    int rank, step, attempts;   // rank `rank` dies at global step `step` (-1: none) in attempts 0..attempts-1
    const char *mode;           // "exit" or "kill"
} fault_plan;

static inline fault_plan fault_none(void) { return (fault_plan){-1, -1, 1, "exit"}; }

// Adds the four flags of a fault plan to a program's flags (each can also
// be set by its COURSE_FAIL_* variable).
static inline void fault_add_flags(flag_set *set, fault_plan *f) {
    flag_int(set, "fail_rank", &f->rank, -1, 1000000, "fault injection: this rank dies... (-1: none)")->env = "COURSE_FAIL_RANK";
    flag_int(set, "fail_step", &f->step, -1, 1000000000, "...at this global step")->env = "COURSE_FAIL_STEP";
    flag_choice(set, "fail_mode", &f->mode, "exit|kill", "...by exit(3) or SIGKILL")->env = "COURSE_FAIL_MODE";
    flag_int(set, "fail_attempts", &f->attempts, 0, 1000000, "...in the first N attempts (restarts) only")->env = "COURSE_FAIL_ATTEMPTS";
}

// The plan the COURSE_FAIL_* variables describe, for a program without the
// flags (chapter 08).
static inline fault_plan fault_from_env(void) {
    fault_plan f = fault_none();
    f.rank = launch_env_int("COURSE_FAIL_RANK", -1);
    f.step = launch_env_int("COURSE_FAIL_STEP", -1);
    f.attempts = launch_env_int("COURSE_FAIL_ATTEMPTS", 1);
    const char *mode = getenv("COURSE_FAIL_MODE");
    if (mode && mode[0] && strcmp(mode, "exit") && strcmp(mode, "kill"))
        die("COURSE_FAIL_MODE must be exit or kill, got '%s'", mode);
    if (mode && mode[0]) f.mode = mode;
    return f;
}

// Dies here if the plan says so: this rank, this step, an early attempt.
static inline void fault_maybe_die(const fault_plan *f, const dist_t *d, int64_t global_step) {
    if (d->rank != f->rank || global_step != f->step) return;
    if (d->env.restart_count >= f->attempts) return;
    bool kill = !strcmp(f->mode, "kill");
    fprintf(stderr, "fault injection: rank %d on node %d dies at step %lld by %s (attempt %d)\n", d->rank,
            d->env.group_rank, (long long)global_step, kill ? "SIGKILL" : "exit(3)", d->env.restart_count);
    fflush(NULL);
    if (kill) raise(SIGKILL);
    exit(3);
}

#endif
