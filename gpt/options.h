// options.h - the flags of the GPT chapters (08 and every chapter after it).
//
// Chapter 08 defines what training a GPT takes: the data, the model's size,
// the optimizer, the device, the precision, how gradients travel. Every
// later chapter keeps all of it - a flag learned in 08 means the same in
// 09-14 - and adds the flags of its own idea. So the options are one struct
// for every chapter: 08's fields, the sizes of the mesh's dimensions, and
// the few fields that one chapter's idea adds (the finale, which composes
// them all, has every one). A chapter registers 08's flags with
// options_add_flags, then its own, then calls options_finish:
//
//   options o = options_defaults(CHAPTER);
//   flag_set set = {.program = CHAPTER, .summary = "..."};
//   options_add_flags(&set, &o);                  // 08's
//   options_add_mesh_flags(&set, &o, "dp tp");    // chapter 10's dimensions
//   flags_parse(&set, argc, argv);
//   options_finish(&o, &set);
#ifndef GPT_OPTIONS_H
#define GPT_OPTIONS_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "files.h"
#include "flags.h"
#include "gpt_layout.h"
#include "plan.h"

typedef struct {
    // Chapter 08's: training, data, model, device and communication.
    int epochs, batch_size, grad_accum, max_steps, warmup_steps, eval_every, log_every, save_every, seed;
    int vocab_size, block_size, n_layer, n_head, n_embd;
    double lr, min_lr, weight_decay, grad_clip, temperature, loss_scale;
    int top_k, num_samples, sample_tokens, nprocs, num_workers, powersgd_rank;
    double timeout;
    const char *backend;
    bool generate, verify_data, cuda_graph, plan;
    const char *preset, *data_dir, *out_dir, *snapshot_path, *prompt, *device, *precision, *grad_compress;
    // The mesh (common/groups.h): the size of each dimension; 0 for dp
    // means "the ranks left over" (--nprocs / the others' product).
    int dp, tp, pp, cp, ep;
    // One chapter's idea each: 09's ZeRO stage, its replicas (hybrid
    // sharding) and --consolidate, 10's replica checks, 11's schedule (and
    // the layers it added so that every stage has one), 12's attention
    // across the cp ranks and the tokens each holds.
    int shard, replicate, check_every;
    bool consolidate, layers_for_stages;
    const char *schedule, *cp_attention, *cp_balance;
    // 13's mixture of experts (gpt_config's fields of the same names; 0 experts: the dense MLP).
    int n_expert, moe_top_k, capacity_groups;
    double capacity_factor, aux_loss_coef;
} options;

// 08's defaults; out_dir is runs/CHAPTER (common/files.h).
static inline options options_defaults(const char *chapter) {
    options o = {.epochs = 1, .batch_size = 8, .grad_accum = 1, .max_steps = 0, .warmup_steps = 100,
                 .eval_every = 1000, .log_every = 10, .save_every = 0, .seed = 1337, .vocab_size = 5000,
                 .lr = 1e-3, .min_lr = -1, .weight_decay = 0.1, .grad_clip = 1.0, .temperature = 0.8,
                 .top_k = 40, .num_samples = 3, .sample_tokens = 64, .verify_data = true, .cuda_graph = true,
                 .preset = "default", .prompt = "The", .device = "auto", .nprocs = 0, .backend = "auto",
                 .precision = "auto", .grad_compress = "none", .num_workers = 0, .loss_scale = 65536,
                 .powersgd_rank = 1, .dp = 0, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .shard = 0, .replicate = 1,
                 .schedule = "1f1b", .cp_attention = "ring", .cp_balance = "zigzag", .moe_top_k = 2,
                 .capacity_groups = 1, .aux_loss_coef = 0.01};
    static char default_out_dir[1024]; // outlives this function: o.out_dir points at it
    files_runs_dir(default_out_dir, sizeof default_out_dir, chapter);
    o.out_dir = default_out_dir;
    return o;
}

