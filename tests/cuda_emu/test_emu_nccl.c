/* The emulated NCCL (tests/cuda_emu/nccl.cpp) across real processes: the ranks are
 * fork()ed children that each start their own emulated runtime after the fork (the parent
 * calls no CUDA or NCCL function; even the unique id is made in a child of its own).
 *
 * What is checked:
 *  - all-reduce for every emulated data type and operation, against the value NCCL
 *    defines (ncclAvg: floats pre-multiplied by float(1.0/nranks) then summed in rank
 *    order; integers: the wrapping sum divided toward zero), bit-identical across ranks,
 *    with 2 and 3 ranks and with sizes that cross the emulation's chunk and ring sizes;
 *  - broadcast (and in-place ncclBcast), reduce, all-gather, reduce-scatter;
 *  - send/recv pairs in one group in both orders, nested groups, a send to oneself;
 *  - the operation runs on the stream given (a held stream holds the result back);
 *  - non-blocking init returns ncclInProgress and a communicator used before it is ready
 *    is refused; non-blocking operations and finalize are polled to completion;
 *  - a killed peer gives the others ncclRemoteError and their waiting stream completes;
 *    ncclCommAbort unblocks a stream waiting for a live peer and later calls fail;
 *  - two ranks on one device are refused (ncclInvalidUsage), the others are not;
 *  - RINGTRAIN_EMU_NCCL_FAIL inside a group: the error, the group left open, the refusal
 *    of the next operation while it is open, ncclGroupEnd returning the error;
 *  - stream capture: an all-reduce and a grouped send/recv captured in a graph run at each
 *    replay, not at capture, with the buffers' contents at the replay, ordered among
 *    uncaptured operations where the graph was launched; a peer that dies in a replay
 *    gives ncclRemoteError, a later replay does nothing and an uncaptured call fails;
 *  - no file of a communicator is left in /dev/shm.
 *
 * No timing windows: every wait is for an event (a flag in shared memory, a stream, an
 * error); the only bound is the safety limit that turns a hang into a failure.
 */
#include "test_util.h"

#include <cuda_runtime.h>
#include <math.h>
#include <nccl.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define MAXR 3
#define LIMIT_S 240 /* a hang becomes a failure (ctest's timeout is 300 s) */

/* ---- the process harness ------------------------------------------------------------- */

typedef struct {
    ncclUniqueId id;
    atomic_int flag[8];               /* rank-to-rank signals */
    uint64_t hash[MAXR][64];          /* results' hashes, per rank and case */
    int ncase;
} shared_t;

static shared_t *g_sh;

typedef int (*rank_fn)(int rank, int n);

/* In ranks: print and return 1 when a condition fails. */
#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: rank check failed: %s: ", __FILE__, __LINE__, #cond);                             \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fprintf(stderr, "\n");                                                                                     \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)
#define CUDA_OK(expr)                                                                                                  \
    do {                                                                                                               \
        cudaError_t e_ = (expr);                                                                                       \
        CHECK(e_ == cudaSuccess, "%s", cudaGetErrorString(e_));                                                        \
    } while (0)
#define NCCL_IS(expr, want)                                                                                            \
    do {                                                                                                               \
        ncclResult_t r_ = (expr);                                                                                      \
        CHECK(r_ == (want), "got %d (%s), expected %d", (int)r_, ncclGetErrorString(r_), (int)(want));                 \
    } while (0)
#define NCCL_OK(expr) NCCL_IS(expr, ncclSuccess)

static void make_shared(void) {
    if (!g_sh) {
        g_sh = mmap(NULL, sizeof *g_sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        assert_true(g_sh != MAP_FAILED);
    }
    memset(g_sh, 0, sizeof *g_sh);
}

/* waits for children; kills the rest after the limit; codes: exit code or 128+signal */
static void reap(pid_t *pids, int n, int *codes) {
    time_t end = time(NULL) + LIMIT_S;
    int left = n;
    for (int i = 0; i < n; i++) codes[i] = -1;
    while (left > 0) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p == 0) {
            if (time(NULL) > end) {
                for (int i = 0; i < n; i++)
                    if (codes[i] == -1) kill(pids[i], SIGKILL);
                end = time(NULL) + 3600;
            }
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
            continue;
        }
        if (p < 0) break;
        for (int i = 0; i < n; i++)
            if (pids[i] == p) {
                codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                left--;
            }
    }
}

/* the unique id, made in a child of its own (the parent calls no NCCL function) */
static void make_id(void) {
    pid_t p = fork();
    assert_true(p >= 0);
    if (p == 0) _exit(ncclGetUniqueId(&g_sh->id) == ncclSuccess ? 0 : 1);
    int code;
    reap(&p, 1, &code);
    assert_int_equal(code, 0);
}

static char *seg_path(char *buf, size_t n) {
    uint64_t w1, w2;
    memcpy(&w1, g_sh->id.internal + 8, 8);
    memcpy(&w2, g_sh->id.internal + 16, 8);
    snprintf(buf, n, "/dev/shm/ringtrain-emu-nccl-%016llx%016llx", (unsigned long long)w1, (unsigned long long)w2);
    return buf;
}

/* Runs fn in n ranks; codes[] as reap's. Checks that no file of the id was left. */
static void run_ranks(int n, rank_fn fn, int *codes) {
    make_shared();
    make_id();
    pid_t pids[MAXR];
    fflush(NULL);
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0) {
            int rc = fn(r, n);
            fflush(NULL);
            _exit(rc);
        }
    }
    reap(pids, n, codes);
    char path[128], lock[160];
    seg_path(path, sizeof path);
    snprintf(lock, sizeof lock, "%s-lock", path);
    if (access(path, F_OK) == 0 || access(lock, F_OK) == 0) fail_msg("%s (or its lock) was left behind", path);
}

