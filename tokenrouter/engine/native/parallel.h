/* Rows split over threads: with OpenMP where the compiler has it (gcc, clang with libomp), with
 * POSIX threads where it has not (Apple clang, or a build with OpenMP off: build.py).
 *
 * TR_PARALLEL_FOR(n, threads, fn, ctx) calls fn(ctx, i) for every i in [0, n), at most `threads`
 * threads at once; TR_PARALLEL_FOR_IF(cond, ...) on one thread unless cond. With OpenMP it is the
 * `omp parallel for schedule(static)` loop the kernels always ran (the same schedule, and torch's
 * libgomp, so its threads are torch's), fn a static function the compiler inlines into it.
 * Without, the same static split: [0, n) in `threads` contiguous shares, the first n % threads
 * one longer, as libgomp splits it; each i is computed whole by one thread either way, so a row's
 * result never depends on the thread count. The shares run on a pool of threads kept for the
 * process (one pool per C file including this: creating threads for every call would cost a
 * decode step's hundreds of calls tens of microseconds each); a call while the pool is busy
 * (another Python thread's model, or a nested call) runs on threads of its own.
 */
#ifndef TR_PARALLEL_H
#define TR_PARALLEL_H

#include <stdint.h>

typedef void (*TrRow)(const void *ctx, int64_t i);

#define TR_PRAGMA(x) _Pragma(#x)

#ifdef _OPENMP

#define TR_PARALLEL_FOR(n, threads, fn, ctx)                                                                           \
    do {                                                                                                               \
        const int64_t tr_n_ = (n);                                                                                     \
        TR_PRAGMA(omp parallel for schedule(static) num_threads(threads))                                              \
        for (int64_t tr_i_ = 0; tr_i_ < tr_n_; tr_i_++) fn(ctx, tr_i_);                                                \
    } while (0)
#define TR_PARALLEL_FOR_IF(cond, n, threads, fn, ctx)                                                                  \
    do {                                                                                                               \
        const int64_t tr_n_ = (n);                                                                                     \
        TR_PRAGMA(omp parallel for schedule(static) num_threads(threads) if (cond))                                    \
        for (int64_t tr_i_ = 0; tr_i_ < tr_n_; tr_i_++) fn(ctx, tr_i_);                                                \
    } while (0)

#else /* POSIX threads */

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#define TR_PARALLEL_FOR(n, threads, fn, ctx) tr_parallel_for((n), (threads), (fn), (ctx))
#define TR_PARALLEL_FOR_IF(cond, n, threads, fn, ctx) tr_parallel_for((n), (cond) ? (threads) : 1, (fn), (ctx))

#define TR_MAX_THREADS 512
#define TR_THREAD_STACK (4 << 20) /* macOS gives a thread 512 KiB; libomp's threads get 4 MiB */

/* Share k of [0, n) in `shares`: libgomp's schedule(static) split. */
static inline void tr_share(int64_t n, int shares, int k, int64_t *begin, int64_t *end) {
    const int64_t q = n / shares, r = n % shares;
    *begin = k * q + (k < r ? k : r);
    *end = *begin + q + (k < r);
}

typedef struct {
    TrRow fn;
    const void *ctx;
    int64_t n;
    int shares;
} TrJob;

static inline void tr_run_share(const TrJob *job, int k) {
    int64_t begin, end;
    tr_share(job->n, job->shares, k, &begin, &end);
    for (int64_t i = begin; i < end; i++) job->fn(job->ctx, i);
}

static struct {
    pthread_mutex_t busy; /* held by the call the pool serves */
    pthread_mutex_t lock; /* the fields below */
    pthread_cond_t start, done;
    TrJob job;
    uint64_t generation; /* one a job: what wakes the workers */
    uint64_t pending; /* the job's shares not yet done by workers */
    uint64_t spin_ns; /* how long a wait spins: the last job's */
    int workers;
    uint64_t born[TR_MAX_THREADS]; /* the generation a worker was created in */
} tr_pool_ __attribute__((unused)) = {.busy = PTHREAD_MUTEX_INITIALIZER,
                                      .lock = PTHREAD_MUTEX_INITIALIZER,
                                      .start = PTHREAD_COND_INITIALIZER,
                                      .done = PTHREAD_COND_INITIALIZER};

/* Waiting spins a while before it sleeps, as libgomp's threads do: a decode step's calls follow
 * each other within microseconds, and a condition variable's wake-up costs about ten. Not where
 * the job has more threads than the machine has CPUs: a spinning thread would hold the CPU a
 * working one waits for. */
#define TR_SPIN_NS 100000

