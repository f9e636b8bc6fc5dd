/* The libraries src/data links, for `ringtrain info`: zlib (gzip'd IDX files). */
#include "data/dataset.h"

#include <zlib.h>

int rt_data_lib_versions(rt_lib_version *out, int cap) {
    int n = 0;
    rt_lib_version_add(out, cap, &n, "zlib", "zlib", zlibVersion());
    return n;
}
