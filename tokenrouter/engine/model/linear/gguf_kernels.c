/* y = x W^T + b with W in a GGUF file's own quantized blocks, on the CPU.
 *
 * Built by gguf_native.py with the machine's C compiler (-O3 -march=native -fopenmp) and called
 * through ctypes. The arithmetic is llama.cpp's: each row of x is quantized to int8, per block of
 * 256 values for the K-quant weights (Q4_K, Q6_K: one float scale and the sums of each 16 codes)
 * and per block of 32 for the others (Q5_0, Q8_0), and the dot products run on the integer codes,
 * scaled once per block. A decode step then reads 4.5-8.5 bits a weight and computes in int8,
 * where torch's own int4 kernel dequantizes every weight to float first.
 *
 * Two implementations of each dot product: AVX512 VNNI (where the compiler targets it) and plain
 * C, which the tests hold the fast one to and which serves any other CPU (slowly: the engine's
 * probe then measures torch's kernels as faster and picks them).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && defined(__F16C__)
#define TR_AVX512 1
#include <immintrin.h>
#else
#define TR_AVX512 0
#endif

enum { TYPE_Q8_0 = 8, TYPE_Q5_0 = 6, TYPE_Q4_K = 12, TYPE_Q6_K = 14 }; /* ggml's type numbers */
enum { MAX_TILE = 8 };                                                  /* rows of x per pass */
enum { CHUNK = 16 };                                                    /* rows of W per task */

static float fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 113;
            while (!(man & 1024)) {
                man <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((man & 1023) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1);                                       /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static uint16_t read_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* ---- x quantized to int8: per row, blocks of `block` values, each with a float scale ---- */

typedef struct {
    int8_t *q;      /* [M][K] */
    float *d;       /* [M][K / block] */
    int16_t *bsums; /* [M][K / 16]: sums of each 16 codes (K-quants; the plain dot products) */
    float *fs16;    /* [M][K / 16]: d * each 16 codes' sum (Q6_K's offset, scaled per row of W) */
    float *fs32;    /* [M][K / 32]: d * each 32 codes' sum (Q4_K's mins) */
    int32_t *xo;    /* [M][K / 4]: -offset * each 4 codes' sum (Q8_0's and Q5_0's unsigned codes) */
} QuantX;

static void quantize_row(const void *x, int x_bf16, int64_t K, int block, int offset, int8_t *q, float *d,
                         int16_t *bsums, float *fs16, float *fs32, int32_t *xo) {
    float buf[256];
    for (int64_t b = 0; b < K / block; b++) {
        float amax = 0.0f;
        for (int i = 0; i < block; i++) {
            int64_t k = b * block + i;
            float v = x_bf16 ? bf16_to_f32(((const uint16_t *)x)[k]) : ((const float *)x)[k];
            buf[i] = v;
            float a = fabsf(v);
            amax = a > amax ? a : amax;
        }
        float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int i = 0; i < block; i++) q[b * block + i] = (int8_t)nearbyintf(buf[i] * inv);
        d[b] = scale;
        if (offset != 0) { /* 32-blocks: what the unsigned codes' offset takes back */
            for (int j = 0; j < block / 4; j++) {
                const int8_t *c = q + b * block + 4 * j;
                xo[b * (block / 4) + j] = -offset * (c[0] + c[1] + c[2] + c[3]);
            }
            continue;
        }
        for (int j = 0; j < block / 16; j++) { /* K-quants: sums of 16 and 32 codes */
            int s = 0;
            for (int i = 0; i < 16; i++) s += q[b * block + j * 16 + i];
            int64_t at = b * (block / 16) + j;
            bsums[at] = (int16_t)s;
            fs16[at] = scale * (float)s;
            if (j & 1) fs32[at / 2] = scale * (float)(bsums[at - 1] + s);
        }
    }
}

/* ---- Q4_K: 256 weights = d, dmin (fp16), 12 bytes of eight 6-bit scales and mins, 128 bytes of
 * codes (each 32-byte run: one sub-block of 32 in its low nibbles, the next in its high ones);
 * w = d * scale_j * q - dmin * min_j ---- */

static void q4k_scales(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t u[3], out[4];
    memcpy(u, s, 12);
    out[0] = u[0] & 0x3f3f3f3fu;                                              /* scales 0-3 */
    out[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);       /* scales 4-7 */
    out[2] = u[1] & 0x3f3f3f3fu;                                              /* mins 0-3 */
    out[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4); /* mins 4-7 */
    memcpy(sc, out, 8);
    memcpy(mn, out + 2, 8);
}

