/* Rendezvous: who am I (rank, world size, local rank) and where is the store.
 *
 * init methods (as torch.distributed):
 *   env://              MASTER_ADDR, MASTER_PORT (+ RANK, WORLD_SIZE, LOCAL_RANK)
 *   tcp://HOST:PORT     the store's address given directly
 *   file:///some/path   rank 0 hosts the store on an ephemeral port and writes
 *                       "host port token" to the file (0600, atomic rename); the other
 *                       ranks read it, re-reading until they connect.
 * Rank and world size come from the arguments when >= 0, else from RANK/WORLD_SIZE
 * (torchrun), OMPI_COMM_WORLD_RANK/SIZE (Open MPI mpirun) or SLURM_PROCID/SLURM_NTASKS
 * (srun); the local rank from LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID.
 *
 * Store port: MASTER_PORT, except under torchrun (TORCHELASTIC_USE_AGENT_STORE=True,
 * whose own store already listens on MASTER_PORT) where it is MASTER_PORT+1;
 * RINGTRAIN_STORE_PORT overrides both. Rank 0 hosts the store unless
 * RINGTRAIN_STORE_HOSTED=1 (a launcher hosts it).
 *
 * Job secret (docs/security.md): every store connection and every transport connection
 * proves it knows it (internal/auth.h); it never travels. RINGTRAIN_JOB_TOKEN (ringtrain's
 * launcher sets a random one), else what every rank of the launch shares:
 * TORCHELASTIC_RUN_ID (torchrun), SLURM_JOB_ID.SLURM_STEP_ID (srun),
 * OMPI_MCA_ess_base_jobid (mpirun) - guessable by other users of the hosts, so a warning
 * says so - else, for file://, a random one rank 0 writes to the file (0600). Without any,
 * env:// and tcp:// are refused.
 *
 * The store listens on the address the ranks connect to (MASTER_ADDR, the tcp:// host,
 * for file:// the address it publishes), never on every interface unless that address
 * is 0.0.0.0.
 */
#ifndef RT_DIST_RENDEZVOUS_H
#define RT_DIST_RENDEZVOUS_H

#include "core/status.h"
#include "dist/store.h"
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rt_rdzv_kind { RT_RDZV_ENV = 0, RT_RDZV_TCP, RT_RDZV_FILE } rt_rdzv_kind;

typedef struct rt_rdzv {
    rt_rdzv_kind kind;
    int rank, world, local_rank;
    char host[256];            /* store host (env://, tcp://) */
    int port;                  /* store port */
    char path[1024];           /* file:// */
    char job[256];             /* the job secret */
    const char *secret_source; /* which variable gave it (NULL: none yet) */
    bool host_store;           /* this process hosts the store */
    const char *rank_source;   /* which variables gave the rank ("RANK", "OMPI_COMM_WORLD_RANK", ...) */
} rt_rdzv;

/* Resolve the init method and the environment. rank/world: -1 = from the environment. */
rt_status rt_rdzv_parse(const char *init_method, int rank, int world, rt_rdzv *out);
/* Start the store if this process hosts it, then connect to it (retrying until
 * timeout_s). *server is NULL when another process hosts the store. */
rt_status rt_rdzv_connect(rt_rdzv *r, double timeout_s, rt_store_server **server, rt_store **store);

#ifdef __cplusplus
}
#endif

#endif
