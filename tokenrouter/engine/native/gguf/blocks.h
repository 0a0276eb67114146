/* The GGUF block kernels' shared header: the block formats, x rounded to int8, and the level.
 *
 * y = x W^T + b with W in a GGUF file's own quantized blocks, on the CPU, as llama.cpp computes it:
 * each row of x is quantized to int8, per block of 256 values for the K-quant weights (Q4_K, Q5_K,
 * Q6_K: one float scale and the sums of each 16 codes) and per block of 32 for the others (Q4_0,
 * Q4_1, Q5_0, Q5_1, Q8_0), and the dot products run on the integer codes, scaled once per block. A
 * decode step then reads 4.5-8.5 bits a weight and computes in int8.
 *
 * The files, as ggml-cpu lays out its own:
 *   reference.c      plain C on the file's own blocks (tr_gguf_matmul): what the tests hold every
 *                    other path to; x's rounding; table rows dequantized (tr_gguf_rows)
 *   repack.c         the group layout: W repacked once at load, 16 rows interleaved (tr_gguf_repack)
 *   generic.c        the group kernels in plain C, for any CPU (TR_LEVEL 0)
 *   arch/x86_avx2.c  the group kernels with AVX2 (TR_LEVEL 1): maddubs and madd, 8 rows a vector
 *   arch/x86_avx512.c  with AVX512 VNNI (TR_LEVEL 2): vpdpbusd, 16 rows a vector
 *   arch/arm_neon.c  ARM64's (TR_LEVEL 3-5), 4 rows a vector: NEON's widening multiplies (3), sdot
 *                    (4: dotprod), smmla on two rows of x at a time (5: i8mm); one file, the levels
 *                    differ only in how 8 codes meet 8 values of x
 *   arch/group_kernel.h  the dispatch over type and rows every vector level includes
 *   linears.c        the packed matmul, several weights against one x with a layer's epilogue
 *                    (tr_gguf_linears), the rotary product (tr_rope)
 *   layers.c         a decoder's layers in one call (tr_decoder_layers)
 * build.py compiles them all with -DTR_LEVEL=<n>; exactly one group-kernel file computes.
 *
 * At every level a row of y is computed alone, in an order fixed by the level: its result is the
 * same bits in a call of any rows, any tile and any thread count. The integer sums are exact, so
 * the levels differ only where float rounding does: the vector levels, x86's and ARM64's, scale
 * each block with the same fused multiply-adds in the same order (the same bits), plain C with a
 * multiply and an add unless its compiler fuses them.
 */
#ifndef TR_GGUF_BLOCKS_H
#define TR_GGUF_BLOCKS_H

#include <stdint.h>
#include <string.h>

#include "../level.h"

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

enum { GROUP = 16, TILE = 4 }; /* rows of W in a repacked group; rows of x a group kernel takes per pass */

