/* Device buffers (label gpu; exit 77 without a GPU). One GPU: two ranks over shm share
 * it, all_reduce and broadcast of device buffers stage through pinned host memory; the
 * nccl transport refuses two ranks on one GPU with a message naming them; a one-rank
 * nccl group runs every collective. Two or more GPUs: two ranks over nccl, all_reduce
 * AVG, broadcast, all_gather, send/recv of device buffers. Results are checked against
 * local expectations on the host, and the flight recorder holds every call, done (staged:
 * the ring's algorithms; nccl: "nccl"). CUDA is probed in a child process (a process must not
 * fork after initialising CUDA). */
#include "../test_util.h"
#include "dist/dist.h"
#include "mp.h"

#ifdef RT_HAVE_CUDA
#include <cuda_runtime.h>
#endif
#include <jansson.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int g_gpus;

typedef struct cfg {
    rt_transport transport;
    int expect_refusal;
    int expect_transport; /* -1: any */
} cfg;

/* The flight recorder sees device-buffer operations too (staged or nccl): the calls
 * of body() in order, every one done, collectives numbered 1, 2, ... */
static int check_flight(rt_pg *pg, int rank, size_t n) {
    char path[96];
    snprintf(path, sizeof path, "/tmp/rt_flight_nccl_%d_%d.json", (int)getpid(), rank);
    MP_OK(rt_pg_flight_dump(pg, path));
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    unlink(path);
    MP_CHECK(j != NULL, "flight dump: %s", err.text);
    json_t *es = json_object_get(j, "entries");
    bool nccl = rt_pg_transport(pg) == RT_TRANSPORT_NCCL;
    static const char *const want[] = {"all_reduce", "broadcast", "all_gather", "all_reduce", "barrier"};
    size_t nwant = nccl ? 5 : 2;
    MP_CHECK(json_array_size(es) >= nwant, "flight: %zu entries", json_array_size(es));
    long long seq = 1;
    for (size_t i = 0; i < json_array_size(es); i++) {
        json_t *e = json_array_get(es, i);
        const char *op = json_string_value(json_object_get(e, "op"));
        const char *st = json_string_value(json_object_get(e, "state"));
        const char *algo = json_string_value(json_object_get(e, "algo"));
        MP_CHECK(op && st && algo, "flight entry %zu incomplete", i);
        MP_CHECK(!strcmp(st, "done"), "flight entry %zu (%s): state %s", i, op, st);
        if (i < nwant) MP_CHECK(!strcmp(op, want[i]), "flight entry %zu: %s, want %s", i, op, want[i]);
        if (nccl) MP_CHECK(!strcmp(algo, "nccl"), "flight entry %zu (%s): algo %s", i, op, algo);
        if (strcmp(op, "send") && strcmp(op, "recv")) {
            MP_CHECK(json_integer_value(json_object_get(e, "seq")) == seq, "flight entry %zu (%s): seq %lld, want %lld",
                     i, op, (long long)json_integer_value(json_object_get(e, "seq")), seq);
            seq++;
        }
    }
    json_t *e0 = json_array_get(es, 0);
    MP_CHECK(json_integer_value(json_object_get(e0, "count")) == (json_int_t)n &&
                 !strcmp(json_string_value(json_object_get(e0, "dtype")), "f32"),
             "flight entry 0: count %lld", (long long)json_integer_value(json_object_get(e0, "count")));
    json_decref(j);
    return 0;
}

