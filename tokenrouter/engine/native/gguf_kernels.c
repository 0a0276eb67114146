/* y = x W^T + b with W in a GGUF file's own quantized blocks, on the CPU.
 *
 * Built by gguf_native.py with the machine's C compiler (-O3 -march=native -fopenmp) and called
 * through ctypes. The arithmetic is llama.cpp's: each row of x is quantized to int8, per block of
 * 256 values for the K-quant weights (Q4_K, Q5_K, Q6_K: one float scale and the sums of each 16
 * codes) and per block of 32 for the others (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), and the dot products
 * run on the integer codes, scaled once per block. A decode step then reads 4.5-8.5 bits a weight
 * and computes in int8, where torch's own int4 kernel dequantizes every weight to float first.
 *
 * Two implementations: plain C on the file's own blocks (tr_gguf_matmul), which the tests hold the
 * other to and which serves any other CPU (slowly: the engine's probe then measures torch's
 * kernels as faster and picks them); and AVX512 VNNI on the blocks repacked once at load, 16 rows
 * of W interleaved (tr_gguf_repack, tr_gguf_matmul_packed; below).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) &&               \
    defined(__F16C__)
#define TR_AVX512 1
#include <immintrin.h>
#else
#define TR_AVX512 0
#endif

enum { /* ggml's type numbers */
    TYPE_Q4_0 = 2,
    TYPE_Q4_1 = 3,
    TYPE_Q5_0 = 6,
    TYPE_Q5_1 = 7,
    TYPE_Q8_0 = 8,
    TYPE_Q4_K = 12,
    TYPE_Q5_K = 13,
    TYPE_Q6_K = 14
};

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
    u += 0x7fffu + ((u >> 16) & 1);                                         /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static uint16_t read_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* ---- x quantized to int8: per row, blocks of `block` values, each with a float scale ---- */

typedef struct {
    int8_t *q;       /* [M][K] */
    float *d;        /* [M][K / block] */
    int16_t *bsums;  /* [M][K / 16]: sums of each 16 codes (K-quants: Q6_K's offset of 32) */
    int16_t *bsum32; /* [M][K / 32]: sums of each 32 codes (Q4_K's and Q5_K's mins; Q4_1's and Q5_1's) */
    int32_t *xo;     /* [M][K / 32]: -offset * each 32 codes' sum (Q8_0's, Q5_0's and Q4_0's unsigned codes) */
} QuantX;

static void quantize_row(const void *x, int x_bf16, int64_t K, int block, int offset, int8_t *q, float *d,
                         int16_t *bsums, int16_t *bsum32, int32_t *xo) {
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
        int8_t *c = q + b * block;
        for (int i = 0; i < block; i++) c[i] = (int8_t)nearbyintf(buf[i] * inv);
        d[b] = scale;
        if (offset != 0) { /* 32-blocks of offset codes: what the offset takes back */
            int s = 0;
            for (int i = 0; i < 32; i++) s += c[i];
            xo[b] = -offset * s;
            continue;
        }
        for (int j = 0; j < block / 16; j++) { /* sums of 16 and 32 codes (K-quants, Q4_1, Q5_1) */
            int s = 0;
            for (int i = 0; i < 16; i++) s += c[j * 16 + i];
            bsums[b * (block / 16) + j] = (int16_t)s;
            if (j & 1) bsum32[b * (block / 32) + j / 2] = (int16_t)(bsums[b * (block / 16) + j - 1] + s);
        }
    }
}

/* ---- Q4_K: 256 weights = d, dmin (fp16), 12 bytes of eight 6-bit scales and mins, 128 bytes of
 * codes (each 32-byte run: one sub-block of 32 in its low nibbles, the next in its high ones);
 * w = d * scale_j * q - dmin * min_j. Q5_K: the same with 32 bytes of high bits before the codes
 * (byte l bit j: bit 4 of value l of sub-block j), q in 0..31 ---- */

static void q4k_scales(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t u[3], out[4];
    memcpy(u, s, 12);
    out[0] = u[0] & 0x3f3f3f3fu;                                               /* scales 0-3 */
    out[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);        /* scales 4-7 */
    out[2] = u[1] & 0x3f3f3f3fu;                                               /* mins 0-3 */
    out[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4); /* mins 4-7 */
    memcpy(sc, out, 8);
    memcpy(mn, out + 2, 8);
}

