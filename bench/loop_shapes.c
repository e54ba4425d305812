/* The AVX2 products' inner loop, in the core alone: GFLOP/s of a few loop shapes on 2 threads,
 * every operand in the L1 cache, the best of 5 rounds. What the packed bf16 products of
 * gptcli/infer/decode.c can reach on a CPU without native bf16, apart from memory:
 *
 *   peak        8 sums, each 2 dependent FMAs an iteration (the kernel's chains), registers only
 *   broadcasts  the same, each FMA's second operand one of 8 activations broadcast from memory
 *   kernel      decode.c's shape (packed_blocks, 4 rows x 2 blocks): 2 x 32 bytes of bf16
 *               weights widened (a shift, an and), 8 broadcast activations, 16 FMAs
 *   fp32        the same with the weights already fp32 (4 loads, nothing widened)
 *   dot         no broadcasts: 4 rows' activations as vectors, 1 weight load widened, 8 FMAs
 *   rows4       decode.c's assembly loop for 4 rows x 2 blocks (rows4_two_blocks: 8 sums, a parity
 *               at a time), 16 FMAs a pair, over 64 pairs (4 KB of weights)
 *   rows6       the same for 6 rows (rows6_two_blocks: 12 sums), 24 FMAs a pair
 *   rows4x3     decode.c's assembly loop for 4 rows x 3 blocks (rows4_three_blocks: 12 sums, a
 *               broadcast for 3 FMAs), 24 FMAs a pair
 *
 *     cc -O3 -march=native -std=gnu11 -fopenmp -w bench/loop_shapes.c -o /tmp/loop_shapes -lm && /tmp/loop_shapes
 */
#include "../gptcli/infer/decode.c"
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ITERATIONS 4000000L /* (a multiple of 64) */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define SUMS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define DECLARE(i) __m256 a##i = _mm256_set1_ps(0.1f * i);
#define ADD_UP(i) +a##i[0]
/* one row's activation pair (xe, xo) against two blocks' even and odd weights, into sums j, k */
#define ROW(i, j, k)                                                                                 \
    {                                                                                                \
        const __m256 xe = _mm256_broadcast_ss(m + 2 * i), xo = _mm256_broadcast_ss(m + 2 * i + 1); \
        a##j = _mm256_fmadd_ps(e0, xe, a##j);                                                        \
        a##j = _mm256_fmadd_ps(o0, xo, a##j);                                                        \
        a##k = _mm256_fmadd_ps(e1, xe, a##k);                                                        \
        a##k = _mm256_fmadd_ps(o1, xo, a##k);                                                        \
    }

/* GFLOP/s of FMAS FMAs of 8 lanes an iteration, ITERATIONS iterations on each of 2 threads, the
 * best of 5 rounds: each thread runs the rest (its loop), adding its sums into `total` */
#define GFLOPS_OF(FMAS, ...)                                                                         \
    double best = 1e9;                                                                               \
    float total = 0.f;                                                                               \
    for (int round = 0; round < 5; round++) {                                                        \
        const double t0 = now();                                                                     \
        _Pragma("omp parallel num_threads(2) reduction(+ : total)") { __VA_ARGS__ }                  \
        const double t = now() - t0;                                                                 \
        best = t < best ? t : best;                                                                  \
    }                                                                                                \
    if (total == 12345.f) puts(""); /* (the sums are used) */                                        \
    return 2.0 * 2 * 8 * (FMAS) * ITERATIONS / best / 1e9;

/* shape_NAME(): GFLOP/s on 2 threads of a loop whose iteration is the rest (FMAS FMAs of 8 lanes),
 * each shape a loop of its own (one loop testing the shape each iteration ran 1.2x to 1.4x slower) */
#define SHAPE(NAME, FMAS, ...)                                                                        \
    static double shape_##NAME(void) {                                                               \
        GFLOPS_OF(                                                                                   \
            FMAS, float *restrict mem = aligned_alloc(64, 16384);                                    \
            for (int i = 0; i < 4096; i++) mem[i] = 1e-3f * (i % 97);                                \
            SUMS(DECLARE)                                                                            \
            const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);                     \
            const __m256i high = _mm256_set1_epi32((int)0xffff0000u);                                \
            (void)b, (void)c, (void)high;                                                            \
            for (long j = 0; j < ITERATIONS; j++) {                                                  \
                const float *m = mem + (j & 63) * 16; /* (moves over 4 KB, as a block's do) */      \
                (void)m;                                                                             \
                __VA_ARGS__                                                                          \
            } total += 0.f SUMS(ADD_UP);                                                             \
            free(mem);)                                                                              \
    }

#define PEAK(i) a##i = _mm256_fmadd_ps(a##i, b, c), a##i = _mm256_fmadd_ps(a##i, c, b);
SHAPE(peak, 16, SUMS(PEAK))

