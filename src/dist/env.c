/* rt_dist_env_read: rank, world size, local rank and local world size from the
 * launcher's environment (see dist.h for the rule). The rendezvous reads them here too. */
#include "dist/dist.h"
#include "dist/internal/env.h"

#include "core/settings.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum { F_RANK, F_WORLD, F_LOCAL, F_LOCAL_WORLD, F_COUNT_ }; /* the fields of rt_dist_env */

/* the variables of each launcher (rows of core/settings.h: their ranges are there, ranks
 * from 0 and sizes from 1, at most 2^20) */
typedef struct launcher_vars {
    const char *launcher;
    const char *program; /* for messages: "torchrun", "Open MPI's mpirun", ... */
    rt_setting_id var[F_COUNT_];
} launcher_vars;

static const launcher_vars k_launchers[] = {
    {"torchrun", "torchrun", {RT_SET_RANK, RT_SET_WORLD_SIZE, RT_SET_LOCAL_RANK, RT_SET_LOCAL_WORLD_SIZE}},
    {"openmpi",
     "Open MPI's mpirun",
     {RT_SET_OMPI_RANK, RT_SET_OMPI_SIZE, RT_SET_OMPI_LOCAL_RANK, RT_SET_OMPI_LOCAL_SIZE}},
    {"slurm",
     "Slurm's srun",
     {RT_SET_SLURM_PROCID, RT_SET_SLURM_NTASKS, RT_SET_SLURM_LOCALID, RT_SET_SLURM_NTASKS_PER_NODE}},
};
enum { N_LAUNCHERS = sizeof k_launchers / sizeof k_launchers[0] };

static const char *var_name(rt_setting_id id) { return rt_setting_info_get(id)->name; }

rt_status rt_env_parse_int(const char *name, const char *text, int lo, int hi, int *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end != '\0' || v < lo || v > hi)
        return RT_ERROR(RT_ERR_INVALID, "%s='%s' is not an integer in %d..%d", name, text, lo, hi);
    *out = (int)v;
    return RT_OK;
}

/* A launcher sets the rank and the world size together (the local pair is optional: srun
 * may leave it); one without the other is a half-set environment, not a one-rank job. */
static rt_status check_pair(const launcher_vars *l, const rt_dist_env *e) {
    if ((e->rank < 0) == (e->world_size < 0)) return RT_OK;
    rt_setting_id set = e->rank >= 0 ? l->var[F_RANK] : l->var[F_WORLD];
    rt_setting_id unset = e->rank >= 0 ? l->var[F_WORLD] : l->var[F_RANK];
    RT_FAIL(RT_ERR_INVALID, "%s=%d is set but %s is not: a launcher sets both (%s does); set %s or unset %s",
            var_name(set), e->rank >= 0 ? e->rank : e->world_size, var_name(unset), l->program, var_name(unset),
            var_name(set));
}

rt_status rt_dist_env_read(rt_dist_env *out) {
    RT_REQUIRE(out != NULL, RT_ERR_INVALID, "rt_dist_env_read: NULL output");
    *out = (rt_dist_env){-1, -1, -1, -1, NULL, NULL};
    for (int i = 0; i < N_LAUNCHERS; i++) {
        const launcher_vars *l = &k_launchers[i];
        bool any = false;
        for (int k = 0; k < F_COUNT_; k++) any = any || rt_setting_is_set(l->var[k]);
        if (!any) continue;
        int *field[F_COUNT_] = {&out->rank, &out->world_size, &out->local_rank, &out->local_world_size};
        for (int k = 0; k < F_COUNT_; k++) { /* unset: stays -1 */
            int64_t v = -1;
            RT_CHECK(rt_setting_int(l->var[k], &v));
            *field[k] = (int)v;
        }
        out->launcher = l->launcher;
        if (out->rank >= 0) out->rank_source = var_name(l->var[F_RANK]);
        RT_CHECK(check_pair(l, out));
        RT_REQUIRE(out->rank < 0 || out->world_size < 0 || out->rank < out->world_size, RT_ERR_INVALID,
                   "%s=%d is out of range for %s=%d", var_name(l->var[F_RANK]), out->rank, var_name(l->var[F_WORLD]),
                   out->world_size);
        RT_REQUIRE(out->local_rank < 0 || out->local_world_size < 0 || out->local_rank < out->local_world_size,
                   RT_ERR_INVALID, "%s=%d is out of range for %s=%d", var_name(l->var[F_LOCAL]), out->local_rank,
                   var_name(l->var[F_LOCAL_WORLD]), out->local_world_size);
        return RT_OK;
    }
    return RT_OK;
}
