/* The plain C reference: x rounded to int8, and y = x W^T on W as the GGUF file holds it.
 *
 * What any CPU can run, and what the tests hold every level's group kernels to: one dot product a
 * block, the integer sums scaled per block as llama.cpp does. The engine serves from the repacked
 * layout (repack.c) with the level's kernels; this path is the arithmetic written plainly.
 */
#include <math.h>
#include <stdlib.h>

#include "../parallel.h"
#include "blocks.h"

/* ---- x rounded to int8 ---- */

TR_INTERNAL void quantize_row(const void *x, int x_bf16, int64_t K, int block, int offset, int8_t *q, float *d,
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

TR_INTERNAL void q4k_scales(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]) {
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

/* ---- the 32-blocks (blocks.h has their format) ---- */

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

/* ---- x rounded to int8 for M rows at once (in parallel where M > 1) ---- */

typedef struct { /* quantize_x's rows: what each needs */
    QuantizeRow row;
    const void *x;
    size_t esize;
    int x_bf16;
    int64_t K;
    int bv, offset;
    QuantX *qx;
} QuantizeRows;

static void quantize_one(const void *ctx, int64_t m) {
    const QuantizeRows *j = ctx;
    const int64_t K = j->K, nb = K / j->bv;
    QuantX *qx = j->qx;
    j->row((const char *)j->x + m * K * j->esize, j->x_bf16, K, j->bv, j->offset, qx->q + m * K, qx->d + m * nb,
           qx->bsums + m * (K / 16), qx->bsum32 + m * (K / 32), qx->xo + m * (K / 32));
}

TR_INTERNAL int quantize_x(int type, const void *x, int x_bf16, int64_t K, int64_t M, int threads, QuantizeRow row,
                           QuantX *qx) {
    const int bv = block_values(type);
    const int64_t nb = K / bv;
    qx->q = malloc((size_t)(M * K));
    qx->d = malloc(sizeof(float) * (size_t)(M * nb));
    qx->bsums = malloc(sizeof(int16_t) * (size_t)(M * (K / 16)));
    qx->bsum32 = malloc(sizeof(int16_t) * (size_t)(M * (K / 32)));
    qx->xo = malloc(sizeof(int32_t) * (size_t)(M * (K / 32)));
    if (!qx->q || !qx->d || !qx->bsums || !qx->bsum32 || !qx->xo) return -2;
    const QuantizeRows job = {row, x, x_bf16 ? 2 : 4, x_bf16, K, bv, code_offset(type), qx};
    TR_PARALLEL_FOR_IF(M > 1, M, threads, quantize_one, &job);
    return 0;
}

TR_INTERNAL void free_x(QuantX *qx) { free(qx->q), free(qx->d), free(qx->bsums), free(qx->bsum32), free(qx->xo); }

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

typedef struct { /* tr_gguf_matmul's rows of W: what each needs */
    int type;
    const uint8_t *w;
    int64_t row_bytes, N, K, M;
    const QuantX *qx;
    void *y;
    int y_bf16;
    const float *bias;
} MatmulRows;

static void matmul_row(const void *ctx, int64_t n) { /* W's row n against every row of x */
    const MatmulRows *j = ctx;
    for (int64_t m = 0; m < j->M; m++) {
        float out;
        rows_ref(j->type, j->w + n * j->row_bytes, j->qx, j->K, m, &out);
        store_y(out + (j->bias ? j->bias[n] : 0.0f), j->y_bf16, j->y, m * j->N + n);
    }
}

/* y[M][N] = x[M][K] . W[N][K]^T (+ bias[N]) in plain C, W as the GGUF file holds it: N rows of
 * K / block_values(type) blocks. x and y are float32 or bf16 (the flags). What the tests hold
 * the repacked path to. Returns 0, -1 for a type or shape it cannot take, -2 out
 * of memory. */
int tr_gguf_matmul(int type, const uint8_t *w, int64_t N, int64_t K, const void *x, int x_bf16, int64_t M, void *y,
                   int y_bf16, const float *bias, int threads) {
    const int bb = block_bytes(type), bv = block_values(type);
    if (bb == 0 || K % bv != 0 || N <= 0 || M <= 0) return -1;
    QuantX qx;
    if (quantize_x(type, x, x_bf16, K, M, threads, quantize_row, &qx) != 0) {
        free_x(&qx);
        return -2;
    }
    const MatmulRows job = {type, w, K / bv * bb, N, K, M, &qx, y, y_bf16, bias};
    TR_PARALLEL_FOR(N, threads, matmul_row, &job);
    free_x(&qx);
    return 0;
}
