/* `ringtrain bench peak`: this CPU's arithmetic peak, measured (issue 22, item 5).
 *
 * Each thread runs a loop of 12 independent multiply-add instructions on registers and
 * nothing else (no loads, no stores), written in inline assembly so the compiler can
 * neither fold nor reorder it:
 *   fp32: vfmadd231ps on zmm registers (AVX-512F: 16 lanes x 2 FLOPs = 32 FLOPs per
 *         instruction), or on ymm (AVX2+FMA: 16 FLOPs) where AVX-512 is missing;
 *   bf16: vdpbf16ps on zmm (AVX-512 BF16: 16 fp32 lanes, each the sum of 2 bf16 products
 *         added to the accumulator, 2 x 2 = 4 FLOPs per lane: 64 FLOPs per instruction),
 *         the instruction oneDNN's bf16 convolutions use; none where the CPU lacks it.
 * Twelve accumulators cover the latency of the FMA units (4-6 cycles on 1-2 pipes). The
 * peak is the best of `repeats` runs of all threads at once, each run about `seconds`
 * long. Where the kernel lets a process count its instructions (perf_event_open), the
 * retired instructions of one thread's loop are counted and compared with the loop's own
 * count (13 instructions + 1 branch per iteration); tests/model/peak_disasm.sh also checks
 * the machine code of the loops, so a compiler cannot have shortened them.
 */
#include "cli/args.h"
#include "cli/cli.h"
#include "core/timer.h"

#include <linux/perf_event.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

/* instructions per loop iteration: 12 multiply-adds, dec, jnz */
#define PEAK_UNROLL 12
#define PEAK_LOOP_INSNS (PEAK_UNROLL + 2)

#if defined(__x86_64__)
/* One loop in assembly text: zero the 12 accumulators (registers 0-11) and the two
 * operands (12, 13) with `zero`, then iterate 12 x `insn` 12, 13 -> accumulator, dec, jnz. */
#define PEAK_Z(zero, r, n) zero " %%" r #n ", %%" r #n ", %%" r #n "\n\t"
#define PEAK_M(insn, r, n) insn " %%" r "12, %%" r "13, %%" r #n "\n\t"
#define PEAK_ASM(zero, insn, r)                                                                                        \
    PEAK_Z(zero, r, 0)                                                                                                 \
    PEAK_Z(zero, r, 1) PEAK_Z(zero, r, 2) PEAK_Z(zero, r, 3) PEAK_Z(zero, r, 4) PEAK_Z(zero, r, 5) PEAK_Z(zero, r, 6)  \
        PEAK_Z(zero, r, 7) PEAK_Z(zero, r, 8) PEAK_Z(zero, r, 9) PEAK_Z(zero, r, 10) PEAK_Z(zero, r, 11)               \
            PEAK_Z(zero, r, 12) PEAK_Z(zero, r, 13) "1:\n\t" PEAK_M(insn, r, 0) PEAK_M(insn, r, 1) PEAK_M(insn, r, 2)  \
                PEAK_M(insn, r, 3) PEAK_M(insn, r, 4) PEAK_M(insn, r, 5) PEAK_M(insn, r, 6) PEAK_M(insn, r, 7)         \
                    PEAK_M(insn, r, 8) PEAK_M(insn, r, 9) PEAK_M(insn, r, 10) PEAK_M(insn, r, 11) "dec %0\n\t"         \
                                                                                                  "jnz 1b\n\t"         \
                                                                                                  "vzeroupper\n\t"
#define PEAK_CLOBBERS                                                                                                  \
    "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",         \
        "xmm13", "cc"

/* The loops: noinline and used so each is one symbol in the binary whose body the
 * disassembly test can read. The accumulators start at zero (no denormals). */
__attribute__((noinline, used)) void rt_peak_loop_fma512(uint64_t iters) {
    __asm__ volatile(PEAK_ASM("vpxord", "vfmadd231ps", "zmm") : "+r"(iters) : : PEAK_CLOBBERS);
}
__attribute__((noinline, used)) void rt_peak_loop_fma256(uint64_t iters) {
    __asm__ volatile(PEAK_ASM("vpxor", "vfmadd231ps", "ymm") : "+r"(iters) : : PEAK_CLOBBERS);
}
__attribute__((noinline, used)) void rt_peak_loop_dpbf16(uint64_t iters) {
    __asm__ volatile(PEAK_ASM("vpxord", "vdpbf16ps", "zmm") : "+r"(iters) : : PEAK_CLOBBERS);
}
#endif /* __x86_64__ */

typedef struct peak_kernel {
    const char *isa; /* what the loop uses */
    double flops;    /* per multiply-add instruction */
    void (*loop)(uint64_t iters);
} peak_kernel;

