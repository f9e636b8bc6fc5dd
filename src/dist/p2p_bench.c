/* The copy benchmark (p2p_bench.h): names, the reading, and the CPU ranks' matrix over
 * the process group. The GPU half is dist/cuda/p2p_cuda.c. */
#include "dist/p2p_bench.h"

#include "dist/internal/p2p.h"

#include "core/timer.h"

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_link_names[RT_P2P_LINK_COUNT_] = {
    [RT_P2P_LINK_SELF] = "self",
    [RT_P2P_LINK_NVLINK] = "NVLink",
    [RT_P2P_LINK_PEER_ATOMIC] = "P2P+atomics",
    [RT_P2P_LINK_PCIE_SWITCH] = "PCIe switch",
    [RT_P2P_LINK_PEER] = "P2P PCIe",
    [RT_P2P_LINK_HOST_BRIDGE] = "host bridge",
    [RT_P2P_LINK_NUMA_NODE] = "NUMA node",
    [RT_P2P_LINK_SOCKETS] = "sockets",
    [RT_P2P_LINK_NO_PEER] = "no P2P",
    [RT_P2P_LINK_SHM] = "shm",
    [RT_P2P_LINK_TCP] = "tcp",
};

const char *rt_p2p_link_name(rt_p2p_link l) { return (unsigned)l < RT_P2P_LINK_COUNT_ ? k_link_names[l] : "?"; }

const char *rt_p2p_host_col_name(int c) {
    static const char *const k[RT_P2P_HOST_COLS] = {"H2D pinned", "D2H pinned", "H2D pageable", "D2H pageable"};
    return c >= 0 && c < RT_P2P_HOST_COLS ? k[c] : "?";
}

void rt_p2p_options_default(rt_p2p_options *o) {
    o->size = 32u << 20;
    o->iters = 5;
    o->warmup = 1;
}

#ifndef RT_HAVE_CUDA
rt_status rt_p2p_bench_gpu(const rt_p2p_options *o, rt_p2p_report **out) {
    (void)o;
    *out = NULL;
    return RT_ERROR(RT_ERR_NODEVICE, "bench p2p: this build has no CUDA backend (use --device cpu)");
}
#endif

/* ---- the reading ---- */

/* how a pair is connected, as the end of "a -> b goes ..." */
static void describe(const rt_p2p_report *r, int a, int b, char *buf, size_t n) {
    static const char *const k[RT_P2P_LINK_COUNT_] = {
        [RT_P2P_LINK_SELF] = "within one device",
        [RT_P2P_LINK_NVLINK] = "over NVLink",
        [RT_P2P_LINK_PEER_ATOMIC] = "peer-to-peer with native atomics (an NVLink)",
        [RT_P2P_LINK_PCIE_SWITCH] = "peer-to-peer below one PCIe switch",
        [RT_P2P_LINK_PEER] = "peer-to-peer over PCIe (no native atomics: no NVLink)",
        [RT_P2P_LINK_HOST_BRIDGE] = "through the CPU's host bridge",
        [RT_P2P_LINK_NUMA_NODE] = "across host bridges within one NUMA node",
        [RT_P2P_LINK_SOCKETS] = "across the sockets' interconnect",
        [RT_P2P_LINK_NO_PEER] = "without peer access (staged through host memory)",
        [RT_P2P_LINK_SHM] = "through shared memory",
        [RT_P2P_LINK_TCP] = "over TCP",
    };
    rt_p2p_link l = r->link[a][b];
    int len = snprintf(buf, n, "%s", (unsigned)l < RT_P2P_LINK_COUNT_ ? k[l] : "?");
    if (r->gpu && !r->access[a][b] && l != RT_P2P_LINK_NO_PEER && len >= 0 && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, " without peer access (staged through host memory)");
    if (r->numa[a] >= 0 && r->numa[b] >= 0 && r->numa[a] != r->numa[b] && len >= 0 && (size_t)len < n)
        snprintf(buf + len, n - (size_t)len, ", NUMA nodes %d and %d", r->numa[a], r->numa[b]);
}

static double at(const rt_p2p_matrix *m, int i, int j) { return m->v[i * m->cols + j]; }

