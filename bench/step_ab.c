/* A/B of two versions of gptcli/infer/decode.c's decoding step, in one process.
 *
 * Built twice from this file: once with -DSTEP_TU and DECODE naming a version of decode.c
 * (each build's public names renamed so that two versions link together), and once as the
 * driver, which builds GPT-2 124M-shaped random bf16 weights (packed as the library packs
 * them) and a KV cache, then alternates a whole step (every layer and the unembedding, the
 * library's own products and attention) of version A and version B, and prints the median
 * of each. Alternating in one process is what makes the two comparable on a machine whose
 * memory bandwidth moves by 2x within a minute. bench/step_ab.sh does the building:
 *
 *     bash bench/step_ab.sh REV [ROWS SLOT REPS [int8]]   # decode.c at REV (A), the work tree's (B)
 */
#ifdef STEP_TU
#include DECODE
void STEPFN(const Model *m, int rows, int slot, int cache_len, void *kc, void *vc, const size_t *at, float *x,
            float *h, float *qkv, float *a, float *f, float *scratch, float *logits, uint16_t *xb) {
    const int C = m->n_embd, F = 4 * C;
#pragma omp parallel num_threads(2)
    {
        uint16_t *mine = xb + (size_t)omp_get_thread_num() * rows * F;
        for (int l = 0; l < m->n_layer; l++) {
            const Layer *L = &m->layers[l];
            layer_norm(x, L->ln1_w, L->ln1_b, h, rows, C);
            matvec(&L->attn, h, mine, qkv, rows, STORE);
            attend(m, l, qkv, kc, vc, at, rows, rows, cache_len, slot, NULL, a, scratch);
            matvec(&L->proj, a, mine, x, rows, ADD);
            layer_norm(x, L->ln2_w, L->ln2_b, h, rows, C);
            matvec(&L->fc, h, mine, f, rows, GELU);
            matvec(&L->out, f, mine, x, rows, ADD);
        }
        layer_norm(x, m->lnf_w, m->lnf_b, h, rows, C);
        matvec(&m->head, h, mine, logits, rows, STORE);
    }
}
#else
#include DECODE
#include <stdio.h>
#include <time.h>
typedef void Step(const Model *, int, int, int, void *, void *, const size_t *, float *, float *, float *, float *,
                  float *, float *, float *, uint16_t *);
Step step_a, step_b;
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static uint16_t *bf16s(size_t n) { /* small deterministic values */
    uint16_t *p = aligned_alloc(64, (n * 2 + 63) / 64 * 64);
    for (size_t i = 0; i < n; i++) p[i] = f32_to_bf16(((int)(i * 2654435761u % 2001) - 1000) * 1e-5f);
    return p;
}
static float *floats(size_t n, float base) {
    float *p = aligned_alloc(64, (n * 4 + 63) / 64 * 64);
    for (size_t i = 0; i < n; i++) p[i] = base + ((int)(i * 40503u % 201) - 100) * 1e-4f;
    return p;
}
static int int8 = 0; /* weights in int8 with a scale per output (--quantize int8), else bf16 */
static Mat mat(int n, int k) {
    Mat m = {bf16s((size_t)n * k), NULL, floats(n, 0), BF16, n, k, NULL};
    if (int8) {
        int8_t *w = malloc((size_t)n * k);
        for (size_t i = 0; i < (size_t)n * k; i++) w[i] = (int8_t)((int)(i * 2654435761u % 255) - 127);
        float *scale = floats(n, 0.001f);
        m = (Mat){w, scale, floats(n, 0), I8, n, k, NULL};
    }
    const size_t size = int8 ? 1 : 2;
    void *p = aligned_alloc(64, (size_t)((n + 63) / 64 * 64) * k * size);
    gptcli_pack(m.w, m.dtype, n, k, p, 2);
    m.packed = p;
    return m;
}
static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
int main(int argc, char **argv) {
    const int rows = argc > 1 ? atoi(argv[1]) : 16, slot = argc > 2 ? atoi(argv[2]) : 100;
    const int reps = argc > 3 ? atoi(argv[3]) : 30;
    int8 = argc > 4 && !strcmp(argv[4], "int8");
    const int C = 768, L = 12, nh = 12, V = 50257, F = 4 * C, cache_len = 1024;
    if (rows < 1 || slot < 0 || slot >= cache_len || reps < 1) return fprintf(stderr, "ROWS SLOT REPS\n"), 2;
    Layer layers[12];
    for (int l = 0; l < L; l++)
        layers[l] = (Layer){floats(C, 1), floats(C, 0), floats(C, 1), floats(C, 0),
                            mat(3 * C, C), mat(C, C), mat(F, C), mat(C, F)};
    Model m = {L, nh, C, V, 1024, BF16, bf16s((size_t)V * C), bf16s((size_t)1024 * C), floats(C, 1), floats(C, 0),
               mat(V, C), layers, BF16};
    uint16_t *kc = bf16s((size_t)L * rows * nh * cache_len * 64), *vc = bf16s((size_t)L * rows * nh * cache_len * 64);
    float *x = floats(rows * C, 0), *h = floats(rows * C, 0), *qkv = floats(rows * 3 * C, 0);
    float *a = floats(rows * C, 0), *f = floats(rows * F, 0), *logits = floats((size_t)rows * V, 0);
    float *scratch = floats((size_t)rows * nh * cache_len, 0);
    uint16_t *xb = bf16s((size_t)2 * (rows * F + 2 * rows));
    size_t *at = malloc(sizeof(size_t) * rows * cache_len);
    slot_offsets(at, NULL, rows, rows, nh, 64, cache_len, slot);
    double *t[2] = {malloc(8 * reps), malloc(8 * reps)};
    for (int rep = 0; rep < 2 * reps + 2; rep++) { /* A B A B ..., the first pair a warm-up */
        const int b = rep % 2;
        const double t0 = now();
        (b ? step_b : step_a)(&m, rows, slot, cache_len, kc, vc, at, x, h, qkv, a, f, scratch, logits, xb);
        if (rep >= 2) t[b][(rep - 2) / 2] = now() - t0;
    }
    qsort(t[0], reps, 8, by_value), qsort(t[1], reps, 8, by_value);
    printf("%s, rows %d, slot %d, %d steps each: A %.2f ms, B %.2f ms (medians; B/A %.3f)\n", int8 ? "int8" : "bf16", rows, slot, reps,
           t[0][reps / 2] * 1e3, t[1][reps / 2] * 1e3, t[1][reps / 2] / t[0][reps / 2]);
    return 0;
}
#endif
