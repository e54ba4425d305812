/* One decoding step of a GPT-2 on the CPU: every row's new token through every block and the
 * unembedding, in one call, with no Python and no framework between the operations.
 *
 * Decoding a token reads every weight once and does little arithmetic with it, so its
 * speed is the speed at which the weights stream from memory. The products are written so
 * that each weight is read from memory once for all the rows of the batch (beams, samples;
 * past 16 rows, a block of weights is read again from the cache for each further 16), in the
 * dtype it is stored in: fp32, bf16 (widened to fp32 as it is read, or, with AVX512-BF16,
 * multiplied in pairs from a copy packed for it) or int8 with one fp32 scale per output
 * row. Activations, LayerNorm, softmax and every sum stay in fp32. The work of each
 * product is split across threads by outputs (OpenMP).
 *
 * Built by gptcli/infer/kernels.py with the machine's own compiler and instruction set
 * (-O3 -march=native -fopenmp), and called through ctypes with the tensors' pointers.
 */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdlib.h>
#include <string.h>

enum { F32 = 0, BF16 = 1, I8 = 2 };

typedef struct {
    const void *w;           /* (n, k): fp32, bf16 or int8 */
    const float *scale;      /* (n) for int8, else NULL */
    const float *bias;       /* (n) or NULL */
    int dtype, n, k;
    const void *packed;      /* bf16 or int8 weights packed by gptcli_pack, or NULL */
} Mat;

enum { STORE = 0, ADD = 1, GELU = 2 }; /* what a product does with its result */

typedef struct {
    const float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
    Mat attn, proj, fc, out;
} Layer;

typedef struct {
    int n_layer, n_head, n_embd, vocab, block;
    int emb_dtype;        /* of wte and wpe (the lookups), fp32 or bf16 */
    const void *wte, *wpe;
    const float *lnf_w, *lnf_b;
    Mat head;             /* the unembedding: wte itself, or its int8 copy */
    const Layer *layers;
    int cache_dtype;      /* of the KV cache: fp32 or bf16 */
} Model;

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* NaN */
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* With AVX512-BF16, the products with bf16 weights read them from a copy packed for them:
 * for each block of 16 outputs, for each pair of inputs (k, k + 1), the 16 outputs' two
 * weights side by side, so that one vector holds 16 outputs' pairs and one instruction
 * adds them times the same pair of activations (broadcast) to 16 sums. A block's weights
 * are one stream, read once for up to 16 rows whose sums stay in registers over all of k;
 * nothing is summed across a vector at the end.
 *
 * Each thread reads its blocks one after another, so its weights are a single stream, and
 * asks for the weights AHEAD_BYTES ahead of those it multiplies: the hardware's prefetchers
 * alone let the stream fall behind as soon as the core has work to do with each weight
 * (several rows), as the out-of-order core then reads only a few hundred bytes ahead. GPT-2
 * 124M on a Zen 5, against tiles of 4 blocks (4 streams a thread) for up to 6 rows with the
 * next tile asked for ahead, whole steps alternated (bench/step_ab.sh): one row 0.99x
 * the time, 4 rows 0.89x to 0.95x, 16 rows 0.90x to 0.94x; int8 weights 0.89x, 0.96x,
 * 0.95x. The activations' pair is broadcast by the product itself (an embedded broadcast;
 * compilers broadcast it into a register first, an instruction more per product: 16 rows
 * 0.99x instead of 0.90x). */
#define PACK 16 /* outputs per block of the packed products; the packed copy's rows are rounded up to it */
#ifndef AHEAD_BYTES
#define AHEAD_BYTES 8192 /* how far ahead a product asks for its weights (4 to 16 KB alike on a Zen 5) */
#endif
/* a product is about to read `bytes` of weights at p (a constant, at most two lines): ask for
 * those AHEAD_BYTES further on (prefetcht0; no loop, which kept GCC from unrolling the
 * products around it: their sums then went through the stack) */
static inline __attribute__((always_inline)) void ask_weights(const void *p, int bytes) {
    __builtin_prefetch((const char *)p + AHEAD_BYTES, 0, 3);
    if (bytes > 64) __builtin_prefetch((const char *)p + AHEAD_BYTES + 64, 0, 3);
}
/* a pair of bf16 or int16 activations, as the products' broadcasts read it from the rows
 * (may_alias: the rows were written as 16-bit values) */
typedef int32_t __attribute__((may_alias, aligned(2))) pair32;
/* dst += src . (the pair at mem, broadcast to 16): the instruction `op` with its memory operand
 * broadcast, in either assembler syntax */
#define BROADCAST_OP(op, dst, src, mem)                                                              \
    __asm__("{" op " %[x]%{1to16%}, %[w], %[a]|" op " %[a], %[w], %[x]%{1to16%}}"                   \
            : [a] "+v"(dst)                                                                          \
            : [w] "v"(src), [x] "m"(*(const pair32 *)(mem)))
/* A packed block's products, in a block function whose scope holds w (the block's packed
 * weights), x (its M rows of activation pairs, k apart), k, M, NA and acc[M][NA]: for every
 * pair p of k / 2, acc[i][p % NA] op= LOAD(the pair's 16 outputs' weights, of pair_bytes) .
 * (row i's pair p, broadcast), the pairs past the last whole group of NA into acc[i][0] */
#define PAIR_PRODUCTS(op, T, LOAD, pair_bytes, P, A)                                                 \
    do {                                                                                             \
        const T wv_ = LOAD(w + (size_t)(P) * 32);                                                    \
        ask_weights(w + (size_t)(P) * 32, pair_bytes);                                               \
        for (int i_ = 0; i_ < M; i_++) BROADCAST_OP(op, acc[i_][A], wv_, x + (size_t)i_ * k + 2 * (P)); \
    } while (0)
#define PRODUCTS_OF_PAIRS(op, T, LOAD, pair_bytes)                                                   \
    do {                                                                                             \
        const int pairs_ = k / 2;                                                                    \
        int p_ = 0;                                                                                  \
        for (; p_ + NA <= pairs_; p_ += NA)                                                          \
            for (int a_ = 0; a_ < NA; a_++) PAIR_PRODUCTS(op, T, LOAD, pair_bytes, p_ + a_, a_);     \
        for (; p_ < pairs_; p_++) PAIR_PRODUCTS(op, T, LOAD, pair_bytes, p_, 0);                     \
    } while (0)
/* BLOCK(M, NA) for the rows r .. r + M of a product, M = min(rows - r, 16) a constant in each
 * call (so that the block's loops over M unroll and its sums stay in registers), NA sums per
 * row: enough sums in flight for few rows (8 rows with 2 sums each, from the L3 cache on a
 * Zen 5: 1.1x as fast as with one; 12 and 14 rows with 2: slower, short of registers) */
#define FOR_ROWS_OF_16(rows, r, BLOCK)                 \
    switch ((rows) - (r) < 16 ? (rows) - (r) : 16) {   \
    case 1: BLOCK(1, 4); break;                        \
    case 2: BLOCK(2, 4); break;                        \
    case 3: BLOCK(3, 2); break;                        \
    case 4: BLOCK(4, 2); break;                        \
    case 5: BLOCK(5, 2); break;                        \
    case 6: BLOCK(6, 2); break;                        \
    case 7: BLOCK(7, 2); break;                        \
    case 8: BLOCK(8, 2); break;                        \
    case 9: BLOCK(9, 1); break;                        \
    case 10: BLOCK(10, 1); break;                      \
    case 11: BLOCK(11, 1); break;                      \
    case 12: BLOCK(12, 1); break;                      \
    case 13: BLOCK(13, 1); break;                      \
    case 14: BLOCK(14, 1); break;                      \
    case 15: BLOCK(15, 1); break;                      \
    default: BLOCK(16, 1); break;                      \
    }

/* outputs per block of the packed bf16 weights: 16 (one AVX-512 vector of sums), or 8 for
 * AVX2's products (see packed_block there); int8's are always 16 */
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define PACK_BF16 8
#else
#define PACK_BF16 16
#endif
/* the packed copy of w (n, k), k even, bf16 or int8, in blocks of W outputs: (ceil(n / W)
 * blocks, k / 2, W, 2), zeros past n (the copy has room for ceil(n / PACK) * PACK rows) */
#define PACK_PAIRS(T, W)                                                                            \
    for (int b = 0; b < (n + (W) - 1) / (W); b++) {                                                 \
        const T *rows[16];                                                                          \
        for (int q = 0; q < (W); q++) rows[q] = b * (W) + q < n ? (const T *)w + (size_t)(b * (W) + q) * k : NULL; \
        T *o = (T *)out + (size_t)b * pairs * 2 * (W);                                              \
        for (int p = 0; p < pairs; p++, o += 2 * (W))                                               \
            for (int q = 0; q < (W); q++) {                                                         \
                o[2 * q] = rows[q] ? rows[q][2 * p] : 0;                                            \
                o[2 * q + 1] = rows[q] ? rows[q][2 * p + 1] : 0;                                    \
            }                                                                                       \
    }
void gptcli_pack(const void *w, int dtype, int n, int k, void *out, int threads) {
    const int pairs = k / 2;
#ifdef _OPENMP
    if (threads < 1) threads = 1;
#else
    (void)threads;
#endif
    if (dtype == BF16) {
#pragma omp parallel for num_threads(threads) schedule(static)
        PACK_PAIRS(uint16_t, PACK_BF16)
    } else {
#pragma omp parallel for num_threads(threads) schedule(static)
        PACK_PAIRS(int8_t, 16)
    }
}

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* Activations as int16 with one scale per row, for the products with int8 weights where
 * the CPU multiplies integers in pairs (AVX512-VNNI, AVX2): xq (rows, k) = round(x / sx[r]),
 * sx[r] = max |x[r]| / Q. Q keeps any sum of k products within int32 (|weight| <= 127), and
 * is 5,500 or more for k <= 3,072: each activation within 1/11,000 of its row's largest
 * (finer than bf16's rounding for those over a twentieth of it, coarser below). A row
 * holding a NaN or an infinity gets the scale NaN (and zeros), so that its products are
 * NaN, as the model's own are, not finite. */
static __attribute__((unused)) void quantize_rows(const float *x, int rows, int k, int16_t *xq, float *sx) {
    const float Q = floorf(2147483647.f / (127.f * (float)k)) - 1.f, top = Q < 32767.f ? Q : 32767.f;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * k;
        int16_t *out = xq + (size_t)r * k;
        float amax = 0.f;
        int bad = 0;
#pragma omp simd reduction(max : amax) reduction(| : bad)
        for (int i = 0; i < k; i++) {
            amax = fabsf(xr[i]) > amax ? fabsf(xr[i]) : amax;
            bad |= !(fabsf(xr[i]) <= FLT_MAX);
        }
        if (bad) {
            sx[r] = NAN;
            memset(out, 0, sizeof(int16_t) * (size_t)k);
            continue;
        }
        const float s = amax > 1e-30f ? amax / top : 1.f, inv = 1.f / s; /* (1 / s finite) */
        sx[r] = s;
        int i = 0;
#if defined(__AVX512BW__)
        for (; i + 16 <= k; i += 16)
            _mm256_storeu_si256((__m256i *)(out + i),
                                _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xr + i), _mm512_set1_ps(inv)))));
#elif defined(__AVX2__)
        for (; i + 8 <= k; i += 8) {
            const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xr + i), _mm256_set1_ps(inv)));
            _mm_storeu_si128((__m128i *)(out + i), _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
        }
#endif
        for (; i < k; i++) out[i] = (int16_t)lrintf(xr[i] * inv);
    }
}

/* where quantize_rows's row scales go in a thread's room xb, after the rows (rows, k) as
 * int16: 4-byte aligned */
static inline float *row_scales(uint16_t *xb, int rows, int k) {
    return (float *)(xb + ((size_t)rows * k + 1) / 2 * 2);
}

/* what a product does with its result s for row r, output j */
static inline void put(const Mat *m, float *y, int r, int j, float s, int mode) {
    s += m->bias ? m->bias[j] : 0.f;
    float *out = y + (size_t)r * m->n + j;
    *out = mode == ADD ? *out + s : s;
}

/* While attention reads a (row, head)'s key or values at a slot, it asks for those `ahead`
 * bytes on (0: none): the same head ATTEND_AHEAD slots further on, whose slots are C apart
 * (into L2; a hint only: near a row's end it may ask for room not yet written). When each
 * head's slots were one short stream and the next head's the next asked for, a whole 16-row
 * step of GPT-2 124M was 6% faster on a Zen 4. __builtin_prefetch, as _mm_prefetch here was
 * dropped by GCC 12's interprocedural optimizations (its `ahead` then an unused argument). */
static inline void ask_ahead(const void *p, ptrdiff_t ahead, int bytes) {
    if (ahead)
        for (int b = 0; b < bytes; b += 64) __builtin_prefetch((const char *)p + ahead + b, 0, 2);
}

/* the dot products of a weight row with an fp32 activation row, by the weight's dtype:
 * AVX-512 or AVX2 where the compiler targets them, plain loops elsewhere */
#if defined(__AVX512F__)

static float dot_f32(const float *w, const float *x, int k) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= k; i += 32) {
        ask_weights(w + i, 128); /* (as rows16_wide) */
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    for (; i < k; i++) s += w[i] * x[i];
    return s;
}

