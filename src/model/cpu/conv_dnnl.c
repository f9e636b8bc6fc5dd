/* conv2d through oneDNN primitives (C API), for the CPU backend.
 *
 * Per layer, prepare makes three stages, each one oneDNN primitive:
 *   forward          x, W, b        -> y
 *   backward-weights x, dy          -> dW, db
 *   backward-data    dy, W          -> dx      (written, or added with a sum reorder)
 * for a batch of exactly max_n images (oneDNN's CPU convolutions take no run-time batch
 * size; conv_cpu.c runs smaller batches through im2col instead).
 *
 * Layouts: our interface is plain NCHW / OIHW. The primitives are created with
 * format `any` for activations and weights (RINGTRAIN_DNNL_LAYOUT=plain forces NCHW
 * activations, for measuring), so oneDNN picks its blocked layouts (nChw16c on AVX-512)
 * and its JIT kernels; every argument whose chosen layout differs from ours gets a
 * reorder into or out of a buffer in the shared workspace (weights too: they change
 * every step, so they are reordered once per call, into one copy that the parts fill
 * together, a block of output channels each, and then all read: dn_wsplit). Scratchpads
 * are user-managed, also in the workspace: no buffer is allocated after prepare
 * (oneDNN's execute call still makes small bookkeeping allocations of its own; see
 * docs/model.md).
 *
 * Threads: Debian's oneDNN 2.6 uses the OpenMP runtime (DNNL_CPU_RUNTIME OMP, libgomp).
 * Letting OpenMP's threads run next to our pool's oversubscribed the cores (a step ran
 * up to 8x slower while another process was busy: OpenMP barriers spin on descheduled
 * threads). Instead a layer is split into one part per pool thread, each part with its
 * own primitives, memory objects, stream and workspace region, and each pool thread runs
 * its part single-threaded (omp_set_num_threads(1), looked up at run time: libgomp comes
 * in with libdnnl and we do not link OpenMP ourselves). Forward and backward-data split
 * the images; backward-weights splits the images too where the activations outweigh
 * the weights (each part writes a partial dW, added up in part order afterwards, so the
 * result does not depend on timing), else the output channels (dy is then a strided
 * channel slice; no partial sums). On tiny inputs (no larger than the kernel: 3x3 on 2x2)
 * backward-weights is no convolution at all but a matmul per part and a fold (dn_mm).
 * RINGTRAIN_DNNL_BWW=omp|oc|batch overrides that (omp: one part on oneDNN's OpenMP
 * threads; all three run the convolution primitive), for measuring.
 */
#include "model/cpu/conv_dnnl.h"
#include "model/cpu/cpu_internal.h"

#ifdef RT_HAVE_DNNL

#include "core/log.h"
#include "core/settings.h"

#include <dlfcn.h>
#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rt_dnnl_env {
    dnnl_engine_t engine;
    void (*set_threads)(int); /* omp_set_num_threads, or NULL */
};

#define DN_MAX_ARGS 6
#define DN_MAX_PARTS 64

typedef struct dn_arg {
    int arg;     /* DNNL_ARG_* */
    bool output; /* written by the primitive */
    bool shared; /* inner is the layer's shared weights copy at `shared_off` in the
                    workspace, filled before the stage runs (dn_wsplit) */
    size_t shared_off;
    dnnl_memory_t user;           /* our plain layout; handle set per call */
    dnnl_memory_t inner;          /* the primitive's layout in the workspace, or NULL: use `user` */
    dnnl_primitive_t reorder;     /* input: user -> inner; output: inner -> user; NULL when same layout */
    dnnl_primitive_t reorder_sum; /* output that may accumulate: inner -> user, adding */
    size_t off;                   /* of inner in the part's region */
    bool reused;                  /* input already in inner, put there by the stage run before (dy of
                                     backward-data, reordered by backward-weights): no reorder */
} dn_arg;

typedef struct dn_stage {
    dnnl_primitive_t prim;
    dn_arg args[DN_MAX_ARGS];
    int nargs;
    dnnl_memory_t scratch; /* NULL when none */
    size_t scratch_off;
    size_t bytes; /* of the part's region this stage uses */
} dn_stage;

/* The weights of forward or backward-data, reordered once per call into one buffer that
 * all parts read: part t converts output channels [o0, o0+ob) of them (a block of the
 * blocked layout, so the parts write disjoint bytes), then every part runs its stage.
 * Each part converting all the weights for itself did the same work `nparts` times
 * (ResNet34's 256x256 3x3 weights: 4 reorders a step where 2 suffice). */
typedef struct dn_wsplit {
    bool on;
    size_t off;                                            /* of the shared copy in the workspace */
    int warg;                                              /* index of the weights argument in the stage */
    dnnl_memory_t user[DN_MAX_PARTS], inner[DN_MAX_PARTS]; /* part t's channel block of each */
    dnnl_primitive_t reorder[DN_MAX_PARTS];
} dn_wsplit;

/* One task's share of a layer: images [n0, n0+nb) in forward and backward-data,
 * output channels [o0, o0+ob) of backward-weights (all images: no reduction). */
typedef struct dn_part {
    int n0, nb, o0, ob;
    dnnl_stream_t stream;
    dn_stage fwd, bww, bwd;
    /* backward-weights as a matmul (dn_mm): rows [o0*P, (o0+ob)*P) of dW' = dy^T rows x */
    rt_dnnl_mm *mm;
    size_t region; /* offset of its buffers in the workspace */
} dn_part;

struct rt_dnnl_conv {
    int max_n, nparts;
    bool bf16;      /* bf16 src/weights/dst, fp32 accumulation and weight gradient */
    int bww_parts;  /* nparts, or 1: backward-weights in part 0 on oneDNN's OpenMP threads */
    bool bww_batch; /* backward-weights split by images (partial dW summed), else by output channels */
    size_t wfloats, partial_off, partial_stride; /* dW + db floats; partial sums of parts 1.. in the workspace */
    size_t ws;                                   /* workspace bytes of all parts */
    dn_part part[DN_MAX_PARTS];
    dn_wsplit wsplit[2];                    /* forward's and backward-data's weights (dn_wsplit) */
    bool bww_mm;                            /* backward-weights as one matmul per part, then folded (dn_mm) */
    size_t mm_dwd_off, mm_x_off, mm_dy_off; /* dW' (f32), bf16 x and dy (bf16 only) in the workspace */
    char impl[3][48];                       /* oneDNN implementation names, for the log */
};

static const char *dn_status_name(dnnl_status_t s) {
    switch (s) {
    case dnnl_success:
        return "success";
    case dnnl_out_of_memory:
        return "out_of_memory";
    case dnnl_invalid_arguments:
        return "invalid_arguments";
    case dnnl_unimplemented:
        return "unimplemented";
    case dnnl_iterator_ends:
        return "iterator_ends";
    case dnnl_runtime_error:
        return "runtime_error";
    case dnnl_not_required:
        return "not_required";
    default:
        return "unknown";
    }
}

