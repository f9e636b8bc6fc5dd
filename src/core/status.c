/* Thread-local error records; see status.h. */
#include "core/status.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static atomic_int g_rank = -1;
static _Thread_local rt_error_record t_err;

static const char *const k_names[RT_ERR_COUNT_] = {
    "RT_OK",          "RT_ERR_INVALID", "RT_ERR_IO",       "RT_ERR_FORMAT",
    "RT_ERR_NOMEM",   "RT_ERR_SYS",     "RT_ERR_CUDA",     "RT_ERR_NODEVICE",
    "RT_ERR_UNSUPPORTED", "RT_ERR_TIMEOUT", "RT_ERR_PEER", "RT_ERR_INTERNAL",
};

const char *rt_status_name(rt_status s) {
    if ((int)s < 0 || s >= RT_ERR_COUNT_) return "RT_ERR_UNKNOWN";
    return k_names[s];
}

void rt_set_rank(int rank) { atomic_store(&g_rank, rank); }
int rt_get_rank(void) { return atomic_load(&g_rank); }

static const char *base_name(const char *path) {
    const char *s = strstr(path, "src/");
    if (!s) s = strstr(path, "tests/");
    return s ? s : path;
}

rt_status rt_error_set(rt_status s, const char *file, int line, const char *call, const char *fmt, ...) {
    char text[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    int rank = rt_get_rank();
    char who[32] = "";
    if (rank >= 0) snprintf(who, sizeof who, "rank %d: ", rank);
    if (call)
        snprintf(t_err.msg, sizeof t_err.msg, "%s%s (%s:%d: %s)", who, text, base_name(file), line, call);
    else
        snprintf(t_err.msg, sizeof t_err.msg, "%s%s (%s:%d)", who, text, base_name(file), line);
    t_err.status = s;
    return s;
}

void rt_error_trace(const char *file, int line, const char *call) {
    size_t len = strlen(t_err.msg);
    if (len + 8 >= sizeof t_err.msg) return;
    snprintf(t_err.msg + len, sizeof t_err.msg - len, "\n  from %s:%d: %s", base_name(file), line, call);
}

rt_status rt_error_sys(const char *file, int line, const char *call) {
    int e = errno;
    return rt_error_set(RT_ERR_SYS, file, line, call, "%s", strerror(e));
}

const char *rt_error_message(void) { return t_err.msg; }
rt_status rt_error_status(void) { return t_err.status; }
void rt_error_clear(void) {
    t_err.status = RT_OK;
    t_err.msg[0] = '\0';
}
void rt_error_save(rt_error_record *rec) { *rec = t_err; }
rt_status rt_error_restore(const rt_error_record *rec) {
    t_err = *rec;
    return t_err.status;
}
