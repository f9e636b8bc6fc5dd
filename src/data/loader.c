/* The prefetching loader: one worker thread, a ring of batch slots; see loader.h.
 *
 * Synchronisation is one mutex and one condition variable. Batch numbers of the current
 * job run from `start` to `nbatches`; `filled` is the first batch not yet published by
 * the worker, `consumed` the first not yet handed out, `released` the first whose slot
 * may be overwritten (the batch handed out last is held until the next call). The
 * worker fills batch b into slot b % depth when b - released < depth. A new epoch or a
 * restore bumps `gen`, waits until the worker is not inside a fill (it reads the
 * sampler), recomputes the order and starts a new job; a fill of an old generation is
 * discarded.
 *
 * Pinned slots (a CUDA device) are read by asynchronous host-to-device copies that run
 * when their stream gets there, possibly after the next rt_loader_next has released the
 * slot. rt_loader_release_after records the slot's event after such a copy; the worker
 * waits for that event before it refills the slot (it queries first: a slot comes round
 * again only `depth` batches later, so the copy is normally long done and nobody waits).
 */
#include "data/loader.h"

#include "data/internal/augment.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct rt_loader {
    rt_loader_config cfg;
    const rt_dataset *ds;
    rt_sampler sampler;
    rt_augment aug;
    bool augment;
    int bs; /* per-rank batch size */
    int depth;
    size_t image_elems; /* C*H*W */
    float lut[RT_DATASET_MAX_C * 256];

    /* one host allocation: per slot images (bs, C, H, W) f32, labels (bs), samples (bs) */
    void *mem;
    bool pinned;
    float **slot_images;
    int64_t **slot_labels;
    int64_t **slot_samples;
    int *slot_size;
    rt_event **slot_read;  /* pinned slots: recorded after the copies that read the slot */
    bool *slot_read_armed; /* slot_read recorded since the slot was last filled */
    bool device_current;   /* the worker made the loader's device current (for the waits) */

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool quit, active, busy, failed;
    uint64_t gen;
    int64_t epoch, start, nbatches, filled, consumed, released;
    rt_error_record err;
};

rt_loader_config rt_loader_config_default(const rt_dataset *ds) {
    rt_loader_config c;
    memset(&c, 0, sizeof c);
    c.dataset = ds;
    c.mode = RT_SAMPLER_DISTRIBUTED;
    c.world_size = 1;
    c.rank = 0;
    c.global_batch = 64;
    c.shuffle = true;
    c.augment = true;
    c.crop_pad = -1;
    c.hflip = -1;
    c.erase_scale[0] = 0.02, c.erase_scale[1] = 0.33; /* torchvision's defaults */
    c.erase_ratio[0] = 0.3, c.erase_ratio[1] = 3.3;
    c.prefetch = 4;
    c.device = rt_device_cpu();
    return c;
}

static int64_t batches_for(const rt_loader *l) {
    int64_t m = rt_sampler_len(&l->sampler);
    return l->cfg.drop_last_batch ? m / l->bs : (m + l->bs - 1) / l->bs;
}

/* Assemble batch b of the current epoch into slot b % depth. Runs on the worker
 * thread without the lock; reads the sampler, which is only changed while !busy. */
static rt_status fill(rt_loader *l, int64_t epoch, int64_t b) {
    int slot = (int)(b % l->depth);
    int64_t m = rt_sampler_len(&l->sampler);
    int64_t first = b * l->bs;
    int size = (int)(m - first < l->bs ? m - first : l->bs);
    const int64_t *idx = rt_sampler_indices(&l->sampler) + first;
    const rt_dataset *ds = l->ds;
    float *img = l->slot_images[slot];
    int64_t *smp = l->slot_samples[slot];
    for (int i = 0; i < size; i++) {
        int64_t s = idx[i];
        if (s < 0 || s >= ds->n)
            RT_FAIL(RT_ERR_INTERNAL, "sample index %lld outside 0..%lld", (long long)s, (long long)ds->n - 1);
        smp[i] = s;
        rt_augment_params p;
        if (l->augment) p = rt_augment_params_at(&l->aug, epoch, s);
        rt_augment_image(ds->images + (size_t)s * l->image_elems, ds->c, ds->h, ds->w, l->lut, l->augment ? &p : NULL,
                         img + (size_t)i * l->image_elems);
        l->slot_labels[slot][i] = ds->labels[s];
    }
    l->slot_size[slot] = size;
    return RT_OK;
}

