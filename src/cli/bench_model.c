/* `ringtrain bench model`: training-step throughput of a model (images/s).
 *
 * One step is forward + cross-entropy + backward + src/optim's SGD with momentum
 * (lr 0.01, momentum 0.9: torch.optim.SGD(lr=0.01, momentum=0.9)), on random data
 * generated once, so the number compares with bench/model_torch.py running the same
 * model in PyTorch. The update is the one training makes: one optimizer over the whole
 * parameter arena, rt_optimizer_step_arena on the model's stream (src/train/trainer.c);
 * --threads sets the model context's threads (the layers), as train.threads does.
 * Prints a table (or one JSON object per batch size with --json) with images/s, the mean
 * time of forward, backward and update, and the process's peak RSS. Every row also gives
 * the step's GFLOP/s (rt_model_flops_per_image: the convolutions and linear layers, from
 * the layer shapes) and, on the CPU, its share of the CPU's peak for the precision
 * (fp32: FMA, bf16: bf16 dot products), measured first on as many threads by
 * src/cli/bench_peak.c's loop.
 *
 * On a GPU the steps are timed with events on the model context's stream and the host
 * synchronises once per batch size, after the last timed step (as bench/gpu_torch.py
 * does on the PyTorch side): nothing in the loop waits for the GPU, the loss is read
 * after the run. The table and JSON add the peak GPU memory of the run (peak_gpu_mb):
 * the rise of the device's used memory (rt_model_ctx_memory: cudaMemGetInfo) since the
 * model context was created, plus the backend's own buffers (cuBLAS workspace); the CUDA
 * context and the cuDNN/cuBLAS handles are not counted, as
 * torch.cuda.max_memory_allocated does not count them. ringtrain allocates everything
 * before the first step, so the memory in use after the run is the run's peak.
 */
#include "cli/args.h"
#include "cli/bench_ledger.h"
#include "cli/cli.h"
#include "core/rng.h"
#include "core/timer.h"
#include "model/model.h"
#include "model/profile.h"
#include "optim/optimizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* "a | b | c" from the model's name tables, so the help never drifts from them */
static void names(FILE *out, const rt_names *t) {
    char list[256];
    fputs(rt_names_list(t, list, sizeof list), out);
}
/* --cudnn: how the GPU chooses its convolution algorithms, as the model context's
 * (deterministic, benchmark) pair (model/ctx.h), the train.* keys they stand for in the
 * help; the default, timed, is what bench model always did */
typedef enum cudnn_choice {
    CUDNN_HEURISTIC,
    CUDNN_TIMED_DET,
    CUDNN_TIMED,
    CUDNN_HEURISTIC_ANY,
    CUDNN_COUNT_
} cudnn_choice;
static const char *const k_cudnn_names[CUDNN_COUNT_] = {"heuristic", "timed-deterministic", "timed", "heuristic-any"};
static const rt_names k_cudnn = {"cuDNN algorithm choice", CUDNN_COUNT_, k_cudnn_names, NULL, NULL};

/* oneDNN's version as `ringtrain info` shows it, for the JSON rows */
static const char *onednn_version(void) {
    static rt_lib_version v[16];
    int n = rt_model_lib_versions(v, 16);
    for (int i = 0; i < n && i < 16; i++)
        if (strcmp(v[i].key, "onednn") == 0) return v[i].version;
    return "?";
}

static void usage(FILE *out) {
    fprintf(out, "usage: ringtrain bench model [options]\n\n"
                 "Training-step throughput on this device: forward, loss, backward and an SGD-momentum update.\n\n"
                 "  --arch NAME      ");
    names(out, &rt_model_arch_names);
    fprintf(out, " (default resnet34)\n"
                 "  --stem NAME      ");
    names(out, &rt_stem_names);
    fprintf(out, " (default imagenet)\n"
                 "  --channels N     input channels (default 1)\n"
                 "  --size N         input height and width (default 28)\n"
                 "  --width N        ResNet base width (default 64)\n"
                 "  --batch LIST     batch sizes, comma-separated (default 64,128)\n"
                 "  --threads N      CPU threads (default 2)\n"
                 "  --device D       cpu | cuda | cuda:N | auto (default cpu)\n"
                 "  --precision P    ");
    names(out, &rt_precision_names);
    fprintf(out, " (CUDA: tf32 allows tensor cores; default fp32)\n"
                 "  --steps N        timed steps per batch size (default 10)\n"
                 "  --warmup N       untimed steps first (default 2)\n"
                 "  --cudnn MODE     GPU convolution algorithms: heuristic (cuDNN's heuristics,\n"
                 "                   deterministic ones: ringtrain train's default) |\n"
                 "                   timed-deterministic (the fastest deterministic one, timed:\n"
                 "                   train.cudnn_benchmark) | timed (the fastest, timed:\n"
                 "                   train.deterministic=false train.cudnn_benchmark=true) |\n"
                 "                   heuristic-any (train.deterministic=false) (default timed)\n"
                 "  --json           one JSON object per batch size instead of the table\n"
                 "  --layers         also time every layer call: a table per batch size of each\n"
                 "                   layer shape and pass, ms per step, share of the step, GFLOP/s\n"
                 "                   (on a GPU: a second run, CUDA events around every layer call)\n"
                 "  --graphs         GPU: after the warm-up, the step as training replays it (train.cuda_graphs):\n"
                 "                   two CUDA graphs around one host wait; only the whole step is timed\n"
                 "  --ledger-ops     emulated GPUs: also list a step's operations (and each layer's)\n"
                 "                   with their bytes and FLOPs, grouped (JSON: \"ledger_ops\")\n"
                 "\nOn the emulated GPUs (RINGTRAIN_CUDA=EMU) every GPU row also gives the cost ledger's\n"
                 "step: DRAM bytes, FLOPs, launches, library calls, host syncs, graph launches and the\n"
                 "modelled H200 step time (docs/gpu.md; the calibration: RINGTRAIN_COST_CALIBRATION, else\n"
                 "the newest bench/results/gpu-cost-calibration-*.json); elsewhere they are null.\n"
                 "\nEvery option takes its value as --opt VALUE or --opt=VALUE.\n");
}

