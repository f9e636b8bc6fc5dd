/* Checkpoints: see checkpoint.h and docs/checkpoints.md. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "train/checkpoint.h"

#include "core/log.h"
#include "core/safetensors.h"
#include "optim/schedule.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include <jansson.h>

static const char *const k_reserved[] = {RT_CKPT_RESERVED_KEYS};
static const char *const k_required[] = {RT_CKPT_REQUIRED_KEYS};
#define N_RESERVED (sizeof k_reserved / sizeof k_reserved[0])
#define N_REQUIRED (sizeof k_required / sizeof k_required[0])
#define MAX_DROPOUT 16

/* ---- metadata ---------------------------------------------------------------------- */

void rt_ckpt_meta_init(rt_ckpt_meta *m) { memset(m, 0, sizeof *m); }

void rt_ckpt_meta_free(rt_ckpt_meta *m) {
    if (!m) return;
    for (int i = 0; i < m->n; i++) {
        free(m->keys[i]);
        free(m->values[i]);
    }
    free(m->keys);
    free(m->values);
    memset(m, 0, sizeof *m);
}

static bool key_ok(const char *k) {
    if (!k || !*k) return false;
    for (const char *c = k; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '.' ||
              *c == '_' || *c == '-'))
            return false;
    return true;
}

rt_status rt_ckpt_meta_set(rt_ckpt_meta *m, const char *key, const char *value) {
    RT_REQUIRE(key_ok(key), RT_ERR_INVALID, "checkpoint metadata key '%s' (expected letters, digits, '.', '_', '-')",
               key ? key : "(null)");
    RT_REQUIRE(value, RT_ERR_INVALID, "checkpoint metadata '%s': NULL value", key);
    char *v = strdup(value);
    RT_CHECK_ALLOC(v, strlen(value));
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->keys[i], key) == 0) {
            free(m->values[i]);
            m->values[i] = v;
            return RT_OK;
        }
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 16;
        char **nk = realloc(m->keys, sizeof *nk * (size_t)cap);
        if (nk) m->keys = nk;
        char **nv = nk ? realloc(m->values, sizeof *nv * (size_t)cap) : NULL;
        if (nv) m->values = nv;
        if (!nk || !nv) {
            free(v);
            RT_FAIL(RT_ERR_NOMEM, "out of memory (checkpoint metadata)");
        }
        m->cap = cap;
    }
    m->keys[m->n] = strdup(key);
    if (!m->keys[m->n]) {
        free(v);
        RT_FAIL(RT_ERR_NOMEM, "out of memory (checkpoint metadata)");
    }
    m->values[m->n++] = v;
    return RT_OK;
}

rt_status rt_ckpt_meta_set_i64(rt_ckpt_meta *m, const char *key, int64_t value) {
    char b[32];
    snprintf(b, sizeof b, "%" PRId64, value);
    return rt_ckpt_meta_set(m, key, b);
}

rt_status rt_ckpt_meta_set_u64(rt_ckpt_meta *m, const char *key, uint64_t value) {
    char b[32];
    snprintf(b, sizeof b, "%" PRIu64, value);
    return rt_ckpt_meta_set(m, key, b);
}

const char *rt_ckpt_meta_get(const rt_ckpt_meta *m, const char *key) {
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->keys[i], key) == 0) return m->values[i];
    return NULL;
}

static const char *src_of(const rt_ckpt_meta *m) { return m->source[0] ? m->source : "checkpoint metadata"; }

rt_status rt_ckpt_meta_get_str(const rt_ckpt_meta *m, const char *key, const char **out) {
    *out = rt_ckpt_meta_get(m, key);
    if (!*out) RT_FAIL(RT_ERR_FORMAT, "%s: metadata '%s' is missing", src_of(m), key);
    return RT_OK;
}

/* strict decimal: [-]digits, no leading zeros, in range */
static bool parse_dec(const char *s, bool allow_neg, uint64_t *mag, bool *neg) {
    *neg = false;
    if (allow_neg && *s == '-') {
        *neg = true;
        s++;
    }
    if (*s < '0' || *s > '9') return false;
    if (s[0] == '0' && s[1]) return false;
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return false;
        uint64_t d = (uint64_t)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return false;
        v = v * 10 + d;
    }
    if (*neg && v == 0) return false; /* "-0" */
    *mag = v;
    return true;
}

rt_status rt_ckpt_meta_get_i64(const rt_ckpt_meta *m, const char *key, int64_t *out) {
    const char *s;
    RT_CHECK(rt_ckpt_meta_get_str(m, key, &s));
    uint64_t v;
    bool neg;
    if (!parse_dec(s, true, &v, &neg) || v > (uint64_t)INT64_MAX + (neg ? 1u : 0u))
        RT_FAIL(RT_ERR_FORMAT, "%s: metadata '%s' is \"%.64s\", expected a decimal integer", src_of(m), key, s);
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return RT_OK;
}

rt_status rt_ckpt_meta_get_u64(const rt_ckpt_meta *m, const char *key, uint64_t *out) {
    const char *s;
    RT_CHECK(rt_ckpt_meta_get_str(m, key, &s));
    bool neg;
    if (!parse_dec(s, false, out, &neg))
        RT_FAIL(RT_ERR_FORMAT, "%s: metadata '%s' is \"%.64s\", expected a non-negative decimal integer", src_of(m),
                key, s);
    return RT_OK;
}

/* ---- convolution algorithms (GPU runs) ------------------------------------------------- */

#define CONV_ALGO_CHARS 158 /* the longest entry written or read, its '\0' included */

/* One entry: "64x28x28->64 k3 s1 p1 n32 fp32 fwd=1/3 data=1/3 filter=1/3" (algorithm /
 * math type, cuDNN's numbers); "bf16/nhwc" where the choice was made for NHWC copies. */
static int conv_algo_str(const rt_conv_algo *a, char *out, size_t n) {
    return snprintf(out, n, "%dx%dx%d->%d k%d s%d p%d n%d %s%s fwd=%d/%d data=%d/%d filter=%d/%d", a->in_c, a->in_h,
                    a->in_w, a->out_c, a->k, a->stride, a->pad, a->n, rt_precision_name((rt_precision)a->precision),
                    a->nhwc ? "/nhwc" : "", a->fwd, a->fwd_math, a->bwd_data, a->bwd_data_math, a->bwd_filter,
                    a->bwd_filter_math);
}

rt_status rt_ckpt_meta_set_conv_algos(rt_ckpt_meta *m, const char *key, const rt_conv_algos *a) {
    RT_REQUIRE(a->n >= 0 && a->n <= RT_CONV_ALGOS_MAX, RT_ERR_INVALID, "metadata '%s': %d convolution shapes", key,
               a->n);
    char *text = calloc((size_t)a->n + 1, CONV_ALGO_CHARS + 2);
    RT_CHECK_ALLOC(text, ((size_t)a->n + 1) * (CONV_ALGO_CHARS + 2));
    size_t len = 0;
    for (int i = 0; i < a->n; i++) {
        if (i) len += (size_t)snprintf(text + len, 3, "; ");
        int l = conv_algo_str(&a->a[i], text + len, CONV_ALGO_CHARS);
        if (l < 0 || l >= CONV_ALGO_CHARS) {
            free(text);
            RT_FAIL(RT_ERR_INVALID, "metadata '%s': convolution entry %d does not fit", key, i);
        }
        len += (size_t)l;
    }
    rt_status st = rt_ckpt_meta_set(m, key, text);
    free(text);
    return st;
}

/* The numbers of an entry in the order conv_algo_str writes them: the text before each,
 * the field it fills, its least value, its name for errors. The precision sits between
 * the two groups. */
typedef struct algo_field {
    const char *before;
    size_t off; /* offsetof(rt_conv_algo, field) */
    int min;
    const char *what;
} algo_field;

#define ALGO_FIELD(before, field, min, what)                                                                           \
    { before, offsetof(rt_conv_algo, field), min, what }
static const algo_field k_algo_shape[] = {
    ALGO_FIELD("", in_c, 1, "input channels"), ALGO_FIELD("x", in_h, 1, "input height"),
    ALGO_FIELD("x", in_w, 1, "input width"),   ALGO_FIELD("->", out_c, 1, "output channels"),
    ALGO_FIELD(" k", k, 1, "kernel size"),     ALGO_FIELD(" s", stride, 1, "stride"),
    ALGO_FIELD(" p", pad, 0, "padding"),       ALGO_FIELD(" n", n, 1, "batch"),
};
static const algo_field k_algo_choice[] = {
    ALGO_FIELD(" fwd=", fwd, 0, "forward algorithm"),
    ALGO_FIELD("/", fwd_math, 0, "forward math type"),
    ALGO_FIELD(" data=", bwd_data, 0, "backward-data algorithm"),
    ALGO_FIELD("/", bwd_data_math, 0, "backward-data math type"),
    ALGO_FIELD(" filter=", bwd_filter, 0, "backward-filter algorithm"),
    ALGO_FIELD("/", bwd_filter_math, 0, "backward-filter math type"),
};
#undef ALGO_FIELD

