/* The step records of a GPU run reach metrics.jsonl in step order (issue 19, defect 5).
 *
 * On a GPU a step's stage times come from CUDA events read a step late: the trainer
 * keeps two pending records and logs each once its events are complete. The run here
 * has an odd number of steps (3) and the emulated streams delay every operation
 * (RINGTRAIN_EMU_DELAY_US), so the last two records are still pending when training
 * ends; they used to be flushed slot 0 then slot 1, which logged step 3 before step 2
 * (and `ringtrain report` then took step 2 for a rewind). Every step line must count up
 * by one. Label gpu: runs on emulated GPUs in the RINGTRAIN_CUDA=EMU build and on a real
 * one; skipped (77) without a GPU or without Fashion-MNIST. */
#include "test_util.h"
#include "train/train_test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void steps_logged_in_order(void **s) {
    (void)s;
    char dir[] = "/tmp/rt-gpu-log-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char logdir[128];
    snprintf(logdir, sizeof logdir, "log.dir=%s", dir);
    const char *ov[] = {"model.arch=net",     "data.train_subset=96", "data.test_subset=32",
                        "data.batch_size=32", "train.epochs=1",       "train.threads=1",
                        "train.device=cuda",  "log.progress=off",     logdir};
    rt_config cfg;
    assert_rt_ok(rt_config_load(&cfg, NULL, (int)(sizeof ov / sizeof ov[0]), ov));
    rt_train_rank who = {0, 1, 0, 1};
    rt_train_result res;
    FILE *devnull = fopen("/dev/null", "w");
    assert_non_null(devnull);
    rt_status st = rt_train(&cfg, &who, devnull, &res);
    fclose(devnull);
    assert_rt_ok(st);
    assert_int_equal(res.steps, 3);

    char path[RT_CONFIG_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", res.run_dir);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("no %s", path);
    char line[4096];
    long long want = 1;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, "\"kind\": \"step\"")) continue;
        const char *k = strstr(line, "\"step\": ");
        assert_non_null(k);
        long long got = strtoll(k + 8, NULL, 10);
        printf("logged step %lld\n", got);
        if (got != want) fail_msg("metrics.jsonl: step %lld logged where step %lld was due (%s)", got, want, path);
        want++;
    }
    fclose(f);
    assert_int_equal(want, 4); /* steps 1, 2, 3 */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    if (tt_fashion_mnist_missing()) return 77;
    /* before the first CUDA call: the emulated streams delay every operation, so the
     * last steps' events are not complete when training ends (a real GPU ignores it) */
    setenv("RINGTRAIN_EMU_DELAY_US", "2000", 0);
    RT_SKIP_WITHOUT_GPU();
    const struct CMUnitTest tests[] = {cmocka_unit_test(steps_logged_in_order)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
