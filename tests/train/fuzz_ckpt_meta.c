/* libFuzzer target: a checkpoint's metadata (train.safetensors' __metadata__) as
 * rt_ckpt_meta_check reads it on every load (issue 38). The input is key NUL value NUL ...
 * (pairs with a key rt_ckpt_meta_set refuses are dropped; a later pair of the same key
 * replaces the earlier, as JSON with duplicates is refused before this). Any metadata is
 * accepted or refused with RT_ERR_FORMAT, never read past; accepted metadata has every
 * field its readers take in range (step, epoch >= 0, world_size >= 1, the dropout
 * counters, the convolution algorithms), and sealing it (rt_ckpt_meta_seal, as the
 * writer does) keeps it accepted, while a change after sealing is refused. The config
 * field is read by the config parser as `ringtrain eval` and a resume read it. */
#include "train/checkpoint.h"
#include "train/config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static rt_config g_cfg;

static void check_accepted(rt_ckpt_meta *m) {
    int64_t v;
    if (rt_ckpt_meta_get_i64(m, "step", &v) != RT_OK || v < 0) __builtin_trap();
    if (rt_ckpt_meta_get_i64(m, "epoch", &v) != RT_OK || v < 0) __builtin_trap();
    if (rt_ckpt_meta_get_i64(m, "world_size", &v) != RT_OK || v < 1) __builtin_trap();
    const char *algos = rt_ckpt_meta_get(m, "cudnn.conv_algos");
    static rt_conv_algos a;
    if (algos && rt_ckpt_meta_get_conv_algos(m, "cudnn.conv_algos", &a) != RT_OK) __builtin_trap();
    const char *text = rt_ckpt_meta_get(m, "config");
    if (text) { /* accepted or refused, never read past */
        rt_config_default(&g_cfg);
        (void)rt_config_parse_text(&g_cfg, text, strlen(text), "fuzz config");
        rt_error_clear();
    }
    if (rt_ckpt_meta_seal(m) != RT_OK || rt_ckpt_meta_check(m) != RT_OK) __builtin_trap();
    const char *was = rt_ckpt_meta_get(m, "fuzz.extra"); /* a change after the seal */
    if (rt_ckpt_meta_set(m, "fuzz.extra", was && strcmp(was, "1") == 0 ? "2" : "1") != RT_OK) __builtin_trap();
    if (rt_ckpt_meta_check(m) != RT_ERR_FORMAT) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 2);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = text[size + 1] = '\0';
    rt_ckpt_meta m;
    rt_ckpt_meta_init(&m);
    for (size_t at = 0; at < size;) {
        const char *key = text + at;
        at += strlen(key) + 1;
        const char *value = at <= size ? text + at : "";
        at += strlen(value) + 1;
        if (rt_ckpt_meta_set(&m, key, value) != RT_OK) rt_error_clear();
    }
    rt_status st = rt_ckpt_meta_check(&m);
    if (st == RT_OK)
        check_accepted(&m);
    else if (st != RT_ERR_FORMAT && st != RT_ERR_NOMEM)
        __builtin_trap();
    rt_error_clear();
    rt_ckpt_meta_free(&m);
    free(text);
    return 0;
}
