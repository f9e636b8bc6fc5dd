/* Name tables of src/model (see internal/names.h). */
#include "model/internal/names.h"

#include <stdio.h>
#include <strings.h>

int rt_model_name_find(const char *text, rt_model_name_fn name_of, int count) {
    if (!text) return -1;
    for (int i = 0; i < count; i++)
        if (strcasecmp(text, name_of(i)) == 0) return i;
    return -1;
}

const char *rt_model_name_list(char *buf, size_t cap, rt_model_name_fn name_of, int count) {
    size_t len = 0;
    if (cap) buf[0] = '\0';
    for (int i = 0; i < count && len < cap; i++) {
        int w = snprintf(buf + len, cap - len, "%s%s", i ? " | " : "", name_of(i));
        if (w < 0) break;
        len += (size_t)w;
    }
    return buf;
}

rt_status rt_model_name_parse(const char *what, const char *text, rt_model_name_fn name_of, int count, int *out) {
    int i = rt_model_name_find(text, name_of, count);
    if (i < 0) {
        char list[256];
        rt_model_name_list(list, sizeof list, name_of, count);
        if (!text) RT_FAIL(RT_ERR_INVALID, "missing %s (expected %s)", what, list);
        RT_FAIL(RT_ERR_INVALID, "unknown %s '%s' (expected %s)", what, text, list);
    }
    *out = i;
    return RT_OK;
}
