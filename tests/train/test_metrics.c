/* Timing logs (src/train/metrics.h): percentiles and shares of the stage table, the
 * metrics.jsonl line format (valid JSON: /usr/bin/python3 parses it when present, NaN as
 * null), and plain progress lines every N steps. */
#include "test_util.h"

#include "train/metrics.h"

#include <jansson.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

static void test_stats(void **state) {
    (void)state;
    rt_stage_stats *s;
    assert_rt_ok(rt_stage_stats_create(&s));
    /* steps 1..100 ms in shuffled order: mean 50.5, p50 50, p95 95 (nearest rank) */
    for (int i = 0; i < 100; i++) {
        rt_step_record r = {0};
        double v = (double)((i * 37) % 100 + 1);
        for (int k = 0; k < RT_STAGE_COUNT_; k++) r.ms[k] = v * (k + 1);
        r.ms[RT_STAGE_STEP] = 4 * v;
        assert_rt_ok(rt_stage_stats_add(s, &r));
    }
    assert_int_equal(rt_stage_stats_count(s), 100);
    double mean, p50, p95, total;
    rt_stage_stats_get(s, RT_STAGE_DATA, &mean, &p50, &p95, &total);
    assert_true(fabs(mean - 50.5) < 1e-9);
    assert_true(p50 == 50.0 && p95 == 95.0);
    assert_true(fabs(total - 5.05) < 1e-9);
    rt_stage_stats_get(s, RT_STAGE_H2D, &mean, &p50, &p95, &total);
    assert_true(p50 == 100.0 && p95 == 190.0);
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    rt_stage_stats_print(s, f, "epoch 1");
    fclose(f);
    /* data is a quarter of step: 25.0% */
    char *line = strstr(buf, "  data ");
    assert_non_null(line);
    assert_non_null(strstr(line, "25.0%"));
    assert_non_null(strstr(buf, "backward"));
    assert_non_null(strstr(buf, "100 steps"));
    free(buf);
    rt_stage_stats_reset(s);
    assert_int_equal(rt_stage_stats_count(s), 0);
    rt_stage_stats_destroy(s);
}

static void test_jsonl(void **state) {
    (void)state;
    char path[] = "/tmp/rt-metrics-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    rt_metrics *m;
    assert_rt_ok(rt_metrics_open(path, false, &m));
    rt_step_record r = {.step = 7, .epoch = 1, .batch = 2, .images = 64, .loss = 0.5, .lr = 0.1, .grad_norm = NAN};
    for (int k = 0; k < RT_STAGE_COUNT_; k++) r.ms[k] = k + 0.25;
    assert_rt_ok(rt_metrics_step(m, &r));
    assert_rt_ok(rt_metrics_eval(m, 7, 1, 0.3, 0.91, 10000));
    rt_metrics_close(m);
    assert_rt_ok(rt_metrics_open(path, true, &m)); /* append, as a resumed run */
    assert_rt_ok(rt_metrics_line(m, "resume", json_pack("{s:i}", "from_step", 7)));
    rt_metrics_close(m);
    FILE *f = fopen(path, "r");
    char line[2048];
    assert_non_null(fgets(line, sizeof line, f));
    assert_non_null(strstr(line, "\"kind\": \"step\""));
    assert_non_null(strstr(line, "\"step\": 7"));
    assert_non_null(strstr(line, "\"backward_ms\": 3.25"));
    assert_non_null(strstr(line, "\"grad_norm\": null"));
    assert_non_null(fgets(line, sizeof line, f));
    assert_non_null(strstr(line, "\"accuracy\": 0.91"));
    assert_non_null(fgets(line, sizeof line, f));
    assert_non_null(strstr(line, "\"kind\": \"resume\", \"from_step\": 7"));
    assert_null(fgets(line, sizeof line, f));
    fclose(f);
    if (access("/usr/bin/python3", X_OK) == 0) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "/usr/bin/python3 -c \"import json,sys; [json.loads(l) for l in open('%s')]\"", path);
        assert_int_equal(system(cmd), 0);
    }
    unlink(path);
}

/* Every string is escaped and every number is JSON: a field with a quote, a backslash and
 * control characters reads back unchanged, and a step whose loss and gradient norm are
 * infinite or NaN is a valid line with nulls (the trainer formatted its lines with
 * printf: "%s" of such a string, or "%.6f" of a NaN test loss, broke the line and with it
 * `ringtrain report`). */
