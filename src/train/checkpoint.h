/* Checkpoints: one directory per checkpoint, written atomically, verified on reading.
 *
 *   DIR/ckpt-000001200/model.safetensors   the model's state dict exactly as rt_model_save
 *                                          writes it (torchvision's names, buffers included:
 *                                          loads into torchvision with strict=True)
 *   DIR/ckpt-000001200/train.safetensors   the optimizer state, one F32 tensor per
 *                                          (trainable parameter, state buffer) named
 *                                          "state.<parameter>.<buffer>" with the parameter's
 *                                          shape ("state.layer1.0.conv1.weight.momentum_buffer"),
 *                                          and __metadata__ (see docs/checkpoints.md)
 *
 * Writing (rank 0, after the buffers are synchronised): into DIR/.ckpt-<step>.tmp-<pid>/,
 * every file fsynced, the whole directory read back and verified exactly as a reader
 * would, renamed to DIR/ckpt-<step>/ (an existing one of the same step is replaced
 * atomically), DIR fsynced; then older checkpoints beyond keep_last are removed, and
 * temporary directories left by writers that no longer run. On failure the temporary
 * directory is removed and nothing else is touched.
 *
 * Reading: both files are read with the strict safetensors reader, and the metadata
 * (every field's form, and its own crc32: rt_ckpt_meta_check), the crc32 of each file's
 * tensor data (stored in train.safetensors), the step against
 * the directory name and the optimizer state names and shapes against model.safetensors
 * are checked; errors are RT_ERR_FORMAT naming the file and the field. Names starting with
 * '.' (temporary directories) are never read.
 *
 * Metadata: the trainer fills an rt_ckpt_meta (string key/value pairs, integers in
 * decimal) with what it needs to resume exactly; it must hold "epoch" and "world_size".
 * The keys the module sets itself (RT_CKPT_RESERVED_KEYS) cannot be set by the caller.
 */
#ifndef RT_TRAIN_CHECKPOINT_H
#define RT_TRAIN_CHECKPOINT_H

#include "core/status.h"
#include "model/model.h"
#include "optim/optimizer.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RT_CKPT_FORMAT "ringtrain.checkpoint"
#define RT_CKPT_FORMAT_VERSION 1
#define RT_CKPT_STEP_DIGITS 9 /* ckpt-000001200: names sort like the steps */
#define RT_CKPT_PATH_MAX 1024
#define RT_CKPT_MODEL_FILE "model.safetensors"
#define RT_CKPT_TRAIN_FILE "train.safetensors"
/* The crc32 of the rest of the metadata (rt_ckpt_meta_seal), written last. */
#define RT_CKPT_META_CRC "crc32.metadata"
/* Keys written by the module (the caller's meta may not hold them); "step" is the
 * argument of rt_ckpt_write. */
#define RT_CKPT_RESERVED_KEYS                                                                                          \
    "format", "format_version", "step", "model.arch", "model.dropout_counters", "optim.kind", "optim.steps",           \
        "optim.state", "crc32.model", "crc32.train", RT_CKPT_META_CRC
/* Keys the caller's meta must hold (integers). */
#define RT_CKPT_REQUIRED_KEYS "epoch", "world_size"

/* ---- metadata ---------------------------------------------------------------------- */

typedef struct rt_ckpt_meta {
    int n, cap;
    char **keys, **values;
    char source[RT_CKPT_PATH_MAX + 32]; /* the file it was read from (errors name it); "" if built */
} rt_ckpt_meta;

void rt_ckpt_meta_init(rt_ckpt_meta *m);
void rt_ckpt_meta_free(rt_ckpt_meta *m); /* back to the empty state; safe twice */
/* Set (or replace) a key. Keys are non-empty [A-Za-z0-9._-]; values any UTF-8 text. */
rt_status rt_ckpt_meta_set(rt_ckpt_meta *m, const char *key, const char *value);
rt_status rt_ckpt_meta_set_i64(rt_ckpt_meta *m, const char *key, int64_t value);
rt_status rt_ckpt_meta_set_u64(rt_ckpt_meta *m, const char *key, uint64_t value);
/* NULL when absent */
const char *rt_ckpt_meta_get(const rt_ckpt_meta *m, const char *key);
/* Present and a decimal integer in range (no sign for u64, no spaces, no leading
 * zeros), else RT_ERR_FORMAT naming m->source and the key:
 *   ".../train.safetensors: metadata 'epoch' is missing"
 *   ".../train.safetensors: metadata 'epoch' is \"1x\", expected a decimal integer" */
