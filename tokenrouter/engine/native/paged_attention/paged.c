/* tr_paged_attention: the arguments checked, the work split over (query, KV head) pairs, and the
 * plain-C loops (TR_LEVEL 0). paged.h states the order every sum runs in, at each level. */
#if !defined(TR_LEVEL) || TR_LEVEL == 0
/* The plain loops round each product before adding it: compilers fuse them where the CPU has
 * fused multiply-adds (ARM64 by default). Unfused, the plain level is the same bits on x86 and
 * ARM64. Before paged.h, so that its inline functions carry it too (gcc inlines only alike). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#endif
#include "paged.h"

#include <stdlib.h>

#include "../parallel.h"

#if TR_LEVEL == TR_PLAIN
/* Any CPU, in C the compiler vectorizes (SSE2 at x86-64, NEON at ARM64) without -ffast-math: a
 * score's and a denominator's sums are carried in an array of LANES floats, element by element,
 * and each output dimension is its own sum, so vector code computes what scalar code does, lane by
 * lane, and no sum is reordered. The order is the AVX512 loops' (paged.h); only the rounding of
 * the products, never fused here (in the exp too), differs. */
#define LANES 16

/* float16 values to float32, exact where none is zero or subnormal (their bits would be wrong
 * here); returns whether one is, for f16_to_f32 to redo the row: the fast loop has no float op. */
static inline int f16_row(const uint16_t *h, int d, float *out) {
    int small = 0;
    for (int c = 0; c < d; c++) {
        const int32_t x = h[c], a = x & 0x7fff, top = 0 - (a >= 0x7c00); /* as f16_to_f32 */
        const uint32_t u = (uint32_t)(x ^ a) << 16 | (uint32_t)((a << 13) + (112 << 23) + (top & (112 << 23)));
        small |= a < 0x400;
        memcpy(out + c, &u, 4);
    }
    return small;
}

/* The d values of a K or V row at element offset i in float32, zeros after them to `to` (>= d):
 * the cache's own row where it is float32 and needs none, else widened into buf (exact). */
static inline const float *row_of(const void *p, int64_t i, int kind, int d, int to, float *buf) {
    if (kind == KIND_F32 && to == d) return (const float *)p + i;
    const uint16_t *h = (const uint16_t *)p + i;
    if (kind == KIND_F32) memcpy(buf, (const float *)p + i, sizeof(float) * (size_t)d);
    else if (kind == KIND_BF16)
        for (int c = 0; c < d; c++) buf[c] = bf16_to_f32(h[c]);
    else if (f16_row(h, d, buf))
        for (int c = 0; c < d; c++) buf[c] = f16_to_f32(h[c]);
    for (int c = d; c < to; c++) buf[c] = 0.0f;
    return buf;
}

/* The lanes' sum: the upper half added onto the lower, 16 -> 8 -> 4 -> 2 -> 1, the order of
 * _mm512_reduce_add_ps. In GNU C's generic vectors of 4 (SSE2, NEON, or scalar code where there
 * are none): gcc leaves such a tree of scalars unvectorized. */
typedef float f32x4 __attribute__((vector_size(16)));
static inline float sum_lanes(const float *a) {
    f32x4 x[4];
    memcpy(x, a, sizeof(x));
    const f32x4 e = (x[0] + x[2]) + (x[1] + x[3]); /* lanes l + l+8 (l < 8), then l + l+4 */
    return (e[0] + e[2]) + (e[1] + e[3]);
}

/* q . k over dp dimensions (a multiple of LANES: q and k padded with zeros, which add +0 to a
 * lane, exactly nothing), dimension c in lane c % LANES. */
