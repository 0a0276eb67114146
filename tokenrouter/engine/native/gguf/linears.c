/* The repacked W computed by the level's group kernels: a matmul, several weights against one x
 * with a decoder layer's epilogue, and the rotary product.
 */
#include <math.h>
#include <stdlib.h>

#include "../parallel.h"
#include "blocks.h"

/* The level this build computes at: level.h's number (0 plain C, 1 AVX2, 2 AVX512 VNNI, 3-5 ARM64's). */
int tr_level(void) { return TR_LEVEL; }

typedef struct { /* tr_gguf_matmul_packed's groups of 16 rows of W: what each needs */
    int type;
    const uint8_t *packed;
    int64_t N, K, M, group_size;
    const QuantX *qx;
    void *y;
    int y_bf16;
    const float *bias;
} PackedGroups;

static void packed_group(const void *ctx, int64_t grp) { /* one group against every row of x */
    const PackedGroups *j = ctx;
    const int64_t M = j->M, N = j->N;
    const uint8_t *g = j->packed + grp * j->group_size;
    for (int64_t m0 = 0; m0 < M; m0 += TILE) {
        const int mt = M - m0 < TILE ? (int)(M - m0) : TILE;
        float out[TILE * GROUP];
        group_kernel(j->type, g, j->qx, j->K, m0, mt, out);
        for (int L = 0; L < GROUP; L++) {
            const int64_t n = grp * GROUP + L;
            if (n >= N) break;
            const float bn = j->bias ? j->bias[n] : 0.0f;
            for (int i = 0; i < mt; i++) store_y(out[GROUP * i + L] + bn, j->y_bf16, j->y, (m0 + i) * N + n);
        }
    }
}

/* y[M][N] = x[M][K] . W[N][K]^T (+ bias[N]), W repacked by tr_gguf_repack. Returns 0, -1 for a
 * type or shape it cannot take, -2 out of memory. */
int tr_gguf_matmul_packed(int type, const uint8_t *packed, int64_t N, int64_t K, const void *x, int x_bf16, int64_t M,
                          void *y, int y_bf16, const float *bias, int threads) {
    if (tr_gguf_packed_bytes(type, N, K) == 0 || M <= 0) return -1;
    const int64_t nb = K / block_values(type), groups = (N + GROUP - 1) / GROUP, gb = group_bytes(type);
    QuantX qx;
    if (quantize_x(type, x, x_bf16, K, M, threads, quantize_row_level, &qx) != 0) {
        free_x(&qx);
        return -2;
    }
    const PackedGroups job = {type, packed, N, K, M, nb * gb, &qx, y, y_bf16, bias};
    TR_PARALLEL_FOR(groups, threads, packed_group, &job);
    free_x(&qx);
    return 0;
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

enum { EPI_STORE = 0, EPI_ADD = 1, EPI_SILU_MUL = 2 };

static void rms_norm_row(const float *x, const float *w, float eps, int64_t K, float *out) {
    double ss = 0.0; /* double: the sum of 1,536 squares in float loses the norm's last bits */
    for (int64_t k = 0; k < K; k++) ss += (double)x[k] * x[k];
    const float r = 1.0f / sqrtf((float)(ss / (double)K) + eps);
    for (int64_t k = 0; k < K; k++) out[k] = w[k] * (x[k] * r);
}

typedef struct { /* tr_gguf_linears' RMSNorm of x's rows */
    const float *x, *w;
    float eps;
    int64_t K;
    float *out;
} NormRows;

static void norm_row(const void *ctx, int64_t m) {
    const NormRows *j = ctx;
    rms_norm_row(j->x + m * j->K, j->w, j->eps, j->K, j->out + m * j->K);
}

typedef struct { /* tr_gguf_linears' items (a group of 16 rows of one weight): what each needs */
    const int *types;
    const uint8_t *const *packed;
    const int64_t *Ns;
    const float *const *biases;
    int64_t K, M;
    float *y;
    int64_t ldy;
    int epilogue;
    const int64_t *first, *col, *nb, *gb;
    const int *share;
    const QuantX *qx;
} LinearItems;

static void linear_item(const void *ctx, int64_t item) {
    const LinearItems *j = ctx;
    const int64_t M = j->M, K = j->K;
    const int epilogue = j->epilogue;
    int w = 0;
    while (item >= j->first[w + 1]) w++;
    const int64_t grp = item - j->first[w];
    const float *b0 = j->biases[w], *b1 = epilogue == EPI_SILU_MUL ? j->biases[1] : NULL;
    for (int64_t m0 = 0; m0 < M; m0 += TILE) {
        const int mt = M - m0 < TILE ? (int)(M - m0) : TILE;
        float out[TILE * GROUP], up[TILE * GROUP];
        group_kernel(j->types[w], j->packed[w] + grp * j->nb[w] * j->gb[w], &j->qx[j->share[w]], K, m0, mt, out);
        if (epilogue == EPI_SILU_MUL)
            group_kernel(j->types[1], j->packed[1] + grp * j->nb[1] * j->gb[1], &j->qx[j->share[1]], K, m0, mt, up);
        for (int L = 0; L < GROUP; L++) {
            const int64_t n = grp * GROUP + L;
            if (n >= j->Ns[w]) break;
            for (int i = 0; i < mt; i++) {
                float *at = j->y + (m0 + i) * j->ldy + j->col[w] + n;
                const float v = out[GROUP * i + L] + (b0 ? b0[n] : 0.0f);
                if (epilogue == EPI_STORE) *at = v;
                else if (epilogue == EPI_ADD) *at = *at + v;
                else *at = v / (1.0f + expf(-v)) * (up[GROUP * i + L] + (b1 ? b1[n] : 0.0f));
            }
        }
    }
}

/* y = the `count` weights' products with x (RMSNorm(x) * norm_w where norm_w is given), per
 * `epilogue`: EPI_STORE writes weight w's N[w] outputs at column sum(N[<w]) of y's rows (ldy
 * apart), plus its bias; EPI_ADD (one weight) adds its output plus bias into y; EPI_SILU_MUL (two
 * weights of the same N) writes silu(x W0^T + b0) * (x W1^T + b1). x and y float32, distinct.
 * Returns 0, -1 for what it cannot take, -2 out of memory. */
int tr_gguf_linears(int count, const int *types, const uint8_t *const *packed, const int64_t *Ns,
                    const float *const *biases, int64_t K, const float *x, int64_t M, const float *norm_w,
                    float eps, float *y, int64_t ldy, int epilogue, int threads) {
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
        const NormRows norm = {x, norm_w, eps, K, xn};
        TR_PARALLEL_FOR_IF(M > 1, M, threads, norm_row, &norm);
        src = xn;
    }
    QuantX qx[MAX_LINEARS];
    memset(qx, 0, sizeof(qx));
    int rc = 0;
    for (int w = 0; w < count && rc == 0; w++)
        if (share[w] == w) rc = quantize_x(types[w], src, 0, K, M, threads, quantize_row_level, &qx[w]);
    if (rc == 0) {
        const int64_t items = first[count];
        const LinearItems job = {types, packed, Ns, biases, K, M, y, ldy, epilogue, first, col, nb, gb, share, qx};
        TR_PARALLEL_FOR(items, threads, linear_item, &job);
    }
    for (int w = 0; w < count; w++)
        if (share[w] == w) free_x(&qx[w]);
    free(xn);
    return rc;
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