static float dot_q4k_ref(const uint8_t *w, const int8_t *q, const float *d, const int16_t *bs, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 144, q += 256, bs += 16) {
        uint8_t sc[8], mn[8];
        q4k_scales(w + 4, sc, mn);
        const uint8_t *qs = w + 16;
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 4; j++) {
            int32_t lo = 0, hi = 0;
            for (int l = 0; l < 32; l++) {
                lo += (qs[32 * j + l] & 15) * q[64 * j + l];
                hi += (qs[32 * j + l] >> 4) * q[64 * j + 32 + l];
            }
            isum += sc[2 * j] * lo + sc[2 * j + 1] * hi;
        }
        for (int j = 0; j < 8; j++) msum += mn[j] * (bs[2 * j] + bs[2 * j + 1]);
        acc += fp16_to_f32(read_u16(w)) * d[b] * (float)isum - fp16_to_f32(read_u16(w + 2)) * d[b] * (float)msum;
    }
    return acc;
}

/* ---- Q6_K: 256 weights = 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, d;
 * w = d * scale_j * (q - 32), one scale per 16 weights ---- */

static float dot_q6k_ref(const uint8_t *w, const int8_t *q, const float *d, const int16_t *bs, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 210, q += 256, bs += 16) {
        const int8_t *sc = (const int8_t *)(w + 192);
        int32_t isum = 0;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w + 64 * h, *qh = w + 128 + 32 * h;
            int32_t part[8] = {0};
            for (int l = 0; l < 32; l++) {
                const int8_t *x = q + 128 * h;
                part[l / 16] += ((ql[l] & 15) | ((qh[l] & 3) << 4)) * x[l];
                part[2 + l / 16] += ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) * x[l + 32];
                part[4 + l / 16] += ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) * x[l + 64];
                part[6 + l / 16] += ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) * x[l + 96];
            }
            for (int j = 0; j < 8; j++) isum += sc[8 * h + j] * part[j];
        }
        for (int j = 0; j < 16; j++) isum -= 32 * sc[j] * bs[j];
        acc += fp16_to_f32(read_u16(w + 208)) * d[b] * (float)isum;
    }
    return acc;
}

/* ---- Q8_0: 32 weights = d (fp16), 32 int8 codes; Q5_0: d, 32 high bits, 16 bytes of low
 * nibbles (first 16 weights low, last 16 high); w = d * (q - 16) ---- */

static float dot_q8_0_ref(const uint8_t *w, const int8_t *q, const float *d, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 34, q += 32) {
        const int8_t *qw = (const int8_t *)(w + 2); /* gcc 12 vectorized (int8_t)w[2 + l] as unsigned */
        int32_t isum = 0;
        for (int l = 0; l < 32; l++) isum += qw[l] * q[l];
        acc += fp16_to_f32(read_u16(w)) * d[b] * (float)isum;
    }
    return acc;
}

static float dot_q5_0_ref(const uint8_t *w, const int8_t *q, const float *d, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 22, q += 32) {
        uint32_t qh;
        memcpy(&qh, w + 2, 4);
        int32_t isum = 0;
        for (int l = 0; l < 16; l++) {
            int lo = ((w[6 + l] & 15) | (((qh >> l) & 1) << 4)) - 16;
            int hi = ((w[6 + l] >> 4) | (((qh >> (l + 16)) & 1) << 4)) - 16;
            isum += lo * q[l] + hi * q[l + 16];
        }
        acc += fp16_to_f32(read_u16(w)) * d[b] * (float)isum;
    }
    return acc;
}

#if TR_AVX512

static float hsum512(__m512 v) { return _mm512_reduce_add_ps(v); }

static float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

#define FP16(p) _cvtsh_ss(read_u16(p)) /* F16C: one instruction, where fp16_to_f32 takes a dozen */

/* Which scale each int16 lane of a 64-weight chunk takes: Q4_K's two sub-blocks of 32 (16 lanes
 * each), Q6_K's four groups of 16 (8 lanes each); and Q6_K's shifts bringing each 32 weights'
 * pair of high bits down (per half of the 64-byte vector). */
#define R16(v) v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v
#define R8(v) v, v, v, v, v, v, v, v
static const int16_t Q4K_PICK[4][32] = {{R16(0), R16(1)}, {R16(2), R16(3)}, {R16(4), R16(5)}, {R16(6), R16(7)}};
static const int16_t Q6K_PICK[4][32] = {{R8(0), R8(1), R8(2), R8(3)},
                                        {R8(4), R8(5), R8(6), R8(7)},
                                        {R8(8), R8(9), R8(10), R8(11)},
                                        {R8(12), R8(13), R8(14), R8(15)}};
