/* The libraries src/dist links, for `ringtrain info`: OpenSSL's libcrypto (the
 * handshake's HMAC) and NCCL (CUDA builds). */
#include "dist/dist.h"

#include <openssl/crypto.h>

#ifdef RT_HAVE_CUDA
#include <nccl.h>
#endif

int rt_dist_lib_versions(rt_lib_version *out, int cap) {
    int n = 0;
    rt_lib_version_add(out, cap, &n, "libcrypto", "libcrypto", OpenSSL_version(OPENSSL_VERSION_STRING));
#ifdef RT_HAVE_CUDA
    int v = 0;
    char s[32];
    ncclGetVersion(&v);
    rt_lib_version_fmt(s, sizeof s, v, 10000, 100);
    rt_lib_version_add(out, cap, &n, "NCCL", "nccl", s);
#else
    rt_lib_version_add(out, cap, &n, "NCCL", "nccl", "not built");
#endif
    return n;
}
