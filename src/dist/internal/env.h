/* Integers in text src/dist parses (env.c): environment variables themselves are read
 * through core/settings.h. */
#ifndef RT_DIST_INTERNAL_ENV_H
#define RT_DIST_INTERNAL_ENV_H

#include "core/status.h"

/* `text` (the value of `name`) as a decimal integer in lo..hi; else RT_ERR_INVALID
 * "NAME='text' is not an integer in lo..hi". */
rt_status rt_env_parse_int(const char *name, const char *text, int lo, int hi, int *out);

#endif
