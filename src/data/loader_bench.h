/* The loader's throughput, measured: the timed loop behind `ringtrain bench loader`.
 *
 * A synthetic dataset of deterministic pseudo-random pixels (labels i % 10) goes through
 * a loader of world size 1 with augmentation (random crop with the padding given, or 2
 * for one channel and 4 for three; horizontal flips) and normalisation; after one
 * warm-up batch the consumer only takes batches, across epochs, until `images` images
 * were handed out. The result is the rate the loader's one worker thread sustains.
 */
#ifndef RT_DATA_LOADER_BENCH_H
#define RT_DATA_LOADER_BENCH_H

#include "core/status.h"
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rt_loader_bench_config {
    int c, h, w;          /* image shape */
    int64_t dataset_size; /* images in the synthetic dataset */
    int batch;            /* global batch (world size 1) */
    int prefetch;         /* ring slots */
    int64_t images;       /* images to time (at least) */
} rt_loader_bench_config;

typedef struct rt_loader_bench_result {
    int64_t images; /* images handed out in the timed part (>= config.images) */
    double seconds; /* how long that took */
} rt_loader_bench_result;

rt_status rt_loader_bench(const rt_loader_bench_config *cfg, rt_loader_bench_result *out);

#ifdef __cplusplus
}
#endif

#endif
