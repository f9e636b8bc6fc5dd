/* Host emulation of the CUDA runtime (see docs/cuda-emulation.md): NOT the toolkit's
 * header. The emulated builds put tests/cuda_emu/include before every other include
 * directory, so the project's CUDA sources (the .c files compiled as C, the .cu copies
 * compiled as C++) and the tests see this file as <cuda_runtime.h>.
 *
 * Two modes:
 *  - kernels only (the default; the main build's rt_cuda_emu): "device" memory is host
 *    memory and a launch runs to completion before it returns. The few runtime calls the
 *    kernel tests need are static inline here, so no global cuda* symbol is defined and
 *    the library links next to the real CUDA runtime.
 *  - the full runtime (RT_EMU_FULL_RUNTIME defined for every file that includes this
 *    header: the -DRINGTRAIN_CUDA=EMU build): the runtime API below is implemented by
 *    tests/cuda_emu/runtime.cpp with devices, device memory the host cannot touch,
 *    streams executed by worker threads, events and the real error codes.
 *
 * Types, constants and error numbers are the CUDA 13.0 toolkit's (driver_types.h,
 * cuda_runtime_api.h). In C++ the file adds the device side: threadIdx/blockIdx/
 * blockDim/gridDim, __global__ and friends, __syncthreads, atomics, the IEEE rounding
 * intrinsics and rt_emu_launch, the target of the rewritten
 * `kernel<<<grid, block, smem, stream>>>(args)`. */
#ifndef RT_EMU_CUDA_RUNTIME_H
#define RT_EMU_CUDA_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#define CUDART_VERSION 13000

