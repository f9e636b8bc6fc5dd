/* Helpers of the GPU model tests: a CPU and a CUDA context, a seed that changes every
 * run (printed; RINGTRAIN_TEST_SEED repeats a run), random host data, device buffers
 * poisoned with NaN before a layer writes them, and the comparison against the CPU
 * backend. Host buffers (rt_test_floats, rt_test_nans, rt_test_randn), g_seed and the
 * bit count of the exact comparison are float_test_util.h's, shared with tests/cuda_emu.
 *
 * Relative error of a result is max_i |gpu_i - cpu_i| / max_i |cpu_i| (the max-norm
 * error relative to the result's scale); a NaN or infinity in the GPU result where the
 * CPU has a finite value (e.g. an element the GPU never wrote: it keeps its NaN
 * poison) counts as an infinite error.
 *
 * RINGTRAIN_GPU_TESTS_ON_CPU=1 runs the "GPU" side on a second CPU context instead:
 * a self-check of the test harness for machines without a GPU (not a GPU test; ctest
 * never sets it).
 *
 * Transfers use the legacy default stream, and every upload, download and poison is
 * followed by cudaDeviceSynchronize, so the tests never race the contexts' own
 * non-blocking streams. */
#ifndef RT_GPU_TEST_UTIL_H
#define RT_GPU_TEST_UTIL_H

#include "float_test_util.h"

#include "core/rng.h"
#include "model/layers.h"
#include "model/model.h"

#include <math.h>
#include <string.h>
#include <time.h>
#ifdef RT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

static rt_model_ctx *g_cpu, *g_gpu;

/* 1e-5 forward, 1e-4 gradients (fp32, the bounds) */
#define TOL_FWD 1e-5
#define TOL_GRAD 1e-4

static inline bool gt_on_cpu(void);
static inline void gt_sync(void) {
#ifdef RT_HAVE_CUDA
    if (gt_on_cpu()) return; /* the harness self-check has no GPU to wait for */
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) fail_msg("cudaDeviceSynchronize: %s", cudaGetErrorString(e));
#endif
}

static inline uint64_t gt_pick_seed(void) {
    const char *env = getenv("RINGTRAIN_TEST_SEED");
    uint64_t s = 0;
    if (env && *env) {
        s = strtoull(env, NULL, 0);
    } else {
        FILE *f = fopen("/dev/urandom", "rb");
        if (!f || fread(&s, sizeof s, 1, f) != 1) s = (uint64_t)time(NULL) * 2654435761u;
        if (f) fclose(f);
    }
    printf("seed %llu (RINGTRAIN_TEST_SEED=%llu repeats this run)\n", (unsigned long long)s, (unsigned long long)s);
    return s;
}

/* A context whose activations are in `fmt` (NULL: the backend's format for the precision). */
static inline rt_model_ctx *gt_ctx_fmt(rt_device d, rt_precision prec, const rt_act_format *fmt) {
    rt_model_ctx *ctx = NULL;
    /* the timed search (cudnnFind*), what these tests were written against: the workspace
     * bound, refusals and fallbacks go through it (train's default, the heuristics, is
     * covered end to end by emu_determinism_* and cli_bench_model_cudnn_gpu) */
    rt_model_ctx_options o = {.device = d, .threads = 4, .precision = prec, .benchmark = true, .act_format = fmt};
    assert_rt_ok(rt_model_ctx_create(&o, &ctx));
    return ctx;
}

/* The per-layer tests' context: activations in fp32 NCHW whatever the precision, so the
 * layers are compared with the CPU's at PyTorch's layout through plain float buffers (the
 * tf32/bf16 kernels and the bf16 casts of that format); the NHWC formats' layers are
 * tested in test_gpu_act_formats and test_gpu_conv_act, whole models in their native
 * format (gt_ctx_native). */
static inline rt_model_ctx *gt_ctx(rt_device d, rt_precision prec) {
    static const rt_act_format nchw = {RT_F32, RT_ACT_NCHW, 1};
    return gt_ctx_fmt(d, prec, &nchw);
}
static inline rt_model_ctx *gt_ctx_native(rt_device d, rt_precision prec) { return gt_ctx_fmt(d, prec, NULL); }

/* the device of the side under test: cuda:0, or the CPU for the harness self-check */
static inline bool gt_on_cpu(void) {
    const char *e = getenv("RINGTRAIN_GPU_TESTS_ON_CPU");
    return e && strcmp(e, "1") == 0;
}
static inline rt_device gt_gpu_device(void) { return gt_on_cpu() ? rt_device_cpu() : rt_device_cuda(0); }

/* main(): skip without a GPU (unless self-checking the harness on the CPU); the
 * self-check is no GPU test, so RINGTRAIN_REQUIRE_GPU=1 fails it as it fails a skip */
#define GT_SKIP_WITHOUT_GPU()                                                                                          \
    do {                                                                                                               \
        if (gt_on_cpu() && rt_test_require_gpu()) {                                                                    \
            printf("FAIL: RINGTRAIN_REQUIRE_GPU is set, but RINGTRAIN_GPU_TESTS_ON_CPU=1 runs no GPU code\n");         \
            return 1;                                                                                                  \
        }                                                                                                              \
        if (gt_on_cpu())                                                                                               \
            printf("RINGTRAIN_GPU_TESTS_ON_CPU=1: harness self-check, the GPU side runs on the CPU\n");                \
        else                                                                                                           \
            RT_SKIP_WITHOUT_GPU();                                                                                     \
    } while (0)