static const int16_t Q6K_SHIFT[2][32] = {{R16(0), R16(2)}, {R16(4), R16(6)}};

/* The dot products below are inlined once per tile height `mt` (a constant there), so that each
 * row of x keeps its accumulators in registers rather than in memory. */
#define INLINE static inline __attribute__((always_inline))

/* 256 unsigned codes (four vectors of 64) times 256 int8 x, each int16 pair times its scale:
 * sixteen int32 lanes. Two chains of two, so that the four multiply-adds do not wait in line. */
INLINE __m512i dot4(const __m512i wv[4], const __m512i sv[4], const int8_t *xq) {
    __m512i a = _mm512_madd_epi16(_mm512_maddubs_epi16(wv[0], _mm512_loadu_si512(xq)), sv[0]);
    __m512i b = _mm512_madd_epi16(_mm512_maddubs_epi16(wv[2], _mm512_loadu_si512(xq + 128)), sv[2]);
    a = _mm512_dpwssd_epi32(a, _mm512_maddubs_epi16(wv[1], _mm512_loadu_si512(xq + 64)), sv[1]);
    b = _mm512_dpwssd_epi32(b, _mm512_maddubs_epi16(wv[3], _mm512_loadu_si512(xq + 192)), sv[3]);
    return _mm512_add_epi32(a, b);
}

/* One row of Q4_K weights against `mt` rows of x: out[i] = that dot product. */
INLINE void rows_q4k(const uint8_t *w, const QuantX *x, int64_t K, int64_t m0, const int mt, float *out) {
    const int64_t nb = K / 256;
    const __m512i low4 = _mm512_set1_epi8(15);
    const __m512i first = _mm512_set_epi64(11, 10, 9, 8, 3, 2, 1, 0);
    const __m512i second = _mm512_set_epi64(15, 14, 13, 12, 7, 6, 5, 4);
    __m512 acc[MAX_TILE];
    __m256 macc[MAX_TILE];
    for (int i = 0; i < mt; i++) {
        acc[i] = _mm512_setzero_ps();
        macc[i] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++, w += 144) {
        uint8_t sc[8], mn[8];
        q4k_scales(w + 4, sc, mn);
        const float dw = FP16(w), mw = FP16(w + 2);
        const __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
        const __m256 wmin = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)mn))),
                                          _mm256_set1_ps(-mw));
        const __m512 dwv = _mm512_set1_ps(dw);
        __m512i wv[4], sv[4];
        for (int h = 0; h < 2; h++) {
            const __m512i raw = _mm512_loadu_si512(w + 16 + 64 * h);
            const __m512i lo = _mm512_and_si512(raw, low4);                        /* sub 4h, 4h+2 */
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);  /* sub 4h+1, 4h+3 */
            wv[2 * h] = _mm512_permutex2var_epi64(lo, first, hi);
            wv[2 * h + 1] = _mm512_permutex2var_epi64(lo, second, hi);
        }
        for (int c = 0; c < 4; c++) sv[c] = _mm512_permutexvar_epi16(_mm512_loadu_si512(Q4K_PICK[c]), sc16);
#pragma GCC unroll 8
        for (int i = 0; i < mt; i++) {
            const int64_t m = m0 + i;
            const int8_t *xq = x->q + m * K + b * 256;
            const __m512i isum = dot4(wv, sv, xq);
            const __m512 dx = _mm512_set1_ps(x->d[m * nb + b]);
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dwv, dx), acc[i]);
            macc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(x->fs32 + m * (K / 32) + b * 8), wmin, macc[i]);
        }
    }
    for (int i = 0; i < mt; i++) out[i] = hsum512(acc[i]) + hsum256(macc[i]);
}

