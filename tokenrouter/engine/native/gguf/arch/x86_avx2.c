/* The group kernels with AVX2 (TR_LEVEL 1): AMD Zen 1-3, Intel from Haswell, AVX512 CPUs without VNNI.
 *
 * A 256-bit vector is half of a group's 64 bytes: 4 codes of each of 8 rows. maddubs multiplies
 * them by 4 int8 values of a row of x (broadcast) into pairs of int16 sums, and madd adds each pair
 * into the row's int32 lane, scaled: llama.cpp's mul_sum_i8_pairs, with the scale folded into the
 * madd. Codes are unsigned, x signed; a pair of products stays within int16 for codes of up to 6
 * bits (63 * 127 * 2), so several maddubs add up in int16 before one madd: 8 for 4-bit codes, 4
 * for 5-bit, 2 for 6-bit. Q8_0's signed codes take llama.cpp's sign trick: |w| times x with w's
 * sign. The integer sums are the AVX512 path's exactly, and each block's float scaling the same
 * fused multiply-adds per lane: a row's result is the same bits at AVX2 and at AVX512.
 */
#include "../blocks.h"

#if TR_LEVEL == TR_AVX2
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))
#define BCAST4(p) _mm256_set1_epi32(*(const int32_t *)(p)) /* 4 int8 of x (or 2 int16) to every lane */

/* ---- x rounded to int8: AVX512's operations, 8 values at a time ---- */

static __m256 load8(const void *x, int x_bf16, int64_t k) {
    if (!x_bf16) return _mm256_loadu_ps((const float *)x + k);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)x + k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float max8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

static inline int sum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}

TR_INTERNAL void quantize_row_level(const void *x, int x_bf16, int64_t K, int block, int offset, int8_t *q, float *d,
                                    int16_t *bsums, int16_t *bsum32, int32_t *xo) {
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < K / block; b++) {
        __m256 v[32], amax = _mm256_setzero_ps();
        const int n = block / 8;
        for (int i = 0; i < n; i++) {
            v[i] = load8(x, x_bf16, b * block + 8 * i);
            amax = _mm256_max_ps(amax, _mm256_and_ps(v[i], sign));
        }
        const float mx = max8(amax);
        const __m256 inv = _mm256_set1_ps(mx > 0.0f ? 127.0f / mx : 0.0f);
        d[b] = mx / 127.0f;
        int s32 = 0;
        for (int i = 0; i < n / 2; i++) { /* 16 values: two vectors */
            const __m256i c0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2 * i], inv));
            const __m256i c1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2 * i + 1], inv));
            const __m128i h0 = _mm_packs_epi32(_mm256_castsi256_si128(c0), _mm256_extracti128_si256(c0, 1));
            const __m128i h1 = _mm_packs_epi32(_mm256_castsi256_si128(c1), _mm256_extracti128_si256(c1, 1));
            _mm_storeu_si128((__m128i *)(q + b * block + 16 * i), _mm_packs_epi16(h0, h1));
            const int s = sum8(_mm256_add_epi32(c0, c1));
            if (offset != 0) {
                s32 += s;
                continue;
            }
            bsums[b * (n / 2) + i] = (int16_t)s;
            if (i & 1) bsum32[b * (n / 4) + i / 2] = (int16_t)(bsums[b * (n / 2) + i - 1] + s);
        }
        if (offset != 0) xo[b] = -offset * s32;
    }
}

/* ---- the group kernels: each block's two halves (rows 0-7, rows 8-15) in turn ---- */

/* Bytes of W prefetched ahead, as the AVX512 path does: the next blocks while this one computes. */
enum { AHEAD = 4736 };

INLINE void prefetch_ahead(const uint8_t *g, int gb, int ahead) {
    if (ahead)
        for (int l = 0; l < gb; l += 64) _mm_prefetch((const char *)g + AHEAD + l, _MM_HINT_T0);
}

