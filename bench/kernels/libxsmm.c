/* libxsmm's (Debian's libxsmm-dev 1.17) direct convolutions at the shapes of onednn.c,
 * fp32 and bf16, one thread, its own blocked layouts, no conversions: the other Debian
 * library with AVX-512 BF16 convolution kernels, measured against oneDNN's. Its bf16
 * layers need physically padded input and output buffers, and write a bf16 weight
 * gradient (ringtrain's, like oneDNN's here, is fp32). One JSON object per line; a pass
 * libxsmm refuses is a row with "error". bench/kernels.sh builds and runs it.
 *
 *   cc -O2 libxsmm.c -o libxsmm -lxsmm -lopenblas -lpthread -lrt -ldl -lm && ./libxsmm [repeats [batch [parts]]]
 *   (defaults 5, 64, 2: the convolutions on batch / parts images)
 */
#include <libxsmm.h>
#include <libxsmm_dnn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int reps = 5;

static void row(const char *shape, int bf16, const char *pass, double s, double flop, const char *err) {
    printf("{\"lib\": \"libxsmm\", \"version\": \"%s\", \"op\": \"conv\", \"shape\": \"%s\", \"precision\": \"%s\", "
           "\"pass\": \"%s\", ",
           LIBXSMM_VERSION, shape, bf16 ? "bf16" : "fp32", pass);
    if (err)
        printf("\"error\": \"%s\"}\n", err);
    else
        printf("\"ms\": %.4f, \"gflops\": %.1f, \"impl\": \"libxsmm %s\"}\n", s * 1e3, flop / s / 1e9,
               libxsmm_get_target_arch());
}

