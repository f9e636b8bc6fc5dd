/* libFuzzer target: the safetensors parser must reject or accept any bytes without
 * crashing, leaking or reading out of bounds; accepted files must be self-consistent. */
#include "core/safetensors.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rt_safetensors *st = NULL;
    if (rt_safetensors_parse(data, size, "fuzz", &st) == RT_OK) {
        for (int i = 0; i < st->n; i++) {
            const rt_st_tensor *t = &st->tensors[i];
            if (rt_safetensors_find(st, t->name) != t) __builtin_trap();
            volatile uint8_t sum = 0;
            for (size_t j = t->begin; j < t->end; j++) sum += ((const uint8_t *)t->data)[j - t->begin];
        }
        (void)rt_safetensors_meta(st, "format");
        rt_safetensors_free(st);
    }
    return 0;
}
