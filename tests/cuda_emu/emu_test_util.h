/* Helpers of the emulated-kernel tests (tests/cuda_emu): random host data from a seed
 * (fixed by default so the unit tests are reproducible; RINGTRAIN_TEST_SEED picks
 * another), buffers of the emulated device poisoned with NaN before a kernel writes
 * them (an element a kernel forgets to write fails the comparison), and the
 * comparisons: exact (bit for bit, any NaN equal to any NaN) and within one float ulp. The
 * host buffers and the bit count are float_test_util.h's, shared with tests/model/test_gpu_*.c. */
#ifndef RT_EMU_TEST_UTIL_H
#define RT_EMU_TEST_UTIL_H

#include "rt_emu_names.h" /* the launchers of the host-compiled copies: rt_emu_* */
#include "float_test_util.h"

#include <math.h>
#include <string.h>

/* g_seed: 20240611, or RINGTRAIN_TEST_SEED */
static inline void et_pick_seed(void) {
    g_seed = 20240611;
    const char *env = getenv("RINGTRAIN_TEST_SEED");
    if (env && *env) g_seed = strtoull(env, NULL, 0);
    printf("seed %llu (RINGTRAIN_TEST_SEED=N picks another)\n", (unsigned long long)g_seed);
}

static inline void et_poison(float *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}

/* bit for bit (NaN: any NaN) */
static inline void et_check_exact(const char *what, const float *cpu, const float *gpu, size_t n) {
    size_t first = 0, differ = rt_test_count_differ(cpu, gpu, n, &first);
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