#define DN_CHECK(call)                                                                                                 \
    do {                                                                                                               \
        dnnl_status_t dn_s_ = (call);                                                                                  \
        if (dn_s_ != dnnl_success)                                                                                     \
            return rt_error_set(dn_s_ == dnnl_unimplemented ? RT_ERR_UNSUPPORTED : RT_ERR_INTERNAL, __FILE__,          \
                                __LINE__, NULL, "oneDNN %s: %s", #call, dn_status_name(dn_s_));                        \
    } while (0)

rt_status rt_dnnl_env_create(rt_dnnl_env **out) {
    *out = NULL;
    rt_dnnl_env *e = calloc(1, sizeof *e);
    RT_CHECK_ALLOC(e, sizeof *e);
    *(void **)&e->set_threads = dlsym(RTLD_DEFAULT, "omp_set_num_threads");
    dnnl_status_t s = dnnl_engine_create(&e->engine, dnnl_cpu, 0);
    if (s != dnnl_success) {
        free(e);
        RT_FAIL(RT_ERR_INTERNAL, "oneDNN CPU engine: %s", dn_status_name(s));
    }
    *out = e;
    return RT_OK;
}

void rt_dnnl_env_destroy(rt_dnnl_env *e) {
    if (!e) return;
    if (e->engine) dnnl_engine_destroy(e->engine);
    free(e);
}

static void stage_destroy(dn_stage *st) {
    if (st->prim) dnnl_primitive_destroy(st->prim);
    for (int i = 0; i < st->nargs; i++) {
        dn_arg *a = &st->args[i];
        if (a->user) dnnl_memory_destroy(a->user);
        if (a->inner) dnnl_memory_destroy(a->inner);
        if (a->reorder) dnnl_primitive_destroy(a->reorder);
        if (a->reorder_sum) dnnl_primitive_destroy(a->reorder_sum);
    }
    if (st->scratch) dnnl_memory_destroy(st->scratch);
    memset(st, 0, sizeof *st);
}

static void wsplit_destroy(dn_wsplit *w) {
    for (int t = 0; t < DN_MAX_PARTS; t++) {
        if (w->user[t]) dnnl_memory_destroy(w->user[t]);
        if (w->inner[t]) dnnl_memory_destroy(w->inner[t]);
        if (w->reorder[t]) dnnl_primitive_destroy(w->reorder[t]);
    }
    memset(w, 0, sizeof *w);
}

void rt_dnnl_conv_destroy(rt_dnnl_conv *c) {
    if (!c) return;
    wsplit_destroy(&c->wsplit[0]);
    wsplit_destroy(&c->wsplit[1]);
    for (int t = 0; t < c->nparts; t++) {
        dn_part *p = &c->part[t];
        stage_destroy(&p->fwd);
        stage_destroy(&p->bww);
        stage_destroy(&p->bwd);
        rt_dnnl_mm_destroy(p->mm);
        if (p->stream) dnnl_stream_destroy(p->stream);
    }
    free(c);
}

int rt_dnnl_conv_batch(const rt_dnnl_conv *c) { return c->max_n; }

bool rt_dnnl_sgemm(rt_dnnl_env *e, bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
                   const float *b, int ldb, float beta, float *c, int ldc) {
    if (!e) return false;
    if (e->set_threads) e->set_threads(1);
    return dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) == dnnl_success;
}

struct rt_dnnl_mm {
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, scratch; /* handles set per run; scratch NULL when none */
    dnnl_stream_t stream;
    int threads;
};

void rt_dnnl_mm_destroy(rt_dnnl_mm *mm) {
    if (!mm) return;
    if (mm->prim) dnnl_primitive_destroy(mm->prim);
    if (mm->a) dnnl_memory_destroy(mm->a);
    if (mm->b) dnnl_memory_destroy(mm->b);
    if (mm->c) dnnl_memory_destroy(mm->c);
    if (mm->scratch) dnnl_memory_destroy(mm->scratch);
    if (mm->stream) dnnl_stream_destroy(mm->stream);
    free(mm);
}

rt_status rt_dnnl_mm_create(rt_dnnl_env *e, bool bf16, int threads, int m, int n, int k, const int64_t as[2],
                            const int64_t bs[2], int64_t ldc, size_t *scratch_bytes, rt_dnnl_mm **out) {
    *out = NULL;
    *scratch_bytes = 0;
    if (e->set_threads) e->set_threads(threads);
    const dnnl_data_type_t lp = bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t a, b, cm;
    dnnl_dims_t ad = {m, k}, bd = {k, n}, cd = {m, n}, ast = {as[0], as[1]}, bst = {bs[0], bs[1]}, cst = {ldc, 1};
    DN_CHECK(dnnl_memory_desc_init_by_strides(&a, 2, ad, lp, ast));
    DN_CHECK(dnnl_memory_desc_init_by_strides(&b, 2, bd, lp, bst));
    DN_CHECK(dnnl_memory_desc_init_by_strides(&cm, 2, cd, dnnl_f32, cst));
    dnnl_matmul_desc_t md;
    DN_CHECK(dnnl_matmul_desc_init(&md, &a, &b, NULL, &cm));
    rt_dnnl_mm *mm = calloc(1, sizeof *mm);
    RT_CHECK_ALLOC(mm, sizeof *mm);
    mm->threads = threads;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t s = dnnl_primitive_attr_create(&attr);
    if (s == dnnl_success) s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &md, attr, e->engine, NULL);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (s == dnnl_success) {
        const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        *scratch_bytes = sp ? dnnl_memory_desc_get_size(sp) : 0;
        if (*scratch_bytes > 0) s = dnnl_memory_create(&mm->scratch, sp, e->engine, DNNL_MEMORY_NONE);
    }
    if (s == dnnl_success) s = dnnl_memory_create(&mm->a, &a, e->engine, DNNL_MEMORY_NONE);
    if (s == dnnl_success) s = dnnl_memory_create(&mm->b, &b, e->engine, DNNL_MEMORY_NONE);
    if (s == dnnl_success) s = dnnl_memory_create(&mm->c, &cm, e->engine, DNNL_MEMORY_NONE);
    if (s == dnnl_success) s = dnnl_stream_create(&mm->stream, e->engine, dnnl_stream_default_flags);
    if (s == dnnl_success) s = dnnl_primitive_create(&mm->prim, pd);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (s != dnnl_success) {
        rt_dnnl_mm_destroy(mm);
        RT_FAIL(s == dnnl_unimplemented ? RT_ERR_UNSUPPORTED : RT_ERR_INTERNAL,
                "oneDNN %s matmul %dx%d x %dx%d (strides %lld,%lld and %lld,%lld): %s", bf16 ? "bf16" : "f32", m, k, k,
                n, (long long)as[0], (long long)as[1], (long long)bs[0], (long long)bs[1], dn_status_name(s));
    }
    *out = mm;
    return RT_OK;
}