static float dot_q45k_ref(int type, const uint8_t *w, const int8_t *q, const float *d, const int16_t *bs,
                          int64_t nb) {
    const int five = type == TYPE_Q5_K;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += five ? 176 : 144, q += 256, bs += 16) {
        uint8_t sc[8], mn[8];
        q4k_scales(w + 4, sc, mn);
        const uint8_t *qh = w + 16, *qs = w + (five ? 48 : 16);
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 4; j++) {
            int32_t lo = 0, hi = 0;
            for (int l = 0; l < 32; l++) {
                const int h = five ? qh[l] >> (2 * j) : 0; /* bits 0, 1: sub-blocks 2j, 2j + 1 */
                lo += ((qs[32 * j + l] & 15) | (h & 1) << 4) * q[64 * j + l];
                hi += ((qs[32 * j + l] >> 4) | (h & 2) << 3) * q[64 * j + 32 + l];
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

/* ---- Q8_0: 32 weights = d (fp16), 32 int8 codes. The others: d, then m (fp16: Q4_1, Q5_1), then
 * 32 high bits (Q5_0, Q5_1), then 16 bytes of low nibbles (first 16 weights low, last 16 high);
 * w = d * (q - 8) (Q4_0), d * (q - 16) (Q5_0), d * q + m (Q4_1, Q5_1) ---- */

static inline int has_min(int type) { return type == TYPE_Q4_1 || type == TYPE_Q5_1; }
static inline int has_high(int type) { return type == TYPE_Q5_0 || type == TYPE_Q5_1; }
static inline int code_offset(int type) {
    return type == TYPE_Q8_0 ? 128 : type == TYPE_Q5_0 ? 16 : type == TYPE_Q4_0 ? 8 : 0;
}

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

/* The min term is m times llama.cpp's q8_1 s: x's scale times its 32 codes' sum (`bs32`). */
static float dot_nibbles_ref(int type, const uint8_t *w, const int8_t *q, const float *d, const int16_t *bs32,
                             int64_t nb) {
    const int at_qh = has_min(type) ? 4 : 2, at_qs = at_qh + (has_high(type) ? 4 : 0), offset = code_offset(type);
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += at_qs + 16, q += 32) {
        uint32_t qh = 0;
        if (has_high(type)) memcpy(&qh, w + at_qh, 4);
        int32_t isum = 0;
        for (int l = 0; l < 16; l++) {
            int lo = ((w[at_qs + l] & 15) | (((qh >> l) & 1) << 4)) - offset;
            int hi = ((w[at_qs + l] >> 4) | (((qh >> (l + 16)) & 1) << 4)) - offset;
            isum += lo * q[l] + hi * q[l + 16];
        }
        acc += fp16_to_f32(read_u16(w)) * d[b] * (float)isum;
        if (has_min(type)) acc += fp16_to_f32(read_u16(w + 2)) * (d[b] * (float)bs32[b]);
    }
    return acc;
}

static int block_bytes(int type) {
    switch (type) {
    case TYPE_Q4_K: return 144;
    case TYPE_Q5_K: return 176;
    case TYPE_Q6_K: return 210;
    case TYPE_Q8_0: return 34;
    case TYPE_Q4_0: return 18;
    case TYPE_Q4_1: return 20;
    case TYPE_Q5_0: return 22;
    case TYPE_Q5_1: return 24;
    default: return 0;
    }
}

static int block_values(int type) { return type == TYPE_Q4_K || type == TYPE_Q5_K || type == TYPE_Q6_K ? 256 : 32; }

#if TR_AVX512
/* quantize_row with AVX512: the same float operations (max |x|, x * 127 / max rounded to nearest
 * even, saturated to int8), 16 values at a time. Scalar, it cost as much as the matmul it feeds for
 * a layer of few output rows. */
static __m512 load16(const void *x, int x_bf16, int64_t k) {
    if (!x_bf16) return _mm512_loadu_ps((const float *)x + k);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)x + k));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static void quantize_row_fast(const void *x, int x_bf16, int64_t K, int block, int offset, int8_t *q, float *d,
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
#endif

/* ---- x rounded to int8 for M rows at once (in parallel where M > 1) ---- */

static int quantize_x(int type, const void *x, int x_bf16, int64_t K, int64_t M, int threads, int plain, QuantX *qx) {
    const int bv = block_values(type);
    const int64_t nb = K / bv;
    qx->q = malloc((size_t)(M * K));
    qx->d = malloc(sizeof(float) * (size_t)(M * nb));
    qx->bsums = malloc(sizeof(int16_t) * (size_t)(M * (K / 16)));
    qx->bsum32 = malloc(sizeof(int16_t) * (size_t)(M * (K / 32)));
    qx->xo = malloc(sizeof(int32_t) * (size_t)(M * (K / 32)));
    if (!qx->q || !qx->d || !qx->bsums || !qx->bsum32 || !qx->xo) return -2;
    const size_t esize = x_bf16 ? 2 : 4;
    const int offset = code_offset(type);
#pragma omp parallel for schedule(static) num_threads(threads) if (M > 1)
    for (int64_t m = 0; m < M; m++) {
        void (*row)(const void *, int, int64_t, int, int, int8_t *, float *, int16_t *, int16_t *, int32_t *) =
            quantize_row;
#if TR_AVX512
        if (!plain) row = quantize_row_fast;
#endif
        row((const char *)x + m * K * esize, x_bf16, K, bv, offset, qx->q + m * K, qx->d + m * nb,
            qx->bsums + m * (K / 16), qx->bsum32 + m * (K / 32), qx->xo + m * (K / 32));
    }
    (void)plain;
    return 0;
}

static void free_x(QuantX *qx) { free(qx->q), free(qx->d), free(qx->bsums), free(qx->bsum32), free(qx->xo); }

static void store(float v, int y_bf16, void *y, int64_t at) {
    if (y_bf16) ((uint16_t *)y)[at] = f32_to_bf16(v);
    else ((float *)y)[at] = v;
}

static void rows_ref(int type, const uint8_t *w, const QuantX *x, int64_t K, int64_t m, float *out) {
    const int64_t nb = K / block_values(type);
    const int8_t *q = x->q + m * K;
    const float *d = x->d + m * nb;
    const int16_t *bs = x->bsums + m * (K / 16);
    switch (type) {
    case TYPE_Q4_K:
    case TYPE_Q5_K: *out = dot_q45k_ref(type, w, q, d, bs, nb); break;
    case TYPE_Q6_K: *out = dot_q6k_ref(w, q, d, bs, nb); break;
    case TYPE_Q8_0: *out = dot_q8_0_ref(w, q, d, nb); break;
    default: *out = dot_nibbles_ref(type, w, q, d, x->bsum32 + m * (K / 32), nb); break;
    }
}

/* y[M][N] = x[M][K] . W[N][K]^T (+ bias[N]) in plain C, W as the GGUF file holds it: N rows of
 * K / block_values(type) blocks. x and y are float32 or bf16 (the flags). What any CPU can run, and
 * what the tests hold the fast path to. Returns 0, -1 for a type or shape it cannot take, -2 out
 * of memory. */
int tr_gguf_matmul(int type, const uint8_t *w, int64_t N, int64_t K, const void *x, int x_bf16, int64_t M, void *y,
                   int y_bf16, const float *bias, int threads) {
    const int bb = block_bytes(type), bv = block_values(type);
    if (bb == 0 || K % bv != 0 || N <= 0 || M <= 0) return -1;
    const int64_t row_bytes = K / bv * bb;
    QuantX qx;
    if (quantize_x(type, x, x_bf16, K, M, threads, 1, &qx) != 0) {
        free_x(&qx);
        return -2;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++)
        for (int64_t m = 0; m < M; m++) {
            float out;
            rows_ref(type, w + n * row_bytes, &qx, K, m, &out);
            store(out + (bias ? bias[n] : 0.0f), y_bf16, y, m * N + n);
        }
    free_x(&qx);
    return 0;
}

/* ---- The fast path: W repacked, 16 rows at a time ----
 *
 * A decode step of few rows reads each weight once, so it wants few bytes a weight; a step of 16
 * rows wants few instructions a product. Both at once: 16 rows of W interleaved, one per 32-bit
 * lane of a 512-bit vector, so that one VNNI instruction (vpdpbusd) multiplies 4 codes of each of
 * the 16 rows by the same 4 int8 values of a row of x (broadcast) and adds them up: 64 products,
 * no horizontal sums, and each block's float scaling done once for 16 rows. Repacked once at load,
 * to the same size give or take the scales (Q4_K 148 bytes a block instead of 144, Q5_K 180
 * instead of 176, the others equal); rows past N pad the last group with zeros. The arithmetic is
 * the same integer sums as the plain path's, scaled per block as llama.cpp does.
 *
 * Per group of 16 rows and block, `g` bytes (codes: "chunk" c = 8 values of each row, lane L
 * holding row L's values 8c..8c+3 in its 4 bytes' low nibbles and 8c+4..8c+7 in the high ones):
 *   Q4_K (2368): 32 chunks of codes; scales [8][16] u8; mins [4][16][2] u8 (pairs of sub-blocks);
 *                d [16], dmin [16] fp16
 *   Q5_K (2880): Q4_K's group (of the codes' low 4 bits), then 64 masks of 64 high bits (mask v:
 *                bit 4 of vector v's bytes, vector v = values 4v..4v+3 of each row: chunk v/2's
 *                low nibbles where v is even, its high ones where odd)
 *   Q6_K (3360): 32 chunks of low nibbles; 16 vectors of high bit pairs, vector v lane L byte k:
 *                bits 0-1, 2-3, 4-5, 6-7 = values 16v+k, +4, +8, +12; scales [8][16][2] int8
 *                (pairs of 16-value groups); d [16] fp16
 *   Q8_0 (544):  8 vectors of codes + 128, vector v lane L = row L's values 4v..4v+3; d [16] fp16
 *   Q5_0 (352):  4 chunks of low nibbles; 8 masks of 64 high bits (mask v: vector v's bytes, as
 *                Q5_K's); d [16] fp16
 *   Q4_0 (288):  4 chunks of codes; d [16] fp16
 *   Q4_1 (320):  4 chunks of codes; d [16], m [16] fp16
 *   Q5_1 (384):  Q5_0's group, then m [16] fp16
 */

enum { GROUP = 16 };

static int group_bytes(int type) {
    switch (type) {
    case TYPE_Q4_K: return 2368;
    case TYPE_Q5_K: return 2880;
    case TYPE_Q6_K: return 3360;
    case TYPE_Q8_0: return 544;
    case TYPE_Q4_0: return 288;
    case TYPE_Q4_1: return 320;
    case TYPE_Q5_0: return 352;
    case TYPE_Q5_1: return 384;
    default: return 0;
    }
}

/* Where a 32-block group's d sit (its m 32 bytes on). */
static inline int q32_at_d(int type) { return (type == TYPE_Q8_0 ? 512 : 256) + (has_high(type) ? 64 : 0); }

/* One block of one row, decoded: its codes (unsigned), scales and fp16 scale bits (`dmin`: Q4_1's
 * and Q5_1's m). */
typedef struct {
    uint8_t code[256];
    uint8_t sc[16], mn[8];
    uint16_t d, dmin;
} Decoded;

static void decode_block(int type, const uint8_t *w, Decoded *o) {
    memset(o, 0, sizeof *o);
    if (type == TYPE_Q4_K || type == TYPE_Q5_K) {
        const int five = type == TYPE_Q5_K;
        const uint8_t *qh = w + 16, *qs = w + (five ? 48 : 16);
        o->d = read_u16(w), o->dmin = read_u16(w + 2);
        q4k_scales(w + 4, o->sc, o->mn);
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                const int h = five ? qh[l] >> (2 * j) : 0;
                o->code[64 * j + l] = (qs[32 * j + l] & 15) | (h & 1) << 4;
                o->code[64 * j + 32 + l] = (qs[32 * j + l] >> 4) | (h & 2) << 3;
            }
    } else if (type == TYPE_Q6_K) {
        o->d = read_u16(w + 208);
        memcpy(o->sc, w + 192, 16);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w + 64 * h, *qh = w + 128 + 32 * h;
            uint8_t *c = o->code + 128 * h;
            for (int l = 0; l < 32; l++) {
                c[l] = (ql[l] & 15) | ((qh[l] & 3) << 4);
                c[l + 32] = (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4);
                c[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                c[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
            }
        }
    } else if (type == TYPE_Q8_0) {
        o->d = read_u16(w);
        for (int l = 0; l < 32; l++) o->code[l] = (uint8_t)(w[2 + l] ^ 0x80); /* int8 + 128 */
    } else {
        const int at_qh = has_min(type) ? 4 : 2, at_qs = at_qh + (has_high(type) ? 4 : 0);
        o->d = read_u16(w);
        if (has_min(type)) o->dmin = read_u16(w + 2);
        uint32_t qh = 0;
        if (has_high(type)) memcpy(&qh, w + at_qh, 4);
        for (int l = 0; l < 16; l++) {
            o->code[l] = (w[at_qs + l] & 15) | (((qh >> l) & 1) << 4);
            o->code[l + 16] = (w[at_qs + l] >> 4) | (((qh >> (l + 16)) & 1) << 4);
        }
    }
}

/* ---- rows of a table dequantized (an embedding's looked-up tokens) ----
 *
 * What gguf-py's reference dequantization computes, to the bit: each block's float scales from
 * its fp16 ones, then w = (d * scale) * code - (dmin * min) for the K-quants with mins, d * code
 * (+ m) for the others, each product and sum rounded to float on its own (no fused multiply-add,
 * which -march=native would otherwise contract them into). Plain C: a step looks up a few rows;
 * gguf-py's numpy took 0.37 ms of the demo 1.5B's 36 ms decode step for one. */

__attribute__((optimize("fp-contract=off"))) static void dequant_block(int type, const uint8_t *w, float *out) {
    Decoded b;
    decode_block(type, w, &b);
    const float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
    if (type == TYPE_Q4_K || type == TYPE_Q5_K) {
        for (int j = 0; j < 8; j++) {
            const float scale = d * (float)b.sc[j], minus = dmin * (float)b.mn[j];
            for (int l = 0; l < 32; l++) out[32 * j + l] = scale * (float)b.code[32 * j + l] - minus;
        }
    } else if (type == TYPE_Q6_K) {
        for (int j = 0; j < 16; j++) {
            const float scale = d * (float)(int8_t)b.sc[j];
            for (int l = 0; l < 16; l++) out[16 * j + l] = scale * (float)((int)b.code[16 * j + l] - 32);
        }
    } else if (has_min(type)) { /* Q4_1, Q5_1: d * code + m */
        for (int l = 0; l < 32; l++) out[l] = d * (float)b.code[l] + dmin;
    } else { /* Q8_0 (codes + 128), Q4_0 (+ 8), Q5_0 (+ 16) */
        const int offset = code_offset(type);
        for (int l = 0; l < 32; l++) out[l] = d * (float)((int)b.code[l] - offset);
    }
}

/* out[M][K] = rows ids[0..M-1] of W (N rows of K values in the file's blocks), in float32. Returns
 * 0, -1 for a type or width it cannot take, -2 for an id outside 0..N-1 (nothing written). */
int tr_gguf_rows(int type, const uint8_t *w, int64_t N, int64_t K, const int64_t *ids, int64_t M, float *out) {
    const int bv = block_values(type), bb = block_bytes(type);
    if (bb == 0 || K % bv != 0) return -1;
    for (int64_t m = 0; m < M; m++)
        if (ids[m] < 0 || ids[m] >= N) return -2;
    const int64_t nb = K / bv;
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++) dequant_block(type, w + (ids[m] * nb + b) * bb, out + m * K + b * bv);
    return 0;
}