/* Part `part` of `parts` of the lines, to L2: a K-quant group's 37-53 lines spread over its
 * sub-blocks, as the AVX512 path found best. */
INLINE void prefetch_l2(const uint8_t *g, int gb, int ahead, int part, int parts) {
    const int lines = (gb + 63) / 64;
    if (ahead)
        for (int l = lines * part / parts; l < lines * (part + 1) / parts; l++)
            _mm_prefetch((const char *)g + AHEAD + 64 * l, _MM_HINT_T1);
}

/* A row's 8 float sums of a half, kept in memory between blocks: the registers go to the integer sums. */
INLINE void fma_into(float *acc, __m256 a, __m256 b) {
    _mm256_storeu_ps(acc, _mm256_fmadd_ps(a, b, _mm256_loadu_ps(acc)));
}

INLINE void fnma_into(float *acc, __m256 a, __m256 b) {
    _mm256_storeu_ps(acc, _mm256_fnmadd_ps(a, b, _mm256_loadu_ps(acc)));
}

INLINE __m256i half(const uint8_t *p, int h) { return _mm256_loadu_si256((const __m256i *)(p + 32 * h)); }

/* 8 fp16 scales of half h (16 at p) as floats. */
INLINE __m256 scales8(const uint8_t *p, int h) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * h)));
}

/* Bit 4 of vector v's codes in half h (`masks`: a group's masks of 64 high bits; bit 4L + k is
 * lane L's byte k), as 16 in each byte whose bit is set. */
INLINE __m256i high16(const uint8_t *masks, int v, int h) {
    int32_t bits;
    memcpy(&bits, masks + 8 * v + 4 * h, 4);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32(bits), _mm256_set_epi64x(0x0303030303030303LL,
                                                                               0x0202020202020202LL,
                                                                               0x0101010101010101LL, 0));
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL)); /* every bit but byte e's bit e % 8 */
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(16));
}

/* Keeps v in a register as it is at this point: gcc otherwise gathers a sub-block's 32 maddubs
 * into one tree of adds, spilling them all to the stack (the sums are the same either way). */
#define PIN(v) __asm__("" : "+x"(v))

/* 8 bytes of scales (one per row) as int16 pairs (s, s) in each 32-bit lane: madd's scaling. */
INLINE __m256i pairs_u8(const uint8_t *p) {
    const __m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
}

INLINE __m256i maddubs(__m256i codes, const int8_t *xq) { return _mm256_maddubs_epi16(codes, BCAST4(xq)); }

/* Q4_K and Q5_K (its high bits added to the codes), both halves of a chunk at once: each
 * broadcast of x feeds two maddubs (a step of many rows reads x from L2, not L1). */
