/* `ringtrain info`: version, build, the libraries every area links (each area reports
 * its own: rt_<area>_lib_versions), and the devices found now. */
#include "cli/cli.h"

#include "core/build_info.h"
#include "core/device.h"
#include "core/info.h"
#include "core/status.h"
#include "data/dataset.h"
#include "dist/dist.h"
#include "model/model.h"

#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#ifdef RT_HAVE_YAML
#include <yaml.h>
#endif

/* Every area's libraries, in the order `ringtrain info` prints them. */
static int all_libs(rt_lib_version *l, int cap) {
    int n = 0;
    n += rt_core_lib_versions(l + n, cap - n);
    n += rt_model_lib_versions(l + n, cap - n);
    n += rt_dist_lib_versions(l + n, cap - n);
    n += rt_data_lib_versions(l + n, cap - n);
#ifdef RT_HAVE_YAML
    rt_lib_version_add(l, cap, &n, "libyaml", "yaml", yaml_get_version_string());
#else
    rt_lib_version_add(l, cap, &n, "libyaml", "yaml", "not built");
#endif
    return n;
}

enum { LIBS_CAP = 4 * RT_LIB_VERSIONS_MAX };

void rt_cli_info_print(FILE *out) {
    rt_lib_version l[LIBS_CAP];
    int n = all_libs(l, LIBS_CAP);
    fprintf(out, "ringtrain %s\n", rt_version_string());
    fprintf(out, "build: %s, %s%s%s\n", RT_BUILD_TYPE, RT_C_COMPILER, *RT_SANITIZE ? ", sanitize=" : "", RT_SANITIZE);
    fprintf(out, "features: cuda=%s openblas=on yaml=%s\n", rt_cuda_built() ? "on" : "off",
#ifdef RT_HAVE_YAML
            "on"
#else
            "off"
#endif
    );
    if (rt_cuda_built()) fprintf(out, "cuda archs: %s\n", RT_CUDA_ARCHS);
    fprintf(out, "libraries:\n");
    for (int i = 0; i < n; i++) fprintf(out, "  %-13s %s\n", l[i].name, l[i].version);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    fprintf(out, "devices:\n  cpu           %ld core(s)\n", ncpu);
    int count = 0;
    rt_status st = rt_cuda_device_count(&count);
    if (st != RT_OK) {
        /* first line of the error, without the source location */
        char why[1200];
        snprintf(why, sizeof why, "%s", rt_error_message());
        char *nl = strchr(why, '\n');
        if (nl) *nl = '\0';
        char *loc = strstr(why, " (src/");
        if (loc) *loc = '\0';
        if (st == RT_ERR_NODEVICE)
            fprintf(out, "  cuda          none: %s; ringtrain will use the CPU\n", why);
        else /* GPUs that cannot be used: device auto fails instead of using the CPU */
            fprintf(out, "  cuda          error: %s\n", why);
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

void rt_cli_info_json(FILE *out) {
    rt_lib_version l[LIBS_CAP];
    int n = all_libs(l, LIBS_CAP);
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
    for (int i = 0; i < n; i++) json_str(out, l[i].key, l[i].version, 1);
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

int rt_cmd_info(int argc, char **argv) {
    if (argc > 2) {
        fprintf(stderr, "ringtrain info: unexpected argument '%s' (try --help)\n", argv[2]);
        return 2;
    }
    if (argc > 1) {
        if (rt_cli_is_help(argv[1])) {
            printf("usage: ringtrain info [--json]\n\n"
                   "Print the version, git commit, build features, library versions (CUDA, cuDNN,\n"
                   "cuBLAS, NCCL, OpenBLAS, oneDNN, zlib, libyaml) and the devices found now. With no\n"
                   "GPU it says why (the driver's reason) and exits 0.\n\n"
                   "  --json   one JSON object instead (as written into benchmark results)\n");
            return 0;
        }
        if (strcmp(argv[1], "--json") == 0) {
            rt_cli_info_json(stdout);
            printf("\n");
            return 0;
        }
        fprintf(stderr, "ringtrain info: unknown option '%s' (try --help)\n", argv[1]);
        return 2;
    }
    rt_cli_info_print(stdout);
    return 0;
}
