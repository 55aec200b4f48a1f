// test_gpt_model.c - gpt/gpt.h in float, as the chapter trains:
// it learns (a tiny model memorises a sentence and says it back), its
// optimizer pieces do what their formulas say, its fast exp is accurate,
// and its safetensors files round-trip and reject damage cleanly.
#include "../../gpt/gpt.h"
#include "test.h"

// ------------------------------------------------------------------ exp and GELU in float

// gpt_expf_fast against the double-precision exp over the whole useful range.
static void check_fast_exp(void) {
    double worst = 0, at = 0;
    for (double x = -87.0; x <= 88.0; x += 0.000731) {
        double rel = fabs((double)gpt_expf_fast((float)x) - exp((double)(float)x)) / exp((double)(float)x);
        if (rel > worst) worst = rel, at = x;
    }
    printf("info: fast exp: worst relative error %.2e at x = %.4f over [-87, 88]\n", worst, at);
    EXPECT("gpt fast exp within 4e-7 relative of exp", worst < 4e-7, "worst relative error %.3e at x = %g", worst, at);
    float tiny = gpt_expf_fast(-1000.0f), huge = gpt_expf_fast(1000.0f);
    EXPECT("gpt fast exp clamps instead of overflowing", tiny >= 0 && tiny < 1e-37f && isfinite(huge) && huge > 1e38f,
           "exp(-1000) = %g, exp(1000) = %g", tiny, huge);
}

static void check_float_gelu(void) {
    enum { N = 2001 };
    float x[N], y[N], dy[N], ones[N];
    for (int i = 0; i < N; i++) x[i] = -10.0f + 0.01f * i, ones[i] = 1;
    gelu_forward(y, x, N);
    gelu_backward(dy, x, ones, N);
    double worst_y = 0, worst_dy = 0;
    for (int i = 0; i < N; i++) {
        double v = x[i], u = 0.7978845608028654 * (v + 0.044715 * v * v * v), th = tanh(u);
        double ref = 0.5 * v * (1 + th);
        double dref = 0.5 * (1 + th) + 0.5 * v * (1 - th * th) * 0.7978845608028654 * (1 + 3 * 0.044715 * v * v);
        worst_y = fmax(worst_y, fabs(y[i] - ref));
        worst_dy = fmax(worst_dy, fabs(dy[i] - dref));
    }
    EXPECT("gpt float gelu matches the tanh formula", worst_y < 2e-6 && worst_dy < 2e-6,
           "max error %.3e (value), %.3e (derivative)", worst_y, worst_dy);
}

// ------------------------------------------------------------------ the optimizer

// ------------------------------------------------------------------ the layout (gpt_layout.h)

// The gradient buckets tile the flat array from its end to its start, in the
// order the backward pass finishes them, and block l's bucket starts at its
// first tensor, h.l.ln_1.weight; the table's tensors follow one another.
static void check_layout(gpt_config c, const char *what) {
    int nt = gpt_num_tensors(&c);
    gpt_tensor *t = xcalloc((size_t)nt, sizeof *t);
    size_t params = gpt_layout_params(&c, t), next = 0;
    bool table_ok = params == gpt_num_params(&c);
    for (int i = 0; i < nt; i++) table_ok = table_ok && t[i].offset == next, next += t[i].count;
    table_ok = table_ok && next == params && !strcmp(t[gpt_ln_f_tensor(&c)].name, "ln_f.weight") &&
               gpt_block_offset(&c, 1) == t[gpt_block_tensor(&c, 1, B_LN1_W)].offset;
    gpt_bucket b[300];
    int n = gpt_layout_buckets(&c, b, 300);
    bool ok = n == c.n_layer + 2 && n <= 300;
    size_t end = params; // buckets come from the end of the buffer to its start
    for (int i = 0; ok && i < n; i++) ok = b[i].offset + b[i].count == end, end = b[i].offset;
    ok = ok && end == 0 && !strcmp(b[0].name, "ln_f") && !strcmp(b[n - 1].name, "wte+wpe");
    for (int l = 0; ok && l < c.n_layer; l++) ok = b[c.n_layer - l].offset == t[gpt_block_tensor(&c, l, B_LN1_W)].offset;
    char name[120];
    snprintf(name, sizeof name, "gpt layout: the table tiles the flat array, and the buckets tile it in backward order (%s)", what);
    EXPECT(name, table_ok && ok, "table %d; %d buckets for %d layers; first '%s', last '%s'", table_ok, n, c.n_layer,
           b[0].name, b[n - 1].name);
    free(t);
}

