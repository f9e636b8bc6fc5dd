/* Per-layer wall-clock profile of the model's forward and backward passes.
 *
 * With a profile attached to a context (rt_model_ctx_set_profile), every forward and
 * backward call of layers.h (conv2d, batch norm with its fused residual add and ReLU,
 * pooling, linear, dropout, the losses, the elementwise layers and copies) adds its
 * time and one call to a row: one row per layer, pass, printed shape and FLOPs (so a
 * layer called with and without its input gradient has two; an elementwise layer, which
 * has no identity, one per size). A layer call that runs others (the unfused batch norm
 * + add + ReLU) counts once, as the outer call. On a GPU context the stream is synchronized before and after each call,
 * so the times are the layers' own but the step loses its overlap of host and device,
 * unless the profile has events (rt_layer_profile_use_events): then each call records
 * an event before and after itself on the stream and nothing waits; the caller
 * synchronises the stream once per step and rt_layer_profile_collect adds the pairs'
 * elapsed times to the rows. A row is then the GPU time from the call's first enqueued
 * work to its last (its launches' host cost included only where the GPU waited for it).
 *
 * It is what `ringtrain bench model --layers` prints (docs/model.md): unlike oneDNN's
 * verbose mode it also times our own loops (batch norm, pooling, the dense and im2col
 * convolution paths) and it adds no logging inside the timed calls.
 */
#ifndef RT_MODEL_PROFILE_H
#define RT_MODEL_PROFILE_H

#include "core/device.h"
#include "core/status.h"
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rt_prof_pass { RT_PROF_FORWARD = 0, RT_PROF_BACKWARD = 1 } rt_prof_pass;

typedef struct rt_layer_prof_row {
    const void *layer; /* the layer (its struct), or NULL for an elementwise layer */
    const char *kind;  /* static string: "conv2d", "batchnorm2d", ... (compared by content) */
    rt_prof_pass pass;
    size_t count;   /* elementwise layers: elements per call (with kind, their key) */
    char shape[64]; /* e.g. "64->128 k3 s2 p1 on 14x14, n 64" */
    double flops;   /* per call (multiply-add = 2), 0 where not counted */
    double seconds; /* summed over the calls */
    long calls;
    /* the emulated GPUs' cost ledger (core/cost_ledger.h), summed over the calls: what the
     * calls enqueued (read at each outermost call's start and end, no synchronisation);
     * `ledger` false where there is none (CPU, a real GPU, the ledger off) */
    bool ledger;
    double ledger_bytes, ledger_flops, ledger_modelled_s;
    long ledger_launches, ledger_library_calls, ledger_copies, ledger_host_syncs;
    size_t ledger_first_op, ledger_nops; /* the first call's operations (indices since the ledger's reset) */
} rt_layer_prof_row;

typedef struct rt_layer_profile {
    rt_layer_prof_row *rows;
    int n, cap;
    bool overflow; /* a call found no free row (cap too small); its time is lost */
    int depth;     /* calls in progress (only the outermost is timed) */
    /* event pairs (GPU, rt_layer_profile_use_events): pair k is ev[2k], ev[2k+1]; pending[k]
     * the row it belongs to, until rt_layer_profile_collect */
    rt_event **ev;
    int *pending;
    int npairs, pairs_cap;
} rt_layer_profile;

/* Room for `cap` rows (ResNet34: about 200); RT_ERR_NOMEM if that fails. */
rt_status rt_layer_profile_init(rt_layer_profile *p, int cap);
void rt_layer_profile_free(rt_layer_profile *p);
/* Time GPU calls with event pairs on device d instead of stream synchronisations: room
 * for `max_calls` timed calls between two rt_layer_profile_collect (a call beyond that
 * is not timed and sets overflow). RT_ERR_NOMEM, or the runtime's error creating events. */
rt_status rt_layer_profile_use_events(rt_layer_profile *p, rt_device d, int max_calls);
/* After the stream has been synchronised: add every pending pair's elapsed time to its
 * row and free the pairs for the next calls (no-op without events). */
rt_status rt_layer_profile_collect(rt_layer_profile *p);
/* forget every row (e.g. after warm-up steps) */
void rt_layer_profile_reset(rt_layer_profile *p);

/* the pass's name: "forward" | "backward" */
const char *rt_prof_pass_name(rt_prof_pass pass);

#ifdef __cplusplus
}
#endif

#endif