static void expect_all_pass(int n, rank_fn fn) {
    int codes[MAXR];
    run_ranks(n, fn, codes);
    for (int r = 0; r < n; r++)
        if (codes[r] != 0) fail_msg("rank %d of %d exited with %d", r, n, codes[r]);
}

/* a rank's common start: device rank (one GPU each), a blocking communicator, a blocking
 * stream (ordered after the uploads of cudaMemcpy and cudaMemset on the legacy stream) */
static int start(int rank, int n, int device, ncclComm_t *comm, cudaStream_t *s) {
    CUDA_OK(cudaSetDevice(device));
    NCCL_OK(ncclCommInitRank(comm, n, g_sh->id, rank));
    CUDA_OK(cudaStreamCreate(s));
    return 0;
}

static void signal_flag(int i) { atomic_store(&g_sh->flag[i], 1); }
static void wait_flag(int i) {
    while (!atomic_load(&g_sh->flag[i])) sched_yield();
}

static uint64_t fnv(const void *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ull;
    return h;
}

/* ---- values and what NCCL defines the reductions to be ------------------------------- */

static const ncclDataType_t k_types[] = {ncclInt8,  ncclUint8,  ncclInt32,   ncclUint32,
                                         ncclInt64, ncclUint64, ncclFloat32, ncclFloat64};
static const ncclRedOp_t k_ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};

static size_t tsize(ncclDataType_t t) {
    return t == ncclInt8 || t == ncclUint8 ? 1 : t == ncclInt64 || t == ncclUint64 || t == ncclFloat64 ? 8 : 4;
}

/* rank r's element i: small signed integers (products wrap in 8 bits), or floats with
 * many fraction bits, both signs */
static long long ival(int r, size_t i) { return (long long)((i * 131 + (size_t)r * 977 + i / 7) % 251) - 125; }
static double fval(int r, size_t i) { return (double)ival(r, i) / 7.0 + (double)((i + (size_t)r) % 13) * 1e-3; }

static void put(ncclDataType_t t, void *buf, size_t i, long long v, double f) {
    switch (t) {
    case ncclInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t *)buf)[i] = (int32_t)(v * 100003); break;
    case ncclUint32: ((uint32_t *)buf)[i] = (uint32_t)(v * 100003); break;
    case ncclInt64: ((int64_t *)buf)[i] = (int64_t)v * 1000000007ll; break;
    case ncclUint64: ((uint64_t *)buf)[i] = (uint64_t)((int64_t)v * 1000000007ll); break;
    case ncclFloat32: ((float *)buf)[i] = (float)f; break;
    default: ((double *)buf)[i] = f;
    }
}

static void fill(ncclDataType_t t, void *buf, int r, size_t count) {
    for (size_t i = 0; i < count; i++) put(t, buf, i, ival(r, i), fval(r, i));
}

/* Integer reductions as NCCL defines them: sums and products wrap (unsigned arithmetic
 * of the width), ncclAvg divides the wrapped sum toward zero (C's division). */
#define INT_EXPECT(T, U)                                                                                               \
    static T exp_##T(ncclRedOp_t op, int n, const T *x) {                                                              \
        U acc = (U)x[0];                                                                                               \
        T best = x[0];                                                                                                 \
        for (int r = 1; r < n; r++) {                                                                                  \
            if (op == ncclProd) acc = (U)(acc * (U)x[r]);                                                              \
            else acc = (U)(acc + (U)x[r]);                                                                             \
            if (op == ncclMax && x[r] > best) best = x[r];                                                             \
            if (op == ncclMin && x[r] < best) best = x[r];                                                             \
        }                                                                                                              \
        if (op == ncclMax || op == ncclMin) return best;                                                               \
        if (op == ncclAvg) return (T)((T)acc / (T)n);                                                                  \
        return (T)acc;                                                                                                 \
    }
INT_EXPECT(int8_t, uint8_t)
INT_EXPECT(uint8_t, uint8_t)
INT_EXPECT(int32_t, uint32_t)
INT_EXPECT(uint32_t, uint32_t)
INT_EXPECT(int64_t, uint64_t)
INT_EXPECT(uint64_t, uint64_t)

/* Float reductions: rank order; ncclAvg is NCCL's PreMulSum: x0*s + x1*s + ... with
 * s = float(1.0/n) (double: 1.0/n), each product and sum rounded on its own. */
#define FLOAT_EXPECT(T, FMAX, FMIN)                                                                                    \
    static T exp_##T(ncclRedOp_t op, int n, const T *x) {                                                              \
        const T s = (T)(1.0 / n);                                                                                      \
        volatile T acc = op == ncclAvg ? x[0] * s : x[0];                                                              \
        for (int r = 1; r < n; r++) {                                                                                  \
            volatile T pre = x[r] * s;                                                                                 \
            if (op == ncclSum) acc = acc + x[r];                                                                       \
            if (op == ncclProd) acc = acc * x[r];                                                                      \
            if (op == ncclMax) acc = FMAX(acc, x[r]);                                                                  \
            if (op == ncclMin) acc = FMIN(acc, x[r]);                                                                  \
            if (op == ncclAvg) acc = acc + pre;                                                                        \
        }                                                                                                              \
        return acc;                                                                                                    \
    }
FLOAT_EXPECT(float, fmaxf, fminf)
FLOAT_EXPECT(double, fmax, fmin)

