/* The level's packed GGUF kernels against the plain reference, for any level and architecture.
 *
 * Built from the library's own sources with -DTR_LEVEL=<n> (tests/test_arm_emulated.py builds it
 * for ARM64 and runs it under qemu; natively on x86 the same way):
 *     cc -O2 -fopenmp -DTR_LEVEL=<n> -march=... -I tokenrouter/engine/native/gguf tests/native/gguf_check.c \
 *         tokenrouter/engine/native/gguf/\*.c tokenrouter/engine/native/gguf/arch/\*.c -lm -o gguf_check
 *     ./gguf_check [threads]        (default 2; exit status 0 only if every line is PASS)
 *
 * For every block type, K = 256 and 512, N = 16, 32 and 48 rows of W, M = 1..9 rows of x, x
 * float32 (tr_gguf_linears, epilogue 0) and bf16 (tr_gguf_matmul_packed), W repacked
 * (tr_gguf_repack) and computed at the build's level against tr_gguf_matmul, the plain C
 * reference on the file's own blocks, twice:
 *   - random data: random codes and sub-scales, fp16 scales of random sign, exponent and mantissa
 *     (subnormals and zeros among them), x of many magnitudes. maxdiff is the largest |packed -
 *     reference| of a row over that row's largest |reference|. Allowed: 1e-5. The integer sums
 *     are exact at every level, so the paths differ only in how each block's float scaling rounds
 *     (fused multiply-adds or not, in another order): at most 2 roundings a block of a term no
 *     larger than the row's outputs give or take their cancellation, 33 terms at most here (K =
 *     512 of 32-blocks), 33 * 2^-24 = 2e-6 of the row's scale, with room for cancellation;
 *   - integer-exact data: x integers in -127..127 with a 127 in every 32 (so x's scale is 1 and its
 *     codes are x itself), W's fp16 scales +-2^-10. Every float step is then exact (the sums stay
 *     far below 2^24 units for these sizes), so both paths give the exact integer result scaled,
 *     and the outputs must be equal to the bit: an integer sum off by one anywhere fails.
 * Then per type a batch-invariance check: each of 37 rows computed in a 1-row call equals, bit for
 * bit, the same row of calls of 1..9 and 37 rows, with 1 thread and with `threads`; its line
 * carries a digest of all the type's packed outputs on random data, equal between builds that
 * compute the same bits (the x86 vector levels and the ARM64 ones do).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "blocks.h"

int tr_level(void);
int tr_gguf_repack(int type, const uint8_t *w, int64_t N, int64_t K, uint8_t *out, int threads);
int tr_gguf_matmul(int type, const uint8_t *w, int64_t N, int64_t K, const void *x, int x_bf16, int64_t M, void *y,
                   int y_bf16, const float *bias, int threads);
int tr_gguf_matmul_packed(int type, const uint8_t *packed, int64_t N, int64_t K, const void *x, int x_bf16, int64_t M,
                          void *y, int y_bf16, const float *bias, int threads);

enum { MAX_M = 37, MAX_N = 48, MAX_K = 512 };
static const double TOLERANCE = 1e-5;

static const struct {
    int type;
    const char *name;
} TYPES[] = {{TYPE_Q4_0, "Q4_0"}, {TYPE_Q4_1, "Q4_1"}, {TYPE_Q5_0, "Q5_0"}, {TYPE_Q5_1, "Q5_1"},
             {TYPE_Q8_0, "Q8_0"}, {TYPE_Q4_K, "Q4_K"}, {TYPE_Q5_K, "Q5_K"}, {TYPE_Q6_K, "Q6_K"}};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t next(void) { /* splitmix64: the same numbers on every machine */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint32_t below(uint32_t n) { return (uint32_t)(next() % n); }

/* A finite fp16 of random sign, exponent (0: zero or subnormal) up to 2^0 and mantissa. */
static uint16_t random_fp16(void) { return (uint16_t)(below(2) << 15 | below(16) << 10 | below(1024)); }

/* N rows of K / block_values(type) blocks: random bytes, the fp16 scales made finite (`exact`:
 * +-2^-10). */
static void make_w(int type, int64_t N, int64_t K, int exact, uint8_t *w) {
    const int bb = block_bytes(type);
    const int64_t blocks = N * (K / block_values(type));
    for (int64_t i = 0; i < blocks * bb; i++) w[i] = (uint8_t)next();
    for (int64_t b = 0; b < blocks; b++) {
        uint8_t *p = w + b * bb;
        const int at_d = type == TYPE_Q6_K ? 208 : 0;
        const int has_dmin = type == TYPE_Q4_K || type == TYPE_Q5_K || has_min(type);
        for (int f = 0; f < 1 + has_dmin; f++) {
            const uint16_t h = exact ? (uint16_t)(below(2) << 15 | 0x1400) : random_fp16();
            p[at_d + 2 * f] = (uint8_t)h, p[at_d + 2 * f + 1] = (uint8_t)(h >> 8);
        }
    }
}