static void test_jsonl_escaping(void **state) {
    (void)state;
    char path[] = "/tmp/rt-metrics-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    const char *odd = "a \"quoted\" C:\\dir\\ with\nnewline\ttab\x01\x1f and \xc3\xa9";
    rt_metrics *m;
    assert_rt_ok(rt_metrics_open(path, false, &m));
    assert_rt_ok(rt_metrics_line(m, "checkpoint", json_pack("{s:i, s:o}", "step", 3, "path", rt_metrics_str(odd))));
    rt_step_record r = {.step = 4, .epoch = 0, .images = 8, .loss = INFINITY, .lr = 0.1, .grad_norm = NAN};
    assert_rt_ok(rt_metrics_step(m, &r));
    assert_rt_ok(rt_metrics_eval(m, 4, 0, NAN, 0.5, 10));
    assert_rt_ok(rt_metrics_line(m, "end",
                                 json_pack("{s:i, s:o, s:o}", "steps", 4, "test_loss", rt_metrics_num(NAN),
                                           "test_accuracy", rt_metrics_num(-INFINITY))));
    /* a path that is not UTF-8 (a Latin-1 folder name): its other bytes as '?' */
    assert_rt_ok(rt_metrics_line(m, "checkpoint", json_pack("{s:o}", "path", rt_metrics_str("/tmp/caf\xe9 x"))));
    /* a failed json_pack is an error naming the kind, and the file stays valid */
    assert_int_not_equal(rt_metrics_line(m, "bad", json_pack("{s:s}", "x", NULL)), RT_OK);
    assert_non_null(strstr(rt_error_message(), "\"bad\""));
    rt_metrics_close(m);
    FILE *f = fopen(path, "r");
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t err;
        json_t *o = json_loads(line, 0, &err);
        if (!o) fail_msg("line %d is not JSON (%s): %s", n + 1, err.text, line);
        static const char *const kinds[] = {"checkpoint", "step", "eval", "end", "checkpoint"};
        assert_true(n < 5);
        assert_string_equal(json_string_value(json_object_get(o, "kind")), kinds[n]);
        if (n == 0) assert_string_equal(json_string_value(json_object_get(o, "path")), odd);
        if (n == 4) assert_string_equal(json_string_value(json_object_get(o, "path")), "/tmp/caf? x"); /* Latin-1 */
        if (n == 1) {
            assert_true(json_is_null(json_object_get(o, "loss")) && json_is_null(json_object_get(o, "grad_norm")));
            assert_true(json_real_value(json_object_get(o, "lr")) == 0.1);
        }
        if (n == 2) assert_true(json_is_null(json_object_get(o, "loss")));
        if (n == 3)
            assert_true(json_is_null(json_object_get(o, "test_loss")) &&
                        json_is_null(json_object_get(o, "test_accuracy")));
        json_decref(o);
        n++;
    }
    fclose(f);
    assert_int_equal(n, 5);
    if (access("/usr/bin/python3", X_OK) == 0) { /* and a stricter parser than jansson agrees */
        char cmd[512];
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/python3 -c \"import json,sys; [json.loads(l, parse_constant=lambda c: sys.exit(c)) "
                 "for l in open('%s')]\"",
                 path);
        assert_int_equal(system(cmd), 0);
    }
    unlink(path);
}

static void test_progress_plain(void **state) {
    (void)state;
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    rt_progress p;
    rt_progress_init(&p, f, false, 5, 2, 10, 20, 0);
    for (int i = 1; i <= 20; i++) {
        rt_step_record r = {.step = i, .epoch = (i - 1) / 10, .batch = (i - 1) % 10, .loss = 1.0 / i};
        rt_progress_step(&p, &r);
    }
    rt_progress_break(&p);
    fclose(f);
    int lines = 0;
    for (char *c = buf; *c; c++) lines += *c == '\n';
    assert_int_equal(lines, 4); /* steps 5, 10, 15, 20 */
    assert_non_null(strstr(buf, "epoch 2/2 step 20/20"));
    assert_null(strchr(buf, '\r'));
    free(buf);
    /* on a terminal: one line redrawn in place */
    buf = NULL;
    f = open_memstream(&buf, &n);
    rt_progress_init(&p, f, true, 5, 1, 3, 3, 0);
    for (int i = 1; i <= 3; i++) {
        rt_step_record r = {.step = i, .batch = i - 1, .loss = 0.5};
        rt_progress_step(&p, &r);
    }
    rt_progress_break(&p);
    fclose(f);
    assert_non_null(strstr(buf, "\r\033[Kepoch 1/1 [########################] 3/3"));
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_stats), cmocka_unit_test(test_jsonl),
                                       cmocka_unit_test(test_jsonl_escaping), cmocka_unit_test(test_progress_plain)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
