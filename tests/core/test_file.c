/* core/file.h: a file that must be regular is opened without blocking, and everything
 * else is named (FIFO, directory, device, symlink loop, dangling link, missing file). */
#include "test_util.h"

#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[256];

static void path_in(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", g_dir, name); }

static void expect_refused(const char *path, const char *what) {
    int fd = -1;
    uint64_t size = 0;
    assert_int_equal(rt_file_open_regular(path, "config", &fd, &size), RT_ERR_IO);
    assert_int_equal(fd, -1);
    if (!strstr(rt_error_message(), path) || !strstr(rt_error_message(), what) ||
        strncmp(rt_error_message(), "config ", 7) != 0)
        fail_msg("expected '%s' about %s: %s", what, path, rt_error_message());
    rt_error_clear();
}

static void test_named(void **state) {
    (void)state;
    alarm(60); /* a blocking open fails the test instead of hanging it */
    snprintf(g_dir, sizeof g_dir, "/tmp/rt-file-XXXXXX");
    if (!mkdtemp(g_dir)) fail_msg("mkdtemp");
    char p[512], q[512];
    path_in(p, sizeof p, "fifo");
    assert_int_equal(mkfifo(p, 0644), 0);
    expect_refused(p, "is a FIFO (named pipe)");
    expect_refused(g_dir, "is a directory");
    expect_refused("/dev/null", "is a device");
    path_in(p, sizeof p, "loop");
    assert_int_equal(symlink(p, p), 0);
    expect_refused(p, "Too many levels of symbolic links");
    path_in(p, sizeof p, "dangling");
    assert_int_equal(symlink("/nonexistent/rt", p), 0);
    expect_refused(p, "No such file or directory (a dangling symbolic link)");
    path_in(p, sizeof p, "none");
    expect_refused(p, "No such file or directory");
    /* a regular file (and a symlink to one) opens, blocking, with its size */
    path_in(p, sizeof p, "file");
    FILE *f = fopen(p, "w");
    fputs("hello", f);
    fclose(f);
    path_in(q, sizeof q, "link");
    assert_int_equal(symlink(p, q), 0);
    int fd;
    uint64_t size;
    assert_rt_ok(rt_file_open_regular(q, NULL, &fd, &size));
    assert_int_equal(size, 5);
    assert_int_equal(fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
    assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    close(fd);
    char *text;
    size_t len;
    assert_rt_ok(rt_file_read_all(p, "config", 16, &text, &len));
    assert_int_equal(len, 5);
    assert_string_equal(text, "hello");
    free(text);
    assert_int_equal(rt_file_read_all(p, "config", 4, &text, &len), RT_ERR_IO);
    assert_non_null(strstr(rt_error_message(), "more than the 4-byte limit"));
    rt_error_clear();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_named)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
