/* The GPU half of the copy benchmark (dist/p2p_bench.h), in the manner of CUDA's
 * p2pBandwidthLatencyTest: cudaMemcpyPeerAsync between every ordered pair of devices with
 * peer access off, then on (cudaDeviceEnablePeerAccess where cudaDeviceCanAccessPeer
 * says so), and cudaMemcpyAsync between each device and pinned / pageable host memory;
 * each entry timed with events on the copying stream, one copy at a time, then every
 * copy of a matrix at once on streams of their own. The topology: the runtime's peer
 * attributes and PCI bus ids, the NUMA node from sysfs, and NVML (libnvidia-ml.so.1,
 * opened with dlopen where present, never linked) for NVLink and the PCIe path. */
#include "dist/internal/p2p.h"

#include "core/cuda/cuda_check.h"
#include "core/device.h"

#include <ctype.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PEER, H2D, D2H };

/* one copy of a matrix entry: run on stream slot `slot` of device `dev` */
typedef struct spec {
    int dev, slot, kind;
    void *dst;
    int ddev;
    const void *src;
    int sdev;
    size_t n;
} spec;

typedef struct gpu {
    cudaStream_t s[RT_P2P_MAX]; /* slot j: copies to GPU j; slot self: host copies */
    cudaEvent_t a[RT_P2P_MAX], b[RT_P2P_MAX];
    char *src, *dst;      /* size, and RT_P2P_MAX slots of size (one per source) */
    char *pinned, *paged; /* 2 x size each: a source half and a destination half */
} gpu;

typedef struct ctx {
    int n;
    size_t size;
    gpu g[RT_P2P_MAX];
} ctx;

static rt_status issue(const spec *c, cudaStream_t s) {
    if (c->kind == PEER)
        RT_CHECK_CUDA(cudaMemcpyPeerAsync(c->dst, c->ddev, c->src, c->sdev, c->n, s));
    else
        RT_CHECK_CUDA(
            cudaMemcpyAsync(c->dst, c->src, c->n, c->kind == H2D ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s));
    return RT_OK;
}

/* enqueue warm-up copies, then the timed ones between events a and b of the spec's slot */
static rt_status enqueue(ctx *x, const spec *c, int warmup, int iters) {
    gpu *g = &x->g[c->dev];
    RT_CHECK_CUDA(cudaSetDevice(c->dev));
    for (int k = 0; k < warmup; k++) RT_CHECK(issue(c, g->s[c->slot]));
    RT_CHECK_CUDA(cudaEventRecord(g->a[c->slot], g->s[c->slot]));
    for (int k = 0; k < iters; k++) RT_CHECK(issue(c, g->s[c->slot]));
    RT_CHECK_CUDA(cudaEventRecord(g->b[c->slot], g->s[c->slot]));
    return RT_OK;
}

static rt_status elapsed_ms(ctx *x, const spec *c, int iters, double *ms) {
    gpu *g = &x->g[c->dev];
    float t = 0;
    RT_CHECK_CUDA(cudaEventSynchronize(g->b[c->slot]));
    RT_CHECK_CUDA(cudaEventElapsedTime(&t, g->a[c->slot], g->b[c->slot]));
    *ms = (double)t / iters;
    return RT_OK;
}

/* the ms per copy of each spec: one at a time, or all enqueued before any is waited for */
static rt_status run(ctx *x, const spec *c, int nc, int warmup, int iters, bool together, double *ms) {
    for (int k = 0; k < nc; k++) {
        RT_CHECK(enqueue(x, &c[k], together ? 0 : warmup, iters));
        if (!together) RT_CHECK(elapsed_ms(x, &c[k], iters, &ms[k]));
    }
    for (int k = 0; together && k < nc; k++) RT_CHECK(elapsed_ms(x, &c[k], iters, &ms[k]));
    return RT_OK;
}

/* every ordered pair of GPUs, n bytes each */
static int pair_specs(ctx *x, size_t n, spec *c) {
    int k = 0;
    for (int i = 0; i < x->n; i++)
        for (int j = 0; j < x->n; j++)
            if (i != j) c[k++] = (spec){i, j, PEER, x->g[j].dst + (size_t)i * x->size, j, x->g[i].src, i, n};
    return k;
}

