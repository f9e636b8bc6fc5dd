/* A small persistent thread pool for the CPU backend.
 *
 * rt_pool_run(pool, ntasks, fn, arg) runs fn(arg, task) for task = 0..ntasks-1 on the
 * pool's threads and the caller, and returns when all are done. Workers are created
 * once; a run allocates nothing. With one thread everything runs on the caller.
 */
#ifndef RT_MODEL_CPU_POOL_H
#define RT_MODEL_CPU_POOL_H

#include "core/status.h"

typedef struct rt_pool rt_pool;
typedef void (*rt_pool_fn)(void *arg, int task);

rt_status rt_pool_create(int threads, rt_pool **out);
void rt_pool_destroy(rt_pool *p);
int rt_pool_threads(const rt_pool *p);
void rt_pool_run(rt_pool *p, int ntasks, rt_pool_fn fn, void *arg);

#endif
