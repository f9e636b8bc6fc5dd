/* For tests that train real ranks through the launcher's fork form: the body of a rank.
 * Loads a config from overrides only, reads the rank from the environment the launcher
 * set, trains with the progress output discarded. Returns 0, or 1 with the error on
 * stderr (the launcher reports the rank and that line). */
#ifndef RT_TEST_TRAIN_UTIL_H
#define RT_TEST_TRAIN_UTIL_H

#include "core/status.h"
#include "dist/dist.h"
#include "train/config.h"
#include "train/trainer.h"

#include <stdbool.h>
#include <stdio.h>
#include <unistd.h>

static inline int tt_train_rank(const char *const *ov, int n, rt_dist_env *env, rt_train_result *res) {
    rt_config cfg;
    if (rt_config_load(&cfg, NULL, n, ov) != RT_OK) {
        fprintf(stderr, "config: %s\n", rt_error_message());
        return 1;
    }
    if (rt_dist_env_read(env) != RT_OK) {
        fprintf(stderr, "env: %s\n", rt_error_message());
        return 1;
    }
    rt_train_rank who = {env->rank, env->world_size, env->local_rank, env->local_world_size};
    FILE *devnull = fopen("/dev/null", "w");
    rt_status s = rt_train(&cfg, &who, devnull, res);
    if (devnull) fclose(devnull);
    if (s != RT_OK) {
        fprintf(stderr, "train: %s\n", rt_error_message());
        return 1;
    }
    return 0;
}

/* Fashion-MNIST from Debian's dataset-fashion-mnist, which these tests train on: main()
 * returns 77 (ctest: skipped) when it is missing, before cmocka (whose skip() counts
 * as passed) runs. */
#define TT_FASHION_MNIST "/usr/share/datasets/fashion-mnist"
static inline bool tt_fashion_mnist_missing(void) {
    if (access(TT_FASHION_MNIST, R_OK) == 0) return false;
    printf("SKIP: no %s (scripts/install-deps test installs dataset-fashion-mnist)\n", TT_FASHION_MNIST);
    return true;
}

#endif
