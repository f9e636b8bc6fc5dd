/* libFuzzer target: the CIFAR-10 batch reader (count + unpack) on arbitrary input. */
#include "data/internal/cifar.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int64_t n = 0;
    if (rt_cifar_count(data, size, "fuzz.bin", RT_CIFAR_CLASSES, &n) == RT_OK) {
        if (n <= 0 || (size_t)n * RT_CIFAR_RECORD != size) __builtin_trap();
        uint8_t *img = malloc((size_t)n * RT_CIFAR_IMAGE), *lab = malloc((size_t)n);
        if (img && lab) {
            rt_cifar_unpack(data, n, img, lab);
            for (int64_t i = 0; i < n; i++)
                if (lab[i] >= RT_CIFAR_CLASSES) __builtin_trap();
        }
        free(img);
        free(lab);
    }
    rt_error_clear();
    return 0;
}
