/* The trainer: one rank of a data-parallel training run, from a resolved config.
 *
 *   datasets -> model (rank 0's weights broadcast, then compared by checksum)
 *   -> per step: loader batch -> forward -> loss -> backward, whose grad-ready callback
 *      hands finished gradient blocks to the reducer (bucketed all-reduce, overlapped)
 *      -> clip -> optimizer with the schedule's lr -> timing record
 *   -> evaluation every train.eval_every epochs and at the end (each test sample once).
 *
 * It knows every area (data, model, dist, optim) and nothing of command lines: src/cli
 * starts the ranks (the launcher) and prints what this returns. */
#ifndef RT_TRAIN_TRAINER_H
#define RT_TRAIN_TRAINER_H

#include "core/status.h"
#include "train/config.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Who this process is. From the environment (torchrun, the ringtrain launcher, Open MPI,
 * Slurm); world 1 with nothing set. */
typedef struct rt_train_rank {
    int rank, world_size, local_rank, local_world_size;
} rt_train_rank;

typedef struct rt_train_result {
    int64_t steps;        /* optimizer steps done */
    int64_t epochs;       /* epochs completed */
    double test_loss;     /* final evaluation */
    double test_accuracy; /* 0..1 */
    int64_t test_samples;
    double val_loss, val_accuracy; /* data.val_split's held-out samples (val_samples 0: none) */
    int64_t val_samples;
    double wall_s;
    char run_dir[RT_CONFIG_PATH_MAX];
    char checkpoint_dir[RT_CONFIG_PATH_MAX];
    int64_t resumed_step; /* -1: a fresh run */
    bool stopped;         /* SIGINT/SIGTERM: stopped after a step, its checkpoint written */
    int stop_signal;
    bool early_stopped;   /* train.early_stop ended it (after an evaluation, its checkpoint written) */
    char stop_reason[256]; /* why, for the summary */
} rt_train_result;

/* Resolve the run directory of a config: log.dir, or runs/<config file name without
 * extension> for "auto". */
void rt_train_run_dir(const rt_config *cfg, char *out, size_t n);

/* The checkpoint directory of a config: checkpoint.dir, or <run directory>/checkpoints
 * for "auto". */
void rt_train_ckpt_dir(const rt_config *cfg, char *out, size_t n);

/* The config fits `world_size` ranks: data.batch_size (the global batch) divides evenly;
 * else RT_ERR_INVALID naming the key. The launcher checks it once before starting ranks. */
rt_status rt_train_check_world(const rt_config *cfg, int64_t world_size);

/* Train as rank `who` (all ranks call it with the same config). Rank 0 writes the
 * resolved config and metrics.jsonl into the run directory and prints the epoch tables
 * and the progress to `out` (NULL: stdout). Resumes from checkpoint.resume; writes
 * checkpoints (checkpoint.every_steps, every_epochs, always one at the end). SIGINT or
 * SIGTERM (handled while it runs) ends the run cleanly after the current step with a
 * checkpoint: RT_OK with res->stopped. */
rt_status rt_train(const rt_config *cfg, const rt_train_rank *who, FILE *out, rt_train_result *res);

/* Evaluate the model of checkpoint directory `checkpoint` ("" or NULL: the newest valid
 * one of cfg's checkpoint.dir) on the test set of cfg's data, split over the ranks (each
 * sample once): res->test_loss, test_accuracy, test_samples, steps (the checkpoint's
 * step), checkpoint_dir (the checkpoint evaluated). Rank 0's choice is every rank's: a
 * rank that cannot load it fails the job with its reason. Any world size. */
rt_status rt_evaluate(const rt_config *cfg, const rt_train_rank *who, const char *checkpoint, rt_train_result *res);

#ifdef __cplusplus
}
#endif

#endif