/* the fastest and slowest measured pair of row `row` (-1: of the whole matrix) */
static void extremes(const rt_p2p_matrix *m, int row, int *fast, int *slow) {
    *fast = *slow = -1;
    for (int i = 0; i < m->rows; i++)
        for (int j = 0; j < m->cols; j++) {
            double v = at(m, i, j);
            if (i == j || (row >= 0 && i != row) || !isfinite(v)) continue;
            if (*fast < 0 || v > m->v[*fast]) *fast = i * m->cols + j;
            if (*slow < 0 || v < m->v[*slow]) *slow = i * m->cols + j;
        }
}

void rt_p2p_reading(const rt_p2p_report *r, char *buf, size_t n) {
    const char *who = r->gpu ? "GPU" : "rank";
    const rt_p2p_matrix *m = &r->mat[r->reading_mat];
    int fast, slow;
    extremes(m, -1, &fast, &slow);
    if (fast < 0) {
        snprintf(buf, n, "no %s pair was measured%s%s", who, *r->note ? ": " : "", r->note);
        return;
    }
    /* the slowest pair against the fastest of the same source, if that row differs */
    int row_fast, row_slow;
    extremes(m, slow / m->cols, &row_fast, &row_slow);
    if (m->v[row_fast] >= 1.25 * m->v[row_slow]) fast = row_fast;
    double ratio = m->v[fast] / m->v[slow];
    int fa = fast / m->cols, fb = fast % m->cols, sa = slow / m->cols, sb = slow % m->cols;
    char df[160], ds[160];
    describe(r, fa, fb, df, sizeof df);
    describe(r, sa, sb, ds, sizeof ds);
    if (r->link[fa][fb] == r->link[sa][sb] && r->numa[fa] == r->numa[sa] && r->numa[fb] == r->numa[sb]) {
        snprintf(buf, n,
                 "%s %d -> %d is %.1fx slower than %d -> %d, yet both go %s: the same path, so the "
                 "difference is not the topology (placement, load or noise: measure again)",
                 who, sa, sb, ratio, fa, fb, df);
        if (ratio >= 1.25) return;
    }
    if (ratio < 1.25) {
        snprintf(buf, n, "every %s pair within 25%% (%.3g to %.3g GB/s): %d -> %d goes %s, %d -> %d %s", who,
                 m->v[slow], m->v[fast], fa, fb, df, sa, sb, ds);
        return;
    }
    snprintf(buf, n, "%s %d -> %d is %.1fx slower than %d -> %d: %d -> %d goes %s, %d -> %d goes %s", who, sa, sb,
             ratio, fa, fb, fa, fb, df, sa, sb, ds);
}

/* ---- CPU ranks ---- */

/* the NUMA node of a CPU from sysfs (-1 unknown) */
static int cpu_numa_node(int cpu) {
    for (int node = 0; node < 64; node++) {
        char path[96];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/node%d", cpu, node);
        FILE *f = fopen(path, "r");
        if (f) {
            fclose(f);
            return node;
        }
    }
    return -1;
}

rt_p2p_matrix *rt_p2p_add_matrix(rt_p2p_report *r, const char *key, const char *title, bool latency, int rows,
                                 int cols) {
    rt_p2p_matrix *m = &r->mat[r->nmat++];
    snprintf(m->key, sizeof m->key, "%s", key);
    snprintf(m->title, sizeof m->title, "%s", title);
    m->latency = latency;
    m->rows = rows;
    m->cols = cols;
    for (int i = 0; i < RT_P2P_MAX * RT_P2P_MAX; i++) m->v[i] = NAN;
    return m;
}

typedef struct rank_bufs {
    char *send, *recv; /* size, and n * size (one slot per source) */
    size_t size;
} rank_bufs;

/* i sends `iters` messages of size bytes to j, j answers with one byte; the sender's
 * time per message (0 on other ranks) */
static rt_status one_way(rt_pg *pg, rank_bufs *B, int i, int j, int iters, double *us) {
    int me = rt_pg_rank(pg);
    char ack = 0;
    *us = 0;
    uint64_t t0 = rt_now_ns();
    for (int k = 0; k < iters; k++) {
        if (me == i) RT_CHECK(rt_send(pg, B->send, B->size, RT_U8, j));
        if (me == j) RT_CHECK(rt_recv(pg, B->recv, B->size, RT_U8, i));
    }
    if (me == j) RT_CHECK(rt_send(pg, &ack, 1, RT_U8, i));
    if (me == i) RT_CHECK(rt_recv(pg, &ack, 1, RT_U8, j));
    if (me == i) *us = (double)(rt_now_ns() - t0) / 1e3 / iters;
    return RT_OK;
}