/* f->before, then a decimal int as printf writes it (digits, no sign, no leading zero)
 * within [f->min, INT_MAX]; false (and *p unmoved) where the text is anything else */
static bool take_algo_field(const char **p, const algo_field *f, rt_conv_algo *a) {
    size_t bl = strlen(f->before);
    const char *s = *p;
    if (strncmp(s, f->before, bl) != 0) return false;
    s += bl;
    if (*s < '0' || *s > '9' || (s[0] == '0' && s[1] >= '0' && s[1] <= '9')) return false;
    long long v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        v = v * 10 + (*s - '0');
        if (v > INT_MAX) return false;
    }
    if (v < f->min) return false;
    *(int *)((char *)a + f->off) = (int)v;
    *p = s;
    return true;
}

/* " ", a precision exactly as rt_precision_name writes it, then "/nhwc" or nothing */
static bool take_algo_precision(const char **p, rt_conv_algo *a) {
    const char *s = *p;
    if (*s++ != ' ') return false;
    size_t len = strcspn(s, " "), nl = strcspn(s, "/ ");
    if (nl < len && (len - nl != 5 || strncmp(s + nl, "/nhwc", 5) != 0)) return false;
    for (int i = 0; i < RT_PRECISION_COUNT_; i++) {
        const char *name = rt_precision_name((rt_precision)i);
        if (strlen(name) == nl && strncmp(s, name, nl) == 0) {
            a->precision = i;
            a->nhwc = nl < len;
            *p = s + len;
            return true;
        }
    }
    return false;
}

/* one entry, strictly: every number present and in range, nothing after the last; on
 * failure `why` says what was expected where */
static bool parse_conv_algo(const char *entry, rt_conv_algo *a, char *why, size_t why_n) {
    const char *p = entry;
    memset(a, 0, sizeof *a);
    const algo_field *bad = NULL;
    for (size_t i = 0; !bad && i < sizeof k_algo_shape / sizeof k_algo_shape[0]; i++)
        if (!take_algo_field(&p, &k_algo_shape[i], a)) bad = &k_algo_shape[i];
    if (!bad && !take_algo_precision(&p, a)) {
        char names[64];
        snprintf(why, why_n, "\" \" and the precision (%s, then \"/nhwc\" or nothing) at byte %d",
                 rt_names_list(&rt_precision_names, names, sizeof names), (int)(p - entry));
        return false;
    }
    for (size_t i = 0; !bad && i < sizeof k_algo_choice / sizeof k_algo_choice[0]; i++)
        if (!take_algo_field(&p, &k_algo_choice[i], a)) bad = &k_algo_choice[i];
    if (bad) {
        snprintf(why, why_n, "\"%s\" and the %s (a decimal integer >= %d) at byte %d", bad->before, bad->what, bad->min,
                 (int)(p - entry));
        return false;
    }
    if (*p) {
        snprintf(why, why_n, "the end of the entry at byte %d", (int)(p - entry));
        return false;
    }
    return true;
}

rt_status rt_ckpt_meta_get_conv_algos(const rt_ckpt_meta *m, const char *key, rt_conv_algos *out) {
    const char *s;
    RT_CHECK(rt_ckpt_meta_get_str(m, key, &s));
    out->n = 0;
    while (*s) {
        const char *end = strstr(s, "; ");
        size_t len = end ? (size_t)(end - s) : strlen(s);
        char entry[CONV_ALGO_CHARS], why[160];
        RT_REQUIRE(out->n < RT_CONV_ALGOS_MAX, RT_ERR_FORMAT, "%s: metadata '%s' holds more than %d convolution shapes",
                   src_of(m), key, RT_CONV_ALGOS_MAX);
        RT_REQUIRE(len < sizeof entry, RT_ERR_FORMAT, "%s: metadata '%s': entry %d is too long", src_of(m), key,
                   out->n + 1);
        memcpy(entry, s, len);
        entry[len] = '\0';
        RT_REQUIRE(parse_conv_algo(entry, &out->a[out->n], why, sizeof why), RT_ERR_FORMAT,
                   "%s: metadata '%s': entry %d is \"%.100s\": expected %s (an entry reads \"CxHxW->C kK sS pP nN "
                   "fp32|tf32|bf16[/nhwc] fwd=A/M data=A/M filter=A/M\")",
                   src_of(m), key, out->n + 1, entry, why);
        out->n++;
        s += len;
        if (end) {
            s += 2;
            RT_REQUIRE(*s, RT_ERR_FORMAT, "%s: metadata '%s' ends with a separator", src_of(m), key);
        }
    }
    return RT_OK;
}

/* ---- small file-system helpers ------------------------------------------------------- */

static rt_status join(char *out, size_t n, const char *a, const char *b) {
    int l = snprintf(out, n, "%s/%s", a, b);
    if (l < 0 || (size_t)l >= n) RT_FAIL(RT_ERR_INVALID, "path too long: %s/%s", a, b);
    return RT_OK;
}

static rt_status fsync_path(const char *path, bool dir) {
    int fd = open(path, (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) RT_FAIL(RT_ERR_IO, "cannot open %s to fsync it: %s", path, strerror(errno));
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        RT_FAIL(RT_ERR_IO, "fsync %s: %s", path, strerror(e));
    }
    close(fd);
    return RT_OK;
}

/* Empty the directory NAME (relative to dirfd at, or a path with AT_FDCWD): files and
 * directories only, never through a symbolic link (the directory itself is opened with
 * O_NOFOLLOW and every entry is looked at with lstat semantics: a link inside is
 * unlinked, what it points to is not ours). False when NAME is not a directory we can
 * open that way (a symlink among them): then nothing was removed. */
static bool empty_tree_at(int at, const char *name) {
    int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return false;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return false;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        struct stat sb;
        if (fstatat(fd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(sb.st_mode)) {
            if (empty_tree_at(fd, e->d_name)) unlinkat(fd, e->d_name, AT_REMOVEDIR);
        } else {
            unlinkat(fd, e->d_name, 0);
        }
    }
    closedir(d);
    return true;
}

/* rm -r of a directory we wrote (files and directories only); best effort. A symbolic
 * link at PATH is left alone, and so is everything it points to. */
static void remove_tree(const char *path) {
    if (empty_tree_at(AT_FDCWD, path)) rmdir(path);
}

void rt_ckpt_dir_name(int64_t step, char *out, size_t n) {
    snprintf(out, n, "ckpt-%0*" PRId64, RT_CKPT_STEP_DIGITS, step);
}

/* "ckpt-<digits>" -> step; false for anything else (temporaries start with '.') */
static bool parse_ckpt_name(const char *name, int64_t *step) {
    if (strncmp(name, "ckpt-", 5) != 0) return false;
    uint64_t v;
    bool neg;
    const char *d = name + 5;
    if (strlen(d) < RT_CKPT_STEP_DIGITS) return false;
    while (d[0] == '0' && d[1]) d++; /* zero padding */
    if (!parse_dec(d, false, &v, &neg) || v > (uint64_t)INT64_MAX) return false;
    *step = (int64_t)v;
    return true;
}

typedef struct ckpt_entry {
    int64_t step;
    char name[512];
} ckpt_entry;

static int cmp_entry_desc(const void *a, const void *b) {
    const ckpt_entry *x = a, *y = b;
    return (x->step < y->step) - (x->step > y->step);
}

/* ckpt-* directories of dir (not symbolic links to one), newest first; *n = 0 if dir does
 * not exist */
static rt_status list_ckpts(const char *dir, ckpt_entry **out, int *n) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return RT_OK;
        RT_FAIL(RT_ERR_IO, "cannot read the checkpoint directory %s: %s", dir, strerror(errno));
    }
    int cap = 0;
    ckpt_entry *v = NULL;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t step;
        if (!parse_ckpt_name(e->d_name, &step) || strlen(e->d_name) >= sizeof v->name) continue;
        char p[RT_CKPT_PATH_MAX + 256];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        /* lstat: a symlinked ckpt-* (say, to an archive) is not ours to count, prune or move */
        if (lstat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            ckpt_entry *nv = realloc(v, sizeof *nv * (size_t)cap);
            if (!nv) {
                free(v);
                closedir(d);
                RT_FAIL(RT_ERR_NOMEM, "out of memory listing %s", dir);
            }
            v = nv;
        }
        v[*n].step = step;
        snprintf(v[*n].name, sizeof v[*n].name, "%s", e->d_name);
        (*n)++;
    }
    closedir(d);
    if (*n) qsort(v, (size_t)*n, sizeof *v, cmp_entry_desc);
    *out = v;
    return RT_OK;
}

