/* TensorBoard event file (src/train/tensorboard.h), the parts TensorBoard's reader cannot
 * judge alone: CRC-32C and its mask against published values (RFC 3720's vectors; the
 * masked ones are what TensorBoard 2.21's masked_crc32c returns), the record framing, and
 * the cut of a resume: records after the step dropped or moved, an evaluation kept at the
 * step reported, a torn record at the end dropped, a fresh run's old files removed. The
 * reader's own view is tests/train/tensorboard.sh (tb_read.py). */
#include "test_util.h"

#include "train/tensorboard.h"

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_crc(void **state) {
    (void)state;
    uint8_t zeros[32] = {0};
    assert_int_equal(rt_tb_crc32c("123456789", 9), 0xE3069283u);
    assert_int_equal(rt_tb_crc32c(zeros, 32), 0x8A9136AAu);
    assert_int_equal(rt_tb_masked_crc("123456789", 9), 0xC78AB0E5u);
    assert_int_equal(rt_tb_masked_crc(zeros, 32), 0x0FD7FFFAu);
}

static uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t *b = malloc(1 << 20);
    *n = fread(b, 1, 1 << 20, f);
    fclose(f);
    return b;
}

/* The framing of every record: length, masked crc of it, data, masked crc of the data; the
 * number of records. */
static int count_records(const char *path) {
    size_t n, at = 0;
    uint8_t *b = slurp(path, &n);
    int count = 0;
    while (at < n) {
        assert_true(at + 16 <= n);
        uint64_t len = le(b + at, 8);
        assert_int_equal(le(b + at + 8, 4), rt_tb_masked_crc(b + at, 8));
        assert_true(at + 16 + len <= n);
        assert_int_equal(le(b + at + 12 + len, 4), rt_tb_masked_crc(b + at + 12, (size_t)len));
        at += 16 + (size_t)len;
        count++;
    }
    free(b);
    return count;
}

static char *tmpdir(void) {
    char *d = strdup("/tmp/rt-tbunit-XXXXXX");
    assert_non_null(mkdtemp(d));
    return d;
}

static void rmdir_all(const char *dir) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* A run of `steps` steps, evaluated at every 4th; returns the writer (open). */
static rt_tb *write_run(const char *dir, int64_t from, int64_t steps, int64_t resume) {
    rt_tb *t;
    assert_rt_ok(rt_tb_open(dir, resume, &t));
    for (int64_t s = from; s <= steps; s++) {
        rt_step_record r = {.step = s, .loss = 1.0 / (double)s, .lr = 0.1, .grad_norm = NAN};
        assert_rt_ok(rt_tb_step(t, &r));
        if (s % 4 == 0) {
            rt_eval_record e = {.step = s, .loss = 0.5, .accuracy = 0.9};
            assert_rt_ok(rt_tb_eval(t, &e));
        }
    }
    return t;
}

static void test_write_and_cut(void **state) {
    (void)state;
    char *dir = tmpdir();
    rt_tb *t = write_run(dir, 1, 10, -1);
    char path[512], moved[600];
    snprintf(path, sizeof path, "%s", rt_tb_path(t));
    rt_tb_close(t);
    assert_int_equal(count_records(path), 1 + 10 + 2); /* version, steps, evaluations at 4 and 8 */
    bool kept = false;
    snprintf(moved, sizeof moved, "%s/moved", dir);
    assert_rt_ok(rt_tb_cut(path, 8, moved, &kept));
    assert_true(kept); /* the evaluation of step 8 */
    assert_int_equal(count_records(path), 1 + 8 + 2);
    assert_int_equal(count_records(moved), 2); /* steps 9 and 10 */
    assert_rt_ok(rt_tb_cut(path, 6, NULL, &kept));
    assert_false(kept);
    assert_int_equal(count_records(path), 1 + 6 + 1);
    /* a write torn by a kill: half a record at the end is dropped by the next cut */
    size_t n;
    uint8_t *b = slurp(path, &n);
    FILE *f = fopen(path, "ab");
    fwrite(b + 16 + le(b, 8), 1, 20, f); /* the first 20 bytes of the second record */
    fclose(f);
    free(b);
    assert_rt_ok(rt_tb_cut(path, 100, NULL, NULL));
    assert_int_equal(count_records(path), 1 + 6 + 1);
    rmdir_all(dir);
    free(dir);
}

static int count_event_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) n += strncmp(e->d_name, RT_TB_PREFIX, 20) == 0;
    closedir(d);
    return n;
}

/* A resume continues the file from its step, and does not log the kept evaluation again;
 * a fresh run replaces the file. */
static void test_resume_and_fresh(void **state) {
    (void)state;
    char *dir = tmpdir();
    rt_tb *t = write_run(dir, 1, 10, -1);
    char path[512];
    snprintf(path, sizeof path, "%s", rt_tb_path(t));
    rt_tb_close(t);
    t = write_run(dir, 9, 12, 8); /* resumed at 8: steps 9..12, evaluation of 12 (8's is kept) */
    assert_string_equal(rt_tb_path(t), path);
    rt_eval_record e = {.step = 8, .loss = 0.5, .accuracy = 0.9}; /* evaluated again after the resume */
    assert_rt_ok(rt_tb_eval(t, &e));
    rt_tb_close(t);
    assert_int_equal(count_records(path), 1 + 12 + 3);
    assert_int_equal(count_event_files(dir), 1);
    t = write_run(dir, 1, 2, -1);
    snprintf(path, sizeof path, "%s", rt_tb_path(t));
    rt_tb_close(t);
    assert_int_equal(count_event_files(dir), 1);
    assert_int_equal(count_records(path), 1 + 2);
    rmdir_all(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_crc), cmocka_unit_test(test_write_and_cut),
                                       cmocka_unit_test(test_resume_and_fresh)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
