/* The settings table (core/settings.h): strict parsing per type, ranges, defaults, the
 * error naming the variable, lookup by name, and rt_settings_check. */
#include "test_util.h"

#include "core/log.h"
#include "core/settings.h"

#include <math.h>

static void set(const char *name, const char *value) { assert_int_equal(setenv(name, value, 1), 0); }

static void test_int(void **state) {
    (void)state;
    int64_t v = -1;
    unsetenv("RINGTRAIN_FLIGHT_ENTRIES");
    assert_rt_ok(rt_setting_int(RT_SET_FLIGHT_ENTRIES, &v));
    assert_int_equal(v, 512); /* the row's default */
    assert_false(rt_setting_is_set(RT_SET_FLIGHT_ENTRIES));
    set("RINGTRAIN_FLIGHT_ENTRIES", "64");
    assert_rt_ok(rt_setting_int(RT_SET_FLIGHT_ENTRIES, &v));
    assert_int_equal(v, 64);
    assert_true(rt_setting_is_set(RT_SET_FLIGHT_ENTRIES));
    set("RINGTRAIN_FLIGHT_ENTRIES", ""); /* empty: unset */
    assert_rt_ok(rt_setting_int(RT_SET_FLIGHT_ENTRIES, &v));
    assert_int_equal(v, 512);
    v = 7;
    set("RINGTRAIN_FLIGHT_ENTRIES", "abc");
    assert_rt_fails(rt_setting_int(RT_SET_FLIGHT_ENTRIES, &v), RT_ERR_INVALID,
                    "RINGTRAIN_FLIGHT_ENTRIES='abc': expected an integer in 0..16777216");
    assert_int_equal(v, 7);                 /* untouched on error */
    set("RINGTRAIN_FLIGHT_ENTRIES", "12x"); /* garbage suffix (atol took 12) */
    assert_rt_fails(rt_setting_int(RT_SET_FLIGHT_ENTRIES, &v), RT_ERR_INVALID, "RINGTRAIN_FLIGHT_ENTRIES='12x'");
    set("RINGTRAIN_FLIGHT_ENTRIES", "1.5");
    assert_rt_fails(rt_setting_int(RT_SET_FLIGHT_ENTRIES, &v), RT_ERR_INVALID, "expected an integer");
    set("RINGTRAIN_FLIGHT_ENTRIES", "-1"); /* below the range */
    assert_rt_fails(rt_setting_int(RT_SET_FLIGHT_ENTRIES, &v), RT_ERR_INVALID, "RINGTRAIN_FLIGHT_ENTRIES='-1'");
    set("RINGTRAIN_FLIGHT_ENTRIES", "16777217"); /* above it */
    assert_rt_fails(rt_setting_int(RT_SET_FLIGHT_ENTRIES, &v), RT_ERR_INVALID, "16777217");
    set("RINGTRAIN_FLIGHT_ENTRIES", "16777216"); /* the bounds are inclusive */
    assert_rt_ok(rt_setting_int(RT_SET_FLIGHT_ENTRIES, &v));
    assert_int_equal(v, 16777216);
    set("RINGTRAIN_FLIGHT_ENTRIES", "0");
    assert_rt_ok(rt_setting_int(RT_SET_FLIGHT_ENTRIES, &v));
    assert_int_equal(v, 0);
    unsetenv("RINGTRAIN_FLIGHT_ENTRIES");
    /* no default: unset leaves the output alone */
    unsetenv("MASTER_PORT");
    v = -1;
    assert_rt_ok(rt_setting_int(RT_SET_MASTER_PORT, &v));
    assert_int_equal(v, -1);
}

