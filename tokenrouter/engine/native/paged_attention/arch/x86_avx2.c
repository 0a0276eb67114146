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
 * A fused multiply-add waits for the one before it, and a KV head's few query heads leave few
 * independent sums: a pass keeps up to 12 accumulators in registers (of 16), several heads times
 * several keys (scores) or several vectors of V (output), and each K, q, V or p value loaded
 * serves all it meets there. A pass's score accumulators are reduced together, by shuffles that
 * add the same lanes in the same order as sum8 does for each. No sum's order depends on how a
 * pass is blocked.
 */
#include "../paged.h"

#if TR_LEVEL == TR_AVX2
#include <immintrin.h>

#define LANES 8
#define MOST 12 /* accumulators a pass */
#define HEADS 6 /* most query heads a pass: a KV head with more has them 4 at a time */
#define ALWAYS_INLINE static inline __attribute__((always_inline))
/* Keys a pass of the scores, and vectors of V a pass of the weighted sum (1, 2, 4 or 8), for hb
 * heads: at most MOST accumulators, and the registers left (16 in all) hold the fewer of the
 * vectors they share (q or K, p_j or V), the others loaded one at a time. */
#define KEYS(hb) ((hb) == 1 ? 8 : (hb) == 2 ? 6 : (hb) == 3 ? 4 : (hb) == 4 ? 3 : 2)
#define VECTORS(hb) ((hb) == 1 ? 8 : (hb) <= 3 ? 4 : 2)
#define KEEP(x) __asm__("" : "+x"(x)) /* in a register: gcc would fold its load into each use */

/* As at AVX512: a row's blocks lie anywhere in the cache, which the hardware's prefetchers cannot
 * guess: each pass asks for the K or V lines of a key about 512 of its multiply-adds ahead (4 to
 * 64 keys), into L2 (into L1 was slower, cold or warm). */
static inline int64_t ahead(int work) {
    const int keys = 512 / work;
    return keys < 4 ? 4 : keys > 64 ? 64 : keys;
}

ALWAYS_INLINE void fetch(const void *p, int64_t i, int kind, int count) { /* count values from i, line by line */
    const int size = kind == KIND_F32 ? 4 : 2;
    const char *a = (const char *)p + i * size;
    for (int b = 0; b < count * size; b += 64) _mm_prefetch(a + b, _MM_HINT_T1);
}

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

/* Lane i of the result: sum8(a[i]), in its order (lanes l + l+4, then 0+2 and 1+3, then those
 * two; an addition's operands swapped, which gives the same bits), for `count` (constant, <= 8)
 * accumulators, the rest counted as zeros. */
