/* Logging with a rank prefix and levels.
 *
 * Level from RINGTRAIN_LOG_LEVEL (error|warn|info|debug|trace or 0-4; default info),
 * read once on first use. Lines go to stderr as one write each, so lines of
 * different threads never interleave:  "[ringtrain rank 1] W message".
 */
#ifndef RT_LOG_H
#define RT_LOG_H

#include "core/names.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rt_log_level {
    RT_LOG_ERROR = 0,
    RT_LOG_WARN = 1,
    RT_LOG_INFO = 2,
    RT_LOG_DEBUG = 3,
    RT_LOG_TRACE = 4,
    RT_LOG_LEVEL_COUNT_
} rt_log_level;

rt_log_level rt_log_get_level(void);
void rt_log_set_level(rt_log_level level);
/* The levels' names (core/names.h): "error" | "warn" | "info" | "debug" | "trace", also
 * "warning" and the numbers 0-4. rt_log_parse_level is rt_names_parse of it. */
extern const rt_names rt_log_level_names;
rt_status rt_log_parse_level(const char *text, rt_log_level *out);

void rt_log(rt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define RT_LOG_ERROR(...) rt_log(RT_LOG_ERROR, __VA_ARGS__)
#define RT_LOG_WARN(...) rt_log(RT_LOG_WARN, __VA_ARGS__)
#define RT_LOG_INFO(...) rt_log(RT_LOG_INFO, __VA_ARGS__)
#define RT_LOG_DEBUG(...)                                                                                              \
    do {                                                                                                               \
        if (rt_log_get_level() >= RT_LOG_DEBUG) rt_log(RT_LOG_DEBUG, __VA_ARGS__);                                     \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
