/* The collective benchmark (see comm_bench.h). */
#include "dist/comm_bench.h"

#include "core/names.h"
#include "core/timer.h"
#include "dist/internal/names.h"

#include <stdlib.h>
#include <string.h>

/* the communicator's operation behind each benchmarked collective (its name, too) */
static const int k_kind[RT_BENCH_COLL_COUNT_] = {
    [RT_BENCH_ALL_REDUCE] = RT_K_ALLREDUCE,
    [RT_BENCH_BROADCAST] = RT_K_BCAST,
    [RT_BENCH_REDUCE] = RT_K_REDUCE,
    [RT_BENCH_ALL_GATHER] = RT_K_ALLGATHER,
    [RT_BENCH_REDUCE_SCATTER] = RT_K_REDUCE_SCATTER,
};

const char *rt_comm_bench_coll_name(rt_comm_bench_coll c) {
    return (unsigned)c < RT_BENCH_COLL_COUNT_ ? rt_comm_kind_name(k_kind[c]) : "?";
}

static const char *coll_name(int c) { return rt_comm_kind_name(k_kind[c]); }
const rt_names rt_comm_bench_coll_names = {"collective", RT_BENCH_COLL_COUNT_, NULL, coll_name, NULL};

rt_status rt_comm_bench_coll_parse(const char *text, rt_comm_bench_coll *out) {
    int i = 0;
    rt_status st = rt_names_parse(&rt_comm_bench_coll_names, text, &i); /* a complete message: no trace line */
    if (st == RT_OK) *out = (rt_comm_bench_coll)i;
    return st;
}

void rt_comm_bench_options_default(rt_comm_bench_options *o) {
    memset(o, 0, sizeof *o);
    o->min_size = 8;
    o->max_size = 64u << 20;
    o->coll_mask = 1u << RT_BENCH_ALL_REDUCE;
    o->algo_mask = (1u << RT_COMM_BENCH_ALGOS) - 1;
    o->warmup = 2;
}

static double busbw_factor(rt_comm_bench_coll c, int n) {
    switch (c) {
    case RT_BENCH_ALL_REDUCE:
        return 2.0 * (n - 1) / n;
    case RT_BENCH_ALL_GATHER:
    case RT_BENCH_REDUCE_SCATTER:
        return (double)(n - 1) / n;
    default:
        return 1.0;
    }
}

static float pat(size_t i) { return (float)((i % 7) + 1); }

typedef struct bufs {
    float *a, *b;
} bufs;

/* One operation of collective c with algorithm a over count elements. */
static rt_status run_op(rt_pg *pg, rt_comm_bench_coll c, rt_algo a, bufs *B, size_t count) {
    int n = rt_pg_size(pg);
    rt_pg_set_algo(pg, a);
    switch (c) {
    case RT_BENCH_ALL_REDUCE:
        return rt_all_reduce(pg, B->a, count, RT_F32, RT_OP_SUM);
    case RT_BENCH_BROADCAST:
        return rt_broadcast(pg, B->a, count, RT_F32, 0);
    case RT_BENCH_REDUCE:
        return rt_reduce(pg, B->a, count, RT_F32, RT_OP_SUM, 0);
    case RT_BENCH_ALL_GATHER:
        return rt_all_gather(pg, B->a, B->b, count / (size_t)n, RT_F32);
    case RT_BENCH_REDUCE_SCATTER:
        return rt_reduce_scatter(pg, B->a, B->b, count / (size_t)n, RT_F32, RT_OP_SUM);
    default:
        return RT_ERROR(RT_ERR_INVALID, "bench comm: collective %d", (int)c);
    }
}

static void fill(rt_pg *pg, bufs *B, size_t count) {
    int r = rt_pg_rank(pg);
    for (size_t i = 0; i < count; i++) B->a[i] = (float)(r + 1) * pat(i);
}

static long long count_wrong(rt_pg *pg, rt_comm_bench_coll c, bufs *B, size_t count) {
    int n = rt_pg_size(pg), r = rt_pg_rank(pg);
    float tri = (float)(n * (n + 1) / 2);
    long long wrong = 0;
    size_t per = count / (size_t)n;
    switch (c) {
    case RT_BENCH_ALL_REDUCE:
        for (size_t i = 0; i < count; i++) wrong += B->a[i] != pat(i) * tri;
        break;
    case RT_BENCH_BROADCAST:
        for (size_t i = 0; i < count; i++) wrong += B->a[i] != pat(i);
        break;
    case RT_BENCH_REDUCE:
        if (r == 0)
            for (size_t i = 0; i < count; i++) wrong += B->a[i] != pat(i) * tri;
        break;
    case RT_BENCH_ALL_GATHER:
        for (int k = 0; k < n; k++)
            for (size_t i = 0; i < per; i++) wrong += B->b[(size_t)k * per + i] != (float)(k + 1) * pat(i);
        break;
    case RT_BENCH_REDUCE_SCATTER:
        for (size_t i = 0; i < per; i++) wrong += B->b[i] != pat((size_t)r * per + i) * tri;
        break;
    default:
        break;
    }
    return wrong;
}

