/* TensorBoard event file of a run (log.tensorboard, docs/train.md "TensorBoard"): rank 0
 * writes the run's scalars (training loss, learning rate, images/s, gradient norm, each
 * stage's time, test and validation loss and accuracy) into RUN_DIR/events.out.tfevents.<time>.<host>.
 *
 * The file is TensorBoard's record format: per record a little-endian uint64 length, the
 * masked CRC-32C of those 8 bytes, the bytes of an Event protobuf (encoded by protobuf-c,
 * tb_event.proto), and the masked CRC-32C of those bytes. Each record is written whole and
 * flushed, so a kill leaves every complete record readable; a resumed run cuts the file back
 * to the checkpoint's step (atomically: a copy fsynced and renamed over it), so every step is
 * in it once. */
#ifndef RT_TRAIN_TENSORBOARD_H
#define RT_TRAIN_TENSORBOARD_H

#include "core/status.h"
#include "train/metrics.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rt_tb rt_tb;

/* The prefix of an event file's name (TensorBoard finds a run's files by it). */
#define RT_TB_PREFIX "events.out.tfevents."

/* Open the event file of run folder `dir`. A fresh run (resume_step < 0) removes the event
 * files a previous run left there (as metrics.jsonl is overwritten) and starts
 * events.out.tfevents.<unix time>.<host> with its version record ("brain.Event:2"). A
 * resumed run cuts every event file in `dir` back to `resume_step` (rt_tb_cut) and appends
 * to the newest; with none (log.tensorboard was off before) it starts a new one. */
rt_status rt_tb_open(const char *dir, int64_t resume_step, rt_tb **out);
void rt_tb_close(rt_tb *t);
/* The file written (for messages and tests). */
const char *rt_tb_path(const rt_tb *t);

/* One Event at `step` holding the scalars tags[i] = values[i]: one record, flushed. */
rt_status rt_tb_scalars(rt_tb *t, int64_t step, size_t n, const char *const *tags, const float *values);
/* A training step: train/loss, train/lr, train/images_per_s, train/grad_norm (when
 * computed), time/<stage>_ms for each stage and time/comm_busy_ms. */
rt_status rt_tb_step(rt_tb *t, const rt_step_record *r);
/* An evaluation: test/loss, test/accuracy, and val/loss, val/accuracy with a validation
 * set. Nothing when the file kept an evaluation of that step through a resume (the
 * resumed run evaluates the checkpoint's step again). */
rt_status rt_tb_eval(rt_tb *t, const rt_eval_record *e);

/* Keep the records of event file `path` up to and with step `step`: the later ones go to
 * the new file `moved` (NULL: dropped), and so does nothing after a record cut short or with
 * a wrong CRC (what a kill mid-write leaves: TensorBoard's reader stops there too). `path`
 * is replaced by an fsynced copy renamed over it. *eval_kept (may be NULL): whether an
 * evaluation's record of step `step` was kept. A missing file is no error. */
rt_status rt_tb_cut(const char *path, int64_t step, const char *moved, bool *eval_kept);

/* CRC-32C (Castagnoli) of n bytes, and TensorBoard's masked form of it:
 * ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t rt_tb_crc32c(const void *p, size_t n);
uint32_t rt_tb_masked_crc(const void *p, size_t n);

#ifdef __cplusplus
}
#endif

#endif
