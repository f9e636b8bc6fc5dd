/* TEMPORARY (issue 40, until the group's capture API lands in dist.h): no group's device
 * operations can be captured yet. */
#ifndef RT_TRAIN_PG_GRAPH_SHIM_H
#define RT_TRAIN_PG_GRAPH_SHIM_H
#include "dist/dist.h"
#include <stdio.h>
typedef struct rt_pg_graph rt_pg_graph;
static inline bool rt_pg_capturable(const rt_pg *pg, char *why, size_t n) {
    (void)pg;
    snprintf(why, n, "the group's operations cannot be captured yet");
    return false;
}
static inline rt_status rt_pg_capture_begin(rt_pg *pg) { (void)pg; return RT_ERR_UNSUPPORTED; }
static inline rt_status rt_pg_capture_end(rt_pg *pg, rt_pg_graph **out) { (void)pg; *out = NULL; return RT_ERR_UNSUPPORTED; }
static inline rt_status rt_pg_graph_launched(rt_pg *pg, const rt_pg_graph *g, rt_stream *s) { (void)pg, (void)g, (void)s; return RT_ERR_UNSUPPORTED; }
static inline void rt_pg_graph_free(rt_pg_graph *g) { (void)g; }
#endif
