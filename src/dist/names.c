/* Name tables of src/dist (see internal/names.h and dist.h). */
#include "dist/dist.h"
#include "dist/internal/names.h"

#include "core/names.h"

static const char *const k_kinds[RT_K_COUNT_] = {
    [RT_K_NONE_] = "?",         [RT_K_P2P] = "send/recv",        [RT_K_BCAST] = "broadcast",
    [RT_K_REDUCE] = "reduce",   [RT_K_ALLREDUCE] = "all_reduce", [RT_K_SCATTER] = "scatter",
    [RT_K_GATHER] = "gather",   [RT_K_ALLGATHER] = "all_gather", [RT_K_REDUCE_SCATTER] = "reduce_scatter",
    [RT_K_BARRIER] = "barrier",
};
static const char *const k_transports[RT_TRANSPORT_COUNT_] = {"auto", "tcp", "shm", "nccl"};
static const char *const k_algos[RT_ALGO_COUNT_] = {"ring", "naive", "rsag", "nccl"};

const char *rt_comm_kind_name(int kind) {
    return kind > RT_K_NONE_ && kind < RT_K_COUNT_ ? k_kinds[kind] : "unknown operation";
}
const char *rt_comm_op_name(int kind, bool is_send) {
    if (kind == RT_K_P2P) return is_send ? "send" : "recv";
    return rt_comm_kind_name(kind);
}

rt_status rt_dist_name_parse(const char *what, const char *const *names, int n, const char *text, int *out) {
    int i = rt_names_find(names, n, text);
    if (i >= 0) {
        *out = i;
        return RT_OK;
    }
    char list[256];
    rt_names_join(names, n, list, sizeof list);
    if (!text) return RT_ERROR(RT_ERR_INVALID, "no %s given (expected %s)", what, list);
    return RT_ERROR(RT_ERR_INVALID, "unknown %s '%s' (expected %s)", what, text, list);
}

const char *rt_transport_name(rt_transport t) { return (unsigned)t < RT_TRANSPORT_COUNT_ ? k_transports[t] : "?"; }
const char *rt_algo_name(rt_algo a) { return (unsigned)a < RT_ALGO_COUNT_ ? k_algos[a] : "?"; }

rt_status rt_transport_parse(const char *text, rt_transport *out) {
    int i = 0;
    RT_CHECK(rt_dist_name_parse("transport", k_transports, RT_TRANSPORT_COUNT_, text, &i));
    *out = (rt_transport)i;
    return RT_OK;
}
rt_status rt_algo_parse(const char *text, rt_algo *out) {
    int i = 0;
    RT_CHECK(rt_dist_name_parse("algorithm", k_algos, RT_ALGO_COUNT_, text, &i));
    *out = (rt_algo)i;
    return RT_OK;
}
