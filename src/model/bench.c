/* `ringtrain bench model`: training-step throughput of a model (images/s).
 *
 * One step is forward + cross-entropy + backward + a plain SGD-with-momentum update
 * (v = mu v + g; w -= lr v, as torch.optim.SGD does), on random data generated once,
 * so the number compares with bench/model_torch.py running the same model in PyTorch.
 * Prints a table (or one JSON object per batch size with --json) with images/s, the
 * mean time of forward, backward and update, and the process's peak RSS.
 */
#include "cli/cli.h"
#include "core/rng.h"
#include "core/timer.h"
#include "model/model.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#ifdef RT_HAVE_CUDA
#include "model/cuda/bench_cuda.h"
#endif

static void usage(FILE *out) {
    fprintf(out, "usage: ringtrain bench model [options]\n\n"
                 "Training-step throughput on this device: forward, loss, backward and an SGD-momentum update.\n\n"
                 "  --arch NAME      resnet18 | resnet34 | net (default resnet34)\n"
                 "  --stem NAME      imagenet | cifar (default imagenet)\n"
                 "  --channels N     input channels (default 1)\n"
                 "  --size N         input height and width (default 28)\n"
                 "  --width N        ResNet base width (default 64)\n"
                 "  --batch LIST     batch sizes, comma-separated (default 64,128)\n"
                 "  --threads N      CPU threads (default 2)\n"
                 "  --device D       cpu | cuda | cuda:N | auto (default cpu)\n"
                 "  --precision P    fp32 | tf32 (CUDA: tf32 allows tensor cores; default fp32)\n"
                 "  --steps N        timed steps per batch size (default 10)\n"
                 "  --warmup N       untimed steps first (default 2)\n"
                 "  --json           one JSON object per batch size instead of the table\n");
}

static int parse_int(const char *opt, const char *v, int lo, int hi, int *out) {
    char *end = NULL;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || x < lo || x > hi) {
        fprintf(stderr, "ringtrain bench model: %s needs an integer in %d..%d (got '%s')\n", opt, lo, hi, v ? v : "");
        return -1;
    }
    *out = (int)x;
    return 0;
}

typedef struct sgd {
    float *velocity;
    size_t n;
} sgd;

typedef struct sgd_part {
    sgd *s;
    float *w;
    const float *g;
    float lr, mu;
    size_t lo, hi;
} sgd_part;

static void *sgd_run(void *arg) {
    sgd_part *p = arg;
    float *v = p->s->velocity;
    for (size_t i = p->lo; i < p->hi; i++) {
        v[i] = p->mu * v[i] + p->g[i];
        p->w[i] -= p->lr * v[i];
    }
    return NULL;
}

/* plain SGD with momentum over the whole parameter arena (padding included: harmless),
 * split over `threads` threads like PyTorch's parallel elementwise kernels */
static void sgd_step(sgd *s, float *w, const float *g, float lr, float mu, int threads) {
    sgd_part parts[16];
    pthread_t tid[16];
    if (threads > 16) threads = 16;
    int started = 0;
    for (int t = 0; t < threads; t++) {
        parts[t] =
            (sgd_part){s, w, g, lr, mu, s->n * (size_t)t / (size_t)threads, s->n * (size_t)(t + 1) / (size_t)threads};
        if (t > 0 && pthread_create(&tid[t], NULL, sgd_run, &parts[t]) == 0)
            started |= 1 << t;
        else if (t > 0)
            sgd_run(&parts[t]);
    }
    sgd_run(&parts[0]);
    for (int t = 1; t < threads; t++)
        if (started & (1 << t)) pthread_join(tid[t], NULL);
}

