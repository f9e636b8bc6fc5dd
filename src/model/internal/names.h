/* Private to src/model: looking up a name in a table of canonical names (architectures,
 * stems, precisions, convolution implementations). One rule for every parse in model:
 * ASCII case-insensitive; canonical names are lowercase; an unknown name is an error
 * that lists the accepted ones, built from the table itself. */
#ifndef RT_MODEL_INTERNAL_NAMES_H
#define RT_MODEL_INTERNAL_NAMES_H

#include "core/status.h"
#include <stddef.h>

/* name_of(i) for i in [0, count): the canonical name of entry i */
typedef const char *(*rt_model_name_fn)(int i);

/* Index of `text` among the names (case-insensitive), -1 if absent or NULL. */
int rt_model_name_find(const char *text, rt_model_name_fn name_of, int count);
/* "a | b | c" into buf (truncated to cap); returns buf. */
const char *rt_model_name_list(char *buf, size_t cap, rt_model_name_fn name_of, int count);
/* rt_model_name_find, or RT_ERR_INVALID "unknown <what> '<text>' (expected a | b | c)" ("missing
 * <what> ..." for NULL). */
rt_status rt_model_name_parse(const char *what, const char *text, rt_model_name_fn name_of, int count, int *out);

#endif