/* Bit 4 of row L's codes into the masks: mask v bit 4L + k = value 4v + k's. */
static void pack_high(const uint8_t *c, int vectors, int L, uint8_t *masks) {
    for (int v = 0; v < vectors; v++)
        for (int k = 0; k < 4; k++)
            if (c[4 * v + k] & 16) masks[8 * v + (4 * L + k) / 8] |= (uint8_t)(1u << ((4 * L + k) % 8));
}

static void put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }

/* Rows 16g..16g+15 of block b, decoded (`r[L]`, zeros past N), written in the group layout. */
static void pack_group(int type, const Decoded r[GROUP], uint8_t *g) {
    for (int L = 0; L < GROUP; L++) {
        const uint8_t *c = r[L].code;
        if (type == TYPE_Q8_0) {
            for (int v = 0; v < 8; v++) memcpy(g + 64 * v + 4 * L, c + 4 * v, 4);
            put_u16(g + 512 + 2 * L, r[L].d);
            continue;
        }
        const int chunks = block_values(type) / 8;
        for (int ch = 0; ch < chunks; ch++)
            for (int k = 0; k < 4; k++) g[64 * ch + 4 * L + k] = (c[8 * ch + k] & 15) | ((c[8 * ch + 4 + k] & 15) << 4);
        if (type == TYPE_Q4_K || type == TYPE_Q5_K) {
            for (int j = 0; j < 8; j++) g[2048 + 16 * j + L] = r[L].sc[j];
            for (int p = 0; p < 4; p++)
                g[2176 + 32 * p + 2 * L] = r[L].mn[2 * p], g[2176 + 32 * p + 2 * L + 1] = r[L].mn[2 * p + 1];
            put_u16(g + 2304 + 2 * L, r[L].d), put_u16(g + 2336 + 2 * L, r[L].dmin);
            if (type == TYPE_Q5_K) pack_high(c, 64, L, g + 2368);
        } else if (type == TYPE_Q6_K) {
            for (int v = 0; v < 16; v++)
                for (int k = 0; k < 4; k++) {
                    const uint8_t *e = c + 16 * v + k;
                    g[2048 + 64 * v + 4 * L + k] =
                        (e[0] >> 4) | ((e[4] >> 4) << 2) | ((e[8] >> 4) << 4) | ((e[12] >> 4) << 6);
                }
            for (int j = 0; j < 16; j++) g[3072 + 32 * (j / 2) + 2 * L + (j & 1)] = r[L].sc[j];
            put_u16(g + 3328 + 2 * L, r[L].d);
        } else {
            if (has_high(type)) pack_high(c, 8, L, g + 256);
            put_u16(g + q32_at_d(type) + 2 * L, r[L].d);
            if (has_min(type)) put_u16(g + q32_at_d(type) + 32 + 2 * L, r[L].dmin);
        }
    }
}

