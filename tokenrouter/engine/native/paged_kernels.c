/* Paged attention on CPU, one query at a time, so that a query's result is the same bits in any step.
 *
 * A query's output depends only on its own vector and the K/V of the keys it attends to: never on
 * the other queries or rows in the call, nor on how wide the call's widest row is. torch's CPU SDPA
 * tiles keys and queries by the call's shapes, so the same token computed in a decode step, in a
 * verifier's check of k drafts, or in a prefill got other bits (docs/evaluation.md, "A row's result must not depend on its step"), and greedy
 * Speculative was not always its target's own output. Here every sum runs in one fixed order:
 *   - a score is one vector accumulator over the head dimension, 16 lanes at a time, then a
 *     fixed horizontal sum;
 *   - softmax's denominator sums key j in lane j % 16, blocks of 16 counted from key 0 (not from
 *     the first key a sliding window lets in), then a fixed horizontal sum;
 *   - the output accumulates p_j * v_j over keys in increasing j, per 16 dimensions.
 * Work is split over (query, KV head) pairs, each computed whole by one thread.
 *
 * q [tokens, heads, head_dim] (strides given, the last dimension contiguous), K and V caches
 * [slots, kv_heads, head_dim] contiguous, slot = table[row][j / block_size] * block_size +
 * j % block_size. q and out float32 or bf16; K and V float32, bf16 or float16 (llama.cpp's KV type);
 * every product and sum in float32. A query attends to keys
 * [lo, keys) of its row, lo = keys - window where a sliding window applies.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define LANES 16
#define HEADS_AT_ONCE 8 /* query heads of one KV head per pass: their accumulators stay in registers */

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch converts */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h) { /* exact: the value rebuilt from its fields */
    const int e = (h >> 10) & 31, m = h & 1023;
    const float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);
    return h >> 15 ? -v : v;
}

enum { KIND_F32 = 0, KIND_BF16 = 1, KIND_F16 = 2 }; /* how a tensor's values are stored */

static inline float load1(const void *p, int64_t i, int kind) {
    if (kind == KIND_BF16) return bf16_to_f32(((const uint16_t *)p)[i]);
    if (kind == KIND_F16) return f16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

typedef struct {
    const void *q;
    void *out;
    int act_bf16;
    const void *k;
    const void *v;
    int kv_kind;
    int heads, kv_heads, dim;
    int64_t q_stride_t, q_stride_h;
    const int32_t *token_row, *token_keys, *tables;
    int64_t table_width;
    int block_size, window;
    float scale;
} Problem;

#ifdef __AVX512F__
static inline __m512 load16(const void *p, int64_t i, int kind, __mmask16 m) {
    if (kind == KIND_F32) return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
    if (kind == KIND_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline __m512 exp16(__m512 x) { /* Cephes' expf: range reduction by ln 2, degree-6 polynomial */
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)), _mm512_set1_ps(-87.3365447505531f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Scores of keys [lo, n) for hb query heads (qh: hb vectors of d floats) into s (hb rows of
 * `width`). hb and kind are constants where it is inlined, so the accumulators stay in registers. */
ALWAYS_INLINE void scores_of(const int hb, const int kind, const void *k, const int64_t *slots, int64_t lo, int64_t n,
                             int d, const float *qh, float *s, int64_t width, float scale) {
    for (int64_t j = lo; j < n; j++) {
        __m512 acc[HEADS_AT_ONCE];
        for (int h = 0; h < hb; h++) acc[h] = _mm512_setzero_ps();
        for (int c = 0; c < d; c += LANES) {
            const __mmask16 m = d - c >= LANES ? 0xffff : (__mmask16)((1u << (d - c)) - 1);
            const __m512 kc = load16(k, slots[j] * d + c, kind, m);
            for (int h = 0; h < hb; h++) acc[h] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, qh + h * d + c), kc, acc[h]);
        }
        for (int h = 0; h < hb; h++) s[h * width + j] = _mm512_reduce_add_ps(acc[h]) * scale;
    }
}

/* acc[h] = sum over keys [lo, n) of p[h][j] * v_j's 16 values from dimension c (mask m). */
ALWAYS_INLINE void weighted_sum(const int hb, const int kind, const void *v, const int64_t *slots, int64_t lo,
                                int64_t n, int d, int c, __mmask16 m, const float *p, int64_t width, __m512 *acc) {
    for (int h = 0; h < hb; h++) acc[h] = _mm512_setzero_ps();
    for (int64_t j = lo; j < n; j++) {
        const __m512 vc = load16(v, slots[j] * d + c, kind, m);
        for (int h = 0; h < hb; h++) acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(p[h * width + j]), vc, acc[h]);
    }
}