// Chapter 08's flags, in the order its --help lists them.
static inline void options_add_flags(flag_set *set, options *o) {
    flag_int(set, "epochs", &o->epochs, 1, 1000, "passes over the training split");
    flag_int(set, "batch_size", &o->batch_size, 1, 4096, "sequences per micro-batch")->short_name = "b";
    flag_int(set, "grad_accum", &o->grad_accum, 1, 4096, "micro-batches per optimizer step");
    flag_double(set, "lr", &o->lr, 0, 10, "peak learning rate");
    flag_double(set, "min_lr", &o->min_lr, -1, 10, "learning rate at the end of the cosine (-1: lr/10)");
    flag_int(set, "warmup_steps", &o->warmup_steps, 0, 1000000, "linear warm-up steps (at most a fifth of the run)");
    flag_double(set, "weight_decay", &o->weight_decay, 0, 10, "AdamW decay of the weight matrices");
    flag_double(set, "grad_clip", &o->grad_clip, 0, 1e6, "clip the gradient norm to this (0: never)");
    flag_int(set, "max_steps", &o->max_steps, 0, 100000000, "stop after this many optimizer steps (0: all epochs)");
    flag_int(set, "eval_every", &o->eval_every, 0, 100000000, "validate every N steps as well as after each epoch (0: epochs only)");
    flag_int(set, "log_every", &o->log_every, 1, 100000000, "progress line every N steps");
    flag_int(set, "num_workers", &o->num_workers, 0, 1, "threads that make the next batch while a step trains (DataLoader's num_workers)");
    flag_int(set, "save_every", &o->save_every, 0, 1000000, "save the model every N epochs (0: at the end only)");
    flag_string(set, "snapshot_path", &o->snapshot_path, "resumable snapshots DIR/STEM.safetensors, every --save_every epochs");
    flag_int(set, "nprocs", &o->nprocs, 1, 256, "ranks to spawn (default: the product of the mesh's sizes; under ddprun: ignored)");
    flag_choice(set, "backend", &o->backend, "auto|cpu|nccl|mpi", "communication backend")->env = "COURSE_BACKEND";
    flag_double(set, "timeout", &o->timeout, 0, 86400, "seconds a rank waits for another (0: COURSE_TIMEOUT or 300)");
    flag_choice(set, "grad_compress", &o->grad_compress, "none|bf16|fp16|powersgd", "gradients all-reduced as fp32, rounded to bf16 or fp16 (half the bytes; DDP's bf16_ and fp16_compress_hook), or low-rank (powerSGD_hook)");
    flag_int(set, "powersgd_rank", &o->powersgd_rank, 1, 1024, "--grad_compress powersgd: the rank R of each matrix's two thin factors (PyTorch's matrix_approximation_rank)");
    flag_int(set, "seed", &o->seed, 0, 2147483647, "seed for the weights, the shuffle and the samples");
    flag_choice(set, "preset", &o->preset, "default|tiny", "model size: default (128/4/4/256) or tiny (32/2/2/64)");
    flag_int(set, "vocab_size", &o->vocab_size, 258, 65536, "BPE vocabulary: 256 bytes + merges + <|endoftext|>");
    flag_int(set, "block_size", &o->block_size, 1, 8192, "context length in tokens (0: from --preset)");
    flag_int(set, "n_layer", &o->n_layer, 1, 256, "transformer blocks (0: from --preset)");
    flag_int(set, "n_head", &o->n_head, 1, 256, "attention heads (0: from --preset)");
    flag_int(set, "n_embd", &o->n_embd, 1, 16384, "channels (0: from --preset)");
    flag_string(set, "data_dir", &o->data_dir, "folder with train.txt, valid.txt, test.txt (none: $WIKITEXT_DIR, else ../shared/data/wikitext-2)");
    flag_bool(set, "verify_data", &o->verify_data, "check the files are the published WikiText-2 (false: any text corpus)");
    flag_string(set, "out_dir", &o->out_dir, "model, tokenizer, caches and metrics go here");
    flag_bool(set, "generate", &o->generate, "load the saved model from --out_dir and sample; no training");
    flag_string(set, "prompt", &o->prompt, "text the samples continue");
    flag_double(set, "temperature", &o->temperature, 0, 100, "sampling temperature (0: always the most likely token)");
    flag_int(set, "top_k", &o->top_k, 0, 65536, "sample among the k most likely tokens (0: all)");
    flag_int(set, "num_samples", &o->num_samples, 0, 100, "continuations to print");
    flag_int(set, "sample_tokens", &o->sample_tokens, 1, 100000, "tokens per continuation");
    flag_choice(set, "device", &o->device, "auto|cpu|cuda", "where to compute")->env = "COURSE_DEVICE";
    flag_choice(set, "precision", &o->precision, "auto|bf16|fp16|fp32", "number format on a GPU (auto: bf16 there, fp32 on the CPU; fp16 for GPUs without bf16)");
    flag_double(set, "loss_scale", &o->loss_scale, 1, 1099511627776.0, "fp16: the first loss scale, a power of two (GradScaler's init_scale)");
    flag_bool(set, "cuda_graph", &o->cuda_graph, "on a GPU, one process, no --grad_accum: each step is one CUDA graph launch");
    flag_bool(set, "plan", &o->plan, "print what each rank would hold and send per step (gpt/plan.h) and exit: no data, no ranks, no training");
}