static inline __m512 widen_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static float dot_bf16(const uint16_t *w, const float *x, int k) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= k; i += 32) {
        ask_weights(w + i, 64);
        a0 = _mm512_fmadd_ps(widen_bf16(w + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(widen_bf16(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    for (; i < k; i++) s += bf16_to_f32(w[i]) * x[i];
    return s;
}

static inline __m512 widen_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

static float dot_i8(const int8_t *w, const float *x, int k) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= k; i += 32) {
        ask_weights(w + i, 32);
        a0 = _mm512_fmadd_ps(widen_i8(w + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(widen_i8(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    for (; i < k; i++) s += (float)w[i] * x[i];
    return s;
}

/* the sums of a[0..15], in order, as one vector (a transposing tree: 45 operations where 16
 * separate horizontal sums take about 130) */
static inline __m512 sum16(const __m512 *a) {
    __m512 t[8], u[4];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        const __m512d x = _mm512_castps_pd(t[2 * i]), y = _mm512_castps_pd(t[2 * i + 1]);
        u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    const __m512 v0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 v1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* p[s] = K[s] . q * scale for s < n: keys of hs values (fp32 or bf16), key s at K + at[s]
 * (elements), 16 keys summed at once; where it does not apply (hs not a multiple of 16), 0
 * and the caller goes on */
#define HAVE_SCORES16 1
static int scores16(const void *K, const size_t *at, int dtype, const float *q, int hs, int n, float scale, float *p,
                    ptrdiff_t ahead) {
    if (hs % 16) return 0;
    const int size = dtype == BF16 ? 2 : 4;
    int s = 0;
    for (; s + 16 <= n; s += 16) {
        __m512 acc[16];
        for (int t = 0; t < 16; t++) {
            __m512 a = _mm512_setzero_ps();
            const size_t row = at[s + t];
            ask_ahead((const char *)K + row * size, ahead, hs * size);
            for (int i = 0; i < hs; i += 16) {
                const __m512 kv = dtype == BF16 ? widen_bf16((const uint16_t *)K + row + i) : _mm512_loadu_ps((const float *)K + row + i);
                a = _mm512_fmadd_ps(kv, _mm512_loadu_ps(q + i), a);
            }
            acc[t] = a;
        }
        _mm512_storeu_ps(p + s, _mm512_mul_ps(sum16(acc), _mm512_set1_ps(scale)));
    }
    return s;
}

/* acc[v] += p[s] V[s][16v .. 16v + 16) for v < NV, s < n, V[s] at V + at[s]: the values' rows
 * read once each, in order, NV vectors of sums in registers */
static inline __attribute__((always_inline)) void weighted_columns(const void *V, const size_t *at, int dtype,
                                                                   const float *p, int n, __m512 *acc, const int NV,
                                                                   ptrdiff_t ahead) {
    if (dtype == BF16)
        for (int s = 0; s < n; s++) {
            const __m512 w = _mm512_set1_ps(p[s]);
            const uint16_t *row = (const uint16_t *)V + at[s];
            ask_ahead(row, ahead, 32 * NV);
            for (int v = 0; v < NV; v++) acc[v] = _mm512_fmadd_ps(w, widen_bf16(row + 16 * v), acc[v]);
        }
    else
        for (int s = 0; s < n; s++) {
            const __m512 w = _mm512_set1_ps(p[s]);
            const float *row = (const float *)V + at[s];
            ask_ahead(row, ahead, 64 * NV);
            for (int v = 0; v < NV; v++) acc[v] = _mm512_fmadd_ps(w, _mm512_loadu_ps(row + 16 * v), acc[v]);
        }
}

/* out[i] = scale * sum over s < n of p[s] V[s][i]: values of hs (fp32 or bf16), V[s] at V +
 * at[s], 64 columns at a time in registers; 0 where it does not apply (hs not a multiple of
 * 16). A slot of weight 0 (masked) adds 0 x its values, which are finite (the cache starts
 * zeroed). */
#define HAVE_WEIGHTED16 1
static int weighted16(const void *V, const size_t *at, int dtype, const float *p, int n, int hs, float scale, float *out,
                      ptrdiff_t ahead) {
    if (hs % 16) return 0;
    const size_t size = dtype == BF16 ? 2 : 4;
    for (int c = 0; c < hs;) {
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        const int nv = hs - c >= 64 ? 4 : 1;
        const void *Vc = (const char *)V + (size_t)c * size;
        if (nv == 4)
            weighted_columns(Vc, at, dtype, p, n, acc, 4, ahead);
        else
            weighted_columns(Vc, at, dtype, p, n, acc, 1, ahead);
        for (int v = 0; v < nv; v++, c += 16) _mm512_storeu_ps(out + c, _mm512_mul_ps(acc[v], _mm512_set1_ps(scale)));
    }
    return 1;
}

/* out[q] = W[j + q] . x for 16 consecutive weight rows of any dtype, widened to fp32 on the
 * way (k % 32 == 0; int8 before its scale), summed 16 at once by sum16. The rows are read one
 * after another, so a thread's weights are one stream, asked for AHEAD_BYTES ahead as the
 * packed products ask for theirs (fp32, one row, whole steps on a Zen 5: 0.86x to 0.95x the
 * time) */
#define HAVE_ROWS16 1
static void rows16_wide(const void *w, int dtype, const float *x, int k, float *out) {
    __m512 acc[16];
    for (int q = 0; q < 16; q++) {
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        if (dtype == I8) {
            const int8_t *r = (const int8_t *)w + (size_t)q * k;
            for (int i = 0; i < k; i += 32) {
                ask_weights(r + i, 32);
                a0 = _mm512_fmadd_ps(widen_i8(r + i), _mm512_loadu_ps(x + i), a0);
                a1 = _mm512_fmadd_ps(widen_i8(r + i + 16), _mm512_loadu_ps(x + i + 16), a1);
            }
        } else if (dtype == BF16) {
            const uint16_t *r = (const uint16_t *)w + (size_t)q * k;
            for (int i = 0; i < k; i += 32) {
                ask_weights(r + i, 64);
                a0 = _mm512_fmadd_ps(widen_bf16(r + i), _mm512_loadu_ps(x + i), a0);
                a1 = _mm512_fmadd_ps(widen_bf16(r + i + 16), _mm512_loadu_ps(x + i + 16), a1);
            }
        } else {
            const float *r = (const float *)w + (size_t)q * k;
            for (int i = 0; i < k; i += 32) {
                ask_weights(r + i, 128);
                a0 = _mm512_fmadd_ps(_mm512_loadu_ps(r + i), _mm512_loadu_ps(x + i), a0);
                a1 = _mm512_fmadd_ps(_mm512_loadu_ps(r + i + 16), _mm512_loadu_ps(x + i + 16), a1);
            }
        }
        acc[q] = _mm512_add_ps(a0, a1);
    }
    _mm512_storeu_ps(out, sum16(acc));
}

#if defined(__AVX512BF16__)
#define HAVE_BF16_PAIRS 1
/* bf16 weights times bf16 activations, 32 pairs per instruction, summed in fp32 (AVX512-BF16:
 * no widening of the weights on the way) */
static float dot_bf16_pairs(const uint16_t *w, const uint16_t *x, int k) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 64 <= k; i += 64) {
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w + i), (__m512bh)_mm512_loadu_si512(x + i));
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(w + i + 32), (__m512bh)_mm512_loadu_si512(x + i + 32));
    }
    for (; i + 32 <= k; i += 32)
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w + i), (__m512bh)_mm512_loadu_si512(x + i));
    float s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    for (; i < k; i++) s += bf16_to_f32(w[i]) * bf16_to_f32(x[i]);
    return s;
}

/* x (n) to bf16, rounding to nearest even as f32_to_bf16 does, 32 at a time */
static void to_bf16(const float *x, uint16_t *y, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
        _mm512_storeu_si512(y + i, (__m512i)v);
    }
    for (; i < n; i++) y[i] = f32_to_bf16(x[i]);
}

/* p[s] = K[s] . q * scale for the first keys (bf16, key s at K + at[s]), 16 at a time, the
 * query in bf16 too (as the model's own bf16 code has it), hs % 32 == 0; returns how many */
static int scores16_pairs(const uint16_t *K, const size_t *at, const uint16_t *q, int hs, int n, float scale, float *p,
                          ptrdiff_t ahead) {
    int s = 0;
    for (; s + 16 <= n; s += 16) {
        __m512 acc[16];
        for (int t = 0; t < 16; t++) {
            const uint16_t *key = K + at[s + t];
            ask_ahead(key, ahead, 2 * hs);
            __m512 a = _mm512_setzero_ps();
            for (int i = 0; i < hs; i += 32)
                a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(key + i), (__m512bh)_mm512_loadu_si512(q + i));
            acc[t] = a;
        }
        _mm512_storeu_ps(p + s, _mm512_mul_ps(sum16(acc), _mm512_set1_ps(scale)));
    }
    return s;
}

/* the products from packed bf16 weights (gptcli_pack) */
#define HAVE_PACKED 1

/* a pair of inputs' weights for 16 outputs, as the products multiply them */
static inline __attribute__((always_inline)) __m512bh load_bf16_pairs(const uint16_t *p) { return (__m512bh)_mm512_loadu_si512(p); }

/* y[r0 + i][j0 .. j0 + 16) for i < M (M <= 16) from the packed block of 16 outputs at w and
 * the rows x (M, k) in bf16, then stored, or added to y, with the bias; outputs past n (the
 * packing's zeros) are not written. Each row's sum is split over NA alternate pairs (NA
 * sums in flight, where few rows would wait on one sum); each activation pair is broadcast
 * from memory by the product itself. */
static inline __attribute__((always_inline)) void packed_block(const Mat *m, const uint16_t *w, const uint16_t *x,
                                                               float *y, int r0, int j0, int mode, const int M,
                                                               const int NA) {
    const int k = m->k, n = m->n;
    __m512 acc[16][4];
    for (int i = 0; i < M; i++)
        for (int a = 0; a < NA; a++) acc[i][a] = _mm512_setzero_ps();
    PRODUCTS_OF_PAIRS("vdpbf16ps", __m512bh, load_bf16_pairs, 64);
    const __mmask16 keep = n - j0 >= 16 ? 0xffff : (__mmask16)((1u << (n - j0)) - 1);
    const __m512 bias = m->bias ? _mm512_maskz_loadu_ps(keep, m->bias + j0) : _mm512_setzero_ps();
    for (int i = 0; i < M; i++) {
        float *out = y + (size_t)(r0 + i) * n + j0;
        __m512 v = acc[i][0];
        for (int a = 1; a < NA; a++) v = _mm512_add_ps(v, acc[i][a]);
        v = _mm512_add_ps(v, bias);
        if (mode == ADD) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(keep, out));
        _mm512_mask_storeu_ps(out, keep, v);
    }
}

/* the rows x (rows, k) as packed_bf16 takes them: in bf16 */
static void prepare_packed(const float *x, int rows, int k, uint16_t *xb) { to_bf16(x, xb, (size_t)rows * k); }

/* the outputs [lo, hi) (lo a multiple of PACK) of a product with packed bf16 weights, the
 * rows (rows, k) made bf16 in xb by prepare_packed */
static void packed_bf16(const Mat *m, const uint16_t *xb, float *y, int rows, int mode, int lo, int hi) {
    for (int j = lo; j < hi; j += PACK) {
        const uint16_t *w = (const uint16_t *)m->packed + (size_t)j * m->k;
        for (int r = 0; r < rows; r += 16) {
            const uint16_t *xr = xb + (size_t)r * m->k;
#define BLOCK(M, NA) packed_block(m, w, xr, y, r, j, mode, M, NA)
            FOR_ROWS_OF_16(rows, r, BLOCK)
#undef BLOCK
        }
    }
}
#endif


#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* The products with int8 weights read them packed as the bf16 ones are, widened to int16
 * pairs, and multiply them with the activations carried as int16 with one scale per row
 * (quantize_rows; AVX512-VNNI: 32 products summed into 16 int32 sums per instruction, where
 * widening every weight to fp32 took three instructions per 16). */
#define HAVE_PACKED_I8 1

/* a pair of inputs' int8 weights for 16 outputs (32 bytes), widened to int16 */
static inline __attribute__((always_inline)) __m512i load_i8_pairs(const int8_t *p) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p));
}

/* packed_block for int8 weights (16 outputs' pairs in 32 bytes, widened to int16) and int16
 * activations x (M, k) of scales sx (M) */
static inline __attribute__((always_inline)) void packed_block_i8(const Mat *m, const int8_t *w, const int16_t *x,
                                                                  const float *sx, float *y, int r0, int j0, int mode,
                                                                  const int M, const int NA) {
    const int k = m->k, n = m->n;
    __m512i acc[16][4];
    for (int i = 0; i < M; i++)
        for (int a = 0; a < NA; a++) acc[i][a] = _mm512_setzero_si512();
    PRODUCTS_OF_PAIRS("vpdpwssd", __m512i, load_i8_pairs, 32);
    const __mmask16 keep = n - j0 >= 16 ? 0xffff : (__mmask16)((1u << (n - j0)) - 1);
    const __m512 scale = _mm512_maskz_loadu_ps(keep, m->scale + j0);
    const __m512 bias = m->bias ? _mm512_maskz_loadu_ps(keep, m->bias + j0) : _mm512_setzero_ps();
    for (int i = 0; i < M; i++) {
        float *out = y + (size_t)(r0 + i) * n + j0;
        __m512i sum = acc[i][0];
        for (int a = 1; a < NA; a++) sum = _mm512_add_epi32(sum, acc[i][a]);
        const __m512 s = _mm512_mul_ps(scale, _mm512_set1_ps(sx[i]));
        __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), s, bias);
        if (mode == ADD) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(keep, out));
        _mm512_mask_storeu_ps(out, keep, v);
    }
}

/* the outputs [lo, hi) of a product with packed int8 weights; xq, sx: the activations as
 * int16 (rows, k) and their scales (rows), from prepare */
static void packed_product_i8(const Mat *m, const int16_t *xq, const float *sx, float *y, int rows, int mode, int lo,
                              int hi) {
    for (int j = lo; j < hi; j += PACK) {
        const int8_t *w = (const int8_t *)m->packed + (size_t)j * m->k;
        for (int r = 0; r < rows; r += 16) {
            const int16_t *xr = xq + (size_t)r * m->k;
#define BLOCK(M, NA) packed_block_i8(m, w, xr, sx + r, y, r, j, mode, M, NA)
            FOR_ROWS_OF_16(rows, r, BLOCK)
#undef BLOCK
        }
    }
}
#endif

#elif defined(__AVX2__) && defined(__FMA__)

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The fp32 dot products of one row (dot_f32, dots4_f32) and of several (f32_rows_block) sum
 * in one order: per output one vector of sums, each 16 inputs' first 8 then last 8 added to
 * it, summed across at the end (hsum256), then the inputs past the last 16 one by one. So a
 * row's logits are the same bits whatever else is in the batch (a sample of a batch is what
 * its seed gives alone; in two orders, near-ties went either way).
 * (its weights are not asked for ahead: on a Zen 3, a whole fp32 step of one row took 1.08x
 * to 1.12x the time when they were) */
static float dot_f32(const float *w, const float *x, int k) {
    __m256 a = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= k; i += 16)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8),
                            _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a));
    float s = hsum256(a);
    for (; i < k; i++) s += w[i] * x[i];
    return s;
}

/* dot_f32 of 4 weight rows at once, each summed as dot_f32 sums it (the same result): for a
 * single row, 4 streams of weights a thread (from 4 parts of its share of the outputs) read
 * more of the memory's bandwidth than one (see packed_bf16) */
#define HAVE_DOTS4 1
static void dots4_f32(const float *const *w, const float *x, int k, float *out) {
    __m256 a[4];
    for (int q = 0; q < 4; q++) a[q] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= k; i += 16) {
        const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
        for (int q = 0; q < 4; q++)
            a[q] = _mm256_fmadd_ps(_mm256_loadu_ps(w[q] + i + 8), x1, _mm256_fmadd_ps(_mm256_loadu_ps(w[q] + i), x0, a[q]));
    }
    for (int q = 0; q < 4; q++) {
        float t = hsum256(a[q]);
        for (int r = i; r < k; r++) t += w[q][r] * x[r];
        out[q] = t;
    }
}

static inline __m256 widen_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

static float dot_bf16(const uint16_t *w, const float *x, int k) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= k; i += 16) {
        a0 = _mm256_fmadd_ps(widen_bf16(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(widen_bf16(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    float s = hsum256(_mm256_add_ps(a0, a1));
    for (; i < k; i++) s += bf16_to_f32(w[i]) * x[i];
    return s;
}

static inline __m256 widen_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* the sums of a[0..7], in order, as one vector */
static inline __m256 sum8(const __m256 *a) {
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* scores16 and weighted16 as the AVX-512 ones, 8 keys summed at once, 64 columns of values
 * in registers: on a Zen 3, one row at slot 900 spent half its step on attention when each
 * key was a dot product of its own and no slot was asked for ahead */
#define HAVE_SCORES16 1
static int scores16(const void *K, const size_t *at, int dtype, const float *q, int hs, int n, float scale, float *p,
                    ptrdiff_t ahead) {
    if (hs % 8) return 0;
    const int size = dtype == BF16 ? 2 : 4;
    int s = 0;
    for (; s + 8 <= n; s += 8) {
        __m256 acc[8];
        for (int t = 0; t < 8; t++) {
            __m256 a = _mm256_setzero_ps();
            const size_t row = at[s + t];
            ask_ahead((const char *)K + row * size, ahead, hs * size);
            for (int i = 0; i < hs; i += 8) {
                const __m256 kv = dtype == BF16 ? widen_bf16((const uint16_t *)K + row + i) : _mm256_loadu_ps((const float *)K + row + i);
                a = _mm256_fmadd_ps(kv, _mm256_loadu_ps(q + i), a);
            }
            acc[t] = a;
        }
        _mm256_storeu_ps(p + s, _mm256_mul_ps(sum8(acc), _mm256_set1_ps(scale)));
    }
    return s;
}

/* acc[v] += p[s] V[s][8v .. 8v + 8) for v < NV, s < n, V[s] at V + at[s] */
static inline __attribute__((always_inline)) void weighted_columns(const void *V, const size_t *at, int dtype,
                                                                   const float *p, int n, __m256 *acc, const int NV,
                                                                   ptrdiff_t ahead) {
    if (dtype == BF16)
        for (int s = 0; s < n; s++) {
            const __m256 w = _mm256_set1_ps(p[s]);
            const uint16_t *row = (const uint16_t *)V + at[s];
            ask_ahead(row, ahead, 16 * NV);
            for (int v = 0; v < NV; v++) acc[v] = _mm256_fmadd_ps(w, widen_bf16(row + 8 * v), acc[v]);
        }
    else
        for (int s = 0; s < n; s++) {
            const __m256 w = _mm256_set1_ps(p[s]);
            const float *row = (const float *)V + at[s];
            ask_ahead(row, ahead, 32 * NV);
            for (int v = 0; v < NV; v++) acc[v] = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 8 * v), acc[v]);
        }
}

#define HAVE_WEIGHTED16 1
static int weighted16(const void *V, const size_t *at, int dtype, const float *p, int n, int hs, float scale, float *out,
                      ptrdiff_t ahead) {
    if (hs % 8) return 0;
    const size_t size = dtype == BF16 ? 2 : 4;
    for (int c = 0; c < hs;) {
        __m256 acc[8];
        for (int v = 0; v < 8; v++) acc[v] = _mm256_setzero_ps();
        const int nv = hs - c >= 64 ? 8 : 1;
        const void *Vc = (const char *)V + (size_t)c * size;
        if (nv == 8)
            weighted_columns(Vc, at, dtype, p, n, acc, 8, ahead);
        else
            weighted_columns(Vc, at, dtype, p, n, acc, 1, ahead);
        for (int v = 0; v < nv; v++, c += 8) _mm256_storeu_ps(out + c, _mm256_mul_ps(acc[v], _mm256_set1_ps(scale)));
    }
    return 1;
}

/* The products with bf16 weights stored as they are (AVX2): one load of 16 weights gives
 * two vectors of fp32, their even ones shifted up and their odd ones masked (a bf16 is the
 * top half of an fp32), each multiplied with the activations' even or odd ones, split once
 * per product (split_even_odd), where widening 8 weights took two instructions and a load
 * of half the width. The products alone, built for AVX2 on a Zen 5, weights in the L3
 * cache: one row 0.98x the time, 4 rows 0.85x, 16 rows 0.93x; a whole one-row step from
 * memory 0.98x to 0.99x. */
#define HAVE_SPLIT_BF16 1
static void split_even_odd(const float *x, int k, float *xs) { /* xs: x's k / 2 even ones, then its odd ones */
    for (int i = 0; i < k / 2; i++) xs[i] = x[2 * i], xs[k / 2 + i] = x[2 * i + 1];
}

static float dot_bf16_split(const uint16_t *w, const float *xs, const float *x, int k) {
    const float *xe = xs, *xo = xs + k / 2;
    const __m256i high = _mm256_set1_epi32((int)0xffff0000u);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 32 <= k; i += 32) {
        ask_weights(w + i, 64);
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(w + i)), v1 = _mm256_loadu_si256((const __m256i *)(w + i + 16));
        a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)), _mm256_loadu_ps(xe + i / 2), a0);
        a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v0, high)), _mm256_loadu_ps(xo + i / 2), a1);
        a2 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v1, 16)), _mm256_loadu_ps(xe + i / 2 + 8), a2);
        a3 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v1, high)), _mm256_loadu_ps(xo + i / 2 + 8), a3);
    }
    for (; i + 16 <= k; i += 16) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(w + i));
        a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), _mm256_loadu_ps(xe + i / 2), a0);
        a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, high)), _mm256_loadu_ps(xo + i / 2), a1);
    }
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3)));
    for (; i < k; i++) s += bf16_to_f32(w[i]) * x[i];
    return s;
}