#ifdef __cplusplus
extern "C" {
#define RT_EMU_DEFAULT(v) = v
#else
#define RT_EMU_DEFAULT(v)
#endif

/* X(name, number, what cudaGetErrorString says): the toolkit's numbers; the emulation
 * returns only these (cudaGetErrorName/String know every one of them) */
#define RT_EMU_CUDA_ERRORS(X)                                                                                          \
    X(cudaSuccess, 0, "no error")                                                                                      \
    X(cudaErrorInvalidValue, 1, "invalid argument")                                                                    \
    X(cudaErrorMemoryAllocation, 2, "out of memory")                                                                   \
    X(cudaErrorInitializationError, 3, "initialization error")                                                         \
    X(cudaErrorCudartUnloading, 4, "driver shutting down")                                                             \
    X(cudaErrorInvalidConfiguration, 9, "invalid configuration argument")                                              \
    X(cudaErrorInvalidPitchValue, 12, "invalid pitch argument")                                                        \
    X(cudaErrorInvalidSymbol, 13, "invalid device symbol")                                                             \
    X(cudaErrorInvalidHostPointer, 16, "invalid host pointer")                                                         \
    X(cudaErrorInvalidDevicePointer, 17, "invalid device pointer")                                                     \
    X(cudaErrorInvalidMemcpyDirection, 21, "invalid copy direction for memcpy")                                        \
    X(cudaErrorStubLibrary, 34, "CUDA driver is a stub library")                                                       \
    X(cudaErrorInsufficientDriver, 35, "CUDA driver version is insufficient for CUDA runtime version")                 \
    X(cudaErrorCallRequiresNewerDriver, 36, "API call is not supported in the installed CUDA driver")                  \
    X(cudaErrorDevicesUnavailable, 46, "CUDA-capable device(s) is/are busy or unavailable")                            \
    X(cudaErrorMissingConfiguration, 52, "__global__ function call is not configured")                                 \
    X(cudaErrorInvalidDeviceFunction, 98, "invalid device function")                                                   \
    X(cudaErrorNoDevice, 100, "no CUDA-capable device is detected")                                                    \
    X(cudaErrorInvalidDevice, 101, "invalid device ordinal")                                                           \
    X(cudaErrorStartupFailure, 127, "startup failure in cuda runtime")                                                 \
    X(cudaErrorInvalidKernelImage, 200, "device kernel image is invalid")                                              \
    X(cudaErrorDeviceUninitialized, 201, "invalid device context")                                                     \
    X(cudaErrorNoKernelImageForDevice, 209, "no kernel image is available for execution on the device")               \
    X(cudaErrorECCUncorrectable, 214, "uncorrectable ECC error encountered")                                           \
    X(cudaErrorUnsupportedLimit, 215, "limit is not supported on this architecture")                                   \
    X(cudaErrorDeviceAlreadyInUse, 216, "exclusive-thread device already in use by a different thread")                \
    X(cudaErrorPeerAccessUnsupported, 217, "peer access is not supported between these two devices")                   \
    X(cudaErrorInvalidPtx, 218, "a PTX JIT compilation failed")                                                        \
    X(cudaErrorOperatingSystem, 304, "OS call failed or operation not supported on this OS")                           \
    X(cudaErrorInvalidResourceHandle, 400, "invalid resource handle")                                                  \
    X(cudaErrorIllegalState, 401, "the operation cannot be performed in the present state")                            \
    X(cudaErrorSymbolNotFound, 500, "named symbol not found")                                                          \
    X(cudaErrorNotReady, 600, "device not ready")                                                                      \
    X(cudaErrorIllegalAddress, 700, "an illegal memory access was encountered")                                        \
    X(cudaErrorLaunchOutOfResources, 701, "too many resources requested for launch")                                   \
    X(cudaErrorLaunchTimeout, 702, "the launch timed out and was terminated")                                          \
    X(cudaErrorPeerAccessAlreadyEnabled, 704, "peer access is already enabled")                                        \
    X(cudaErrorPeerAccessNotEnabled, 705, "peer access has not been enabled")                                          \
    X(cudaErrorContextIsDestroyed, 709, "context is destroyed")                                                        \
    X(cudaErrorAssert, 710, "device-side assert triggered")                                                            \
    X(cudaErrorHostMemoryAlreadyRegistered, 712, "part or all of the requested memory range is already mapped")        \
    X(cudaErrorHostMemoryNotRegistered, 713, "pointer does not correspond to a registered memory region")              \
    X(cudaErrorHardwareStackError, 714, "hardware stack error")                                                        \
    X(cudaErrorIllegalInstruction, 715, "an illegal instruction was encountered")                                      \
    X(cudaErrorMisalignedAddress, 716, "misaligned address")                                                           \
    X(cudaErrorLaunchFailure, 719, "unspecified launch failure")                                                       \
    X(cudaErrorNotPermitted, 800, "operation not permitted")                                                           \
    X(cudaErrorNotSupported, 801, "operation not supported")                                                           \
    X(cudaErrorSystemNotReady, 802, "system not yet initialized")                                                      \
    X(cudaErrorSystemDriverMismatch, 803, "system has unsupported display driver / cuda driver combination")           \
    X(cudaErrorCompatNotSupportedOnDevice, 804, "forward compatibility was attempted on non supported HW")             \
    X(cudaErrorStreamCaptureUnsupported, 900, "operation not permitted when stream is capturing")                      \
    X(cudaErrorStreamCaptureInvalidated, 901, "operation failed due to a previous error during capture")               \
    X(cudaErrorStreamCaptureMerge, 902, "operation would result in a merge of separate capture sequences")             \
    X(cudaErrorStreamCaptureUnmatched, 903, "capture was not ended in the same stream as it began")                    \
    X(cudaErrorStreamCaptureUnjoined, 904, "capturing stream has unjoined work")                                      \
    X(cudaErrorStreamCaptureIsolation, 905, "dependency created on uncaptured work in another stream")                 \
    X(cudaErrorStreamCaptureImplicit, 906, "operation would make the legacy stream depend on a capturing blocking stream") \
    X(cudaErrorCapturedEvent, 907, "operation not permitted on an event last recorded in a capturing stream")         \
    X(cudaErrorStreamCaptureWrongThread, 908, "attempt to terminate a thread-local capture sequence from another thread") \
    X(cudaErrorTimeout, 909, "wait operation timed out")                                                               \
    X(cudaErrorGraphExecUpdateFailure, 910, "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update") \
    X(cudaErrorUnknown, 999, "unknown error")

#define RT_EMU_ERROR_ENUM(name, number, text) name = number,
typedef enum cudaError { RT_EMU_CUDA_ERRORS(RT_EMU_ERROR_ENUM) } cudaError_t;
#undef RT_EMU_ERROR_ENUM

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
/* stream capture and graphs (the full runtime only): the toolkit's names and values */
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct CUgraphNode_st *cudaGraphNode_t;
enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2
};
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
};
enum cudaGraphExecUpdateResult {
    cudaGraphExecUpdateSuccess = 0x0,
    cudaGraphExecUpdateError = 0x1,
    cudaGraphExecUpdateErrorTopologyChanged = 0x2,
    cudaGraphExecUpdateErrorNodeTypeChanged = 0x3,
    cudaGraphExecUpdateErrorFunctionChanged = 0x4,
    cudaGraphExecUpdateErrorParametersChanged = 0x5,
    cudaGraphExecUpdateErrorNotSupported = 0x6,
    cudaGraphExecUpdateErrorUnsupportedFunctionChange = 0x7,
    cudaGraphExecUpdateErrorAttributesChanged = 0x8
};
typedef struct cudaGraphExecUpdateResultInfo_st {
    enum cudaGraphExecUpdateResult result;
    cudaGraphNode_t errorNode;
    cudaGraphNode_t errorFromNode;
} cudaGraphExecUpdateResultInfo;
typedef void (*cudaHostFn_t)(void *userData);

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;

