/* `ringtrain report` (src/train/report.h, src/cli/report.c): a synthetic run directory
 * written with the trainer's own writer (metrics.h), a resume with a second "start" line,
 * per-rank files, a truncated last line; the summary against numbers computed here; the
 * errors that name file:line; and the command itself.
 *
 *   test_report          the library and the command without drawing (label unit)
 *   test_report plots    the command drawing PNGs with gnuplot: exits 77 (skipped) when
 *                        gnuplot or file(1) is not installed */
#include "test_util.h"

#include "train/metrics.h"
#include "train/report.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

enum { N_STEPS = 12, PER_EPOCH = 4, RESUME_AT = 9 };

/* the synthetic step s (1-based) of rank `rank` */
static rt_step_record step_of(int s, int rank) {
    rt_step_record r = {.step = s, .epoch = (s - 1) / PER_EPOCH, .batch = (s - 1) % PER_EPOCH, .rank = rank};
    r.ms[RT_STAGE_DATA] = 1 + (s * 7) % 5;
    r.ms[RT_STAGE_H2D] = 0.5;
    r.ms[RT_STAGE_FORWARD] = 10 + s % 3 + (rank == 1 ? 3 : 0); /* rank 1 is the straggler */
    r.ms[RT_STAGE_BACKWARD] = 20 + (s * 5) % 7;
    r.ms[RT_STAGE_COMM] = rank == 1 ? 0 : s % 4;
    r.ms[RT_STAGE_OPTIM] = 2;
    double sum = 0;
    for (int k = 0; k < RT_STAGE_STEP; k++) sum += r.ms[k];
    r.ms[RT_STAGE_STEP] = sum + 0.25;
    r.comm_busy_ms = 15;
    r.images = 64;
    r.images_per_s = 1000 + 10 * s;
    r.loss = 2.0 / s;
    r.lr = 0.1;
    r.grad_norm = NAN;
    /* time_s starts again at the resume */
    r.time_s = s < RESUME_AT ? 0.5 * s : 0.625 * (s - RESUME_AT + 1);
    return r;
}
#define SEG0_LAST_T (0.5 * (RESUME_AT - 1))
#define SEG1_END_WALL 3.5
#define SEG1_LAST_T (0.625 * (N_STEPS - RESUME_AT + 1))

