/* The settings table (settings.h) and its one parser. This is the only file of
 * ringtrain that calls getenv (tests/core/settings_docs.sh checks it). */
#include "core/settings.h"

#include "core/log.h"
#include "core/names.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static rt_setting_info k_settings[RT_SETTING_COUNT_] = {
#define RT_SETTING_ROW_(id, name, type, def, lo, hi, choices, group, doc)                                              \
    [RT_SET_##id] = {name, RT_SETTING_##type, def, lo, hi, choices, RT_SETTING_##group, doc},
    RT_SETTINGS(RT_SETTING_ROW_)
#undef RT_SETTING_ROW_
};

/* CHOICE rows whose choices are an area's name table (core/names.h; the row says NULL):
 * parsed by it, aliases included (the log level's "warning" and digits), their choices
 * text built from it, so the two cannot drift. Other CHOICE rows list theirs. */
static const rt_names *choice_table(rt_setting_id id) { return id == RT_SET_LOG_LEVEL ? &rt_log_level_names : NULL; }

/* The table rows' choices text ("a|b|c") from their name tables, once. */
static pthread_once_t g_choices_once = PTHREAD_ONCE_INIT;
static char g_choices[RT_SETTING_COUNT_][128];
static void fill_choices(void) {
    for (int i = 0; i < RT_SETTING_COUNT_; i++) {
        const rt_names *t = choice_table((rt_setting_id)i);
        if (!t) continue;
        char list[128];
        rt_names_list(t, list, sizeof list);
        size_t j = 0;
        for (const char *p = list; *p && j + 1 < sizeof g_choices[i]; p++)
            if (*p != ' ') g_choices[i][j++] = *p;
        g_choices[i][j] = '\0';
        k_settings[i].choices = g_choices[i];
    }
}

const rt_setting_info *rt_setting_info_get(rt_setting_id id) {
    pthread_once(&g_choices_once, fill_choices);
    return (int)id >= 0 && id < RT_SETTING_COUNT_ ? &k_settings[id] : NULL;
}

rt_status rt_setting_find(const char *name, rt_setting_id *out) {
    for (int i = 0; name && i < RT_SETTING_COUNT_; i++)
        if (strcmp(k_settings[i].name, name) == 0) {
            *out = (rt_setting_id)i;
            return RT_OK;
        }
    return RT_ERROR(RT_ERR_INVALID, "environment variable %s is not declared in core/settings.h",
                    name ? name : "(null)");
}

const char *rt_setting_type_name(rt_setting_type t) {
    static const char *const n[] = {"int", "float", "bool", "string", "choice"};
    return (int)t >= 0 && t <= RT_SETTING_CHOICE ? n[t] : "?";
}

const char *rt_setting_group_name(rt_setting_group g) {
    static const char *const n[] = {"user", "launcher", "system", "test"};
    return (int)g >= 0 && g <= RT_SETTING_TEST ? n[g] : "?";
}

const char *rt_setting_text(rt_setting_id id) {
    const rt_setting_info *s = rt_setting_info_get(id);
    const char *v = s ? getenv(s->name) : NULL;
    return v && *v ? v : NULL;
}

bool rt_setting_is_set(rt_setting_id id) { return rt_setting_text(id) != NULL; }

/* ---- the parser ---- */

static bool is_word(const char *text, const char *const *words) {
    for (int i = 0; words[i]; i++)
        if (strcasecmp(text, words[i]) == 0) return true;
    return false;
}

/* The index of `text` among "a|b|c" (any case; a digit is a name only where the list
 * says it, as torch's TORCH_DISTRIBUTED_DEBUG takes no number); -1. */
static int choice_index(const char *choices, const char *text) {
    int i = 0;
    for (const char *p = choices; p && *p; i++) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (strlen(text) == len && strncasecmp(p, text, len) == 0) return i;
        p = bar ? bar + 1 : p + len;
    }
    return -1;
}

static rt_status parse_number(const rt_setting_info *s, const char *text, double *num) {
    char *end = NULL;
    errno = 0;
    double v;
    if (s->type == RT_SETTING_INT) {
        long long k = strtoll(text, &end, 10);
        v = (double)k;
    } else {
        v = strtod(text, &end);
    }
    bool ok = errno == 0 && end != text && *end == '\0' && isfinite(v) && v >= s->lo && v <= s->hi;
    if (!ok)
        return RT_ERROR(RT_ERR_INVALID, "%s='%s': expected %s in %.15g..%.15g (%s)", s->name, text,
                        s->type == RT_SETTING_INT ? "an integer" : "a number", s->lo, s->hi, s->doc);
    if (num) *num = v;
    return RT_OK;
}

