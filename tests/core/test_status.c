/* Error records: location, failing call, rank, trace frames, thread-locality. */
#include "test_util.h"

#include "core/names.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

static rt_status leaf(int x) {
    RT_REQUIRE(x > 0, RT_ERR_INVALID, "x must be positive, got %d", x);
    return RT_OK;
}
static rt_status middle(int x) {
    RT_CHECK(leaf(x));
    return RT_OK;
}
static rt_status top(int x) {
    RT_CHECK(middle(x));
    return RT_OK;
}

static void test_propagation(void **state) {
    (void)state;
    rt_error_clear();
    assert_int_equal(top(1), RT_OK);
    assert_int_equal(top(-3), RT_ERR_INVALID);
    const char *m = rt_error_message();
    assert_non_null(strstr(m, "x must be positive, got -3"));
    assert_non_null(strstr(m, "tests/core/test_status.c:"));
    assert_non_null(strstr(m, "x > 0")); /* the failing condition */
    assert_non_null(strstr(m, "from tests/core/test_status.c"));
    assert_non_null(strstr(m, "leaf(x)"));
    assert_non_null(strstr(m, "middle(x)"));
    assert_int_equal(rt_error_status(), RT_ERR_INVALID);
    rt_error_clear();
    assert_string_equal(rt_error_message(), "");
}

static void test_rank_prefix(void **state) {
    (void)state;
    rt_set_rank(3);
    (void)RT_ERROR(RT_ERR_PEER, "peer %d closed", 2);
    assert_true(strncmp(rt_error_message(), "rank 3: peer 2 closed", 21) == 0);
    rt_set_rank(-1);
    (void)RT_ERROR(RT_ERR_PEER, "x");
    assert_true(strncmp(rt_error_message(), "x (", 3) == 0);
}

static rt_status open_missing(void) {
    RT_CHECK_SYS(open("/nonexistent/ringtrain", 0));
    return RT_OK;
}

static void test_sys(void **state) {
    (void)state;
    assert_int_equal(open_missing(), RT_ERR_SYS);
    assert_non_null(strstr(rt_error_message(), strerror(ENOENT)));
    assert_non_null(strstr(rt_error_message(), "open(\"/nonexistent/ringtrain\", 0)"));
}

static void *thread_fn(void *arg) {
    int id = (int)(intptr_t)arg;
    for (int i = 0; i < 1000; i++) {
        (void)RT_ERROR(RT_ERR_IO, "thread %d iteration %d", id, i);
        char want[64];
        snprintf(want, sizeof want, "thread %d iteration %d", id, i);
        if (strncmp(rt_error_message(), want, strlen(want)) != 0) return (void *)1;
    }
    return NULL;
}

static void test_thread_local(void **state) {
    (void)state;
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, thread_fn, (void *)(intptr_t)i);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        assert_null(r);
    }
}

static void test_save_restore(void **state) {
    (void)state;
    (void)RT_ERROR(RT_ERR_TIMEOUT, "waited too long");
    rt_error_record rec;
    rt_error_save(&rec);
    rt_error_clear();
    assert_int_equal(rt_error_restore(&rec), RT_ERR_TIMEOUT);
    assert_non_null(strstr(rt_error_message(), "waited too long"));
    assert_string_equal(rt_status_name(RT_ERR_TIMEOUT), "RT_ERR_TIMEOUT");
    assert_string_equal(rt_status_name((rt_status)999), "RT_ERR_UNKNOWN");
}

static void test_names(void **state) {
    (void)state;
    static const char *const names[] = {"tcp", NULL, "shm"};
    assert_int_equal(rt_names_find(names, 3, "SHM"), 2);
    assert_int_equal(rt_names_find(names, 3, "tcp"), 0);
    assert_int_equal(rt_names_find(names, 3, "nccl"), -1);
    assert_int_equal(rt_names_find(names, 3, NULL), -1);
    assert_int_equal(rt_names_find(names, 3, ""), -1);
    char buf[32];
    assert_string_equal(rt_names_join(names, 3, buf, sizeof buf), "tcp | shm");
    assert_string_equal(rt_names_join(names, 0, buf, sizeof buf), "");
    assert_string_equal(rt_names_append(buf, sizeof buf, "auto"), "auto");
    /* a name that does not fit is left out whole, never cut */
    char small[10] = "";
    rt_names_join(names, 3, small, sizeof small);
    assert_string_equal(small, "tcp | shm");
    assert_string_equal(rt_names_append(small, sizeof small, "x"), "tcp | shm");
}

/* A table (rt_names): the one parser, its one message, aliases, unnamed values, rows. */
static const char *row_name(int i) { return i == 1 ? NULL : i == 0 ? "ring" : "rsag"; }

static void test_name_tables(void **state) {
    (void)state;
    static const char *const names[] = {"tcp", NULL, "shm"};
    static const rt_name_alias aliases[] = {{"sharedmem", 2}, {NULL, 0}};
    const rt_names t = {"transport", 3, names, NULL, aliases};
    int v = -7;
    assert_int_equal(rt_names_parse(&t, "SHM", &v), RT_OK);
    assert_int_equal(v, 2);
    assert_int_equal(rt_names_parse(&t, "sharedMem", &v), RT_OK); /* an alias, any case */
    assert_int_equal(v, 2);
    assert_int_equal(rt_names_index(&t, "?"), -1);
    assert_int_equal(rt_names_index(&t, NULL), -1);
    v = -7;
    assert_int_equal(rt_names_parse(&t, "pigeon", &v), RT_ERR_INVALID);
    assert_int_equal(v, -7); /* untouched */
    assert_non_null(strstr(rt_error_message(), "unknown transport 'pigeon' (expected tcp | shm) ("));
    assert_int_equal(rt_names_parse(&t, NULL, &v), RT_ERR_INVALID);
    assert_non_null(strstr(rt_error_message(), "no transport given (expected tcp | shm) ("));
    rt_error_clear();
    char buf[64];
    assert_string_equal(rt_names_list(&t, buf, sizeof buf), "tcp | shm"); /* aliases are not listed */
    assert_null(rt_names_name(&t, 1));
    assert_null(rt_names_name(&t, 3));
    assert_string_equal(rt_names_name(&t, 0), "tcp");
    /* a table of rows names its values through a function */
    const rt_names rows = {"algorithm", 3, NULL, row_name, NULL};
    assert_string_equal(rt_names_list(&rows, buf, sizeof buf), "ring | rsag");
    assert_int_equal(rt_names_index(&rows, "RSAG"), 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_propagation),  cmocka_unit_test(test_rank_prefix),  cmocka_unit_test(test_sys),
        cmocka_unit_test(test_thread_local), cmocka_unit_test(test_save_restore), cmocka_unit_test(test_names),
        cmocka_unit_test(test_name_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