static inline uint64_t tr_now_ns_(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static inline void tr_relax_(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Spin while *at == value, for `ns` at most. */
static inline void tr_spin_while_(const uint64_t *at, uint64_t value, uint64_t ns) {
    if (ns == 0) return;
    const uint64_t until = tr_now_ns_() + ns;
    for (unsigned i = 1; __atomic_load_n(at, __ATOMIC_ACQUIRE) == value; i++) {
        if (i % 64 == 0 && tr_now_ns_() > until) return;
        tr_relax_();
    }
}

static void *tr_pool_worker_(void *arg) {
    const int k = (int)(intptr_t)arg; /* runs share k: the caller runs share 0 */
    pthread_mutex_lock(&tr_pool_.lock);
    uint64_t seen = tr_pool_.born[k];
    for (;;) {
        if (tr_pool_.generation == seen) {
            pthread_mutex_unlock(&tr_pool_.lock);
            tr_spin_while_(&tr_pool_.generation, seen, tr_pool_.spin_ns);
            pthread_mutex_lock(&tr_pool_.lock);
        }
        while (tr_pool_.generation == seen) pthread_cond_wait(&tr_pool_.start, &tr_pool_.lock);
        seen = tr_pool_.generation;
        if (k >= tr_pool_.job.shares) continue; /* not needed for this job */
        const TrJob job = tr_pool_.job;
        pthread_mutex_unlock(&tr_pool_.lock);
        tr_run_share(&job, k);
        pthread_mutex_lock(&tr_pool_.lock);
        if (__atomic_sub_fetch(&tr_pool_.pending, 1, __ATOMIC_ACQ_REL) == 0) pthread_cond_signal(&tr_pool_.done);
    }
    return NULL;
}

/* A forked child has none of the parent's workers: it starts a pool of its own. */
static void tr_pool_after_fork_(void) {
    pthread_mutex_init(&tr_pool_.busy, NULL);
    pthread_mutex_init(&tr_pool_.lock, NULL);
    pthread_cond_init(&tr_pool_.start, NULL);
    pthread_cond_init(&tr_pool_.done, NULL);
    tr_pool_.workers = tr_pool_.pending = 0;
}

static inline int tr_thread(pthread_t *t, void *(*run)(void *), void *arg) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, TR_THREAD_STACK);
    const int rc = pthread_create(t, &attr, run, arg);
    pthread_attr_destroy(&attr);
    return rc;
}

typedef struct {
    const TrJob *job;
    int k;
} TrOwnShare;

static void *tr_own_share_(void *arg) {
    const TrOwnShare *s = arg;
    tr_run_share(s->job, s->k);
    return NULL;
}

/* The job on threads of its own, created and joined for it (the pool is busy). */
static void tr_parallel_own_(TrJob job) {
    pthread_t t[TR_MAX_THREADS];
    TrOwnShare share[TR_MAX_THREADS];
    int made = 1;
    for (; made < job.shares; made++) {
        share[made] = (TrOwnShare){&job, made};
        if (tr_thread(&t[made], tr_own_share_, &share[made]) != 0) break;
    }
    tr_run_share(&job, 0);
    for (int k = made; k < job.shares; k++) tr_run_share(&job, k); /* those no thread took */
    for (int k = 1; k < made; k++) pthread_join(t[k], NULL);
}

static __attribute__((unused)) void tr_parallel_for(int64_t n, int threads, TrRow fn, const void *ctx) {
    if (n <= 0) return;
    int shares = threads < 1 ? 1 : threads > TR_MAX_THREADS ? TR_MAX_THREADS : threads;
    if (shares > n) shares = (int)n;
    TrJob job = {fn, ctx, n, shares};
    if (shares == 1) {
        tr_run_share(&job, 0);
        return;
    }
    if (pthread_mutex_trylock(&tr_pool_.busy) != 0) {
        tr_parallel_own_(job);
        return;
    }
    pthread_mutex_lock(&tr_pool_.lock);
    if (tr_pool_.workers == 0 && tr_pool_.generation == 0) pthread_atfork(NULL, NULL, tr_pool_after_fork_);
    for (; tr_pool_.workers < shares - 1; tr_pool_.workers++) { /* workers 1 .. shares-1 */
        pthread_t t;
        tr_pool_.born[tr_pool_.workers + 1] = tr_pool_.generation;
        if (tr_thread(&t, tr_pool_worker_, (void *)(intptr_t)(tr_pool_.workers + 1)) != 0) break;
        pthread_detach(t);
    }
    if (shares > tr_pool_.workers + 1) shares = tr_pool_.workers + 1; /* as many as could be made */
    job.shares = shares;
    tr_pool_.job = job;
    tr_pool_.pending = (uint64_t)shares - 1;
    static long cpus = 0;
    if (cpus == 0) cpus = sysconf(_SC_NPROCESSORS_ONLN);
    tr_pool_.spin_ns = shares <= cpus ? TR_SPIN_NS : 0;
    __atomic_store_n(&tr_pool_.generation, tr_pool_.generation + 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&tr_pool_.start);
    pthread_mutex_unlock(&tr_pool_.lock);
    tr_run_share(&job, 0);
    for (uint64_t left = shares - 1, now; left > 0; left = now) { /* spin while shares finish */
        tr_spin_while_(&tr_pool_.pending, left, tr_pool_.spin_ns);
        if ((now = __atomic_load_n(&tr_pool_.pending, __ATOMIC_ACQUIRE)) == left) break; /* none did a while */
    }
    pthread_mutex_lock(&tr_pool_.lock);
    while (tr_pool_.pending > 0) pthread_cond_wait(&tr_pool_.done, &tr_pool_.lock);
    pthread_mutex_unlock(&tr_pool_.lock);
    pthread_mutex_unlock(&tr_pool_.busy);
}

#endif /* _OPENMP */

#endif