// With zero gradients AdamW only decays: matrices shrink by exactly
// (1 - lr * wd), vectors (biases, LayerNorm) stay. With a constant
// gradient g, the first step moves every parameter by -lr * sign(g).
static void check_adamw(void) {
    gpt_config cfg = gpt_config_of(17, 8, 1, 2, 8);
    gpt_t m;
    gpt_init(&m, cfg, 1);
    float *before = xmalloc(sizeof(float) * m.num_params);
    memcpy(before, m.params, sizeof(float) * m.num_params);
    gpt_zero_grad(&m);
    gpt_adamw_step(&m, 0.01f, 0.9f, 0.95f, 1e-8f, 0.5f);
    bool decay_ok = true;
    for (int t = 0; t < m.num_tensors; t++)
        for (size_t i = m.tensors[t].offset; i < m.tensors[t].offset + m.tensors[t].count; i++) {
            float want = m.tensors[t].ndim == 2 ? before[i] * (1 - 0.01f * 0.5f) : before[i];
            decay_ok = decay_ok && fabsf(m.params[i] - want) <= 1e-7f * (1 + fabsf(want));
        }
    EXPECT("gpt adamw decays matrices only", decay_ok, "a parameter moved other than by (1 - lr*wd)");

    gpt_free(&m);
    gpt_init(&m, cfg, 1);
    memcpy(before, m.params, sizeof(float) * m.num_params);
    for (size_t i = 0; i < m.num_params; i++) m.grads[i] = (i % 3 == 0) ? -0.3f : 0.002f;
    gpt_adamw_step(&m, 0.01f, 0.9f, 0.95f, 1e-8f, 0.0f);
    double worst = 0;
    for (size_t i = 0; i < m.num_params; i++)
        worst = fmax(worst, fabs((m.params[i] - before[i]) - (i % 3 == 0 ? 0.01 : -0.01)));
    EXPECT("gpt adamw first step is lr * sign(gradient)", worst < 1e-6, "worst deviation %.3e", worst);
    free(before);
    gpt_free(&m);
}

static void check_clip(void) {
    gpt_config cfg = gpt_config_of(17, 8, 1, 2, 8);
    gpt_t m;
    gpt_init(&m, cfg, 1);
    for (size_t i = 0; i < m.num_params; i++) m.grads[i] = 0.5f;
    double expected = 0.5 * sqrt((double)m.num_params);
    float norm = gpt_clip_grad_norm(&m, 1.0f), after = gpt_clip_grad_norm(&m, 0.0f);
    EXPECT("gpt clip returns the norm and scales to max_norm",
           fabs(norm - expected) < 1e-4 * expected && fabs(after - 1.0) < 1e-4, "norm %g (want %g), after %g", norm,
           expected, after);
    gpt_free(&m);
}

// ------------------------------------------------------------------ sampling

static void check_sampling(void) {
    float logits[6] = {0.5f, 2.0f, -1.0f, 1.9f, 0.0f, -3.0f};
    rng_t rng = rng_seed(3);
    int counts[6] = {0};
    bool greedy = gpt_sample_next(logits, 6, 0.0f, 0, &rng) == 1 && gpt_sample_next(logits, 6, 1.0f, 1, &rng) == 1;
    for (int i = 0; i < 20000; i++) counts[gpt_sample_next(logits, 6, 1.0f, 2, &rng)]++;
    // Top-2 leaves tokens 1 and 3 with probabilities e^2 / (e^2 + e^1.9) = 0.525 and 0.475.
    bool only_top2 = counts[0] + counts[2] + counts[4] + counts[5] == 0;
    double p1 = counts[1] / 20000.0;
    EXPECT("gpt sampling: greedy and top-k", greedy && only_top2 && fabs(p1 - 0.525) < 0.015,
           "greedy %d, only the top 2 %d, P(token 1) = %.3f (want 0.525)", greedy, only_top2, p1);
    for (int i = 0; i < 6; i++) counts[i] = 0;
    for (int i = 0; i < 20000; i++) counts[gpt_sample_next(logits, 6, 1.0f, 0, &rng)]++;
    double z = 0;
    for (int i = 0; i < 6; i++) z += exp(logits[i]);
    double worst = 0;
    for (int i = 0; i < 6; i++) worst = fmax(worst, fabs(counts[i] / 20000.0 - exp(logits[i]) / z));
    EXPECT("gpt sampling follows softmax(logits)", worst < 0.015, "largest frequency error %.3f", worst);
}

// ------------------------------------------------------------------ learning

static const char SENTENCE[] = "the quick brown fox jumps over the lazy dog, while five wizards box a jackdaw.";