/* ---- crc ------------------------------------------------------------------------------ */

/* crc32 (zlib's) continued over n bytes (user: the uLong so far) */
static void crc_add(void *user, const void *data, size_t n) {
    uLong *c = user;
    const unsigned char *p = data;
    while (n) {
        uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        *c = crc32(*c, p, chunk);
        p += chunk;
        n -= chunk;
    }
}

/* crc32 of a safetensors file's data section */
static uint32_t data_crc(const rt_safetensors *st) {
    const unsigned char *b = st->bytes;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
    size_t off = 8 + (size_t)hlen;
    uLong c = crc32(0L, Z_NULL, 0);
    crc_add(&c, b + off, st->size - off);
    return (uint32_t)c;
}

static void crc_str(uint32_t c, char out[9]) { snprintf(out, 9, "%08" PRIx32, c); }

static bool parse_crc(const char *s, uint32_t *out) {
    if (strlen(s) != 8) return false;
    uint32_t v = 0;
    for (int i = 0; i < 8; i++) {
        char c = s[i];
        int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (h < 0) return false;
        v = v << 4 | (uint32_t)h;
    }
    *out = v;
    return true;
}

/* ---- verification ----------------------------------------------------------------------- */

typedef struct ckpt_files {
    rt_safetensors *model, *train;
    rt_ckpt_meta meta;
    char model_path[RT_CKPT_PATH_MAX + 32], train_path[RT_CKPT_PATH_MAX + 32];
} ckpt_files;

static void files_free(ckpt_files *f) {
    rt_safetensors_free(f->model);
    rt_safetensors_free(f->train);
    rt_ckpt_meta_free(&f->meta);
    f->model = f->train = NULL;
}

static rt_status check_crc(const rt_ckpt_meta *m, const char *key, const rt_safetensors *st, const char *file) {
    const char *s;
    RT_CHECK(rt_ckpt_meta_get_str(m, key, &s));
    uint32_t want;
    if (!parse_crc(s, &want))
        RT_FAIL(RT_ERR_FORMAT, "%s: metadata '%s' is \"%.64s\", expected 8 lowercase hex digits", m->source, key, s);
    uint32_t got = data_crc(st);
    if (got != want)
        RT_FAIL(RT_ERR_FORMAT, "%s: crc32 of the tensor data is %08" PRIx32 ", the checkpoint says %08" PRIx32, file,
                got, want);
    return RT_OK;
}

/* comma-separated list of names -> count, checking each (`what` for errors) */
static rt_status split_list(const rt_ckpt_meta *m, const char *key, char items[][64], int cap, int *count) {
    const char *s;
    RT_CHECK(rt_ckpt_meta_get_str(m, key, &s));
    *count = 0;
    if (!*s) return RT_OK;
    const char *p = s;
    for (;;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0 || len >= 64 || *count >= cap)
            RT_FAIL(RT_ERR_FORMAT,
                    "%s: metadata '%s' is \"%.64s\", expected a comma-separated list of at most %d items", m->source,
                    key, s, cap);
        memcpy(items[*count], p, len);
        items[*count][len] = 0;
        (*count)++;
        if (!e) break;
        p = e + 1;
    }
    return RT_OK;
}

/* the dropout counters: "" or "c0,c1,..." */
static rt_status parse_counters(const rt_ckpt_meta *m, uint64_t *c, int *n) {
    char items[MAX_DROPOUT][64];
    RT_CHECK(split_list(m, "model.dropout_counters", items, MAX_DROPOUT, n));
    for (int i = 0; i < *n; i++) {
        bool neg;
        if (!parse_dec(items[i], false, &c[i], &neg))
            RT_FAIL(RT_ERR_FORMAT,
                    "%s: metadata 'model.dropout_counters' item %d is \"%s\", expected a decimal integer", m->source, i,
                    items[i]);
    }
    return RT_OK;
}

/* ---- the metadata's fields and its crc32 --------------------------------------------- */

/* crc32.metadata: zlib's crc32 of every other key and value, by key in byte order, each
 * as key '\0' value '\0' (the JSON's order and escapes do not matter). No allocation:
 * the next key is the smallest one after the last (keys are unique). */
static uint32_t meta_crc(const rt_ckpt_meta *m) {
    uLong c = crc32(0L, Z_NULL, 0);
    const char *last = NULL;
    for (;;) {
        int next = -1;
        for (int i = 0; i < m->n; i++) {
            const char *k = m->keys[i];
            if (strcmp(k, RT_CKPT_META_CRC) == 0 || (last && strcmp(k, last) <= 0)) continue;
            if (next < 0 || strcmp(k, m->keys[next]) < 0) next = i;
        }
        if (next < 0) return (uint32_t)c;
        last = m->keys[next];
        c = crc32(c, (const Bytef *)last, (uInt)strlen(last) + 1);
        crc_add(&c, m->values[next], strlen(m->values[next]) + 1);
    }
}

typedef enum field_form {
    FORM_INT,      /* a decimal integer >= lo */
    FORM_NAME,     /* a canonical name of `names` (or `also`) */
    FORM_ID,       /* a run id: at most 31 letters, digits, '_' or '-' (a folder's name part) */
    FORM_CRC,      /* 8 lowercase hex digits */
    FORM_STATE,    /* optim.state: buffer names separated by commas */
    FORM_COUNTERS, /* model.dropout_counters: decimal integers separated by commas */
    FORM_ALGOS,    /* cudnn.conv_algos (rt_ckpt_meta_get_conv_algos) */
    FORM_TEXT,     /* any text (config: read by the config parser where it is used) */
} field_form;

typedef struct meta_field {
    const char *key;
    bool required;
    field_form form;
    int64_t lo;
    const rt_names *names;
    const char *also;
} meta_field;

static const char *const k_device_names[] = {"cpu", "cuda"};
static const rt_names k_devices = {"device kind", 2, k_device_names, NULL, NULL};
static const char *const k_bool_names[] = {"false", "true"};
static const rt_names k_bools = {"boolean", 2, k_bool_names, NULL, NULL};

/* Every field a ringtrain checkpoint holds (docs/checkpoints.md's tables), with its form;
 * format and format_version are check_format's. Fields not listed are ignored. */
static const meta_field k_fields[] = {
    {"step", true, FORM_INT, 0, NULL, NULL},
    {"model.arch", true, FORM_NAME, 0, &rt_model_arch_names, NULL},
    {"model.dropout_counters", true, FORM_COUNTERS, 0, NULL, NULL},
    {"optim.kind", true, FORM_NAME, 0, &rt_optim_kind_names, "none"},
    {"optim.steps", true, FORM_INT, 0, NULL, NULL},
    {"optim.state", true, FORM_STATE, 0, NULL, NULL},
    {"crc32.model", true, FORM_CRC, 0, NULL, NULL},
    {"crc32.train", true, FORM_CRC, 0, NULL, NULL},
    {RT_CKPT_META_CRC, false, FORM_CRC, 0, NULL, NULL}, /* absent before issue 38 */
    {"epoch", true, FORM_INT, 0, NULL, NULL},
    {"world_size", true, FORM_INT, 1, NULL, NULL},
    {"epoch_batches", false, FORM_INT, 0, NULL, NULL},
    {"global_batch", false, FORM_INT, 1, NULL, NULL},
    {"seed", false, FORM_INT, INT64_MIN, NULL, NULL},
    {"run_id", false, FORM_ID, 0, NULL, NULL},
    {"schedule.kind", false, FORM_NAME, 0, &rt_sched_kind_names, NULL},
    {"schedule.interval", false, FORM_NAME, 0, &rt_sched_interval_names, NULL},
    {"schedule.steps_per_epoch", false, FORM_INT, 0, NULL, NULL},
    {"schedule.t_max", false, FORM_INT, -1 /* auto for another schedule */, NULL, NULL},
    {"schedule.total_steps", false, FORM_INT, -1 /* auto for another schedule */, NULL, NULL},
    {"schedule.warmup_steps", false, FORM_INT, 0, NULL, NULL},
    {"schedule.step", false, FORM_INT, 0, NULL, NULL},
    {"device", false, FORM_NAME, 0, &k_devices, NULL},
    {"cudnn.deterministic", false, FORM_NAME, 0, &k_bools, NULL},
    {"cudnn.benchmark", false, FORM_NAME, 0, &k_bools, NULL}, /* absent before issue 40 */
    {"cudnn.conv_algos", false, FORM_ALGOS, 0, NULL, NULL},
    {"config", false, FORM_TEXT, 0, NULL, NULL},
};
#define N_FIELDS (sizeof k_fields / sizeof k_fields[0])