static rt_status bench_one(rt_pg *pg, const rt_comm_bench_options *o, rt_comm_bench_coll c, rt_algo a, size_t size,
                           bufs *B, rt_comm_bench_row *out) {
    int n = rt_pg_size(pg);
    size_t count = size / sizeof(float);
    if ((c == RT_BENCH_ALL_GATHER || c == RT_BENCH_REDUCE_SCATTER) && count % (size_t)n) count -= count % (size_t)n;
    int iters = o->iters;
    if (iters <= 0) {
        double it = (double)(64u << 20) / (double)(size ? size : 1);
        iters = it > 200 ? 200 : it < 5 ? 5 : (int)it;
    }
    fill(pg, B, count);
    for (int i = 0; i < o->warmup; i++) RT_CHECK(run_op(pg, c, a, B, count));
    RT_CHECK(rt_barrier(pg));
    uint64_t t0 = rt_now_ns();
    for (int i = 0; i < iters; i++) RT_CHECK(run_op(pg, c, a, B, count));
    double us = (double)(rt_now_ns() - t0) / 1e3 / iters;
    RT_CHECK(rt_all_reduce(pg, &us, 1, RT_F64, RT_OP_MAX));
    fill(pg, B, count);
    RT_CHECK(run_op(pg, c, a, B, count));
    long long wrong = count_wrong(pg, c, B, count);
    RT_CHECK(rt_all_reduce(pg, &wrong, 1, RT_I64, RT_OP_SUM));
    size_t bytes = count * sizeof(float);
    out->coll = c;
    out->algo = a;
    out->size = bytes;
    out->count = count;
    out->time_us = us;
    out->algbw = us > 0 ? (double)bytes / (us * 1e-6) / 1e9 : 0;
    out->busbw = out->algbw * busbw_factor(c, n);
    out->wrong = wrong;
    return RT_OK;
}

static rt_status bench_all(rt_pg *pg, const rt_comm_bench_options *o, size_t min_size, bufs *B,
                           rt_comm_bench_row_fn on_row, void *arg, rt_comm_bench_row **rows, int *nrows) {
    int cap = 0;
    for (size_t size = min_size; size <= o->max_size; size *= 2) {
        for (int c = 0; c < RT_BENCH_COLL_COUNT_; c++) {
            if (!(o->coll_mask & (1u << c))) continue;
            for (int a = 0; a < RT_COMM_BENCH_ALGOS; a++) {
                if (!(o->algo_mask & (1u << a))) continue;
                if ((c == RT_BENCH_ALL_GATHER || c == RT_BENCH_REDUCE_SCATTER) && a != RT_ALGO_RING) continue;
                if ((c == RT_BENCH_BROADCAST || c == RT_BENCH_REDUCE) && a == RT_ALGO_RSAG) continue;
                rt_comm_bench_row r;
                RT_CHECK(bench_one(pg, o, (rt_comm_bench_coll)c, (rt_algo)a, size, B, &r));
                if (rows) {
                    if (*nrows == cap) {
                        cap = cap ? 2 * cap : 64;
                        rt_comm_bench_row *more = realloc(*rows, (size_t)cap * sizeof *more);
                        RT_CHECK_ALLOC(more, (size_t)cap * sizeof *more);
                        *rows = more;
                    }
                    (*rows)[(*nrows)++] = r;
                }
                if (on_row) on_row(&r, arg);
            }
        }
    }
    return RT_OK;
}

rt_status rt_comm_bench_run(rt_pg *pg, const rt_comm_bench_options *o, rt_comm_bench_row_fn on_row, void *arg,
                            rt_comm_bench_row **rows, int *nrows) {
    if (rows) *rows = NULL;
    if (nrows) *nrows = 0;
    RT_REQUIRE(pg != NULL && o != NULL, RT_ERR_INVALID, "bench comm: NULL process group or options");
    RT_REQUIRE(!rows || nrows, RT_ERR_INVALID, "bench comm: rows without nrows");
    size_t min_size = o->min_size < 8 ? 8 : o->min_size;
    RT_REQUIRE(o->max_size <= (4ull << 30), RT_ERR_INVALID, "bench comm: max size %zu is above 4 GiB", o->max_size);
    RT_REQUIRE(min_size <= o->max_size, RT_ERR_INVALID, "bench comm: min size %zu is above max size %zu", min_size,
               o->max_size);
    RT_REQUIRE(o->coll_mask && o->coll_mask < (1u << RT_BENCH_COLL_COUNT_), RT_ERR_INVALID,
               "bench comm: collective mask 0x%x", o->coll_mask);
    RT_REQUIRE(o->algo_mask && o->algo_mask < (1u << RT_COMM_BENCH_ALGOS), RT_ERR_INVALID,
               "bench comm: algorithm mask 0x%x", o->algo_mask);
    RT_REQUIRE(o->iters >= 0 && o->warmup >= 0, RT_ERR_INVALID, "bench comm: iters %d, warmup %d", o->iters, o->warmup);
    rt_algo keep = rt_pg_algo(pg);
    size_t cap = o->max_size + 64;
    bufs B = {calloc(1, cap), calloc(1, cap)};
    rt_status s = B.a && B.b ? RT_OK : RT_ERROR(RT_ERR_NOMEM, "bench comm: out of memory (2 x %zu bytes)", cap);
    int dummy = 0;
    if (s == RT_OK) s = bench_all(pg, o, min_size, &B, on_row, arg, rows, nrows ? nrows : &dummy);
    free(B.a);
    free(B.b);
    rt_pg_set_algo(pg, keep);
    return s;
}
