/* Emulated cuDNN 9 (docs/cuda-emulation.md): the legacy-API calls the project makes,
 * running on the emulated runtime's streams (emu_internal.h). Declared by
 * include/cudnn.h; linked as rt_emu_cudnn in the RINGTRAIN_CUDA=EMU build.
 *
 * Every call validates on the calling thread and returns cuDNN's status (BAD_PARAM for
 * inconsistent shapes or an undersized workspace, NOT_SUPPORTED for what the emulation
 * does not implement: anything but 4-d NCHW float), copies the descriptors' contents and
 * the host scalars alpha/beta into the operation and enqueues it on the handle's stream
 * (cudnnSetStream; default the legacy stream). Inside the operation every device
 * pointer goes through rt_emu_access, so a host pointer, a freed buffer or a range past
 * the end of an allocation is a fault, as on the device; so is a buffer of another
 * device than the stream's.
 *
 * Convolution algorithms. Each supported algorithm is its own loop nest with its own
 * accumulation order and precision, so two algorithms differ in the last bits (as on a
 * GPU) and a run that changes its algorithm choice shows it:
 *   fwd   IMPLICIT_GEMM          double, taps (c, r, s)          no workspace
 *         IMPLICIT_PRECOMP_GEMM  float,  taps (c, r, s)          index table;   TF32 variant
 *         GEMM                   float,  taps (r, s, c)          one image's im2col
 *         FFT (stride 1)         float,  taps reversed           FFT buffers
 *   data  ALGO_0   NON-DETERMINISTIC: float, output channels in a random order per call
 *         ALGO_1                 double, taps (k, r, s)          no workspace;  TF32 variant
 *         FFT (stride 1)         float,  taps (r, s, k)          FFT buffers
 *   filt  ALGO_0   NON-DETERMINISTIC: float, (image, row) pairs in a random order per call
 *         ALGO_1                 double, (n, oh, ow)             no workspace;  TF32 variant
 *         ALGO_3   NON-DETERMINISTIC: float partial sums per image, combined in a
 *                  random order per call                        partial-sum buffers
 *         FFT (stride 1)         float,  (n, oh, ow)             FFT buffers
 * Everything else (DIRECT, FFT_TILING, WINOGRAD*) is CUDNN_STATUS_NOT_SUPPORTED. An
 * algorithm that needs a workspace really uses it: it checks the whole range is device
 * memory and leaves it filled with NaN bytes, so a workspace that overlaps live data
 * corrupts it. The double-accumulating algorithms are the exact sum rounded once; the
 * float ones are within (taps) * 2^-24 * sum|terms| of it, like the CPU backend's
 * sgemm: the tolerance against the CPU backend is that bound, in practice a few 1e-7
 * relative to the output's scale (test_emu_cudnn checks 1e-5).
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
 * No project code is linked: the loops are self-contained (the CPU backend's conv runs
 * through OpenBLAS/oneDNN, whose summation order cannot be reproduced anyway).
 */
#include "emu_internal.h"

