/* Check macros for the CUDA runtime: do { } while (0), recording the failing call,
 * file, line and rank and returning RT_ERR_CUDA (RT_ERR_NODEVICE for "no driver / no
 * device"). RT_CHECK_LIB is the family's shape for the libraries above core, which
 * define their own macros with it in their own cuda/ folders (cuDNN and cuBLAS in
 * src/model/cuda/lib_check.h, NCCL in src/dist/cuda/nccl.c): core includes and links
 * no GPU library but the CUDA runtime. Include only from CUDA-backend sources. */
#ifndef RT_CUDA_CHECK_H
#define RT_CUDA_CHECK_H

#include "core/status.h"

#include <cuda_runtime.h>

static inline rt_status rt_cuda_status_of(cudaError_t e) {
    return (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) ? RT_ERR_NODEVICE : RT_ERR_CUDA;
}

#define RT_CHECK_CUDA(expr)                                                                   \
    do {                                                                                      \
        cudaError_t rt_e_ = (expr);                                                           \
        if (rt_e_ != cudaSuccess) {                                                           \
            (void)cudaGetLastError();                                                         \
            return rt_error_set(rt_cuda_status_of(rt_e_), __FILE__, __LINE__, #expr, "CUDA error %s: %s", \
                                cudaGetErrorName(rt_e_), cudaGetErrorString(rt_e_));          \
        }                                                                                     \
    } while (0)

/* A library call that returns a status: `ok` is the condition on rt_e_ that means
 * success, `lib` the library's name, `errstr` its function naming a status. */
#define RT_CHECK_LIB(expr, type, ok, lib, errstr)                                             \
    do {                                                                                      \
        type rt_e_ = (expr);                                                                  \
        if (!(ok))                                                                            \
            return rt_error_set(RT_ERR_CUDA, __FILE__, __LINE__, #expr, lib " error %d: %s",  \
                                (int)rt_e_, errstr(rt_e_));                                   \
    } while (0)

/* Kernel launches: check the launch itself (configuration errors). */
#define RT_CHECK_LAUNCH() RT_CHECK_CUDA(cudaGetLastError())

#endif
