/* Host emulation (docs/cuda-emulation.md): the cuBLAS types named by
 * src/model/cuda/cuda_internal.h. No cuBLAS function exists here. */
#ifndef RT_EMU_CUBLAS_V2_H
#define RT_EMU_CUBLAS_V2_H

typedef struct cublasContext *cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;

#endif