INLINE void group_q45k(const int type, const uint8_t *g, const QuantX *x, int64_t K, int64_t m0, const int mt,
                       int ahead, float *out) {
    const int64_t nb = K / 256;
    const int gb = group_bytes(type), five = type == TYPE_Q5_K;
    const __m256i low4 = _mm256_set1_epi8(15);
    float acc[TILE * GROUP] = {0};
    for (int64_t b = 0; b < nb; b++, g += gb) {
        __m256i isum[2][TILE];
        for (int i = 0; i < mt; i++) isum[0][i] = isum[1][i] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            prefetch_l2(g, gb, ahead, j, 8);
            __m256i s[2][TILE];
            for (int i = 0; i < mt; i++) s[0][i] = s[1][i] = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int cc = 0; cc < 4; cc++) {
                const int c = 4 * j + cc;
                const __m256i r0 = half(g + 64 * c, 0), r1 = half(g + 64 * c, 1);
                __m256i lo0 = _mm256_and_si256(r0, low4), hi0 = _mm256_and_si256(_mm256_srli_epi16(r0, 4), low4);
                __m256i lo1 = _mm256_and_si256(r1, low4), hi1 = _mm256_and_si256(_mm256_srli_epi16(r1, 4), low4);
                if (five) {
                    lo0 = _mm256_or_si256(lo0, high16(g + 2368, 2 * c, 0)), hi0 = _mm256_or_si256(hi0, high16(g + 2368, 2 * c + 1, 0));
                    lo1 = _mm256_or_si256(lo1, high16(g + 2368, 2 * c, 1)), hi1 = _mm256_or_si256(hi1, high16(g + 2368, 2 * c + 1, 1));
                }
#pragma GCC unroll 4
                for (int i = 0; i < mt; i++) {
                    const int8_t *xq = x->q + (m0 + i) * K + b * 256 + 8 * c;
                    const __m256i xa = BCAST4(xq), xb = BCAST4(xq + 4);
                    s[0][i] = _mm256_add_epi16(s[0][i], _mm256_add_epi16(_mm256_maddubs_epi16(lo0, xa), _mm256_maddubs_epi16(hi0, xb)));
                    s[1][i] = _mm256_add_epi16(s[1][i], _mm256_add_epi16(_mm256_maddubs_epi16(lo1, xa), _mm256_maddubs_epi16(hi1, xb)));
                    PIN(s[0][i]);
                    PIN(s[1][i]);
                }
                if (five && (c & 1))
                    for (int h = 0; h < 2; h++) {
                        const __m256i sc = pairs_u8(g + 2048 + 16 * j + 8 * h);
                        for (int i = 0; i < mt; i++) {
                            isum[h][i] = _mm256_add_epi32(isum[h][i], _mm256_madd_epi16(s[h][i], sc));
                            s[h][i] = _mm256_setzero_si256();
                        }
                    }
            }
            if (!five)
                for (int h = 0; h < 2; h++) {
                    const __m256i sc = pairs_u8(g + 2048 + 16 * j + 8 * h);
                    for (int i = 0; i < mt; i++) isum[h][i] = _mm256_add_epi32(isum[h][i], _mm256_madd_epi16(s[h][i], sc));
                }
        }
        for (int h = 0; h < 2; h++) {
            const __m256 d = scales8(g + 2304, h), dmin = scales8(g + 2336, h);
            for (int i = 0; i < mt; i++) {
                __m256i msum = _mm256_setzero_si256();
                for (int p = 0; p < 4; p++) {
                    const __m128i mn = _mm_loadu_si128((const __m128i *)(g + 2176 + 32 * p + 16 * h));
                    msum = _mm256_add_epi32(msum, _mm256_madd_epi16(_mm256_cvtepu8_epi16(mn),
                                                                    BCAST4(x->bsum32 + (m0 + i) * (K / 32) + b * 8 + 2 * p)));
                }
                const __m256 dx = _mm256_set1_ps(x->d[(m0 + i) * nb + b]);
                fma_into(acc + GROUP * i + 8 * h, _mm256_cvtepi32_ps(isum[h][i]), _mm256_mul_ps(d, dx));
                fnma_into(acc + GROUP * i + 8 * h, _mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, dx));
            }
        }
    }
    memcpy(out, acc, sizeof(float) * GROUP * (size_t)mt);
}

/* Q6_K for one row of x, both halves of a vector's codes at once: each broadcast of x feeds two
 * maddubs (7% less time a call); for more rows the halves in turn (group_q6k_halves), whose
 * codes stay in registers across the rows. */