bool rt_dnnl_mm_run(rt_dnnl_env *e, rt_dnnl_mm *mm, const void *a, const void *b, float *c, void *scratch) {
    if (e->set_threads) e->set_threads(mm->threads);
    if (dnnl_memory_set_data_handle(mm->a, (void *)a) != dnnl_success ||
        dnnl_memory_set_data_handle(mm->b, (void *)b) != dnnl_success ||
        dnnl_memory_set_data_handle(mm->c, c) != dnnl_success ||
        (mm->scratch && dnnl_memory_set_data_handle(mm->scratch, scratch) != dnnl_success))
        return false;
    dnnl_exec_arg_t ex[4] = {{DNNL_ARG_SRC, mm->a}, {DNNL_ARG_WEIGHTS, mm->b}, {DNNL_ARG_DST, mm->c}};
    int nex = 3;
    if (mm->scratch) ex[nex++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, mm->scratch};
    return dnnl_primitive_execute(mm->prim, mm->stream, nex, ex) == dnnl_success &&
           dnnl_stream_wait(mm->stream) == dnnl_success;
}

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

static rt_status make_reorder(rt_dnnl_env *e, const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to, bool sum,
                              dnnl_primitive_t *out) {
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t s = dnnl_primitive_attr_create(&attr);
    if (s == dnnl_success) s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (s == dnnl_success && sum) {
        s = dnnl_post_ops_create(&po);
        if (s == dnnl_success) s = dnnl_post_ops_append_sum(po, 1.0f);
        if (s == dnnl_success) s = dnnl_primitive_attr_set_post_ops(attr, po);
    }
    if (s == dnnl_success) s = dnnl_reorder_primitive_desc_create(&pd, from, e->engine, to, e->engine, attr);
    if (s == dnnl_success) {
        /* we give reorders no scratchpad: one that wants one is not used */
        const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        if (sp && dnnl_memory_desc_get_size(sp) > 0) s = dnnl_unimplemented;
    }
    if (s == dnnl_success) s = dnnl_primitive_create(out, pd);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    RT_REQUIRE(s == dnnl_success, s == dnnl_unimplemented ? RT_ERR_UNSUPPORTED : RT_ERR_INTERNAL,
               "oneDNN reorder%s: %s", sum ? " with sum" : "", dn_status_name(s));
    return RT_OK;
}

/* Add argument `arg` of primitive descriptor pd to the stage: `user` is our layout of
 * it; an inner buffer and reorders are made when the primitive wants another layout
 * (or, for an output that may accumulate, always). */
static rt_status stage_arg(rt_dnnl_env *e, dn_stage *st, const_dnnl_primitive_desc_t pd, int arg,
                           const dnnl_memory_desc_t *user, bool output, bool may_accumulate) {
    RT_REQUIRE(st->nargs < DN_MAX_ARGS, RT_ERR_INTERNAL, "too many oneDNN arguments");
    dn_arg *a = &st->args[st->nargs++];
    a->arg = arg;
    a->output = output;
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, arg);
    RT_REQUIRE(md != NULL, RT_ERR_INTERNAL, "oneDNN: no memory descriptor for argument %d", arg);
    DN_CHECK(dnnl_memory_create(&a->user, user, e->engine, DNNL_MEMORY_NONE));
    bool same = dnnl_memory_desc_equal(md, user);
    if (same && !(output && may_accumulate)) return RT_OK;
    DN_CHECK(dnnl_memory_create(&a->inner, md, e->engine, DNNL_MEMORY_NONE));
    a->off = st->bytes;
    st->bytes = align64(st->bytes + dnnl_memory_desc_get_size(md));
    if (!same)
        RT_CHECK(output ? make_reorder(e, md, user, false, &a->reorder)
                        : make_reorder(e, user, md, false, &a->reorder));
    if (output && may_accumulate) RT_CHECK(make_reorder(e, md, user, true, &a->reorder_sum));
    return RT_OK;
}

static rt_status stage_finish(rt_dnnl_env *e, dn_stage *st, const_dnnl_primitive_desc_t pd, char *impl,
                              size_t impl_len) {
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t sb = sp ? dnnl_memory_desc_get_size(sp) : 0;
    if (sb > 0) {
        DN_CHECK(dnnl_memory_create(&st->scratch, sp, e->engine, DNNL_MEMORY_NONE));
        st->scratch_off = st->bytes;
        st->bytes = align64(st->bytes + sb);
    }
    const char *name = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name) == dnnl_success && name)
        snprintf(impl, impl_len, "%s", name);
    DN_CHECK(dnnl_primitive_create(&st->prim, pd));
    return RT_OK;
}

/* Run a stage with its buffers at `region`: set the handles, reorder inputs in, run,
 * reorder outputs out. ptrs[i] is our pointer for args[i]; a shared argument is already
 * in its layout at ws + shared_off. */
static dnnl_status_t stage_run(dnnl_stream_t stream, dn_stage *st, char *region, char *ws, void *const *ptrs,
                               bool accumulate) {
    dnnl_exec_arg_t ex[DN_MAX_ARGS + 1];
    int nex = 0;
    dnnl_status_t s;
#define DN_RUN(call)                                                                                                   \
    do {                                                                                                               \
        if ((s = (call)) != dnnl_success) return s;                                                                    \
    } while (0)
    for (int i = 0; i < st->nargs; i++) {
        dn_arg *a = &st->args[i];
        DN_RUN(dnnl_memory_set_data_handle(a->user, ptrs[i]));
        dnnl_memory_t m = a->user;
        /* an output written (not added) in our layout goes straight to the user */
        bool direct = !a->inner || (a->output && !a->reorder && !accumulate);
        if (a->shared) {
            DN_RUN(dnnl_memory_set_data_handle(a->inner, ws + a->shared_off));
            m = a->inner;
        } else if (!direct) {
            DN_RUN(dnnl_memory_set_data_handle(a->inner, region + a->off));
            m = a->inner;
            if (!a->output && !a->reused) {
                dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, a->user}, {DNNL_ARG_TO, a->inner}};
                DN_RUN(dnnl_primitive_execute(a->reorder, stream, 2, r));
            }
        }
        ex[nex++] = (dnnl_exec_arg_t){a->arg, m};
    }
    if (st->scratch) {
        DN_RUN(dnnl_memory_set_data_handle(st->scratch, region + st->scratch_off));
        ex[nex++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, st->scratch};
    }
    DN_RUN(dnnl_primitive_execute(st->prim, stream, nex, ex));
    for (int i = 0; i < st->nargs; i++) {
        dn_arg *a = &st->args[i];
        if (!a->output || !a->inner) continue;
        dnnl_primitive_t r = accumulate && a->reorder_sum ? a->reorder_sum : a->reorder;
        if (!r) continue; /* written directly */
        dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, a->inner}, {DNNL_ARG_TO, a->user}};
        DN_RUN(dnnl_primitive_execute(r, stream, 2, ra));
    }
    return dnnl_stream_wait(stream);
