/* The collective benchmark behind `ringtrain bench comm`, in the style of nccl-tests,
 * as a library: it runs on a process group and hands back rows; printing, options and
 * launching the ranks belong to the command (src/cli/bench_comm.c).
 *
 * For each size (bytes of f32, doubling from min_size to max_size), each selected
 * collective and each selected algorithm: warm-up, then timed iterations; the time of an
 * operation is the mean over iterations of the slowest rank. algbw = size / time; busbw
 * = algbw x the collective's factor (all_reduce 2(n-1)/n, all_gather and reduce_scatter
 * (n-1)/n, broadcast and reduce 1), so results compare with the link's peak whatever the
 * number of ranks. After timing, one checked run counts wrong elements over all ranks
 * (inputs are small integers, so f32 sums are exact). all_gather and reduce_scatter run
 * ring only; broadcast and reduce run ring (a chain) and naive (flat).
 *
 * Collective: every rank of the group calls it with the same options; every rank gets
 * the same rows.
 */
#ifndef RT_DIST_COMM_BENCH_H
#define RT_DIST_COMM_BENCH_H

#include "dist/dist.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rt_comm_bench_coll {
    RT_BENCH_ALL_REDUCE = 0,
    RT_BENCH_BROADCAST,
    RT_BENCH_REDUCE,
    RT_BENCH_ALL_GATHER,
    RT_BENCH_REDUCE_SCATTER,
    RT_BENCH_COLL_COUNT_
} rt_comm_bench_coll;

/* "all_reduce", ... (the communicator's operation names). Parsing is case-insensitive;
 * an unknown name is RT_ERR_INVALID listing the accepted ones. */
const char *rt_comm_bench_coll_name(rt_comm_bench_coll c);
rt_status rt_comm_bench_coll_parse(const char *text, rt_comm_bench_coll *out);
/* The collectives' names, rt_comm_bench_coll_parse's table (core/names.h). */
extern const rt_names rt_comm_bench_coll_names;

/* The algorithms the benchmark runs over tcp/shm (ring, naive, rsag): bits of algo_mask. */
#define RT_COMM_BENCH_ALGOS ((int)RT_ALGO_NCCL) /* the enum's members before nccl */

typedef struct rt_comm_bench_options {
    size_t min_size, max_size; /* bytes; min_size below 8 counts as 8; default 8 .. 64 MiB */
    unsigned coll_mask;        /* bit c: collective c; default all_reduce */
    unsigned algo_mask;        /* bit a: rt_algo a < RT_COMM_BENCH_ALGOS; default all three */
    int iters;                 /* timed iterations; 0 (default): by size, 5..200 */
    int warmup;                /* untimed iterations first; default 2 */
} rt_comm_bench_options;

void rt_comm_bench_options_default(rt_comm_bench_options *o);

typedef struct rt_comm_bench_row {
    rt_comm_bench_coll coll;
    rt_algo algo;
    size_t size, count;           /* bytes and f32 elements actually moved */
    double time_us, algbw, busbw; /* GB/s */
    long long wrong;              /* wrong elements over all ranks */
} rt_comm_bench_row;

/* Called with every row as soon as it is measured (on every rank). */
typedef void (*rt_comm_bench_row_fn)(const rt_comm_bench_row *row, void *arg);

/* Run the benchmark. on_row (may be NULL) sees each row as it comes; with rows != NULL
 * *rows gets every row (malloc'd, free() it) and *nrows their number, also on failure
 * (the rows measured so far). */
rt_status rt_comm_bench_run(rt_pg *pg, const rt_comm_bench_options *o, rt_comm_bench_row_fn on_row, void *arg,
                            rt_comm_bench_row **rows, int *nrows);

#ifdef __cplusplus
}
#endif

#endif
