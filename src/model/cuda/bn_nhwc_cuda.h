/* Batch norm's per-channel reduction in NHWC, shared by the fused batch norm
 * (kernels_cuda.cu) and the synchronised one (syncbn_cuda.cu): device code, included by
 * those .cu files only.
 *
 * NHWC activations are an (n * plane) x C matrix, a row's C channels adjacent: a channel's
 * values lie C elements apart, so a block per channel (NCHW's reduction) would have each
 * warp load touch 32 separate memory sectors. Here threads run along C instead. Block
 * (g, t) takes channel group g (`lanes` adjacent channels: C rounded up to a power of 2, at
 * most 32) and row tile t of bn_nhwc_tiles(C, rows) tiles; its BN_NHWC_THREADS threads are
 * `lanes` channel lanes x `rl` = BN_NHWC_THREADS / lanes row lanes, and lane (x, y) sums
 * channel g * lanes + x over the tile's rows r0 + y, r0 + y + rl, ... in double: a warp
 * reads 32 adjacent channels of a row (or, C below 32, 32 / lanes whole rows). The block
 * adds its row lanes in a fixed shared-memory tree and stores one partial pair per (tile,
 * channel) in `partial` (2 * C * tiles doubles, channel-major); an integer atomicAdd on the
 * group's ticket (tickets[g]) only tells which block of the group finishes last, and in that
 * block lane (x, 0) adds its channel's partials in tile order and the ticket returns to 0
 * (a captured graph replays it). Partitioning from the shape alone, a fixed order
 * everywhere, no floating-point atomics: the same bits on every run. */
#ifndef RT_MODEL_CUDA_BN_NHWC_H
#define RT_MODEL_CUDA_BN_NHWC_H

#include <cuda_runtime.h>
#include <stddef.h>

#define BN_NHWC_THREADS 256
#define BN_NHWC_CHUNK ((size_t)8192) /* at least this many values per block */
#define BN_NHWC_MAX_TILES 256

/* channel lanes per block: C rounded up to a power of 2, at most a warp */
static __host__ __device__ __forceinline__ int bn_nhwc_lanes(int c) {
    int w = 1;
    while (w < c && w < 32) w <<= 1;
    return w;
}
static __host__ __device__ __forceinline__ int bn_nhwc_groups(int c) {
    const int w = bn_nhwc_lanes(c);
    return (c + w - 1) / w;
}
/* row tiles over `rows` rows: at least BN_NHWC_CHUNK values per block, at most
 * BN_NHWC_MAX_TILES tiles */
static __host__ __device__ __forceinline__ int bn_nhwc_tiles(int c, size_t rows) {
    const size_t per = BN_NHWC_CHUNK / (size_t)bn_nhwc_lanes(c), k = (rows + per - 1) / per;
    return k < 1 ? 1 : k > BN_NHWC_MAX_TILES ? BN_NHWC_MAX_TILES : (int)k;
}

/* this thread's place: channel ch (>= c: an idle lane), rows r0 + y, r0 + y + rl, ... < r1 */
typedef struct bn_tile {
    int c, ch, tiles;
    unsigned lanes, rl, y;
    size_t r0, r1;
} bn_tile;

static __device__ __forceinline__ bn_tile bn_tile_of(int c, size_t rows, int tiles) {
    bn_tile T;
    T.c = c, T.tiles = tiles;
    T.lanes = (unsigned)bn_nhwc_lanes(c), T.rl = BN_NHWC_THREADS / T.lanes;
    T.y = threadIdx.x / T.lanes;
    T.ch = (int)(blockIdx.x * T.lanes + threadIdx.x % T.lanes);
    const size_t per = (rows + (size_t)tiles - 1) / (size_t)tiles;
    T.r0 = (size_t)blockIdx.y * per;
    T.r1 = T.r0 + per < rows ? T.r0 + per : rows;
    if (T.ch >= c) T.r1 = T.r0; /* an idle lane sums nothing */
    return T;
}

/* every thread of the block: add the row lanes' sums (*a, *b) per channel in a fixed tree
 * (sa, sb: BN_NHWC_THREADS shared doubles each; last: a shared int) and store the block's
 * partials; true in lane (x, 0) of a real channel in the group's last block to finish, with
 * the channel's totals (the partials in tile order) in *a, *b */
static __device__ bool bn_tile_done(const bn_tile T, double *a, double *b, double *sa, double *sb, int *last,
                                    double *partial, int *tickets) {
    const unsigned t = threadIdx.x;
    sa[t] = *a, sb[t] = *b;
    __syncthreads();
    for (unsigned h = T.rl / 2; h > 0; h >>= 1) {
        if (T.y < h) sa[t] += sa[t + h * T.lanes], sb[t] += sb[t + h * T.lanes];
        __syncthreads();
    }
    double *p = partial + 2 * (size_t)T.ch * (size_t)T.tiles;
    const bool mine = T.y == 0 && T.ch < T.c;
    if (mine) p[2 * blockIdx.y] = sa[t], p[2 * blockIdx.y + 1] = sb[t];
    __threadfence();
    __syncthreads();
    if (t == 0) {
        *last = atomicAdd(&tickets[blockIdx.x], 1) == T.tiles - 1;
        if (*last) tickets[blockIdx.x] = 0; /* for the next launch */
    }
    __syncthreads();
    if (!*last || !mine) return false;
    __threadfence();
    const volatile double *q = p;
    double s1 = 0, s2 = 0;
    for (int k = 0; k < T.tiles; k++) s1 += q[2 * k], s2 += q[2 * k + 1];
    *a = s1, *b = s2;
    return true;
}

#endif
