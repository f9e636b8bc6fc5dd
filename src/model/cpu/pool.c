/* Thread pool: workers sleep on a condition variable between runs and take tasks from
 * an atomic counter, so uneven tasks balance themselves. */
#include "model/cpu/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

struct rt_pool {
    int nthreads; /* including the caller */
    pthread_t *workers;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    uint64_t generation; /* bumped per run */
    int pending;         /* workers still inside the current run */
    int quit;
    rt_pool_fn fn;
    void *arg;
    int ntasks;
    atomic_int next;
};

static void drain(rt_pool *p) {
    for (;;) {
        int t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= p->ntasks) break;
        p->fn(p->arg, t);
    }
}

static void *worker_main(void *vp) {
    rt_pool *p = vp;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->wake, &p->mu);
        if (p->quit) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        drain(p);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

rt_status rt_pool_create(int threads, rt_pool **out) {
    *out = NULL;
    if (threads < 1) threads = 1;
    rt_pool *p = calloc(1, sizeof *p);
    RT_CHECK_ALLOC(p, sizeof *p);
    p->nthreads = threads;
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
                rt_pool_destroy(p);
                RT_FAIL(RT_ERR_SYS, "pthread_create for model worker %d of %d failed (%d)", i + 1, threads, rc);
            }
        }
    }
    *out = p;
    return RT_OK;
}

void rt_pool_destroy(rt_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads - 1; i++) pthread_join(p->workers[i], NULL);
    free(p->workers);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p);
}

int rt_pool_threads(const rt_pool *p) { return p ? p->nthreads : 1; }

void rt_pool_run(rt_pool *p, int ntasks, rt_pool_fn fn, void *arg) {
    if (ntasks <= 0) return;
    if (!p || p->nthreads == 1 || ntasks == 1) {
        for (int t = 0; t < ntasks; t++) fn(arg, t);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->ntasks = ntasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    p->pending = p->nthreads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    drain(p);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