/* The products with int8 weights stored as they are (AVX2) multiply them, widened to
 * int16, with the activations as int16 (quantize_rows), in pairs summed into int32: two
 * instructions for 16 weights where widening them to fp32 took six, and the same integer
 * sums as the AVX512-VNNI products (GPT-2 124M on a Zen 5 built for AVX2, a whole step:
 * one row 0.87x to 0.93x the time, 4 rows 0.55x). */
#define HAVE_INT16_PAIRS 1
static inline int32_t hsum_epi32(__m256i a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static int32_t dot_i8_pairs(const int8_t *w, const int16_t *x, int k) {
    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
    int i = 0;
    for (; i + 32 <= k; i += 32) {
        ask_weights(w + i, 32);
        a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + i))),
                                                    _mm256_loadu_si256((const __m256i *)(x + i))));
        a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + i + 16))),
                                                    _mm256_loadu_si256((const __m256i *)(x + i + 16))));
    }
    for (; i + 16 <= k; i += 16)
        a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + i))),
                                                    _mm256_loadu_si256((const __m256i *)(x + i))));
    int32_t t = hsum_epi32(_mm256_add_epi32(a0, a1));
    for (; i < k; i++) t += (int32_t)w[i] * x[i];
    return t;
}

/* dot_i8_pairs of 4 weight rows at once (see dots4_f32) */
static void dots4_i8(const int8_t *const *w, const int16_t *x, int k, int32_t *out) {
    __m256i a[4][2];
    for (int q = 0; q < 4; q++) a[q][0] = a[q][1] = _mm256_setzero_si256();
    int i = 0;
    for (; i + 32 <= k; i += 32) {
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(x + i)), x1 = _mm256_loadu_si256((const __m256i *)(x + i + 16));
        for (int q = 0; q < 4; q++) {
            ask_weights(w[q] + i, 32);
            a[q][0] = _mm256_add_epi32(a[q][0], _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w[q] + i))), x0));
            a[q][1] = _mm256_add_epi32(a[q][1], _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w[q] + i + 16))), x1));
        }
    }
    for (int q = 0; q < 4; q++) {
        int t = i;
        for (; t + 16 <= k; t += 16)
            a[q][0] = _mm256_add_epi32(a[q][0], _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w[q] + t))),
                                                                _mm256_loadu_si256((const __m256i *)(x + t))));
        int32_t sum = hsum_epi32(_mm256_add_epi32(a[q][0], a[q][1]));
        for (; t < k; t++) sum += (int32_t)w[q][t] * x[t];
        out[q] = sum;
    }
}

/* BLOCK(R) for the rows r .. r + R of a product, R = min(rows - r, 4) a constant in each call
 * (the two-output blocks of weights read as stored: their sums stay in registers) */
#define FOR_ROWS_OF_4(rows, r, BLOCK)               \
    switch ((rows) - (r) < 4 ? (rows) - (r) : 4) {  \
    case 1: BLOCK(1); break;                        \
    case 2: BLOCK(2); break;                        \
    case 3: BLOCK(3); break;                        \
    default: BLOCK(4); break;                       \
    }

/* dot_i8_pairs for two outputs' weight rows (j, j + 1) and up to 4 rows of int16
 * activations at once, each 32 weights widened once for all the rows (the same integer sums;
 * 16 rows of GPT-2 124M on a Zen 3, a whole step: see bench/RESULTS.md) */
static inline __attribute__((always_inline)) void i8_rows_block(const Mat *m, const int16_t *xq, const float *sx,
                                                                float *y, int r0, int j, int mode, const int R) {
    const int k = m->k;
    const int8_t *w0 = (const int8_t *)m->w + (size_t)j * k, *w1 = w0 + k;
    __m256i a[4][2];
    for (int i = 0; i < R; i++) a[i][0] = a[i][1] = _mm256_setzero_si256();
    int c = 0;
    for (; c + 32 <= k; c += 32) {
        ask_weights(w0 + c, 32);
        ask_weights(w1 + c, 32);
        const __m256i u0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w0 + c)));
        const __m256i u1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w0 + c + 16)));
        const __m256i v0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w1 + c)));
        const __m256i v1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w1 + c + 16)));
        for (int i = 0; i < R; i++) {
            const int16_t *xi = xq + (size_t)(r0 + i) * k + c;
            const __m256i p = _mm256_loadu_si256((const __m256i *)xi), q = _mm256_loadu_si256((const __m256i *)(xi + 16));
            a[i][0] = _mm256_add_epi32(a[i][0], _mm256_add_epi32(_mm256_madd_epi16(u0, p), _mm256_madd_epi16(u1, q)));
            a[i][1] = _mm256_add_epi32(a[i][1], _mm256_add_epi32(_mm256_madd_epi16(v0, p), _mm256_madd_epi16(v1, q)));
        }
    }
    for (int i = 0; i < R; i++) {
        const int16_t *xi = xq + (size_t)(r0 + i) * k;
        int32_t t0 = hsum_epi32(a[i][0]), t1 = hsum_epi32(a[i][1]);
        for (int t = c; t < k; t++) t0 += (int32_t)w0[t] * xi[t], t1 += (int32_t)w1[t] * xi[t];
        put(m, y, r0 + i, j, (float)t0 * (m->scale[j] * sx[r0 + i]), mode);
        put(m, y, r0 + i, j + 1, (float)t1 * (m->scale[j + 1] * sx[r0 + i]), mode);
    }
}

