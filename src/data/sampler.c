/* Distributed, partition and evaluation samplers; see sampler.h. */
#include "data/sampler.h"

#include "core/device.h"
#include "core/names.h"
#include "core/rng.h"

#include <string.h>

/* subsequences of the Philox streams used here (seeds are the user's) */
#define SUBSEQ_EPOCH_PERM 0x53414d50ull      /* distributed: key seed + epoch */
#define SUBSEQ_PARTITION 0x50415254ull       /* partition: key seed */
#define SUBSEQ_PARTITION_ORDER 0x4f524452ull /* partition: key seed + epoch */

static const char *const k_mode_names[RT_SAMPLER_MODE_COUNT_] = {"distributed", "partition", "eval"};

const rt_names rt_sampler_mode_names = {"sampler mode", RT_SAMPLER_MODE_COUNT_, k_mode_names, NULL, NULL};
const rt_names rt_sampler_train_mode_names = {"sampler mode", RT_SAMPLER_EVAL, k_mode_names, NULL, NULL};

rt_status rt_sampler_mode_parse(const char *text, rt_sampler_mode *out) {
    int k = 0;
    rt_status st = rt_names_parse(&rt_sampler_mode_names, text, &k); /* a complete message: no trace line */
    if (st == RT_OK) *out = (rt_sampler_mode)k;
    return st;
}

const char *rt_sampler_mode_name(rt_sampler_mode mode) {
    return (unsigned)mode < RT_SAMPLER_MODE_COUNT_ ? k_mode_names[mode] : "?";
}

rt_sampler_config rt_sampler_config_default(int64_t n) {
    rt_sampler_config c = {RT_SAMPLER_DISTRIBUTED, n, 1, 0, 0, true, false};
    return c;
}

/* Fisher-Yates over a[0..n) with an unbiased Philox draw per step. */
static void shuffle(int64_t *a, int64_t n, uint64_t key, uint64_t subseq) {
    rt_rng r;
    rt_rng_init(&r, key, subseq);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)rt_rng_below(&r, (uint64_t)i + 1);
        int64_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

static void iota(int64_t *a, int64_t n) {
    for (int64_t i = 0; i < n; i++) a[i] = i;
}

rt_status rt_sampler_init(rt_sampler *s, const rt_sampler_config *cfg) {
    memset(s, 0, sizeof *s);
    RT_REQUIRE(cfg->n > 0, RT_ERR_INVALID, "sampler over %lld samples: expected a non-empty dataset",
               (long long)cfg->n);
    RT_REQUIRE(cfg->world_size >= 1, RT_ERR_INVALID, "world_size %d: expected >= 1", cfg->world_size);
    RT_REQUIRE(cfg->rank >= 0 && cfg->rank < cfg->world_size, RT_ERR_INVALID, "rank %d: expected 0..%d", cfg->rank,
               cfg->world_size - 1);
    char names[64];
    RT_REQUIRE((unsigned)cfg->mode < RT_SAMPLER_MODE_COUNT_, RT_ERR_INVALID, "sampler mode %d: expected %s",
               (int)cfg->mode, rt_names_list(&rt_sampler_mode_names, names, sizeof names));
    s->cfg = *cfg;
    int64_t n = cfg->n, w = cfg->world_size, r = cfg->rank;
    switch (cfg->mode) {
    case RT_SAMPLER_DISTRIBUTED:
        /* torch: drop_last and N % W != 0 -> ceil((N - W) / W) (= floor(N / W) for N >= W, 0 below), else ceil(N / W)
         */
        if (cfg->drop_last && n % w != 0)
            s->num_samples = n >= w ? n / w : 0;
        else
            s->num_samples = (n + w - 1) / w;
        s->total_size = s->num_samples * w;
        break;
    case RT_SAMPLER_PARTITION:
        s->num_samples = n / w;
        s->total_size = s->num_samples * w;
        break;
    case RT_SAMPLER_EVAL:
        s->num_samples = r < n ? (n - r + w - 1) / w : 0;
        s->total_size = n;
        break;
    case RT_SAMPLER_MODE_COUNT_: /* rejected above */
        break;
    }
    void *p = NULL;
    RT_CHECK(rt_malloc(rt_device_cpu(), (size_t)n * sizeof(int64_t), &p));
    s->perm_ = p;
    rt_status st = rt_malloc(rt_device_cpu(), (size_t)(s->num_samples > 0 ? s->num_samples : 1) * sizeof(int64_t), &p);
    if (st != RT_OK) {
        rt_sampler_free(s);
        RT_CHECK(st);
    }
    s->indices = p;
    if (cfg->mode == RT_SAMPLER_PARTITION) {
        /* the partition is fixed for the run: drawn once from the seed */
        iota(s->perm_, n);
        if (cfg->shuffle) shuffle(s->perm_, n, cfg->seed, SUBSEQ_PARTITION);
    }
    return rt_sampler_set_epoch(s, 0);
}

