/* Emulated cuDNN 9 (docs/cuda-emulation.md): the legacy-API calls the project makes,
 * running on the emulated runtime's streams (emu_internal.h). Declared by
 * include/cudnn.h; linked as rt_emu_cudnn in the RINGTRAIN_CUDA=EMU build.
 *
 * Every call validates on the calling thread and returns cuDNN's status (BAD_PARAM for
 * inconsistent shapes or an undersized workspace, NOT_SUPPORTED for what the emulation
 * does not implement: anything but 4-d NCHW or NHWC float or bf16 tensors, NHWC and bf16
 * outside the convolutions, and convolutions whose x, w and y mix NCHW and NHWC),
 * copies the descriptors' contents and
 * the host scalars alpha/beta into the operation and enqueues it on the handle's stream
 * (cudnnSetStream; default the legacy stream). Inside the operation every device
 * pointer goes through rt_emu_access, so a host pointer, a freed buffer or a range past
 * the end of an allocation is a fault, as on the device; so is a buffer of another
 * device than the stream's.
 *
 * Convolution algorithms. Every pass is lowered to im2col + OpenBLAS GEMMs over groups
 * of images (see "the lowering to GEMMs" below); each supported algorithm has its own
 * reduction order, rounding points and precision, so two algorithms differ in the last
 * bits (as on a GPU) and a run that changes its algorithm choice shows it:
 *   fwd   IMPLICIT_GEMM          double (dgemm), taps (c, r, s)  no workspace
 *         IMPLICIT_PRECOMP_GEMM  float,  taps (c, r, s)          index table;   TF32 variant
 *         GEMM                   float,  taps (r, s, c) from the middle one on (wrapping)
 *                                                                one image's im2col
 *         FFT (stride 1)         float,  taps (c, r, s) reversed FFT buffers
 *   data  ALGO_0   NON-DETERMINISTIC: float, output channels in a random order per call,
 *                  then col2im (the taps (r, s) of each dx element summed in float)
 *         ALGO_1                 double (dgemm + col2im in double)   no workspace;
 *                                TF32 variant: float, channels in order
 *         FFT (stride 1)         float, gather form: one sum over the taps (r, s, k) of
 *                                dy per dx element (no col2im)   FFT buffers
 *   filt  ALGO_0   NON-DETERMINISTIC: float; groups of images in a random order, the
 *                  (image, row) pairs of a group in a random order per call
 *         ALGO_1                 double (dgemm), (n, oh, ow)     no workspace;  TF32 variant
 *                                (float)
 *         ALGO_3   NON-DETERMINISTIC: float partial sums per piece of an image (its rows
 *                  cut in up to 3 at random rows), combined in a random order per call
 *                                                                partial-sum buffers
 *         FFT (stride 1)         float,  (n, oh, ow) reversed    FFT buffers
 * (A non-deterministic algorithm varies where its random order can matter: not with a
 * single output channel, image row or piece, nor where all orders give one float sum.)
 * Everything else (DIRECT, FFT_TILING, WINOGRAD*) is CUDNN_STATUS_NOT_SUPPORTED. An
 * algorithm that needs a workspace really uses it: it checks the whole range is device
 * memory and leaves it filled with NaN bytes, so a workspace that overlaps live data
 * corrupts it (the GEMM operands themselves live in host scratch of the operation). The
 * double-accumulating algorithms are the exact sum rounded once (products of floats are
 * exact in double); the float ones are within (taps) * 2^-24 * sum|terms| of it, like the
 * CPU backend's sgemm: the tolerance against the CPU backend is that bound, in practice
 * a few 1e-7 relative to the output's scale (test_emu_cudnn checks 1e-5).
 *
 * bf16 (PSEUDO_BFLOAT16_CONFIG: x, w and y, or w, dy and dx, or x, dy and dw all
 * CUDNN_DATA_BFLOAT16, the convolution descriptor's compute type CUDNN_DATA_FLOAT; any
 * other mix of data types is CUDNN_STATUS_NOT_SUPPORTED, as is a compute type other than
 * float, which cudnnSetConvolution2dDescriptor already refuses): the operands are widened
 * exactly to float, the algorithm runs as above (its own order and precision), alpha and
 * beta are applied in float and the result is rounded once to bf16, to nearest even: the
 * rounding points of a tensor-core kernel with fp32 accumulation. Except BWD_FILTER_ALGO_0,
 * whose atomics add into the bf16 dw: its running sum is rounded after every group of
 * images (as a real GPU showed; BWD_DATA_ALGO_0's atomics are not modelled so: one
 * rounding). Only IMPLICIT_GEMM,
 * IMPLICIT_PRECOMP_GEMM, BWD_DATA_ALGO_0/1 and BWD_FILTER_ALGO_0/1 run bf16 here (FFT,
 * GEMM and BWD_FILTER_ALGO_3 are NOT_SUPPORTED for bf16: the emulation claims no more
 * than cuDNN's documented bf16 support, which may be smaller than a given release's);
 * the tensor-core variants read bf16 exactly, so they differ from the FMA ones only in
 * the summation order and precision.
 *
 * Math types (cuDNN 9 on an sm_90 device): with CUDNN_FMA_MATH on the descriptor
 * everything is plain fp32 and every perf result says CUDNN_FMA_MATH. With
 * CUDNN_DEFAULT_MATH (or TENSOR_OP) the algorithms that have tensor-core kernels are
 * listed twice, as CUDNN_TENSOR_OP_MATH (TF32: operands rounded to 10 mantissa bits,
 * faster) and as CUDNN_FMA_MATH, the others as CUDNN_FMA_MATH; running such an
 * algorithm with a non-FMA descriptor computes in TF32.
 *
 * Find*AlgorithmEx runs every candidate that fits the given workspace on the stream
 * (overwriting y / dx / dw, as cuDNN does), waits for it (counted as a host
 * synchronisation) and returns the candidates by a timing model (flops over a per-
 * algorithm rate) with a random jitter per call (RINGTRAIN_EMU_CUDNN_JITTER, a fraction,
 * default 0.15; 0 = fixed), so close algorithms swap places between processes as real
 * measurements do. Candidates that need more workspace than given come next with
 * CUDNN_STATUS_ALLOC_FAILED, then the unsupported ones. Get*_v7 gives the same list
 * without running or jitter.
 *
 * Batch norm (SPATIAL; SPATIAL_PERSISTENT computes the same): statistics per channel in
 * double (two passes), y = x * a + b in float with a = gamma*invstd, b = beta - mean*a as
 * the CPU backend does; the running variance is updated with the unbiased batch
 * variance, resultSaveInvVariance is 1/sqrt(biased var + eps), epsilon below
 * CUDNN_BN_MIN_EPSILON is BAD_PARAM. Everywhere beta == 0 means the output is not read.
 *
 * No project code is linked: the lowering is self-contained and calls OpenBLAS's cblas
 * (sgemm/dgemm) directly (the CPU backend's conv runs through OpenBLAS/oneDNN in its own
 * summation order, which the emulation does not try to reproduce).
 */
#include "core/cost_ledger.h"
#include "emu_internal.h"

#include <cblas.h>
#include <cudnn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <limits.h>
#include <math.h>
#include <mutex>
#include <random>
#include <unistd.h>
#include <vector>

/* ---- objects ------------------------------------------------------------------------- */

namespace {
constexpr uint32_t kHandleMagic = 0x48444e4e, kTensorMagic = 0x54444e4e, kFilterMagic = 0x46444e4e,
                   kConvMagic = 0x43444e4e;
}

struct cudnnContext {
    uint32_t magic;
    int device;
    cudaStream_t stream;
};
struct cudnnTensorStruct {
    uint32_t magic;
    bool set;
    int n, c, h, w;
    cudnnDataType_t type; /* CUDNN_DATA_FLOAT or CUDNN_DATA_BFLOAT16 */
    bool nhwc;            /* CUDNN_TENSOR_NHWC (else NCHW) */
};
struct cudnnFilterStruct {
    uint32_t magic;
    bool set;
    int k, c, h, w;
    cudnnDataType_t type;
    bool nhwc; /* CUDNN_TENSOR_NHWC: (k, r, s, c) in memory (else (k, c, r, s)) */
};
struct cudnnConvolutionStruct {
    uint32_t magic;
    bool set;
    int pad_h, pad_w, u, v, dil_h, dil_w;
    cudnnConvolutionMode_t mode;
    cudnnDataType_t compute;
    cudnnMathType_t math;
};

namespace {

bool handle_ok(cudnnHandle_t h) { return h && h->magic == kHandleMagic; }
bool tensor_ok(cudnnTensorDescriptor_t d) { return d && d->magic == kTensorMagic && d->set; }
bool filter_ok(cudnnFilterDescriptor_t d) { return d && d->magic == kFilterMagic && d->set; }
bool conv_ok(cudnnConvolutionDescriptor_t d) { return d && d->magic == kConvMagic && d->set; }

/* read a host float scalar (float data: alpha/beta are float) */
float host_scalar(const void *p) {
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

/* a per-call seed for the non-deterministic algorithms: differs between calls and
 * between processes */
uint64_t next_seed() {
    static std::atomic<uint64_t> counter{(uint64_t)std::chrono::steady_clock::now().time_since_epoch().count() ^
                                         ((uint64_t)getpid() << 32)};
    uint64_t z = counter.fetch_add(0x9e3779b97f4a7c15ULL) + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Enqueue fn(op) on the handle's stream; op is heap-allocated and owned by the queue
 * from here on (freed after it ran, or here when the stream is invalid). */
template <class Op>
cudnnStatus_t enqueue(cudnnHandle_t h, const char *what, void (*fn)(void *), Op *op, const rt_emu_cost &cost) {
    cudaError_t e = rt_emu_stream_enqueue(h->stream, what, fn, op, [](void *a) { delete static_cast<Op *>(a); });
    if (e != cudaSuccess) {
        delete op;
        return CUDNN_STATUS_EXECUTION_FAILED_CUDART;
    }
    rt_emu_ledger_record(h->stream, RT_COST_CUDNN, what, &cost);
    return CUDNN_STATUS_SUCCESS;
}

/* The device view of [p, p + bytes) inside an operation on device `dev`: a fault for
 * anything that is not device (or pinned) memory, or device memory of another GPU. */
template <class T> T *dev_view(const void *p, size_t bytes, int dev, const char *what) {
    if (bytes == 0) return nullptr;
    int pd = rt_emu_ptr_device(p);
    if (pd >= 0 && dev >= 0 && pd != dev)
        rt_emu_fatal("%s: pointer %p is memory of device %d, the operation runs on device %d", what, p, pd, dev);
    return static_cast<T *>(rt_emu_access(p, bytes, what));
}

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

/* TF32: keep 10 mantissa bits, round to nearest even (what tensor cores read) */
float tf32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u) return f; /* inf, nan */
    u += 0xfffu + ((u >> 13) & 1u);
    u &= 0xffffe000u;
    memcpy(&f, &u, sizeof u);
    return f;
}

/* out = alpha * v + beta * out, out not read when beta == 0 */
inline void blend(float *out, float v, float alpha, float beta) {
    *out = beta == 0.0f ? alpha * v : alpha * v + beta * *out;
}

/* ---- convolution geometry and algorithms --------------------------------------------- */

struct geom {
    int n, c, h, w;    /* x */
    int k, r, s;       /* filter (k, c, r, s) */
    int oh, ow;        /* y (n, k, oh, ow) */
    int ph, pw, u, v, dh, dw;
    bool flip;         /* CUDNN_CONVOLUTION: the filter is applied flipped */
    bool bf16;         /* x, w, y are CUDNN_DATA_BFLOAT16 (else CUDNN_DATA_FLOAT) */
    bool nhwc;         /* x, w, y are all CUDNN_TENSOR_NHWC (else all NCHW) */
    size_t x_elems() const { return (size_t)n * c * h * w; }
    size_t y_elems() const { return (size_t)n * k * oh * ow; }
    size_t w_elems() const { return (size_t)k * c * r * s; }
    double flops() const { return 2.0 * (double)y_elems() * c * r * s; }
    bool unit_stride() const { return u == 1 && v == 1 && dh == 1 && dw == 1; }
};

int out_dim(int in, int pad, int filt, int dil, int stride) {
    return 1 + (in + 2 * pad - ((filt - 1) * dil + 1)) / stride;
}

/* The geometry of x (*) w under conv; y checked against it when given. */
cudnnStatus_t make_geom(cudnnTensorDescriptor_t xd, cudnnFilterDescriptor_t wd, cudnnConvolutionDescriptor_t cd,
                        cudnnTensorDescriptor_t yd, geom *g) {
    if (!tensor_ok(xd) || !filter_ok(wd) || !conv_ok(cd)) return CUDNN_STATUS_BAD_PARAM;
    if (yd && !tensor_ok(yd)) return CUDNN_STATUS_BAD_PARAM;
    if (xd->c != wd->c) return CUDNN_STATUS_BAD_PARAM;
    geom G{};
    G.n = xd->n, G.c = xd->c, G.h = xd->h, G.w = xd->w;
    G.k = wd->k, G.r = wd->h, G.s = wd->w;
    G.ph = cd->pad_h, G.pw = cd->pad_w, G.u = cd->u, G.v = cd->v, G.dh = cd->dil_h, G.dw = cd->dil_w;
    G.flip = cd->mode == CUDNN_CONVOLUTION;
    if (G.h + 2 * G.ph < (G.r - 1) * G.dh + 1 || G.w + 2 * G.pw < (G.s - 1) * G.dw + 1) return CUDNN_STATUS_BAD_PARAM;
    G.oh = out_dim(G.h, G.ph, G.r, G.dh, G.u);
    G.ow = out_dim(G.w, G.pw, G.s, G.dw, G.v);
    if (yd && (yd->n != G.n || yd->c != G.k || yd->h != G.oh || yd->w != G.ow)) return CUDNN_STATUS_BAD_PARAM;
    *g = G;
    return CUDNN_STATUS_SUCCESS;
}

enum dir_t { DIR_FWD, DIR_DATA, DIR_FILTER };
enum ws_kind { WS_NONE, WS_INDEX, WS_IM2COL, WS_FFT, WS_PARTIAL };
enum support_t { SUP_ALWAYS, SUP_UNIT_STRIDE, SUP_NEVER };

struct algo_spec {
    int algo;
    bool deterministic;
    bool tensor_cores; /* has a tensor-core variant (TF32 for float data, bf16 for bf16) */
    bool bf16;         /* runs the bf16 configuration (x, w, y bf16, compute float) */
    double gflops;     /* FMA rate of the timing model (the TF32 variant: 10x) */
    ws_kind ws;
    support_t support;
};

const algo_spec kFwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT] = {
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, true, false, true, 38, WS_NONE, SUP_ALWAYS},
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, true, true, true, 40, WS_INDEX, SUP_ALWAYS},
    {CUDNN_CONVOLUTION_FWD_ALGO_GEMM, true, false, false, 36, WS_IM2COL, SUP_ALWAYS},
    {CUDNN_CONVOLUTION_FWD_ALGO_DIRECT, true, false, false, 0, WS_NONE, SUP_NEVER},
    {CUDNN_CONVOLUTION_FWD_ALGO_FFT, true, false, false, 60, WS_FFT, SUP_UNIT_STRIDE},
    {CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING, true, false, false, 0, WS_NONE, SUP_NEVER},
    {CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD, true, false, false, 0, WS_NONE, SUP_NEVER},
    {CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, true, false, false, 0, WS_NONE, SUP_NEVER},
};
const algo_spec kData[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT] = {
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, false, false, true, 44, WS_NONE, SUP_ALWAYS},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, true, true, true, 40, WS_NONE, SUP_ALWAYS},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT, true, false, false, 60, WS_FFT, SUP_UNIT_STRIDE},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING, true, false, false, 0, WS_NONE, SUP_NEVER},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD, true, false, false, 0, WS_NONE, SUP_NEVER},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED, true, false, false, 0, WS_NONE, SUP_NEVER},
};
const algo_spec kFilter[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT] = {
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, false, false, true, 44, WS_NONE, SUP_ALWAYS},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, true, true, true, 40, WS_NONE, SUP_ALWAYS},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT, true, false, false, 60, WS_FFT, SUP_UNIT_STRIDE},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, false, false, false, 46, WS_PARTIAL, SUP_ALWAYS},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD, true, false, false, 0, WS_NONE, SUP_NEVER},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED, true, false, false, 0, WS_NONE, SUP_NEVER},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING, true, false, false, 0, WS_NONE, SUP_NEVER},
};

