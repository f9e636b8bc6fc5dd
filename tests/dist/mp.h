/* Multi-process test harness: fork N ranks that meet on a free loopback port, through
 * the launcher's fork form (dist/launch.h).
 *
 * mp_run forks `world` children; child r calls fn(r, world, port, arg) and exits with
 * its return value (0 = pass). A failing rank does not stop the others (tests kill ranks
 * on purpose). The parent waits for all of them (stopping the rest after `limit_s`
 * seconds, so a hang fails instead of blocking ctest) and returns the number of ranks
 * that failed; codes[] gets each exit code (or 128+signal). */
#ifndef RT_TEST_MP_H
#define RT_TEST_MP_H

#include <stdio.h>
#include <stdlib.h>

#include "core/status.h"
#include "dist/dist.h"

typedef int (*mp_fn)(int rank, int world, int port, void *arg);

int mp_free_port(void);
int mp_run(int world, mp_fn fn, void *arg, double limit_s, int *codes);

/* Default process-group options for rank `rank` of `world` meeting at
 * tcp://127.0.0.1:port (the string is kept in `method`, which must outlive *o). A bad
 * setting (rt_pg_options_default fails) aborts the child with the error. */
#define MP_METHOD_LEN 64
void mp_pg_options(rt_pg_options *o, char method[MP_METHOD_LEN], int rank, int world, int port, rt_transport transport,
                   double timeout_s);

/* In children: print and return 1 when a condition fails. */
#define MP_CHECK(cond, ...)                                                                                            \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: rank check failed: %s: ", __FILE__, __LINE__, #cond);                              \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fprintf(stderr, "\n");                                                                                     \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)
#define MP_OK(expr)                                                                                                    \
    do {                                                                                                               \
        rt_status s_ = (expr);                                                                                         \
        if (s_ != RT_OK) {                                                                                             \
            fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr, rt_status_name(s_),                    \
                    rt_error_message());                                                                               \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

#endif
