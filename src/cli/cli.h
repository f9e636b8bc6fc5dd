/* Subcommands of the `ringtrain` executable: each lives in its own file in src/cli and
 * has one row in the table in src/cli/main.c. Only src/cli parses command lines and
 * decides to exit; the areas below expose library functions that the commands call.
 * Return value: the process exit code (0 ok, 1 failure, 2 usage error). */
#ifndef RT_CLI_H
#define RT_CLI_H

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

#endif
