/* The group kernels with AVX512 VNNI (TR_LEVEL 2): one vector holds 4 codes of each of a group's
 * 16 rows, and vpdpbusd multiplies them by 4 int8 values of a row of x and adds them up.
 */
#include "../blocks.h"

#if TR_LEVEL == TR_AVX512
#include <immintrin.h>

/* quantize_row with AVX512: the same float operations (max |x|, x * 127 / max rounded to nearest
 * even, saturated to int8), 16 values at a time. Scalar, it cost as much as the matmul it feeds for
 * a layer of few output rows. */
static __m512 load16(const void *x, int x_bf16, int64_t k) {
    if (!x_bf16) return _mm512_loadu_ps((const float *)x + k);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)x + k));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

TR_INTERNAL void quantize_row_level(const void *x, int x_bf16, int64_t K, int block, int offset, int8_t *q, float *d,
                                    int16_t *bsums, int16_t *bsum32, int32_t *xo) {
    const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < K / block; b++) {
        __m512 v[16], amax = _mm512_setzero_ps();
        const int n = block / 16;
        for (int i = 0; i < n; i++) {
            v[i] = load16(x, x_bf16, b * block + 16 * i);
            amax = _mm512_max_ps(amax, _mm512_and_ps(v[i], sign));
        }
        const float mx = _mm512_reduce_max_ps(amax);
        const __m512 inv = _mm512_set1_ps(mx > 0.0f ? 127.0f / mx : 0.0f);
        d[b] = mx / 127.0f;
        int s32 = 0;
        for (int i = 0; i < n; i++) {
            const __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(v[i], inv));
            _mm_storeu_si128((__m128i *)(q + b * block + 16 * i), _mm512_cvtsepi32_epi8(c));
            const int s = _mm512_reduce_add_epi32(c);
            if (offset != 0) {
                s32 += s;
                continue;
            }
            bsums[b * n + i] = (int16_t)s;
            if (i & 1) bsum32[b * (n / 2) + i / 2] = (int16_t)(bsums[b * n + i - 1] + s);
        }
        if (offset != 0) xo[b] = -offset * s32;
    }
}

/* TILE (4) rows of x a pass: with two sums each, 8 independent chains of vpdpbusd (4 cycles each). */
/* Bytes of W prefetched ahead (two Q4_K groups' blocks): without, a 1-row step read ~27 GB/s of W;
 * with, ~48 (what the plain stream of the old per-row kernels read). */
enum { AHEAD = 4736 };

#define INLINE static inline __attribute__((always_inline))
#define BCAST4(p) _mm512_set1_epi32(*(const int32_t *)(p)) /* 4 int8 of x (or 2 int16) to every lane */

/* The next blocks of W into the cache while this one computes: the hardware prefetcher alone fell
 * behind. Only on the first pass over a group (`ahead`): later passes find it in cache. A 32-block
 * group's 5-9 lines go to L1; a K-quant group's 37-53 to L2 (`prefetch_l2`), Q4_K's and Q5_K's an
 * eighth per sub-block. All at once to L1 they stalled the core on its misses in flight: a 1-row
 * step read 24 GB/s of Q5_K's W (35 this way), 31 of Q4_K's (36), and 20-44 of Q6_K's, by build. */
INLINE void prefetch_ahead(const uint8_t *g, int gb, int ahead) {
    if (ahead)
        for (int l = 0; l < gb; l += 64) _mm_prefetch((const char *)g + AHEAD + l, _MM_HINT_T0);
}

/* Part `part` of `parts` of the lines. */
INLINE void prefetch_l2(const uint8_t *g, int gb, int ahead, int part, int parts) {
    const int lines = (gb + 63) / 64;
    if (ahead)
        for (int l = lines * part / parts; l < lines * (part + 1) / parts; l++)
            _mm_prefetch((const char *)g + AHEAD + 64 * l, _MM_HINT_T1);
}

INLINE __m512 scales16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

/* Bit 4 of vector v's codes (`masks`: the group's masks of high bits) added to its low nibbles. */
INLINE __m512i add_high(__m512i nib, const uint8_t *masks, int v) {
    __mmask64 high;
    memcpy(&high, masks + 8 * v, 8);
    return _mm512_mask_add_epi8(nib, high, nib, _mm512_set1_epi8(16));
}

/* 16 rows of W (group `g` onwards, `nb` blocks) against rows m0..m0+mt-1 of x: out[i][L].
 * Q4_K and Q5_K (its high bits added to the codes). */
