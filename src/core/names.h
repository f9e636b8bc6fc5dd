/* Names of enum values: one table per enum, indexed by the value and sized by its
 * *_COUNT_ member, from which parsing and the "expected ..." part of a bad-name error
 * are both built, so the accepted names and the error can never drift apart.
 *
 * The rule for every rt_*_parse of a name: ASCII case-insensitive matching; canonical
 * names are lowercase and printed lowercase; NULL or an unknown name is RT_ERR_INVALID
 * with a message such as  unknown optimizer 'rmsprop' (expected sgd | adam | adamw).
 */
#ifndef RT_NAMES_H
#define RT_NAMES_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Index of `text` in names[0..count) (ASCII case-insensitive; NULL entries never
 * match); -1 when text is NULL or absent. */
int rt_names_find(const char *const *names, int count, const char *text);

/* "a | b | c" from names[0..count) (NULL entries skipped) into buf; returns buf. */
const char *rt_names_join(const char *const *names, int count, char *buf, size_t n);

/* Append `name` to the " | "-separated list in buf (for tables that are not a plain
 * array of names); returns buf. */
const char *rt_names_append(char *buf, size_t n, const char *name);

#ifdef __cplusplus
}
#endif

#endif