/* Bytes the repacked W takes (0: a type or shape it cannot take). */
int64_t tr_gguf_packed_bytes(int type, int64_t N, int64_t K) {
    const int bv = block_values(type);
    if (group_bytes(type) == 0 || K % bv != 0 || N <= 0) return 0;
    return (N + GROUP - 1) / GROUP * (K / bv) * group_bytes(type);
}

/* W (N rows of GGUF blocks) into the layout above, `out` holding tr_gguf_packed_bytes. */
int tr_gguf_repack(int type, const uint8_t *w, int64_t N, int64_t K, uint8_t *out, int threads) {
    const int64_t size = tr_gguf_packed_bytes(type, N, K);
    if (size == 0) return -1;
    const int bb = block_bytes(type), gb = group_bytes(type);
    const int64_t nb = K / block_values(type), groups = (N + GROUP - 1) / GROUP;
    memset(out, 0, (size_t)size);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t grp = 0; grp < groups; grp++) {
        Decoded r[GROUP];
        for (int64_t b = 0; b < nb; b++) {
            for (int L = 0; L < GROUP; L++) {
                const int64_t n = grp * GROUP + L;
                if (n < N) decode_block(type, w + n * nb * bb + b * bb, &r[L]);
                else memset(&r[L], 0, sizeof r[L]);
            }
            pack_group(type, r, out + (grp * nb + b) * gb);
        }
    }
    return 0;
}