/* Wait until the copies that read `slot` (rt_loader_release_after) have completed; on
 * the worker thread, without the lock (the slot is released: nobody records on it). */
static rt_status wait_slot_read(rt_loader *l, int slot) {
    bool done = false;
    if (!l->device_current) {
        RT_CHECK(rt_device_set_current(l->cfg.device));
        l->device_current = true;
    }
    RT_CHECK(rt_event_query(l->slot_read[slot], &done));
    if (!done) RT_CHECK(rt_event_sync(l->slot_read[slot]));
    return RT_OK;
}

static void *worker(void *arg) {
    rt_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->quit && !(l->active && l->filled < l->nbatches && l->filled - l->released < l->depth))
            pthread_cond_wait(&l->cv, &l->mu);
        if (l->quit) break;
        int64_t b = l->filled, epoch = l->epoch;
        uint64_t gen = l->gen;
        int slot = (int)(b % l->depth);
        bool armed = l->slot_read_armed && l->slot_read_armed[slot];
        if (armed) l->slot_read_armed[slot] = false;
        l->busy = true;
        pthread_mutex_unlock(&l->mu);
        rt_status st = armed ? wait_slot_read(l, slot) : RT_OK;
        if (st == RT_OK) st = fill(l, epoch, b);
        rt_error_record rec;
        if (st != RT_OK) rt_error_save(&rec);
        pthread_mutex_lock(&l->mu);
        l->busy = false;
        if (gen == l->gen) {
            if (st != RT_OK) {
                l->err = rec;
                l->failed = true;
                l->active = false;
            } else {
                l->filled = b + 1;
            }
        }
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* The configuration a loader can be made from: a dataset, a batch the ranks share, and
 * augmentation settings in range. */
static rt_status check_config(const rt_loader_config *cfg) {
    const rt_dataset *ds = cfg->dataset;
    RT_REQUIRE(ds && ds->images && ds->labels && ds->n > 0, RT_ERR_INVALID, "loader: no dataset (or an empty one)");
    RT_REQUIRE(ds->c >= 1 && ds->c <= RT_DATASET_MAX_C && ds->h > 0 && ds->w > 0, RT_ERR_INVALID,
               "loader: image shape (%d, %d, %d): expected 1..%d channels", ds->c, ds->h, ds->w, RT_DATASET_MAX_C);
    RT_REQUIRE(cfg->world_size >= 1, RT_ERR_INVALID, "loader: world_size %d: expected >= 1", cfg->world_size);
    RT_REQUIRE(cfg->global_batch >= cfg->world_size && cfg->global_batch % cfg->world_size == 0, RT_ERR_INVALID,
               "loader: batch_size %lld is not a positive multiple of world_size %d (each rank gets batch_size / "
               "world_size samples)",
               (long long)cfg->global_batch, cfg->world_size);
    RT_REQUIRE(cfg->global_batch / cfg->world_size <= (1 << 20), RT_ERR_INVALID,
               "loader: per-rank batch %lld: expected at most %d", (long long)(cfg->global_batch / cfg->world_size),
               1 << 20);
    RT_REQUIRE(cfg->prefetch == 0 || (cfg->prefetch >= 2 && cfg->prefetch <= 64), RT_ERR_INVALID,
               "loader: prefetch %d: expected 2..64 batches (0: default 4)", cfg->prefetch);
    RT_REQUIRE(cfg->crop_pad >= -1 && cfg->crop_pad <= ds->h && cfg->crop_pad <= ds->w, RT_ERR_INVALID,
               "loader: crop padding %d: expected -1 (dataset default) or 0..%d", cfg->crop_pad,
               ds->h < ds->w ? ds->h : ds->w);
    RT_REQUIRE(cfg->hflip >= -1 && cfg->hflip <= 1, RT_ERR_INVALID, "loader: hflip %d: expected -1, 0 or 1",
               cfg->hflip);
    RT_REQUIRE(cfg->erase_p >= 0 && cfg->erase_p <= 1, RT_ERR_INVALID,
               "loader: random erasing probability %g: expected 0..1 (data.erasing)", cfg->erase_p);
    if (cfg->erase_p > 0) {
        RT_REQUIRE(cfg->erase_scale[0] >= 0 && cfg->erase_scale[0] <= cfg->erase_scale[1] && cfg->erase_scale[1] <= 1,
                   RT_ERR_INVALID,
                   "loader: random erasing scale [%g, %g]: expected 0 <= lo <= hi <= 1 (data.erasing_scale)",
                   cfg->erase_scale[0], cfg->erase_scale[1]);
        RT_REQUIRE(cfg->erase_ratio[0] > 0 && cfg->erase_ratio[0] <= cfg->erase_ratio[1] &&
                       isfinite(cfg->erase_ratio[1]),
                   RT_ERR_INVALID, "loader: random erasing ratio [%g, %g]: expected 0 < lo <= hi (data.erasing_ratio)",
                   cfg->erase_ratio[0], cfg->erase_ratio[1]);
        RT_REQUIRE(cfg->erase_random || isfinite(cfg->erase_value), RT_ERR_INVALID,
                   "loader: random erasing value %g: expected a finite number (data.erasing_value)",
                   (double)cfg->erase_value);
    }
    return RT_OK;
}

