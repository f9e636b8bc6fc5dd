/* The device tables of src/dist, picked here only: the transports' (transport.h), with
 * the choice of a world group's transport, and bf16 compression's steps per device kind
 * (bf16_ops.h). A new transport is its own file filling an rt_transport_ops, its row
 * here, its enum member in dist.h and its name in names.c. */
#include "dist/internal/bf16_ops.h"
#include "dist/internal/pg_internal.h"

#include "core/log.h"

const rt_dist_bf16_ops *rt_dist_bf16_ops_of(rt_device_kind kind) {
    static const rt_dist_bf16_ops *const k_bf16[RT_DEVICE_KIND_COUNT_] = {
        [RT_DEVICE_CPU] = &rt_dist_bf16_cpu,
#ifdef RT_HAVE_CUDA
        [RT_DEVICE_CUDA] = &rt_dist_bf16_cuda,
#endif
    };
    return (unsigned)kind < RT_DEVICE_KIND_COUNT_ ? k_bf16[kind] : NULL;
}

static const rt_transport_ops *const k_tables[RT_TRANSPORT_COUNT_] = {
    [RT_TRANSPORT_TCP] = &rt_tp_tcp,
    [RT_TRANSPORT_SHM] = &rt_tp_shm,
#ifdef RT_HAVE_CUDA
    [RT_TRANSPORT_NCCL] = &rt_tp_nccl,
#endif
};

const rt_transport_ops *rt_transport_ops_of(rt_transport t) {
    return (unsigned)t < RT_TRANSPORT_COUNT_ ? k_tables[t] : NULL;
}

bool rt_transport_takes_host(rt_transport t) {
    const rt_transport_ops *tp = rt_transport_ops_of(t);
    return t == RT_TRANSPORT_AUTO || (tp && !tp->device_only);
}

/* A byte-stream transport (the engine drives it): its channels carry the transfers. */
static bool is_host(const rt_transport_ops *tp) { return tp->send != NULL; }

/* Connect one transport: can it, then its setup. A host transport connects only peers
 * (a group of one has none). */
static rt_status connect_one(rt_pg *pg, const rt_transport_ops *tp, const rt_transport_setup *s) {
    if (tp->can_connect) RT_CHECK(tp->can_connect(pg, s));
    if (is_host(tp) && pg->size == 1) return RT_OK;
    return tp->setup(pg, s);
}

/* auto with device buffers: the first built transport that takes them and connects (nccl:
 * every rank has a GPU of its own; the check reads every rank's answer, so all decide
 * alike); one that cannot (RT_ERR_UNSUPPORTED) is logged and the next is tried. Else the
 * host transport stages them. */
static rt_status try_device(rt_pg *pg, const rt_transport_setup *s) {
    for (int k = 0; k < RT_TRANSPORT_COUNT_; k++) {
        const rt_transport_ops *d = k_tables[k];
        if (!d || !d->device_only) continue;
        rt_status ds = connect_one(pg, d, s);
        if (ds == RT_OK) {
            pg->tp = d;
            return RT_OK;
        }
        if (ds != RT_ERR_UNSUPPORTED) return ds;
        RT_LOG_INFO("transport auto: %s; device buffers go through pinned host memory over %s", rt_error_message(),
                    pg->tp->name);
        if (d->teardown) d->teardown(pg->w);
        rt_error_clear();
    }
    return RT_OK;
}

rt_status rt_transport_connect(rt_pg *pg, const rt_pg_options *o, const rt_transport_setup *s) {
    rt_transport want = o->transport;
    RT_REQUIRE((unsigned)want < RT_TRANSPORT_COUNT_, RT_ERR_INVALID, "transport %d: expected one of rt_transport",
               (int)want);
    const rt_transport_ops *tp = rt_transport_ops_of(want);
    RT_REQUIRE(want == RT_TRANSPORT_AUTO || tp, RT_ERR_UNSUPPORTED,
               "transport %s: built without CUDA/NCCL (it is not in this build)", rt_transport_name(want));
    /* the engine's channels: the transport asked for, or tcp under a whole-operation one;
     * auto: shm when every rank shares this host, else tcp */
    const rt_transport_ops *host = &rt_tp_tcp;
    if (tp && is_host(tp))
        host = tp;
    else if (!tp && s->same_host && pg->size > 1)
        host = &rt_tp_shm;
    RT_CHECK(connect_one(pg, host, s));
    pg->tp = host;
    if (tp && !is_host(tp)) {
        RT_CHECK(connect_one(pg, tp, s));
        pg->tp = tp;
    } else if (!tp && o->device.kind == RT_DEVICE_CUDA) {
        RT_CHECK(try_device(pg, s));
    }
    pg->transport = pg->tp->kind;
    return RT_OK;
}