int algo_count(dir_t d) {
    if (d == DIR_FWD) return CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    return d == DIR_DATA ? (int)CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT : (int)CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
}
const algo_spec *spec_of(dir_t d, int algo) {
    if (algo < 0 || algo >= algo_count(d)) return nullptr;
    return d == DIR_FWD ? &kFwd[algo] : d == DIR_DATA ? &kData[algo] : &kFilter[algo];
}
bool supported(const algo_spec *a, const geom &g) {
    if (g.bf16 && !a->bf16) return false;
    return a->support == SUP_ALWAYS || (a->support == SUP_UNIT_STRIDE && g.unit_stride());
}

/* RINGTRAIN_EMU_CUDNN_REFUSE=DIR:N[:call][,...] or DIR:nhwc (DIR fwd, data or filter; nhwc:
 * every call of that direction on NHWC tensors, any batch, as a cuDNN without an NHWC
 * kernel for the shape would): every algorithm
 * of that direction is refused at batch N, as a real cuDNN may refuse a shape the
 * algorithm search never saw (an H200, cuDNN 9.19: a bf16 backward-filter at the last,
 * smaller batch of an epoch, CUDNN_STATUS_BAD_PARAM). Plain: NOT_SUPPORTED from the
 * workspace query, the algorithm lists and the call; with ":call", only the call fails,
 * with BAD_PARAM, after a workspace query that succeeded (what the H200 showed). Read at
 * every call, so a test can set it between cases. */
enum refusal { REFUSE_NONE, REFUSE_ALL, REFUSE_CALL };
refusal refused(dir_t d, const geom &g) {
    const char *e = getenv("RINGTRAIN_EMU_CUDNN_REFUSE");
    if (!e || !*e) return REFUSE_NONE;
    static const char *const names[3] = {"fwd", "data", "filter"};
    std::string s(e);
    size_t pos = 0;
    while (pos < s.size()) {
        size_t end = s.find(',', pos);
        if (end == std::string::npos) end = s.size();
        const std::string item = s.substr(pos, end - pos);
        pos = end + 1;
        const size_t c1 = item.find(':');
        if (c1 == std::string::npos || item.substr(0, c1) != names[d]) continue;
        if (item.substr(c1 + 1) == "nhwc") { /* every NHWC call of that direction */
            if (g.nhwc) return REFUSE_ALL;
            continue;
        }
        char *rest = nullptr;
        const long n = strtol(item.c_str() + c1 + 1, &rest, 10);
        if (n != g.n) continue;
        return rest && strcmp(rest, ":call") == 0 ? REFUSE_CALL : REFUSE_ALL;
    }
    return REFUSE_NONE;
}

size_t round256(size_t b) { return (b + 255) & ~(size_t)255; }
size_t pow2_at_least(size_t v) {
    size_t p = 1;
    while (p < v) p <<= 1;
    return p;
}

size_t workspace_of(const algo_spec *a, const geom &g) {
    switch (a->ws) {
    case WS_NONE:
        return 0;
    case WS_INDEX:
        return round256(sizeof(int) * 2 * (size_t)g.c * g.r * g.s + 1024);
    case WS_IM2COL:
        return round256(sizeof(float) * (size_t)g.c * g.r * g.s * g.oh * g.ow);
    case WS_FFT: {
        size_t fh = pow2_at_least((size_t)g.h + 2 * g.ph), fw = pow2_at_least((size_t)g.w + 2 * g.pw);
        size_t plane = fh * (fw / 2 + 1) * 8; /* complex float */
        return round256(plane * ((size_t)g.n * g.c + (size_t)g.k * g.c + (size_t)g.n * g.k));
    }
    case WS_PARTIAL:
        return round256(sizeof(float) * g.w_elems() * (size_t)std::min(g.n, 8));
    }
    return 0;
}

/* ---- the lowering to GEMMs (worker thread) ------------------------------------------- */

/* Every pass is an im2col (or a gather of dy) followed by OpenBLAS GEMMs over a group of
 * images (at least kGroupCols GEMM columns), and for backward data ALGO_0/ALGO_1 a col2im.
 * The algorithms differ in the order of the GEMM's reduction dimension (the rows of the
 * im2col: which tap comes first; for the filter: which (image, row, column) comes
 * first), in where partial sums are rounded, in precision (the double algorithms use
 * dgemm on the exactly converted operands: products exact, sums in double, rounded once
 * to float) and in the TF32 rounding of the operands, so they differ in the last bits.
 * GEMM results do not depend on OpenBLAS's thread count (it splits M and N, never K):
 * the deterministic algorithms are bit-reproducible; the non-deterministic ones draw
 * their order from the per-call seed. */

constexpr size_t kGroupCols = 512;

struct tap {
    int a, r, s; /* a: the source channel (c of x, k of dy) */
};

/* (a, r, s) with a slowest, or (r, s, a) */
std::vector<tap> taps_of(int na, int nr, int ns, bool a_last) {
    std::vector<tap> t;
    t.reserve((size_t)na * nr * ns);
    if (a_last) {
        for (int r = 0; r < nr; r++)
            for (int s = 0; s < ns; s++)
                for (int a = 0; a < na; a++) t.push_back({a, r, s});
    } else {
        for (int a = 0; a < na; a++)
            for (int r = 0; r < nr; r++)
                for (int s = 0; s < ns; s++) t.push_back({a, r, s});
    }
    return t;
}

/* The sliding window of an im2col: a source image of ch planes h x w, read at
 * (o * stride - pad + tap * dilation) for the output positions o of an oh x ow grid */
struct window {
    int ch, h, w, oh, ow, ph, pw, u, v, dh, dw;
};

/* the outputs o in [*lo, *hi) whose source column o * v + base lies in [0, w) */
inline void valid_range(int base, int v, int w, int ow, int *lo, int *hi) {
    int l = base >= 0 ? 0 : (-base + v - 1) / v;
    int h = w - 1 - base < 0 ? 0 : (w - 1 - base) / v + 1;
    h = std::min(h, ow);
    *lo = std::min(l, h), *hi = h;
}

/* The GEMM columns of a group of nb images, each contributing its output rows
 * row0 ... row0 + oh - 1: row row0 + i of image j lands at columns off[j * oh + i] ...
 * + ow - 1, reversed within the row when rev. */
struct col_layout {
    int nb = 0, oh = 0, ow = 0, row0 = 0;
    bool rev = false;
    std::vector<size_t> off;
    size_t cols() const { return (size_t)nb * oh * ow; }
};

/* slot: the position of each (image, row) among the group's rows; null = in order */
col_layout layout_of(int nb, int oh, int ow, const std::vector<int> *slot, bool rev) {
    col_layout L;
    L.nb = nb, L.oh = oh, L.ow = ow, L.rev = rev;
    const size_t rows = (size_t)nb * oh;
    L.off.resize(rows);
    for (size_t i = 0; i < rows; i++) L.off[i] = (size_t)(slot ? (*slot)[i] : (int)i) * ow;
    return L;
}

/* images per GEMM: enough for kGroupCols columns of per_image each, at most n */
int group_of(int n, size_t per_image) {
    const size_t nb = (kGroupCols + per_image - 1) / std::max<size_t>(per_image, 1);
    return (int)std::min<size_t>(std::max<size_t>(nb, 1), (size_t)n);
}

/* the im2col of one image (src: q.ch planes) as image j of the group: one row per tap */
template <class T>
void im2col(const window &q, const float *src, const std::vector<tap> &taps, const col_layout &L, int j, T *col,
            bool tf) {
    const size_t ld = L.cols();
    for (size_t i = 0; i < taps.size(); i++) {
        const tap &t = taps[i];
        const float *plane = src + (size_t)t.a * q.h * q.w;
        const int base = t.s * q.dw - q.pw;
        int lo, hi;
        valid_range(base, q.v, q.w, q.ow, &lo, &hi);
        for (int ri = 0; ri < L.oh; ri++) {
            const int oh = L.row0 + ri;
            T *dst = col + i * ld + L.off[(size_t)j * L.oh + ri];
            const int ih = oh * q.u - q.ph + t.r * q.dh;
            if (ih < 0 || ih >= q.h || lo >= hi) {
                std::fill(dst, dst + q.ow, T(0));
                continue;
            }
            const float *sr = plane + (size_t)ih * q.w;
            std::fill(dst, dst + lo, T(0));
            if (tf)
                for (int ow = lo; ow < hi; ow++) dst[ow] = (T)tf32(sr[ow * q.v + base]);
            else if (q.v == 1)
                for (int ow = lo; ow < hi; ow++) dst[ow] = (T)sr[ow + base];
            else
                for (int ow = lo; ow < hi; ow++) dst[ow] = (T)sr[ow * q.v + base];
            std::fill(dst + hi, dst + q.ow, T(0));
            if (L.rev) std::reverse(dst, dst + q.ow);
        }
    }
}

