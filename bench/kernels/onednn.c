/* Kernel-level fp32 and bf16 times of oneDNN's convolution and matmul primitives at the
 * shapes of ResNet34 1x28x28 (a batch split in parts, one per pool thread, as ringtrain
 * runs them: the convolutions on one part's images, the dense layers' matmuls on all the
 * images and one part's output channels), one thread, no reorders: what the library's
 * kernels allow, before anything ringtrain adds. One JSON object per line. bench/kernels.sh
 * builds and runs it (with libxsmm.c beside it) and writes bench/results/kernels-cpu-<date>.json.
 *
 *   cc -O2 onednn.c -o onednn -ldnnl -fopenmp && OMP_NUM_THREADS=1 ./onednn [repeats [batch [parts]]]
 *   (defaults 5, 64, 2)
 */
#include <dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define CK(x)                                                                          \
    do {                                                                               \
        dnnl_status_t s_ = (x);                                                        \
        if (s_ != dnnl_success) {                                                      \
            fprintf(stderr, "onednn.c:%d: %s: status %d\n", __LINE__, #x, (int)s_);    \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

static dnnl_engine_t eng;
static dnnl_stream_t strm;
static int reps = 5;

/* best time of `reps` rounds of 20 calls, after 5 untimed; the arguments are allocated
 * from the primitive's own descriptors (blocked layouts: no reorder is timed) */
static double time_pd(dnnl_primitive_desc_t pd, const char **impl) {
    static const int args[] = {DNNL_ARG_SRC,       DNNL_ARG_WEIGHTS,      DNNL_ARG_DST,      DNNL_ARG_DIFF_SRC,
                               DNNL_ARG_DIFF_WEIGHTS, DNNL_ARG_DIFF_DST, DNNL_ARG_SCRATCHPAD};
    static const dnnl_query_t q[] = {dnnl_query_src_md,          dnnl_query_weights_md,   dnnl_query_dst_md,
                                     dnnl_query_diff_src_md,     dnnl_query_diff_weights_md, dnnl_query_diff_dst_md,
                                     dnnl_query_scratchpad_md};
    dnnl_primitive_t p;
    CK(dnnl_primitive_create(&p, pd));
    CK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, impl));
    dnnl_exec_arg_t ea[7];
    int na = 0;
    for (int a = 0; a < 7; a++) {
        const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, q[a], 0);
        if (!md || md->ndims == 0) continue;
        dnnl_memory_t m;
        CK(dnnl_memory_create(&m, md, eng, DNNL_MEMORY_ALLOCATE));
        void *h;
        CK(dnnl_memory_get_data_handle(m, &h));
        memset(h, 0x3c, dnnl_memory_desc_get_size(md)); /* (finite values in both types) */
        ea[na].arg = args[a];
        ea[na].memory = m;
        na++;
    }
    for (int i = 0; i < 5; i++) CK(dnnl_primitive_execute(p, strm, na, ea));
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = now();
        for (int i = 0; i < 20; i++) CK(dnnl_primitive_execute(p, strm, na, ea));
        CK(dnnl_stream_wait(strm));
        t = (now() - t) / 20;
        if (t < best) best = t;
    }
    for (int a = 0; a < na; a++) dnnl_memory_destroy(ea[a].memory);
    dnnl_primitive_destroy(p);
    return best;
}

static void row(const char *op, const char *shape, const char *prec, const char *pass, double s, double flop,
                const char *impl) {
    printf("{\"lib\": \"onednn\", \"version\": \"%d.%d.%d\", \"op\": \"%s\", \"shape\": \"%s\", \"precision\": \"%s\", "
           "\"pass\": \"%s\", \"ms\": %.4f, \"gflops\": %.1f, \"impl\": \"%s\"}\n",
           dnnl_version()->major, dnnl_version()->minor, dnnl_version()->patch, op, shape, prec, pass, s * 1e3,
           flop / s / 1e9, impl);
}