int rt_cmd_bench_model(int argc, char **argv) {
    rt_model_config cfg;
    rt_model_config_default(&cfg);
    int threads = 2, steps = 10, warmup = 2, json = 0;
    const char *device_name = "cpu";
    rt_precision precision = RT_PRECISION_FP32;
    int batches[16] = {64, 128}, nbatch = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (rt_cli_is_help(a)) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
            continue;
        } else if (strcmp(a, "--arch") == 0) {
            if (!v || rt_model_arch_parse(v, &cfg.arch) != 0) {
                fprintf(stderr, "ringtrain bench model: --arch resnet18|resnet34|net\n");
                return 2;
            }
        } else if (strcmp(a, "--stem") == 0) {
            if (!v || rt_stem_parse(v, &cfg.stem) != 0) {
                fprintf(stderr, "ringtrain bench model: --stem imagenet|cifar\n");
                return 2;
            }
        } else if (strcmp(a, "--channels") == 0) {
            if (parse_int(a, v, 1, 64, &cfg.in_channels)) return 2;
        } else if (strcmp(a, "--size") == 0) {
            if (parse_int(a, v, 1, 1024, &cfg.in_h)) return 2;
            cfg.in_w = cfg.in_h;
        } else if (strcmp(a, "--width") == 0) {
            if (parse_int(a, v, 1, 1024, &cfg.width)) return 2;
        } else if (strcmp(a, "--device") == 0) {
            if (!v) {
                fprintf(stderr, "ringtrain bench model: --device cpu|cuda|cuda:N|auto\n");
                return 2;
            }
            device_name = v;
        } else if (strcmp(a, "--precision") == 0) {
            if (v && strcmp(v, "fp32") == 0)
                precision = RT_PRECISION_FP32;
            else if (v && strcmp(v, "tf32") == 0)
                precision = RT_PRECISION_TF32;
            else {
                fprintf(stderr, "ringtrain bench model: --precision fp32|tf32\n");
                return 2;
            }
        } else if (strcmp(a, "--threads") == 0) {
            if (parse_int(a, v, 1, 256, &threads)) return 2;
        } else if (strcmp(a, "--steps") == 0) {
            if (parse_int(a, v, 1, 100000, &steps)) return 2;
        } else if (strcmp(a, "--warmup") == 0) {
            if (parse_int(a, v, 0, 100000, &warmup)) return 2;
        } else if (strcmp(a, "--batch") == 0) {
            if (!v) {
                fprintf(stderr, "ringtrain bench model: --batch needs a list\n");
                return 2;
            }
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v);
            nbatch = 0;
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                if (nbatch == 16) {
                    fprintf(stderr, "ringtrain bench model: --batch '%s': expected at most 16 batch sizes\n", v);
                    return 2;
                }
                if (parse_int("--batch", tok, 1, 65536, &batches[nbatch])) return 2;
                nbatch++;
            }
            if (nbatch == 0) {
                fprintf(stderr, "ringtrain bench model: --batch '%s': expected batch sizes such as 64,128\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "ringtrain bench model: unknown option '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
        i++;
    }

    rt_device dev;
    rt_status dst = rt_device_select(device_name, 0, &dev);
    if (dst != RT_OK) { /* a malformed --device (or cuda:N beyond the GPUs) is a usage error */
        int rc = rt_cli_fail();
        return dst == RT_ERR_INVALID ? 2 : rc;
    }
    const bool gpu = rt_device_is_cuda(dev);
    char devstr[32];
    rt_device_str(dev, devstr, sizeof devstr);
    rt_model_ctx *ctx = NULL;
    rt_model_ctx_options o = {.device = dev, .threads = threads, .precision = precision};
    if (rt_model_ctx_create(&o, &ctx) != RT_OK) return rt_cli_fail();
    if (!json)
        printf("%-9s %-8s %-9s %5s %7s | %9s %8s %9s %8s %8s\n", "model", "stem", "input", "batch", "threads", "img/s",
               "step ms", "fwd ms", "bwd ms", "sgd ms");
    int status = 0;
    for (int bi = 0; bi < nbatch && status == 0; bi++) {
        int n = batches[bi];
        cfg.max_batch = n;
        rt_model *m = NULL;
        float *x = NULL, *x_dev = NULL, *v_dev = NULL;
        int32_t *labels = NULL, *labels_dev = NULL;
        sgd s = {0};
        if (rt_model_create(&cfg, ctx, &m) != RT_OK || rt_model_init_weights(m, 1) != RT_OK) {
            status = rt_cli_fail();
            break;
        }
        size_t xn = (size_t)n * cfg.in_channels * cfg.in_h * cfg.in_w;
        x = malloc(xn * sizeof(float));
        labels = malloc((size_t)n * sizeof(int32_t));
        s.n = rt_model_params(m)->size / sizeof(float);
        s.velocity = gpu ? NULL : calloc(s.n, sizeof(float));
        if (!x || !labels || (!gpu && !s.velocity)) {
            fprintf(stderr, "ringtrain bench model: out of memory\n");
            status = 1;
        } else {
            rt_rng rng;
            rt_rng_init(&rng, 7, 0);
            rt_rng_normal(&rng, x, xn, 0.0f, 1.0f);
            for (int i = 0; i < n; i++) labels[i] = (int32_t)rt_rng_below(&rng, (uint64_t)cfg.num_classes);
            if (gpu) {
                /* inputs and the optimizer state live on the GPU, copied once */
                if (rt_malloc(dev, xn * sizeof(float), (void **)&x_dev) != RT_OK ||
                    rt_malloc(dev, (size_t)n * sizeof(int32_t), (void **)&labels_dev) != RT_OK ||
                    rt_malloc(dev, s.n * sizeof(float), (void **)&v_dev) != RT_OK ||
                    rt_memcpy(x_dev, dev, x, rt_device_cpu(), xn * sizeof(float), NULL) != RT_OK ||
                    rt_memcpy(labels_dev, dev, labels, rt_device_cpu(), (size_t)n * sizeof(int32_t), NULL) != RT_OK ||
                    rt_memset(dev, v_dev, 0, s.n * sizeof(float), NULL) != RT_OK)
                    status = rt_cli_fail();
            }
        }
        if (status == 0) {
            const float *xin = gpu ? x_dev : x;
            const int32_t *lin = gpu ? labels_dev : labels;
            double t_fwd = 0, t_bwd = 0, t_sgd = 0, t_all = 0;
            float loss = 0;
            for (int it = 0; it < warmup + steps && status == 0; it++) {
                uint64_t t0 = rt_now_ns();
                if (rt_model_forward(m, xin, n, true) != RT_OK || rt_model_loss(m, lin) != RT_OK ||
                    (gpu && rt_model_ctx_sync(ctx) != RT_OK)) {
                    status = rt_cli_fail();
                    break;
                }
                uint64_t t1 = rt_now_ns();
                if (rt_model_backward(m, NULL, NULL) != RT_OK || rt_model_loss_value(m, &loss) != RT_OK) {
                    status = rt_cli_fail();
                    break;
                }
                uint64_t t2 = rt_now_ns();
                if (!gpu) {
                    sgd_step(&s, rt_model_params(m)->base, rt_model_grads(m)->base, 0.01f, 0.9f, threads);
                } else {
#ifdef RT_HAVE_CUDA
                    if (rt_model_cuda_sgd_momentum(ctx, rt_model_params(m)->base, rt_model_grads(m)->base, v_dev, s.n,
                                                   0.01f, 0.9f) != RT_OK ||
                        rt_model_ctx_sync(ctx) != RT_OK) {
                        status = rt_cli_fail();
                        break;
                    }
#endif
                }
                uint64_t t3 = rt_now_ns();
                if (it >= warmup) {
                    t_fwd += rt_ns_to_ms(t1 - t0);
                    t_bwd += rt_ns_to_ms(t2 - t1);
                    t_sgd += rt_ns_to_ms(t3 - t2);
                    t_all += rt_ns_to_ms(t3 - t0);
                }
            }
            if (status == 0) {
                struct rusage ru;
                getrusage(RUSAGE_SELF, &ru);
                double ms = t_all / steps, ips = n * 1000.0 / ms;
                if (json)
                    printf("{\"impl\": \"ringtrain\", \"device\": \"%s\", \"precision\": \"%s\", "
                           "\"arch\": \"%s\", \"stem\": \"%s\", \"channels\": %d, "
                           "\"size\": %d, \"batch\": %d, \"threads\": %d, \"steps\": %d, \"images_per_s\": %.2f, "
                           "\"step_ms\": %.3f, \"forward_ms\": %.3f, \"backward_ms\": %.3f, \"optim_ms\": %.3f, "
                           "\"last_loss\": %.5f, \"peak_rss_mb\": %.1f}\n",
                           devstr, precision == RT_PRECISION_TF32 ? "tf32" : "fp32", rt_model_arch_name(cfg.arch),
                           rt_stem_name(cfg.stem), cfg.in_channels, cfg.in_h, n, threads, steps, ips, ms, t_fwd / steps,
                           t_bwd / steps, t_sgd / steps, (double)loss, ru.ru_maxrss / 1024.0);
                else
                    printf("%-9s %-8s %2dx%-2dx%-3d %5d %7d | %9.1f %8.1f %9.1f %8.1f %8.1f\n",
                           rt_model_arch_name(cfg.arch), rt_stem_name(cfg.stem), cfg.in_channels, cfg.in_h, cfg.in_w, n,
                           threads, ips, ms, t_fwd / steps, t_bwd / steps, t_sgd / steps);
                fflush(stdout);
            }
        }
        free(x);
        free(labels);
        free(s.velocity);
        rt_free(dev, x_dev);
        rt_free(dev, labels_dev);
        rt_free(dev, v_dev);
        rt_model_destroy(m);
    }
    if (!json && status == 0) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        printf("peak RSS %.1f MiB\n", ru.ru_maxrss / 1024.0);
    }
    rt_model_ctx_destroy(ctx);
    return status;
}