#include <cudnn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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
};
struct cudnnFilterStruct {
    uint32_t magic;
    bool set;
    int k, c, h, w;
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
template <class Op> cudnnStatus_t enqueue(cudnnHandle_t h, const char *what, void (*fn)(void *), Op *op) {
    cudaError_t e = rt_emu_stream_enqueue(h->stream, what, fn, op, [](void *a) { delete static_cast<Op *>(a); });
    if (e != cudaSuccess) {
        delete op;
        return CUDNN_STATUS_EXECUTION_FAILED_CUDART;
    }
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
    bool tensor_cores; /* has a TF32 tensor-core variant */
    double gflops;     /* FMA rate of the timing model (the TF32 variant: 10x) */
    ws_kind ws;
    support_t support;
};

const algo_spec kFwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT] = {
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, true, false, 38, WS_NONE, SUP_ALWAYS},
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, true, true, 40, WS_INDEX, SUP_ALWAYS},
    {CUDNN_CONVOLUTION_FWD_ALGO_GEMM, true, false, 36, WS_IM2COL, SUP_ALWAYS},
    {CUDNN_CONVOLUTION_FWD_ALGO_DIRECT, true, false, 0, WS_NONE, SUP_NEVER},
    {CUDNN_CONVOLUTION_FWD_ALGO_FFT, true, false, 60, WS_FFT, SUP_UNIT_STRIDE},
    {CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING, true, false, 0, WS_NONE, SUP_NEVER},
    {CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD, true, false, 0, WS_NONE, SUP_NEVER},
    {CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, true, false, 0, WS_NONE, SUP_NEVER},
};
const algo_spec kData[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT] = {
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, false, false, 44, WS_NONE, SUP_ALWAYS},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, true, true, 40, WS_NONE, SUP_ALWAYS},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT, true, false, 60, WS_FFT, SUP_UNIT_STRIDE},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING, true, false, 0, WS_NONE, SUP_NEVER},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD, true, false, 0, WS_NONE, SUP_NEVER},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED, true, false, 0, WS_NONE, SUP_NEVER},
};
const algo_spec kFilter[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT] = {
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, false, false, 44, WS_NONE, SUP_ALWAYS},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, true, true, 40, WS_NONE, SUP_ALWAYS},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT, true, false, 60, WS_FFT, SUP_UNIT_STRIDE},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, false, false, 46, WS_PARTIAL, SUP_ALWAYS},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD, true, false, 0, WS_NONE, SUP_NEVER},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED, true, false, 0, WS_NONE, SUP_NEVER},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING, true, false, 0, WS_NONE, SUP_NEVER},
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
    return a->support == SUP_ALWAYS || (a->support == SUP_UNIT_STRIDE && g.unit_stride());
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

/* ---- the loop nests (worker thread) -------------------------------------------------- */

struct tap {
    int a, r, s; /* a: c (forward) or k (backward data) */
};

/* forward: y[n,k,oh,:] accumulated over the taps in the given order */
template <class T> void fwd_loop(const geom &g, const float *x, const float *w, float *y, const std::vector<tap> &taps,
                                 float alpha, float beta) {
    std::vector<T> acc((size_t)g.ow);
    for (int n = 0; n < g.n; n++)
        for (int k = 0; k < g.k; k++)
            for (int oh = 0; oh < g.oh; oh++) {
                std::fill(acc.begin(), acc.end(), T(0));
                for (const tap &t : taps) {
                    const int ih = oh * g.u - g.ph + t.r * g.dh;
                    if (ih < 0 || ih >= g.h) continue;
                    const int fr = g.flip ? g.r - 1 - t.r : t.r, fs = g.flip ? g.s - 1 - t.s : t.s;
                    const T wv = (T)w[(((size_t)k * g.c + t.a) * g.r + fr) * g.s + fs];
                    const float *xr = x + (((size_t)n * g.c + t.a) * g.h + ih) * g.w;
                    for (int ow = 0; ow < g.ow; ow++) {
                        const int iw = ow * g.v - g.pw + t.s * g.dw;
                        if (iw >= 0 && iw < g.w) acc[ow] += (T)xr[iw] * wv;
                    }
                }
                float *yr = y + (((size_t)n * g.k + k) * g.oh + oh) * g.ow;
                for (int ow = 0; ow < g.ow; ow++) blend(&yr[ow], (float)acc[ow], alpha, beta);
            }
}