/* the expected element i of an all-reduce over n ranks, into out[i] */
static void expect_elem(ncclDataType_t t, ncclRedOp_t op, int n, size_t i, void *out) {
    uint8_t xs[MAXR * 8];
    for (int r = 0; r < n; r++) put(t, xs, (size_t)r, ival(r, i), fval(r, i));
    switch (t) {
    case ncclInt8: ((int8_t *)out)[i] = exp_int8_t(op, n, (int8_t *)xs); break;
    case ncclUint8: ((uint8_t *)out)[i] = exp_uint8_t(op, n, (uint8_t *)xs); break;
    case ncclInt32: ((int32_t *)out)[i] = exp_int32_t(op, n, (int32_t *)xs); break;
    case ncclUint32: ((uint32_t *)out)[i] = exp_uint32_t(op, n, (uint32_t *)xs); break;
    case ncclInt64: ((int64_t *)out)[i] = exp_int64_t(op, n, (int64_t *)xs); break;
    case ncclUint64: ((uint64_t *)out)[i] = exp_uint64_t(op, n, (uint64_t *)xs); break;
    case ncclFloat32: ((float *)out)[i] = exp_float(op, n, (float *)xs); break;
    default: ((double *)out)[i] = exp_double(op, n, (double *)xs);
    }
}

/* ---- all-reduce: every type and operation --------------------------------------------- */

