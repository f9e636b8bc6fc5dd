/* A group's operations inside a CUDA graph (dist.h, "CUDA graphs"; label gpu: exit 77
 * without a GPU; the emulated build has 2 GPUs and runs all of it). CUDA is probed in a
 * child process (a process must not fork after initialising CUDA).
 *
 *  - capturable: nccl yes; host buffers and staging (shm, two ranks on one GPU) no, saying
 *    why; staging refuses rt_pg_capture_begin, and an operation on a capturing stream of
 *    a nccl group without rt_pg_capture_begin, a blocking call and rt_wait on a captured
 *    request are errors naming the call;
 *  - reducer_replay (nccl, 1 rank and 2 ranks, f32 and bf16 compression, ring and naive): the
 *    reducer's begin, ready..., finish of one step captured with the step's uploads on
 *    the model stream, replayed 3 times with new gradients, gives the bits the uncaptured
 *    reducer gave the same gradients (a value baked in at capture repeats step 0's); the
 *    flight recorder has no entry for the capture and, per replay, one per bucket, tagged
 *    "bucket i of n, replay k", numbered on from the uncaptured steps, all done (the
 *    watchdog ends them); without a warm-up step a 2-rank bf16 capture is refused (its
 *    scratch cannot grow in a capture);
 *  - replay_dead_peer: rank 1 is killed as its second replay's all-reduce starts
 *    (RINGTRAIN_EMU_NCCL_KILL, emulated build only); rank 0's replay ends, the watchdog
 *    fails its entry and its next call fails naming the nccl error, no hang;
 *  - replay_timeout: rank 1 lives but never launches its second replay; rank 0's
 *    watchdog aborts the communicator after the group's timeout (set to 1 s for that
 *    replay only: no earlier step depends on the machine's speed), its stream completes
 *    and its next call fails naming the timed-out replay.
 * Waits are for events (the recorder's states, the stream, a flag): the bound is mp_run's
 * limit, which turns a hang into a failure. */
#include "../test_util.h"
#include "dist/dist.h"
#include "dist/internal/pg_internal.h"
#include "dist/reducer.h"
#include "mp.h"

#include <jansson.h>
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>

enum { NSEG = 4, N = 3000 + 700 + 5000 + 1300, NSTEP = 3 };
static const size_t k_seg[NSEG] = {3000, 700, 5000, 1300};
static int g_gpus;
static atomic_int *g_flag; /* shared between the ranks */

static float value(int rank, int step, size_t i) {
    double v = sin(0.37 * (double)i + 1.3 * rank + 0.71 * step) * pow(10.0, (double)((i + (size_t)rank) % 5) - 2.0);
    return (float)(v * (1.0 + 1e-3 * rank));
}

typedef struct world_s {
    rt_pg *pg;
    rt_device dev;
    rt_stream *s;
} world_s;

static int open_group(int rank, int world, int port, rt_transport t, int gpu, world_s *w) {
    char method[MP_METHOD_LEN];
    rt_pg_options o;
    mp_pg_options(&o, method, rank, world, port, t, 60);
    w->dev = rt_device_cuda(gpu);
    MP_OK(rt_device_set_current(w->dev));
    o.device = w->dev;
    MP_OK(rt_pg_init(&o, &w->pg));
    MP_OK(rt_pg_set_buffer_device(w->pg, w->dev));
    MP_OK(rt_stream_create(w->dev, &w->s));
    return 0;
}

/* ---- the flight recorder ---- */

typedef struct flight_want {
    int first, n;    /* entries [first, first + n) */
    int seq0;        /* the first one's sequence number */
    const char *tag; /* each one's tag contains it (NULL: not checked) */
    const char *state;
} flight_want;

/* *ok: entries [first, first + n) all in state `state` (with numbers and tags as wanted);
 * *total: the number of entries. */
