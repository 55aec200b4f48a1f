// test_gpt_moe.c - the mixture of experts of gpt/moe.h: the rules a
// gradient check cannot see because forward and backward would share the
// slip (chapter 13's exercise names them): every token's kept gates add up
// to 1; a token whose every choice was dropped leaves its block on the
// residual stream alone; capacity is counted per group of sequences
// (sequence j in group j mod G); an expert shard's table maps to the whole
// model's and back. tests/chapters/test_13_expert_parallel.sh runs it, and
// its planted copies.
#include "../../gpt/gpt.h"
#include "test.h"

// A 1-layer mixture of 4 experts, top 2, on B x T random tokens.
static void build(gpt_t *m, float capacity_factor, int groups) {
    gpt_config cfg = gpt_config_of(13, 8, 1, 2, 16);
    cfg.n_expert = 4, cfg.top_k = 2, cfg.capacity_factor = capacity_factor, cfg.capacity_groups = groups;
    gpt_init(m, cfg, 11);
    rng_t rng = rng_seed(3);
    for (size_t i = 0; i < m->num_params; i++) m->params[i] += (gpt_real)(rng_normal(&rng) * 0.3);
    m->train_pass = true;
}

static void forward(gpt_t *m, int B, int T) {
    uint16_t in[64], tg[64];
    rng_t rng = rng_seed(8);
    for (int i = 0; i < B * T; i++) in[i] = (uint16_t)rng_below(&rng, 13), tg[i] = (uint16_t)rng_below(&rng, 13);
    gpt_forward(m, in, tg, B, T);
}

int main(void) {
    gpt_t m;
    enum { B = 4, T = 8 };
    // Gates: renormalised over the kept K, so each token's add up to 1.
    build(&m, 0, 1);
    forward(&m, B, T);
    const gpt_moe_layer *y = &m.moe->layer[0];
    double worst = 0;
    for (int n = 0; n < B * T; n++) {
        double sum = 0;
        for (int k = 0; k < m.cfg.top_k; k++) sum += y->gate[n * m.cfg.top_k + k];
        worst = fabs(sum - 1) > worst ? fabs(sum - 1) : worst;
    }
    EXPECT("moe: every token's top-2 gates add up to 1 (renormalised)", worst < 1e-6, "off by %.3g", worst);
    gpt_free(&m);

    // Drops: capacity 0.25 over 2 groups of 2 sequences (16 tokens, 32
    // assignments): an expert takes ceil(0.25 x 16 x 2 / 4) = 2 of a group's.
    // Some tokens lose every choice: their res3 is their res2, bit for bit;
    // the others' is not.
    build(&m, 0.25f, 2);
    forward(&m, B, T);
    y = &m.moe->layer[0];
    gpt_block_acts a = gpt_block_acts_view(&m, 0);
    int all_dropped = 0, passed = 0, kept_moved = 0, kept = 0, C = m.cfg.n_embd, K = m.cfg.top_k;
    for (int n = 0; n < B * T; n++) {
        bool none = true;
        for (int k = 0; k < K; k++) none &= y->slot[n * K + k] < 0;
        bool same = !memcmp(a.res3 + (size_t)n * C, a.res2 + (size_t)n * C, sizeof(gpt_real) * (size_t)C);
        if (none) all_dropped++, passed += same;
        else kept++, kept_moved += !same;
    }
    char name[160];
    snprintf(name, sizeof name, "moe: the %d tokens whose every choice was dropped leave the block on the residual "
             "stream alone (res3 == res2), the %d others do not", all_dropped, kept);
    EXPECT(name, all_dropped > 0 && passed == all_dropped && kept_moved == kept,
           "%d of %d dropped tokens kept their residual, %d of %d others moved", passed, all_dropped, kept_moved, kept);
    // Capacity per group: group g is sequences g, g + G, ...; each expert
    // serves at most 2 assignments of each group.
    int served[2][4] = {{0}};
    for (int n = 0; n < B * T; n++)
        for (int k = 0; k < K; k++)
            if (y->slot[n * K + k] >= 0) served[(n / T) % 2][y->choice[n * K + k]]++;
    int most = 0;
    for (int g = 0; g < 2; g++)
        for (int e = 0; e < 4; e++) most = served[g][e] > most ? served[g][e] : most;
    EXPECT("moe: no expert serves more than its capacity (2) of any group of sequences j mod 2", most <= 2,
           "an expert served %d of a group's assignments", most);
    gpt_free(&m);

    // An expert shard: rank r of ep 2 holds experts 2r, 2r+1 of every
    // expert tensor and all of the rest; the shards put back give the whole.
    gpt_t whole, shard[2];
    build(&whole, 0, 1);
    gpt_real *back = xcalloc(whole.num_params, sizeof(gpt_real));
    for (int r = 0; r < 2; r++) {
        gpt_init_expert_shard(&shard[r], &whole, 2, r);
        gpt_expert_shard_copy(&shard[r], r, back, shard[r].params, false);
    }
    size_t expert = 0;
    for (int t = 0; t < shard[0].num_tensors; t++)
        if (gpt_tensor_is_expert(&shard[0], t)) expert += shard[0].tensors[t].count;
    bool same = !memcmp(back, whole.params, sizeof(gpt_real) * whole.num_params);
    EXPECT("moe: two expert shards (ep 2) hold half the experts each and put back give the whole model",
           same && shard[0].num_params == whole.num_params - expert && expert * 2 == 4 * (8 * 16 * 16 + 5 * 16) / 2 * 2,
           "same %d, shard %zu of %zu parameters, %zu expert numbers", same, shard[0].num_params, whole.num_params,
           expert);
    free(back);
    gpt_free(&shard[0]), gpt_free(&shard[1]), gpt_free(&whole);
    return test_failures ? 1 : 0;
}
