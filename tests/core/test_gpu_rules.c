/* The rules around a GPU that runs without one (label unit): the exit code of a GPU
 * test's main() for each device-count status (skip only for "no GPU", fail under
 * RINGTRAIN_REQUIRE_GPU=1 or for an unusable GPU), the message for a driver too old
 * for the CUDA runtime (it names both versions), and which cudaGetDeviceCount failures
 * are "no GPU" and which are errors naming their cause. */
#include "test_util.h"

#include "core/cuda/driver_version.h"

#include <string.h>

static void skip_only_for_no_gpu(void **s) {
    (void)s;
    unsetenv("RINGTRAIN_REQUIRE_GPU");
    assert_int_equal(rt_test_gpu_exit_code(RT_OK, ""), 0);
    assert_int_equal(rt_test_gpu_exit_code(RT_ERR_NODEVICE, "no GPU: no driver"), 77);
    /* a GPU that is there but cannot be used (e.g. an old driver) is a failure */
    assert_int_equal(rt_test_gpu_exit_code(RT_ERR_CUDA, "the NVIDIA driver is too old"), 1);
    assert_int_equal(rt_test_gpu_exit_code(RT_ERR_INVALID, "?"), 1);
    setenv("RINGTRAIN_REQUIRE_GPU", "0", 1); /* "0" and "" do not require */
    assert_int_equal(rt_test_gpu_exit_code(RT_ERR_NODEVICE, "no GPU"), 77);
    setenv("RINGTRAIN_REQUIRE_GPU", "", 1);
    assert_int_equal(rt_test_gpu_exit_code(RT_ERR_NODEVICE, "no GPU"), 77);
    unsetenv("RINGTRAIN_REQUIRE_GPU");
}

static void require_gpu_turns_skip_into_failure(void **s) {
    (void)s;
    setenv("RINGTRAIN_REQUIRE_GPU", "1", 1);
    assert_true(rt_test_require_gpu());
    assert_int_equal(rt_test_gpu_exit_code(RT_ERR_NODEVICE, "no GPU: no driver"), 1);
    assert_int_equal(rt_test_gpu_exit_code(RT_ERR_CUDA, "old driver"), 1);
    assert_int_equal(rt_test_gpu_exit_code(RT_OK, ""), 0);
    unsetenv("RINGTRAIN_REQUIRE_GPU");
    assert_false(rt_test_require_gpu());
}

static void old_driver_message_names_both_versions(void **s) {
    (void)s;
    char m[512];
    rt_cuda_old_driver_message(m, sizeof m, 12020, 13000, "535.104.05");
    printf("%s\n", m);
    assert_non_null(strstr(m, "too old"));
    assert_non_null(strstr(m, "supports CUDA 12.2 (kernel module 535.104.05)"));
    assert_non_null(strstr(m, "built with the CUDA 13.0 runtime"));
    assert_non_null(strstr(m, "needs a driver for CUDA 13.0 or newer"));
    assert_non_null(strstr(m, "cudaErrorInsufficientDriver"));
    assert_null(strstr(m, "no GPU"));

    /* a 13.1 runtime runs on a 13.0 driver (minor-version compatibility) */
    assert_int_equal(rt_cuda_driver_min_for_runtime(13010), 13000);
    assert_int_equal(rt_cuda_driver_min_for_runtime(12080), 12000);
    assert_int_equal(rt_cuda_driver_min_for_runtime(0), 0);
    rt_cuda_old_driver_message(m, sizeof m, 11080, 13010, NULL);
    printf("%s\n", m);
    assert_non_null(strstr(m, "supports CUDA 11.8, but"));
    assert_non_null(strstr(m, "CUDA 13.1 runtime, which needs a driver for CUDA 13.0 or newer"));
    assert_null(strstr(m, "kernel module"));

    /* unknown driver version, empty module string */
    rt_cuda_old_driver_message(m, sizeof m, 0, 13000, "");
    printf("%s\n", m);
    assert_non_null(strstr(m, "unknown (cuDriverGetVersion failed)"));
    assert_null(strstr(m, "kernel module"));
}