/* each GPU with host memory in mode col (rt_p2p_host_col) */
static int host_specs(ctx *x, int col, size_t n, spec *c) {
    for (int d = 0; d < x->n; d++) {
        gpu *g = &x->g[d];
        char *host = col == RT_P2P_H2D_PINNED || col == RT_P2P_D2H_PINNED ? g->pinned : g->paged;
        bool h2d = col == RT_P2P_H2D_PINNED || col == RT_P2P_H2D_PAGEABLE;
        c[d] = h2d ? (spec){d, d, H2D, g->src, d, host, -1, n} : (spec){d, d, D2H, host + x->size, -1, g->src, d, n};
    }
    return x->n;
}

/* ms per copy into matrix m: GB/s of `bytes`, or microseconds (latency) */
static void store(rt_p2p_matrix *m, const spec *c, int nc, const double *ms, size_t bytes, int col) {
    for (int k = 0; k < nc; k++) {
        int row = c[k].dev, cl = col >= 0 ? col : c[k].slot;
        m->v[row * m->cols + cl] = m->latency ? ms[k] * 1e3 : (double)bytes / (ms[k] * 1e-3) / 1e9;
    }
}

static rt_status gpu_pairs(ctx *x, const rt_p2p_options *o, rt_p2p_matrix *bw, rt_p2p_matrix *cbw, rt_p2p_matrix *lat) {
    static spec c[RT_P2P_MAX * RT_P2P_MAX];
    static double ms[RT_P2P_MAX * RT_P2P_MAX];
    int nc = pair_specs(x, o->size, c);
    RT_CHECK(run(x, c, nc, o->warmup, o->iters, false, ms));
    store(bw, c, nc, ms, o->size, -1);
    RT_CHECK(run(x, c, nc, 0, o->iters, true, ms));
    store(cbw, c, nc, ms, o->size, -1);
    nc = pair_specs(x, 8, c);
    RT_CHECK(run(x, c, nc, o->warmup, o->iters < 20 ? 20 : o->iters, false, ms));
    store(lat, c, nc, ms, 8, -1);
    return RT_OK;
}

static rt_status gpu_host(ctx *x, const rt_p2p_options *o, rt_p2p_matrix *bw, rt_p2p_matrix *cbw, rt_p2p_matrix *lat) {
    spec c[RT_P2P_MAX];
    double ms[RT_P2P_MAX];
    for (int col = 0; col < RT_P2P_HOST_COLS; col++) {
        int nc = host_specs(x, col, o->size, c);
        RT_CHECK(run(x, c, nc, o->warmup, o->iters, false, ms));
        store(bw, c, nc, ms, o->size, col);
        RT_CHECK(run(x, c, nc, 0, o->iters, true, ms));
        store(cbw, c, nc, ms, o->size, col);
        nc = host_specs(x, col, 8, c);
        RT_CHECK(run(x, c, nc, o->warmup, o->iters < 20 ? 20 : o->iters, false, ms));
        store(lat, c, nc, ms, 8, col);
    }
    return RT_OK;
}

/* peer access on between every pair that supports it (on = false: off again) */
static rt_status set_peer(ctx *x, const rt_p2p_report *r, bool on) {
    for (int i = 0; i < x->n; i++) {
        RT_CHECK_CUDA(cudaSetDevice(i));
        for (int j = 0; j < x->n; j++)
            if (i != j && r->access[i][j])
                RT_CHECK_CUDA(on ? cudaDeviceEnablePeerAccess(j, 0) : cudaDeviceDisablePeerAccess(j));
    }
    return RT_OK;
}

/* ---- topology ---- */

typedef struct nvml {
    void *lib;
    int (*handle)(const char *bus_id, void **dev);
    int (*ancestor)(void *a, void *b, int *level);
    int (*p2p)(void *a, void *b, int index, int *status);
    void *dev[RT_P2P_MAX];
} nvml;

/* NVML where libnvidia-ml.so.1 opens and initialises (false otherwise: nothing loaded) */
static bool nvml_open(nvml *v, const rt_p2p_report *r) {
    memset(v, 0, sizeof *v);
    v->lib = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!v->lib) return false;
    int (*init)(void) = (int (*)(void))dlsym(v->lib, "nvmlInit_v2");
    *(void **)&v->handle = dlsym(v->lib, "nvmlDeviceGetHandleByPciBusId_v2");
    *(void **)&v->ancestor = dlsym(v->lib, "nvmlDeviceGetTopologyCommonAncestor");
    *(void **)&v->p2p = dlsym(v->lib, "nvmlDeviceGetP2PStatus");
    bool ok = init && v->handle && v->ancestor && v->p2p && init() == 0;
    for (int i = 0; ok && i < r->n; i++) ok = v->handle(r->bus_id[i], &v->dev[i]) == 0;
    if (!ok) dlclose(v->lib);
    return ok;
}

