/* Monotonic timers (CLOCK_MONOTONIC). */
#ifndef RT_TIMER_H
#define RT_TIMER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Nanoseconds since an arbitrary fixed point; never goes backwards. */
uint64_t rt_now_ns(void);

static inline double rt_ns_to_ms(uint64_t ns) { return (double)ns * 1e-6; }

typedef struct rt_timer {
    uint64_t start_ns;
} rt_timer;

static inline void rt_timer_start(rt_timer *t) { t->start_ns = rt_now_ns(); }
static inline double rt_timer_elapsed_ms(const rt_timer *t) { return rt_ns_to_ms(rt_now_ns() - t->start_ns); }
static inline double rt_timer_elapsed_s(const rt_timer *t) { return (double)(rt_now_ns() - t->start_ns) * 1e-9; }

#ifdef __cplusplus
}
#endif

#endif
