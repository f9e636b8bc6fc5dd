/* libFuzzer target: the IDX reader on raw and gzip input (as rt_dataset_load reads a
 * file: inflate when it starts with the gzip magic, then parse as images and labels). */
#include "data/internal/bytes.h"
#include "data/internal/idx.h"

#include <stdint.h>
#include <string.h>

static void parse(const uint8_t *buf, size_t len) {
    rt_idx v;
    for (int nd = 1; nd <= 3; nd++)
        if (rt_idx_parse(buf, len, "fuzz", nd, &v) == RT_OK) {
            /* touch every element the view claims: ASan catches a view past the buffer */
            unsigned sum = 0;
            for (size_t i = 0; i < v.count; i++) sum += v.data[i];
            if (v.data + v.count != buf + len) __builtin_trap();
            (void)sum;
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (rt_is_gzip(data, size)) {
        rt_bytes out;
        if (rt_gunzip(data, size, "fuzz.gz", (size_t)1 << 20, NULL, &out) == RT_OK) {
            parse(out.data, out.len);
            rt_bytes_free(&out);
        }
        /* with the size rule of images and labels, as rt_dataset_load reads them */
        for (int nd = 1; nd <= 3; nd += 2) {
            rt_bytes_rule rule = rt_idx_rule(nd);
            if (rt_gunzip(data, size, "fuzz.gz", (size_t)1 << 20, &rule, &out) == RT_OK) {
                rt_idx v;
                if (rt_idx_parse(out.data, out.len, "fuzz", nd, &v) != RT_OK) __builtin_trap();
                rt_bytes_free(&out);
            }
        }
    } else {
        parse(data, size);
    }
    rt_error_clear();
    return 0;
}