#undef DN_RUN
}

static rt_status pd_create(rt_dnnl_env *e, const dnnl_convolution_desc_t *cd, const_dnnl_primitive_desc_t hint,
                           dnnl_primitive_desc_t *pd) {
    dnnl_primitive_attr_t attr = NULL;
    DN_CHECK(dnnl_primitive_attr_create(&attr));
    dnnl_status_t s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(pd, cd, attr, e->engine, hint);
    dnnl_primitive_attr_destroy(attr);
    RT_REQUIRE(s == dnnl_success, s == dnnl_unimplemented ? RT_ERR_UNSUPPORTED : RT_ERR_INTERNAL,
               "oneDNN convolution primitive descriptor: %s", dn_status_name(s));
    return RT_OK;
}

/* The descriptors of a conv of n images and `oc` of the layer's output channels:
 * ours (plain, dy possibly a channel slice of the whole tensor) and `any`. */
typedef struct dn_descs {
    dnnl_memory_desc_t x, y, w, b;          /* ours */
    dnnl_memory_desc_t x_any, y_any, w_any; /* what the primitives may choose (bf16 under bf16) */
    dnnl_memory_desc_t b_in;                /* the forward's bias (bf16 under bf16) */
    dnnl_memory_desc_t dw_any;              /* the weight gradient: f32 always */
    dnnl_dims_t strides, pad_l, pad_r;
} dn_descs;

static rt_status make_descs(const rt_conv2d *l, int n, int oc, bool plain, bool bf16, dn_descs *d) {
    const dnnl_data_type_t lp = bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_dims_t xd = {n, l->in_c, l->in_h, l->in_w}, yd = {n, oc, l->out_h, l->out_w}, wd = {oc, l->in_c, l->k, l->k},
                bd = {oc};
    const dnnl_dim_t P = (dnnl_dim_t)l->out_h * l->out_w;
    dnnl_dims_t ys = {l->out_c * P, P, l->out_w, 1}; /* a channel slice of the whole (n, O, OH, OW) */
    DN_CHECK(dnnl_memory_desc_init_by_tag(&d->x, 4, xd, dnnl_f32, dnnl_nchw));
    DN_CHECK(dnnl_memory_desc_init_by_strides(&d->y, 4, yd, dnnl_f32, ys));
    DN_CHECK(dnnl_memory_desc_init_by_tag(&d->w, 4, wd, dnnl_f32, dnnl_oihw));
    DN_CHECK(dnnl_memory_desc_init_by_tag(&d->b, 1, bd, dnnl_f32, dnnl_a));
    DN_CHECK(dnnl_memory_desc_init_by_tag(&d->x_any, 4, xd, lp, plain ? dnnl_nchw : dnnl_format_tag_any));
    DN_CHECK(dnnl_memory_desc_init_by_tag(&d->y_any, 4, yd, lp, plain ? dnnl_nchw : dnnl_format_tag_any));
    DN_CHECK(dnnl_memory_desc_init_by_tag(&d->w_any, 4, wd, lp, dnnl_format_tag_any));
    DN_CHECK(dnnl_memory_desc_init_by_tag(&d->dw_any, 4, wd, dnnl_f32, dnnl_format_tag_any));
    DN_CHECK(dnnl_memory_desc_init_by_tag(&d->b_in, 1, bd, lp, dnnl_a));
    d->strides[0] = d->strides[1] = l->stride;
    d->pad_l[0] = d->pad_l[1] = l->pad;
    /* right padding so that out = (in + pad_l + pad_r - k) / stride + 1 exactly */
    d->pad_r[0] = (dnnl_dim_t)(l->out_h - 1) * l->stride + l->k - l->in_h - l->pad;
    d->pad_r[1] = (dnnl_dim_t)(l->out_w - 1) * l->stride + l->k - l->in_w - l->pad;
    return RT_OK;
}

#define DN_GOTO(call)                                                                                                  \
    do {                                                                                                               \
        dnnl_status_t dn_s_ = (call);                                                                                  \
        if (dn_s_ != dnnl_success) {                                                                                   \
            st = rt_error_set(dn_s_ == dnnl_unimplemented ? RT_ERR_UNSUPPORTED : RT_ERR_INTERNAL, __FILE__, __LINE__,  \
                              NULL, "oneDNN %s: %s", #call, dn_status_name(dn_s_));                                    \
            goto out;                                                                                                  \
        }                                                                                                              \
    } while (0)

/* the stages of one part */
static rt_status part_build(rt_dnnl_env *e, const rt_conv2d *l, int max_n, bool plain, bool with_bww, dn_part *p,
                            rt_dnnl_conv *c) {
    dn_descs d, dw;
    RT_CHECK(make_descs(l, p->nb, l->out_c, plain, c->bf16, &d));
    RT_CHECK(make_descs(l, c->bww_batch ? p->nb : max_n, p->ob, plain, c->bf16, &dw));
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t fpd = NULL, hpd = NULL, wpd = NULL, dpd = NULL;
    rt_status st = RT_OK;
    DN_CHECK(dnnl_stream_create(&p->stream, e->engine, dnnl_stream_default_flags));

    DN_CHECK(dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct, &d.x_any, &d.w_any,
                                                l->has_bias ? &d.b_in : NULL, &d.y_any, d.strides, d.pad_l, d.pad_r));
    RT_CHECK(pd_create(e, &cd, NULL, &fpd));
    RT_CHECK_GOTO(stage_arg(e, &p->fwd, fpd, DNNL_ARG_SRC, &d.x, false, false), st, out);
    RT_CHECK_GOTO(stage_arg(e, &p->fwd, fpd, DNNL_ARG_WEIGHTS, &d.w, false, false), st, out);
    if (l->has_bias) RT_CHECK_GOTO(stage_arg(e, &p->fwd, fpd, DNNL_ARG_BIAS, &d.b, false, false), st, out);
    RT_CHECK_GOTO(stage_arg(e, &p->fwd, fpd, DNNL_ARG_DST, &d.y, true, false), st, out);
    RT_CHECK_GOTO(stage_finish(e, &p->fwd, fpd, c->impl[0], sizeof c->impl[0]), st, out);

    /* backward-weights of the part's output channels over the whole batch; its forward
     * descriptor is only the hint oneDNN wants */
    if (!with_bww) goto bwd;
    DN_GOTO(dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct, &dw.x_any,
                                               &dw.w_any, l->has_bias ? &dw.b_in : NULL, &dw.y_any, dw.strides,
                                               dw.pad_l, dw.pad_r));
    RT_CHECK_GOTO(pd_create(e, &cd, NULL, &hpd), st, out);
    DN_GOTO(dnnl_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &dw.x_any, &dw.dw_any,
                                                        l->has_bias ? &dw.b : NULL, &dw.y_any, dw.strides, dw.pad_l,
                                                        dw.pad_r));
    RT_CHECK_GOTO(pd_create(e, &cd, hpd, &wpd), st, out);
    RT_CHECK_GOTO(stage_arg(e, &p->bww, wpd, DNNL_ARG_SRC, &dw.x, false, false), st, out);
    RT_CHECK_GOTO(stage_arg(e, &p->bww, wpd, DNNL_ARG_DIFF_DST, &dw.y, false, false), st, out);
    RT_CHECK_GOTO(stage_arg(e, &p->bww, wpd, DNNL_ARG_DIFF_WEIGHTS, &dw.w, true, false), st, out);
    if (l->has_bias) RT_CHECK_GOTO(stage_arg(e, &p->bww, wpd, DNNL_ARG_DIFF_BIAS, &dw.b, true, false), st, out);
    RT_CHECK_GOTO(stage_finish(e, &p->bww, wpd, c->impl[1], sizeof c->impl[1]), st, out);