static inline float dot(const float *restrict q, const float *restrict k, int dp) {
    float acc[LANES] = {0};
    for (int c = 0; c < dp; c += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += q[c + l] * k[c + l];
    return sum_lanes(acc);
}

/* yes ? a : b by masks: gcc turns ?: into branches, then neither vectorizes nor moves float ops out
 * of them (they could trap). */
static inline float pick(int yes, float a, float b) {
    uint32_t ua, ub;
    memcpy(&ua, &a, 4);
    memcpy(&ub, &b, 4);
    const uint32_t m = 0u - (uint32_t)yes;
    ua = (ua & m) | (ub & ~m);
    memcpy(&a, &ua, 4);
    return a;
}

/* Cephes' expf for x <= 0 as exp16 at AVX512 computes it, each product rounded before its sum.
 * (t + 1.5 * 2^23) - 1.5 * 2^23 rounds t to the nearest integer, ties to even (|t| < 2^22). */
static inline float exp1(float x) {
    x = pick(x < 88.3762626647949f, x, 88.3762626647949f); /* a NaN becomes the top, as minps does */
    x = pick(x > -87.3365447505531f, x, -87.3365447505531f);
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * (r * r) + (r + 1.0f);
    const uint32_t e = (uint32_t)((int32_t)n + 127) << 23; /* 2^n: n in [-126, 128] */
    float two;
    memcpy(&two, &e, 4);
    return y * two;
}

/* Scores of keys [lo, n) for the g heads (q: g rows of dp, padded) into s (g rows of `width`):
 * each K row widened once for all g. */
static void scores_of(const Problem *pr, const int64_t *slots, int64_t lo, int64_t n, const float *q, int dp, float *s,
                      int64_t width, float *row) {
    const int g = pr->heads / pr->kv_heads, d = pr->dim;
    for (int64_t j = lo; j < n; j++) {
        const float *k = row_of(pr->k, slots[j] * d, pr->kv_kind, d, dp, row);
        for (int h = 0; h < g; h++) s[h * width + j] = dot(q + h * dp, k, dp) * pr->scale;
    }
}

/* A row of scores [lo, n) to exp(s - max), which it returns the sum of: key j in lane j % LANES,
 * blocks counted from key 0 (`first`, whole blocks to `end`: width is a multiple of LANES). */
static float softmax(float *s, int64_t lo, int64_t n) {
    const int64_t first = lo - lo % LANES, end = (n + LANES - 1) / LANES * LANES;
    float most[LANES], total[LANES] = {0}, mx = -INFINITY;
    for (int64_t j = first; j < lo; j++) s[j] = -INFINITY; /* keys outside [lo, n) count nothing */
    for (int64_t j = n; j < end; j++) s[j] = -INFINITY;
    for (int l = 0; l < LANES; l++) most[l] = -INFINITY;
    for (int64_t j0 = first; j0 < end; j0 += LANES) /* the max in lanes (its value is the scalar rule's) */
        for (int l = 0; l < LANES; l++) most[l] = s[j0 + l] > most[l] ? s[j0 + l] : most[l];
    for (int l = 0; l < LANES; l++) mx = most[l] > mx ? most[l] : mx; /* a NaN never wins */
    for (int64_t j0 = first; j0 < end; j0 += LANES) {
        const int from = j0 < lo ? (int)(lo - j0) : 0, to = n - j0 < LANES ? (int)(n - j0) : LANES;
        for (int l = 0; l < LANES; l++) { /* p, or 0 outside [lo, n) */
            s[j0 + l] = pick((l >= from) & (l < to), exp1(s[j0 + l] - mx), 0.0f);
            total[l] += s[j0 + l];
        }
    }
    return sum_lanes(total);
}

/* acc (g rows of d, zeroed) += p_j v_j over keys [lo, n) in increasing j, each dimension its own
 * sum: four keys a pass (one load and store of acc for four), added in their order. */
static void weighted_sum(const Problem *pr, const int64_t *slots, int64_t lo, int64_t n, const float *p, int64_t width,
                         float *acc, float *row) {
    const int g = pr->heads / pr->kv_heads, d = pr->dim, kind = pr->kv_kind;
    int64_t j = lo;
    for (; j + 4 <= n; j += 4) {
        const float *v[4];
        for (int i = 0; i < 4; i++) v[i] = row_of(pr->v, slots[j + i] * d, kind, d, d, row + i * d);
        const float *restrict v0 = v[0], *v1 = v[1], *v2 = v[2], *v3 = v[3];
        for (int h = 0; h < g; h++) {
            const float *ph = p + h * width + j, p0 = ph[0], p1 = ph[1], p2 = ph[2], p3 = ph[3];
            float *restrict o = acc + h * d;
            for (int c = 0; c < d; c++) o[c] = o[c] + p0 * v0[c] + p1 * v1[c] + p2 * v2[c] + p3 * v3[c];
        }
    }
    for (; j < n; j++) {
        const float *v = row_of(pr->v, slots[j] * d, kind, d, d, row);
        for (int h = 0; h < g; h++) {
            const float ph = p[h * width + j];
            float *restrict o = acc + h * d;
            for (int c = 0; c < d; c++) o[c] += ph * v[c];
        }
    }
}

TR_INTERNAL void attend_level(const Problem *pr, int64_t t, int kvh, int64_t lo, int64_t n, int64_t width,
                              const int64_t *slots, const float *qf, float *scores, float *sum) {
    const int g = pr->heads / pr->kv_heads, d = pr->dim, dp = PADDED(d);
    /* after q, LEVEL_SCRATCH: q again, rows padded to dp; 4 rows of K or V; g rows of out */
    float *q = sum + g + g * d, *row = q + g * dp, *acc = row + 4 * dp;
    for (int h = 0; h < g; h++) {
        memcpy(q + h * dp, qf + h * d, sizeof(float) * (size_t)d);
        for (int c = d; c < dp; c++) q[h * dp + c] = 0.0f;
    }
    scores_of(pr, slots, lo, n, q, dp, scores, width, row);
    for (int h = 0; h < g; h++) sum[h] = softmax(scores + h * width, lo, n);
    memset(acc, 0, sizeof(float) * (size_t)g * (size_t)d);
    weighted_sum(pr, slots, lo, n, scores, width, acc, row);
    for (int h = 0; h < g; h++) {
        float *o = acc + h * d;
        for (int c = 0; c < d; c++) o[c] /= sum[h];
        store_out(pr, t, kvh * g + h, 0, o, d);
    }
}
#endif

/* One query's heads of one KV head: the slots of its keys and its q in float32, then the level's
 * loops. `slots` holds n slot numbers; `scratch` g rows of `width` scores (the call's most keys,
 * rounded up), g sums and g * dim floats of q. */
static void attend(const Problem *pr, int64_t t, int kvh, int64_t width, int64_t *slots, float *scratch) {
    const int g = pr->heads / pr->kv_heads, d = pr->dim, kvn = pr->kv_heads;
    const int64_t row = pr->token_row[t], n = pr->token_keys[t];
    const int64_t lo = pr->window > 0 && n > pr->window ? n - pr->window : 0;
    const int32_t *table = pr->tables + row * pr->table_width;
    const int bs = pr->block_size;
    for (int64_t j = lo - lo % bs; j < n; j += bs) { /* no division per key */
        const int64_t base = (int64_t)table[j / bs] * bs;
        for (int64_t o = 0; o < bs && j + o < n; o++) slots[j + o] = (base + o) * kvn + kvh;
    }
    float *scores = scratch, *sum = scores + g * width, *qf = sum + g;
    for (int h = 0; h < g; h++) {
        const int64_t qi = t * pr->q_stride_t + (int64_t)(kvh * g + h) * pr->q_stride_h;
        for (int c = 0; c < d; c++) qf[h * d + c] = load1(pr->q, qi + c, pr->act_bf16 ? KIND_BF16 : KIND_F32);
    }
    attend_level(pr, t, kvh, lo, n, width, slots, qf, scores, sum);
}

#ifndef _OPENMP
typedef struct { /* the items split in `shares` contiguous runs, a share's scratch its own */
    const Problem *pr;
    int64_t items, shares;
    int kv_heads;
    int64_t width, most, scratch_floats;
    int *failed;
} AttendShares;

static void attend_share(const void *ctx, int64_t k) {
    const AttendShares *j = ctx;
    int64_t begin, end;
    tr_share(j->items, (int)j->shares, (int)k, &begin, &end);
    float *scratch = malloc(sizeof(float) * (size_t)j->scratch_floats);
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)(j->most > 0 ? j->most : 1));
    if (scratch && slots)
        for (int64_t i = begin; i < end; i++)
            attend(j->pr, i / j->kv_heads, (int)(i % j->kv_heads), j->width, slots, scratch);
    else if (begin < end)
        __atomic_store_n(j->failed, 1, __ATOMIC_RELAXED);
    free(scratch);
    free(slots);
}
#endif