static int flight_look(rt_pg *pg, int rank, const flight_want *fw, bool *ok, size_t *total) {
    char path[96];
    snprintf(path, sizeof path, "/tmp/rt_flight_graph_%d_%d.json", (int)getpid(), rank);
    MP_OK(rt_pg_flight_dump(pg, path));
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    unlink(path);
    MP_CHECK(j != NULL, "flight dump: %s", err.text);
    json_t *es = json_object_get(j, "entries");
    *total = json_array_size(es);
    MP_CHECK(*total >= (size_t)(fw->first + fw->n), "%zu flight entries, expected at least %d", *total,
             fw->first + fw->n);
    *ok = true;
    for (int i = fw->first; *ok && i < fw->first + fw->n; i++) {
        json_t *e = json_array_get(es, (size_t)i);
        const char *st = json_string_value(json_object_get(e, "state"));
        const char *tag = json_string_value(json_object_get(e, "tag"));
        long long seq = json_integer_value(json_object_get(e, "seq"));
        MP_CHECK(!strcmp(json_string_value(json_object_get(e, "op")), "all_reduce"), "entry %d is not an all_reduce",
                 i);
        MP_CHECK(seq == fw->seq0 + (i - fw->first), "entry %d: seq %lld, expected %d", i, seq,
                 fw->seq0 + i - fw->first);
        MP_CHECK(!fw->tag || (tag && strstr(tag, fw->tag)), "entry %d: tag '%s', expected '%s' in it", i,
                 tag ? tag : "", fw->tag);
        if (strcmp(st, fw->state) != 0) *ok = false;
    }
    json_decref(j);
    return 0;
}

/* Waits (for the watchdog: an event, not a time) until the entries are in their state. */
static int flight_wait(rt_pg *pg, int rank, const flight_want *fw) {
    bool ok = false;
    size_t total = 0;
    while (!ok) {
        if (flight_look(pg, rank, fw, &ok, &total)) return 1;
        if (!ok) sched_yield();
    }
    return 0;
}

/* ---- capturable ---- */

static int capturable_body(int rank, int world, int port, void *arg) {
    rt_transport t = *(rt_transport *)arg;
    world_s w;
    if (open_group(rank, world, port, t, t == RT_TRANSPORT_NCCL ? rank : 0, &w)) return 1;
    char why[256];
    if (t != RT_TRANSPORT_NCCL) {
        MP_CHECK(!rt_pg_capturable(w.pg, why, sizeof why) && strstr(why, "shm stages device buffers through the host"),
                 "staging: capturable or '%s'", why);
        MP_CHECK(rt_pg_capture_begin(w.pg) == RT_ERR_UNSUPPORTED && strstr(rt_error_message(), "cannot be captured"),
                 "staging capture_begin: %s", rt_error_message());
        MP_OK(rt_pg_set_buffer_device(w.pg, rt_device_cpu()));
        MP_CHECK(!rt_pg_capturable(w.pg, why, sizeof why) && strstr(why, "host memory"), "host buffers: '%s'", why);
        rt_pg_destroy(w.pg);
        return 0;
    }
    MP_CHECK(rt_pg_capturable(w.pg, why, sizeof why) && why[0] == '\0', "nccl: not capturable: %s", why);
    float *d;
    MP_OK(rt_malloc(w.dev, 64 * sizeof *d, (void **)&d));
    MP_OK(rt_memset(w.dev, d, 0, 64 * sizeof *d, w.s));
    rt_pg_set_stream(w.pg, w.s);
    rt_request *req = NULL;
    rt_graph *graph = NULL;
    MP_OK(rt_stream_capture_begin(w.s));
    rt_status s = rt_iall_reduce(w.pg, d, 64, RT_F32, RT_OP_SUM, &req);
    MP_CHECK(s == RT_ERR_INVALID && strstr(rt_error_message(), "all_reduce: the group's stream is capturing") &&
                 strstr(rt_error_message(), "rt_pg_capture_begin"),
             "without capture_begin: %s", rt_error_message());
    MP_OK(rt_pg_capture_begin(w.pg));
    s = rt_all_reduce(w.pg, d, 64, RT_F32, RT_OP_SUM);
    MP_CHECK(s == RT_ERR_INVALID && strstr(rt_error_message(), "all_reduce: a blocking call cannot be captured"),
             "blocking: %s", rt_error_message());
    MP_OK(rt_iall_reduce(w.pg, d, 64, RT_F32, RT_OP_SUM, &req));
    s = rt_wait(req);
    MP_CHECK(s == RT_ERR_INVALID && strstr(rt_error_message(), "rt_wait: all_reduce was captured"), "rt_wait: %s",
             rt_error_message());
    rt_pg_graph *pgg = NULL;
    MP_OK(rt_pg_capture_end(w.pg, &pgg));
    MP_CHECK(rt_pg_graph_ops(pgg) == 1, "the graph holds %d operations", rt_pg_graph_ops(pgg));
    /* the comm stream forked by the waited-for operation was never joined: CUDA refuses */
    MP_CHECK(rt_stream_capture_end(w.s, &graph) != RT_OK, "a capture with an unjoined operation ended");
    rt_pg_graph_free(pgg);
    rt_pg_set_stream(w.pg, NULL);
    MP_OK(rt_all_reduce(w.pg, d, 64, RT_F32, RT_OP_SUM)); /* the group works on */
    rt_free(w.dev, d);
    rt_stream_destroy(w.s);
    rt_pg_destroy(w.pg);
    return 0;
}

