/* Log levels: parsing, RINGTRAIN_LOG_LEVEL, filtering, rank prefix on one line. */
#include "test_util.h"

#include "core/log.h"
#include "core/settings.h"

#include <string.h>
#include <unistd.h>

static void test_parse(void **state) {
    (void)state;
    rt_log_level lv;
    assert_rt_ok(rt_log_parse_level("warn", &lv));
    assert_int_equal(lv, RT_LOG_WARN);
    assert_rt_ok(rt_log_parse_level("DEBUG", &lv));
    assert_int_equal(lv, RT_LOG_DEBUG);
    assert_rt_ok(rt_log_parse_level("0", &lv));
    assert_int_equal(lv, RT_LOG_ERROR);
    assert_rt_ok(rt_log_parse_level("Warning", &lv));
    assert_int_equal(lv, RT_LOG_WARN);
    assert_rt_fails(rt_log_parse_level("loud", &lv), RT_ERR_INVALID,
                    "unknown log level 'loud' (expected error | warn | info | debug | trace");
    assert_rt_fails(rt_log_parse_level("", &lv), RT_ERR_INVALID, "''");
    assert_rt_fails(rt_log_parse_level("5", &lv), RT_ERR_INVALID, "'5'");
    /* RINGTRAIN_LOG_LEVEL's row (core/settings.h) lists the same names, in the same order
     * (its digits are their indexes), as the level table that log.level parses with */
    char list[128], bars[128];
    rt_names_list(&rt_log_level_names, list, sizeof list);
    size_t j = 0;
    for (const char *p = list; *p && j + 1 < sizeof bars; p++)
        if (*p != ' ') bars[j++] = *p;
    bars[j] = '\0';
    assert_string_equal(rt_setting_info_get(RT_SET_LOG_LEVEL)->choices, bars);
}

/* capture stderr into a pipe while running fn */
static void capture(void (*fn)(void), char *buf, size_t n) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    int saved = dup(STDERR_FILENO);
    dup2(fds[1], STDERR_FILENO);
    fn();
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(fds[1]);
    ssize_t r = read(fds[0], buf, n - 1);
    buf[r < 0 ? 0 : r] = '\0';
    close(fds[0]);
}

static void emit(void) {
    RT_LOG_INFO("hello %d", 42);
    RT_LOG_DEBUG("hidden");
    RT_LOG_WARN("careful");
}

static void test_env_and_filter(void **state) {
    (void)state;
    /* RINGTRAIN_LOG_LEVEL=warn is set by main() before the first log call */
    assert_int_equal(rt_log_get_level(), RT_LOG_WARN);
    char buf[512];
    rt_set_rank(1);
    capture(emit, buf, sizeof buf);
    assert_null(strstr(buf, "hello"));
    assert_null(strstr(buf, "hidden"));
    assert_non_null(strstr(buf, "[ringtrain rank 1] W careful\n"));
    rt_log_set_level(RT_LOG_DEBUG);
    capture(emit, buf, sizeof buf);
    assert_non_null(strstr(buf, "[ringtrain rank 1] I hello 42\n"));
    assert_non_null(strstr(buf, "D hidden\n"));
    rt_set_rank(-1);
}

int main(void) {
    setenv("RINGTRAIN_LOG_LEVEL", "warn", 1);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_parse), cmocka_unit_test(test_env_and_filter)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