void rt_sampler_free(rt_sampler *s) {
    if (!s) return;
    rt_free(rt_device_cpu(), s->perm_);
    rt_free(rt_device_cpu(), s->indices);
    memset(s, 0, sizeof *s);
}

rt_status rt_sampler_set_epoch(rt_sampler *s, int64_t epoch) {
    RT_REQUIRE(s->perm_ != NULL, RT_ERR_INVALID, "sampler not initialised");
    RT_REQUIRE(epoch >= 0, RT_ERR_INVALID, "epoch %lld: expected >= 0", (long long)epoch);
    const rt_sampler_config *c = &s->cfg;
    int64_t n = c->n, w = c->world_size, r = c->rank, m = s->num_samples;
    switch (c->mode) {
    case RT_SAMPLER_DISTRIBUTED:
        iota(s->perm_, n);
        if (c->shuffle) shuffle(s->perm_, n, c->seed + (uint64_t)epoch, SUBSEQ_EPOCH_PERM);
        /* padding wraps around to the start of the permutation (repeatedly if W > N) */
        for (int64_t k = 0; k < m; k++) s->indices[k] = s->perm_[(r + k * w) % n];
        break;
    case RT_SAMPLER_PARTITION:
        memcpy(s->indices, s->perm_ + r * m, (size_t)m * sizeof(int64_t));
        if (c->shuffle) shuffle(s->indices, m, c->seed + (uint64_t)epoch, SUBSEQ_PARTITION_ORDER + (uint64_t)r);
        break;
    case RT_SAMPLER_EVAL:
        for (int64_t k = 0; k < m; k++) s->indices[k] = r + k * w;
        break;
    case RT_SAMPLER_MODE_COUNT_: /* rejected by rt_sampler_init */
        break;
    }
    s->epoch = epoch;
    s->position = 0;
    return RT_OK;
}

bool rt_sampler_next(rt_sampler *s, int64_t *index) {
    if (s->position >= s->num_samples) return false;
    *index = s->indices[s->position++];
    return true;
}

rt_sampler_state rt_sampler_get_state(const rt_sampler *s) {
    rt_sampler_state st = {s->epoch, s->position};
    return st;
}

rt_status rt_sampler_set_state(rt_sampler *s, rt_sampler_state st) {
    RT_REQUIRE(st.position >= 0 && st.position <= s->num_samples, RT_ERR_INVALID,
               "sampler state position %lld: expected 0..%lld (samples per epoch on this rank)", (long long)st.position,
               (long long)s->num_samples);
    RT_CHECK(rt_sampler_set_epoch(s, st.epoch));
    s->position = st.position;
    return RT_OK;
}

bool rt_sampler_resumable(const rt_sampler_config *cfg, int old_world, int64_t taken) {
    if (cfg->mode != RT_SAMPLER_PARTITION || old_world == cfg->world_size || taken <= 0) return true;
    int64_t old_parts = old_world > 0 ? cfg->n / old_world * old_world : 0; /* the old ranks' parts together */
    return taken >= old_parts;
}