#if TR_AVX512

/* Rows of x per pass: with two sums each, 8 independent chains of vpdpbusd (4 cycles each). */
enum { TILE = 4 };
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

/* One group against `mt` rows of x, `mt` a constant in each copy so the sums stay in registers. */
static void group_fast(int type, const uint8_t *g, const QuantX *x, int64_t K, int64_t m0, int mt, float *out) {
    const int ahead = m0 == 0;
#define ROWS(n)                                                                                                        \
    case n:                                                                                                            \
        switch (type) {                                                                                                \
        case TYPE_Q4_K: group_q45k(TYPE_Q4_K, g, x, K, m0, n, ahead, out); break;                                      \
        case TYPE_Q5_K: group_q45k(TYPE_Q5_K, g, x, K, m0, n, ahead, out); break;                                      \
        case TYPE_Q6_K: group_q6k(g, x, K, m0, n, ahead, out); break;                                                  \
        case TYPE_Q8_0: group_q32(TYPE_Q8_0, g, x, K, m0, n, ahead, out); break;                                       \
        case TYPE_Q4_0: group_q32(TYPE_Q4_0, g, x, K, m0, n, ahead, out); break;                                       \
        case TYPE_Q4_1: group_q32(TYPE_Q4_1, g, x, K, m0, n, ahead, out); break;                                       \
        case TYPE_Q5_0: group_q32(TYPE_Q5_0, g, x, K, m0, n, ahead, out); break;                                       \
        default: group_q32(TYPE_Q5_1, g, x, K, m0, n, ahead, out); break;                                              \
        }                                                                                                              \
        break;
    switch (mt) { ROWS(1) ROWS(2) ROWS(3) ROWS(4) }
#undef ROWS
}