// A character-level vocabulary: the distinct characters of the sentence.
static int char_vocab(char *chars) {
    int n = 0;
    for (const char *c = SENTENCE; *c; c++)
        if (!memchr(chars, *c, (size_t)n)) chars[n++] = *c;
    return n;
}

// The tiny chapter preset memorises the sentence from random windows of it:
// the training loss falls below 0.1 and greedy decoding from its first
// words says the rest back, character for character.
static void check_overfit(void) {
    char chars[128];
    int V = char_vocab(chars), len = (int)strlen(SENTENCE);
    uint16_t text[sizeof SENTENCE];
    for (int i = 0; i < len; i++) text[i] = (uint16_t)((const char *)memchr(chars, SENTENCE[i], (size_t)V) - chars);
    gpt_config cfg = gpt_config_of(V, 0, 0, 0, 0);
    gpt_preset("tiny", &cfg);
    gpt_t m;
    gpt_init(&m, cfg, 42);
    enum { B = 8, STEPS = 250 };
    int T = cfg.block_size;
    uint16_t in[B * 32], tg[B * 32];
    rng_t rng = rng_seed(1);
    float loss = 0;
    for (int step = 0; step < STEPS; step++) {
        for (int b = 0; b < B; b++) {
            int start = (int)rng_below(&rng, (uint64_t)(len - T));
            memcpy(in + b * T, text + start, sizeof(uint16_t) * T);
            memcpy(tg + b * T, text + start + 1, sizeof(uint16_t) * T);
        }
        gpt_zero_grad(&m);
        loss = gpt_forward(&m, in, tg, B, T);
        gpt_backward(&m, 1.0f);
        gpt_clip_grad_norm(&m, 1.0f);
        // The chapter's schedule (its own test is tests/chapters/test_08_gpt_model.sh):
        // 20 steps of warm-up to 3e-3, then a cosine down to 3e-4.
        double progress = step < 20 ? 0 : (double)(step - 20) / (STEPS - 20);
        float lr = step < 20 ? 3e-3f * (float)(step + 1) / 20 : 3e-4f + (float)(0.5 * (1 + cos(M_PI * progress))) * 2.7e-3f;
        gpt_adamw_step(&m, lr, 0.9f, 0.95f, 1e-8f, 0.0f);
    }
    printf("info: overfit: training loss %.4f after %d steps\n", loss, STEPS);
    EXPECT("gpt overfits a sentence (training loss < 0.1)", loss < 0.1f, "loss after %d steps: %.4f", STEPS, loss);

    uint16_t out[sizeof SENTENCE];
    memcpy(out, text, sizeof(uint16_t) * 10); // "the quick "
    gpt_generate(&m, out, 10, len, 0.0f, 0, &rng);
    char said[sizeof SENTENCE];
    for (int i = 0; i < len; i++) said[i] = chars[out[i]];
    said[len] = '\0';
    EXPECT("gpt greedy generation says the sentence back", !strcmp(said, SENTENCE), "it said \"%s\"", said);
    gpt_free(&m);
}

// ------------------------------------------------------------------ safetensors

static bool write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = xmalloc(*n + 1);
    size_t got = fread(data, 1, *n, f);
    fclose(f);
    if (got != *n) return free(data), NULL;
    return data;
}

static void check_roundtrip(const char *dir) {
    gpt_config cfg = gpt_config_of(37, 16, 2, 2, 16);
    gpt_t m, back;
    gpt_init(&m, cfg, 9);
    char path[600], err[2048] = "";
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    bool saved = gpt_save_safetensors(&m, path, err, sizeof err);
    bool loaded = saved && gpt_load_safetensors(&back, path, err, sizeof err);
    bool same = loaded && back.num_params == m.num_params && !memcmp(&back.cfg, &m.cfg, sizeof cfg) &&
                !memcmp(back.params, m.params, sizeof(float) * m.num_params);
    EXPECT("gpt safetensors round trip is bit-exact", same, "saved %d, loaded %d (%s)", saved, loaded, err);
    size_t n = 0;
    char *file = read_bytes(path, &n);
    uint64_t hlen = 0;
    if (file) memcpy(&hlen, file, 8);
    bool layout = file && hlen % 8 == 0 && n == 8 + hlen + 4 * m.num_params && file[8] == '{' &&
                  strstr(file + 8, "\"wte.weight\":{\"dtype\":\"F32\",\"shape\":[37,16],\"data_offsets\":[0,2368]}") &&
                  strstr(file + 8, "\"n_layer\":\"2\"");
    EXPECT("gpt safetensors layout (header length, F32, shapes, metadata)", layout, "file of %zu bytes, header %llu",
           n, (unsigned long long)hlen);
    free(file);
    if (loaded) gpt_free(&back);
    gpt_free(&m);
}