/* one image's planes (ch planes of plane_rows x L.ow, e.g. dy) as image j of the group:
 * GEMM row i is plane order[i] (null: i) */
template <class T>
void gather_planes(const float *src, int ch, int plane_rows, const std::vector<int> *order, const col_layout &L, int j,
                   T *dst, bool tf) {
    const size_t ld = L.cols(), P = (size_t)plane_rows * L.ow;
    for (int i = 0; i < ch; i++) {
        const float *plane = src + (size_t)(order ? (*order)[i] : i) * P;
        for (int ri = 0; ri < L.oh; ri++) {
            T *d = dst + (size_t)i * ld + L.off[(size_t)j * L.oh + ri];
            const float *s = plane + (size_t)(L.row0 + ri) * L.ow;
            if (tf)
                for (int ow = 0; ow < L.ow; ow++) d[ow] = (T)tf32(s[ow]);
            else
                for (int ow = 0; ow < L.ow; ow++) d[ow] = (T)s[ow];
            if (L.rev) std::reverse(d, d + L.ow);
        }
    }
}

/* row-major C (m x n) = A * B + beta * C (A: m x k, or k x m when ta; B: k x n, or n x k when tb) */
void gemm(bool ta, bool tb, int m, int n, int k, const float *A, int lda, const float *B, int ldb, float beta, float *C,
          int ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, A, lda,
                B, ldb, beta, C, ldc);
}
void gemm(bool ta, bool tb, int m, int n, int k, const double *A, int lda, const double *B, int ldb, double beta,
          double *C, int ldc) {
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0, A, lda,
                B, ldb, beta, C, ldc);
}

/* the filter as a cross-correlation (CUDNN_CONVOLUTION applies it flipped) */
std::vector<float> xcorr_filter(const geom &g, const float *w) {
    std::vector<float> wf(w, w + g.w_elems());
    if (g.flip)
        for (size_t kc = 0; kc < (size_t)g.k * g.c; kc++)
            for (int r = 0; r < g.r; r++)
                for (int s = 0; s < g.s; s++)
                    wf[(kc * g.r + r) * g.s + s] = w[(kc * g.r + (g.r - 1 - r)) * g.s + (g.s - 1 - s)];
    return wf;
}

/* forward: y (k x images * oh * ow) = W (k x taps) * im2col(x) (taps x images * oh * ow),
 * the reduction over the taps in the given order */
template <class T>
void fwd_gemm(const geom &g, const float *x, const float *wf, float *y, const std::vector<tap> &taps, bool tf,
              float alpha, float beta) {
    const window q{g.c, g.h, g.w, g.oh, g.ow, g.ph, g.pw, g.u, g.v, g.dh, g.dw};
    const int nt = (int)taps.size();
    const size_t P = (size_t)g.oh * g.ow;
    std::vector<T> wm((size_t)g.k * nt);
    for (int k = 0; k < g.k; k++)
        for (int i = 0; i < nt; i++) {
            const tap &t = taps[i];
            const float v = wf[(((size_t)k * g.c + t.a) * g.r + t.r) * g.s + t.s];
            wm[(size_t)k * nt + i] = (T)(tf ? tf32(v) : v);
        }
    const int nb = group_of(g.n, P);
    std::vector<T> col((size_t)nt * nb * P), out((size_t)g.k * nb * P);
    for (int n0 = 0; n0 < g.n; n0 += nb) {
        const int m = std::min(nb, g.n - n0);
        const col_layout L = layout_of(m, g.oh, g.ow, nullptr, false);
        const int ld = (int)L.cols();
        for (int j = 0; j < m; j++) im2col(q, x + (size_t)(n0 + j) * g.c * g.h * g.w, taps, L, j, col.data(), tf);
        gemm(false, false, g.k, ld, nt, wm.data(), nt, col.data(), ld, T(0), out.data(), ld);
        for (int j = 0; j < m; j++)
            for (int k = 0; k < g.k; k++) {
                float *yr = y + ((size_t)(n0 + j) * g.k + k) * P;
                const T *o = out.data() + (size_t)k * ld + (size_t)j * P;
                for (size_t p = 0; p < P; p++) blend(&yr[p], (float)o[p], alpha, beta);
            }
    }
}

/* backward data as a scatter: dcol (taps (c, r, s) x images * oh * ow) = W^T * dy, the
 * reduction over the output channels in the order korder; then col2im, each dx element
 * summing its taps in (r, s) order (in T) */
template <class T>
void data_scatter(const geom &g, const float *wf, const float *dy, float *dx, const std::vector<int> &korder, bool tf,
                  float alpha, float beta) {
    const int nt = g.c * g.r * g.s;
    const size_t P = (size_t)g.oh * g.ow, HW = (size_t)g.h * g.w;
    std::vector<T> wm((size_t)g.k * nt);
    for (int i = 0; i < g.k; i++)
        for (int t = 0; t < nt; t++) {
            const float v = wf[(size_t)korder[i] * nt + t];
            wm[(size_t)i * nt + t] = (T)(tf ? tf32(v) : v);
        }
    const int nb = group_of(g.n, P);
    std::vector<T> dyg((size_t)g.k * nb * P), dcol((size_t)nt * nb * P), acc((size_t)g.c * HW);
    for (int n0 = 0; n0 < g.n; n0 += nb) {
        const int m = std::min(nb, g.n - n0);
        const col_layout L = layout_of(m, g.oh, g.ow, nullptr, false);
        const int ld = (int)L.cols();
        for (int j = 0; j < m; j++) gather_planes(dy + (size_t)(n0 + j) * g.k * P, g.k, g.oh, &korder, L, j, dyg.data(), tf);
        gemm(true, false, nt, ld, g.k, wm.data(), nt, dyg.data(), ld, T(0), dcol.data(), ld);
        for (int j = 0; j < m; j++) {
            std::fill(acc.begin(), acc.end(), T(0));
            for (int c = 0; c < g.c; c++)
                for (int r = 0; r < g.r; r++)
                    for (int s = 0; s < g.s; s++) {
                        const T *src = dcol.data() + (((size_t)c * g.r + r) * g.s + s) * ld + (size_t)j * P;
                        const int base = s * g.dw - g.pw;
                        int lo, hi;
                        valid_range(base, g.v, g.w, g.ow, &lo, &hi);
                        for (int oh = 0; oh < g.oh; oh++) {
                            const int ih = oh * g.u - g.ph + r * g.dh;
                            if (ih < 0 || ih >= g.h) continue;
                            T *ar = acc.data() + ((size_t)c * g.h + ih) * g.w;
                            const T *sr = src + (size_t)oh * g.ow;
                            for (int ow = lo; ow < hi; ow++) ar[ow * g.v + base] += sr[ow];
                        }
                    }
            float *dxi = dx + (size_t)(n0 + j) * g.c * HW;
            for (size_t i = 0; i < (size_t)g.c * HW; i++) blend(&dxi[i], (float)acc[i], alpha, beta);
        }
    }
}

/* backward data as a gather (unit stride and dilation): dx (c x images * h * w) =
 * W' (c x taps (r, s, k)) * im2col(dy) over the flipped window, one reduction per element */
void data_gather(const geom &g, const float *wf, const float *dy, float *dx, float alpha, float beta) {
    const window q{g.k, g.oh, g.ow, g.h, g.w, g.r - 1 - g.ph, g.s - 1 - g.pw, 1, 1, 1, 1};
    const std::vector<tap> taps = taps_of(g.k, g.r, g.s, true);
    const int nt = (int)taps.size();
    const size_t P = (size_t)g.oh * g.ow, HW = (size_t)g.h * g.w;
    std::vector<float> w2((size_t)g.c * nt);
    for (int c = 0; c < g.c; c++)
        for (int i = 0; i < nt; i++) {
            const tap &t = taps[i];
            w2[(size_t)c * nt + i] = wf[(((size_t)t.a * g.c + c) * g.r + (g.r - 1 - t.r)) * g.s + (g.s - 1 - t.s)];
        }
    const int nb = group_of(g.n, HW);
    std::vector<float> col((size_t)nt * nb * HW), out((size_t)g.c * nb * HW);
    for (int n0 = 0; n0 < g.n; n0 += nb) {
        const int m = std::min(nb, g.n - n0);
        const col_layout L = layout_of(m, g.h, g.w, nullptr, false);
        const int ld = (int)L.cols();
        for (int j = 0; j < m; j++) im2col(q, dy + (size_t)(n0 + j) * g.k * P, taps, L, j, col.data(), false);
        gemm(false, false, g.c, ld, nt, w2.data(), nt, col.data(), ld, 0.0f, out.data(), ld);
        for (int j = 0; j < m; j++)
            for (int c = 0; c < g.c; c++) {
                float *dr = dx + ((size_t)(n0 + j) * g.c + c) * HW;
                const float *o = out.data() + (size_t)c * ld + (size_t)j * HW;
                for (size_t p = 0; p < HW; p++) blend(&dr[p], o[p], alpha, beta);
            }
    }
}

/* the order of backward filter's reduction over (image, oh, ow) */
enum filt_order {
    F_FORWARD,        /* in order, groups of images accumulated in the GEMM's output */
    F_REVERSED,       /* the same, all reversed */
    F_ROWS_RANDOM,    /* groups in a random order, (image, row) pairs in a random order inside */
    F_IMAGE_PARTIALS, /* each image in up to three pieces (its rows cut at random rows), one
                         rounded partial sum per piece, the pieces added up in a random order */
};

/* backward filter: dW (k x taps (c, r, s)) = sum over groups of dy (k x cols) * im2col(x)^T */
template <class T>
void filter_gemm(const geom &g, const float *x, const float *dy, float *dw, filt_order order, bool tf, uint64_t seed,
                 float alpha, float beta) {
    const window q{g.c, g.h, g.w, g.oh, g.ow, g.ph, g.pw, g.u, g.v, g.dh, g.dw};
    const std::vector<tap> taps = taps_of(g.c, g.r, g.s, false);
    const int nt = (int)taps.size();
    const size_t P = (size_t)g.oh * g.ow;
    const int nb = order == F_IMAGE_PARTIALS ? 1 : group_of(g.n, P);
    std::mt19937_64 rng(seed);
    /* the GEMMs' pieces: (first image, images, first row, rows) */
    struct piece {
        int n0, m, row0, rows;
    };
    std::vector<piece> pieces;
    if (order == F_IMAGE_PARTIALS) {
        for (int n = 0; n < g.n; n++) { /* up to 3 pieces, cut at random rows */
            int cut[2] = {g.oh, g.oh};
            if (g.oh >= 2) cut[0] = 1 + (int)(rng() % (uint64_t)(g.oh - 1));
            if (g.oh >= 3) {
                cut[1] = 1 + (int)(rng() % (uint64_t)(g.oh - 2));
                if (cut[1] >= cut[0]) cut[1]++;
                if (cut[1] < cut[0]) std::swap(cut[0], cut[1]);
            }
            pieces.push_back({n, 1, 0, cut[0]});
            if (cut[0] < g.oh) pieces.push_back({n, 1, cut[0], cut[1] - cut[0]});
            if (cut[1] < g.oh) pieces.push_back({n, 1, cut[1], g.oh - cut[1]});
        }
    } else
        for (int n0 = 0; n0 < g.n; n0 += nb) pieces.push_back({n0, std::min(nb, g.n - n0), 0, g.oh});
    if (order == F_ROWS_RANDOM || order == F_IMAGE_PARTIALS) std::shuffle(pieces.begin(), pieces.end(), rng);
    if (order == F_REVERSED) std::reverse(pieces.begin(), pieces.end());
    std::vector<T> acc((size_t)g.k * nt), part(order == F_IMAGE_PARTIALS ? (size_t)g.k * nt : 0);
    std::vector<T> col((size_t)nt * nb * P), dyg((size_t)g.k * nb * P);
    std::vector<int> slot;
    bool first = true;
    for (const piece &pc : pieces) {
        const int rows = pc.m * pc.rows;
        slot.resize((size_t)rows);
        for (int i = 0; i < rows; i++) slot[i] = order == F_REVERSED ? rows - 1 - i : i;
        if (order == F_ROWS_RANDOM) std::shuffle(slot.begin(), slot.end(), rng);
        col_layout L = layout_of(pc.m, pc.rows, g.ow, &slot, order == F_REVERSED);
        L.row0 = pc.row0;
        const int ld = (int)L.cols();
        for (int j = 0; j < pc.m; j++) {
            im2col(q, x + (size_t)(pc.n0 + j) * g.c * g.h * g.w, taps, L, j, col.data(), tf);
            gather_planes(dy + (size_t)(pc.n0 + j) * g.k * P, g.k, g.oh, nullptr, L, j, dyg.data(), tf);
        }
        if (order == F_IMAGE_PARTIALS && !first) {
            gemm(false, true, g.k, nt, ld, dyg.data(), ld, col.data(), ld, T(0), part.data(), nt);
            for (size_t i = 0; i < acc.size(); i++) acc[i] += part[i];
        } else {
            gemm(false, true, g.k, nt, ld, dyg.data(), ld, col.data(), ld, first ? T(0) : T(1), acc.data(), nt);
        }
        /* bf16 ALGO_0: its atomics add each group's partial sums into the bf16 dw, so the
         * running sum is rounded to bf16 after every group (cuDNN 9.19 on an H200 gave dW
         * 10x the one-rounding bound off with a non-deterministic algorithm) */
        if (g.bf16 && order == F_ROWS_RANDOM)
            for (T &v : acc) v = (T)bf16_widen(bf16_round((float)v));
        first = false;
    }
    for (int k = 0; k < g.k; k++)
        for (int i = 0; i < nt; i++) {
            const tap &t = taps[i];
            const int fr = g.flip ? g.r - 1 - t.r : t.r, fs = g.flip ? g.s - 1 - t.s : t.s;
            blend(&dw[(((size_t)k * g.c + t.a) * g.r + fr) * g.s + fs], (float)acc[(size_t)k * nt + i], alpha, beta);
        }
}

