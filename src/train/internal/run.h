/* One rank's run: the state the trainer's rooms share, and what each room offers the
 * others. Private to src/train.
 *
 * The trainer is split by concern, one file each (docs/architecture.md, the Folders table):
 *   trainer.c     the public entry points, the run's setup sequence, its logs and its end
 *   setup.c       datasets, process group, model (and its convolution algorithms), loaders,
 *                 optimizer and schedule, gradient reducer
 *   loop.c        the epoch loop: batches, per-epoch tables, evaluation and checkpoint points
 *   step.c        one training step: input, forward, backward, the step's scalars, update
 *   graphs.c      the step in CUDA graphs (train.cuda_graphs): capture, replay, its timings
 *   timing.c      the per-step timing records, completed from events a step late
 *   evaluate.c    evaluation (EMA weights, eval.tta) and `ringtrain eval` of a checkpoint
 *   save.c        writing a checkpoint during a run
 *   resume.c      choosing the checkpoint to continue from, loading and checking it
 *   monitor.c     what watches the evaluations: the best checkpoint, the early stop;
 *                 the clock of checkpoint.every_minutes
 *   sync.c        host values and state the ranks exchange besides the gradients
 *   stop.c        clean stops: signals, the ranks' agreement, the flight recorder dump
 *   tracing.c     log.trace: the recorder, the clock offset to rank 0
 *   test_hooks.c  test-only fault injection (RINGTRAIN_TEST_*), off unless enabled
 * Functions shared between the files carry the rt_run_ prefix. */
#ifndef RT_TRAIN_INTERNAL_RUN_H
#define RT_TRAIN_INTERNAL_RUN_H

#include "core/device.h"
#include "core/status.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "dist/dist.h"
#include "dist/reducer.h"
#include "model/ctx.h"
#include "model/model.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/tensorboard.h"
#include "train/trainer.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* The events of a step's stages, in order (timing.c). */
enum { EV_START, EV_H2D, EV_FWD, EV_BWD, EV_COMM, EV_END, EV_COUNT };
/* Bytes of the device buffer that host values travel through (sync.c, step.c). */
enum { RUN_SCRATCH_BYTES = 64 };
/* graphs.c: forward graphs kept (one per loader slot and batch size; the loader has
 * data.prefetch slots), and the uncaptured steps before the first capture */
enum { RUN_GRAPHS_MAX = 64, RUN_GRAPH_WARMUP = 2 }; /* 64: data.prefetch's largest value */

/* A step's timing record until its events are ready (a step later on a GPU). */
typedef struct pending {
    rt_event *ev[EV_COUNT];
    /* tracing on a GPU: an event recorded with the step's scalars and the host time right
     * after the host waited for them, which places the step's events on the host clock */
    rt_event *anchor;
    uint64_t anchor_ns;
    rt_step_record rec;
    bool waiting; /* events recorded, record not logged yet */
    /* a step run as graphs (graphs.c): its stages up to the forward graph's end, read from
     * the graph's events right after the host's wait (ev[EV_H2D..EV_BWD] are not recorded;
     * ev[EV_COMM] is the graph's end): h2d, forward, backward, comm, and the part of optim
     * inside the graph (the step's scalars) */
    bool graphed;
    float pre_ms[EV_COUNT - 1];
} pending;

/* A forward graph (graphs.c): its key, the graph, the group's record of its collectives. */
typedef struct run_graph {
    const void *images, *labels; /* the loader's slot the graph copies from */
    int n;                       /* the batch size */
    rt_graph *g;
    rt_pg_graph *pg;
    uint64_t used; /* when last launched (run->graphs.clock) */
} run_graph;

/* One evaluation: the test set's loss, accuracy and samples and, with data.val_split, the
 * validation set's (val_samples 0: none). */
typedef struct run_eval {
    double loss, acc;
    int64_t samples;
    double val_loss, val_acc;
    int64_t val_samples;
} run_eval;

/* What a metric watch (checkpoint.keep_best, train.early_stop) keeps between evaluations
 * and in the checkpoint's metadata (monitor.c): the metric, its best value and step,
 * and for the early stop the evaluations since it last improved. */
