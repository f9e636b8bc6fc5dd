/* Which samples each rank sees: PyTorch's DistributedSampler, the tutorial's fixed
 * partition, and an evaluation split that covers every sample exactly once.
 *
 * distributed  torch.utils.data.distributed.DistributedSampler: each epoch a permutation
 *              of 0..N-1 drawn from seed + epoch (or 0..N-1 in order without shuffle);
 *              drop_last false pads it to ceil(N/W)*W by wrapping around to its start,
 *              true cuts it to floor(N/W)*W; rank r takes positions r, r+W, r+2W, ...
 *              With shuffle off the indices equal torch's exactly; with shuffle on the
 *              permutation comes from our Philox RNG (not bit-identical to torch).
 * partition    the "Writing distributed applications" tutorial's DataPartitioner: one
 *              permutation drawn from the seed alone (identity without shuffle), cut
 *              into W equal parts of floor(N/W), rank r keeps part r for every epoch;
 *              with shuffle the order inside the part is redrawn each epoch (as the
 *              tutorial's DataLoader(shuffle=True) does).
 * eval         no shuffle, no padding: rank r takes r, r+W, ... < N, so the ranks cover
 *              every sample exactly once (counts may differ by one between ranks).
 *
 * The state to checkpoint is (epoch, position): set_state recomputes the epoch's order
 * and continues at `position`, so a resumed run sees the same indices.
 */
#ifndef RT_DATA_SAMPLER_H
#define RT_DATA_SAMPLER_H

#include "core/names.h"
#include "core/status.h"
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rt_sampler_mode {
    RT_SAMPLER_DISTRIBUTED = 0,
    RT_SAMPLER_PARTITION,
    RT_SAMPLER_EVAL, /* last: the modes before it are the training modes */
    RT_SAMPLER_MODE_COUNT_
} rt_sampler_mode;

/* The modes' names (core/names.h): "distributed" | "partition" | "eval"; and the modes a
 * training loader takes (data.sampler): the same table without eval. */
extern const rt_names rt_sampler_mode_names, rt_sampler_train_mode_names;

/* rt_names_parse of rt_sampler_mode_names. */
rt_status rt_sampler_mode_parse(const char *text, rt_sampler_mode *out);
const char *rt_sampler_mode_name(rt_sampler_mode mode);

typedef struct rt_sampler_config {
    rt_sampler_mode mode;
    int64_t n;      /* dataset size */
    int world_size; /* number of ranks (>= 1) */
    int rank;       /* 0..world_size-1 */
    uint64_t seed;
    bool shuffle;
    bool drop_last; /* distributed mode only */
} rt_sampler_config;

/* distributed, world 1, rank 0, seed 0, shuffle on, drop_last off (torch's defaults). */
rt_sampler_config rt_sampler_config_default(int64_t n);

typedef struct rt_sampler_state {
    int64_t epoch;
    int64_t position; /* indices of this epoch already taken by this rank */
} rt_sampler_state;

typedef struct rt_sampler {
    rt_sampler_config cfg;
    int64_t epoch;
    int64_t position;
    int64_t num_samples; /* this rank's indices per epoch (torch: len(sampler)) */
    int64_t total_size;  /* distributed: num_samples * world_size */
    int64_t *indices;    /* (num_samples) this rank's indices for the epoch */
    int64_t *perm_;      /* (n) scratch */
} rt_sampler;

/* Validate the config, allocate, and compute epoch 0. */
rt_status rt_sampler_init(rt_sampler *s, const rt_sampler_config *cfg);
void rt_sampler_free(rt_sampler *s);

/* Compute the order of `epoch` (>= 0) and rewind to its start. */
rt_status rt_sampler_set_epoch(rt_sampler *s, int64_t epoch);

static inline int64_t rt_sampler_len(const rt_sampler *s) { return s->num_samples; }
static inline const int64_t *rt_sampler_indices(const rt_sampler *s) { return s->indices; }

/* The next index of this epoch; false at the end of the epoch. */
bool rt_sampler_next(rt_sampler *s, int64_t *index);

/* A run took the first `taken` samples of an epoch on `old_world` ranks together (every
 * rank the same number: batches * global batch) and continues that epoch on
 * cfg->world_size ranks, each at position taken / cfg->world_size. Whether the two parts
 * together take the epoch's samples each once (as the new world's epoch would):
 *   distributed, eval: yes. The epoch's order does not depend on the world size and rank
 *       r takes its positions r, r+W, r+2W, ...: the old ranks took positions 0..taken-1
 *       of it, the new ones take the rest (the padding at its end is the new world's).
 *   partition: only with the same world size, at the epoch's start (taken 0) or once the
 *       old ranks took their whole parts: each rank's part, and its order, depend on the
 *       world size, so some samples would be taken twice and others never. */
bool rt_sampler_resumable(const rt_sampler_config *cfg, int old_world, int64_t taken);

rt_sampler_state rt_sampler_get_state(const rt_sampler *s);
/* Continue at (epoch, position); position must be in 0..len. */
rt_status rt_sampler_set_state(rt_sampler *s, rt_sampler_state st);

#ifdef __cplusplus
}
#endif

#endif
