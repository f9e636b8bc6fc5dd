/* Shared helpers for the cmocka tests. */
#ifndef RT_TEST_UTIL_H
#define RT_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <cmocka.h>

#include "core/device.h"
#include "core/status.h"

/* Assert an rt_status is RT_OK, printing the recorded error otherwise. */
#define assert_rt_ok(expr)                                                                    \
    do {                                                                                      \
        rt_status s_ = (expr);                                                                \
        if (s_ != RT_OK) fail_msg("%s -> %s: %s", #expr, rt_status_name(s_), rt_error_message()); \
    } while (0)

/* GPU tests: exit 77 (ctest: skipped) when no device answers. */
#define RT_SKIP_WITHOUT_GPU()                                                                 \
    do {                                                                                      \
        int n_ = 0;                                                                           \
        if (rt_cuda_device_count(&n_) != RT_OK) {                                             \
            printf("SKIP: %s\n", rt_error_message());                                        \
            return 77;                                                                        \
        }                                                                                     \
    } while (0)

#endif
