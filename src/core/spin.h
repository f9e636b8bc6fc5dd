/* rt_cpu_relax: the processor's "spin-wait" hint (x86 pause, arm64 yield), for the short
 * busy-wait loops of the thread pool and the shm transport before they sleep. */
#ifndef RT_CORE_SPIN_H
#define RT_CORE_SPIN_H

static inline void rt_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif
