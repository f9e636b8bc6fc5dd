/* Name tables: lookup and the list for error messages; see names.h. */
#include "core/names.h"

#include <string.h>
#include <strings.h>

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