// The mesh's dimensions a chapter uses, by name ("dp tp pp cp ep", any of
// them): one flag each, named and explained the same in every chapter.
static inline void options_add_mesh_flags(flag_set *set, options *o, const char *dims) {
    if (strstr(dims, "dp")) flag_int(set, "dp", &o->dp, 0, 256, "data-parallel replicas (0: the ranks the other dimensions leave)");
    if (strstr(dims, "tp")) flag_int(set, "tp", &o->tp, 1, 256, "tensor-parallel ranks: each block split over them (chapter 10)");
    if (strstr(dims, "pp")) flag_int(set, "pp", &o->pp, 1, 256, "pipeline stages: the blocks cut into this many (chapter 11)");
    if (strstr(dims, "cp")) flag_int(set, "cp", &o->cp, 1, 256, "context-parallel ranks: each sequence split over them (chapter 12)");
    if (strstr(dims, "ep")) flag_int(set, "ep", &o->ep, 1, 256, "expert-parallel ranks: the experts spread over them (chapter 13)");
}

// How many ranks a program started by hand spawns: --nprocs, or the
// product of the mesh's sizes (dp 1 when not given).
static inline int options_ranks(const options *o) {
    if (o->nprocs) return o->nprocs;
    return (o->dp ? o->dp : 1) * o->tp * o->pp * o->cp * o->ep;
}