rt_status rt_ckpt_meta_get_str(const rt_ckpt_meta *m, const char *key, const char **out);
rt_status rt_ckpt_meta_get_i64(const rt_ckpt_meta *m, const char *key, int64_t *out);
rt_status rt_ckpt_meta_get_u64(const rt_ckpt_meta *m, const char *key, uint64_t *out);

/* Every field of a checkpoint (docs/checkpoints.md's tables) in its form, else
 * RT_ERR_FORMAT naming m->source and the field: the module's and the required ones
 * present; the others (epoch_batches, global_batch, seed, run_id: at most 31 letters,
 * digits, '_' or '-', schedule.*, device, cudnn.*) when present: integers in range,
 * names of their tables, cudnn.conv_algos as rt_ckpt_meta_get_conv_algos reads it; other
 * keys are ignored. Then RT_CKPT_META_CRC, when present (checkpoints written before it
 * have none and keep loading), must equal the crc32 of the other keys and values: by key
 * in byte order, each as key '\0' value '\0'. The crc detects corruption; a crafted
 * file can recompute it, so it is no defence against one (docs/security.md: what a
 * checkpoint never sets). rt_ckpt_verify and rt_ckpt_load run this. */
rt_status rt_ckpt_meta_check(const rt_ckpt_meta *m);
/* Set RT_CKPT_META_CRC to the crc32 of the other keys (as rt_ckpt_meta_check computes it). */
rt_status rt_ckpt_meta_seal(rt_ckpt_meta *m);

/* The convolution algorithms of a GPU run (rt_model_ctx_get_conv_algos) as one value:
 * one entry per shape, "64x28x28->64 k3 s1 p1 n32 fp32 fwd=1/3 data=1/3 filter=1/3"
 * (in_c x in_h x in_w -> out_c, kernel, stride, padding, the batch chosen at, precision,
 * then algorithm/math type of each direction, cuDNN's numbers), joined by "; "; "" for
 * none. get: only that exact text, every number checked (present, digits only, in range),
 * nothing after the last (RT_ERR_FORMAT naming the source, the key, the entry and the piece
 * expected where it went wrong), at most RT_CONV_ALGOS_MAX entries. */
rt_status rt_ckpt_meta_set_conv_algos(rt_ckpt_meta *m, const char *key, const rt_conv_algos *a);
rt_status rt_ckpt_meta_get_conv_algos(const rt_ckpt_meta *m, const char *key, rt_conv_algos *out);

/* ---- writing ----------------------------------------------------------------------- */

/* "ckpt-000001200" (at least RT_CKPT_STEP_DIGITS digits) */
void rt_ckpt_dir_name(int64_t step, char *out, size_t n);

/* Write checkpoint `step` of `model` (its state dict and dropout counters) and `opt`
 * (state buffers and step counter; NULL: none, e.g. for an exported model) with the
 * caller's `meta` into DIR/ckpt-<step>/ as described above; DIR is created if missing
 * (not its parents). keep_last > 0: then prune (rt_ckpt_prune) with the meta's
 * "run_id" ("" when absent); 0 keeps all. The path written goes to path_out when
 * non-NULL. Errors name the path and the errno text; after an error DIR holds what it
 * held before. */
rt_status rt_ckpt_write(const char *dir, int64_t step, rt_model *model, const rt_optimizer *opt,
                        const rt_ckpt_meta *meta, int keep_last, char *path_out, size_t path_n);

/* The same into DIR/<name>/ (e.g. "best": checkpoint.keep_best) instead of ckpt-<step>/,
 * the same way (a temporary beside it, verified, renamed into place: an existing one is
 * replaced atomically), and nothing pruned. Resume, pruning and moving aside only ever
 * read ckpt-* names, so such a checkpoint is left alone by them; rt_ckpt_verify and
 * rt_ckpt_load read it as any other (its step is not checked against its name). `name`:
 * no '/', not starting with '.', not ckpt-<digits>. */
rt_status rt_ckpt_write_named(const char *dir, const char *name, int64_t step, rt_model *model,
                              const rt_optimizer *opt, const rt_ckpt_meta *meta, char *path_out, size_t path_n);