static float dot_i8(const int8_t *w, const float *x, int k) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= k; i += 16) {
        a0 = _mm256_fmadd_ps(widen_i8(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(widen_i8(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    float s = hsum256(_mm256_add_ps(a0, a1));
    for (; i < k; i++) s += (float)w[i] * x[i];
    return s;
}

/* With AVX2, the products of several rows with fp32 weights (read as stored: a packed copy
 * would be as large as the model) take two outputs' weight rows at once, each 16 weights
 * loaded once for up to 4 rows (8 sums in flight), where a dot product per row and output
 * loaded a weight for every product (16 rows, GPT-2 124M, a whole step on a Zen 3: see
 * bench/RESULTS.md) */
#define HAVE_F32_ROWS 1
static inline __attribute__((always_inline)) void f32_rows_block(const Mat *m, const float *x, float *y, int r0, int j,
                                                                 int mode, const int R) {
    const int k = m->k;
    const float *w0 = (const float *)m->w + (size_t)j * k, *w1 = w0 + k;
    __m256 a[4][2];
    for (int i = 0; i < R; i++) a[i][0] = a[i][1] = _mm256_setzero_ps();
    int c = 0;
    for (; c + 16 <= k; c += 16) {
        ask_weights(w0 + c, 64);
        ask_weights(w1 + c, 64);
        const __m256 u0 = _mm256_loadu_ps(w0 + c), u1 = _mm256_loadu_ps(w0 + c + 8);
        const __m256 v0 = _mm256_loadu_ps(w1 + c), v1 = _mm256_loadu_ps(w1 + c + 8);
        for (int i = 0; i < R; i++) {
            const float *xi = x + (size_t)(r0 + i) * k + c;
            const __m256 p = _mm256_loadu_ps(xi), q = _mm256_loadu_ps(xi + 8);
            a[i][0] = _mm256_fmadd_ps(u1, q, _mm256_fmadd_ps(u0, p, a[i][0]));
            a[i][1] = _mm256_fmadd_ps(v1, q, _mm256_fmadd_ps(v0, p, a[i][1]));
        }
    }
    for (int i = 0; i < R; i++) {
        const float *xi = x + (size_t)(r0 + i) * k;
        float s0 = hsum256(a[i][0]), s1 = hsum256(a[i][1]);
        for (int t = c; t < k; t++) s0 += w0[t] * xi[t], s1 += w1[t] * xi[t];
        put(m, y, r0 + i, j, s0, mode);
        put(m, y, r0 + i, j + 1, s1, mode);
    }
}

/* With AVX2, the products with bf16 weights read them packed too, in blocks of 8 outputs
 * (PACK_BF16): for each pair of inputs (k, k + 1), the 8 outputs' two weights side by side,
 * 32 bytes that one load and two instructions make into two vectors of fp32 (the even
 * input's weights shifted up, the odd one's masked: a bf16 is the top half of an fp32), each
 * multiplied by its row's activation broadcast, into sums that stay in registers over all
 * of k. Nothing is summed across a vector at the end, where the products of rows read as
 * stored took one dot product per row and output.
 *
 * A thread reads S blocks at once (S streams), from S parts of its share of the outputs
 * (PACKED_STREAMS): several streams a core read more of the memory's bandwidth than one
 * here (a 2-core Zen 3, 512 MB summed on 2 threads, the median of 40 rounds: 28.4 GB/s in
 * one stream a thread, 30.3 in 2, 32.3 in 4, 34.7 in 8), and each row's broadcast
 * activations serve the S blocks. Rows go 6 at a time (BF16_GROUP; int8's 4 at a time,
 * ROW_GROUP), the blocks' weights read again from the core's caches for each further 6; 4 to
 * 6 rows of 2 blocks in an assembly loop that keeps 12 sums in registers (rowsM_two_blocks:
 * a step of 16 rows on a Zen 3 took 0.93x the time of groups of 4 in C, bench/RESULTS.md),
 * and 4 rows alone (beams of 4) 3 blocks at once (rows4_three_blocks). */
#define HAVE_PACKED 1
#define ROW_GROUP 4
#define BF16_GROUP 6
#define PACKED_STREAMS 4 /* blocks a thread reads at once for a single row; 3 for 4 rows, where
                            * rows4_three_blocks is; 2 for other rows (8 for one row: 1.15x to
                            * 1.25x the time of 4; 2: 1.07x to 1.18x) */

/* row i's sums with block s (acc[(i * S + s) * NA ..]): the one at A0 += the even input's
 * weights of pair P in block s x row i's activation, the one at A1 += the odd one's, for
 * i < M, s < S: in a block function whose scope holds w[S], x, M, S, NA, high and acc */
#define SPLIT_PAIRS(P, A0, A1)                                                                       \
    do {                                                                                             \
        __m256 even_[PACKED_STREAMS], odd_[PACKED_STREAMS];                                          \
        for (int s_ = 0; s_ < S; s_++) {                                                             \
            const __m256i v_ = _mm256_loadu_si256((const __m256i *)(w[s_] + (size_t)(P) * 16));      \
            ask_weights(w[s_] + (size_t)(P) * 16, 32);                                               \
            even_[s_] = _mm256_castsi256_ps(_mm256_slli_epi32(v_, 16));                              \
            odd_[s_] = _mm256_castsi256_ps(_mm256_and_si256(v_, high));                              \
        }                                                                                            \
        for (int i_ = 0; i_ < M; i_++) {                                                             \
            const float *xi_ = x + ((size_t)(P) * M + i_) * 2;                                       \
            const __m256 xe_ = _mm256_broadcast_ss(xi_), xo_ = _mm256_broadcast_ss(xi_ + 1);         \
            for (int s_ = 0; s_ < S; s_++) {                                                         \
                const int a_ = (i_ * S + s_) * NA;                                                   \
                acc[a_ + (A0)] = _mm256_fmadd_ps(even_[s_], xe_, acc[a_ + (A0)]);                    \
                acc[a_ + (A1)] = _mm256_fmadd_ps(odd_[s_], xo_, acc[a_ + (A1)]);                     \
            }                                                                                        \
        }                                                                                            \
    } while (0)

/* SPLIT_PAIRS for M = 4, 5 or 6 rows and 2 blocks (NA = 1), over pairs [0, pairs), pairs >= 1,
 * in assembly, each pair's even inputs' products first, then the odd ones' (the weights read
 * again from the L1 cache): the registers hold 2 widened weights, not 4, so that 12 sums fit
 * beside them, a broadcast activation and the mask (row i's sums with block s in ymm(2 i +
 * s)). Written in C, GCC (12.2) spilled 1 to 3 of 6 rows' sums to the stack. The same products
 * in the same order as SPLIT_PAIRS': the same sums. x86-64 only (ymm8 to ymm15); either
 * assembler syntax (the loop's label numbered by %=, since LLVM's Intel syntax reads `1b` as a
 * number). */
#if defined(__x86_64__)
#define HAVE_ROWS_ASM 1 /* (rowsM_two_blocks, rows4_three_blocks) */
/* the mask that keeps the odd inputs' weights of a pair (the high halves of 8 int32) */
static const int32_t HIGH_HALVES[8] __attribute__((aligned(32))) = {-65536, -65536, -65536, -65536,
                                                                    -65536, -65536, -65536, -65536};
#define ASM2(att, intel) "{" att "|" intel "}\n\t"
#define SUM_IN(i) ASM2("vmovups " #i "*32(%[acc]), %%ymm" #i, "vmovups ymm" #i ", YMMWORD PTR [%[acc] + " #i "*32]")
#define SUM_OUT(i) ASM2("vmovups %%ymm" #i ", " #i "*32(%[acc])", "vmovups YMMWORD PTR [%[acc] + " #i "*32], ymm" #i)
#define ROW_FMAS(off, A, B)                                                                          \
    ASM2("vbroadcastss " off "(%[x]), %%ymm14", "vbroadcastss ymm14, DWORD PTR [%[x] + " off "]")    \
    ASM2("vfmadd231ps %%ymm14, %%ymm12, %%ymm" #A, "vfmadd231ps ymm" #A ", ymm12, ymm14")           \
    ASM2("vfmadd231ps %%ymm14, %%ymm13, %%ymm" #B, "vfmadd231ps ymm" #B ", ymm13, ymm14")
#define SUMS_4(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define SUMS_5(X) SUMS_4(X) X(8) X(9)
#define SUMS_6(X) SUMS_5(X) X(10) X(11)
#define EVENS_4 ROW_FMAS("0", 0, 1) ROW_FMAS("8", 2, 3) ROW_FMAS("16", 4, 5) ROW_FMAS("24", 6, 7)
#define EVENS_5 EVENS_4 ROW_FMAS("32", 8, 9)
#define EVENS_6 EVENS_5 ROW_FMAS("40", 10, 11)
#define ODDS_4 ROW_FMAS("4", 0, 1) ROW_FMAS("12", 2, 3) ROW_FMAS("20", 4, 5) ROW_FMAS("28", 6, 7)
#define ODDS_5 ODDS_4 ROW_FMAS("36", 8, 9)
#define ODDS_6 ODDS_5 ROW_FMAS("44", 10, 11)
/* the same for 3 blocks (weights in ymm12 to ymm14, the broadcast in ymm15) */
#define ROW_FMAS3(off, A, B, C)                                                                      \
    ASM2("vbroadcastss " off "(%[x]), %%ymm15", "vbroadcastss ymm15, DWORD PTR [%[x] + " off "]")    \
    ASM2("vfmadd231ps %%ymm15, %%ymm12, %%ymm" #A, "vfmadd231ps ymm" #A ", ymm12, ymm15")           \
    ASM2("vfmadd231ps %%ymm15, %%ymm13, %%ymm" #B, "vfmadd231ps ymm" #B ", ymm13, ymm15")           \
    ASM2("vfmadd231ps %%ymm15, %%ymm14, %%ymm" #C, "vfmadd231ps ymm" #C ", ymm14, ymm15")
/* ask for the weights AHEAD_BYTES past pointer operand w (r: unused, as WEIGHTS3 passes it) */
#define ASK(w, r) ASM2("prefetcht0 %c[ahead](%[" #w "])", "prefetcht0 [%[" #w "] + %c[ahead]]")
#define ROWS_TWO_BLOCKS(M)                                                                           \
    static inline __attribute__((always_inline)) void rows##M##_two_blocks(                         \
        const uint16_t *w0, const uint16_t *w1, const float *x, int pairs, __m256 *acc) {            \
        long left = pairs;                                                                           \
        __asm__(SUMS_##M(SUM_IN) ASM2("vmovdqa %[high], %%ymm15", "vmovdqa ymm15, %[high]")          \
                ".Lrows%=:\n\t"                                                                      \
                ASK(w0, 12) ASK(w1, 13)                                                              \
                ASM2("vmovdqu (%[w0]), %%ymm12", "vmovdqu ymm12, YMMWORD PTR [%[w0]]")              \
                ASM2("vmovdqu (%[w1]), %%ymm13", "vmovdqu ymm13, YMMWORD PTR [%[w1]]")              \
                ASM2("vpslld $16, %%ymm12, %%ymm12", "vpslld ymm12, ymm12, 16")                      \
                ASM2("vpslld $16, %%ymm13, %%ymm13", "vpslld ymm13, ymm13, 16")                      \
                EVENS_##M                                                                            \
                ASM2("vpand (%[w0]), %%ymm15, %%ymm12", "vpand ymm12, ymm15, YMMWORD PTR [%[w0]]")  \
                ASM2("vpand (%[w1]), %%ymm15, %%ymm13", "vpand ymm13, ymm15, YMMWORD PTR [%[w1]]")  \
                ODDS_##M                                                                             \
                ASM2("add $32, %[w0]", "add %[w0], 32")                                              \
                ASM2("add $32, %[w1]", "add %[w1], 32")                                              \
                ASM2("add $8*" #M ", %[x]", "add %[x], 8*" #M)                                      \
                ASM2("dec %[left]", "dec %[left]")                                                   \
                "jnz .Lrows%=\n\t" SUMS_##M(SUM_OUT)                                                \
                : [w0] "+r"(w0), [w1] "+r"(w1), [x] "+r"(x), [left] "+r"(left), "+m"(*(__m256(*)[2 * M])acc) \
                : [acc] "r"(acc), [high] "m"(*(const __m256i *)HIGH_HALVES), [ahead] "i"(AHEAD_BYTES)  \
                : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",   \
                  "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "cc", "memory");                      \
    }
ROWS_TWO_BLOCKS(4)
ROWS_TWO_BLOCKS(5)
ROWS_TWO_BLOCKS(6)
#undef ROWS_TWO_BLOCKS
/* WEIGHTS(load) for 3 blocks: the pair's 32 bytes of each into ymm12 to ymm14 */
#define WEIGHTS3(load)                                                                               \
    load(w0, 12) load(w1, 13) load(w2, 14)
#define EVEN_OF(w, r)                                                                                \
    ASM2("vmovdqu (%[" #w "]), %%ymm" #r, "vmovdqu ymm" #r ", YMMWORD PTR [%[" #w "]]")             \
    ASM2("vpslld $16, %%ymm" #r ", %%ymm" #r, "vpslld ymm" #r ", ymm" #r ", 16")
#define ODD_OF(w, r)                                                                                 \
    ASM2("vmovdqu (%[" #w "]), %%ymm" #r, "vmovdqu ymm" #r ", YMMWORD PTR [%[" #w "]]")             \
    ASM2("vpand %[high], %%ymm" #r ", %%ymm" #r, "vpand ymm" #r ", ymm" #r ", %[high]")
/* SPLIT_PAIRS for 4 rows and 3 blocks (NA = 1), over pairs [0, pairs), pairs >= 1, as
 * rowsM_two_blocks: 12 sums (row i's with block s in ymm(3 i + s)) beside the 3 blocks' widened
 * weights and a broadcast activation, the mask read from memory. A broadcast serves 3
 * products, not 2: in the L1 cache on a Zen 3 this loop ran at 1.07x the rate of
 * rows4_two_blocks (bench/loop_shapes.c, bench/RESULTS.md), and a thread reads 3 streams of
 * weights. */
static inline __attribute__((always_inline)) void rows4_three_blocks(const uint16_t *w0, const uint16_t *w1,
                                                                     const uint16_t *w2, const float *x, int pairs,
                                                                     __m256 *acc) {
    long left = pairs;
    __asm__(SUMS_6(SUM_IN) ".Lrows%=:\n\t" WEIGHTS3(ASK) WEIGHTS3(EVEN_OF)                              //
            ROW_FMAS3("0", 0, 1, 2) ROW_FMAS3("8", 3, 4, 5) ROW_FMAS3("16", 6, 7, 8) ROW_FMAS3("24", 9, 10, 11) //
            WEIGHTS3(ODD_OF)                                                                             //
            ROW_FMAS3("4", 0, 1, 2) ROW_FMAS3("12", 3, 4, 5) ROW_FMAS3("20", 6, 7, 8) ROW_FMAS3("28", 9, 10, 11) //
            ASM2("add $32, %[w0]", "add %[w0], 32") ASM2("add $32, %[w1]", "add %[w1], 32")               //
            ASM2("add $32, %[w2]", "add %[w2], 32") ASM2("add $32, %[x]", "add %[x], 32")                 //
            ASM2("dec %[left]", "dec %[left]") "jnz .Lrows%=\n\t" SUMS_6(SUM_OUT)                     //
            : [w0] "+r"(w0), [w1] "+r"(w1), [w2] "+r"(w2), [x] "+r"(x), [left] "+r"(left),
              "+m"(*(__m256(*)[12])acc)
            : [acc] "r"(acc), [high] "m"(*(const __m256i *)HIGH_HALVES), [ahead] "i"(AHEAD_BYTES)
            : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
              "xmm12", "xmm13", "xmm14", "xmm15", "cc", "memory");
}
#undef ASK
#undef ODD_OF
#undef EVEN_OF
#undef WEIGHTS3
#undef ROW_FMAS3
#undef ODDS_6
#undef ODDS_5
#undef ODDS_4
#undef EVENS_6
#undef EVENS_5
#undef EVENS_4
#undef SUMS_6
#undef SUMS_5
#undef SUMS_4
#undef ROW_FMAS
#undef SUM_OUT
#undef SUM_IN
#undef ASM2
#define FOUR_ROWS_STREAMS 3 /* (rows4_three_blocks) */
#else
#define FOUR_ROWS_STREAMS 2
#endif

/* y[r0 + i][j[s] .. j[s] + 8) for i < M (M <= BF16_GROUP), s < S, from the packed blocks of 8
 * outputs at w[s] and the rows' activations x, pair by pair ((k / 2, M, 2), fp32), then
 * stored, or added to y, with the bias; outputs past n (the packing's zeros) are not
 * written. Each row's products with a block go to NA sums (the even and odd inputs' to
 * different ones where NA = 2): M x S x NA chains of FMAs in flight, at least the 8 that keep
 * the core's two FMA units busy where they can be: at most 8 sums beside the S blocks' even
 * and odd weights and a row's two activations (SPLIT_PAIRS), 12 for 4 to 6 rows of 2 blocks
 * (rowsM_two_blocks, a parity at a time) and for 4 rows of 3 blocks (rows4_three_blocks). */
static inline __attribute__((always_inline)) void packed_blocks(const Mat *m, const uint16_t *const *ws,
                                                                const int *j, const float *x, float *y, int r0,
                                                                int mode, const int M, const int S, const int NA) {
    const int k = m->k, n = m->n, pairs = k / 2;
    const uint16_t *w[PACKED_STREAMS];
    for (int s = 0; s < S; s++) w[s] = ws[s];
    __m256 acc[12]; /* row i's sums with block s: acc[(i * S + s) * NA ..] */
    for (int a = 0; a < M * S * NA; a++) acc[a] = _mm256_setzero_ps();
#ifdef HAVE_ROWS_ASM
    if (S == 2 && NA == 1 && M >= 4 && pairs > 0) {
        if (M == 4) rows4_two_blocks(w[0], w[1], x, pairs, acc);
        if (M == 5) rows5_two_blocks(w[0], w[1], x, pairs, acc);
        if (M == 6) rows6_two_blocks(w[0], w[1], x, pairs, acc);
    } else if (S == 3 && NA == 1 && M == 4 && pairs > 0) {
        rows4_three_blocks(w[0], w[1], w[2], x, pairs, acc);
    } else
#endif
    {
        const __m256i high = _mm256_set1_epi32((int)0xffff0000u);
        for (int p = 0; p < pairs; p++) SPLIT_PAIRS(p, 0, NA - 1);
    }
#pragma GCC unroll 8
    for (int s = 0; s < S; s++) {
        const int left = n - j[s] < 8 ? n - j[s] : 8;
        const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 bias = m->bias ? _mm256_maskload_ps(m->bias + j[s], keep) : _mm256_setzero_ps();
#pragma GCC unroll 8
        for (int i = 0; i < M; i++) {
            float *out = y + (size_t)(r0 + i) * n + j[s];
            const int a = (i * S + s) * NA;
            __m256 v = NA > 1 ? _mm256_add_ps(acc[a], acc[a + 1]) : acc[a];
            v = _mm256_add_ps(v, bias);
            if (mode == ADD) v = _mm256_add_ps(v, _mm256_maskload_ps(out, keep));
            _mm256_maskstore_ps(out, keep, v);
        }
    }
}

/* BLOCKS(M, S, NA) for the rows r .. r + M of a product, M = min(rows - r, BF16_GROUP), with S
 * streams (1, 2, 3 or 4: 4 for a single row, 3 for 4 rows alone) and M x S x NA <= 12 sums.
 * NA depends on M alone, so that an output's sum is the same whichever S reads its block (the
 * blocks left over, read one at a time, depend on the threads' shares). */
#define FOR_BF16_GROUPS(rows, r, S, BLOCKS)                                                          \
    do {                                                                                             \
        if ((S) == 4) { /* a single row */                                                           \
            BLOCKS(1, 4, 2);                                                                         \
            break;                                                                                   \
        }                                                                                            \
        switch ((rows) - (r) < BF16_GROUP ? (rows) - (r) : BF16_GROUP) {                             \
        case 1: ONE_OR_TWO_STREAMS(S, BLOCKS, 1, 2); break;                                          \
        case 2: ONE_OR_TWO_STREAMS(S, BLOCKS, 2, 2); break;                                          \
        case 3: ONE_OR_TWO_STREAMS(S, BLOCKS, 3, 1); break;                                          \
        case 4: (S) == 3 ? BLOCKS(4, 3, 1) : ONE_OR_TWO_STREAMS(S, BLOCKS, 4, 1); break;              \
        case 5: ONE_OR_TWO_STREAMS(S, BLOCKS, 5, 1); break;                                          \
        default: ONE_OR_TWO_STREAMS(S, BLOCKS, 6, 1); break;                                         \
        }                                                                                            \
    } while (0)
#define ONE_OR_TWO_STREAMS(S, BLOCKS, M, NA) ((S) == 2 ? BLOCKS(M, 2, NA) : BLOCKS(M, 1, NA))

/* the rows x (rows, k) in fp32 as packed_bf16 takes them, in xb: each BF16_GROUP rows' pairs
 * side by side, (k / 2, M, 2) */
static void prepare_packed(const float *x, int rows, int k, uint16_t *xb) {
    float *xt = (float *)xb;
    for (int r = 0; r < rows; r += BF16_GROUP) {
        const int M = rows - r < BF16_GROUP ? rows - r : BF16_GROUP;
        uint64_t *g = (uint64_t *)(xt + (size_t)r * k);
        for (int i = 0; i < M; i++) {
            const float *xi = x + (size_t)(r + i) * k;
            for (int p = 0; p < k / 2; p++) memcpy(g + (size_t)p * M + i, xi + 2 * p, 8);
        }
    }
}

/* the outputs [lo, hi) (lo a multiple of PACK) of a product with packed bf16 weights, the
 * rows' activations grouped in xb by prepare_packed. The range's blocks of 8 outputs are cut
 * into S parts read side by side (the blocks left over one at a time). */
static void packed_bf16(const Mat *m, const uint16_t *xb, float *y, int rows, int mode, int lo, int hi) {
    const int k = m->k;
    const float *xt = (const float *)xb;
    const int blocks = (hi - lo + PACK_BF16 - 1) / PACK_BF16;
    const int S = rows == 1 ? PACKED_STREAMS : rows == 4 ? FOUR_ROWS_STREAMS : 2, part = blocks / S;
    const uint16_t *base = (const uint16_t *)m->packed;
    for (int b = 0; b < part; b++) {
        const uint16_t *w[PACKED_STREAMS];
        int j[PACKED_STREAMS];
        for (int s = 0; s < S; s++) j[s] = lo + (s * part + b) * PACK_BF16, w[s] = base + (size_t)j[s] * k;
        for (int r = 0; r < rows; r += BF16_GROUP) {
            const float *xr = xt + (size_t)r * k;
#define BLOCKS(M, S_, NA) packed_blocks(m, w, j, xr, y, r, mode, M, S_, NA)
            FOR_BF16_GROUPS(rows, r, S, BLOCKS);
        }
    }
    for (int jj = lo + S * part * PACK_BF16; jj < hi; jj += PACK_BF16) {
        const uint16_t *w[1] = {base + (size_t)jj * k};
        const int j[1] = {jj};
        for (int r = 0; r < rows; r += BF16_GROUP) {
            const float *xr = xt + (size_t)r * k;
            FOR_BF16_GROUPS(rows, r, 1, BLOCKS);
#undef BLOCKS
        }
    }
}

/* With AVX2, the products with int8 weights read them packed as AVX512-VNNI's do (blocks of
 * 16 outputs: for each pair of inputs, the 16 outputs' two weights in 32 bytes), each half
 * widened to int16 and multiplied with the row's int16 pair broadcast (vpmaddwd: 8 outputs'
 * int32 sums), the sums in registers over all of k: where the rows read as stored took a
 * dot product per output and row, and its sum across a vector at the end. The same integer
 * sums, scaled as those were: the same outputs. In the Decoder's arena, so on huge pages
 * (torch's own int8 tensors, under 2 MB, were not). GPT-2 124M, one row on a Zen 3: see
 * bench/RESULTS.md. */
#define HAVE_PACKED_I8 1

/* y[r0 + i][j[s] .. j[s] + 16) for i < M, s < S, from the packed blocks at w[s] and the rows'
 * int16 activations x (M, k) of scales sx (M), as packed_blocks (M x S x 2 sums) */
static inline __attribute__((always_inline)) void packed_blocks_i8(const Mat *m, const int8_t *const *ws,
                                                                   const int *j, const int16_t *x, const float *sx,
                                                                   float *y, int r0, int mode, const int M,
                                                                   const int S) {
    const int k = m->k, n = m->n, pairs = k / 2;
    const int8_t *w[PACKED_STREAMS];
    for (int s = 0; s < S; s++) w[s] = ws[s];
    __m256i acc[8]; /* row i's sums with block s: acc[(i * S + s) * 2 ..], its 8 first outputs', then the others' */
    for (int a = 0; a < 2 * M * S; a++) acc[a] = _mm256_setzero_si256();
    for (int p = 0; p < pairs; p++) {
        __m256i xv[ROW_GROUP];
        for (int i = 0; i < M; i++) xv[i] = _mm256_set1_epi32(*(const pair32 *)(x + (size_t)i * k + 2 * p));
        for (int s = 0; s < S; s++) {
            const int8_t *wp = w[s] + (size_t)p * 32;
            ask_weights(wp, 32);
            const __m256i lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)wp));
            const __m256i hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wp + 16)));
            for (int i = 0; i < M; i++) {
                const int a = (i * S + s) * 2;
                acc[a] = _mm256_add_epi32(acc[a], _mm256_madd_epi16(lo, xv[i]));
                acc[a + 1] = _mm256_add_epi32(acc[a + 1], _mm256_madd_epi16(hi, xv[i]));
            }
        }
    }
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int s = 0; s < S; s++)
        for (int h = 0; h < 2; h++) {
            const int j0 = j[s] + 8 * h, left = n - j0 < 8 ? n - j0 : 8;
            if (left <= 0) continue;
            const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), lanes);
            const __m256 scale = _mm256_maskload_ps(m->scale + j0, keep);
            const __m256 bias = m->bias ? _mm256_maskload_ps(m->bias + j0, keep) : _mm256_setzero_ps();
            for (int i = 0; i < M; i++) {
                float *out = y + (size_t)(r0 + i) * n + j0;
                const __m256 sums = _mm256_cvtepi32_ps(acc[(i * S + s) * 2 + h]);
                __m256 v = _mm256_add_ps(_mm256_mul_ps(sums, _mm256_mul_ps(scale, _mm256_set1_ps(sx[i]))), bias);
                if (mode == ADD) v = _mm256_add_ps(_mm256_maskload_ps(out, keep), v);
                _mm256_maskstore_ps(out, keep, v);
            }
        }
}

/* BLOCKS(M, S) for the rows r .. r + M of a product: a single row in 4 streams, two rows in
 * 2, more in groups of up to ROW_GROUP rows in one (at most 8 sums) */
#define FOR_I8_GROUPS(rows, r, S, BLOCKS)                                                            \
    do {                                                                                             \
        if ((S) == 4) BLOCKS(1, 4);                                                                  \
        else if ((S) == 2) BLOCKS(2, 2);                                                             \
        else                                                                                         \
            switch ((rows) - (r) < ROW_GROUP ? (rows) - (r) : ROW_GROUP) {                           \
            case 1: BLOCKS(1, 1); break;                                                             \
            case 2: BLOCKS(2, 1); break;                                                             \
            case 3: BLOCKS(3, 1); break;                                                             \
            default: BLOCKS(4, 1); break;                                                            \
            }                                                                                        \
    } while (0)

/* the outputs [lo, hi) (lo a multiple of PACK) of a product with packed int8 weights; xq, sx:
 * the activations as int16 (rows, k) and their scales (rows), from prepare. The range's
 * blocks are cut into S parts read side by side (the blocks left over one at a time). */
static void packed_product_i8(const Mat *m, const int16_t *xq, const float *sx, float *y, int rows, int mode, int lo,
                              int hi) {
    const int k = m->k;
    const int blocks = (hi - lo + PACK - 1) / PACK;
    const int S = rows == 1 ? PACKED_STREAMS : rows == 2 ? 2 : 1, part = blocks / S;
    const int8_t *base = (const int8_t *)m->packed;
    for (int b = 0; b < part; b++) {
        const int8_t *w[PACKED_STREAMS];
        int j[PACKED_STREAMS];
        for (int s = 0; s < S; s++) j[s] = lo + (s * part + b) * PACK, w[s] = base + (size_t)j[s] * k;
        for (int r = 0; r < rows; r += S == 1 ? ROW_GROUP : rows) {
#define BLOCKS(M, S_) packed_blocks_i8(m, w, j, xq + (size_t)r * k, sx + r, y, r, mode, M, S_)
            FOR_I8_GROUPS(rows, r, S, BLOCKS);
        }
    }
    for (int jj = lo + S * part * PACK; jj < hi; jj += PACK) {
        const int8_t *w[1] = {base + (size_t)jj * k};
        const int j[1] = {jj};
        for (int r = 0; r < rows; r += ROW_GROUP)
            FOR_I8_GROUPS(rows, r, 1, BLOCKS);
#undef BLOCKS
    }
}

#else
static float dot_f32(const float *w, const float *x, int k) {
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < k; i++) s += w[i] * x[i];
    return s;
}

static float dot_bf16(const uint16_t *w, const float *x, int k) {
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < k; i++) s += bf16_to_f32(w[i]) * x[i];
    return s;
}

static float dot_i8(const int8_t *w, const float *x, int k) {
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < k; i++) s += (float)w[i] * x[i];
    return s;
}
#endif

/* e^x for the GELU and the softmax, as plain arithmetic the compiler vectorizes (expf is a call per
 * element): 2^n e^r with |r| <= ln2/2 and a degree-6 polynomial, within 2e-7 relative */
static inline float vexp(float x) {
    x = x > 88.f ? 88.f : x < -87.f ? -87.f : x;
    const float n = floorf(x * 1.44269504f + 0.5f);
    const float r = x - n * 0.693145752f - n * 1.42860677e-6f;
    float p = 1.f / 720;
    p = p * r + 1.f / 120, p = p * r + 1.f / 24, p = p * r + 1.f / 6;
    p = p * r + 0.5f, p = p * r + 1.f, p = p * r + 1.f;
    const int32_t e = ((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &e, 4);
    return p * two_n;
}

static inline float gelu(float x) { /* GPT-2's tanh approximation, tanh z = 1 - 2 / (e^2z + 1) */
    const float z = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (2.f - 2.f / (vexp(2.f * z) + 1.f));
}

/* y[i] = gelu(y[i]) for i < n, 16 at a time (a loop of its own, which the compiler
 * vectorizes: inside the product's, it would not) */
static void gelu_all(float *restrict y, int n) {
#pragma omp simd
    for (int i = 0; i < n; i++) y[i] = gelu(y[i]);
}

/* one output of a product, by the weight's dtype; prep: the row's activations as the bf16
 * products take them (in bf16 for bf16 pairs, split for AVX2) */
static inline float dot_row(const Mat *m, int j, const float *xr, const void *prep) {
    const int k = m->k;
    if (m->dtype == BF16) {
#if defined(HAVE_BF16_PAIRS)
        (void)xr;
        return dot_bf16_pairs((const uint16_t *)m->w + (size_t)j * k, prep, k);
#elif defined(HAVE_SPLIT_BF16)
        return dot_bf16_split((const uint16_t *)m->w + (size_t)j * k, prep, xr, k);
#else
        (void)prep;
        return dot_bf16((const uint16_t *)m->w + (size_t)j * k, xr, k);
#endif
    }
    if (m->dtype == I8) return dot_i8((const int8_t *)m->w + (size_t)j * k, xr, k) * m->scale[j];
    return dot_f32((const float *)m->w + (size_t)j * k, xr, k);
}

#ifdef HAVE_DOTS4
/* a single row's outputs [lo, hi) from fp32 or int8 weight rows as they are stored (int8's
 * with the row as int16, xq, and its scale, sx), 4 at a time from the 4 quarters of
 * [lo, hi): returns where the outputs left over (fewer than 4) begin */
static int four_streams(const Mat *m, const float *x, const int16_t *xq, const float *sx, float *y, int mode, int lo,
                        int hi) {
    const int k = m->k, part = (hi - lo) / 4;
    for (int b = 0; b < part; b++) {
        const int js[4] = {lo + b, lo + part + b, lo + 2 * part + b, lo + 3 * part + b};
        if (m->dtype == I8) {
            const int8_t *ws[4];
            int32_t dots[4];
            for (int q = 0; q < 4; q++) ws[q] = (const int8_t *)m->w + (size_t)js[q] * k;
            dots4_i8(ws, xq, k, dots);
            for (int q = 0; q < 4; q++) put(m, y, 0, js[q], (float)dots[q] * (m->scale[js[q]] * sx[0]), mode);
        } else {
            const float *ws[4];
            float dots[4];
            for (int q = 0; q < 4; q++) ws[q] = (const float *)m->w + (size_t)js[q] * k;
            dots4_f32(ws, x, k, dots);
            for (int q = 0; q < 4; q++) put(m, y, 0, js[q], dots[q], mode);
        }
    }
    return lo + 4 * part;
}
#endif

/* the outputs [lo, hi) of a product, from the weight rows as they are stored (for weights
 * with no packed copy: fp32, int8, or bf16 where the CPU lacks AVX512-BF16); xb: x as
 * prepare put it for the bf16 products (rows, k): in bf16 (bf16 pairs) or split into fp32
 * even and odd ones (AVX2), or for the int8 ones as int16 with the rows' scales after them */
static void stored_product(const Mat *m, const float *x, const uint16_t *xb, float *y, int rows, int mode, int lo,
                           int hi) {
    const int k = m->k;
    int j = lo;
    size_t prep_stride = 0; /* between the rows' prepared activations in xb, in bytes */
#if defined(HAVE_BF16_PAIRS)
    if (m->dtype == BF16) prep_stride = (size_t)k * 2;
#elif defined(HAVE_SPLIT_BF16)
    if (m->dtype == BF16) prep_stride = (size_t)k * 4;
#endif
#ifdef HAVE_INT16_PAIRS
    if (m->dtype == I8) { /* the rows as int16, their scales after them */
        const int16_t *xq = (const int16_t *)xb;
        const float *sx = row_scales((uint16_t *)xb, rows, k);
        if (rows > 1)
            for (; j + 2 <= hi; j += 2)
                for (int r = 0; r < rows; r += 4) {
#define BLOCK(R) i8_rows_block(m, xq, sx, y, r, j, mode, R)
                    FOR_ROWS_OF_4(rows, r, BLOCK)
#undef BLOCK
                }
#ifdef HAVE_DOTS4
        if (rows == 1) j = four_streams(m, x, xq, sx, y, mode, lo, hi);
#endif
        for (; j < hi; j++)
            for (int r = 0; r < rows; r++) {
                const int32_t dot = dot_i8_pairs((const int8_t *)m->w + (size_t)j * k, xq + (size_t)r * k, k);
                put(m, y, r, j, (float)dot * (m->scale[j] * sx[r]), mode);
            }
        return;
    }
#endif
#ifdef HAVE_F32_ROWS
    if (m->dtype == F32 && rows > 1)
        for (; j + 2 <= hi; j += 2)
            for (int r = 0; r < rows; r += 4) {
#define BLOCK(R) f32_rows_block(m, x, y, r, j, mode, R)
                FOR_ROWS_OF_4(rows, r, BLOCK)
#undef BLOCK
            }
#endif
#ifdef HAVE_DOTS4
    if (rows == 1 && m->dtype == F32) j = four_streams(m, x, NULL, NULL, y, mode, lo, hi);
#endif
#ifdef HAVE_ROWS16
    /* (fp32 weights: every row so, whatever the batch, as each row alone: the same bits) */
    if ((rows == 1 || m->dtype == F32) && k % 32 == 0) {
        const size_t size = m->dtype == I8 ? 1 : m->dtype == BF16 ? 2 : 4;
        float out[16];
        for (; j + 16 <= hi; j += 16)
            for (int r = 0; r < rows; r++) {
                rows16_wide((const char *)m->w + (size_t)j * k * size, m->dtype, x + (size_t)r * k, k, out);
                for (int q = 0; q < 16; q++)
                    put(m, y, r, j + q, m->dtype == I8 ? out[q] * m->scale[j + q] : out[q], mode);
            }
    }
#endif
    for (; j < hi; j++)
        for (int r = 0; r < rows; r++)
            put(m, y, r, j, dot_row(m, j, x + (size_t)r * k, (const char *)xb + r * prep_stride), mode);
}

/* how a product reads its weights: their packed copy (bf16 or int8), or as stored */
enum { PACKED_BF16, PACKED_I8, STORED };
static int reading(const Mat *m) {
    (void)m;
#ifdef HAVE_PACKED
    if (m->packed && m->dtype == BF16) return PACKED_BF16;
#endif
#ifdef HAVE_PACKED_I8
    if (m->packed && m->dtype == I8) return PACKED_I8;
#endif
    return STORED;
}

/* x (rows, k) as the products of m take it, in this thread's room xb (rows, k, and int8's
 * row scales after them: row_scales): in bf16 (AVX-512 BF16's packed products and bf16
 * pairs), grouped in pairs (AVX2's packed bf16), split into even and odd ones (AVX2's bf16
 * read as stored), or as int16 with a scale per row (int8); fp32 read as stored takes x */
static void prepare(const Mat *m, int how, const float *x, uint16_t *xb, int rows) {
    const int k = m->k;
    (void)how, (void)k, (void)x, (void)xb, (void)rows;
#ifdef HAVE_PACKED
    if (how == PACKED_BF16) {
        prepare_packed(x, rows, k, xb);
        return;
    }
#endif
#ifdef HAVE_INT16_PAIRS
    const int as_int16 = m->dtype == I8; /* (AVX2: every int8 product, packed or not) */
#else
    const int as_int16 = how == PACKED_I8; /* (AVX512-VNNI's; int8 read as stored takes x) */
#endif
    if (as_int16) {
        quantize_rows(x, rows, k, (int16_t *)xb, row_scales(xb, rows, k));
        return;
    }
#if defined(HAVE_BF16_PAIRS)
    if (m->dtype == BF16) to_bf16(x, xb, (size_t)rows * k);
#elif defined(HAVE_SPLIT_BF16)
    if (m->dtype == BF16)
        for (int r = 0; r < rows; r++) split_even_odd(x + (size_t)r * k, k, (float *)xb + (size_t)r * k);
#endif
}

/* the outputs [lo, hi) of m's product, read as `how` says, from x and as prepare put it in xb */
static void product(const Mat *m, int how, const float *x, uint16_t *xb, float *y, int rows, int mode, int lo,
                    int hi) {
    (void)how;
#ifdef HAVE_PACKED
    if (how == PACKED_BF16) {
        packed_bf16(m, xb, y, rows, mode, lo, hi);
        return;
    }
#endif
#ifdef HAVE_PACKED_I8
    if (how == PACKED_I8) {
        packed_product_i8(m, (const int16_t *)xb, row_scales(xb, rows, m->k), y, rows, mode, lo, hi);
        return;
    }
#endif
    stored_product(m, x, xb, y, rows, mode, lo, hi);
}

#define PIECE 16          /* outputs: a thread's share or piece of a product is a multiple of it */
#define PIECES_FROM_ROWS 9 /* rows from which the threads take a product's outputs piece by piece */

/* how many threads share the parallel region this is called in (1 outside one) */
static inline int team_size(void) {
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

/* this thread's share [lo, hi) of n outputs, fixed in advance, in pieces of PIECE */
static void share(int n, int *lo, int *hi) {
#ifdef _OPENMP
    const int t = omp_get_thread_num();
#else
    const int t = 0;
#endif
    const int nt = team_size();
    const long pieces = (n + PIECE - 1) / PIECE;
    const int b0 = (int)(pieces * t / nt), b1 = (int)(pieces * (t + 1) / nt);
    *lo = b0 * PIECE < n ? b0 * PIECE : n;
    *hi = b1 * PIECE < n ? b1 * PIECE : n;
}

/* The next piece [*lo, *hi) of a product's n outputs for the thread that asks, from the
 * product's counter `taken` (of pieces of PIECE outputs): one 2 x threads-th of what is left
 * (as OpenMP's guided schedule), at least one PIECE; 0: none left. */
static int take(int *taken, int n, int *lo, int *hi) {
    const int threads = team_size();
    const int pieces = (n + PIECE - 1) / PIECE;
    int at = __atomic_load_n(taken, __ATOMIC_RELAXED);
    for (;;) {
        const int left = pieces - at;
        if (left <= 0) return 0;
        int size = left / (2 * threads);
        size = size < 1 ? 1 : size;
        if (__atomic_compare_exchange_n(taken, &at, at + size, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            *lo = at * PIECE;
            *hi = (at + size) * PIECE < n ? (at + size) * PIECE : n;
            return 1;
        }
    }
}

/* y (rows, n) = x (rows, k) @ W^T + bias, then stored, added to y (a residual) or passed
 * through GELU; each weight read from memory once for all rows. Called inside the step's
 * parallel region: each thread computes its share of the outputs, then they meet. With
 * PIECES_FROM_ROWS rows or more, where the products' arithmetic takes longer than their
 * reads, the threads take the outputs piece by piece instead (take, from the counter
 * `taken`, zero before): with fixed shares, one thread waited for the other at every
 * product's end (16 rows of GPT-2 124M on a Zen 3: 7% of a step). Whole 16-row steps in
 * pieces, against fixed shares: bf16 0.98 and 0.99 of the time (pieces of 32 outputs: 0.89
 * to 1.02), int8 0.855, fp32 0.95. One row reads its weights in fewer, longer streams with
 * fixed shares (in pieces: 0.98 to 1.06 of the time; 4 and 8 rows 0.94 to 1.03). xb: this
 * thread's room for x as the products take it (prepare). */
static void matvec(const Mat *m, const float *x, uint16_t *xb, float *y, int rows, int mode, int *taken) {
    const int how = reading(m);
    prepare(m, how, x, xb, rows);
    int lo = 0, hi = 0, more = 1;
    if (rows < PIECES_FROM_ROWS) share(m->n, &lo, &hi);
    else more = take(taken, m->n, &lo, &hi);
    while (more && lo < hi) {
        product(m, how, x, xb, y, rows, mode, lo, hi);
        if (mode == GELU)
            for (int r = 0; r < rows; r++) gelu_all(y + (size_t)r * m->n + lo, hi - lo);
        more = rows >= PIECES_FROM_ROWS && take(taken, m->n, &lo, &hi);
    }
#pragma omp barrier
}

/* LayerNorm of every row (rows, c), by the threads in turn; the sums in vectors (in order, one
 * add after another: 16 rows, GPT-2 124M, 0.2 ms a step) */
static void layer_norm(const float *x, const float *w, const float *b, float *y, int rows, int c) {
#pragma omp for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * c;
        float *yr = y + (size_t)r * c;
        float mean = 0.f, var = 0.f;
#pragma omp simd reduction(+ : mean)
        for (int i = 0; i < c; i++) mean += xr[i];
        mean /= c;
#pragma omp simd reduction(+ : var)
        for (int i = 0; i < c; i++) var += (xr[i] - mean) * (xr[i] - mean);
        const float inv = 1.f / sqrtf(var / c + 1e-5f);
#pragma omp simd
        for (int i = 0; i < c; i++) yr[i] = (xr[i] - mean) * inv * w[i] + (b ? b[i] : 0.f); /* (bias=False: none) */
    }
}

static inline float load_any(const void *p, int dtype, size_t i) {
    return dtype == BF16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* the first scores by 16 at a time where the CPU can; returns how many */
static inline int first_scores(const void *K, const size_t *at, int dtype, const float *q, int hs, int n, float scale,
                               float *p, ptrdiff_t ahead) {
#ifdef HAVE_SCORES16
    return scores16(K, at, dtype, q, hs, n, scale, p, ahead);
#else
    (void)K, (void)at, (void)dtype, (void)q, (void)hs, (void)n, (void)scale, (void)p, (void)ahead;
    return 0;
#endif
}

/* the weighted sum of the values by 16 columns where the CPU can; whether it did */
static inline int weighted_values(const void *V, const size_t *at, int dtype, const float *p, int n, int hs,
                                  float scale, float *out, ptrdiff_t ahead) {
#ifdef HAVE_WEIGHTED16
    return weighted16(V, at, dtype, p, n, hs, scale, out, ahead);
#else
    (void)V, (void)at, (void)dtype, (void)p, (void)n, (void)hs, (void)scale, (void)out, (void)ahead;
    return 0;
#endif
}

/* the new keys and values of every row (qkv (rows, 3C)) into this layer's cache, at each
 * row's own slot last[r] (where at says it is: see slot_offsets) */
static void store_keys(const Model *m, int layer, const float *qkv, void *kc, void *vc, const size_t *ats, int rows,
                       int batch, int cache_len, const int *last) {
    const int C = m->n_embd, nh = m->n_head, hs = C / nh;
    const size_t layer_off = (size_t)layer * batch * cache_len * C;
#pragma omp for collapse(2) schedule(static)
    for (int r = 0; r < rows; r++) {
        for (int h = 0; h < nh; h++) {
            const size_t to = layer_off + (size_t)h * hs + ats[(size_t)r * cache_len + last[r]];
            const float *k = qkv + (size_t)r * 3 * C + C + h * hs, *v = k + C;
            if (m->cache_dtype == BF16)
                for (int i = 0; i < hs; i++)
                    ((uint16_t *)kc)[to + i] = f32_to_bf16(k[i]), ((uint16_t *)vc)[to + i] = f32_to_bf16(v[i]);
            else {
                memcpy((float *)kc + to, k, sizeof(float) * hs);
                memcpy((float *)vc + to, v, sizeof(float) * hs);
            }
        }
    }
}

/* a row's softmax over the scores p (n) of one head, in place: masked slots (keep[s] == 0,
 * keep NULL: none; those from `always` on are kept whatever keep says: the new slot) weigh 0;
 * returns the sum of the masses e^(p - max) it leaves in p, and the max in *top (NULL: not) */
static float softmax_masses(float *p, int n, const uint8_t *keep, int always, float *top) {
    if (keep)
        for (int s = 0; s < n && s < always; s++)
            if (!keep[s]) p[s] = -INFINITY;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int s = 0; s < n; s++) mx = p[s] > mx ? p[s] : mx;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int s = 0; s < n; s++) {
        p[s] = p[s] == -INFINITY ? 0.f : vexp(p[s] - mx);
        sum += p[s];
    }
    if (top) *top = mx;
    return sum;
}

#ifndef ROW_AHEAD
#define ROW_AHEAD 4096 /* how far ahead attend_rows asks for a row's keys and values, in bytes */
#endif
#ifdef HAVE_BF16_PAIRS
#define HAVE_ATTEND_ROWS 1
/* out[h] = scale[h] * sum over s < n of w[h][s] V[s][h] for the G heads g .. g + G of a row
 * (bf16, hs 64), V[s] at V + at[s], w (nh, cache_len); the values' rows read in order, G x 4
 * vectors of sums in registers; ask: whether to ask for the whole rows ahead (the first pass) */
static inline __attribute__((always_inline)) void values_of_heads(const uint16_t *V, const size_t *at, const float *w,
                                                                  const float *scale, int n, int cache_len, int C,
                                                                  int g, const int G, int ask, float *out) {
    __m512 acc[4][4];
    for (int a = 0; a < G; a++)
        for (int v = 0; v < 4; v++) acc[a][v] = _mm512_setzero_ps();
    for (int s = 0; s < n; s++) {
        const uint16_t *row = V + at[s];
        if (ask && ROW_AHEAD)
            for (int b = 0; b < 2 * C; b += 64) __builtin_prefetch((const char *)row + ROW_AHEAD + b, 0, 3);
        for (int a = 0; a < G; a++) {
            const __m512 x = _mm512_set1_ps(w[(size_t)(g + a) * cache_len + s]);
            for (int v = 0; v < 4; v++) acc[a][v] = _mm512_fmadd_ps(x, widen_bf16(row + (g + a) * 64 + 16 * v), acc[a][v]);
        }
    }
    for (int a = 0; a < G; a++)
        for (int v = 0; v < 4; v++)
            _mm512_storeu_ps(out + (g + a) * 64 + 16 * v, _mm512_mul_ps(acc[a][v], _mm512_set1_ps(scale[g + a])));
}

/* attend's rows one at a time, for bf16 caches with heads of 64 (GPT-2's): a row's keys are
 * read from start to end as one stream of (slot, head) pairs, 16 summed at once, and its values
 * in passes of 4 heads, the first of them reading the slots in order (the others find them in
 * the core's caches). K, V: the layer's cache; scratch: room for the weights, (rows, nh,
 * cache_len). Where each head's slots were cache_len apart (batch, nh, cache_len, hs), the
 * hardware's prefetchers ran past the end of every head's written slots, into those not yet
 * written: a batch of 16 at slot 116 of 216 took 1.15x to 1.3x the time of a cache holding
 * exactly its 117 slots; this reads a row as such a cache would be read. */
static void attend_rows(const Model *m, const uint16_t *K, const uint16_t *V, const float *qkv, const size_t *ats,
                        int rows, int cache_len, const int *last, const uint8_t *key_mask, float scale, float *y,
                        float *scratch) {
    const int C = m->n_embd, nh = m->n_head;
#pragma omp for schedule(static)
    for (int r = 0; r < rows; r++) {
        const size_t *at = ats + (size_t)r * cache_len;
        const int n = last[r] + 1, pairs = n * nh;
        uint16_t qb[4096];
        to_bf16(qkv + (size_t)r * 3 * C, qb, C);
        float *p = scratch + (size_t)r * nh * cache_len; /* p[h * cache_len + s] */
        int s = 0, h = 0, ws = 0, wh = 0, i = 0; /* (s, h): the next pair read; (ws, wh): written */
        for (; i + 16 <= pairs; i += 16) {
            __m512 acc[16];
            for (int t = 0; t < 16; t++) {
                const uint16_t *key = K + at[s] + h * 64, *q = qb + h * 64;
                if (ROW_AHEAD) {
                    __builtin_prefetch((const char *)key + ROW_AHEAD, 0, 3);
                    __builtin_prefetch((const char *)key + ROW_AHEAD + 64, 0, 3);
                }
                const __m512 a = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)_mm512_loadu_si512(key),
                                                  (__m512bh)_mm512_loadu_si512(q));
                acc[t] = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(key + 32), (__m512bh)_mm512_loadu_si512(q + 32));
                if (++h == nh) h = 0, s++;
            }
            float o[16];
            _mm512_storeu_ps(o, _mm512_mul_ps(sum16(acc), _mm512_set1_ps(scale)));
            for (int t = 0; t < 16; t++) {
                p[(size_t)wh * cache_len + ws] = o[t];
                if (++wh == nh) wh = 0, ws++;
            }
        }
        for (; i < pairs; i++) {
            p[(size_t)h * cache_len + s] = dot_bf16_pairs(K + at[s] + h * 64, qb + h * 64, 64) * scale;
            if (++h == nh) h = 0, s++;
        }
        const uint8_t *keep = key_mask ? key_mask + (size_t)r * cache_len : NULL;
        float inv[64];
        for (h = 0; h < nh; h++) inv[h] = 1.f / softmax_masses(p + (size_t)h * cache_len, n, keep, n - 1, NULL);
        float *out = y + (size_t)r * C;
        int g = 0;
        for (; g + 4 <= nh; g += 4) values_of_heads(V, at, p, inv, n, cache_len, C, g, 4, g == 0, out);
        for (; g < nh; g++) values_of_heads(V, at, p, inv, n, cache_len, C, g, 1, g == 0, out);
    }
}
#endif

