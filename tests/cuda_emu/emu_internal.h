/* The emulated CUDA runtime's interface to the emulated libraries (cuDNN, cuBLAS, NCCL)
 * of the test tree (docs/cuda-emulation.md). Not a CUDA header: only the emulation
 * includes it.
 *
 * Model: every device allocation lives in memory the host cannot touch (the pointer
 * cudaMalloc hands out is a view without access; the emulator works through a
 * read-write alias of the same pages). Every stream is a FIFO of operations executed by
 * a worker thread of its own. A library call that works on device memory therefore
 *   1. validates its arguments on the calling thread (returning the library's error),
 *   2. enqueues one operation on the stream bound to its handle with
 *      rt_emu_stream_enqueue(), copying every host-side value it needs into `arg`
 *      (scalars, descriptors' contents: the caller may change them after the call
 *      returns, as with the real libraries),
 *   3. inside the operation (on the worker thread) turns each device pointer into the
 *      emulator's read-write alias with rt_emu_dev_view() and computes.
 */
#ifndef RT_EMU_INTERNAL_H
#define RT_EMU_INTERNAL_H

#include <cuda_runtime.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueue fn(arg) on stream `s` (0 / cudaStreamLegacy: the current device's legacy
 * default stream, with its implicit synchronisation with blocking streams;
 * cudaStreamPerThread: the thread's default stream). The operation runs on the stream's
 * worker thread after everything enqueued before it (and after any event waits enqueued
 * before it), possibly after a random delay (RINGTRAIN_EMU_DELAY_US). cleanup(arg), when
 * not NULL, runs after fn on the worker thread (free what arg owns). `what` names the
 * operation in error messages ("cudnnConvolutionForward").
 * Returns cudaErrorInvalidResourceHandle for a stream that is not (or no longer) valid,
 * or the capture's error where the stream captures and CUDA would refuse the work
 * (runtime.cpp, "stream capture"); then neither fn nor cleanup runs: the caller frees
 * arg. On a capturing stream the operation is recorded into the graph, not run: fn(arg)
 * runs at every launch of the graph (arg must not be consumed by fn), cleanup(arg) when
 * the graph's last instance is gone. */
cudaError_t rt_emu_stream_enqueue(cudaStream_t s, const char *what, void (*fn)(void *arg), void *arg,
                                  void (*cleanup)(void *arg));
/* rt_emu_stream_enqueue, plus on_queue(arg), called under the runtime's lock whenever the
 * operation is put on a stream's queue to run (before the worker can start it): at once
 * where s does not capture; where it does, never at capture but at each cudaGraphLaunch of
 * a graph holding it, on the launching thread, in launch order. The emulated NCCL takes a
 * communicator's ticket there, so a replayed operation is ordered where the host launched
 * the graph. on_queue must not call the runtime. */
cudaError_t rt_emu_stream_enqueue_queued(cudaStream_t s, const char *what, void (*fn)(void *arg), void *arg,
                                         void (*cleanup)(void *arg), void (*on_queue)(void *arg));

/* The device a stream belongs to (0 / legacy: the current device); -1 when invalid. */
int rt_emu_stream_device(cudaStream_t s);

/* The emulator's read-write alias of [p, p + n) when that range lies inside one live
 * device allocation; NULL otherwise (a host pointer, a freed or foreign pointer, a range
 * that runs past the end). Callable from any thread. */
void *rt_emu_dev_view(const void *p, size_t n);

/* Like rt_emu_dev_view, for memory an operation may legitimately read or write on the
 * "device" side: device allocations (aliased) and pinned host memory from
 * cudaHostAlloc/cudaMallocHost (returned as is). Anything else (pageable host memory, a
 * freed pointer) is a fault: the emulation stops with a message naming `what`, the
 * pointer and the nearest allocation. Used inside stream operations. */
void *rt_emu_access(const void *p, size_t n, const char *what);

/* Device index of the allocation holding p, or -1 when p is not device memory. */
int rt_emu_ptr_device(const void *p);

/* The calling thread's current device (cudaSetDevice), 0 by default. */
int rt_emu_current_device(void);