/* The augmentation of the training batches (each setting: the config's, else the
 * dataset's default) and the normalisation table of the dataset's channels. */
static rt_status setup_augment(rt_loader *l) {
    const rt_loader_config *cfg = &l->cfg;
    const rt_dataset *ds = l->ds;
    l->augment = cfg->augment && cfg->mode != RT_SAMPLER_EVAL;
    l->aug.seed = cfg->seed ^ 0x6175676d656e7421ull; /* its own stream, apart from the sampler's */
    l->aug.crop_pad = cfg->crop_pad >= 0 ? cfg->crop_pad : ds->crop_pad;
    l->aug.hflip = cfg->hflip >= 0 ? cfg->hflip == 1 : ds->hflip_suits;
    if (l->aug.crop_pad > ds->h || l->aug.crop_pad > ds->w) l->aug.crop_pad = 0;
    l->aug.erase_p = cfg->erase_p;
    for (int i = 0; i < 2; i++)
        l->aug.erase_scale[i] = cfg->erase_scale[i], l->aug.erase_ratio[i] = cfg->erase_ratio[i];
    l->aug.erase_random = cfg->erase_random;
    l->aug.erase_value = cfg->erase_value;
    l->aug.c = ds->c, l->aug.h = ds->h, l->aug.w = ds->w;
    for (int ch = 0; ch < ds->c; ch++)
        if (!(ds->std[ch] > 0))
            RT_FAIL(RT_ERR_INVALID, "loader: dataset %s has std %g for channel %d: expected > 0", ds->name,
                    (double)ds->std[ch], ch);
    rt_normalize_lut(ds->mean, ds->std, ds->c, l->lut);
    return RT_OK;
}

/* The ring of l->depth batch slots: images, labels and sample indices of each in one host
 * allocation (pinned for a GPU), each part 64-byte aligned, touched now; with pinned
 * memory, an event per slot for the copy that reads it. */
static rt_status alloc_slots(rt_loader *l) {
    size_t img_bytes = ((size_t)l->bs * l->image_elems * sizeof(float) + 63) & ~(size_t)63;
    size_t lab_bytes = ((size_t)l->bs * sizeof(int64_t) + 63) & ~(size_t)63;
    size_t slot_bytes = img_bytes + 2 * lab_bytes;
    size_t total;
    if (__builtin_mul_overflow(slot_bytes, (size_t)l->depth, &total))
        RT_FAIL(RT_ERR_INVALID, "loader: ring of %d batches of %d images overflows", l->depth, l->bs);
    RT_CHECK(rt_host_alloc(total, rt_device_is_cuda(l->cfg.device), &l->mem, &l->pinned));
    l->slot_images = calloc((size_t)l->depth, sizeof *l->slot_images);
    l->slot_labels = calloc((size_t)l->depth, sizeof *l->slot_labels);
    l->slot_samples = calloc((size_t)l->depth, sizeof *l->slot_samples);
    l->slot_size = calloc((size_t)l->depth, sizeof *l->slot_size);
    if (!l->slot_images || !l->slot_labels || !l->slot_samples || !l->slot_size)
        RT_FAIL(RT_ERR_NOMEM, "loader: out of memory for %d slot pointers", l->depth);
    for (int s = 0; s < l->depth; s++) {
        uint8_t *base = (uint8_t *)l->mem + (size_t)s * slot_bytes;
        l->slot_images[s] = (float *)base;
        l->slot_labels[s] = (int64_t *)(base + img_bytes);
        l->slot_samples[s] = (int64_t *)(base + img_bytes + lab_bytes);
    }
    memset(l->mem, 0, total); /* touch the pages now, not in the first batches */
    if (l->pinned) {
        l->slot_read = calloc((size_t)l->depth, sizeof *l->slot_read);
        l->slot_read_armed = calloc((size_t)l->depth, sizeof *l->slot_read_armed);
        if (!l->slot_read || !l->slot_read_armed)
            RT_FAIL(RT_ERR_NOMEM, "loader: out of memory for %d slot events", l->depth);
        for (int s = 0; s < l->depth; s++) RT_CHECK(rt_event_create(l->cfg.device, &l->slot_read[s]));
    }
    return RT_OK;
}

