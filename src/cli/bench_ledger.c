/* The cost ledger in `ringtrain bench model --device cuda` (bench_ledger.h; docs/gpu.md
 * "The cost ledger" and "Modelled step time"). */
#include "cli/bench_ledger.h"

#include "core/settings.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef RT_SOURCE_DIR
#define RT_SOURCE_DIR "."
#endif

/* the newest committed calibration into path (false: none) */
static bool newest_calibration(char *path, size_t n) {
    glob_t g;
    if (glob(RT_SOURCE_DIR "/bench/results/gpu-cost-calibration-*.json", 0, NULL, &g) != 0) return false;
    snprintf(path, n, "%s", g.gl_pathv[g.gl_pathc - 1]); /* sorted: the latest date last */
    globfree(&g);
    return true;
}

int rt_bench_ledger_setup(rt_bench_ledger *l, bool gpu) {
    memset(l, 0, sizeof *l);
    l->api = gpu ? rt_cost_ledger_find() : NULL;
    if (!l->api) return 0;
    l->api->enable(1); /* keeps count only when RINGTRAIN_EMU_LEDGER=count */
    const char *env = rt_setting_text(RT_SET_COST_CALIBRATION);
    if (env && *env)
        snprintf(l->calibration, sizeof l->calibration, "%s", env);
    else if (!newest_calibration(l->calibration, sizeof l->calibration)) {
        snprintf(l->calibration, sizeof l->calibration,
                 "none: no " RT_SOURCE_DIR "/bench/results/gpu-cost-calibration-*.json and no RINGTRAIN_COST_CALIBRATION");
        return 0;
    }
    rt_cost_model m;
    if (rt_cost_model_load(l->calibration, &m) != RT_OK) {
        fprintf(stderr, "ringtrain bench model: %s (RINGTRAIN_COST_CALIBRATION names a calibration file, "
                        "bench/gpu_cost_fit.py writes one)\n",
                rt_error_message());
        return 2;
    }
    l->api->set_model(&m);
    l->modelled = true;
    return 0;
}

void rt_bench_ledger_free(rt_bench_ledger *l) {
    free(l->ops);
    l->ops = NULL;
    l->nops = 0;
}

void rt_bench_ledger_reset(rt_bench_ledger *l) {
    if (l->api) l->api->reset();
}

/* reset, run `steps` steps, read */
static rt_status run_steps(rt_bench_ledger *l, rt_status (*step)(void *), void *arg, int steps, rt_cost_ledger *out) {
    l->api->reset();
    for (int i = 0; i < steps; i++) RT_CHECK(step(arg));
    out->size = sizeof *out;
    RT_REQUIRE(l->api->read(out) == 0, RT_ERR_INTERNAL, "cost ledger: the emulated runtime's ledger has another layout");
    return RT_OK;
}

static bool same_counts(const rt_cost_ledger *a, const rt_cost_ledger *b) {
    return a->ops == b->ops && a->launches == b->launches && a->library_calls == b->library_calls &&
           a->copies == b->copies && a->fills == b->fills && a->host_syncs == b->host_syncs &&
           a->graph_launches == b->graph_launches && a->bytes_read == b->bytes_read &&
           a->bytes_written == b->bytes_written && a->flops == b->flops;
}

rt_status rt_bench_ledger_measure(rt_bench_ledger *l, rt_status (*step)(void *arg), void *arg) {
    if (!l->api) return RT_OK;
    rt_cost_ledger one, two;
    RT_CHECK(run_steps(l, step, arg, 1, &one));
    rt_bench_ledger_free(l);
    l->ops = malloc((one.ops ? one.ops : 1) * sizeof *l->ops);
    RT_CHECK_ALLOC(l->ops, one.ops * sizeof *l->ops);
    l->nops = l->api->ops(l->ops, 0, one.ops);
    RT_CHECK(run_steps(l, step, arg, 2, &two));
    rt_cost_ledger_diff(&two, &one, &l->step);
    l->steady = same_counts(&one, &l->step);
    l->measured = true;
    return RT_OK;
}

