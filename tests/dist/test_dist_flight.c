/* The flight recorder with real processes (label multiproc): every rank runs a known
 * sequence of collectives (blocking and asynchronous, the small one-round and the ring
 * all-reduce) and point-to-point calls, dumps its recorder with rt_pg_flight_dump and
 * checks the JSON: the operations, dtypes, counts, peers and algorithms as called, in
 * order, ids and collective sequence numbers consecutive (a send or receive: the first to
 * or from its peer, seq 1), every entry done with ordered
 * times; a recorder of 4 entries after 10 all-reduces keeps the newest 4; a sub-group
 * records its own operations; an all-reduce whose peer left is failed; flight_entries 0
 * records nothing. */
#include "../test_util.h"
#include "dist/dist.h"
#include "mp.h"

#include <jansson.h>
#include <string.h>
#include <unistd.h>

typedef struct cfg {
    rt_transport transport;
    char dir[64];
} cfg;

static json_t *load(const char *path) {
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j) fprintf(stderr, "%s: %s (line %d)\n", path, err.text, err.line);
    return j;
}

static const char *str(json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "(none)";
}
static long long num(json_t *o, const char *k) { return (long long)json_integer_value(json_object_get(o, k)); }

/* entry i: op, dtype, count, peer, algo as expected, state done, times ordered */
static int check_entry(json_t *e, int i, const char *op, const char *dtype, long long count, int peer,
                       const char *algo) {
    MP_CHECK(e != NULL, "entry %d missing", i);
    MP_CHECK(!strcmp(str(e, "op"), op), "entry %d: op %s, want %s", i, str(e, "op"), op);
    MP_CHECK(!strcmp(str(e, "dtype"), dtype), "entry %d (%s): dtype %s, want %s", i, op, str(e, "dtype"), dtype);
    MP_CHECK(num(e, "count") == count, "entry %d (%s): count %lld, want %lld", i, op, num(e, "count"), count);
    MP_CHECK(num(e, "peer") == peer, "entry %d (%s): peer %lld, want %d", i, op, num(e, "peer"), peer);
    MP_CHECK(!strcmp(str(e, "algo"), algo), "entry %d (%s): algo %s, want %s", i, op, str(e, "algo"), algo);
    MP_CHECK(!strcmp(str(e, "state"), "done"), "entry %d (%s): state %s", i, op, str(e, "state"));
    double q = json_number_value(json_object_get(e, "t_queued_ms"));
    double st = json_number_value(json_object_get(e, "t_started_ms"));
    double d = json_number_value(json_object_get(e, "t_done_ms"));
    MP_CHECK(q > 0 && q <= st && st <= d, "entry %d (%s): times %g %g %g", i, op, q, st, d);
    return 0;
}