/* backward data: dx[n,c,ih,:] accumulated over the taps (k, r, s) in the given order */
template <class T> void data_loop(const geom &g, const float *w, const float *dy, float *dx,
                                  const std::vector<tap> &taps, float alpha, float beta) {
    std::vector<T> acc((size_t)g.w);
    for (int n = 0; n < g.n; n++)
        for (int c = 0; c < g.c; c++)
            for (int ih = 0; ih < g.h; ih++) {
                std::fill(acc.begin(), acc.end(), T(0));
                for (const tap &t : taps) {
                    const int th = ih + g.ph - t.r * g.dh;
                    if (th < 0 || th % g.u) continue;
                    const int oh = th / g.u;
                    if (oh >= g.oh) continue;
                    const int fr = g.flip ? g.r - 1 - t.r : t.r, fs = g.flip ? g.s - 1 - t.s : t.s;
                    const T wv = (T)w[(((size_t)t.a * g.c + c) * g.r + fr) * g.s + fs];
                    const float *dyr = dy + (((size_t)n * g.k + t.a) * g.oh + oh) * g.ow;
                    /* each iw gets at most one term per tap: the same order as a gather */
                    for (int ow = 0; ow < g.ow; ow++) {
                        const int iw = ow * g.v - g.pw + t.s * g.dw;
                        if (iw >= 0 && iw < g.w) acc[iw] += (T)dyr[ow] * wv;
                    }
                }
                float *dxr = dx + (((size_t)n * g.c + c) * g.h + ih) * g.w;
                for (int iw = 0; iw < g.w; iw++) blend(&dxr[iw], (float)acc[iw], alpha, beta);
            }
}

/* backward filter: the sum over the (image, output row) pairs `rows` (n * oh + row) of
 * dy * x for one weight, in that order */