static void conv(int N, int C, int K, int H, int R, int stride, int pad, int bf16) {
    char shape[96];
    snprintf(shape, sizeof shape, "n%d %d->%d k%d s%d p%d on %dx%d", N, C, K, R, stride, pad, H, H);
    static const char *pass[3] = {"forward", "backward-data", "backward-weights"};
    libxsmm_dnn_err_t st;
    libxsmm_dnn_conv_desc d;
    memset(&d, 0, sizeof d);
    d.N = N, d.C = C, d.H = H, d.W = H, d.K = K, d.R = R, d.S = R, d.u = stride, d.v = stride;
    d.pad_h = d.pad_w = d.pad_h_in = d.pad_w_in = pad;
    d.pad_h_out = d.pad_w_out = bf16 ? pad : 0; /* (bf16: physical padding only) */
    d.threads = 1;
    d.algo = LIBXSMM_DNN_CONV_ALGO_DIRECT;
    d.buffer_format = d.filter_format = LIBXSMM_DNN_TENSOR_FORMAT_LIBXSMM;
    d.fuse_ops = LIBXSMM_DNN_CONV_FUSE_NONE;
    d.options = LIBXSMM_DNN_CONV_OPTION_OVERWRITE;
    d.datatype_in = d.datatype_out = bf16 ? LIBXSMM_DNN_DATATYPE_BF16 : LIBXSMM_DNN_DATATYPE_F32;
    libxsmm_dnn_layer *h = libxsmm_dnn_create_conv_layer(d, &st);
    if (st != LIBXSMM_DNN_SUCCESS && st != LIBXSMM_DNN_WARN_FALLBACK) {
        for (int k = 0; k < 3; k++) row(shape, bf16, pass[k], 0, 0, libxsmm_dnn_get_error(st));
        return;
    }
    const int OH = (H + 2 * pad - R) / stride + 1, HO = OH + 2 * d.pad_h_out, HI = H + 2 * pad;
    const size_t es = bf16 ? 2 : 4, nin = (size_t)N * C * HI * HI, nout = (size_t)N * K * HO * HO,
                 nw = (size_t)K * C * R * R;
    struct {
        libxsmm_dnn_tensor_type t;
        size_t n;
        void *p;
        libxsmm_dnn_tensor *tensor;
    } b[] = {{LIBXSMM_DNN_REGULAR_INPUT, nin, 0, 0},  {LIBXSMM_DNN_GRADIENT_INPUT, nin, 0, 0},
             {LIBXSMM_DNN_REGULAR_OUTPUT, nout, 0, 0}, {LIBXSMM_DNN_GRADIENT_OUTPUT, nout, 0, 0},
             {LIBXSMM_DNN_REGULAR_FILTER, nw, 0, 0},  {LIBXSMM_DNN_GRADIENT_FILTER, nw, 0, 0}};
    for (int i = 0; i < 6; i++) {
        b[i].p = libxsmm_aligned_malloc(b[i].n * es, 64);
        memset(b[i].p, 0x3c, b[i].n * es); /* (finite values in both types; padding is not zero, no matter for timing) */
        libxsmm_dnn_tensor_datalayout *l = libxsmm_dnn_create_tensor_datalayout(h, b[i].t, &st);
        if (st == LIBXSMM_DNN_SUCCESS) b[i].tensor = libxsmm_dnn_link_tensor(l, b[i].p, &st);
        if (st == LIBXSMM_DNN_SUCCESS) st = libxsmm_dnn_bind_tensor(h, b[i].tensor, b[i].t);
        libxsmm_dnn_destroy_tensor_datalayout(l);
        if (st != LIBXSMM_DNN_SUCCESS) {
            fprintf(stderr, "libxsmm.c: %s: tensor %d: %s\n", shape, i, libxsmm_dnn_get_error(st));
            exit(1);
        }
    }
    const size_t ss = libxsmm_dnn_get_scratch_size(h, LIBXSMM_DNN_COMPUTE_KIND_ALL, &st);
    void *scratch = libxsmm_aligned_malloc(ss + 64, 64);
    st = libxsmm_dnn_bind_scratch(h, LIBXSMM_DNN_COMPUTE_KIND_ALL, scratch);
    if (st != LIBXSMM_DNN_SUCCESS) {
        fprintf(stderr, "libxsmm.c: %s: scratch: %s\n", shape, libxsmm_dnn_get_error(st));
        exit(1);
    }
    static const libxsmm_dnn_compute_kind kinds[3] = {LIBXSMM_DNN_COMPUTE_KIND_FWD, LIBXSMM_DNN_COMPUTE_KIND_BWD,
                                                      LIBXSMM_DNN_COMPUTE_KIND_UPD};
    const double flop = 2.0 * N * K * C * R * R * OH * OH;
    for (int k = 0; k < 3; k++) {
        st = LIBXSMM_DNN_SUCCESS;
        for (int i = 0; i < 5 && st == LIBXSMM_DNN_SUCCESS; i++) st = libxsmm_dnn_execute_st(h, kinds[k], 0, 0);
        if (st != LIBXSMM_DNN_SUCCESS) {
            row(shape, bf16, pass[k], 0, 0, libxsmm_dnn_get_error(st));
            continue;
        }
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            double t = now();
            for (int i = 0; i < 20; i++) libxsmm_dnn_execute_st(h, kinds[k], 0, 0);
            t = (now() - t) / 20;
            if (t < best) best = t;
        }
        row(shape, bf16, pass[k], best, flop, NULL);
    }
    libxsmm_dnn_release_scratch(h, LIBXSMM_DNN_COMPUTE_KIND_ALL);
    libxsmm_free(scratch);
    for (int i = 0; i < 6; i++) {
        libxsmm_dnn_release_tensor(h, b[i].t);
        libxsmm_dnn_destroy_tensor(b[i].tensor);
        libxsmm_free(b[i].p);
    }
    libxsmm_dnn_destroy_conv_layer(h);
}

int main(int argc, char **argv) {
    if (argc > 1) reps = atoi(argv[1]);
    const int batch = argc > 2 ? atoi(argv[2]) : 64, parts = argc > 3 ? atoi(argv[3]) : 2;
    if (reps < 1 || batch < 1 || parts < 1 || batch % parts) {
        fprintf(stderr, "usage: libxsmm [repeats [batch [parts]]]: parts must divide the batch\n");
        return 2;
    }
    const int n = batch / parts;
    libxsmm_init();
    for (int bf16 = 0; bf16 < 2; bf16++) {
        conv(n, 64, 64, 7, 3, 1, 1, bf16);
        conv(n, 64, 128, 7, 3, 2, 1, bf16);
        conv(n, 128, 128, 4, 3, 1, 1, bf16);
        conv(n, 256, 256, 2, 3, 1, 1, bf16);
    }
    libxsmm_finalize();
    return 0;
}