static int parse_int(const char *opt, const char *v, int lo, int hi, int *out) {
    int x = 0;
    if (rt_cli_parse_int(v, lo, hi, &x) != 0) {
        fprintf(stderr, "ringtrain bench model: %s needs an integer in %d..%d (got '%s')\n", opt, lo, hi, v ? v : "");
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* a name option the model did not accept: its message lists the accepted names */
static int bad_name(const char *opt) {
    fprintf(stderr, "ringtrain bench model: %s: %s\n", opt, rt_error_message());
    return 2;
}

/* The update users get: one optimizer over the whole parameter arena, stepped with
 * rt_optimizer_step_arena on the model's stream, as src/train/trainer.c does */
static rt_status sgd_init(rt_optimizer *opt, rt_model *m, rt_model_ctx *ctx, rt_device dev) {
    rt_optim_config oc;
    rt_optim_config_default(&oc, RT_OPTIM_SGD);
    oc.lr = 0.01;
    oc.momentum = 0.9;
    const size_t n = rt_model_params(m)->size / sizeof(float);
    RT_CHECK(rt_optim_config_validate(&oc, n));
    RT_CHECK(rt_optimizer_init(opt, &oc, dev, n));
    rt_optimizer_set_parallel(opt, rt_model_ctx_parallel, ctx); /* the model's threads, as training */
    return RT_OK;
}

static rt_status sgd_step(rt_optimizer *opt, rt_model *m, rt_stream *stream) {
    return rt_optimizer_step_arena(opt, rt_model_params(m), rt_model_grads(m), -1.0, stream);
}

/* ---- GPU: event timing, one synchronisation per run, peak device memory ------------ */

/* s inside a JSON string: quotes, backslashes and control characters escaped */
static void json_chars(const char *s) {
    for (; s && *s; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
}

/* steps whose events are kept at once; a longer run reads a slot's times before reusing
 * it (an event recorded GPU_EVENT_RING steps earlier: long complete, nothing waits) */
#define GPU_EVENT_RING 256

/* *acc += ms from a to b; both recorded and complete */
static rt_status add_elapsed(rt_event *a, rt_event *b, double *acc) {
    float ms = 0;
    bool ready = false;
    RT_CHECK(rt_event_elapsed_ms(a, b, &ms, &ready));
    if (!ready) {
        RT_CHECK(rt_event_sync(b));
        RT_CHECK(rt_event_elapsed_ms(a, b, &ms, &ready));
    }
    *acc += ms;
    return RT_OK;
}

/* --layers on a GPU: `steps` more steps after the timed run, with the profile attached
 * and timing every layer call with a pair of events on the stream (model/profile.h:
 * nothing waits between layers, so the step keeps its overlap of host and device); one
 * synchronisation per step, after the update, then the pairs are read
 * (rt_layer_profile_collect). *step_ms and *optim_ms: this run's means, from events
 * around the whole step and the update. */
static rt_status gpu_layers_run(rt_model *m, rt_model_ctx *ctx, rt_optimizer *opt, const float *x,
                                const int64_t *labels, int n, int steps, rt_layer_profile *prof, double *step_ms,
                                double *optim_ms) {
    double all = 0, sgd = 0;
    rt_event *e[3] = {NULL, NULL, NULL};
    rt_status st = rt_layer_profile_use_events(prof, ctx->device, prof->cap);
    for (int k = 0; k < 3 && st == RT_OK; k++) st = rt_event_create(ctx->device, &e[k]);
    if (st == RT_OK) st = rt_stream_sync(ctx->stream);
    if (st == RT_OK) rt_model_ctx_set_profile(ctx, prof);
    for (int it = 0; it < steps && st == RT_OK; it++) {
        if ((st = rt_event_record(e[0], ctx->stream)) != RT_OK || (st = rt_model_forward(m, x, n, true)) != RT_OK ||
            (st = rt_model_loss(m, labels)) != RT_OK || (st = rt_model_backward(m, NULL, NULL)) != RT_OK ||
            (st = rt_event_record(e[1], ctx->stream)) != RT_OK || (st = sgd_step(opt, m, ctx->stream)) != RT_OK ||
            (st = rt_event_record(e[2], ctx->stream)) != RT_OK || (st = rt_stream_sync(ctx->stream)) != RT_OK ||
            (st = rt_layer_profile_collect(prof)) != RT_OK || (st = add_elapsed(e[0], e[2], &all)) != RT_OK)
            break;
        st = add_elapsed(e[1], e[2], &sgd);
    }
    rt_model_ctx_set_profile(ctx, NULL);
    for (int k = 0; k < 3; k++) rt_event_destroy(e[k]);
    *step_ms = all / steps;
    *optim_ms = sgd / steps;
    return st;
}

typedef struct step_times {
    double fwd, bwd, sgd, all; /* ms, sums over the timed steps */
} step_times;

/* warmup + steps training steps on the GPU: events around forward + loss, backward and
 * the update of every timed step, one event before the first and one after the last,
 * then one stream synchronisation */
static rt_status gpu_run(rt_model *m, rt_model_ctx *ctx, rt_optimizer *opt, const float *x, const int64_t *labels,
                         int n, int warmup, int steps, step_times *t, float *loss) {
    memset(t, 0, sizeof *t);
    const int ring = steps < GPU_EVENT_RING ? steps : GPU_EVENT_RING;
    rt_event *ev[GPU_EVENT_RING][4] = {{NULL}}, *start = NULL, *end = NULL;
    rt_status st = RT_OK;
    for (int r = 0; r < ring && st == RT_OK; r++)
        for (int k = 0; k < 4 && st == RT_OK; k++) st = rt_event_create(ctx->device, &ev[r][k]);
    if (st == RT_OK) st = rt_event_create(ctx->device, &start);
    if (st == RT_OK) st = rt_event_create(ctx->device, &end);
    for (int it = 0; it < warmup + steps && st == RT_OK; it++) {
        const int timed = it - warmup, slot = timed >= 0 ? timed % ring : 0;
        rt_event **e = ev[slot];
        if (timed >= ring) { /* the slot's previous step: read its times before reusing it */
            if ((st = add_elapsed(e[0], e[1], &t->fwd)) != RT_OK || (st = add_elapsed(e[1], e[2], &t->bwd)) != RT_OK ||
                (st = add_elapsed(e[2], e[3], &t->sgd)) != RT_OK)
                break;
        }
        if (timed == 0 && (st = rt_event_record(start, ctx->stream)) != RT_OK) break;
        if ((timed >= 0 && (st = rt_event_record(e[0], ctx->stream)) != RT_OK) ||
            (st = rt_model_forward(m, x, n, true)) != RT_OK || (st = rt_model_loss(m, labels)) != RT_OK ||
            (timed >= 0 && (st = rt_event_record(e[1], ctx->stream)) != RT_OK) ||
            (st = rt_model_backward(m, NULL, NULL)) != RT_OK ||
            (timed >= 0 && (st = rt_event_record(e[2], ctx->stream)) != RT_OK) ||
            (st = sgd_step(opt, m, ctx->stream)) != RT_OK ||
            (timed >= 0 && (st = rt_event_record(e[3], ctx->stream)) != RT_OK))
            break;
    }
    if (st == RT_OK) st = rt_event_record(end, ctx->stream);
    if (st == RT_OK) st = rt_stream_sync(ctx->stream); /* the one synchronisation of the run */
    for (int timed = steps > ring ? steps - ring : 0; timed < steps && st == RT_OK; timed++) {
        rt_event **e = ev[timed % ring];
        if ((st = add_elapsed(e[0], e[1], &t->fwd)) == RT_OK && (st = add_elapsed(e[1], e[2], &t->bwd)) == RT_OK)
            st = add_elapsed(e[2], e[3], &t->sgd);
    }
    if (st == RT_OK) st = add_elapsed(start, end, &t->all);
    if (st == RT_OK) st = rt_model_loss_value(m, loss);
    for (int r = 0; r < ring; r++)
        for (int k = 0; k < 4; k++) rt_event_destroy(ev[r][k]);
    rt_event_destroy(start);
    rt_event_destroy(end);
    return st;
}

/* --graphs: the training step as `ringtrain train` replays it (train.cuda_graphs,
 * src/train/graphs.c): a forward graph (forward, loss, backward, the loss copied to pinned
 * memory), the host's one wait for it, the optimizer's scalars for the next replay
 * (rt_optimizer_replay_prepare_after: no synchronisation of its own), the update graph */
typedef struct split_graphs {
    rt_graph *fwd, *upd;
    float *loss_host; /* pinned */
    bool pinned;
    rt_event *ev; /* after the forward graph: the host waits for it */
} split_graphs;

static void split_free(split_graphs *g) {
    rt_graph_destroy(g->fwd);
    rt_graph_destroy(g->upd);
    rt_event_destroy(g->ev);
    if (g->loss_host) rt_host_free(g->loss_host, g->pinned);
    *g = (split_graphs){0};
}

/* capture both graphs (nothing runs: the first replay does) */
static rt_status split_capture(rt_model *m, rt_model_ctx *ctx, rt_optimizer *opt, const float *x,
                               const int64_t *labels, int n, split_graphs *g) {
    *g = (split_graphs){0};
    RT_CHECK(rt_host_alloc(sizeof(float), true, (void **)&g->loss_host, &g->pinned));
    RT_CHECK(rt_event_create(ctx->device, &g->ev));
    RT_CHECK(rt_stream_capture_begin(ctx->stream));
    rt_status cap = rt_model_forward(m, x, n, true);
    if (cap == RT_OK) cap = rt_model_loss(m, labels);
    if (cap == RT_OK) cap = rt_model_backward(m, NULL, NULL);
    if (cap == RT_OK)
        cap = rt_memcpy(g->loss_host, rt_device_cpu(), rt_model_loss_ptr(m), ctx->device, sizeof(float), ctx->stream);
    rt_status st = rt_stream_capture_end(ctx->stream, &g->fwd); /* ends it in every case */
    RT_CHECK(cap != RT_OK ? cap : st);
    RT_CHECK(rt_stream_capture_begin(ctx->stream));
    cap = sgd_step(opt, m, ctx->stream);
    st = rt_stream_capture_end(ctx->stream, &g->upd);
    return cap != RT_OK ? cap : st;
}

/* one replayed step: forward graph, the host's wait, the update graph */
static rt_status split_step(split_graphs *g, rt_optimizer *opt, rt_stream *s) {
    RT_CHECK(rt_graph_launch(g->fwd, s));
    RT_CHECK(rt_event_record(g->ev, s));
    RT_CHECK(rt_event_sync(g->ev)); /* the trainer's wait for the step's scalars */
    RT_CHECK(rt_optimizer_replay_prepare_after(opt, -1.0, g->ev));
    return rt_graph_launch(g->upd, s);
}

/* --graphs: warmup uncaptured steps (at least one), the step captured as the trainer's
 * two graphs, then `steps` replayed steps between two events (the first replay runs the
 * captured step). Only the whole step is timed: forward_ms, backward_ms, optim_ms are
 * null. The replays count as optimizer steps (rt_optimizer_replay_prepare_after). */
static rt_status gpu_run_graphs(rt_model *m, rt_model_ctx *ctx, rt_optimizer *opt, const float *x,
                                const int64_t *labels, int n, int warmup, int steps, step_times *t, float *loss) {
    memset(t, 0, sizeof *t);
    rt_event *start = NULL, *end = NULL;
    split_graphs g = {0};
    rt_status st = rt_event_create(ctx->device, &start);
    if (st == RT_OK) st = rt_event_create(ctx->device, &end);
    for (int it = 0; it < (warmup > 0 ? warmup : 1) && st == RT_OK; it++)
        if ((st = rt_model_forward(m, x, n, true)) == RT_OK && (st = rt_model_loss(m, labels)) == RT_OK &&
            (st = rt_model_backward(m, NULL, NULL)) == RT_OK)
            st = sgd_step(opt, m, ctx->stream);
    if (st == RT_OK) st = split_capture(m, ctx, opt, x, labels, n, &g);
    if (st == RT_OK) st = rt_event_record(start, ctx->stream);
    for (int it = 0; it < steps && st == RT_OK; it++) st = split_step(&g, opt, ctx->stream);
    if (st == RT_OK) st = rt_event_record(end, ctx->stream);
    if (st == RT_OK) st = rt_stream_sync(ctx->stream);
    if (st == RT_OK) st = add_elapsed(start, end, &t->all);
    if (st == RT_OK) st = rt_model_loss_value(m, loss);
    split_free(&g);
    rt_event_destroy(start);
    rt_event_destroy(end);
    return st;
}

/* The profile's rows summed by (kind, shape, pass), in order of first call: the same
 * shape recurs in ResNet's blocks. instances: how many layers had the shape. */
typedef struct layer_sum {
    const char *kind;
    const char *shape;
    rt_prof_pass pass;
    int instances;
    long calls;
    double seconds, flops; /* flops: summed over the calls */
} layer_sum;

static int layer_sums(const rt_layer_profile *p, layer_sum *out) {
    int n = 0;
    for (int i = 0; i < p->n; i++) {
        const rt_layer_prof_row *r = &p->rows[i];
        int j = 0;
        while (j < n &&
               !(out[j].pass == r->pass && strcmp(out[j].kind, r->kind) == 0 && strcmp(out[j].shape, r->shape) == 0))
            j++;
        if (j == n) out[n++] = (layer_sum){.kind = r->kind, .shape = r->shape, .pass = r->pass};
        out[j].instances++;
        out[j].calls += r->calls;
        out[j].seconds += r->seconds;
        out[j].flops += r->flops * (double)r->calls;
    }
    return n;
}

/* the per-layer table (text) or the "layers" members of the JSON object; step_ms and
 * optim_ms: the run's means, for the shares and the line of what the layers leave out */
static void print_layers(const rt_layer_profile *p, int steps, double step_ms, double optim_ms, const rt_cpu_peak *peak,
                         bool json, const rt_bench_ledger *ledger, bool ledger_ops) {
    layer_sum *sums = calloc((size_t)p->n + 1, sizeof *sums);
    if (!sums) return;
    const int n = layer_sums(p, sums);
    double total_ms = 0;
    for (int i = 0; i < n; i++) total_ms += sums[i].seconds * 1e3 / steps;
    if (json)
        printf(", \"layers_ms_per_step\": %.3f, \"layers_overflow\": %s, \"layers\": [", total_ms,
               p->overflow ? "true" : "false");
    else
        printf("  %-21s %-36s %-8s %5s %8s %7s %8s %7s\n", "layer", "shape", "pass", "calls", "ms/step", "% step",
               "GFLOP/s", "% peak");
    for (int i = 0; i < n; i++) {
        const layer_sum *u = &sums[i];
        const double ms = u->seconds * 1e3 / steps, share = 100.0 * ms / step_ms;
        const double gflops = u->flops > 0 && u->seconds > 0 ? u->flops * 1e-9 / u->seconds : 0;
        const double pk = gflops > 0 && peak->available ? 100.0 * gflops / peak->gflops : 0;
        if (json) {
            printf("%s{\"kind\": \"%s\", \"shape\": \"%s\", \"pass\": \"%s\", \"instances\": %d, "
                   "\"calls_per_step\": %.2f, \"ms_per_step\": %.4f, \"step_share_percent\": %.2f, "
                   "\"gflop_per_step\": %.5f, \"gflops\": %.1f, \"peak_share_percent\": %.1f",
                   i ? ", " : "", u->kind, u->shape, rt_prof_pass_name(u->pass), u->instances, (double)u->calls / steps,
                   ms, share, u->flops * 1e-9 / steps, gflops, pk);
            if (ledger) rt_bench_ledger_layer_json(ledger, p, u->kind, u->shape, u->pass, steps, ledger_ops);
            printf("}");
        } else {
            char g[16] = "", q[16] = "";
            if (gflops > 0) snprintf(g, sizeof g, "%.1f", gflops);
            if (pk > 0) snprintf(q, sizeof q, "%.1f", pk);
            printf("  %-21s %-36s %-8s %5.0f %8.3f %7.1f %8s %7s\n", u->kind, u->shape, rt_prof_pass_name(u->pass),
                   (double)u->calls / steps, ms, share, g, q);
        }
    }
    if (json) {
        printf("]");
    } else {
        const double rest = step_ms - total_ms - optim_ms;
        printf("  %-21s %-36s %-8s %5s %8.3f %7.1f\n", "all layers", "", "", "", total_ms, 100.0 * total_ms / step_ms);
        printf("  %-21s %-36s %-8s %5s %8.3f %7.1f\n", "optimizer", "SGD momentum", "", "", optim_ms,
               100.0 * optim_ms / step_ms);
        printf("  %-21s %-36s %-8s %5s %8.3f %7.1f\n", "rest", "model glue, timing", "", "", rest,
               100.0 * rest / step_ms);
        if (p->overflow) printf("  (more layer shapes than the profile holds: some calls are not counted)\n");
    }
    free(sums);
}

/* ---- the command: options, the model context, one run per batch size ---------------- */

typedef struct bench_opts {
    rt_model_config cfg;
    int threads, steps, warmup, json, layers, graphs, ledger_ops;
    int cudnn; /* cudnn_choice */
    const char *device_name;
    rt_precision precision;
    int batches[16], nbatch;
} bench_opts;

/* --batch LIST: 0 ok, 2 usage error (printed) */
static int parse_batches(const char *v, bench_opts *o) {
    if (!v) {
        fprintf(stderr, "ringtrain bench model: --batch needs a list\n");
        return 2;
    }
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    o->nbatch = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (o->nbatch == 16) {
            fprintf(stderr, "ringtrain bench model: --batch '%s': expected at most 16 batch sizes\n", v);
            return 2;
        }
        if (parse_int("--batch", tok, 1, 65536, &o->batches[o->nbatch])) return 2;
        o->nbatch++;
    }
    if (o->nbatch == 0) {
        fprintf(stderr, "ringtrain bench model: --batch '%s': expected batch sizes such as 64,128\n", v);
        return 2;
    }
    return 0;
}

/* One option `a` with its value v (NULL when it has none): 0 ok, 2 usage error (printed) */
static int parse_option(const char *a, const char *v, bench_opts *o) {
    rt_model_config *cfg = &o->cfg;
    if (strcmp(a, "--arch") == 0) {
        if (rt_model_arch_parse(v, &cfg->arch) != RT_OK) return bad_name(a);
    } else if (strcmp(a, "--stem") == 0) {
        if (rt_stem_parse(v, &cfg->stem) != RT_OK) return bad_name(a);
    } else if (strcmp(a, "--channels") == 0) {
        if (parse_int(a, v, 1, 64, &cfg->in_channels)) return 2;
    } else if (strcmp(a, "--size") == 0) {
        if (parse_int(a, v, 1, 1024, &cfg->in_h)) return 2;
        cfg->in_w = cfg->in_h;
    } else if (strcmp(a, "--width") == 0) {
        if (parse_int(a, v, 1, 1024, &cfg->width)) return 2;
    } else if (strcmp(a, "--device") == 0) {
        if (!v) {
            fprintf(stderr, "ringtrain bench model: --device cpu|cuda|cuda:N|auto\n");
            return 2;
        }
        o->device_name = v;
    } else if (strcmp(a, "--precision") == 0) {
        if (rt_precision_parse(v, &o->precision) != RT_OK) return bad_name(a);
    } else if (strcmp(a, "--threads") == 0) {
        if (parse_int(a, v, 1, 256, &o->threads)) return 2;
    } else if (strcmp(a, "--steps") == 0) {
        if (parse_int(a, v, 1, 100000, &o->steps)) return 2;
    } else if (strcmp(a, "--warmup") == 0) {
        if (parse_int(a, v, 0, 100000, &o->warmup)) return 2;
    } else if (strcmp(a, "--batch") == 0) {
        return parse_batches(v, o);
    } else if (strcmp(a, "--cudnn") == 0) {
        if (rt_names_parse(&k_cudnn, v, &o->cudnn) != RT_OK) return bad_name(a);
    } else {
        fprintf(stderr, "ringtrain bench model: unknown option '%s'\n\n", a);
        usage(stderr);
        return 2;
    }
    return 0;
}

/* 0 ok, 1 help printed, 2 usage error (printed) */
static int parse_args(int argc, char **argv, bench_opts *o) {
    *o = (bench_opts){.threads = 2,
                      .steps = 10,
                      .warmup = 2,
                      .device_name = "cpu",
                      .precision = RT_PRECISION_FP32,
                      .cudnn = CUDNN_TIMED,
                      .batches = {64, 128},
                      .nbatch = 2};
    rt_model_config_default(&o->cfg);
    const char *prog = "ringtrain bench model";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int f;
        if (rt_cli_is_help(a)) {
            usage(stdout);
            return 1;
        }
        /* the flags: set to 1 */
        const struct {
            const char *name;
            int *set;
        } flags[] = {{"--json", &o->json}, {"--layers", &o->layers}, {"--ledger-ops", &o->ledger_ops},
                     {"--graphs", &o->graphs}};
        bool flag = false;
        for (size_t k = 0; k < sizeof flags / sizeof flags[0] && !flag; k++) {
            if ((f = rt_cli_flag(prog, a, flags[k].name)) < 0) return 2;
            if (f > 0) *flags[k].set = flag = true;
        }
        if (flag) continue;
        /* --opt VALUE or --opt=VALUE */
        static const char *const k_valued[] = {"--arch",  "--stem",   "--channels",  "--size",
                                               "--width", "--device", "--precision", "--threads",
                                               "--steps", "--warmup", "--batch",     "--cudnn"};
        const char *name = NULL;
        for (size_t k = 0; k < sizeof k_valued / sizeof k_valued[0] && !name; k++) {
            int r = rt_cli_opt(prog, argc, argv, &i, k_valued[k], &v);
            if (r < 0) return 2;
            if (r > 0) name = k_valued[k];
        }
        if (parse_option(name ? name : a, v, o) != 0) return 2;
    }
    return 0;
}

/* What every batch size's run shares: the device, the model context, the baseline of the
 * GPU's memory and the CPU's peak. */
typedef struct bench {
    const bench_opts *o;
    rt_device dev;
    bool gpu;
    char devstr[32];
    rt_model_ctx *ctx;
    size_t mem_base;         /* the device's used memory when the context was created (GPU) */
    size_t mem_base_backend; /* the backend's own buffers then (the cuBLAS workspace) */
    rt_cpu_peak peak;
    rt_bench_ledger ledger; /* the emulated GPUs' cost ledger (none on a real GPU or the CPU) */
} bench;

/* 0 ok, else the exit code (the error printed) */
static int bench_setup(const bench_opts *o, bench *b) {
    *b = (bench){.o = o};
    rt_status dst = rt_device_select(o->device_name, 0, &b->dev);
    if (dst != RT_OK) { /* a malformed --device (or cuda:N beyond the GPUs) is a usage error */
        int rc = rt_cli_fail();
        return dst == RT_ERR_INVALID ? 2 : rc;
    }
    b->gpu = rt_device_is_cuda(b->dev);
    rt_device_str(b->dev, b->devstr, sizeof b->devstr);
    int lrc = rt_bench_ledger_setup(&b->ledger, b->gpu);
    if (lrc != 0) return lrc;
    rt_model_ctx_options co = {.device = b->dev,
                               .threads = o->threads,
                               .precision = o->precision,
                               .deterministic = o->cudnn == CUDNN_HEURISTIC || o->cudnn == CUDNN_TIMED_DET,
                               .benchmark = o->cudnn == CUDNN_TIMED_DET || o->cudnn == CUDNN_TIMED};
    if (rt_model_ctx_create(&co, &b->ctx) != RT_OK) return rt_cli_fail();
    if (b->gpu && rt_model_ctx_memory(b->ctx, &b->mem_base, &b->mem_base_backend) != RT_OK) return rt_cli_fail();
    /* the CPU's peak for this precision on as many threads (bench peak's loop): every CPU
     * row reports its step as a share of it */
    if (!b->gpu && rt_cli_cpu_peak(o->precision == RT_PRECISION_BF16, o->threads, 0.2, 3, &b->peak) < 0) {
        fprintf(stderr, "ringtrain bench model: could not start %d threads for the peak\n", o->threads);
        return 1;
    }
    return 0;
}

/* One batch size's model, optimizer and random data (on the GPU as well, copied once) */
typedef struct batch {
    int n;
    rt_model *m;
    float *x, *x_dev;
    int64_t *labels, *labels_dev;
    rt_optimizer opt;
} batch;

/* 0 ok, else the exit code (the error printed); batch_free frees what was made */
static int batch_setup(const bench *b, int n, rt_model_config *cfg, batch *bt) {
    *bt = (batch){.n = n};
    cfg->max_batch = n;
    if (rt_model_create(cfg, b->ctx, &bt->m) != RT_OK || rt_model_init_weights(bt->m, 1) != RT_OK) return rt_cli_fail();
    size_t xn = (size_t)n * cfg->in_channels * cfg->in_h * cfg->in_w;
    bt->x = malloc(xn * sizeof(float));
    bt->labels = malloc((size_t)n * sizeof(int64_t));
    if (!bt->x || !bt->labels) {
        fprintf(stderr, "ringtrain bench model: out of memory\n");
        return 1;
    }
    if (sgd_init(&bt->opt, bt->m, b->ctx, b->dev) != RT_OK) return rt_cli_fail();
    rt_rng rng;
    rt_rng_init(&rng, 7, 0);
    rt_rng_normal(&rng, bt->x, xn, 0.0f, 1.0f);
    for (int i = 0; i < n; i++) bt->labels[i] = (int64_t)rt_rng_below(&rng, (uint64_t)cfg->num_classes);
    if (b->gpu) {
        /* inputs live on the GPU (as the optimizer state does), copied once */
        if (rt_malloc(b->dev, xn * sizeof(float), (void **)&bt->x_dev) != RT_OK ||
            rt_malloc(b->dev, (size_t)n * sizeof(int64_t), (void **)&bt->labels_dev) != RT_OK ||
            rt_memcpy(bt->x_dev, b->dev, bt->x, rt_device_cpu(), xn * sizeof(float), NULL) != RT_OK ||
            rt_memcpy(bt->labels_dev, b->dev, bt->labels, rt_device_cpu(), (size_t)n * sizeof(int64_t), NULL) != RT_OK)
            return rt_cli_fail();
    }
    return 0;
}

static void batch_free(const bench *b, batch *bt) {
    free(bt->x);
    free(bt->labels);
    rt_optimizer_free(&bt->opt);
    rt_free(b->dev, bt->x_dev);
    rt_free(b->dev, bt->labels_dev);
    rt_model_destroy(bt->m);
}

/* --layers on a GPU, after the timed row: the profiled run and its table */
static int gpu_layers(bench *b, batch *bt) {
    const bench_opts *o = b->o;
    int status = 0;
    rt_layer_profile prof = {0};
    double lms = 0, lsgd = 0;
    fflush(stdout); /* the timed row, whatever the profiled run does */
    rt_bench_ledger_reset(&b->ledger); /* the rows index the operations of this run */
    if (rt_layer_profile_init(&prof, 1024) != RT_OK ||
        gpu_layers_run(bt->m, b->ctx, &bt->opt, bt->x_dev, bt->labels_dev, bt->n, o->steps, &prof, &lms, &lsgd) !=
            RT_OK) {
        if (o->json) { /* the row says so, not only the exit code */
            printf(", \"layers\": null, \"layers_error\": \"");
            json_chars(rt_error_message());
            printf("\"");
        }
        status = rt_cli_fail();
    } else {
        if (o->json)
            printf(", \"layers_step_ms\": %.3f, \"layers_timing\": \"a second run of %d steps, a pair "
                   "of CUDA events around every layer call, one synchronisation per step: each "
                   "layer's GPU time from its first work to its last, launch gaps included where "
                   "the GPU waited for the host\"",
                   lms, o->steps);
        else
            printf("per layer, a second run of %d steps with a pair of CUDA events around every layer "
                   "call and one synchronisation per step: %.3f ms per step\n",
                   o->steps, lms);
        print_layers(&prof, o->steps, lms, lsgd, &b->peak, o->json, &b->ledger, o->ledger_ops);
    }
    rt_layer_profile_free(&prof);
    return status;
}

/* the JSON row's "conv_algos": the convolution algorithms in use, one per shape (cuDNN's
 * enum values and math types, as `ringtrain info` and the checkpoints record them) */
static void print_conv_algos(rt_model_ctx *ctx) {
    static rt_conv_algos a; /* 64 entries: off the stack */
    rt_model_ctx_get_conv_algos(ctx, &a);
    printf(", \"conv_algos\": [");
    for (int i = 0; i < a.n; i++) {
        const rt_conv_algo *c = &a.a[i];
        printf("%s{\"shape\": \"%d->%d k%d s%d p%d on %dx%d, n %d\", \"fwd\": %d, \"bwd_data\": %d, "
               "\"bwd_filter\": %d, \"math\": [%d, %d, %d], \"nhwc\": %d}",
               i ? ", " : "", c->in_c, c->out_c, c->k, c->stride, c->pad, c->in_h, c->in_w, c->n, c->fwd, c->bwd_data,
               c->bwd_filter, c->fwd_math, c->bwd_data_math, c->bwd_filter_math, c->nhwc);
    }
    printf("]");
}

/* one training step as the timed run makes it, for the ledger: a replayed step where
 * the step was captured (--graphs) */
typedef struct step_arg {
    const bench *b;
    batch *bt;
    split_graphs *g;
} step_arg;

static rt_status ledger_step(void *arg) {
    const step_arg *a = arg;
    batch *bt = a->bt;
    if (a->g) return split_step(a->g, &bt->opt, a->b->ctx->stream);
    RT_CHECK(rt_model_forward(bt->m, bt->x_dev, bt->n, true));
    RT_CHECK(rt_model_loss(bt->m, bt->labels_dev));
    RT_CHECK(rt_model_backward(bt->m, NULL, NULL));
    return sgd_step(&bt->opt, bt->m, a->b->ctx->stream);
}

/* One batch size on the GPU: the timed run, the ledger's step (emulated GPUs), the row,
 * then --layers' run */
static int bench_gpu(bench *b, batch *bt) {
    const bench_opts *o = b->o;
    const rt_model_config *cfg = &o->cfg;
    const int n = bt->n, steps = o->steps;
    step_times t;
    float loss = 0;
    size_t used = 0, backend_bytes = 0;
    rt_status run = o->graphs ? gpu_run_graphs(bt->m, b->ctx, &bt->opt, bt->x_dev, bt->labels_dev, n, o->warmup, steps,
                                               &t, &loss)
                              : gpu_run(bt->m, b->ctx, &bt->opt, bt->x_dev, bt->labels_dev, n, o->warmup, steps, &t, &loss);
    split_graphs g = {0};
    step_arg sa = {b, bt, NULL}; /* --graphs: the ledger's step is a replayed one */
    if (run == RT_OK && o->graphs && b->ledger.api) {
        run = split_capture(bt->m, b->ctx, &bt->opt, bt->x_dev, bt->labels_dev, n, &g);
        sa.g = &g;
    }
    if (run == RT_OK) run = rt_bench_ledger_measure(&b->ledger, ledger_step, &sa);
    split_free(&g);
    if (run != RT_OK || rt_model_ctx_memory(b->ctx, &used, &backend_bytes) != RT_OK)
        return rt_cli_fail();
    /* what the backend held before mem_base was read: what it allocated since is in the rise */
    double peak_gpu_mb =
        (double)(used > b->mem_base ? used - b->mem_base : 0) / 1048576.0 + b->mem_base_backend / 1048576.0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double ms = t.all / steps, ips = n * 1000.0 / ms;
    const double gflop = rt_model_flops_per_image(bt->m, true) * 1e-9;
    char fwd[24] = "null", bwd[24] = "null", sgd[24] = "null"; /* not timed inside a graph */
    if (!o->graphs) {
        snprintf(fwd, sizeof fwd, "%.3f", t.fwd / steps);
        snprintf(bwd, sizeof bwd, "%.3f", t.bwd / steps);
        snprintf(sgd, sizeof sgd, "%.3f", t.sgd / steps);
    }
    if (o->json)
        printf("{\"impl\": \"ringtrain\", \"device\": \"%s\", \"precision\": \"%s\", "
               "\"arch\": \"%s\", \"stem\": \"%s\", \"channels\": %d, "
               "\"size\": %d, \"batch\": %d, \"threads\": %d, \"steps\": %d, \"images_per_s\": %.2f, "
               "\"step_ms\": %.3f, \"forward_ms\": %s, \"backward_ms\": %s, \"optim_ms\": %s, "
               "\"last_loss\": %.5f, \"peak_rss_mb\": %.1f, \"peak_gpu_mb\": %.1f, "
               "\"gflop_per_image\": %.5f, \"gflops\": %.1f, \"graphs\": %s, "
               "\"timing\": \"cuda events, one synchronisation per run%s\"",
               b->devstr, rt_precision_name(o->precision), rt_model_arch_name(cfg->arch), rt_stem_name(cfg->stem),
               cfg->in_channels, cfg->in_h, n, o->threads, steps, ips, ms, fwd, bwd, sgd, (double)loss,
               ru.ru_maxrss / 1024.0, peak_gpu_mb, gflop, gflop * ips, o->graphs ? "true" : "false",
               o->graphs ? ", replays of the trainer's two graphs around one host wait" : "");
    else
        printf("%-9s %-8s %2dx%-2dx%-3d %5d %7d | %9.1f %8.1f %9.1f %8.1f %8.1f %8.1f %8.0f\n",
               rt_model_arch_name(cfg->arch), rt_stem_name(cfg->stem), cfg->in_channels, cfg->in_h, cfg->in_w, n,
               o->threads, ips, ms, t.fwd / steps, t.bwd / steps, t.sgd / steps, gflop * ips, peak_gpu_mb);
    if (o->json) {
        printf(", \"cudnn\": \"%s\"", k_cudnn_names[o->cudnn]);
        rt_bench_ledger_json(&b->ledger, o->ledger_ops);
        print_conv_algos(b->ctx);
    } else {
        rt_bench_ledger_text(&b->ledger);
    }
    int status = o->layers ? gpu_layers(b, bt) : 0;
    if (o->json) printf("}\n");
    fflush(stdout);
    return status;
}

/* warmup + steps training steps on the CPU, each phase timed on the host; with a
 * profile, it is attached for the timed steps. 0 ok, else the exit code. */
static int cpu_run(const bench *b, batch *bt, rt_layer_profile *prof, step_times *t, float *loss) {
    const bench_opts *o = b->o;
    memset(t, 0, sizeof *t);
    int status = 0;
    for (int it = 0; it < o->warmup + o->steps && status == 0; it++) {
        if (prof && it == o->warmup) rt_model_ctx_set_profile(b->ctx, prof);
        uint64_t t0 = rt_now_ns();
        if (rt_model_forward(bt->m, bt->x, bt->n, true) != RT_OK || rt_model_loss(bt->m, bt->labels) != RT_OK) {
            status = rt_cli_fail();
            break;
        }
        uint64_t t1 = rt_now_ns();
        if (rt_model_backward(bt->m, NULL, NULL) != RT_OK || rt_model_loss_value(bt->m, loss) != RT_OK) {
            status = rt_cli_fail();
            break;
        }
        uint64_t t2 = rt_now_ns();
        if (sgd_step(&bt->opt, bt->m, b->ctx->stream) != RT_OK) {
            status = rt_cli_fail();
            break;
        }
        uint64_t t3 = rt_now_ns();
        if (it >= o->warmup) {
            t->fwd += rt_ns_to_ms(t1 - t0);
            t->bwd += rt_ns_to_ms(t2 - t1);
            t->sgd += rt_ns_to_ms(t3 - t2);
            t->all += rt_ns_to_ms(t3 - t0);
        }
    }
    rt_model_ctx_set_profile(b->ctx, NULL);
    return status;
}

/* One batch size on the CPU: the timed run (profiled with --layers), its row and table */
static int bench_cpu(const bench *b, batch *bt) {
    const bench_opts *o = b->o;
    const rt_model_config *cfg = &o->cfg;
    const int n = bt->n, steps = o->steps;
    step_times t;
    float loss = 0;
    rt_layer_profile prof = {0};
    int status = 0;
    if (o->layers && rt_layer_profile_init(&prof, 1024) != RT_OK) status = rt_cli_fail();
    if (status == 0) status = cpu_run(b, bt, o->layers ? &prof : NULL, &t, &loss);
    if (status == 0) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        double ms = t.all / steps, ips = n * 1000.0 / ms;
        const double gflop = rt_model_flops_per_image(bt->m, true) * 1e-9, gflops = gflop * ips;
        const rt_cpu_peak *peak = &b->peak;
        const double share = peak->available ? 100.0 * gflops / peak->gflops : -1;
        if (o->json)
            printf("{\"impl\": \"ringtrain\", \"device\": \"%s\", \"precision\": \"%s\", "
                   "\"arch\": \"%s\", \"stem\": \"%s\", \"channels\": %d, "
                   "\"size\": %d, \"batch\": %d, \"threads\": %d, \"steps\": %d, \"images_per_s\": %.2f, "
                   "\"step_ms\": %.3f, \"forward_ms\": %.3f, \"backward_ms\": %.3f, \"optim_ms\": %.3f, "
                   "\"last_loss\": %.5f, \"peak_rss_mb\": %.1f, \"cpu_avx512_bf16\": %s, "
                   "\"onednn\": \"%s\", \"onednn_isa\": \"%s\", \"gflop_per_image\": %.5f, "
                   "\"gflops\": %.1f, \"peak_instruction\": \"%s\", \"peak_gflops\": %.1f, "
                   "\"peak_share_percent\": %.1f",
                   b->devstr, rt_precision_name(o->precision), rt_model_arch_name(cfg->arch), rt_stem_name(cfg->stem),
                   cfg->in_channels, cfg->in_h, n, o->threads, steps, ips, ms, t.fwd / steps, t.bwd / steps,
                   t.sgd / steps, (double)loss, ru.ru_maxrss / 1024.0, rt_model_cpu_bf16() ? "true" : "false",
                   onednn_version(), rt_model_onednn_isa(), gflop, gflops, peak->available ? peak->isa : "none",
                   peak->available ? peak->gflops : 0.0, share);
        else
            printf("%-9s %-8s %2dx%-2dx%-3d %5d %7d | %9.1f %8.1f %9.1f %8.1f %8.1f %8.1f %8.1f\n",
                   rt_model_arch_name(cfg->arch), rt_stem_name(cfg->stem), cfg->in_channels, cfg->in_h, cfg->in_w, n,
                   o->threads, ips, ms, t.fwd / steps, t.bwd / steps, t.sgd / steps, gflops, share);
        if (o->layers) print_layers(&prof, steps, ms, t.sgd / steps, peak, o->json, NULL, false);
        if (o->json) printf("}\n");
        fflush(stdout);
    }
    rt_layer_profile_free(&prof);
    return status;
}

/* the table's closing lines: the process's peak RSS and what "% peak" is a share of */
static void print_footer(const bench *b) {
    const bench_opts *o = b->o;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("peak RSS %.1f MiB\n", ru.ru_maxrss / 1024.0);
    if (b->gpu) printf("convolution algorithms: --cudnn %s\n", k_cudnn_names[o->cudnn]);
    if (!b->gpu && b->peak.available)
        printf("%% peak: of this CPU's %s peak on %d threads, %.1f GFLOP/s (%s, ringtrain bench peak)\n",
               rt_precision_name(o->precision), o->threads, b->peak.gflops, b->peak.isa);
}

int rt_cmd_bench_model(int argc, char **argv) {
    bench_opts o;
    int pr = parse_args(argc, argv, &o);
    if (pr != 0) return pr == 1 ? 0 : 2;
    bench b;
    int status = bench_setup(&o, &b);
    if (status != 0) {
        rt_model_ctx_destroy(b.ctx);
        return status;
    }
    if (!o.json)
        printf("%-9s %-8s %-9s %5s %7s | %9s %8s %9s %8s %8s %8s%s\n", "model", "stem", "input", "batch", "threads",
               "img/s", "step ms", "fwd ms", "bwd ms", "sgd ms", "GFLOP/s", b.gpu ? "  GPU MiB" : "  % peak");
    for (int bi = 0; bi < o.nbatch && status == 0; bi++) {
        batch bt;
        status = batch_setup(&b, o.batches[bi], &o.cfg, &bt);
        if (status == 0) status = b.gpu ? bench_gpu(&b, &bt) : bench_cpu(&b, &bt);
        batch_free(&b, &bt);
    }
    if (!o.json && status == 0) print_footer(&b);
    rt_model_ctx_destroy(b.ctx);
    rt_bench_ledger_free(&b.ledger);
    return status;
}
