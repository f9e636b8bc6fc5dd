/* `ringtrain trace RUN_DIR [--steps A:B] [-o trace.json]`: every rank's timeline
 * (RUN_DIR/trace-rank<R>.jsonl, written with log.trace: true or --trace) merged into one
 * Chrome trace-event JSON on rank 0's clock, for Perfetto (ui.perfetto.dev) or
 * chrome://tracing (src/train/trace_merge.h, docs/debugging.md). */
#include "cli/args.h"
#include "cli/cli.h"
#include "train/trace_merge.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static const char k_prog[] = "ringtrain trace";

static void usage(FILE *out) {
    fprintf(out, "usage: ringtrain trace RUN_DIR [--steps A:B] [-o FILE]\n"
                 "\n"
                 "Merges the timelines of a run trained with log.trace: true (or ringtrain train --trace)\n"
                 "into one Chrome trace-event JSON: one process per rank, one thread per track (main\n"
                 "thread, communication thread, GPU stream), times on rank 0's clock. Open it in\n"
                 "https://ui.perfetto.dev or chrome://tracing (docs/debugging.md).\n"
                 "\n"
                 "  --steps A:B   only the spans of steps A to B (inclusive; 1 is the first step)\n"
                 "  -o FILE       where to write it (default RUN_DIR/trace.json)\n"
                 "\n"
                 "Exit status: 0 ok, 1 a missing or malformed trace file (named with its line), 2 a usage\n"
                 "error.\n");
}

/* "A:B" with 0 <= A <= B */
static int parse_steps(const char *v, int64_t *lo, int64_t *hi) {
    const char *colon = strchr(v, ':');
    if (!colon) return -1;
    char a[32];
    size_t n = (size_t)(colon - v);
    if (n == 0 || n >= sizeof a) return -1;
    memcpy(a, v, n);
    a[n] = '\0';
    if (rt_cli_parse_i64(a, 0, INT64_MAX, lo) != 0 || rt_cli_parse_i64(colon + 1, 0, INT64_MAX, hi) != 0) return -1;
    return *lo <= *hi ? 0 : -1;
}

int rt_cmd_trace(int argc, char **argv) {
    const char *run_dir = NULL, *out = NULL, *steps = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (rt_cli_is_help(a)) {
            usage(stdout);
            return 0;
        }
        const char *v = NULL;
        int got = rt_cli_opt(k_prog, argc, argv, &i, "--steps", &v);
        if (got < 0) return 2;
        if (got) {
            steps = v;
            continue;
        }
        got = rt_cli_opt(k_prog, argc, argv, &i, "-o", &v);
        if (got == 0) got = rt_cli_opt(k_prog, argc, argv, &i, "--out", &v);
        if (got < 0) return 2;
        if (got) {
            out = v;
            continue;
        }
        if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "%s: unknown option '%s' (try --help)\n", k_prog, a);
            return 2;
        }
        if (run_dir) {
            fprintf(stderr, "%s: one RUN_DIR expected, got '%s' and '%s' (try --help)\n", k_prog, run_dir, a);
            return 2;
        }
        run_dir = a;
    }
    if (!run_dir) {
        usage(stderr);
        return 2;
    }
    int64_t lo = 0, hi = -1;
    if (steps && parse_steps(steps, &lo, &hi) != 0) {
        fprintf(stderr, "%s: --steps '%s' (expected A:B, whole numbers with A <= B, e.g. 10:20)\n", k_prog, steps);
        return 2;
    }
    char path[1200];
    if (out && !*out) {
        fprintf(stderr, "%s: -o needs a file name (try --help)\n", k_prog);
        return 2;
    }
    snprintf(path, sizeof path, "%s", out ? out : "");
    if (!out) snprintf(path, sizeof path, "%s/trace.json", run_dir);
    if (rt_cli_check_output(k_prog, "-o", path) != 0) return 1;
    rt_trace_run t;
    bool found = false;
    if (rt_trace_load(run_dir, &t, &found) != RT_OK) return rt_cli_fail();
    if (!found) {
        fprintf(stderr,
                "ringtrain trace: error: %s holds no trace-rank*.jsonl (train with log.trace: true or "
                "ringtrain train --trace)\n",
                run_dir);
        return 1;
    }
    int64_t events = 0;
    rt_status st = rt_trace_write_chrome(&t, lo, hi, path, &events);
    if (st != RT_OK) {
        rt_trace_run_free(&t);
        return rt_cli_fail();
    }
    int64_t err = 0;
    for (int r = 0; r < t.world_size; r++)
        if (t.ranks[r].error_ns > err) err = t.ranks[r].error_ns;
    for (int r = 0; r < t.world_size; r++)
        if (t.ranks[r].truncated)
            fprintf(stderr, "%s: warning: %s: its last line was cut short (skipped)\n", k_prog, t.ranks[r].path);
    printf("%s: %d rank(s), %" PRId64 " spans", path, t.world_size, events);
    if (steps) printf(" of steps %" PRId64 "..%" PRId64, lo, hi);
    printf("; clocks aligned to rank 0's within %.1f us; open it in https://ui.perfetto.dev or chrome://tracing\n",
           (double)err * 1e-3);
    rt_trace_run_free(&t);
    return 0;
}