#endif

/* Whether this build has the fast path (1) or only plain C (0). */
int tr_fast_path(void) { return TR_AVX512; }

/* y[M][N] = x[M][K] . W[N][K]^T (+ bias[N]), W repacked by tr_gguf_repack. Returns 0, -1 for a
 * type or shape it cannot take (or a build without the fast path), -2 out of memory. */
int tr_gguf_matmul_packed(int type, const uint8_t *packed, int64_t N, int64_t K, const void *x, int x_bf16, int64_t M,
                          void *y, int y_bf16, const float *bias, int threads) {
#if TR_AVX512
    if (tr_gguf_packed_bytes(type, N, K) == 0 || M <= 0) return -1;
    const int64_t nb = K / block_values(type), groups = (N + GROUP - 1) / GROUP, gb = group_bytes(type);
    QuantX qx;
    if (quantize_x(type, x, x_bf16, K, M, threads, 0, &qx) != 0) {
        free_x(&qx);
        return -2;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t grp = 0; grp < groups; grp++) {
        const uint8_t *g = packed + grp * nb * gb;
        for (int64_t m0 = 0; m0 < M; m0 += TILE) {
            const int mt = M - m0 < TILE ? (int)(M - m0) : TILE;
            float out[TILE * GROUP];
            group_fast(type, g, &qx, K, m0, mt, out);
            for (int L = 0; L < GROUP; L++) {
                const int64_t n = grp * GROUP + L;
                if (n >= N) break;
                const float bn = bias ? bias[n] : 0.0f;
                for (int i = 0; i < mt; i++) store(out[GROUP * i + L] + bn, y_bf16, y, (m0 + i) * N + n);
            }
        }
    }
    free_x(&qx);
    return 0;
#else
    (void)type, (void)packed, (void)N, (void)K, (void)x, (void)x_bf16, (void)M, (void)y, (void)y_bf16, (void)bias,
        (void)threads;
    return -1;
#endif
}

/* ---- a decoder layer's calls, fused: fewer calls and passes over x per layer ----
 *
 * A Llama-style layer around its block matmuls is a dozen small torch ops (RMSNorm, the rotary
 * product, SiLU times up, two residual adds), each a pass over a row and a few microseconds of
 * dispatch: on the demo 1.5B about a quarter of a decode step. tr_gguf_linears computes several
 * weights against one x in one parallel region (q, k and v; gate and up), x normalised first
 * where a norm weight is given and rounded to int8 once per block format, with the epilogue the
 * layer needs: store the outputs side by side, add into y (the residual), or SiLU(gate) * up.
 * Each output row is still computed alone, by the very group kernels tr_gguf_matmul_packed runs:
 * a token's result is the same bits in a step of any rows. */

enum { MAX_LINEARS = 4, EPI_STORE = 0, EPI_ADD = 1, EPI_SILU_MUL = 2 };

static void rms_norm_row(const float *x, const float *w, float eps, int64_t K, float *out) {
    double ss = 0.0; /* double: the sum of 1,536 squares in float loses the norm's last bits */
    for (int64_t k = 0; k < K; k++) ss += (double)x[k] * x[k];
    const float r = 1.0f / sqrtf((float)(ss / (double)K) + eps);
    for (int64_t k = 0; k < K; k++) out[k] = w[k] * (x[k] * r);
}

/* y = the `count` weights' products with x (RMSNorm(x) * norm_w where norm_w is given), per
 * `epilogue`: EPI_STORE writes weight w's N[w] outputs at column sum(N[<w]) of y's rows (ldy
 * apart), plus its bias; EPI_ADD (one weight) adds its output plus bias into y; EPI_SILU_MUL (two
 * weights of the same N) writes silu(x W0^T + b0) * (x W1^T + b1). x and y float32, distinct.
 * Returns 0, -1 for what it cannot take (or a build without the fast path), -2 out of memory. */