static void capturable(void **st) {
    (void)st;
    rt_transport shm = RT_TRANSPORT_SHM, nccl = RT_TRANSPORT_NCCL;
    int codes[2];
    assert_int_equal(mp_run(2, capturable_body, &shm, 120, codes), 0);
    if (g_gpus < 2) {
        printf("capturable over nccl: skipped, needs 2 GPUs (this machine has %d)\n", g_gpus);
        return;
    }
    assert_int_equal(mp_run(2, capturable_body, &nccl, 120, codes), 0);
}

/* ---- the reducer captured and replayed ---- */

typedef struct rcfg {
    bool bf16;
    rt_algo algo;
} rcfg;

static int reducer_step(rt_reducer *r, const size_t *bounds) {
    MP_OK(rt_reducer_begin(r));
    for (int s = NSEG - 1; s >= 0; s--) MP_OK(rt_reducer_ready(r, bounds[s], bounds[s + 1]));
    MP_OK(rt_reducer_finish(r));
    return 0;
}

/* the step's upload (on the model stream, as the trainer's input copy) */
static int upload(world_s *w, float *h, float *d, int rank, int step) {
    for (size_t i = 0; i < N; i++) h[i] = value(rank, step, i);
    MP_OK(rt_memcpy(d, w->dev, h, rt_device_cpu(), N * sizeof *h, w->s));
    return 0;
}

static int capture_step(world_s *w, rt_reducer *r, const size_t *bounds, float *pinned, float *d, rt_graph **graph,
                        rt_pg_graph **pgg) {
    MP_OK(rt_stream_capture_begin(w->s));
    MP_OK(rt_pg_capture_begin(w->pg));
    MP_OK(rt_memcpy(d, w->dev, pinned, rt_device_cpu(), N * sizeof *d, w->s));
    if (reducer_step(r, bounds)) return 1;
    MP_OK(rt_pg_capture_end(w->pg, pgg));
    MP_OK(rt_stream_capture_end(w->s, graph));
    return 0;
}