/* NVML's view of a pair (NVML_P2P_CAPS_INDEX_NVLINK = 2, NVML_P2P_STATUS_OK = 0;
 * topology levels 0..20 one switch or board, 30 host bridge, 40 NUMA node, 50 system) */
static rt_p2p_link nvml_link(const nvml *v, int i, int j) {
    int status = -1, level = -1;
    if (v->p2p(v->dev[i], v->dev[j], 2, &status) == 0 && status == 0) return RT_P2P_LINK_NVLINK;
    if (v->ancestor(v->dev[i], v->dev[j], &level) != 0) return RT_P2P_LINK_NO_PEER;
    return level <= 20   ? RT_P2P_LINK_PCIE_SWITCH
           : level <= 30 ? RT_P2P_LINK_HOST_BRIDGE
           : level <= 40 ? RT_P2P_LINK_NUMA_NODE
                         : RT_P2P_LINK_SOCKETS;
}

/* the CUDA runtime's view: peer access and atomics, then NUMA nodes */
static rt_p2p_link cuda_link(const rt_p2p_report *r, int i, int j) {
    if (r->access[i][j]) return r->atomics[i][j] ? RT_P2P_LINK_PEER_ATOMIC : RT_P2P_LINK_PEER;
    if (r->numa[i] >= 0 && r->numa[j] >= 0 && r->numa[i] != r->numa[j]) return RT_P2P_LINK_SOCKETS;
    return RT_P2P_LINK_NO_PEER;
}

static int pci_numa_node(const char *bus_id) {
    char id[20], path[96];
    size_t k = 0;
    for (; bus_id[k] && k + 1 < sizeof id; k++) id[k] = (char)tolower((unsigned char)bus_id[k]);
    id[k] = 0;
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", id);
    FILE *f = fopen(path, "r");
    int node = -1;
    if (f && fscanf(f, "%d", &node) != 1) node = -1;
    if (f) fclose(f);
    return node;
}

static rt_status topology(rt_p2p_report *r) {
    for (int i = 0; i < r->n; i++) {
        RT_CHECK_CUDA(cudaDeviceGetPCIBusId(r->bus_id[i], (int)sizeof r->bus_id[i], i));
        r->numa[i] = pci_numa_node(r->bus_id[i]);
    }
    for (int i = 0; i < r->n; i++)
        for (int j = 0; j < r->n; j++) {
            if (i == j) continue;
            RT_CHECK_CUDA(cudaDeviceCanAccessPeer(&r->access[i][j], i, j));
            RT_CHECK_CUDA(cudaDeviceGetP2PAttribute(&r->rank[i][j], cudaDevP2PAttrPerformanceRank, i, j));
            RT_CHECK_CUDA(cudaDeviceGetP2PAttribute(&r->atomics[i][j], cudaDevP2PAttrNativeAtomicSupported, i, j));
        }
    nvml v;
    r->nvml = nvml_open(&v, r);
    for (int i = 0; i < r->n; i++)
        for (int j = 0; j < r->n; j++)
            r->link[i][j] = i == j ? RT_P2P_LINK_SELF : r->nvml ? nvml_link(&v, i, j) : cuda_link(r, i, j);
    if (r->nvml) dlclose(v.lib); /* nvmlShutdown is not needed for a process that ends soon */
    return RT_OK;
}

/* ---- buffers ---- */

static rt_status alloc_gpu(ctx *x, int d) {
    gpu *g = &x->g[d];
    RT_CHECK_CUDA(cudaSetDevice(d));
    for (int k = 0; k < x->n; k++) {
        RT_CHECK_CUDA(cudaStreamCreateWithFlags(&g->s[k], cudaStreamNonBlocking));
        RT_CHECK_CUDA(cudaEventCreate(&g->a[k]));
        RT_CHECK_CUDA(cudaEventCreate(&g->b[k]));
    }
    RT_CHECK_CUDA(cudaMalloc((void **)&g->src, x->size));
    RT_CHECK_CUDA(cudaMalloc((void **)&g->dst, x->size * (size_t)x->n));
    RT_CHECK_CUDA(cudaMemset(g->src, 0x5a, x->size));
    RT_CHECK_CUDA(cudaHostAlloc((void **)&g->pinned, 2 * x->size, cudaHostAllocDefault));
    g->paged = calloc(2, x->size);
    RT_CHECK_ALLOC(g->paged, 2 * x->size);
    return RT_OK;
}

