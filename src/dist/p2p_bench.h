/* The copy benchmark behind `ringtrain bench p2p` (docs/bench.md): the bandwidth and
 * latency between every ordered pair of GPUs (peer access off and on) and between the
 * host and each GPU (pinned and pageable, both directions), one at a time and all at
 * once, with the topology beside it (the CUDA runtime's peer attributes and PCI bus ids,
 * the NUMA node from sysfs, NVML's common ancestor and NVLink status where
 * libnvidia-ml.so.1 can be opened at run time); on CPU ranks the same matrix over the
 * process group's transport (shm or tcp). A reading names the slowest pair against the
 * fastest and the link that explains it (rt_p2p_reading).
 *
 * As comm_bench.h: a library that hands back a report; options, printing and launching
 * ranks belong to the command (src/cli/bench_p2p.c).
 */
#ifndef RT_DIST_P2P_BENCH_H
#define RT_DIST_P2P_BENCH_H

#include "dist/dist.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RT_P2P_MAX 16 /* endpoints (GPUs or ranks) a report holds */

/* How two endpoints are connected, most direct first. */
typedef enum rt_p2p_link {
    RT_P2P_LINK_SELF = 0,
    RT_P2P_LINK_NVLINK,      /* NVML: an NVLink between them */
    RT_P2P_LINK_PEER_ATOMIC, /* CUDA only: peer access with native atomics (NVLink-like) */
    RT_P2P_LINK_PCIE_SWITCH, /* NVML: below one PCIe switch (PIX/PXB) */
    RT_P2P_LINK_PEER,        /* CUDA only: peer access without atomics (PCIe) */
    RT_P2P_LINK_HOST_BRIDGE, /* NVML: through the CPU's host bridge (PHB) */
    RT_P2P_LINK_NUMA_NODE,   /* NVML: across host bridges within one NUMA node (NODE) */
    RT_P2P_LINK_SOCKETS,     /* NVML: across the sockets' interconnect (SYS), or NUMA nodes differ */
    RT_P2P_LINK_NO_PEER,     /* CUDA: no peer access: copies staged through host memory */
    RT_P2P_LINK_SHM,         /* CPU ranks: shared memory */
    RT_P2P_LINK_TCP,         /* CPU ranks: TCP */
    RT_P2P_LINK_COUNT_
} rt_p2p_link;

/* "NVLink", "PCIe switch", ... (a short name for the matrix) */
const char *rt_p2p_link_name(rt_p2p_link l);

/* A matrix: rows x cols values, row-major; NAN where nothing was measured. */
typedef struct rt_p2p_matrix {
    char key[40];   /* JSON key, e.g. "gpu_bw_peer_on_serial" */
    char title[96]; /* e.g. "GPU -> GPU bandwidth (GB/s), peer access on, one pair at a time" */
    bool latency;   /* values are microseconds per copy; else GB/s */
    bool host;      /* columns are the host modes (rt_p2p_host_col), rows the GPUs */
    int rows, cols;
    double v[RT_P2P_MAX * RT_P2P_MAX];
} rt_p2p_matrix;

/* the columns of the host matrices */
enum { RT_P2P_H2D_PINNED, RT_P2P_D2H_PINNED, RT_P2P_H2D_PAGEABLE, RT_P2P_D2H_PAGEABLE, RT_P2P_HOST_COLS };
const char *rt_p2p_host_col_name(int c);

#define RT_P2P_MATRICES 12

typedef struct rt_p2p_report {
    bool gpu;    /* GPUs; else CPU ranks */
    int n;       /* GPUs or ranks */
    size_t size; /* bytes per copy (bandwidth); latency: 8 bytes */
    int iters;
    char transport[8];           /* CPU ranks: "shm" | "tcp" */
    bool nvml;                   /* NVML answered */
    char bus_id[RT_P2P_MAX][20]; /* GPUs: PCI bus id; ranks: "cpu N" */
    int numa[RT_P2P_MAX];        /* -1 unknown */
    rt_p2p_link link[RT_P2P_MAX][RT_P2P_MAX];
    int access[RT_P2P_MAX][RT_P2P_MAX], rank[RT_P2P_MAX][RT_P2P_MAX], atomics[RT_P2P_MAX][RT_P2P_MAX];
    int nmat;
    rt_p2p_matrix mat[RT_P2P_MATRICES];
    int reading_mat; /* the matrix rt_p2p_reading reads (pairs' bandwidth, the links' best case) */
    char note[160];  /* e.g. "one GPU: no GPU pair to measure" */
} rt_p2p_report;

typedef struct rt_p2p_options {
    size_t size; /* bytes per copy; default 32 MiB */
    int iters;   /* copies timed per entry; default 5 */
    int warmup;  /* untimed first; default 1 */
} rt_p2p_options;

void rt_p2p_options_default(rt_p2p_options *o);

/* GPUs: the CUDA runtime's devices. RT_ERR_NODEVICE without a CUDA build or device.
 * *out is malloc'd (free() it). */
rt_status rt_p2p_bench_gpu(const rt_p2p_options *o, rt_p2p_report **out);

/* CPU ranks: every rank of pg calls it; rank 0's *out holds the report (others: NULL).
 * pg has at most RT_P2P_MAX ranks. */
rt_status rt_p2p_bench_ranks(rt_pg *pg, const rt_p2p_options *o, rt_p2p_report **out);

/* One line on why the entries of the report's reading matrix differ: the slowest pair
 * against the fastest of the same source and the links of the two, e.g. "GPU 0 -> 2 is
 * 12.4x slower than 0 -> 1: 0 -> 1 is NVLink, 0 -> 2 has no peer access (staged through
 * host memory)". */
void rt_p2p_reading(const rt_p2p_report *r, char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif
