/* Check macros for the CUDA runtime, cuDNN, cuBLAS and NCCL: one family, all
 * do { } while (0), all recording the failing call, file, line and rank and returning
 * RT_ERR_CUDA (RT_ERR_NODEVICE for "no driver / no device"). Include only from
 * CUDA-backend sources (src/<area>/cuda/), which have the CUDA headers. */
#ifndef RT_CUDA_CHECK_H
#define RT_CUDA_CHECK_H

#include "core/status.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

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

#define RT_CHECK_CUDNN(expr)                                                                  \
    do {                                                                                      \
        cudnnStatus_t rt_e_ = (expr);                                                         \
        if (rt_e_ != CUDNN_STATUS_SUCCESS)                                                    \
            return rt_error_set(RT_ERR_CUDA, __FILE__, __LINE__, #expr, "cuDNN error %d: %s", \
                                (int)rt_e_, cudnnGetErrorString(rt_e_));                      \
    } while (0)

#define RT_CHECK_CUBLAS(expr)                                                                 \
    do {                                                                                      \
        cublasStatus_t rt_e_ = (expr);                                                        \
        if (rt_e_ != CUBLAS_STATUS_SUCCESS)                                                   \
            return rt_error_set(RT_ERR_CUDA, __FILE__, __LINE__, #expr, "cuBLAS error %d: %s", \
                                (int)rt_e_, cublasGetStatusString(rt_e_));                    \
    } while (0)

#define RT_CHECK_NCCL(expr)                                                                   \
    do {                                                                                      \
        ncclResult_t rt_e_ = (expr);                                                          \
        if (rt_e_ != ncclSuccess && rt_e_ != ncclInProgress)                                  \
            return rt_error_set(RT_ERR_CUDA, __FILE__, __LINE__, #expr, "NCCL error %d: %s", \
                                (int)rt_e_, ncclGetErrorString(rt_e_));                       \
    } while (0)

/* Kernel launches: check the launch itself (configuration errors). */
#define RT_CHECK_LAUNCH() RT_CHECK_CUDA(cudaGetLastError())

#endif
