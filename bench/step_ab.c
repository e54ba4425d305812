/* A/B of two versions of gptcli/infer/decode.c's decoding step, in one process.
 *
 * Each version is compiled on its own with its public names renamed (a_decode_step,
 * b_decode_step, ...), so that both link into this driver, which builds GPT-2 124M-shaped
 * random weights (bf16, int8 with a scale per output, or fp32; packed as the library packs them
 * where it does)
 * and a KV cache at slot SLOT, then alternates whole steps of version A and version B
 * (gptcli_decode_step as the library runs it: every layer and the unembedding) and prints
 * the median of each. Alternating in one process is what makes the two comparable on a
 * machine whose memory bandwidth moves by 2x within a minute. bench/step_ab.sh builds it:
 *
 *     bash bench/step_ab.sh REV [ROWS SLOT REPS [bf16|int8|fp32] [SHARED] [CACHE_LEN]]   # decode.c at REV (A), the work tree's (B)
 *
 * SHARED (beams): every row reads its slots before slot - SHARED from row 0, as beams that
 * share all but their last SHARED tokens read their common history (KVCache.sources); -1: none.
 * CACHE_LEN: the slots the cache has room for (1024 unless given; generate's: the prompt's and
 * the new tokens').
 */
#include DECODE /* the work tree's, for its types and its packing (its public names renamed) */
#include <stdio.h>
#include <time.h>

typedef int Step(const Model *, const int64_t *, const int64_t *, int, int, int, int, void *, void *,
                 const int32_t *, const uint8_t *, float *, int, int64_t *);
Step a_decode_step, b_decode_step;

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
static int int8 = 0, fp32 = 0; /* weights in int8 with a scale per output (--quantize int8), fp32, else bf16 */
static float *f32s(size_t n) { /* the same values as bf16s, in fp32 */
    float *p = aligned_alloc(64, (n * 4 + 63) / 64 * 64);
    for (size_t i = 0; i < n; i++) p[i] = ((int)(i * 2654435761u % 2001) - 1000) * 1e-5f;
    return p;
}
static Mat mat(int n, int k) {
    Mat m = {bf16s((size_t)n * k), NULL, floats(n, 0), BF16, n, k, NULL};
    if (int8) {
        int8_t *w = malloc((size_t)n * k);
        for (size_t i = 0; i < (size_t)n * k; i++) w[i] = (int8_t)((int)(i * 2654435761u % 255) - 127);
        float *scale = floats(n, 0.001f);
        m = (Mat){w, scale, floats(n, 0), I8, n, k, NULL};
    }
    if (fp32) return (Mat){f32s((size_t)n * k), NULL, floats(n, 0), F32, n, k, NULL}; /* (read as stored) */
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
    fp32 = argc > 4 && !strcmp(argv[4], "fp32");
    const int shared = argc > 5 ? atoi(argv[5]) : -1;
    /* the slots the cache has room for (generate: the prompt's and the new tokens') */
    const int cache_len = argc > 6 ? atoi(argv[6]) : 1024;
    const int C = 768, L = 12, nh = 12, V = 50257;
    if (rows < 1 || slot < 0 || slot >= cache_len || cache_len > 1024 || reps < 1)
        return fprintf(stderr, "ROWS SLOT REPS [bf16|int8|fp32] [SHARED] [CACHE_LEN]\n"), 2;
    Layer layers[12];
    for (int l = 0; l < L; l++)
        layers[l] = (Layer){floats(C, 1), floats(C, 0), floats(C, 1), floats(C, 0),
                            mat(3 * C, C), mat(C, C), mat(4 * C, C), mat(C, 4 * C)};
    Model m = {L, nh, C, V, 1024, BF16, bf16s((size_t)V * C), bf16s((size_t)1024 * C), floats(C, 1), floats(C, 0),
               mat(V, C), layers, fp32 ? F32 : BF16}; /* (the KV cache in the weights' dtype, as generate makes it) */
    const size_t cache = (size_t)L * rows * nh * cache_len * 64;
    void *kc = fp32 ? (void *)f32s(cache) : (void *)bf16s(cache), *vc = fp32 ? (void *)f32s(cache) : (void *)bf16s(cache);
    int64_t *tokens = malloc(sizeof(int64_t) * rows), *positions = malloc(sizeof(int64_t) * rows);
    for (int r = 0; r < rows; r++) tokens[r] = (r * 7919) % V, positions[r] = slot;
    float *logits = floats((size_t)rows * V, 0);
    int64_t *best = malloc(sizeof(int64_t) * rows); /* (each row's argmax, as generate asks; older versions ignore it) */
    int32_t *sources = NULL;
    if (shared >= 0) {
        sources = malloc(sizeof(int32_t) * rows * cache_len);
        for (int r = 0; r < rows; r++)
            for (int s = 0; s < cache_len; s++) sources[(size_t)r * cache_len + s] = s < slot - shared ? 0 : r;
    }
    double *t[2] = {malloc(8 * reps), malloc(8 * reps)};
    for (int rep = 0; rep < 2 * reps + 2; rep++) { /* A B A B ..., the first pair a warm-up */
        const int b = rep % 2;
        const double t0 = now();
        if ((b ? b_decode_step : a_decode_step)(&m, tokens, positions, rows, rows, slot, cache_len, kc, vc, sources,
                                                NULL, logits, 2, best))
            return fprintf(stderr, "the step failed\n"), 1;
        if (rep >= 2) t[b][(rep - 2) / 2] = now() - t0;
    }
    qsort(t[0], reps, 8, by_value), qsort(t[1], reps, 8, by_value);
    const double a = t[0][reps / 2], b = t[1][reps / 2];
    printf("%s, rows %d, slot %d of %d%s, %d steps each: A %.2f ms, B %.2f ms (medians; B/A %.3f)\n",
           int8 ? "int8" : fp32 ? "fp32" : "bf16", rows, slot, cache_len, shared >= 0 ? " (history shared)" : "", reps,
           a * 1e3, b * 1e3, b / a);
    return 0;
}
