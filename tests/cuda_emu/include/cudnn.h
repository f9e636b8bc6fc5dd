/* Host emulation (docs/cuda-emulation.md): the cuDNN types that the model backend's
 * private header (src/model/cuda/cuda_internal.h) names, so the emulated kernels and
 * their tests compile without cuDNN. No cuDNN function exists here: the library calls
 * stay GPU-only tests. */
#ifndef RT_EMU_CUDNN_H
#define RT_EMU_CUDNN_H

typedef struct cudnnContext *cudnnHandle_t;
typedef enum { CUDNN_STATUS_SUCCESS = 0 } cudnnStatus_t;
typedef enum { RT_EMU_CUDNN_FWD_ALGO_ = 0 } cudnnConvolutionFwdAlgo_t;
typedef enum { RT_EMU_CUDNN_BWD_DATA_ALGO_ = 0 } cudnnConvolutionBwdDataAlgo_t;
typedef enum { RT_EMU_CUDNN_BWD_FILTER_ALGO_ = 0 } cudnnConvolutionBwdFilterAlgo_t;
typedef enum { CUDNN_DEFAULT_MATH = 0 } cudnnMathType_t;

#endif
