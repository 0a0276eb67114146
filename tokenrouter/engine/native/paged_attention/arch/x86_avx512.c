/* The attention loops with AVX512 (TR_LEVEL 2): 16 lanes, masked loads for the head dimension's and
 * the keys' tails (16-bit ones too, with BW and VL).
 *
 * A pass keeps up to 16 accumulators in registers (of 32): several query heads times several keys
 * (scores) or several vectors of V (output), so that few heads a KV head still leave enough
 * independent fused multiply-adds, and each K or V vector loaded serves them all. The accumulators
 * are locals of the inlined pass, never passed by pointer: gcc would keep them on the stack. A
 * pass's 16 score accumulators are reduced together, by shuffles that add the same lanes in the
 * same order as _mm512_reduce_add_ps does for each (paged.h): one vector of 16 scores at the end.
 * No sum's order depends on how a pass is blocked.
 */
#include "../paged.h"

#if TR_LEVEL == TR_AVX512
#include <immintrin.h>

#define LANES 16
#define MOST 16 /* accumulators a pass */
#define ALWAYS_INLINE static inline __attribute__((always_inline))
/* keys a pass of the scores for hb heads: 16 accumulators, at most 8 K vectors live */
#define KEYS(hb) (16 / (hb) < 8 ? 16 / (hb) : 8)

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

/* A row's blocks lie anywhere in the cache, which the hardware's prefetchers cannot guess: each
 * pass asks for the K or V lines of a key about 512 of its multiply-adds ahead (4 to 64 keys),
 * into L2 (into L1 costs more where the data is already near). */
static inline int64_t ahead(int work) {
    const int keys = 512 / work;
    return keys < 4 ? 4 : keys > 64 ? 64 : keys;
}

ALWAYS_INLINE void fetch(const void *p, int64_t i, int kind, int count) { /* count values from i, line by line */
    const int size = kind == KIND_F32 ? 4 : 2;
    const char *a = (const char *)p + i * size;
    for (int b = 0; b < count * size; b += 64) _mm_prefetch(a + b, _MM_HINT_T1);
}

static inline __mmask16 dims_mask(int d, int c) { return d - c >= LANES ? 0xffff : (__mmask16)((1u << (d - c)) - 1); }

static inline __mmask16 keys_mask(int64_t j0, int64_t lo, int64_t n) { /* keys [j0, j0 + 16) within [lo, n) */
    uint32_t bits = 0xffffu;
    if (j0 < lo) bits &= 0xffffu << (lo - j0);
    if (n - j0 < LANES) bits &= (1u << (n - j0)) - 1;
    return (__mmask16)bits;
}

static inline __mmask16 lanes_from(int from, int count) { return (__mmask16)(((1u << count) - 1) << from); }

/* Two accumulators' halves added: [a's 256-bit halves summed | b's]; the first step of
 * _mm512_reduce_add_ps for both (high + low: addition commutes, the bits are the same). */
static inline __m512 halves(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}

/* Lane i of the result: _mm512_reduce_add_ps(a[i]), in its order (lanes i + i+8, then + i+4,
 * then lanes 0+2 and 1+3 of what is left, then those two), for `count` (constant) accumulators,
 * the rest counted as zeros. */
