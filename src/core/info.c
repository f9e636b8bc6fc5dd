/* Build information and core's own linked libraries (the CUDA runtime and driver). */
#include "core/info.h"

#include "core/build_info.h"
#include "core/cuda/device_cuda.h"

#include <stdio.h>

const char *rt_version_string(void) { return RT_VERSION " (" RT_GIT_COMMIT ")"; }

void rt_lib_version_add(rt_lib_version *out, int cap, int *n, const char *name, const char *key, const char *version) {
    if (*n >= cap) return;
    out[*n].name = name;
    out[*n].key = key;
    snprintf(out[*n].version, sizeof out[*n].version, "%s", version);
    (*n)++;
}

void rt_lib_version_fmt(char *buf, unsigned long n, int v, int div1, int div2) {
    if (v <= 0)
        snprintf(buf, n, "n/a");
    else
        snprintf(buf, n, "%d.%d.%d", v / div1, (v % div1) / div2, v % div2);
}

int rt_core_lib_versions(rt_lib_version *out, int cap) {
    int n = 0;
#ifdef RT_HAVE_CUDA
    char v[32];
    rt_lib_version_fmt(v, sizeof v, rt_cuda_runtime_version(), 1000, 10);
    rt_lib_version_add(out, cap, &n, "CUDA runtime", "cuda_runtime", v);
    int drv = rt_cuda_driver_version();
    rt_lib_version_fmt(v, sizeof v, drv, 1000, 10);
    rt_lib_version_add(out, cap, &n, "CUDA driver", "cuda_driver", drv > 0 ? v : "none");
#else
    rt_lib_version_add(out, cap, &n, "CUDA runtime", "cuda_runtime", "not built");
    rt_lib_version_add(out, cap, &n, "CUDA driver", "cuda_driver", "not built");
#endif
    return n;
}
