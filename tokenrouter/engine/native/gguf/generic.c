/* The group kernels in plain C (TR_LEVEL 0): any CPU, the compiler's own vectors.
 *
 * The same integer sums as the vector levels, lane by lane over a group's 16 rows, each block's
 * float scaling as a multiply and an add (the vector levels fuse them: the last bits differ
 * between levels, never between calls). Written so that the compiler can vectorize the 16 lanes.
 */
#include "blocks.h"

#if TR_LEVEL == TR_PLAIN

TR_INTERNAL void quantize_row_level(const void *x, int x_bf16, int64_t K, int block, int offset, int8_t *q, float *d,
                                    int16_t *bsums, int16_t *bsum32, int32_t *xo) {
    quantize_row(x, x_bf16, K, block, offset, q, d, bsums, bsum32, xo);
}

/* The 64 bytes of a group's mask of high bits (mask v: bit e for byte e) as 16 or 0 a byte: a
 * table of 8 bytes per mask byte, so the lane loops below need no shift per byte. */
static const uint64_t *high_table(void) {
    static uint64_t table[256];
    static int ready;
    if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
        for (int b = 0; b < 256; b++) {
            uint64_t t = 0;
            for (int i = 0; i < 8; i++) t |= (uint64_t)((b >> i & 1) << 4) << (8 * i);
            table[b] = t;
        }
        __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
    }
    return table;
}

static inline void highs(const uint8_t *mask, uint8_t out[64]) {
    const uint64_t *table = high_table();
    for (int i = 0; i < 8; i++) memcpy(out + 8 * i, &table[mask[i]], 8);
}

/* 16 fp16 scales as floats, branch-free (the compiler vectorizes it): the magnitude's bits moved
 * into float32's places and scaled by 2^112 (exact for zeros, subnormals and normals), infinities
 * and NaNs given float32's top exponent, then the sign. What fp16_to_f32 computes. */
static void fp16s(const uint8_t *p, float out[GROUP]) {
    for (int L = 0; L < GROUP; L++) {
        const uint32_t h = read_u16(p + 2 * L);
        uint32_t u = (h & 0x7fffu) << 13;
        float f;
        memcpy(&f, &u, 4);
        f *= 0x1p112f;
        memcpy(&u, &f, 4);
        u |= ((h & 0x7c00u) == 0x7c00u ? 0x7f800000u : 0u) | (h & 0x8000u) << 16;
        memcpy(&out[L], &u, 4);
    }
}

#define INLINE static inline __attribute__((always_inline))

/* s[L] += lane L's 4 codes of a chunk's low nibbles times x[0..3] and of its high nibbles times
 * x[4..7], plus their high bits (`hlo`, `hhi`) where `five`: the loop the compiler vectorizes
 * over the 16 lanes. */
INLINE void lanes8(const int five, const uint8_t *c, const uint8_t *hlo, const uint8_t *hhi, const int8_t *xq,
                   int32_t s[GROUP]) {
    const int x0 = xq[0], x1 = xq[1], x2 = xq[2], x3 = xq[3], x4 = xq[4], x5 = xq[5], x6 = xq[6], x7 = xq[7];
    for (int L = 0; L < GROUP; L++) {
        const uint8_t *a = c + 4 * L;
        int32_t t = (a[0] & 15) * x0 + (a[1] & 15) * x1 + (a[2] & 15) * x2 + (a[3] & 15) * x3 + (a[0] >> 4) * x4 +
                    (a[1] >> 4) * x5 + (a[2] >> 4) * x6 + (a[3] >> 4) * x7;
        if (five) {
            const uint8_t *ha = hlo + 4 * L, *hb = hhi + 4 * L;
            t += ha[0] * x0 + ha[1] * x1 + ha[2] * x2 + ha[3] * x3 + hb[0] * x4 + hb[1] * x5 + hb[2] * x6 + hb[3] * x7;
        }
        s[L] += t;
    }
}

