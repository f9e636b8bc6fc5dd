/* Environment variables as src/dist reads them (env.c): one rule for "set" and for the
 * integers in them, shared by rt_dist_env_read and the rendezvous. */
#ifndef RT_DIST_INTERNAL_ENV_H
#define RT_DIST_INTERNAL_ENV_H

#include "core/status.h"

/* getenv(name), NULL when unset or empty */
const char *rt_env_get(const char *name);

/* `text` (the value of `name`) as a decimal integer in lo..hi; else RT_ERR_INVALID
 * "NAME='text' is not an integer in lo..hi". */
rt_status rt_env_parse_int(const char *name, const char *text, int lo, int hi, int *out);

#endif
