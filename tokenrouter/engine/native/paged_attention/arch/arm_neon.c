/* The attention loops with NEON (TR_LEVEL 3, and 4 and 5: dotprod and i8mm have nothing for float
 * attention, so this file serves them too): ARMv8-A's Advanced SIMD, on every ARM64 CPU.
 *
 * L = 16 lanes, as four float32x4_t vectors (lane 4v + i is vector v's lane i), reduced by halves
 * as paged.h says (vectors 0 + 2 and 1 + 3, those two, then lanes 0 + 2 and 1 + 3, then those two),
 * with fused multiply-adds (vfmaq_f32) where the x86 levels fuse: every sum runs in the AVX512
 * loops' order and rounds as they do, so for the same inputs this level computes the AVX512
 * level's bits (tests/native/attention_check.c checks each value against paged.h's order, and
 * prints a digest of each case's output to compare across CPUs).
 * The exp is the x86 levels' Cephes expf, 2^n built in the exponent bits as at AVX2; its clamps
 * are compares and selects, as minps and maxps are (vminq_f32 would keep a NaN). Lanes past the
 * head dimension add +0, as AVX512's masked ones do.
 *
 * NEON has no masked loads, and nothing past a key's vector may be read: q is copied once into
 * rows padded with zeros to 16 floats (LEVEL_SCRATCH), a K row's last values (fewer than 4) are
 * read one at a time, and the output's last d % 4 values are summed one at a time with a vector
 * lane's fused multiply-adds. Of the 32 vector registers, a score pass keeps up to 6 sums of 16
 * lanes (24 registers): several query heads times several keys, each K vector loaded serving every
 * head; a weighted-sum pass keeps up to 16 vectors of output, several heads times several vectors
 * of V, each p_j a lane operand (fmla by element). No sum's order depends on how a pass is blocked.
 */
#if defined(__aarch64__)
/* Only the multiply-adds written as such are fused (vfmaq_f32, fmaf): compilers would fuse a
 * product into a later sum elsewhere too (an exp's last product into softmax's denominator),
 * where paged.h rounds it first. Before paged.h, so that its inline functions carry it too. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#endif
#include "../paged.h"

#if TR_ARM
#include <arm_neon.h>

#define LANES 16
#define MOST 6  /* sums of 16 lanes a score pass (4 registers each) */
#define HEADS 6 /* most query heads a pass: a KV head with more has them 4 at a time */
#define ALWAYS_INLINE static inline __attribute__((always_inline))
/* keys a score pass for hb heads (at most MOST sums), and vectors of V a weighted-sum pass (1, 2,
 * 4, 8 or 16; at most 16 accumulators: more spill to the stack, with V's widened values) */
#define KEYS(hb) ((hb) == 1 ? 6 : (hb) == 2 ? 3 : (hb) == 3 ? 2 : 1)
#define VECTORS(hb) ((hb) == 1 ? 16 : (hb) == 2 ? 8 : (hb) <= 4 ? 4 : 2)

static inline float32x4_t load4(const void *p, int64_t i, int kind) {
    if (kind == KIND_F32) return vld1q_f32((const float *)p + i);
    const uint16x4_t h = vld1_u16((const uint16_t *)p + i);
    if (kind == KIND_F16) return vcvt_f32_f16(vreinterpret_f16_u16(h)); /* exact, subnormals too */
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

/* count (0 to 3) values from i, the other lanes 0 */
static inline float32x4_t load_part(const void *p, int64_t i, int kind, int count) {
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int l = 0; l < count; l++) part[l] = load1(p, i + l, kind);
    return vld1q_f32(part);
}

/* lanes [from, to) of a block of 16 (vector v's lanes 4v .. 4v + 3) all ones */
static inline uint32x4_t lanes_in(int v, int from, int to) {
    const int32x4_t at = vaddq_s32(vdupq_n_s32(4 * v), (int32x4_t){0, 1, 2, 3});
    return vandq_u32(vcgeq_s32(at, vdupq_n_s32(from)), vcltq_s32(at, vdupq_n_s32(to)));
}

static inline float32x4_t only(uint32x4_t in, float32x4_t x) { /* x in the lanes of `in`, +0 elsewhere */
    return vreinterpretq_f32_u32(vandq_u32(in, vreinterpretq_u32_f32(x)));
}

/* A sum of 16 lanes (vectors a0 .. a3) to one vector: lanes l + l+8, then + l+4 (the first two
 * halvings). By value: an array passed by pointer would keep a pass's sums on the stack. */
static inline float32x4_t halve(float32x4_t a0, float32x4_t a1, float32x4_t a2, float32x4_t a3) {
    return vaddq_f32(vaddq_f32(a0, a2), vaddq_f32(a1, a3));
}

