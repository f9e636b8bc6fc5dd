/* Check macros for cuDNN and cuBLAS (core's RT_CHECK_LIB shape; see
 * core/cuda/cuda_check.h). Include only from src/model/cuda/. */
#ifndef RT_MODEL_LIB_CHECK_H
#define RT_MODEL_LIB_CHECK_H

#include "core/cuda/cuda_check.h"

#include <cublas_v2.h>
#include <cudnn.h>

#define RT_CHECK_CUDNN(expr) RT_CHECK_LIB(expr, cudnnStatus_t, rt_e_ == CUDNN_STATUS_SUCCESS, "cuDNN", cudnnGetErrorString)
#define RT_CHECK_CUBLAS(expr)                                                                                          \
    RT_CHECK_LIB(expr, cublasStatus_t, rt_e_ == CUBLAS_STATUS_SUCCESS, "cuBLAS", cublasGetStatusString)

#endif