static bool id_ok(const char *s) {
    size_t n = strlen(s);
    if (n > 31) return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              *s == '-'))
            return false;
    return true;
}

/* field f (present in m) has its form */
static rt_status check_field(const rt_ckpt_meta *m, const meta_field *f) {
    const char *s = rt_ckpt_meta_get(m, f->key);
    int64_t v;
    uint32_t crc;
    char items[RT_OPTIM_MAX_STATE][64];
    uint64_t counters[MAX_DROPOUT];
    int n;
    switch (f->form) {
    case FORM_INT:
        RT_CHECK(rt_ckpt_meta_get_i64(m, f->key, &v));
        if (v < f->lo)
            RT_FAIL(RT_ERR_FORMAT, "%s: metadata '%s' is %" PRId64 ", expected >= %" PRId64, src_of(m), f->key, v,
                    f->lo);
        return RT_OK;
    case FORM_NAME: {
        int i = rt_names_index(f->names, s);
        if ((i >= 0 && strcmp(rt_names_name(f->names, i), s) == 0) || (f->also && strcmp(s, f->also) == 0))
            return RT_OK;
        char list[256];
        RT_FAIL(RT_ERR_FORMAT, "%s: metadata '%s' is \"%.64s\", expected %s%s%s", src_of(m), f->key, s,
                rt_names_list(f->names, list, sizeof list), f->also ? " | " : "", f->also ? f->also : "");
    }
    case FORM_ID:
        if (!id_ok(s))
            RT_FAIL(RT_ERR_FORMAT,
                    "%s: metadata '%s' is \"%.64s\", expected at most 31 letters, digits, '_' or '-' (a run id)",
                    src_of(m), f->key, s);
        return RT_OK;
    case FORM_CRC:
        if (!parse_crc(s, &crc))
            RT_FAIL(RT_ERR_FORMAT, "%s: metadata '%s' is \"%.64s\", expected 8 lowercase hex digits", src_of(m), f->key,
                    s);
        return RT_OK;
    case FORM_STATE:
        return split_list(m, f->key, items, RT_OPTIM_MAX_STATE, &n);
    case FORM_COUNTERS:
        return parse_counters(m, counters, &n);
    case FORM_ALGOS: {
        rt_conv_algos *a = malloc(sizeof *a);
        RT_CHECK_ALLOC(a, sizeof *a);
        rt_status st = rt_ckpt_meta_get_conv_algos(m, f->key, a);
        free(a);
        return st;
    }
    case FORM_TEXT:
        return RT_OK;
    }
    return RT_ERROR(RT_ERR_INTERNAL, "metadata field form %d", (int)f->form);
}

rt_status rt_ckpt_meta_check(const rt_ckpt_meta *m) {
    for (size_t i = 0; i < N_FIELDS; i++) {
        const meta_field *f = &k_fields[i];
        if (!rt_ckpt_meta_get(m, f->key)) {
            if (f->required) RT_FAIL(RT_ERR_FORMAT, "%s: metadata '%s' is missing", src_of(m), f->key);
            continue;
        }
        RT_CHECK(check_field(m, f));
    }
    const char *s = rt_ckpt_meta_get(m, RT_CKPT_META_CRC);
    uint32_t want, got = meta_crc(m);
    if (s && parse_crc(s, &want) && want != got)
        RT_FAIL(RT_ERR_FORMAT,
                "%s: metadata '" RT_CKPT_META_CRC "' is %08" PRIx32 ", the crc32 of the other metadata is %08" PRIx32
                ": the metadata changed after it was written",
                src_of(m), want, got);
    return RT_OK;
}

rt_status rt_ckpt_meta_seal(rt_ckpt_meta *m) {
    char c[9];
    crc_str(meta_crc(m), c);
    return rt_ckpt_meta_set(m, RT_CKPT_META_CRC, c);
}

/* The two files' paths under checkpoint directory `path`; both must exist. */
static rt_status locate_files(const char *path, ckpt_files *f) {
    struct stat sb;
    if (stat(path, &sb) != 0) RT_FAIL(RT_ERR_IO, "checkpoint %s: %s", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) RT_FAIL(RT_ERR_FORMAT, "checkpoint %s is not a directory", path);
    RT_CHECK(join(f->model_path, sizeof f->model_path, path, RT_CKPT_MODEL_FILE));
    RT_CHECK(join(f->train_path, sizeof f->train_path, path, RT_CKPT_TRAIN_FILE));
    for (int i = 0; i < 2; i++) {
        const char *fp = i ? f->model_path : f->train_path;
        if (stat(fp, &sb) != 0 && errno == ENOENT)
            RT_FAIL(RT_ERR_FORMAT, "%s is missing (not a complete checkpoint)", fp);
    }
    return RT_OK;
}

/* train.safetensors read whole, its metadata copied into f->meta (source: the file) */
static rt_status read_train(ckpt_files *f) {
    RT_CHECK(rt_safetensors_read(f->train_path, &f->train));
    rt_ckpt_meta *m = &f->meta;
    snprintf(m->source, sizeof m->source, "%s", f->train_path);
    for (int i = 0; i < f->train->n_meta; i++)
        RT_CHECK(rt_ckpt_meta_set(m, f->train->meta_keys[i], f->train->meta_values[i]));
    return RT_OK;
}

/* 'format' and 'format_version' say this is a checkpoint this ringtrain reads */
static rt_status check_format(const rt_ckpt_meta *m) {
    const char *fmt;
    RT_CHECK(rt_ckpt_meta_get_str(m, "format", &fmt));
    if (strcmp(fmt, RT_CKPT_FORMAT) != 0)
        RT_FAIL(RT_ERR_FORMAT, "%s: metadata 'format' is \"%.64s\", expected \"%s\"", m->source, fmt, RT_CKPT_FORMAT);
    int64_t ver;
    RT_CHECK(rt_ckpt_meta_get_i64(m, "format_version", &ver));
    if (ver != RT_CKPT_FORMAT_VERSION)
        RT_FAIL(RT_ERR_FORMAT, "%s: metadata 'format_version' is %" PRId64 ", this ringtrain reads version %d",
                m->source, ver, RT_CKPT_FORMAT_VERSION);
    return RT_OK;
}

/* both files' tensor data against the crc32s of the metadata (model.safetensors is read here) */
static rt_status check_crcs(ckpt_files *f) {
    RT_CHECK(check_crc(&f->meta, "crc32.train", f->train, f->train_path));
    RT_CHECK(rt_safetensors_read(f->model_path, &f->model));
    RT_CHECK(check_crc(&f->meta, "crc32.model", f->model, f->model_path));
    return RT_OK;
}

/* the step against the directory's name, then every field's form and the metadata's
 * crc32 (rt_ckpt_meta_check) */
static rt_status check_fields(const char *path, const rt_ckpt_meta *m) {
    int64_t step;
    RT_CHECK(rt_ckpt_meta_get_i64(m, "step", &step));
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    int64_t dir_step;
    if (step >= 0 && parse_ckpt_name(base, &dir_step) && dir_step != step)
        RT_FAIL(RT_ERR_FORMAT, "%s: metadata 'step' is %" PRId64 " but the directory is %s", m->source, step, base);
    return rt_ckpt_meta_check(m);
}

/* one optimizer state tensor: state.<param>.<buffer>, buffer one of bufs, <param> an F32
 * tensor of model.safetensors with the same shape */
static rt_status check_state_tensor(const ckpt_files *f, const rt_st_tensor *t, char bufs[][64], int nb) {
    const char *dot = strrchr(t->name, '.');
    char pname[256];
    bool ok = strncmp(t->name, "state.", 6) == 0 && dot && dot > t->name + 6;
    const rt_st_tensor *p = NULL;
    if (ok) {
        ok = false;
        for (int b = 0; b < nb; b++) ok |= strcmp(dot + 1, bufs[b]) == 0;
    }
    if (ok) {
        size_t len = (size_t)(dot - (t->name + 6));
        ok = len < sizeof pname;
        if (ok) {
            memcpy(pname, t->name + 6, len);
            pname[len] = 0;
            p = rt_safetensors_find(f->model, pname);
        }
    }
    if (!ok)
        RT_FAIL(RT_ERR_FORMAT,
                "%s: unexpected tensor '%s' (expected state.<parameter>.<buffer> with a buffer of 'optim.state')",
                f->train_path, t->name);
    bool same = p && p->dtype == RT_F32 && t->dtype == RT_F32 && p->ndim == t->ndim;
    for (int d = 0; same && d < t->ndim; d++) same = p->shape[d] == t->shape[d];
    if (!same)
        RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s' has no F32 parameter '%s' of the same shape in %s", f->train_path,
                t->name, pname, f->model_path);
    return RT_OK;
}