ALWAYS_INLINE __m512 reduce_each(const int count, const __m512 *a) {
    __m512 x[8], y[4], z[2];
    for (int i = 0; i < 8; i++) /* 512 -> 256: [acc 2i | acc 2i+1] */
        x[i] = 2 * i >= count       ? _mm512_setzero_ps()
               : 2 * i + 1 < count ? halves(a[2 * i], a[2 * i + 1])
                                   : halves(a[2 * i], _mm512_setzero_ps());
    for (int i = 0; i < 4; i++) /* 256 -> 128: quarter k of y[i] is acc 4i + k */
        y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; i++) /* lanes 0+2, 1+3 of each quarter: acc 8i + k in lanes 0-1, 8i + 4 + k in 2-3 */
        z[i] = _mm512_add_ps(_mm512_shuffle_ps(y[2 * i], y[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(y[2 * i], y[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* lanes 0+1: quarter k holds acc k, 4 + k, 8 + k, 12 + k; a 4x4 transpose puts acc i in lane i */
    const __m512 w = _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), w);
}

/* Scores of keys [lo, n) for hb query heads (qh: hb vectors of d floats) into s (hb rows of
 * `width`), KEYS(hb) keys a pass; a last pass's keys past n repeat key n - 1 and are not stored.
 * hb and kind are constants where it is inlined, so the accumulators stay in registers. */
ALWAYS_INLINE void scores_of(const int hb, const int kind, const void *k, const int64_t *slots, int64_t lo, int64_t n,
                             int d, const float *qh, float *s, int64_t width, float scale) {
    const int kb = KEYS(hb);
    const int64_t early = ahead(hb * ((d + LANES - 1) / LANES));
    for (int64_t j = lo; j < n; j += kb) {
        __m512 acc[MOST], kc[8];
        int64_t at[8];
        for (int i = 0; i < kb; i++) at[i] = slots[j + i < n ? j + i : n - 1] * d;
        for (int i = 0; i < kb; i++) fetch(k, slots[j + early + i < n ? j + early + i : n - 1] * d, kind, d);
        for (int i = 0; i < hb * kb; i++) acc[i] = _mm512_setzero_ps();
        for (int c = 0; c < d; c += LANES) {
            const __mmask16 m = dims_mask(d, c);
            for (int i = 0; i < kb; i++) kc[i] = load16(k, at[i] + c, kind, m);
            for (int h = 0; h < hb; h++) {
                const __m512 qc = _mm512_maskz_loadu_ps(m, qh + h * d + c);
                for (int i = 0; i < kb; i++) acc[h * kb + i] = _mm512_fmadd_ps(qc, kc[i], acc[h * kb + i]);
            }
        }
        const __m512 r = _mm512_mul_ps(reduce_each(hb * kb, acc), _mm512_set1_ps(scale));
        const int valid = n - j < kb ? (int)(n - j) : kb;
        for (int h = 0; h < hb; h++) /* lane h * kb + i is key j + i: stored from s[h][j - h * kb] (>= s) */
            _mm512_mask_storeu_ps(s + h * (width - kb) + j, lanes_from(h * kb, valid), r);
    }
}

/* out[oi + l] = o[l] for the lanes of m, in out's dtype (bf16 rounded as f32_to_bf16 does) */
static inline void store16(const Problem *pr, int64_t oi, __m512 o, __mmask16 m) {
    if (!pr->act_bf16) {
        _mm512_mask_storeu_ps((float *)pr->out + oi, m, o);
        return;
    }
    const __m512i u = _mm512_castps_si512(o), high = _mm512_srli_epi32(u, 16);
    const __m512i even = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(high, _mm512_set1_epi32(1)));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    const __m512i b = _mm512_mask_or_epi32(_mm512_srli_epi32(_mm512_add_epi32(u, even), 16), nan, high,
                                           _mm512_set1_epi32(0x40));
    _mm256_mask_storeu_epi16((uint16_t *)pr->out + oi, m, _mm512_cvtepi32_epi16(b));
}

/* Out rows head0 .. head0 + hb - 1, dimensions [c, min(d, c + 16 ch)): the sum over keys [lo, n)
 * of p[h][j] * v_j's values there, over sum[h]; ch vectors (1, 2, 4 or 8) of each head a pass,
 * which share each p_j's broadcast. hb and ch are constants where it is inlined. */
ALWAYS_INLINE void weighted_sum(const int hb, const int ch, const int kind, const Problem *pr, int64_t t, int head0,
                                const int64_t *slots, int64_t lo, int64_t n, int c, const float *p, int64_t width,
                                const float *sum) {
    const int d = pr->dim;
    __m512 acc[MOST];
    __mmask16 m[8];
    for (int i = 0; i < ch; i++) m[i] = dims_mask(d, c + LANES * i);
    for (int i = 0; i < hb * ch; i++) acc[i] = _mm512_setzero_ps();
    const int64_t early = ahead(hb * ch);
    for (int64_t j = lo; j < n; j++) {
        __m512 vc[8];
        fetch(pr->v, slots[j + early < n ? j + early : n - 1] * d + c, kind, ch * LANES);
        for (int i = 0; i < ch; i++) vc[i] = load16(pr->v, slots[j] * d + c + LANES * i, kind, m[i]);
        for (int h = 0; h < hb; h++) {
            const __m512 pj = _mm512_set1_ps(p[h * width + j]);
            for (int i = 0; i < ch; i++) acc[h * ch + i] = _mm512_fmadd_ps(pj, vc[i], acc[h * ch + i]);
        }
    }
#pragma GCC unroll 8 /* whole, or acc[] would live on the stack */
    for (int h = 0; h < hb; h++) {
        const __m512 total = _mm512_set1_ps(sum[h]);
        const int64_t oi = (t * pr->heads + head0 + h) * (int64_t)d + c;
#pragma GCC unroll 8
        for (int i = 0; i < ch; i++) store16(pr, oi + LANES * i, _mm512_div_ps(acc[h * ch + i], total), m[i]);
    }
}

/* hb heads (1-8), kind constant */
#define BY_HEADS(call)                                                                                                 \
    switch (hb) {                                                                                                      \
    case 1: BY_KIND(call, 1) break;                                                                                    \
    case 2: BY_KIND(call, 2) break;                                                                                    \
    case 3: BY_KIND(call, 3) break;                                                                                    \
    case 4: BY_KIND(call, 4) break;                                                                                    \
    case 5: BY_KIND(call, 5) break;                                                                                    \
    case 6: BY_KIND(call, 6) break;                                                                                    \
    case 7: BY_KIND(call, 7) break;                                                                                    \
    default: BY_KIND(call, 8) break;                                                                                   \
    }
/* hb heads (1-8) and ch vectors (1, 2, 4 or 8; hb * ch <= 16) constant; the kind is not (as
 * fast here, and a third of the code to compile) */
#define BY_SHAPE(call)                                                                                                 \
    switch (ch * 8 + hb) {                                                                                             \
    case 9: call(1, 1); break;                                                                                         \
    case 10: call(2, 1); break;                                                                                        \
    case 11: call(3, 1); break;                                                                                        \
    case 12: call(4, 1); break;                                                                                        \
    case 13: call(5, 1); break;                                                                                        \
    case 14: call(6, 1); break;                                                                                        \
    case 15: call(7, 1); break;                                                                                        \
    case 16: call(8, 1); break;                                                                                        \
    case 17: call(1, 2); break;                                                                                        \
    case 18: call(2, 2); break;                                                                                        \
    case 19: call(3, 2); break;                                                                                        \
    case 20: call(4, 2); break;                                                                                        \
    case 21: call(5, 2); break;                                                                                        \
    case 22: call(6, 2); break;                                                                                        \
    case 23: call(7, 2); break;                                                                                        \
    case 24: call(8, 2); break;                                                                                        \
    case 33: call(1, 4); break;                                                                                        \
    case 34: call(2, 4); break;                                                                                        \
    case 35: call(3, 4); break;                                                                                        \
    case 36: call(4, 4); break;                                                                                        \
    case 65: call(1, 8); break;                                                                                        \
    default: call(2, 8); break;                                                                                        \
    }

static void scores_any(int hb, int kind, const void *k, const int64_t *slots, int64_t lo, int64_t n, int d,
                       const float *qh, float *s, int64_t width, float scale) {
#define SCORES(HB, KIND) scores_of(HB, KIND, k, slots, lo, n, d, qh, s, width, scale)
    BY_HEADS(SCORES)
#undef SCORES
}

static void weighted_sum_any(int hb, int ch, int kind, const Problem *pr, int64_t t, int head0, const int64_t *slots,
                             int64_t lo, int64_t n, int c, const float *p, int64_t width, const float *sum) {
#define SUM(HB, CH) weighted_sum(HB, CH, kind, pr, t, head0, slots, lo, n, c, p, width, sum)
    BY_SHAPE(SUM)
#undef SUM
}

TR_INTERNAL void attend_level(const Problem *pr, int64_t t, int kvh, int64_t lo, int64_t n, int64_t width,
                              const int64_t *slots, const float *qf, float *scores, float *sum) {
    const int g = pr->heads / pr->kv_heads, d = pr->dim;
    const int64_t first = lo - lo % LANES; /* blocks of keys counted from key 0 */
    for (int h0 = 0; h0 < g; h0 += HEADS_AT_ONCE) { /* scores */
        const int hb = g - h0 < HEADS_AT_ONCE ? g - h0 : HEADS_AT_ONCE;
        scores_any(hb, pr->kv_kind, pr->k, slots, lo, n, d, qf + h0 * d, scores + h0 * width, width, pr->scale);
    }
    for (int h = 0; h < g; h++) { /* softmax: the max, then exp and the sum in lanes by key */
        float *s = scores + h * width;
        /* the max in lanes, kept as the scalar rule keeps it (a NaN never wins): the same value; a
         * zero's sign may differ, which no s - max then shows */
        __m512 most = _mm512_set1_ps(-INFINITY);
        for (int64_t j0 = first; j0 < n; j0 += LANES) {
            const __mmask16 m = keys_mask(j0, lo, n);
            const __m512 x = _mm512_maskz_loadu_ps(m, s + j0);
            most = _mm512_mask_mov_ps(most, _mm512_mask_cmp_ps_mask(m, x, most, _CMP_GT_OQ), x);
        }
        float lane[LANES], mx = -INFINITY;
        _mm512_storeu_ps(lane, most);
        for (int l = 0; l < LANES; l++) mx = lane[l] > mx ? lane[l] : mx;
        __m512 total = _mm512_setzero_ps();
        for (int64_t j0 = first; j0 < n; j0 += LANES) {
            const __mmask16 m = keys_mask(j0, lo, n);
            __m512 p =
                _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j0), _mm512_set1_ps(mx))));
            _mm512_mask_storeu_ps(s + j0, m, p);
            total = _mm512_add_ps(total, p);
        }
        sum[h] = _mm512_reduce_add_ps(total);
    }
    const int vectors = (d + LANES - 1) / LANES;
    for (int h0 = 0; h0 < g; h0 += HEADS_AT_ONCE) { /* out = sum_j p_j v_j / sum_j p_j */
        const int hb = g - h0 < HEADS_AT_ONCE ? g - h0 : HEADS_AT_ONCE;
        for (int v = 0; v < vectors;) {
            int ch = MOST / hb >= 8 ? 8 : MOST / hb >= 4 ? 4 : 2; /* as many as 16 accumulators hold */
            while (ch > 1 && vectors - v < ch) ch /= 2;           /* and the dimensions left */
            weighted_sum_any(hb, ch, pr->kv_kind, pr, t, kvh * g + h0, slots, lo, n, LANES * v, scores + h0 * width,
                             width, sum + h0);
            v += ch;
        }
    }
}
#endif