/* The worker thread that fills the slots (l->thread_started once it runs). */
static rt_status start_worker(rt_loader *l) {
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    int e = pthread_create(&l->thread, NULL, worker, l);
    if (e != 0) {
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
        RT_FAIL(RT_ERR_SYS, "loader: pthread_create failed (error %d)", e);
    }
    l->thread_started = true;
    return RT_OK;
}

rt_status rt_loader_create(const rt_loader_config *cfg, rt_loader **out) {
    *out = NULL;
    RT_CHECK(check_config(cfg));
    const rt_dataset *ds = cfg->dataset;
    rt_loader *l = calloc(1, sizeof *l);
    RT_CHECK_ALLOC(l, sizeof *l);
    l->cfg = *cfg;
    l->ds = ds;
    rt_status st = RT_OK;
    rt_sampler_config sc = {cfg->mode, ds->n, cfg->world_size, cfg->rank, cfg->seed, cfg->shuffle, cfg->drop_last};
    if (cfg->mode == RT_SAMPLER_EVAL) l->cfg.drop_last_batch = false;
    RT_CHECK_GOTO(rt_sampler_init(&l->sampler, &sc), st, fail);
    l->bs = (int)(cfg->global_batch / cfg->world_size);
    l->depth = cfg->prefetch ? cfg->prefetch : 4;
    l->image_elems = rt_dataset_image_bytes(ds);
    RT_CHECK_GOTO(setup_augment(l), st, fail);
    RT_CHECK_GOTO(alloc_slots(l), st, fail);
    RT_CHECK_GOTO(start_worker(l), st, fail);
    *out = l;
    return RT_OK;
fail:
    rt_loader_destroy(l);
    return st;
}

void rt_loader_destroy(rt_loader *l) {
    if (!l) return;
    if (l->thread_started) {
        pthread_mutex_lock(&l->mu);
        l->quit = true;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
    }
    /* copies still reading a slot finish before the memory goes */
    for (int s = 0; l->slot_read && s < l->depth; s++) {
        bool done = true;
        if (l->slot_read_armed[s] && rt_event_query(l->slot_read[s], &done) == RT_OK && !done)
            (void)rt_event_sync(l->slot_read[s]);
        rt_error_clear();
        rt_event_destroy(l->slot_read[s]);
    }
    free(l->slot_read);
    free(l->slot_read_armed);
    rt_host_free(l->mem, l->pinned);
    free(l->slot_images);
    free(l->slot_labels);
    free(l->slot_samples);
    free(l->slot_size);
    rt_sampler_free(&l->sampler);
    free(l);
}

/* Stop the current job, recompute the sampler for (epoch, start batch), start again. */
static rt_status restart(rt_loader *l, int64_t epoch, int64_t position) {
    RT_REQUIRE(epoch >= 0, RT_ERR_INVALID, "loader: epoch %lld: expected >= 0", (long long)epoch);
    pthread_mutex_lock(&l->mu);
    l->gen++;
    l->active = false;
    while (l->busy) pthread_cond_wait(&l->cv, &l->mu);
    rt_status st = rt_sampler_set_epoch(&l->sampler, epoch);
    if (st != RT_OK) {
        pthread_mutex_unlock(&l->mu);
        RT_CHECK(st);
    }
    int64_t nb = batches_for(l), m = rt_sampler_len(&l->sampler);
    int64_t end = l->cfg.drop_last_batch ? nb * l->bs : m;
    if (position < 0 || position > m || (position % l->bs != 0 && position != end)) {
        pthread_mutex_unlock(&l->mu);
        RT_FAIL(RT_ERR_INVALID,
                "loader state position %lld: expected a multiple of the per-rank batch size %d in 0..%lld, or %lld "
                "(the end of the epoch)",
                (long long)position, l->bs, (long long)m, (long long)end);
    }
    int64_t b = position == end ? nb : position / l->bs;
    l->epoch = epoch;
    l->nbatches = nb;
    l->start = l->filled = l->consumed = l->released = b;
    l->failed = false;
    l->active = true;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    return RT_OK;
}