static int body(int rank, int world, int port, void *arg) {
    cfg *c = arg;
    char method[MP_METHOD_LEN];
    rt_pg_options o;
    mp_pg_options(&o, method, rank, world, port, c->transport, 60);
    setenv("LOCAL_RANK", rank ? "1" : "0", 1);
    /* two ranks on one GPU on any machine: only GPU 0 is visible to them */
    if (c->expect_refusal) setenv("CUDA_VISIBLE_DEVICES", "0", 1);
    rt_device dev;
    MP_OK(rt_device_select("cuda", rank, &dev));
    o.device = dev;
    rt_pg *pg;
    rt_status s = rt_pg_init(&o, &pg);
    if (c->expect_refusal) {
        MP_CHECK(s == RT_ERR_UNSUPPORTED, "rank %d: two ranks on one GPU over nccl: %s: %s", rank, rt_status_name(s),
                 rt_error_message());
        MP_CHECK(strstr(rt_error_message(), "share GPU"), "message: %s", rt_error_message());
        return 0;
    }
    MP_OK(s);
    if (c->expect_transport >= 0)
        MP_CHECK(rt_pg_transport(pg) == (rt_transport)c->expect_transport, "transport %s",
                 rt_transport_name(rt_pg_transport(pg)));
    MP_OK(rt_pg_set_buffer_device(pg, dev));
    size_t n = 1000003;
    float *h = malloc(n * sizeof *h), *d = NULL;
    MP_CHECK(h != NULL, "alloc");
    MP_OK(rt_malloc(dev, n * sizeof *h, (void **)&d));
    for (size_t i = 0; i < n; i++) h[i] = (float)((rank + 1) * (int)(i % 17));
    MP_OK(rt_memcpy(d, dev, h, rt_device_cpu(), n * sizeof *h, NULL));
    MP_OK(rt_all_reduce(pg, d, n, RT_F32, RT_OP_SUM));
    MP_OK(rt_memcpy(h, rt_device_cpu(), d, dev, n * sizeof *h, NULL));
    for (size_t i = 0; i < n; i++)
        MP_CHECK(h[i] == (float)(world * (world + 1) / 2 * (int)(i % 17)), "all_reduce [%zu] = %g", i, h[i]);
    int64_t v = rank == 0 ? 77 : 0, *vd = NULL;
    MP_OK(rt_malloc(dev, sizeof v, (void **)&vd));
    MP_OK(rt_memcpy(vd, dev, &v, rt_device_cpu(), sizeof v, NULL));
    MP_OK(rt_broadcast(pg, vd, 1, RT_I64, 0));
    MP_OK(rt_memcpy(&v, rt_device_cpu(), vd, dev, sizeof v, NULL));
    MP_CHECK(v == 77, "broadcast got %lld", (long long)v);
    if (rt_pg_transport(pg) == RT_TRANSPORT_NCCL) {
        int32_t me = rank + 5, all[8] = {0}, *md = NULL, *ad = NULL;
        MP_OK(rt_malloc(dev, sizeof me, (void **)&md));
        MP_OK(rt_malloc(dev, sizeof all, (void **)&ad));
        MP_OK(rt_memcpy(md, dev, &me, rt_device_cpu(), sizeof me, NULL));
        MP_OK(rt_all_gather(pg, md, ad, 1, RT_I32));
        MP_OK(rt_memcpy(all, rt_device_cpu(), ad, dev, (size_t)world * sizeof me, NULL));
        for (int k = 0; k < world; k++) MP_CHECK(all[k] == k + 5, "all_gather [%d] = %d", k, all[k]);
        MP_OK(rt_all_reduce(pg, d, n, RT_F32, RT_OP_AVG));
        MP_OK(rt_barrier(pg));
        if (world > 1) {
            if (rank == 0) MP_OK(rt_send(pg, md, 1, RT_I32, 1));
            if (rank == 1) {
                MP_OK(rt_recv(pg, md, 1, RT_I32, 0));
                MP_OK(rt_memcpy(&me, rt_device_cpu(), md, dev, sizeof me, NULL));
                MP_CHECK(me == 5, "recv got %d", me);
            }
        }
        rt_free(dev, md);
        rt_free(dev, ad);
    }
    rt_free(dev, d);
    rt_free(dev, vd);
    free(h);
    if (check_flight(pg, rank, n)) return 1;
    rt_pg_destroy(pg);
    return 0;
}

/* The communicator runs on the group's device, the one the program chose (not a guess
 * of its own from the local rank): local rank 0 asking for the last GPU gets NCCL there,
 * even when another GPU is current when the group is created. */
static int on_chosen_device(int rank, int world, int port, void *arg) {
    (void)arg;
    char method[MP_METHOD_LEN];
    rt_pg_options o;
    mp_pg_options(&o, method, rank, world, port, RT_TRANSPORT_NCCL, 60);
    setenv("LOCAL_RANK", "0", 1);
    char want[32];
    snprintf(want, sizeof want, "cuda:%d", g_gpus - 1);
    rt_device dev;
    MP_OK(rt_device_select(want, 0, &dev));
    MP_CHECK(dev.index == g_gpus - 1, "selected cuda:%d", dev.index);
    MP_OK(rt_device_set_current(rt_device_cuda(0))); /* something else is current */
    o.device = dev;
    rt_pg *pg;
    MP_OK(rt_pg_init(&o, &pg));
    MP_OK(rt_pg_set_buffer_device(pg, dev));
    float h[4] = {1, 2, 3, 4}, *d = NULL;
    MP_OK(rt_malloc(dev, sizeof h, (void **)&d));
    MP_OK(rt_memcpy(d, dev, h, rt_device_cpu(), sizeof h, NULL));
    MP_OK(rt_all_reduce(pg, d, 4, RT_F32, RT_OP_SUM));
#ifdef RT_HAVE_CUDA
    int cur = -1;
    MP_CHECK(cudaGetDevice(&cur) == cudaSuccess && cur == g_gpus - 1, "NCCL ran on GPU %d, the group's is %d", cur,
             g_gpus - 1);
#endif
    MP_OK(rt_memcpy(h, rt_device_cpu(), d, dev, sizeof h, NULL));
    MP_CHECK(h[0] == 1 && h[3] == 4, "all_reduce of one rank changed the data: %g", h[0]);
    rt_free(dev, d);
    rt_pg_destroy(pg);
    return 0;
}

/* Debug mode over nccl (which has no message headers to compare): ranks that call
 * all_reduce with different counts fail before the operation is enqueued, each naming both
 * calls; the recorder holds the first (matching, tagged) all-reduce only. */