INLINE void group_q45k(const int type, const uint8_t *g, const QuantX *x, int64_t K, int64_t m0, int mt, float *out) {
    const int64_t nb = K / 256;
    const int gb = group_bytes(type), five = type == TYPE_Q5_K;
    float acc[TILE][GROUP] = {{0}};
    uint8_t hlo[64], hhi[64];
    for (int64_t b = 0; b < nb; b++, g += gb) {
        float d[GROUP], dmin[GROUP];
        fp16s(g + 2304, d), fp16s(g + 2336, dmin);
        int32_t isum[TILE][GROUP] = {{0}};
        for (int j = 0; j < 8; j++) { /* sub-block j: chunks 4j..4j+3 */
            int32_t s[TILE][GROUP] = {{0}};
            for (int c = 4 * j; c < 4 * j + 4; c++) {
                if (five) highs(g + 2368 + 8 * (2 * c), hlo), highs(g + 2368 + 8 * (2 * c + 1), hhi);
                for (int i = 0; i < mt; i++) lanes8(five, g + 64 * c, hlo, hhi, x->q + (m0 + i) * K + b * 256 + 8 * c, s[i]);
            }
            for (int i = 0; i < mt; i++)
                for (int L = 0; L < GROUP; L++) isum[i][L] += s[i][L] * g[2048 + 16 * j + L];
        }
        for (int i = 0; i < mt; i++) {
            const int16_t *bs32 = x->bsum32 + (m0 + i) * (K / 32) + b * 8;
            int32_t msum[GROUP] = {0};
            for (int p = 0; p < 4; p++) /* mins of sub-blocks 2p, 2p+1 times x's sums of 32 */
                for (int L = 0; L < GROUP; L++)
                    msum[L] += g[2176 + 32 * p + 2 * L] * bs32[2 * p] + g[2176 + 32 * p + 2 * L + 1] * bs32[2 * p + 1];
            const float dx = x->d[(m0 + i) * nb + b];
            for (int L = 0; L < GROUP; L++) {
                acc[i][L] += (float)isum[i][L] * (d[L] * dx);
                acc[i][L] -= (float)msum[L] * (dmin[L] * dx);
            }
        }
    }
    for (int i = 0; i < mt; i++) memcpy(out + GROUP * i, acc[i], sizeof acc[i]);
}

/* Lane L's 6-bit code `e` (0-3: values k, 4 + k, 8 + k, 12 + k of 16) at byte k of chunks a, b
 * with their high pairs h. */
#define Q6(a, b, h, e)                                                                                                 \
    ((e) == 0   ? ((a) & 15) | ((h) << 4 & 0x30)                                                                       \
     : (e) == 1 ? ((a) >> 4) | ((h) << 2 & 0x30)                                                                       \
     : (e) == 2 ? ((b) & 15) | ((h) & 0x30)                                                                            \
                : ((b) >> 4) | ((h) >> 2 & 0x30))

/* s[L] += lane L's 16 six-bit codes (chunks r0, r1 and their high pairs hb) times x[0..15]. */
INLINE void lanes_q6(const uint8_t *r0, const uint8_t *r1, const uint8_t *hb, const int8_t *xq, int32_t s[GROUP]) {
    int x[16];
    for (int i = 0; i < 16; i++) x[i] = xq[i];
    for (int L = 0; L < GROUP; L++) {
        const uint8_t *a = r0 + 4 * L, *b = r1 + 4 * L, *h = hb + 4 * L;
        int32_t t = 0;
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            t += Q6(a[k], b[k], h[k], 0) * x[k] + Q6(a[k], b[k], h[k], 1) * x[4 + k] +
                 Q6(a[k], b[k], h[k], 2) * x[8 + k] + Q6(a[k], b[k], h[k], 3) * x[12 + k];
        s[L] += t;
    }
}

INLINE void group_q6k(const uint8_t *g, const QuantX *x, int64_t K, int64_t m0, int mt, float *out) {
    const int64_t nb = K / 256;
    float acc[TILE][GROUP] = {{0}};
    for (int64_t b = 0; b < nb; b++, g += 3360) {
        float d[GROUP];
        fp16s(g + 3328, d);
        for (int i = 0; i < mt; i++) {
            const int8_t *xq = x->q + (m0 + i) * K + b * 256;
            const int16_t *bs = x->bsums + (m0 + i) * (K / 16) + b * 16;
            int32_t total[GROUP] = {0};
            for (int v = 0; v < 16; v++) { /* 16 values of each row: chunks 2v, 2v + 1 and high pairs v */
                int32_t s[GROUP] = {0};
                lanes_q6(g + 64 * (2 * v), g + 64 * (2 * v + 1), g + 2048 + 64 * v, xq + 16 * v, s);
                const int8_t *sc = (const int8_t *)(g + 3072 + 32 * (v / 2) + (v & 1));
                for (int L = 0; L < GROUP; L++) total[L] += (s[L] - 32 * bs[v]) * sc[2 * L];
            }
            const float dx = x->d[(m0 + i) * nb + b];
            for (int L = 0; L < GROUP; L++) acc[i][L] += (float)total[L] * (d[L] * dx);
        }
    }
    for (int i = 0; i < mt; i++) memcpy(out + GROUP * i, acc[i], sizeof acc[i]);
}