typedef struct run_watch {
    int metric; /* rt_monitor; RT_MONITOR_NONE: off */
    bool have;  /* an evaluation was seen */
    double best;
    int64_t best_step;
    int64_t bad; /* evaluations without an improvement since best */
} run_watch;

typedef struct run {
    const rt_config *cfg;
    rt_train_rank who;
    FILE *out;
    char run_dir[RT_CONFIG_PATH_MAX];
    rt_device dev;
    rt_model_ctx *ctx;
    rt_model *model;
    rt_pg *pg;    /* NULL with one rank */
    int64_t step; /* optimizer steps done */

    struct run_data { /* setup.c */
        rt_dataset train_ds, test_ds, val_ds; /* val_ds: data.val_split held out of the training set */
        bool have_train, have_test, have_val;
        uint64_t val_fingerprint; /* FNV-1a of the held-out indices (metrics.jsonl's start line) */
        rt_loader *train_loader, *test_loader, *val_loader;
        int64_t steps_per_epoch;
        int64_t total_steps; /* what this run trains (train.max_steps may end it early) */
        int64_t plan_steps;  /* train.epochs x steps_per_epoch: what auto schedule lengths fit */
    } data;

    struct run_bufs {       /* setup.c: the model's input and what the host reads back */
        float *x_dev;       /* CUDA: the batch on the device */
        int64_t *label_dev; /* CUDA */
        void *scratch_dev;  /* CUDA: host values all-reduced through the device (rt_run_all_reduce_host) */
        /* CUDA: what a step reads back, in pinned memory: the summed loss and stop flag, the
         * gradients' sum of squares; one event, one host wait per step (step.c) */
        struct step_vals {
            float loss_stop[4]; /* and the flight recorder and checkpoint-now flags */
            double sumsq;
            /* the host's stop, flight and checkpoint-now flags, copied to the device (a graph reads them) */
            float flags[3];
        } * vals_host;
        bool vals_pinned;
        rt_event *ev_vals;
        float *out_host; /* evaluation: logits on the host */
        float *tta_x;    /* eval.tta flip: the mirrored batch (host) */
        float *tta_out;  /* eval.tta flip: the mirrored batch's logits (host) */
    } bufs;

    struct run_update {      /* setup.c: the gradients' way to the parameters */
        rt_reducer *reducer; /* NULL with one rank */
        size_t *bounds;      /* the model's gradient blocks, for the reducer */
        rt_optimizer opt;
        bool have_opt;
        rt_optim_range *no_decay;
        rt_schedule sched;
        rt_grad_clip clip;
        bool have_clip;
    } upd;

    struct run_log { /* trainer.c, timing.c */
        rt_metrics *metrics, *rank_metrics;
        rt_tb *tb; /* rank 0's TensorBoard event file (log.tensorboard), else NULL */
        rt_stage_stats *stats;
        rt_progress progress;
        pending pend[2];
        pending *cur;         /* the step under way (step.c) */
        uint64_t stream_last; /* tracing on a GPU: the end of the last stream span */
        uint64_t t0;          /* when training started */
    } log;

    struct run_ckpt { /* resume.c, save.c */
        char dir[RT_CONFIG_PATH_MAX];
        char chosen_path[RT_CKPT_PATH_MAX]; /* rank 0's choice to continue from ("": fresh), found before the model */
        int64_t chosen_step;                /* its step (-1: not known before loading) */
        bool choose_failed;                 /* rank 0 could not choose (choose_err says why) */
        rt_error_record choose_err;
        int64_t resumed_from;               /* the step loaded (-1: a fresh run) */
        int64_t start_epoch, start_batches; /* where a resumed run continues */
        char run_id[32];                    /* 16 hex digits: rank 0's at a fresh start, the checkpoint's on resume */
        double saved_min;                   /* checkpoint.every_minutes: the trainer's clock at the last save */
    } ckpt;

    struct run_monitor { /* monitor.c: checkpoint.keep_best, train.early_stop */
        run_watch best, stop;
        bool write_best;    /* the checkpoint being written also goes to DIR/best/ */
        bool stop_wanted;   /* rank 0: the early stop's patience ran out at this evaluation */
        bool early_stopped; /* the ranks agreed on it: the run ends with a checkpoint */
        char why[256];      /* what the summary says */
    } mon;

    struct run_accum {   /* step.c: train.accumulate */
        int micro;       /* samples per micro-batch on this rank (the whole batch without accumulation) */
        int count;       /* micro-batches of the step under way (1: the step runs as without accumulation) */
        float *grads;    /* the earlier micro-batches' gradients, scaled and summed (the gradient arena's size) */
        float *loss_dev; /* GPU: 2 floats: the rank's loss so far, the micro-batch's share */
        float loss;      /* CPU: the rank's loss so far */
        float share;     /* the micro-batch under way: its samples / the rank's batch (1/K when they are equal) */
        int mode;        /* how the gradients backward writes are folded in (step.c: fold_mode) */
    } accum;

    struct run_graphs { /* graphs.c: train.cuda_graphs */
        bool on;             /* steps of a full batch are captured, after the warmup */
        int warmup_left;     /* uncaptured steps left before the first capture */
        run_graph fwd[RUN_GRAPHS_MAX];
        uint64_t clock;
        rt_graph *update;        /* the optimizer's step */
        rt_event *ev[EV_COUNT];  /* the forward graph's stage events (record nodes) */
        int64_t captures, replays;
    } graphs;

    struct run_stop {   /* stop.c */
        bool requested; /* the ranks agreed to stop (rt_run_agree_stop, the step's scalars) */
        int signal;     /* the signal they agreed on (SIGTERM over SIGINT) */
        bool flight;    /* a rank got SIGUSR1: every rank dumps after this step */
        bool ckpt_now;  /* checkpoint.every_minutes: rank 0's clock says so, every rank saves after this step */
    } stop;
} run;

