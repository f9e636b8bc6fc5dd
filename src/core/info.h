/* Build information and the libraries each area links, for `ringtrain info`.
 *
 * Every area reports the libraries it links itself (rt_<area>_lib_versions, declared
 * in the area's public header), so core needs no GPU library but the CUDA runtime;
 * src/cli gathers the lists. */
#ifndef RT_INFO_H
#define RT_INFO_H

#ifdef __cplusplus
extern "C" {
#endif

/* "0.1.0 (abc123)" */
const char *rt_version_string(void);

/* One linked library: its display name ("cuDNN"), the key it has in `ringtrain info
 * --json` ("cudnn") and its version ("9.19.0"; "not built" when compiled out, "none"
 * for a driver that is not installed). */
typedef struct rt_lib_version {
    const char *name;
    const char *key;
    char version[128];
} rt_lib_version;

/* Fill up to `cap` entries and return how many were written (at most RT_LIB_VERSIONS_MAX). */
#define RT_LIB_VERSIONS_MAX 8
int rt_core_lib_versions(rt_lib_version *out, int cap); /* CUDA runtime, CUDA driver */

/* Internal helper for the areas: set entry *n (if below cap) and advance *n. */
void rt_lib_version_add(rt_lib_version *out, int cap, int *n, const char *name, const char *key, const char *version);
/* "M.m.p" from a version number v = M*div1 + m*div2 + p; "n/a" when v <= 0. */
void rt_lib_version_fmt(char *buf, unsigned long n, int v, int div1, int div2);

#ifdef __cplusplus
}
#endif

#endif