INLINE void group_q6k_both(const uint8_t *g, const QuantX *x, int64_t K, int64_t m0, const int mt, int ahead, float *out) {
    const int64_t nb = K / 256;
    const __m256i low4 = _mm256_set1_epi8(15), bits45 = _mm256_set1_epi8(0x30), low16 = _mm256_set1_epi32(0xffff);
    float acc[TILE * GROUP] = {0}; /* row i's half h at GROUP * i + 8 * h: out's layout */
    for (int64_t b = 0; b < nb; b++, g += 3360) {
        prefetch_l2(g, 3360, ahead, 0, 1);
        __m256i isum[2][TILE], osum[2][TILE];
        for (int i = 0; i < mt; i++) isum[0][i] = isum[1][i] = osum[0][i] = osum[1][i] = _mm256_setzero_si256();
        for (int p = 0; p < 8; p++) { /* groups 2p, 2p+1 of 16 values: chunks 4p..4p+3 */
            __m256i pair[2], sc[2][2];
            for (int h = 0; h < 2; h++) {
                pair[h] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(g + 3072 + 32 * p + 16 * h)));
                sc[h][0] = _mm256_or_si256(_mm256_and_si256(pair[h], low16), _mm256_slli_epi32(pair[h], 16));
                sc[h][1] = _mm256_or_si256(_mm256_andnot_si256(low16, pair[h]), _mm256_srli_epi32(pair[h], 16));
            }
#pragma GCC unroll 2
            for (int h2 = 0; h2 < 2; h2++) {
                const int v = 2 * p + h2;
                __m256i c[2][4];
                for (int h = 0; h < 2; h++) {
                    const __m256i hb = half(g + 2048 + 64 * v, h);
                    const __m256i r0 = half(g + 64 * (2 * v), h), r1 = half(g + 64 * (2 * v + 1), h);
                    c[h][0] = _mm256_or_si256(_mm256_and_si256(r0, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), bits45));
                    c[h][1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(r0, 4), low4),
                                              _mm256_and_si256(_mm256_slli_epi16(hb, 2), bits45));
                    c[h][2] = _mm256_or_si256(_mm256_and_si256(r1, low4), _mm256_and_si256(hb, bits45));
                    c[h][3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(r1, 4), low4),
                                              _mm256_and_si256(_mm256_srli_epi16(hb, 2), bits45));
                }
#pragma GCC unroll 4
                for (int i = 0; i < mt; i++) {
                    const int8_t *xq = x->q + (m0 + i) * K + b * 256 + 16 * v;
                    const __m256i x0 = BCAST4(xq), x1 = BCAST4(xq + 4), x2 = BCAST4(xq + 8), x3 = BCAST4(xq + 12);
                    for (int h = 0; h < 2; h++) {
                        const __m256i s01 = _mm256_add_epi16(_mm256_maddubs_epi16(c[h][0], x0), _mm256_maddubs_epi16(c[h][1], x1));
                        const __m256i s23 = _mm256_add_epi16(_mm256_maddubs_epi16(c[h][2], x2), _mm256_maddubs_epi16(c[h][3], x3));
                        isum[h][i] = _mm256_add_epi32(isum[h][i], _mm256_add_epi32(_mm256_madd_epi16(s01, sc[h][h2]),
                                                                                   _mm256_madd_epi16(s23, sc[h][h2])));
                        PIN(isum[h][i]);
                    }
                }
            }
            for (int i = 0; i < mt; i++) /* the codes' offset of 32: scales times x's sums of 16 */
                for (int h = 0; h < 2; h++)
                    osum[h][i] = _mm256_add_epi32(
                        osum[h][i], _mm256_madd_epi16(pair[h], BCAST4(x->bsums + (m0 + i) * (K / 16) + b * 16 + 2 * p)));
        }
        for (int h = 0; h < 2; h++) {
            const __m256 d = scales8(g + 3328, h);
            for (int i = 0; i < mt; i++) {
                const __m256i total = _mm256_sub_epi32(isum[h][i], _mm256_slli_epi32(osum[h][i], 5));
                fma_into(acc + GROUP * i + 8 * h, _mm256_cvtepi32_ps(total),
                         _mm256_mul_ps(d, _mm256_set1_ps(x->d[(m0 + i) * nb + b])));
            }
        }
    }
    memcpy(out, acc, sizeof(float) * GROUP * (size_t)mt);
}