/* ---- one convolution operation ------------------------------------------------------- */

struct conv_args {
    dir_t dir;
    geom g;
    int algo;
    bool tf32;
    int dev;
    float alpha, beta;
    const void *a, *b; /* fwd: x, w; data: w, dy; filter: x, dy */
    void *out;         /* y, dx, dw */
    void *ws;
    size_t ws_need;
    uint64_t seed;
};

struct dir_names {
    const char *call, *a, *b, *out, *ws;
};
const dir_names kNames[3] = {
    {"cudnnConvolutionForward", "cudnnConvolutionForward x", "cudnnConvolutionForward w", "cudnnConvolutionForward y",
     "cudnnConvolutionForward workSpace"},
    {"cudnnConvolutionBackwardData", "cudnnConvolutionBackwardData w", "cudnnConvolutionBackwardData dy",
     "cudnnConvolutionBackwardData dx", "cudnnConvolutionBackwardData workSpace"},
    {"cudnnConvolutionBackwardFilter", "cudnnConvolutionBackwardFilter x", "cudnnConvolutionBackwardFilter dy",
     "cudnnConvolutionBackwardFilter dw", "cudnnConvolutionBackwardFilter workSpace"},
};

void run_fwd(const conv_args &A, const float *x, const float *w, float *y) {
    const geom &g = A.g;
    const std::vector<float> wf = xcorr_filter(g, w);
    std::vector<tap> taps = taps_of(g.c, g.r, g.s, A.algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM);
    if (A.algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM) /* from the middle tap on, wrapping: differs from
                                                      (c, r, s) also for one channel or one valid tap */
        std::rotate(taps.begin(), taps.begin() + taps.size() / 2, taps.end());
    if (A.algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT) std::reverse(taps.begin(), taps.end());
    if (A.algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM)
        fwd_gemm<double>(g, x, wf.data(), y, taps, false, A.alpha, A.beta);
    else
        fwd_gemm<float>(g, x, wf.data(), y, taps, A.tf32, A.alpha, A.beta);
}

void run_data(const conv_args &A, const float *w, const float *dy, float *dx) {
    const geom &g = A.g;
    const std::vector<float> wf = xcorr_filter(g, w);
    if (A.algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT) {
        data_gather(g, wf.data(), dy, dx, A.alpha, A.beta);
        return;
    }
    std::vector<int> ks((size_t)g.k);
    for (int k = 0; k < g.k; k++) ks[k] = k;
    if (A.algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0) { /* atomics: any order of the output channels */
        std::mt19937_64 rng(A.seed);
        std::shuffle(ks.begin(), ks.end(), rng);
        data_scatter<float>(g, wf.data(), dy, dx, ks, false, A.alpha, A.beta);
    } else if (A.tf32)
        data_scatter<float>(g, wf.data(), dy, dx, ks, true, A.alpha, A.beta);
    else
        data_scatter<double>(g, wf.data(), dy, dx, ks, false, A.alpha, A.beta);
}

void run_filter(const conv_args &A, const float *x, const float *dy, float *dw) {
    const geom &g = A.g;
    switch (A.algo) {
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0:
        filter_gemm<float>(g, x, dy, dw, F_ROWS_RANDOM, false, A.seed, A.alpha, A.beta);
        break;
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1:
        if (A.tf32)
            filter_gemm<float>(g, x, dy, dw, F_FORWARD, true, A.seed, A.alpha, A.beta);
        else
            filter_gemm<double>(g, x, dy, dw, F_FORWARD, false, A.seed, A.alpha, A.beta);
        break;
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT:
        filter_gemm<float>(g, x, dy, dw, F_REVERSED, false, A.seed, A.alpha, A.beta);
        break;
    default: /* ALGO_3 */
        filter_gemm<float>(g, x, dy, dw, F_IMAGE_PARTIALS, false, A.seed, A.alpha, A.beta);
        break;
    }
}

/* n values (bf16 or float) as floats (exact) */
std::vector<float> widen_all(const void *p, size_t n, bool bf16) {
    std::vector<float> v(n);
    if (!bf16) {
        memcpy(v.data(), p, n * sizeof(float));
        return v;
    }
    const uint16_t *h = static_cast<const uint16_t *>(p);
    for (size_t i = 0; i < n; i++) v[i] = bf16_widen(h[i]);
    return v;
}

/* An NHWC operand (images of c channels and `plane` positions: x, y, or a filter's k
 * rows of (r, s, c)) as NCHW, or back (to_nhwc). */
std::vector<float> permute(const std::vector<float> &v, size_t images, int c, size_t plane, bool to_nhwc) {
    std::vector<float> o(v.size());
    for (size_t i = 0; i < images; i++)
        for (int ch = 0; ch < c; ch++)
            for (size_t p = 0; p < plane; p++) {
                const size_t nchw = (i * c + ch) * plane + p, nhwc = (i * plane + p) * c + ch;
                if (to_nhwc)
                    o[nhwc] = v[nchw];
                else
                    o[nchw] = v[nhwc];
            }
    return o;
}

/* The operand shapes of direction d, for the permutations: x, w, y as (images, c, plane) */
struct operand {
    size_t images;
    int c;
    size_t plane;
};
void operands(const geom &g, dir_t d, operand *a, operand *b, operand *out) {
    const operand x{(size_t)g.n, g.c, (size_t)g.h * g.w}, w{(size_t)g.k, g.c, (size_t)g.r * g.s},
        y{(size_t)g.n, g.k, (size_t)g.oh * g.ow};
    if (d == DIR_FWD)
        *a = x, *b = w, *out = y;
    else if (d == DIR_DATA)
        *a = w, *b = y, *out = x;
    else
        *a = x, *b = y, *out = w;
}

void run_dir(const conv_args &A, const float *a, const float *b, float *out) {
    if (A.dir == DIR_FWD)
        run_fwd(A, a, b, out);
    else if (A.dir == DIR_DATA)
        run_data(A, a, b, out);
    else
        run_filter(A, a, b, out);
}

void run_conv(const conv_args &A) {
    const dir_names &nm = kNames[A.dir];
    const geom &g = A.g;
    size_t a_n, b_n, out_n; /* elements */
    if (A.dir == DIR_FWD)
        a_n = g.x_elems(), b_n = g.w_elems(), out_n = g.y_elems();
    else if (A.dir == DIR_DATA)
        a_n = g.w_elems(), b_n = g.y_elems(), out_n = g.x_elems();
    else
        a_n = g.x_elems(), b_n = g.y_elems(), out_n = g.w_elems();
    const size_t eb = g.bf16 ? sizeof(uint16_t) : sizeof(float);
    const void *a = dev_view<const void>(A.a, a_n * eb, A.dev, nm.a);
    const void *b = dev_view<const void>(A.b, b_n * eb, A.dev, nm.b);
    void *out = dev_view<void>(A.out, out_n * eb, A.dev, nm.out);
    unsigned char *ws = A.ws_need ? dev_view<unsigned char>(A.ws, A.ws_need, A.dev, nm.ws) : nullptr;
    if (!g.bf16 && !g.nhwc) {
        run_dir(A, static_cast<const float *>(a), static_cast<const float *>(b), static_cast<float *>(out));
    } else {
        /* the bf16 configuration: operands read exactly as floats, the algorithm's own
         * float/double arithmetic, alpha/beta applied in float (the prior output widened
         * when beta != 0), the result rounded once to bf16. NHWC: the operands permuted
         * to NCHW around the same computation (the same bits as NCHW) */
        std::vector<float> af = widen_all(a, a_n, g.bf16), bf = widen_all(b, b_n, g.bf16);
        std::vector<float> of = A.beta != 0.0f ? widen_all(out, out_n, g.bf16) : std::vector<float>(out_n, 0.0f);
        operand oa, ob, oo;
        operands(g, A.dir, &oa, &ob, &oo);
        if (g.nhwc) {
            af = permute(af, oa.images, oa.c, oa.plane, false);
            bf = permute(bf, ob.images, ob.c, ob.plane, false);
            if (A.beta != 0.0f) of = permute(of, oo.images, oo.c, oo.plane, false);
        }
        run_dir(A, af.data(), bf.data(), of.data());
        if (g.nhwc) of = permute(of, oo.images, oo.c, oo.plane, true);
        if (g.bf16) {
            uint16_t *o = static_cast<uint16_t *>(out);
            for (size_t i = 0; i < out_n; i++) o[i] = bf16_round(of[i]);
        } else {
            memcpy(out, of.data(), out_n * sizeof(float));
        }
    }
    if (ws) memset(ws, 0xff, A.ws_need); /* scratch left behind: NaN bytes */
}

void conv_op(void *p) {
    if (rt_emu_ledger_count_only()) return; /* RINGTRAIN_EMU_LEDGER=count */
    run_conv(*static_cast<conv_args *>(p));
}

/* The ledger's cost of a convolution call, from its shapes and data types alone (never
 * the algorithm): x, w and the incoming gradient read once, the output written once
 * (read too when beta != 0), 2*N*K*C*R*S*P*Q FLOPs in every direction; bf16 data is bf16
 * math, float under CUDNN_FMA_MATH fp32, otherwise tf32 (tensor cores allowed). The
 * workspace is not counted. */
rt_emu_cost conv_cost(dir_t d, const geom &g, float beta, cudnnMathType_t math) {
    const double es = g.bf16 ? 2.0 : 4.0, x = (double)g.x_elems() * es, w = (double)g.w_elems() * es,
                 y = (double)g.y_elems() * es;
    const double out = d == DIR_FWD ? y : d == DIR_DATA ? x : w;
    rt_emu_cost c{x + w + y - out + (beta != 0.0f ? out : 0.0), out, g.flops(), RT_COST_MATH_TF32};
    if (g.bf16)
        c.math = RT_COST_MATH_BF16;
    else if (math == CUDNN_FMA_MATH)
        c.math = RT_COST_MATH_FP32;
    return c;
}

/* ---- validation shared by the three directions --------------------------------------- */

/* The geometry of a call in direction d from its descriptors (x, w, y in the forward
 * sense), and the status cuDNN gives for it. */
cudnnStatus_t dir_geom(cudnnTensorDescriptor_t xd, cudnnFilterDescriptor_t wd, cudnnConvolutionDescriptor_t cd,
                       cudnnTensorDescriptor_t yd, geom *g) {
    if (!yd) return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = make_geom(xd, wd, cd, yd, g);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    /* the configurations: FLOAT_CONFIG (x, w, y float) and PSEUDO_BFLOAT16_CONFIG (x, w,
     * y bf16); both compute in float (the only compute type a descriptor takes here).
     * Mixed data types (e.g. bf16 x with a float y or dw) are no configuration. */
    if (xd->type != wd->type || yd->type != xd->type || cd->compute != CUDNN_DATA_FLOAT)
        return CUDNN_STATUS_NOT_SUPPORTED;
    /* layouts: x, w and y all NCHW or all NHWC (cuDNN takes some mixes; the emulation
     * does not) */
    if (xd->nhwc != wd->nhwc || yd->nhwc != xd->nhwc) return CUDNN_STATUS_NOT_SUPPORTED;
    g->bf16 = xd->type == CUDNN_DATA_BFLOAT16;
    g->nhwc = xd->nhwc;
    return CUDNN_STATUS_SUCCESS;
}

