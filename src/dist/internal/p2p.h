/* Shared by the two halves of the copy benchmark (p2p_bench.c, cuda/p2p_cuda.c). */
#ifndef RT_DIST_INTERNAL_P2P_H
#define RT_DIST_INTERNAL_P2P_H

#include "dist/p2p_bench.h"

/* the report's next matrix, every value NAN */
rt_p2p_matrix *rt_p2p_add_matrix(rt_p2p_report *r, const char *key, const char *title, bool latency, int rows,
                                 int cols);

#endif
