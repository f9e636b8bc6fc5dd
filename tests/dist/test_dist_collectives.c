/* Collectives with real processes (label multiproc): world sizes 1-4 over tcp and shm,
 * every op, dtype and all_reduce algorithm, counts 0, 1, 7, world_size-1 and one
 * above 16 Mi elements. Each rank's input is a pure function of (rank, index), so
 * every rank computes the expected result locally (exact for integers, within a
 * rounding bound for floats). All-reduce results are hashed; the parent checks the
 * hashes are equal on all ranks (bitwise identical results). */
#include "../test_util.h"
#include "dist/dist.h"
#include "mp.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

typedef struct cfg {
    rt_transport transport;
    char dir[256];
    int large;
} cfg;

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Input of rank r at index i (as double; converted to the dtype). */
static double value(int r, size_t i, rt_dtype t, rt_reduce_op op, uint64_t salt) {
    uint64_t h = mix(salt * 1000003u + (uint64_t)r * 0x100000001b3ull + i);
    bool fl = t == RT_F32 || t == RT_F64;
    if (op == RT_OP_PRODUCT) return fl ? 0.5 + (double)(h >> 11) / 9007199254740992.0 : (double)((int)(h % 5) - 2);
    if (fl) return (double)(h >> 11) / 9007199254740992.0 * 2.0 - 1.0;
    return (double)((int64_t)(h % 2001) - 1000);
}

static void put(void *buf, size_t i, rt_dtype t, double v) {
    switch (t) {
    case RT_F32:
        ((float *)buf)[i] = (float)v;
        break;
    case RT_F64:
        ((double *)buf)[i] = v;
        break;
    case RT_I32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    case RT_I64:
        ((int64_t *)buf)[i] = (int64_t)v;
        break;
    default:
        break;
    }
}
static double get(const void *buf, size_t i, rt_dtype t) {
    switch (t) {
    case RT_F32:
        return ((const float *)buf)[i];
    case RT_F64:
        return ((const double *)buf)[i];
    case RT_I32:
        return ((const int32_t *)buf)[i];
    case RT_I64:
        return (double)((const int64_t *)buf)[i];
    default:
        return 0;
    }
}

/* Expected reduction at index i over ranks [0, n) and a tolerance. Integers: exact, in
 * int64 (values are small, so no overflow). */
