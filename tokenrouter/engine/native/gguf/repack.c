/* W repacked once at load, 16 rows at a time: the layout every level's group kernels read.
 *
 * A decode step of few rows reads each weight once, so it wants few bytes a weight; a step of 16
 * rows wants few instructions a product. Both at once: 16 rows of W interleaved, row L in the 4
 * bytes at 4L of every 64, so that a vector instruction multiplies 4 codes of each of 16 rows (one
 * 512-bit vector, AVX512 VNNI's vpdpbusd), 8 rows (each half of the 64 bytes, AVX2's maddubs and
 * madd) or 4 (a 128-bit quarter) by the same 4 int8 values of a row of x (broadcast) and adds them
 * up: no horizontal sums, and each block's float scaling done once for a vector of rows. The
 * repacked W is the file's size give or take the scales (Q4_K 148 bytes a block instead of 144,
 * Q5_K 180 instead of 176, the others equal); rows past N pad the last group with zeros. The
 * arithmetic is the same integer sums as the plain path's, scaled per block as llama.cpp does.
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
#include <stdlib.h>

#include "../parallel.h"
#include "blocks.h"

/* One block of one row decoded into its codes (unsigned), scales and fp16 scale bits. */
TR_INTERNAL void decode_block(int type, const uint8_t *w, Decoded *o) {
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

typedef struct { /* tr_gguf_repack's groups of 16 rows: what each needs */
    int type;
    const uint8_t *w;
    int64_t N, nb;
    int bb, gb;
    uint8_t *out;
} RepackGroups;

static void repack_group(const void *ctx, int64_t grp) {
    const RepackGroups *j = ctx;
    Decoded r[GROUP];
    for (int64_t b = 0; b < j->nb; b++) {
        for (int L = 0; L < GROUP; L++) {
            const int64_t n = grp * GROUP + L;
            if (n < j->N) decode_block(j->type, j->w + n * j->nb * j->bb + b * j->bb, &r[L]);
            else memset(&r[L], 0, sizeof r[L]);
        }
        pack_group(j->type, r, j->out + (grp * j->nb + b) * j->gb);
    }
}

/* W (N rows of GGUF blocks) into the layout above, `out` holding tr_gguf_packed_bytes. */
int tr_gguf_repack(int type, const uint8_t *w, int64_t N, int64_t K, uint8_t *out, int threads) {
    const int64_t size = tr_gguf_packed_bytes(type, N, K);
    if (size == 0) return -1;
    memset(out, 0, (size_t)size);
    const RepackGroups job = {type, w, N, K / block_values(type), block_bytes(type), group_bytes(type), out};
    TR_PARALLEL_FOR((N + GROUP - 1) / GROUP, threads, repack_group, &job);
    return 0;
}
