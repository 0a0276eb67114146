/* Paged attention on CPU, one query at a time, so that a query's result is the same bits in any step.
 *
 * A query's output depends only on its own vector and the K/V of the keys it attends to: never on
 * the other queries or rows in the call, nor on how wide the call's widest row is. torch's CPU SDPA
 * tiles keys and queries by the call's shapes, so the same token computed in a decode step, in a
 * verifier's check of k drafts, or in a prefill got other bits (docs/evaluation.md, "A row's result
 * must not depend on its step"), and greedy Speculative was not always its target's own output.
 * Here every sum runs in one fixed order, set by the level (L lanes: 16 at AVX512, NEON and in
 * plain C, 8 at AVX2), and the rule holds at every level:
 *   - a score sums q_c * k_c with dimension c in lane c % L, each lane in increasing c, then adds
 *     the lanes by halves (lane i + lane i + L/2 for i < L/2, again down to lane 0 + lane 1: the
 *     order of _mm512_reduce_add_ps);
 *   - softmax's denominator sums key j in lane j % L, blocks of L counted from key 0 (not from the
 *     first key a sliding window lets in), each lane in increasing j, then adds the lanes by halves;
 *     exp is Cephes' expf (range reduction by ln 2, degree-6 polynomial) at every level; the max
 *     has no order (a NaN never wins);
 *   - the output accumulates p_j * v_j over keys in increasing j, each dimension its own sum, then
 *     divides it by the denominator.
 * The vector levels fuse each product into its sum (AVX2 and AVX512 compute the same bits for the
 * output); plain C rounds each product before adding it, on every CPU (paged.c keeps compilers
 * from fusing them), so that the plain level is the same bits on x86 and ARM64 whatever vectors
 * the compiler uses. Work is split over (query, KV head) pairs, each computed whole by one thread.
 * How a level blocks its loops (heads, keys, vectors or rows a pass, reductions done together)
 * never changes a sum's order. The levels differ in the last bits (L, fused or not); a level's
 * result never depends on the call.
 *
 * q [tokens, heads, head_dim] (strides given, the last dimension contiguous), K and V caches
 * [slots, kv_heads, head_dim] contiguous, slot = table[row][j / block_size] * block_size +
 * j % block_size. q and out float32 or bf16; K and V float32, bf16 or float16 (llama.cpp's KV type);
 * every product and sum in float32. A query attends to keys [lo, keys) of its row,
 * lo = keys - window where a sliding window applies.
 *
 * The files, as ggml-cpu lays out its own:
 *   paged.c            the arguments checked, the split over (query, KV head) pairs, and the plain-C
 *                      loops (TR_LEVEL 0, any CPU), written for the compiler to vectorize: each sum
 *                      held in an array of 16 floats: tr_paged_attention, tr_attention_level
 *   arch/x86_avx2.c    the loops with AVX2, FMA and F16C (TR_LEVEL 1): 8 lanes, the tails copied
 *                      or summed one value at a time (no masked 16-bit loads)
 *   arch/x86_avx512.c  the loops with AVX512 (TR_LEVEL 2): 16 lanes, masked loads for the tails
 *   arch/arm_neon.c    the loops with ARM64's NEON (TR_LEVEL 3, and 4 and 5, which add nothing for
 *                      attention): 16 lanes as four float32x4_t, fused: AVX512's bits; q copied
 *                      into rows padded with zeros, the tails read one value at a time
 * build.py compiles them all with -DTR_LEVEL=<n>; exactly one file's attend_level computes.
 */
#ifndef TR_PAGED_H
#define TR_PAGED_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../level.h"

/* A row of scores is this many floats apart from the next, rounded up: a whole number of vectors
 * at every level, so a block of keys counted from 0 never runs past its row. */
#define SCORE_ALIGN 16
#define HEADS_AT_ONCE 8 /* query heads of one KV head per pass: their accumulators stay in registers */

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch converts */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h) { /* exact, as F16C converts; no branch, so loops of it vectorize */
    const int32_t a = h & 0x7fff; /* signed: SSE2 compares int32 only */
    const int32_t top = 0 - (a >= 0x7c00), small = 0 - (a < 0x400); /* all ones where so */
    /* the exponent rebiased (twice for infinity and NaN: 255); zero or subnormal: a * 2^-24, exact */
    const int32_t normal = (a << 13) + (112 << 23) + (top & (112 << 23));
    const float tiny = (float)a * 0x1p-24f;
    uint32_t u;
    memcpy(&u, &tiny, 4);
    /* masks, not ?: (gcc would move the float ops into a branch, which it cannot then vectorize) */
    u = (uint32_t)(h & 0x8000) << 16 | (u & (uint32_t)small) | (uint32_t)(normal & ~small);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

enum { KIND_F32 = 0, KIND_BF16 = 1, KIND_F16 = 2 }; /* how a tensor's values are stored */
/* call(..., kind) with the storage kind a constant: a vector level's loops compiled per kind */
#define BY_KIND(call, ...)                                                                                             \
    switch (kind) {                                                                                                    \
    case KIND_F32: call(__VA_ARGS__, KIND_F32); break;                                                                 \
    case KIND_BF16: call(__VA_ARGS__, KIND_BF16); break;                                                               \
    default: call(__VA_ARGS__, KIND_F16); break;                                                                       \
    }

static inline float load1(const void *p, int64_t i, int kind) {
    if (kind == KIND_BF16) return bf16_to_f32(((const uint16_t *)p)[i]);
    if (kind == KIND_F16) return f16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

typedef struct {
    const void *q;
    void *out;
    int act_bf16;
    const void *k;
    const void *v;
    int kv_kind;
    int heads, kv_heads, dim;
    int64_t q_stride_t, q_stride_h;
    const int32_t *token_row, *token_keys, *tables;
    int64_t table_width;
    int block_size, window;
    float scale;
} Problem;

/* Floats of scratch a level's loops may use after q (plain C: q again and 4 rows of K or V, in
 * rows padded to 16 floats, then g rows of out; NEON: q again in rows padded to 16 floats). */
#define PADDED(d) (((d) + 15) / 16 * 16)
#define LEVEL_SCRATCH(g, d)                                                                                            \
    (TR_LEVEL == TR_PLAIN ? (int64_t)((g) + 4) * PADDED(d) + (int64_t)(g) * (d)                                        \
     : TR_ARM             ? (int64_t)(g) * PADDED(d)                                                                   \
                          : 0)

/* One query's g = heads / kv_heads heads of KV head kvh, keys [lo, n) at `slots` (their K/V
 * element offsets are slots[j] * dim), q as g * dim floats in `qf`: writes their rows of out.
 * Scratch: `scores`, g rows of `width` floats (at least n rounded up to SCORE_ALIGN), `sum`, g floats,
 * which qf follows, then LEVEL_SCRATCH(g, dim) floats. The level's file defines it (paged.c at
 * TR_LEVEL 0). */
TR_INTERNAL void attend_level(const Problem *pr, int64_t t, int kvh, int64_t lo, int64_t n, int64_t width,
                              const int64_t *slots, const float *qf, float *scores, float *sum);

/* out[t][head][c, c + count) from `o` (count floats), in out's dtype. */
static inline void store_out(const Problem *pr, int64_t t, int head, int c, const float *o, int count) {
    const int64_t oi = (t * pr->heads + head) * (int64_t)pr->dim + c;
    if (pr->act_bf16)
        for (int l = 0; l < count; l++) ((uint16_t *)pr->out)[oi + l] = f32_to_bf16(o[l]);
    else memcpy((float *)pr->out + oi, o, sizeof(float) * (size_t)count);
}

#endif
