/* `ringtrain info`: version, build, the libraries every area links (each area reports
 * its own: rt_<area>_lib_versions), and the devices found now. */
#include "cli/cli.h"

#include "core/build_info.h"
#include "core/device.h"
#include "core/info.h"
#include "core/settings.h"
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
    char why[160] = "";
    const bool bf16 = rt_model_cpu_bf16_native(why, sizeof why);
    fprintf(out, "devices:\n  cpu           %ld core(s); bf16 %s%s%s\n", ncpu, bf16 ? "native (" : "emulated (",
            bf16 ? rt_model_onednn_isa() : why, ")");
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

/* ---- `ringtrain info --settings`: the table of core/settings.h with the values in force ---- */

/* Row i's range or choices as text ("0..65535", "auto|im2col|dnnl", "" for none). */
static void setting_range(const rt_setting_info *s, char *buf, size_t n) {
    if (s->type == RT_SETTING_INT || s->type == RT_SETTING_FLOAT)
        snprintf(buf, n, "%.15g..%.15g", s->lo, s->hi);
    else if (s->type == RT_SETTING_CHOICE)
        snprintf(buf, n, "%s", s->choices);
    else if (s->type == RT_SETTING_BOOL)
        snprintf(buf, n, "0|1");
    else
        buf[0] = '\0';
}

/* The value in force: the variable's text (source "environment"), else the default
 * ("default"), else "" ("unset"); `why` gets the parse error of a bad value, else "". */
static const char *setting_value(rt_setting_id id, const char **source, char *why, size_t n) {
    const rt_setting_info *s = rt_setting_info_get(id);
    const char *v = rt_setting_text(id);
    why[0] = '\0';
    if (v && rt_setting_parse(id, v, NULL) != RT_OK) {
        snprintf(why, n, "%s", rt_error_message());
        rt_error_clear();
    }
    *source = v ? "environment" : *s->def ? "default" : "unset";
    return v ? v : s->def;
}

static void print_md_cell(FILE *out, const char *text) {
    fputc(' ', out);
    for (const char *p = text; *p; p++) {
        if (*p == '|') fputc('\\', out);
        fputc(*p, out);
    }
    fprintf(out, " |");
}

/* docs/settings.md's table (every group but test): pasted from this output, compared by
 * tests/core/settings_docs.sh. */
static void settings_markdown(FILE *out) {
    fprintf(out, "| variable | set by | type | default | range or choices | meaning |\n");
    fprintf(out, "|---|---|---|---|---|---|\n");
    for (int i = 0; i < RT_SETTING_COUNT_; i++) {
        const rt_setting_info *s = rt_setting_info_get((rt_setting_id)i);
        if (s->group == RT_SETTING_TEST) continue;
        char range[160], def[80];
        setting_range(s, range, sizeof range);
        def[0] = '\0';
        if (*s->def) snprintf(def, sizeof def, "`%s`", s->def);
        fprintf(out, "| `%s` |", s->name);
        print_md_cell(out, rt_setting_group_name(s->group));
        print_md_cell(out, rt_setting_type_name(s->type));
        print_md_cell(out, def);
        print_md_cell(out, range);
        print_md_cell(out, s->doc);
        fputc('\n', out);
    }
}

static void settings_text(FILE *out) {
    fprintf(out, "environment variables (docs/settings.md): NAME=value (where it came from)\n");
    for (int g = RT_SETTING_USER; g <= RT_SETTING_TEST; g++) {
        fprintf(out, "\n%s:\n", rt_setting_group_name((rt_setting_group)g));
        for (int i = 0; i < RT_SETTING_COUNT_; i++) {
            const rt_setting_info *s = rt_setting_info_get((rt_setting_id)i);
            if ((int)s->group != g) continue;
            char range[160], why[2048];
            const char *source;
            const char *v = setting_value((rt_setting_id)i, &source, why, sizeof why);
            setting_range(s, range, sizeof range);
            fprintf(out, "%s=%s (%s%s%s)\n", s->name, v, source, *why ? "; INVALID: " : "", why);
            fprintf(out, "    %s%s%s: %s\n", rt_setting_type_name(s->type), *range ? " " : "", range, s->doc);
        }
    }
}

static void settings_json(FILE *out) {
    fprintf(out, "[");
    for (int i = 0; i < RT_SETTING_COUNT_; i++) {
        const rt_setting_info *s = rt_setting_info_get((rt_setting_id)i);
        char range[160], why[2048];
        const char *source;
        const char *v = setting_value((rt_setting_id)i, &source, why, sizeof why);
        setting_range(s, range, sizeof range);
        fprintf(out, "%s{", i ? ",\n " : "");
        json_str(out, "name", s->name, 1);
        json_str(out, "group", rt_setting_group_name(s->group), 1);
        json_str(out, "type", rt_setting_type_name(s->type), 1);
        json_str(out, "default", s->def, 1);
        json_str(out, "range", range, 1);
        json_str(out, "value", v, 1);
        json_str(out, "source", source, 1);
        json_str(out, "error", why, 1);
        json_str(out, "meaning", s->doc, 0);
        fprintf(out, "}");
    }
    fprintf(out, "]\n");
}

static void info_usage(void) {
    printf("usage: ringtrain info [--json] [--settings [--markdown]]\n\n"
           "Print the version, git commit, build features, library versions (CUDA, cuDNN,\n"
           "cuBLAS, NCCL, OpenBLAS, oneDNN, zlib, libyaml) and the devices found now. With no\n"
           "GPU it says why (the driver's reason) and exits 0.\n\n"
           "  --json       one JSON object instead (as written into benchmark results)\n"
           "  --settings   every environment variable ringtrain reads: its value and where it\n"
           "               came from (environment or default), type, range and meaning; a bad\n"
           "               value is marked INVALID (other commands refuse to start with it).\n"
           "               With --json: a JSON array\n"
           "  --markdown   with --settings: the table of docs/settings.md\n");
}

int rt_cmd_info(int argc, char **argv) {
    bool json = false, settings = false, markdown = false;
    for (int i = 1; i < argc; i++) {
        if (rt_cli_is_help(argv[i])) {
            info_usage();
            return 0;
        }
        bool *flag = strcmp(argv[i], "--json") == 0       ? &json
                     : strcmp(argv[i], "--settings") == 0 ? &settings
                     : strcmp(argv[i], "--markdown") == 0 ? &markdown
                                                          : NULL;
        if (!flag) {
            fprintf(stderr, "ringtrain info: %s '%s' (try --help)\n",
                    argv[i][0] == '-' ? "unknown option" : "unexpected argument", argv[i]);
            return 2;
        }
        *flag = true;
    }
    if (markdown && (!settings || json)) {
        fprintf(stderr, "ringtrain info: --markdown goes with --settings alone (try --help)\n");
        return 2;
    }
    if (settings) {
        if (markdown)
            settings_markdown(stdout);
        else if (json)
            settings_json(stdout);
        else
            settings_text(stdout);
        return 0;
    }
    if (json) {
        rt_cli_info_json(stdout);
        printf("\n");
        return 0;
    }
    rt_cli_info_print(stdout);
    return 0;
}