rt_status rt_setting_parse(rt_setting_id id, const char *text, double *num) {
    static const char *const k_true[] = {"1", "true", "yes", "on", NULL};
    static const char *const k_false[] = {"0", "false", "no", "off", NULL};
    const rt_setting_info *s = rt_setting_info_get(id);
    RT_REQUIRE(s != NULL, RT_ERR_INTERNAL, "setting id %d is not in the table", (int)id);
    RT_REQUIRE(text != NULL, RT_ERR_INVALID, "%s: no value", s->name);
    switch (s->type) {
    case RT_SETTING_INT:
    case RT_SETTING_FLOAT:
        return parse_number(s, text, num);
    case RT_SETTING_BOOL:
        if (!is_word(text, k_true) && !is_word(text, k_false))
            return RT_ERROR(RT_ERR_INVALID, "%s='%s': expected 1 or 0 (also true/false, yes/no, on/off) (%s)", s->name,
                            text, s->doc);
        if (num) *num = is_word(text, k_true) ? 1 : 0;
        return RT_OK;
    case RT_SETTING_CHOICE: {
        const rt_names *t = choice_table(id);
        int k = t ? rt_names_index(t, text) : choice_index(s->choices, text);
        if (k < 0)
            return RT_ERROR(RT_ERR_INVALID, "%s='%s': expected one of %s (%s)", s->name, text, s->choices, s->doc);
        if (num) *num = k;
        return RT_OK;
    }
    case RT_SETTING_STRING:
        return RT_OK;
    }
    return RT_ERROR(RT_ERR_INTERNAL, "%s: unknown setting type %d", s->name, (int)s->type);
}

/* The row's value (variable, else default) as a number; *have false when neither is set. */
static rt_status value_of(rt_setting_id id, rt_setting_type want, double *num, bool *have) {
    const rt_setting_info *s = rt_setting_info_get(id);
    RT_REQUIRE(s != NULL, RT_ERR_INTERNAL, "setting id %d is not in the table", (int)id);
    RT_REQUIRE(s->type == want, RT_ERR_INTERNAL, "%s is a %s setting, read as a %s", s->name,
               rt_setting_type_name(s->type), rt_setting_type_name(want));
    const char *text = rt_setting_text(id);
    if (!text) text = *s->def ? s->def : NULL;
    *have = text != NULL;
    return text ? rt_setting_parse(id, text, num) : RT_OK;
}

rt_status rt_setting_int(rt_setting_id id, int64_t *out) {
    double v = 0;
    bool have = false;
    RT_CHECK(value_of(id, RT_SETTING_INT, &v, &have));
    if (have) *out = (int64_t)v;
    return RT_OK;
}

rt_status rt_setting_float(rt_setting_id id, double *out) {
    double v = 0;
    bool have = false;
    RT_CHECK(value_of(id, RT_SETTING_FLOAT, &v, &have));
    if (have) *out = v;
    return RT_OK;
}

rt_status rt_setting_bool(rt_setting_id id, bool *out) {
    double v = 0;
    bool have = false;
    RT_CHECK(value_of(id, RT_SETTING_BOOL, &v, &have));
    if (have) *out = v != 0;
    return RT_OK;
}

rt_status rt_setting_choice(rt_setting_id id, int *out) {
    double v = 0;
    bool have = false;
    RT_CHECK(value_of(id, RT_SETTING_CHOICE, &v, &have));
    if (have) *out = (int)v;
    return RT_OK;
}

const char *rt_setting_str(rt_setting_id id) {
    const rt_setting_info *s = rt_setting_info_get(id);
    const char *v = rt_setting_text(id);
    return v ? v : s && *s->def ? s->def : NULL;
}

rt_status rt_settings_check(void) {
    for (int i = 0; i < RT_SETTING_COUNT_; i++) {
        const rt_setting_info *s = rt_setting_info_get((rt_setting_id)i);
        const char *v = rt_setting_text((rt_setting_id)i);
        if (v && (s->group == RT_SETTING_USER || s->group == RT_SETTING_SYSTEM))
            RT_CHECK(rt_setting_parse((rt_setting_id)i, v, NULL));
    }
    return RT_OK;
}
