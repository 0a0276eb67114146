/* The group kernels for ARM64 (TR_LEVEL 3-5): NEON, with dotprod's sdot, with i8mm's smmla.
 *
 * A 128-bit vector is a quarter of a group's 64 bytes: 4 codes of each of 4 rows of W (rows 4q..
 * 4q+3 in quarter q). Each block is computed a quarter at a time against every row of x, the
 * quarter's sums in 4 int32 lanes, one per row of W. The three levels differ only in how 8 codes
 * of each row (two quarters: values k..k+3 and k+4..k+7) meet x's 8 values, `sums_add` below:
 *   TR_NEON     vmull_s8 and vmlal_s8 into int16 (a pair of products stays within int16: codes of
 *               up to 8 bits signed, x within +-127), vpadalq_s16 into int32 pairs, added up per
 *               row at the end of a run of sums (`Sum4`);
 *   TR_DOTPROD  vdotq_s32: 4 products a lane, x's 4 values broadcast;
 *   TR_I8MM     vmmlaq_s32 on two rows of x at once (a 2x8 tile of x by two rows of W's 8 codes,
 *               zipped from the two quarters): half the multiplies of sdot; an odd last row of x
 *               (a decode step's only one) takes sdot.
 * Codes are unsigned but fit int8 (Q6_K's 6 bits at most), multiplied signed; Q8_0's codes + 128
 * are taken back to int8, which leaves out x's offset sum (`xo`) the plain path starts from: the
 * same integer either way. All integer sums are exact and equal plain C's.
 *
 * Float order: each block's scaling is the x86 levels' fused multiply-adds in their order, per
 * lane: acc = fma(isum, d * dx, acc), then acc = fma(-msum, dmin * dx, acc) (Q4_K, Q5_K),
 * fma(m, dx * xsum, acc) (Q4_1, Q5_1), blocks in order. A row's result is therefore the same bits
 * as at AVX2 and AVX512 (and as plain C where its compiler contracts the multiply-add, as gcc
 * does on ARM64), and differs from plain C without contraction by float rounding only. It never
 * depends on the rows of x in the call, the tile or the threads: each row's integers are exact
 * and its float steps the same whichever path (paired or alone) computed them.
 *
 * No software prefetch (`ahead` is unused): the x86 levels' was tuned on their own hardware, and
 * there was no ARM64 machine to tune one on.
 */
#include "../blocks.h"

#if TR_ARM
#include <arm_neon.h>

#define INLINE static inline __attribute__((always_inline))

/* ---- x rounded to int8: the plain path's float operations, 4 values at a time ---- */

static inline float32x4_t load4(const void *x, int x_bf16, int64_t k) {
    if (!x_bf16) return vld1q_f32((const float *)x + k);
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)x + k), 16));
}

TR_INTERNAL void quantize_row_level(const void *x, int x_bf16, int64_t K, int block, int offset, int8_t *q, float *d,
                                    int16_t *bsums, int16_t *bsum32, int32_t *xo) {
    for (int64_t b = 0; b < K / block; b++) {
        const int64_t at = b * block;
        float32x4_t amax = vdupq_n_f32(0.0f);
        for (int i = 0; i < block; i += 4) /* maxnm: a NaN is passed over, as plain C's max passes it */
            amax = vmaxnmq_f32(amax, vabsq_f32(load4(x, x_bf16, at + i)));
        const float mx = vmaxnmvq_f32(amax), inv = mx > 0.0f ? 127.0f / mx : 0.0f;
        d[b] = mx / 127.0f;
        int s32 = 0;
        for (int i = 0; i < block / 16; i++) { /* 16 values */
            int32x4_t c[4];
            for (int r = 0; r < 4; r++) c[r] = vcvtnq_s32_f32(vmulq_n_f32(load4(x, x_bf16, at + 16 * i + 4 * r), inv));
            const int16x8_t h0 = vcombine_s16(vqmovn_s32(c[0]), vqmovn_s32(c[1]));
            const int16x8_t h1 = vcombine_s16(vqmovn_s32(c[2]), vqmovn_s32(c[3]));
            vst1q_s8(q + at + 16 * i, vcombine_s8(vqmovn_s16(h0), vqmovn_s16(h1)));
            const int s = vaddvq_s32(vaddq_s32(vaddq_s32(c[0], c[1]), vaddq_s32(c[2], c[3])));
            if (offset != 0) {
                s32 += s;
                continue;
            }
            bsums[b * (block / 16) + i] = (int16_t)s;
            if (i & 1) bsum32[b * (block / 32) + i / 2] = (int16_t)(bsums[b * (block / 16) + i - 1] + s);
        }
        if (offset != 0) xo[b] = -offset * s32;
    }
}