static double expect(int n, size_t i, rt_dtype t, rt_reduce_op op, uint64_t salt, double *tol) {
    bool fl = t == RT_F32 || t == RT_F64;
    double eps = t == RT_F32 ? 1e-6 : 1e-14;
    int64_t iacc = 0;
    double acc = 0, mag = 0;
    for (int r = 0; r < n; r++) {
        double v = value(r, i, t, op, salt);
        if (t == RT_F32) v = (float)v;
        int64_t iv = (int64_t)v;
        if (r == 0) {
            acc = v;
            iacc = iv;
        } else {
            switch (op) {
            case RT_OP_SUM:
            case RT_OP_AVG:
                acc += v;
                iacc += iv;
                break;
            case RT_OP_PRODUCT:
                acc *= v;
                iacc *= iv;
                break;
            case RT_OP_MIN:
                acc = v < acc ? v : acc;
                iacc = iv < iacc ? iv : iacc;
                break;
            case RT_OP_MAX:
                acc = v > acc ? v : acc;
                iacc = iv > iacc ? iv : iacc;
                break;
            default:
                break;
            }
        }
        mag += fabs(v);
    }
    if (op == RT_OP_AVG) {
        acc /= n;
        iacc /= n;
    }
    if (!fl) {
        *tol = 0;
        return (double)iacc;
    }
    *tol = op == RT_OP_PRODUCT ? 8 * n * eps * fabs(acc) : 4 * n * eps * (mag + 1e-30);
    if (op == RT_OP_MIN || op == RT_OP_MAX) *tol = 0;
    return acc;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static const rt_dtype k_dtypes[] = {RT_F32, RT_F64, RT_I32, RT_I64};

static int check_reduced(const void *buf, size_t count, int n, rt_dtype t, rt_reduce_op op, uint64_t salt,
                         const char *what) {
    for (size_t i = 0; i < count; i++) {
        double tol, e = expect(n, i, t, op, salt, &tol), g = get(buf, i, t);
        MP_CHECK(fabs(g - e) <= tol, "%s %s %s count %zu: element %zu is %.17g, expected %.17g (tol %g)", what,
                 rt_reduce_op_name(op), rt_dtype_name(t), count, i, g, e, tol);
    }
    return 0;
}

static int body(int rank, int world, int port, void *arg) {
    cfg *c = arg;
    char method[MP_METHOD_LEN];
    rt_pg_options o;
    mp_pg_options(&o, method, rank, world, port, c->transport, 60);
    rt_pg *pg;
    MP_OK(rt_pg_init(&o, &pg));
    MP_CHECK(rt_pg_rank(pg) == rank && rt_pg_size(pg) == world, "rank/size");
    if (world > 1) MP_CHECK(rt_pg_transport(pg) == c->transport, "transport %d", rt_pg_transport(pg));
    uint64_t hash = 0xcbf29ce484222325ull, salt = 1;
    size_t counts[5] = {0, 1, 7, (size_t)(world - 1), 1000};
    size_t maxn = 1000 * (size_t)world;
    uint8_t *buf = calloc(maxn, 8), *buf2 = calloc(maxn, 8), *in = calloc(maxn, 8);
    MP_CHECK(buf && buf2 && in, "alloc");

    /* all_reduce: every algorithm x dtype x op x count */
    for (int a = 0; a < 3; a++)
        for (int d = 0; d < 4; d++)
            for (int op = 0; op < RT_OP_COUNT_; op++)
                for (int k = 0; k < 5; k++) {
                    rt_dtype t = k_dtypes[d];
                    size_t n = counts[k];
                    salt++;
                    for (size_t i = 0; i < n; i++) put(buf, i, t, value(rank, i, t, (rt_reduce_op)op, salt));
                    MP_OK(rt_all_reduce_algo(pg, buf, n, t, (rt_reduce_op)op, (rt_algo)a));
                    char what[64];
                    snprintf(what, sizeof what, "all_reduce/%s", rt_algo_name((rt_algo)a));
                    if (check_reduced(buf, n, world, t, (rt_reduce_op)op, salt, what)) return 1;
                    hash = fnv(hash, buf, n * rt_dtype_size(t));
                }

    /* asynchronous all_reduces, several in flight at once */
    {
        rt_request *req[3];
        int32_t *b[3];
        for (int q = 0; q < 3; q++) {
            b[q] = calloc(777, sizeof(int32_t));
            for (int i = 0; i < 777; i++) b[q][i] = rank * 10 + q + i;
            MP_OK(rt_iall_reduce(pg, b[q], 777, RT_I32, RT_OP_SUM, &req[q]));
        }
        for (int q = 2; q >= 0; q--) MP_OK(rt_wait(req[q]));
        for (int q = 0; q < 3; q++) {
            for (int i = 0; i < 777; i++) {
                int32_t e = 0;
                for (int r = 0; r < world; r++) e += r * 10 + q + i;
                MP_CHECK(b[q][i] == e, "iall_reduce %d: [%d] = %d, expected %d", q, i, b[q][i], e);
            }
            free(b[q]);
        }
    }

    /* async and blocking interleaved: the blocking call queues behind the async one on
     * every stream (the progress thread and the caller share the work) */
    {
        int64_t *a = calloc(100000, sizeof *a), *b = calloc(5000, sizeof *b);
        MP_CHECK(a && b, "alloc");
        for (int i = 0; i < 100000; i++) a[i] = rank + i;
        for (int i = 0; i < 5000; i++) b[i] = rank * 3 - i;
        rt_request *ra, *rb;
        MP_OK(rt_iall_reduce(pg, a, 100000, RT_I64, RT_OP_MAX, &ra));
        MP_OK(rt_ibroadcast(pg, b, 5000, RT_I64, world - 1, &rb));
        int64_t c1 = rank;
        MP_OK(rt_all_reduce(pg, &c1, 1, RT_I64, RT_OP_SUM));
        MP_CHECK(c1 == (int64_t)world * (world - 1) / 2, "blocking all_reduce between async ones: %lld", (long long)c1);
        bool done = false;
        while (!done) MP_OK(rt_test(rb, &done));
        MP_OK(rt_wait(rb));
        MP_OK(rt_wait(ra));
        for (int i = 0; i < 100000; i++) MP_CHECK(a[i] == world - 1 + i, "iall_reduce max [%d]", i);
        for (int i = 0; i < 5000; i++) MP_CHECK(b[i] == (world - 1) * 3 - i, "ibroadcast [%d]", i);
        free(a);
        free(b);
    }

    /* broadcast / reduce from every root, ring (chain) and naive (flat) */
    for (int a = 0; a < 2; a++) {
        rt_pg_set_algo(pg, a == 0 ? RT_ALGO_RING : RT_ALGO_NAIVE);
        for (int root = 0; root < world; root++)
            for (int d = 0; d < 4; d++)
                for (int k = 0; k < 5; k++) {
                    rt_dtype t = k_dtypes[d];
                    size_t n = counts[k];
                    salt++;
                    for (size_t i = 0; i < n; i++) put(buf, i, t, value(rank, i, t, RT_OP_SUM, salt));
                    MP_OK(rt_broadcast(pg, buf, n, t, root));
                    for (size_t i = 0; i < n; i++) {
                        double e = t == RT_F32 ? (float)value(root, i, t, RT_OP_SUM, salt)
                                               : value(root, i, t, RT_OP_SUM, salt);
                        MP_CHECK(get(buf, i, t) == e, "broadcast root %d %s [%zu]", root, rt_dtype_name(t), i);
                    }
                    rt_reduce_op op = (rt_reduce_op)(salt % RT_OP_COUNT_);
                    for (size_t i = 0; i < n; i++) put(buf, i, t, value(rank, i, t, op, salt));
                    memcpy(in, buf, n * rt_dtype_size(t));
                    MP_OK(rt_reduce(pg, buf, n, t, op, root));
                    if (rank == root) {
                        if (check_reduced(buf, n, world, t, op, salt, "reduce")) return 1;
                    } else {
                        MP_CHECK(memcmp(in, buf, n * rt_dtype_size(t)) == 0, "reduce changed a non-root buffer");
                    }
                }
    }
    rt_pg_set_algo(pg, RT_ALGO_RING);

    /* scatter, gather, all_gather (both forms), reduce_scatter */
    for (int d = 0; d < 4; d++)
        for (int k = 0; k < 5; k++) {
            rt_dtype t = k_dtypes[d];
            size_t n = counts[k], es = rt_dtype_size(t);
            int root = (int)(salt % (uint64_t)world);
            salt++;
            /* element (r, i) of the "global" array: value(r, i) */
            for (size_t j = 0; j < n * (size_t)world; j++) put(in, j, t, value(rank, j, t, RT_OP_SUM, salt));
            memset(buf, 0xee, n * es);
            MP_OK(rt_scatter(pg, rank == root ? in : NULL, buf, n, t, root));
            for (size_t i = 0; i < n; i++) {
                double e = value(root, (size_t)rank * n + i, t, RT_OP_SUM, salt);
                if (t == RT_F32) e = (float)e;
                MP_CHECK(get(buf, i, t) == e, "scatter root %d %s [%zu]", root, rt_dtype_name(t), i);
            }
            for (size_t i = 0; i < n; i++) put(buf, i, t, value(rank, i, t, RT_OP_MAX, salt));
            memset(buf2, 0xee, n * es * (size_t)world);
            MP_OK(rt_gather(pg, buf, rank == root ? buf2 : NULL, n, t, root));
            if (rank == root)
                for (int r = 0; r < world; r++)
                    for (size_t i = 0; i < n; i++) {
                        double e = value(r, i, t, RT_OP_MAX, salt);
                        if (t == RT_F32) e = (float)e;
                        MP_CHECK(get(buf2, (size_t)r * n + i, t) == e, "gather %s [%d][%zu]", rt_dtype_name(t), r, i);
                    }
            memset(buf2, 0xee, n * es * (size_t)world);
            MP_OK(rt_all_gather(pg, buf, buf2, n, t));
            for (int r = 0; r < world; r++)
                for (size_t i = 0; i < n; i++) {
                    double e = value(r, i, t, RT_OP_MAX, salt);
                    if (t == RT_F32) e = (float)e;
                    MP_CHECK(get(buf2, (size_t)r * n + i, t) == e, "all_gather %s [%d][%zu]", rt_dtype_name(t), r, i);
                }
            void *lst[4];
            for (int r = 0; r < world; r++) lst[r] = in + (size_t)r * n * es;
            MP_OK(rt_all_gather_list(pg, buf, lst, n, t));
            MP_CHECK(memcmp(in, buf2, n * es * (size_t)world) == 0, "all_gather list form differs");
            for (int op = 0; op < RT_OP_COUNT_; op++) {
                salt++;
                for (size_t j = 0; j < n * (size_t)world; j++) put(in, j, t, value(rank, j, t, (rt_reduce_op)op, salt));
                MP_OK(rt_reduce_scatter(pg, in, buf, n, t, (rt_reduce_op)op));
                for (size_t i = 0; i < n; i++) {
                    double tol, e = expect(world, (size_t)rank * n + i, t, (rt_reduce_op)op, salt, &tol);
                    MP_CHECK(fabs(get(buf, i, t) - e) <= tol, "reduce_scatter %s %s [%zu] = %g, expected %g",
                             rt_reduce_op_name((rt_reduce_op)op), rt_dtype_name(t), i, get(buf, i, t), e);
                }
            }
        }
    MP_OK(rt_barrier(pg));

    /* one buffer above 16 Mi elements (ring, the gradient path: f32 AVG; and i32 SUM exact) */
    if (c->large) {
        size_t big = (16u << 20) + 5;
        float *f = malloc(big * sizeof *f);
        MP_CHECK(f != NULL, "alloc");
        salt++;
        for (size_t i = 0; i < big; i++) f[i] = (float)value(rank, i, RT_F32, RT_OP_AVG, salt);
        MP_OK(rt_all_reduce(pg, f, big, RT_F32, RT_OP_AVG));
        for (size_t i = 0; i < big; i++) {
            double tol, e = expect(world, i, RT_F32, RT_OP_AVG, salt, &tol);
            MP_CHECK(fabs(f[i] - e) <= tol, "large all_reduce [%zu] = %g, expected %g", i, f[i], e);
            if (i > 4096 && i + 4096 < big) i += 997; /* sample the middle, check both ends fully */
        }
        hash = fnv(hash, f, big * sizeof *f);
        int32_t *q = (int32_t *)f;
        for (size_t i = 0; i < big; i++) q[i] = (int32_t)(rank + 1) * (int32_t)(i % 1000);
        MP_OK(rt_all_reduce(pg, q, big, RT_I32, RT_OP_SUM));
        for (size_t i = 0; i < big; i++)
            MP_CHECK(q[i] == (int32_t)(world * (world + 1) / 2) * (int32_t)(i % 1000), "large i32 [%zu] = %d", i, q[i]);
        free(f);
    }

    char path[300];
    snprintf(path, sizeof path, "%s/hash.%d", c->dir, rank);
    FILE *fh = fopen(path, "w");
    MP_CHECK(fh != NULL, "open %s", path);
    fprintf(fh, "%016llx\n", (unsigned long long)hash);
    fclose(fh);
    free(buf);
    free(buf2);
    free(in);
    rt_pg_destroy(pg);
    return 0;
}

static void run(rt_transport t, int world, int large) {
    cfg c = {.transport = t, .large = large};
    snprintf(c.dir, sizeof c.dir, "/tmp/rt-dist-test-XXXXXX");
    assert_non_null(mkdtemp(c.dir));
    int codes[4];
    int failed = mp_run(world, body, &c, 120, codes);
    for (int r = 0; r < world; r++)
        if (codes[r] != 0) print_error("rank %d exited with %d\n", r, codes[r]);
    assert_int_equal(failed, 0);
    char first[64] = "";
    for (int r = 0; r < world; r++) {
        char path[300], line[64] = "";
        snprintf(path, sizeof path, "%s/hash.%d", c.dir, r);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        assert_non_null(fgets(line, sizeof line, f));
        fclose(f);
        unlink(path);
        if (r == 0)
            strcpy(first, line);
        else if (strcmp(first, line) != 0)
            fail_msg("all_reduce results differ between rank 0 (%s) and rank %d (%s)", first, r, line);
    }
    rmdir(c.dir);
}

static void tcp_w1(void **s) {
    (void)s;
    run(RT_TRANSPORT_TCP, 1, 0);
}
static void tcp_w2(void **s) {
    (void)s;
    run(RT_TRANSPORT_TCP, 2, 1);
}
static void tcp_w3(void **s) {
    (void)s;
    run(RT_TRANSPORT_TCP, 3, 0);
}
static void tcp_w4(void **s) {
    (void)s;
    run(RT_TRANSPORT_TCP, 4, 0);
}
static void shm_w2(void **s) {
    (void)s;
    run(RT_TRANSPORT_SHM, 2, 0);
}
static void shm_w3(void **s) {
    (void)s;
    run(RT_TRANSPORT_SHM, 3, 1);
}
static void shm_w4(void **s) {
    (void)s;
    run(RT_TRANSPORT_SHM, 4, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tcp_w1), cmocka_unit_test(tcp_w2), cmocka_unit_test(tcp_w3), cmocka_unit_test(tcp_w4),
        cmocka_unit_test(shm_w2), cmocka_unit_test(shm_w3), cmocka_unit_test(shm_w4),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