static int debug_desync(int rank, int world, int port, void *arg) {
    (void)arg;
    char method[MP_METHOD_LEN];
    rt_pg_options o;
    mp_pg_options(&o, method, rank, world, port, RT_TRANSPORT_NCCL, 60);
    o.debug = true;
    setenv("LOCAL_RANK", rank ? "1" : "0", 1);
    rt_device dev;
    MP_OK(rt_device_select("cuda", rank, &dev));
    o.device = dev;
    rt_pg *pg;
    MP_OK(rt_pg_init(&o, &pg));
    MP_CHECK(rt_pg_transport(pg) == RT_TRANSPORT_NCCL, "transport %s", rt_transport_name(rt_pg_transport(pg)));
    float *d = NULL;
    MP_OK(rt_malloc(dev, 1000 * sizeof *d, (void **)&d));
    MP_OK(rt_memset(dev, d, 0, 1000 * sizeof *d, NULL));
    rt_pg_set_tag(pg, "step 7");
    MP_OK(rt_all_reduce(pg, d, 1000, RT_F32, RT_OP_SUM));
    rt_status s = rt_all_reduce(pg, d, rank == 0 ? 1000 : 999, RT_F32, RT_OP_SUM);
    MP_CHECK(s == RT_ERR_PEER, "a count mismatch over nccl in debug mode: %s: %s", rt_status_name(s),
             rt_error_message());
    const char *e = rt_error_message();
    MP_CHECK(strstr(e, "desync at #2 (group 0, dist debug mode, before it ran)") &&
                 strstr(e, "all_reduce #2 (f32 x 1000, 4.0 kB, sum, step 7)") &&
                 strstr(e, "all_reduce #2 (f32 x 999, 4.0 kB, sum, step 7)"),
             "message: %s", e);
    char path[128];
    snprintf(path, sizeof path, "/tmp/rt_flight_nccl_debug_%d_%d.json", (int)getpid(), rank);
    MP_OK(rt_pg_flight_dump(pg, path));
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    remove(path);
    MP_CHECK(j != NULL, "flight dump: %s", err.text);
    json_t *es = json_object_get(j, "entries");
    MP_CHECK(json_array_size(es) == 1, "flight: %zu entries, want the first all_reduce only", json_array_size(es));
    json_t *e0 = json_array_get(es, 0);
    MP_CHECK(!strcmp(json_string_value(json_object_get(e0, "algo")), "nccl") &&
                 !strcmp(json_string_value(json_object_get(e0, "state")), "done") &&
                 !strcmp(json_string_value(json_object_get(e0, "tag")), "step 7"),
             "flight entry 0 is not the tagged, done nccl all_reduce");
    json_decref(j);
    rt_free(dev, d);
    rt_pg_destroy(pg);
    return 0;
}

static void nccl_debug_desync(void **s) {
    (void)s;
    if (g_gpus < 2) {
        printf("nccl_debug_desync: skipped, needs 2 GPUs (this machine has %d)\n", g_gpus);
        skip();
    }
    int codes[2];
    assert_int_equal(mp_run(2, debug_desync, NULL, 120, codes), 0);
}

static void nccl_on_chosen_device(void **s) {
    (void)s;
    int codes[1];
    assert_int_equal(mp_run(1, on_chosen_device, NULL, 120, codes), 0);
}

static void run_expect(rt_transport t, int world, int refusal, int expect) {
    cfg c = {t, refusal, expect};
    int codes[4];
    assert_int_equal(mp_run(world, body, &c, 120, codes), 0);
}

static void run(rt_transport t, int world, int refusal) { run_expect(t, world, refusal, -1); }

/* transport auto with device buffers: nccl with a GPU per rank, else shm with staging */
static void auto_picks(void **s) {
    (void)s;
    run_expect(RT_TRANSPORT_AUTO, 2, 0, g_gpus >= 2 ? RT_TRANSPORT_NCCL : RT_TRANSPORT_SHM);
}

static void shared_gpu_staged(void **s) {
    (void)s;
    run(RT_TRANSPORT_SHM, 2, 0);
}
static void nccl_one_rank(void **s) {
    (void)s;
    run(RT_TRANSPORT_NCCL, 1, 0);
}
static void nccl_shared_gpu_refused(void **s) {
    (void)s;
    run(RT_TRANSPORT_NCCL, 2, 1);
}
static void nccl_two_gpus(void **s) {
    (void)s;
    if (g_gpus < 2) {
        printf("nccl_two_gpus: skipped, needs 2 GPUs (this machine has %d)\n", g_gpus);
        skip();
    }
    run(RT_TRANSPORT_NCCL, 2, 0);
}

int main(void) {
    int rc = 0;
    g_gpus = rt_test_probe_gpus(&rc);
    if (rc != 0) return rc;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(shared_gpu_staged), cmocka_unit_test(nccl_one_rank), cmocka_unit_test(nccl_shared_gpu_refused),
        cmocka_unit_test(nccl_two_gpus),     cmocka_unit_test(auto_picks),    cmocka_unit_test(nccl_on_chosen_device),
        cmocka_unit_test(nccl_debug_desync),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