bwd:

    DN_GOTO(dnnl_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &d.x_any, &d.w_any, &d.y_any,
                                                     d.strides, d.pad_l, d.pad_r));
    RT_CHECK_GOTO(pd_create(e, &cd, fpd, &dpd), st, out);
    RT_CHECK_GOTO(stage_arg(e, &p->bwd, dpd, DNNL_ARG_DIFF_DST, &d.y, false, false), st, out);
    /* Split by images, backward-weights has just reordered the same images of dy
     * (rt_dnnl_conv_backward runs it first): where backward-data wants them in the same
     * layout it reads that copy instead of reordering dy again, and its own buffers go
     * after all of backward-weights' (one activation reorder of six per layer and step) */
    if (with_bww && c->bww_batch && p->bww.args[1].arg == DNNL_ARG_DIFF_DST && p->bww.args[1].reorder &&
        p->bwd.args[0].reorder) {
        const dnnl_memory_desc_t *have = NULL, *want = NULL;
        DN_GOTO(dnnl_memory_get_memory_desc(p->bww.args[1].inner, &have));
        DN_GOTO(dnnl_memory_get_memory_desc(p->bwd.args[0].inner, &want));
        if (dnnl_memory_desc_equal(have, want)) {
            p->bwd.args[0].off = p->bww.args[1].off;
            p->bwd.args[0].reused = true;
            p->bwd.bytes = p->bww.bytes;
        }
    }
    RT_CHECK_GOTO(stage_arg(e, &p->bwd, dpd, DNNL_ARG_WEIGHTS, &d.w, false, false), st, out);
    RT_CHECK_GOTO(stage_arg(e, &p->bwd, dpd, DNNL_ARG_DIFF_SRC, &d.x, true, true), st, out);
    RT_CHECK_GOTO(stage_finish(e, &p->bwd, dpd, c->impl[2], sizeof c->impl[2]), st, out);
out:
    if (fpd) dnnl_primitive_desc_destroy(fpd);
    if (hpd) dnnl_primitive_desc_destroy(hpd);
    if (wpd) dnnl_primitive_desc_destroy(wpd);
    if (dpd) dnnl_primitive_desc_destroy(dpd);
    return st;
}

static void part_range(int total, int parts, int unit, int t, int *lo, int *len) {
    int units = total / unit;
    int a = (int)((long)units * t / parts), b = (int)((long)units * (t + 1) / parts);
    *lo = a * unit;
    *len = (t == parts - 1 ? total : b * unit) - *lo;
}

/* Share the weights reorder of forward (k 0) or backward-data (k 1) among the parts
 * (dn_wsplit): where every part wants them reordered into the same layout and the output
 * channels split into whole 16-channel blocks, at least one per part (not necessarily
 * as many in each: 64 channels on 3 threads are 1 + 1 + 2 blocks). The copy goes at
 * *region (advanced). Anything oneDNN cannot do here leaves each part reordering for
 * itself, as before. */
static rt_status wsplit_build(rt_dnnl_env *e, const rt_conv2d *l, rt_dnnl_conv *c, int k, size_t *region) {
    dn_wsplit *w = &c->wsplit[k];
    const int T = c->nparts;
    if (T < 2 || l->out_c % 16 != 0 || l->out_c / 16 < T) return RT_OK; /* every part a whole block or more */
    dn_stage *st0 = k == 0 ? &c->part[0].fwd : &c->part[0].bwd;
    w->warg = -1;
    for (int i = 0; i < st0->nargs; i++)
        if (st0->args[i].arg == DNNL_ARG_WEIGHTS) w->warg = i;
    if (w->warg < 0 || !st0->args[w->warg].reorder) return RT_OK; /* no reorder to share */
    const dnnl_memory_desc_t *umd = NULL, *imd = NULL, *md_t = NULL;
    DN_CHECK(dnnl_memory_get_memory_desc(st0->args[w->warg].user, &umd));
    DN_CHECK(dnnl_memory_get_memory_desc(st0->args[w->warg].inner, &imd));
    /* a padded layout is not shared: setting a memory's handle zero-fills its padding,
     * and the parts would do that to one buffer while the others read it */
    for (int d = 0; d < imd->ndims; d++)
        if (imd->padded_dims[d] != imd->dims[d]) return RT_OK;
    for (int t = 1; t < T; t++) {
        dn_arg *a = &(k == 0 ? &c->part[t].fwd : &c->part[t].bwd)->args[w->warg];
        if (!a->inner || !a->reorder) return RT_OK;
        DN_CHECK(dnnl_memory_get_memory_desc(a->inner, &md_t));
        if (!dnnl_memory_desc_equal(md_t, imd)) return RT_OK;
    }
    rt_status st = RT_OK;
    for (int t = 0; t < T && st == RT_OK; t++) {
        int o0, ob;
        part_range(l->out_c, T, 16, t, &o0, &ob);
        dnnl_dims_t dims = {ob, l->in_c, l->k, l->k}, offs = {o0, 0, 0, 0};
        dnnl_memory_desc_t us, is;
        dnnl_status_t s = dnnl_memory_desc_init_submemory(&us, umd, dims, offs);
        if (s == dnnl_success) s = dnnl_memory_desc_init_submemory(&is, imd, dims, offs);
        if (s == dnnl_success) s = dnnl_memory_create(&w->user[t], &us, e->engine, DNNL_MEMORY_NONE);
        if (s == dnnl_success) s = dnnl_memory_create(&w->inner[t], &is, e->engine, DNNL_MEMORY_NONE);
        if (s != dnnl_success)
            st = rt_error_set(RT_ERR_UNSUPPORTED, __FILE__, __LINE__, NULL, "oneDNN weights block %d: %s", t,
                              dn_status_name(s));
        if (st == RT_OK) st = make_reorder(e, &us, &is, false, &w->reorder[t]);
    }
    if (st != RT_OK) {
        RT_LOG_DEBUG("conv2d %d->%d k%d: %s weights reorder not shared among the parts (%s)", l->in_c, l->out_c, l->k,
                     k == 0 ? "forward" : "backward-data", rt_error_message());
        rt_error_clear();
        wsplit_destroy(w);
        return RT_OK;
    }
    w->on = true;
    w->off = *region;
    *region += align64(dnnl_memory_desc_get_size(imd));
    for (int t = 0; t < T; t++) {
        dn_arg *a = &(k == 0 ? &c->part[t].fwd : &c->part[t].bwd)->args[w->warg];
        a->shared = true;
        a->shared_off = w->off;
    }
    return RT_OK;
}

