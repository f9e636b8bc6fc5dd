/* A small persistent thread pool for the CPU backend.
 *
 * rt_threadpool_run(pool, ntasks, fn, arg) runs fn(arg, task) for task = 0..ntasks-1 on the
 * pool's threads and the caller, and returns when all are done. Workers are created
 * once; a run allocates nothing. With one thread everything runs on the caller.
 */
#ifndef RT_MODEL_CPU_THREADPOOL_H
#define RT_MODEL_CPU_THREADPOOL_H

#include "core/status.h"

typedef struct rt_threadpool rt_threadpool;
typedef void (*rt_threadpool_fn)(void *arg, int task);

rt_status rt_threadpool_create(int threads, rt_threadpool **out);
void rt_threadpool_destroy(rt_threadpool *p);
int rt_threadpool_threads(const rt_threadpool *p);
void rt_threadpool_run(rt_threadpool *p, int ntasks, rt_threadpool_fn fn, void *arg);

#endif
