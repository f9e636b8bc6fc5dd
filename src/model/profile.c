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

rt_status rt_layer_profile_use_events(rt_layer_profile *p, rt_device d, int max_calls) {
    RT_REQUIRE(max_calls > 0 && !p->ev, RT_ERR_INVALID, "layer profile events: %d calls (expected > 0, once)",
               max_calls);
    p->ev = calloc(2 * (size_t)max_calls, sizeof *p->ev);
    p->pending = calloc((size_t)max_calls, sizeof *p->pending);
    if (!p->ev || !p->pending) {
        free(p->ev);
        free(p->pending);
        p->ev = NULL;
        p->pending = NULL;
        RT_FAIL(RT_ERR_NOMEM, "layer profile events: %d calls", max_calls);
    }
    p->pairs_cap = max_calls;
    for (int i = 0; i < 2 * max_calls; i++) RT_CHECK(rt_event_create(d, &p->ev[i]));
    return RT_OK;
}

rt_status rt_layer_profile_collect(rt_layer_profile *p) {
    for (int k = 0; k < p->npairs; k++) {
        float ms = 0;
        bool ready = false;
        RT_CHECK(rt_event_elapsed_ms(p->ev[2 * k], p->ev[2 * k + 1], &ms, &ready));
        RT_REQUIRE(ready, RT_ERR_INVALID, "layer profile: collected before the stream was synchronised");
        p->rows[p->pending[k]].seconds += ms * 1e-3;
    }
    p->npairs = 0;
    return RT_OK;
}

void rt_layer_profile_free(rt_layer_profile *p) {
    if (!p) return;
    for (int i = 0; p->ev && i < 2 * p->pairs_cap; i++) rt_event_destroy(p->ev[i]);
    free(p->ev);
    free(p->pending);
    free(p->rows);
    memset(p, 0, sizeof *p);
}

void rt_layer_profile_reset(rt_layer_profile *p) {
    if (p->rows) memset(p->rows, 0, (size_t)p->cap * sizeof *p->rows);
    p->n = 0;
    p->overflow = false;
    p->depth = 0;
    p->npairs = 0;
}

const char *rt_prof_pass_name(rt_prof_pass pass) { return pass == RT_PROF_FORWARD ? "forward" : "backward"; }