/* the kernel for a precision on this CPU; false when it has none */
static bool pick_kernel(bool bf16, peak_kernel *k) {
#if !defined(__x86_64__)
    (void)bf16;
    (void)k;
    return false; /* the loops are x86-64 assembly */
#else
    __builtin_cpu_init();
    if (bf16) {
        if (!__builtin_cpu_supports("avx512bf16")) return false;
        *k = (peak_kernel){"avx512_bf16 vdpbf16ps zmm", 64.0, rt_peak_loop_dpbf16};
        return true;
    }
    if (__builtin_cpu_supports("avx512f")) {
        *k = (peak_kernel){"avx512f vfmadd231ps zmm", 32.0, rt_peak_loop_fma512};
        return true;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        *k = (peak_kernel){"avx2 vfmadd231ps ymm", 16.0, rt_peak_loop_fma256};
        return true;
    }
    return false;
#endif
}

typedef struct peak_job {
    void (*loop)(uint64_t iters);
    uint64_t iters;
    pthread_barrier_t *start;
} peak_job;

static void *peak_thread(void *arg) {
    peak_job *j = arg;
    pthread_barrier_wait(j->start);
    j->loop(j->iters);
    return NULL;
}

/* wall seconds for `threads` threads each running `iters` iterations at once; < 0 on a
 * thread that could not start */
static double run_threads(void (*loop)(uint64_t), uint64_t iters, int threads) {
    pthread_t tid[256];
    peak_job job = {loop, iters, NULL};
    pthread_barrier_t start;
    if (pthread_barrier_init(&start, NULL, (unsigned)threads + 1) != 0) return -1;
    job.start = &start;
    int started = 0;
    for (; started < threads; started++)
        if (pthread_create(&tid[started], NULL, peak_thread, &job) != 0) break;
    if (started < threads) { /* cannot happen short of resource limits: let the started ones finish */
        for (int i = started; i < threads; i++) pthread_barrier_wait(&start);
        for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
        pthread_barrier_destroy(&start);
        return -1;
    }
    pthread_barrier_wait(&start);
    uint64_t t0 = rt_now_ns();
    for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
    uint64_t t1 = rt_now_ns();
    pthread_barrier_destroy(&start);
    return (double)(t1 - t0) * 1e-9;
}

/* Retired instructions (user space) of `iters` iterations on this thread; -1 when the
 * kernel does not let us count them (no PMU in a VM, perf_event_paranoid). */
static int64_t count_instructions(void (*loop)(uint64_t), uint64_t iters) {
    struct perf_event_attr pe;
    memset(&pe, 0, sizeof pe);
    pe.type = PERF_TYPE_HARDWARE;
    pe.size = sizeof pe;
    pe.config = PERF_COUNT_HW_INSTRUCTIONS;
    pe.disabled = 1;
    pe.exclude_kernel = 1;
    pe.exclude_hv = 1;
    int fd = (int)syscall(SYS_perf_event_open, &pe, 0, -1, -1, 0);
    if (fd < 0) return -1;
    long long count = -1;
    ioctl(fd, PERF_EVENT_IOC_RESET, 0);
    ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
    loop(iters);
    ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
    if (read(fd, &count, sizeof count) != (ssize_t)sizeof count) count = -1;
    close(fd);
    return count;
}

int rt_cli_cpu_peak(bool bf16, int threads, double seconds, int repeats, rt_cpu_peak *out) {
    memset(out, 0, sizeof *out);
    peak_kernel k;
    if (!pick_kernel(bf16, &k)) return 0;
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    /* calibrate on one thread: iterations for ~seconds */
    uint64_t iters = 1u << 16;
    double t = 0;
    while ((t = run_threads(k.loop, iters, 1)) >= 0 && t < 0.02) iters *= 4;
    if (t < 0) return -1;
    iters = (uint64_t)((double)iters * seconds / (t > 0 ? t : 1e-3));
    if (iters < 1024) iters = 1024;
    double best = 0;
    for (int r = 0; r < (repeats > 0 ? repeats : 1); r++) {
        double s = run_threads(k.loop, iters, threads);
        if (s < 0) return -1;
        if (best == 0 || s < best) best = s;
    }
    out->available = true;
    out->isa = k.isa;
    out->flops_per_insn = k.flops;
    out->threads = threads;
    out->gflops = (double)iters * PEAK_UNROLL * k.flops * threads / best * 1e-9;
    out->seconds = best;
    const uint64_t check_iters = 1u << 20;
    out->insns_expected = (int64_t)check_iters * PEAK_LOOP_INSNS;
    out->insns_counted = count_instructions(k.loop, check_iters);
    return 1;
}