#if !defined(HAVE_ATTEND_ROWS) && defined(HAVE_SPLIT_BF16)
#define HAVE_ATTEND_ROWS 1

/* Row r's attention for AVX2 (bf16 caches, heads of 64) over its slots [s0, s1) of the n it
 * attends to, every head at once: the keys read from s0 to s1 as one stream of (slot, head)
 * pairs, 8 summed at once, each key's bf16 pairs split into even and odd ones (as the packed
 * products split their weights) against the query's even and odd ones; then each head's
 * largest score mx[h] over the range and its masses e^(score - mx[h]), summed in sum[h]; then
 * the values likewise slot by slot, every head's weighted values added to out (C) in the
 * core's L1 cache, not divided by sum. q: the row's query (C); keep: the row's key mask or
 * NULL; p: room for the row's scores, p[h * cache_len + s]. Where each (row, head) read its
 * slots on its own, C apart, a step of 16 rows at slot 100 spent most of its time waiting on
 * them; where the values were read head by head (the first head's pass asking for the whole
 * slots ahead, the others finding them in the core's caches), whole steps took 1.03x to 1.1x
 * the time (16 rows at slot 100 and 500, beams of 4 at slot 900, a Zen 3: bench/RESULTS.md). */
static void attend_slots(const uint16_t *K, const uint16_t *V, const float *q, const size_t *at, int C, int nh,
                         int cache_len, int s0, int s1, int n, const uint8_t *keep, float scale, float *p, float *out,
                         float *mx, float *sum) {
    const __m256i high = _mm256_set1_epi32((int)0xffff0000u);
    float qs[4096]; /* each head's query: its 32 even values, then its 32 odd ones */
    for (int h = 0; h < nh; h++) split_even_odd(q + h * 64, 64, qs + h * 64);
    const int pairs = (s1 - s0) * nh;
    int s = s0, h = 0, ws = s0, wh = 0; /* (s, h): the next pair read; (ws, wh): written */
    for (int i = 0; i < pairs; i += 8) {
        __m256 acc[8];
        const int t_end = pairs - i < 8 ? pairs - i : 8;
        for (int t = 0; t < 8; t++) {
            if (t >= t_end) {
                acc[t] = _mm256_setzero_ps();
                continue;
            }
            const uint16_t *key = K + at[s] + h * 64;
            const float *qe = qs + h * 64, *qo = qe + 32;
            if (ROW_AHEAD) {
                __builtin_prefetch((const char *)key + ROW_AHEAD, 0, 3);
                __builtin_prefetch((const char *)key + ROW_AHEAD + 64, 0, 3);
            }
            __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
            for (int c = 0; c < 64; c += 16) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(key + c));
                a = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), _mm256_loadu_ps(qe + c / 2), a);
                b = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, high)), _mm256_loadu_ps(qo + c / 2), b);
            }
            acc[t] = _mm256_add_ps(a, b);
            if (++h == nh) h = 0, s++;
        }
        float o[8];
        _mm256_storeu_ps(o, _mm256_mul_ps(sum8(acc), _mm256_set1_ps(scale)));
        for (int t = 0; t < t_end; t++) {
            p[(size_t)wh * cache_len + ws] = o[t];
            if (++wh == nh) wh = 0, ws++;
        }
    }
    for (h = 0; h < nh; h++) /* (the new slot, n - 1, always kept) */
        sum[h] = softmax_masses(p + (size_t)h * cache_len + s0, s1 - s0, keep ? keep + s0 : NULL, n - 1 - s0, mx + h);
    for (int c = 0; c < C; c++) out[c] = 0.f;
    for (s = s0; s < s1; s++) {
        const uint16_t *row = V + at[s];
        if (ROW_AHEAD)
            for (int b = 0; b < 2 * C; b += 64) __builtin_prefetch((const char *)row + ROW_AHEAD + b, 0, 3);
        for (h = 0; h < nh; h++) {
            const __m256 x = _mm256_set1_ps(p[(size_t)h * cache_len + s]);
            float *o = out + h * 64;
            for (int c = 0; c < 64; c += 8)
                _mm256_storeu_ps(o + c, _mm256_fmadd_ps(x, widen_bf16(row + h * 64 + c), _mm256_loadu_ps(o + c)));
        }
    }
}