static void write_file(const char *path, const char *text, const char *mode) {
    FILE *f = fopen(path, mode);
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* dir/metrics.jsonl: start (2 ranks), steps 1..8 with evals at 4 and 8, killed (no end);
 * start (1 rank), steps 9..12, eval at 12, end; then a truncated line. Per-rank files
 * for ranks 0 and 1 (no start lines, time_s starting again at step 9). */
static void make_run(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    rt_metrics *m;
    assert_rt_ok(rt_metrics_open(path, false, &m));
    assert_rt_ok(rt_metrics_line(m, "start",
                                 json_pack("{s:i, s:s, s:i}", "world_size", 2, "device", "cpu", "steps_per_epoch", 4)));
    for (int s = 1; s < RESUME_AT; s++) {
        rt_step_record r = step_of(s, 0);
        assert_rt_ok(rt_metrics_step(m, &r));
        if (s % PER_EPOCH == 0) assert_rt_ok(rt_metrics_eval(m, s, r.epoch, 1.0 / s, 0.5 + 0.01 * s, 100));
    }
    rt_metrics_close(m);
    assert_rt_ok(rt_metrics_open(path, true, &m)); /* the resumed run appends */
    assert_rt_ok(rt_metrics_line(m, "start",
                                 json_pack("{s:i, s:s, s:i}", "world_size", 1, "device", "cpu", "steps_per_epoch", 4)));
    assert_rt_ok(rt_metrics_line(m, "resume", json_pack("{s:i}", "from_step", 8))); /* a kind the report ignores */
    for (int s = RESUME_AT; s <= N_STEPS; s++) {
        rt_step_record r = step_of(s, 0);
        assert_rt_ok(rt_metrics_step(m, &r));
    }
    assert_rt_ok(rt_metrics_eval(m, N_STEPS, 2, 0.125, 0.8125, 100));
    assert_rt_ok(rt_metrics_line(
        m, "end",
        json_pack("{s:i, s:f, s:f, s:f}", "steps", 12, "wall_s", 3.5, "test_accuracy", 0.8125, "test_loss", 0.125)));
    rt_metrics_close(m);
    write_file(path, "{\"kind\": \"step\", \"step\": 13, \"epoch\": 3, \"da", "a"); /* killed mid-write */
    for (int rank = 0; rank < 2; rank++) {
        snprintf(path, sizeof path, "%s/metrics-rank%d.jsonl", dir, rank);
        assert_rt_ok(rt_metrics_open(path, false, &m));
        for (int s = 1; s <= N_STEPS; s++) {
            rt_step_record r = step_of(s, rank);
            assert_rt_ok(rt_metrics_step(m, &r));
        }
        rt_metrics_close(m);
    }
}

static void make_tmpdir(char *dir, size_t n) {
    snprintf(dir, n, "/tmp/rt-report-XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static void rm_rf(const char *dir) {
    if (fork() == 0) {
        execlp("rm", "rm", "-rf", dir, (char *)NULL);
        _exit(127);
    }
    int st;
    wait(&st);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* mean, p50 and p95 (nearest rank) of stage k over steps 1..N of rank `rank` */
static void expect_stage(int k, int rank, double *mean, double *p50, double *p95) {
    double v[N_STEPS], sum = 0;
    for (int s = 1; s <= N_STEPS; s++) {
        v[s - 1] = step_of(s, rank).ms[k];
        sum += v[s - 1];
    }
    qsort(v, N_STEPS, sizeof v[0], cmp_double);
    *mean = sum / N_STEPS;
    *p50 = v[(int)ceil(0.50 * N_STEPS) - 1];
    *p95 = v[(int)ceil(0.95 * N_STEPS) - 1];
}

#define assert_close(a, b) assert_true(fabs((a) - (b)) <= 1e-6 * (1 + fabs(b)))

static void test_summary(void **state) {
    (void)state;
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    make_run(dir);
    rt_report *r;
    assert_rt_ok(rt_report_load(dir, &r));
    /* the truncated last line: skipped, with a warning naming the file and line */
    assert_int_equal(r->main->n_warnings, 1);
    assert_non_null(strstr(r->main->warnings[0], "metrics.jsonl:20: "));
    assert_non_null(strstr(r->main->warnings[0], "truncated"));
    assert_int_equal(r->main->n_segments, 2);
    assert_int_equal(r->main->n_steps, N_STEPS);
    assert_int_equal(r->main->n_evals, 3);
    assert_int_equal(r->n_ranks, 2);
    assert_int_equal(r->ranks[0]->rank, 0);
    assert_int_equal(r->ranks[1]->rank, 1);
    for (int i = 0; i < N_STEPS; i++) {
        assert_int_equal(r->main->steps[i].rec.step, i + 1);
        assert_int_equal(r->main->steps[i].segment, i + 1 < RESUME_AT ? 0 : 1);
        /* time across the resume */
        double t = step_of(i + 1, 0).time_s + (i + 1 < RESUME_AT ? 0 : SEG0_LAST_T);
        assert_close(r->main->steps[i].run_s, t);
    }
    /* a rank file without start lines: the resume is seen from time_s starting again */
    assert_close(r->ranks[1]->wall_s, SEG0_LAST_T + SEG1_LAST_T);

    rt_report_summary s;
    assert_rt_ok(rt_report_summarize(r, &s));
    assert_true(s.has_eval);
    assert_int_equal(s.eval_step, N_STEPS);
    assert_close(s.test_accuracy, 0.8125);
    assert_close(s.test_loss, 0.125);
    assert_close(s.wall_s, SEG0_LAST_T + SEG1_END_WALL); /* the killed segment's last step + the end's wall_s */
    assert_int_equal(s.steps, N_STEPS);
    assert_int_equal(s.step_records, N_STEPS);
    assert_int_equal(s.world_size, 1);
    assert_int_equal(s.first_world_size, 2);
    assert_int_equal(s.segments, 2);
    assert_true(s.finished);
    assert_close(s.final_train_loss, 2.0 / N_STEPS);
    double ips = 0, ips_last = 0;
    int n_last = 0;
    for (int k = 1; k <= N_STEPS; k++) {
        ips += 1000 + 10 * k;
        if ((k - 1) / PER_EPOCH == (N_STEPS - 1) / PER_EPOCH) {
            ips_last += 1000 + 10 * k;
            n_last++;
        }
    }
    assert_close(s.images_per_s_mean, ips / N_STEPS);
    assert_close(s.images_per_s_last_epoch, ips_last / n_last);
    assert_int_equal(s.last_epoch, (N_STEPS - 1) / PER_EPOCH);
    assert_int_equal(s.last_epoch_steps, n_last);
    /* the stage table: every stage against a computation here */
    assert_int_equal(rt_stage_stats_count(s.stages), N_STEPS);
    for (int k = 0; k < RT_STAGE_COUNT_; k++) {
        double em, e50, e95, m, p50, p95, total;
        expect_stage(k, 0, &em, &e50, &e95);
        rt_stage_stats_get(s.stages, (rt_stage)k, &m, &p50, &p95, &total);
        assert_close(m, em);
        assert_close(p50, e50);
        assert_close(p95, e95);
        assert_close(total, em * N_STEPS * 1e-3);
    }
    /* per rank */
    assert_int_equal(s.n_ranks, 2);
    for (int rank = 0; rank < 2; rank++) {
        double em, e50, e95, cm, c50, c95, dm, d50, d95;
        expect_stage(RT_STAGE_STEP, rank, &em, &e50, &e95);
        expect_stage(RT_STAGE_COMM, rank, &cm, &c50, &c95);
        expect_stage(RT_STAGE_DATA, rank, &dm, &d50, &d95);
        assert_int_equal(s.ranks[rank].rank, rank);
        assert_int_equal(s.ranks[rank].steps, N_STEPS);
        assert_close(s.ranks[rank].step_mean_ms, em);
        assert_close(s.ranks[rank].step_p50_ms, e50);
        assert_close(s.ranks[rank].step_p95_ms, e95);
        assert_close(s.ranks[rank].comm_mean_ms, cm);
        assert_close(s.ranks[rank].data_mean_ms, dm);
    }
    /* the printed summary */
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    rt_report_print(r, &s, f);
    fclose(f);
    assert_non_null(strstr(buf, "test accuracy: 81.25%"));
    assert_non_null(strstr(buf, "wall time: 7.50 s"));
    assert_non_null(strstr(buf, "steps: 12,"));
    assert_non_null(strstr(buf, "world size: 1  (1 resume(s); world size by segment: 2 1)"));
    assert_non_null(strstr(buf, "backward"));
    assert_non_null(strstr(buf, "<- slowest"));
    char *slow = strstr(buf, "<- slowest");
    while (slow > buf && slow[-1] != '\n') slow--;
    assert_true(strncmp(slow, "  1 ", 4) == 0); /* rank 1 computes longest */
    free(buf);
    rt_report_summary_free(&s);
    rt_report_free(r);
    rm_rf(dir);
}

/* A resume that repeats steps (from an earlier checkpoint) replaces the earlier records;
 * a truncated record with the resumed run's "start" on the same line is recovered. */
static void test_rewind(void **state) {
    (void)state;
    char dir[64], path[128];
    make_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    rt_metrics *m;
    assert_rt_ok(rt_metrics_open(path, false, &m));
    assert_rt_ok(rt_metrics_line(m, "start", json_pack("{s:i}", "world_size", 2)));
    for (int s = 1; s <= 6; s++) {
        rt_step_record r = step_of(s, 0);
        assert_rt_ok(rt_metrics_step(m, &r));
        if (s == 4) assert_rt_ok(rt_metrics_eval(m, 4, 0, 1, 0.5, 10));
    }
    rt_metrics_close(m);
    write_file(path, "{\"kind\": \"step\", \"step\": 7, \"ep", "a"); /* killed mid-write, no newline */
    assert_rt_ok(rt_metrics_open(path, true, &m));
    assert_rt_ok(rt_metrics_line(m, "start", json_pack("{s:i}", "world_size", 1)));
    for (int s = 4; s <= 8; s++) { /* resumed from the checkpoint at step 3 */
        rt_step_record r = step_of(s, 0);
        r.loss = 100 + s; /* tells the records apart */
        assert_rt_ok(rt_metrics_step(m, &r));
    }
    rt_metrics_close(m);
    rt_report *r;
    assert_rt_ok(rt_report_load(dir, &r));
    assert_int_equal(r->n_ranks, 0);
    assert_int_equal(r->main->n_warnings, 2);
    assert_non_null(strstr(r->main->warnings[0], "metrics.jsonl:9: a truncated record"));
    assert_non_null(strstr(r->main->warnings[1], "metrics.jsonl:10: step 4 repeats"));
    assert_int_equal(r->main->n_segments, 2);
    assert_int_equal(r->main->segments[1].world_size, 1);
    assert_int_equal(r->main->n_steps, 8);
    assert_int_equal(r->main->n_evals, 0); /* the eval at step 4 belonged to the replaced records */
    for (int i = 0; i < 8; i++) {
        assert_int_equal(r->main->steps[i].rec.step, i + 1);
        assert_close(r->main->steps[i].rec.loss, i + 1 < 4 ? 2.0 / (i + 1) : 100 + i + 1);
    }
    rt_report_free(r);
    rm_rf(dir);
}

static void expect_error(const char *dir, const char *content, const char *needle) {
    char path[128];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    write_file(path, content, "w");
    rt_report *r = (rt_report *)1;
    rt_status st = rt_report_load(dir, &r);
    if (st == RT_OK || !strstr(rt_error_message(), needle))
        fail_msg("expected an error with '%s', got %s: %s", needle, rt_status_name(st), rt_error_message());
    assert_null(r);
}

static void test_malformed(void **state) {
    (void)state;
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    const char *start = "{\"kind\": \"start\", \"world_size\": 1}\n";
    const char *step = "{\"kind\": \"step\", \"step\": 1, \"step_ms\": 2.5}\n";
    char text[512];
    /* a broken line in the middle: file:line and what jansson says */
    snprintf(text, sizeof text, "%s%s{\"kind\": \"step\", \"step\": 2,,}\n%s", start, step, step);
    expect_error(dir, text, "metrics.jsonl:3: malformed JSON");
    /* a broken last line that ends with a newline was written whole: an error too */
    snprintf(text, sizeof text, "%s%snot json\n", start, step);
    expect_error(dir, text, "metrics.jsonl:3: malformed JSON");
    snprintf(text, sizeof text, "%s[1, 2]\n", start);
    expect_error(dir, text, "metrics.jsonl:2: malformed JSON at column 1: not a JSON object");
    snprintf(text, sizeof text, "%s{\"step\": 1}\n", start);
    expect_error(dir, text, "metrics.jsonl:2: no \"kind\" field");
    snprintf(text, sizeof text, "%s{\"kind\": \"step\", \"step\": \"one\"}\n", start);
    expect_error(dir, text, "metrics.jsonl:2: field 'step': expected an integer");
    snprintf(text, sizeof text, "%s{\"kind\": \"step\"}\n", start);
    expect_error(dir, text, "metrics.jsonl:2: field 'step' is missing");
    snprintf(text, sizeof text, "%s{\"kind\": \"step\", \"step\": 1, \"forward_ms\": \"fast\"}\n", start);
    expect_error(dir, text, "metrics.jsonl:2: field 'forward_ms': expected a number or null");
    snprintf(text, sizeof text, "{\"kind\": \"start\", \"world_size\": 1.5}\n");
    expect_error(dir, text, "metrics.jsonl:1: field 'world_size'");
    /* a broken per-rank file names that file */
    char path[128];
    snprintf(text, sizeof text, "%s%s", start, step);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    write_file(path, text, "w");
    snprintf(path, sizeof path, "%s/metrics-rank1.jsonl", dir);
    write_file(path, "{\"kind\": \"step\", \"step\": 1}\n{oops}\n", "w");
    rt_report *r;
    assert_int_equal(rt_report_load(dir, &r), RT_ERR_FORMAT);
    assert_non_null(strstr(rt_error_message(), "metrics-rank1.jsonl:2: malformed JSON"));
    unlink(path);
    /* no metrics.jsonl */
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    unlink(path);
    assert_int_equal(rt_report_load(dir, &r), RT_ERR_IO);
    assert_non_null(strstr(rt_error_message(), "metrics.jsonl: No such file"));
    rm_rf(dir);
}

/* ---- the command -------------------------------------------------------------------------- */

static const char *binary(void) {
    const char *b = getenv("RINGTRAIN_BINARY");
    if (!b || !*b) fail_msg("RINGTRAIN_BINARY is not set (run through ctest)");
    return b;
}

/* Run argv (no shell) with PATH set to `path_env` when not NULL; stdout and stderr into
 * *out (malloc'd). Returns the exit status, or -1. */
static int run(char *const argv[], const char *path_env, char **out) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        if (path_env) setenv("PATH", path_env, 1);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    ssize_t got;
    while ((got = read(fds[0], buf + n, cap - n - 1)) > 0) {
        n += (size_t)got;
        if (cap - n < 1024) buf = realloc(buf, cap *= 2);
    }
    buf[n] = '\0';
    close(fds[0]);
    int st;
    waitpid(pid, &st, 0);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Errors of the command, no gnuplot needed. */
static void test_cli_errors(void **state) {
    (void)state;
    char dir[64], path[128], *out;
    make_tmpdir(dir, sizeof dir);
    make_run(dir);
    /* --no-plots: the summary, the warning, nothing written */
    char *a1[] = {(char *)binary(), "report", dir, "--no-plots", NULL};
    assert_int_equal(run(a1, NULL, &out), 0);
    assert_non_null(strstr(out, "test accuracy: 81.25%"));
    assert_non_null(strstr(out, "warning: "));
    assert_non_null(strstr(out, "metrics.jsonl:20: the last line is truncated"));
    free(out);
    snprintf(path, sizeof path, "%s/report", dir);
    assert_false(exists(path));
    /* no gnuplot on PATH: exit 1 naming the package, after the summary */
    char *a2[] = {(char *)binary(), "report", dir, NULL};
    assert_int_equal(run(a2, "/nonexistent", &out), 1);
    assert_non_null(strstr(out, "test accuracy: 81.25%"));
    assert_non_null(strstr(out, "gnuplot-nox"));
    free(out);
    /* a malformed line: exit 1 naming file:line */
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    write_file(path, "{\"kind\": \"start\"}\n{\"kind\": \"step\", \"step\": 1}\n{\"kind\": \"eval\" \"step\": 1}\n",
               "w");
    assert_int_equal(run(a1, NULL, &out), 1);
    char want[200];
    snprintf(want, sizeof want, "%s:3: malformed JSON", path);
    if (!strstr(out, want)) fail_msg("'%s' not in:\n%s", want, out);
    free(out);
    /* usage errors */
    char *a3[] = {(char *)binary(), "report", NULL};
    assert_int_equal(run(a3, NULL, &out), 2);
    free(out);
    char *a4[] = {(char *)binary(), "report", dir, "--bogus", NULL};
    assert_int_equal(run(a4, NULL, &out), 2);
    assert_non_null(strstr(out, "unknown option '--bogus'"));
    free(out);
    rm_rf(dir);
}

/* `ringtrain report` draws every plot: non-empty files that file(1) calls PNG. */
static void test_cli_plots(void **state) {
    (void)state;
    char dir[64], outdir[128], path[192], *out;
    make_tmpdir(dir, sizeof dir);
    make_run(dir);
    snprintf(outdir, sizeof outdir, "%s/a dir with spaces/and 'quotes'", dir); /* no shell anywhere */
    char *a[] = {(char *)binary(), "report", dir, "--out", outdir, NULL};
    int rc = run(a, NULL, &out);
    if (rc != 0) fail_msg("exit %d:\n%s", rc, out);
    const char *pngs[] = {"loss.png", "stages.png", "throughput.png", "ranks.png"};
    for (size_t i = 0; i < sizeof pngs / sizeof pngs[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", outdir, pngs[i]);
        assert_non_null(strstr(out, path));
        struct stat sb;
        assert_int_equal(stat(path, &sb), 0);
        assert_true(sb.st_size > 1000);
        char *fa[] = {"/usr/bin/file", "-b", path, NULL}, *kind;
        assert_int_equal(run(fa, NULL, &kind), 0);
        if (strncmp(kind, "PNG image data", 14) != 0) fail_msg("%s: file(1) says %s", path, kind);
        free(kind);
    }
    free(out);
    snprintf(path, sizeof path, "%s/summary.txt", outdir);
    assert_true(exists(path));
    snprintf(path, sizeof path, "%s/plots.gp", outdir);
    assert_true(exists(path));
    /* the default output folder */
    char *b[] = {(char *)binary(), "report", dir, NULL};
    assert_int_equal(run(b, NULL, &out), 0);
    free(out);
    snprintf(path, sizeof path, "%s/report/ranks.png", dir);
    assert_true(exists(path));
    rm_rf(dir);
}

static bool on_path(const char *prog) {
    const char *p = getenv("PATH");
    char buf[1024];
    while (p && *p) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        snprintf(buf, sizeof buf, "%.*s/%s", (int)n, p, prog);
        if (access(buf, X_OK) == 0) return true;
        p = e ? e + 1 : NULL;
    }
    return false;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "plots") == 0) {
        if (!on_path("gnuplot") || access("/usr/bin/file", X_OK) != 0) {
            printf("SKIP: the plots need gnuplot and file(1) (scripts/install-deps test: gnuplot-nox, file)\n");
            return 77;
        }
        const struct CMUnitTest plots[] = {cmocka_unit_test(test_cli_plots)};
        return cmocka_run_group_tests(plots, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_summary),
        cmocka_unit_test(test_rewind),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_cli_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
