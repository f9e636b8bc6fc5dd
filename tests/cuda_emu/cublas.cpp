/* Emulated cuBLAS 13 (docs/cuda-emulation.md): the handle calls and cublasSgemm, on
 * the emulated runtime's streams (emu_internal.h). Declared by include/cublas_v2.h;
 * linked as rt_emu_cublas (with OpenBLAS) in the RINGTRAIN_CUDA=EMU build.
 *
 * A handle belongs to the device current at cublasCreate and is bound to one stream
 * (cublasSetStream; default the legacy stream). cublasSgemm validates its arguments on
 * the calling thread as cuBLAS does (CUBLAS_STATUS_INVALID_VALUE for negative sizes,
 * leading dimensions below their minimum, an unknown operation, NULL scalars), reads
 * alpha/beta there in CUBLAS_POINTER_MODE_HOST (on the stream, from device memory, in
 * CUBLAS_POINTER_MODE_DEVICE), and enqueues the product, which runs through the CPU
 * BLAS (cblas_sgemm, column-major) on the emulator's views of A, B and C: a host
 * pointer or a range past an allocation's end is a fault, as on the device. beta == 0
 * means C is not read. A stream that is no longer valid gives
 * CUBLAS_STATUS_EXECUTION_FAILED (the kernel launch fails), not a crash.
 *
 * Math modes: CUBLAS_TF32_TENSOR_OP_MATH (and the deprecated CUBLAS_TENSOR_OP_MATH)
 * round A and B to TF32 (10 mantissa bits) before the product, as tensor cores read
 * them; CUBLAS_DEFAULT_MATH and CUBLAS_PEDANTIC_MATH are plain fp32.
 *
 * Workspace (cublasSetWorkspace): per the cuBLAS documentation the pointer must be
 * aligned to 256 bytes (else CUBLAS_STATUS_INVALID_VALUE) and cublasSetStream resets the
 * handle to the library's default workspace. Assumed here, stricter than the
 * documentation says: the workspace must be device memory of the handle's device (else
 * INVALID_VALUE; real cuBLAS would fault later) and NULL only with size 0; the size
 * need not be a multiple of anything (the docs state no such rule; they recommend at
 * least 16 KiB to avoid CUBLAS_STATUS_ALLOC_FAILED, 32 MiB on Hopper). Every GEMM
 * checks the workspace is still allocated and overwrites its first 16 KiB, so a
 * workspace freed or shared with live data shows.
 */
#include "emu_internal.h"

#include <cublas_v2.h>

#include <cblas.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {
constexpr uint32_t kMagic = 0x53414c42;
constexpr size_t kWsScribble = 16 << 10;
} // namespace

struct cublasContext {
    uint32_t magic;
    int device;
    cudaStream_t stream;
    cublasPointerMode_t pointer_mode;
    cublasMath_t math;
    void *ws; /* NULL: the library's default pool */
    size_t ws_bytes;
};

namespace {

bool handle_ok(cublasHandle_t h) { return h && h->magic == kMagic; }

float tf32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u) return f;
    u += 0xfffu + ((u >> 13) & 1u);
    u &= 0xffffe000u;
    memcpy(&f, &u, sizeof u);
    return f;
}

bool tf32_math(cublasMath_t m) {
    const int base = (int)m & ~(int)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    return base == CUBLAS_TF32_TENSOR_OP_MATH || base == CUBLAS_TENSOR_OP_MATH;
}

/* floats spanned by a column-major rows x cols matrix with leading dimension ld */
size_t span(int rows, int cols, int ld) {
    if (rows == 0 || cols == 0) return 0;
    return (size_t)ld * (size_t)(cols - 1) + (size_t)rows;
}

template <class T> T *view(const void *p, size_t bytes, int dev, const char *what) {
    int pd = rt_emu_ptr_device(p);
    if (pd >= 0 && pd != dev)
        rt_emu_fatal("%s: pointer %p is memory of device %d, the operation runs on device %d", what, p, pd, dev);
    return static_cast<T *>(rt_emu_access(p, bytes, what));
}

struct gemm_args {
    int dev;
    bool ta, tb, tf32, device_scalars;
    int m, n, k, lda, ldb, ldc;
    float alpha, beta;
    const float *alpha_p, *beta_p; /* device pointer mode */
    const float *A, *B;
    float *C;
    void *ws;
    size_t ws_bytes;
};

std::vector<float> tf32_copy(const float *p, size_t n) {
    std::vector<float> v(p, p + n);
    for (float &f : v) f = tf32(f);
    return v;
}