static void test_float(void **state) {
    (void)state;
    double t = 0;
    unsetenv("RINGTRAIN_DIST_TIMEOUT");
    assert_rt_ok(rt_setting_float(RT_SET_DIST_TIMEOUT, &t));
    assert_true(t == 300.0);
    set("RINGTRAIN_DIST_TIMEOUT", "2.5");
    assert_rt_ok(rt_setting_float(RT_SET_DIST_TIMEOUT, &t));
    assert_true(t == 2.5);
    set("RINGTRAIN_DIST_TIMEOUT", "abc"); /* atof gave 0 and was ignored before */
    assert_rt_fails(rt_setting_float(RT_SET_DIST_TIMEOUT, &t), RT_ERR_INVALID,
                    "RINGTRAIN_DIST_TIMEOUT='abc': expected a number in 0.001..100000000");
    set("RINGTRAIN_DIST_TIMEOUT", "10s");
    assert_rt_fails(rt_setting_float(RT_SET_DIST_TIMEOUT, &t), RT_ERR_INVALID, "RINGTRAIN_DIST_TIMEOUT='10s'");
    set("RINGTRAIN_DIST_TIMEOUT", "0");
    assert_rt_fails(rt_setting_float(RT_SET_DIST_TIMEOUT, &t), RT_ERR_INVALID, "RINGTRAIN_DIST_TIMEOUT='0'");
    set("RINGTRAIN_DIST_TIMEOUT", "inf");
    assert_rt_fails(rt_setting_float(RT_SET_DIST_TIMEOUT, &t), RT_ERR_INVALID, "'inf'");
    set("RINGTRAIN_DIST_TIMEOUT", "nan");
    assert_rt_fails(rt_setting_float(RT_SET_DIST_TIMEOUT, &t), RT_ERR_INVALID, "'nan'");
    unsetenv("RINGTRAIN_DIST_TIMEOUT");
}

static void test_bool_and_choice(void **state) {
    (void)state;
    bool b = true;
    unsetenv("RINGTRAIN_SHM_NAMED");
    assert_rt_ok(rt_setting_bool(RT_SET_SHM_NAMED, &b));
    assert_false(b);
    const char *yes[] = {"1", "true", "YES", "on"}, *no[] = {"0", "False", "no", "OFF"};
    for (int i = 0; i < 4; i++) {
        set("RINGTRAIN_SHM_NAMED", yes[i]);
        assert_rt_ok(rt_setting_bool(RT_SET_SHM_NAMED, &b));
        assert_true(b);
        set("RINGTRAIN_SHM_NAMED", no[i]);
        assert_rt_ok(rt_setting_bool(RT_SET_SHM_NAMED, &b));
        assert_false(b);
    }
    set("RINGTRAIN_SHM_NAMED", "2");
    assert_rt_fails(rt_setting_bool(RT_SET_SHM_NAMED, &b), RT_ERR_INVALID, "RINGTRAIN_SHM_NAMED='2': expected 1 or 0");
    unsetenv("RINGTRAIN_SHM_NAMED");

    int k = -1;
    unsetenv("RINGTRAIN_CONV");
    assert_rt_ok(rt_setting_choice(RT_SET_CONV, &k));
    assert_int_equal(k, 0); /* auto */
    set("RINGTRAIN_CONV", "DNNL");
    assert_rt_ok(rt_setting_choice(RT_SET_CONV, &k));
    assert_int_equal(k, 2);
    set("RINGTRAIN_CONV", "1"); /* an index is not a choice */
    assert_rt_fails(rt_setting_choice(RT_SET_CONV, &k), RT_ERR_INVALID, "RINGTRAIN_CONV='1'");
    /* TORCH_DISTRIBUTED_DEBUG as torch reads it: OFF | INFO | DETAIL in any case, no number */
    set("TORCH_DISTRIBUTED_DEBUG", "detail");
    assert_rt_ok(rt_setting_choice(RT_SET_TORCH_DEBUG, &k));
    assert_int_equal(k, 2);
    set("TORCH_DISTRIBUTED_DEBUG", "2");
    assert_rt_fails(rt_setting_choice(RT_SET_TORCH_DEBUG, &k), RT_ERR_INVALID,
                    "TORCH_DISTRIBUTED_DEBUG='2': expected one of OFF|INFO|DETAIL");
    unsetenv("TORCH_DISTRIBUTED_DEBUG");
    /* RINGTRAIN_LOG_LEVEL is parsed by the level table (core/log.c): its aliases too */
    set("RINGTRAIN_LOG_LEVEL", "Warning");
    assert_rt_ok(rt_setting_choice(RT_SET_LOG_LEVEL, &k));
    assert_int_equal(k, RT_LOG_WARN);
    set("RINGTRAIN_LOG_LEVEL", "3");
    assert_rt_ok(rt_setting_choice(RT_SET_LOG_LEVEL, &k));
    assert_int_equal(k, RT_LOG_DEBUG);
    set("RINGTRAIN_LOG_LEVEL", "loud");
    assert_rt_fails(rt_setting_choice(RT_SET_LOG_LEVEL, &k), RT_ERR_INVALID,
                    "RINGTRAIN_LOG_LEVEL='loud': expected one of error|warn|info|debug|trace");
    unsetenv("RINGTRAIN_LOG_LEVEL");
    set("RINGTRAIN_CONV", "im2co"); /* a prefix is not a choice */
    assert_rt_fails(rt_setting_choice(RT_SET_CONV, &k), RT_ERR_INVALID,
                    "RINGTRAIN_CONV='im2co': expected one of auto|im2col|dnnl");
    unsetenv("RINGTRAIN_CONV");
}

