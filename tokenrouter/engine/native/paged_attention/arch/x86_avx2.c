/* The attention loops with AVX2, FMA and F16C (TR_LEVEL 1): AMD Zen 1-3, Intel from Haswell, AVX512
 * CPUs without VNNI. 8 lanes; the AVX512 loops' structure, each of their 16-lane steps as 8-lane ones.
 *
 * AVX2 has no masked 16-bit loads, and nothing past a key's vector may be read: a score's last
 * (d % 8) bf16 or float16 values of K are copied into a zeroed buffer first (float32 ones read
 * with a masked load); the output's last d % 8 values are summed one at a time, with the fused
 * multiply-adds a lane would do. The exp is the AVX512 one's, 2^n built in the exponent bits
 * instead of scalef: the same bits for the same inputs. The weighted sum of V is the AVX512 one's
 * too, value by value; the scores and softmax's denominator differ in the last bits (8 lanes).
 *
 * A KV head with few query heads (MHA, GQA of 2 to 4) leaves few independent sums a pass, and
 * a fused multiply-add waits for the one before it: its passes take several keys (scores) or
 * several vectors of V (output) at once, up to 8 chains; no sum's order changes.
 */
#include "../paged.h"

#if TR_LEVEL == TR_AVX2
#include <immintrin.h>

#define LANES 8
#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline __m256i first_lanes(int count) { /* lanes [0, count) all ones */
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline __m256 widen(__m128i h, int kind) { /* 8 bf16 or float16 values to float32 */
    if (kind == KIND_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline __m256 load8(const void *p, int64_t i, int kind) {
    if (kind == KIND_F32) return _mm256_loadu_ps((const float *)p + i);
    return widen(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)), kind);
}

/* count < 8 values from i, the other lanes 0. */
static inline __m256 load_part(const void *p, int64_t i, int kind, int count) {
    if (kind == KIND_F32) return _mm256_maskload_ps((const float *)p + i, first_lanes(count));
    uint16_t part[LANES] = {0};
    memcpy(part, (const uint16_t *)p + i, sizeof(uint16_t) * (size_t)count);
    return widen(_mm_loadu_si128((const __m128i *)part), kind);
}

static inline float sum8(__m256 v) { /* fixed: the two halves, then lanes 0+2 and 1+3, then those two */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* Cephes' expf for x <= 0 (s - max), as exp16 at AVX512: range reduction by ln 2, degree-6
 * polynomial, times 2^n. The clamp keeps n in [-126, 128], so n + 127 is a float's exponent field
 * (255, infinity, only where a NaN score was clamped to the top, as scalef gives too). */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)), _mm256_set1_ps(-87.3365447505531f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e)); /* exact, or rounded once into a subnormal as scalef */
}

/* Scores of keys [lo, n) for hb query heads (qh: hb vectors of d floats) into s (hb rows of
 * `width`), kb keys a pass (1, 2 or 4; n - lo a multiple of kb). hb, kb and kind are constants
 * where it is inlined, so the accumulators stay in registers. */
ALWAYS_INLINE void scores_of(const int hb, const int kb, const int kind, const void *k, const int64_t *slots,
                             int64_t lo, int64_t n, int d, const float *qh, float *s, int64_t width, float scale) {
    const int whole = d - d % LANES;
    const __m256i tail = first_lanes(d - whole);
    for (int64_t j = lo; j < n; j += kb) {
        __m256 acc[HEADS_AT_ONCE], kc[4];
        for (int i = 0; i < hb * kb; i++) acc[i] = _mm256_setzero_ps();
        for (int c = 0; c < whole; c += LANES) {
            for (int i = 0; i < kb; i++) kc[i] = load8(k, slots[j + i] * d + c, kind);
            for (int h = 0; h < hb; h++) {
                const __m256 qc = _mm256_loadu_ps(qh + h * d + c);
                for (int i = 0; i < kb; i++) acc[h * kb + i] = _mm256_fmadd_ps(qc, kc[i], acc[h * kb + i]);
            }
        }
        if (whole < d) {
            for (int i = 0; i < kb; i++) kc[i] = load_part(k, slots[j + i] * d + whole, kind, d - whole);
            for (int h = 0; h < hb; h++) {
                const __m256 qc = _mm256_maskload_ps(qh + h * d + whole, tail);
                for (int i = 0; i < kb; i++) acc[h * kb + i] = _mm256_fmadd_ps(qc, kc[i], acc[h * kb + i]);
            }
        }
        for (int h = 0; h < hb; h++)
            for (int i = 0; i < kb; i++) s[h * width + j + i] = sum8(acc[h * kb + i]) * scale;
    }
}

