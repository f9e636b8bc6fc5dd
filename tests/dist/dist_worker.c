/* A rank for launcher-driven tests (netns two-host test, torchrun, mpirun): joins the
 * group from the environment (env:// by default, or argv[1]), runs a few collectives
 * and point-to-point transfers and checks the results against local expectations.
 * Exit 0 when everything matched. RT_EXPECT_TRANSPORT=tcp|shm also checks which
 * transport `auto` picked. */
#include "dist/dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "dist_worker: check failed: " __VA_ARGS__);                                                \
            fprintf(stderr, "\n");                                                                                     \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)
#define OK(expr)                                                                                                       \
    do {                                                                                                               \
        if ((expr) != RT_OK) {                                                                                         \
            fprintf(stderr, "dist_worker: %s: %s\n", #expr, rt_error_message());                                       \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

int main(int argc, char **argv) {
    rt_pg_options o;
    OK(rt_pg_options_default(&o));
    if (argc > 1) o.init_method = argv[1];
    o.timeout_s = 60;
    rt_pg *pg;
    OK(rt_pg_init(&o, &pg));
    int r = rt_pg_rank(pg), n = rt_pg_size(pg);
    const char *want = getenv("RT_EXPECT_TRANSPORT");
    if (want)
        CHECK(strcmp(rt_transport_name(rt_pg_transport(pg)), want) == 0, "transport %s, expected %s",
              rt_transport_name(rt_pg_transport(pg)), want);
    size_t count = 1u << 20;
    float *x = malloc(count * sizeof *x);
    CHECK(x != NULL, "alloc");
    for (int a = 0; a < 3; a++) {
        for (size_t i = 0; i < count; i++) x[i] = (float)((r + 1) * (int)(i % 13));
        OK(rt_all_reduce_algo(pg, x, count, RT_F32, RT_OP_SUM, (rt_algo)a));
        for (size_t i = 0; i < count; i++)
            CHECK(x[i] == (float)(n * (n + 1) / 2 * (int)(i % 13)), "all_reduce %s [%zu] = %g",
                  rt_algo_name((rt_algo)a), i, x[i]);
    }
    int64_t v = r == n - 1 ? 4242 : -1;
    OK(rt_broadcast(pg, &v, 1, RT_I64, n - 1));
    CHECK(v == 4242, "broadcast got %lld", (long long)v);
    int32_t me = r * 7, *all = calloc((size_t)n, sizeof *all);
    OK(rt_all_gather(pg, &me, all, 1, RT_I32));
    for (int k = 0; k < n; k++) CHECK(all[k] == k * 7, "all_gather [%d] = %d", k, all[k]);
    if (n > 1) { /* first and last rank: across hosts in the netns test */
        double d = 0;
        if (r == 0) {
            d = 2.5;
            OK(rt_send(pg, &d, 1, RT_F64, n - 1));
        } else if (r == n - 1) {
            OK(rt_recv(pg, &d, 1, RT_F64, 0));
            CHECK(d == 2.5, "recv got %g", d);
        }
    }
    OK(rt_barrier(pg));
    printf("dist_worker: rank %d of %d (local rank %d, transport %s): ok\n", r, n, rt_pg_local_rank(pg),
           rt_transport_name(rt_pg_transport(pg)));
    free(x);
    free(all);
    rt_pg_destroy(pg);
    return 0;
}