/* every tensor of train.safetensors is the state of a parameter (see check_state_tensor) */
static rt_status check_state_tensors(const ckpt_files *f) {
    char bufs[RT_OPTIM_MAX_STATE][64];
    int nb;
    RT_CHECK(split_list(&f->meta, "optim.state", bufs, RT_OPTIM_MAX_STATE, &nb));
    for (int i = 0; i < f->train->n; i++) RT_CHECK(check_state_tensor(f, &f->train->tensors[i], bufs, nb));
    return RT_OK;
}

/* Read and check everything that does not need a model; on success f holds both files. */
static rt_status verify_files(const char *path, ckpt_files *f) {
    memset(f, 0, sizeof *f);
    rt_ckpt_meta_init(&f->meta);
    RT_CHECK(locate_files(path, f));
    rt_status st;
    RT_CHECK_GOTO(read_train(f), st, fail);
    RT_CHECK_GOTO(check_format(&f->meta), st, fail);
    RT_CHECK_GOTO(check_fields(path, &f->meta), st, fail); /* before the data: an error names the field */
    RT_CHECK_GOTO(check_crcs(f), st, fail);
    RT_CHECK_GOTO(check_state_tensors(f), st, fail);
    return RT_OK;
fail:
    files_free(f);
    return st;
}

rt_status rt_ckpt_verify(const char *path, rt_ckpt_meta *meta) {
    if (meta) rt_ckpt_meta_init(meta);
    ckpt_files f;
    RT_CHECK(verify_files(path, &f));
    if (meta) {
        *meta = f.meta;
        rt_ckpt_meta_init(&f.meta);
    }
    files_free(&f);
    return RT_OK;
}

/* ---- writing ------------------------------------------------------------------------------ */

static bool is_reserved(const char *k) {
    for (size_t i = 0; i < N_RESERVED; i++)
        if (strcmp(k, k_reserved[i]) == 0) return true;
    return false;
}

/* remove .ckpt-*.tmp-<pid> directories of writers that no longer run */
/* A writer that died between its two renames (put_in_place without RENAME_EXCHANGE) left
 * DIR/.ckpt-aside-<name>.tmp-<pid> and no DIR/<name>: the aside is the only copy of
 * <name> (best/ has no other), so it is put back. Whether it was (false: remove it). */
static bool restore_aside(const char *dir, const char *entry, const char *t, const char *path) {
    static const char k_aside[] = ".ckpt-aside-";
    size_t len = (size_t)(t - entry);
    if (strncmp(entry, k_aside, sizeof k_aside - 1) != 0 || len <= sizeof k_aside - 1) return false;
    char name[256], target[RT_CKPT_PATH_MAX + 256];
    snprintf(name, sizeof name, "%.*s", (int)(len - (sizeof k_aside - 1)), entry + sizeof k_aside - 1);
    if (snprintf(target, sizeof target, "%s/%s", dir, name) >= (int)sizeof target) return false;
    struct stat sb;
    if (lstat(target, &sb) == 0 || errno != ENOENT) return false; /* <name> is there: the aside is old */
    if (rename(path, target) != 0) return false;
    RT_LOG_WARN("%s: put back from %s, left by a checkpoint writer that died while replacing it", target, entry);
    return true;
}

static void remove_stale_tmp(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, ".ckpt-", 6) != 0) continue;
        const char *t = strstr(e->d_name, ".tmp-");
        if (!t) continue;
        char *end;
        long pid = strtol(t + 5, &end, 10);
        if (*end || pid <= 0) continue;
        if (pid == (long)getpid() || !(kill((pid_t)pid, 0) != 0 && errno == ESRCH)) continue;
        char p[RT_CKPT_PATH_MAX + 256];
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
        if (!restore_aside(dir, e->d_name, t, p)) remove_tree(p);
    }
    closedir(d);
}

/* The step and run_id of checkpoint CKPT's train.safetensors from its header alone (no
 * tensor data read, no crc): run_id "" when it has none; false when the header cannot be
 * read (a corrupt or incomplete checkpoint; *step is then -1). Pruning uses it to pass
 * over other runs' checkpoints without reading them whole. */
static bool header_meta(const char *ckpt, int64_t *step, char *id_out, size_t n) {
    char p[RT_CKPT_PATH_MAX + 300];
    id_out[0] = '\0';
    *step = -1;
    if (snprintf(p, sizeof p, "%s/%s", ckpt, RT_CKPT_TRAIN_FILE) >= (int)sizeof p) return false;
    FILE *f = fopen(p, "rb");
    if (!f) return false;
    unsigned char lb[8];
    bool ok = fread(lb, 1, 8, f) == 8;
    uint64_t hlen = 0;
    for (int i = 7; ok && i >= 0; i--) hlen = hlen << 8 | lb[i];
    ok = ok && hlen > 0 && hlen <= (100u << 20);
    char *h = ok ? malloc((size_t)hlen) : NULL;
    ok = h && fread(h, 1, (size_t)hlen, f) == (size_t)hlen;
    fclose(f);
    json_t *j = ok ? json_loadb(h, (size_t)hlen, 0, NULL) : NULL;
    free(h);
    json_t *meta = json_object_get(j, "__metadata__");
    const char *id = json_string_value(json_object_get(meta, "run_id"));
    if (id) snprintf(id_out, n, "%s", id);
    const char *st = json_string_value(json_object_get(meta, "step"));
    uint64_t v;
    bool neg;
    bool good = j && st && parse_dec(st, false, &v, &neg) && v <= (uint64_t)INT64_MAX;
    if (good) *step = (int64_t)v;
    json_decref(j);
    return good;
}

rt_status rt_ckpt_peek(const char *path, int64_t *step, char *run_id, size_t n) {
    RT_REQUIRE(header_meta(path, step, run_id, n), RT_ERR_FORMAT,
               "%s/" RT_CKPT_TRAIN_FILE ": no readable header with a 'step' (not a complete checkpoint)", path);
    return RT_OK;
}

rt_status rt_ckpt_prune(const char *dir, int keep_last, int64_t keep_step, const char *run_id) {
    if (keep_last <= 0) return RT_OK;
    if (!run_id) run_id = "";
    ckpt_entry *v;
    int n;
    RT_CHECK(list_ckpts(dir, &v, &n));
    int kept = 0; /* valid checkpoints of this run, newest first */
    for (int i = 0; i < n; i++) {
        char p[RT_CKPT_PATH_MAX + 256];
        snprintf(p, sizeof p, "%s/%s", dir, v[i].name);
        if (v[i].step == keep_step) { /* just written and verified */
            kept++;
            continue;
        }
        /* another run's (by its header: not read whole) or unreadable: never removed here;
         * one without a run_id (older than the key) counts as this run's */
        char hid[64];
        int64_t hstep;
        if (!header_meta(p, &hstep, hid, sizeof hid) || (hid[0] && strcmp(hid, run_id) != 0)) continue;
        rt_ckpt_meta m;
        if (rt_ckpt_verify(p, &m) != RT_OK) { /* corrupt: neither counted nor removed */
            rt_error_clear();
            continue;
        }
        const char *id = rt_ckpt_meta_get(&m, "run_id");
        bool mine = !id || !*id || strcmp(id, run_id) == 0;
        rt_ckpt_meta_free(&m);
        if (!mine) continue;
        if (kept < keep_last) {
            kept++;
            continue;
        }
        /* rename aside first, so a crash mid-removal leaves no half checkpoint under a
         * name readers consider */
        char aside[RT_CKPT_PATH_MAX + 300];
        snprintf(aside, sizeof aside, "%s/.%s.tmp-%ld", dir, v[i].name, (long)getpid());
        if (rename(p, aside) == 0) remove_tree(aside);
    }
    free(v);
    return RT_OK;
}

rt_status rt_ckpt_count(const char *dir, int *n, char *newest, size_t newest_n) {
    ckpt_entry *v;
    RT_CHECK(list_ckpts(dir, &v, n));
    if (newest && newest_n) snprintf(newest, newest_n, "%s", *n ? v[0].name : "");
    free(v);
    return RT_OK;
}

/* The run_id of the newest readable checkpoint of v[0..n) (a folder's label), else the
 * UTC time */