template <class T> T filter_sum(const geom &g, const float *x, const float *dy, int k, int c, int r, int s,
                                const int *rows, size_t nrows) {
    T acc = 0;
    for (size_t i = 0; i < nrows; i++) {
        const int n = rows[i] / g.oh, oh = rows[i] % g.oh;
        const int ih = oh * g.u - g.ph + r * g.dh;
        if (ih < 0 || ih >= g.h) continue;
        const float *xr = x + (((size_t)n * g.c + c) * g.h + ih) * g.w;
        const float *dyr = dy + (((size_t)n * g.k + k) * g.oh + oh) * g.ow;
        for (int ow = 0; ow < g.ow; ow++) {
            const int iw = ow * g.v - g.pw + s * g.dw;
            if (iw >= 0 && iw < g.w) acc += (T)dyr[ow] * (T)xr[iw];
        }
    }
    return acc;
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

std::vector<float> tf32_copy(const float *p, size_t n) {
    std::vector<float> v(p, p + n);
    for (float &f : v) f = tf32(f);
    return v;
}

void run_fwd(const conv_args &A, const float *x, const float *w, float *y) {
    const geom &g = A.g;
    std::vector<tap> taps;
    taps.reserve((size_t)g.c * g.r * g.s);
    if (A.algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM) {
        for (int r = 0; r < g.r; r++)
            for (int s = 0; s < g.s; s++)
                for (int c = 0; c < g.c; c++) taps.push_back({c, r, s});
    } else {
        for (int c = 0; c < g.c; c++)
            for (int r = 0; r < g.r; r++)
                for (int s = 0; s < g.s; s++) taps.push_back({c, r, s});
        if (A.algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT) std::reverse(taps.begin(), taps.end());
    }
    if (A.algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM)
        fwd_loop<double>(g, x, w, y, taps, A.alpha, A.beta);
    else if (A.tf32) {
        std::vector<float> xt = tf32_copy(x, g.x_elems()), wt = tf32_copy(w, g.w_elems());
        fwd_loop<float>(g, xt.data(), wt.data(), y, taps, A.alpha, A.beta);
    } else
        fwd_loop<float>(g, x, w, y, taps, A.alpha, A.beta);
}

void run_data(const conv_args &A, const float *w, const float *dy, float *dx) {
    const geom &g = A.g;
    std::vector<int> ks((size_t)g.k);
    for (int k = 0; k < g.k; k++) ks[k] = k;
    if (A.algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0) { /* atomics: any order of the output channels */
        std::mt19937_64 rng(A.seed);
        std::shuffle(ks.begin(), ks.end(), rng);
    }
    std::vector<tap> taps;
    taps.reserve((size_t)g.k * g.r * g.s);
    if (A.algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT) {
        for (int r = 0; r < g.r; r++)
            for (int s = 0; s < g.s; s++)
                for (int k = 0; k < g.k; k++) taps.push_back({k, r, s});
    } else {
        for (int k : ks)
            for (int r = 0; r < g.r; r++)
                for (int s = 0; s < g.s; s++) taps.push_back({k, r, s});
    }
    if (A.algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 && !A.tf32)
        data_loop<double>(g, w, dy, dx, taps, A.alpha, A.beta);
    else if (A.tf32) {
        std::vector<float> wt = tf32_copy(w, g.w_elems()), dyt = tf32_copy(dy, g.y_elems());
        data_loop<float>(g, wt.data(), dyt.data(), dx, taps, A.alpha, A.beta);
    } else
        data_loop<float>(g, w, dy, dx, taps, A.alpha, A.beta);
}

void run_filter(const conv_args &A, const float *x, const float *dy, float *dw) {
    const geom &g = A.g;
    const size_t nrows = (size_t)g.n * g.oh;
    std::vector<int> rows(nrows);
    for (size_t i = 0; i < nrows; i++) rows[i] = (int)i;
    std::mt19937_64 rng(A.seed);
    if (A.algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0) std::shuffle(rows.begin(), rows.end(), rng);
    std::vector<float> xt, dyt;
    if (A.tf32) {
        xt = tf32_copy(x, g.x_elems());
        dyt = tf32_copy(dy, g.y_elems());
        x = xt.data();
        dy = dyt.data();
    }
    /* ALGO_3: per-image partial sums, combined in a random order */
    std::vector<int> img((size_t)g.n);
    for (int n = 0; n < g.n; n++) img[n] = n;
    std::vector<float> part((size_t)g.n);
    for (int k = 0; k < g.k; k++)
        for (int c = 0; c < g.c; c++)
            for (int r = 0; r < g.r; r++)
                for (int s = 0; s < g.s; s++) {
                    float v;
                    if (A.algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 && !A.tf32) {
                        v = (float)filter_sum<double>(g, x, dy, k, c, r, s, rows.data(), nrows);
                    } else if (A.algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3) {
                        for (int n = 0; n < g.n; n++)
                            part[n] = filter_sum<float>(g, x, dy, k, c, r, s, rows.data() + (size_t)n * g.oh, g.oh);
                        std::shuffle(img.begin(), img.end(), rng);
                        v = 0;
                        for (int n : img) v += part[n];
                    } else {
                        v = filter_sum<float>(g, x, dy, k, c, r, s, rows.data(), nrows);
                    }
                    const int fr = g.flip ? g.r - 1 - r : r, fs = g.flip ? g.s - 1 - s : s;
                    blend(&dw[(((size_t)k * g.c + c) * g.r + fr) * g.s + fs], v, A.alpha, A.beta);
                }
}

void run_conv(const conv_args &A) {
    const dir_names &nm = kNames[A.dir];
    const geom &g = A.g;
    const size_t fb = sizeof(float);
    size_t a_bytes, b_bytes, out_bytes;
    if (A.dir == DIR_FWD)
        a_bytes = g.x_elems() * fb, b_bytes = g.w_elems() * fb, out_bytes = g.y_elems() * fb;
    else if (A.dir == DIR_DATA)
        a_bytes = g.w_elems() * fb, b_bytes = g.y_elems() * fb, out_bytes = g.x_elems() * fb;
    else
        a_bytes = g.x_elems() * fb, b_bytes = g.y_elems() * fb, out_bytes = g.w_elems() * fb;
    const float *a = dev_view<const float>(A.a, a_bytes, A.dev, nm.a);
    const float *b = dev_view<const float>(A.b, b_bytes, A.dev, nm.b);
    float *out = dev_view<float>(A.out, out_bytes, A.dev, nm.out);
    unsigned char *ws = A.ws_need ? dev_view<unsigned char>(A.ws, A.ws_need, A.dev, nm.ws) : nullptr;
    if (A.dir == DIR_FWD)
        run_fwd(A, a, b, out);
    else if (A.dir == DIR_DATA)
        run_data(A, a, b, out);
    else
        run_filter(A, a, b, out);
    if (ws) memset(ws, 0xff, A.ws_need); /* scratch left behind: NaN bytes */
}

void conv_op(void *p) { run_conv(*static_cast<conv_args *>(p)); }

/* ---- validation shared by the three directions --------------------------------------- */

/* The geometry of a call in direction d from its descriptors (x, w, y in the forward
 * sense), and the status cuDNN gives for it. */
cudnnStatus_t dir_geom(cudnnTensorDescriptor_t xd, cudnnFilterDescriptor_t wd, cudnnConvolutionDescriptor_t cd,
                       cudnnTensorDescriptor_t yd, geom *g) {
    if (!yd) return CUDNN_STATUS_BAD_PARAM;
    return make_geom(xd, wd, cd, yd, g);
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
    const size_t need = workspace_of(sp, g);
    if (need > 0 && (!ws || ws_bytes < need)) return CUDNN_STATUS_BAD_PARAM;
    auto *op = new conv_args{};
    op->dir = d, op->g = g, op->algo = algo, op->tf32 = sp->tensor_cores && tf32_allowed(cd->math);
    op->dev = rt_emu_stream_device(h->stream);
    op->alpha = host_scalar(alpha), op->beta = host_scalar(beta);
    op->a = a, op->b = b, op->out = out, op->ws = ws, op->ws_need = need, op->seed = next_seed();
    return enqueue(h, kNames[d].call, conv_op, op);
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

/* Every algorithm of direction d as perf results, sorted as cuDNN sorts them: the ones
 * that ran (by time), then those that need more workspace than `ws_limit`
 * (ALLOC_FAILED), then the unsupported ones. */
std::vector<candidate> candidates(dir_t d, const geom &g, cudnnMathType_t desc_math, size_t ws_limit, bool jitter) {
    std::vector<candidate> out;
    std::mt19937_64 rng(next_seed());
    const double jf = jitter ? jitter_fraction() : 0.0;
    std::uniform_real_distribution<double> uj(1.0 - jf, 1.0 + jf);
    for (int a = 0; a < algo_count(d); a++) {
        const algo_spec *sp = spec_of(d, a);
        if (!supported(sp, g)) {
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
    std::vector<candidate> c = candidates(d, g, cd->math, ws_bytes, true);
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
    if (!supported(sp, g)) return CUDNN_STATUS_NOT_SUPPORTED;
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
    *tensorDesc = new cudnnTensorStruct{kTensorMagic, false, 0, 0, 0, 0};
    return CUDNN_STATUS_SUCCESS;
}

/* the dimensions and type cuDNN accepts; what the emulation implements on top */
static cudnnStatus_t check_4d(int format, cudnnDataType_t type, int n, int c, int h, int w) {
    if (n <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
    if (format < CUDNN_TENSOR_NCHW || format > CUDNN_TENSOR_NCHW_VECT_C) return CUDNN_STATUS_BAD_PARAM;
    if ((double)n * c * h * w > (double)INT_MAX) return CUDNN_STATUS_NOT_SUPPORTED;
    if (format != CUDNN_TENSOR_NCHW || type != CUDNN_DATA_FLOAT) return CUDNN_STATUS_NOT_SUPPORTED;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t format,
                                         cudnnDataType_t dataType, int n, int c, int h, int w) {
    if (!d || d->magic != kTensorMagic) return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = check_4d(format, dataType, n, c, h, w);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    d->n = n, d->c = c, d->h = h, d->w = w, d->set = true;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetTensor4dDescriptor(const cudnnTensorDescriptor_t d, cudnnDataType_t *dataType, int *n, int *c,
                                         int *h, int *w, int *nStride, int *cStride, int *hStride, int *wStride) {
    if (!tensor_ok(d)) return CUDNN_STATUS_BAD_PARAM;
    if (dataType) *dataType = CUDNN_DATA_FLOAT;
    if (n) *n = d->n;
    if (c) *c = d->c;
    if (h) *h = d->h;
    if (w) *w = d->w;
    if (nStride) *nStride = d->c * d->h * d->w;
    if (cStride) *cStride = d->h * d->w;
    if (hStride) *hStride = d->w;
    if (wStride) *wStride = 1;
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
    *filterDesc = new cudnnFilterStruct{kFilterMagic, false, 0, 0, 0, 0};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t dataType,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
    if (!d || d->magic != kFilterMagic) return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = check_4d(format, dataType, k, c, h, w);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    d->k = k, d->c = c, d->h = h, d->w = w, d->set = true;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetFilter4dDescriptor(const cudnnFilterDescriptor_t d, cudnnDataType_t *dataType,
                                         cudnnTensorFormat_t *format, int *k, int *c, int *h, int *w) {
    if (!filter_ok(d)) return CUDNN_STATUS_BAD_PARAM;
    if (dataType) *dataType = CUDNN_DATA_FLOAT;
    if (format) *format = CUDNN_TENSOR_NCHW;
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

struct bias_args {
    dims dy;
    int dev;
    float alpha, beta;
    const void *dyp;
    void *db;
};

void bias_op(void *p) {
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
    const bn_args &A = *static_cast<bn_args *>(p);
    if (A.kind == BN_BACKWARD)
        bn_backward(A);
    else
        bn_forward(A);
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
    return CUDNN_STATUS_SUCCESS;
}

} // namespace

extern "C" {

cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t handle, const void *alpha,
                                           const cudnnTensorDescriptor_t dyDesc, const void *dy, const void *beta,
                                           const cudnnTensorDescriptor_t dbDesc, void *db) {
    if (!handle_ok(handle) || !tensor_ok(dyDesc) || !tensor_ok(dbDesc)) return CUDNN_STATUS_BAD_PARAM;
    if (!alpha || !beta || !dy || !db) return CUDNN_STATUS_BAD_PARAM;
    if (!is_param(dims_of(dbDesc), dyDesc->c)) return CUDNN_STATUS_BAD_PARAM;
    auto *op = new bias_args{dims_of(dyDesc), rt_emu_stream_device(handle->stream), host_scalar(alpha),
                             host_scalar(beta), dy, db};
    return enqueue(handle, "cudnnConvolutionBackwardBias", bias_op, op);
}

cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t aDesc,
                             const void *A, const void *beta, const cudnnTensorDescriptor_t cDesc, void *C) {
    if (!handle_ok(handle) || !tensor_ok(aDesc) || !tensor_ok(cDesc)) return CUDNN_STATUS_BAD_PARAM;
    if (!alpha || !beta || !A || !C) return CUDNN_STATUS_BAD_PARAM;
    const dims a = dims_of(aDesc), c = dims_of(cDesc);
    if ((a.n != c.n && a.n != 1) || (a.c != c.c && a.c != 1) || (a.h != c.h && a.h != 1) || (a.w != c.w && a.w != 1))
        return CUDNN_STATUS_BAD_PARAM;
    auto *op = new add_args{a, c, rt_emu_stream_device(handle->stream), host_scalar(alpha), host_scalar(beta), A, C};
    return enqueue(handle, "cudnnAddTensor", add_op, op);
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
    return enqueue(handle, "cudnnBatchNormalizationForwardInference", bn_op, op);
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
    return enqueue(handle, "cudnnBatchNormalizationForwardTraining", bn_op, op);
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
    return enqueue(handle, "cudnnBatchNormalizationBackward", bn_op, op);
}

} /* extern "C" */