/* Backward-weights of a layer on a tiny input (ResNet's layer3 at 28x28: 3x3 on 2x2) as
 * a matrix product (dn_mm). oneDNN's convolution kernels run it at a small share of the
 * machine there (256x256 on 2x2, batch 64: ~1 ms per part in bf16 and fp32 alike, the
 * layer's forward ~0.2 ms), where its matmul reaches ~470 GFLOP/s in bf16 (~240 f32) on
 * one core. NCHW already stores dy as (n, O*P) and x as (n, C*IP), so
 *   dW' (O*P, C*IP) = dy^T x        (one sum over the images per element, in fp32)
 * holds, for each output position p and input position q, the gradient of the one tap
 * that joins them; conv_cpu.c's fold (the dense path's) adds them into dW (O, C, k, k),
 * over the positions in order. The sums run over only the taps that read the image (4
 * of 9 on 2x2), and dW' is 16/9 the weights. Part t computes rows [o0*P, (o0+ob)*P)
 * over all images. Under bf16 the matmul reads bf16 copies of x and dy (each part packs
 * its own images first), as the convolution did. */
static bool mm_wanted(const rt_conv2d *l) {
    const size_t P = (size_t)l->out_h * l->out_w, IP = (size_t)l->in_h * l->in_w;
    return !l->has_bias && IP <= (size_t)l->k * l->k && (size_t)l->out_c * P * l->in_c * IP <= ((size_t)4 << 20);
}

static rt_status mm_build(rt_dnnl_env *e, const rt_conv2d *l, int max_n, bool bf16, int threads, dn_part *p,
                          size_t *bytes) {
    const int64_t P = (int64_t)l->out_h * l->out_w, N = (int64_t)l->in_c * l->in_h * l->in_w;
    /* dy^T: a column slice of (n, O*P); x (n, N); dW' rows (ob*P, N) */
    const int64_t as[2] = {1, (int64_t)l->out_c * P}, bs[2] = {N, 1};
    return rt_dnnl_mm_create(e, bf16, threads, p->ob * P, N, max_n, as, bs, N, bytes, &p->mm);
}

/* allow_mm: backward-weights may be the matmul where mm_wanted says so */
static rt_status conv_create(rt_dnnl_env *e, const rt_conv2d *l, int max_n, int threads, bool bf16, bool allow_mm,
                             size_t *workspace, rt_dnnl_conv **out) {
    *out = NULL;
    enum { BWW_AUTO, BWW_OMP, BWW_OC, BWW_BATCH }; /* RINGTRAIN_DNNL_BWW's choices, in order */
    int bw = BWW_AUTO, layout = 0;                 /* RINGTRAIN_DNNL_LAYOUT: auto (0) | plain (1) */
    RT_CHECK(rt_setting_choice(RT_SET_DNNL_BWW, &bw));
    RT_CHECK(rt_setting_choice(RT_SET_DNNL_LAYOUT, &layout));
    rt_dnnl_conv *c = calloc(1, sizeof *c);
    RT_CHECK_ALLOC(c, sizeof *c);
    c->max_n = max_n;
    c->bf16 = bf16;
    int T = threads;
    if (T > max_n) T = max_n;
    if (T > l->out_c) T = l->out_c;
    if (T > DN_MAX_PARTS) T = DN_MAX_PARTS;
    if (T < 1) T = 1;
    /* output channels split in multiples of 16 (oneDNN's AVX-512 block) when they can */
    const int unit = l->out_c % (16 * T) == 0 ? 16 : 1;
    c->bww_parts = bw == BWW_OMP ? 1 : T;
    /* backward-weights: split by images where the activations outweigh the weights
     * (ResNet's layer1/layer2: each part then reorders only its own images), else by
     * output channels (no partial sums of large weights to add up) */
    c->wfloats = (size_t)l->out_c * l->in_c * l->k * l->k + (l->has_bias ? (size_t)l->out_c : 0);
    const size_t xfloats = (size_t)max_n * l->in_c * l->in_h * l->in_w;
    c->bww_batch = c->bww_parts > 1 && (bw != BWW_AUTO ? bw == BWW_BATCH : xfloats > c->wfloats);
    c->bww_mm = allow_mm && bw == BWW_AUTO && mm_wanted(l); /* (RINGTRAIN_DNNL_BWW=oc|batch|omp: the convolution) */
    if (c->bww_mm) c->bww_batch = false;
    const bool plain = layout == 1;
    /* oneDNN plans a primitive (blocking, reduction order) for the OpenMP thread count of
     * the creating thread; by default that follows the CPU affinity mask (1 under mpirun's
     * core binding, all cores otherwise), which made results depend on the launcher. Plan
     * for the count the parts run with. */
    if (e->set_threads) e->set_threads(T == 1 ? threads : 1);
    rt_status st = RT_OK;
    size_t region = 0;
    for (int t = 0; t < T && st == RT_OK; t++) {
        dn_part *p = &c->part[t];
        c->nparts = t + 1;
        part_range(max_n, T, 1, t, &p->n0, &p->nb);
        if (c->bww_batch) {
            p->o0 = 0;
            p->ob = l->out_c;
        } else {
            part_range(l->out_c, c->bww_parts, unit, t, &p->o0, &p->ob);
        }
        st = part_build(e, l, max_n, plain, t < c->bww_parts && !c->bww_mm, p, c);
        size_t mmb = 0;
        if (st == RT_OK && c->bww_mm) st = mm_build(e, l, max_n, bf16, T == 1 ? threads : 1, p, &mmb);
        size_t b = p->fwd.bytes > mmb ? p->fwd.bytes : mmb; /* (the scratchpad at the region's start) */
        if (p->bww.bytes > b) b = p->bww.bytes;
        if (p->bwd.bytes > b) b = p->bwd.bytes;
        p->region = region;
        region += align64(b);
    }
    if (st != RT_OK) {
        rt_dnnl_conv_destroy(c);
        return st;
    }
    for (int k = 0; k < 2 && st == RT_OK; k++) st = wsplit_build(e, l, c, k, &region);
    if (st != RT_OK) {
        rt_dnnl_conv_destroy(c);
        return st;
    }
    if (c->bww_mm) {
        const size_t P = (size_t)l->out_h * l->out_w, IP = (size_t)l->in_h * l->in_w;
        c->mm_dwd_off = region;
        region += align64((size_t)l->out_c * P * l->in_c * IP * sizeof(float));
        if (bf16) {
            c->mm_x_off = region;
            region += align64((size_t)max_n * l->in_c * IP * sizeof(uint16_t));
            c->mm_dy_off = region;
            region += align64((size_t)max_n * l->out_c * P * sizeof(uint16_t));
        }
    }
    if (c->bww_batch) {
        c->partial_off = region;
        c->partial_stride = align64(c->wfloats * sizeof(float));
        region += (size_t)(T - 1) * c->partial_stride;
    }
    *workspace = c->ws = region;
    RT_LOG_DEBUG("conv2d %d->%d k%d s%d on %dx%d, batch %d in %d parts, %s: oneDNN %s / %s / %s, workspace %zu bytes",
                 l->in_c, l->out_c, l->k, l->stride, l->in_h, l->in_w, max_n, T, bf16 ? "bf16" : "f32", c->impl[0],
                 c->bww_mm ? "matmul + fold" : c->impl[1], c->impl[2], region);
    *out = c;
    return RT_OK;
}

