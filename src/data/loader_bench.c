/* The loader benchmark's timed loop; see loader_bench.h. */
#include "data/loader_bench.h"

#include "core/timer.h"
#include "data/dataset.h"
#include "data/loader.h"

#include <stdio.h>
#include <string.h>

rt_status rt_loader_bench(const rt_loader_bench_config *cfg, rt_loader_bench_result *out) {
    RT_REQUIRE(cfg != NULL && out != NULL, RT_ERR_INVALID, "loader bench: NULL argument");
    RT_REQUIRE(cfg->images > 0, RT_ERR_INVALID, "loader bench: images %lld: expected > 0", (long long)cfg->images);
    memset(out, 0, sizeof *out);
    rt_dataset ds;
    char name[32];
    snprintf(name, sizeof name, "%dx%dx%d", cfg->c, cfg->h, cfg->w);
    RT_CHECK(rt_dataset_alloc(&ds, name, cfg->dataset_size, cfg->c, cfg->h, cfg->w, 10));
    /* deterministic pseudo-random pixels and labels */
    uint8_t *img = (uint8_t *)ds.images, *lab = (uint8_t *)ds.labels;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    size_t bytes = (size_t)cfg->dataset_size * rt_dataset_image_bytes(&ds);
    for (size_t i = 0; i < bytes; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        img[i] = (uint8_t)x;
    }
    for (int64_t i = 0; i < cfg->dataset_size; i++) lab[i] = (uint8_t)(i % 10);
    ds.crop_pad = cfg->c == 3 ? 4 : 2;
    ds.hflip_suits = true;
    rt_loader_config lc = rt_loader_config_default(&ds);
    lc.global_batch = cfg->batch;
    lc.prefetch = cfg->prefetch;
    lc.augment = true;
    rt_loader *l = NULL;
    rt_status st = rt_loader_create(&lc, &l);
    if (st != RT_OK) {
        rt_dataset_free(&ds);
        RT_CHECK(st);
    }
    /* warm-up: one batch */
    rt_batch b;
    RT_CHECK_GOTO(rt_loader_start_epoch(l, 0), st, done);
    RT_CHECK_GOTO(rt_loader_next(l, &b), st, done);
    int64_t got = 0, epoch = 0;
    volatile float sink = 0; /* the consumer reads each batch */
    rt_timer t;
    rt_timer_start(&t);
    while (got < cfg->images) {
        RT_CHECK_GOTO(rt_loader_next(l, &b), st, done);
        if (b.size == 0) {
            RT_CHECK_GOTO(rt_loader_start_epoch(l, ++epoch), st, done);
            continue;
        }
        sink += b.images[0];
        got += b.size;
    }
    out->seconds = rt_timer_elapsed_s(&t);
    out->images = got;
    (void)sink;
done:
    rt_loader_destroy(l);
    rt_dataset_free(&ds);
    return st;
}
