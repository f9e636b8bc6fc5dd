/* Status codes and error messages.
 *
 * Library code returns an rt_status (0 = ok). On failure it records a message that
 * carries the file, the line, the failing call and the rank; callers that pass the
 * failure up add one "from" line each (RT_CHECK), so the final message reads like a
 * short stack trace. Only main() decides to exit. The record is thread-local, so
 * threads (loader, communicator progress) never overwrite each other's errors.
 */
#ifndef RT_STATUS_H
#define RT_STATUS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rt_status {
    RT_OK = 0,
    RT_ERR_INVALID,     /* bad argument, config value or input data */
    RT_ERR_IO,          /* file or socket I/O failed */
    RT_ERR_FORMAT,      /* malformed file or message */
    RT_ERR_NOMEM,       /* allocation failed */
    RT_ERR_SYS,         /* a system call failed (errno in the message) */
    RT_ERR_CUDA,        /* CUDA runtime, cuDNN, cuBLAS or NCCL error */
    RT_ERR_NODEVICE,    /* no GPU / no driver */
    RT_ERR_UNSUPPORTED, /* feature not built in or not implemented for this case */
    RT_ERR_TIMEOUT,     /* a blocking call ran out of time */
    RT_ERR_PEER,        /* a peer rank failed, closed or sent garbage */
    RT_ERR_INTERNAL,    /* a bug: an invariant did not hold */
    RT_ERR_COUNT_
} rt_status;

/* Short constant name of a status ("RT_ERR_IO"). */
const char *rt_status_name(rt_status s);

/* The rank printed in error messages and log lines (-1: not yet known). Process-wide. */
void rt_set_rank(int rank);
int rt_get_rank(void);

/* Record an error on this thread, replacing any earlier one. `call` is the failing
 * expression or function (may be NULL). Returns `s` so it can be returned directly. */
rt_status rt_error_set(rt_status s, const char *file, int line, const char *call, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Append a "from file:line: call" frame to this thread's error (used by RT_CHECK). */
void rt_error_trace(const char *file, int line, const char *call);

/* This thread's last error message ("" if none) and status. */
const char *rt_error_message(void);
rt_status rt_error_status(void);
void rt_error_clear(void);

/* Copy this thread's error into another thread's view: used when a worker thread
 * fails and the owning thread reports it. */
typedef struct rt_error_record {
    rt_status status;
    char msg[2048];
} rt_error_record;
void rt_error_save(rt_error_record *rec);
rt_status rt_error_restore(const rt_error_record *rec);

/* ---- check macros: do { } while (0), print the failing statement, file and line ---- */

#define RT_STR_(x) #x
#define RT_STR(x) RT_STR_(x)

/* A new error recorded, as a value: `return RT_ERROR(RT_ERR_INVALID, "batch_size %d", n);`, or
 * `st = RT_ERROR(...); goto fail;` on a cleanup path. */
#define RT_ERROR(code, ...) rt_error_set((code), __FILE__, __LINE__, NULL, __VA_ARGS__)

/* Record and return a new error from the current function: a statement, not a value
 * (`RT_FAIL(RT_ERR_INVALID, "batch_size %d", n);`, never `return RT_FAIL(...)`). */
#define RT_FAIL(code, ...)                                                                    \
    do {                                                                                      \
        return rt_error_set((code), __FILE__, __LINE__, NULL, __VA_ARGS__);                   \
    } while (0)

/* Evaluate an rt_status expression; on failure add a trace frame and return it. */
#define RT_CHECK(expr)                                                                        \
    do {                                                                                      \
        rt_status rt_s_ = (expr);                                                             \
        if (rt_s_ != RT_OK) {                                                                 \
            rt_error_trace(__FILE__, __LINE__, #expr);                                        \
            return rt_s_;                                                                     \
        }                                                                                     \
    } while (0)

/* The same, but store the status in `st` and jump to `label` (for cleanup paths). */
#define RT_CHECK_GOTO(expr, st, label)                                                        \
    do {                                                                                      \
        (st) = (expr);                                                                        \
        if ((st) != RT_OK) {                                                                  \
            rt_error_trace(__FILE__, __LINE__, #expr);                                        \
            goto label;                                                                       \
        }                                                                                     \
    } while (0)

/* A condition that must hold on input (never compiled out, unlike assert). */
#define RT_REQUIRE(cond, code, ...)                                                           \
    do {                                                                                      \
        if (!(cond)) return rt_error_set((code), __FILE__, __LINE__, #cond, __VA_ARGS__);     \
    } while (0)

/* A system call returning <0 (or -1) on failure with errno set. */
rt_status rt_error_sys(const char *file, int line, const char *call);
#define RT_CHECK_SYS(expr)                                                                    \
    do {                                                                                      \
        if ((expr) < 0) return rt_error_sys(__FILE__, __LINE__, #expr);                       \
    } while (0)
#define RT_CHECK_SYS_GOTO(expr, st, label)                                                    \
    do {                                                                                      \
        if ((expr) < 0) {                                                                     \
            (st) = rt_error_sys(__FILE__, __LINE__, #expr);                                   \
            goto label;                                                                       \
        }                                                                                     \
    } while (0)

/* malloc/calloc that records RT_ERR_NOMEM with the size on failure. */
#define RT_CHECK_ALLOC(ptr, nbytes)                                                           \
    do {                                                                                      \
        if ((ptr) == NULL)                                                                    \
            return rt_error_set(RT_ERR_NOMEM, __FILE__, __LINE__, #ptr,                       \
                                "out of memory allocating %zu bytes", (size_t)(nbytes));      \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