// Damaged files: each must fail with a reason, never crash or load.
static void check_damage(const char *dir) {
    gpt_config cfg = gpt_config_of(37, 16, 2, 2, 16);
    gpt_t m, back;
    gpt_init(&m, cfg, 9);
    char path[600], bad[600], err[2048];
    snprintf(path, sizeof path, "%s/good.safetensors", dir);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    gpt_save_safetensors(&m, path, err, sizeof err);
    size_t n;
    char *file = read_bytes(path, &n);
    uint64_t hlen;
    memcpy(&hlen, file, 8);
    // Each case names what the reason must say. The file's checksum catches
    // any changed byte; the cases with unseal also rename the checksum key,
    // so that the file is read as one without a checksum (as a file from
    // elsewhere) and the check behind it must refuse it.
    struct { const char *what, *find, *replace; size_t cut; uint64_t header; bool unseal; const char *want; } cases[] = {
        {"truncated data", NULL, NULL, n - 5, 0, false, "end beyond the data"},
        {"truncated header", NULL, NULL, 8 + hlen / 2, 0, false, "larger than the file"},
        {"header length past the end", NULL, NULL, 0, 1u << 30, false, "larger than the file"},
        {"a changed dtype of the same size", "\"F32\"", "\"I32\"", 0, 0, false, "checksum mismatch"},
        {"a changed dtype of the same size, no checksum", "\"F32\"", "\"I32\"", 0, 0, true, "is I32, not F32"},
        {"a dtype of another size", "\"F32\"", "\"F16\"", 0, 0, false, "hold 2368 bytes"},
        {"wrong shape", "[37,16]", "[36,16]", 0, 0, true, "hold 2368 bytes"},
        {"missing tensor", "\"ln_f.bias\"", "\"ln_f.bian\"", 0, 0, true, "unexpected tensor 'ln_f.bian'"},
        {"bad offsets", "[0,2368]", "[0,2364]", 0, 0, true, "hold 2364 bytes"},
        {"no configuration", "\"n_embd\"", "\"n_embx\"", 0, 0, true, "no usable configuration"},
        {"changed configuration", "\"n_layer\":\"2\"", "\"n_layer\":\"1\"", 0, 0, true, "unexpected tensor"},
        {"not JSON", "{\"__metadata__\"", "[\"__metadata__\"", 0, 0, false, "does not start with '{'"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char *copy = xmalloc(n);
        memcpy(copy, file, n);
        size_t len = cases[c].cut ? cases[c].cut : n;
        if (cases[c].header) memcpy(copy, &cases[c].header, 8);
        if (cases[c].find) {
            char *at = memmem(copy + 8, hlen, cases[c].find, strlen(cases[c].find));
            if (at) memcpy(at, cases[c].replace, strlen(cases[c].replace)); // same length by construction
        }
        char *sum = cases[c].unseal ? memmem(copy + 8, hlen, "\"checksum\"", 10) : NULL;
        if (sum) memcpy(sum, "\"checksux\"", 10);
        write_bytes(bad, copy, len);
        err[0] = '\0';
        bool loaded = gpt_load_safetensors(&back, bad, err, sizeof err);
        char name[96];
        snprintf(name, sizeof name, "gpt safetensors rejects: %s", cases[c].what);
        printf("info: %s -> %s\n", cases[c].what, err);
        EXPECT(name, !loaded && strstr(err, cases[c].want) && !strchr(err, '\n'), "loaded %d, reason '%s' (wanted '%s')", loaded,
               err, cases[c].want);
        if (loaded) gpt_free(&back);
        free(copy);
    }
    bool missing = !gpt_load_safetensors(&back, "/nonexistent/x.safetensors", err, sizeof err) &&
                   strstr(err, "/nonexistent/x.safetensors");
    EXPECT("gpt safetensors: a missing file names the path", missing, "reason '%s'", err);
    unlink(bad), unlink(path);
    free(file);
    gpt_free(&m);
}

int main(void) {
    char dir[512];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/test_gpt_model.XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(dir)) die("mkdtemp in %s failed: %s", dir, strerror(errno));
    check_fast_exp();
    check_layout(gpt_config_of(211, 32, 2, 2, 64), "tiny");
    check_layout(gpt_config_of(5000, 128, 4, 4, 256), "default");
    check_layout(gpt_config_of(50257, 1024, 12, 12, 768), "GPT-2 small");
    check_float_gelu();
    check_adamw();
    check_clip();
    check_sampling();
    check_roundtrip(dir);
    check_damage(dir);
    check_overfit();
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
    return test_failures ? 1 : 0;
}