#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaHostAllocWriteCombined 0x04
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaEventInterprocess 0x04
#define cudaEventWaitDefault 0x00
#define cudaEventWaitExternal 0x01
#define cudaEventRecordDefault 0x00
#define cudaEventRecordExternal 0x01

typedef struct CUuuid_st {
    char bytes[16];
} cudaUUID_t;

/* the toolkit's fields, in its order (CUDA 13 removed clockRate, computeMode, ...) */
struct cudaDeviceProp {
    char name[256];
    cudaUUID_t uuid;
    char luid[8];
    unsigned int luidDeviceNodeMask;
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int regsPerBlock;
    int warpSize;
    size_t memPitch;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    size_t totalConstMem;
    int major;
    int minor;
    size_t textureAlignment;
    size_t texturePitchAlignment;
    int multiProcessorCount;
    int integrated;
    int canMapHostMemory;
    int concurrentKernels;
    int ECCEnabled;
    int pciBusID;
    int pciDeviceID;
    int pciDomainID;
    int tccDriver;
    int asyncEngineCount;
    int unifiedAddressing;
    int memoryBusWidth;
    int l2CacheSize;
    int persistingL2CacheMaxSize;
    int maxThreadsPerMultiProcessor;
    int streamPrioritiesSupported;
    int globalL1CacheSupported;
    int localL1CacheSupported;
    size_t sharedMemPerMultiprocessor;
    int regsPerMultiprocessor;
    int managedMemory;
    int isMultiGpuBoard;
    int multiGpuBoardGroupID;
    int hostNativeAtomicSupported;
    int pageableMemoryAccess;
    int concurrentManagedAccess;
    int computePreemptionSupported;
    int canUseHostPointerForRegisteredMem;
    int cooperativeLaunch;
    size_t sharedMemPerBlockOptin;
    int pageableMemoryAccessUsesHostPageTables;
    int directManagedMemAccessFromHost;
    int maxBlocksPerMultiProcessor;
    int accessPolicyMaxWindowSize;
    size_t reservedSharedMemPerBlock;
    int hostRegisterSupported;
    int memoryPoolsSupported;
    int gpuDirectRDMASupported;
    int clusterLaunch;
    int unifiedFunctionPointers;
    int mpsEnabled;
    int reserved[56];
};

/* kernels launched since the start (the tests check that a launcher launched) */
unsigned long long rt_emu_launch_count(void);

#ifdef RT_EMU_FULL_RUNTIME

/* ---- the emulated runtime (runtime.cpp) -------------------------------------------- */

cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorName(cudaError_t error);
const char *cudaGetErrorString(cudaError_t error);

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device);
cudaError_t cudaDriverGetVersion(int *driverVersion);
cudaError_t cudaRuntimeGetVersion(int *runtimeVersion);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority);

