/* Shared helpers for the cmocka tests. */
#ifndef RT_TEST_UTIL_H
#define RT_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "core/device.h"
#include "core/status.h"

/* Assert an rt_status is RT_OK, printing the recorded error otherwise. */
#define assert_rt_ok(expr)                                                                                             \
    do {                                                                                                               \
        rt_status s_ = (expr);                                                                                         \
        if (s_ != RT_OK) fail_msg("%s -> %s: %s", #expr, rt_status_name(s_), rt_error_message());                      \
    } while (0)

/* Assert that an expression fails with `code` and an error message containing `needle`. */
#define assert_rt_fails(expr, code, needle)                                                                            \
    do {                                                                                                               \
        rt_status s_ = (expr);                                                                                         \
        if (s_ != (code))                                                                                              \
            fail_msg("%s -> %s, expected %s (%s)", #expr, rt_status_name(s_), rt_status_name(code),                    \
                     rt_error_message());                                                                              \
        if (!strstr(rt_error_message(), (needle)))                                                                     \
            fail_msg("%s: message \"%s\" lacks \"%s\"", #expr, rt_error_message(), (needle));                          \
    } while (0)

/* GPU tests: what main() does about the device, from the status of rt_cuda_device_count
 * (`why` is its message): 0 = run the tests; 77 = skip (ctest: skipped), only for "no GPU"
 * (RT_ERR_NODEVICE); 1 = fail, for any other error (a GPU that is there but unusable, e.g.
 * a driver too old for this CUDA) and for "no GPU" when RINGTRAIN_REQUIRE_GPU is set to
 * anything but "" or "0" (scripts/gpu-check sets it: a GPU check cannot pass by skipping). */
static inline bool rt_test_require_gpu(void) {
    const char *e = getenv("RINGTRAIN_REQUIRE_GPU");
    return e && *e && !(e[0] == '0' && e[1] == 0);
}
static inline int rt_test_gpu_exit_code(rt_status count_status, const char *why) {
    if (count_status == RT_OK) return 0;
    if (count_status == RT_ERR_NODEVICE && !rt_test_require_gpu()) {
        printf("SKIP: %s\n", why);
        return 77;
    }
    if (count_status == RT_ERR_NODEVICE)
        printf("FAIL: RINGTRAIN_REQUIRE_GPU is set, but %s\n", why);
    else
        printf("FAIL: the GPU cannot be used (%s): %s\n", rt_status_name(count_status), why);
    return 1;
}

/* main(): skip (77) when no device answers, fail (1) under RINGTRAIN_REQUIRE_GPU=1 or
 * when the GPU is there but unusable */
#define RT_SKIP_WITHOUT_GPU()                                                                                          \
    do {                                                                                                               \
        int n_ = 0;                                                                                                    \
        rt_status st_ = rt_cuda_device_count(&n_);                                                                     \
        int rc_ = rt_test_gpu_exit_code(st_, st_ == RT_OK ? "" : rt_error_message());                                  \
        if (rc_ != 0) return rc_;                                                                                      \
    } while (0)

/* The GPU count probed in a child (so the parent, which forks ranks, never touches CUDA),
 * for main() of multi-process GPU tests: returns the count (1..100) to run with, or sets
 * *exit_code: 77 for no GPU (as rt_test_gpu_exit_code, RINGTRAIN_REQUIRE_GPU included),
 * 1 for a GPU that cannot be used or a crashing probe. */
static inline int rt_test_probe_gpus(int *exit_code) {
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        int n = 0;
        rt_status s = rt_cuda_device_count(&n);
        _exit(s == RT_OK ? (n > 100 ? 100 : n) : s == RT_ERR_NODEVICE ? 0 : 101);
    }
    int st = 0;
    if (p < 0 || waitpid(p, &st, 0) != p || !WIFEXITED(st)) {
        printf("FAIL: the GPU probe (rt_cuda_device_count in a child) crashed\n");
        *exit_code = 1;
        return 0;
    }
    int n = WEXITSTATUS(st);
    if (n == 101) {
        printf("FAIL: the GPU cannot be used (rt_cuda_device_count failed with something other than no GPU)\n");
        *exit_code = 1;
        return 0;
    }
    *exit_code = n == 0 ? rt_test_gpu_exit_code(RT_ERR_NODEVICE, "no GPU") : 0;
    return n;
}

#endif
