/* libFuzzer target: the whole safetensors reader (header length, jansson's JSON parse,
 * the safetensors rules, rt_safetensors_get) must reject or accept any bytes without
 * crashing, leaking or reading out of bounds; accepted files must be self-consistent:
 * names valid UTF-8, non-empty and unique, tensors contiguous from 0. */
#include "core/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rt_safetensors *st = NULL;
    if (rt_safetensors_parse(data, size, "fuzz", &st) == RT_OK) {
        for (int i = 0; i < st->n; i++) {
            const rt_st_tensor *t = &st->tensors[i];
            if (rt_safetensors_find(st, t->name) != t) __builtin_trap();
            if (!t->name[0] || (i > 0 && strcmp(st->tensors[i - 1].name, t->name) >= 0)) __builtin_trap();
            volatile uint8_t sum = 0;
            for (size_t j = t->begin; j < t->end; j++) sum += ((const uint8_t *)t->data)[j - t->begin];
            void *dst = malloc(t->end - t->begin + 1);
            if (dst && rt_safetensors_get(st, t->name, t->dtype, t->ndim, t->shape, dst) != RT_OK) __builtin_trap();
            free(dst);
        }
        size_t covered = 0;
        for (int i = 0; i < st->n; i++) covered += st->tensors[i].end - st->tensors[i].begin;
        if (st->n) { /* the tensors cover the data section exactly */
            const uint8_t *data0 = (const uint8_t *)st->tensors[0].data - st->tensors[0].begin;
            if (covered != st->size - (size_t)(data0 - (const uint8_t *)st->bytes)) __builtin_trap();
        }
        (void)rt_safetensors_meta(st, "format");
        rt_safetensors_free(st);
    }
    rt_error_clear();
    return 0;
}