/* Keep the newest keep_last valid checkpoints of run `run_id` (metadata "run_id"; a
 * checkpoint without one, older than the key, counts as this run's) and remove this
 * run's older ones, never `keep_step` (counted as valid: just written). Checkpoints that
 * fail rt_ckpt_verify and those of other runs (another branch: docs/checkpoints.md) are
 * neither counted nor removed. keep_last 0: nothing. */
rt_status rt_ckpt_prune(const char *dir, int keep_last, int64_t keep_step, const char *run_id);

/* The number of ckpt-* directories of DIR (0 when it does not exist), valid or not, and
 * the newest one's name ("" for none) when newest is non-NULL. */
rt_status rt_ckpt_count(const char *dir, int *n, char *newest, size_t newest_n);

/* Move every ckpt-* directory of DIR into a new DIR/old-<run_id>/ (the run of the newest
 * readable one; old-<UTC time>/ when none has a run_id; -1, -2, ... when taken), whose
 * path goes to aside_out ("" when there was nothing to move). Nothing is deleted; names
 * not starting with "ckpt-" are never read as checkpoints, so the moved ones are out of
 * resume's and pruning's way. */
rt_status rt_ckpt_move_aside(const char *dir, char *aside_out, size_t aside_n);

/* A resume from checkpoint KEEP (step `step`) continues from there: the checkpoints of DIR
 * it abandons are those of a later step and one of the same step that is not KEEP (another
 * directory). rt_ckpt_count_abandoned: their number and the newest one's name ("" for
 * none). rt_ckpt_abandon: moves them (renames only, *n of them) into a new
 * DIR/abandoned-<run_id of the newest readable one>-from-<step>/ (the UTC time when none
 * has an id; -1, -2, ... when taken), whose path goes to aside_out ("" when none). */
rt_status rt_ckpt_count_abandoned(const char *dir, int64_t step, const char *keep, int *n, char *newest,
                                  size_t newest_n);
rt_status rt_ckpt_abandon(const char *dir, int64_t step, const char *keep, int *n, char *aside_out, size_t aside_n);

/* ---- reading ----------------------------------------------------------------------- */

/* Check a checkpoint directory completely (structure, metadata, both crcs) without a
 * model; its metadata into *meta when non-NULL (rt_ckpt_meta_free it). */
rt_status rt_ckpt_verify(const char *path, rt_ckpt_meta *meta);

/* The step and run_id ("" when it has none) of the checkpoint at `path` from its
 * train.safetensors header alone: no tensor data read, nothing verified (rt_ckpt_verify
 * does that); RT_ERR_FORMAT when the header cannot be read. */
rt_status rt_ckpt_peek(const char *path, int64_t *step, char *run_id, size_t n);

#define RT_CKPT_MAX_SKIPPED 16
typedef struct rt_ckpt_skipped {
    char path[RT_CKPT_PATH_MAX];
    char reason[512]; /* the error message rt_ckpt_verify gave */
} rt_ckpt_skipped;

typedef struct rt_ckpt_found {
    char path[RT_CKPT_PATH_MAX]; /* "" when DIR holds no checkpoint at all (or does not exist) */
    int64_t step;                /* -1 with path "" */
    char run_id[64];             /* its metadata "run_id" ("" when none) */
    int n_skipped;               /* newer checkpoints refused, newest first */
    rt_ckpt_skipped skipped[RT_CKPT_MAX_SKIPPED];
    int n_skipped_total; /* > n_skipped when more were refused than fit */
} rt_ckpt_found;

/* For `resume: auto`: the newest ckpt-<step> of DIR that rt_ckpt_verify accepts; the
 * newer ones it refused are listed in out->skipped with the reason (the caller says
 * so). RT_OK with path "" when there is no ckpt-* at all (start afresh); when there are
 * some but none is valid, RT_ERR_FORMAT listing them (refusing beats silently starting
 * over). */
rt_status rt_ckpt_find(const char *dir, rt_ckpt_found *out);

/* Verify the checkpoint at `path`, then restore `model` (parameters, buffers, dropout
 * counters: call rt_model_set_dropout_seed before, it resets them) and `opt` (state
 * buffers, step counter); either may be NULL. The metadata goes to *meta when non-NULL
 * (rt_ckpt_meta_free it); compare its world_size with yours. Errors name the file and
 * the field; after an error past the verification (a model or optimizer that does not
 * match the checkpoint) they may be partly loaded. */
rt_status rt_ckpt_load(const char *path, rt_model *model, rt_optimizer *opt, rt_ckpt_meta *meta);

#ifdef __cplusplus
}
#endif

#endif