/* ---- grouped operations -------------------------------------------------------------- */

typedef struct op_group {
    rt_cost_op op;
    double n; /* per step */
} op_group;

static bool same_op(const rt_cost_op *a, const rt_cost_op *b) {
    return a->kind == b->kind && a->math == b->math && a->bytes_read == b->bytes_read &&
           a->bytes_written == b->bytes_written && a->flops == b->flops && a->captured == b->captured &&
           strcmp(a->name, b->name) == 0;
}

/* add n ops with weight w each into g (*ng groups, room for cap) */
static void group_ops(const rt_cost_op *ops, size_t n, double w, op_group *g, size_t *ng, size_t cap) {
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < *ng && !same_op(&g[j].op, &ops[i])) j++;
        if (j == *ng) {
            if (*ng == cap) continue;
            g[(*ng)++] = (op_group){ops[i], 0};
        }
        g[j].n += w;
    }
}

static void print_groups(const op_group *g, size_t n) {
    printf(", \"ledger_ops\": [");
    for (size_t i = 0; i < n; i++) {
        const rt_cost_op *o = &g[i].op;
        printf("%s{\"name\": \"%s\", \"kind\": \"%s\", \"math\": \"%s\", \"bytes_read\": %.0f, "
               "\"bytes_written\": %.0f, \"flops\": %.0f, \"captured\": %s, \"n\": %.4g}",
               i ? ", " : "", o->name, rt_cost_kind_name(o->kind), rt_cost_math_name(o->math), o->bytes_read,
               o->bytes_written, o->flops, o->captured ? "true" : "false", g[i].n);
    }
    printf("]");
}

/* ---- the row ------------------------------------------------------------------------- */

static void json_string_or_null(const char *key, const char *s) {
    printf(", \"%s\": ", key);
    if (!s) {
        printf("null");
        return;
    }
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') putchar('\\');
        if ((unsigned char)*s >= 0x20) putchar(*s);
    }
    putchar('"');
}

void rt_bench_ledger_json(const rt_bench_ledger *l, bool with_ops) {
    if (!l->api || !l->measured) {
        printf(", \"modelled_step_ms\": null, \"dram_bytes_per_step\": null, \"flops_per_step\": null, "
               "\"launches_per_step\": null, \"library_calls_per_step\": null, \"host_syncs_per_step\": null, "
               "\"graph_launches_per_step\": null, \"ledger\": null");
        return;
    }
    const rt_cost_ledger *s = &l->step;
    if (l->modelled)
        printf(", \"modelled_step_ms\": %.4f", s->modelled_s * 1e3);
    else
        printf(", \"modelled_step_ms\": null");
    printf(", \"dram_bytes_per_step\": %.0f, \"dram_read_bytes_per_step\": %.0f, \"dram_written_bytes_per_step\": %.0f, "
           "\"flops_per_step\": %.0f, \"launches_per_step\": %llu, \"library_calls_per_step\": %llu, "
           "\"copies_per_step\": %llu, \"host_syncs_per_step\": %llu, \"graph_launches_per_step\": %llu, "
           "\"captured_per_step\": %llu",
           s->bytes_read + s->bytes_written, s->bytes_read, s->bytes_written, s->flops, s->launches, s->library_calls,
           s->copies + s->fills, s->host_syncs, s->graph_launches, s->captured);
    printf(", \"ledger\": \"%s\", \"ledger_steady\": %s, \"ledger_unknown_kernels\": %llu",
           s->mode == 2 ? "count only" : "on", l->steady ? "true" : "false", s->unknown_kernels);
    json_string_or_null("ledger_unknown_names", s->unknown_kernels ? s->unknown_names : NULL);
    json_string_or_null("cost_calibration", l->calibration);
    printf(", \"dram_bytes_by_kind\": {");
    for (int k = 0; k < RT_COST_KINDS; k++) printf("%s\"%s\": %.0f", k ? ", " : "", rt_cost_kind_name(k), s->kind_bytes[k]);
    printf("}");
    if (with_ops) {
        op_group *g = calloc(l->nops ? l->nops : 1, sizeof *g);
        size_t ng = 0;
        if (g) group_ops(l->ops, l->nops, 1.0, g, &ng, l->nops);
        print_groups(g, ng);
        free(g);
    }
}

