/* The optimizer configurations that both backend comparisons run: the GPU kernels on a
 * device (tests/optim/test_gpu_optim.c) and the same kernels on the emulated GPU
 * (tests/cuda_emu/test_emu_optim.c). Every optimizer with PyTorch's defaults and with its
 * options on, weight-decay exclusions (the caller's three ranges, placed to straddle its
 * bit-mask words), and the parameters' moving average. */
#ifndef RT_OPTIM_TEST_UTIL_H
#define RT_OPTIM_TEST_UTIL_H

#include "test_util.h"

#include "optim/optimizer.h"

#include <stdbool.h>

#define OPTIM_TEST_CONFIGS_MAX 11 /* room for every configuration below */

/* Fill cs (OPTIM_TEST_CONFIGS_MAX entries) and set *count; `ranges` (3 entries) must
 * outlive the configurations. */
static inline void optim_test_configs(rt_optim_config *cs, int *count, const rt_optim_range *ranges) {
    int k = 0;
    rt_optim_config_default(&cs[k++], RT_OPTIM_SGD);
    rt_optim_config_default(&cs[k], RT_OPTIM_SGD);
    cs[k].momentum = 0.9, cs[k].dampening = 0.2, cs[k].weight_decay = 1e-2, k++;
    rt_optim_config_default(&cs[k], RT_OPTIM_SGD);
    cs[k].momentum = 0.9, cs[k].nesterov = true, cs[k].weight_decay = 5e-4, cs[k].no_decay = ranges,
    cs[k].n_no_decay = 3, k++;
    rt_optim_config_default(&cs[k++], RT_OPTIM_ADAM);
    rt_optim_config_default(&cs[k], RT_OPTIM_ADAM);
    cs[k].weight_decay = 1e-2, cs[k].amsgrad = true, cs[k].no_decay = ranges, cs[k].n_no_decay = 3, k++;
    rt_optim_config_default(&cs[k++], RT_OPTIM_ADAMW);
    rt_optim_config_default(&cs[k], RT_OPTIM_ADAMW);
    cs[k].weight_decay = 0.1, cs[k].amsgrad = true, cs[k].betas[0] = 0.8, cs[k].eps = 1e-6, cs[k].no_decay = ranges,
    cs[k].n_no_decay = 3, k++;
    rt_optim_config_default(&cs[k++], RT_OPTIM_ADADELTA);
    rt_optim_config_default(&cs[k], RT_OPTIM_ADADELTA);
    cs[k].rho = 0.95, cs[k].eps = 1e-4, cs[k].lr = 0.5, cs[k].weight_decay = 1e-2, cs[k].no_decay = ranges,
    cs[k].n_no_decay = 3, k++;
    rt_optim_config_default(&cs[k], RT_OPTIM_SGD); /* the parameters' moving average, every 2 steps */
    cs[k].momentum = 0.9, cs[k].ema_decay = 0.9, cs[k].ema_every = 2, k++;
    *count = k;
}

/* The state buffers of opt (n floats each, in state order) copied into a new host buffer
 * (*count of them) and its step count into *steps: a checkpoint of the optimizer. */
static inline float *optim_test_save(rt_optimizer *opt, size_t n, int *count, int64_t *steps) {
    const int ns = rt_optimizer_state_count(opt);
    float *saved = malloc((ns ? (size_t)ns : 1) * n * sizeof(float));
    if (!saved) fail_msg("out of memory (%d state buffers of %zu floats)", ns, n);
    for (int i = 0; i < ns; i++) {
        rt_optim_state st;
        assert_rt_ok(rt_optimizer_state_get(opt, i, &st));
        assert_rt_ok(rt_optimizer_state_save(opt, st.name, saved + (size_t)i * n, n));
    }
    *count = ns;
    *steps = rt_optimizer_get_steps(opt);
    return saved;
}

/* Load what optim_test_save wrote into opt (a new optimizer of the same configuration),
 * restore the step count, and free `saved`. */
static inline void optim_test_load(rt_optimizer *opt, float *saved, size_t n, int64_t steps) {
    for (int i = 0; i < rt_optimizer_state_count(opt); i++) {
        rt_optim_state st;
        assert_rt_ok(rt_optimizer_state_get(opt, i, &st));
        assert_rt_ok(rt_optimizer_state_load(opt, st.name, saved + (size_t)i * n, n));
    }
    assert_rt_ok(rt_optimizer_set_steps(opt, steps));
    free(saved);
}

#endif