/* Q6_K, the halves in turn. */
INLINE void group_q6k_halves(const uint8_t *g, const QuantX *x, int64_t K, int64_t m0, const int mt, int ahead, float *out) {
    const int64_t nb = K / 256;
    const __m256i low4 = _mm256_set1_epi8(15), bits45 = _mm256_set1_epi8(0x30), low16 = _mm256_set1_epi32(0xffff);
    __m256 acc[2][TILE];
    for (int i = 0; i < mt; i++) acc[0][i] = acc[1][i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, g += 3360) {
        prefetch_l2(g, 3360, ahead, 0, 1);
        for (int h = 0; h < 2; h++) {
            __m256i isum[TILE], osum[TILE];
            for (int i = 0; i < mt; i++) isum[i] = osum[i] = _mm256_setzero_si256();
            for (int p = 0; p < 8; p++) { /* groups 2p, 2p+1 of 16 values: chunks 4p..4p+3 */
                const __m256i pair = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(g + 3072 + 32 * p + 16 * h)));
                const __m256i sc[2] = {_mm256_or_si256(_mm256_and_si256(pair, low16), _mm256_slli_epi32(pair, 16)),
                                       _mm256_or_si256(_mm256_andnot_si256(low16, pair), _mm256_srli_epi32(pair, 16))};
#pragma GCC unroll 2
                for (int h2 = 0; h2 < 2; h2++) {
                    const int v = 2 * p + h2;
                    const __m256i hb = half(g + 2048 + 64 * v, h);
                    const __m256i r0 = half(g + 64 * (2 * v), h), r1 = half(g + 64 * (2 * v + 1), h);
                    const __m256i c0 = _mm256_or_si256(_mm256_and_si256(r0, low4),
                                                       _mm256_and_si256(_mm256_slli_epi16(hb, 4), bits45));
                    const __m256i c1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(r0, 4), low4),
                                                       _mm256_and_si256(_mm256_slli_epi16(hb, 2), bits45));
                    const __m256i c2 = _mm256_or_si256(_mm256_and_si256(r1, low4), _mm256_and_si256(hb, bits45));
                    const __m256i c3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(r1, 4), low4),
                                                       _mm256_and_si256(_mm256_srli_epi16(hb, 2), bits45));
#pragma GCC unroll 4
                    for (int i = 0; i < mt; i++) {
                        const int8_t *xq = x->q + (m0 + i) * K + b * 256 + 16 * v;
                        const __m256i s01 = _mm256_add_epi16(maddubs(c0, xq), maddubs(c1, xq + 4));
                        const __m256i s23 = _mm256_add_epi16(maddubs(c2, xq + 8), maddubs(c3, xq + 12));
                        isum[i] = _mm256_add_epi32(isum[i], _mm256_add_epi32(_mm256_madd_epi16(s01, sc[h2]),
                                                                             _mm256_madd_epi16(s23, sc[h2])));
                        PIN(isum[i]);
                    }
                }
                for (int i = 0; i < mt; i++) /* the codes' offset of 32: scales times x's sums of 16 */
                    osum[i] = _mm256_add_epi32(
                        osum[i], _mm256_madd_epi16(pair, BCAST4(x->bsums + (m0 + i) * (K / 16) + b * 16 + 2 * p)));
            }
            const __m256 d = scales8(g + 3328, h);
            for (int i = 0; i < mt; i++) {
                const __m256i total = _mm256_sub_epi32(isum[i], _mm256_slli_epi32(osum[i], 5));
                acc[h][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total),
                                            _mm256_mul_ps(d, _mm256_set1_ps(x->d[(m0 + i) * nb + b])), acc[h][i]);
            }
        }
    }
    for (int i = 0; i < mt; i++)
        _mm256_storeu_ps(out + GROUP * i, acc[0][i]), _mm256_storeu_ps(out + GROUP * i + 8, acc[1][i]);
}

INLINE void group_q6k(const uint8_t *g, const QuantX *x, int64_t K, int64_t m0, const int mt, int ahead, float *out) {
    if (mt == 1) group_q6k_both(g, x, K, m0, 1, ahead, out);
    else group_q6k_halves(g, x, K, m0, mt, ahead, out);
}