static void aside_label(const char *dir, const ckpt_entry *v, int n, char *label, size_t label_n) {
    label[0] = '\0';
    for (int i = 0; i < n && !label[0]; i++) {
        char p[RT_CKPT_PATH_MAX + 256];
        snprintf(p, sizeof p, "%s/%s", dir, v[i].name);
        rt_ckpt_meta m;
        if (rt_ckpt_verify(p, &m) != RT_OK) {
            rt_error_clear();
            continue;
        }
        const char *id = rt_ckpt_meta_get(&m, "run_id");
        if (id && *id && strlen(id) < 40 && !strchr(id, '/') && id[0] != '.') snprintf(label, label_n, "%s", id);
        rt_ckpt_meta_free(&m);
    }
    if (!label[0]) {
        time_t t = time(NULL);
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(label, label_n, "%Y%m%d-%H%M%S", &tm);
    }
}

/* Move the checkpoints v[0..n) of DIR into a new folder DIR/<prefix><label><suffix>/
 * (label: aside_label; -1, -2, ... when taken), its path to aside_out; renames only. */
static rt_status move_into(const char *dir, const ckpt_entry *v, int n, const char *prefix, const char *suffix,
                           char *aside_out, size_t aside_n) {
    if (aside_out && aside_n) aside_out[0] = '\0';
    if (n == 0) return RT_OK;
    char label[64];
    aside_label(dir, v, n, label, sizeof label);
    char aside[RT_CKPT_PATH_MAX + 128];
    rt_status st = RT_OK;
    for (int k = 0;; k++) { /* a fresh folder: <prefix><label><suffix>, then -1, -2, ... */
        if (k == 0)
            snprintf(aside, sizeof aside, "%s/%s%s%s", dir, prefix, label, suffix);
        else
            snprintf(aside, sizeof aside, "%s/%s%s%s-%d", dir, prefix, label, suffix, k);
        if (mkdir(aside, 0755) == 0) break;
        if (errno != EEXIST || k > 1000) {
            st = RT_ERROR(RT_ERR_IO, "cannot create %s: %s", aside, strerror(errno));
            break;
        }
    }
    for (int i = 0; i < n && st == RT_OK; i++) {
        char from[RT_CKPT_PATH_MAX + 256], to[2 * RT_CKPT_PATH_MAX + 256];
        snprintf(from, sizeof from, "%s/%s", dir, v[i].name);
        snprintf(to, sizeof to, "%s/%s", aside, v[i].name);
        if (rename(from, to) != 0) st = RT_ERROR(RT_ERR_IO, "moving %s to %s: %s", from, to, strerror(errno));
    }
    if (st == RT_OK) st = fsync_path(aside, true);
    if (st == RT_OK) st = fsync_path(dir, true);
    if (st == RT_OK && aside_out) snprintf(aside_out, aside_n, "%s", aside);
    return st;
}

/* DIR/best/ (checkpoint.keep_best) joins v[0..*n) when its step is after `after`: it
 * belongs to the checkpoints being moved aside (a new run, or the branch a rollback
 * abandons), not to the run that goes on. lstat: a symlink is not ours. */
static rt_status add_best(const char *dir, int64_t after, ckpt_entry **v, int *n) {
    char p[RT_CKPT_PATH_MAX + 256];
    struct stat sb;
    snprintf(p, sizeof p, "%s/best", dir);
    if (lstat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) return RT_OK;
    int64_t step = INT64_MAX; /* unreadable: moved with them (nothing of the run going on) */
    rt_ckpt_meta m;
    rt_ckpt_meta_init(&m);
    const char *s = rt_ckpt_verify(p, &m) == RT_OK ? rt_ckpt_meta_get(&m, "step") : NULL;
    rt_error_clear();
    if (s) step = strtoll(s, NULL, 10);
    rt_ckpt_meta_free(&m);
    if (step <= after) return RT_OK;
    ckpt_entry *nv = realloc(*v, sizeof *nv * (size_t)(*n + 1));
    RT_CHECK_ALLOC(nv, sizeof *nv * (size_t)(*n + 1));
    *v = nv;
    nv[*n].step = step;
    snprintf(nv[*n].name, sizeof nv[*n].name, "best");
    (*n)++;
    return RT_OK;
}

rt_status rt_ckpt_move_aside(const char *dir, char *aside_out, size_t aside_n) {
    ckpt_entry *v;
    int n;
    RT_CHECK(list_ckpts(dir, &v, &n));
    rt_status st = add_best(dir, INT64_MIN, &v, &n);
    if (st == RT_OK) st = move_into(dir, v, n, "old-", "", aside_out, aside_n);
    free(v);
    return st;
}

/* The checkpoints of DIR a resume of checkpoint KEEP (step `step`) abandons, kept in
 * v[0..*n) newest first: every valid one of a later step, and one of the same step that is
 * not KEEP itself (a write of that step would replace it). One that would be refused is
 * not a branch (a restart past a corrupt newest checkpoint is no rollback). */
static rt_status list_abandoned(const char *dir, int64_t step, const char *keep, ckpt_entry **v, int *n) {
    RT_CHECK(list_ckpts(dir, v, n));
    struct stat ks;
    bool have_keep = stat(keep, &ks) == 0;
    int m = 0;
    for (int i = 0; i < *n; i++) {
        bool take = (*v)[i].step > step;
        if ((*v)[i].step == step) {
            char p[RT_CKPT_PATH_MAX + 256];
            struct stat sb;
            snprintf(p, sizeof p, "%s/%s", dir, (*v)[i].name);
            take = !have_keep || stat(p, &sb) != 0 || sb.st_dev != ks.st_dev || sb.st_ino != ks.st_ino;
        }
        if (take) { /* a checkpoint that would be refused is not a branch: it stays, as auto leaves it */
            char p[RT_CKPT_PATH_MAX + 256];
            snprintf(p, sizeof p, "%s/%s", dir, (*v)[i].name);
            rt_ckpt_meta meta;
            rt_ckpt_meta_init(&meta);
            if (rt_ckpt_verify(p, &meta) != RT_OK) {
                rt_error_clear();
                take = false;
            }
            rt_ckpt_meta_free(&meta);
        }
        if (take) (*v)[m++] = (*v)[i];
    }
    *n = m;
    return RT_OK;
}

rt_status rt_ckpt_count_abandoned(const char *dir, int64_t step, const char *keep, int *n, char *newest,
                                  size_t newest_n) {
    ckpt_entry *v;
    RT_CHECK(list_abandoned(dir, step, keep, &v, n));
    if (newest && newest_n) snprintf(newest, newest_n, "%s", *n ? v[0].name : "");
    free(v);
    return RT_OK;
}

rt_status rt_ckpt_abandon(const char *dir, int64_t step, const char *keep, int *n, char *aside_out, size_t aside_n) {
    ckpt_entry *v;
    RT_CHECK(list_abandoned(dir, step, keep, &v, n));
    char suffix[48];
    snprintf(suffix, sizeof suffix, "-from-%" PRId64, step);
    int listed = *n;
    rt_status st = *n ? add_best(dir, step, &v, n) : RT_OK; /* a best of the abandoned branch goes with it */
    if (st == RT_OK) st = move_into(dir, v, *n, "abandoned-", suffix, aside_out, aside_n);
    *n = listed; /* checkpoints moved (best/ is not one) */
    free(v);
    return st;
}

typedef struct optim_host {
    float *buf[RT_OPTIM_MAX_STATE];
    int n;
} optim_host;

/* train.safetensors' metadata: the module's keys, the caller's, then the crc32 of them
 * all (crc32.metadata, written last) */
static rt_status write_meta(rt_st_writer *w, rt_model *model, const rt_optimizer *opt, const rt_ckpt_meta *meta,
                            int64_t step, const char *list, const char *model_crc, const char *crc_s) {
    uint64_t counters[MAX_DROPOUT];
    int nc = rt_model_dropout_counters(model, counters, MAX_DROPOUT);
    RT_REQUIRE(nc <= MAX_DROPOUT, RT_ERR_INTERNAL, "checkpoint: %d dropout layers (at most %d)", nc, MAX_DROPOUT);
    char cl[MAX_DROPOUT * 24 + 1] = "";
    for (int i = 0; i < nc; i++)
        snprintf(cl + strlen(cl), sizeof cl - strlen(cl), i ? ",%" PRIu64 : "%" PRIu64, counters[i]);
    rt_ckpt_meta all;
    rt_ckpt_meta_init(&all);
    rt_status st = rt_ckpt_meta_set(&all, "format", RT_CKPT_FORMAT);
    if (st == RT_OK) st = rt_ckpt_meta_set_i64(&all, "format_version", RT_CKPT_FORMAT_VERSION);
    if (st == RT_OK) st = rt_ckpt_meta_set_i64(&all, "step", step);
    if (st == RT_OK) st = rt_ckpt_meta_set(&all, "model.arch", rt_model_arch_name(rt_model_config_of(model)->arch));
    if (st == RT_OK) st = rt_ckpt_meta_set(&all, "model.dropout_counters", cl);
    if (st == RT_OK) st = rt_ckpt_meta_set(&all, "optim.kind", opt ? rt_optim_kind_name(opt->cfg.kind) : "none");
    if (st == RT_OK) st = rt_ckpt_meta_set_i64(&all, "optim.steps", opt ? rt_optimizer_get_steps(opt) : (int64_t)0);
    if (st == RT_OK) st = rt_ckpt_meta_set(&all, "optim.state", list);
    if (st == RT_OK) st = rt_ckpt_meta_set(&all, "crc32.model", model_crc);
    if (st == RT_OK) st = rt_ckpt_meta_set(&all, "crc32.train", crc_s);
    for (int i = 0; st == RT_OK && i < meta->n; i++) st = rt_ckpt_meta_set(&all, meta->keys[i], meta->values[i]);
    if (st == RT_OK) st = rt_ckpt_meta_seal(&all);
    for (int i = 0; st == RT_OK && i < all.n; i++) st = rt_st_writer_meta(w, all.keys[i], all.values[i]);
    rt_ckpt_meta_free(&all);
    return st;
}