/* one all-reduce of `count` elements; result compared bit for bit, hash kept for the parent */
static int allreduce_case(int rank, int n, ncclComm_t comm, cudaStream_t s, ncclDataType_t t, ncclRedOp_t op,
                          size_t count, bool in_place, int hash_slot) {
    size_t nb = count * tsize(t);
    void *h = malloc(nb), *want = malloc(nb);
    void *d_in = NULL, *d_out = NULL;
    CHECK(h && want, "out of memory");
    fill(t, h, rank, count);
    CUDA_OK(cudaMalloc(&d_in, nb));
    CUDA_OK(cudaMalloc(&d_out, nb));
    CUDA_OK(cudaMemcpy(d_in, h, nb, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_out, 0xa5, nb));
    void *dst = in_place ? d_in : d_out;
    NCCL_OK(ncclAllReduce(d_in, dst, count, t, op, comm, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(h, dst, nb, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; i++) expect_elem(t, op, n, i, want);
    size_t es = tsize(t);
    for (size_t i = 0; i < count; i++)
        CHECK(memcmp((char *)h + i * es, (char *)want + i * es, es) == 0, "type %d op %d count %zu: element %zu differs",
              (int)t, (int)op, count, i);
    g_sh->hash[rank][hash_slot] = fnv(h, nb);
    if (t == ncclFloat32 && op == ncclAvg && n == 3) {
        /* NCCL's pre-multiplication is visible: some element differs from (x0+x1+x2)/3 */
        size_t differ = 0;
        for (size_t i = 0; i < count; i++) {
            float a = (float)fval(0, i), b = (float)fval(1, i), c = (float)fval(2, i);
            volatile float sum = a + b;
            sum = sum + c;
            if (((float *)h)[i] != sum / 3.0f) differ++;
        }
        CHECK(differ > 0, "ncclAvg over 3 float ranks equals sum/3 everywhere: not NCCL's pre-multiplied sum");
    }
    CUDA_OK(cudaFree(d_in));
    CUDA_OK(cudaFree(d_out));
    free(h);
    free(want);
    return 0;
}

static int rank_allreduce(int rank, int n) {
    ncclComm_t comm;
    cudaStream_t s;
    if (start(rank, n, rank, &comm, &s)) return 1;
    int c = 0;
    for (size_t ti = 0; ti < sizeof k_types / sizeof *k_types; ti++)
        for (size_t oi = 0; oi < sizeof k_ops / sizeof *k_ops; oi++)
            if (allreduce_case(rank, n, comm, s, k_types[ti], k_ops[oi], 1003, oi == 0, c++)) return 1;
    /* past the 1 MiB collective slot: several chunks */
    if (allreduce_case(rank, n, comm, s, ncclFloat32, ncclAvg, 600011, false, c++)) return 1;
    if (allreduce_case(rank, n, comm, s, ncclInt64, ncclSum, 300007, true, c++)) return 1;
    g_sh->ncase = c;
    NCCL_OK(ncclCommDestroy(comm));
    CHECK(rt_emu_nccl_live_comms() == 0, "a communicator is still alive");
    return 0;
}

static void check_hashes(int n) {
    for (int c = 0; c < g_sh->ncase; c++)
        for (int r = 1; r < n; r++)
            if (g_sh->hash[r][c] != g_sh->hash[0][c]) fail_msg("case %d: rank %d's result differs from rank 0's", c, r);
}

static void test_allreduce_2(void **state) {
    (void)state;
    expect_all_pass(2, rank_allreduce);
    assert_true(g_sh->ncase > 40);
    check_hashes(2);
}

static void test_allreduce_3(void **state) {
    (void)state;
    expect_all_pass(3, rank_allreduce);
    check_hashes(3);
}

/* ---- broadcast, reduce, all-gather, reduce-scatter ------------------------------------ */

static int rank_collectives(int rank, int n) {
    ncclComm_t comm;
    cudaStream_t s;
    if (start(rank, n, rank, &comm, &s)) return 1;
    const size_t count = 300007; /* floats: past the 1 MiB slot */
    size_t nb = count * sizeof(float);
    float *h = malloc(nb * n), *g = malloc(nb * n);
    float *d_a, *d_b;
    CHECK(h && g, "out of memory");
    CUDA_OK(cudaMalloc((void **)&d_a, nb * n));
    CUDA_OK(cudaMalloc((void **)&d_b, nb * n));

    /* broadcast from the last rank, then in place (ncclBcast) from rank 0 */
    int root = n - 1;
    fill(ncclFloat32, h, rank, count);
    CUDA_OK(cudaMemcpy(d_a, h, nb, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_b, 0, nb));
    NCCL_OK(ncclBroadcast(d_a, d_b, count, ncclFloat32, root, comm, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(g, d_b, nb, cudaMemcpyDeviceToHost));
    fill(ncclFloat32, h, root, count);
    CHECK(memcmp(g, h, nb) == 0, "broadcast from %d", root);
    NCCL_OK(ncclBcast(d_a, count, ncclFloat32, 0, comm, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(g, d_a, nb, cudaMemcpyDeviceToHost));
    fill(ncclFloat32, h, 0, count);
    CHECK(memcmp(g, h, nb) == 0, "ncclBcast in place from 0");

    /* reduce (sum) to rank 1: only the root's buffer is written */
    fill(ncclFloat32, h, rank, count);
    CUDA_OK(cudaMemcpy(d_a, h, nb, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_b, 0, nb));
    NCCL_OK(ncclReduce(d_a, d_b, count, ncclFloat32, ncclSum, 1, comm, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(g, d_b, nb, cudaMemcpyDeviceToHost));
    memset(h, 0, nb);
    if (rank == 1)
        for (size_t i = 0; i < count; i++) expect_elem(ncclFloat32, ncclSum, n, i, h);
    CHECK(memcmp(g, h, nb) == 0, "reduce to rank 1 (rank %d's buffer)", rank);

    /* all-gather: rank r's block at r * count */
    fill(ncclFloat32, h, rank, count);
    CUDA_OK(cudaMemcpy(d_a, h, nb, cudaMemcpyHostToDevice));
    NCCL_OK(ncclAllGather(d_a, d_b, count, ncclFloat32, comm, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(g, d_b, nb * n, cudaMemcpyDeviceToHost));
    for (int r = 0; r < n; r++) {
        fill(ncclFloat32, h, r, count);
        CHECK(memcmp(g + (size_t)r * count, h, nb) == 0, "all-gather block %d", r);
    }

    /* reduce-scatter (avg of int32, then sum of floats): rank r gets block r's reduction */
    const size_t rc = 100003;
    int32_t *hi = malloc(rc * n * sizeof(int32_t)), *gi = malloc(rc * sizeof(int32_t));
    CHECK(hi && gi, "out of memory");
    fill(ncclInt32, hi, rank, rc * n);
    CUDA_OK(cudaMemcpy(d_a, hi, rc * n * sizeof(int32_t), cudaMemcpyHostToDevice));
    NCCL_OK(ncclReduceScatter(d_a, d_b, rc, ncclInt32, ncclAvg, comm, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(gi, d_b, rc * sizeof(int32_t), cudaMemcpyDeviceToHost));
    int32_t *want = malloc(rc * n * sizeof(int32_t));
    CHECK(want, "out of memory");
    for (size_t i = rank * rc; i < (rank + 1) * rc; i++) expect_elem(ncclInt32, ncclAvg, n, i, want);
    CHECK(memcmp(gi, want + rank * rc, rc * sizeof(int32_t)) == 0, "reduce-scatter avg int32");
    free(hi), free(gi), free(want);

    CUDA_OK(cudaFree(d_a));
    CUDA_OK(cudaFree(d_b));
    free(h), free(g);
    NCCL_OK(ncclCommDestroy(comm));
    return 0;
}

static void test_collectives_2(void **state) {
    (void)state;
    expect_all_pass(2, rank_collectives);
}
static void test_collectives_3(void **state) {
    (void)state;
    expect_all_pass(3, rank_collectives);
}

/* ---- send/recv in groups ------------------------------------------------------------- */

/* one ring exchange in a group: send to rank+1, receive from rank-1 (plus a send to
 * oneself); `send_first` picks the order of the calls inside the group */
static int ring_exchange(int rank, int n, ncclComm_t comm, cudaStream_t s, size_t count, bool send_first, int tag) {
    size_t nb = count * sizeof(int64_t);
    int64_t *h = malloc(nb), *g = malloc(nb);
    void *d_s, *d_r, *d_self;
    CHECK(h && g, "out of memory");
    for (size_t i = 0; i < count; i++) h[i] = (int64_t)rank * 1000003 + (int64_t)i * 7 + tag;
    CUDA_OK(cudaMalloc(&d_s, nb));
    CUDA_OK(cudaMalloc(&d_r, nb));
    CUDA_OK(cudaMalloc(&d_self, nb));
    CUDA_OK(cudaMemcpy(d_s, h, nb, cudaMemcpyHostToDevice));
    int to = (rank + 1) % n, from = (rank + n - 1) % n;
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclGroupStart()); /* nested: only the outer end launches */
    if (send_first) NCCL_OK(ncclSend(d_s, count, ncclInt64, to, comm, s));
    NCCL_OK(ncclRecv(d_r, count, ncclInt64, from, comm, s));
    NCCL_OK(ncclGroupEnd());
    CHECK(rt_emu_nccl_group_depth() == 1, "depth %d inside the outer group", rt_emu_nccl_group_depth());
    if (!send_first) NCCL_OK(ncclSend(d_s, count, ncclInt64, to, comm, s));
    NCCL_OK(ncclRecv(d_self, count, ncclInt64, rank, comm, s));
    NCCL_OK(ncclSend(d_s, count, ncclInt64, rank, comm, s));
    NCCL_OK(ncclGroupEnd());
    CHECK(rt_emu_nccl_group_depth() == 0, "depth %d after the group", rt_emu_nccl_group_depth());
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(g, d_r, nb, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; i++)
        CHECK(g[i] == (int64_t)from * 1000003 + (int64_t)i * 7 + tag, "recv from %d element %zu: %lld (count %zu, tag %d)",
              from, i, (long long)g[i], count, tag);
    CUDA_OK(cudaMemcpy(g, d_self, nb, cudaMemcpyDeviceToHost));
    CHECK(memcmp(g, h, nb) == 0, "send to oneself");
    CUDA_OK(cudaFree(d_s));
    CUDA_OK(cudaFree(d_r));
    CUDA_OK(cudaFree(d_self));
    free(h), free(g);
    return 0;
}

static int rank_p2p(int rank, int n) {
    ncclComm_t comm;
    cudaStream_t s;
    if (start(rank, n, rank, &comm, &s)) return 1;
    /* every rank sends first; every rank receives first; mixed (even ranks send first);
     * small and larger than the 256 KiB ring */
    for (int k = 0; k < 3; k++)
        for (size_t count = 5; count < 200000; count *= 211) {
            bool send_first = k == 0 ? true : k == 1 ? false : rank % 2 == 0;
            if (ring_exchange(rank, n, comm, s, count, send_first, k)) return 1;
        }
    NCCL_OK(ncclCommDestroy(comm));
    return 0;
}

static void test_send_recv_2(void **state) {
    (void)state;
    expect_all_pass(2, rank_p2p);
}
static void test_send_recv_3(void **state) {
    (void)state;
    expect_all_pass(3, rank_p2p);
}

/* ---- the operation runs on its stream ------------------------------------------------ */

static void gate_wait(void *arg) {
    (void)arg;
    wait_flag(1);
}

static int rank_on_stream(int rank, int n) {
    ncclComm_t comm;
    cudaStream_t s, reader;
    if (start(rank, n, rank, &comm, &s)) return 1;
    CUDA_OK(cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking));
    int32_t *d, h[4] = {rank + 1, rank + 1, rank + 1, rank + 1}, g[4];
    CUDA_OK(cudaMalloc((void **)&d, sizeof h));
    CUDA_OK(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize()); /* the upload is done before the reader looks */
    if (rank == 0) CUDA_OK(cudaLaunchHostFunc(s, gate_wait, NULL)); /* rank 0's stream is held */
    NCCL_OK(ncclAllReduce(d, d, 4, ncclInt32, ncclSum, comm, s));
    if (rank == 0) { /* the call returned, the stream is held: nothing may have happened yet */
        CUDA_OK(cudaMemcpyAsync(g, d, sizeof g, cudaMemcpyDeviceToHost, reader));
        CUDA_OK(cudaStreamSynchronize(reader));
        CHECK(g[0] == 1 && g[3] == 1, "the all-reduce ran before its stream reached it (%d)", g[0]);
        CHECK(cudaStreamQuery(s) == cudaErrorNotReady, "the held stream is done");
        signal_flag(1);
    }
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(g, d, sizeof g, cudaMemcpyDeviceToHost));
    CHECK(g[0] == n * (n + 1) / 2 && g[3] == g[0], "all-reduce result %d", g[0]);
    NCCL_OK(ncclCommDestroy(comm));
    return 0;
}

static void test_runs_on_stream(void **state) {
    (void)state;
    expect_all_pass(2, rank_on_stream);
}

/* ---- stream capture: NCCL operations in a CUDA graph ------------------------------------ */

#define CAPN 300000 /* floats: more than one chunk of the emulation's slots (1 MiB) */

/* rank r's input at replay k, element i: small integers, so every sum is exact */
static float cap_val(int r, int k, size_t i) { return (float)((int)(i % 97) + 100 * r + 1000 * k); }

/* The graph of the capture tests, captured on `cap` in thread-local mode (as ringtrain
 * captures): an all-reduce of in into out, then a grouped exchange of in with the other
 * rank into peer. */
static int capture_graph(int rank, ncclComm_t comm, cudaStream_t cap, float *in, float *out, float *peer,
                         cudaGraphExec_t *exec) {
    CUDA_OK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeThreadLocal));
    NCCL_OK(ncclAllReduce(in, out, CAPN, ncclFloat32, ncclSum, comm, cap));
    if (peer) {
        NCCL_OK(ncclGroupStart());
        NCCL_OK(ncclSend(in, CAPN, ncclFloat32, 1 - rank, comm, cap));
        NCCL_OK(ncclRecv(peer, CAPN, ncclFloat32, 1 - rank, comm, cap));
        NCCL_OK(ncclGroupEnd());
    }
    cudaGraph_t graph = NULL;
    CUDA_OK(cudaStreamEndCapture(cap, &graph));
    CUDA_OK(cudaGraphInstantiate(exec, graph, 0));
    CUDA_OK(cudaGraphDestroy(graph));
    return 0;
}

/* Element checks of replay k: out is the sum of both ranks' inputs of replay k, peer the
 * other rank's input of replay k. */
static int check_replay(int rank, int k, const float *out, const float *peer) {
    for (size_t i = 0; i < CAPN; i++) {
        float want = cap_val(0, k, i) + cap_val(1, k, i);
        CHECK(out[i] == want, "replay %d: all-reduce element %zu is %g, expected %g", k, i, out[i], want);
        CHECK(peer[i] == cap_val(1 - rank, k, i), "replay %d: received element %zu is %g, expected %g", k, i, peer[i],
              cap_val(1 - rank, k, i));
    }
    return 0;
}

/* Captured once, replayed 3 times with new inputs each time (a value read at capture would
 * repeat replay 0's sums), each replay followed by an uncaptured all-reduce on another
 * stream: the replay takes its place among the communicator's operations when the graph
 * is launched. Nothing runs at capture. The graph outlives the communicator. */
static int rank_capture_replay(int rank, int n) {
    ncclComm_t comm;
    cudaStream_t s, cap;
    if (start(rank, n, rank, &comm, &s)) return 1;
    CUDA_OK(cudaStreamCreate(&cap)); /* blocking: after the uploads on the legacy stream */
    size_t nb = CAPN * sizeof(float);
    float *h = malloc(nb), *g = malloc(nb), *gp = malloc(nb), *in, *out, *peer;
    int32_t *x, hx = rank + 1, gx = 0;
    CHECK(h && g && gp, "out of memory");
    CUDA_OK(cudaMalloc((void **)&in, nb));
    CUDA_OK(cudaMalloc((void **)&out, nb));
    CUDA_OK(cudaMalloc((void **)&peer, nb));
    CUDA_OK(cudaMalloc((void **)&x, sizeof hx));
    CUDA_OK(cudaMemset(out, 0, nb));
    cudaGraphExec_t exec;
    if (capture_graph(rank, comm, cap, in, out, peer, &exec)) return 1;
    CUDA_OK(cudaMemcpy(g, out, sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(g[0] == 0.0f, "the captured all-reduce ran at capture (%g)", g[0]);
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < CAPN; i++) h[i] = cap_val(rank, k, i);
        CUDA_OK(cudaMemcpy(in, h, nb, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(x, &hx, sizeof hx, cudaMemcpyHostToDevice));
        CUDA_OK(cudaGraphLaunch(exec, cap));
        NCCL_OK(ncclAllReduce(x, x, 1, ncclInt32, ncclSum, comm, s));
        CUDA_OK(cudaStreamSynchronize(cap));
        CUDA_OK(cudaStreamSynchronize(s));
        CUDA_OK(cudaMemcpy(g, out, nb, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(gp, peer, nb, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(&gx, x, sizeof gx, cudaMemcpyDeviceToHost));
        if (check_replay(rank, k, g, gp)) return 1;
        CHECK(gx == n * (n + 1) / 2, "the uncaptured all-reduce after replay %d: %d", k, gx);
    }
    NCCL_OK(ncclCommDestroy(comm));
    CUDA_OK(cudaGraphExecDestroy(exec));
    CHECK(rt_emu_nccl_live_comms() == 0, "a communicator is still alive");
    free(h), free(g), free(gp);
    return 0;
}

static void test_capture_replay(void **state) {
    (void)state;
    expect_all_pass(2, rank_capture_replay);
}

/* Rank 1 dies (RINGTRAIN_EMU_NCCL_KILL) as its second replay's all-reduce starts. Rank 0
 * sees ncclRemoteError and its stream completes, as for an uncaptured operation; a replay
 * launched after that does nothing and the error stays; an uncaptured call returns it. */
static int rank_capture_dead_peer(int rank, int n) {
    if (rank == 1) setenv("RINGTRAIN_EMU_NCCL_KILL", "ncclAllReduce:2", 1);
    ncclComm_t comm;
    cudaStream_t s, cap;
    if (start(rank, n, rank, &comm, &s)) return 1;
    CUDA_OK(cudaStreamCreate(&cap)); /* blocking: after the uploads on the legacy stream */
    float *in, *out, g = 0;
    CUDA_OK(cudaMalloc((void **)&in, CAPN * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&out, CAPN * sizeof(float)));
    CUDA_OK(cudaMemset(in, 0, CAPN * sizeof(float)));
    cudaGraphExec_t exec;
    if (capture_graph(rank, comm, cap, in, out, NULL, &exec)) return 1;
    CUDA_OK(cudaGraphLaunch(exec, cap));
    CUDA_OK(cudaStreamSynchronize(cap));
    CUDA_OK(cudaGraphLaunch(exec, cap));
    if (rank == 1) {
        (void)cudaStreamSynchronize(cap);
        return 2; /* the kill did not happen */
    }
    ncclResult_t a = ncclSuccess;
    while (a == ncclSuccess || a == ncclInProgress) {
        NCCL_OK(ncclCommGetAsyncError(comm, &a));
        sched_yield();
    }
    CHECK(a == ncclRemoteError, "asynchronous error %d (%s) in a replay", (int)a, ncclGetErrorString(a));
    CUDA_OK(cudaStreamSynchronize(cap)); /* the replay ended: the stream goes on */
    CUDA_OK(cudaMemcpy(out, &g, sizeof g, cudaMemcpyHostToDevice));
    CUDA_OK(cudaGraphLaunch(exec, cap)); /* after the peer died */
    CUDA_OK(cudaStreamSynchronize(cap));
    NCCL_OK(ncclCommGetAsyncError(comm, &a));
    CHECK(a == ncclRemoteError, "asynchronous error %d after a replay on a broken communicator", (int)a);
    NCCL_IS(ncclAllReduce(in, in, 1, ncclFloat32, ncclSum, comm, s), ncclRemoteError);
    NCCL_OK(ncclCommAbort(comm));
    CUDA_OK(cudaGraphExecDestroy(exec));
    return 0;
}

static void test_capture_dead_peer(void **state) {
    (void)state;
    int codes[MAXR];
    run_ranks(2, rank_capture_dead_peer, codes);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 128 + SIGKILL);
}

/* ---- non-blocking communicators ------------------------------------------------------ */

static int poll_done(ncclComm_t comm, ncclResult_t *out) {
    ncclResult_t a = ncclInProgress;
    while (a == ncclInProgress) {
        ncclResult_t q = ncclCommGetAsyncError(comm, &a);
        if (q != ncclSuccess) return (int)q;
        sched_yield();
    }
    *out = a;
    return 0;
}

static int rank_nonblocking(int rank, int n) {
    CUDA_OK(cudaSetDevice(rank));
    if (rank == 1) wait_flag(0); /* joins only once rank 0 saw its init in progress */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t comm;
    NCCL_IS(ncclCommInitRankConfig(&comm, n, g_sh->id, rank, &cfg), ncclInProgress);
    ncclResult_t a = ncclSuccess;
    if (rank == 0) {
        NCCL_OK(ncclCommGetAsyncError(comm, &a));
        CHECK(a == ncclInProgress, "init of a communicator whose peer has not come is %d", (int)a);
        int cnt = 0;
        NCCL_IS(ncclCommCount(comm, &cnt), ncclInvalidArgument); /* used before it is ready */
        signal_flag(0);
    }
    CHECK(poll_done(comm, &a) == 0 && a == ncclSuccess, "init ended with %d", (int)a);
    int cnt = 0, me = -1, dev = -1;
    NCCL_OK(ncclCommCount(comm, &cnt));
    NCCL_OK(ncclCommUserRank(comm, &me));
    NCCL_OK(ncclCommCuDevice(comm, &dev));
    CHECK(cnt == n && me == rank && dev == rank, "count %d rank %d device %d", cnt, me, dev);
    cudaStream_t s;
    CUDA_OK(cudaStreamCreate(&s));
    double *d, h = rank + 0.25, g = 0;
    CUDA_OK(cudaMalloc((void **)&d, sizeof h));
    CUDA_OK(cudaMemcpy(d, &h, sizeof h, cudaMemcpyHostToDevice));
    NCCL_IS(ncclAllReduce(d, d, 1, ncclFloat64, ncclMax, comm, s), ncclInProgress);
    CHECK(poll_done(comm, &a) == 0 && a == ncclSuccess, "all-reduce ended with %d", (int)a);
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclAllReduce(d, d, 1, ncclFloat64, ncclSum, comm, s));
    NCCL_IS(ncclGroupEnd(), ncclInProgress);
    CHECK(poll_done(comm, &a) == 0 && a == ncclSuccess, "grouped all-reduce ended with %d", (int)a);
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(&g, d, sizeof g, cudaMemcpyDeviceToHost));
    CHECK(g == (n - 1 + 0.25) * n, "max then sum: %g", g);
    NCCL_IS(ncclCommFinalize(comm), ncclInProgress);
    CHECK(poll_done(comm, &a) == 0 && a == ncclSuccess, "finalize ended with %d", (int)a);
    NCCL_OK(ncclCommDestroy(comm));
    CHECK(rt_emu_nccl_live_comms() == 0, "a communicator is still alive");
    return 0;
}

static void test_nonblocking(void **state) {
    (void)state;
    expect_all_pass(2, rank_nonblocking);
}

/* ---- faults: a killed peer, an abort ------------------------------------------------- */

/* rank 2 dies (RINGTRAIN_EMU_NCCL_KILL) when its second all-reduce starts; the others
 * wait in it and must see ncclRemoteError, and their stream must complete */
static int rank_killed_peer(int rank, int n) {
    if (rank == n - 1) setenv("RINGTRAIN_EMU_NCCL_KILL", "ncclAllReduce:2", 1);
    ncclComm_t comm;
    cudaStream_t s;
    if (start(rank, n, rank, &comm, &s)) return 1;
    float *d;
    CUDA_OK(cudaMalloc((void **)&d, 4096 * sizeof(float)));
    CUDA_OK(cudaMemset(d, 0, 4096 * sizeof(float)));
    NCCL_OK(ncclAllReduce(d, d, 4096, ncclFloat32, ncclSum, comm, s));
    CUDA_OK(cudaStreamSynchronize(s));
    NCCL_OK(ncclAllReduce(d, d, 4096, ncclFloat32, ncclSum, comm, s));
    CHECK(rank != n - 1 || cudaStreamSynchronize(s) == cudaSuccess, "unreachable");
    if (rank == n - 1) return 2; /* the kill did not happen */
    ncclResult_t a = ncclSuccess;
    while (a == ncclSuccess || a == ncclInProgress) {
        NCCL_OK(ncclCommGetAsyncError(comm, &a));
        sched_yield();
    }
    CHECK(a == ncclRemoteError, "asynchronous error %d (%s)", (int)a, ncclGetErrorString(a));
    CUDA_OK(cudaStreamSynchronize(s)); /* the operation ended: the stream goes on */
    NCCL_OK(ncclCommAbort(comm));
    NCCL_IS(ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, comm, s), ncclInvalidArgument);
    CHECK(rt_emu_nccl_live_comms() == 0, "a communicator is still alive");
    return 0;
}

static void test_killed_peer(void **state) {
    (void)state;
    int codes[MAXR];
    run_ranks(3, rank_killed_peer, codes);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
    assert_int_equal(codes[2], 128 + SIGKILL);
}

/* rank 1 lives but never joins rank 0's all-reduce: rank 0's stream waits until rank 0
 * aborts; later calls fail */
static int rank_abort(int rank, int n) {
    ncclComm_t comm;
    cudaStream_t s;
    if (start(rank, n, rank, &comm, &s)) return 1;
    if (rank == 1) {
        wait_flag(2);
        NCCL_OK(ncclCommAbort(comm));
        return 0;
    }
    float *d;
    CUDA_OK(cudaMalloc((void **)&d, 64 * sizeof(float)));
    NCCL_OK(ncclAllReduce(d, d, 64, ncclFloat32, ncclSum, comm, s));
    /* the worker is inside the all-reduce, waiting for rank 1: nothing ends it but an abort */
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady, "an all-reduce without its peer completed");
    ncclResult_t a = ncclInternalError;
    NCCL_OK(ncclCommGetAsyncError(comm, &a));
    CHECK(a == ncclSuccess, "asynchronous error %d while the peer lives", (int)a);
    NCCL_OK(ncclCommAbort(comm));
    CUDA_OK(cudaStreamSynchronize(s));
    NCCL_IS(ncclAllReduce(d, d, 64, ncclFloat32, ncclSum, comm, s), ncclInvalidArgument);
    NCCL_IS(ncclCommGetAsyncError(comm, &a), ncclInvalidArgument);
    signal_flag(2);
    return 0;
}