int tr_gguf_linears(int count, const int *types, const uint8_t *const *packed, const int64_t *Ns,
                    const float *const *biases, int64_t K, const float *x, int64_t M, const float *norm_w,
                    float eps, float *y, int64_t ldy, int epilogue, int threads) {
#if TR_AVX512
    if (count < 1 || count > MAX_LINEARS || M <= 0) return -1;
    if ((epilogue == EPI_ADD && count != 1) || (epilogue == EPI_SILU_MUL && (count != 2 || Ns[0] != Ns[1])))
        return -1;
    if (epilogue != EPI_STORE && epilogue != EPI_ADD && epilogue != EPI_SILU_MUL) return -1;
    int64_t first[MAX_LINEARS + 1], col[MAX_LINEARS], nb[MAX_LINEARS], gb[MAX_LINEARS];
    int share[MAX_LINEARS]; /* the weight whose rounding of x this one reads */
    first[0] = 0;
    int64_t cols = 0;
    for (int w = 0; w < count; w++) {
        if (tr_gguf_packed_bytes(types[w], Ns[w], K) == 0) return -1;
        nb[w] = K / block_values(types[w]), gb[w] = group_bytes(types[w]), col[w] = cols;
        cols += Ns[w];
        const int64_t groups = (Ns[w] + GROUP - 1) / GROUP;
        first[w + 1] = first[w] + (epilogue == EPI_SILU_MUL && w == 1 ? 0 : groups);
        share[w] = w;
        for (int v = 0; v < w; v++)
            if (block_values(types[v]) == block_values(types[w]) && code_offset(types[v]) == code_offset(types[w])) {
                share[w] = v;
                break;
            }
    }
    float *xn = NULL;
    const float *src = x;
    if (norm_w) {
        xn = malloc(sizeof(float) * (size_t)(M * K));
        if (!xn) return -2;
#pragma omp parallel for schedule(static) num_threads(threads) if (M > 1)
        for (int64_t m = 0; m < M; m++) rms_norm_row(x + m * K, norm_w, eps, K, xn + m * K);
        src = xn;
    }
    QuantX qx[MAX_LINEARS];
    memset(qx, 0, sizeof(qx));
    int rc = 0;
    for (int w = 0; w < count && rc == 0; w++)
        if (share[w] == w) rc = quantize_x(types[w], src, 0, K, M, threads, 0, &qx[w]);
    if (rc == 0) {
        const int64_t items = first[count];
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t item = 0; item < items; item++) {
            int w = 0;
            while (item >= first[w + 1]) w++;
            const int64_t grp = item - first[w];
            const float *b0 = biases[w], *b1 = epilogue == EPI_SILU_MUL ? biases[1] : NULL;
            for (int64_t m0 = 0; m0 < M; m0 += TILE) {
                const int mt = M - m0 < TILE ? (int)(M - m0) : TILE;
                float out[TILE * GROUP], up[TILE * GROUP];
                group_fast(types[w], packed[w] + grp * nb[w] * gb[w], &qx[share[w]], K, m0, mt, out);
                if (epilogue == EPI_SILU_MUL)
                    group_fast(types[1], packed[1] + grp * nb[1] * gb[1], &qx[share[1]], K, m0, mt, up);
                for (int L = 0; L < GROUP; L++) {
                    const int64_t n = grp * GROUP + L;
                    if (n >= Ns[w]) break;
                    for (int i = 0; i < mt; i++) {
                        float *at = y + (m0 + i) * ldy + col[w] + n;
                        const float v = out[GROUP * i + L] + (b0 ? b0[n] : 0.0f);
                        if (epilogue == EPI_STORE) *at = v;
                        else if (epilogue == EPI_ADD) *at = *at + v;
                        else *at = v / (1.0f + expf(-v)) * (up[GROUP * i + L] + (b1 ? b1[n] : 0.0f));
                    }
                }
            }
        }
    }
    for (int w = 0; w < count; w++)
        if (share[w] == w) free_x(&qx[w]);
    free(xn);
    return rc;
#else
    (void)count, (void)types, (void)packed, (void)Ns, (void)biases, (void)K, (void)x, (void)M, (void)norm_w,
        (void)eps, (void)y, (void)ldy, (void)epilogue, (void)threads;
    return -1;
#endif
}

/* In place, the rotary embedding of the first `heads` heads of each of M rows of x (rows `ld`
 * floats apart, heads `dim` apart), in transformers' rotate-half form: for i < dim / 2,
 * (a, b) = (x[i], x[i + dim/2]) becomes (a cos[i] - b sin[i], b cos[i + dim/2] + a sin[i + dim/2]),
 * with cos and sin [M][dim] as the model's rotary module gives them for each row's position. */
__attribute__((optimize("fp-contract=off"))) /* torch's mul and add, each rounded */
void tr_rope(float *x, int64_t M, int64_t ld, int heads, int dim, const float *cos, const float *sin) {
    const int half = dim / 2;
    for (int64_t m = 0; m < M; m++) {
        const float *c = cos + m * dim, *s = sin + m * dim;
        for (int h = 0; h < heads; h++) {
            float *v = x + m * ld + (int64_t)h * dim;
            for (int i = 0; i < half; i++) {
                const float a = v[i], b = v[i + half];
                const float ac = a * c[i], bs = b * s[i], bc = b * c[i + half], as = a * s[i + half];
                v[i] = ac - bs, v[i + half] = bc + as;
            }
        }
    }
}

/* ---- a decoder's layers in one call ----
 *
 * FusedDecoder's layer is six calls (q, k and v with the norm; the rotary product; the KV write
 * and attention; o into the residual; gate and up with the norm; down into the residual), each
 * through ctypes and a few torch ops of Python around it: about 1 ms of the demo 1.5B's 30 ms
 * decode step and of the 0.5B's 12. tr_decoder_layers runs a stack of such layers on the same
 * kernels in the same order, so each output is the same bits: tr_gguf_linears for the four
 * weight groups, tr_rope, the new K and V rounded into the paged cache as torch's conversion
 * rounds them, and the attention kernel of paged_kernels.c (a separate library: its function
 * is passed in). */