/* the train.safetensors writer: state tensors, metadata; *train_crc of its data */
static rt_status build_train(rt_st_writer *w, rt_model *model, const rt_optimizer *opt, optim_host *oh,
                             const rt_ckpt_meta *meta, int64_t step, const char *model_crc, uint32_t *train_crc) {
    char list[RT_OPTIM_MAX_STATE * 64 + 8] = "";
    uLong crc = crc32(0L, Z_NULL, 0);
    if (opt) {
        size_t arena = rt_model_params(model)->size;
        RT_REQUIRE(opt->n * sizeof(float) == arena, RT_ERR_INVALID,
                   "checkpoint: the optimizer covers %zu floats but the parameter arena holds %zu", opt->n,
                   arena / sizeof(float));
        int ns = rt_optimizer_state_count(opt);
        for (int b = 0; b < ns; b++) {
            rt_optim_state s;
            RT_CHECK(rt_optimizer_state_get(opt, b, &s));
            oh->buf[b] = malloc(opt->n * sizeof(float) + 1);
            RT_CHECK_ALLOC(oh->buf[b], opt->n * sizeof(float));
            oh->n = b + 1;
            RT_CHECK(rt_optimizer_state_save(opt, s.name, oh->buf[b], opt->n));
            if (b) strcat(list, ",");
            strncat(list, s.name, 63);
            for (int i = 0; i < rt_model_param_count(model); i++) {
                const rt_param *p = rt_model_param(model, i);
                if (!rt_param_trainable(p)) continue;
                char name[512];
                int l = snprintf(name, sizeof name, "state.%s.%s", p->name, s.name);
                RT_REQUIRE(l > 0 && (size_t)l < sizeof name, RT_ERR_INVALID, "checkpoint: name too long: %s", p->name);
                RT_CHECK(rt_st_writer_add(w, name, RT_F32, p->value.ndim, p->value.shape,
                                          oh->buf[b] + p->value.offset / sizeof(float)));
            }
        }
    }
    /* the crc of the data section as the writer will lay it out (the written directory
     * is verified before it is renamed into place) */
    rt_st_writer_each_data(w, crc_add, &crc);
    *train_crc = (uint32_t)crc;
    char crc_s[9];
    crc_str(*train_crc, crc_s);
    return write_meta(w, model, opt, meta, step, list, model_crc, crc_s);
}

/* move `tmp` to `final`; an existing `final` (same step written again) is swapped out
 * atomically where the file system can, else moved aside first */
static rt_status put_in_place(const char *dir, const char *tmp, const char *final, const char *name) {
    if (rename(tmp, final) == 0) return RT_OK;
    if (errno != ENOTEMPTY && errno != EEXIST) RT_FAIL(RT_ERR_IO, "rename %s -> %s: %s", tmp, final, strerror(errno));
#ifdef RENAME_EXCHANGE
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
        remove_tree(tmp); /* now the old one */
        return RT_OK;
    }
#endif
    char aside[RT_CKPT_PATH_MAX + 300];
    /* a crash before the second rename leaves this aside: the next write puts it back */
    snprintf(aside, sizeof aside, "%s/.ckpt-aside-%s.tmp-%ld", dir, name, (long)getpid());
    if (rename(final, aside) != 0) RT_FAIL(RT_ERR_IO, "rename %s -> %s: %s", final, aside, strerror(errno));
    if (rename(tmp, final) != 0) {
        int e = errno;
        rename(aside, final);
        RT_FAIL(RT_ERR_IO, "rename %s -> %s: %s", tmp, final, strerror(e));
    }
    remove_tree(aside);
    return RT_OK;
}

/* rt_ckpt_write into DIR/<name>/ (prune: then keep_last) */
static rt_status write_as(const char *dir, const char *name, int64_t step, rt_model *model, const rt_optimizer *opt,
                          const rt_ckpt_meta *meta, int keep_last, bool prune, char *path_out, size_t path_n);

rt_status rt_ckpt_write(const char *dir, int64_t step, rt_model *model, const rt_optimizer *opt,
                        const rt_ckpt_meta *meta, int keep_last, char *path_out, size_t path_n) {
    char name[64];
    rt_ckpt_dir_name(step, name, sizeof name);
    return write_as(dir, name, step, model, opt, meta, keep_last, true, path_out, path_n);
}

rt_status rt_ckpt_write_named(const char *dir, const char *name, int64_t step, rt_model *model, const rt_optimizer *opt,
                              const rt_ckpt_meta *meta, char *path_out, size_t path_n) {
    int64_t s;
    RT_REQUIRE(name && *name && name[0] != '.' && !strchr(name, '/') && !parse_ckpt_name(name, &s), RT_ERR_INVALID,
               "checkpoint name '%s': expected a plain folder name that is not ckpt-<step> (e.g. best)",
               name ? name : "(null)");
    return write_as(dir, name, step, model, opt, meta, 0, false, path_out, path_n);
}

static rt_status write_as(const char *dir, const char *name, int64_t step, rt_model *model, const rt_optimizer *opt,
                          const rt_ckpt_meta *meta, int keep_last, bool prune, char *path_out, size_t path_n) {
    RT_REQUIRE(dir && *dir && model && meta, RT_ERR_INVALID, "rt_ckpt_write: NULL argument");
    RT_REQUIRE(step >= 0, RT_ERR_INVALID, "checkpoint step %" PRId64 " (expected >= 0)", step);
    RT_REQUIRE(keep_last >= 0, RT_ERR_INVALID, "checkpoint keep_last %d (expected >= 0)", keep_last);
    for (int i = 0; i < meta->n; i++)
        RT_REQUIRE(!is_reserved(meta->keys[i]), RT_ERR_INVALID,
                   "checkpoint metadata key '%s' is written by the checkpoint module itself", meta->keys[i]);
    int64_t v;
    for (size_t i = 0; i < N_REQUIRED; i++) {
        rt_status s = rt_ckpt_meta_get_i64(meta, k_required[i], &v);
        RT_REQUIRE(s == RT_OK, RT_ERR_INVALID, "checkpoint metadata needs '%s' (an integer): %s", k_required[i],
                   rt_error_message());
    }
    char tmp[RT_CKPT_PATH_MAX], final[RT_CKPT_PATH_MAX], file[RT_CKPT_PATH_MAX + 32];
    /* .ckpt-<step>.tmp-<pid>, .ckpt-best.tmp-<pid>: remove_stale_tmp's names */
    int l1 = snprintf(tmp, sizeof tmp, "%s/.%s%s.tmp-%ld", dir, strncmp(name, "ckpt-", 5) == 0 ? "" : "ckpt-", name,
                      (long)getpid());
    int l2 = snprintf(final, sizeof final, "%s/%s", dir, name);
    RT_REQUIRE(l1 > 0 && (size_t)l1 < sizeof tmp && l2 > 0 && (size_t)l2 < sizeof final, RT_ERR_INVALID,
               "checkpoint path too long: %s", dir);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        RT_FAIL(RT_ERR_IO, "cannot create the checkpoint directory %s: %s", dir, strerror(errno));
    remove_tree(tmp); /* our own leftover of a failed attempt */
    if (mkdir(tmp, 0755) != 0) RT_FAIL(RT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));

    rt_status st = RT_OK;
    rt_st_writer *w = NULL;
    rt_safetensors *mf = NULL;
    optim_host oh = {0};
    char model_crc[9];
    uint32_t train_crc = 0;
    RT_CHECK_GOTO(join(file, sizeof file, tmp, RT_CKPT_MODEL_FILE), st, fail);
    RT_CHECK_GOTO(rt_model_save(model, file), st, fail); /* fsyncs the file */
    RT_CHECK_GOTO(rt_safetensors_read(file, &mf), st, fail);
    crc_str(data_crc(mf), model_crc);
    rt_safetensors_free(mf);
    mf = NULL;
    RT_CHECK_GOTO(rt_st_writer_create(&w), st, fail);
    RT_CHECK_GOTO(build_train(w, model, opt, &oh, meta, step, model_crc, &train_crc), st, fail);
    RT_CHECK_GOTO(join(file, sizeof file, tmp, RT_CKPT_TRAIN_FILE), st, fail);
    RT_CHECK_GOTO(rt_st_writer_write(w, file), st, fail);
    RT_CHECK_GOTO(fsync_path(tmp, true), st, fail);
    /* read it back as a reader will: nothing is renamed into place that would be refused */
    RT_CHECK_GOTO(rt_ckpt_verify(tmp, NULL), st, fail);
    RT_CHECK_GOTO(put_in_place(dir, tmp, final, name), st, fail);
    RT_CHECK_GOTO(fsync_path(dir, true), st, done);
    if (path_out) snprintf(path_out, path_n, "%s", final);
    if (prune) RT_CHECK_GOTO(rt_ckpt_prune(dir, keep_last, step, rt_ckpt_meta_get(meta, "run_id")), st, done);
    remove_stale_tmp(dir);
    goto done;