/* attend's rows one at a time, whole (attend_slots over all their slots, divided by the sums) */
static void attend_rows(const Model *m, const uint16_t *K, const uint16_t *V, const float *qkv, const size_t *ats,
                        int rows, int cache_len, const int *last, const uint8_t *key_mask, float scale, float *y,
                        float *scratch) {
    const int C = m->n_embd, nh = m->n_head;
#pragma omp for schedule(static)
    for (int r = 0; r < rows; r++) {
        const int n = last[r] + 1;
        float *out = y + (size_t)r * C, mx[64], sum[64];
        attend_slots(K, V, qkv + (size_t)r * 3 * C, ats + (size_t)r * cache_len, C, nh, cache_len, 0, n, n,
                     key_mask ? key_mask + (size_t)r * cache_len : NULL, scale, scratch + (size_t)r * nh * cache_len,
                     out, mx, sum);
        for (int h = 0; h < nh; h++)
            for (int c = 0; c < 64; c += 8)
                _mm256_storeu_ps(out + h * 64 + c, _mm256_mul_ps(_mm256_loadu_ps(out + h * 64 + c), _mm256_set1_ps(1.f / sum[h])));
    }
}

/* A single row's attention shared by the threads by its slots (as flash-decoding does): each
 * thread attend_slots over its part of them, into parts (threads x (C + 2 nh): its output,
 * its heads' largest scores and sums); then every head's parts weighed by e^(their largest -
 * the largest of all), the heads shared by the threads. Where the threads took 6 heads each,
 * reading every slot's keys and values 128 bytes in 1,536. */
#define HAVE_ATTEND_SPLIT 1
static void attend_split(const Model *m, const uint16_t *K, const uint16_t *V, const float *qkv, const size_t *at,
                         int cache_len, int n, const uint8_t *keep, float scale, float *y, float *p, float *parts) {
    const int C = m->n_embd, nh = m->n_head, threads = team_size();
#ifdef _OPENMP
    const int t = omp_get_thread_num();
#else
    const int t = 0;
#endif
    const int s0 = (int)((long)n * t / threads), s1 = (int)((long)n * (t + 1) / threads);
    float *mine = parts + (size_t)t * (C + 2 * nh);
    attend_slots(K, V, qkv, at, C, nh, cache_len, s0, s1, n, keep, scale, p, mine, mine + C, mine + C + nh);
#pragma omp barrier
#pragma omp for schedule(static)
    for (int h = 0; h < nh; h++) {
        float top = -INFINITY, total = 0.f, w[256];
        for (int u = 0; u < threads; u++) {
            const float mx = parts[(size_t)u * (C + 2 * nh) + C + h];
            top = mx > top ? mx : top;
        }
        for (int u = 0; u < threads; u++) {
            const float *part = parts + (size_t)u * (C + 2 * nh);
            w[u] = part[C + h] == -INFINITY ? 0.f : expf(part[C + h] - top);
            total += w[u] * part[C + nh + h];
        }
        for (int c = 0; c < 64; c++) {
            float v = 0.f;
            for (int u = 0; u < threads; u++) v += w[u] * parts[(size_t)u * (C + 2 * nh) + h * 64 + c];
            y[h * 64 + c] = v / total;
        }
    }
}
#endif

