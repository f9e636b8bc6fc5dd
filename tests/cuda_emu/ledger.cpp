/* The cost ledger of the emulated GPUs (docs/gpu.md "The cost ledger", src/core/cost_ledger.h
 * for the types, include/rt_emu_ledger.h for the exported functions).
 *
 * Every operation is recorded on the thread that enqueues it, when it is enqueued (so a
 * host reading the ledger between two calls sees exactly the calls in between, with no
 * synchronisation): a kernel launch (emu.cpp, its cost from kernel_costs.cpp), a cuDNN,
 * cuBLAS or NCCL compute call (cudnn.cpp, cublas.cpp, nccl.cpp, from their descriptors'
 * shapes and data types, never from the algorithm the emulation picks), a copy or a fill
 * (runtime.cpp). Host synchronisations are the runtime's counter (rt_emu_host_syncs).
 * An operation enqueued on a capturing stream is not counted then (nothing runs): its
 * record goes into the graph being captured (runtime.cpp, rt_emu_capture_cost), and every
 * cudaGraphLaunch of that graph adds its records, marked captured, and one graph launch
 * (so a step run as a graph costs what its operations cost, without their host calls).
 *
 * RINGTRAIN_EMU_LEDGER: unset or 0 off, 1 on, count on and count only (kernels, cuDNN and
 * cuBLAS skip their arithmetic: fast, results garbage). rt_emu_ledger_enable switches it
 * at run time (`ringtrain bench model --device cuda` does).
 */
#include "emu_internal.h"
#include "rt_emu_ledger.h"

#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <mutex>
#include <vector>

namespace {

const size_t MAX_OPS = (size_t)1 << 20; /* kept for rt_emu_ledger_ops; totals go on beyond */

struct ledger_state {
    std::once_flag once;
    std::mutex m;
    int mode = 0;
    rt_cost_ledger tot{};     /* since the reset; host_syncs from sync_base */
    unsigned long long sync_base = 0;
    std::vector<rt_cost_op> ops;
    bool dropped = false; /* ops beyond MAX_OPS were not kept */
    bool model_set = false;
    rt_cost_model model{};
    double ops_s = 0; /* the model's time of the recorded operations */
    unsigned long long graph_launches = 0; /* since the reset */
};

ledger_state &L = *new ledger_state; /* never destroyed: workers may record after main() */

void init_once(void) {
    const char *v = getenv("RINGTRAIN_EMU_LEDGER");
    if (!v || !*v || strcmp(v, "0") == 0)
        L.mode = 0;
    else if (strcmp(v, "1") == 0)
        L.mode = 1;
    else if (strcmp(v, "count") == 0)
        L.mode = 2;
    else
        rt_emu_fatal("RINGTRAIN_EMU_LEDGER=%s: expected 0, 1 or count", v);
}

void init(void) { std::call_once(L.once, init_once); }

double op_time(const rt_cost_model &m, const rt_cost_op &o) {
    double t = 0;
    const double peak = m.peak_flops[o.math];
    if (o.flops > 0 && peak > 0 && m.eta > 0) t = o.flops / (m.eta * peak);
    if (m.bandwidth > 0 && m.beta > 0) t = std::max(t, (o.bytes_read + o.bytes_written) / (m.beta * m.bandwidth));
    if (!o.captured) t = std::max(t, m.h);
    return t;
}

/* L.m held */
void add(const rt_cost_op &o) {
    rt_cost_ledger &t = L.tot;
    t.ops++;
    if (o.kind == RT_COST_KERNEL) t.launches++;
    if (o.kind == RT_COST_CUDNN || o.kind == RT_COST_CUBLAS || o.kind == RT_COST_NCCL) t.library_calls++;
    if (o.kind == RT_COST_COPY) t.copies++;
    if (o.kind == RT_COST_FILL) t.fills++;
    if (o.captured) t.captured++;
    t.bytes_read += o.bytes_read;
    t.bytes_written += o.bytes_written;
    t.flops += o.flops;
    t.kind_bytes[o.kind] += o.bytes_read + o.bytes_written;
    t.kind_flops[o.kind] += o.flops;
    if (L.model_set) L.ops_s += op_time(L.model, o);
    if (L.ops.size() < MAX_OPS)
        L.ops.push_back(o);
    else
        L.dropped = true;
}

/* the unknown kernel's name into the list, once */
void note_unknown(const char *name) {
    char *list = L.tot.unknown_names;
    const size_t len = strlen(list), n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != nullptr; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == 0)) return;
    if (len + n + 2 >= sizeof L.tot.unknown_names) return;
    if (len) strcat(list, ",");
    strcat(list, name);
}

} // namespace

