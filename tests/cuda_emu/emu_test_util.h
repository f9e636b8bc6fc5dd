/* Helpers of the emulated-kernel tests (tests/cuda_emu): random host data from a seed
 * (fixed by default so the unit tests are reproducible; RINGTRAIN_TEST_SEED picks
 * another), buffers of the emulated device poisoned with NaN before a kernel writes
 * them (an element a kernel forgets to write fails the comparison), and the
 * comparisons: exact (bit for bit, any NaN equal to any NaN) and within one float ulp. */
#ifndef RT_EMU_TEST_UTIL_H
#define RT_EMU_TEST_UTIL_H

#include "rt_emu_names.h" /* the launchers of the host-compiled copies: rt_emu_* */
#include "test_util.h"

#include "core/rng.h"

#include <math.h>
#include <string.h>

static uint64_t g_seed = 20240611;
static uint64_t g_subseq;

static inline void et_pick_seed(void) {
    const char *env = getenv("RINGTRAIN_TEST_SEED");
    if (env && *env) g_seed = strtoull(env, NULL, 0);
    printf("seed %llu (RINGTRAIN_TEST_SEED=N picks another)\n", (unsigned long long)g_seed);
}

static inline float *et_alloc(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) fail_msg("out of memory (%zu floats)", n);
    return p;
}
static inline float *et_nan(size_t n) {
    float *p = et_alloc(n);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}
static inline float *et_randn(size_t n, float std) {
    float *p = et_alloc(n);
    rt_rng r;
    rt_rng_init(&r, g_seed, ++g_subseq);
    rt_rng_normal(&r, p, n, 0.0f, std);
    return p;
}
static inline float *et_copy(const float *x, size_t n) {
    float *p = et_alloc(n);
    memcpy(p, x, n * sizeof(float));
    return p;
}
static inline void et_poison(float *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}

/* bit for bit (NaN: any NaN) */
static inline void et_check_exact(const char *what, const float *cpu, const float *gpu, size_t n) {
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&cpu[i], &gpu[i], sizeof(float)) != 0 && !(isnan(cpu[i]) && isnan(gpu[i]))) {
            if (!differ) first = i;
            differ++;
        }
    printf("  %-44s %zu of %zu differ\n", what, differ, n);
    if (differ)
        fail_msg("%s: %zu elements differ from the CPU (first %zu: cpu %.9g emulated gpu %.9g)", what, differ, first,
                 (double)cpu[first], (double)gpu[first]);
}

/* equal, or the neighbouring float: what two double sums of the same terms in different
 * orders give once rounded to float */
static inline void et_check_ulp(const char *what, float cpu, float gpu) {
    printf("  %-44s cpu %.9g emulated gpu %.9g\n", what, (double)cpu, (double)gpu);
    if (!(gpu == cpu || gpu == nextafterf(cpu, INFINITY) || gpu == nextafterf(cpu, -INFINITY)))
        fail_msg("%s: cpu %.9g emulated gpu %.9g: more than one float ulp apart", what, (double)cpu, (double)gpu);
}

#endif