rt_status rt_dnnl_conv_create(rt_dnnl_env *e, const rt_conv2d *l, int max_n, int threads, bool bf16, size_t *workspace,
                              rt_dnnl_conv **out) {
    rt_status st = conv_create(e, l, max_n, threads, bf16, true, workspace, out);
    if (st == RT_ERR_UNSUPPORTED && mm_wanted(l)) {
        /* a oneDNN without this matmul (data type, strides): the layer keeps oneDNN's
         * convolutions, backward-weights included */
        RT_LOG_DEBUG("conv2d %d->%d k%d on %dx%d: backward-weights matmul not available (%s); convolution instead",
                     l->in_c, l->out_c, l->k, l->in_h, l->in_w, rt_error_message());
        rt_error_clear();
        st = conv_create(e, l, max_n, threads, bf16, false, workspace, out);
    }
    return st;
}

typedef struct dn_job {
    rt_dnnl_env *e;
    rt_dnnl_conv *c;
    rt_conv2d *l;
    int omp_threads;
    char *ws;
    const float *x, *dy;
    float *y, *dx;
    bool accumulate;
    int which; /* 0 forward, 1 backward-weights, 2 backward-data */
    dnnl_status_t status[DN_MAX_PARTS];
} dn_job;

static void dn_task(void *arg, int t) {
    dn_job *J = arg;
    dn_part *p = &J->c->part[t];
    const rt_conv2d *l = J->l;
    const size_t xi = (size_t)l->in_c * l->in_h * l->in_w, yi = (size_t)l->out_c * l->out_h * l->out_w;
    const size_t wo = (size_t)l->in_c * l->k * l->k;
    if (J->e->set_threads) J->e->set_threads(J->omp_threads);
    char *region = J->ws + p->region;
    if (J->which == 0) {
        void *ptr[4];
        int i = 0;
        ptr[i++] = (void *)(J->x + p->n0 * xi);
        ptr[i++] = rt_tensor_data(&l->weight);
        if (l->has_bias) ptr[i++] = rt_tensor_data(&l->bias);
        ptr[i++] = J->y + p->n0 * yi;
        J->status[t] = stage_run(p->stream, &p->fwd, region, J->ws, ptr, false);
    } else if (J->which == 1 && J->c->bww_batch) {
        void *ptr[4];
        int i = 0;
        float *dw = t == 0 ? rt_tensor_data(&l->dweight)
                           : (float *)(J->ws + J->c->partial_off + (size_t)(t - 1) * J->c->partial_stride);
        ptr[i++] = (void *)(J->x + p->n0 * xi);
        ptr[i++] = (void *)(J->dy + p->n0 * yi);
        ptr[i++] = dw;
        if (l->has_bias) ptr[i++] = t == 0 ? (float *)rt_tensor_data(&l->dbias) : dw + (size_t)l->out_c * wo;
        J->status[t] = stage_run(p->stream, &p->bww, region, J->ws, ptr, false);
    } else if (J->which == 1) {
        void *ptr[4];
        int i = 0;
        ptr[i++] = (void *)J->x;
        ptr[i++] = (void *)(J->dy + (size_t)p->o0 * l->out_h * l->out_w);
        ptr[i++] = (float *)rt_tensor_data(&l->dweight) + (size_t)p->o0 * wo;
        if (l->has_bias) ptr[i++] = (float *)rt_tensor_data(&l->dbias) + p->o0;
        J->status[t] = stage_run(p->stream, &p->bww, region, J->ws, ptr, false);
    } else {
        void *ptr[3] = {(void *)(J->dy + p->n0 * yi), rt_tensor_data(&l->weight), J->dx + p->n0 * xi};
        J->status[t] = stage_run(p->stream, &p->bwd, region, J->ws, ptr, J->accumulate);
    }
}

/* part t's block of the shared weights copy (dn_wsplit) */
static void dn_wsplit_task(void *arg, int t) {
    dn_job *J = arg;
    dn_wsplit *w = &J->c->wsplit[J->which == 0 ? 0 : 1];
    dnnl_status_t s;
    if (J->e->set_threads) J->e->set_threads(J->omp_threads);
    if ((s = dnnl_memory_set_data_handle(w->user[t], rt_tensor_data(&J->l->weight))) != dnnl_success ||
        (s = dnnl_memory_set_data_handle(w->inner[t], J->ws + w->off)) != dnnl_success) {
        J->status[t] = s;
        return;
    }
    dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, w->user[t]}, {DNNL_ARG_TO, w->inner[t]}};
    s = dnnl_primitive_execute(w->reorder[t], J->c->part[t].stream, 2, r);
    J->status[t] = s == dnnl_success ? dnnl_stream_wait(J->c->part[t].stream) : s;
}

