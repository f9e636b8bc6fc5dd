/* Build and run-time information for `ringtrain info`. */
#ifndef RT_INFO_H
#define RT_INFO_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version, commit, build features, library versions and the devices found now.
 * Never fails: a missing GPU is reported with the driver's reason. */
void rt_info_print(FILE *out);
/* The same as one JSON object (for benchmark result files). */
void rt_info_json(FILE *out);
/* "0.1.0 (abc123)" */
const char *rt_version_string(void);

#ifdef __cplusplus
}
#endif

#endif
