/* Rows of a table dequantized: an embedding's looked-up tokens.
 *
 * What gguf-py's reference dequantization computes, to the bit: each block's float scales from
 * its fp16 ones, then w = (d * scale) * code - (dmin * min) for the K-quants with mins, d * code
 * (+ m) for the others, each product and sum rounded to float on its own (no fused multiply-add,
 * which -march=native would otherwise contract them into). Plain C: a step looks up a few rows;
 * gguf-py's numpy took 0.37 ms of the demo 1.5B's 36 ms decode step for one.
 */
#include "blocks.h"

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
