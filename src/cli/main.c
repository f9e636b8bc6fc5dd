/* The `ringtrain` command: train | eval | report | trace | info | data | bench.
 *
 * main() is the only place that decides to exit: library code returns an rt_status and
 * records a message, and the command prints it. */
#include "cli/cli.h"
#include "core/info.h"
#include "core/settings.h"
#include "core/status.h"

#include <stdio.h>
#include <string.h>

int rt_cli_is_help(const char *arg) { return arg && (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0); }

int rt_cli_fail(void) {
    fprintf(stderr, "ringtrain: error: %s\n", *rt_error_message() ? rt_error_message() : "unknown error");
    return 1;
}

static void list_commands(FILE *out, const rt_command *cmds, int n) {
    for (int i = 0; i < n; i++) fprintf(out, "  %-10s %s\n", cmds[i].name, cmds[i].summary);
}

int rt_cli_dispatch(const char *prog, const rt_command *cmds, int n, int argc, char **argv) {
    if (argc < 2 || rt_cli_is_help(argv[1])) {
        FILE *out = argc < 2 ? stderr : stdout;
        fprintf(out, "usage: %s COMMAND [options]\n\ncommands:\n", prog);
        list_commands(out, cmds, n);
        fprintf(out, "\n'%s COMMAND --help' shows a command's options.\n", prog);
        return argc < 2 ? 2 : 0;
    }
    for (int i = 0; i < n; i++)
        if (strcmp(argv[1], cmds[i].name) == 0) return cmds[i].run(argc - 1, argv + 1);
    fprintf(stderr, "%s: unknown command '%s'\n\ncommands:\n", prog, argv[1]);
    list_commands(stderr, cmds, n);
    return 2;
}

static const rt_command k_bench[] = {
    {"comm", "collectives: time, algbw, busbw per size and algorithm (nccl-tests style)", rt_cmd_bench_comm},
    {"loader", "data loader throughput (images/s)", rt_cmd_bench_loader},
    {"model", "training-step throughput of a model on this device (images/s)", rt_cmd_bench_model},
    {"p2p", "copy bandwidth and latency between GPUs / ranks and with the host, with the topology",
     rt_cmd_bench_p2p},
    {"peak", "this CPU's fp32 and bf16 arithmetic peak (GFLOP/s), measured", rt_cmd_bench_peak},
};

static int cmd_bench(int argc, char **argv) {
    return rt_cli_dispatch("ringtrain bench", k_bench, (int)(sizeof k_bench / sizeof k_bench[0]), argc, argv);
}

static const rt_command k_commands[] = {
    {"train", "train from a YAML config across ranks (ringtrain train --help)", rt_cmd_train},
    {"eval", "evaluate a checkpoint on the test set with any number of ranks", rt_cmd_eval},
    {"info", "version, build features, library versions and devices", rt_cmd_info},
    {"data", "inspect datasets and the distributed sampler", rt_cmd_data},
    {"report", "a run's summary and plots from its metrics.jsonl (ringtrain report --help)", rt_cmd_report},
    {"trace", "merge a traced run's timelines into one Chrome trace JSON (ringtrain trace --help)", rt_cmd_trace},
    {"bench", "benchmarks (ringtrain bench --help)", cmd_bench},
};

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "--version") == 0) {
        printf("ringtrain %s\n", rt_version_string());
        return 0;
    }
    /* a bad environment variable fails every command at once, naming it (core/settings.h);
     * info still runs: `ringtrain info --settings` shows what is wrong */
    if (argc >= 2 && strcmp(argv[1], "info") != 0 && !rt_cli_is_help(argv[1]) && rt_settings_check() != RT_OK) {
        fprintf(stderr, "ringtrain: error: %s\n", rt_error_message());
        return 2;
    }
    return rt_cli_dispatch("ringtrain", k_commands, (int)(sizeof k_commands / sizeof k_commands[0]), argc, argv);
}
