/* The paged attention kernel of one level, checked where no Python runs (an ARM64 level under
 * qemu-aarch64, or x86 natively), the library's sources built in with the level's -DTR_LEVEL:
 *   - attention: tr_paged_attention against a reference in double precision written here;
 *   - order: every output value the bits of paged.h's order at this level (L lanes, products fused
 *     or not), computed here one value at a time: a sum run in another order passes the tolerance,
 *     never this;
 *   - invariance: a query's output the same bits alone in a call, among others in another order,
 *     and with 1 or more threads.
 *
 *   aarch64-linux-gnu-gcc -O2 -static -fopenmp -DTR_LEVEL=3 -march=armv8-a \
 *       -I tokenrouter/engine/native/paged_attention tests/native/attention_check.c \
 *       tokenrouter/engine/native/paged_attention/[*].c tokenrouter/engine/native/paged_attention/arch/[*].c \
 *       -lm -o /tmp/attention_check
 *   qemu-aarch64 -cpu max /tmp/attention_check [threads]      (threads: 2 unless given)
 * (OMP_WAIT_POLICY=passive keeps OpenMP's idle threads from spinning on a busy machine.)
 *
 * One line a check, PASS or FAIL; the exit status is 0 only if every check passes. Steps as the
 * engine makes them: pages of 8 or 16 keys in shuffled blocks, rows of 1 to 171 keys (decodes, an
 * extend, prefills), 1, 2 or 7 query heads a KV head, head dims 64, 128, 72 (a last block of 16
 * half full) and 70 (a last vector of 4 half full), sliding windows on and off, K/V in float32,
 * bf16 and float16 (a few float16 subnormals), q (inside a fused qkv row) and out in float32 or
 * bf16.
 *
 * Tolerance against the double reference: 1e-5 absolute for a float32 output, as
 * tests/engine/attention holds the kernel to torch. Every product and sum runs in float32 (2^-24
 * relative a rounding); an output, a weighted mean of V's values (|v| < 4 here), moves by about
 * |v| times a score's error: the maxdiff lines show under 1e-6 at every level. A bf16 output adds
 * its own rounding, at most half a unit in its last place, 2^-8 relative: 1e-5 + 2^-8 (|ref| +
 * 1e-5) for each value. Each attention line ends with a digest of the output's bits: the inputs
 * are made with integer arithmetic only, the same bits on every CPU, so two levels that sum in the
 * same order and round alike (plain C on x86 and ARM64; AVX512 and NEON) print the same digests.
 */
/* The order model below rounds each product before its sum where the level does: no compiler may
 * fuse them (as paged.c keeps them apart). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef TR_LEVEL
#define TR_LEVEL 0 /* as level.h: the plain level unless the build names one */
#endif

int tr_paged_attention(const void *q, int64_t q_stride_t, int64_t q_stride_h, void *out, int act_bf16, const void *k,
                       const void *v, int kv_kind, int64_t cache_blocks, int64_t tokens, int heads, int kv_heads,
                       int dim, const int32_t *token_row, const int32_t *token_keys, const int32_t *tables,
                       int64_t rows, int64_t table_width, int block_size, int window, float scale, int threads);
int tr_attention_level(void);

enum { F32 = 0, BF16 = 1, F16 = 2 }; /* tr_paged_attention's kv_kind */
static const char *const KIND_NAME[] = {"f32", "bf16", "f16"};
#define TOL 1e-5
#define KV_HEADS 2

/* Rows of a step: keys already cached and new tokens (one query each, at the positions after) */
static const int CACHED[] = {0, 36, 60, 0, 170, 16};
static const int NEW[] = {1, 1, 4, 9, 1, 3};
#define ROWS 6