/* dW (+ db) += the partial sums of parts 1.. (in part order: deterministic) */
#define DN_SUM_CHUNK 16384
static void dn_sum_task(void *arg, int task) {
    dn_job *J = arg;
    const rt_dnnl_conv *c = J->c;
    const rt_conv2d *l = J->l;
    const size_t nw = (size_t)l->out_c * l->in_c * l->k * l->k;
    size_t lo = (size_t)task * DN_SUM_CHUNK, hi = lo + DN_SUM_CHUNK < c->wfloats ? lo + DN_SUM_CHUNK : c->wfloats;
    for (size_t i = lo; i < hi; i++) {
        float *dst = i < nw ? (float *)rt_tensor_data(&l->dweight) + i : (float *)rt_tensor_data(&l->dbias) + (i - nw);
        float v = *dst;
        for (int t = 1; t < c->nparts; t++)
            v += ((const float *)(J->ws + c->partial_off + (size_t)(t - 1) * c->partial_stride))[i];
        *dst = v;
    }
}

/* dn_mm, bf16: part t packs its images of x and dy */
static void dn_mm_pack_task(void *arg, int t) {
    dn_job *J = arg;
    const rt_conv2d *l = J->l;
    const dn_part *p = &J->c->part[t];
    const size_t xi = (size_t)l->in_c * l->in_h * l->in_w, yi = (size_t)l->out_c * l->out_h * l->out_w;
    rt_cpu_bf16_pack((size_t)p->nb * xi, J->x + p->n0 * xi, (uint16_t *)(J->ws + J->c->mm_x_off) + p->n0 * xi);
    rt_cpu_bf16_pack((size_t)p->nb * yi, J->dy + p->n0 * yi, (uint16_t *)(J->ws + J->c->mm_dy_off) + p->n0 * yi);
}

/* dn_mm: part t's rows of dW' */
static void dn_mm_task(void *arg, int t) {
    dn_job *J = arg;
    const rt_conv2d *l = J->l;
    dn_part *p = &J->c->part[t];
    const size_t P = (size_t)l->out_h * l->out_w, N = (size_t)l->in_c * l->in_h * l->in_w;
    char *a, *b;
    if (J->c->bf16) {
        a = (char *)((uint16_t *)(J->ws + J->c->mm_dy_off) + (size_t)p->o0 * P);
        b = J->ws + J->c->mm_x_off;
    } else {
        a = (char *)(J->dy + (size_t)p->o0 * P);
        b = (char *)J->x;
    }
    float *cp = (float *)(J->ws + J->c->mm_dwd_off) + (size_t)p->o0 * P * N;
    J->status[t] = rt_dnnl_mm_run(J->e, p->mm, a, b, cp, J->ws + p->region) ? dnnl_success : dnnl_runtime_error;
}

static rt_status dn_run_mm(rt_model_ctx *ctx, dn_job *J) {
    rt_dnnl_conv *c = J->c;
    if (c->bf16) rt_threadpool_run(cpu_pool(ctx), c->nparts, dn_mm_pack_task, J);
    rt_threadpool_run(cpu_pool(ctx), c->nparts, dn_mm_task, J);
    for (int t = 0; t < c->nparts; t++)
        RT_REQUIRE(J->status[t] == dnnl_success, RT_ERR_INTERNAL,
                   "conv2d %d->%d k%d: oneDNN matmul (backward-weights) failed: %s", J->l->in_c, J->l->out_c, J->l->k,
                   dn_status_name(J->status[t]));
    rt_cpu_conv2d_fold(ctx, J->l, (const float *)(J->ws + c->mm_dwd_off), rt_tensor_data(&J->l->dweight));
    return RT_OK;
}

static rt_status dn_run(rt_model_ctx *ctx, dn_job *J) {
    rt_dnnl_conv *c = J->c;
    RT_REQUIRE(ctx->work && ctx->work_bytes >= c->ws, RT_ERR_INVALID,
               "conv2d %d->%d k%d (oneDNN): workspace of %zu bytes is smaller than %zu; call rt_conv2d_prepare and "
               "rt_model_ctx_reserve",
               J->l->in_c, J->l->out_c, J->l->k, ctx->work_bytes, c->ws);
    J->ws = ctx->work;
    /* one part: oneDNN's own OpenMP threads; several: one of ours per part, each
     * running its primitive single-threaded */
    const int parts = J->which == 1 ? c->bww_parts : c->nparts;
    J->omp_threads = parts == 1 ? ctx->threads : 1;
    if (J->which == 1 && c->bww_mm) return dn_run_mm(ctx, J);
    if (J->which != 1 && c->wsplit[J->which == 0 ? 0 : 1].on) {
        rt_threadpool_run(cpu_pool(ctx), parts, dn_wsplit_task, J);
        for (int t = 0; t < parts; t++)
            RT_REQUIRE(J->status[t] == dnnl_success, RT_ERR_INTERNAL,
                       "conv2d %d->%d k%d: oneDNN weights reorder failed: %s", J->l->in_c, J->l->out_c, J->l->k,
                       dn_status_name(J->status[t]));
    }
    rt_threadpool_run(cpu_pool(ctx), parts, dn_task, J);
    for (int t = 0; t < parts; t++)
        RT_REQUIRE(J->status[t] == dnnl_success, RT_ERR_INTERNAL, "conv2d %d->%d k%d: oneDNN %s failed: %s", J->l->in_c,
                   J->l->out_c, J->l->k,
                   J->which == 0   ? "forward"
                   : J->which == 1 ? "backward-weights"
                                   : "backward-data",
                   dn_status_name(J->status[t]));
    if (J->which == 1 && c->bww_batch)
        rt_threadpool_run(cpu_pool(ctx), (int)((c->wfloats + DN_SUM_CHUNK - 1) / DN_SUM_CHUNK), dn_sum_task, J);
    return RT_OK;
}

rt_status rt_dnnl_conv_forward(rt_model_ctx *ctx, rt_dnnl_env *e, rt_dnnl_conv *c, rt_conv2d *l, const float *x,
                               float *y) {
    dn_job J = {.e = e, .c = c, .l = l, .x = x, .y = y, .which = 0};
    return dn_run(ctx, &J);
}

rt_status rt_dnnl_conv_backward(rt_model_ctx *ctx, rt_dnnl_env *e, rt_dnnl_conv *c, rt_conv2d *l, const float *x,
                                const float *dy, float *dx, bool accumulate) {
    dn_job J = {.e = e, .c = c, .l = l, .x = x, .dy = dy, .which = 1};
    RT_CHECK(dn_run(ctx, &J));
    if (!dx) return RT_OK;
    J.which = 2;
    J.dx = dx;
    J.accumulate = accumulate;
    return dn_run(ctx, &J);
}

#endif