/* M rows of K values (`exact`: integers in -127..127, +-127 first in every 32; else multiples of
 * 2^-8 up to 4, scaled by 2^-e per 32 values, e in 0..15), as float32 and as bf16 (the float ones
 * rounded; the exact ones are bf16 values already). */
static void make_x(int64_t M, int64_t K, int exact, float *xf, uint16_t *xb) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t k0 = 0; k0 < K; k0 += 32) {
            const float scale = ldexpf(1.0f, -(int)below(16));
            for (int64_t k = k0; k < k0 + 32; k++) {
                float v;
                if (exact) v = k == k0 ? (below(2) ? 127.0f : -127.0f) : (float)((int)below(255) - 127);
                else v = (float)((int)below(2049) - 1024) / 256.0f * scale;
                xf[m * K + k] = v;
                xb[m * K + k] = f32_to_bf16(v);
            }
        }
}

static uint64_t digest_add(uint64_t h, const float *y, size_t n) { /* FNV-1a over the bits */
    const uint8_t *p = (const uint8_t *)y;
    for (size_t i = 0; i < 4 * n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* y[M][N] by the level's packed path: tr_gguf_linears for float32 x, tr_gguf_matmul_packed for bf16. */
static int packed_call(int type, const uint8_t *packed, int64_t N, int64_t K, const void *x, int x_bf16, int64_t M,
                       float *y, int threads) {
    if (x_bf16) return tr_gguf_matmul_packed(type, packed, N, K, x, 1, M, y, 0, NULL, threads);
    const uint8_t *ws[1] = {packed};
    const float *biases[1] = {NULL};
    const int64_t Ns[1] = {N};
    return tr_gguf_linears(1, &type, ws, Ns, biases, K, (const float *)x, M, NULL, 0.0f, y, N, 0, threads);
}

/* The largest |a - b| of a row over the row's largest |b| (its absolute difference for a row of zeros). */
static double max_relative(const float *a, const float *b, int64_t M, int64_t N) {
    double worst = 0.0;
    for (int64_t m = 0; m < M; m++) {
        double scale = 0.0, diff = 0.0;
        for (int64_t n = 0; n < N; n++) {
            const double r = fabs((double)b[m * N + n]), e = fabs((double)a[m * N + n] - (double)b[m * N + n]);
            if (isnan(e)) return INFINITY;
            if (e > diff) diff = e;
            if (r > scale) scale = r;
        }
        const double rel = scale > 0.0 ? diff / scale : diff;
        if (rel > worst) worst = rel;
    }
    return worst;
}

typedef struct {
    uint8_t *w, *packed;
    float *xf, *y, *ref, *alone;
    uint16_t *xb;
} Buffers;

static int failures, cases;

static void report(int ok, const char *line) {
    printf("%s %s\n", ok ? "PASS" : "FAIL", line);
    failures += !ok, cases++;
}

/* One type, K, N, M and x's format: random data within the tolerance, exact data to the bit. */
static void check_case(const Buffers *B, int t, int64_t K, int64_t N, int64_t M, int x_bf16, int threads,
                       uint64_t *digest) {
    const int type = TYPES[t].type;
    double maxdiff = 0.0;
    int exact_ok = 1, calls_ok = 1;
    for (int exact = 0; exact < 2; exact++) {
        make_w(type, N, K, exact, B->w);
        make_x(M, K, exact, B->xf, B->xb);
        const void *x = x_bf16 ? (const void *)B->xb : (const void *)B->xf;
        calls_ok &= tr_gguf_repack(type, B->w, N, K, B->packed, threads) == 0;
        calls_ok &= packed_call(type, B->packed, N, K, x, x_bf16, M, B->y, threads) == 0;
        calls_ok &= tr_gguf_matmul(type, B->w, N, K, x, x_bf16, M, B->ref, 0, NULL, threads) == 0;
        if (exact) exact_ok = memcmp(B->y, B->ref, sizeof(float) * (size_t)(M * N)) == 0;
        else maxdiff = max_relative(B->y, B->ref, M, N), *digest = digest_add(*digest, B->y, (size_t)(M * N));
    }
    char line[200];
    snprintf(line, sizeof line, "gguf %s K=%lld N=%lld M=%lld maxdiff=%.3g x=%s exact=%s", TYPES[t].name,
             (long long)K, (long long)N, (long long)M, maxdiff, x_bf16 ? "bf16" : "f32", exact_ok ? "yes" : "no");
    report(calls_ok && exact_ok && maxdiff <= TOLERANCE, line);
}

/* Each row of x computed alone (1-row calls, 1 thread) equals, bit for bit, the same row of a call
 * of M = 1..9 and MAX_M rows (every tile of rows, TILE = 4, in every place), with 1 thread and
 * with `threads`. */
static void check_batch(const Buffers *B, int t, int threads, uint64_t *digest) {
    static const int64_t Ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, MAX_M};
    const int type = TYPES[t].type;
    const int64_t K = MAX_K, N = MAX_N;
    const int counts[2] = {1, threads};
    int ok = 1, compared = 0, equal = 0;
    for (int x_bf16 = 0; x_bf16 < 2; x_bf16++) {
        make_w(type, N, K, 0, B->w);
        make_x(MAX_M, K, 0, B->xf, B->xb);
        ok &= tr_gguf_repack(type, B->w, N, K, B->packed, threads) == 0;
        const char *x = x_bf16 ? (const char *)B->xb : (const char *)B->xf;
        const size_t row_bytes = (size_t)K * (x_bf16 ? 2 : 4), out_bytes = sizeof(float) * (size_t)N;
        for (int64_t m = 0; m < MAX_M; m++)
            ok &= packed_call(type, B->packed, N, K, x + m * row_bytes, x_bf16, 1, B->alone + m * N, 1) == 0;
        *digest = digest_add(*digest, B->alone, (size_t)(MAX_M * N));
        for (int i = 0; i < (int)(sizeof Ms / sizeof Ms[0]); i++)
            for (int c = 0; c < (threads > 1 ? 2 : 1); c++) {
                ok &= packed_call(type, B->packed, N, K, x, x_bf16, Ms[i], B->y, counts[c]) == 0;
                for (int64_t m = 0; m < Ms[i]; m++) {
                    const int same = memcmp(B->y + m * N, B->alone + m * N, out_bytes) == 0;
                    ok &= same, equal += same, compared++;
                }
            }
    }
    char line[200];
    snprintf(line, sizeof line,
             "gguf %s batch-invariance K=%lld N=%lld M=1..9,%d threads=1,%d rows_equal=%d/%d digest=%016llx",
             TYPES[t].name, (long long)K, (long long)N, MAX_M, threads, equal, compared, (unsigned long long)*digest);
    report(ok && equal == compared, line);
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2;
    if (threads < 1) {
        fprintf(stderr, "usage: %s [threads >= 1]\n", argv[0]);
        return 2;
    }
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    const int types = (int)(sizeof TYPES / sizeof TYPES[0]);
    Buffers B; /* W's bytes for Q8_0, the most a value of any type: 34 a 32 in the file, 544 a 16 x 32 repacked */
    B.w = malloc((size_t)MAX_N * (MAX_K / 32) * 34);
    B.packed = malloc((size_t)tr_gguf_packed_bytes(TYPE_Q8_0, MAX_N, MAX_K));
    B.xf = malloc(sizeof(float) * MAX_M * MAX_K), B.xb = malloc(sizeof(uint16_t) * MAX_M * MAX_K);
    B.y = malloc(sizeof(float) * MAX_M * MAX_N), B.ref = malloc(sizeof(float) * MAX_M * MAX_N);
    B.alone = malloc(sizeof(float) * MAX_M * MAX_N);
    if (!B.w || !B.packed || !B.xf || !B.xb || !B.y || !B.ref || !B.alone) return 2;
    /* stdout has the PASS and FAIL lines only */
    fprintf(stderr, "gguf_check: TR_LEVEL %d, %d threads\n", tr_level(), threads);
    static const int64_t Ks[] = {256, 512}, Ns[] = {16, 32, 48};
    for (int t = 0; t < types; t++) {
        uint64_t digest = 0xcbf29ce484222325ull;
        for (int k = 0; k < 2; k++)
            for (int n = 0; n < 3; n++)
                for (int64_t M = 1; M <= 9; M++)
                    for (int x_bf16 = 0; x_bf16 < 2; x_bf16++)
                        check_case(&B, t, Ks[k], Ns[n], M, x_bf16, threads, &digest);
        check_batch(&B, t, threads, &digest);
    }
    fprintf(stderr, "gguf_check: %d lines, %d FAIL\n", cases, failures);
    free(B.w), free(B.packed), free(B.xf), free(B.xb), free(B.y), free(B.ref), free(B.alone);
    return failures == 0 ? 0 : 1;
}
