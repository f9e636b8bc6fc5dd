#include "core/info.h"

#include "core/build_info.h"
#include "core/cuda/device_cuda.h"
#include "core/device.h"
#include "core/status.h"

#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#ifdef RT_HAVE_OPENBLAS
#include <cblas.h>
#endif
#ifdef RT_HAVE_YAML
#include <yaml.h>
#endif
#include <zlib.h>

const char *rt_version_string(void) { return RT_VERSION " (" RT_GIT_COMMIT ")"; }

#ifdef RT_HAVE_CUDA
static void fmt_ver(char *buf, size_t n, int v, int div1, int div2) {
    if (v <= 0)
        snprintf(buf, n, "n/a");
    else
        snprintf(buf, n, "%d.%d.%d", v / div1, (v % div1) / div2, v % div2);
}
#endif

typedef struct libs {
    char cuda_rt[32], cuda_drv[32], cudnn[32], cublas[32], nccl[32];
    char openblas[128], yaml[32], zlib[32];
} libs;

static void get_libs(libs *l) {
    memset(l, 0, sizeof *l);
    snprintf(l->cuda_rt, sizeof l->cuda_rt, "not built");
    snprintf(l->cuda_drv, sizeof l->cuda_drv, "not built");
    snprintf(l->cudnn, sizeof l->cudnn, "not built");
    snprintf(l->cublas, sizeof l->cublas, "not built");
    snprintf(l->nccl, sizeof l->nccl, "not built");
#ifdef RT_HAVE_CUDA
    fmt_ver(l->cuda_rt, sizeof l->cuda_rt, rt_cuda_runtime_version(), 1000, 10);
    fmt_ver(l->cuda_drv, sizeof l->cuda_drv, rt_cuda_driver_version(), 1000, 10);
    fmt_ver(l->cudnn, sizeof l->cudnn, rt_cudnn_version(), 10000, 100);
    fmt_ver(l->cublas, sizeof l->cublas, rt_cublas_version(), 10000, 100);
    fmt_ver(l->nccl, sizeof l->nccl, rt_nccl_version(), 10000, 100);
    if (rt_cuda_driver_version() <= 0) snprintf(l->cuda_drv, sizeof l->cuda_drv, "none");
#endif
#ifdef RT_HAVE_OPENBLAS
    snprintf(l->openblas, sizeof l->openblas, "%s", openblas_get_config());
    size_t len = strlen(l->openblas);
    while (len && l->openblas[len - 1] == ' ') l->openblas[--len] = '\0';
#else
    snprintf(l->openblas, sizeof l->openblas, "not built");
#endif
#ifdef RT_HAVE_YAML
    snprintf(l->yaml, sizeof l->yaml, "%s", yaml_get_version_string());
#else
    snprintf(l->yaml, sizeof l->yaml, "not built");
#endif
    snprintf(l->zlib, sizeof l->zlib, "%s", zlibVersion());
}

void rt_info_print(FILE *out) {
    libs l;
    get_libs(&l);
    fprintf(out, "ringtrain %s\n", rt_version_string());
    fprintf(out, "build: %s, %s%s%s\n", RT_BUILD_TYPE, RT_C_COMPILER, *RT_SANITIZE ? ", sanitize=" : "", RT_SANITIZE);
    fprintf(out, "features: cuda=%s openblas=%s yaml=%s\n", rt_cuda_built() ? "on" : "off",
#ifdef RT_HAVE_OPENBLAS
            "on",
#else
            "off",
#endif
#ifdef RT_HAVE_YAML
            "on"
#else
            "off"
#endif
    );
    if (rt_cuda_built()) fprintf(out, "cuda archs: %s\n", RT_CUDA_ARCHS);
    fprintf(out, "libraries:\n");
    fprintf(out, "  CUDA runtime  %s\n  CUDA driver   %s\n  cuDNN         %s\n  cuBLAS        %s\n  NCCL          %s\n",
            l.cuda_rt, l.cuda_drv, l.cudnn, l.cublas, l.nccl);
    fprintf(out, "  OpenBLAS      %s\n  libyaml       %s\n  zlib          %s\n", l.openblas, l.yaml, l.zlib);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    fprintf(out, "devices:\n  cpu           %ld core(s)\n", ncpu);
    int count = 0;
    rt_status st = rt_cuda_device_count(&count);
    if (st != RT_OK) {
        /* first line of the error, without the source location */
        char why[512];
        snprintf(why, sizeof why, "%s", rt_error_message());
        char *nl = strchr(why, '\n');
        if (nl) *nl = '\0';
        char *loc = strstr(why, " (src/");
        if (loc) *loc = '\0';
        fprintf(out, "  cuda          none: %s; ringtrain will use the CPU\n", why);
        rt_error_clear();
        return;
    }
    for (int i = 0; i < count; i++) {
        rt_cuda_device_info info;
        if (rt_cuda_device_info_get(i, &info) == RT_OK)
            fprintf(out, "  cuda:%-8d  %s, sm_%d%d, %.1f GiB, %d SMs\n", i, info.name, info.major, info.minor,
                    (double)info.total_mem / (1024.0 * 1024 * 1024), info.multiprocessors);
        else {
            fprintf(out, "  cuda:%-8d  error: %s\n", i, rt_error_message());
            rt_error_clear();
        }
    }
}

static void json_str(FILE *out, const char *key, const char *v, int comma) {
    fprintf(out, "\"%s\": \"", key);
    for (const char *p = v; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p);
        else if ((unsigned char)*p < 0x20)
            fputc(' ', out);
        else
            fputc(*p, out);
    }
    fprintf(out, "\"%s", comma ? ", " : "");
}

void rt_info_json(FILE *out) {
    libs l;
    get_libs(&l);
    struct utsname u;
    char host[300] = "unknown";
    if (uname(&u) == 0) snprintf(host, sizeof host, "%s %s %s", u.nodename, u.sysname, u.machine);
    char cpu[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "model name", 10) == 0) {
                char *c = strchr(line, ':');
                if (c) snprintf(cpu, sizeof cpu, "%s", c + 2);
                cpu[strcspn(cpu, "\n")] = '\0';
                break;
            }
        fclose(f);
    }
    fprintf(out, "{");
    json_str(out, "version", RT_VERSION, 1);
    json_str(out, "commit", RT_GIT_COMMIT, 1);
    json_str(out, "build_type", RT_BUILD_TYPE, 1);
    json_str(out, "compiler", RT_C_COMPILER, 1);
    json_str(out, "host", host, 1);
    json_str(out, "cpu", cpu, 1);
    fprintf(out, "\"cpu_cores\": %ld, ", sysconf(_SC_NPROCESSORS_ONLN));
    json_str(out, "cuda_runtime", l.cuda_rt, 1);
    json_str(out, "cuda_driver", l.cuda_drv, 1);
    json_str(out, "cudnn", l.cudnn, 1);
    json_str(out, "cublas", l.cublas, 1);
    json_str(out, "nccl", l.nccl, 1);
    json_str(out, "openblas", l.openblas, 1);
    char gpu[300] = "none";
    int count = 0;
    if (rt_cuda_device_count(&count) == RT_OK) {
        rt_cuda_device_info info;
        if (rt_cuda_device_info_get(0, &info) == RT_OK) snprintf(gpu, sizeof gpu, "%s x%d", info.name, count);
    }
    rt_error_clear();
    json_str(out, "gpu", gpu, 0);
    fprintf(out, "}");
}
