/* Host float buffers and the bit-exact comparison, shared by the tests that hold a GPU
 * backend to the CPU one: tests/model (gpu_test_util.h) on a GPU and tests/cuda_emu
 * (emu_test_util.h) on the emulated one. Random data is drawn from Philox stream
 * (g_seed, ++g_subseq): every fill takes a new subsequence, so the data depends only on
 * the seed and the order of the fills. */
#ifndef RT_FLOAT_TEST_UTIL_H
#define RT_FLOAT_TEST_UTIL_H

#include "test_util.h"

#include "core/rng.h"

#include <math.h>
#include <string.h>

static uint64_t g_seed;   /* the test's seed (its main() picks it and prints it) */
static uint64_t g_subseq; /* the Philox subsequence of the last random fill */

/* n floats on the host (at least one), uninitialised; fails the test when out of memory */
static inline float *rt_test_floats(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) fail_msg("out of memory (%zu floats)", n);
    return p;
}
/* n NaNs on the host */
static inline float *rt_test_nans(size_t n) {
    float *p = rt_test_floats(n);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}
/* n normal(0, std) floats from the next subsequence of g_seed */
static inline float *rt_test_randn(size_t n, float std) {
    float *p = rt_test_floats(n);
    rt_rng r;
    rt_rng_init(&r, g_seed, ++g_subseq);
    rt_rng_normal(&r, p, n, 0.0f, std);
    return p;
}
/* a host copy of n floats */
static inline float *rt_test_copy(const float *x, size_t n) {
    float *p = rt_test_floats(n);
    memcpy(p, x, n * sizeof(float));
    return p;
}
/* The elements of a and b (n floats) that differ in some bit, a NaN being equal to any
 * NaN; *first is the index of the first (0 when none). */
static inline size_t rt_test_count_differ(const float *a, const float *b, size_t n, size_t *first) {
    size_t differ = 0;
    *first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0 && !(isnan(a[i]) && isnan(b[i]))) {
            if (!differ) *first = i;
            differ++;
        }
    return differ;
}

#endif