static void test_abort_unblocks(void **state) {
    (void)state;
    expect_all_pass(2, rank_abort);
}

/* ---- two ranks on one device --------------------------------------------------------- */

/* ranks 0 and 2 on device 0, rank 1 on device 1: NCCL refuses the pair sharing a GPU
 * (each of them sees the duplicate); rank 1 sees none and initialises */
static int rank_same_device(int rank, int n) {
    CUDA_OK(cudaSetDevice(rank % 2));
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRank(&comm, n, g_sh->id, rank);
    if (rank % 2 == 0) {
        CHECK(r == ncclInvalidUsage, "rank %d sharing device 0: init returned %d", rank, (int)r);
    } else {
        CHECK(r == ncclSuccess, "rank 1 alone on its device: init returned %d", (int)r);
        NCCL_OK(ncclCommAbort(comm));
    }
    return 0;
}

static void test_same_device(void **state) {
    (void)state;
    expect_all_pass(3, rank_same_device);
}

/* ---- fault injection inside a group -------------------------------------------------- */

static int rank_fail_injection(int rank, int n) {
    setenv("RINGTRAIN_EMU_NCCL_FAIL", "ncclSend:1,ncclAllReduce:1", 1);
    ncclComm_t comm;
    cudaStream_t s;
    if (start(rank, n, rank, &comm, &s)) return 1;
    int *d;
    CUDA_OK(cudaMalloc((void **)&d, 2 * sizeof(int)));
    CUDA_OK(cudaMemset(d, 0, 2 * sizeof(int)));
    int peer = 1 - rank;
    NCCL_OK(ncclGroupStart());
    NCCL_IS(ncclSend(d, 1, ncclInt32, peer, comm, s), ncclUnhandledCudaError); /* the injected failure */
    CHECK(rt_emu_nccl_group_depth() == 1, "depth %d after a failure inside the group", rt_emu_nccl_group_depth());
    /* the group failed and is still open: an operation issued now is refused */
    NCCL_IS(ncclAllReduce(d, d, 1, ncclInt32, ncclSum, comm, s), ncclInvalidUsage);
    NCCL_IS(ncclGroupEnd(), ncclUnhandledCudaError); /* the group's error; its work dropped */
    CHECK(rt_emu_nccl_group_depth() == 0, "depth %d after ncclGroupEnd", rt_emu_nccl_group_depth());
    NCCL_IS(ncclGroupEnd(), ncclInvalidUsage); /* not in a group */
    /* the communicator still works: a second send is not injected */
    int h[2] = {rank + 10, 0};
    CUDA_OK(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice));
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(d, 1, ncclInt32, peer, comm, s));
    NCCL_OK(ncclRecv(d + 1, 1, ncclInt32, peer, comm, s));
    NCCL_OK(ncclGroupEnd());
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(h[1] == peer + 10, "received %d", h[1]);
    /* the first counted all-reduce fails (the one refused above never reached the injection) */
    NCCL_IS(ncclAllReduce(d, d, 1, ncclInt32, ncclSum, comm, s), ncclUnhandledCudaError);
    NCCL_OK(ncclCommDestroy(comm));
    return 0;
}

