/* rt_dist_env_read: rank, world size, local rank and local world size from the
 * launcher's environment (see dist.h for the rule). The rendezvous reads them here too. */
#include "dist/dist.h"
#include "dist/internal/env.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum { F_RANK, F_WORLD, F_LOCAL, F_LOCAL_WORLD, F_COUNT_ }; /* the fields of rt_dist_env */

typedef struct launcher_vars {
    const char *launcher;
    const char *var[F_COUNT_];
} launcher_vars;

static const launcher_vars k_launchers[] = {
    {"torchrun", {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}},
    {"openmpi",
     {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"}},
    {"slurm", {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"}},
};
enum { N_LAUNCHERS = sizeof k_launchers / sizeof k_launchers[0], RT_DIST_ENV_MAX = 1 << 20 };

const char *rt_env_get(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

rt_status rt_env_parse_int(const char *name, const char *text, int lo, int hi, int *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end != '\0' || v < lo || v > hi)
        return RT_ERROR(RT_ERR_INVALID, "%s='%s' is not an integer in %d..%d", name, text, lo, hi);
    *out = (int)v;
    return RT_OK;
}

rt_status rt_dist_env_read(rt_dist_env *out) {
    RT_REQUIRE(out != NULL, RT_ERR_INVALID, "rt_dist_env_read: NULL output");
    *out = (rt_dist_env){-1, -1, -1, -1, NULL, NULL};
    for (int i = 0; i < N_LAUNCHERS; i++) {
        const launcher_vars *l = &k_launchers[i];
        bool any = false;
        for (int k = 0; k < F_COUNT_; k++) any = any || rt_env_get(l->var[k]) != NULL;
        if (!any) continue;
        int *field[F_COUNT_] = {&out->rank, &out->world_size, &out->local_rank, &out->local_world_size};
        for (int k = 0; k < F_COUNT_; k++) { /* sizes are at least 1, ranks at least 0 */
            const char *v = rt_env_get(l->var[k]);
            bool is_size = k == F_WORLD || k == F_LOCAL_WORLD;
            if (v) RT_CHECK(rt_env_parse_int(l->var[k], v, is_size ? 1 : 0, RT_DIST_ENV_MAX, field[k]));
        }
        out->launcher = l->launcher;
        if (out->rank >= 0) out->rank_source = l->var[F_RANK];
        RT_REQUIRE(out->rank < 0 || out->world_size < 0 || out->rank < out->world_size, RT_ERR_INVALID,
                   "%s=%d is out of range for %s=%d", l->var[F_RANK], out->rank, l->var[F_WORLD], out->world_size);
        RT_REQUIRE(out->local_rank < 0 || out->local_world_size < 0 || out->local_rank < out->local_world_size,
                   RT_ERR_INVALID, "%s=%d is out of range for %s=%d", l->var[F_LOCAL], out->local_rank,
                   l->var[F_LOCAL_WORLD], out->local_world_size);
        return RT_OK;
    }
    return RT_OK;
}
