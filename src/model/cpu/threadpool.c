/* Thread pool: workers take tasks from an atomic counter, so uneven tasks balance
 * themselves. Between runs a worker spins a little (RINGTRAIN_POOL_SPIN pause instructions,
 * some microseconds) before it sleeps on a condition variable: a training step
 * is hundreds of short runs back to back (every layer's forward and backward), and the
 * futex wake-ups of those showed as several percent of a ResNet34 step in perf on 2
 * cores. The caller likewise spins briefly before it sleeps waiting for the workers.
 * On a loaded machine the difference is within the noise; RINGTRAIN_POOL_SPIN=0 turns
 * spinning off. */
#include "model/cpu/threadpool.h"
#include "core/spin.h"
#include "core/settings.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

struct rt_threadpool {
    int nthreads; /* including the caller */
    pthread_t *workers;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    _Atomic uint64_t generation; /* bumped per run (release: fn/arg/ntasks are set) */
    atomic_int pending;          /* workers still inside the current run */
    atomic_int quit;
    int spin;            /* pause iterations before sleeping */
    int sleepers;        /* workers waiting on `wake` (under mu) */
    int caller_sleeping; /* the caller waits on `done` (under mu) */
    rt_threadpool_fn fn;
    void *arg;
    int ntasks;
    atomic_int next;
};

static void drain(rt_threadpool *p) {
    for (;;) {
        int t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= p->ntasks) break;
        p->fn(p->arg, t);
    }
}

static void *worker_main(void *vp) {
    rt_threadpool *p = vp;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&p->quit, memory_order_acquire)) {
            if (++spins < p->spin) {
                rt_cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            p->sleepers++;
            while (atomic_load_explicit(&p->generation, memory_order_acquire) == seen &&
                   !atomic_load_explicit(&p->quit, memory_order_acquire))
                pthread_cond_wait(&p->wake, &p->mu);
            p->sleepers--;
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load_explicit(&p->quit, memory_order_acquire)) break;
        seen = g;
        drain(p);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            if (p->caller_sleeping) pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

rt_status rt_threadpool_create(int threads, rt_threadpool **out) {
    *out = NULL;
    if (threads < 1) threads = 1;
    int64_t spin = 0; /* RINGTRAIN_POOL_SPIN (default 1000; 0: sleep at once) */
    RT_CHECK(rt_setting_int(RT_SET_POOL_SPIN, &spin));
    rt_threadpool *p = calloc(1, sizeof *p);
    RT_CHECK_ALLOC(p, sizeof *p);
    p->nthreads = threads;
    p->spin = (int)spin;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (threads > 1) {
        p->workers = calloc((size_t)threads - 1, sizeof *p->workers);
        if (!p->workers) {
            free(p);
            RT_FAIL(RT_ERR_NOMEM, "thread pool of %d threads", threads);
        }
        for (int i = 0; i < threads - 1; i++) {
            int rc = pthread_create(&p->workers[i], NULL, worker_main, p);
            if (rc != 0) {
                p->nthreads = i + 1;
                rt_threadpool_destroy(p);
                RT_FAIL(RT_ERR_SYS, "pthread_create for model worker %d of %d failed (%d)", i + 1, threads, rc);
            }
        }
    }
    *out = p;
    return RT_OK;
}

void rt_threadpool_destroy(rt_threadpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->quit, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads - 1; i++) pthread_join(p->workers[i], NULL);
    free(p->workers);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p);
}

int rt_threadpool_threads(const rt_threadpool *p) { return p ? p->nthreads : 1; }

void rt_threadpool_run(rt_threadpool *p, int ntasks, rt_threadpool_fn fn, void *arg) {
    if (ntasks <= 0) return;
    if (!p || p->nthreads == 1 || ntasks == 1) {
        for (int t = 0; t < ntasks; t++) fn(arg, t);
        return;
    }
    /* the workers of the previous run are all done (pending reached 0) */
    p->fn = fn;
    p->arg = arg;
    p->ntasks = ntasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, p->nthreads - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_mutex_lock(&p->mu);
    if (p->sleepers > 0) pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    drain(p);
    int spins = 0;
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
        if (++spins < p->spin) {
            rt_cpu_relax();
            continue;
        }
        pthread_mutex_lock(&p->mu);
        p->caller_sleeping = 1;
        while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) pthread_cond_wait(&p->done, &p->mu);
        p->caller_sleeping = 0;
        pthread_mutex_unlock(&p->mu);
    }
}