/* The 32-blocks' vector v in half h: unsigned codes, or for Q8_0 the signed ones (the layout's
 * codes + 128, taken back). */
INLINE __m256i q32_vector(const int type, const uint8_t *g, int v, int h) {
    if (type == TYPE_Q8_0) return _mm256_xor_si256(half(g + 64 * v, h), _mm256_set1_epi8((char)0x80));
    const __m256i raw = half(g + 64 * (v / 2), h);
    const __m256i nib = _mm256_and_si256(v & 1 ? _mm256_srli_epi16(raw, 4) : raw, _mm256_set1_epi8(15));
    return has_high(type) ? _mm256_or_si256(nib, high16(g + 256, v, h)) : nib;
}

/* Q8_0: sum_v w . x with |w| times x signed as w (maddubs takes unsigned times signed), from 0;
 * Q4_0 and Q5_0: from minus the offset times x's sum of 32 (`xo`); Q4_1 and Q5_1: from 0, with m
 * times x's scale times that sum added. The same integers as the AVX512 path's offset codes. */
INLINE void group_q32(const int type, const uint8_t *g, const QuantX *x, int64_t K, int64_t m0, const int mt, int ahead,
                      float *out) {
    const int64_t nb = K / 32;
    const int gb = group_bytes(type), at_d = q32_at_d(type), flush = has_high(type) ? 4 : 8; /* int16 room */
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[2][TILE];
    for (int i = 0; i < mt; i++) acc[0][i] = acc[1][i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, g += gb) {
        prefetch_ahead(g, gb, ahead);
        for (int h = 0; h < 2; h++) {
            __m256i s32[TILE], s16[TILE];
            for (int i = 0; i < mt; i++) {
                const int from = type == TYPE_Q8_0 || has_min(type) ? 0 : x->xo[(m0 + i) * nb + b];
                s32[i] = _mm256_set1_epi32(from), s16[i] = _mm256_setzero_si256();
            }
#pragma GCC unroll 8
            for (int v = 0; v < 8; v++) {
                const __m256i w = q32_vector(type, g, v, h);
                if (type == TYPE_Q8_0) {
                    const __m256i aw = _mm256_abs_epi8(w);
#pragma GCC unroll 4
                    for (int i = 0; i < mt; i++) {
                        const __m256i xs = _mm256_sign_epi8(BCAST4(x->q + (m0 + i) * K + b * 32 + 4 * v), w);
                        s32[i] = _mm256_add_epi32(s32[i], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xs), ones));
                        PIN(s32[i]);
                    }
                    continue;
                }
#pragma GCC unroll 4
                for (int i = 0; i < mt; i++) {
                    s16[i] = _mm256_add_epi16(s16[i], maddubs(w, x->q + (m0 + i) * K + b * 32 + 4 * v));
                    PIN(s16[i]);
                }
                if ((v + 1) % flush == 0)
                    for (int i = 0; i < mt; i++) {
                        s32[i] = _mm256_add_epi32(s32[i], _mm256_madd_epi16(s16[i], ones));
                        s16[i] = _mm256_setzero_si256();
                    }
            }
            const __m256 d = scales8(g + at_d, h);
            for (int i = 0; i < mt; i++) {
                const float dx = x->d[(m0 + i) * nb + b];
                acc[h][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32[i]), _mm256_mul_ps(d, _mm256_set1_ps(dx)), acc[h][i]);
                if (has_min(type))
                    acc[h][i] = _mm256_fmadd_ps(scales8(g + at_d + 32, h),
                                                _mm256_set1_ps(dx * x->bsum32[(m0 + i) * nb + b]), acc[h][i]);
            }
        }
    }
    for (int i = 0; i < mt; i++)
        _mm256_storeu_ps(out + GROUP * i, acc[0][i]), _mm256_storeu_ps(out + GROUP * i + 8, acc[1][i]);
}

#include "group_kernel.h" /* the dispatch over type and rows, as every vector level has it */

#endif