#define ATTEND_AHEAD 8 /* how many slots ahead attend's (row, head) pairs ask for theirs */

/* single-query attention for every row and head over the slots 0..last[r] of this layer's
 * cache (the new keys and values already stored: store_keys); qkv (rows, 3C), y (rows, C).
 * A layer's cache is (batch, cache_len, nh, hs): each slot's heads side by side, so that the
 * slots a row has written are one stretch of memory, however many it has room for. at (rows,
 * cache_len): where row r's slot s is, in elements from the layer's cache (see slot_offsets).
 * With enough rows to share evenly among the threads, rows are taken whole (attend_rows)
 * where they can be; otherwise each (row, head) on its own, its slots C apart. */
static void attend(const Model *m, int layer, const float *qkv, const void *kc, const void *vc, const size_t *ats,
                   int rows, int batch, int cache_len, const int *last, const uint8_t *key_mask, float *y,
                   float *scratch) {
    const int C = m->n_embd, nh = m->n_head, hs = C / nh, dt = m->cache_dtype;
    const size_t layer_off = (size_t)layer * batch * cache_len * C;
    const size_t size = dt == BF16 ? 2 : 4;
    const float scale = 1.f / sqrtf((float)hs);
#ifdef HAVE_ATTEND_ROWS
    const int threads = team_size();
    /* whole rows where the largest share of them is at most a quarter above the mean (2 threads:
     * 5 rows 0.96x the time of (row, head) pairs; 17 rows on 16 threads would take twice) */
    const int most = (rows + threads - 1) / threads;
    if (dt == BF16 && hs == 64 && C <= 4096 && rows >= threads && 4 * most * threads <= 5 * rows) {
        attend_rows(m, (const uint16_t *)kc + layer_off, (const uint16_t *)vc + layer_off, qkv, ats, rows, cache_len,
                    last, key_mask, scale, y, scratch);
        return;
    }
#endif
#ifdef HAVE_ATTEND_SPLIT
    if (dt == BF16 && hs == 64 && C <= 4096 && rows == 1 && threads > 1 && threads <= 256) {
        attend_split(m, (const uint16_t *)kc + layer_off, (const uint16_t *)vc + layer_off, qkv, ats, cache_len,
                     last[0] + 1, key_mask, scale, y, scratch, scratch + (size_t)nh * cache_len);
        return;
    }
#endif
#pragma omp for collapse(2) schedule(static)
    for (int r = 0; r < rows; r++) {
        for (int h = 0; h < nh; h++) {
            const size_t base = layer_off + (size_t)h * hs, *at = ats + (size_t)r * cache_len;
            const int slot = last[r];
            const float *q = qkv + (size_t)r * 3 * C + h * hs;
            float *p = scratch + (size_t)(r * nh + h) * cache_len; /* (slot + 1) scores */
            float *out = y + (size_t)r * C + h * hs;
            /* this head's slots further on */
            const ptrdiff_t ahead = (ptrdiff_t)(ATTEND_AHEAD * C * size);
            if (dt == BF16) {
                const uint16_t *K = (const uint16_t *)kc + base;
#ifdef HAVE_BF16_PAIRS
                if (hs % 32 == 0 && hs <= 256) {
                    uint16_t qb[256];
                    to_bf16(q, qb, hs);
                    for (int s = scores16_pairs(K, at, qb, hs, slot + 1, scale, p, ahead); s <= slot; s++)
                        p[s] = dot_bf16_pairs(K + at[s], qb, hs) * scale;
                } else
#endif
                    for (int s = first_scores(K, at, BF16, q, hs, slot + 1, scale, p, ahead); s <= slot; s++)
                        p[s] = dot_bf16(K + at[s], q, hs) * scale;
            } else {
                const float *K = (const float *)kc + base;
                for (int s = first_scores(K, at, F32, q, hs, slot + 1, scale, p, ahead); s <= slot; s++)
                    p[s] = dot_f32(K + at[s], q, hs) * scale;
            }
            const float sum = softmax_masses(p, slot + 1, key_mask ? key_mask + (size_t)r * cache_len : NULL, slot, NULL);
            const void *Vh = dt == BF16 ? (const void *)((const uint16_t *)vc + base) : (const void *)((const float *)vc + base);
            if (weighted_values(Vh, at, dt, p, slot + 1, hs, 1.f / sum, out, ahead)) continue;
            for (int i = 0; i < hs; i++) out[i] = 0.f;
            for (int s = 0; s <= slot; s++) {
                const float w = p[s] / sum;
                if (w == 0.f) continue;
                if (dt == BF16) {
                    const uint16_t *V = (const uint16_t *)Vh + at[s];
#pragma omp simd
                    for (int i = 0; i < hs; i++) out[i] += w * bf16_to_f32(V[i]);
                } else {
                    const float *V = (const float *)Vh + at[s];
#pragma omp simd
                    for (int i = 0; i < hs; i++) out[i] += w * V[i];
                }
            }
        }
    }
}

/* at (rows, cache_len): where each row's slots 0..last[r] are in the cache, in elements from
 * a layer's cache (batch, cache_len, nh, hs), its heads following. Row r is the cache's row r
 * (one_sequence: every row is row 0, the rows a sequence's tokens), whose slots it reads
 * there, unless sources (batch, cache_len) says which row of the cache holds each of them
 * before last[r] (beams that share their history read it where it was written, and are not
 * copied); the new slot is the row's own. */
static void slot_offsets(size_t *at, const int32_t *sources, int one_sequence, const int *last, int rows, int batch,
                         int nh, int hs, int cache_len) {
    const size_t C = (size_t)nh * hs, row_stride = cache_len * C;
    for (int r = 0; r < rows; r++) {
        const int mine = one_sequence ? 0 : r;
        for (int s = 0; s <= last[r]; s++) {
            int src = sources && s < last[r] ? sources[(size_t)mine * cache_len + s] : mine;
            if (src < 0 || src >= batch) src = mine; /* (never so: gptcli's own cache keeps them in range) */
            at[(size_t)r * cache_len + s] = (size_t)src * row_stride + (size_t)s * C;
        }
    }
}

/* whether weights of this dtype are read from a packed copy (gptcli_pack) on this CPU */
int gptcli_packs(int dtype) {
#ifdef HAVE_PACKED
    if (dtype == BF16) return 1;
#endif
#ifdef HAVE_PACKED_I8
    if (dtype == I8) return 1;
#endif
    (void)dtype;
    return 0;
}

#define ARGMAX_BLOCK 512
/* the first largest of q (V), or the first NaN, as torch's argmax: each block's largest in
 * vectors, then the first block holding the row's largest searched in order (GPT-2's
 * vocabulary on a Zen 3: 6 us where a search in order took 68) */
static int64_t argmax_row(const float *q, int V) {
    float mx = -INFINITY;
    int nan = 0, first = 0;
    for (int b = 0; b < V; b += ARGMAX_BLOCK) {
        const int end = V - b < ARGMAX_BLOCK ? V : b + ARGMAX_BLOCK;
        float m = -INFINITY;
#pragma omp simd reduction(max : m) reduction(| : nan)
        for (int i = b; i < end; i++) {
            m = q[i] > m ? q[i] : m;
            nan |= q[i] != q[i];
        }
        if (nan) /* (this block holds the first NaN) */
            for (int i = b; i < end; i++)
                if (q[i] != q[i]) return i;
        if (m > mx) mx = m, first = b;
    }
    for (int i = first; i < V; i++)
        if (q[i] == mx) return i;
    return 0; /* (every logit -inf: torch's too) */
}

/* each row's argmax_row, ids (rows) for x (rows, V) */
void gptcli_argmax(const float *x, int rows, int V, int64_t *ids) {
    for (int r = 0; r < rows; r++) ids[r] = argmax_row(x + (size_t)r * V, V);
}

/* Sampling's draw: ids[r], for each row of q (rows, V), the first id whose cumulative mass
 * passes u[r] times the row's total (inverse CDF), found as gptcli.infer.generate.draw_from
 * finds it with torch: the sums of blocks of 1,024 ids in double, the block where the point
 * falls, then the id within it (the cumulative sum in double, in order); an id of
 * probability 0 (or NaN) is never drawn, the row's argmax instead. One pass over q for the
 * block sums, where torch's version took five over it and its float64 copy (16 rows of
 * GPT-2's vocabulary: 1 ms). Only the order of each block's sum differs from torch's (a
 * draw can differ where a point falls within 1e-16 of a block's end). */
#define DRAW_BLOCK 1024
/* id i's mass in a row: the row itself (masses: q), or e^((x[i] - mx) / t) (logits x at
 * temperature t, mx their largest; inv_t = 1 / t), 0 below e^-87 (where vexp stops; -inf
 * logits: 0, never drawn) */
static inline __attribute__((always_inline)) float mass(const float *row, size_t i, const int logits, float mx,
                                                        float inv_t) {
    if (!logits) return row[i];
    const float z = (row[i] - mx) * inv_t;
    return z < -87.f ? 0.f : vexp(z);
}

/* one row's draw at the uniform u, of its masses (see mass); ends: room for the sums of its
 * blocks of DRAW_BLOCK ids */
static inline __attribute__((always_inline)) int64_t draw_row(const float *row, int V, double u, const int logits,
                                                              float mx, float inv_t, double *ends) {
    const int size = V < DRAW_BLOCK ? V : DRAW_BLOCK, blocks = (V + size - 1) / size;
    double total = 0.;
    for (int b = 0; b < blocks; b++) {
        const int n = b + 1 < blocks ? size : V - b * size;
        double s = 0.;
#pragma omp simd reduction(+ : s)
        for (int i = 0; i < n; i++) s += (double)mass(row, (size_t)b * size + i, logits, mx, inv_t);
        ends[b] = total += s;
    }
    const double x = u * ends[blocks - 1];
    int b = 0;
    while (b < blocks - 1 && !(ends[b] > x)) b++;
    const double before = b > 0 ? ends[b - 1] : 0.;
    const int n = b + 1 < blocks ? size : V - b * size;
    float m[DRAW_BLOCK]; /* the block's masses, in vectors, then summed in order */
#pragma omp simd
    for (int i = 0; i < n; i++) m[i] = mass(row, (size_t)b * size + i, logits, mx, inv_t);
    int j = size - 1; /* (past the block's ids: its last, as torch clamps) */
    double cum = 0.;
    for (int i = 0; i < n; i++) {
        cum += (double)m[i];
        if (cum + before > x) {
            j = i;
            break;
        }
    }
    int64_t id = (int64_t)b * size + j;
    if (id > V - 1) id = V - 1;
    return mass(row, (size_t)id, logits, mx, inv_t) > 0.f ? id : argmax_row(row, V);
}

int gptcli_draw(const float *q, int rows, int V, const double *u, int64_t *ids) {
    if (V < 1) return -1;
    double *ends = malloc(sizeof(double) * ((V + DRAW_BLOCK - 1) / DRAW_BLOCK));
    if (!ends) return -1;
    for (int r = 0; r < rows; r++) ids[r] = draw_row(q + (size_t)r * V, V, u[r], 0, 0.f, 1.f, ends);
    free(ends);
    return 0;
}

/* one row's draw from its logits at 1 / inv_t (see gptcli_sample) into *id: 0, or -1 (nothing
 * drawn) where the row holds NaN or +inf or no finite logit */
static int sample_row(const float *row, int V, float inv_t, double u, double *ends, int64_t *id) {
    float mx = -INFINITY;
    int nan = 0;
#pragma omp simd reduction(max : mx) reduction(| : nan)
    for (int i = 0; i < V; i++) {
        nan |= row[i] != row[i];
        mx = row[i] > mx ? row[i] : mx;
    }
    if (nan || !(mx > -INFINITY) || mx == INFINITY) return -1;
    *id = draw_row(row, V, u, 1, mx, inv_t, ends);
    return 0;
}

/* the inverse temperature gptcli_sample draws at, for t > 0 (below 1e-30 every logit short
 * of the largest has no mass, as at any t that small) */
static inline float inverse(float t) { return 1.f / (t < 1e-30f ? 1e-30f : t); }

/* Sampling from logits (rows, V) at temperature t, with no distribution written out: for
 * each row, its largest logit, then gptcli_draw's search over the masses e^((x - max) / t)
 * (q times the row's total), the rows shared by `threads` threads. Where torch's softmax
 * and the draw read 16 rows of GPT-2's vocabulary six times (0.35 ms a step), this reads
 * them twice. -1 (nothing drawn) for a row holding NaN or +inf, or no finite logit: the
 * caller then draws as torch does. */
int gptcli_sample(const float *x, int rows, int V, float t, const double *u, int64_t *ids, int threads) {
    if (V < 1 || !(t > 0.f) || t == INFINITY) return -1; /* (a temperature past float's range: torch's code) */
    const float inv_t = inverse(t);
    const int blocks = (V + DRAW_BLOCK - 1) / DRAW_BLOCK;
    double *ends = malloc(sizeof(double) * (size_t)blocks * rows);
    if (!ends) return -1;
#ifndef _OPENMP
    threads = 1;
#endif
    int bad = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(| : bad) if (rows > 1 && threads > 1)
    for (int r = 0; r < rows; r++) bad |= sample_row(x + (size_t)r * V, V, inv_t, u[r], ends + (size_t)r * blocks, ids + r);
    free(ends);
    return bad ? -1 : 0;
}

/* log sum_j e^x[j] over a row x (V): the row's largest plus the log of a sum of vexp, in
 * double */
static float row_logsumexp(const float *x, int V) {
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < V; j++) mx = x[j] > mx ? x[j] : mx;
    if (!(mx > -INFINITY) || mx == INFINITY) return mx; /* (no finite entry: -inf, or +inf as torch gives) */
    double s = 0.;
    for (int j0 = 0; j0 < V; j0 += 1024) { /* float sums of 1024, added in double */
        const int end = j0 + 1024 < V ? j0 + 1024 : V;
        float b = 0.f;
#pragma omp simd reduction(+ : b)
        for (int j = j0; j < end; j++) b += vexp(x[j] - mx);
        s += b;
    }
    return mx + (float)log(s);
}

/* out[r] = log sum_j e^x[r * V + j], the log-softmax's normalizer of each row (beam search:
 * log p = x - out[r]) */
void gptcli_logsumexp(const float *x, int rows, int V, float *out) {
    for (int r = 0; r < rows; r++) out[r] = row_logsumexp(x + (size_t)r * V, V);
}

/* v at index i into values, index (k, best first) where it ranks, if it does (above the k-th:
 * equal ones there first stay ahead; -inf and NaN never) */
static inline void place(float v, int64_t i, int k, float *values, int64_t *index) {
    if (!(v > values[k - 1])) return;
    int at = k - 1; /* shift the smaller ones down */
    while (at > 0 && values[at - 1] < v) {
        values[at] = values[at - 1], index[at] = index[at - 1];
        at--;
    }
    values[at] = v, index[at] = i;
}

/* values, index (k, best first): where off + x[j] for j < n of one row x ranks among them,
 * its index first + j (see place). Blocks of 64 ids are checked against the k-th value so
 * far at once, so the pass runs at the speed of reading x; the few that reach it are placed
 * by insertion. */
static void rank_row(const float *x, int n, float off, int k, float *values, int64_t *index, int64_t first) {
    if (!(off > -INFINITY)) return; /* (a dead beam, or NaN) */
    for (int j0 = 0; j0 < n; j0 += 64) {
        const int end = j0 + 64 < n ? j0 + 64 : n;
        const float least = values[k - 1];
        int any = 0;
#pragma omp simd reduction(| : any)
        for (int j = j0; j < end; j++) any |= off + x[j] > least;
        if (!any) continue;
        for (int j = j0; j < end; j++) place(off + x[j], first + j, k, values, index);
    }
}

/* Beam search's ranking: the k largest of offsets[r] + x[r * V + j] over the rows r < rows
 * and the ids j < n, in descending order (ties: the lower index first), as values and
 * indices r * V + j; entries at -inf or NaN never count, and places left over hold -inf and
 * -1. With offsets = a beam's score minus its row's log-sum-exp these are the best
 * continuations of all beams, found in one pass with no (rows, V) tensor of sums (torch
 * took a log-softmax, a sum and two topk calls: 0.4 ms for 4 rows of GPT-2's vocabulary). */
