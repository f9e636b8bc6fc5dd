/* The data loader: per-rank batches assembled by a background thread a few batches ahead.
 *
 * Each rank gets batches of global_batch / world_size samples, in the order its sampler
 * gives. A worker thread fills a ring of `prefetch` batch slots (float32 NCHW images,
 * normalised with the dataset's mean/std and, for training, randomly cropped and
 * flipped as a pure function of (seed, epoch, sample index); labels as int64, the type
 * the loss takes, as in PyTorch) in host memory that is page-locked when the device is
 * CUDA, so the trainer's host-to-device copy can be asynchronous. All memory is allocated at creation: the
 * per-batch path only computes.
 *
 *   rt_loader_start_epoch(l, e);                       // or rt_loader_restore(l, state)
 *   for (rt_batch b; rt_loader_next(l, &b) == RT_OK && b.size > 0;) { ... }
 *
 * A batch returned by rt_loader_next stays valid until the next call to rt_loader_next,
 * rt_loader_start_epoch, rt_loader_restore or rt_loader_destroy. A consumer that reads
 * it asynchronously (a host-to-device copy on a CUDA stream) calls
 * rt_loader_release_after once the copy is enqueued: the slot is then refilled only
 * after that copy has completed, whatever the host does meanwhile. The state (epoch,
 * position = samples of the epoch already handed out) restores the exact batch
 * sequence, augmentation included. In eval mode (sampler RT_SAMPLER_EVAL) every sample
 * is seen exactly once across ranks: no padding, the last batch may be short, and
 * ranks may get one sample more or less than each other.
 */
#ifndef RT_DATA_LOADER_H
#define RT_DATA_LOADER_H

#include "core/device.h"
#include "core/status.h"
#include "data/dataset.h"
#include "data/sampler.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rt_loader_config {
    const rt_dataset *dataset; /* borrowed: must outlive the loader */
    rt_sampler_mode mode;      /* distributed (training), partition, eval */
    int world_size, rank;
    int64_t global_batch; /* over all ranks; divisible by world_size */
    uint64_t seed;        /* shuffling and augmentation */
    bool shuffle;
    bool drop_last;       /* sampler: drop the tail instead of padding (torch DistributedSampler) */
    bool drop_last_batch; /* loader: drop a short last batch (torch DataLoader); never in eval mode */
    bool augment;         /* random crop + flip (never in eval mode) */
    int crop_pad;         /* -1: the dataset's default (2 for MNIST-like, 4 for CIFAR-10) */
    int hflip;            /* -1: the dataset's default (off for MNIST digits), 0 off, 1 on */
    /* random erasing (torchvision RandomErasing after Normalize; part of `augment`):
     * probability (0: off), area fraction [lo, hi] in [0, 1], aspect ratio [lo, hi] > 0,
     * value: erase_random (N(0, 1) per pixel) or erase_value */
    double erase_p;
    double erase_scale[2], erase_ratio[2];
    bool erase_random;
    float erase_value;
    int prefetch;     /* batch slots in the ring (>= 2; 0: 4) */
    rt_device device; /* the training device: CUDA -> pinned host memory */
} rt_loader_config;

/* Training defaults for `ds`: distributed, world 1, batch 64, seed 0, shuffle and
 * augmentation on, 4 slots, CPU. */
rt_loader_config rt_loader_config_default(const rt_dataset *ds);

typedef struct rt_batch {
    int64_t epoch;
    int64_t index;          /* batch number within the epoch */
    int size;               /* samples in this batch; 0 at the end of the epoch */
    float *images;          /* (size, C, H, W) */
    int64_t *labels;        /* (size) class indices: the type rt_model_loss takes */
    const int64_t *samples; /* (size) dataset indices */
} rt_batch;

typedef rt_sampler_state rt_loader_state;
typedef struct rt_loader rt_loader;

rt_status rt_loader_create(const rt_loader_config *cfg, rt_loader **out);
void rt_loader_destroy(rt_loader *l);

/* Begin epoch `epoch` from its first batch (the worker starts filling right away). */
rt_status rt_loader_start_epoch(rt_loader *l, int64_t epoch);
/* The next batch of the current epoch (b->size == 0 at its end), waiting if needed. */
rt_status rt_loader_next(rt_loader *l, rt_batch *b);

/* Batch b (the one rt_loader_next returned last) is read by work enqueued on `stream`
 * so far (its host-to-device copy): its slot is not refilled before that work has
 * completed. Records an event on `stream` after the copy; the worker waits for it (on its
 * own thread, and only if it is not complete yet) when the slot comes round again, so
 * the caller never blocks. A no-op for a loader without pinned memory (a CPU device:
 * copies from pageable memory have read it when they return). */
rt_status rt_loader_release_after(rt_loader *l, const rt_batch *b, rt_stream *stream);

/* (epoch, samples handed out so far); restore continues right there. The position
 * must be a multiple of the per-rank batch size or the end of the epoch. */
rt_loader_state rt_loader_get_state(const rt_loader *l);
rt_status rt_loader_restore(rt_loader *l, rt_loader_state st);

int rt_loader_batch_size(const rt_loader *l);            /* per rank */
int64_t rt_loader_batches_per_epoch(const rt_loader *l); /* this rank */
int64_t rt_loader_samples_per_epoch(const rt_loader *l); /* this rank, after drop_last_batch */
bool rt_loader_pinned(const rt_loader *l);
const rt_sampler *rt_loader_sampler(const rt_loader *l);

#ifdef __cplusplus
}
#endif

#endif
