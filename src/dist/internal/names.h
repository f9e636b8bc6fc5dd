/* The name tables of src/dist, each in one place: operations (the kinds every message
 * header carries, used in errors and by the nccl transport). Every public *_parse of a
 * name is core's rt_names_parse of its table (core/names.h). */
#ifndef RT_DIST_NAMES_H
#define RT_DIST_NAMES_H

#include "core/status.h"
#include <stdbool.h>

/* Operation kinds: one per public operation, carried in every message header. */
typedef enum rt_comm_kind {
    RT_K_NONE_ = 0,
    RT_K_P2P,
    RT_K_BCAST,
    RT_K_REDUCE,
    RT_K_ALLREDUCE,
    RT_K_SCATTER,
    RT_K_GATHER,
    RT_K_ALLGATHER,
    RT_K_REDUCE_SCATTER,
    RT_K_BARRIER,
    RT_K_COUNT_
} rt_comm_kind;

/* "all_reduce", ...; RT_K_P2P is "send/recv" (a message of either side). Unknown
 * kinds (a corrupt header): "unknown operation". */
const char *rt_comm_kind_name(int kind);
/* The name of one call: as rt_comm_kind_name, with "send" or "recv" for RT_K_P2P. */
const char *rt_comm_op_name(int kind, bool is_send);

#endif
