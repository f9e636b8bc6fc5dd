/* What the trainer reports is what it did: the learning rate logged for step k is the
 * schedule's at iteration k - 1 (the rate the optimizer used: a warmup of 3 steps from
 * 0.25 x lr), the logged loss of a 2-rank step is the mean over the ranks (equal to the
 * 1-rank loss of the same global batch), and the test accuracy is the share of correct
 * samples (a whole number of samples, equal to the 1-rank run's). test_train_equiv
 * compares only the final parameters, which none of these change (found by
 * `make mutants`, docs/testing.md). Real Fashion-MNIST subset, forked ranks. */
#include "test_util.h"
#include "train/train_test_util.h"

#include "dist/dist.h"
#include "dist/launch.h"
#include "train/config.h"
#include "train/trainer.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char g_dir[256];

static int rank_fn(int local_rank, void *arg) {
    (void)local_rank;
    const char *name = arg;
    char dir[512];
    snprintf(dir, sizeof dir, "log.dir=%s/%s", g_dir, name);
    const char *ov[] = {"model.arch=net",
                        "model.dropout=0",
                        "data.train_subset=256",
                        "data.test_subset=100",
                        "data.batch_size=32",
                        "train.max_steps=5",
                        "train.threads=1",
                        "optim.lr=0.05",
                        "optim.momentum=0.9",
                        "optim.warmup_steps=3",
                        "optim.warmup_start_factor=0.25",
                        "dist.transport=shm",
                        dir,
                        "log.progress=off",
                        "dist.timeout_s=60"};
    rt_dist_env env;
    rt_train_result res;
    if (tt_train_rank(ov, (int)(sizeof ov / sizeof ov[0]), &env, &res) != 0) return 1;
    if (env.rank == 0) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s/result.txt", g_dir, name);
        FILE *f = fopen(p, "w");
        if (!f) return 3;
        fprintf(f, "%.17g %.17g %lld\n", res.test_accuracy, res.test_loss, (long long)res.test_samples);
        fclose(f);
    }
    return res.steps == 5 ? 0 : 2;
}

static void run(const char *name, int nproc) {
    rt_launch_options o;
    rt_launch_options_default(&o);
    o.nproc = nproc;
    o.timeout_s = 240;
    rt_launch_result res;
    rt_status s = rt_launch_fork(&o, rank_fn, (void *)name, &res);
    char line[2048];
    if (s != RT_OK) fail_msg("%s with %d rank(s): %s", name, nproc, rt_launch_describe(&res, line, sizeof line));
    rt_launch_result_free(&res);
}

typedef struct logged {
    double lr[5], loss[5];
    double acc, test_loss;
    long long samples;
} logged;

static double field(const char *line, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char *p = strstr(line, k);
    if (!p) fail_msg("no %s in %s", key, line);
    return strtod(p + strlen(k), NULL);
}

static void read_run(const char *name, logged *L) {
    char p[600], line[4096];
    snprintf(p, sizeof p, "%s/%s/metrics.jsonl", g_dir, name);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    int steps = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "\"kind\": \"step\"")) {
            int k = (int)field(line, "step");
            assert_true(k >= 1 && k <= 5);
            L->lr[k - 1] = field(line, "lr");
            L->loss[k - 1] = field(line, "loss");
            steps++;
        }
    fclose(f);
    assert_int_equal(steps, 5);
    snprintf(p, sizeof p, "%s/%s/result.txt", g_dir, name);
    f = fopen(p, "r");
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%lf %lf %lld", &L->acc, &L->test_loss, &L->samples), 3);
    fclose(f);
}

static void test_logged_values(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/rt-logged-XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    run("one", 1);
    run("two", 2);
    logged a, b;
    read_run("one", &a);
    read_run("two", &b);
    for (int k = 0; k < 5; k++) {
        /* LinearLR(start_factor 0.25, total_iters 3): iteration k uses 0.25 + 0.75 k / 3 */
        double want = 0.05 * (k < 3 ? 0.25 + 0.75 * k / 3.0 : 1.0);
        print_message("step %d: lr %.6g (want %.6g), loss %.6g (1 rank) %.6g (2 ranks)\n", k + 1, a.lr[k], want,
                      a.loss[k], b.loss[k]);
        assert_true(fabs(a.lr[k] - want) <= 1e-6 * want);
        assert_true(fabs(b.lr[k] - want) <= 1e-6 * want);
        /* the mean over the ranks of their batch means: the 1-rank loss of the same batch */
        assert_true(fabs(a.loss[k] - b.loss[k]) <= 1e-4 * fabs(a.loss[k]));
    }
    print_message("test accuracy %.6g / %.6g, loss %.6g / %.6g, %lld / %lld samples\n", a.acc, b.acc, a.test_loss,
                  b.test_loss, a.samples, b.samples);
    assert_int_equal(a.samples, 100);
    assert_int_equal(b.samples, 100);
    for (int i = 0; i < 2; i++) {
        double acc = i ? b.acc : a.acc;
        assert_true(acc >= 0 && acc <= 1);
        double correct = acc * 100;
        assert_true(fabs(correct - round(correct)) < 1e-9); /* a share of whole samples */
    }
    assert_true(fabs(a.acc - b.acc) <= 0.011); /* the same model up to rounding: at most a sample flips */
    assert_true(fabs(a.test_loss - b.test_loss) <= 1e-4 * fabs(a.test_loss));
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    if (tt_fashion_mnist_missing()) return 77;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_logged_values)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
