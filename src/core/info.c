/* Build information and core's own linked libraries (the CUDA runtime and driver, jansson). */
#include "core/info.h"

#include "core/build_info.h"
#include "core/internal/device_backend.h"

#include <jansson.h>
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
    const rt_device_backend *cuda = rt_device_backend_get(RT_DEVICE_CUDA);
    if (cuda && cuda->lib_versions) {
        n = cuda->lib_versions(out, cap);
    } else {
        rt_lib_version_add(out, cap, &n, "CUDA runtime", "cuda_runtime", "not built");
        rt_lib_version_add(out, cap, &n, "CUDA driver", "cuda_driver", "not built");
    }
    rt_lib_version_add(out, cap, &n, "jansson", "jansson", jansson_version_str()); /* safetensors headers */
    return n;
}