static int reducer_body(int rank, int world, int port, void *arg) {
    const rcfg *c = arg;
    world_s w;
    if (open_group(rank, world, port, RT_TRANSPORT_NCCL, rank, &w)) return 1;
    rt_pg_set_algo(w.pg, c->algo);
    size_t bounds[NSEG + 1] = {0};
    for (int s = 0; s < NSEG; s++) bounds[s + 1] = bounds[s] + k_seg[s] * sizeof(float);
    float *h = malloc(N * sizeof *h), *ref = malloc(NSTEP * N * sizeof *ref), *d, *pinned;
    bool is_pinned;
    MP_CHECK(h && ref, "malloc");
    MP_OK(rt_malloc(w.dev, N * sizeof *d, (void **)&d));
    MP_OK(rt_host_alloc(N * sizeof *pinned, true, (void **)&pinned, &is_pinned));
    rt_reducer_options ro;
    rt_reducer_options_default(&ro);
    ro.bucket_bytes = ro.first_bucket_bytes = 4;
    ro.compress_bf16 = c->bf16;
    ro.stream = w.s;
    rt_reducer *r;
    MP_OK(rt_reducer_create(w.pg, d, bounds, NSEG, &ro, &r));
    int nb = rt_reducer_bucket_count(r);
    rt_graph *graph = NULL;
    rt_pg_graph *pgg = NULL;
    if (c->bf16 && world > 1) { /* no warm-up yet: the bf16 scratch would have to grow inside the capture */
        MP_OK(rt_stream_capture_begin(w.s));
        MP_OK(rt_pg_capture_begin(w.pg));
        MP_OK(rt_reducer_begin(r));
        rt_status s = rt_reducer_ready(r, bounds[NSEG - 1], bounds[NSEG]);
        MP_CHECK(s == RT_ERR_INVALID && strstr(rt_error_message(), "a CUDA graph capture cannot allocate"),
                 "bf16 capture without a warm-up: %s: %s", rt_status_name(s), rt_error_message());
        MP_CHECK(rt_reducer_finish(r) != RT_OK, "finish after a failed ready");
        MP_CHECK(rt_pg_capture_end(w.pg, &pgg) == RT_OK && rt_pg_graph_ops(pgg) == 0, "capture end");
        rt_pg_graph_free(pgg);
        if (rt_stream_capture_end(w.s, &graph) == RT_OK) rt_graph_destroy(graph); /* the rounding kernel */
        graph = NULL;
    }
    for (int k = 0; k < NSTEP; k++) { /* uncaptured: the reference bits (and the warm-up) */
        if (upload(&w, h, d, rank, k) || reducer_step(r, bounds)) return 1;
        MP_OK(rt_memcpy(ref + (size_t)k * N, rt_device_cpu(), d, w.dev, N * sizeof *h, w.s));
        MP_OK(rt_stream_sync(w.s));
    }
    flight_want fw = {0, NSTEP * nb, 1, "bucket", "done"};
    size_t total = 0;
    if (flight_wait(w.pg, rank, &fw)) return 1;
    if (capture_step(&w, r, bounds, pinned, d, &graph, &pgg)) return 1;
    bool ok = false;
    if (flight_look(w.pg, rank, &fw, &ok, &total)) return 1;
    MP_CHECK(total == (size_t)(NSTEP * nb), "%zu flight entries after the capture, expected %d", total, NSTEP * nb);
    MP_CHECK(rt_pg_graph_ops(pgg) == nb, "the graph holds %d operations, expected %d", rt_pg_graph_ops(pgg), nb);
    for (int k = 0; k < NSTEP; k++) {
        MP_OK(rt_stream_sync(w.s)); /* the pinned input is rewritten: the last replay has read it */
        for (size_t i = 0; i < N; i++) pinned[i] = value(rank, k, i);
        char tag[32];
        snprintf(tag, sizeof tag, "replay %d", k);
        rt_pg_set_tag(w.pg, tag);
        MP_OK(rt_graph_launch(graph, w.s));
        MP_OK(rt_pg_graph_launched(w.pg, pgg, w.s));
        MP_OK(rt_memcpy(h, rt_device_cpu(), d, w.dev, N * sizeof *h, w.s));
        MP_OK(rt_stream_sync(w.s));
        size_t differ = 0, first = N;
        for (size_t i = 0; i < N; i++)
            if (memcmp(&h[i], &ref[(size_t)k * N + i], sizeof *h) != 0 && differ++ == 0) first = i;
        MP_CHECK(differ == 0,
                 "%s, %s, replay %d: %zu of %d elements differ from the uncaptured step's (first [%zu]: %.9g, "
                 "uncaptured %.9g)",
                 c->bf16 ? "bf16" : "f32", rt_algo_name(c->algo), k, differ, N, first, (double)h[first],
                 (double)ref[(size_t)k * N + first]);
        flight_want fr = {(NSTEP + k) * nb, nb, (NSTEP + k) * nb + 1, tag, "done"};
        if (flight_wait(w.pg, rank, &fr)) return 1;
    }
    rt_graph_destroy(graph);
    rt_pg_graph_free(pgg);
    rt_reducer_destroy(r);
    rt_free(w.dev, d);
    rt_host_free(pinned, is_pinned);
    rt_stream_destroy(w.s);
    rt_pg_destroy(w.pg);
    free(h), free(ref);
    return 0;
}

/* 1 rank (any GPU: real NCCL and CUDA accept the captured sequence) and 2 ranks */
static void reducer_replay(void **st) {
    (void)st;
    static const rcfg cfgs[] = {{false, RT_ALGO_RING}, {true, RT_ALGO_RING}, {true, RT_ALGO_NAIVE}};
    for (int world = 1; world <= 2; world++) {
        if (world > g_gpus) {
            printf("reducer_replay with %d ranks: skipped, needs %d GPUs (this machine has %d)\n", world, world,
                   g_gpus);
            continue;
        }
        for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
            int codes[2];
            assert_int_equal(mp_run(world, reducer_body, (void *)&cfgs[i], 60, codes), 0);
        }
    }
}

/* ---- a replay that fails ---- */

/* One all-reduce captured; replay 1 runs; then `fault` (rank 1 dies in replay 2, or
 * never launches it); rank 0 launches replay 2 and must see the failure. */
