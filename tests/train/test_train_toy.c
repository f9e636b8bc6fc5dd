/* The tutorial's toy case through ringtrain's gradient-averaging code (the reducer) and
 * its SGD: one parameter p = 2.0, rank r's input r, loss (r - p)^2, lr 0.1, 2 ranks.
 * d/dp (r - p)^2 = 2 (p - r): rank 0 has 4, rank 1 has 2. All-reduced with SUM both ranks
 * hold 6 (the tutorial's p would become 2 - 0.1 * 6 = 1.4, as it prints); ringtrain
 * averages (DDP), so both hold 3 and after its SGD step p = 2 - 0.1 * 3 = 1.7. */
#include "dist/mp.h"

#include "dist/reducer.h"
#include "optim/optimizer.h"

#include <math.h>

static int rank_main(int rank, int world, int port, void *arg) {
    (void)arg;
    rt_pg_options o;
    char method[MP_METHOD_LEN];
    mp_pg_options(&o, method, rank, world, port, RT_TRANSPORT_AUTO, 30);
    rt_pg *pg;
    MP_OK(rt_pg_init(&o, &pg));
    for (int averaged = 0; averaged <= 1; averaged++) {
        float p = 2.0f;
        float x = (float)rank;
        float grad = 2.0f * (p - x); /* d/dp (x - p)^2 */
        size_t bounds[2] = {0, sizeof(float)};
        rt_reducer_options ro;
        rt_reducer_options_default(&ro);
        ro.op = averaged ? RT_OP_AVG : RT_OP_SUM;
        rt_reducer *r;
        MP_OK(rt_reducer_create(pg, &grad, bounds, 1, &ro, &r));
        MP_OK(rt_reducer_begin(r));
        MP_OK(rt_reducer_ready(r, 0, sizeof(float))); /* backward reports the only gradient */
        MP_OK(rt_reducer_finish(r));
        rt_reducer_destroy(r);
        if (!averaged) {
            MP_CHECK(grad == 6.0f, "SUM: gradient %g, expected 6", grad);
            p -= 0.1f * grad;
            MP_CHECK(fabsf(p - 1.4f) < 1e-6f, "SUM: p = %g, expected 1.4 (the tutorial's)", p);
            continue;
        }
        MP_CHECK(grad == 3.0f, "AVG: gradient %g, expected 3", grad);
        rt_optim_config oc;
        rt_optim_config_default(&oc, RT_OPTIM_SGD);
        oc.lr = 0.1;
        rt_optimizer opt;
        MP_OK(rt_optimizer_init(&opt, &oc, rt_device_cpu(), 1));
        MP_OK(rt_optimizer_step(&opt, &p, &grad, -1, NULL));
        rt_optimizer_free(&opt);
        MP_CHECK(fabsf(p - 1.7f) < 1e-6f, "after ringtrain's averaged SGD step p = %g, expected 1.7", p);
        printf("rank %d: p = %.4f\n", rank, p);
    }
    rt_pg_destroy(pg);
    return 0;
}

int main(void) {
    int fails = mp_run(2, rank_main, NULL, 60, NULL);
    printf("%s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