INLINE void group_q45k(const int type, const uint8_t *g, const QuantX *x, int64_t K, int64_t m0, const int mt,
                       int ahead, float *out) {
    const int64_t nb = K / 256;
    const int gb = group_bytes(type);
    const __m512i low4 = _mm512_set1_epi8(15);
    __m512 acc[TILE];
    for (int i = 0; i < mt; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, g += gb) {
        __m512i isum[TILE], msum[TILE];
        for (int i = 0; i < mt; i++) isum[i] = msum[i] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) { /* sub-block j: 32 values, chunks 4j..4j+3 */
            prefetch_l2(g, gb, ahead, j, 8);
            __m512i s0[TILE], s1[TILE];
            for (int i = 0; i < mt; i++) s0[i] = s1[i] = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int c = 4 * j; c < 4 * j + 4; c++) {
                const __m512i raw = _mm512_loadu_si512(g + 64 * c);
                __m512i lo = _mm512_and_si512(raw, low4), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
                if (type == TYPE_Q5_K) lo = add_high(lo, g + 2368, 2 * c), hi = add_high(hi, g + 2368, 2 * c + 1);
#pragma GCC unroll 4
                for (int i = 0; i < mt; i++) {
                    const int8_t *xq = x->q + (m0 + i) * K + b * 256 + 8 * c;
                    s0[i] = _mm512_dpbusd_epi32(s0[i], lo, BCAST4(xq));
                    s1[i] = _mm512_dpbusd_epi32(s1[i], hi, BCAST4(xq + 4));
                }
            }
            const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(g + 2048 + 16 * j)));
            for (int i = 0; i < mt; i++)
                isum[i] = _mm512_add_epi32(isum[i], _mm512_mullo_epi32(_mm512_add_epi32(s0[i], s1[i]), sc));
        }
        for (int p = 0; p < 4; p++) { /* mins of sub-blocks 2p, 2p+1 times x's sums of 32 */
            const __m512i mn = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(g + 2176 + 32 * p)));
            for (int i = 0; i < mt; i++)
                msum[i] = _mm512_dpwssd_epi32(msum[i], mn, BCAST4(x->bsum32 + (m0 + i) * (K / 32) + b * 8 + 2 * p));
        }
        const __m512 d = scales16(g + 2304), dmin = scales16(g + 2336);
        for (int i = 0; i < mt; i++) {
            const __m512 dx = _mm512_set1_ps(x->d[(m0 + i) * nb + b]);
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[i]), _mm512_mul_ps(d, dx), acc[i]);
            acc[i] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum[i]), _mm512_mul_ps(dmin, dx), acc[i]);
        }
    }
    for (int i = 0; i < mt; i++) _mm512_storeu_ps(out + GROUP * i, acc[i]);
}

INLINE void group_q6k(const uint8_t *g, const QuantX *x, int64_t K, int64_t m0, const int mt, int ahead, float *out) {
    const int64_t nb = K / 256;
    const __m512i low4 = _mm512_set1_epi8(15), bits45 = _mm512_set1_epi8(0x30);
    __m512 acc[TILE];
    for (int i = 0; i < mt; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, g += 3360) {
        prefetch_l2(g, 3360, ahead, 0, 1);
        __m512i isum[TILE], osum[TILE];
        for (int i = 0; i < mt; i++) isum[i] = osum[i] = _mm512_setzero_si512();
        for (int p = 0; p < 8; p++) { /* groups 2p, 2p+1 of 16 values: chunks 4p..4p+3 */
            const __m512i pair = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(g + 3072 + 32 * p)));
            const __m512i sc[2] = {_mm512_srai_epi32(_mm512_slli_epi32(pair, 16), 16), _mm512_srai_epi32(pair, 16)};
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const int v = 2 * p + h;
                const __m512i hb = _mm512_loadu_si512(g + 2048 + 64 * v);
                const __m512i r0 = _mm512_loadu_si512(g + 64 * (2 * v)), r1 = _mm512_loadu_si512(g + 64 * (2 * v + 1));
                const __m512i c0 =
                    _mm512_or_si512(_mm512_and_si512(r0, low4), _mm512_and_si512(_mm512_slli_epi16(hb, 4), bits45));
                const __m512i c1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(r0, 4), low4),
                                                   _mm512_and_si512(_mm512_slli_epi16(hb, 2), bits45));
                const __m512i c2 = _mm512_or_si512(_mm512_and_si512(r1, low4), _mm512_and_si512(hb, bits45));
                const __m512i c3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(r1, 4), low4),
                                                   _mm512_and_si512(_mm512_srli_epi16(hb, 2), bits45));