bool tf32_allowed(cudnnMathType_t m) { return m != CUDNN_FMA_MATH; }

/* Validate and enqueue one convolution call. */
cudnnStatus_t conv_call(cudnnHandle_t h, dir_t d, int algo, const void *alpha, cudnnTensorDescriptor_t xd,
                        cudnnFilterDescriptor_t wd, cudnnConvolutionDescriptor_t cd, cudnnTensorDescriptor_t yd,
                        const void *a, const void *b, void *out, void *ws, size_t ws_bytes, const void *beta) {
    if (!handle_ok(h)) return CUDNN_STATUS_BAD_PARAM;
    geom g;
    cudnnStatus_t st = dir_geom(xd, wd, cd, yd, &g);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (!alpha || !beta || !a || !b || !out) return CUDNN_STATUS_BAD_PARAM;
    const algo_spec *sp = spec_of(d, algo);
    if (!sp) return CUDNN_STATUS_BAD_PARAM;
    if (!supported(sp, g)) return CUDNN_STATUS_NOT_SUPPORTED;
    if (const refusal r = refused(d, g)) return r == REFUSE_CALL ? CUDNN_STATUS_BAD_PARAM : CUDNN_STATUS_NOT_SUPPORTED;
    const size_t need = workspace_of(sp, g);
    if (need > 0 && (!ws || ws_bytes < need)) return CUDNN_STATUS_BAD_PARAM;
    auto *op = new conv_args{};
    op->dir = d, op->g = g, op->algo = algo, op->tf32 = sp->tensor_cores && tf32_allowed(cd->math);
    op->dev = rt_emu_stream_device(h->stream);
    op->alpha = host_scalar(alpha), op->beta = host_scalar(beta);
    op->a = a, op->b = b, op->out = out, op->ws = ws, op->ws_need = need, op->seed = next_seed();
    return enqueue(h, kNames[d].call, conv_op, op, conv_cost(d, g, op->beta, cd->math));
}

/* ---- algorithm lists (Find / Get) ---------------------------------------------------- */

struct candidate {
    int algo;
    cudnnStatus_t status;
    float time;
    size_t memory;
    bool deterministic;
    cudnnMathType_t math;
    bool tf32;
};

double jitter_fraction() {
    const char *e = getenv("RINGTRAIN_EMU_CUDNN_JITTER");
    if (!e || !*e) return 0.15;
    double v = atof(e);
    return v < 0 ? 0 : v > 0.9 ? 0.9 : v;
}

/* RINGTRAIN_EMU_CUDNN_FAST=DIR:ALGO[@DEV][,...] (DIR fwd, data or filter): Find measures
 * algorithm ALGO of that direction 100 times faster than the timing model says (with
 * @DEV only on emulated device DEV), so it comes first among those that ran: how a test
 * makes one algorithm, deterministic or not, the measured fastest, or two GPUs measure
 * differently. The heuristics (Get*_v7) measure nothing and do not change. Read at every
 * call. */
bool made_fast(dir_t d, int algo, int dev) {
    const char *e = getenv("RINGTRAIN_EMU_CUDNN_FAST");
    if (!e || !*e) return false;
    static const char *const names[3] = {"fwd", "data", "filter"};
    char want[32];
    for (const char *p = e; *p;) {
        const char *end = strchr(p, ',');
        const std::string item(p, end ? (size_t)(end - p) : strlen(p));
        p = end ? end + 1 : p + strlen(p);
        snprintf(want, sizeof want, "%s:%d", names[d], algo);
        const size_t at = item.find('@');
        if (item.substr(0, at) != want) continue;
        if (at == std::string::npos || atoi(item.c_str() + at + 1) == dev) return true;
    }
    return false;
}

/* Every algorithm of direction d as perf results, sorted as cuDNN sorts them: the ones
 * that ran (by time), then those that need more workspace than `ws_limit`
 * (ALLOC_FAILED), then the unsupported ones. find_dev: Find's device (-1: Get*_v7). */
std::vector<candidate> candidates(dir_t d, const geom &g, cudnnMathType_t desc_math, size_t ws_limit, bool jitter,
                                  int find_dev = -1) {
    std::vector<candidate> out;
    std::mt19937_64 rng(next_seed());
    const double jf = jitter ? jitter_fraction() : 0.0;
    std::uniform_real_distribution<double> uj(1.0 - jf, 1.0 + jf);
    for (int a = 0; a < algo_count(d); a++) {
        const algo_spec *sp = spec_of(d, a);
        if (!supported(sp, g) || refused(d, g) == REFUSE_ALL) {
            out.push_back({a, CUDNN_STATUS_NOT_SUPPORTED, -1.0f, 0, sp->deterministic, CUDNN_FMA_MATH, false});
            continue;
        }
        const size_t mem = workspace_of(sp, g);
        const cudnnStatus_t st = mem > ws_limit ? CUDNN_STATUS_ALLOC_FAILED : CUDNN_STATUS_SUCCESS;
        for (int tc = 1; tc >= 0; tc--) {
            if (tc && !(sp->tensor_cores && tf32_allowed(desc_math))) continue;
            const double rate = sp->gflops * (tc ? 10.0 : 1.0) * 1e9;
            double ms = (g.flops() / rate) * 1e3 + 0.004 + (double)mem / 2e12 * 1e3;
            ms *= jf > 0 ? uj(rng) : 1.0;
            if (find_dev >= 0 && made_fast(d, a, find_dev)) ms /= 100;
            cudnnMathType_t m = CUDNN_FMA_MATH;
            if (tc) m = desc_math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ? desc_math : CUDNN_TENSOR_OP_MATH;
            out.push_back({a, st, st == CUDNN_STATUS_SUCCESS ? (float)ms : -1.0f, mem, sp->deterministic, m, tc != 0});
        }
    }
    auto rank = [](const candidate &c) { return c.status == CUDNN_STATUS_SUCCESS ? 0 : c.status == CUDNN_STATUS_ALLOC_FAILED ? 1 : 2; };
    std::stable_sort(out.begin(), out.end(), [&](const candidate &x, const candidate &y) {
        if (rank(x) != rank(y)) return rank(x) < rank(y);
        return rank(x) == 0 && x.time < y.time;
    });
    return out;
}

template <class Perf, class Algo> void fill_perf(const std::vector<candidate> &c, int requested, int *returned, Perf *perf) {
    int n = std::min((int)c.size(), requested);
    for (int i = 0; i < n; i++) {
        Perf p{};
        p.algo = (Algo)c[i].algo;
        p.status = c[i].status;
        p.time = c[i].time;
        p.memory = c[i].memory;
        p.determinism = c[i].deterministic ? CUDNN_DETERMINISTIC : CUDNN_NON_DETERMINISTIC;
        p.mathType = c[i].math;
        perf[i] = p;
    }
    *returned = n;
}

/* Find: run every candidate that fits the workspace on the stream, wait for them */
struct find_args {
    std::vector<conv_args> runs;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
};

void find_op(void *p) {
    auto *f = static_cast<find_args *>(p);
    if (!rt_emu_ledger_count_only()) /* RINGTRAIN_EMU_LEDGER=count: the timing model only */
        for (const conv_args &a : f->runs) run_conv(a);
    std::lock_guard<std::mutex> lk(f->mu);
    f->done = true;
    f->cv.notify_all();
}

template <class Perf, class Algo>
cudnnStatus_t find_call(cudnnHandle_t h, dir_t d, cudnnTensorDescriptor_t xd, cudnnFilterDescriptor_t wd,
                        cudnnConvolutionDescriptor_t cd, cudnnTensorDescriptor_t yd, const void *a, const void *b,
                        void *out, int requested, int *returned, Perf *perf, void *ws, size_t ws_bytes) {
    if (!handle_ok(h)) return CUDNN_STATUS_BAD_PARAM;
    geom g;
    cudnnStatus_t st = dir_geom(xd, wd, cd, yd, &g);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (requested <= 0 || !returned || !perf || !a || !b || !out) return CUDNN_STATUS_BAD_PARAM;
    if (!ws) ws_bytes = 0;
    std::vector<candidate> c = candidates(d, g, cd->math, ws_bytes, true, rt_emu_stream_device(h->stream));
    find_args f;
    const int dev = rt_emu_stream_device(h->stream);
    for (const candidate &k : c) {
        if (k.status != CUDNN_STATUS_SUCCESS) continue;
        conv_args r{};
        r.dir = d, r.g = g, r.algo = k.algo, r.tf32 = k.tf32, r.dev = dev, r.alpha = 1.0f, r.beta = 0.0f;
        r.a = a, r.b = b, r.out = out, r.ws = ws, r.ws_need = k.memory, r.seed = next_seed();
        f.runs.push_back(r);
    }
    static const char *const names[3] = {"cudnnFindConvolutionForwardAlgorithmEx",
                                         "cudnnFindConvolutionBackwardDataAlgorithmEx",
                                         "cudnnFindConvolutionBackwardFilterAlgorithmEx"};
    if (rt_emu_stream_enqueue(h->stream, names[d], find_op, &f, nullptr) != cudaSuccess)
        return CUDNN_STATUS_EXECUTION_FAILED_CUDART;
    {
        std::unique_lock<std::mutex> lk(f.mu);
        f.cv.wait(lk, [&] { return f.done; });
    }
    rt_emu_count_host_sync(names[d]);
    fill_perf<Perf, Algo>(c, requested, returned, perf);
    return CUDNN_STATUS_SUCCESS;
}

template <class Perf, class Algo>
cudnnStatus_t get_v7_call(cudnnHandle_t h, dir_t d, cudnnTensorDescriptor_t xd, cudnnFilterDescriptor_t wd,
                          cudnnConvolutionDescriptor_t cd, cudnnTensorDescriptor_t yd, int requested, int *returned,
                          Perf *perf) {
    if (!handle_ok(h)) return CUDNN_STATUS_BAD_PARAM;
    geom g;
    cudnnStatus_t st = dir_geom(xd, wd, cd, yd, &g);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (requested <= 0 || !returned || !perf) return CUDNN_STATUS_BAD_PARAM;
    fill_perf<Perf, Algo>(candidates(d, g, cd->math, SIZE_MAX, false), requested, returned, perf);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t ws_size_call(cudnnHandle_t h, dir_t d, cudnnTensorDescriptor_t xd, cudnnFilterDescriptor_t wd,
                           cudnnConvolutionDescriptor_t cd, cudnnTensorDescriptor_t yd, int algo, size_t *size) {
    if (!handle_ok(h) || !size) return CUDNN_STATUS_BAD_PARAM;
    geom g;
    cudnnStatus_t st = dir_geom(xd, wd, cd, yd, &g);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    const algo_spec *sp = spec_of(d, algo);
    if (!sp) return CUDNN_STATUS_BAD_PARAM;
    if (!supported(sp, g) || refused(d, g) == REFUSE_ALL) return CUDNN_STATUS_NOT_SUPPORTED;
    *size = workspace_of(sp, g);
    return CUDNN_STATUS_SUCCESS;
}

} // namespace

/* ---- library ------------------------------------------------------------------------- */

