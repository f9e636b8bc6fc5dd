/* What a failed cudaGetDeviceCount means, and the messages that say so: "no GPU" only
 * for no device and no driver; a driver too old for the CUDA runtime ringtrain was built
 * with (cudaErrorInsufficientDriver while libcuda.so.1 loads), a driver updated without a
 * reboot, GPUs busy in exclusive mode, a failed initialisation... are errors that name
 * the cause and the remedy, so `device: auto` never trains on the CPU by accident.
 * Pure functions, no CUDA headers: the unit test tests/core/test_gpu_rules.c checks them
 * without a GPU. Internal to src/core. */
#ifndef RT_CORE_CUDA_DRIVER_VERSION_H
#define RT_CORE_CUDA_DRIVER_VERSION_H

#include <stdbool.h>
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

/* cudaGetDeviceCount's failures, as the CUDA runtime numbers them (driver_types.h) */
enum {
    RT_CUDA_ERR_INITIALIZATION = 3,           /* cudaErrorInitializationError */
    RT_CUDA_ERR_STUB_LIBRARY = 34,            /* cudaErrorStubLibrary */
    RT_CUDA_ERR_INSUFFICIENT_DRIVER = 35,     /* cudaErrorInsufficientDriver */
    RT_CUDA_ERR_DEVICES_UNAVAILABLE = 46,     /* cudaErrorDevicesUnavailable */
    RT_CUDA_ERR_NO_DEVICE = 100,              /* cudaErrorNoDevice */
    RT_CUDA_ERR_SYSTEM_NOT_READY = 802,       /* cudaErrorSystemNotReady */
    RT_CUDA_ERR_SYSTEM_DRIVER_MISMATCH = 803, /* cudaErrorSystemDriverMismatch */
    RT_CUDA_ERR_COMPAT_NOT_SUPPORTED = 804,   /* cudaErrorCompatNotSupportedOnDevice */
};

typedef enum rt_cuda_probe {
    RT_CUDA_PROBE_NO_GPU,     /* no device, or no driver: RT_ERR_NODEVICE (auto uses the CPU) */
    RT_CUDA_PROBE_OLD_DRIVER, /* rt_cuda_old_driver_message: RT_ERR_CUDA */
    RT_CUDA_PROBE_ERROR,      /* rt_cuda_probe_message: RT_ERR_CUDA */
} rt_cuda_probe;

/* The cause and the remedy of a failure that has one; NULL for the others. */
static inline const char *rt_cuda_probe_cause(int err) {
    switch (err) {
    case RT_CUDA_ERR_SYSTEM_DRIVER_MISMATCH:
        return "the NVIDIA driver was updated without a reboot: the loaded kernel module and the user-space driver "
               "(libcuda) have different versions; reboot, or reload the kernel module (stop the processes using the "
               "GPUs, then rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia; modprobe nvidia)";
    case RT_CUDA_ERR_DEVICES_UNAVAILABLE:
        return "every GPU is busy or unavailable: the GPUs are in exclusive-process (or prohibited) compute mode and "
               "other processes hold them (nvidia-smi shows the compute mode and the processes); wait for them, pick "
               "free GPUs with CUDA_VISIBLE_DEVICES, or have the compute mode set to DEFAULT (nvidia-smi -c DEFAULT)";
    case RT_CUDA_ERR_INITIALIZATION:
        return "the CUDA driver failed to initialise: the NVIDIA kernel module is not loaded, /dev/nvidia* is "
               "missing or not accessible to this user, or a GPU is in a bad state (see nvidia-smi and dmesg); fix the "
               "driver setup";
    case RT_CUDA_ERR_SYSTEM_NOT_READY:
        return "the GPU system is not ready: on an NVSwitch system (HGX, DGX) the NVIDIA fabric manager must run with "
               "the driver's version; start it (systemctl start nvidia-fabricmanager)";
    case RT_CUDA_ERR_COMPAT_NOT_SUPPORTED:
        return "the CUDA forward-compatibility libraries (cuda-compat) on the library path do not support this GPU; "
               "remove them from LD_LIBRARY_PATH, or update the NVIDIA driver";
    default:
        return NULL;
    }
}

/* What cudaGetDeviceCount's failure `err` means; `have_driver`: libcuda.so.1 loads.
 * "No GPU" is only no device, a stub driver, or no driver at all (the runtime then says
 * "insufficient driver"); a failure with a known cause is an error even when libcuda.so.1
 * does not load (the emulated runtime has none), and so is any other failure where a
 * driver is installed. */
static inline rt_cuda_probe rt_cuda_probe_classify(int err, bool have_driver) {
    if (err == RT_CUDA_ERR_NO_DEVICE || err == RT_CUDA_ERR_STUB_LIBRARY) return RT_CUDA_PROBE_NO_GPU;
    if (err == RT_CUDA_ERR_INSUFFICIENT_DRIVER) return have_driver ? RT_CUDA_PROBE_OLD_DRIVER : RT_CUDA_PROBE_NO_GPU;
    if (rt_cuda_probe_cause(err)) return RT_CUDA_PROBE_ERROR;
    return have_driver ? RT_CUDA_PROBE_ERROR : RT_CUDA_PROBE_NO_GPU;
}

/* Writes e.g. "the GPUs cannot be used: cudaGetDeviceCount failed with
 * cudaErrorSystemDriverMismatch (803: ...): the NVIDIA driver was updated without a reboot:
 * ...; device: auto does not fall back to the CPU while GPUs are installed: fix this, or use
 * device: cpu". `name` and `desc` are cudaGetErrorName's and cudaGetErrorString's. */
static inline void rt_cuda_probe_message(char *buf, size_t n, int err, const char *name, const char *desc) {
    const char *cause = rt_cuda_probe_cause(err);
    snprintf(buf, n,
             "the GPUs cannot be used: cudaGetDeviceCount failed with %s (%d: %s): %s; device: auto does not fall back "
             "to the CPU while GPUs are installed: fix this, or use device: cpu",
             name ? name : "?", err, desc ? desc : "?",
             cause ? cause : "the CUDA driver reports an error (see nvidia-smi and dmesg)");
}

#endif
