/* Process-group internals shared by pg.c, collectives.c and the nccl transport. */
#ifndef RT_DIST_PG_INTERNAL_H
#define RT_DIST_PG_INTERNAL_H

#include "dist/dist.h"
#include "dist/engine.h"
#include "dist/rendezvous.h"

enum rt_comm_kind {
    RT_K_P2P = 1,
    RT_K_BCAST,
    RT_K_REDUCE,
    RT_K_ALLREDUCE,
    RT_K_SCATTER,
    RT_K_GATHER,
    RT_K_ALLGATHER,
    RT_K_REDUCE_SCATTER,
    RT_K_BARRIER,
};

typedef struct rt_pg_world {
    rt_engine eng;
    rt_rdzv rdzv;
    rt_store *store;
    rt_store_server *server;
    uint8_t token[RT_TOKEN_BYTES];
    char tokhex[2 * RT_TOKEN_BYTES + 1];
    int next_group;
    void *nccl; /* nccl transport state (CUDA builds) */
} rt_pg_world;

struct rt_pg {
    rt_pg_world *w;
    rt_device buf_device; /* where collective buffers live (see rt_pg_set_buffer_device) */
    void *stage;          /* pinned host staging for device buffers over tcp/shm */
    size_t stage_bytes;
    bool stage_pinned;
    bool is_world;
    int rank, size; /* in this group */
    int *ranks;     /* group rank -> world rank */
    int id;
    uint32_t seq;
    double timeout_s;
    rt_algo algo;
    rt_transport transport;
};

/* Host identity: hostname | boot id | network namespace (ranks with equal ids share
 * memory). */
void rt_dist_host_id(char *buf, size_t n);

/* nccl transport (cuda/nccl.c in CUDA builds; stubs in pg.c otherwise). The buffers
 * are device pointers on the rank's GPU; peers are world ranks (world group only). */
rt_status rt_pg_nccl_init(rt_pg *pg);
void rt_pg_nccl_destroy(rt_pg_world *w);
rt_status rt_nccl_coll(rt_pg *pg, int kind, const void *send, void *recv, size_t count, rt_dtype dtype, rt_reduce_op op,
                       int root);
rt_status rt_nccl_p2p(rt_pg *pg, bool is_send, void *buf, size_t count, rt_dtype dtype, int peer);

#endif