#define BY_HEADS(call, KIND)                                                                                           \
    switch (hb) {                                                                                                      \
    case 1: call(1, KIND); break;                                                                                      \
    case 2: call(2, KIND); break;                                                                                      \
    case 3: call(3, KIND); break;                                                                                      \
    case 4: call(4, KIND); break;                                                                                      \
    case 5: call(5, KIND); break;                                                                                      \
    case 6: call(6, KIND); break;                                                                                      \
    case 7: call(7, KIND); break;                                                                                      \
    default: call(8, KIND); break;                                                                                     \
    }
#define BY_CONSTANTS(call)                                                                                             \
    switch (kind) {                                                                                                    \
    case KIND_F32: BY_HEADS(call, KIND_F32) break;                                                                     \
    case KIND_BF16: BY_HEADS(call, KIND_BF16) break;                                                                   \
    default: BY_HEADS(call, KIND_F16) break;                                                                           \
    }

static void scores_any(int hb, int kind, const void *k, const int64_t *slots, int64_t lo, int64_t n, int d,
                       const float *qh, float *s, int64_t width, float scale) {
#define SCORES(HB, KIND) scores_of(HB, KIND, k, slots, lo, n, d, qh, s, width, scale)
    BY_CONSTANTS(SCORES)
#undef SCORES
}

static void weighted_sum_any(int hb, int kind, const void *v, const int64_t *slots, int64_t lo, int64_t n, int d, int c,
                             __mmask16 m, const float *p, int64_t width, __m512 *acc) {
#define SUM(HB, KIND) weighted_sum(HB, KIND, v, slots, lo, n, d, c, m, p, width, acc)
    BY_CONSTANTS(SUM)
#undef SUM
}
#endif

/* One query's heads of one KV head: g = heads / kv_heads query heads, keys [lo, n). `scores` holds
 * g * (n rounded up to 16) floats, `slots` n slot numbers, `qf` g * dim floats. */
