/* libFuzzer target: the small text parsers of src/core (log levels, dtypes, device names). */
#include "core/device.h"
#include "core/log.h"
#include "core/tensor.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    rt_log_level lv;
    (void)rt_log_parse_level(text, &lv);
    rt_dtype dt;
    (void)rt_dtype_parse(text, &dt);
    rt_device d;
    for (int count = 0; count < 3; count++) (void)rt_device_choose(text, 1, count, &d);
    if (strncasecmp(text, "cuda", 4) != 0) (void)rt_device_select(text, 0, &d);
    rt_error_clear();
    free(text);
    return 0;
}