extern "C" {

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

const char *cudnnGetErrorString(cudnnStatus_t status) {
    switch (status) {
#define RT_CASE(x)                                                                                                     \
    case x:                                                                                                            \
        return #x;
        RT_CASE(CUDNN_STATUS_SUCCESS)
        RT_CASE(CUDNN_STATUS_NOT_INITIALIZED)
        RT_CASE(CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH)
        RT_CASE(CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH)
        RT_CASE(CUDNN_STATUS_DEPRECATED)
        RT_CASE(CUDNN_STATUS_LICENSE_ERROR)
        RT_CASE(CUDNN_STATUS_RUNTIME_IN_PROGRESS)
        RT_CASE(CUDNN_STATUS_RUNTIME_FP_OVERFLOW)
        RT_CASE(CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED)
        RT_CASE(CUDNN_STATUS_BAD_PARAM)
        RT_CASE(CUDNN_STATUS_INVALID_VALUE)
        RT_CASE(CUDNN_STATUS_BAD_PARAM_NULL_POINTER)
        RT_CASE(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER)
        RT_CASE(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED)
        RT_CASE(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND)
        RT_CASE(CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT)
        RT_CASE(CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH)
        RT_CASE(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH)
        RT_CASE(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES)
        RT_CASE(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE)
        RT_CASE(CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH)
        RT_CASE(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE)
        RT_CASE(CUDNN_STATUS_NOT_SUPPORTED)
        RT_CASE(CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN)
        RT_CASE(CUDNN_STATUS_NOT_SUPPORTED_SHAPE)
        RT_CASE(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE)
        RT_CASE(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT)
        RT_CASE(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER)
        RT_CASE(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART)
        RT_CASE(CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH)
        RT_CASE(CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING)
        RT_CASE(CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE)
        RT_CASE(CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT)
        RT_CASE(CUDNN_STATUS_NOT_SUPPORTED_PADDING)
        RT_CASE(CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM)
        RT_CASE(CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API)
        RT_CASE(CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE)
        RT_CASE(CUDNN_STATUS_INTERNAL_ERROR)
        RT_CASE(CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED)
        RT_CASE(CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE)
        RT_CASE(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED)
        RT_CASE(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
        RT_CASE(CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM)
        RT_CASE(CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED)
        RT_CASE(CUDNN_STATUS_EXECUTION_FAILED)
        RT_CASE(CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER)
        RT_CASE(CUDNN_STATUS_EXECUTION_FAILED_CUBLAS)
        RT_CASE(CUDNN_STATUS_EXECUTION_FAILED_CUDART)
        RT_CASE(CUDNN_STATUS_EXECUTION_FAILED_CURAND)
#undef RT_CASE
    }
    return "CUDNN_UNKNOWN_STATUS_FOUND";
}

cudnnStatus_t cudnnCreate(cudnnHandle_t *handle) {
    if (!handle) return CUDNN_STATUS_BAD_PARAM;
    if (rt_emu_device_count() <= 0) return CUDNN_STATUS_NOT_INITIALIZED; /* no GPU */
    *handle = new cudnnContext{kHandleMagic, rt_emu_current_device(), nullptr};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
    if (!handle_ok(handle)) return CUDNN_STATUS_BAD_PARAM;
    handle->magic = 0;
    delete handle;
    return CUDNN_STATUS_SUCCESS;
}

/* a stream of another device than the handle's: cuDNN 9's stream-mismatch error */
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
    if (!handle_ok(handle)) return CUDNN_STATUS_BAD_PARAM;
    const int dev = rt_emu_stream_device(streamId);
    if (dev < 0) return CUDNN_STATUS_BAD_PARAM;
    if (streamId && dev != handle->device) return CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH;
    handle->stream = streamId;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t *streamId) {
    if (!handle_ok(handle) || !streamId) return CUDNN_STATUS_BAD_PARAM;
    *streamId = handle->stream;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- descriptors --------------------------------------------------------------------- */

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *tensorDesc) {
    if (!tensorDesc) return CUDNN_STATUS_BAD_PARAM;
    *tensorDesc = new cudnnTensorStruct{kTensorMagic, false, 0, 0, 0, 0, CUDNN_DATA_FLOAT, false};
    return CUDNN_STATUS_SUCCESS;
}

/* the dimensions and type cuDNN accepts; what the emulation implements on top */
static cudnnStatus_t check_4d(int format, cudnnDataType_t type, int n, int c, int h, int w) {
    if (n <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
    if (format < CUDNN_TENSOR_NCHW || format > CUDNN_TENSOR_NCHW_VECT_C) return CUDNN_STATUS_BAD_PARAM;
    if ((double)n * c * h * w > (double)INT_MAX) return CUDNN_STATUS_NOT_SUPPORTED;
    if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC) return CUDNN_STATUS_NOT_SUPPORTED;
    if (type != CUDNN_DATA_FLOAT && type != CUDNN_DATA_BFLOAT16) return CUDNN_STATUS_NOT_SUPPORTED;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t format,
                                         cudnnDataType_t dataType, int n, int c, int h, int w) {
    if (!d || d->magic != kTensorMagic) return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = check_4d(format, dataType, n, c, h, w);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    d->n = n, d->c = c, d->h = h, d->w = w, d->type = dataType, d->nhwc = format == CUDNN_TENSOR_NHWC, d->set = true;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetTensor4dDescriptor(const cudnnTensorDescriptor_t d, cudnnDataType_t *dataType, int *n, int *c,
                                         int *h, int *w, int *nStride, int *cStride, int *hStride, int *wStride) {
    if (!tensor_ok(d)) return CUDNN_STATUS_BAD_PARAM;
    if (dataType) *dataType = d->type;
    if (n) *n = d->n;
    if (c) *c = d->c;
    if (h) *h = d->h;
    if (w) *w = d->w;
    if (nStride) *nStride = d->c * d->h * d->w;
    if (cStride) *cStride = d->nhwc ? 1 : d->h * d->w;
    if (hStride) *hStride = d->nhwc ? d->w * d->c : d->w;
    if (wStride) *wStride = d->nhwc ? d->c : 1;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) {
    if (!d) return CUDNN_STATUS_SUCCESS;
    if (d->magic != kTensorMagic) return CUDNN_STATUS_BAD_PARAM;
    d->magic = 0;
    delete d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *filterDesc) {
    if (!filterDesc) return CUDNN_STATUS_BAD_PARAM;
    *filterDesc = new cudnnFilterStruct{kFilterMagic, false, 0, 0, 0, 0, CUDNN_DATA_FLOAT, false};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t dataType,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
    if (!d || d->magic != kFilterMagic) return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = check_4d(format, dataType, k, c, h, w);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    d->k = k, d->c = c, d->h = h, d->w = w, d->type = dataType, d->nhwc = format == CUDNN_TENSOR_NHWC, d->set = true;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetFilter4dDescriptor(const cudnnFilterDescriptor_t d, cudnnDataType_t *dataType,
                                         cudnnTensorFormat_t *format, int *k, int *c, int *h, int *w) {
    if (!filter_ok(d)) return CUDNN_STATUS_BAD_PARAM;
    if (dataType) *dataType = d->type;
    if (format) *format = d->nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    if (k) *k = d->k;
    if (c) *c = d->c;
    if (h) *h = d->h;
    if (w) *w = d->w;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) {
    if (!d) return CUDNN_STATUS_SUCCESS;
    if (d->magic != kFilterMagic) return CUDNN_STATUS_BAD_PARAM;
    d->magic = 0;
    delete d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *convDesc) {
    if (!convDesc) return CUDNN_STATUS_BAD_PARAM;
    *convDesc = new cudnnConvolutionStruct{kConvMagic, false, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                           CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d) {
    if (!d) return CUDNN_STATUS_SUCCESS;
    if (d->magic != kConvMagic) return CUDNN_STATUS_BAD_PARAM;
    d->magic = 0;
    delete d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t mathType) {
    if (!d || d->magic != kConvMagic) return CUDNN_STATUS_BAD_PARAM;
    if (mathType < CUDNN_DEFAULT_MATH || mathType > CUDNN_FMA_MATH) return CUDNN_STATUS_BAD_PARAM;
    d->math = mathType;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t *mathType) {
    if (!d || d->magic != kConvMagic || !mathType) return CUDNN_STATUS_BAD_PARAM;
    *mathType = d->math;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w, int u, int v,
                                              int dilation_h, int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t computeType) {
    if (!d || d->magic != kConvMagic) return CUDNN_STATUS_BAD_PARAM;
    if (pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 || dilation_w <= 0) return CUDNN_STATUS_BAD_PARAM;
    if (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION) return CUDNN_STATUS_BAD_PARAM;
    if (computeType != CUDNN_DATA_FLOAT) return CUDNN_STATUS_NOT_SUPPORTED;
    d->pad_h = pad_h, d->pad_w = pad_w, d->u = u, d->v = v, d->dil_h = dilation_h, d->dil_w = dilation_w;
    d->mode = mode, d->compute = computeType, d->set = true;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolution2dDescriptor(const cudnnConvolutionDescriptor_t d, int *pad_h, int *pad_w, int *u,
                                              int *v, int *dilation_h, int *dilation_w, cudnnConvolutionMode_t *mode,
                                              cudnnDataType_t *computeType) {
    if (!conv_ok(d)) return CUDNN_STATUS_BAD_PARAM;
    if (pad_h) *pad_h = d->pad_h;
    if (pad_w) *pad_w = d->pad_w;
    if (u) *u = d->u;
    if (v) *v = d->v;
    if (dilation_h) *dilation_h = d->dil_h;
    if (dilation_w) *dilation_w = d->dil_w;
    if (mode) *mode = d->mode;
    if (computeType) *computeType = d->compute;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t convDesc,
                                                    const cudnnTensorDescriptor_t inputTensorDesc,
                                                    const cudnnFilterDescriptor_t filterDesc, int *n, int *c, int *h,
                                                    int *w) {
    geom g;
    cudnnStatus_t st = make_geom(inputTensorDesc, filterDesc, convDesc, nullptr, &g);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (!n || !c || !h || !w) return CUDNN_STATUS_BAD_PARAM;
    *n = g.n, *c = g.k, *h = g.oh, *w = g.ow;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- convolution --------------------------------------------------------------------- */

cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(cudnnHandle_t handle, int *count) {
    if (!handle_ok(handle) || !count) return CUDNN_STATUS_BAD_PARAM;
    *count = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
                                                     const cudnnFilterDescriptor_t filterDesc,
                                                     const cudnnConvolutionDescriptor_t convDesc,
                                                     const cudnnTensorDescriptor_t destDesc,
                                                     const int requestedAlgoCount, int *returnedAlgoCount,
                                                     cudnnConvolutionFwdAlgoPerf_t *perfResults) {
    return get_v7_call<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
        handle, DIR_FWD, srcDesc, filterDesc, convDesc, destDesc, requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                     const void *x, const cudnnFilterDescriptor_t wDesc, const void *w,
                                                     const cudnnConvolutionDescriptor_t convDesc,
                                                     const cudnnTensorDescriptor_t yDesc, void *y,
                                                     const int requestedAlgoCount, int *returnedAlgoCount,
                                                     cudnnConvolutionFwdAlgoPerf_t *perfResults, void *workSpace,
                                                     size_t workSpaceSizeInBytes) {
    return find_call<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
        handle, DIR_FWD, xDesc, wDesc, convDesc, yDesc, x, w, y, requestedAlgoCount, returnedAlgoCount, perfResults,
        workSpace, workSpaceSizeInBytes);
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                      const cudnnFilterDescriptor_t wDesc,
                                                      const cudnnConvolutionDescriptor_t convDesc,
                                                      const cudnnTensorDescriptor_t yDesc,
                                                      cudnnConvolutionFwdAlgo_t algo, size_t *sizeInBytes) {
    return ws_size_call(handle, DIR_FWD, xDesc, wDesc, convDesc, yDesc, algo, sizeInBytes);
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t xDesc,
                                      const void *x, const cudnnFilterDescriptor_t wDesc, const void *w,
                                      const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
                                      void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
                                      const cudnnTensorDescriptor_t yDesc, void *y) {
    return conv_call(handle, DIR_FWD, algo, alpha, xDesc, wDesc, convDesc, yDesc, x, w, y, workSpace,
                     workSpaceSizeInBytes, beta);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnnHandle_t handle, int *count) {
    if (!handle_ok(handle) || !count) return CUDNN_STATUS_BAD_PARAM;
    *count = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t handle,
                                                          const cudnnFilterDescriptor_t filterDesc,
                                                          const cudnnTensorDescriptor_t diffDesc,
                                                          const cudnnConvolutionDescriptor_t convDesc,
                                                          const cudnnTensorDescriptor_t gradDesc,
                                                          const int requestedAlgoCount, int *returnedAlgoCount,
                                                          cudnnConvolutionBwdDataAlgoPerf_t *perfResults) {
    return get_v7_call<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
        handle, DIR_DATA, gradDesc, filterDesc, convDesc, diffDesc, requestedAlgoCount, returnedAlgoCount,
        perfResults);
}

cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc,
                                                          const void *w, const cudnnTensorDescriptor_t dyDesc,
                                                          const void *dy, const cudnnConvolutionDescriptor_t convDesc,
                                                          const cudnnTensorDescriptor_t dxDesc, void *dx,
                                                          const int requestedAlgoCount, int *returnedAlgoCount,
                                                          cudnnConvolutionBwdDataAlgoPerf_t *perfResults,
                                                          void *workSpace, size_t workSpaceSizeInBytes) {
    return find_call<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
        handle, DIR_DATA, dxDesc, wDesc, convDesc, dyDesc, w, dy, dx, requestedAlgoCount, returnedAlgoCount,
        perfResults, workSpace, workSpaceSizeInBytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc,
                                                           const cudnnTensorDescriptor_t dyDesc,
                                                           const cudnnConvolutionDescriptor_t convDesc,
                                                           const cudnnTensorDescriptor_t dxDesc,
                                                           cudnnConvolutionBwdDataAlgo_t algo, size_t *sizeInBytes) {
    return ws_size_call(handle, DIR_DATA, dxDesc, wDesc, convDesc, dyDesc, algo, sizeInBytes);
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void *alpha,
                                           const cudnnFilterDescriptor_t wDesc, const void *w,
                                           const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                           const cudnnConvolutionDescriptor_t convDesc,
                                           cudnnConvolutionBwdDataAlgo_t algo, void *workSpace,
                                           size_t workSpaceSizeInBytes, const void *beta,
                                           const cudnnTensorDescriptor_t dxDesc, void *dx) {
    return conv_call(handle, DIR_DATA, algo, alpha, dxDesc, wDesc, convDesc, dyDesc, w, dy, dx, workSpace,
                     workSpaceSizeInBytes, beta);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnnHandle_t handle, int *count) {
    if (!handle_ok(handle) || !count) return CUDNN_STATUS_BAD_PARAM;
    *count = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t handle,
                                                            const cudnnTensorDescriptor_t srcDesc,
                                                            const cudnnTensorDescriptor_t diffDesc,
                                                            const cudnnConvolutionDescriptor_t convDesc,
                                                            const cudnnFilterDescriptor_t gradDesc,
                                                            const int requestedAlgoCount, int *returnedAlgoCount,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t *perfResults) {
    return get_v7_call<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
        handle, DIR_FILTER, srcDesc, gradDesc, convDesc, diffDesc, requestedAlgoCount, returnedAlgoCount,
        perfResults);
}

cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                            const void *x, const cudnnTensorDescriptor_t dyDesc,
                                                            const void *y, const cudnnConvolutionDescriptor_t convDesc,
                                                            const cudnnFilterDescriptor_t dwDesc, void *dw,
                                                            const int requestedAlgoCount, int *returnedAlgoCount,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t *perfResults,
                                                            void *workSpace, size_t workSpaceSizeInBytes) {
    return find_call<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
        handle, DIR_FILTER, xDesc, dwDesc, convDesc, dyDesc, x, y, dw, requestedAlgoCount, returnedAlgoCount,
        perfResults, workSpace, workSpaceSizeInBytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                             const cudnnTensorDescriptor_t dyDesc,
                                                             const cudnnConvolutionDescriptor_t convDesc,
                                                             const cudnnFilterDescriptor_t gradDesc,
                                                             cudnnConvolutionBwdFilterAlgo_t algo,
                                                             size_t *sizeInBytes) {
    return ws_size_call(handle, DIR_FILTER, xDesc, gradDesc, convDesc, dyDesc, algo, sizeInBytes);
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha,
                                             const cudnnTensorDescriptor_t xDesc, const void *x,
                                             const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                             const cudnnConvolutionDescriptor_t convDesc,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void *workSpace,
                                             size_t workSpaceSizeInBytes, const void *beta,
                                             const cudnnFilterDescriptor_t dwDesc, void *dw) {
    return conv_call(handle, DIR_FILTER, algo, alpha, xDesc, dwDesc, convDesc, dyDesc, x, dy, dw, workSpace,
                     workSpaceSizeInBytes, beta);
}

} /* extern "C" */