static int fail_body(int rank, int world, int port, void *arg) {
    bool kill_peer = *(bool *)arg;
    if (kill_peer && rank == 1) setenv("RINGTRAIN_EMU_NCCL_KILL", "ncclAllReduce:2", 1);
    world_s w;
    if (open_group(rank, world, port, RT_TRANSPORT_NCCL, rank, &w)) return 1;
    float *d;
    MP_OK(rt_malloc(w.dev, 1000 * sizeof *d, (void **)&d));
    MP_OK(rt_memset(w.dev, d, 0, 1000 * sizeof *d, w.s));
    rt_pg_set_stream(w.pg, w.s);
    rt_graph *graph = NULL;
    rt_pg_graph *pgg = NULL;
    rt_request *req;
    MP_OK(rt_stream_capture_begin(w.s));
    MP_OK(rt_pg_capture_begin(w.pg));
    MP_OK(rt_iall_reduce(w.pg, d, 1000, RT_F32, RT_OP_SUM, &req));
    MP_OK(rt_wait_stream(req, w.s));
    MP_OK(rt_pg_capture_end(w.pg, &pgg));
    MP_OK(rt_stream_capture_end(w.s, &graph));
    for (int k = 0; k < 2; k++) {
        if (k == 1 && !kill_peer && rank == 1) {
            while (!atomic_load(g_flag)) sched_yield(); /* alive, not launching, until rank 0 is done */
            return 0;
        }
        /* (test only) the watchdog's deadline of the replay that rank 1 never joins: 1 s */
        if (k == 1 && !kill_peer) w.pg->timeout_s = 1.0;
        MP_OK(rt_graph_launch(graph, w.s));
        MP_OK(rt_pg_graph_launched(w.pg, pgg, w.s));
        MP_OK(rt_stream_sync(w.s)); /* the failed replay ends too (the abort or the peer's death ends it) */
    }
    MP_CHECK(rank == 0, "rank 1 survived its kill");
    atomic_store(g_flag, 1);                    /* rank 1 (alive in the timeout case) may go */
    flight_want fw = {1, 1, 2, NULL, "failed"}; /* the watchdog fails replay 2's entry */
    if (flight_wait(w.pg, rank, &fw)) return 1;
    rt_status s = rt_all_reduce(w.pg, d, 1000, RT_F32, RT_OP_SUM);
    const char *want =
        kill_peer ? "graph replay over nccl: remote process exited" : "graph replay over nccl: timed out";
    MP_CHECK(s == (kill_peer ? RT_ERR_PEER : RT_ERR_TIMEOUT) &&
                 strstr(rt_error_message(), "the process group is broken") && strstr(rt_error_message(), want),
             "the call after a failed replay: %s: %s (expected '%s')", rt_status_name(s), rt_error_message(), want);
    s = rt_pg_graph_launched(w.pg, pgg, w.s);
    MP_CHECK(s != RT_OK && strstr(rt_error_message(), "broken"), "a launch on a broken group: %s", rt_error_message());
    rt_graph_destroy(graph);
    rt_pg_graph_free(pgg);
    rt_pg_destroy(w.pg);
    return 0;
}

static void replay_dead_peer(void **st) {
    (void)st;
#ifndef RT_TEST_EMU_NCCL
    printf("replay_dead_peer: skipped, needs the emulated NCCL (RINGTRAIN_EMU_NCCL_KILL)\n");
    skip();
#endif
    if (g_gpus < 2) {
        printf("replay_dead_peer: skipped, needs 2 GPUs (this machine has %d)\n", g_gpus);
        skip();
    }
    bool kill_peer = true;
    int codes[2];
    mp_run(2, fail_body, &kill_peer, 60, codes);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 128 + 9);
}

static void replay_timeout(void **st) {
    (void)st;
    if (g_gpus < 2) {
        printf("replay_timeout: skipped, needs 2 GPUs (this machine has %d)\n", g_gpus);
        skip();
    }
    atomic_store(g_flag, 0);
    bool kill_peer = false;
    int codes[2];
    assert_int_equal(mp_run(2, fail_body, &kill_peer, 60, codes), 0);
}

int main(void) {
    int rc = 0;
    g_gpus = rt_test_probe_gpus(&rc);
    if (rc != 0) return rc;
    g_flag = mmap(NULL, sizeof *g_flag, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_flag == MAP_FAILED) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(capturable),
        cmocka_unit_test(reducer_replay),
        cmocka_unit_test(replay_dead_peer),
        cmocka_unit_test(replay_timeout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