rt_status rt_loader_start_epoch(rt_loader *l, int64_t epoch) {
    RT_CHECK(restart(l, epoch, 0));
    return RT_OK;
}

rt_status rt_loader_restore(rt_loader *l, rt_loader_state st) {
    RT_CHECK(restart(l, st.epoch, st.position));
    return RT_OK;
}

rt_status rt_loader_next(rt_loader *l, rt_batch *b) {
    memset(b, 0, sizeof *b);
    pthread_mutex_lock(&l->mu);
    if (!l->active && !l->failed) {
        pthread_mutex_unlock(&l->mu);
        RT_FAIL(RT_ERR_INVALID, "loader: no epoch started (call rt_loader_start_epoch or rt_loader_restore first)");
    }
    l->released = l->consumed; /* the batch handed out last is done with */
    pthread_cond_broadcast(&l->cv);
    b->epoch = l->epoch;
    if (l->consumed >= l->nbatches) {
        b->index = l->nbatches;
        pthread_mutex_unlock(&l->mu);
        return RT_OK;
    }
    while (!l->failed && l->filled <= l->consumed) pthread_cond_wait(&l->cv, &l->mu);
    if (l->failed) {
        rt_error_record rec = l->err;
        pthread_mutex_unlock(&l->mu);
        rt_error_restore(&rec);
        rt_error_trace(__FILE__, __LINE__, "loader worker");
        return rec.status;
    }
    int64_t idx = l->consumed++;
    int slot = (int)(idx % l->depth);
    b->index = idx;
    b->size = l->slot_size[slot];
    b->images = l->slot_images[slot];
    b->labels = l->slot_labels[slot];
    b->samples = l->slot_samples[slot];
    pthread_mutex_unlock(&l->mu);
    return RT_OK;
}

rt_status rt_loader_release_after(rt_loader *l, const rt_batch *b, rt_stream *stream) {
    RT_REQUIRE(b && b->size > 0, RT_ERR_INVALID, "rt_loader_release_after: no batch (size 0: the end of the epoch)");
    int slot = (int)(b->index % l->depth);
    pthread_mutex_lock(&l->mu);
    /* the slot is still held (the batch handed out last): the worker does not touch it */
    bool held = b->images == l->slot_images[slot] && b->index == l->consumed - 1 && l->released <= b->index;
    rt_status st = RT_OK;
    if (!held)
        st = RT_ERROR(RT_ERR_INVALID,
                      "rt_loader_release_after: batch %lld is not the one this loader handed out last (call it before "
                      "the next rt_loader_next)",
                      (long long)b->index);
    else if (l->slot_read) { /* pageable memory: a copy from it has read it when the call returns */
        st = rt_event_record(l->slot_read[slot], stream);
        if (st == RT_OK) l->slot_read_armed[slot] = true;
    }
    pthread_mutex_unlock(&l->mu);
    return st;
}

rt_loader_state rt_loader_get_state(const rt_loader *l) {
    rt_loader *m = (rt_loader *)l;
    pthread_mutex_lock(&m->mu);
    int64_t pos = m->consumed * m->bs;
    int64_t len = rt_sampler_len(&m->sampler);
    if (pos > len) pos = len;
    rt_loader_state st = {m->epoch, pos};
    pthread_mutex_unlock(&m->mu);
    return st;
}

int rt_loader_batch_size(const rt_loader *l) { return l->bs; }
int64_t rt_loader_batches_per_epoch(const rt_loader *l) { return batches_for(l); }
int64_t rt_loader_samples_per_epoch(const rt_loader *l) {
    int64_t m = rt_sampler_len(&l->sampler);
    return l->cfg.drop_last_batch ? (m / l->bs) * l->bs : m;
}
bool rt_loader_pinned(const rt_loader *l) { return l->pinned; }
const rt_sampler *rt_loader_sampler(const rt_loader *l) { return &l->sampler; }
