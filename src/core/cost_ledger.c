/* The cost ledger's lookup (core/cost_ledger.h): weak references to the functions the
 * emulated CUDA runtime exports (tests/cuda_emu/include/rt_emu_ledger.h). They resolve
 * only where that runtime is linked in (the RINGTRAIN_CUDA=EMU build); elsewhere they
 * stay NULL and there is no ledger. */
#include "core/cost_ledger.h"

#include <jansson.h>
#include <stdbool.h>
#include <string.h>

extern int rt_emu_ledger_enable(int mode) __attribute__((weak));
extern void rt_emu_ledger_reset(void) __attribute__((weak));
extern int rt_emu_ledger_read(rt_cost_ledger *out) __attribute__((weak));
extern size_t rt_emu_ledger_ops(rt_cost_op *out, size_t first, size_t cap) __attribute__((weak));
extern void rt_emu_ledger_set_model(const rt_cost_model *m) __attribute__((weak));

const rt_cost_ledger_api *rt_cost_ledger_find(void) {
    static const rt_cost_ledger_api *api;
    static rt_cost_ledger_api table;
    if (api) return api;
    if (!rt_emu_ledger_enable || !rt_emu_ledger_reset || !rt_emu_ledger_read || !rt_emu_ledger_ops ||
        !rt_emu_ledger_set_model)
        return NULL;
    table = (rt_cost_ledger_api){rt_emu_ledger_enable, rt_emu_ledger_reset, rt_emu_ledger_read, rt_emu_ledger_ops,
                                 rt_emu_ledger_set_model};
    api = &table;
    return api;
}

void rt_cost_ledger_diff(const rt_cost_ledger *a, const rt_cost_ledger *b, rt_cost_ledger *out) {
    rt_cost_ledger d = *a;
    d.ops = a->ops - b->ops;
    d.launches = a->launches - b->launches;
    d.library_calls = a->library_calls - b->library_calls;
    d.copies = a->copies - b->copies;
    d.fills = a->fills - b->fills;
    d.host_syncs = a->host_syncs - b->host_syncs;
    d.graph_launches = a->graph_launches - b->graph_launches;
    d.captured = a->captured - b->captured;
    d.unknown_kernels = a->unknown_kernels - b->unknown_kernels;
    d.bytes_read = a->bytes_read - b->bytes_read;
    d.bytes_written = a->bytes_written - b->bytes_written;
    d.flops = a->flops - b->flops;
    for (int k = 0; k < RT_COST_KINDS; k++) {
        d.kind_bytes[k] = a->kind_bytes[k] - b->kind_bytes[k];
        d.kind_flops[k] = a->kind_flops[k] - b->kind_flops[k];
    }
    d.modelled_s = a->modelled_s - b->modelled_s;
    *out = d;
}

const char *rt_cost_kind_name(int kind) {
    static const char *const names[RT_COST_KINDS] = {"kernel", "cudnn", "cublas", "nccl", "copy", "fill"};
    return kind >= 0 && kind < RT_COST_KINDS ? names[kind] : "?";
}

const char *rt_cost_math_name(int math) {
    static const char *const names[RT_COST_MATHS] = {"none", "fp32", "tf32", "bf16"};
    return math >= 0 && math < RT_COST_MATHS ? names[math] : "?";
}

/* the number obj[key] (> 0, or >= 0 when zero_ok) into *out */
static rt_status model_number(const char *path, json_t *obj, const char *key, bool zero_ok, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_number(v))
        RT_FAIL(RT_ERR_FORMAT, "cost calibration %s: \"%s\" is missing or not a number (expected %s)", path, key,
                zero_ok ? "a number >= 0" : "a number > 0");
    const double x = json_number_value(v);
    if (!(x > 0 || (zero_ok && x == 0)))
        RT_FAIL(RT_ERR_FORMAT, "cost calibration %s: \"%s\" is %g (expected %s)", path, key, x,
                zero_ok ? "a number >= 0" : "a number > 0");
    *out = x;
    return RT_OK;
}

static rt_status model_fields(const char *path, json_t *root, rt_cost_model *m) {
    if (!json_is_object(root)) RT_FAIL(RT_ERR_FORMAT, "cost calibration %s: expected a JSON object", path);
    json_t *peaks = json_object_get(root, "peak_flops");
    if (!json_is_object(peaks))
        RT_FAIL(RT_ERR_FORMAT, "cost calibration %s: \"peak_flops\" is missing (expected {\"fp32\", \"tf32\", \"bf16\"})",
                path);
    memset(m, 0, sizeof *m);
    for (int k = RT_COST_MATH_FP32; k < RT_COST_MATHS; k++)
        RT_CHECK(model_number(path, peaks, rt_cost_math_name(k), false, &m->peak_flops[k]));
    RT_CHECK(model_number(path, root, "bandwidth_bytes_per_s", false, &m->bandwidth));
    RT_CHECK(model_number(path, root, "eta", false, &m->eta));
    RT_CHECK(model_number(path, root, "beta", false, &m->beta));
    RT_CHECK(model_number(path, root, "h_s", true, &m->h));
    RT_CHECK(model_number(path, root, "sync_s", true, &m->sync_s));
    return RT_OK;
}

rt_status rt_cost_model_load(const char *path, rt_cost_model *m) {
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (je.line < 0) RT_FAIL(RT_ERR_IO, "cost calibration %s: cannot read it (%s)", path, je.text);
        RT_FAIL(RT_ERR_FORMAT, "cost calibration %s: line %d: %s", path, je.line, je.text);
    }
    rt_status st = model_fields(path, root, m);
    json_decref(root);
    return st;
}