static int sequence(int rank, int world, int port, void *arg) {
    const cfg *c = arg;
    rt_pg_options o;
    char method[MP_METHOD_LEN];
    mp_pg_options(&o, method, rank, world, port, c->transport, 30);
    rt_pg *pg;
    MP_OK(rt_pg_init(&o, &pg));
    float f[10] = {0};
    MP_OK(rt_all_reduce(pg, f, 10, RT_F32, RT_OP_SUM)); /* one round (small) */
    int32_t iv[5] = {rank};
    MP_OK(rt_broadcast(pg, iv, 5, RT_I32, 1));
    double dv[3] = {0}, dall[3 * 3];
    MP_OK(rt_all_gather(pg, dv, dall, 3, RT_F64));
    MP_OK(rt_barrier(pg));
    static float big[100000];
    rt_request *req;
    MP_OK(rt_iall_reduce(pg, big, 100000, RT_F32, RT_OP_SUM, &req)); /* ring, on the progress thread */
    MP_OK(rt_wait(req));
    int64_t l = 7;
    if (rank == 0) MP_OK(rt_send(pg, &l, 1, RT_I64, 1));
    if (rank == 1) MP_OK(rt_recv(pg, &l, 1, RT_I64, 0));
    MP_OK(rt_all_reduce_algo(pg, f, 10, RT_F32, RT_OP_MAX, RT_ALGO_NAIVE));
    char path[128];
    snprintf(path, sizeof path, "%s/flight-rank%d.json", c->dir, rank);
    MP_OK(rt_pg_flight_dump(pg, path));
    rt_pg_destroy(pg);

    json_t *j = load(path);
    MP_CHECK(j != NULL, "dump %s does not parse", path);
    MP_CHECK(num(j, "rank") == rank && num(j, "world_size") == world, "rank %lld world %lld", num(j, "rank"),
             num(j, "world_size"));
    json_t *es = json_object_get(j, "entries");
    int p2p = rank <= 1 ? 1 : 0;
    MP_CHECK(json_array_size(es) == (size_t)(6 + p2p), "%zu entries", json_array_size(es));
    for (size_t i = 0; i < json_array_size(es); i++)
        MP_CHECK(num(json_array_get(es, i), "id") == (long long)i + 1, "entry %zu: id %lld", i,
                 num(json_array_get(es, i), "id"));
    /* collectives numbered 1, 2, ... as on the wire; the send/recv between them is not */
    int i = 0;
    if (check_entry(json_array_get(es, i++), 0, "all_reduce", "f32", 10, 0, "ring")) return 1;
    if (check_entry(json_array_get(es, i++), 1, "broadcast", "i32", 5, 1, "chain")) return 1;
    if (check_entry(json_array_get(es, i++), 2, "all_gather", "f64", 3, 0, "ring")) return 1;
    if (check_entry(json_array_get(es, i++), 3, "barrier", "i32", 0, 0, "ring")) return 1;
    if (check_entry(json_array_get(es, i++), 4, "all_reduce", "f32", 100000, 0, "ring")) return 1;
    if (rank == 0 && check_entry(json_array_get(es, i++), 5, "send", "i64", 1, 1, "direct")) return 1;
    if (rank == 1 && check_entry(json_array_get(es, i++), 5, "recv", "i64", 1, 0, "direct")) return 1;
    if (check_entry(json_array_get(es, i), i, "all_reduce", "f32", 10, 0, "naive")) return 1;
    long long want = 1;
    for (size_t k = 0; k < json_array_size(es); k++) {
        json_t *e = json_array_get(es, k);
        if (!strcmp(str(e, "op"), "send") || !strcmp(str(e, "op"), "recv")) {
            /* numbered per peer and direction: the first message to (from) that peer */
            MP_CHECK(num(e, "seq") == 1, "%s: seq %lld, want 1", str(e, "op"), num(e, "seq"));
            continue;
        }
        MP_CHECK(num(e, "seq") == want, "entry %zu (%s): seq %lld, want %lld", k, str(e, "op"), num(e, "seq"), want);
        want++;
    }
    json_decref(j);
    return 0;
}

static int wrap(int rank, int world, int port, void *arg) {
    const cfg *c = arg;
    rt_pg_options o;
    char method[MP_METHOD_LEN];
    mp_pg_options(&o, method, rank, world, port, c->transport, 30);
    o.flight_entries = 4;
    rt_pg *pg;
    MP_OK(rt_pg_init(&o, &pg));
    double buf[16] = {0};
    for (int k = 1; k <= 10; k++) MP_OK(rt_all_reduce(pg, buf, (size_t)k, RT_F64, RT_OP_SUM));
    /* a sub-group of ranks 0 and 1 has its own recorder and numbering */
    int sub_ranks[2] = {0, 1};
    rt_pg *sub = NULL;
    MP_OK(rt_pg_new_group(pg, sub_ranks, 2, &sub));
    char path[128];
    if (sub) {
        MP_OK(rt_all_reduce(sub, buf, 3, RT_F64, RT_OP_SUM));
        snprintf(path, sizeof path, "%s/sub-rank%d.json", c->dir, rank);
        MP_OK(rt_pg_flight_dump(sub, path));
        rt_pg_destroy(sub);
        json_t *j = load(path);
        MP_CHECK(j != NULL, "sub-group dump does not parse");
        json_t *es = json_object_get(j, "entries");
        MP_CHECK(json_array_size(es) == 1, "sub-group: %zu entries", json_array_size(es));
        MP_CHECK(num(json_array_get(es, 0), "seq") == 1 && num(json_array_get(es, 0), "count") == 3,
                 "sub-group entry seq %lld count %lld", num(json_array_get(es, 0), "seq"),
                 num(json_array_get(es, 0), "count"));
        json_decref(j);
    }
    snprintf(path, sizeof path, "%s/wrap-rank%d.json", c->dir, rank);
    MP_OK(rt_pg_flight_dump(pg, path));
    rt_pg_destroy(pg);
    json_t *j = load(path);
    MP_CHECK(j != NULL, "dump does not parse");
    json_t *es = json_object_get(j, "entries");
    MP_CHECK(json_array_size(es) == 4, "%zu entries, want the newest 4", json_array_size(es));
    MP_CHECK(num(j, "recorded") == 10, "recorded %lld", num(j, "recorded"));
    for (int k = 0; k < 4; k++) {
        json_t *e = json_array_get(es, (size_t)k);
        MP_CHECK(num(e, "seq") == 7 + k && num(e, "id") == 7 + k, "entry %d: seq %lld id %lld, want %d", k,
                 num(e, "seq"), num(e, "id"), 7 + k);
        if (check_entry(e, k, "all_reduce", "f64", 7 + k, 0, "ring")) return 1;
    }
    json_decref(j);
    return 0;
}

