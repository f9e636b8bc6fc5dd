/* The libraries src/model links, for `ringtrain info`: cuDNN and cuBLAS (CUDA builds),
 * OpenBLAS, oneDNN (when found). */
#include "model/model.h"

#include <stdio.h>
#include <string.h>

#include <cblas.h>
#ifdef RT_HAVE_CUDA
#include <cublas_v2.h>
#include <cudnn.h>
#endif
#ifdef RT_HAVE_DNNL
#include <dnnl.h>
#endif

int rt_model_lib_versions(rt_lib_version *out, int cap) {
    int n = 0;
    char v[128];
#ifdef RT_HAVE_CUDA
    rt_lib_version_fmt(v, sizeof v, (int)cudnnGetVersion(), 10000, 100);
    rt_lib_version_add(out, cap, &n, "cuDNN", "cudnn", v);
    int major = 0, minor = 0, patch = 0;
    cublasGetProperty(MAJOR_VERSION, &major);
    cublasGetProperty(MINOR_VERSION, &minor);
    cublasGetProperty(PATCH_LEVEL, &patch);
    rt_lib_version_fmt(v, sizeof v, major * 10000 + minor * 100 + patch, 10000, 100);
    rt_lib_version_add(out, cap, &n, "cuBLAS", "cublas", v);
#else
    rt_lib_version_add(out, cap, &n, "cuDNN", "cudnn", "not built");
    rt_lib_version_add(out, cap, &n, "cuBLAS", "cublas", "not built");
#endif
    snprintf(v, sizeof v, "%s", openblas_get_config());
    size_t len = strlen(v);
    while (len && v[len - 1] == ' ') v[--len] = '\0';
    rt_lib_version_add(out, cap, &n, "OpenBLAS", "openblas", v);
#ifdef RT_HAVE_DNNL
    const dnnl_version_t *d = dnnl_version();
    snprintf(v, sizeof v, "%d.%d.%d", d->major, d->minor, d->patch);
    rt_lib_version_add(out, cap, &n, "oneDNN", "onednn", v);
#else
    rt_lib_version_add(out, cap, &n, "oneDNN", "onednn", "not built");
#endif
    return n;
}

bool rt_model_cpu_bf16(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    return __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
}

bool rt_model_cpu_bf16_native(char *why, size_t why_len) {
#ifdef RT_HAVE_DNNL
    const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    /* the ISA values are cumulative bit masks: avx512_core_bf16's bits, with AMX or whatever
     * a newer oneDNN adds on top of them */
    if (((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) == (unsigned)dnnl_cpu_isa_avx512_core_bf16)
        return true;
    if (why)
        snprintf(why, why_len, "oneDNN's kernels use %s%s", rt_model_onednn_isa(),
                 rt_model_cpu_bf16() ? ", though the CPU has AVX-512 BF16 (ONEDNN_MAX_CPU_ISA?)"
                                     : ": the CPU has no AVX-512 BF16");
    return false;
#else
    if (why) snprintf(why, why_len, "this ringtrain was built without oneDNN (libdnnl-dev)");
    return false;
#endif
}

const char *rt_model_onednn_isa(void) {
#ifdef RT_HAVE_DNNL
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41:
        return "sse41";
    case dnnl_cpu_isa_avx:
        return "avx";
    case dnnl_cpu_isa_avx2:
        return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
        return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic:
        return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops:
        return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core:
        return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
        return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
        return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
        return "avx512_core_amx";
    default:
        return "other";
    }
#else
    return "not built";
#endif
}