/* peer access between devices (the emulator answers from RINGTRAIN_EMU_TOPOLOGY) */
enum cudaDeviceP2PAttr {
    cudaDevP2PAttrPerformanceRank = 1,
    cudaDevP2PAttrAccessSupported = 2,
    cudaDevP2PAttrNativeAtomicSupported = 3,
    cudaDevP2PAttrCudaArrayAccessSupported = 4
};
cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice);
cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags);
cudaError_t cudaDeviceDisablePeerAccess(int peerDevice);
cudaError_t cudaDeviceGetP2PAttribute(int *value, enum cudaDeviceP2PAttr attr, int srcDevice, int dstDevice);

cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream RT_EMU_DEFAULT(0));
cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
                                cudaStream_t stream RT_EMU_DEFAULT(0));
cudaError_t cudaMemset(void *devPtr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream RT_EMU_DEFAULT(0));

cudaError_t cudaStreamCreate(cudaStream_t *pStream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamGetFlags(cudaStream_t hStream, unsigned int *flags);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags RT_EMU_DEFAULT(0));
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData);

cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream RT_EMU_DEFAULT(0));
cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream RT_EMU_DEFAULT(0),
                                     unsigned int flags RT_EMU_DEFAULT(0));
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus);
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                 unsigned long long flags RT_EMU_DEFAULT(0));
cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream);
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t hGraphExec, cudaGraph_t hGraph,
                                cudaGraphExecUpdateResultInfo *resultInfo);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

#else /* kernels only */

/* emulation state (emu.cpp) */
cudaError_t rt_emu_get_last_error(int clear);
const char *rt_emu_error_name(cudaError_t e);
const char *rt_emu_error_string(cudaError_t e);
cudaError_t rt_emu_malloc(void **p, size_t n);
cudaError_t rt_emu_free(void *p);
cudaError_t rt_emu_mem_get_info(size_t *free_b, size_t *total_b);

/* "Device" memory is host memory; a stream is a name: every launch runs to completion
 * before it returns, so stream order holds trivially. */
static inline cudaError_t cudaGetLastError(void) { return rt_emu_get_last_error(1); }
static inline cudaError_t cudaPeekAtLastError(void) { return rt_emu_get_last_error(0); }
static inline const char *cudaGetErrorName(cudaError_t e) { return rt_emu_error_name(e); }
static inline const char *cudaGetErrorString(cudaError_t e) { return rt_emu_error_string(e); }
static inline cudaError_t cudaMalloc(void **p, size_t n) { return rt_emu_malloc(p, n); }
static inline cudaError_t cudaFree(void *p) { return rt_emu_free(p); }
static inline cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
    return rt_emu_mem_get_info(free_b, total_b);
}
static inline cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    (void)s;
    return cudaSuccess;
}

#endif /* RT_EMU_FULL_RUNTIME */

#ifdef __cplusplus
} /* extern "C" */

/* ---- C++ only: the device side ----------------------------------------------------- */

#include <math.h>
#include <memory> /* before __noinline__ is defined: libstdc++'s shared_ptr uses the name */
#include <tuple>
#include <type_traits>
#include <utility>

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
/* one array per kernel function and worker thread: a thread runs one block at a time,
 * and several stream workers may run kernels at the same time */
#define __shared__ static thread_local

/* the built-ins of the thread now running (read-only, as on the device) */
extern thread_local uint3 rt_emu_thread_idx, rt_emu_block_idx;
extern thread_local dim3 rt_emu_block_dim, rt_emu_grid_dim;
#define threadIdx (static_cast<const uint3 &>(rt_emu_thread_idx))
#define blockIdx (static_cast<const uint3 &>(rt_emu_block_idx))
#define blockDim (static_cast<const dim3 &>(rt_emu_block_dim))
#define gridDim (static_cast<const dim3 &>(rt_emu_grid_dim))

/* every live (not yet returned) thread of the block reaches it before any goes on */
void __syncthreads(void);
/* a memory fence (the last-block-finishes pattern: store, fence, atomic ticket); blocks
 * run one after another here, so only the compiler's and the host's ordering remain */
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* a cycle counter at 2 GHz; each thread's first reading is its grid's start (emu.cpp) */
long long rt_emu_clock64(void);
static inline long long clock64(void) { return rt_emu_clock64(); }