/* ---- bias, tensor add, batch norm ---------------------------------------------------- */

namespace {

struct dims {
    int n, c, h, w;
    size_t elems() const { return (size_t)n * c * h * w; }
};
dims dims_of(const cudnnTensorStruct *t) { return {t->n, t->c, t->h, t->w}; }
bool same(const dims &a, const dims &b) { return a.n == b.n && a.c == b.c && a.h == b.h && a.w == b.w; }
bool is_param(const dims &p, int c) { return p.n == 1 && p.c == c && p.h == 1 && p.w == 1; }
/* bias, tensor add and batch norm are emulated for float NCHW data only (cuDNN has more) */
bool float_data(const cudnnTensorStruct *t) { return t->type == CUDNN_DATA_FLOAT && !t->nhwc; }

struct bias_args {
    dims dy;
    int dev;
    float alpha, beta;
    const void *dyp;
    void *db;
};

void bias_op(void *p) {
    if (rt_emu_ledger_count_only()) return;
    const bias_args &A = *static_cast<bias_args *>(p);
    const size_t P = (size_t)A.dy.h * A.dy.w;
    const float *dy = dev_view<const float>(A.dyp, A.dy.elems() * sizeof(float), A.dev, "cudnnConvolutionBackwardBias dy");
    float *db = dev_view<float>(A.db, (size_t)A.dy.c * sizeof(float), A.dev, "cudnnConvolutionBackwardBias db");
    for (int k = 0; k < A.dy.c; k++) {
        double s = 0;
        for (int n = 0; n < A.dy.n; n++) {
            const float *d = dy + ((size_t)n * A.dy.c + k) * P;
            for (size_t i = 0; i < P; i++) s += d[i];
        }
        blend(&db[k], (float)s, A.alpha, A.beta);
    }
}

struct add_args {
    dims a, c;
    int dev;
    float alpha, beta;
    const void *A;
    void *C;
};

void add_op(void *p) {
    if (rt_emu_ledger_count_only()) return;
    const add_args &G = *static_cast<add_args *>(p);
    const float *a = dev_view<const float>(G.A, G.a.elems() * sizeof(float), G.dev, "cudnnAddTensor A");
    float *c = dev_view<float>(G.C, G.c.elems() * sizeof(float), G.dev, "cudnnAddTensor C");
    size_t i = 0;
    for (int n = 0; n < G.c.n; n++)
        for (int ch = 0; ch < G.c.c; ch++)
            for (int h = 0; h < G.c.h; h++)
                for (int w = 0; w < G.c.w; w++, i++) {
                    const int an = G.a.n == 1 ? 0 : n, ac = G.a.c == 1 ? 0 : ch, ah = G.a.h == 1 ? 0 : h,
                              aw = G.a.w == 1 ? 0 : w;
                    const float av = a[(((size_t)an * G.a.c + ac) * G.a.h + ah) * G.a.w + aw];
                    blend(&c[i], av, G.alpha, G.beta);
                }
}

enum bn_kind { BN_TRAIN, BN_INFER, BN_BACKWARD };

struct bn_args {
    bn_kind kind;
    dims x;
    int dev;
    float alpha, beta;   /* data blend (backward: alphaDataDiff, betaDataDiff) */
    float palpha, pbeta; /* backward: alphaParamDiff, betaParamDiff */
    double factor, eps;
    const void *xp, *dyp, *scale, *bias, *mean_in, *var_in; /* mean_in/var_in: estimated (infer), saved (backward) */
    void *y, *run_mean, *run_var, *save_mean, *save_invvar, *dscale, *dbias;
};

/* the per-channel plane i of image n */
inline size_t plane(const dims &d, int n, int c) { return ((size_t)n * d.c + c) * d.h * d.w; }

/* batch mean and biased variance of channel c, in double, two passes */
void channel_stats(const dims &d, const float *x, int c, double *mean, double *var) {
    const size_t P = (size_t)d.h * d.w;
    const double m = (double)d.n * (double)P;
    double s = 0;
    for (int n = 0; n < d.n; n++)
        for (size_t i = 0; i < P; i++) s += x[plane(d, n, c) + i];
    const double mu = s / m;
    double ss = 0;
    for (int n = 0; n < d.n; n++)
        for (size_t i = 0; i < P; i++) {
            const double t = x[plane(d, n, c) + i] - mu;
            ss += t * t;
        }
    *mean = mu;
    *var = ss / m;
}

/* y = x * a + b (float, as the CPU backend), blended */
void bn_apply(const bn_args &A, const float *x, float *y, int c, double mean, double invstd, float gamma, float beta) {
    const size_t P = (size_t)A.x.h * A.x.w;
    const float a = (float)(gamma * invstd), b = (float)(beta - mean * gamma * invstd);
    for (int n = 0; n < A.x.n; n++) {
        const size_t o = plane(A.x, n, c);
        for (size_t i = 0; i < P; i++) blend(&y[o + i], x[o + i] * a + b, A.alpha, A.beta);
    }
}

void bn_forward(const bn_args &A) {
    const bool train = A.kind == BN_TRAIN;
    const char *what_x = train ? "cudnnBatchNormalizationForwardTraining x" : "cudnnBatchNormalizationForwardInference x";
    const size_t xb = A.x.elems() * sizeof(float), pb = (size_t)A.x.c * sizeof(float);
    const float *x = dev_view<const float>(A.xp, xb, A.dev, what_x);
    float *y = dev_view<float>(A.y, xb, A.dev, "cudnnBatchNormalization y");
    const float *scale = dev_view<const float>(A.scale, pb, A.dev, "cudnnBatchNormalization bnScale");
    const float *bias = dev_view<const float>(A.bias, pb, A.dev, "cudnnBatchNormalization bnBias");
    const double m = (double)A.x.n * A.x.h * A.x.w;
    float *rm = nullptr, *rv = nullptr, *sm = nullptr, *si = nullptr;
    const float *em = nullptr, *ev = nullptr;
    if (train) {
        if (A.run_mean) rm = dev_view<float>(A.run_mean, pb, A.dev, "cudnnBatchNormalizationForwardTraining resultRunningMean");
        if (A.run_var) rv = dev_view<float>(A.run_var, pb, A.dev, "cudnnBatchNormalizationForwardTraining resultRunningVariance");
        if (A.save_mean) sm = dev_view<float>(A.save_mean, pb, A.dev, "cudnnBatchNormalizationForwardTraining resultSaveMean");
        if (A.save_invvar)
            si = dev_view<float>(A.save_invvar, pb, A.dev, "cudnnBatchNormalizationForwardTraining resultSaveInvVariance");
    } else {
        em = dev_view<const float>(A.mean_in, pb, A.dev, "cudnnBatchNormalizationForwardInference estimatedMean");
        ev = dev_view<const float>(A.var_in, pb, A.dev, "cudnnBatchNormalizationForwardInference estimatedVariance");
    }
    for (int c = 0; c < A.x.c; c++) {
        double mean, var;
        if (train) {
            channel_stats(A.x, x, c, &mean, &var);
            const double unbiased = m > 1 ? var * m / (m - 1.0) : var;
            if (rm) rm[c] = (float)((1.0 - A.factor) * rm[c] + A.factor * mean);
            if (rv) rv[c] = (float)((1.0 - A.factor) * rv[c] + A.factor * unbiased);
        } else {
            mean = em[c];
            var = ev[c];
        }
        const double invstd = 1.0 / sqrt(var + A.eps);
        if (sm) sm[c] = (float)mean;
        if (si) si[c] = (float)invstd;
        bn_apply(A, x, y, c, mean, invstd, scale[c], bias[c]);
    }
}

void bn_backward(const bn_args &A) {
    const size_t xb = A.x.elems() * sizeof(float), pb = (size_t)A.x.c * sizeof(float);
    const size_t P = (size_t)A.x.h * A.x.w;
    const float *x = dev_view<const float>(A.xp, xb, A.dev, "cudnnBatchNormalizationBackward x");
    const float *dy = dev_view<const float>(A.dyp, xb, A.dev, "cudnnBatchNormalizationBackward dy");
    float *dx = dev_view<float>(A.y, xb, A.dev, "cudnnBatchNormalizationBackward dx");
    const float *scale = dev_view<const float>(A.scale, pb, A.dev, "cudnnBatchNormalizationBackward bnScale");
    float *ds = dev_view<float>(A.dscale, pb, A.dev, "cudnnBatchNormalizationBackward dBnScaleResult");
    float *dbias = dev_view<float>(A.dbias, pb, A.dev, "cudnnBatchNormalizationBackward dBnBiasResult");
    const float *smean = A.mean_in ? dev_view<const float>(A.mean_in, pb, A.dev, "cudnnBatchNormalizationBackward savedMean") : nullptr;
    const float *sinv =
        A.var_in ? dev_view<const float>(A.var_in, pb, A.dev, "cudnnBatchNormalizationBackward savedInvVariance") : nullptr;
    const double m = (double)A.x.n * (double)P;
    for (int c = 0; c < A.x.c; c++) {
        double mean, invstd;
        if (smean) {
            mean = smean[c];
            invstd = sinv[c];
        } else {
            double var;
            channel_stats(A.x, x, c, &mean, &var);
            invstd = 1.0 / sqrt(var + A.eps);
        }
        double sdy = 0, sdyx = 0;
        for (int n = 0; n < A.x.n; n++) {
            const size_t o = plane(A.x, n, c);
            for (size_t i = 0; i < P; i++) {
                sdy += dy[o + i];
                sdyx += (double)dy[o + i] * (x[o + i] - mean);
            }
        }
        sdyx *= invstd; /* sum dy * xhat */
        blend(&ds[c], (float)sdyx, A.palpha, A.pbeta);
        blend(&dbias[c], (float)sdy, A.palpha, A.pbeta);
        const double k = scale[c] * invstd;
        for (int n = 0; n < A.x.n; n++) {
            const size_t o = plane(A.x, n, c);
            for (size_t i = 0; i < P; i++) {
                const double xhat = (x[o + i] - mean) * invstd;
                blend(&dx[o + i], (float)(k * (dy[o + i] - sdy / m - xhat * sdyx / m)), A.alpha, A.beta);
            }
        }
    }
}

void bn_op(void *p) {
    if (rt_emu_ledger_count_only()) return;
    const bn_args &A = *static_cast<bn_args *>(p);
    if (A.kind == BN_BACKWARD)
        bn_backward(A);
    else
        bn_forward(A);
}

/* The ledger's cost of a batch-norm call: x (and dy) read once, y (dx) written once (read
 * too when beta != 0), the per-channel vectors (scale, bias, running and saved pairs, the
 * parameter gradients) each read or written once when given; FLOPs per element: training
 * forward 7 (sum and sum of squares 3, the normalisation 4), inference 4, backward 9
 * (the two sums 3, dx 6). */
rt_emu_cost bn_cost(const bn_args &A) {
    const double e = (double)A.x.elems(), c = A.x.c, out = A.beta != 0.0f ? e : 0;
    auto vec = [c](const void *p) { return p ? 4 * c : 0.0; };
    rt_emu_cost k{0, 4 * e, 0, RT_COST_MATH_FP32};
    if (A.kind == BN_TRAIN) {
        k.bytes_read = 4 * (e + out) + vec(A.scale) + vec(A.bias) + vec(A.run_mean) + vec(A.run_var);
        k.bytes_written += vec(A.run_mean) + vec(A.run_var) + vec(A.save_mean) + vec(A.save_invvar);
        k.flops = 7 * e;
    } else if (A.kind == BN_INFER) {
        k.bytes_read = 4 * (e + out) + vec(A.scale) + vec(A.bias) + vec(A.mean_in) + vec(A.var_in);
        k.flops = 4 * e;
    } else {
        const double pout = A.pbeta != 0.0f ? 2 * 4 * c : 0;
        k.bytes_read = 4 * (2 * e + out) + vec(A.scale) + vec(A.mean_in) + vec(A.var_in) + pout;
        k.bytes_written += vec(A.dscale) + vec(A.dbias);
        k.flops = 9 * e;
    }
    return k;
}

/* shared checks of the batch-norm calls: mode, x/y shapes, the parameter descriptor */
cudnnStatus_t bn_check(cudnnHandle_t h, cudnnBatchNormMode_t mode, cudnnTensorDescriptor_t xd,
                       cudnnTensorDescriptor_t yd, cudnnTensorDescriptor_t pd, double eps) {
    if (!handle_ok(h)) return CUDNN_STATUS_BAD_PARAM;
    if (!tensor_ok(xd) || !tensor_ok(yd) || !tensor_ok(pd)) return CUDNN_STATUS_BAD_PARAM;
    if (mode == CUDNN_BATCHNORM_PER_ACTIVATION) return CUDNN_STATUS_NOT_SUPPORTED;
    if (mode != CUDNN_BATCHNORM_SPATIAL && mode != CUDNN_BATCHNORM_SPATIAL_PERSISTENT) return CUDNN_STATUS_BAD_PARAM;
    if (!same(dims_of(xd), dims_of(yd))) return CUDNN_STATUS_BAD_PARAM;
    if (!is_param(dims_of(pd), xd->c)) return CUDNN_STATUS_BAD_PARAM;
    if (!(eps >= CUDNN_BN_MIN_EPSILON)) return CUDNN_STATUS_BAD_PARAM;
    if (!float_data(xd) || !float_data(yd) || !float_data(pd)) return CUDNN_STATUS_NOT_SUPPORTED;
    return CUDNN_STATUS_SUCCESS;
}

} // namespace

