/* `ringtrain report RUN_DIR [--out DIR] [--no-plots]`: a run's summary from its
 * metrics.jsonl (and metrics-rank<R>.jsonl), and its plots drawn with gnuplot
 * (src/train/report.h, docs/report.md). */
#include "cli/args.h"
#include "cli/cli.h"
#include "core/file.h"
#include "train/report.h"
#include "train/trace_merge.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *out) {
    fprintf(out, "usage: ringtrain report RUN_DIR [--out DIR] [--no-plots]\n"
                 "\n"
                 "Prints the summary of a training run from RUN_DIR/metrics.jsonl (test accuracy and loss,\n"
                 "wall time, steps, world size, images/s, the per-stage table, and per-rank step times when\n"
                 "log.all_ranks wrote metrics-rank<R>.jsonl), and draws PNG plots with gnuplot (Debian:\n"
                 "gnuplot-nox): loss.png, stages.png, throughput.png, ranks.png.\n"
                 "\n"
                 "  --out DIR    where the summary (summary.txt), the plots, their data and the gnuplot\n"
                 "               script go (default RUN_DIR/report)\n"
                 "  --no-plots   print the summary only; write nothing\n"
                 "\n"
                 "Exit status: 0 ok, 1 an unreadable or malformed log, or plots that could not be drawn\n"
                 "(gnuplot missing or failing), 2 a usage error.\n"
                 "\n"
                 "A run traced with log.trace: true (trace-rank<R>.jsonl) adds one line per epoch: the share\n"
                 "of the gradient all-reduce time hidden behind backward, and the rank that started the\n"
                 "collectives last most often (the one the others waited for; docs/debugging.md).\n");
}

static const char k_prog[] = "ringtrain report";

/* With a traced run (log.trace): one line per epoch, the share of the gradient
 * all-reduce hidden behind backward and the slowest rank (trace_merge.h). A damaged
 * trace is a warning: the metrics summary stands on its own. */
static void trace_summary(const char *run_dir, rt_trace_epoch **e, int *n, int *world) {
    *e = NULL;
    *n = *world = 0;
    rt_trace_run t;
    bool found = false;
    rt_status st = rt_trace_load(run_dir, &t, &found);
    if (st == RT_OK && found) st = rt_trace_overlap(&t, e, n);
    if (st != RT_OK) fprintf(stderr, "%s: warning: the trace: %s\n", k_prog, rt_error_message());
    *world = t.world_size;
    rt_trace_run_free(&t);
}

/* 0 ok, 1 help printed, 2 usage error (printed) */
static int parse_args(int argc, char **argv, const char **run_dir, const char **out_dir, int *plots) {
    *run_dir = *out_dir = NULL;
    *plots = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (rt_cli_is_help(a)) {
            usage(stdout);
            return 1;
        }
        int flag = rt_cli_flag(k_prog, a, "--no-plots");
        int got = flag ? 0 : rt_cli_opt(k_prog, argc, argv, &i, "--out", out_dir);
        if (flag < 0 || got < 0) return 2;
        if (flag) {
            *plots = 0;
        } else if (got) {
            if (!**out_dir) {
                fprintf(stderr, "%s: --out needs a directory (try --help)\n", k_prog);
                return 2;
            }
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "ringtrain report: unknown option '%s' (try --help)\n", a);
            return 2;
        } else if (!*run_dir) {
            *run_dir = a;
        } else {
            fprintf(stderr, "ringtrain report: one RUN_DIR expected, got '%s' and '%s' (try --help)\n", *run_dir, a);
            return 2;
        }
    }
    if (!*run_dir) {
        usage(stderr);
        return 2;
    }
    return 0;
}

/* The trace's per-epoch overlap (rt_trace_overlap_print), next to the summary */
typedef struct overlap {
    rt_trace_epoch *te;
    int nte, world;
} overlap;

/* DIR/summary.txt, the plots' data and script, and the plots gnuplot draws from them
 * (their paths printed). Returns the exit code. */
static int write_report(const char *dir, const rt_report *r, const rt_report_summary *s, const overlap *ov) {
    char path[1200];
    const char *pngs[RT_REPORT_MAX_PLOTS];
    int n = 0, rc = 0;
    if (rt_file_mkdirs(dir, "report directory") != RT_OK) return rt_cli_fail();
    snprintf(path, sizeof path, "%s/summary.txt", dir);
    FILE *f = fopen(path, "w");
    if (f) {
        rt_report_print(r, s, f);
        rt_trace_overlap_print(ov->te, ov->nte, ov->world, f);
        if (fclose(f) != 0) f = NULL;
    }
    if (!f) {
        fprintf(stderr, "ringtrain report: error: cannot write %s\n", path);
        return 1;
    }
    if (rt_report_write_plots(r, dir, pngs, &n) != RT_OK) return rt_cli_fail();
    if (n == 0) {
        printf("\nno plots: the run recorded no steps (summary in %s)\n", path);
        return 0;
    }
    if (rt_report_run_gnuplot(dir) != RT_OK) return rt_cli_fail();
    printf("\nplots (gnuplot script and data in %s):\n", dir);
    for (int i = 0; i < n; i++) {
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, pngs[i]);
        if (stat(path, &sb) != 0 || sb.st_size == 0) {
            fprintf(stderr, "ringtrain report: error: gnuplot did not draw %s (see %s/gnuplot.log)\n", path, dir);
            rc = 1;
            continue;
        }
        printf("  %s\n", path);
    }
    return rc;
}

int rt_cmd_report(int argc, char **argv) {
    const char *run_dir, *out_dir;
    int plots;
    int pr = parse_args(argc, argv, &run_dir, &out_dir, &plots);
    if (pr != 0) return pr == 1 ? 0 : 2;

    rt_report *r;
    if (rt_report_load(run_dir, &r) != RT_OK) return rt_cli_fail();
    for (int i = -1; i < r->n_ranks; i++) {
        const rt_run_log *log = i < 0 ? r->main : r->ranks[i];
        for (int w = 0; w < log->n_warnings; w++) fprintf(stderr, "ringtrain report: warning: %s\n", log->warnings[w]);
    }
    rt_report_summary s;
    if (rt_report_summarize(r, &s) != RT_OK) {
        rt_report_free(r);
        return rt_cli_fail();
    }
    rt_report_print(r, &s, stdout);
    overlap ov;
    trace_summary(run_dir, &ov.te, &ov.nte, &ov.world);
    rt_trace_overlap_print(ov.te, ov.nte, ov.world, stdout);
    fflush(stdout);

    int rc = 0;
    if (plots) {
        char dir[1100];
        if (out_dir)
            snprintf(dir, sizeof dir, "%s", out_dir);
        else
            snprintf(dir, sizeof dir, "%s/report", run_dir);
        rc = write_report(dir, r, &s, &ov);
    }
    rt_trace_overlap_free(ov.te, ov.nte);
    rt_report_summary_free(&s);
    rt_report_free(r);
    return rc;
}
