/* Name tables: the one parser of a name and the list for error messages; see names.h. */
#include "core/names.h"

#include <string.h>
#include <strings.h>

const char *rt_names_name(const rt_names *t, int i) {
    if (!t || i < 0 || i >= t->count) return NULL;
    return t->names ? t->names[i] : t->name_of ? t->name_of(i) : NULL;
}

int rt_names_index(const rt_names *t, const char *text) {
    if (!t || !text) return -1;
    for (int i = 0; i < t->count; i++) {
        const char *name = rt_names_name(t, i);
        if (name && strcasecmp(text, name) == 0) return i;
    }
    for (const rt_name_alias *a = t->aliases; a && a->name; a++)
        if (strcasecmp(text, a->name) == 0) return a->value;
    return -1;
}

const char *rt_names_list(const rt_names *t, char *buf, size_t n) {
    if (n == 0) return buf;
    buf[0] = '\0';
    for (int i = 0; t && i < t->count; i++) rt_names_append(buf, n, rt_names_name(t, i));
    return buf;
}

rt_status rt_names_parse(const rt_names *t, const char *text, int *out) {
    int i = rt_names_index(t, text);
    if (i >= 0) {
        *out = i;
        return RT_OK;
    }
    char list[512];
    rt_names_list(t, list, sizeof list);
    const char *what = t && t->what ? t->what : "name";
    if (!text) return RT_ERROR(RT_ERR_INVALID, "no %s given (expected %s)", what, list);
    return RT_ERROR(RT_ERR_INVALID, "unknown %s '%s' (expected %s)", what, text, list);
}

int rt_names_find(const char *const *names, int count, const char *text) {
    if (!text) return -1;
    for (int i = 0; i < count; i++)
        if (names[i] && strcasecmp(text, names[i]) == 0) return i;
    return -1;
}

const char *rt_names_append(char *buf, size_t n, const char *name) {
    if (n == 0 || !name) return buf;
    size_t len = strnlen(buf, n - 1);
    const char *sep = len ? " | " : "";
    size_t sl = strlen(sep), nl = strlen(name);
    if (len + sl + nl >= n) return buf; /* never a cut name: the list stays as it was */
    memcpy(buf + len, sep, sl);
    memcpy(buf + len + sl, name, nl + 1);
    return buf;
}

const char *rt_names_join(const char *const *names, int count, char *buf, size_t n) {
    if (n == 0) return buf;
    buf[0] = '\0';
    for (int i = 0; i < count; i++) rt_names_append(buf, n, names[i]);
    return buf;
}
