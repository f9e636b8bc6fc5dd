/* The cost of every kernel of ours, for the emulated GPUs' ledger (ledger.cpp; docs/gpu.md
 * "The cost ledger"): ONE table, an entry per __global__ kernel of src/model/cuda/kernels_cuda.cu,
 * src/optim/cuda/optim_cuda.cu, src/core/cuda/rng_cuda.cu and src/dist/cuda/bf16_cuda.cu,
 * computed from the launch's parameters (and grid) alone.
 *
 * The rules (the same for every entry):
 *  - bytes: every tensor parameter is read once over the elements the kernel touches, at
 *    its element size (the pointer's type; activations passed as void * with the format's
 *    bf16 flag: 2 bytes bf16, 4 fp32, and a cast, 1 FLOP, per bf16 element read or
 *    stored), and written once if the kernel stores into it
 *    (read and written both when it updates in place: dx += dy reads and writes dx). A
 *    NULL pointer costs nothing. A gather counts the elements it reads (nll reads one
 *    logit per row). Data-dependent paths are not followed (the atomic counter of bad
 *    labels; SGD's first step that does not read its buffer), scalar flags are (from_bf16's
 *    accumulate, ema's first).
 *  - FLOPs: the floating-point operations per element as the kernel writes them (add,
 *    multiply, divide, compare-and-select, sqrt, exp, log: 1 each; an FMA: 2), a cast
 *    1; integer index arithmetic and Philox's integer rounds 0. They only matter against
 *    the fp32 CUDA-core peak, far above what these memory-bound kernels need.
 *  - math: RT_COST_MATH_FP32 (CUDA cores) for every entry.
 *
 * A launch of a kernel that has no entry is recorded with no cost and named in the
 * ledger's unknown_kernels; test_emu_ledger fails on it, and on any __global__ kernel of
 * the sources without an entry (the list is generated from the .cu files), and checks
 * every entry's bytes against the sizes of the tensors it launches on. A kernel launched
 * with another number of parameters than its entry expects stops the emulation.
 */
#include "core/cost_ledger.h"
#include "emu_internal.h"
#include "model/cuda/cuda_internal.h"
#include "optim/internal/optim_kernels.h"
#include "rt_emu_ledger.h"

#include <string.h>

#include <string>
#include <unordered_map>

namespace {

/* a launch's parameters */
struct params {
    const char *kernel;
    int n;
    const rt_emu_karg *a;
    dim3 grid, block;

