/* Emulated cuBLAS 13 (docs/cuda-emulation.md): the handle calls, cublasSgemm and
 * cublasGemmEx (fp32 and bf16 operands, below), on
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
 * cublasGemmEx (cuBLAS 13's table of type combinations, the subset emulated): compute
 * type CUBLAS_COMPUTE_32F or CUBLAS_COMPUTE_32F_PEDANTIC with float alpha/beta and
 *   A, B CUDA_R_32F,  C CUDA_R_32F   (as cublasSgemm; the handle's TF32 mode applies
 *                                      under CUBLAS_COMPUTE_32F, not under _PEDANTIC)
 *   A, B CUDA_R_16BF, C CUDA_R_16BF  (bf16 read exactly, products exact in fp32, fp32
 *                                      sums, alpha/beta applied in fp32, C rounded once
 *                                      to bf16, to nearest even)
 *   A, B CUDA_R_16BF, C CUDA_R_32F   (the same, C left in fp32)
 * Everything else real cuBLAS rejects is CUBLAS_STATUS_NOT_SUPPORTED here too (A and B
 * of different types, a bf16 C with fp32 inputs, bf16 inputs under CUBLAS_COMPUTE_16F or
 * _64F or _32I); the combinations cuBLAS has but the emulation does not implement (half,
 * int8, complex, the _FAST_ and emulated compute types) are NOT_SUPPORTED as well. algo
 * must be a cublasGemmAlgo_t value (CUBLAS_GEMM_DEFAULT, ALGO0..23, the _TENSOR_OP ones;
 * else INVALID_VALUE); it does not change the arithmetic.
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
#include "core/cost_ledger.h"
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

/* bf16 (the top half of a float): round to nearest, ties to even; NaN stays a quiet NaN */
uint16_t bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float bf16_widen(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

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
    const char *call; /* "cublasSgemm", "cublasGemmEx" */
    int dev;
    bool ta, tb, tf32, device_scalars;
    bool bf16_ab, bf16_c; /* A and B (C) hold bf16, else float */
    int m, n, k, lda, ldb, ldc;
    float alpha, beta;
    const float *alpha_p, *beta_p; /* device pointer mode */
    const void *A, *B;
    void *C;
    void *ws;
    size_t ws_bytes;
};

/* "call what" for fault messages (string literals only: the pointer is kept) */
struct names {
    const char *alpha, *beta, *ws, *A, *B, *C;
};
names names_of(const char *call) {
    if (strcmp(call, "cublasGemmEx") == 0)
        return {"cublasGemmEx alpha", "cublasGemmEx beta", "cublasGemmEx workspace", "cublasGemmEx A",
                "cublasGemmEx B", "cublasGemmEx C"};
    return {"cublasSgemm alpha", "cublasSgemm beta", "cublasSgemm workspace", "cublasSgemm A", "cublasSgemm B",
            "cublasSgemm C"};
}

/* n elements of a bf16 or float operand as floats (bf16 widens exactly) */
std::vector<float> floats_of(const void *p, size_t n, bool bf16) {
    std::vector<float> v(n);
    if (bf16) {
        const uint16_t *h = static_cast<const uint16_t *>(p);
        for (size_t i = 0; i < n; i++) v[i] = bf16_widen(h[i]);
    } else {
        memcpy(v.data(), p, n * sizeof(float));
    }
    return v;
}

std::vector<float> tf32_copy(const float *p, size_t n) {
    std::vector<float> v(p, p + n);
    for (float &f : v) f = tf32(f);
    return v;
}

/* C (column-major m x n, leading dimension ldc, as floats in c) = beta * C where k == 0
 * or alpha == 0; C not read when beta == 0 */
void scale_only(const gemm_args &G, float beta, float *c) {
    for (int j = 0; j < G.n; j++)
        for (int i = 0; i < G.m; i++) {
            float *e = &c[(size_t)j * G.ldc + i];
            *e = beta == 0.0f ? 0.0f : beta * *e;
        }
}

