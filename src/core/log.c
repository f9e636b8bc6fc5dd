#include "core/log.h"

#include "core/names.h"
#include "core/settings.h"
#include "core/status.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static atomic_int g_level = -1;

static const char *const k_level_names[RT_LOG_LEVEL_COUNT_] = {[RT_LOG_ERROR] = "error",
                                                               [RT_LOG_WARN] = "warn",
                                                               [RT_LOG_INFO] = "info",
                                                               [RT_LOG_DEBUG] = "debug",
                                                               [RT_LOG_TRACE] = "trace"};
/* also accepted: "warning", and the level's number */
static const rt_name_alias k_level_aliases[] = {
    {"warning", RT_LOG_WARN}, {"0", RT_LOG_ERROR}, {"1", RT_LOG_WARN}, {"2", RT_LOG_INFO},
    {"3", RT_LOG_DEBUG},      {"4", RT_LOG_TRACE}, {NULL, 0}};
const rt_names rt_log_level_names = {"log level", RT_LOG_LEVEL_COUNT_, k_level_names, NULL, k_level_aliases};

/* The level `text` names, or -1 (records no error: rt_log_get_level uses it). */
static int level_find(const char *text) { return rt_names_index(&rt_log_level_names, text); }

rt_status rt_log_parse_level(const char *text, rt_log_level *out) {
    int k = 0;
    rt_status st = rt_names_parse(&rt_log_level_names, text, &k); /* a complete message: no trace line */
    if (st == RT_OK) *out = (rt_log_level)k;
    return st;
}

rt_log_level rt_log_get_level(void) {
    int lv = atomic_load(&g_level);
    if (lv < 0) {
        int parsed = RT_LOG_INFO;
        const char *env = rt_setting_text(RT_SET_LOG_LEVEL);
        if (env && (parsed = level_find(env)) < 0) {
            /* no error can be returned from here: the CLI refuses the value before any
             * command runs (rt_settings_check) */
            char list[64];
            fprintf(stderr, "[ringtrain] W RINGTRAIN_LOG_LEVEL='%s' is not one of %s; using info\n", env,
                    rt_names_list(&rt_log_level_names, list, sizeof list));
            parsed = RT_LOG_INFO;
        }
        int expected = -1;
        atomic_compare_exchange_strong(&g_level, &expected, (int)parsed);
        lv = atomic_load(&g_level);
    }
    return (rt_log_level)lv;
}

void rt_log_set_level(rt_log_level level) { atomic_store(&g_level, (int)level); }

void rt_log(rt_log_level level, const char *fmt, ...) {
    if (level > rt_log_get_level()) return;
    static const char tag[] = "EWIDT";
    char line[4096];
    int rank = rt_get_rank();
    int n = rank >= 0 ? snprintf(line, sizeof line, "[ringtrain rank %d] %c ", rank, tag[level])
                      : snprintf(line, sizeof line, "[ringtrain] %c ", tag[level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2) len = sizeof line - 2;
    if (len == 0 || line[len - 1] != '\n') line[len++] = '\n';
    /* one write(2) per line: atomic with respect to other threads and processes */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