static int attend(const Problem *pr, int64_t t, int kvh, float *scores, int64_t *slots, float *qf) {
    const int g = pr->heads / pr->kv_heads, d = pr->dim, kvn = pr->kv_heads;
    const int64_t row = pr->token_row[t], n = pr->token_keys[t];
    const int64_t lo = pr->window > 0 && n > pr->window ? n - pr->window : 0;
    const int64_t first = lo - lo % LANES, width = (n + LANES - 1) / LANES * LANES;
    const int32_t *table = pr->tables + row * pr->table_width;
    const int bs = pr->block_size;
    for (int64_t j = lo - lo % bs; j < n; j += bs) { /* no division per key */
        const int64_t base = (int64_t)table[j / bs] * bs;
        for (int64_t o = 0; o < bs && j + o < n; o++) slots[j + o] = (base + o) * kvn + kvh;
    }
    for (int h = 0; h < g; h++) {
        const int64_t qi = t * pr->q_stride_t + (int64_t)(kvh * g + h) * pr->q_stride_h;
        for (int c = 0; c < d; c++) qf[h * d + c] = load1(pr->q, qi + c, pr->act_bf16 ? KIND_BF16 : KIND_F32);
    }
    float sums[256];
    float *sum = g <= 256 ? sums : malloc(sizeof(float) * g);
    if (!sum) return -1;
#ifdef __AVX512F__
    for (int h0 = 0; h0 < g; h0 += HEADS_AT_ONCE) { /* scores */
        const int hb = g - h0 < HEADS_AT_ONCE ? g - h0 : HEADS_AT_ONCE;
        scores_any(hb, pr->kv_kind, pr->k, slots, lo, n, d, qf + h0 * d, scores + h0 * width, width, pr->scale);
    }
    for (int h = 0; h < g; h++) { /* softmax: the max, then exp and the sum in lanes by key */
        float *s = scores + h * width;
        float mx = -INFINITY;
        for (int64_t j = lo; j < n; j++) mx = s[j] > mx ? s[j] : mx;
        __m512 total = _mm512_setzero_ps();
        for (int64_t j0 = first; j0 < n; j0 += LANES) {
            uint32_t bits = 0xffffu;
            if (j0 < lo) bits &= 0xffffu << (lo - j0);
            if (n - j0 < LANES) bits &= (1u << (n - j0)) - 1;
            const __mmask16 m = (__mmask16)bits;
            __m512 p =
                _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j0), _mm512_set1_ps(mx))));
            _mm512_mask_storeu_ps(s + j0, m, p);
            total = _mm512_add_ps(total, p);
        }
        sum[h] = _mm512_reduce_add_ps(total);
    }
    for (int c = 0; c < d; c += LANES) { /* out = sum_j p_j v_j / sum_j p_j */
        const __mmask16 m = d - c >= LANES ? 0xffff : (__mmask16)((1u << (d - c)) - 1);
        for (int h0 = 0; h0 < g; h0 += HEADS_AT_ONCE) {
            const int hb = g - h0 < HEADS_AT_ONCE ? g - h0 : HEADS_AT_ONCE;
            __m512 acc[HEADS_AT_ONCE];
            weighted_sum_any(hb, pr->kv_kind, pr->v, slots, lo, n, d, c, m, scores + h0 * width, width, acc);
            for (int h = 0; h < hb; h++) {
                const __m512 o = _mm512_div_ps(acc[h], _mm512_set1_ps(sum[h0 + h]));
                const int64_t oi = (t * pr->heads + kvh * g + h0 + h) * (int64_t)d + c;
                if (pr->act_bf16) {
                    float tmp[LANES];
                    _mm512_storeu_ps(tmp, o);
                    for (int l = 0; l < LANES && c + l < d; l++) ((uint16_t *)pr->out)[oi + l] = f32_to_bf16(tmp[l]);
                } else {
                    _mm512_mask_storeu_ps((float *)pr->out + oi, m, o);
                }
            }
        }
    }
#else
    (void)first;
    for (int h = 0; h < g; h++) {
        float *s = scores + h * width;
        float mx = -INFINITY;
        for (int64_t j = lo; j < n; j++) {
            float acc = 0.0f;
            for (int c = 0; c < d; c++) acc += qf[h * d + c] * load1(pr->k, slots[j] * d + c, pr->kv_kind);
            s[j] = acc * pr->scale;
            mx = s[j] > mx ? s[j] : mx;
        }
        float total = 0.0f;
        for (int64_t j = lo; j < n; j++) total += (s[j] = expf(s[j] - mx));
        for (int c = 0; c < d; c++) {
            float acc = 0.0f;
            for (int64_t j = lo; j < n; j++) acc += s[j] * load1(pr->v, slots[j] * d + c, pr->kv_kind);
            const float o = acc / total;
            const int64_t oi = (t * pr->heads + kvh * g + h) * (int64_t)d + c;
            if (pr->act_bf16) ((uint16_t *)pr->out)[oi] = f32_to_bf16(o);
            else ((float *)pr->out)[oi] = o;
        }
    }
#endif
    if (sum != sums) free(sum);
    return 0;
}

int tr_attention_vectorized(void) {
#ifdef __AVX512F__
    return 1;
#else
    return 0;
#endif
}

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
    const int64_t width = (most + LANES - 1) / LANES * LANES, items = tokens * kv_heads;
    int failed = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        float *scores = malloc(sizeof(float) * (size_t)(g * width + g * dim));
        int64_t *slots = malloc(sizeof(int64_t) * (size_t)(most > 0 ? most : 1));
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < items; i++)
            if (!scores || !slots ||
                attend(&pr, i / kv_heads, (int)(i % kv_heads), scores, slots, scores + g * width)) {
#pragma omp atomic write
                failed = 1;
            }
        free(scores);
        free(slots);
    }
    return failed ? -1 : 0;
}