static inline float sum16(const float32x4_t *a) { /* the last two: lanes 0+2 and 1+3, then those two */
    const float32x4_t e = halve(a[0], a[1], a[2], a[3]);
    return vpadds_f32(vadd_f32(vget_low_f32(e), vget_high_f32(e)));
}

/* Lane i: the last two halvings of e[i] (lanes 0+2 and 1+3, then those two), as sum16 does; an
 * addition's operands swapped, which gives the same bits. */
static inline float32x4_t finish4(float32x4_t e0, float32x4_t e1, float32x4_t e2, float32x4_t e3) {
    const float32x4_t a = vaddq_f32(vcombine_f32(vget_low_f32(e0), vget_low_f32(e1)),
                                    vcombine_f32(vget_high_f32(e0), vget_high_f32(e1)));
    const float32x4_t b = vaddq_f32(vcombine_f32(vget_low_f32(e2), vget_low_f32(e3)),
                                    vcombine_f32(vget_high_f32(e2), vget_high_f32(e3)));
    return vpaddq_f32(a, b); /* [a0 + a1, a2 + a3, b0 + b1, b2 + b3] */
}

/* Cephes' expf for x <= 0 (s - max), as exp16 at AVX512: range reduction by ln 2 (fused, as
 * fnmadd), degree-6 polynomial, times 2^n. The clamp keeps n in [-126, 128], so n + 127 is a
 * float's exponent field; the product is exact, or rounded once into a subnormal as scalef. */
static inline float32x4_t exp4(float32x4_t x) {
    const float32x4_t top = vdupq_n_f32(88.3762626647949f), bottom = vdupq_n_f32(-87.3365447505531f);
    x = vbslq_f32(vcltq_f32(x, top), x, top); /* minps: a NaN becomes the top */
    x = vbslq_f32(vcgtq_f32(x, bottom), x, bottom);
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f))); /* ties to even */
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t y = vdupq_n_f32(1.9875691500e-4f);
    y = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), y, r);
    y = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), y, r);
    y = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), y, r);
    y = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), y, r);
    y = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), y, r);
    y = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), y, vmulq_f32(r, r));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(y, vreinterpretq_f32_s32(e));
}

/* Scores of keys [lo, n) for hb query heads (qp: hb rows of dp floats, zeros after d) into s (hb
 * rows of `width`), KEYS(hb) keys a pass; a last pass's keys past n repeat key n - 1 and are not
 * stored. hb and kind are constants where it is inlined, so the sums stay in registers. */
ALWAYS_INLINE void scores_of(const int hb, const int kind, const void *k, const int64_t *slots, int64_t lo, int64_t n,
                             int d, const float *qp, int dp, float *s, int64_t width, float scale) {
    const int kb = KEYS(hb), count = hb * kb, whole = d - d % LANES;
    for (int64_t j = lo; j < n; j += kb) {
        float32x4_t acc[MOST][4], kc[8];
        int64_t at[8];
#pragma GCC unroll 8
        for (int i = 0; i < kb; i++) at[i] = slots[j + i < n ? j + i : n - 1] * d;
#pragma GCC unroll 8
        for (int i = 0; i < count; i++) {
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) acc[i][v] = vdupq_n_f32(0.0f);
        }
        for (int c = 0; c < whole; c += LANES) {
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) {
#pragma GCC unroll 8
                for (int i = 0; i < kb; i++) kc[i] = load4(k, at[i] + c + 4 * v, kind);
#pragma GCC unroll 8
                for (int h = 0; h < hb; h++) {
                    const float32x4_t qc = vld1q_f32(qp + h * dp + c + 4 * v);
#pragma GCC unroll 8
                    for (int i = 0; i < kb; i++) acc[h * kb + i][v] = vfmaq_f32(acc[h * kb + i][v], qc, kc[i]);
                }
            }
        }
        if (whole < d) { /* the last block: q's padding is zeros, K's values past d read as zeros */
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) {
                const int left = d - whole - 4 * v;
#pragma GCC unroll 8
                for (int i = 0; i < kb; i++)
                    kc[i] = left >= 4 ? load4(k, at[i] + whole + 4 * v, kind)
                                      : load_part(k, at[i] + whole + 4 * v, kind, left > 0 ? left : 0);
#pragma GCC unroll 8
                for (int h = 0; h < hb; h++) {
                    const float32x4_t qc = vld1q_f32(qp + h * dp + whole + 4 * v);
#pragma GCC unroll 8
                    for (int i = 0; i < kb; i++) acc[h * kb + i][v] = vfmaq_f32(acc[h * kb + i][v], qc, kc[i]);
                }
            }
        }
        float r[8]; /* r[h * kb + i]: key j + i of head h */
        const float32x4_t zero = vdupq_n_f32(0.0f), sc = vdupq_n_f32(scale);
