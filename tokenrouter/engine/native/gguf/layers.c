/* A decoder's layers in one call.
 *
 * FusedDecoder's layer is six calls (q, k and v with the norm; the rotary product; the KV write
 * and attention; o into the residual; gate and up with the norm; down into the residual), each
 * through ctypes and a few torch ops of Python around it: about 1 ms of the demo 1.5B's 30 ms
 * decode step and of the 0.5B's 12. tr_decoder_layers runs a stack of such layers on the same
 * kernels in the same order, so each output is the same bits: tr_gguf_linears for the four
 * weight groups, tr_rope, the new K and V rounded into the paged cache as torch's conversion
 * rounds them, and the paged attention kernel (paged_attention/, a library of its own: its
 * function is passed in).
 */
#include <math.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

#include "blocks.h"

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
#ifdef __F16C__
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return sign | 0x7e00u;          /* NaN */
    if (u >= 0x477ff000u) return sign | 0x7c00u;         /* 65520 and up round to infinity */
    if (u < 0x38800000u) {                               /* below 2^-14: a subnormal half (or 0) */
        float a;
        memcpy(&a, &u, 4);
        return sign | (uint16_t)nearbyintf(a * 16777216.0f); /* exact scaling, then to nearest even */
    }
    return sign | (uint16_t)((u + 0xfffu + ((u >> 13) & 1u) - (112u << 23)) >> 13); /* rebias, round */
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
 * outside the cache, widths that do not chain), else the code of the call that failed. */
int tr_decoder_layers(const TrLayer *layers, int count, float *h, int64_t T, const float *cos, const float *sin,
                      const int64_t *slots, int heads, int kv_heads, int head_dim, float scale, TrAttention attention,
                      int kv_kind, int64_t cache_blocks, const int32_t *token_row, const int32_t *token_keys,
                      const int32_t *tables, int64_t rows, int64_t table_width, int block_size, float *qkv,
                      float *attn, float *act, int threads) {
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
}