INLINE void rows_q6k(const uint8_t *w, const QuantX *x, int64_t K, int64_t m0, const int mt, float *out) {
    const int64_t nb = K / 256;
    const __m512i low4 = _mm512_set1_epi8(15), two = _mm512_set1_epi8(3);
    const __m512i shift_lo = _mm512_loadu_si512(Q6K_SHIFT[0]), shift_hi = _mm512_loadu_si512(Q6K_SHIFT[1]);
    __m512 acc[MAX_TILE], oacc[MAX_TILE];
    for (int i = 0; i < mt; i++) acc[i] = oacc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += 210) {
        const float dw = FP16(w + 208);
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 192)));
        const __m512i sc512 = _mm512_castsi256_si512(sc16);
        const __m512 wsc = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(sc16)), _mm512_set1_ps(-32.0f * dw));
        const __m512 dwv = _mm512_set1_ps(dw);
        __m512i wv[4], sv[4];
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512(w + 64 * h);
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h)));
            const __m512i hlo = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shift_lo), two), 4);
            const __m512i hhi = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, shift_hi), two), 4);
            wv[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, low4), hlo);
            wv[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4), hhi);
        }
        for (int c = 0; c < 4; c++) sv[c] = _mm512_permutexvar_epi16(_mm512_loadu_si512(Q6K_PICK[c]), sc512);
#pragma GCC unroll 8
        for (int i = 0; i < mt; i++) {
            const int64_t m = m0 + i;
            const int8_t *xq = x->q + m * K + b * 256;
            const __m512i isum = dot4(wv, sv, xq);
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dwv, _mm512_set1_ps(x->d[m * nb + b])), acc[i]);
            oacc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(x->fs16 + m * (K / 16) + b * 16), wsc, oacc[i]); /* -32 */
        }
    }
    for (int i = 0; i < mt; i++) out[i] = hsum512(_mm512_add_ps(acc[i], oacc[i]));
}

/* 32-blocks: VNNI multiplies unsigned by signed bytes, so the codes go in as unsigned ones
 * (Q8_0's plus 128, Q5_0's as stored, plus 16) and each row's accumulator starts from minus the
 * offset times its 4-code sums of x (`xo`), which takes the offset back off for free. Two blocks
 * per step, in two accumulators, so that a row's additions do not wait on each other. */
INLINE __m256i q32_codes(int type, const uint8_t *w) {
    if (type == TYPE_Q8_0) return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + 2)), _mm256_set1_epi8((char)0x80));
    uint32_t qh;
    memcpy(&qh, w + 2, 4);
    const __m128i qs = _mm_loadu_si128((const __m128i *)(w + 6));
    const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), _mm256_set1_epi8(15));
    return _mm256_or_si256(nib, _mm256_and_si256(_mm256_movm_epi8(qh), _mm256_set1_epi8(16)));
}

INLINE void rows_q32(const int type, const uint8_t *w, const QuantX *x, int64_t K, int64_t m0, const int mt,
                     float *out) {
    const int64_t nb = K / 32;
    const int size = type == TYPE_Q8_0 ? 34 : 22;
    __m256 acc[2][MAX_TILE];
    for (int i = 0; i < mt; i++) acc[0][i] = acc[1][i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += size) {
        const int odd = (int)(b & 1);
        const __m256i u = q32_codes(type, w);
        const __m256 dw = _mm256_set1_ps(FP16(w));
#pragma GCC unroll 8
        for (int i = 0; i < mt; i++) {
            const int64_t m = m0 + i;
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(x->q + m * K + b * 32));
            const __m256i start = _mm256_loadu_si256((const __m256i *)(x->xo + m * (K / 4) + b * 8));
            const __m256i isum = _mm256_dpbusd_epi32(start, u, xv);
            const __m256 scale = _mm256_mul_ps(dw, _mm256_broadcast_ss(x->d + m * nb + b));
            acc[odd][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[odd][i]);
        }
    }
    for (int i = 0; i < mt; i++) out[i] = hsum256(_mm256_add_ps(acc[0][i], acc[1][i]));
}

/* One row of W against `mt` rows of x, with `mt` a constant in each copy. */
static void rows_fast(int type, const uint8_t *w, const QuantX *x, int64_t K, int64_t m0, int mt, float *out) {
#define TILE(n)                                                                                                      \
    case n:                                                                                                          \
        if (type == TYPE_Q4_K) rows_q4k(w, x, K, m0, n, out);                                                        \
        else if (type == TYPE_Q6_K) rows_q6k(w, x, K, m0, n, out);                                                   \
        else if (type == TYPE_Q8_0) rows_q32(TYPE_Q8_0, w, x, K, m0, n, out);                                        \
        else rows_q32(TYPE_Q5_0, w, x, K, m0, n, out);                                                               \
        break;
    switch (mt) {
        TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6) TILE(7) TILE(8)
    }
#undef TILE
}

#endif

static int block_bytes(int type) {
    switch (type) {
    case TYPE_Q4_K: return 144;
    case TYPE_Q6_K: return 210;
    case TYPE_Q8_0: return 34;
    case TYPE_Q5_0: return 22;
    default: return 0;
    }
}

