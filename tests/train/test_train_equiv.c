/* The data-parallel step is the single-process step: 2 ranks with global batch B reach
 * the parameters 1 rank reaches with batch B, after 5 steps, for a model with neither
 * batch norm nor dropout (the tutorial Net, dropout 0), for every all-reduce algorithm
 * (ring, naive, rsag) and bucket size (0: one all-reduce after backward; tiny: one bucket
 * per block; the default 25 MiB). Real ranks through the public launcher (fork form),
 * real Fashion-MNIST (a subset), shuffling and augmentation on: the DistributedSampler
 * gives rank r the samples r, r+2, ... of the 1-rank batch, so only the summation order
 * differs (relative error < 1e-5). The ranks' own parameters are compared by the
 * trainer's checksum at the end (a mismatch fails the run). */
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
    const char *name, *algo, *bucket, *lr;
} job;

static int rank_fn(int local_rank, void *arg) {
    (void)local_rank;
    const job *j = arg;
    char dir[512], algo[64], bucket[64], lr[64];
    snprintf(lr, sizeof lr, "optim.lr=%s", j->lr);
    snprintf(dir, sizeof dir, "log.dir=%s/%s", g_dir, j->name);
    snprintf(algo, sizeof algo, "dist.algo=%s", j->algo);
    snprintf(bucket, sizeof bucket, "dist.bucket_mb=%s", j->bucket);
    const char *ov[] = {"model.arch=net",
                        "model.dropout=0",
                        "data.train_subset=512",
                        "data.test_subset=64",
                        "data.batch_size=32",
                        "train.max_steps=5",
                        "train.threads=1",
                        lr,
                        "optim.momentum=0.9",
                        "dist.transport=shm",
                        "dist.first_bucket_mb=0",
                        dir,
                        algo,
                        bucket,
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

/* ||a - b|| / ||a|| over every tensor of two state dicts with the same names. */
static double rel_err(const char *pa, const char *pb) {
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

static void test_equivalence(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/rt-equiv-XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    job one = {"one", "ring", "25", "0.05"}, frozen = {"frozen", "ring", "25", "0"};
    run(&frozen, 1);
    run(&one, 1);
    char ref[512];
    snprintf(ref, sizeof ref, "%s/one/model.safetensors", g_dir);
    char init[512];
    snprintf(init, sizeof init, "%s/frozen/model.safetensors", g_dir);
    double moved = rel_err(ref, init); /* lr 0 keeps the initial weights */
    printf("5 steps moved the parameters by %.3g (relative)\n", moved);
    if (!(moved > 1e-3))
        fail_msg("training did not move the parameters (%.3g): the comparison would be vacuous", moved);
    const char *algos[] = {"ring", "naive", "rsag"};
    const char *buckets[] = {"0", "0.0001", "25"};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            char name[64];
            snprintf(name, sizeof name, "%s-%s", algos[a], buckets[b]);
            job j = {name, algos[a], buckets[b], "0.05"};
            run(&j, 2);
            char got[512];
            snprintf(got, sizeof got, "%s/%s/model.safetensors", g_dir, name);
            double e = rel_err(ref, got);
            printf("%-14s relative error %.3g\n", name, e);
            if (!(e < 1e-5)) fail_msg("%s: 2 ranks differ from 1 rank by %.3g (expected < 1e-5)", name, e);
        }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    if (tt_fashion_mnist_missing()) return 77;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_equivalence)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