/* Only no device and no driver are "no GPU" (device auto then uses the CPU); a driver
 * updated without a reboot, GPUs busy in exclusive mode, a failed initialisation are
 * errors that name the cause, also where libcuda.so.1 does not load (the emulated
 * runtime has none) */
static void probe_failures_other_than_no_gpu_are_errors(void **s) {
    (void)s;
    assert_int_equal(rt_cuda_probe_classify(RT_CUDA_ERR_NO_DEVICE, true), RT_CUDA_PROBE_NO_GPU);
    assert_int_equal(rt_cuda_probe_classify(RT_CUDA_ERR_NO_DEVICE, false), RT_CUDA_PROBE_NO_GPU);
    assert_int_equal(rt_cuda_probe_classify(RT_CUDA_ERR_INSUFFICIENT_DRIVER, false), RT_CUDA_PROBE_NO_GPU);
    assert_int_equal(rt_cuda_probe_classify(RT_CUDA_ERR_INSUFFICIENT_DRIVER, true), RT_CUDA_PROBE_OLD_DRIVER);
    assert_int_equal(rt_cuda_probe_classify(RT_CUDA_ERR_STUB_LIBRARY, true), RT_CUDA_PROBE_NO_GPU);
    const int specific[] = {RT_CUDA_ERR_SYSTEM_DRIVER_MISMATCH, RT_CUDA_ERR_DEVICES_UNAVAILABLE,
                            RT_CUDA_ERR_INITIALIZATION, RT_CUDA_ERR_SYSTEM_NOT_READY, RT_CUDA_ERR_COMPAT_NOT_SUPPORTED};
    for (size_t i = 0; i < sizeof specific / sizeof specific[0]; i++) {
        assert_int_equal(rt_cuda_probe_classify(specific[i], true), RT_CUDA_PROBE_ERROR);
        assert_int_equal(rt_cuda_probe_classify(specific[i], false), RT_CUDA_PROBE_ERROR);
        assert_non_null(rt_cuda_probe_cause(specific[i]));
    }
    /* any other failure with a driver installed is an error too (999: cudaErrorUnknown) */
    assert_int_equal(rt_cuda_probe_classify(999, true), RT_CUDA_PROBE_ERROR);
    assert_int_equal(rt_cuda_probe_classify(999, false), RT_CUDA_PROBE_NO_GPU);
    assert_null(rt_cuda_probe_cause(999));

    char m[1024];
    rt_cuda_probe_message(m, sizeof m, 803, "cudaErrorSystemDriverMismatch", "system has unsupported display driver");
    printf("%s\n", m);
    assert_non_null(strstr(m, "cudaErrorSystemDriverMismatch (803"));
    assert_non_null(strstr(m, "updated without a reboot"));
    assert_non_null(strstr(m, "reboot, or reload the kernel module"));
    assert_non_null(strstr(m, "device: cpu"));
    assert_null(strstr(m, "no GPU"));
    rt_cuda_probe_message(m, sizeof m, 46, "cudaErrorDevicesUnavailable", "busy");
    printf("%s\n", m);
    assert_non_null(strstr(m, "exclusive-process"));
    assert_non_null(strstr(m, "CUDA_VISIBLE_DEVICES"));
    rt_cuda_probe_message(m, sizeof m, 3, "cudaErrorInitializationError", "initialization error");
    printf("%s\n", m);
    assert_non_null(strstr(m, "failed to initialise"));
    assert_non_null(strstr(m, "/dev/nvidia"));
    rt_cuda_probe_message(m, sizeof m, 999, "cudaErrorUnknown", "unknown error");
    assert_non_null(strstr(m, "cudaErrorUnknown (999: unknown error)"));
    assert_non_null(strstr(m, "nvidia-smi"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(skip_only_for_no_gpu),
        cmocka_unit_test(require_gpu_turns_skip_into_failure),
        cmocka_unit_test(old_driver_message_names_both_versions),
        cmocka_unit_test(probe_failures_other_than_no_gpu_are_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