fail:
    remove_tree(tmp);
done:
    rt_st_writer_free(w);
    for (int b = 0; b < oh.n; b++) free(oh.buf[b]);
    return st;
}

/* ---- finding and loading ---------------------------------------------------------------- */

rt_status rt_ckpt_find(const char *dir, rt_ckpt_found *out) {
    memset(out, 0, sizeof *out);
    out->step = -1;
    ckpt_entry *v;
    int n;
    RT_CHECK(list_ckpts(dir, &v, &n));
    for (int i = 0; i < n; i++) {
        char p[RT_CKPT_PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", dir, v[i].name) >= (int)sizeof p) continue;
        if (rt_ckpt_verify(p, NULL) == RT_OK) {
            snprintf(out->path, sizeof out->path, "%s", p);
            out->step = v[i].step;
            int64_t hstep;
            header_meta(p, &hstep, out->run_id, sizeof out->run_id); /* just verified */
            free(v);
            return RT_OK;
        }
        if (out->n_skipped < RT_CKPT_MAX_SKIPPED) {
            rt_ckpt_skipped *s = &out->skipped[out->n_skipped++];
            snprintf(s->path, sizeof s->path, "%s", p);
            snprintf(s->reason, sizeof s->reason, "%s", rt_error_message());
        }
        out->n_skipped_total++;
    }
    free(v);
    if (n == 0) return RT_OK;
    char first[600];
    snprintf(first, sizeof first, "%s", out->n_skipped ? out->skipped[0].reason : "");
    RT_FAIL(RT_ERR_FORMAT, "none of the %d checkpoints in %s is valid (the newest: %s)", n, dir, first);
}

/* the model's weights and dropout counters from f (its architecture must match) */
static rt_status restore_model(const ckpt_files *f, rt_model *model) {
    const rt_ckpt_meta *m = &f->meta;
    const char *arch = rt_ckpt_meta_get(m, "model.arch");
    const char *mine = rt_model_arch_name(rt_model_config_of(model)->arch);
    if (strcmp(arch, mine) != 0)
        RT_FAIL(RT_ERR_INVALID, "%s: metadata 'model.arch' is \"%s\" but the model is %s", m->source, arch, mine);
    uint64_t counters[MAX_DROPOUT];
    int nc;
    RT_CHECK(parse_counters(m, counters, &nc));
    int have = rt_model_dropout_counters(model, NULL, 0);
    if (nc != have)
        RT_FAIL(RT_ERR_FORMAT, "%s: metadata 'model.dropout_counters' has %d counters, the model %d dropout layers",
                m->source, nc, have);
    RT_CHECK(rt_model_load(model, f->model_path));
    RT_CHECK(rt_model_set_dropout_counters(model, counters, nc));
    return RT_OK;
}

/* f's optimizer fields against opt: its kind, its size, its state buffers (bufs, *ns of
 * them, in opt's order) and the number of state tensors; *steps its step counter */
static rt_status check_optimizer(const ckpt_files *f, rt_model *model, const rt_optimizer *opt, char bufs[][64],
                                 int *ns, int64_t *steps) {
    const rt_ckpt_meta *m = &f->meta;
    const char *kind = rt_ckpt_meta_get(m, "optim.kind");
    if (strcmp(kind, rt_optim_kind_name(opt->cfg.kind)) != 0)
        RT_FAIL(RT_ERR_INVALID, "%s: metadata 'optim.kind' is \"%s\" but the optimizer is %s", m->source, kind,
                rt_optim_kind_name(opt->cfg.kind));
    if (opt->n * sizeof(float) != rt_model_params(model)->size)
        RT_FAIL(RT_ERR_INVALID, "rt_ckpt_load: the optimizer covers %zu floats, the parameter arena %zu", opt->n,
                rt_model_params(model)->size / sizeof(float));
    int nb;
    RT_CHECK(split_list(m, "optim.state", bufs, RT_OPTIM_MAX_STATE, &nb));
    *ns = rt_optimizer_state_count(opt);
    bool same = nb == *ns;
    for (int b = 0; same && b < *ns; b++) {
        rt_optim_state s;
        RT_CHECK(rt_optimizer_state_get(opt, b, &s));
        same = strcmp(s.name, bufs[b]) == 0;
    }
    if (!same)
        RT_FAIL(RT_ERR_INVALID, "%s: metadata 'optim.state' is \"%s\", which this optimizer's state does not match",
                m->source, rt_ckpt_meta_get(m, "optim.state"));
    RT_CHECK(rt_ckpt_meta_get_i64(m, "optim.steps", steps));
    int trainable = 0;
    for (int i = 0; i < rt_model_param_count(model); i++) trainable += rt_param_trainable(rt_model_param(model, i));
    if (f->train->n != trainable * *ns)
        RT_FAIL(RT_ERR_FORMAT, "%s: %d state tensors, expected %d (%d parameters x %d buffers)", f->train_path,
                f->train->n, trainable * *ns, trainable, *ns);
    return RT_OK;
}

/* each state buffer gathered from its per-parameter tensors into host (opt->n floats), then
 * handed to the optimizer */
static rt_status load_state_buffers(const ckpt_files *f, rt_model *model, rt_optimizer *opt, char bufs[][64], int ns,
                                    float *host) {
    for (int b = 0; b < ns; b++) {
        memset(host, 0, opt->n * sizeof(float));
        for (int i = 0; i < rt_model_param_count(model); i++) {
            const rt_param *p = rt_model_param(model, i);
            if (!rt_param_trainable(p)) continue;
            char name[512];
            snprintf(name, sizeof name, "state.%s.%s", p->name, bufs[b]);
            RT_CHECK(rt_safetensors_get(f->train, name, RT_F32, p->value.ndim, p->value.shape,
                                        host + p->value.offset / sizeof(float)));
        }
        RT_CHECK(rt_optimizer_state_load(opt, bufs[b], host, opt->n));
    }
    return RT_OK;
}

/* the optimizer's state buffers and step counter from f */
static rt_status restore_optimizer(const ckpt_files *f, rt_model *model, rt_optimizer *opt) {
    char bufs[RT_OPTIM_MAX_STATE][64];
    int ns = 0;
    int64_t steps = 0;
    RT_CHECK(check_optimizer(f, model, opt, bufs, &ns, &steps));
    float *host = calloc(opt->n + 1, sizeof(float));
    if (!host) RT_FAIL(RT_ERR_NOMEM, "out of memory (%zu floats)", opt->n);
    rt_status st = load_state_buffers(f, model, opt, bufs, ns, host);
    free(host);
    if (st != RT_OK) return st;
    RT_CHECK(rt_optimizer_set_steps(opt, steps));
    return RT_OK;
}

rt_status rt_ckpt_load(const char *path, rt_model *model, rt_optimizer *opt, rt_ckpt_meta *meta) {
    if (meta) rt_ckpt_meta_init(meta);
    RT_REQUIRE(model || !opt, RT_ERR_INVALID,
               "rt_ckpt_load: restoring an optimizer needs the model (its parameter table)");
    ckpt_files f;
    RT_CHECK(verify_files(path, &f));
    rt_status st = RT_OK;
    if (model) RT_CHECK_GOTO(restore_model(&f, model), st, done);
    if (opt) RT_CHECK_GOTO(restore_optimizer(&f, model, opt), st, done);
    if (meta) {
        *meta = f.meta;
        rt_ckpt_meta_init(&f.meta);
    }
done:
    files_free(&f);
    return st;
}