/* i and j bounce 8 bytes `iters` times: half a round trip, on i (0 elsewhere) */
static rt_status ping_pong(rt_pg *pg, int i, int j, int iters, double *us) {
    int me = rt_pg_rank(pg);
    double x = 0;
    *us = 0;
    uint64_t t0 = rt_now_ns();
    for (int k = 0; k < iters; k++) {
        if (me == i) {
            RT_CHECK(rt_send(pg, &x, 1, RT_F64, j));
            RT_CHECK(rt_recv(pg, &x, 1, RT_F64, j));
        } else if (me == j) {
            RT_CHECK(rt_recv(pg, &x, 1, RT_F64, i));
            RT_CHECK(rt_send(pg, &x, 1, RT_F64, i));
        }
    }
    if (me == i) *us = (double)(rt_now_ns() - t0) / 1e3 / (2.0 * iters);
    return RT_OK;
}

/* every ordered pair at once: each rank sends to all and receives from all; the time
 * from the start until each source's message has arrived, summed over iters (row: source) */
static rt_status all_at_once(rt_pg *pg, rank_bufs *B, int iters, double *us_from) {
    int me = rt_pg_rank(pg), n = rt_pg_size(pg);
    rt_request *rq[RT_P2P_MAX], *sq[RT_P2P_MAX];
    for (int it = 0; it < iters; it++) {
        RT_CHECK(rt_barrier(pg));
        uint64_t t0 = rt_now_ns();
        for (int s = 0; s < n; s++) {
            rq[s] = sq[s] = NULL;
            if (s == me) continue;
            RT_CHECK(rt_irecv(pg, B->recv + (size_t)s * B->size, B->size, RT_U8, s, &rq[s]));
            RT_CHECK(rt_isend(pg, B->send, B->size, RT_U8, s, &sq[s]));
        }
        for (int left = n - 1; left > 0; sched_yield()) /* yield: more ranks than cores */
            for (int s = 0; s < n; s++) {
                bool done = false;
                if (!rq[s]) continue;
                RT_CHECK(rt_test(rq[s], &done));
                if (!done) continue;
                us_from[s] += (double)(rt_now_ns() - t0) / 1e3;
                rq[s] = NULL, left--;
            }
        for (int s = 0; s < n; s++)
            if (sq[s]) RT_CHECK(rt_wait(sq[s]));
    }
    return RT_OK;
}

/* the three matrices, each rank filling what it measured; summed onto every rank */
static rt_status measure_ranks(rt_pg *pg, const rt_p2p_options *o, rank_bufs *B, double *bw, double *cbw, double *lat) {
    int me = rt_pg_rank(pg), n = rt_pg_size(pg);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            if (i == j) continue;
            double us;
            RT_CHECK(rt_barrier(pg));
            if (o->warmup) RT_CHECK(one_way(pg, B, i, j, o->warmup, &us));
            RT_CHECK(one_way(pg, B, i, j, o->iters, &us));
            if (me == i) bw[i * n + j] = (double)B->size / (us * 1e-6) / 1e9;
            RT_CHECK(ping_pong(pg, i, j, o->iters < 20 ? 20 : o->iters, &us));
            if (me == i) lat[i * n + j] = us;
        }
    double from[RT_P2P_MAX] = {0};
    RT_CHECK(all_at_once(pg, B, o->iters, from));
    for (int s = 0; s < n; s++)
        if (s != me) cbw[s * n + me] = (double)B->size * o->iters / (from[s] * 1e-6) / 1e9;
    size_t nn = (size_t)n * (size_t)n;
    RT_CHECK(rt_all_reduce(pg, bw, nn, RT_F64, RT_OP_SUM));
    RT_CHECK(rt_all_reduce(pg, cbw, nn, RT_F64, RT_OP_SUM));
    return rt_all_reduce(pg, lat, nn, RT_F64, RT_OP_SUM);
}