static void usage(FILE *out) {
    fprintf(out, "usage: ringtrain bench peak [options]\n\n"
                 "This CPU's arithmetic peak in fp32 (FMA) and bf16 (dot products), measured with a register-only\n"
                 "loop of 12 independent multiply-adds per iteration on every thread at once.\n\n"
                 "  --threads N      threads (default: the online CPUs)\n"
                 "  --seconds S      length of one timed run in seconds (default 0.3)\n"
                 "  --repeats N      timed runs; the best counts (default 5)\n"
                 "  --json           one JSON object per precision instead of the table\n"
                 "\nEvery option takes its value as --opt VALUE or --opt=VALUE.\n");
}

int rt_cmd_bench_peak(int argc, char **argv) {
    const char *prog = "ringtrain bench peak";
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = ncpu > 0 && ncpu < 256 ? (int)ncpu : 1, repeats = 5, json = 0, ms = 300;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int f, r;
        if (rt_cli_is_help(a)) {
            usage(stdout);
            return 0;
        }
        if ((f = rt_cli_flag(prog, a, "--json")) != 0) {
            if (f < 0) return 2;
            json = 1;
        } else if ((r = rt_cli_opt(prog, argc, argv, &i, "--threads", &v)) != 0) {
            if (r < 0 || rt_cli_parse_int(v, 1, 256, &threads) != 0) {
                fprintf(stderr, "%s: --threads needs an integer in 1..256 (got '%s')\n", prog, v ? v : "");
                return 2;
            }
        } else if ((r = rt_cli_opt(prog, argc, argv, &i, "--repeats", &v)) != 0) {
            if (r < 0 || rt_cli_parse_int(v, 1, 1000, &repeats) != 0) {
                fprintf(stderr, "%s: --repeats needs an integer in 1..1000 (got '%s')\n", prog, v ? v : "");
                return 2;
            }
        } else if ((r = rt_cli_opt(prog, argc, argv, &i, "--seconds", &v)) != 0) {
            double s = 0;
            char *end = NULL;
            if (r > 0 && v) s = strtod(v, &end);
            if (r < 0 || !v || end == v || *end != '\0' || !(s >= 0.001 && s <= 60)) {
                fprintf(stderr, "%s: --seconds needs a number in 0.001..60 (got '%s')\n", prog, v ? v : "");
                return 2;
            }
            ms = (int)(s * 1000 + 0.5);
        } else {
            fprintf(stderr, "%s: unknown option '%s'\n\n", prog, a);
            usage(stderr);
            return 2;
        }
    }
    if (!json)
        printf("%-9s %-28s %7s | %10s %12s %s\n", "precision", "instruction", "threads", "GFLOP/s", "FLOP/insn",
               "instructions counted / expected (one thread)");
    for (int p = 0; p < 2; p++) {
        const bool bf16 = p == 1;
        rt_cpu_peak pk;
        int rc = rt_cli_cpu_peak(bf16, threads, ms / 1000.0, repeats, &pk);
        if (rc < 0) {
            fprintf(stderr, "%s: could not start %d threads\n", prog, threads);
            return 1;
        }
        char counted[96];
        if (rc == 1 && pk.insns_counted >= 0)
            snprintf(counted, sizeof counted, "%lld / %lld", (long long)pk.insns_counted, (long long)pk.insns_expected);
        else
            snprintf(counted, sizeof counted, "no counter (perf_event_open); see tests/model/peak_disasm.sh");
        if (json) {
            if (rc == 1)
                printf("{\"precision\": \"%s\", \"available\": true, \"instruction\": \"%s\", \"threads\": %d, "
                       "\"gflops\": %.2f, \"flops_per_instruction\": %.0f, \"multiply_adds_per_iteration\": %d, "
                       "\"seconds\": %.4f, \"repeats\": %d, \"instructions_counted\": %lld, "
                       "\"instructions_expected\": %lld}\n",
                       bf16 ? "bf16" : "fp32", pk.isa, pk.threads, pk.gflops, pk.flops_per_insn, PEAK_UNROLL,
                       pk.seconds, repeats, (long long)pk.insns_counted, (long long)pk.insns_expected);
            else
                printf("{\"precision\": \"%s\", \"available\": false}\n", bf16 ? "bf16" : "fp32");
        } else if (rc == 1) {
            printf("%-9s %-28s %7d | %10.1f %12.0f %s\n", bf16 ? "bf16" : "fp32", pk.isa, pk.threads, pk.gflops,
                   pk.flops_per_insn, counted);
        } else {
            printf("%-9s %-28s %7d | %10s %12s\n", bf16 ? "bf16" : "fp32", "(not on this CPU)", threads, "-", "-");
        }
        fflush(stdout);
    }
    return 0;
}