/* ---- 8 codes of each of a quarter's 4 rows against 8 values of each row of x ---- */

/* x's 4 int8 values at p in every lane. */
INLINE int8x16_t dup4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return vreinterpretq_s8_s32(vdupq_n_s32(v));
}

#if TR_LEVEL >= TR_DOTPROD
typedef int32x4_t Sum4; /* a row of x's sums, one lane per row of W */

INLINE Sum4 sum4_zero(void) { return vdupq_n_s32(0); }

/* s + w0 . x0 + w1 . x1 per lane (4 products each). */
INLINE Sum4 dot8(Sum4 s, int8x16_t w0, int8x16_t x0, int8x16_t w1, int8x16_t x1) {
    return vdotq_s32(vdotq_s32(s, w0, x0), w1, x1);
}

INLINE int32x4_t sum4_total(Sum4 s) { return s; }
#else
/* A row of x's sums as pairs: lo's lanes rows 0, 0, 1, 1 of W, hi's rows 2, 2, 3, 3 (vpadalq_s16
 * adds neighbouring int16 products into one int32 lane); one vpaddq_s32 makes them a lane per row. */
typedef struct {
    int32x4_t lo, hi;
} Sum4;

INLINE Sum4 sum4_zero(void) { return (Sum4){vdupq_n_s32(0), vdupq_n_s32(0)}; }

/* Each int16 lane w0 x0 + w1 x1: at most 2 * 128 * 127 in magnitude, within int16. */
INLINE Sum4 dot8(Sum4 s, int8x16_t w0, int8x16_t x0, int8x16_t w1, int8x16_t x1) {
    const int16x8_t lo = vmlal_s8(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)), vget_low_s8(w1), vget_low_s8(x1));
    const int16x8_t hi = vmlal_high_s8(vmull_high_s8(w0, x0), w1, x1);
    return (Sum4){vpadalq_s16(s.lo, lo), vpadalq_s16(s.hi, hi)};
}

INLINE int32x4_t sum4_total(Sum4 s) { return vpaddq_s32(s.lo, s.hi); }
#endif

/* One quarter's sums against rows 0..mt-1 of x (mt a constant): at TR_I8MM rows 2p, 2p + 1 as
 * smmla's 2x2 tiles (`two[p][0]`: x rows 2p, 2p+1 by W rows 0, 1; `two[p][1]`: by W rows 2, 3),
 * the rest alone. */
typedef struct {
    Sum4 one[TILE];
#if TR_LEVEL == TR_I8MM
    int32x4_t two[TILE / 2][2];
#endif
} Sums;

/* The rows of x that go by pairs. */
INLINE int paired(const int mt) { return TR_LEVEL == TR_I8MM ? mt & ~1 : 0; }

INLINE void sums_zero(Sums *s, const int mt) {
#if TR_LEVEL == TR_I8MM
    for (int p = 0; p < paired(mt) / 2; p++) s->two[p][0] = s->two[p][1] = vdupq_n_s32(0);
#endif
    for (int i = paired(mt); i < mt; i++) s->one[i] = sum4_zero();
}

/* s += the quarter's codes (w0: values k..k+3 of each of its rows, w1: values k+4..k+7) times
 * values k..k+7 of each row of x (`xk`: row 0's, the rows `K` apart). */
INLINE void sums_add(Sums *s, const int mt, uint8x16_t w0, uint8x16_t w1, const int8_t *xk, int64_t K) {
#if TR_LEVEL == TR_I8MM
    if (mt >= 2) { /* W rows 0, 1 and rows 2, 3, each row's 8 codes in a row of the 2x8 */
        const uint32x4_t a = vreinterpretq_u32_u8(w0), b = vreinterpretq_u32_u8(w1);
        const int8x16_t w01 = vreinterpretq_s8_u32(vzip1q_u32(a, b)), w23 = vreinterpretq_s8_u32(vzip2q_u32(a, b));
        for (int p = 0; p < paired(mt) / 2; p++) {
            const int8x16_t xx = vcombine_s8(vld1_s8(xk + 2 * p * K), vld1_s8(xk + (2 * p + 1) * K));
            s->two[p][0] = vmmlaq_s32(s->two[p][0], xx, w01);
            s->two[p][1] = vmmlaq_s32(s->two[p][1], xx, w23);
        }
    }
#endif
    for (int i = paired(mt); i < mt; i++)
        s->one[i] = dot8(s->one[i], vreinterpretq_s8_u8(w0), dup4(xk + i * K), vreinterpretq_s8_u8(w1),
                         dup4(xk + i * K + 4));
}

/* Row i of x's sums, a lane per row of W. */
INLINE int32x4_t sums_row(const Sums *s, const int mt, int i) {
#if TR_LEVEL == TR_I8MM
    if (i < paired(mt)) {
        const int64x2_t a = vreinterpretq_s64_s32(s->two[i / 2][0]), b = vreinterpretq_s64_s32(s->two[i / 2][1]);
        return vreinterpretq_s32_s64(i & 1 ? vzip2q_s64(a, b) : vzip1q_s64(a, b));
    }
#endif
    (void)mt;
    return sum4_total(s->one[i]);
}

/* ---- the group kernels: each block a quarter (4 rows of W) at a time ---- */

INLINE uint8x16_t quarter(const uint8_t *p, int q) { return vld1q_u8(p + 16 * q); }

/* 4 fp16 scales (quarter q of 16 at p) as floats. */
INLINE float32x4_t scales4(const uint8_t *p, int q) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(p + 8 * q))));
}

/* 4 unsigned bytes at p as int32 lanes. */
INLINE int32x4_t u8x4(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8(v)))));
}

/* Bit 4 of vector v's codes in quarter q (`masks`: a group's masks of 64 high bits, bit 4L + k
 * lane L's byte k), as 16 in each byte whose bit is set. */
INLINE uint8x16_t high16(const uint8_t *masks, int v, int q) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t m = vcombine_u8(vdup_n_u8(masks[8 * v + 2 * q]), vdup_n_u8(masks[8 * v + 2 * q + 1]));
    return vandq_u8(vtstq_u8(m, vld1q_u8(bit)), vdupq_n_u8(16));
}

/* acc[4] (memory: a row's quarter of out) = fma(a, b, acc) */
INLINE void fma_into(float *acc, float32x4_t a, float32x4_t b) { vst1q_f32(acc, vfmaq_f32(vld1q_f32(acc), a, b)); }