int gptcli_top_rows(const float *x, int rows, int V, int n, const float *offsets, int k, float *values,
                    int64_t *index) {
    if (k < 1 || n > V) return -1;
    for (int i = 0; i < k; i++) values[i] = -INFINITY, index[i] = -1;
    for (int r = 0; r < rows; r++) rank_row(x + (size_t)r * V, n, offsets[r], k, values, index, (int64_t)r * V);
    return 0;
}

/* gptcli_top_rows at offsets[r] = scores[r] - the row's log-sum-exp, the rows shared by the
 * threads: each finds its rows' log-sum-exp and best k, then the rows' best are merged in
 * row order (so that ties keep the lower index first). What beam search ranks each step, in
 * one call. */
int gptcli_best(const float *x, int rows, int V, int n, const float *scores, int k, float *values, int64_t *index,
                int threads) {
    if (k < 1 || n > V || rows < 1) return -1;
    float *best = malloc(sizeof(float) * (size_t)rows * k);
    int64_t *at = malloc(sizeof(int64_t) * (size_t)rows * k);
    if (!best || !at) {
        free(best), free(at);
        return -1;
    }
#ifndef _OPENMP
    threads = 1;
#endif
#pragma omp parallel for num_threads(threads) schedule(static) if (rows > 1 && threads > 1)
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * V;
        float *v = best + (size_t)r * k;
        int64_t *i = at + (size_t)r * k;
        for (int q = 0; q < k; q++) v[q] = -INFINITY, i[q] = -1;
        rank_row(xr, n, scores[r] - row_logsumexp(xr, V), k, v, i, (int64_t)r * V);
    }
    for (int i = 0; i < k; i++) values[i] = -INFINITY, index[i] = -1;
    for (int c = 0; c < rows * k; c++) place(best[c], at[c], k, values, index); /* (in row order) */
    free(best), free(at);
    return 0;
}

/* The model over `rows` new tokens, in one parallel region: the threads meet at barriers
 * between the operations, rather than starting anew for each. Row r's token tokens[r] is
 * at position positions[r] of the model (its positional embedding), in row r of the cache
 * (one_sequence: row 0, the rows a sequence's tokens), which holds `batch` rows of
 * cache_len slots; its keys and values
 * go to slot last[r], and it attends to the slots 0..last[r] of that row (as sources and
 * key_mask say: see slot_offsets, attend). All the rows' keys are stored before any row
 * attends, so the rows may be one sequence's tokens. logits (out_rows, vocab): those of the
 * last out_rows rows; NULL: none (the unembedding skipped). */
static int forward_rows(const Model *m, const int64_t *tokens, const int64_t *positions, int rows, int batch,
                        int cache_len, void *k_cache, void *v_cache, const int32_t *sources, const uint8_t *key_mask,
                        int one_sequence, const int *last, float *logits, int out_rows, int64_t *best,
                        int threads) {
    const int C = m->n_embd, F = 4 * C;
    for (int r = 0; r < rows; r++) /* ids and positions the embeddings have (-3: nothing done) */
        if (tokens[r] < 0 || tokens[r] >= m->vocab || positions[r] < 0 || positions[r] >= m->block) return -3;
    float *x = malloc(sizeof(float) * rows * C), *h = malloc(sizeof(float) * rows * C);
    float *qkv = malloc(sizeof(float) * rows * 3 * C), *a = malloc(sizeof(float) * rows * C);
    float *f = malloc(sizeof(float) * rows * F);
#ifndef _OPENMP
    threads = 1;
#endif
    if (threads < 1) threads = 1;
    /* attention's scores (rows, nh, cache_len), and room for each thread's part of a row's (attend_split) */
    float *scratch = malloc(sizeof(float) * ((size_t)rows * m->n_head * cache_len + (size_t)threads * (C + 2 * m->n_head)));
    const int products = 4 * m->n_layer + 1;
    int *taken = aligned_alloc(64, (size_t)products * 64); /* each product's counter (take), 64 bytes apart */
    size_t *at = malloc(sizeof(size_t) * (size_t)rows * cache_len);
    /* each thread's: x in bf16, int16 or split fp32, and int8's row scales */
    const size_t room = 2 * (size_t)rows * F + 2 * (size_t)rows;
    uint16_t *xb = malloc(sizeof(uint16_t) * (size_t)threads * room);
    if (!x || !h || !qkv || !a || !f || !scratch || !at || !xb || !taken) {
        free(x), free(h), free(qkv), free(a), free(f), free(scratch), free(at), free(xb), free(taken);
        return -1;
    }
    memset(taken, 0, (size_t)products * 64);
    slot_offsets(at, sources, one_sequence, last, rows, batch, m->n_head, C / m->n_head, cache_len);
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < C; i++)
            x[(size_t)r * C + i] = load_any(m->wte, m->emb_dtype, (size_t)tokens[r] * C + i) +
                                   load_any(m->wpe, m->emb_dtype, (size_t)positions[r] * C + i);
    const int first_out = rows - out_rows; /* the rows whose logits are asked for */
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        uint16_t *mine = xb + (size_t)omp_get_thread_num() * room;
#else
        uint16_t *mine = xb;
#endif
        for (int l = 0; l < m->n_layer; l++) {
            const Layer *L = &m->layers[l];
            int *counters = taken + 64 * l; /* this layer's 4 products' (16 ints apart) */
            layer_norm(x, L->ln1_w, L->ln1_b, h, rows, C);
            matvec(&L->attn, h, mine, qkv, rows, STORE, counters);
            store_keys(m, l, qkv, k_cache, v_cache, at, rows, batch, cache_len, last);
            attend(m, l, qkv, k_cache, v_cache, at, rows, batch, cache_len, last, key_mask, a, scratch);
            matvec(&L->proj, a, mine, x, rows, ADD, counters + 16);
            layer_norm(x, L->ln2_w, L->ln2_b, h, rows, C);
            matvec(&L->fc, h, mine, f, rows, GELU, counters + 32);
            matvec(&L->out, f, mine, x, rows, ADD, counters + 48);
        }
        if (logits) {
            layer_norm(x + (size_t)first_out * C, m->lnf_w, m->lnf_b, h, out_rows, C);
            matvec(&m->head, h, mine, logits, out_rows, STORE, taken + 64 * m->n_layer);
            if (best) /* while the logits are in the cores' caches */
#pragma omp for schedule(static)
                for (int r = 0; r < out_rows; r++) best[r] = argmax_row(logits + (size_t)r * m->vocab, m->vocab);
        }
    }
    free(x), free(h), free(qkv), free(a), free(f), free(scratch), free(at), free(xb), free(taken);
    return 0;
}

/* One decoding step: tokens (rows), each row's new token, at position positions[r] of the
 * model (NULL: every row at position `slot`) and at slot `slot` of the cache (which holds
 * `batch` rows of cache_len slots); sources (batch, cache_len) or NULL: which row of the
 * cache holds each slot of each row (see slot_offsets); key_mask (rows, cache_len) or NULL:
 * which slots a row may attend to. logits (rows, vocab). threads: how many to use (torch's
 * own setting). best (rows) or NULL: each row's argmax (the first largest logit, or the first
 * NaN, as torch's; last, so that bench/step_ab.c calls older versions alike). Returns 0, -1 (no
 * memory for its buffers) or -3 (a token or position outside the embeddings: nothing done). */
int gptcli_decode_step(const Model *m, const int64_t *tokens, const int64_t *positions, int rows, int batch,
                       int slot, int cache_len, void *k_cache, void *v_cache, const int32_t *sources,
                       const uint8_t *key_mask, float *logits, int threads, int64_t *best) {
    const int n = rows > 0 ? rows : 1;
    int *last = malloc(sizeof(int) * n);
    int64_t *at_slot = positions ? NULL : malloc(sizeof(int64_t) * n);
    int rc = -1;
    if (last && (positions || at_slot)) {
        for (int r = 0; r < rows; r++) {
            last[r] = slot;
            if (at_slot) at_slot[r] = slot;
        }
        rc = forward_rows(m, tokens, positions ? positions : at_slot, rows, batch, cache_len, k_cache, v_cache,
                          sources, key_mask, 0, last, logits, rows, best, threads);
    }
    free(last), free(at_slot);
    return rc;
}

/* Decoding one sequence, up to n steps in one call (no Python between them: a step streams
 * the weights through every cache, and the Python after it ran from memory, 0.3 to 0.5 ms a
 * token of GPT-2 124M on a Zen 3). Step i feeds the id chosen before it (first: `token`) at
 * position and slot `slot + i` of a cache of one row (cache_len slots) and writes its logits
 * to logits + i * vocab, those of the ids from `choose` on (the embeddings' padding) at -inf;
 * then it chooses ids[i] from them as the caller would one step at a time: their argmax
 * (u NULL: greedy), or drawn at temperature t at the uniform u[i] (gptcli_sample; a row it
 * cannot draw from ends the run with ids[i] = -1, for the caller to draw). The run stops
 * after an id in ends (n_ends). Returns the steps taken (1 to n; a step after the first
 * that finds no memory ends the run before it), or, with nothing done, -1 (no memory), -2
 * (arguments out of their range) or -3 (a token or slot outside the embeddings or the cache). */
int gptcli_decode_run(const Model *m, int64_t token, int n, int slot, int cache_len, void *k_cache, void *v_cache,
                      int choose, const int64_t *ends, int n_ends, float t, const double *u, float *logits,
                      int64_t *ids, int threads) {
    const int V = m->vocab;
    if (n < 1 || choose < 1 || choose > V || (u && (!(t > 0.f) || t == INFINITY))) return -2;
    if (slot < 0 || slot + n > cache_len || slot + n > m->block) return -3;
    const float inv_t = u ? inverse(t) : 1.f;
    double *sums = u ? malloc(sizeof(double) * ((V + DRAW_BLOCK - 1) / DRAW_BLOCK)) : NULL;
    if (u && !sums) return -1;
    int i = 0;
    for (; i < n; i++) {
        const int64_t position = slot + i;
        const int last = slot + i;
        float *row = logits + (size_t)i * V;
        const int rc = forward_rows(m, &token, &position, 1, 1, cache_len, k_cache, v_cache, NULL, NULL, 0, &last,
                                    row, 1, NULL, threads);
        if (rc != 0) {
            free(sums);
            return i > 0 ? i : rc;
        }
        for (int j = choose; j < V; j++) row[j] = -INFINITY;
        if (!u)
            ids[i] = argmax_row(row, V);
        else if (sample_row(row, V, inv_t, u[i], sums, ids + i) != 0) {
            ids[i] = -1;
            i++;
            break;
        }
        token = ids[i];
        int end = 0;
        for (int e = 0; e < n_ends; e++) end |= token == ends[e];
        if (end) {
            i++;
            break;
        }
    }
    free(sums);
    return i;
}

/* Beam search, up to n steps in one call (no Python between them; see gptcli_decode_run). Step
 * i feeds each of the B beams its token (first: tokens) at position and slot `slot + i` of
 * its row of the cache (B rows of cache_len slots; sources (B, cache_len): which row holds
 * each slot, see slot_offsets) and ranks all their continuations as gptcli_best does (the
 * beams' scores (B), the ids below `choose`, the best k) into values + i * k and index + i * k.
 * Then, but at the run's last step, the beams go on as gptcli/infer/generate.py's
 * beam_search takes them (a step that is not the search's last): by rank, a continuation
 * whose id is in ends (n_ends) is set aside if it ranks among the first B (`ended` were so
 * far), the first B others go on, dead ones (score -inf) making up their number; each takes
 * the cache row that _cache_rows gives it (sources follow), and its token and score are the
 * next step's. A step after which beam_search stops (B set aside, or none going on) is the
 * run's last. Returns the steps taken (1 to n): all ranked, all but the last taken on by the
 * rules above (the caller takes the last, as it takes any step); or -2 (arguments out of
 * their range) or -3 (a token or slot outside the embeddings or the cache), nothing done, or
 * -1: no memory (for a step after the first: the run left half done, its sources moved). */
int gptcli_beam_run(const Model *m, const int64_t *tokens, int B, int n, int slot, int cache_len, void *k_cache,
                    void *v_cache, int32_t *sources, int choose, const int64_t *ends, int n_ends, int ended,
                    const float *scores, int k, float *values, int64_t *index, int threads) {
    const int V = m->vocab;
    if (B < 1 || n < 1 || choose < 1 || choose > V || k < 1) return -2;
    if (slot < 0 || slot + n > cache_len || slot + n > m->block) return -3;
    float *logits = malloc(sizeof(float) * (size_t)B * V), *score = malloc(sizeof(float) * 2 * B);
    int64_t *feed = malloc(sizeof(int64_t) * 4 * (size_t)B);
    int *last = malloc(sizeof(int) * 4 * (size_t)B);
    int32_t *moved = malloc(sizeof(int32_t) * (size_t)B * cache_len);
    int i = 0, rc = 0;
    if (!logits || !score || !feed || !last || !moved) {
        rc = -1;
        goto done;
    }
    int64_t *positions = feed + B, *row = feed + 2 * B, *token = feed + 3 * B;
    int *stay = last + B, *order = last + 2 * B, *movers = last + 3 * B;
    for (int b = 0; b < B; b++) feed[b] = tokens[b], score[b] = scores[b];
    for (; i < n; i++) {
        for (int b = 0; b < B; b++) positions[b] = last[b] = slot + i;
        rc = forward_rows(m, feed, positions, B, B, cache_len, k_cache, v_cache, sources, NULL, 0, last, logits, B,
                          NULL, threads);
        if (rc == 0) rc = gptcli_best(logits, B, V, choose, score, k, values + (size_t)i * k, index + (size_t)i * k,
                                      threads);
        if (rc != 0) break;
        if (i == n - 1) {
            i++;
            break;
        }
        /* the beams that go on: row (the beam each continues), token, score */
        const float *v = values + (size_t)i * k;
        const int64_t *at = index + (size_t)i * k;
        int kept = 0;
        for (int r = 0; r < k && v[r] != -INFINITY; r++) {
            const int64_t id = at[r] % V;
            int end = 0;
            for (int e = 0; e < n_ends; e++) end |= id == ends[e];
            if (end)
                ended += r < B;
            else if (kept < B)
                row[kept] = at[r] / V, token[kept] = id, score[B + kept] = v[r], kept++;
        }
        if (ended >= B || kept == 0) {
            i++;
            break;
        }
        for (; kept < B; kept++) row[kept] = row[0], token[kept] = token[0], score[B + kept] = -INFINITY;
        /* _cache_rows: the first beam continuing a row stays in it, the others take the rows
         * no beam continues, in order */
        int n_movers = 0;
        for (int b = 0; b < B; b++) stay[b] = -1;
        for (int b = 0; b < B; b++)
            if (stay[row[b]] < 0) stay[row[b]] = b;
        for (int b = 0; b < B; b++)
            if (stay[row[b]] != b) movers[n_movers++] = b;
        for (int r = 0, next = 0; r < B; r++) order[r] = stay[r] >= 0 ? stay[r] : movers[next++];
        const int written = slot + i + 1; /* (the slots written so far: KVCache.reorder) */
        for (int r = 0; r < B; r++) {
            const int b = order[r];
            memcpy(moved + (size_t)r * cache_len, sources + (size_t)row[b] * cache_len, sizeof(int32_t) * written);
            feed[r] = token[b], score[r] = score[B + b];
        }
        for (int r = 0; r < B; r++)
            memcpy(sources + (size_t)r * cache_len, moved + (size_t)r * cache_len, sizeof(int32_t) * written);
    }
done:
    free(logits), free(score), free(feed), free(last), free(moved);
    return rc != 0 ? rc : i; /* (a step failing after the first: an error too, the run half done) */
}

/* A prompt's tokens (n) at once, one sequence in a cache of one row (cache_len slots), after
 * the slot0 tokens it holds: token i at position and slot slot0 + i, attending to the slots
 * up to its own (causal). logits (vocab): the last token's; NULL: none (a prompt encoded in
 * parts: all but the last). The products read each weight once for all n tokens. */
int gptcli_prefill(const Model *m, const int64_t *tokens, int n, int slot0, int cache_len, void *k_cache,
                   void *v_cache, float *logits, int threads) {
    if (n < 1 || slot0 < 0 || slot0 + n > cache_len) return -3; /* (slots the cache does not have) */
    int64_t *positions = malloc(sizeof(int64_t) * n);
    int *last = malloc(sizeof(int) * n);
    int rc = -1;
    if (positions && last) {
        for (int i = 0; i < n; i++) positions[i] = last[i] = slot0 + i;
        rc = forward_rows(m, tokens, positions, n, 1, cache_len, k_cache, v_cache, NULL, NULL, 1, last, logits, 1,
                          NULL, threads);
    }
    free(positions), free(last);
    return rc;
}