static uint64_t rng_state;
static uint64_t next_u64(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* About normal (mean 0, deviation `spread`), from integers and one rounded product: the same bits
 * on every CPU and compiler, with no libm and nothing a compiler could fuse. */
static float random_value(float spread) {
    int64_t sum = 0;
    for (int i = 0; i < 4; i++) sum += (int64_t)(next_u64() >> 44); /* 20 bits each */
    return (float)((double)(sum - ((int64_t)2 << 20)) * ((double)spread * 0x1.bb67ae8584caap-20)); /* * sqrt(3) */
}

static uint16_t to_bf16(float f) { /* round to nearest even */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static uint16_t to_f16(float f) { /* round to nearest even; the values here are far below 65504 */
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    const int e = (int)((u >> 23) & 0xff) - 127 + 15;
    const uint32_t m = u & 0x7fffff;
    uint32_t q, rem, half;
    if (e > 0) { /* normal: 10 of the 23 bits kept */
        q = (uint32_t)e << 10 | m >> 13, rem = m & 0x1fff, half = 0x1000;
    } else { /* subnormal: the value in units of 2^-24 */
        if (e < -10) return sign;
        const int shift = 14 - e;
        q = (m | 0x800000) >> shift, rem = (m | 0x800000) & ((1u << shift) - 1), half = 1u << (shift - 1);
    }
    if (rem > half || (rem == half && (q & 1))) q++;
    return (uint16_t)(sign | q);
}

static double from_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static double from_f16(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const double x = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return h & 0x8000 ? -x : x;
}

static int size_of(int kind) { return kind == F32 ? 4 : 2; }

static void store(void *p, int64_t i, int kind, float x) {
    if (kind == F32) ((float *)p)[i] = x;
    else ((uint16_t *)p)[i] = kind == BF16 ? to_bf16(x) : to_f16(x);
}

static double fetch(const void *p, int64_t i, int kind) {
    if (kind == F32) return ((const float *)p)[i];
    const uint16_t h = ((const uint16_t *)p)[i];
    return kind == BF16 ? from_bf16(h) : from_f16(h);
}

typedef struct {
    int block, g, dim, window, kv_kind, q_bf16;
} Shape;

typedef struct { /* one step's inputs, laid out as the engine lays them out */
    Shape sh;
    int heads, tokens, table_width;
    int64_t cache_blocks, q_stride_t, q_stride_h;
    int32_t token_row[64], token_keys[64], *tables;
    void *k, *v, *q; /* q: each token's fused qkv row, q's heads first */
    float *kf, *vf, *qf; /* their values in float32 (exact), for the checks */
    float scale;
} Step;

static void name_of(const Shape *s, char *out, size_t size) {
    snprintf(out, size, "kv=%s q=%s block=%d g=%d dim=%d window=%d", KIND_NAME[s->kv_kind], s->q_bf16 ? "bf16" : "f32",
             s->block, s->g, s->dim, s->window);
}

static float *decoded(const void *p, int64_t count, int kind) {
    float *out = malloc(sizeof(float) * (size_t)count);
    for (int64_t i = 0; i < count; i++) out[i] = (float)fetch(p, i, kind);
    return out;
}

static Step make_step(Shape sh, uint64_t seed) {
    Step st = {.sh = sh, .heads = sh.g * KV_HEADS};
    rng_state = seed;
    int need[ROWS], blocks = 0, widest = 0;
    for (int r = 0; r < ROWS; r++) {
        for (int i = 0; i < NEW[r]; i++, st.tokens++) {
            st.token_row[st.tokens] = r;
            st.token_keys[st.tokens] = CACHED[r] + i + 1;
        }
        need[r] = (CACHED[r] + NEW[r] + sh.block - 1) / sh.block;
        blocks += need[r];
        widest = need[r] > widest ? need[r] : widest;
    }
    st.cache_blocks = blocks + 3; /* some blocks no row uses */
    st.table_width = widest + 1;
    int32_t *order = malloc(sizeof(int32_t) * (size_t)st.cache_blocks);
    for (int i = 0; i < st.cache_blocks; i++) order[i] = i;
    for (int i = (int)st.cache_blocks - 1; i > 0; i--) { /* shuffled: a row's blocks lie anywhere */
        const int j = (int)(next_u64() % (uint64_t)(i + 1)), x = order[i];
        order[i] = order[j], order[j] = x;
    }
    st.tables = malloc(sizeof(int32_t) * ROWS * (size_t)st.table_width);
    for (int r = 0, at = 0; r < ROWS; r++)
        for (int b = 0; b < st.table_width; b++) st.tables[r * st.table_width + b] = b < need[r] ? order[at++] : -1;
    free(order);
    const int64_t cache = st.cache_blocks * sh.block * KV_HEADS * sh.dim;
    st.k = malloc((size_t)(cache * size_of(sh.kv_kind)));
    st.v = malloc((size_t)(cache * size_of(sh.kv_kind)));
    for (int64_t i = 0; i < cache; i++) { /* one value in 64 scaled by 2^-16: float16's subnormals */
        const float k = random_value(1.0f), v = random_value(1.0f);
        store(st.k, i, sh.kv_kind, next_u64() % 64 ? k : k * 0x1p-16f);
        store(st.v, i, sh.kv_kind, next_u64() % 64 ? v : v * 0x1p-16f);
    }
    st.q_stride_h = sh.dim;
    st.q_stride_t = (int64_t)(st.heads + 2 * KV_HEADS) * sh.dim;
    const int q_kind = sh.q_bf16 ? BF16 : F32;
    st.q = malloc((size_t)(st.tokens * st.q_stride_t * size_of(q_kind)));
    for (int64_t i = 0; i < st.tokens * st.q_stride_t; i++) store(st.q, i, q_kind, random_value(1.5f));
    st.kf = decoded(st.k, cache, sh.kv_kind);
    st.vf = decoded(st.v, cache, sh.kv_kind);
    st.qf = decoded(st.q, st.tokens * st.q_stride_t, q_kind);
    st.scale = (float)(1.0 / sqrt((double)sh.dim));
    return st;
}

static void free_step(Step *st) {
    free(st->kf);
    free(st->vf);
    free(st->qf);
    free(st->tables);
    free(st->k);
    free(st->v);
    free(st->q);
}

static int out_size(const Step *st) { return size_of(st->sh.q_bf16 ? BF16 : F32); }

/* tokens [first, first + count) of the step in one call: their rows of out, or -1 */
static int attend(const Step *st, int first, int count, void *out, int threads) {
    const Shape *s = &st->sh;
    const char *q = (const char *)st->q + (size_t)(first * st->q_stride_t * out_size(st));
    return tr_paged_attention(q, st->q_stride_t, st->q_stride_h, out, s->q_bf16, st->k, st->v, s->kv_kind,
                              st->cache_blocks, count, st->heads, KV_HEADS, s->dim, st->token_row + first,
                              st->token_keys + first, st->tables, ROWS, st->table_width, s->block, s->window, st->scale,
                              threads);
}

/* Token t's head h in double: softmax(scale q.k) over its keys (its window's), times V */
static void reference(const Step *st, int t, int h, double *o) {
    const Shape *s = &st->sh;
    const int d = s->dim, kvh = h / s->g, n = st->token_keys[t];
    const int lo = s->window > 0 && n > s->window ? n - s->window : 0;
    const int32_t *table = st->tables + st->token_row[t] * st->table_width;
    double *score = malloc(sizeof(double) * (size_t)n), most = -INFINITY, total = 0.0;
    for (int j = lo; j < n; j++) {
        const int64_t at = (((int64_t)table[j / s->block] * s->block + j % s->block) * KV_HEADS + kvh) * d;
        const float *q = st->qf + t * st->q_stride_t + h * st->q_stride_h;
        double dot = 0.0;
        for (int c = 0; c < d; c++) dot += (double)q[c] * st->kf[at + c];
        score[j] = dot * st->scale;
        most = score[j] > most ? score[j] : most;
    }
    for (int c = 0; c < d; c++) o[c] = 0.0;
    for (int j = lo; j < n; j++) {
        const int64_t at = (((int64_t)table[j / s->block] * s->block + j % s->block) * KV_HEADS + kvh) * d;
        const double p = exp(score[j] - most);
        total += p;
        for (int c = 0; c < d; c++) o[c] += p * st->vf[at + c];
    }
    for (int c = 0; c < d; c++) o[c] /= total;
    free(score);
}

/* paged.h's order at this level, one value at a time: L lanes (8 at AVX2; 16 in plain C, at AVX512
 * and NEON), each product fused into its sum or not (plain C only). The level's output must be
 * these bits exactly: a sum run in another order passes the tolerance, never this. */
#if TR_LEVEL == 1
#define L 8
#else
#define L 16
#endif
#define FUSED (TR_LEVEL != 0)

static float madd(float a, float b, float acc) { return FUSED ? fmaf(a, b, acc) : acc + a * b; }

static float by_halves(float *lane) { /* lane i + lane i + w, w = L/2 .. 1 */
    for (int w = L / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) lane[i] = lane[i] + lane[i + w];
    return lane[0];
}

static float cephes_exp(float x) { /* the levels' expf: range reduction by ln 2, degree-6 polynomial */
    x = x < 88.3762626647949f ? x : 88.3762626647949f;
    x = x > -87.3365447505531f ? x : -87.3365447505531f;
    const float n = rintf(x * 1.44269504088896341f);
    float r = FUSED ? fmaf(-n, 0.693359375f, x) : x - n * 0.693359375f;
    r = FUSED ? fmaf(-n, -2.12194440e-4f, r) : r - n * -2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = madd(y, r, 1.3981999507e-3f);
    y = madd(y, r, 8.3334519073e-3f);
    y = madd(y, r, 4.1665795894e-2f);
    y = madd(y, r, 1.6666665459e-1f);
    y = madd(y, r, 5.0000001201e-1f);
    y = madd(y, r * r, r + 1.0f);
    return ldexpf(y, (int)n); /* y 2^n, rounded once */
}

/* Token t's head h as paged.h orders it at this level, in float32 */
static void in_order(const Step *st, int t, int h, float *o) {
    const Shape *s = &st->sh;
    const int d = s->dim, kvh = h / s->g, n = st->token_keys[t];
    const int lo = s->window > 0 && n > s->window ? n - s->window : 0;
    const int32_t *table = st->tables + st->token_row[t] * st->table_width;
    const float *q = st->qf + t * st->q_stride_t + h * st->q_stride_h;
    float *p = malloc(sizeof(float) * (size_t)n), most = -INFINITY, lane[L] = {0}, total;
    for (int j = lo; j < n; j++) { /* dimension c in lane c % L; dimensions past d add 0 * 0 */
        const int64_t at = (((int64_t)table[j / s->block] * s->block + j % s->block) * KV_HEADS + kvh) * d;
        for (int c = 0; c < (d + L - 1) / L * L; c++)
            lane[c % L] = madd(c < d ? q[c] : 0.0f, c < d ? st->kf[at + c] : 0.0f, lane[c % L]);
        p[j] = by_halves(lane) * st->scale;
        most = p[j] > most ? p[j] : most;
        memset(lane, 0, sizeof(lane));
    }
    for (int j = lo; j < n; j++) { /* key j in lane j % L */
        p[j] = cephes_exp(p[j] - most);
        lane[j % L] += p[j];
    }
    total = by_halves(lane);
    for (int c = 0; c < d; c++) { /* each dimension its own sum, in increasing j */
        float acc = 0.0f;
        for (int j = lo; j < n; j++) {
            const int64_t at = (((int64_t)table[j / s->block] * s->block + j % s->block) * KV_HEADS + kvh) * d;
            acc = madd(p[j], st->vf[at + c], acc);
        }
        o[c] = acc / total;
    }
    free(p);
}

static uint64_t digest(const void *p, size_t size) { /* FNV-1a over the bytes */
    uint64_t x = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < size; i++) x = (x ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
    return x;
}

static int failures;

static void report(int pass, const char *line) {
    printf("%s %s\n", pass ? "PASS" : "FAIL", line);
    fflush(stdout);
    failures += !pass;
}

/* The step's output at this level against the reference, every value within its tolerance */
static void check_attention(Shape sh, uint64_t seed, int threads) {
    Step st = make_step(sh, seed);
    const int d = sh.dim, bf16 = sh.q_bf16;
    const size_t values = (size_t)st.tokens * (size_t)st.heads * (size_t)d;
    void *out = malloc(values * (size_t)out_size(&st));
    double *want = malloc(sizeof(double) * (size_t)d), worst = 0.0;
    float *ordered = malloc(sizeof(float) * (size_t)d);
    const int ran = attend(&st, 0, st.tokens, out, threads) == 0;
    int pass = ran, other = 0; /* other: values not the bits of paged.h's order */
    for (int t = 0; t < st.tokens && ran; t++)
        for (int h = 0; h < st.heads; h++) {
            reference(&st, t, h, want);
            in_order(&st, t, h, ordered);
            for (int c = 0; c < d; c++) {
                const int64_t i = ((int64_t)t * st.heads + h) * d + c;
                const double got = fetch(out, i, bf16 ? BF16 : F32);
                const double diff = fabs(got - want[c]), tol = bf16 ? TOL + 0x1p-8 * (fabs(want[c]) + TOL) : TOL;
                pass &= diff <= tol; /* false for a NaN too */
                worst = diff > worst || diff != diff ? diff : worst;
                other += bf16 ? ((uint16_t *)out)[i] != to_bf16(ordered[c])
                              : memcmp((float *)out + i, ordered + c, sizeof(float)) != 0;
            }
        }
    char name[128], line[256];
    name_of(&sh, name, sizeof(name));
    snprintf(line, sizeof(line), "attention %s maxdiff=%.3g tol=%s bits=%016llx", name, worst,
             bf16 ? "1e-05+2^-8|ref|" : "1e-05", (unsigned long long)digest(out, values * (size_t)out_size(&st)));
    report(pass, line);
    snprintf(line, sizeof(line), "order %s lanes=%d %s values-differing=%d/%zu", name, L, FUSED ? "fused" : "unfused",
             other, values);
    report(ran && !other, line);
    free(ordered);
    free(want);
    free(out);
    free_step(&st);
}

/* A query's output is the same bits whatever else its call holds (alone; all the step's tokens in
 * reverse order, one call each way) and with 1 or `threads` threads. */
static void check_invariance(Shape sh, uint64_t seed, int threads) {
    Step st = make_step(sh, seed);
    const size_t row = (size_t)st.heads * (size_t)sh.dim * (size_t)out_size(&st), all = row * (size_t)st.tokens;
    char *one = malloc(all), *many = malloc(all), *alone = malloc(all), *reversed = malloc(all);
    int ok = attend(&st, 0, st.tokens, one, 1) == 0 && attend(&st, 0, st.tokens, many, threads) == 0;
    for (int t = 0; t < st.tokens; t++) ok &= attend(&st, t, 1, alone + row * (size_t)t, threads) == 0;
    Step back = st; /* the same rows and pages, the tokens in reverse order */
    char *q = malloc((size_t)(st.tokens * st.q_stride_t * out_size(&st)));
    const size_t q_row = (size_t)(st.q_stride_t * out_size(&st));
    for (int t = 0; t < st.tokens; t++) {
        const int from = st.tokens - 1 - t;
        back.token_row[t] = st.token_row[from];
        back.token_keys[t] = st.token_keys[from];
        memcpy(q + q_row * (size_t)t, (const char *)st.q + q_row * (size_t)from, q_row);
    }
    back.q = q;
    ok &= attend(&back, 0, st.tokens, reversed, threads) == 0;
    int apart = 0, by_threads = 0, in_reverse = 0;
    for (int t = 0; t < st.tokens; t++) {
        by_threads += memcmp(one + row * (size_t)t, many + row * (size_t)t, row) != 0;
        apart += memcmp(one + row * (size_t)t, alone + row * (size_t)t, row) != 0;
        in_reverse += memcmp(one + row * (size_t)t, reversed + row * (size_t)(st.tokens - 1 - t), row) != 0;
    }
    char name[128], line[256];
    name_of(&sh, name, sizeof(name));
    snprintf(line, sizeof(line), "invariance %s threads=1,%d tokens differing=%d/%d", name, threads, by_threads,
             st.tokens);
    report(ok && !by_threads, line);
    snprintf(line, sizeof(line), "invariance %s alone-vs-step tokens differing=%d/%d", name, apart, st.tokens);
    report(ok && !apart, line);
    snprintf(line, sizeof(line), "invariance %s reversed-step tokens differing=%d/%d", name, in_reverse, st.tokens);
    report(ok && !in_reverse, line);
    free(q);
    free(one);
    free(many);
    free(alone);
    free(reversed);
    free_step(&st);
}

int main(int argc, char **argv) {
    const int threads = argc > 1 && atoi(argv[1]) > 0 ? atoi(argv[1]) : 2;
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    char line[64];
    snprintf(line, sizeof(line), "level built=%d reports=%d", TR_LEVEL, tr_attention_level());
    report(tr_attention_level() == TR_LEVEL, line);
    /* every KV kind with every head count and head dim; q's dtype, the block size and the window
     * alternate among them, so that each meets each kind and each head count */
    static const int G[] = {1, 2, 7}, DIM[] = {64, 128, 72, 70};
    for (int kind = F32; kind <= F16; kind++)
        for (int gi = 0; gi < 3; gi++)
            for (int di = 0; di < 4; di++) {
                const int block = (gi + kind) % 2 ? 16 : 8, window = (di / 2 + gi + kind) % 2 ? 23 : 0;
                const Shape sh = {block, G[gi], DIM[di], window, kind, (gi + di + kind) % 2};
                check_attention(sh, 1000 + (uint64_t)(kind * 12 + gi * 4 + di), threads);
            }
    const Shape mixed[] = {{16, 2, 128, 0, F32, 0}, {8, 7, 72, 23, F16, 1}, {8, 1, 70, 0, BF16, 1}};
    for (int i = 0; i < 3; i++) check_invariance(mixed[i], 3000 + (uint64_t)i, threads > 1 ? threads : 2);
    return failures ? 1 : 0;
}