#pragma GCC unroll 4
                for (int i = 0; i < mt; i++) {
                    const int8_t *xq = x->q + (m0 + i) * K + b * 256 + 16 * v;
                    const __m512i s0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), c0, BCAST4(xq)),
                                                           c1, BCAST4(xq + 4));
                    const __m512i s1 = _mm512_dpbusd_epi32(
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), c2, BCAST4(xq + 8)), c3, BCAST4(xq + 12));
                    isum[i] = _mm512_add_epi32(isum[i], _mm512_mullo_epi32(_mm512_add_epi32(s0, s1), sc[h]));
                }
            }
            for (int i = 0; i < mt; i++) /* the codes' offset of 32: scales times x's sums of 16 */
                osum[i] = _mm512_dpwssd_epi32(osum[i], pair, BCAST4(x->bsums + (m0 + i) * (K / 16) + b * 16 + 2 * p));
        }
        const __m512 d = scales16(g + 3328);
        for (int i = 0; i < mt; i++) {
            const __m512i total = _mm512_sub_epi32(isum[i], _mm512_slli_epi32(osum[i], 5));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total),
                                     _mm512_mul_ps(d, _mm512_set1_ps(x->d[(m0 + i) * nb + b])), acc[i]);
        }
    }
    for (int i = 0; i < mt; i++) _mm512_storeu_ps(out + GROUP * i, acc[i]);
}

/* The 32-blocks. Q8_0, Q4_0 and Q5_0: each sum starts from minus the codes' offset times x's sum
 * of 32 (`xo`); Q4_1 and Q5_1: m times x's scale times that sum (`bsum32`) is added. */
INLINE __m512i q32_vector(const int type, const uint8_t *g, int v) {
    if (type == TYPE_Q8_0) return _mm512_loadu_si512(g + 64 * v);
    const __m512i raw = _mm512_loadu_si512(g + 64 * (v / 2));
    const __m512i nib = _mm512_and_si512(v & 1 ? _mm512_srli_epi16(raw, 4) : raw, _mm512_set1_epi8(15));
    return has_high(type) ? add_high(nib, g + 256, v) : nib;
}

INLINE void group_q32(const int type, const uint8_t *g, const QuantX *x, int64_t K, int64_t m0, const int mt, int ahead,
                      float *out) {
    const int64_t nb = K / 32;
    const int gb = group_bytes(type), at_d = q32_at_d(type);
    __m512 acc[TILE];
    for (int i = 0; i < mt; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, g += gb) {
        prefetch_ahead(g, gb, ahead);
        __m512i s0[TILE], s1[TILE];
        for (int i = 0; i < mt; i++)
            s0[i] = has_min(type) ? _mm512_setzero_si512() : _mm512_set1_epi32(x->xo[(m0 + i) * nb + b]),
            s1[i] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int v = 0; v < 8; v += 2) {
            const __m512i u0 = q32_vector(type, g, v), u1 = q32_vector(type, g, v + 1);
#pragma GCC unroll 4
            for (int i = 0; i < mt; i++) {
                const int8_t *xq = x->q + (m0 + i) * K + b * 32 + 4 * v;
                s0[i] = _mm512_dpbusd_epi32(s0[i], u0, BCAST4(xq));
                s1[i] = _mm512_dpbusd_epi32(s1[i], u1, BCAST4(xq + 4));
            }
        }
        const __m512 d = scales16(g + at_d);
        for (int i = 0; i < mt; i++) {
            const float dx = x->d[(m0 + i) * nb + b];
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0[i], s1[i])),
                                     _mm512_mul_ps(d, _mm512_set1_ps(dx)), acc[i]);
            if (has_min(type))
                acc[i] = _mm512_fmadd_ps(scales16(g + at_d + 32), _mm512_set1_ps(dx * x->bsum32[(m0 + i) * nb + b]),
                                         acc[i]);
        }
    }
    for (int i = 0; i < mt; i++) _mm512_storeu_ps(out + GROUP * i, acc[i]);
}

#include "group_kernel.h" /* the dispatch over type and rows, as every vector level has it */

#endif