#define BROADCAST(i)                                                                                 \
    {                                                                                                \
        const __m256 x = _mm256_broadcast_ss(m + i);                                                 \
        a##i = _mm256_fmadd_ps(x, b, a##i), a##i = _mm256_fmadd_ps(x, c, a##i);                      \
    }
SHAPE(broadcasts, 16, SUMS(BROADCAST))

SHAPE(kernel, 16, {
    const __m256i v0 = _mm256_loadu_si256((const __m256i *)(m + 1024));
    const __m256i v1 = _mm256_loadu_si256((const __m256i *)(m + 1032));
    const __m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
    const __m256 o0 = _mm256_castsi256_ps(_mm256_and_si256(v0, high));
    const __m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
    const __m256 o1 = _mm256_castsi256_ps(_mm256_and_si256(v1, high));
    ROW(0, 0, 1) ROW(1, 2, 3) ROW(2, 4, 5) ROW(3, 6, 7)
})

SHAPE(fp32, 16, {
    const __m256 e0 = _mm256_load_ps(m + 1024), o0 = _mm256_load_ps(m + 1032);
    const __m256 e1 = _mm256_load_ps(m + 2048), o1 = _mm256_load_ps(m + 2056);
    ROW(0, 0, 1) ROW(1, 2, 3) ROW(2, 4, 5) ROW(3, 6, 7)
})

SHAPE(dot, 8, {
    const __m256 x0 = _mm256_load_ps(m), x1 = _mm256_load_ps(m + 8);
    const __m256 x2 = _mm256_load_ps(m + 1024), x3 = _mm256_load_ps(m + 1032);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(m + 2048));
    const __m256 e = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    const __m256 o = _mm256_castsi256_ps(_mm256_and_si256(v, high));
    a0 = _mm256_fmadd_ps(e, x0, a0), a1 = _mm256_fmadd_ps(e, x1, a1);
    a2 = _mm256_fmadd_ps(e, x2, a2), a3 = _mm256_fmadd_ps(e, x3, a3);
    a4 = _mm256_fmadd_ps(o, x0, a4), a5 = _mm256_fmadd_ps(o, x1, a5);
    a6 = _mm256_fmadd_ps(o, x2, a6), a7 = _mm256_fmadd_ps(o, x3, a7);
})

/* shape_NAME(): GFLOP/s of one of decode.c's assembly loops, M rows x B blocks over 64 pairs a
 * call (CALL, on x, w and acc), which a build for AVX2 without AVX-512 on x86-64 has (0
 * elsewhere) */
#ifdef HAVE_ROWS_ASM
#define ASM_SHAPE(NAME, M, B, CALL)                                                                  \
    static double shape_##NAME(void) {                                                               \
        GFLOPS_OF(                                                                                   \
            2 * (M) * (B), float *restrict x = aligned_alloc(64, 64 * (M) * 8);                      \
            uint16_t *restrict w = aligned_alloc(64, (B) * 64 * 32);                                 \
            for (int i = 0; i < 64 * (M) * 2; i++) x[i] = 1e-3f * (i % 97);                          \
            for (int i = 0; i < (B) * 64 * 16; i++) w[i] = f32_to_bf16(1e-3f * (i % 89));            \
            __m256 acc[12];                                                                          \
            for (int a = 0; a < 12; a++) acc[a] = _mm256_setzero_ps();                               \
            /* (ITERATIONS pairs: 64 a call) */                                                      \
            for (long j = 0; j < ITERATIONS / 64; j++) CALL;                                         \
            for (int a = 0; a < (M) * (B); a++) total += acc[a][0];                                  \
            free(x), free(w);)                                                                       \
    }
#else
#define ASM_SHAPE(NAME, M, B, CALL)                                                                  \
    static double shape_##NAME(void) { return 0; }
#endif
ASM_SHAPE(rows4, 4, 2, rows4_two_blocks(w, w + 64 * 16, x, 64, acc))
ASM_SHAPE(rows6, 6, 2, rows6_two_blocks(w, w + 64 * 16, x, 64, acc))
ASM_SHAPE(rows4x3, 4, 3, rows4_three_blocks(w, w + 64 * 16, w + 128 * 16, x, 64, acc))

int main(int argc, char **argv) {
    const struct {
        const char *name;
        double (*run)(void);
    } shapes[] = {{"peak", shape_peak}, {"broadcasts", shape_broadcasts}, {"kernel", shape_kernel},
                  {"fp32", shape_fp32}, {"dot", shape_dot},
                  {"rows4", shape_rows4}, {"rows6", shape_rows6},
                  {"rows4x3", shape_rows4x3}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (argc < 2 || strcmp(argv[1], shapes[i].name) == 0) {
            const double rate = shapes[i].run();
            if (rate > 0) printf("%-10s %4.0f GFLOP/s\n", shapes[i].name, rate);
            else printf("%-10s (decode.c has this loop only for AVX2 without AVX-512, on x86-64)\n", shapes[i].name);
        }
    return 0;
}