#pragma GCC unroll 2
        for (int a = 0; a < count; a += 4) {
            float32x4_t e[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const int x = a + i < count ? a + i : 0; /* in range, unused where a + i is not */
                e[i] = a + i < count ? halve(acc[x][0], acc[x][1], acc[x][2], acc[x][3]) : zero;
            }
            vst1q_f32(r + a, vmulq_f32(finish4(e[0], e[1], e[2], e[3]), sc));
        }
        const int valid = n - j < kb ? (int)(n - j) : kb;
#pragma GCC unroll 8
        for (int h = 0; h < hb; h++)
            for (int i = 0; i < valid; i++) s[h * width + j + i] = r[h * kb + i];
    }
}

/* Out rows head0 .. head0 + hb - 1, dimensions [c, c + 4 ch): the sum over keys [lo, n) of
 * p[h][j] * v_j's values there, each dimension in increasing j, over sum[h]. hb, ch and kind are
 * constants where it is inlined. */
ALWAYS_INLINE void weighted_sum(const int hb, const int ch, const int kind, const Problem *pr, int64_t t, int head0,
                                const int64_t *slots, int64_t lo, int64_t n, int c, const float *p, int64_t width,
                                const float *sum) {
    const int d = pr->dim;
    float32x4_t acc[16];
#pragma GCC unroll 24
    for (int i = 0; i < hb * ch; i++) acc[i] = vdupq_n_f32(0.0f);
    for (int64_t j = lo; j < n; j++) {
        const int64_t at = slots[j] * d + c;
        float pj[HEADS];
#pragma GCC unroll 6
        for (int h = 0; h < hb; h++) pj[h] = p[h * width + j];
#pragma GCC unroll 16
        for (int i = 0; i < ch; i++) {
            const float32x4_t vv = load4(pr->v, at + 4 * i, kind);
#pragma GCC unroll 6
            for (int h = 0; h < hb; h++) acc[h * ch + i] = vfmaq_n_f32(acc[h * ch + i], vv, pj[h]);
        }
    }
#pragma GCC unroll 8 /* whole, or acc[] would live on the stack */
    for (int h = 0; h < hb; h++) {
        float o[64];
        const float32x4_t total = vdupq_n_f32(sum[h]);
#pragma GCC unroll 16
        for (int i = 0; i < ch; i++) vst1q_f32(o + 4 * i, vdivq_f32(acc[h * ch + i], total));
        store_out(pr, t, head0 + h, c, o, 4 * ch);
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
/* hb heads (1-6) and ch vectors (at most VECTORS(hb)) constant; the kind is not (gcc moves its
 * test out of the loop over keys: a third of the code to compile) */
#define BY_SHAPE(call)                                                                                                 \
    switch (ch * 8 + hb) {                                                                                             \
    case 9: call(1, 1); break;                                                                                         \
    case 10: call(2, 1); break;                                                                                        \
    case 11: call(3, 1); break;                                                                                        \
    case 12: call(4, 1); break;                                                                                        \
    case 13: call(5, 1); break;                                                                                        \
    case 14: call(6, 1); break;                                                                                        \
    case 17: call(1, 2); break;                                                                                        \
    case 18: call(2, 2); break;                                                                                        \
    case 19: call(3, 2); break;                                                                                        \
    case 20: call(4, 2); break;                                                                                        \
    case 21: call(5, 2); break;                                                                                        \
    case 22: call(6, 2); break;                                                                                        \
    case 33: call(1, 4); break;                                                                                        \
    case 34: call(2, 4); break;                                                                                        \
    case 35: call(3, 4); break;                                                                                        \
    case 36: call(4, 4); break;                                                                                        \
    case 65: call(1, 8); break;                                                                                        \
    case 66: call(2, 8); break;                                                                                        \
    default: call(1, 16); break;                                                                                       \
    }

static void scores_any(int hb, int kind, const void *k, const int64_t *slots, int64_t lo, int64_t n, int d,
                       const float *qp, int dp, float *s, int64_t width, float scale) {
#define SCORES(HB, KIND) scores_of(HB, KIND, k, slots, lo, n, d, qp, dp, s, width, scale)
    BY_HEADS(SCORES)
#undef SCORES
}

static void weighted_sum_any(int hb, int ch, int kind, const Problem *pr, int64_t t, int head0, const int64_t *slots,
                             int64_t lo, int64_t n, int c, const float *p, int64_t width, const float *sum) {
#define SUM(HB, CH) weighted_sum(HB, CH, kind, pr, t, head0, slots, lo, n, c, p, width, sum)
    BY_SHAPE(SUM)
#undef SUM
}

/* The last d % 4 dimensions of every head, one value at a time: a vector lane's fused
 * multiply-adds, in the same order over j (nothing read past a key's vector). */
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

/* A row of scores [lo, n) to exp(s - max), which it returns the sum of: key j in lane j % 16,
 * blocks counted from key 0 (the row is whole blocks wide: j0 + 16 <= width). */
static float softmax(float *s, int64_t lo, int64_t n) {
    const int64_t first = lo - lo % LANES;
    const float32x4_t none = vdupq_n_f32(-INFINITY);
    /* the max in lanes, each kept as the scalar rule keeps it (a NaN never wins): the same value;
     * a zero's sign may differ, which no s - max then shows (exp of either is 1) */
    float32x4_t most[4] = {none, none, none, none};
    for (int64_t j0 = first; j0 < n; j0 += LANES) {
        const int from = j0 < lo ? (int)(lo - j0) : 0, to = n - j0 < LANES ? (int)(n - j0) : LANES;
        for (int v = 0; v < 4; v++) {
            float32x4_t x = vld1q_f32(s + j0 + 4 * v);
            if (from > 0 || to < LANES) x = vbslq_f32(lanes_in(v, from, to), x, none); /* keys outside [lo, n) */
            most[v] = vbslq_f32(vcgtq_f32(x, most[v]), x, most[v]);
        }
    }
    float lane[LANES], mx = -INFINITY;
    for (int v = 0; v < 4; v++) vst1q_f32(lane + 4 * v, most[v]);
    for (int l = 0; l < LANES; l++) mx = lane[l] > mx ? lane[l] : mx;
    const float32x4_t top = vdupq_n_f32(mx);
    float32x4_t total[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (int64_t j0 = first; j0 < n; j0 += LANES) {
        const int from = j0 < lo ? (int)(lo - j0) : 0, to = n - j0 < LANES ? (int)(n - j0) : LANES;
        for (int v = 0; v < 4; v++) {
            const float32x4_t x = vsubq_f32(vld1q_f32(s + j0 + 4 * v), top);
            float32x4_t p;
            if (from > 0 || to < LANES) { /* keys outside [lo, n) count +0, whatever their scratch held */
                const uint32x4_t in = lanes_in(v, from, to);
                p = only(in, exp4(only(in, x)));
            } else p = exp4(x);
            vst1q_f32(s + j0 + 4 * v, p);
            total[v] = vaddq_f32(total[v], p);
        }
    }
    return sum16(total);
}

TR_INTERNAL void attend_level(const Problem *pr, int64_t t, int kvh, int64_t lo, int64_t n, int64_t width,
                              const int64_t *slots, const float *qf, float *scores, float *sum) {
    const int g = pr->heads / pr->kv_heads, d = pr->dim, dp = PADDED(d);
    float *qp = sum + g + g * d; /* LEVEL_SCRATCH: q in rows of dp, zeros after d */
    for (int h = 0; h < g; h++) {
        memcpy(qp + h * dp, qf + h * d, sizeof(float) * (size_t)d);
        for (int c = d; c < dp; c++) qp[h * dp + c] = 0.0f;
    }
    const int most = g <= HEADS ? g : 4; /* heads a pass: 7 or 8 would take one key or vector a pass */
    for (int h0 = 0; h0 < g; h0 += most) { /* scores */
        const int hb = g - h0 < most ? g - h0 : most;
        scores_any(hb, pr->kv_kind, pr->k, slots, lo, n, d, qp + h0 * dp, dp, scores + h0 * width, width, pr->scale);
    }
    for (int h = 0; h < g; h++) sum[h] = softmax(scores + h * width, lo, n);
    const int vectors = d / 4;
    for (int h0 = 0; h0 < g; h0 += most) { /* out = sum_j p_j v_j / sum_j p_j */
        const int hb = g - h0 < most ? g - h0 : most;
        for (int v = 0; v < vectors;) {
            int ch = VECTORS(hb);                       /* as many as the registers hold */
            while (ch > 1 && vectors - v < ch) ch /= 2; /* and the dimensions left */
            weighted_sum_any(hb, ch, pr->kv_kind, pr, t, kvh * g + h0, slots, lo, n, 4 * v, scores + h0 * width,
                             width, sum + h0);
            v += ch;
        }
    }
    if (vectors * 4 < d) weighted_sum_tail(pr, t, kvh * g, g, slots, lo, n, vectors * 4, scores, width, sum);
}
#endif