static inline bool is_root(const run *r) { return r->who.rank == 0; }

/* trainer.c */
void rt_run_free(run *r);
long long rt_run_restart_count(void);

/* setup.c */
rt_status rt_run_load_data(run *r);
rt_status rt_run_setup_group(run *r);
rt_status rt_run_setup_model(run *r);
rt_status rt_run_setup_loaders(run *r, bool train);
rt_status rt_run_setup_optim(run *r);
rt_status rt_run_setup_reducer(run *r);
rt_status rt_run_setup_events(run *r);
rt_status rt_run_setup_accum(run *r); /* step.c: train.accumulate's buffers */
void rt_run_free_accum(run *r);

/* loop.c: the epochs from where the run starts; the last evaluation's results (loss NaN
 * when no evaluation ran) and the epoch reached */
rt_status rt_run_epochs(run *r, int64_t eval_logged, run_eval *ev, int64_t *epoch);
/* an evaluation's "eval" line in metrics.jsonl (unless one of this step is kept there:
 * eval_logged) and with `print` rank 0's epoch line */
rt_status rt_run_log_eval(run *r, const run_eval *e, int64_t epoch, int64_t eval_logged, bool print);

/* step.c; rt_run_step_work: the step's device work up to its scalars (input copy,
 * forward, loss, backward with the reducer, the scalars' all-reduce on a GPU), stage
 * events into ev[EV_H2D..EV_COMM], as record nodes of a graph when `capture` (the loader's
 * slot is then released by the caller, after the launch) */
rt_status rt_run_train_step(run *r, const rt_batch *b, double data_ms, int64_t epoch);
rt_status rt_run_step_work(run *r, const rt_batch *b, rt_event *const *ev, bool capture, rt_reducer_stats *rs);

/* graphs.c. forward: where this step runs as graphs (*graphed), captures the forward
 * graph of its slot if needed and launches it; times: after the host's wait, the stages
 * from the graph's events into p; update: the optimizer's graph (captured at its first
 * use), its scalars for learning rate lr */
rt_status rt_run_setup_graphs(run *r);
void rt_run_free_graphs(run *r);
rt_status rt_run_graph_forward(run *r, const rt_batch *b, pending *p, bool *graphed);
rt_status rt_run_graph_times(run *r, pending *p);
rt_status rt_run_graph_update(run *r, double lr);