static inline int block_bytes(int type) {
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

static inline int block_values(int type) {
    return type == TYPE_Q4_K || type == TYPE_Q5_K || type == TYPE_Q6_K ? 256 : 32;
}

/* Q8_0: 32 weights = d (fp16), 32 int8 codes. The other 32-blocks: d, then m (fp16: Q4_1, Q5_1),
 * then 32 high bits (Q5_0, Q5_1), then 16 bytes of low nibbles (first 16 weights low, last 16
 * high); w = d * (q - 8) (Q4_0), d * (q - 16) (Q5_0), d * q + m (Q4_1, Q5_1). */
static inline int has_min(int type) { return type == TYPE_Q4_1 || type == TYPE_Q5_1; }
static inline int has_high(int type) { return type == TYPE_Q5_0 || type == TYPE_Q5_1; }
static inline int code_offset(int type) {
    return type == TYPE_Q8_0 ? 128 : type == TYPE_Q5_0 ? 16 : type == TYPE_Q4_0 ? 8 : 0;
}

static inline float fp16_to_f32(uint16_t h) {
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

static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1);                                         /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static inline uint16_t read_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* ---- x quantized to int8: per row, blocks of `block` values, each with a float scale ---- */

typedef struct {
    int8_t *q;       /* [M][K] */
    float *d;        /* [M][K / block] */
    int16_t *bsums;  /* [M][K / 16]: sums of each 16 codes (K-quants: Q6_K's offset of 32) */
    int16_t *bsum32; /* [M][K / 32]: sums of each 32 codes (Q4_K's and Q5_K's mins; Q4_1's and Q5_1's) */
    int32_t *xo;     /* [M][K / 32]: -offset * each 32 codes' sum (Q8_0's, Q5_0's and Q4_0's unsigned codes) */
} QuantX;

/* One row of x (float32 or bf16) rounded: max |x| / 127 a block, x * 127 / max rounded to nearest
 * even; the sums of codes the block type needs (`offset` != 0: xo, else bsums and bsum32). The
 * level's own (arch files, generic.c) gives the same integers and scales as the plain one. */
typedef void (*QuantizeRow)(const void *x, int x_bf16, int64_t K, int block, int offset, int8_t *q, float *d,
                            int16_t *bsums, int16_t *bsum32, int32_t *xo);
TR_INTERNAL void quantize_row(const void *x, int x_bf16, int64_t K, int block, int offset, int8_t *q, float *d,
                              int16_t *bsums, int16_t *bsum32, int32_t *xo);
TR_INTERNAL void quantize_row_level(const void *x, int x_bf16, int64_t K, int block, int offset, int8_t *q, float *d,
                                    int16_t *bsums, int16_t *bsum32, int32_t *xo);

/* M rows of x rounded for blocks of `type` (in parallel where M > 1), by `row`. 0, or -2 out of memory. */
TR_INTERNAL int quantize_x(int type, const void *x, int x_bf16, int64_t K, int64_t M, int threads, QuantizeRow row,
                           QuantX *qx);
TR_INTERNAL void free_x(QuantX *qx);

/* y[at] = v in float32 or bf16 (`y_bf16`). */
static inline void store_y(float v, int y_bf16, void *y, int64_t at) {
    if (y_bf16) ((uint16_t *)y)[at] = f32_to_bf16(v);
    else ((float *)y)[at] = v;
}

/* ---- one block of one row, decoded (repack.c): its codes (unsigned), scales and fp16 scale bits
 * (`dmin`: Q4_1's and Q5_1's m) ---- */
typedef struct {
    uint8_t code[256];
    uint8_t sc[16], mn[8];
    uint16_t d, dmin;
} Decoded;

TR_INTERNAL void q4k_scales(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]);
TR_INTERNAL void decode_block(int type, const uint8_t *w, Decoded *o);

/* ---- the repacked layout (repack.c has its map) and the level's kernels over it ---- */

/* Bytes of one group (16 rows) of one block; 0 for a type the layout does not take. */
static inline int group_bytes(int type) {
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

/* 16 rows of W (the group at `g`, K / block_values(type) blocks) against rows m0..m0+mt-1 of x
 * (mt <= TILE): out[GROUP * i + L] = row m0 + i of x times row L of the group. The level's file
 * defines it. */
TR_INTERNAL void group_kernel(int type, const uint8_t *g, const QuantX *x, int64_t K, int64_t m0, int mt, float *out);

int64_t tr_gguf_packed_bytes(int type, int64_t N, int64_t K);

/* ---- linears.c's calls, which layers.c makes ---- */
enum { MAX_LINEARS = 4 }; /* weights in one tr_gguf_linears call */
int tr_gguf_linears(int count, const int *types, const uint8_t *const *packed, const int64_t *Ns,
                    const float *const *biases, int64_t K, const float *x, int64_t M, const float *norm_w,
                    float eps, float *y, int64_t ldy, int epilogue, int threads);
void tr_rope(float *x, int64_t M, int64_t ld, int heads, int dim, const float *cos, const float *sin);

#endif