ALWAYS_INLINE __m256 reduce_each(const int count, const __m256 *a) {
    __m256 x[4], y[2];
    for (int i = 0; i < 4; i++) { /* [a[i]'s halves summed | a[i + 4]'s] */
        const __m256 lo = i < count ? a[i] : _mm256_setzero_ps(), hi = i + 4 < count ? a[i + 4] : _mm256_setzero_ps();
        x[i] = _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
    }
    for (int i = 0; i < 2; i++) /* lanes 0+2, 1+3: x[2i]'s in lanes 0-1 (4-5), x[2i+1]'s in 2-3 (6-7) */
        y[i] = _mm256_add_ps(_mm256_shuffle_ps(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm256_add_ps(_mm256_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm256_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
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
 * `width`), KEYS(hb) keys a pass; a last pass's keys past n repeat key n - 1 and are not stored.
 * hb and kind are constants where it is inlined, so the accumulators stay in registers. */
ALWAYS_INLINE void scores_of(const int hb, const int kind, const void *k, const int64_t *slots, int64_t lo, int64_t n,
                             int d, const float *qh, float *s, int64_t width, float scale) {
    const int kb = KEYS(hb), whole = d - d % LANES, count = hb * kb;
    const __m256i tail = first_lanes(d - whole);
    const int64_t early = ahead(hb * ((d + LANES - 1) / LANES));
    for (int64_t j = lo; j < n; j += kb) {
        __m256 acc[MOST], kc[8];
        int64_t at[8];
        for (int i = 0; i < kb; i++) at[i] = slots[j + i < n ? j + i : n - 1] * d;
        for (int i = 0; i < kb; i++) fetch(k, slots[j + early + i < n ? j + early + i : n - 1] * d, kind, d);
        for (int i = 0; i < count; i++) acc[i] = _mm256_setzero_ps();
        for (int c = 0; c < whole; c += LANES) {
            if (hb >= kb) { /* the K vectors kept, each q loaded once */
                for (int i = 0; i < kb; i++) kc[i] = load8(k, at[i] + c, kind);
                for (int h = 0; h < hb; h++) {
                    __m256 qc = _mm256_loadu_ps(qh + h * d + c);
                    KEEP(qc);
                    for (int i = 0; i < kb; i++) acc[h * kb + i] = _mm256_fmadd_ps(qc, kc[i], acc[h * kb + i]);
                }
            } else { /* the q vectors kept, each K loaded once */
                __m256 qc[8];
                for (int h = 0; h < hb; h++) {
                    qc[h] = _mm256_loadu_ps(qh + h * d + c);
                    KEEP(qc[h]);
                }
                for (int i = 0; i < kb; i++) {
                    const __m256 kv = load8(k, at[i] + c, kind);
                    for (int h = 0; h < hb; h++) acc[h * kb + i] = _mm256_fmadd_ps(qc[h], kv, acc[h * kb + i]);
                }
            }
        }
        if (whole < d) {
            for (int i = 0; i < kb; i++) kc[i] = load_part(k, at[i] + whole, kind, d - whole);
            for (int h = 0; h < hb; h++) {
                const __m256 qc = _mm256_maskload_ps(qh + h * d + whole, tail);
                for (int i = 0; i < kb; i++) acc[h * kb + i] = _mm256_fmadd_ps(qc, kc[i], acc[h * kb + i]);
            }
        }
        float r[16]; /* lane h * kb + i: key j + i of head h */
        _mm256_storeu_ps(r, _mm256_mul_ps(reduce_each(count < 8 ? count : 8, acc), _mm256_set1_ps(scale)));
        if (count > 8) _mm256_storeu_ps(r + 8, _mm256_mul_ps(reduce_each(count - 8, acc + 8), _mm256_set1_ps(scale)));
        const int valid = n - j < kb ? (int)(n - j) : kb;
        for (int h = 0; h < hb; h++)
            for (int i = 0; i < kb; i++)
                if (i < valid) s[h * width + j + i] = r[h * kb + i];
    }
}

/* Out rows head0 .. head0 + hb - 1, dimensions [c, c + 8 ch): the sum over keys [lo, n) of
 * p[h][j] * v_j's values there, over sum[h]; ch vectors (1, 2, 4 or 8) of each head a pass, which
 * share each p_j's broadcast. */
ALWAYS_INLINE void weighted_sum(const int hb, const int ch, const int kind, const Problem *pr, int64_t t, int head0,
                                const int64_t *slots, int64_t lo, int64_t n, int c, const float *p, int64_t width,
                                const float *sum) {
    const int d = pr->dim;
    __m256 acc[MOST];
    for (int i = 0; i < hb * ch; i++) acc[i] = _mm256_setzero_ps();
    const int64_t early = ahead(hb * ch);
    for (int64_t j = lo; j < n; j++) {
        __m256 vc[8];
        fetch(pr->v, slots[j + early < n ? j + early : n - 1] * d + c, kind, ch * LANES);
        if (hb >= ch) { /* the V vectors kept, each p_j broadcast once */
            for (int i = 0; i < ch; i++) vc[i] = load8(pr->v, slots[j] * d + c + LANES * i, kind);
            for (int h = 0; h < hb; h++) {
                const __m256 pj = _mm256_set1_ps(p[h * width + j]);
                for (int i = 0; i < ch; i++) acc[h * ch + i] = _mm256_fmadd_ps(pj, vc[i], acc[h * ch + i]);
            }
        } else { /* the broadcasts kept, each V vector loaded once */
            __m256 pj[8];
            for (int h = 0; h < hb; h++) pj[h] = _mm256_set1_ps(p[h * width + j]);
            for (int i = 0; i < ch; i++) {
                const __m256 vv = load8(pr->v, slots[j] * d + c + LANES * i, kind);
                for (int h = 0; h < hb; h++) acc[h * ch + i] = _mm256_fmadd_ps(pj[h], vv, acc[h * ch + i]);
            }
        }
    }
    for (int h = 0; h < hb; h++) {
        float o[8 * LANES];
        const __m256 total = _mm256_set1_ps(sum[h]);
        for (int i = 0; i < ch; i++) _mm256_storeu_ps(o + LANES * i, _mm256_div_ps(acc[h * ch + i], total));
        store_out(pr, t, head0 + h, c, o, ch * LANES);
    }
}

/* hb heads (1-6), kind constant */
#define BY_HEADS(call)                                                                                                 \
    switch (hb) {                                                                                                      \
    case 1: BY_KIND(call, 1) break;                                                                                    \
    case 2: BY_KIND(call, 2) break;                                                                                    \
    case 3: BY_KIND(call, 3) break;                                                                                    \
    case 4: BY_KIND(call, 4) break;                                                                                    \
    case 5: BY_KIND(call, 5) break;                                                                                    \
    default: BY_KIND(call, 6) break;                                                                                   \
    }
/* hb heads (1-6) and ch vectors (VECTORS(hb), or fewer where fewer are left) constant, and the kind */
#define BY_SHAPE(call)                                                                                                 \
    switch (ch * 8 + hb) {                                                                                             \
    case 9: BY_KIND(call, 1, 1) break;                                                                                 \
    case 10: BY_KIND(call, 2, 1) break;                                                                                \
    case 11: BY_KIND(call, 3, 1) break;                                                                                \
    case 12: BY_KIND(call, 4, 1) break;                                                                                \
    case 13: BY_KIND(call, 5, 1) break;                                                                                \
    case 14: BY_KIND(call, 6, 1) break;                                                                                \
    case 17: BY_KIND(call, 1, 2) break;                                                                                \
    case 18: BY_KIND(call, 2, 2) break;                                                                                \
    case 19: BY_KIND(call, 3, 2) break;                                                                                \
    case 20: BY_KIND(call, 4, 2) break;                                                                                \
    case 21: BY_KIND(call, 5, 2) break;                                                                                \
    case 22: BY_KIND(call, 6, 2) break;                                                                                \
    case 33: BY_KIND(call, 1, 4) break;                                                                                \
    case 34: BY_KIND(call, 2, 4) break;                                                                                \
    case 35: BY_KIND(call, 3, 4) break;                                                                                \
    default: BY_KIND(call, 1, 8) break;                                                                                \
    }

static void scores_any(int hb, int kind, const void *k, const int64_t *slots, int64_t lo, int64_t n, int d,
                       const float *qh, float *s, int64_t width, float scale) {
#define SCORES(HB, KIND) scores_of(HB, KIND, k, slots, lo, n, d, qh, s, width, scale)
    BY_HEADS(SCORES)
#undef SCORES
}

static void weighted_sum_any(int hb, int ch, int kind, const Problem *pr, int64_t t, int head0, const int64_t *slots,
                             int64_t lo, int64_t n, int c, const float *p, int64_t width, const float *sum) {
#define SUM(HB, CH, KIND) weighted_sum(HB, CH, KIND, pr, t, head0, slots, lo, n, c, p, width, sum)
    BY_SHAPE(SUM)
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
    const int most = g <= HEADS ? g : 4; /* heads a pass: 7 or 8 would take one key or vector a pass */
    for (int h0 = 0; h0 < g; h0 += most) { /* scores */
        const int hb = g - h0 < most ? g - h0 : most;
        scores_any(hb, pr->kv_kind, pr->k, slots, lo, n, d, qf + h0 * d, scores + h0 * width, width, pr->scale);
    }
    for (int h = 0; h < g; h++) { /* softmax: the max, then exp and the sum in lanes by key */
        float *s = scores + h * width;
        /* the max in lanes, each kept as the scalar rule keeps it (max_ps: a NaN never wins): the
         * same value; a zero's sign may differ, which no s - max then shows (exp of either is 1) */
        __m256 top = _mm256_set1_ps(-INFINITY);
        for (int64_t j0 = first; j0 < n; j0 += LANES) {
            __m256 x = _mm256_loadu_ps(s + j0);
            if (j0 < lo || n - j0 < LANES) { /* keys outside [lo, n): -infinity */
                const int from = j0 < lo ? (int)(lo - j0) : 0, to = n - j0 < LANES ? (int)(n - j0) : LANES;
                const __m256 in = _mm256_castsi256_ps(_mm256_andnot_si256(first_lanes(from), first_lanes(to)));
                x = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x, in);
            }
            top = _mm256_max_ps(x, top);
        }
        float lane[LANES], mx = -INFINITY;
        _mm256_storeu_ps(lane, top);
        for (int l = 0; l < LANES; l++) mx = lane[l] > mx ? lane[l] : mx;
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
    const int vectors = d / LANES;
    for (int h0 = 0; h0 < g; h0 += most) { /* out = sum_j p_j v_j / sum_j p_j */
        const int hb = g - h0 < most ? g - h0 : most;
        for (int v = 0; v < vectors;) {
            int ch = VECTORS(hb);                       /* as many as the registers hold */
            while (ch > 1 && vectors - v < ch) ch /= 2; /* and the dimensions left */
            weighted_sum_any(hb, ch, pr->kv_kind, pr, t, kvh * g + h0, slots, lo, n, LANES * v, scores + h0 * width,
                             width, sum + h0);
            v += ch;
        }
    }
    if (vectors * LANES < d) weighted_sum_tail(pr, t, kvh * g, g, slots, lo, n, vectors * LANES, scores, width, sum);
}
#endif