/* Atomics: the threads of a block are fibers that switch only at __syncthreads, so a
 * read-modify-write is never interleaved with another thread's. (Blocks of one kernel
 * run one after another on one worker; two kernels running at once on two streams are
 * unordered, as on the GPU: their atomics on shared data are not emulated.) */
template <class T> static inline T rt_emu_rmw_add(T *a, T v) {
    T old = *a;
    *a = old + v;
    return old;
}
static inline int atomicAdd(int *a, int v) { return rt_emu_rmw_add(a, v); }
static inline unsigned atomicAdd(unsigned *a, unsigned v) { return rt_emu_rmw_add(a, v); }
static inline unsigned long long atomicAdd(unsigned long long *a, unsigned long long v) { return rt_emu_rmw_add(a, v); }
static inline float atomicAdd(float *a, float v) { return rt_emu_rmw_add(a, v); }
static inline double atomicAdd(double *a, double v) { return rt_emu_rmw_add(a, v); }
static inline int atomicSub(int *a, int v) { return rt_emu_rmw_add(a, -v); }
template <class T> static inline T rt_emu_rmw_max(T *a, T v) {
    T old = *a;
    if (v > old) *a = v;
    return old;
}
template <class T> static inline T rt_emu_rmw_min(T *a, T v) {
    T old = *a;
    if (v < old) *a = v;
    return old;
}
static inline int atomicMax(int *a, int v) { return rt_emu_rmw_max(a, v); }
static inline unsigned atomicMax(unsigned *a, unsigned v) { return rt_emu_rmw_max(a, v); }
static inline int atomicMin(int *a, int v) { return rt_emu_rmw_min(a, v); }
static inline unsigned atomicMin(unsigned *a, unsigned v) { return rt_emu_rmw_min(a, v); }
template <class T> static inline T rt_emu_rmw_exch(T *a, T v) {
    T old = *a;
    *a = v;
    return old;
}
static inline int atomicExch(int *a, int v) { return rt_emu_rmw_exch(a, v); }
static inline unsigned atomicExch(unsigned *a, unsigned v) { return rt_emu_rmw_exch(a, v); }
static inline float atomicExch(float *a, float v) { return rt_emu_rmw_exch(a, v); }
template <class T> static inline T rt_emu_rmw_cas(T *a, T cmp, T v) {
    T old = *a;
    if (old == cmp) *a = v;
    return old;
}
static inline int atomicCAS(int *a, int cmp, int v) { return rt_emu_rmw_cas(a, cmp, v); }
static inline unsigned atomicCAS(unsigned *a, unsigned cmp, unsigned v) { return rt_emu_rmw_cas(a, cmp, v); }
static inline unsigned long long atomicCAS(unsigned long long *a, unsigned long long cmp, unsigned long long v) {
    return rt_emu_rmw_cas(a, cmp, v);
}

/* IEEE round-to-nearest intrinsics: one correctly rounded operation each. This file and
 * every emulated .cu copy are compiled with -ffp-contract=off, so `a + b` here is one
 * float addition and nothing around it is fused. fmaf/fma/sqrtf are correctly rounded
 * in glibc (in hardware or in software). */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __dsqrt_rn(double a) { return sqrt(a); }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }

/* ---- the launch -------------------------------------------------------------------- */

/* One parameter of a launch as the cost ledger sees it (tests/cuda_emu/kernel_costs.cpp):
 * the converted value (a pointer parameter: the emulator's alias, NULL stays NULL) and
 * its C++ type's shape. */
struct rt_emu_karg {
    const void *value;   /* the parameter's bytes */
    unsigned size;       /* sizeof the parameter */
    unsigned elem;       /* pointers: sizeof the element type (void: 1); else 0 */
    bool pointer, constant, floating; /* a pointer; to const; a floating-point value */
};