/* The level this library was built for: level.h's number (cpu.py's ALL_LEVELS, in order). */
int tr_attention_level(void) { return TR_LEVEL; }

/* out [tokens, heads, dim] (contiguous, q's dtype) for every query of the step. token_row[t]: the
 * row (index into tables, [rows, table_width] block ids of a cache of cache_blocks) of query t;
 * token_keys[t]: how many keys it attends to (its position + 1). window <= 0: no sliding window.
 * Returns 0, or -1 on bad arguments (a row, key count or block id out of range: nothing is read
 * outside the cache) or memory. */
int tr_paged_attention(const void *q, int64_t q_stride_t, int64_t q_stride_h, void *out, int act_bf16, const void *k,
                       const void *v, int kv_kind, int64_t cache_blocks, int64_t tokens, int heads, int kv_heads,
                       int dim, const int32_t *token_row, const int32_t *token_keys, const int32_t *tables,
                       int64_t rows, int64_t table_width, int block_size, int window, float scale, int threads) {
    if (kv_kind < KIND_F32 || kv_kind > KIND_F16) return -1;
    if (tokens < 0 || heads <= 0 || kv_heads <= 0 || heads % kv_heads || dim <= 0 || block_size <= 0) return -1;
    int64_t most = 0;
    int64_t *need = calloc(rows > 0 ? (size_t)rows : 1, sizeof(int64_t)); /* each row's most keys */
    if (!need) return -1;
    int bad = 0;
    for (int64_t t = 0; t < tokens && !bad; t++) {
        bad =
            token_row[t] < 0 || token_row[t] >= rows || token_keys[t] <= 0 || token_keys[t] > table_width * block_size;
        if (!bad && token_keys[t] > need[token_row[t]]) need[token_row[t]] = token_keys[t];
        most = token_keys[t] > most ? token_keys[t] : most;
    }
    for (int64_t r = 0; r < rows && !bad; r++)
        for (int64_t b = 0; b * block_size < need[r] && !bad; b++)
            bad = tables[r * table_width + b] < 0 || tables[r * table_width + b] >= cache_blocks;
    free(need);
    if (bad) return -1;
    const Problem pr = {.q = q,
                        .out = out,
                        .act_bf16 = act_bf16,
                        .k = k,
                        .v = v,
                        .kv_kind = kv_kind,
                        .heads = heads,
                        .kv_heads = kv_heads,
                        .dim = dim,
                        .q_stride_t = q_stride_t,
                        .q_stride_h = q_stride_h,
                        .token_row = token_row,
                        .token_keys = token_keys,
                        .tables = tables,
                        .table_width = table_width,
                        .block_size = block_size,
                        .window = window,
                        .scale = scale};
    const int g = heads / kv_heads;
    const int64_t width = (most + SCORE_ALIGN - 1) / SCORE_ALIGN * SCORE_ALIGN, items = tokens * kv_heads;
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        float *scratch = malloc(sizeof(float) * (size_t)(g * width + g + g * dim + LEVEL_SCRATCH(g, dim)));
        int64_t *slots = malloc(sizeof(int64_t) * (size_t)(most > 0 ? most : 1));
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < items; i++) {
            if (scratch && slots) attend(&pr, i / kv_heads, (int)(i % kv_heads), width, slots, scratch);
            else {
#pragma omp atomic write
                failed = 1;
            }
        }
        free(scratch);
        free(slots);
    }
#else /* parallel.h's threads: one share of the items each, with its scratch */
    const int64_t most_threads = threads > 0 ? threads : 1, shares = items < most_threads ? items : most_threads;
    const int64_t scratch_floats = g * width + g + g * dim + LEVEL_SCRATCH(g, dim);
    const AttendShares job = {&pr, items, shares, kv_heads, width, most, scratch_floats, &failed};
    TR_PARALLEL_FOR(shares, (int)shares, attend_share, &job);
#endif
    return failed ? -1 : 0;
}