void gemm_op(void *p) {
    if (rt_emu_ledger_count_only()) return; /* RINGTRAIN_EMU_LEDGER=count */
    const gemm_args &G = *static_cast<gemm_args *>(p);
    const names nm = names_of(G.call);
    float alpha = G.alpha, beta = G.beta;
    if (G.device_scalars) {
        alpha = *view<const float>(G.alpha_p, sizeof(float), G.dev, nm.alpha);
        beta = *view<const float>(G.beta_p, sizeof(float), G.dev, nm.beta);
    }
    if (G.ws) memset(view<unsigned char>(G.ws, G.ws_bytes, G.dev, nm.ws), 0xff,
                     G.ws_bytes < kWsScribble ? G.ws_bytes : kWsScribble);
    const size_t cn = span(G.m, G.n, G.ldc);
    if (cn == 0) return;
    const size_t ab = G.bf16_ab ? sizeof(uint16_t) : sizeof(float), cb = G.bf16_c ? sizeof(uint16_t) : sizeof(float);
    void *Cdev = view<void>(G.C, cn * cb, G.dev, nm.C);
    /* a bf16 C is computed in a float copy (read only when beta != 0), rounded once at the end */
    std::vector<float> cwork;
    float *C = static_cast<float *>(Cdev);
    if (G.bf16_c) {
        cwork = beta == 0.0f ? std::vector<float>(cn, 0.0f) : floats_of(Cdev, cn, true);
        C = cwork.data();
    }
    const size_t an = G.ta ? span(G.k, G.m, G.lda) : span(G.m, G.k, G.lda);
    const size_t bn = G.tb ? span(G.n, G.k, G.ldb) : span(G.k, G.n, G.ldb);
    if (G.k == 0 || alpha == 0.0f || an == 0 || bn == 0) { /* C = beta * C, C not read when beta == 0 */
        scale_only(G, beta, C);
    } else {
        const void *Adev = view<const void>(G.A, an * ab, G.dev, nm.A);
        const void *Bdev = view<const void>(G.B, bn * ab, G.dev, nm.B);
        const float *A = static_cast<const float *>(Adev), *B = static_cast<const float *>(Bdev);
        std::vector<float> at, bt;
        if (G.bf16_ab) { /* exact: every bf16 is a float, and a product of two is exact in fp32 */
            at = floats_of(Adev, an, true);
            bt = floats_of(Bdev, bn, true);
            A = at.data();
            B = bt.data();
        } else if (G.tf32) {
            at = tf32_copy(A, an);
            bt = tf32_copy(B, bn);
            A = at.data();
            B = bt.data();
        }
        if (beta == 0.0f) /* not read: NaN in C must not survive */
            for (int j = 0; j < G.n; j++) memset(&C[(size_t)j * G.ldc], 0, sizeof(float) * (size_t)G.m);
        cblas_sgemm(CblasColMajor, G.ta ? CblasTrans : CblasNoTrans, G.tb ? CblasTrans : CblasNoTrans, G.m, G.n, G.k,
                    alpha, A, G.lda, B, G.ldb, beta, C, G.ldc);
    }
    if (G.bf16_c) { /* only the m x n elements: the gaps of ldc > m stay untouched */
        uint16_t *h = static_cast<uint16_t *>(Cdev);
        for (int j = 0; j < G.n; j++)
            for (int i = 0; i < G.m; i++) h[(size_t)j * G.ldc + i] = bf16_round(C[(size_t)j * G.ldc + i]);
    }
}

int max1(int v) { return v > 1 ? v : 1; }

/* The ledger's cost of a GEMM from its shape and types: A (m x k) and B (k x n) read once,
 * C (m x n) written once and read too unless beta is a host 0; 2*m*n*k FLOPs, bf16 math
 * for bf16 A/B, tf32 where the math mode rounds to tf32, else fp32. */
rt_emu_cost gemm_cost(const gemm_args &G) {
    const double ab = G.bf16_ab ? 2 : 4, cb = G.bf16_c ? 2 : 4, m = G.m, n = G.n, k = G.k;
    const bool reads_c = G.device_scalars || G.beta != 0.0f;
    rt_emu_cost c{(m * k + k * n) * ab + (reads_c ? m * n * cb : 0), m * n * cb, 2 * m * n * k, RT_COST_MATH_FP32};
    if (G.bf16_ab)
        c.math = RT_COST_MATH_BF16;
    else if (G.tf32)
        c.math = RT_COST_MATH_TF32;
    return c;
}

/* The shared validation and enqueue of cublasSgemm and cublasGemmEx (types decided) */
cublasStatus_t gemm_call(cublasHandle_t handle, const char *call, cublasOperation_t transa, cublasOperation_t transb,
                         int m, int n, int k, const float *alpha, const void *A, int lda, const void *B, int ldb,
                         const float *beta, void *C, int ldc, bool bf16_ab, bool bf16_c, bool tf) {
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
    g->call = call;
    g->dev = dev, g->ta = ta, g->tb = tb, g->tf32 = tf, g->device_scalars = dev_scalars;
    g->bf16_ab = bf16_ab, g->bf16_c = bf16_c;
    g->m = m, g->n = n, g->k = k, g->lda = lda, g->ldb = ldb, g->ldc = ldc;
    g->alpha = ha, g->beta = hb, g->alpha_p = alpha, g->beta_p = beta;
    g->A = A, g->B = B, g->C = C, g->ws = handle->ws, g->ws_bytes = handle->ws_bytes;
    const rt_emu_cost cost = gemm_cost(*g);
    cudaError_t e = rt_emu_stream_enqueue(handle->stream, call, gemm_op, g,
                                          [](void *p) { delete static_cast<gemm_args *>(p); });
    if (e != cudaSuccess) {
        delete g;
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    rt_emu_ledger_record(handle->stream, RT_COST_CUBLAS, call, &cost);
    return CUBLAS_STATUS_SUCCESS;
}

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
    return gemm_call(handle, "cublasSgemm", transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, false, false,
                     tf32_math(handle_ok(handle) ? handle->math : CUBLAS_DEFAULT_MATH));
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    if (!handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    const int a = (int)algo;
    if (!(a >= -1 && a <= 23) && !(a >= 99 && a <= 115)) return CUBLAS_STATUS_INVALID_VALUE;
    if (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_PEDANTIC)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (Atype != Btype) return CUBLAS_STATUS_NOT_SUPPORTED;
    const bool bf16_ab = Atype == CUDA_R_16BF;
    if (!bf16_ab && Atype != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (Ctype != CUDA_R_32F && !(bf16_ab && Ctype == CUDA_R_16BF)) return CUBLAS_STATUS_NOT_SUPPORTED;
    const bool tf = !bf16_ab && computeType == CUBLAS_COMPUTE_32F && tf32_math(handle->math);
    return gemm_call(handle, "cublasGemmEx", transa, transb, m, n, k, static_cast<const float *>(alpha), A, lda, B,
                     ldb, static_cast<const float *>(beta), C, ldc, bf16_ab, Ctype == CUDA_R_16BF, tf);
}

} /* extern "C" */