static void test_type_and_lookup(void **state) {
    (void)state;
    int64_t v;
    /* reading a row as another type is a bug, said as one */
    assert_rt_fails(rt_setting_int(RT_SET_DIST_TIMEOUT, &v), RT_ERR_INTERNAL, "RINGTRAIN_DIST_TIMEOUT is a float");
    rt_setting_id id;
    assert_rt_ok(rt_setting_find("SLURM_PROCID", &id));
    assert_int_equal(id, RT_SET_SLURM_PROCID);
    assert_rt_fails(rt_setting_find("RINGTRAIN_NO_SUCH", &id), RT_ERR_INVALID, "RINGTRAIN_NO_SUCH is not declared");
    set("RINGTRAIN_JOB_TOKEN", "tok");
    assert_string_equal(rt_setting_str(RT_SET_JOB_TOKEN), "tok");
    unsetenv("RINGTRAIN_JOB_TOKEN");
    assert_null(rt_setting_str(RT_SET_JOB_TOKEN));
    unsetenv("SLURM_STEP_ID");
    assert_string_equal(rt_setting_str(RT_SET_SLURM_STEP_ID), "0"); /* the default */
    /* every row is whole: a name, a meaning, a default that parses, a sane range */
    for (int i = 0; i < RT_SETTING_COUNT_; i++) {
        const rt_setting_info *s = rt_setting_info_get((rt_setting_id)i);
        assert_non_null(s->name);
        assert_true(*s->doc);
        if (*s->def) assert_rt_ok(rt_setting_parse((rt_setting_id)i, s->def, NULL));
        if (s->type == RT_SETTING_INT || s->type == RT_SETTING_FLOAT) assert_true(s->lo <= s->hi);
        if (s->type == RT_SETTING_CHOICE) assert_non_null(s->choices);
        for (int j = 0; j < i; j++)
            if (strcmp(rt_setting_info_get((rt_setting_id)j)->name, s->name) == 0) fail_msg("%s twice", s->name);
    }
    assert_null(rt_setting_info_get(RT_SETTING_COUNT_));
}

static void test_check(void **state) {
    (void)state;
    assert_rt_ok(rt_settings_check());
    set("RINGTRAIN_SHM_SPIN_US", "fast");
    assert_rt_fails(rt_settings_check(), RT_ERR_INVALID, "RINGTRAIN_SHM_SPIN_US='fast'");
    unsetenv("RINGTRAIN_SHM_SPIN_US");
    set("SLURM_NTASKS_PER_NODE", "2(x3)"); /* launcher variables: checked where read */
    assert_rt_ok(rt_settings_check());
    unsetenv("SLURM_NTASKS_PER_NODE");
    set("RINGTRAIN_TEST_NAN_AT", "anything"); /* test hooks: the reader's format */
    assert_rt_ok(rt_settings_check());
    unsetenv("RINGTRAIN_TEST_NAN_AT");
}

int main(void) {
    /* the settings these tests read start unset, whatever the caller's environment */
    for (int i = 0; i < RT_SETTING_COUNT_; i++) {
        const rt_setting_info *s = rt_setting_info_get((rt_setting_id)i);
        if (s->group != RT_SETTING_SYSTEM) unsetenv(s->name);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int),
        cmocka_unit_test(test_float),
        cmocka_unit_test(test_bool_and_choice),
        cmocka_unit_test(test_type_and_lookup),
        cmocka_unit_test(test_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