/* Q4_K and Q5_K (its high bits added to the codes). */
INLINE void group_q45k(const int type, const uint8_t *g, const QuantX *x, int64_t K, int64_t m0, const int mt,
                       int ahead, float *out) {
    (void)ahead;
    const int64_t nb = K / 256;
    const int gb = group_bytes(type), five = type == TYPE_Q5_K;
    const uint8x16_t low4 = vdupq_n_u8(15);
    float acc[TILE * GROUP] = {0};
    for (int64_t b = 0; b < nb; b++, g += gb) {
        const int8_t *xb = x->q + m0 * K + b * 256;
        for (int q = 0; q < 4; q++) {
            int32x4_t isum[TILE];
            for (int i = 0; i < mt; i++) isum[i] = vdupq_n_s32(0);
            for (int j = 0; j < 8; j++) { /* sub-block j: 32 values, chunks 4j..4j+3 */
                Sums s;
                sums_zero(&s, mt);
#pragma GCC unroll 4
                for (int c = 4 * j; c < 4 * j + 4; c++) {
                    const uint8x16_t raw = quarter(g + 64 * c, q);
                    uint8x16_t lo = vandq_u8(raw, low4), hi = vshrq_n_u8(raw, 4);
                    if (five) {
                        lo = vorrq_u8(lo, high16(g + 2368, 2 * c, q));
                        hi = vorrq_u8(hi, high16(g + 2368, 2 * c + 1, q));
                    }
                    sums_add(&s, mt, lo, hi, xb + 8 * c, K);
                }
                const int32x4_t sc = u8x4(g + 2048 + 16 * j + 4 * q);
                for (int i = 0; i < mt; i++) isum[i] = vmlaq_s32(isum[i], sums_row(&s, mt, i), sc);
            }
            const float32x4_t d = scales4(g + 2304, q), dmin = scales4(g + 2336, q);
            for (int i = 0; i < mt; i++) {
                const int16_t *bs32 = x->bsum32 + (m0 + i) * (K / 32) + b * 8;
                int32x4_t msum = vdupq_n_s32(0);
                for (int p = 0; p < 4; p++) { /* mins of sub-blocks 2p, 2p+1 (a pair a row) times x's sums of 32 */
                    const int16x8_t mn = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(g + 2176 + 32 * p + 8 * q)));
                    int32_t pair;
                    memcpy(&pair, bs32 + 2 * p, 4);
                    const int16x8_t xs = vreinterpretq_s16_s32(vdupq_n_s32(pair));
                    msum = vaddq_s32(msum,
                                     vpaddq_s32(vmull_s16(vget_low_s16(mn), vget_low_s16(xs)), vmull_high_s16(mn, xs)));
                }
                const float dx = x->d[(m0 + i) * nb + b];
                float *a = acc + GROUP * i + 4 * q;
                fma_into(a, vcvtq_f32_s32(isum[i]), vmulq_n_f32(d, dx));
                vst1q_f32(a, vfmsq_f32(vld1q_f32(a), vcvtq_f32_s32(msum), vmulq_n_f32(dmin, dx)));
            }
        }
    }
    memcpy(out, acc, sizeof(float) * GROUP * (size_t)mt);
}

/* Q6_K: the codes' offset of 32 taken off once a block, as scales times x's sums of 16. */
INLINE void group_q6k(const uint8_t *g, const QuantX *x, int64_t K, int64_t m0, const int mt, int ahead, float *out) {
    (void)ahead;
    const int64_t nb = K / 256;
    const uint8x16_t low4 = vdupq_n_u8(15), bits45 = vdupq_n_u8(0x30);
    float acc[TILE * GROUP] = {0};
    for (int64_t b = 0; b < nb; b++, g += 3360) {
        const int8_t *xb = x->q + m0 * K + b * 256;
        for (int q = 0; q < 4; q++) {
            int32x4_t isum[TILE], osum[TILE];
            for (int i = 0; i < mt; i++) isum[i] = osum[i] = vdupq_n_s32(0);
            for (int p = 0; p < 8; p++) { /* groups 2p, 2p+1 of 16 values: a row's two scales side by side */
                const int16x8_t pair = vmovl_s8(vld1_s8((const int8_t *)g + 3072 + 32 * p + 8 * q));
                const int32x4_t sc[2] = {vmovl_s16(vget_low_s16(vuzp1q_s16(pair, pair))),
                                         vmovl_s16(vget_low_s16(vuzp2q_s16(pair, pair)))};
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const int v = 2 * p + h; /* values 16v..16v+15 of each row */
                    const uint8x16_t hb = quarter(g + 2048 + 64 * v, q);
                    const uint8x16_t r0 = quarter(g + 64 * (2 * v), q), r1 = quarter(g + 64 * (2 * v + 1), q);
                    const uint8x16_t c0 = vorrq_u8(vandq_u8(r0, low4), vandq_u8(vshlq_n_u8(hb, 4), bits45));
                    const uint8x16_t c1 = vorrq_u8(vshrq_n_u8(r0, 4), vandq_u8(vshlq_n_u8(hb, 2), bits45));
                    const uint8x16_t c2 = vorrq_u8(vandq_u8(r1, low4), vandq_u8(hb, bits45));
                    const uint8x16_t c3 = vorrq_u8(vshrq_n_u8(r1, 4), vandq_u8(vshrq_n_u8(hb, 2), bits45));
                    Sums s;
                    sums_zero(&s, mt);
                    sums_add(&s, mt, c0, c1, xb + 16 * v, K);
                    sums_add(&s, mt, c2, c3, xb + 16 * v + 8, K);
                    for (int i = 0; i < mt; i++) isum[i] = vmlaq_s32(isum[i], sums_row(&s, mt, i), sc[h]);
                }
                for (int i = 0; i < mt; i++) {
                    const int16_t *bs = x->bsums + (m0 + i) * (K / 16) + b * 16 + 2 * p;
                    osum[i] = vmlaq_n_s32(vmlaq_n_s32(osum[i], sc[0], bs[0]), sc[1], bs[1]);
                }
            }
            const float32x4_t d = scales4(g + 3328, q);
            for (int i = 0; i < mt; i++) {
                const int32x4_t total = vsubq_s32(isum[i], vshlq_n_s32(osum[i], 5));
                fma_into(acc + GROUP * i + 4 * q, vcvtq_f32_s32(total), vmulq_n_f32(d, x->d[(m0 + i) * nb + b]));
            }
        }
    }
    memcpy(out, acc, sizeof(float) * GROUP * (size_t)mt);
}

