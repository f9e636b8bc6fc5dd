/* libFuzzer target: cudnn.conv_algos (rt_ckpt_meta_get_conv_algos), checkpoint metadata no
 * crc covers. Any text is accepted or refused without reading past it or using a field
 * that was not there; accepted text is canonical: written back with
 * rt_ckpt_meta_set_conv_algos it is the same bytes. */
#include "train/checkpoint.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    rt_ckpt_meta m;
    rt_ckpt_meta_init(&m);
    static rt_conv_algos a;
    if (strlen(text) == size && rt_ckpt_meta_set(&m, "cudnn.conv_algos", text) == RT_OK &&
        rt_ckpt_meta_get_conv_algos(&m, "cudnn.conv_algos", &a) == RT_OK) {
        if (a.n < 0 || a.n > RT_CONV_ALGOS_MAX) __builtin_trap();
        if (rt_ckpt_meta_set_conv_algos(&m, "again", &a) != RT_OK) __builtin_trap();
        if (strcmp(rt_ckpt_meta_get(&m, "again"), text) != 0) __builtin_trap();
    }
    rt_error_clear();
    rt_ckpt_meta_free(&m);
    free(text);
    return 0;
}