extern "C" {

int rt_emu_ledger_on(void) {
    init();
    return __atomic_load_n(&L.mode, __ATOMIC_RELAXED) != 0;
}

int rt_emu_ledger_count_only(void) {
    init();
    return __atomic_load_n(&L.mode, __ATOMIC_RELAXED) == 2;
}

void rt_emu_ledger_record(cudaStream_t s, int kind, const char *name, const rt_emu_cost *c) {
    rt_cost_op o{};
    o.name = name;
    o.kind = kind;
    o.math = c->math;
    o.stream = rt_emu_stream_serial(s);
    o.captured = 1;
    o.bytes_read = c->bytes_read;
    o.bytes_written = c->bytes_written;
    o.flops = c->flops;
    if (rt_emu_capture_cost(s, &o)) return; /* counted at each launch of the graph */
    if (!rt_emu_ledger_on()) return;
    o.captured = 0;
    std::lock_guard<std::mutex> lk(L.m);
    add(o);
}

void rt_emu_ledger_unknown_kernel(cudaStream_t s, const char *name) {
    rt_emu_cost none{0, 0, 0, RT_COST_MATH_NONE};
    rt_emu_ledger_record(s, RT_COST_KERNEL, name, &none);
    if (!rt_emu_ledger_on()) return;
    std::lock_guard<std::mutex> lk(L.m);
    L.tot.unknown_kernels++; /* a capturing stream's is counted at the launches: once here too */
    note_unknown(name);
}

void rt_emu_ledger_graph_launch(cudaStream_t s, const rt_cost_op *ops, size_t n) {
    (void)s;
    if (!rt_emu_ledger_on()) return;
    std::lock_guard<std::mutex> lk(L.m);
    L.graph_launches++;
    for (size_t i = 0; i < n; i++) {
        add(ops[i]);
        if (ops[i].kind == RT_COST_KERNEL && !rt_emu_kernel_cost_known(ops[i].name)) {
            L.tot.unknown_kernels++;
            note_unknown(ops[i].name);
        }
    }
}

int rt_emu_ledger_enable(int mode) {
    init();
    std::lock_guard<std::mutex> lk(L.m);
    if (mode < 0 || mode > 2) return L.mode;
    if (L.mode == 2 && mode == 1) mode = 2; /* "on" keeps count only (RINGTRAIN_EMU_LEDGER=count) */
    __atomic_store_n(&L.mode, mode, __ATOMIC_RELAXED);
    return mode;
}

void rt_emu_ledger_reset(void) {
    init();
    std::lock_guard<std::mutex> lk(L.m);
    L.tot = rt_cost_ledger{};
    L.sync_base = rt_emu_host_syncs();
    L.ops.clear();
    L.dropped = false;
    L.ops_s = 0;
    L.graph_launches = 0;
}

int rt_emu_ledger_read(rt_cost_ledger *out) {
    init();
    if (!out || out->size != sizeof(rt_cost_ledger)) return -1;
    std::lock_guard<std::mutex> lk(L.m);
    rt_cost_ledger t = L.tot;
    t.size = sizeof t;
    t.mode = L.mode;
    t.host_syncs = rt_emu_host_syncs() - L.sync_base;
    t.graph_launches = L.graph_launches;
    t.modelled = L.model_set;
    t.modelled_s = L.model_set ? L.ops_s + L.model.h * (double)t.graph_launches + L.model.sync_s * (double)t.host_syncs
                               : 0;
    *out = t;
    return 0;
}

size_t rt_emu_ledger_ops(rt_cost_op *out, size_t first, size_t cap) {
    init();
    std::lock_guard<std::mutex> lk(L.m);
    if (first >= L.ops.size()) return 0;
    const size_t n = std::min(cap, L.ops.size() - first);
    std::copy(L.ops.begin() + (ptrdiff_t)first, L.ops.begin() + (ptrdiff_t)(first + n), out);
    return n;
}

void rt_emu_ledger_set_model(const rt_cost_model *m) {
    init();
    std::lock_guard<std::mutex> lk(L.m);
    L.model_set = m != nullptr;
    if (m) L.model = *m;
    L.ops_s = 0;
    if (L.model_set && !L.dropped)
        for (const rt_cost_op &o : L.ops) L.ops_s += op_time(L.model, o);
}

} // extern "C"