/* timing.c */
rt_status rt_run_complete(run *r, pending *p, bool force);
rt_status rt_run_complete_in_order(run *r, bool force);

/* evaluate.c */
bool rt_run_ema_active(const run *r);
rt_status rt_run_ema_swap(run *r);
rt_status rt_run_evaluate(run *r, run_eval *e);

/* monitor.c: checkpoint.keep_best and train.early_stop. setup: the watches from the
 * config (after the data: keep_best auto needs the split; a val_* metric without one is
 * an error); observe: an evaluation (the same numbers on every rank) updates them, sets
 * mon.write_best when keep_best improved and, on rank 0, mon.stop_wanted when the early
 * stop's patience ran out; meta/restore: their state in a checkpoint's metadata and back
 * (a resume of an early-stopped run refuses unless the config lets it continue); minutes:
 * the trainer's clock for checkpoint.every_minutes (rank 0's only is read). */
rt_status rt_run_monitor_setup(run *r);
void rt_run_monitor_observe(run *r, const run_eval *e);
rt_status rt_run_monitor_meta(const run *r, rt_ckpt_meta *m);
rt_status rt_run_monitor_restore(run *r, const rt_ckpt_meta *m, const char *path);
double rt_run_minutes(const run *r);
bool rt_run_minutes_due(const run *r);

/* save.c */
rt_status rt_run_save_checkpoint(run *r, int64_t epoch, int64_t epoch_batches, const char *why);
rt_status rt_run_save_model(run *r);

/* resume.c */
rt_status rt_run_find_resume(run *r);
rt_status rt_run_share_resume(run *r);
rt_status rt_run_agree_loaded(run *r, rt_status st, const char *path);
rt_status rt_run_resume(run *r);
rt_status rt_run_truncate_metrics(const char *path, int64_t step, int64_t *eval_at);

/* sync.c */
rt_status rt_run_all_reduce_host(run *r, void *v, size_t n, rt_dtype t, rt_reduce_op op);
rt_status rt_run_all_reduce_f64(run *r, double *v, size_t n, rt_reduce_op op);
rt_status rt_run_broadcast_bytes(run *r, void *p, size_t bytes);
rt_status rt_run_check_in_sync(run *r, bool buffers, const char *when);
rt_status rt_run_agree(run *r, rt_status st, const char *what);
rt_status rt_run_broadcast_state(run *r, bool params);

/* stop.c */
void rt_run_signals_install(void);
void rt_run_signals_restore_stop(void);   /* SIGINT, SIGTERM */
void rt_run_signals_restore_flight(void); /* SIGUSR1 */
int rt_run_stop_signal(void);             /* SIGINT or SIGTERM received (0: none) */
bool rt_run_flight_signal(void);          /* SIGUSR1 received and not dumped yet */
void rt_run_flight_clear(void);
void rt_run_flight_dump(run *r, const char *why);
rt_status rt_run_agree_stop(run *r);
rt_status rt_run_agree_watches(run *r); /* after the run's last evaluation: no signals */

/* tracing.c */
rt_status rt_run_setup_trace(run *r);
rt_status rt_run_traced_barrier(run *r);

/* test_hooks.c: each does nothing unless RINGTRAIN_TEST_HOOKS=1 (docs/testing.md) */
void rt_run_test_hooks_check(const run *r);
void rt_run_test_signal_at(run *r, const char *where, int64_t step);
void rt_run_test_nan_batch(const run *r, const rt_batch *b);
void rt_run_test_bucket_fault(run *r);
rt_status rt_run_test_init_seed_rank(run *r);
rt_status rt_run_test_perturb_at(run *r);
rt_status rt_run_test_bn_perturb(run *r);
void rt_run_test_kill_after_checkpoint(run *r);
void rt_run_test_kill_rank_at(const run *r);
void rt_run_test_ckpt_stall(const run *r);
void rt_run_rank_view(const run *r, const char *path, char *out, size_t n);
bool rt_run_test_clock(const run *r, double *minutes);

#endif