template <class T> static inline rt_emu_karg rt_emu_karg_of(const T &v) {
    rt_emu_karg a{&v, (unsigned)sizeof(T), 0, false, false, std::is_floating_point<T>::value};
    if constexpr (std::is_pointer<T>::value) {
        using E = std::remove_pointer_t<T>;
        a.pointer = true;
        a.constant = std::is_const<E>::value;
        if constexpr (std::is_void<E>::value)
            a.elem = 1;
        else
            a.elem = (unsigned)sizeof(E);
    }
    return a;
}

/* Run body(arg) once per thread of the grid: blocks in order (x fastest, then y, z),
 * the threads of a block as fibers; then cleanup(arg). `name` is the kernel's. Checks the configuration as the
 * device does (cudaErrorInvalidConfiguration, reported by cudaGetLastError, nothing
 * runs). Kernels only: runs now, on the calling thread. Full runtime: enqueued on
 * `stream` (cudaErrorInvalidResourceHandle for a destroyed one), returns at once, and
 * recorded in the cost ledger from the nargs parameters `args` (read before the launch
 * is enqueued: they live in arg). */
void rt_emu_run_grid(const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void (*body)(void *),
                     void *arg, void (*cleanup)(void *), int nargs, const rt_emu_karg *args);

/* A pointer parameter of a launch, as the kernel will see it. Kernels only: p itself.
 * Full runtime: the emulator's alias of device memory (of the stream's device), pinned
 * host memory as is, NULL as is; anything else (pageable host memory, freed or another
 * device's memory) stops the emulation with a message naming the kernel and the
 * parameter's index. */
extern "C" void *rt_emu_kernel_arg(const void *p, const char *kernel, int index, cudaStream_t stream);

template <class T> static inline T rt_emu_param(T v, const char *, int, cudaStream_t) { return v; }
template <class T> static inline T *rt_emu_param(T *v, const char *kernel, int index, cudaStream_t stream) {
    return static_cast<T *>(rt_emu_kernel_arg(const_cast<const void *>(static_cast<const volatile void *>(v)), kernel,
                                              index, stream));
}
/* the implicit conversion of an argument to its parameter's type */
template <class P, class A> static inline P rt_emu_convert(A &&a) { return std::forward<A>(a); }

template <class... P> struct rt_emu_launcher {
    const char *name;
    void (*kernel)(P...);
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;

    struct call {
        void (*kernel)(P...);
        std::tuple<P...> args;
        static void run(void *self) {
            call *c = static_cast<call *>(self);
            std::apply(c->kernel, c->args);
        }
        static void destroy(void *self) { delete static_cast<call *>(self); }
    };

    /* The arguments are converted to the kernel's parameter types once, as the launch
     * does, and copied (the launch returns before the kernel runs); every thread then
     * gets its own copies (parameters are per-thread values). */
    template <class... A> void operator()(A &&...args) const {
        static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
        launch(std::index_sequence_for<A...>{}, std::forward<A>(args)...);
    }

  private:
    template <size_t... I, class... A> void launch(std::index_sequence<I...>, A &&...args) const {
        call *c = new call{kernel, std::tuple<P...>(rt_emu_param(rt_emu_convert<P>(std::forward<A>(args)), name,
                                                                 static_cast<int>(I), stream)...)};
        const rt_emu_karg kargs[sizeof...(P) + 1] = {rt_emu_karg_of(std::get<I>(c->args))...};
        rt_emu_run_grid(name, grid, block, smem, stream, &call::run, c, &call::destroy, (int)sizeof...(P), kargs);
    }
};

template <class... P>
static inline rt_emu_launcher<P...> rt_emu_launch_named(const char *name, void (*kernel)(P...), dim3 grid, dim3 block,
                                                        size_t smem = 0, cudaStream_t stream = 0) {
    return rt_emu_launcher<P...>{name, kernel, grid, block, smem, stream};
}

/* `kernel<<<grid, block, smem, stream>>>(args)` is rewritten (tests/cuda_emu/rewrite_cu.cmake)
 * to `rt_emu_launch(kernel, grid, block, smem, stream)(args)`; the kernel's name goes
 * along for the emulation's messages */
#define rt_emu_launch(kernel, ...) rt_emu_launch_named(#kernel, kernel, __VA_ARGS__)

#endif /* __cplusplus */

#endif