void rt_bench_ledger_text(const rt_bench_ledger *l) {
    if (!l->api || !l->measured) return;
    const rt_cost_ledger *s = &l->step;
    char model[64] = "no calibration";
    if (l->modelled) snprintf(model, sizeof model, "%.3f ms", s->modelled_s * 1e3);
    printf("  ledger per step (emulated GPU%s): %.1f MB DRAM, %.3f TFLOP, %llu launches, %llu library calls, "
           "%llu copies, %llu host syncs, %llu graph launches; modelled H200 step %s%s\n",
           s->mode == 2 ? ", count only" : "", (s->bytes_read + s->bytes_written) / 1e6, s->flops / 1e12, s->launches,
           s->library_calls, s->copies + s->fills, s->host_syncs, s->graph_launches, model,
           l->steady ? "" : " (NOT steady: one step differs from the next)");
    if (s->unknown_kernels) printf("  kernels without a cost entry: %s\n", s->unknown_names);
}

/* ---- --layers rows ------------------------------------------------------------------- */

static bool row_is(const rt_layer_prof_row *r, const char *kind, const char *shape, rt_prof_pass pass) {
    return r->pass == pass && strcmp(r->kind, kind) == 0 && strcmp(r->shape, shape) == 0;
}

void rt_bench_ledger_layer_json(const rt_bench_ledger *l, const rt_layer_profile *p, const char *kind,
                                const char *shape, rt_prof_pass pass, int steps, bool with_ops) {
    rt_layer_prof_row sum = {.ledger = false};
    for (int i = 0; i < p->n; i++) {
        const rt_layer_prof_row *r = &p->rows[i];
        if (!row_is(r, kind, shape, pass) || !r->ledger) continue;
        sum.ledger = true;
        sum.ledger_bytes += r->ledger_bytes, sum.ledger_flops += r->ledger_flops;
        sum.ledger_modelled_s += r->ledger_modelled_s, sum.ledger_launches += r->ledger_launches;
        sum.ledger_library_calls += r->ledger_library_calls, sum.ledger_copies += r->ledger_copies;
        sum.ledger_host_syncs += r->ledger_host_syncs;
    }
    if (!sum.ledger || !l->api) return;
    printf(", \"dram_bytes_per_step\": %.0f, \"flops_per_step\": %.0f, \"launches_per_step\": %.4g, "
           "\"library_calls_per_step\": %.4g, \"copies_per_step\": %.4g, \"host_syncs_per_step\": %.4g",
           sum.ledger_bytes / steps, sum.ledger_flops / steps, (double)sum.ledger_launches / steps,
           (double)sum.ledger_library_calls / steps, (double)sum.ledger_copies / steps,
           (double)sum.ledger_host_syncs / steps);
    if (l->modelled)
        printf(", \"modelled_ms_per_step\": %.5f", sum.ledger_modelled_s * 1e3 / steps);
    else
        printf(", \"modelled_ms_per_step\": null");
    if (!with_ops) return;
    enum { CAP = 64 };
    op_group g[CAP];
    size_t ng = 0;
    for (int i = 0; i < p->n; i++) {
        const rt_layer_prof_row *r = &p->rows[i];
        if (!row_is(r, kind, shape, pass) || !r->ledger || r->ledger_nops == 0 || r->ledger_nops > CAP) continue;
        rt_cost_op ops[CAP];
        const size_t got = l->api->ops(ops, r->ledger_first_op, r->ledger_nops);
        group_ops(ops, got, (double)r->calls / steps, g, &ng, CAP);
    }
    print_groups(g, ng);
}