static int block_values(int type) { return type == TYPE_Q4_K || type == TYPE_Q6_K ? 256 : 32; }

static void rows_ref(int type, const uint8_t *w, const QuantX *x, int64_t K, int64_t m0, int mt, float *out) {
    const int bv = block_values(type);
    const int64_t nb = K / bv;
    for (int i = 0; i < mt; i++) {
        const int64_t m = m0 + i;
        const int8_t *q = x->q + m * K;
        const float *d = x->d + m * nb;
        const int16_t *bs = x->bsums + m * (K / 16);
        switch (type) {
        case TYPE_Q4_K: out[i] = dot_q4k_ref(w, q, d, bs, nb); break;
        case TYPE_Q6_K: out[i] = dot_q6k_ref(w, q, d, bs, nb); break;
        case TYPE_Q8_0: out[i] = dot_q8_0_ref(w, q, d, nb); break;
        default: out[i] = dot_q5_0_ref(w, q, d, nb); break;
        }
    }
}

/* Whether this build has the fast path (1) or only plain C (0). */
int tr_fast_path(void) { return TR_AVX512; }

/* y[M][N] = x[M][K] . W[N][K]^T (+ bias[N]). W: N rows of K / block_values(type) blocks, as the
 * GGUF file holds them. x and y are float32 or bf16 (the flags). `plain` forces the plain-C dot
 * products (tests). Returns 0, or -1 for a type or shape it cannot take, -2 out of memory. */
int tr_gguf_matmul(int type, const uint8_t *w, int64_t N, int64_t K, const void *x, int x_bf16, int64_t M, void *y,
                   int y_bf16, const float *bias, int threads, int plain) {
    const int bb = block_bytes(type), bv = block_values(type);
    if (bb == 0 || K % bv != 0 || N <= 0 || M <= 0) return -1;
    const int64_t nb = K / bv, row_bytes = nb * bb;
    QuantX qx;
    qx.q = malloc((size_t)(M * K));
    qx.d = malloc(sizeof(float) * (size_t)(M * nb));
    qx.bsums = malloc(sizeof(int16_t) * (size_t)(M * (K / 16)));
    qx.fs16 = malloc(sizeof(float) * (size_t)(M * (K / 16)));
    qx.fs32 = malloc(sizeof(float) * (size_t)(M * (K / 32)));
    qx.xo = malloc(sizeof(int32_t) * (size_t)(M * (K / 4)));
    if (!qx.q || !qx.d || !qx.bsums || !qx.fs16 || !qx.fs32 || !qx.xo) {
        free(qx.q), free(qx.d), free(qx.bsums), free(qx.fs16), free(qx.fs32), free(qx.xo);
        return -2;
    }
    const size_t esize = x_bf16 ? 2 : 4;
    const int offset = type == TYPE_Q8_0 ? 128 : type == TYPE_Q5_0 ? 16 : 0;
#pragma omp parallel for schedule(static) num_threads(threads) if (M > 1)
    for (int64_t m = 0; m < M; m++)
        quantize_row((const char *)x + m * K * esize, x_bf16, K, bv, offset, qx.q + m * K, qx.d + m * nb,
                     qx.bsums + m * (K / 16), qx.fs16 + m * (K / 16), qx.fs32 + m * (K / 32), qx.xo + m * (K / 4));
    const int64_t chunks = (N + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t n_end = (c + 1) * CHUNK < N ? (c + 1) * CHUNK : N;
        for (int64_t m0 = 0; m0 < M; m0 += MAX_TILE) {
            const int mt = M - m0 < MAX_TILE ? (int)(M - m0) : MAX_TILE;
            for (int64_t n = c * CHUNK; n < n_end; n++) {
                const uint8_t *wr = w + n * row_bytes;
                float out[MAX_TILE];
#if TR_AVX512
                if (!plain) rows_fast(type, wr, &qx, K, m0, mt, out);
                else
#endif
                    rows_ref(type, wr, &qx, K, m0, mt, out);
                const float b = bias ? bias[n] : 0.0f;
                for (int i = 0; i < mt; i++) {
                    const int64_t at = (m0 + i) * N + n;
                    if (y_bf16) ((uint16_t *)y)[at] = f32_to_bf16(out[i] + b);
                    else ((float *)y)[at] = out[i] + b;
                }
            }
        }
    }
    free(qx.q), free(qx.d), free(qx.bsums), free(qx.fs16), free(qx.fs32), free(qx.xo);
    (void)plain;
    return 0;
}