/* s[L] += lane L's 4 codes of vector `w` (unsigned) times x[0..3]. */
static inline void lanes4(const uint8_t *w, const int8_t *xq, int32_t s[GROUP]) {
    const int x0 = xq[0], x1 = xq[1], x2 = xq[2], x3 = xq[3];
    for (int L = 0; L < GROUP; L++) s[L] += w[4 * L] * x0 + w[4 * L + 1] * x1 + w[4 * L + 2] * x2 + w[4 * L + 3] * x3;
}

/* The 32-blocks: Q8_0's 8 vectors of codes + 128, or 4 chunks of nibbles (plus high bits). */
INLINE void group_q32(const int type, const uint8_t *g, const QuantX *x, int64_t K, int64_t m0, int mt, float *out) {
    const int64_t nb = K / 32;
    const int gb = group_bytes(type), at_d = q32_at_d(type);
    float acc[TILE][GROUP] = {{0}};
    uint8_t hlo[64], hhi[64];
    for (int64_t b = 0; b < nb; b++, g += gb) {
        float d[GROUP], m[GROUP];
        fp16s(g + at_d, d);
        if (has_min(type)) fp16s(g + at_d + 32, m);
        for (int i = 0; i < mt; i++) {
            const int8_t *xq = x->q + (m0 + i) * K + b * 32;
            int32_t s[GROUP];
            for (int L = 0; L < GROUP; L++) s[L] = has_min(type) ? 0 : x->xo[(m0 + i) * nb + b];
            if (type == TYPE_Q8_0) {
                for (int v = 0; v < 8; v++) lanes4(g + 64 * v, xq + 4 * v, s);
            } else {
                for (int c = 0; c < 4; c++) { /* chunk c: vectors 2c (low nibbles) and 2c + 1 */
                    if (has_high(type)) highs(g + 256 + 8 * (2 * c), hlo), highs(g + 256 + 8 * (2 * c + 1), hhi);
                    lanes8(has_high(type), g + 64 * c, hlo, hhi, xq + 8 * c, s);
                }
            }
            const float dx = x->d[(m0 + i) * nb + b];
            for (int L = 0; L < GROUP; L++) {
                acc[i][L] += (float)s[L] * (d[L] * dx);
                if (has_min(type)) acc[i][L] += m[L] * (dx * x->bsum32[(m0 + i) * nb + b]);
            }
        }
    }
    for (int i = 0; i < mt; i++) memcpy(out + GROUP * i, acc[i], sizeof acc[i]);
}

TR_INTERNAL void group_kernel(int type, const uint8_t *g, const QuantX *x, int64_t K, int64_t m0, int mt, float *out) {
    switch (type) { /* each type its own copy: the compiler drops what the type does not have */
    case TYPE_Q4_K: group_q45k(TYPE_Q4_K, g, x, K, m0, mt, out); break;
    case TYPE_Q5_K: group_q45k(TYPE_Q5_K, g, x, K, m0, mt, out); break;
    case TYPE_Q6_K: group_q6k(g, x, K, m0, mt, out); break;
    case TYPE_Q8_0: group_q32(TYPE_Q8_0, g, x, K, m0, mt, out); break;
    case TYPE_Q4_0: group_q32(TYPE_Q4_0, g, x, K, m0, mt, out); break;
    case TYPE_Q4_1: group_q32(TYPE_Q4_1, g, x, K, m0, mt, out); break;
    case TYPE_Q5_0: group_q32(TYPE_Q5_0, g, x, K, m0, mt, out); break;
    default: group_q32(TYPE_Q5_1, g, x, K, m0, mt, out); break;
    }
}

#endif