// --plan: the layout these flags ask for (the mesh is arithmetic: --dp, or
// the ranks --nprocs leaves over the other dimensions), its rows printed by
// gpt/plan.h; then the program ends, having trained nothing. The
// vocabulary is --vocab_size: a tokenizer trained on a small corpus may
// stop short of it (the chapters' "model:" line says what it reached).
static inline void options_plan(const options *o, flag_set *set) {
    plan_layout l = {.cfg = {o->vocab_size, o->block_size, o->n_layer, o->n_head, o->n_embd},
                     .B = o->batch_size, .T = o->block_size, .M = o->grad_accum, .gpu = !strcmp(o->device, "cuda"),
                     .tp = o->tp, .pp = o->pp, .cp = o->cp, .ep = o->ep, .zero = o->shard, .replicate = o->replicate,
                     .gpipe = !strcmp(o->schedule, "gpipe"), .wire_bytes = 4,
                     .ulysses = !strcmp(o->cp_attention, "ulysses"), .n_expert = o->n_expert, .top_k = o->moe_top_k,
                     .capacity_groups = o->capacity_groups};
    l.cfg.n_expert = o->n_expert, l.cfg.top_k = o->moe_top_k, l.cfg.ep = o->ep; // 13's mixture, E/ep experts a rank
    int others = o->tp * o->pp * o->cp * o->ep;
    l.dp = o->dp ? o->dp : o->nprocs ? o->nprocs / others : 1;
    if (!o->dp && o->nprocs % others != 0)
        flags_fail(set, "--plan: --nprocs %d is not a multiple of the other dimensions' %d ranks", o->nprocs, others);
    l.precision = !strcmp(o->precision, "fp16") ? GPT_FP16 : !strcmp(o->precision, "fp32") ? GPT_FP32
                  : l.gpu ? GPT_BF16 : GPT_FP32;
    if (!strcmp(o->grad_compress, "bf16") || !strcmp(o->grad_compress, "fp16")) l.wire_bytes = 2;
    if (!strcmp(o->grad_compress, "powersgd"))
        flags_fail(set, "--plan: --grad_compress powersgd is not planned (its factors' sizes depend on the matrices' ranks)");
    if (o->ep > 1 && !o->n_expert) flags_fail(set, "--plan: --ep %d spreads experts over ranks: give --n_expert", o->ep);
    if (o->n_expert && l.gpu)
        flags_fail(set, "--plan: the GPU model's mixture of experts (gpt_cuda_moe.cuh) is not planned; --device cpu "
                        "plans the CPU model's");
    const char *problem = plan_problem(&l);
    if (problem) flags_fail(set, "--plan: %s", problem);
    printf("plan: %s for --device %s (auto plans the CPU model; --device cuda the GPU's)\n", set->program, o->device);
    plan_print(stdout, &l);
    fflush(stdout);
    exit(0);
}

// Model sizes left at 0 come from the preset; the result must be buildable;
// then what no single flag's range can say.
static inline void options_finish(options *o, flag_set *set) {
    gpt_config p = gpt_config_of(o->vocab_size, 0, 0, 0, 0);
    gpt_preset(o->preset, &p); // the flag's choices guarantee a known name
    if (!o->block_size) o->block_size = p.block_size;
    if (!o->n_layer) o->n_layer = p.n_layer;
    if (!o->n_head) o->n_head = p.n_head;
    if (!o->n_embd) o->n_embd = p.n_embd;
    gpt_config c = gpt_config_of(o->vocab_size, o->block_size, o->n_layer, o->n_head, o->n_embd);
    const char *problem = gpt_config_problem(c);
    if (problem) flags_fail(set, "bad model size: %s (got --n_embd %d --n_head %d)", problem, o->n_embd, o->n_head);
    if (o->min_lr < 0) o->min_lr = o->lr / 10;
    if (o->min_lr > o->lr) flags_fail(set, "--min_lr %g is above --lr %g", o->min_lr, o->lr);
    if (strlen(o->out_dir) > 900) flags_fail(set, "--out_dir is too long (at most 900 characters)");
    if (!strcmp(o->device, "cpu") && (!strcmp(o->precision, "bf16") || !strcmp(o->precision, "fp16")))
        flags_fail(set, "--precision %s needs a GPU: the CPU model computes in fp32 (use --device auto or cuda)",
                   o->precision);
    // A power of two: multiplying and dividing by it changes no digit of a
    // gradient, only its exponent (the scaler halves and doubles it).
    int exponent;
    if (frexp(o->loss_scale, &exponent) != 0.5)
        flags_fail(set, "--loss_scale %g is not a power of two (65536 is GradScaler's default)", o->loss_scale);
    long product = (long)(o->dp ? o->dp : 1) * o->tp * o->pp * o->cp * o->ep;
    if (o->nprocs && o->dp && product != o->nprocs)
        flags_fail(set, "--nprocs %d is not the mesh's %ld ranks (leave --dp out to take the ranks left over)",
                   o->nprocs, product);
    if (o->plan) options_plan(o, set);
}

#endif
