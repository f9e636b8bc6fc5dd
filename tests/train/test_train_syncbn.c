/* model.sync_bn: 2 ranks with global batch B and synchronised batch norm reach the
 * parameters and running statistics 1 rank reaches with batch B (batch norm over the same
 * B images), after 5 steps of a small ResNet18 (width 4) with SGD momentum. Real ranks
 * through the public launcher (fork form), real Fashion-MNIST (a subset), shuffling and
 * augmentation on: the DistributedSampler gives rank r the samples r, r+2, ... of the
 * 1-rank batch, so only the summation order differs: the statistics' double sums over
 * two halves, the gradients' all-reduce. Bound: relative error (2-norm over every f32
 * tensor of the state dict, buffers included) < 1e-5. Without sync_bn the same 2-rank
 * run differs by far more (each rank normalises its 16 images), so the comparison is not
 * vacuous. The ranks' own parameters are compared by the trainer's checksum at the end. */
#include "test_util.h"
#include "train/train_test_util.h"

#include "core/safetensors.h"
#include "dist/dist.h"
#include "dist/launch.h"
#include "train/config.h"
#include "train/trainer.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

static char g_dir[256];

typedef struct job {
    const char *name, *sync, *lr;
} job;

static int rank_fn(int local_rank, void *arg) {
    (void)local_rank;
    const job *j = arg;
    char dir[512], sync[64], lr[64];
    snprintf(lr, sizeof lr, "optim.lr=%s", j->lr);
    snprintf(dir, sizeof dir, "log.dir=%s/%s", g_dir, j->name);
    snprintf(sync, sizeof sync, "model.sync_bn=%s", j->sync);
    const char *ov[] = {"model.arch=resnet18",
                        "model.width=4",
                        "data.train_subset=512",
                        "data.test_subset=64",
                        "data.batch_size=32",
                        "train.max_steps=5",
                        "train.threads=1",
                        lr,
                        sync,
                        "optim.momentum=0.9",
                        "dist.transport=shm",
                        dir,
                        "log.progress=off",
                        "dist.timeout_s=60"};
    rt_dist_env env;
    rt_train_result res;
    if (tt_train_rank(ov, (int)(sizeof ov / sizeof ov[0]), &env, &res) != 0) return 1;
    return res.steps == 5 ? 0 : 2;
}

static void run(const job *j, int nproc) {
    rt_launch_options o;
    rt_launch_options_default(&o);
    o.nproc = nproc;
    o.timeout_s = 240;
    rt_launch_result res;
    rt_status s = rt_launch_fork(&o, rank_fn, (void *)j, &res);
    char line[2048];
    if (s != RT_OK) fail_msg("%s with %d rank(s): %s", j->name, nproc, rt_launch_describe(&res, line, sizeof line));
    rt_launch_result_free(&res);
}

/* ||a - b|| / ||a|| over every f32 tensor of two state dicts with the same names */
static double rel_err(const char *name_a, const char *name_b) {
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/%s/model.safetensors", g_dir, name_a);
    snprintf(pb, sizeof pb, "%s/%s/model.safetensors", g_dir, name_b);
    rt_safetensors *a, *b;
    assert_rt_ok(rt_safetensors_read(pa, &a));
    assert_rt_ok(rt_safetensors_read(pb, &b));
    assert_int_equal(a->n, b->n);
    double num = 0, den = 0;
    for (int i = 0; i < a->n; i++) {
        const rt_st_tensor *ta = &a->tensors[i], *tb = rt_safetensors_find(b, ta->name);
        assert_non_null(tb);
        if (ta->dtype != RT_F32) continue;
        assert_int_equal(ta->end - ta->begin, tb->end - tb->begin);
        const float *x = ta->data, *y = tb->data;
        for (size_t k = 0; k < (ta->end - ta->begin) / 4; k++) {
            num += ((double)x[k] - y[k]) * ((double)x[k] - y[k]);
            den += (double)x[k] * x[k];
        }
    }
    rt_safetensors_free(a);
    rt_safetensors_free(b);
    return sqrt(num / den);
}

static void test_sync_bn_equals_global_batch(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/rt-syncbn-XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    job frozen = {"frozen", "false", "0"}, one = {"one", "true", "0.05"}, sync = {"sync", "true", "0.05"},
        local = {"local", "false", "0.05"};
    run(&frozen, 1);
    run(&one, 1); /* one rank: sync_bn has no group to reduce over (the plain layer) */
    run(&sync, 2);
    run(&local, 2);
    double moved = rel_err("one", "frozen"), e = rel_err("one", "sync"), e_local = rel_err("one", "local");
    printf("5 steps moved the state by %.3g; 2 ranks with sync_bn differ from 1 rank by %.3g, without by %.3g\n", moved,
           e, e_local);
    if (!(moved > 1e-3)) fail_msg("training did not move the state (%.3g): the comparison would be vacuous", moved);
    if (!(e < 1e-5)) fail_msg("2 ranks with model.sync_bn differ from 1 rank by %.3g (expected < 1e-5)", e);
    if (!(e_local > 100 * e && e_local > 1e-4))
        fail_msg("2 ranks without sync_bn differ from 1 rank by only %.3g: the test cannot tell them apart", e_local);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    if (tt_fashion_mnist_missing()) return 77;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sync_bn_equals_global_batch)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