static int disabled(int rank, int world, int port, void *arg) {
    const cfg *c = arg;
    rt_pg_options o;
    char method[MP_METHOD_LEN];
    mp_pg_options(&o, method, rank, world, port, c->transport, 30);
    o.flight_entries = 0;
    rt_pg *pg;
    MP_OK(rt_pg_init(&o, &pg));
    float f = 1;
    MP_OK(rt_all_reduce(pg, &f, 1, RT_F32, RT_OP_SUM));
    char path[128];
    snprintf(path, sizeof path, "%s/off-rank%d.json", c->dir, rank);
    MP_OK(rt_pg_flight_dump(pg, path));
    rt_pg_destroy(pg);
    json_t *j = load(path);
    MP_CHECK(j != NULL, "dump does not parse");
    MP_CHECK(json_array_size(json_object_get(j, "entries")) == 0, "disabled recorder has %zu entries",
             json_array_size(json_object_get(j, "entries")));
    json_decref(j);
    return 0;
}

/* Rank 1 leaves without calling the all-reduce (its connections close): rank 0's fails,
 * and its entry says so. */
static int failed(int rank, int world, int port, void *arg) {
    const cfg *c = arg;
    rt_pg_options o;
    char method[MP_METHOD_LEN];
    mp_pg_options(&o, method, rank, world, port, c->transport, 30);
    rt_pg *pg;
    MP_OK(rt_pg_init(&o, &pg));
    float f[4] = {0};
    MP_OK(rt_all_reduce(pg, f, 4, RT_F32, RT_OP_SUM));
    if (rank == 1) _exit(0);
    MP_CHECK(rt_all_reduce(pg, f, 4, RT_F32, RT_OP_SUM) != RT_OK, "all_reduce with a departed peer succeeded");
    char path[128];
    snprintf(path, sizeof path, "%s/failed-rank%d.json", c->dir, rank);
    MP_OK(rt_pg_flight_dump(pg, path));
    json_t *j = load(path);
    MP_CHECK(j != NULL, "dump does not parse");
    json_t *es = json_object_get(j, "entries");
    MP_CHECK(json_array_size(es) == 2, "%zu entries", json_array_size(es));
    MP_CHECK(!strcmp(str(json_array_get(es, 0), "state"), "done"), "first: %s", str(json_array_get(es, 0), "state"));
    json_t *e = json_array_get(es, 1);
    MP_CHECK(!strcmp(str(e, "state"), "failed") && num(e, "seq") == 2, "second: %s seq %lld", str(e, "state"),
             num(e, "seq"));
    MP_CHECK(json_number_value(json_object_get(e, "t_done_ms")) > 0, "a failed entry has its end time");
    json_decref(j);
    rt_pg_destroy(pg);
    return 0;
}

static void run(mp_fn fn, rt_transport t, int world) {
    cfg c = {.transport = t};
    snprintf(c.dir, sizeof c.dir, "/tmp/rt_flight_XXXXXX");
    assert_non_null(mkdtemp(c.dir));
    int codes[8];
    int failed = mp_run(world, fn, &c, 60, codes);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", c.dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", c.dir);
    assert_int_equal(failed, 0);
}

static void sequence_tcp_2(void **s) {
    (void)s;
    run(sequence, RT_TRANSPORT_TCP, 2);
}
static void sequence_shm_3(void **s) {
    (void)s;
    run(sequence, RT_TRANSPORT_SHM, 3);
}
static void wrap_keeps_newest_3(void **s) {
    (void)s;
    run(wrap, RT_TRANSPORT_SHM, 3);
}
static void failed_tcp_2(void **s) {
    (void)s;
    run(failed, RT_TRANSPORT_TCP, 2);
}
static void disabled_2(void **s) {
    (void)s;
    run(disabled, RT_TRANSPORT_TCP, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sequence_tcp_2),
        cmocka_unit_test(sequence_shm_3),
        cmocka_unit_test(wrap_keeps_newest_3),
        cmocka_unit_test(failed_tcp_2),
        cmocka_unit_test(disabled_2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