/* each rank's CPU and NUMA node, gathered onto every rank */
static rt_status rank_places(rt_pg *pg, rt_p2p_report *r) {
    int n = rt_pg_size(pg), me = rt_pg_rank(pg);
    double place[2 * RT_P2P_MAX] = {0};
    int cpu = sched_getcpu();
    place[2 * me] = cpu + 1;
    place[2 * me + 1] = cpu >= 0 ? cpu_numa_node(cpu) + 1 : 0;
    RT_CHECK(rt_all_reduce(pg, place, (size_t)(2 * n), RT_F64, RT_OP_SUM));
    for (int i = 0; i < n; i++) {
        snprintf(r->bus_id[i], sizeof r->bus_id[i], "cpu %d", (int)place[2 * i] - 1);
        r->numa[i] = (int)place[2 * i + 1] - 1;
    }
    return RT_OK;
}

static void ranks_topology(rt_pg *pg, rt_p2p_report *r) {
    snprintf(r->transport, sizeof r->transport, "%s", rt_transport_name(rt_pg_transport(pg)));
    bool tcp = strcmp(r->transport, "tcp") == 0;
    for (int i = 0; i < r->n; i++)
        for (int j = 0; j < r->n; j++) {
            r->link[i][j] = i == j ? RT_P2P_LINK_SELF : tcp ? RT_P2P_LINK_TCP : RT_P2P_LINK_SHM;
            r->access[i][j] = 1;
        }
}

static void fill_rank_matrices(rt_p2p_report *r, const double *bw, const double *cbw, const double *lat) {
    int n = r->n;
    char t[96];
    snprintf(t, sizeof t, "rank -> rank bandwidth (GB/s) over %s, one pair at a time", r->transport);
    rt_p2p_matrix *m[3] = {rt_p2p_add_matrix(r, "rank_bw_serial", t, false, n, n), NULL, NULL};
    snprintf(t, sizeof t, "rank -> rank bandwidth (GB/s) over %s, all pairs at once", r->transport);
    m[1] = rt_p2p_add_matrix(r, "rank_bw_concurrent", t, false, n, n);
    snprintf(t, sizeof t, "rank -> rank latency (us, 8 bytes, half a round trip) over %s", r->transport);
    m[2] = rt_p2p_add_matrix(r, "rank_lat", t, true, n, n);
    const double *src[3] = {bw, cbw, lat};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++)
                if (i != j) m[k]->v[i * n + j] = src[k][i * n + j];
    r->reading_mat = 0;
}

rt_status rt_p2p_bench_ranks(rt_pg *pg, const rt_p2p_options *o, rt_p2p_report **out) {
    *out = NULL;
    int n = rt_pg_size(pg);
    RT_REQUIRE(n >= 1 && n <= RT_P2P_MAX, RT_ERR_INVALID, "bench p2p: %d ranks (at most %d)", n, RT_P2P_MAX);
    RT_REQUIRE(o->size >= 1 && o->iters >= 1 && o->warmup >= 0, RT_ERR_INVALID,
               "bench p2p: size %zu, iters %d, warmup %d", o->size, o->iters, o->warmup);
    rt_p2p_report *r = calloc(1, sizeof *r);
    rank_bufs B = {malloc(o->size), calloc((size_t)n, o->size), o->size};
    size_t nn = (size_t)n * (size_t)n;
    double *m = calloc(3 * nn, sizeof *m);
    rt_status s = r && B.send && B.recv && m ? RT_OK : RT_ERROR(RT_ERR_NOMEM, "bench p2p: out of memory");
    if (s == RT_OK) {
        memset(B.send, 0x5a, o->size);
        r->n = n, r->size = o->size, r->iters = o->iters;
        ranks_topology(pg, r);
        s = rank_places(pg, r);
    }
    if (s == RT_OK) s = measure_ranks(pg, o, &B, m, m + nn, m + 2 * nn);
    if (s == RT_OK) fill_rank_matrices(r, m, m + nn, m + 2 * nn);
    if (n == 1 && r) snprintf(r->note, sizeof r->note, "one rank: no pair to measure");
    free(B.send);
    free(B.recv);
    free(m);
    if (s == RT_OK && rt_pg_rank(pg) == 0)
        *out = r;
    else
        free(r);
    return s;
}
