/* The cost ledger of the emulated GPUs (tests/cuda_emu/ledger.cpp, docs/gpu.md "The cost
 * ledger"), seen from ringtrain: its types and a lookup at run time.
 *
 * In the emulated-GPU build (RINGTRAIN_CUDA=EMU) the emulated CUDA runtime records, for
 * every kernel launch, library call (cuDNN, cuBLAS, NCCL), copy and fill, the device bytes
 * it reads and writes and its FLOPs, and counts host synchronisations and graph launches.
 * ringtrain never links against it by name: rt_cost_ledger_find() returns the functions
 * when the process has them (weak symbols, resolved only where the emulated runtime is
 * linked in) and NULL everywhere else, so a real CUDA build or a CPU build simply has no
 * ledger (bench model prints null). This header is the whole interface: the emulator
 * includes it for the same types.
 */
#ifndef RT_CORE_COST_LEDGER_H
#define RT_CORE_COST_LEDGER_H

#include "core/status.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* what an operation is */
typedef enum rt_cost_kind {
    RT_COST_KERNEL = 0, /* one of our kernels (a launch) */
    RT_COST_CUDNN,      /* a cuDNN compute call */
    RT_COST_CUBLAS,     /* a cuBLAS compute call */
    RT_COST_NCCL,       /* an NCCL collective or send/recv */
    RT_COST_COPY,       /* cudaMemcpy(Async) */
    RT_COST_FILL,       /* cudaMemset(Async) */
    RT_COST_KINDS
} rt_cost_kind;

/* the arithmetic an operation's FLOPs run on (which peak they are measured against) */
typedef enum rt_cost_math {
    RT_COST_MATH_NONE = 0, /* no FLOPs that count: copies, fills, NCCL */
    RT_COST_MATH_FP32,     /* CUDA cores, fp32 FMA (our kernels; cuDNN CUDNN_FMA_MATH; pedantic cuBLAS) */
    RT_COST_MATH_TF32,     /* tensor cores, tf32 (float data with tensor-op math allowed) */
    RT_COST_MATH_BF16,     /* tensor cores, bf16 */
    RT_COST_MATHS
} rt_cost_math;

/* one recorded operation */
typedef struct rt_cost_op {
    const char *name; /* the kernel's or the call's name (a static string) */
    int kind;         /* rt_cost_kind */
    int math;         /* rt_cost_math */
    unsigned long long stream; /* the stream's serial number in the emulation (per process) */
    int captured;              /* enqueued inside a stream capture (a CUDA graph): always 0, no capture emulated */
    double bytes_read, bytes_written, flops;
} rt_cost_op;

/* The model of docs/gpu.md ("Modelled step time"), set from the calibration file:
 *   t_op = max(flops / (eta * peak_flops[math]), bytes / (beta * bandwidth), h if not captured)
 *   T    = sum of t_op + h * graph_launches + sync_s * host_syncs */
typedef struct rt_cost_model {
    double peak_flops[RT_COST_MATHS]; /* FLOP/s ([RT_COST_MATH_NONE]: for FLOPs of ops without math, unused) */
    double bandwidth;                 /* bytes/s, read + written */
    double eta, beta;                 /* efficiencies, fitted */
    double h;                         /* s per operation issued by the host (not captured), fitted */
    double sync_s;                    /* s per host synchronisation */
} rt_cost_model;

/* totals since the last reset (rt_cost_ledger_api.reset) */
typedef struct rt_cost_ledger {
    size_t size;              /* sizeof(rt_cost_ledger): set by the caller, checked by the ledger */
    int mode;                 /* 0 off, 1 on, 2 count only (the emulation skips the arithmetic) */
    unsigned long long ops;   /* recorded operations (every kind) */
    unsigned long long launches, library_calls, copies, fills, host_syncs, graph_launches, captured;
    unsigned long long unknown_kernels; /* launches of kernels without a cost entry */
    char unknown_names[256];            /* their names, comma-separated (the first few) */
    double bytes_read, bytes_written, flops;
    double kind_bytes[RT_COST_KINDS], kind_flops[RT_COST_KINDS];
    int modelled; /* a model is set: modelled_s is meaningful */
    double modelled_s;
} rt_cost_ledger;

typedef struct rt_cost_ledger_api {
    /* mode 1 on, 2 count only, 0 off (RINGTRAIN_EMU_LEDGER sets it at start: 1 | count);
     * count only is taken only before the first operation. Returns the mode now. */
    int (*enable)(int mode);
    void (*reset)(void);
    /* 0, or -1 when out->size does not match the ledger's */
    int (*read)(rt_cost_ledger *out);
    /* copies up to cap recorded operations from index first (0 = the first since the
     * reset) into out; returns how many */
    size_t (*ops)(rt_cost_op *out, size_t first, size_t cap);
    void (*set_model)(const rt_cost_model *m);
} rt_cost_ledger_api;

/* The ledger of this process, or NULL when there is none (not the emulated GPUs). */
const rt_cost_ledger_api *rt_cost_ledger_find(void);

/* Read a calibration file (bench/results/gpu-cost-calibration-<date>.json, written by
 * bench/gpu_cost_fit.py) into *m: peak_flops {fp32, tf32, bf16} (FLOP/s),
 * bandwidth_bytes_per_s, eta, beta, h_s, sync_s, every one a positive number
 * (sync_s >= 0). RT_ERR_IO when it cannot be read, RT_ERR_FORMAT naming the file and the
 * field otherwise. */
rt_status rt_cost_model_load(const char *path, rt_cost_model *m);

/* a - b, field by field (counts, bytes, FLOPs, modelled time) into out */
void rt_cost_ledger_diff(const rt_cost_ledger *a, const rt_cost_ledger *b, rt_cost_ledger *out);

/* "kernel" | "cudnn" | ...; "fp32" | "tf32" | "bf16" | "none" */
const char *rt_cost_kind_name(int kind);
const char *rt_cost_math_name(int math);

#ifdef __cplusplus
}
#endif

#endif
