/* Per-layer profile rows (profile.h); layers.c does the timing. */
#include "model/profile.h"

#include <stdlib.h>
#include <string.h>

rt_status rt_layer_profile_init(rt_layer_profile *p, int cap) {
    memset(p, 0, sizeof *p);
    RT_REQUIRE(cap > 0, RT_ERR_INVALID, "layer profile of %d rows (expected > 0)", cap);
    p->rows = calloc((size_t)cap, sizeof *p->rows);
    RT_CHECK_ALLOC(p->rows, (size_t)cap * sizeof *p->rows);
    p->cap = cap;
    return RT_OK;
}

void rt_layer_profile_free(rt_layer_profile *p) {
    if (!p) return;
    free(p->rows);
    memset(p, 0, sizeof *p);
}

void rt_layer_profile_reset(rt_layer_profile *p) {
    if (p->rows) memset(p->rows, 0, (size_t)p->cap * sizeof *p->rows);
    p->n = 0;
    p->overflow = false;
    p->depth = 0;
}

const char *rt_prof_pass_name(rt_prof_pass pass) { return pass == RT_PROF_FORWARD ? "forward" : "backward"; }