void gemm_op(void *p) {
    const gemm_args &G = *static_cast<gemm_args *>(p);
    float alpha = G.alpha, beta = G.beta;
    if (G.device_scalars) {
        alpha = *view<const float>(G.alpha_p, sizeof(float), G.dev, "cublasSgemm alpha");
        beta = *view<const float>(G.beta_p, sizeof(float), G.dev, "cublasSgemm beta");
    }
    if (G.ws) memset(view<unsigned char>(G.ws, G.ws_bytes, G.dev, "cublasSgemm workspace"), 0xff,
                     G.ws_bytes < kWsScribble ? G.ws_bytes : kWsScribble);
    const size_t cn = span(G.m, G.n, G.ldc);
    if (cn == 0) return;
    float *C = view<float>(G.C, cn * sizeof(float), G.dev, "cublasSgemm C");
    const size_t an = G.ta ? span(G.k, G.m, G.lda) : span(G.m, G.k, G.lda);
    const size_t bn = G.tb ? span(G.n, G.k, G.ldb) : span(G.k, G.n, G.ldb);
    if (G.k == 0 || alpha == 0.0f || an == 0 || bn == 0) { /* C = beta * C, C not read when beta == 0 */
        for (int j = 0; j < G.n; j++)
            for (int i = 0; i < G.m; i++) {
                float *c = &C[(size_t)j * G.ldc + i];
                *c = beta == 0.0f ? 0.0f : beta * *c;
            }
        return;
    }
    const float *A = view<const float>(G.A, an * sizeof(float), G.dev, "cublasSgemm A");
    const float *B = view<const float>(G.B, bn * sizeof(float), G.dev, "cublasSgemm B");
    std::vector<float> at, bt;
    if (G.tf32) {
        at = tf32_copy(A, an);
        bt = tf32_copy(B, bn);
        A = at.data();
        B = bt.data();
    }
    if (beta == 0.0f) /* not read: NaN in C must not survive */
        for (int j = 0; j < G.n; j++) memset(&C[(size_t)j * G.ldc], 0, sizeof(float) * (size_t)G.m);
    cblas_sgemm(CblasColMajor, G.ta ? CblasTrans : CblasNoTrans, G.tb ? CblasTrans : CblasNoTrans, G.m, G.n, G.k, alpha,
                A, G.lda, B, G.ldb, beta, C, G.ldc);
}

int max1(int v) { return v > 1 ? v : 1; }

} // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    if (rt_emu_device_count() <= 0) return CUBLAS_STATUS_NOT_INITIALIZED;
    *handle = new cublasContext{kMagic, rt_emu_current_device(), nullptr, CUBLAS_POINTER_MODE_HOST,
                                CUBLAS_DEFAULT_MATH, nullptr, 0};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->magic = 0;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int *version) {
    if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!version) return CUBLAS_STATUS_INVALID_VALUE;
    *version = CUBLAS_VERSION;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetProperty(libraryPropertyType type, int *value) {
    if (!value) return CUBLAS_STATUS_INVALID_VALUE;
    switch (type) {
    case MAJOR_VERSION:
        *value = CUBLAS_VER_MAJOR;
        return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION:
        *value = CUBLAS_VER_MINOR;
        return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL:
        *value = CUBLAS_VER_PATCH;
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

const char *cublasGetStatusName(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
        return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS:
        return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR:
        return "error detected trying to check the license";
    }
    return "unknown error";
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t workspaceSizeInBytes) {
    if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!workspace) {
        if (workspaceSizeInBytes) return CUBLAS_STATUS_INVALID_VALUE;
        handle->ws = nullptr, handle->ws_bytes = 0;
        return CUBLAS_STATUS_SUCCESS;
    }
    if ((uintptr_t)workspace % 256) return CUBLAS_STATUS_INVALID_VALUE;
    if (workspaceSizeInBytes == 0 || !rt_emu_dev_view(workspace, workspaceSizeInBytes) ||
        rt_emu_ptr_device(workspace) != handle->device)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->ws = workspace, handle->ws_bytes = workspaceSizeInBytes;
    return CUBLAS_STATUS_SUCCESS;
}

/* also resets the workspace to the library's default, as cuBLAS documents */
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
    if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = streamId;
    handle->ws = nullptr, handle->ws_bytes = 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *streamId) {
    if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!streamId) return CUBLAS_STATUS_INVALID_VALUE;
    *streamId = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t *mode) {
    if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
    if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE) return CUBLAS_STATUS_INVALID_VALUE;
    handle->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode) {
    if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->math;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    const int base = (int)mode & ~(int)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_TENSOR_OP_MATH && base != CUBLAS_PEDANTIC_MATH &&
        base != CUBLAS_TF32_TENSOR_OP_MATH && base != CUBLAS_FP32_EMULATED_BF16X9_MATH &&
        base != CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                              const float *beta, float *C, int ldc) {
    if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    auto op_ok = [](cublasOperation_t o) { return o == CUBLAS_OP_N || o == CUBLAS_OP_T || o == CUBLAS_OP_C; };
    if (!op_ok(transa) || !op_ok(transb) || m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
    const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
    if (lda < max1(ta ? k : m) || ldb < max1(tb ? n : k) || ldc < max1(m)) return CUBLAS_STATUS_INVALID_VALUE;
    if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS; /* quick return */
    const bool dev_scalars = handle->pointer_mode == CUBLAS_POINTER_MODE_DEVICE;
    const float ha = dev_scalars ? 0.0f : *alpha, hb = dev_scalars ? 0.0f : *beta;
    if (!dev_scalars && k == 0 && hb == 1.0f) return CUBLAS_STATUS_SUCCESS; /* quick return: C unchanged */
    const int dev = rt_emu_stream_device(handle->stream);
    if (dev < 0 || dev != handle->device) return CUBLAS_STATUS_EXECUTION_FAILED;
    auto *g = new gemm_args{};
    g->dev = dev, g->ta = ta, g->tb = tb, g->tf32 = tf32_math(handle->math), g->device_scalars = dev_scalars;
    g->m = m, g->n = n, g->k = k, g->lda = lda, g->ldb = ldb, g->ldc = ldc;
    g->alpha = ha, g->beta = hb, g->alpha_p = alpha, g->beta_p = beta;
    g->A = A, g->B = B, g->C = C, g->ws = handle->ws, g->ws_bytes = handle->ws_bytes;
    cudaError_t e = rt_emu_stream_enqueue(handle->stream, "cublasSgemm", gemm_op, g,
                                          [](void *p) { delete static_cast<gemm_args *>(p); });
    if (e != cudaSuccess) {
        delete g;
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

} /* extern "C" */