    const rt_emu_karg &at(int i) const {
        if (i < 0 || i >= n) rt_emu_fatal("kernel_costs: %s has no parameter %d", kernel, i);
        return a[i];
    }
    /* a number parameter: 4-byte integers signed, 8-byte unsigned, floats as they are */
    double num(int i) const {
        const rt_emu_karg &k = at(i);
        if (k.pointer) rt_emu_fatal("kernel_costs: %s parameter %d is a pointer, not a number", kernel, i);
        if (k.floating) return k.size == sizeof(float) ? (double)get<float>(i) : get<double>(i);
        switch (k.size) {
        case 1: return (double)get<uint8_t>(i);
        case 2: return (double)get<uint16_t>(i);
        case 4: return (double)get<int32_t>(i);
        case 8: return (double)get<uint64_t>(i);
        }
        rt_emu_fatal("kernel_costs: %s parameter %d: a number of %u bytes", kernel, i, k.size);
    }
    template <class T> T get(int i) const {
        const rt_emu_karg &k = at(i);
        if (k.size != sizeof(T))
            rt_emu_fatal("kernel_costs: %s parameter %d has %u bytes, the entry reads %zu", kernel, i, k.size,
                         sizeof(T));
        T v;
        memcpy(&v, k.value, sizeof v);
        return v;
    }
    bool null(int i) const {
        const rt_emu_karg &k = at(i);
        if (!k.pointer) rt_emu_fatal("kernel_costs: %s parameter %d is not a pointer", kernel, i);
        return get<const void *>(i) == nullptr;
    }
};

/* what an entry adds up */
struct tally {
    const params &p;
    rt_emu_cost c;
    void rd(int i, double count) {
        if (!p.null(i)) c.bytes_read += count * p.at(i).elem;
    }
    void wr(int i, double count) {
        if (!p.null(i)) c.bytes_written += count * p.at(i).elem;
    }
    void rw(int i, double count) {
        rd(i, count);
        wr(i, count);
    }
    void fl(double f) { c.flops += f; }
    /* activations (void *) of the format's dtype: bf16 2 bytes and a cast per element */
    void rda(int i, double count, bool bf16) {
        if (p.null(i)) return;
        c.bytes_read += count * (bf16 ? 2 : 4);
        if (bf16) c.flops += count;
    }
    void wra(int i, double count, bool bf16) {
        if (p.null(i)) return;
        c.bytes_written += count * (bf16 ? 2 : 4);
        if (bf16) c.flops += count;
    }
    void rwa(int i, double count, bool bf16) {
        rda(i, count, bf16);
        wra(i, count, bf16);
    }
};

typedef void (*cost_fn)(const params &p, tally &t);
struct entry {
    const char *name;
    int nparams;
    cost_fn fn;
};

double words32(double n) { return (double)(((uint64_t)n + 31) / 32); }               /* a bit mask's uint32 words */
double blocks_of(const params &p) { return (double)p.grid.x * p.grid.y * p.grid.z; } /* the launch's blocks */

/* the casts' three arrays: counts n0, n1 and the rest of total */
void set_counts(const params &p, double n[3]) {
    n[0] = p.num(1), n[1] = p.num(2), n[2] = p.num(0) - n[0] - n[1];
}

const entry kTable[] = {
    /* ---- src/model/cuda/kernels_cuda.cu ---- */
    {"relu_fw_kernel", 4, [](const params &p, tally &t) { /* (count, bf16, x, y) */
         const double n = p.num(0);
         const bool h = p.num(1) != 0;
         t.rda(2, n, h), t.wra(3, n, h), t.fl(n);
     }},
    {"relu_bw_kernel", 5, [](const params &p, tally &t) { /* (count, bf16, y, dy, dx) */
         const double n = p.num(0);
         const bool h = p.num(1) != 0;
         t.rda(2, n, h), t.rda(3, n, h), t.wra(4, n, h), t.fl(n);
     }},
    {"add_kernel", 5, [](const params &p, tally &t) { /* (count, bf16, a, b, y) */
         const double n = p.num(0);
         const bool h = p.num(1) != 0;
         t.rda(2, n, h), t.rda(3, n, h), t.wra(4, n, h), t.fl(n);
     }},
    {"acc_kernel", 4, [](const params &p, tally &t) { /* (count, bf16, dy, dx): dx += dy */
         const double n = p.num(0);
         const bool h = p.num(1) != 0;
         t.rda(2, n, h), t.rwa(3, n, h), t.fl(n);
     }},
    /* (total stored, c, stored_c, plane, bf16, nhwc, src fp32 NCHW, dst): the padding
     * channels are written, not read */
    {"act_from_nchw_kernel", 8, [](const params &p, tally &t) {
         const double total = p.num(0), c = p.num(1), sc = p.num(2);
         t.rd(6, total * c / sc), t.wra(7, total, p.num(4) != 0);
     }},
    {"act_to_nchw_kernel", 8, [](const params &p, tally &t) { /* (total = n c plane, c, stored_c, ...) */
         const double total = p.num(0);
         t.rda(6, total, p.num(4) != 0), t.wr(7, total);
     }},
    {"maxpool_fw_kernel", 4, [](const params &p, tally &t) { /* (total out, geom, x, y) */
         const double total = p.num(0);
         const rt_cuk_pool_geom g = p.get<rt_cuk_pool_geom>(1);
         const double planes = total / ((double)g.out_h * g.out_w);
         t.rda(2, planes * g.in_h * g.in_w, g.bf16), t.wra(3, total, g.bf16), t.fl(total * g.k * g.k);
     }},
    {"maxpool_bw_kernel", 5, [](const params &p, tally &t) { /* (total in, geom, x, dy, dx) */
         const double total = p.num(0);
         const rt_cuk_pool_geom g = p.get<rt_cuk_pool_geom>(1);
         const double planes = total / ((double)g.in_h * g.in_w), per = (g.k + g.stride - 1) / g.stride;
         t.rda(2, total, g.bf16), t.rda(3, planes * g.out_h * g.out_w, g.bf16), t.wra(4, total, g.bf16);
         t.fl(total * per * per * g.k * g.k); /* every window over the element scanned again */
     }},
    {"avgpool_fw_kernel", 7, [](const params &p, tally &t) { /* (planes, c, hw, bf16, nhwc, x, y fp32) */
         const double planes = p.num(0), hw = p.num(2);
         t.rda(5, planes * hw, p.num(3) != 0), t.wr(6, planes), t.fl(planes * hw);
     }},
    {"avgpool_bw_kernel", 8, [](const params &p, tally &t) { /* (total, c, hw, bf16, nhwc, inv, dy fp32, dx) */
         const double total = p.num(0), hw = p.num(2);
         t.rd(6, total / hw), t.wra(7, total, p.num(3) != 0), t.fl(total);
     }},
    {"bias_rows_kernel", 4, [](const params &p, tally &t) { /* (total, out, b, y) */
         t.rd(2, p.num(1)), t.wr(3, p.num(0));
     }},
    {"column_sums_kernel", 4, [](const params &p, tally &t) { /* (n, out, dy, db) */
         const double n = p.num(0), out = p.num(1);
         t.rd(2, n * out), t.wr(3, out), t.fl(n * out);
     }},
    {"dropout_mask_kernel", 7, [](const params &p, tally &t) { /* (draws, seed, subseq, counter, p, scale, mask) */
         const double draws = p.num(0);
         t.wr(6, draws), t.fl(2 * draws);
     }},
    {"dropout_apply_kernel", 9, [](const params &p, tally &t) { /* (count, plane, c, hw, bf16, nhwc, mask, x, y) */
         const double n = p.num(0), plane = p.num(1);
         const bool h = p.num(4) != 0;
         t.rd(6, n / plane), t.rda(7, n, h), t.wra(8, n, h), t.fl(n);
     }},
    /* batch norm (rt_cuk_bn_shape s: n * c * plane values; splits blocks per channel, each
     * storing its two double partials and taking its channel's integer ticket once; the
     * last block's finalisation reads the partials again and the per-channel vectors) */
    {"bn_stats_kernel", 14, [](const params &p, tally &t) {
         /* (s, x, partial, tickets, weight, bias, rmean, rvar, save_mean, save_invstd, nbt, factors, mo, eps) */
         const rt_cuk_bn_shape s = p.get<rt_cuk_bn_shape>(0);
         const double all = (double)s.n * s.c * s.plane, c = s.c, blocks = c * s.splits;
         t.rda(1, all, s.bf16), t.rw(2, 2 * blocks), t.rw(3, blocks), t.rd(4, c), t.rd(5, c), t.rw(6, c), t.rw(7, c);
         t.wr(8, c), t.wr(9, c), t.rw(10, 1), t.wr(11, 2 * c);
         t.fl(3 * all + 2 * blocks + 20 * c);
     }},
    /* NHWC (bn_nhwc_cuda.h): a block per (channel group, row tile), s.splits tiles; each
     * (channel, tile) stores its two double partials, each block takes its group's ticket once */
    {"bn_stats_nhwc_kernel", 14, [](const params &p, tally &t) { /* the parameters of bn_stats_kernel */
         const rt_cuk_bn_shape s = p.get<rt_cuk_bn_shape>(0);
         const double all = (double)s.n * s.c * s.plane, c = s.c, parts = c * s.splits;
         t.rda(1, all, s.bf16), t.rw(2, 2 * parts), t.rw(3, blocks_of(p)), t.rd(4, c), t.rd(5, c), t.rw(6, c);
         t.rw(7, c), t.wr(8, c), t.wr(9, c), t.rw(10, 1), t.wr(11, 2 * c);
         t.fl(3 * all + 2 * parts + 20 * c);
     }},
    {"bn_eval_factors_kernel", 7, [](const params &p, tally &t) { /* (c, weight, bias, rmean, rvar, eps, factors) */
         const double c = p.num(0);
         t.rd(1, c), t.rd(2, c), t.rd(3, c), t.rd(4, c), t.wr(6, 2 * c), t.fl(8 * c);
     }},
    {"bn_apply_kernel", 6, [](const params &p, tally &t) { /* (s, x, res, factors, y, relu) */
         const rt_cuk_bn_shape s = p.get<rt_cuk_bn_shape>(0);
         const double all = (double)s.n * s.c * s.plane;
         t.rda(1, all, s.bf16), t.rda(2, all, s.bf16), t.rd(3, 2.0 * s.c), t.wra(4, all, s.bf16);
         t.fl(all * (2 + (p.null(2) ? 0 : 1) + (p.num(5) != 0 ? 1 : 0)));
     }},
    {"bn_dsums_kernel", 13, [](const params &p, tally &t) {
         /* (s, x, act, dy, partial, tickets, weight, save_mean, save_invstd, dweight, dbias, factors, keep) */
         const rt_cuk_bn_shape s = p.get<rt_cuk_bn_shape>(0);
         const double all = (double)s.n * s.c * s.plane, c = s.c, blocks = c * s.splits;
         t.rda(1, all, s.bf16), t.rda(2, all, s.bf16), t.rda(3, all, s.bf16), t.rw(4, 2 * blocks), t.rw(5, blocks);
         t.rd(6, c), t.rd(7, c), t.rd(8, c), t.wr(9, c), t.wr(10, c), t.wr(11, 4 * c);
         t.fl(all * (4 + (p.null(2) ? 0 : 1)) + 2 * blocks + 10 * c);
         if (!p.null(12)) t.wra(12, all, s.bf16);
     }},
    {"bn_dsums_nhwc_kernel", 13, [](const params &p, tally &t) { /* the parameters of bn_dsums_kernel */
         const rt_cuk_bn_shape s = p.get<rt_cuk_bn_shape>(0);
         const double all = (double)s.n * s.c * s.plane, c = s.c, parts = c * s.splits;
         t.rda(1, all, s.bf16), t.rda(2, all, s.bf16), t.rda(3, all, s.bf16), t.rw(4, 2 * parts);
         t.rw(5, blocks_of(p)), t.rd(6, c), t.rd(7, c), t.rd(8, c), t.wr(9, c), t.wr(10, c), t.wr(11, 4 * c);
         t.fl(all * (4 + (p.null(2) ? 0 : 1)) + 2 * parts + 10 * c);
         if (!p.null(12)) t.wra(12, all, s.bf16);
     }},
    {"bn_dx_kernel", 7, [](const params &p, tally &t) { /* (s, x, act, dy, factors, dx, accumulate) */
         const rt_cuk_bn_shape s = p.get<rt_cuk_bn_shape>(0);
         const double all = (double)s.n * s.c * s.plane;
         t.rda(1, all, s.bf16), t.rda(2, all, s.bf16), t.rda(3, all, s.bf16), t.rd(4, 4.0 * s.c);
         t.wra(5, all, s.bf16);
         t.fl(all * (5 + (p.null(2) ? 0 : 1)));
         if (p.num(6) != 0) t.rda(5, all, s.bf16), t.fl(all);
     }},
    {"increment_i64_kernel", 1, [](const params &p, tally &t) { t.rw(0, 1); }},
    {"to_bf16_kernel", 3, [](const params &p, tally &t) { /* (count, x, y) */
         const double n = p.num(0);
         t.rd(1, n), t.wr(2, n), t.fl(n);
     }},
    {"from_bf16_kernel", 4, [](const params &p, tally &t) { /* (count, x bf16, y, accumulate) */
         const double n = p.num(0);
         t.rd(1, n), t.wr(2, n), t.fl(n);
         if (p.num(3) != 0) t.rd(2, n), t.fl(n);
     }},
    {"round_bf16_kernel", 2, [](const params &p, tally &t) { /* (count, y) in place */
         const double n = p.num(0);
         t.rw(1, n), t.fl(2 * n);
     }},
    {"bf16_fill_channels_kernel", 6, [](const params &p, tally &t) { /* (total, plane, c, nhwc, b, y) */
         t.rd(4, p.num(2)), t.wr(5, p.num(0)), t.fl(p.num(0));
     }},
    {"bf16_channel_sums_kernel", 6, [](const params &p, tally &t) { /* (n, c, plane, nhwc, dy, db) */
         const double all = p.num(0) * p.num(1) * p.num(2);
         t.rd(4, all), t.wr(5, p.num(1)), t.fl(all);
     }},
    {"to_bf16_set_kernel", 15, [](const params &p, tally &t) { /* (total, n0, n1, x0..2, y0..2, c0..2, p0..2) */
         double n[3];
         set_counts(p, n);
         for (int k = 0; k < 3; k++) t.rd(3 + k, n[k]), t.wr(6 + k, n[k]), t.fl(n[k]);
     }},
    {"from_bf16_set_kernel", 18, [](const params &p, tally &t) { /* (total, n0, n1, x0..2, y0..2, acc0..2, c, p) */
         double n[3];
         set_counts(p, n);
         for (int k = 0; k < 3; k++) {
             t.rd(3 + k, n[k]), t.wr(6 + k, n[k]), t.fl(n[k]);
             if (p.num(9 + k) != 0) t.rd(6 + k, n[k]), t.fl(n[k]);
         }
     }},
    {"softmax_xent_kernel", 8, [](const params &p, tally &t) { /* (n, k, logits, labels, eps, loss, dlogits, bad) */
         const double n = p.num(0), nk = n * p.num(1);
         t.rd(2, nk), t.rd(3, n), t.wr(5, 1), t.wr(6, nk), t.fl(4 * nk);
     }},
    {"log_softmax_fw_kernel", 4, [](const params &p, tally &t) { /* (n, k, x, y) */
         const double nk = p.num(0) * p.num(1);
         t.rd(2, nk), t.wr(3, nk), t.fl(3 * nk);
     }},
    {"log_softmax_bw_kernel", 5, [](const params &p, tally &t) { /* (n, k, y, dy, dx) */
         const double nk = p.num(0) * p.num(1);
         t.rd(2, nk), t.rd(3, nk), t.wr(4, nk), t.fl(4 * nk);
     }},
    {"nll_kernel", 7, [](const params &p, tally &t) { /* (n, k, logp, labels, loss, dlogp, bad) */
         const double n = p.num(0);
         t.rd(2, n), t.rd(3, n), t.wr(4, 1), t.wr(5, n * p.num(1)), t.fl(n);
     }},

    /* ---- src/model/cuda/convw_cuda.cu (convolutions in an NHWC activation format) ---- */
    /* void pointers count bytes (elem 1): the elements times the dtype's size (bf16 flag) */
    {"convw_refresh_kernel", 7, [](const params &p, tally &t) { /* (n, table, wbase, copies, bf16, src, copy) */
         const double es = p.num(4) ? 2 : 4;
         t.rd(1, p.num(0)), t.rd(2, p.num(5)), t.wr(3, p.num(6) * es), t.fl(p.num(4) ? p.num(6) : 0);
     }},
    {"convw_dw_kernel", 8, [](const params &p, tally &t) { /* (total, in_c, x_c, taps, nhwc, bf16, dwc, dw) */
         const double n = p.num(0), es = p.num(5) ? 2 : 4;
         t.rd(6, n * es), t.wr(7, n), t.fl(p.num(5) ? n : 0);
     }},
    {"convw_grads_kernel", 7, [](const params &p, tally &t) { /* (first, count, table, dws, gbase, bf16, grad) */
         const double n = p.num(6), es = p.num(5) ? 2 : 4;
         t.rd(2, p.num(1)), t.rd(3, n * es), t.wr(4, n), t.fl(p.num(5) ? n : 0);
     }},
    {"conv_bias_fill_kernel", 7, [](const params &p, tally &t) { /* (total, plane, c, nhwc, bf16, b, y) */
         const double n = p.num(0), es = p.num(4) ? 2 : 4;
         t.rd(5, p.num(2)), t.wr(6, n * es), t.fl(p.num(4) ? n : 0);
     }},
    {"conv_bias_sums_kernel", 7, [](const params &p, tally &t) { /* (n, c, plane, nhwc, bf16, dy, db) */
         const double all = p.num(0) * p.num(1) * p.num(2), es = p.num(4) ? 2 : 4;
         t.rd(5, all * es), t.wr(6, p.num(1)), t.fl(all);
     }},
    {"act_relayout_kernel", 7, [](const params &p, tally &t) { /* (total, c, plane, to_nhwc, bf16, x, y) */
         const double bytes = p.num(0) * (p.num(4) ? 2 : 4);
         t.rd(5, bytes), t.wr(6, bytes);
     }},
    /* ---- src/optim/cuda/optim_cuda.cu ---- */
    /* the step's scalars by value (sv), or read from device memory (sd, a captured step:
     * one struct read; the FLOPs follow the host's copy, the same values) */
    {"sgd_kernel", 7, [](const params &p, tally &t) { /* (p, g, buf, n, sv, sd, mask) */
         const double n = p.num(3);
         const rt_optim_scalars s = p.get<rt_optim_scalars>(4);
         t.rw(0, n), t.rd(1, n), t.rw(2, n), t.rd(5, 1), t.rd(6, words32(n));
         t.fl(n * (2 + (s.has_wd ? 2 : 0) + (p.null(2) ? 0 : 3)));
     }},
    {"adam_kernel", 9, [](const params &p, tally &t) { /* (p, g, m, v, vmax, n, sv, sd, mask) */
         const double n = p.num(5);
         const rt_optim_scalars s = p.get<rt_optim_scalars>(6);
         t.rw(0, n), t.rd(1, n), t.rw(2, n), t.rw(3, n), t.rw(4, n), t.rd(7, 1), t.rd(8, words32(n));
         t.fl(n * (14 + (s.has_wd ? 2 : 0) + (p.null(4) ? 0 : 1)));
     }},
    {"adadelta_kernel", 8, [](const params &p, tally &t) { /* (p, g, sq, acc, n, sv, sd, mask) */
         const double n = p.num(4);
         const rt_optim_scalars s = p.get<rt_optim_scalars>(5);
         t.rw(0, n), t.rd(1, n), t.rw(2, n), t.rw(3, n), t.rd(6, 1), t.rd(7, words32(n));
         t.fl(n * (16 + (s.has_wd ? 2 : 0)));
     }},
    {"sumsq_partial_kernel", 3, [](const params &p, tally &t) { /* (x, n, partial[grid]) */
         const double n = p.num(1);
         t.rd(0, n), t.wr(2, (double)p.grid.x * p.grid.y * p.grid.z), t.fl(2 * n);
     }},
    {"sumsq_final_kernel", 3, [](const params &p, tally &t) { /* (partial, count, out) */
         const double n = p.num(1);
         t.rd(0, n), t.wr(2, 1), t.fl(n);
     }},
    {"scale_kernel", 3, [](const params &p, tally &t) { /* (x, n, coef) in place */
         const double n = p.num(1);
         t.rw(0, n), t.fl(n);
     }},
    {"ema_kernel", 6, [](const params &p, tally &t) { /* (avg, p, n, decay, omdecay, first) */
         const double n = p.num(2);
         const bool first = p.num(5) != 0;
         t.wr(0, n), t.rd(1, n);
         if (!first) t.rd(0, n), t.fl(3 * n);
     }},
    {"ema_swap_kernel", 3, [](const params &p, tally &t) { /* (avg, p, n) */
         const double n = p.num(2);
         t.rw(0, n), t.rw(1, n);
     }},

    /* ---- src/core/cuda/rng_cuda.cu (Philox's rounds are integer work) ---- */
    {"uniform_kernel", 5, [](const params &p, tally &t) { /* (out, n, seed, subseq, offset) */
         t.wr(0, p.num(1)), t.fl(p.num(1));
     }},
    {"normal_kernel", 7, [](const params &p, tally &t) { /* (out, n, seed, subseq, offset, mean, std) */
         t.wr(0, p.num(1)), t.fl(8 * p.num(1)); /* Box-Muller: log, sqrt, cos, products; the scaling 2 */
     }},

    /* ---- src/dist/cuda/bf16_cuda.cu ---- */
    {"pack_kernel", 3, [](const params &p, tally &t) { /* (n, x, y bf16) */
         const double n = p.num(0);
         t.rd(1, n), t.wr(2, n), t.fl(n);
     }},
    {"unpack_kernel", 3, [](const params &p, tally &t) { /* (n, x bf16, y) */
         const double n = p.num(0);
         t.rd(1, n), t.wr(2, n), t.fl(n);
     }},
    {"combine_kernel", 5, [](const params &p, tally &t) { /* (n, d, s, op, div): d = round(op(d, s)) */
         const double n = p.num(0);
         t.rw(1, n), t.rd(2, n), t.fl(n * (p.num(4) > 0 ? 4 : 3));
     }},
    {"div_kernel", 3, [](const params &p, tally &t) { /* (n, d, div) in place */
         const double n = p.num(0);
         t.rw(1, n), t.fl(n * 3);
     }},
    /* ---- src/model/cuda/syncbn_cuda.cu (model.sync_bn) ---- */
    /* activations: (..., bf16, nhwc, ...) after the shape */
    {"syncbn_stats_kernel", 7, [](const params &p, tally &t) { /* (n, c, plane, bf16, nhwc, x, sums) */
         const double all = p.num(0) * p.num(1) * p.num(2);
         t.rda(5, all, p.num(3) != 0), t.wr(6, 2 * p.num(1) + 1), t.fl(3 * all);
     }},
    /* NHWC (bn_nhwc_cuda.h): a block per (channel group, row tile), `tiles` tiles; partials
     * and tickets as bn_stats_nhwc_kernel's */
    {"syncbn_stats_nhwc_kernel", 9, [](const params &p, tally &t) {
         /* (n, c, plane, bf16, x, partial, tickets, tiles, sums) */
         const double all = p.num(0) * p.num(1) * p.num(2), parts = p.num(1) * p.num(7);
         t.rda(4, all, p.num(3) != 0), t.rw(5, 2 * parts), t.rw(6, blocks_of(p)), t.wr(8, 2 * p.num(1) + 1);
         t.fl(3 * all + 2 * parts);
     }},
    {"syncbn_finish_kernel", 9, [](const params &p, tally &t) { /* (c, eps, momentum, sums, mean, invstd, rm, rv, nbt) */
         const double c = p.num(0);
         t.rd(3, 2 * c + 1), t.wr(4, c), t.wr(5, c), t.rw(6, c), t.rw(7, c), t.rw(8, 1), t.fl(16 * c);
     }},
    {"syncbn_apply_kernel", 13, [](const params &p, tally &t) {
         /* (count, c, plane, bf16, nhwc, x, r, mean, invstd, g, b, y, relu) */
         const double n = p.num(0), c = p.num(1);
         const bool h = p.num(3) != 0;
         t.rda(5, n, h), t.rda(6, n, h), t.rd(7, c), t.rd(8, c), t.rd(9, c), t.rd(10, c), t.wra(11, n, h);
         t.fl(n * (2 + (p.null(6) ? 0 : 1) + (p.num(12) != 0 ? 1 : 0)));
     }},
    {"syncbn_dsums_kernel", 13, [](const params &p, tally &t) {
         /* (n, c, plane, bf16, nhwc, x, act, dy, mean, invstd, sums, dw, db) */
         const double all = p.num(0) * p.num(1) * p.num(2), c = p.num(1);
         const bool h = p.num(3) != 0;
         t.rda(5, all, h), t.rda(6, all, h), t.rda(7, all, h), t.rd(8, c), t.rd(9, c);
         t.wr(10, 2 * c + 1), t.wr(11, c), t.wr(12, c), t.fl(4 * all);
     }},
    {"syncbn_dsums_nhwc_kernel", 15, [](const params &p, tally &t) {
         /* (n, c, plane, bf16, x, act, dy, mean, invstd, partial, tickets, tiles, sums, dw, db) */
         const double all = p.num(0) * p.num(1) * p.num(2), c = p.num(1), parts = c * p.num(11);
         const bool h = p.num(3) != 0;
         t.rda(4, all, h), t.rda(5, all, h), t.rda(6, all, h), t.rd(7, c), t.rd(8, c), t.rw(9, 2 * parts);
         t.rw(10, blocks_of(p)), t.wr(12, 2 * c + 1), t.wr(13, c), t.wr(14, c), t.fl(4 * all + 2 * parts);
     }},
    {"syncbn_dx_kernel", 14, [](const params &p, tally &t) {
         /* (count, c, plane, bf16, nhwc, x, act, dy, mean, invstd, g, sums, dx, acc) */
         const double n = p.num(0), c = p.num(1);
         const bool h = p.num(3) != 0;
         t.rda(5, n, h), t.rda(6, n, h), t.rda(7, n, h), t.rd(8, c), t.rd(9, c), t.rd(10, c);
         t.rd(11, 2 * c + 1), t.wra(12, n, h);
         if (p.num(13) != 0) t.rda(12, n, h), t.fl(n);
         t.fl(6 * n);
     }},
};

const std::unordered_map<std::string, const entry *> &index_of_table(void) {
    static const std::unordered_map<std::string, const entry *> *idx = [] {
        auto *m = new std::unordered_map<std::string, const entry *>;
        for (const entry &e : kTable)
            if (!m->emplace(e.name, &e).second) rt_emu_fatal("kernel_costs: %s has two entries", e.name);
        return m;
    }();
    return *idx;
}

const entry *find(const char *name) {
    const auto &idx = index_of_table();
    auto it = idx.find(name);
    return it == idx.end() ? nullptr : it->second;
}

} // namespace

bool rt_emu_kernel_cost(const char *name, dim3 grid, dim3 block, int nargs, const rt_emu_karg *args,
                        rt_emu_cost *out) {
    const entry *e = find(name);
    if (!e) return false;
    if (nargs != e->nparams)
        rt_emu_fatal("kernel %s: launched with %d parameters, its cost entry (tests/cuda_emu/kernel_costs.cpp) "
                     "reads %d: update the entry",
                     name, nargs, e->nparams);
    const params p{name, nargs, args, grid, block};
    tally t{p, {0, 0, 0, RT_COST_MATH_FP32}};
    e->fn(p, t);
    *out = t.c;
    return true;
}

extern "C" int rt_emu_kernel_cost_known(const char *name) { return name && find(name) != nullptr; }

extern "C" const char *const *rt_emu_kernel_cost_names(size_t *n) {
    static const char *names[sizeof kTable / sizeof kTable[0]];
    for (size_t i = 0; i < sizeof kTable / sizeof kTable[0]; i++) names[i] = kTable[i].name;
    *n = sizeof kTable / sizeof kTable[0];
    return names;
}