/* The 32-blocks. Q8_0: its codes + 128 taken back to int8, sums from 0; Q4_0 and Q5_0: from minus
 * the offset times x's sum of 32 (`xo`); Q4_1 and Q5_1: from 0, m times x's scale times that sum
 * added in float. */
INLINE void group_q32(const int type, const uint8_t *g, const QuantX *x, int64_t K, int64_t m0, const int mt, int ahead,
                      float *out) {
    (void)ahead;
    const int64_t nb = K / 32;
    const int gb = group_bytes(type), at_d = q32_at_d(type);
    const uint8x16_t low4 = vdupq_n_u8(15), sign = vdupq_n_u8(0x80);
    float acc[TILE * GROUP] = {0};
    for (int64_t b = 0; b < nb; b++, g += gb) {
        const int8_t *xb = x->q + m0 * K + b * 32;
        for (int q = 0; q < 4; q++) {
            Sums s;
            sums_zero(&s, mt);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) { /* values 8c..8c+7: Q8_0's vectors 2c, 2c+1, the others' chunk c */
                uint8x16_t w0, w1;
                if (type == TYPE_Q8_0) {
                    w0 = veorq_u8(quarter(g + 64 * (2 * c), q), sign);
                    w1 = veorq_u8(quarter(g + 64 * (2 * c + 1), q), sign);
                } else {
                    const uint8x16_t raw = quarter(g + 64 * c, q);
                    w0 = vandq_u8(raw, low4), w1 = vshrq_n_u8(raw, 4);
                    if (has_high(type))
                        w0 = vorrq_u8(w0, high16(g + 256, 2 * c, q)), w1 = vorrq_u8(w1, high16(g + 256, 2 * c + 1, q));
                }
                sums_add(&s, mt, w0, w1, xb + 8 * c, K);
            }
            const float32x4_t d = scales4(g + at_d, q);
            for (int i = 0; i < mt; i++) {
                int32x4_t total = sums_row(&s, mt, i);
                if (type != TYPE_Q8_0 && !has_min(type))
                    total = vaddq_s32(total, vdupq_n_s32(x->xo[(m0 + i) * nb + b]));
                const float dx = x->d[(m0 + i) * nb + b];
                float *a = acc + GROUP * i + 4 * q;
                fma_into(a, vcvtq_f32_s32(total), vmulq_n_f32(d, dx));
                if (has_min(type))
                    fma_into(a, scales4(g + at_d + 32, q), vdupq_n_f32(dx * x->bsum32[(m0 + i) * nb + b]));
            }
        }
    }
    memcpy(out, acc, sizeof(float) * GROUP * (size_t)mt);
}

#include "group_kernel.h" /* the dispatch over type and rows, as every vector level has it */

#endif