static void free_gpu(ctx *x, int d) {
    gpu *g = &x->g[d];
    if (cudaSetDevice(d) != cudaSuccess) return;
    (void)cudaDeviceSynchronize();
    for (int k = 0; k < x->n; k++) {
        if (g->s[k]) (void)cudaStreamDestroy(g->s[k]);
        if (g->a[k]) (void)cudaEventDestroy(g->a[k]);
        if (g->b[k]) (void)cudaEventDestroy(g->b[k]);
    }
    if (g->src) (void)cudaFree(g->src);
    if (g->dst) (void)cudaFree(g->dst);
    if (g->pinned) (void)cudaFreeHost(g->pinned);
    free(g->paged);
    (void)cudaGetLastError();
}

static void add_gpu_matrices(rt_p2p_report *r, rt_p2p_matrix **m) {
    int n = r->n;
    m[0] = rt_p2p_add_matrix(r, "gpu_bw_peer_off_serial",
                             "GPU -> GPU bandwidth (GB/s), peer access off, one pair at a time", false, n, n);
    m[1] = rt_p2p_add_matrix(r, "gpu_bw_peer_on_serial",
                             "GPU -> GPU bandwidth (GB/s), peer access on, one pair at a time", false, n, n);
    m[2] = rt_p2p_add_matrix(r, "gpu_bw_peer_off_concurrent",
                             "GPU -> GPU bandwidth (GB/s), peer access off, all pairs at once", false, n, n);
    m[3] = rt_p2p_add_matrix(r, "gpu_bw_peer_on_concurrent",
                             "GPU -> GPU bandwidth (GB/s), peer access on, all pairs at once", false, n, n);
    m[4] = rt_p2p_add_matrix(r, "gpu_lat_peer_off", "GPU -> GPU latency (us per 8-byte copy), peer access off", true, n,
                             n);
    m[5] =
        rt_p2p_add_matrix(r, "gpu_lat_peer_on", "GPU -> GPU latency (us per 8-byte copy), peer access on", true, n, n);
    m[6] = rt_p2p_add_matrix(r, "host_bw_serial", "host <-> GPU bandwidth (GB/s), one GPU at a time", false, n,
                             RT_P2P_HOST_COLS);
    m[7] = rt_p2p_add_matrix(r, "host_bw_concurrent", "host <-> GPU bandwidth (GB/s), all GPUs at once", false, n,
                             RT_P2P_HOST_COLS);
    m[8] = rt_p2p_add_matrix(r, "host_lat", "host <-> GPU latency (us per 8-byte copy)", true, n, RT_P2P_HOST_COLS);
    for (int k = 6; k < 9; k++) m[k]->host = true;
    r->reading_mat = 1;
}

static rt_status measure(ctx *x, rt_p2p_report *r, const rt_p2p_options *o) {
    rt_p2p_matrix *m[9];
    add_gpu_matrices(r, m);
    RT_CHECK(topology(r));
    for (int d = 0; d < x->n; d++) RT_CHECK(alloc_gpu(x, d));
    RT_CHECK(gpu_host(x, o, m[6], m[7], m[8]));
    if (x->n < 2) {
        snprintf(r->note, sizeof r->note, "one GPU: no GPU pair to measure (the host rows are measured)");
        return RT_OK;
    }
    RT_CHECK(gpu_pairs(x, o, m[0], m[2], m[4]));
    RT_CHECK(set_peer(x, r, true));
    rt_status s = gpu_pairs(x, o, m[1], m[3], m[5]);
    rt_status off = set_peer(x, r, false);
    return s != RT_OK ? s : off;
}

rt_status rt_p2p_bench_gpu(const rt_p2p_options *o, rt_p2p_report **out) {
    *out = NULL;
    int n = 0;
    RT_CHECK(rt_cuda_device_count(&n)); /* its error names why there is no GPU */
    RT_REQUIRE(o->size >= 8 && o->iters >= 1 && o->warmup >= 0, RT_ERR_INVALID,
               "bench p2p: size %zu (at least 8), iters %d, warmup %d", o->size, o->iters, o->warmup);
    if (n > RT_P2P_MAX) n = RT_P2P_MAX;
    rt_p2p_report *r = calloc(1, sizeof *r);
    ctx *x = calloc(1, sizeof *x);
    rt_status s = r && x ? RT_OK : RT_ERROR(RT_ERR_NOMEM, "bench p2p: out of memory");
    if (s == RT_OK) {
        r->gpu = true, r->n = x->n = n, r->size = x->size = o->size, r->iters = o->iters;
        s = measure(x, r, o);
    }
    for (int d = 0; x && d < n; d++) free_gpu(x, d);
    free(x);
    if (s == RT_OK)
        *out = r;
    else
        free(r);
    return s;
}
