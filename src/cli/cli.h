/* Subcommands of the `ringtrain` executable: each lives in its own file in src/cli and
 * has one row in the table in src/cli/main.c. Only src/cli parses command lines and
 * decides to exit; the areas below expose library functions that the commands call.
 * Return value: the process exit code (0 ok, 1 failure, 2 usage error). */
#ifndef RT_CLI_H
#define RT_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct rt_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the command name */
} rt_command;

/* Shared helpers for subcommands. */
int rt_cli_is_help(const char *arg); /* "-h" or "--help" */
/* Print the error recorded on this thread, "ringtrain: error: ...", and return 1. */
int rt_cli_fail(void);
/* Dispatch argv[1] among `cmds`; prints `usage` (and the list) on --help or unknown. */
int rt_cli_dispatch(const char *prog, const rt_command *cmds, int n, int argc, char **argv);

/* `ringtrain info` as text, and as one JSON object (written into benchmark results). */
void rt_cli_info_print(FILE *out);
void rt_cli_info_json(FILE *out);

/* The CPU's measured arithmetic peak (src/cli/bench_peak.c): a register-only loop of
 * multiply-adds on `threads` threads at once, the best of `repeats` runs of about
 * `seconds` each. fp32: vfmadd231ps (zmm, else ymm); bf16: vdpbf16ps (zmm). */
typedef struct rt_cpu_peak {
    bool available;        /* the CPU has the instruction */
    const char *isa;       /* e.g. "avx512f vfmadd231ps zmm" */
    double flops_per_insn; /* FLOPs of one instruction (a multiply and an add count 2) */
    int threads;
    double gflops;          /* the peak */
    double seconds;         /* the best run's wall time */
    int64_t insns_expected; /* the loop's instructions over the check run */
    int64_t insns_counted;  /* retired instructions over it (perf_event_open); -1: no counter */
} rt_cpu_peak;
/* Returns 1 measured, 0 the CPU lacks the instruction (out->available false), -1 threads
 * could not start. */
int rt_cli_cpu_peak(bool bf16, int threads, double seconds, int repeats, rt_cpu_peak *out);

/* ---- entry points ---- */
int rt_cmd_train(int argc, char **argv);        /* src/cli/train.c */
int rt_cmd_eval(int argc, char **argv);         /* src/cli/train.c */
int rt_cmd_info(int argc, char **argv);         /* src/cli/info.c */
int rt_cmd_data(int argc, char **argv);         /* src/cli/data.c */
int rt_cmd_report(int argc, char **argv);       /* src/cli/report.c */
int rt_cmd_trace(int argc, char **argv);        /* src/cli/trace.c */
int rt_cmd_bench_comm(int argc, char **argv);   /* src/cli/bench_comm.c */
int rt_cmd_bench_loader(int argc, char **argv); /* src/cli/data.c */
int rt_cmd_bench_model(int argc, char **argv);  /* src/cli/bench_model.c */
int rt_cmd_bench_peak(int argc, char **argv);   /* src/cli/bench_peak.c */
int rt_cmd_bench_p2p(int argc, char **argv);    /* src/cli/bench_p2p.c */

#endif
