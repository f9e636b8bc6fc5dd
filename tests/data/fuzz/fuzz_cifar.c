/* libFuzzer target: the CIFAR-10 and CIFAR-100 readers (count + unpack) on arbitrary
 * input, each format (CIFAR-100 with either label kept) on the same bytes. */
#include "data/internal/cifar.h"

#include <stdint.h>
#include <stdlib.h>

static void one(const uint8_t *data, size_t size, const rt_cifar_format *f) {
    int64_t n = 0;
    if (rt_cifar_count(data, size, "fuzz.bin", f, &n) == RT_OK) {
        if (n <= 0 || (size_t)n * rt_cifar_record(f) != size) __builtin_trap();
        uint8_t *img = malloc((size_t)n * RT_CIFAR_IMAGE), *lab = malloc((size_t)n);
        if (img && lab) {
            rt_cifar_unpack(data, n, f, img, lab);
            for (int64_t i = 0; i < n; i++)
                if (lab[i] >= f->classes[f->keep]) __builtin_trap();
        }
        free(img);
        free(lab);
    }
    rt_error_clear();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    one(data, size, &rt_cifar10_format);
    one(data, size, &rt_cifar100_fine_format);
    one(data, size, &rt_cifar100_coarse_format);
    return 0;
}