/* Out rows head0 .. head0 + hb - 1, dimensions [c, c + 8 ch): the sum over keys [lo, n) of
 * p[h][j] * v_j's values there, over sum[h]; ch vectors (1, 2 or 4) of each head a pass, which
 * share each p_j's broadcast. */
ALWAYS_INLINE void weighted_sum(const int hb, const int ch, const int kind, const Problem *pr, int64_t t, int head0,
                                const int64_t *slots, int64_t lo, int64_t n, int c, const float *p, int64_t width,
                                const float *sum) {
    const int d = pr->dim;
    __m256 acc[HEADS_AT_ONCE];
    for (int i = 0; i < hb * ch; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t j = lo; j < n; j++) {
        __m256 vc[4];
        for (int i = 0; i < ch; i++) vc[i] = load8(pr->v, slots[j] * d + c + LANES * i, kind);
        for (int h = 0; h < hb; h++) {
            const __m256 pj = _mm256_set1_ps(p[h * width + j]);
            for (int i = 0; i < ch; i++) acc[h * ch + i] = _mm256_fmadd_ps(pj, vc[i], acc[h * ch + i]);
        }
    }
    for (int h = 0; h < hb; h++) {
        float o[4 * LANES];
        const __m256 total = _mm256_set1_ps(sum[h]);
        for (int i = 0; i < ch; i++) _mm256_storeu_ps(o + LANES * i, _mm256_div_ps(acc[h * ch + i], total));
        store_out(pr, t, head0 + h, c, o, ch * LANES);
    }
}

/* hb heads (1-8), `per` keys or vectors a pass (1, 2 or 4; hb * per <= 8) and kind as constants */
#define BY_SHAPE(call, KIND)                                                                                           \
    switch (per == 1 ? hb : per == 2 ? 8 + hb : 12 + hb) {                                                             \
    case 1: call(1, 1, KIND); break;                                                                                   \
    case 2: call(2, 1, KIND); break;                                                                                   \
    case 3: call(3, 1, KIND); break;                                                                                   \
    case 4: call(4, 1, KIND); break;                                                                                   \
    case 5: call(5, 1, KIND); break;                                                                                   \
    case 6: call(6, 1, KIND); break;                                                                                   \
    case 7: call(7, 1, KIND); break;                                                                                   \
    case 8: call(8, 1, KIND); break;                                                                                   \
    case 9: call(1, 2, KIND); break;                                                                                   \
    case 10: call(2, 2, KIND); break;                                                                                  \
    case 11: call(3, 2, KIND); break;                                                                                  \
    case 12: call(4, 2, KIND); break;                                                                                  \
    case 13: call(1, 4, KIND); break;                                                                                  \
    default: call(2, 4, KIND); break;                                                                                  \
    }
#define BY_CONSTANTS(call)                                                                                             \
    switch (kind) {                                                                                                    \
    case KIND_F32: BY_SHAPE(call, KIND_F32) break;                                                                     \
    case KIND_BF16: BY_SHAPE(call, KIND_BF16) break;                                                                   \
    default: BY_SHAPE(call, KIND_F16) break;                                                                           \
    }

static void scores_any(int hb, int per, int kind, const void *k, const int64_t *slots, int64_t lo, int64_t n, int d,
                       const float *qh, float *s, int64_t width, float scale) {
    const int64_t rest = n - (n - lo) % per; /* the last keys, fewer than per: one a pass */
#define SCORES(HB, PER, KIND) scores_of(HB, PER, KIND, k, slots, lo, rest, d, qh, s, width, scale)
    BY_CONSTANTS(SCORES)
#undef SCORES
    if (rest < n) scores_any(hb, 1, kind, k, slots, rest, n, d, qh, s, width, scale);
}