/* Number of emulated devices (RINGTRAIN_EMU_GPUS; 0 means "no device"). */
int rt_emu_device_count(void);

/* Count one host synchronisation (a host thread blocking until device work is done:
 * stream/event/device synchronize, synchronous copies, a copy to pageable memory).
 * The emulated libraries call it when they block the host (e.g. an NCCL call that waits
 * for a peer on the calling thread). */
void rt_emu_count_host_sync(const char *what);

/* Host synchronisations counted so far in this process. */
unsigned long long rt_emu_host_syncs(void);

/* Stop the process with a message: an emulation-detected programming error (the
 * equivalent of a device fault), never an ordinary error return. printf-like. */
void rt_emu_fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* ---- added with the runtime (runtime.cpp) ---- */

/* Set the calling thread's last error (what cudaGetLastError/cudaPeekAtLastError report);
 * for the launches of emu.cpp and for libraries that fail like the runtime does. */
void rt_emu_set_last_error(cudaError_t e);

/* Operations the stream workers have completed, and device allocations live now. */
unsigned long long rt_emu_ops(void);
/* Graph launches (cudaGraphLaunch) so far in this process. */
unsigned long long rt_emu_graph_launches(void);
unsigned long long rt_emu_allocs_live(void);

/* Whether [p, p + n) lies inside one pinned host allocation (cudaHostAlloc/MallocHost). */
int rt_emu_is_pinned(const void *p, size_t n);

/* Tests: make the nth call (1 = the next) of runtime function `call` made from now on in
 * this process fail with `err`, doing nothing (as a failed call does). Checked by
 * cudaEventRecord, cudaStreamWaitEvent, cudaMemcpyAsync and cudaEventCreateWithFlags. */
void rt_emu_fail_call(const char *call, int nth, cudaError_t err);

/* ---- the cost ledger (ledger.cpp, kernel_costs.cpp; src/core/cost_ledger.h) ---- */

/* What one operation costs: device bytes read and written, FLOPs and the arithmetic they
 * run on (rt_cost_math). */
typedef struct rt_emu_cost {
    double bytes_read, bytes_written, flops;
    int math;
} rt_emu_cost;

/* Whether the ledger records (RINGTRAIN_EMU_LEDGER=1 or count, or rt_emu_ledger_enable). */
int rt_emu_ledger_on(void);
/* Whether the emulation skips its arithmetic (RINGTRAIN_EMU_LEDGER=count): kernels,
 * cuDNN and cuBLAS enqueue and are recorded but compute nothing (results are garbage). */
int rt_emu_ledger_count_only(void);
/* Record one operation of kind `kind` (rt_cost_kind) on stream s, enqueued now by the
 * calling thread; nothing when the ledger is off. `name` must be a static string. */
void rt_emu_ledger_record(cudaStream_t s, int kind, const char *name, const rt_emu_cost *c);
/* A launch of a kernel without a cost entry: counted and named (rt_cost_ledger.unknown_*). */
void rt_emu_ledger_unknown_kernel(cudaStream_t s, const char *name);
/* Where stream s captures: keep o in the graph being captured (the ledger replays it at
 * each launch of the graph) and return 1; else 0. */
struct rt_cost_op;
int rt_emu_capture_cost(cudaStream_t s, const struct rt_cost_op *o);
/* A graph launched on s: its captured operations' records (n of them) into the ledger, and
 * one graph launch. */
void rt_emu_ledger_graph_launch(cudaStream_t s, const struct rt_cost_op *ops, size_t n);
/* The stream's serial number (the legacy stream's too); 0 for an invalid handle. */
unsigned long long rt_emu_stream_serial(cudaStream_t s);

#ifdef __cplusplus
}

/* The cost of a launch of kernel `name` from its parameters (kernel_costs.cpp); false
 * when the table has no entry for it. */
bool rt_emu_kernel_cost(const char *name, dim3 grid, dim3 block, int nargs, const rt_emu_karg *args,
                        rt_emu_cost *out);
#endif

#endif
