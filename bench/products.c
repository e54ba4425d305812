/* The packed bf16 products of gptcli/infer/decode.c alone, on 2 threads, as the decoding step
 * runs them (matvec: each thread its share of the outputs, then a barrier): GFLOP/s and the
 * weights' GB/s for ROWS rows over NW weights of N x K, the best of 7 rounds. NW small
 * (weights in the L3 cache) measures the arithmetic; NW large (hundreds of MB, from
 * memory) measures how the weights' stream and the arithmetic overlap. On a CPU without
 * packed bf16 products (AVX512-BF16 or AVX2) it says so and stops.
 *
 *     cc -O3 -march=native -fno-trapping-math -std=gnu11 -fopenmp -w bench/products.c -o /tmp/products -lm
 *     /tmp/products ROWS NW [N K]        e.g. /tmp/products 16 4; /tmp/products 16 50 768 3072
 */
#include "../gptcli/infer/decode.c"
#include <stdio.h>
#include <time.h>

#define ROUNDED(bytes) (((size_t)(bytes) + 63) / 64 * 64) /* aligned_alloc's sizes: multiples of 64 */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s ROWS NW [N K]\n", argv[0]);
        return 2;
    }
    const int rows = atoi(argv[1]), nw = atoi(argv[2]);
    const int n = argc > 3 ? atoi(argv[3]) : 3072, k = argc > 4 ? atoi(argv[4]) : 768;
    if (rows < 1 || rows > 64 || nw < 1 || n < 1 || k < 2 || k % 2 || k > 65536) {
        fprintf(stderr, "need 1 <= ROWS <= 64, NW >= 1, N >= 1, even K <= 65536\n");
        return 2;
    }
    if (!gptcli_packs(BF16)) {
        fprintf(stderr, "this CPU has no packed bf16 products (AVX512-BF16)\n");
        return 1;
    }
    Mat *ms = malloc(sizeof(Mat) * nw);
    const size_t padded = (size_t)((n + PACK - 1) / PACK * PACK) * k;
    for (int i = 0; i < nw; i++) {
        uint16_t *w = aligned_alloc(64, ROUNDED((size_t)n * k * 2));
        for (size_t j = 0; j < (size_t)n * k; j++) w[j] = f32_to_bf16(((int)(j * 2654435761u % 2001) - 1000) * 1e-5f);
        void *p = aligned_alloc(64, padded * 2);
        gptcli_pack(w, BF16, n, k, p, 2);
        ms[i] = (Mat){w, NULL, NULL, BF16, n, k, p};
    }
    float *x = aligned_alloc(64, ROUNDED((size_t)rows * k * 4)), *y = aligned_alloc(64, ROUNDED((size_t)rows * n * 4));
    for (int i = 0; i < rows * k; i++) x[i] = (float)(i % 17) * 0.01f;
    int *taken = aligned_alloc(64, (size_t)nw * 64); /* each product's counter (matvec's pieces) */
    double best = 1e9;
    for (int rep = 0; rep < 7; rep++) {
        memset(taken, 0, (size_t)nw * 64);
        const double t0 = now();
#pragma omp parallel num_threads(2)
        {
            uint16_t *xb = aligned_alloc(64, ROUNDED((size_t)rows * k * 4 + 64));
            for (int i = 0; i < nw; i++) matvec(&ms[i], x, xb, y, rows, STORE, taken + 16 * i);
            free(xb);
        }
        const double t = now() - t0;
        best = t < best ? t : best;
    }
    const double flops = 2.0 * rows * n * (double)k * nw, bytes = 2.0 * n * (double)k * nw;
    printf("rows %d, %d weights %dx%d (%.0f MB): %.2f ms, %.0f GFLOP/s, %.1f GB/s\n", rows, nw, n, k, bytes / 1e6,
           best * 1e3, flops / best / 1e9, bytes / best / 1e9);
    return 0;
}