static void weighted_sum_any(int hb, int per, int kind, const Problem *pr, int64_t t, int head0, const int64_t *slots,
                             int64_t lo, int64_t n, int c, const float *p, int64_t width, const float *sum) {
#define SUM(HB, PER, KIND) weighted_sum(HB, PER, KIND, pr, t, head0, slots, lo, n, c, p, width, sum)
    BY_CONSTANTS(SUM)
#undef SUM
}

/* The last d % 8 dimensions of every head, one value at a time: the fused multiply-adds of a
 * vector lane, in the same order over j (no 16-bit loads past a key's vector). */
static void weighted_sum_tail(const Problem *pr, int64_t t, int head0, int g, const int64_t *slots, int64_t lo,
                              int64_t n, int c, const float *p, int64_t width, const float *sum) {
    const int d = pr->dim;
    for (int h = 0; h < g; h++)
        for (int e = c; e < d; e++) {
            float acc = 0.0f;
            for (int64_t j = lo; j < n; j++)
                acc = fmaf(p[h * width + j], load1(pr->v, slots[j] * d + e, pr->kv_kind), acc);
            const float o = acc / sum[h];
            store_out(pr, t, head0 + h, e, &o, 1);
        }
}

TR_INTERNAL void attend_level(const Problem *pr, int64_t t, int kvh, int64_t lo, int64_t n, int64_t width,
                              const int64_t *slots, const float *qf, float *scores, float *sum) {
    const int g = pr->heads / pr->kv_heads, d = pr->dim;
    const int64_t first = lo - lo % LANES; /* blocks of keys counted from key 0 */
    const int wide = g >= 5 ? 1 : g >= 3 ? 2 : 4, heads = HEADS_AT_ONCE / wide; /* keys or vectors a pass */
    for (int h0 = 0; h0 < g; h0 += heads) { /* scores */
        const int hb = g - h0 < heads ? g - h0 : heads;
        scores_any(hb, wide, pr->kv_kind, pr->k, slots, lo, n, d, qf + h0 * d, scores + h0 * width, width, pr->scale);
    }
    for (int h = 0; h < g; h++) { /* softmax: the max, then exp and the sum in lanes by key */
        float *s = scores + h * width;
        float mx = -INFINITY;
        for (int64_t j = lo; j < n; j++) mx = s[j] > mx ? s[j] : mx;
        __m256 total = _mm256_setzero_ps();
        for (int64_t j0 = first; j0 < n; j0 += LANES) { /* s's row is whole blocks wide: j0 + 8 <= width */
            __m256 x = _mm256_sub_ps(_mm256_loadu_ps(s + j0), _mm256_set1_ps(mx)), p;
            if (j0 >= lo && n - j0 >= LANES) {
                p = exp8(x);
            } else { /* keys outside [lo, n) count 0, whatever their scratch held */
                const int from = j0 < lo ? (int)(lo - j0) : 0, to = n - j0 < LANES ? (int)(n - j0) : LANES;
                const __m256 in = _mm256_castsi256_ps(_mm256_andnot_si256(first_lanes(from), first_lanes(to)));
                p = _mm256_and_ps(in, exp8(_mm256_and_ps(in, x)));
            }
            _mm256_storeu_ps(s + j0, p);
            total = _mm256_add_ps(total, p);
        }
        sum[h] = sum8(total);
    }
    const int whole = d - d % LANES;
    for (int c = 0; c < whole;) { /* out = sum_j p_j v_j / sum_j p_j */
        int per = wide; /* as many vectors as the dimensions left hold */
        while (per > 1 && whole - c < per * LANES) per /= 2;
        const int most = HEADS_AT_ONCE / per;
        for (int h0 = 0; h0 < g; h0 += most) {
            const int hb = g - h0 < most ? g - h0 : most;
            weighted_sum_any(hb, per, pr->kv_kind, pr, t, kvh * g + h0, slots, lo, n, c, scores + h0 * width, width,
                             sum + h0);
        }
        c += per * LANES;
    }
    if (whole < d) weighted_sum_tail(pr, t, kvh * g, g, slots, lo, n, whole, scores, width, sum);
}
#endif
