/* Name tables of src/dist (see internal/names.h and dist.h). */
#include "dist/dist.h"
#include "dist/internal/names.h"
#include "dist/reducer.h"

#include "core/names.h"

static const char *const k_kinds[RT_K_COUNT_] = {
    [RT_K_NONE_] = "?",         [RT_K_P2P] = "send/recv",        [RT_K_BCAST] = "broadcast",
    [RT_K_REDUCE] = "reduce",   [RT_K_ALLREDUCE] = "all_reduce", [RT_K_SCATTER] = "scatter",
    [RT_K_GATHER] = "gather",   [RT_K_ALLGATHER] = "all_gather", [RT_K_REDUCE_SCATTER] = "reduce_scatter",
    [RT_K_BARRIER] = "barrier",
};
static const char *const k_transports[RT_TRANSPORT_COUNT_] = {
    [RT_TRANSPORT_AUTO] = "auto", [RT_TRANSPORT_TCP] = "tcp", [RT_TRANSPORT_SHM] = "shm", [RT_TRANSPORT_NCCL] = "nccl"};
static const char *const k_algos[RT_ALGO_COUNT_] = {
    [RT_ALGO_RING] = "ring", [RT_ALGO_NAIVE] = "naive", [RT_ALGO_RSAG] = "rsag", [RT_ALGO_NCCL] = "nccl"};
static const char *const k_compress[2] = {[false] = "none", [true] = "bf16"}; /* indexed by compress_bf16 */
const rt_names rt_transport_names = {"transport", RT_TRANSPORT_COUNT_, k_transports, NULL, NULL};
const rt_names rt_algo_names = {"algorithm", RT_ALGO_COUNT_, k_algos, NULL, NULL};
const rt_names rt_compress_names = {"gradient compression", 2, k_compress, NULL, NULL};

const char *rt_comm_kind_name(int kind) {
    return kind > RT_K_NONE_ && kind < RT_K_COUNT_ ? k_kinds[kind] : "unknown operation";
}
const char *rt_comm_op_name(int kind, bool is_send) {
    if (kind == RT_K_P2P) return is_send ? "send" : "recv";
    return rt_comm_kind_name(kind);
}

const char *rt_transport_name(rt_transport t) { return (unsigned)t < RT_TRANSPORT_COUNT_ ? k_transports[t] : "?"; }
const char *rt_algo_name(rt_algo a) { return (unsigned)a < RT_ALGO_COUNT_ ? k_algos[a] : "?"; }

rt_status rt_transport_parse(const char *text, rt_transport *out) {
    int i = 0;
    rt_status st = rt_names_parse(&rt_transport_names, text, &i); /* a complete message: no trace line */
    if (st == RT_OK) *out = (rt_transport)i;
    return st;
}
rt_status rt_algo_parse(const char *text, rt_algo *out) {
    int i = 0;
    rt_status st = rt_names_parse(&rt_algo_names, text, &i);
    if (st == RT_OK) *out = (rt_algo)i;
    return st;
}
