/* Names of enum values: one table per enum (rt_names), indexed by the value and sized by
 * its *_COUNT_ member, owned by the area that owns the enum. The one parser of a name,
 * rt_names_parse, and the "expected ..." list of every bad-name error are built from it,
 * and so are the config key table (src/train/config.c), `ringtrain train --help` and the
 * check of docs/config.md: adding a row to a table changes all of them at once.
 *
 * The rule for every rt_*_parse of a name: ASCII case-insensitive matching; canonical
 * names are lowercase and printed lowercase; NULL or an unknown name is RT_ERR_INVALID
 * with the one message
 *     unknown optimizer 'rmsprop' (expected sgd | adam | adamw | adadelta)
 *     no optimizer given (expected sgd | adam | adamw | adadelta)
 */
#ifndef RT_NAMES_H
#define RT_NAMES_H

#include "core/status.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Another spelling a table accepts for a value ("warning" for warn); never listed. */
typedef struct rt_name_alias {
    const char *name;
    int value;
} rt_name_alias;

/* The names of one enum. Value i's canonical name is names[i] when names is set, else
 * name_of(i) (tables of rows, whose rows hold their names); a NULL name is a value that
 * cannot be named (it is neither accepted nor listed). */
typedef struct rt_names {
    const char *what;              /* what the names name, for errors: "optimizer" */
    int count;                     /* values 0..count-1 */
    const char *const *names;      /* names[count], or NULL and: */
    const char *(*name_of)(int i); /* value i's name */
    const rt_name_alias *aliases;  /* NULL, or other spellings ended by {NULL, 0} */
} rt_names;

/* Value i's canonical name; NULL when out of range or unnamed. */
const char *rt_names_name(const rt_names *t, int i);

/* The value `text` names (canonical names then aliases, ASCII case-insensitive); -1
 * when text is NULL or names nothing. Records no error. */
int rt_names_index(const rt_names *t, const char *text);

/* *out = the value `text` names; otherwise RT_ERR_INVALID with the one message above
 * (no trace line is needed: it names the table's `what` and its names). */
rt_status rt_names_parse(const rt_names *t, const char *text, int *out);

/* "a | b | c": the canonical names in value order (unnamed ones skipped); returns buf. */
const char *rt_names_list(const rt_names *t, char *buf, size_t n);

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