/* group setup: both contexts, fp32 */
static inline int gt_setup(void **state) {
    (void)state;
    g_cpu = gt_ctx(rt_device_cpu(), RT_PRECISION_FP32);
    g_gpu = gt_ctx(gt_gpu_device(), RT_PRECISION_FP32);
    return 0;
}
static inline int gt_teardown(void **state) {
    (void)state;
    rt_model_ctx_destroy(g_gpu);
    rt_model_ctx_destroy(g_cpu);
    return 0;
}

/* ---- host data (more in float_test_util.h) ------------------------------------------ */

static inline float *gt_uniform(size_t n, float lo, float hi) {
    float *p = rt_test_floats(n);
    rt_rng r;
    rt_rng_init(&r, g_seed, ++g_subseq);
    rt_rng_uniform_range(&r, p, n, lo, hi);
    return p;
}
static inline int64_t *gt_labels(size_t n, int k) {
    int64_t *p = malloc((n ? n : 1) * sizeof(int64_t));
    rt_rng r;
    rt_rng_init(&r, g_seed, ++g_subseq);
    for (size_t i = 0; i < n; i++) p[i] = (int64_t)rt_rng_below(&r, (uint64_t)k);
    return p;
}

/* ---- device buffers ---------------------------------------------------------------- */

static inline void *gt_dev(size_t bytes) {
    void *p = NULL;
    assert_rt_ok(rt_malloc(g_gpu->device, bytes ? bytes : 4, &p));
    return p;
}
static inline void gt_upload(void *dst, const void *src, size_t bytes) {
    gt_sync();
    assert_rt_ok(rt_memcpy(dst, g_gpu->device, src, rt_device_cpu(), bytes, NULL));
    gt_sync();
}
static inline void gt_download(void *dst, const void *src, size_t bytes) {
    gt_sync();
    assert_rt_ok(rt_memcpy(dst, rt_device_cpu(), src, g_gpu->device, bytes, NULL));
    gt_sync();
}
/* 0xFF bytes: every float is a NaN */
static inline void gt_poison(void *p, size_t bytes) {
    gt_sync();
    assert_rt_ok(rt_memset(g_gpu->device, p, 0xff, bytes, NULL));
    gt_sync();
}
/* device copy of n host floats */
static inline float *gt_dev_copy(const float *h, size_t n) {
    float *d = gt_dev(n * sizeof(float));
    gt_upload(d, h, n * sizeof(float));
    return d;
}
/* device buffer of n floats, NaN */
static inline float *gt_dev_nan(size_t n) {
    float *d = gt_dev(n * sizeof(float));
    gt_poison(d, n * sizeof(float));
    return d;
}
static inline void gt_free(void *d) { rt_free(g_gpu->device, d); }

/* ---- comparison -------------------------------------------------------------------- */

/* max-norm relative error of gpu against cpu (host arrays) */
static inline double gt_rel_err(const float *cpu, const float *gpu, size_t n, size_t *worst_at) {
    double scale = 0, err = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)cpu[i]));
    for (size_t i = 0; i < n; i++) {
        double d;
        if (isfinite(cpu[i]) && !isfinite(gpu[i]))
            d = INFINITY;
        else if (isnan(cpu[i]) && isnan(gpu[i]))
            d = 0;
        else
            d = fabs((double)gpu[i] - (double)cpu[i]);
        if (!(d <= err)) {
            err = d;
            at = i;
        }
    }
    if (worst_at) *worst_at = at;
    if (scale == 0) return err; /* all-zero reference: absolute */
    return err / scale;
}

/* compare host cpu[] with device gpu_dev[] (n floats) within tol; prints the error */
static inline double gt_check_dev(const char *what, const float *cpu, const float *gpu_dev, size_t n, double tol) {
    float *g = rt_test_floats(n);
    gt_download(g, gpu_dev, n * sizeof(float));
    size_t at = 0;
    double e = gt_rel_err(cpu, g, n, &at);
    printf("  %-40s rel err %.3g (tol %.0e)\n", what, e, tol);
    if (!(e <= tol))
        fail_msg("%s: relative error %.3g > %.0e (element %zu: cpu %.9g gpu %.9g, seed %llu)", what, e, tol, at,
                 (double)cpu[at], (double)g[at], (unsigned long long)g_seed);
    free(g);
    return e;
}

/* bit-exact comparison for the ops whose kernels repeat the CPU arithmetic */
static inline void gt_check_exact(const char *what, const float *cpu, const float *gpu_dev, size_t n) {
    float *g = rt_test_floats(n);
    gt_download(g, gpu_dev, n * sizeof(float));
    size_t first = 0, differ = rt_test_count_differ(cpu, g, n, &first);
    printf("  %-40s %zu of %zu elements differ\n", what, differ, n);
    if (differ)
        fail_msg("%s: %zu elements differ from the CPU backend (first %zu: cpu %.9g gpu %.9g, seed %llu)", what, differ,
                 first, (double)cpu[first], (double)g[first], (unsigned long long)g_seed);
    free(g);
}

#endif