extern "C" {

cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t handle, const void *alpha,
                                           const cudnnTensorDescriptor_t dyDesc, const void *dy, const void *beta,
                                           const cudnnTensorDescriptor_t dbDesc, void *db) {
    if (!handle_ok(handle) || !tensor_ok(dyDesc) || !tensor_ok(dbDesc)) return CUDNN_STATUS_BAD_PARAM;
    if (!alpha || !beta || !dy || !db) return CUDNN_STATUS_BAD_PARAM;
    if (!float_data(dyDesc) || !float_data(dbDesc)) return CUDNN_STATUS_NOT_SUPPORTED;
    if (!is_param(dims_of(dbDesc), dyDesc->c)) return CUDNN_STATUS_BAD_PARAM;
    auto *op = new bias_args{dims_of(dyDesc), rt_emu_stream_device(handle->stream), host_scalar(alpha),
                             host_scalar(beta), dy, db};
    const double e = (double)op->dy.elems(), c = op->dy.c;
    const rt_emu_cost cost{4 * (e + (op->beta != 0.0f ? c : 0)), 4 * c, e, RT_COST_MATH_FP32};
    return enqueue(handle, "cudnnConvolutionBackwardBias", bias_op, op, cost);
}

cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t aDesc,
                             const void *A, const void *beta, const cudnnTensorDescriptor_t cDesc, void *C) {
    if (!handle_ok(handle) || !tensor_ok(aDesc) || !tensor_ok(cDesc)) return CUDNN_STATUS_BAD_PARAM;
    if (!alpha || !beta || !A || !C) return CUDNN_STATUS_BAD_PARAM;
    if (!float_data(aDesc) || !float_data(cDesc)) return CUDNN_STATUS_NOT_SUPPORTED;
    const dims a = dims_of(aDesc), c = dims_of(cDesc);
    if ((a.n != c.n && a.n != 1) || (a.c != c.c && a.c != 1) || (a.h != c.h && a.h != 1) || (a.w != c.w && a.w != 1))
        return CUDNN_STATUS_BAD_PARAM;
    auto *op = new add_args{a, c, rt_emu_stream_device(handle->stream), host_scalar(alpha), host_scalar(beta), A, C};
    const double ce = (double)c.elems(), reads = (double)a.elems() + (op->beta != 0.0f ? ce : 0);
    const rt_emu_cost cost{4 * reads, 4 * ce, ce * (op->beta != 0.0f ? 3 : 1), RT_COST_MATH_FP32};
    return enqueue(handle, "cudnnAddTensor", add_op, op, cost);
}

cudnnStatus_t cudnnBatchNormalizationForwardInference(cudnnHandle_t handle, cudnnBatchNormMode_t mode,
                                                      const void *alpha, const void *beta,
                                                      const cudnnTensorDescriptor_t xDesc, const void *x,
                                                      const cudnnTensorDescriptor_t yDesc, void *y,
                                                      const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc,
                                                      const void *bnScale, const void *bnBias,
                                                      const void *estimatedMean, const void *estimatedVariance,
                                                      double epsilon) {
    cudnnStatus_t st = bn_check(handle, mode, xDesc, yDesc, bnScaleBiasMeanVarDesc, epsilon);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (!alpha || !beta || !x || !y || !bnScale || !bnBias || !estimatedMean || !estimatedVariance)
        return CUDNN_STATUS_BAD_PARAM;
    auto *op = new bn_args{};
    op->kind = BN_INFER, op->x = dims_of(xDesc), op->dev = rt_emu_stream_device(handle->stream);
    op->alpha = host_scalar(alpha), op->beta = host_scalar(beta), op->eps = epsilon;
    op->xp = x, op->y = y, op->scale = bnScale, op->bias = bnBias, op->mean_in = estimatedMean,
    op->var_in = estimatedVariance;
    return enqueue(handle, "cudnnBatchNormalizationForwardInference", bn_op, op, bn_cost(*op));
}

cudnnStatus_t cudnnBatchNormalizationForwardTraining(cudnnHandle_t handle, cudnnBatchNormMode_t mode,
                                                     const void *alpha, const void *beta,
                                                     const cudnnTensorDescriptor_t xDesc, const void *x,
                                                     const cudnnTensorDescriptor_t yDesc, void *y,
                                                     const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc,
                                                     const void *bnScale, const void *bnBias,
                                                     double exponentialAverageFactor, void *resultRunningMean,
                                                     void *resultRunningVariance, double epsilon,
                                                     void *resultSaveMean, void *resultSaveInvVariance) {
    cudnnStatus_t st = bn_check(handle, mode, xDesc, yDesc, bnScaleBiasMeanVarDesc, epsilon);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (!alpha || !beta || !x || !y || !bnScale || !bnBias) return CUDNN_STATUS_BAD_PARAM;
    /* the running pair and the saved pair: both or neither */
    if (!resultRunningMean != !resultRunningVariance || !resultSaveMean != !resultSaveInvVariance)
        return CUDNN_STATUS_BAD_PARAM;
    auto *op = new bn_args{};
    op->kind = BN_TRAIN, op->x = dims_of(xDesc), op->dev = rt_emu_stream_device(handle->stream);
    op->alpha = host_scalar(alpha), op->beta = host_scalar(beta), op->eps = epsilon;
    op->factor = exponentialAverageFactor;
    op->xp = x, op->y = y, op->scale = bnScale, op->bias = bnBias;
    op->run_mean = resultRunningMean, op->run_var = resultRunningVariance;
    op->save_mean = resultSaveMean, op->save_invvar = resultSaveInvVariance;
    return enqueue(handle, "cudnnBatchNormalizationForwardTraining", bn_op, op, bn_cost(*op));
}

cudnnStatus_t cudnnBatchNormalizationBackward(cudnnHandle_t handle, cudnnBatchNormMode_t mode,
                                              const void *alphaDataDiff, const void *betaDataDiff,
                                              const void *alphaParamDiff, const void *betaParamDiff,
                                              const cudnnTensorDescriptor_t xDesc, const void *x,
                                              const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                              const cudnnTensorDescriptor_t dxDesc, void *dx,
                                              const cudnnTensorDescriptor_t dBnScaleBiasDesc, const void *bnScale,
                                              void *dBnScaleResult, void *dBnBiasResult, double epsilon,
                                              const void *savedMean, const void *savedInvVariance) {
    cudnnStatus_t st = bn_check(handle, mode, xDesc, dxDesc, dBnScaleBiasDesc, epsilon);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (!tensor_ok(dyDesc) || !same(dims_of(xDesc), dims_of(dyDesc))) return CUDNN_STATUS_BAD_PARAM;
    if (!float_data(dyDesc)) return CUDNN_STATUS_NOT_SUPPORTED;
    if (!alphaDataDiff || !betaDataDiff || !alphaParamDiff || !betaParamDiff || !x || !dy || !dx || !bnScale ||
        !dBnScaleResult || !dBnBiasResult)
        return CUDNN_STATUS_BAD_PARAM;
    if (!savedMean != !savedInvVariance) return CUDNN_STATUS_BAD_PARAM;
    auto *op = new bn_args{};
    op->kind = BN_BACKWARD, op->x = dims_of(xDesc), op->dev = rt_emu_stream_device(handle->stream);
    op->alpha = host_scalar(alphaDataDiff), op->beta = host_scalar(betaDataDiff);
    op->palpha = host_scalar(alphaParamDiff), op->pbeta = host_scalar(betaParamDiff), op->eps = epsilon;
    op->xp = x, op->dyp = dy, op->y = dx, op->scale = bnScale, op->dscale = dBnScaleResult, op->dbias = dBnBiasResult;
    op->mean_in = savedMean, op->var_in = savedInvVariance;
    return enqueue(handle, "cudnnBatchNormalizationBackward", bn_op, op, bn_cost(*op));
}

} /* extern "C" */