static void test_fail_injection(void **state) {
    (void)state;
    expect_all_pass(2, rank_fail_injection);
}

/* ---- the version and the error strings (no process needed) --------------------------- */

static void test_version(void **state) {
    (void)state;
    int v = 0;
    assert_int_equal(ncclGetVersion(&v), ncclSuccess);
    assert_int_equal(v, 22809);
    assert_int_equal(NCCL_VERSION_CODE, NCCL_VERSION(2, 28, 9));
    assert_int_equal(sizeof(ncclUniqueId), 128);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    assert_int_equal(cfg.blocking, NCCL_CONFIG_UNDEF_INT);
    assert_int_equal(cfg.size, sizeof(ncclConfig_t));
    assert_string_equal(ncclGetErrorString(ncclRemoteError), "remote process exited or there was a network error");
    assert_int_equal(rt_emu_nccl_group_depth(), 0);
}

int main(void) {
    setenv("RINGTRAIN_EMU_GPUS", "3", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),        cmocka_unit_test(test_allreduce_2),   cmocka_unit_test(test_allreduce_3),
        cmocka_unit_test(test_collectives_2),  cmocka_unit_test(test_collectives_3), cmocka_unit_test(test_send_recv_2),
        cmocka_unit_test(test_send_recv_3),    cmocka_unit_test(test_runs_on_stream), cmocka_unit_test(test_nonblocking),
        cmocka_unit_test(test_killed_peer),    cmocka_unit_test(test_abort_unblocks), cmocka_unit_test(test_same_device),
        cmocka_unit_test(test_fail_injection), cmocka_unit_test(test_capture_replay),
        cmocka_unit_test(test_capture_dead_peer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