/* forward, backward-data and backward-weights (fp32 weight gradient, as ringtrain) */
static void conv(int N, int C, int K, int H, int R, int stride, int pad, int bf16) {
    const int OH = (H + 2 * pad - R) / stride + 1;
    dnnl_dims_t sd = {N, C, H, H}, wd = {K, C, R, R}, dd = {N, K, OH, OH}, st = {stride, stride}, pl = {pad, pad};
    const dnnl_data_type_t dt = bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t smd, wmd, dmd, wmdf;
    CK(dnnl_memory_desc_init_by_tag(&smd, 4, sd, dt, dnnl_format_tag_any));
    CK(dnnl_memory_desc_init_by_tag(&wmd, 4, wd, dt, dnnl_format_tag_any));
    CK(dnnl_memory_desc_init_by_tag(&wmdf, 4, wd, dnnl_f32, dnnl_format_tag_any));
    CK(dnnl_memory_desc_init_by_tag(&dmd, 4, dd, dt, dnnl_format_tag_any));
    dnnl_convolution_desc_t fd, bd, ud;
    dnnl_primitive_desc_t pd[3];
    CK(dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct, &smd, &wmd, NULL, &dmd,
                                          st, pl, pl));
    CK(dnnl_primitive_desc_create(&pd[0], &fd, NULL, eng, NULL));
    CK(dnnl_convolution_backward_data_desc_init(&bd, dnnl_convolution_direct, &smd, &wmd, &dmd, st, pl, pl));
    CK(dnnl_primitive_desc_create(&pd[1], &bd, NULL, eng, pd[0]));
    CK(dnnl_convolution_backward_weights_desc_init(&ud, dnnl_convolution_direct, &smd, &wmdf, NULL, &dmd, st, pl, pl));
    CK(dnnl_primitive_desc_create(&pd[2], &ud, NULL, eng, pd[0]));
    static const char *pass[3] = {"forward", "backward-data", "backward-weights"};
    char shape[96];
    snprintf(shape, sizeof shape, "n%d %d->%d k%d s%d p%d on %dx%d", N, C, K, R, stride, pad, H, H);
    const double flop = 2.0 * N * K * C * R * R * OH * OH; /* (padding taps counted) */
    for (int k = 0; k < 3; k++) {
        const char *impl;
        const double s = time_pd(pd[k], &impl);
        row("conv", shape, bf16 ? "bf16" : "fp32", pass[k], s, flop, impl);
        dnnl_primitive_desc_destroy(pd[k]);
    }
}

/* C (m, n) fp32 = A (m, k) B (k, n), row-major, A and B in the precision: the dense
 * path's products (ringtrain's fp32 products are dnnl_sgemm; timed here as matmul too) */
static void matmul(int m, int n, int k, int bf16, const char *what) {
    const dnnl_data_type_t dt = bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_dims_t ad = {m, k}, bd = {k, n}, cd = {m, n};
    dnnl_memory_desc_t a, b, c;
    CK(dnnl_memory_desc_init_by_tag(&a, 2, ad, dt, dnnl_ab));
    CK(dnnl_memory_desc_init_by_tag(&b, 2, bd, dt, dnnl_ab));
    CK(dnnl_memory_desc_init_by_tag(&c, 2, cd, dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t md;
    CK(dnnl_matmul_desc_init(&md, &a, &b, NULL, &c));
    dnnl_primitive_desc_t pd;
    CK(dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL));
    const char *impl;
    const double s = time_pd(pd, &impl);
    char shape[96];
    snprintf(shape, sizeof shape, "%dx%dx%d (%s)", m, n, k, what);
    row("matmul", shape, bf16 ? "bf16" : "fp32", "product", s, 2.0 * m * n * k, impl);
    dnnl_primitive_desc_destroy(pd);
}

int main(int argc, char **argv) {
    if (argc > 1) reps = atoi(argv[1]);
    const int batch = argc > 2 ? atoi(argv[2]) : 64, parts = argc > 3 ? atoi(argv[3]) : 2;
    if (reps < 1 || batch < 1 || parts < 1 || batch % parts || 512 % parts) {
        fprintf(stderr, "usage: onednn [repeats [batch [parts]]]: parts must divide the batch and 512\n");
        return 2;
    }
    const int n = batch / parts;
    omp_set_num_threads(1);
    CK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    CK(dnnl_stream_create(&strm, eng, dnnl_stream_default_flags));
    for (int bf16 = 0; bf16 < 2; bf16++) {
        conv(n, 64, 64, 7, 3, 1, 1, bf16);    /* layer1 */
        conv(n, 64, 128, 7, 3, 2, 1, bf16);   /* layer2's first */
        conv(n, 128, 128, 4, 3, 1, 1, bf16);  /* layer2 */
        conv(n, 256, 256, 2, 3, 1, 1, bf16);  /* layer3 (ringtrain: the dense path below) */
        matmul(batch, 1024 / parts, 1024, bf16, "layer3 dense forward, one part's output channels");
        matmul(batch, 512 / parts, 512, bf16, "layer4 1x1 dense forward, one part's output channels");
    }
    return 0;
}
