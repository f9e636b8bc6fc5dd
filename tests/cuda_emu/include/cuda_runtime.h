/* Host emulation of the CUDA runtime for the project's own kernels (see
 * docs/cuda-emulation.md): NOT the toolkit's header. The emulated builds put
 * tests/cuda_emu/include before every other include directory, so the .cu copies and
 * the tests that call their launchers see this file as <cuda_runtime.h>.
 *
 * In C (the tests) it declares the runtime types and the few runtime calls the
 * launchers and tests use. In C++ (the host-compiled .cu copies) it adds the
 * built-ins: threadIdx/blockIdx/blockDim/gridDim, __global__ and friends,
 * __syncthreads, atomics, the IEEE rounding intrinsics and rt_emu_launch, the target of
 * the rewritten `kernel<<<grid, block, smem, stream>>>(args)`. */
#ifndef RT_EMU_CUDA_RUNTIME_H
#define RT_EMU_CUDA_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* the values are the CUDA runtime's */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorNotSupported = 801,
} cudaError_t;

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;

/* emulation state (emu.cpp) */
cudaError_t rt_emu_get_last_error(int clear);
const char *rt_emu_error_name(cudaError_t e);
const char *rt_emu_error_string(cudaError_t e);
cudaError_t rt_emu_malloc(void **p, size_t n);
cudaError_t rt_emu_free(void *p);
cudaError_t rt_emu_mem_get_info(size_t *free_b, size_t *total_b);
/* kernels launched since the start (the tests check that a launcher launched) */
unsigned long long rt_emu_launch_count(void);

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

#ifdef __cplusplus
} /* extern "C" */

/* ---- C++ only: the device side ----------------------------------------------------- */

#include <math.h>
#include <tuple>
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
/* blocks run one after another, the threads of a block share the function's statics */
#define __shared__ static

/* the built-ins of the thread now running (read-only, as on the device) */
extern thread_local uint3 rt_emu_thread_idx, rt_emu_block_idx;
extern thread_local dim3 rt_emu_block_dim, rt_emu_grid_dim;
#define threadIdx (static_cast<const uint3 &>(rt_emu_thread_idx))
#define blockIdx (static_cast<const uint3 &>(rt_emu_block_idx))
#define blockDim (static_cast<const dim3 &>(rt_emu_block_dim))
#define gridDim (static_cast<const dim3 &>(rt_emu_grid_dim))

/* every live (not yet returned) thread of the block reaches it before any goes on */
void __syncthreads(void);

/* Atomics: the threads of a block are fibers that switch only at __syncthreads, so a
 * read-modify-write is never interleaved with another thread's. */
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

/* Run body(arg) once per thread of the grid: blocks in order (x fastest, then y, z),
 * the threads of a block as fibers. Checks the configuration as the device does
 * (cudaErrorInvalidConfiguration, reported by cudaGetLastError, nothing runs). */
void rt_emu_run_grid(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void (*body)(void *), void *arg);

template <class... P> struct rt_emu_launcher {
    void (*kernel)(P...);
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;

    /* The arguments are converted to the kernel's parameter types once, as the launch
     * does; every thread then gets its own copies (parameters are per-thread values). */
    template <class... A> void operator()(A &&...args) const {
        static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
        struct call {
            void (*kernel)(P...);
            std::tuple<P...> args;
            static void run(void *self) {
                call *c = static_cast<call *>(self);
                std::apply(c->kernel, c->args);
            }
        } c{kernel, std::tuple<P...>(std::forward<A>(args)...)};
        rt_emu_run_grid(grid, block, smem, stream, &call::run, &c);
    }
};

/* `kernel<<<grid, block, smem, stream>>>(args)` is rewritten (tests/cuda_emu/rewrite_cu.cmake)
 * to `rt_emu_launch(kernel, grid, block, smem, stream)(args)`. */
template <class... P>
static inline rt_emu_launcher<P...> rt_emu_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem = 0,
                                                  cudaStream_t stream = 0) {
    return rt_emu_launcher<P...>{kernel, grid, block, smem, stream};
}

#endif /* __cplusplus */

#endif
