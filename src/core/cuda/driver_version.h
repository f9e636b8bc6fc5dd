/* The message for a GPU driver too old for the CUDA runtime ringtrain was built with
 * (cudaErrorInsufficientDriver while libcuda.so.1 loads). Pure functions, no CUDA
 * headers: the unit test tests/gpu/test_driver_version.c checks them without a GPU.
 * Internal to src/core. */
#ifndef RT_CORE_CUDA_DRIVER_VERSION_H
#define RT_CORE_CUDA_DRIVER_VERSION_H

#include <stddef.h>
#include <stdio.h>

/* The oldest driver (as the CUDA version it supports, cuDriverGetVersion's 1000*major +
 * 10*minor) that runs a CUDA runtime of `runtime_version`: CUDA's minor-version
 * compatibility lets an X.y runtime run on any driver for X.0. */
static inline int rt_cuda_driver_min_for_runtime(int runtime_version) {
    return runtime_version > 0 ? runtime_version / 1000 * 1000 : 0;
}

/* Writes e.g. "the NVIDIA driver is too old for this ringtrain: it supports CUDA 12.2
 * (kernel module 535.104.05), but ringtrain was built with the CUDA 13.0 runtime, which
 * needs a driver for CUDA 13.0 or newer (cudaErrorInsufficientDriver); update the NVIDIA
 * driver, or use device: cpu". `driver_version` <= 0: unknown; `module` (the kernel
 * module's version, from /proc/driver/nvidia/version) may be NULL or empty. */
static inline void rt_cuda_old_driver_message(char *buf, size_t n, int driver_version, int runtime_version,
                                              const char *module) {
    char drv[96];
    if (driver_version > 0)
        snprintf(drv, sizeof drv, "it supports CUDA %d.%d", driver_version / 1000, driver_version % 1000 / 10);
    else
        snprintf(drv, sizeof drv, "the CUDA version it supports is unknown (cuDriverGetVersion failed)");
    int need = rt_cuda_driver_min_for_runtime(runtime_version);
    snprintf(buf, n,
             "the NVIDIA driver is too old for this ringtrain: %s%s%s%s, but ringtrain was built with the CUDA %d.%d "
             "runtime, which needs a driver for CUDA %d.%d or newer (cudaErrorInsufficientDriver); update the NVIDIA "
             "driver, or use device: cpu",
             drv, module && *module ? " (kernel module " : "", module && *module ? module : "",
             module && *module ? ")" : "", runtime_version / 1000, runtime_version % 1000 / 10, need / 1000,
             need % 1000 / 10);
}

#endif