typedef struct { /* one tr_gguf_linears call: its weights and epilogue */
    int count, epilogue;
    int types[MAX_LINEARS];
    const uint8_t *packed[MAX_LINEARS];
    int64_t Ns[MAX_LINEARS];
    const float *biases[MAX_LINEARS];
    const float *norm_w;
    float eps;
    int64_t K, out_features;
} TrLinears;

typedef struct {
    TrLinears qkv, o, gate_up, down;
    void *k_cache, *v_cache; /* [slots][kv_heads][head_dim] of kv_kind */
    int window;              /* sliding window, 0: none */
} TrLayer;

typedef int (*TrAttention)(const void *q, int64_t q_stride_t, int64_t q_stride_h, void *out, int act_bf16,
                           const void *k, const void *v, int kv_kind, int64_t cache_blocks, int64_t tokens, int heads,
                           int kv_heads, int dim, const int32_t *token_row, const int32_t *token_keys,
                           const int32_t *tables, int64_t rows, int64_t table_width, int block_size, int window,
                           float scale, int threads);

static int linears_call(const TrLinears *l, const float *x, int64_t M, float *y, int threads) {
    return tr_gguf_linears(l->count, l->types, l->packed, l->Ns, l->biases, l->K, x, M, l->norm_w, l->eps, y,
                           l->out_features, l->epilogue, threads);
}

static uint16_t f32_to_f16(float f) { /* round to nearest even, as torch converts */
#if TR_AVX512
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    (void)f;
    return 0; /* unreachable: tr_decoder_layers needs the fast path */
#endif
}

/* n values of src into the cache at element `at`, in kind (0 float32, 1 bfloat16, 2 float16). */
static void put_kv(void *cache, int kind, int64_t at, const float *src, int64_t n) {
    if (kind == 0) {
        memcpy((float *)cache + at, src, sizeof(float) * (size_t)n);
        return;
    }
    uint16_t *dst = (uint16_t *)cache + at;
    for (int64_t i = 0; i < n; i++) dst[i] = kind == 2 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
}

/* h [T][hidden] float32, in place, through `count` layers. cos, sin [T][head_dim]; slots [T] the
 * cache slot of each token; token_row, token_keys, tables, rows, table_width, block_size and
 * cache_blocks as tr_paged_attention takes them. Scratch: qkv [T][(heads + 2 kv_heads) head_dim],
 * attn [T][heads head_dim], act [T][the MLP's width]. Returns 0, -1 for bad arguments (a slot
 * outside the cache, widths that do not chain) or a build without the fast path, else the code of
 * the call that failed. */
int tr_decoder_layers(const TrLayer *layers, int count, float *h, int64_t T, const float *cos, const float *sin,
                      const int64_t *slots, int heads, int kv_heads, int head_dim, float scale, TrAttention attention,
                      int kv_kind, int64_t cache_blocks, const int32_t *token_row, const int32_t *token_keys,
                      const int32_t *tables, int64_t rows, int64_t table_width, int block_size, float *qkv,
                      float *attn, float *act, int threads) {
#if TR_AVX512
    if (count < 0 || T <= 0 || heads <= 0 || kv_heads <= 0 || head_dim <= 0 || kv_kind < 0 || kv_kind > 2) return -1;
    const int64_t q_width = (int64_t)heads * head_dim, kv_width = (int64_t)kv_heads * head_dim;
    const int64_t qkv_width = q_width + 2 * kv_width;
    for (int64_t t = 0; t < T; t++)
        if (slots[t] < 0 || slots[t] >= cache_blocks * block_size) return -1;
    for (int i = 0; i < count; i++) {
        const TrLayer *L = &layers[i];
        if (L->qkv.out_features != qkv_width || L->o.out_features != L->qkv.K || L->down.out_features != L->qkv.K)
            return -1;
        int rc = linears_call(&L->qkv, h, T, qkv, threads);
        if (rc != 0) return rc;
        tr_rope(qkv, T, qkv_width, heads + kv_heads, head_dim, cos, sin);
        for (int64_t t = 0; t < T; t++) {
            put_kv(L->k_cache, kv_kind, slots[t] * kv_width, qkv + t * qkv_width + q_width, kv_width);
            put_kv(L->v_cache, kv_kind, slots[t] * kv_width, qkv + t * qkv_width + q_width + kv_width, kv_width);
        }
        rc = attention(qkv, qkv_width, head_dim, attn, 0, L->k_cache, L->v_cache, kv_kind, cache_blocks, T, heads,
                       kv_heads, head_dim, token_row, token_keys, tables, rows, table_width, block_size, L->window,
                       scale, threads);
        if (rc != 0) return rc;
        if ((rc = linears_call(&L->o, attn, T, h, threads)) != 0) return rc;
        if ((rc = linears_call(&L->gate_up, h, T, act, threads)) != 0) return rc;
        if ((rc = linears_call(&L->down, act, T, h, threads)) != 0) return rc;
    }
    return 0;
#else
    (void)layers, (void)count, (void)h, (void)T, (void)cos, (void)sin, (void)slots, (void)heads, (void)kv_heads,
        (void)head_dim, (void)scale, (void)attention, (void)kv_kind, (void)cache_blocks, (void)token_row,
        (void)token_keys, (void)tables, (void)rows, (void)table_width, (void)block_size, (void)qkv, (void)attn,
        (void)act, (void)threads;
    return -1;
#endif
}
