/* safetensors reader and writer. The header JSON is parsed by jansson (as the reference
 * implementation parses it with serde_json: UTF-8 validated, duplicate keys refused);
 * the safetensors rules (dtypes, shapes, offsets, sizes) are checked here. See the
 * header for the format and for what is validated. */
#include "core/safetensors.h"

#include "core/file.h"
#include "core/names.h"

#include <jansson.h>
#include <stdbool.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER ((uint64_t)100 << 20) /* the reference implementation's limit */

static const struct {
    const char *name;
    rt_dtype dtype;
} k_st_dtypes[] = {{"F32", RT_F32}, {"F64", RT_F64}, {"I32", RT_I32}, {"I64", RT_I64}, {"U8", RT_U8}};

static const char *st_dtype_name(rt_dtype t) {
    for (size_t i = 0; i < sizeof k_st_dtypes / sizeof k_st_dtypes[0]; i++)
        if (k_st_dtypes[i].dtype == t) return k_st_dtypes[i].name;
    return NULL;
}

/* ---- header parsing (jansson) ---------------------------------------------------- */

/* `s` for an error message: control characters, DEL and NUL as \xNN (and with
 * `all_bytes`, every byte outside printable ASCII: jansson's error text may quote
 * bytes that are not UTF-8). Truncated to fit `out`. */
static const char *esc(const char *s, size_t len, bool all_bytes, char *out, size_t n) {
    size_t u = 0;
    for (size_t i = 0; i < len && u + 5 < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f || (all_bytes && c >= 0x80))
            u += (size_t)snprintf(out + u, n - u, "\\x%02x", c);
        else
            out[u++] = (char)c;
    }
    out[u] = '\0';
    return out;
}
#define ESC(s) esc((s), strlen(s), false, (char[160]){0}, 160)

static void free_st(rt_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n; i++) free(st->tensors[i].name);
    for (int i = 0; i < st->n_meta; i++) {
        free(st->meta_keys[i]);
        free(st->meta_values[i]);
    }
    free(st->tensors);
    free(st->meta_keys);
    free(st->meta_values);
    free(st->bytes);
    free(st);
}

void rt_safetensors_free(rt_safetensors *st) { free_st(st); }

static rt_status parse_metadata(const char *what, json_t *meta, rt_safetensors *st) {
    if (!json_is_object(meta))
        RT_FAIL(RT_ERR_FORMAT, "%s: __metadata__ must be an object of strings (a string -> string map)", what);
    size_t n = json_object_size(meta);
    st->meta_keys = calloc(n ? n : 1, sizeof *st->meta_keys);
    st->meta_values = calloc(n ? n : 1, sizeof *st->meta_values);
    if (!st->meta_keys || !st->meta_values) RT_FAIL(RT_ERR_NOMEM, "out of memory parsing %s", what);
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v) {
        if (!json_is_string(v))
            RT_FAIL(RT_ERR_FORMAT, "%s: __metadata__ values must be strings: \"%s\" is not", what, ESC(k));
        char *kk = strdup(k), *vv = strdup(json_string_value(v));
        if (!kk || !vv) {
            free(kk);
            free(vv);
            RT_FAIL(RT_ERR_NOMEM, "out of memory parsing %s", what);
        }
        st->meta_keys[st->n_meta] = kk;
        st->meta_values[st->n_meta] = vv;
        st->n_meta++;
    }
    return RT_OK;
}

/* a JSON array of at most `max` non-negative integers */
static rt_status uint_array(const char *what, const char *name, const char *field, json_t *a, uint64_t *vals, int max,
                            int *count) {
    if (!json_is_array(a)) RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s': '%s' must be an array", what, ESC(name), field);
    size_t n = json_array_size(a);
    if (n > (size_t)max)
        RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s': '%s' has more than %d elements", what, ESC(name), field, max);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(a, i);
        if (json_is_real(x))
            RT_FAIL(RT_ERR_FORMAT,
                    "%s: tensor '%s': '%s' element %zu: expected an integer, found a fraction or exponent", what,
                    ESC(name), field, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s': '%s' element %zu: expected a non-negative integer", what,
                    ESC(name), field, i);
        vals[i] = (uint64_t)json_integer_value(x);
    }
    *count = (int)n;
    return RT_OK;
}

static rt_status parse_tensor(const char *what, json_t *obj, rt_st_tensor *t) {
    const char *name = t->name;
    if (!json_is_object(obj))
        RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s' must be an object (with dtype, shape, data_offsets)", what, ESC(name));
    bool have_dtype = false, have_shape = false, have_off = false;
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        if (strcmp(key, "dtype") == 0) {
            if (!json_is_string(v)) RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s': dtype must be a string", what, ESC(name));
            const char *d = json_string_value(v);
            bool ok = false;
            for (size_t i = 0; i < sizeof k_st_dtypes / sizeof k_st_dtypes[0]; i++)
                if (strcmp(d, k_st_dtypes[i].name) == 0) {
                    t->dtype = k_st_dtypes[i].dtype;
                    ok = true;
                }
            if (!ok) {
                char list[64] = "";
                for (size_t i = 0; i < sizeof k_st_dtypes / sizeof k_st_dtypes[0]; i++)
                    rt_names_append(list, sizeof list, k_st_dtypes[i].name);
                RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s': dtype \"%s\" is not supported (expected %s)", what, ESC(name),
                        ESC(d), list);
            }
            have_dtype = true;
        } else if (strcmp(key, "shape") == 0) {
            uint64_t dims[RT_MAX_DIMS];
            RT_CHECK(uint_array(what, name, "shape", v, dims, RT_MAX_DIMS, &t->ndim));
            for (int d = 0; d < t->ndim; d++) t->shape[d] = (int64_t)dims[d]; /* jansson: at most INT64_MAX */
            have_shape = true;
        } else if (strcmp(key, "data_offsets") == 0) {
            uint64_t off[2];
            int cnt = 0;
            RT_CHECK(uint_array(what, name, "data_offsets", v, off, 2, &cnt));
            if (cnt != 2) RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s': data_offsets needs [begin, end]", what, ESC(name));
            if (off[0] > off[1]) RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s': data_offsets begin > end", what, ESC(name));
            if (off[1] > SIZE_MAX) RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s': data_offsets too large", what, ESC(name));
            t->begin = (size_t)off[0];
            t->end = (size_t)off[1];
            have_off = true;
        } else {
            RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s': unexpected field \"%s\" (expected dtype, shape, data_offsets)",
                    what, ESC(name), ESC(key));
        }
    }
    if (!have_dtype || !have_shape || !have_off)
        RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s' lacks %s", what, ESC(name),
                !have_dtype   ? "dtype"
                : !have_shape ? "shape"
                              : "data_offsets");
    return RT_OK;
}

static int cmp_begin(const void *a, const void *b) {
    const rt_st_tensor *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}
static int cmp_name(const void *a, const void *b) {
    return strcmp(((const rt_st_tensor *)a)->name, ((const rt_st_tensor *)b)->name);
}

/* The header JSON, by jansson: UTF-8 validated, duplicate keys refused at every level,
 * \u escapes (surrogate pairs included) decoded, \u0000 refused. */
static rt_status load_header(const char *what, const char *text, size_t len, json_t **out) {
    json_error_t err;
    *out = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (*out) return RT_OK;
    char msg[256], byte[64] = "";
    esc(err.text, strlen(err.text), true, msg, sizeof msg);
    /* jansson stops after the offending byte; a NUL or control character there is
     * named (escaped), as its own text may call a NUL "end of file" */
    for (long long at = (long long)err.position - 1; at <= (long long)err.position && !byte[0]; at++) {
        if (at < 0 || (size_t)at >= len) continue;
        unsigned char c = (unsigned char)text[at];
        if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f)
            snprintf(byte, sizeof byte, " (byte %lld is \\x%02x)", at + 8, c);
    }
    RT_FAIL(RT_ERR_FORMAT, "%s: header JSON at byte %lld (line %d, column %d): %s%s", what, (long long)err.position + 8,
            err.line, err.column, msg, byte);
}

static rt_status parse_tensors(rt_safetensors *st, json_t *root) {
    const char *what = st->path;
    if (!json_is_object(root)) RT_FAIL(RT_ERR_FORMAT, "%s: the header JSON must be an object", what);
    size_t n = json_object_size(root);
    st->tensors = calloc(n ? n : 1, sizeof *st->tensors);
    if (!st->tensors) RT_FAIL(RT_ERR_NOMEM, "out of memory parsing %s", what);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            RT_CHECK(parse_metadata(what, v, st));
            continue;
        }
        if (!*key) RT_FAIL(RT_ERR_FORMAT, "%s: a tensor has an empty name", what);
        rt_st_tensor *t = &st->tensors[st->n];
        memset(t, 0, sizeof *t);
        t->name = strdup(key);
        if (!t->name) RT_FAIL(RT_ERR_NOMEM, "out of memory parsing %s", what);
        st->n++;
        RT_CHECK(parse_tensor(what, v, t));
    }
    return RT_OK;
}

static rt_status parse_all(rt_safetensors *st) {
    const unsigned char *b = st->bytes;
    const char *what = st->path;
    if (st->size < 8)
        RT_FAIL(RT_ERR_FORMAT, "%s: %zu bytes, too short for a safetensors header length", what, st->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
    if (hlen > st->size - 8)
        RT_FAIL(RT_ERR_FORMAT, "%s: header length %llu is beyond the end of the file (%zu bytes)", what,
                (unsigned long long)hlen, st->size);
    if (hlen > ST_MAX_HEADER)
        RT_FAIL(RT_ERR_FORMAT, "%s: header length %llu exceeds the 100 MiB limit", what, (unsigned long long)hlen);
    if (hlen < 2)
        RT_FAIL(RT_ERR_FORMAT, "%s: header length %llu is too small for a JSON object", what, (unsigned long long)hlen);
    const size_t data_size = st->size - 8 - (size_t)hlen;
    const unsigned char *data = b + 8 + hlen;
    json_t *root = NULL;
    RT_CHECK(load_header(what, (const char *)b + 8, (size_t)hlen, &root));
    rt_status s = parse_tensors(st, root);
    json_decref(root);
    if (s != RT_OK) return s;
    /* sizes, ranges, overlaps */
    for (int i = 0; i < st->n; i++) {
        rt_st_tensor *t = &st->tensors[i];
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] && numel > UINT64_MAX / 16 / (uint64_t)t->shape[d])
                RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s': element count overflows", what, ESC(t->name));
            numel *= (uint64_t)t->shape[d];
        }
        uint64_t nbytes = numel * rt_dtype_size(t->dtype);
        if (t->end - t->begin != nbytes)
            RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s': data_offsets [%zu, %zu] hold %zu bytes but %s x shape needs %llu",
                    what, ESC(t->name), t->begin, t->end, t->end - t->begin, st_dtype_name(t->dtype),
                    (unsigned long long)nbytes);
        if (t->end > data_size)
            RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s': data_offsets end %zu is beyond the %zu data bytes", what,
                    ESC(t->name), t->end, data_size);
        t->data = data + t->begin;
    }
    if (st->n > 0) {
        qsort(st->tensors, (size_t)st->n, sizeof *st->tensors, cmp_begin);
        size_t pos = 0;
        for (int i = 0; i < st->n; i++) {
            const rt_st_tensor *t = &st->tensors[i];
            if (t->begin != pos)
                RT_FAIL(RT_ERR_FORMAT,
                        "%s: tensor '%s': data_offsets begin %zu, expected %zu (tensors must be "
                        "contiguous and not overlap)",
                        what, ESC(t->name), t->begin, pos);
            pos = t->end;
        }
        if (pos != data_size)
            RT_FAIL(RT_ERR_FORMAT, "%s: tensors cover %zu data bytes but the file holds %zu", what, pos, data_size);
        qsort(st->tensors, (size_t)st->n, sizeof *st->tensors, cmp_name);
    } else if (data_size != 0) {
        RT_FAIL(RT_ERR_FORMAT, "%s: no tensors but %zu data bytes", what, data_size);
    }
    return RT_OK;
}

rt_status rt_safetensors_parse(const void *buf, size_t len, const char *what, rt_safetensors **out) {
    *out = NULL;
    rt_safetensors *st = calloc(1, sizeof *st);
    RT_CHECK_ALLOC(st, sizeof *st);
    snprintf(st->path, sizeof st->path, "%s", what ? what : "(buffer)");
    st->bytes = malloc(len ? len : 1);
    if (!st->bytes) {
        free(st);
        RT_FAIL(RT_ERR_NOMEM, "out of memory (%zu bytes) for %s", len, what);
    }
    if (len) memcpy(st->bytes, buf, len);
    st->size = len;
    rt_status s = parse_all(st);
    if (s != RT_OK) {
        free_st(st);
        return s;
    }
    *out = st;
    return RT_OK;
}

rt_status rt_safetensors_read(const char *path, rt_safetensors **out) {
    *out = NULL;
    int fd;
    uint64_t size64;
    RT_CHECK(rt_file_open_regular(path, NULL, &fd, &size64)); /* never blocks on a FIFO */
    if (size64 > SIZE_MAX - 1) {
        close(fd);
        RT_FAIL(RT_ERR_IO, "%s: %llu bytes, too large", path, (unsigned long long)size64);
    }
    size_t size = (size_t)size64;
    /* the header length first: a header that runs past the end is refused unread */
    unsigned char hl[8];
    if (size >= 8) {
        rt_status s = rt_file_read_exact(fd, hl, 8, path);
        if (s != RT_OK) {
            close(fd);
            return s;
        }
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--) hlen = hlen << 8 | hl[i];
        if (hlen > size - 8 || hlen > ST_MAX_HEADER) {
            close(fd);
            RT_FAIL(RT_ERR_FORMAT, "%s: header length %llu is %s (%zu bytes)", path, (unsigned long long)hlen,
                    hlen > size - 8 ? "beyond the end of the file" : "above the 100 MiB limit for a file", size);
        }
    }
    char *buf = malloc(size ? size : 1);
    if (!buf) {
        close(fd);
        RT_FAIL(RT_ERR_NOMEM, "out of memory (%zu bytes) reading %s", size, path);
    }
    size_t got = size >= 8 ? 8 : 0;
    if (got) memcpy(buf, hl, 8);
    rt_status s = rt_file_read_exact(fd, buf + got, size - got, path);
    close(fd);
    if (s != RT_OK) {
        free(buf);
        return s;
    }
    rt_safetensors *st = calloc(1, sizeof *st);
    if (!st) {
        free(buf);
        RT_FAIL(RT_ERR_NOMEM, "out of memory");
    }
    snprintf(st->path, sizeof st->path, "%s", path);
    st->bytes = buf;
    st->size = size;
    s = parse_all(st);
    if (s != RT_OK) {
        free_st(st);
        return s;
    }
    *out = st;
    return RT_OK;
}

const rt_st_tensor *rt_safetensors_find(const rt_safetensors *st, const char *name) {
    int lo = 0, hi = st->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (c == 0) return &st->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

const char *rt_safetensors_meta(const rt_safetensors *st, const char *key) {
    for (int i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta_keys[i], key) == 0) return st->meta_values[i];
    return NULL;
}

static void shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t u = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && u < n; i++)
        u += (size_t)snprintf(buf + u, n - u, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (u < n) snprintf(buf + u, n - u, "]");
}

rt_status rt_safetensors_get(const rt_safetensors *st, const char *name, rt_dtype dtype, int ndim, const int64_t *shape,
                             void *dst) {
    const rt_st_tensor *t = rt_safetensors_find(st, name);
    if (!t) RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s' is missing", st->path, name);
    if (t->dtype != dtype)
        RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected %s", st->path, name, st_dtype_name(t->dtype),
                st_dtype_name(dtype) ? st_dtype_name(dtype) : "?");
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char a[160], b[160];
        shape_str(t->ndim, t->shape, a, sizeof a);
        shape_str(ndim, shape, b, sizeof b);
        RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s", st->path, name, a, b);
    }
    if (t->end > t->begin) memcpy(dst, t->data, t->end - t->begin);
    return RT_OK;
}

/* ---- writer ------------------------------------------------------------------------ */

typedef struct st_item {
    char *name;
    rt_dtype dtype;
    int ndim;
    int64_t shape[RT_MAX_DIMS];
    const void *data;
    size_t nbytes;
} st_item;

struct rt_st_writer {
    st_item *items;
    int n;
    char **keys, **values;
    int n_meta;
};

rt_status rt_st_writer_create(rt_st_writer **out) {
    *out = calloc(1, sizeof **out);
    RT_CHECK_ALLOC(*out, sizeof **out);
    return RT_OK;
}

void rt_st_writer_free(rt_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->items[i].name);
    for (int i = 0; i < w->n_meta; i++) {
        free(w->keys[i]);
        free(w->values[i]);
    }
    free(w->items);
    free(w->keys);
    free(w->values);
    free(w);
}

rt_status rt_st_writer_add(rt_st_writer *w, const char *name, rt_dtype dtype, int ndim, const int64_t *shape,
                           const void *data) {
    RT_REQUIRE(name && *name && strcmp(name, "__metadata__") != 0, RT_ERR_INVALID, "safetensors: bad tensor name");
    RT_REQUIRE(st_dtype_name(dtype) != NULL, RT_ERR_INVALID, "safetensors: tensor '%s': unsupported dtype %d", name,
               (int)dtype);
    for (int i = 0; i < w->n; i++)
        RT_REQUIRE(strcmp(w->items[i].name, name) != 0, RT_ERR_INVALID, "safetensors: tensor '%s' added twice", name);
    rt_tensor desc;
    RT_CHECK(rt_tensor_init(&desc, dtype, ndim, shape, rt_device_cpu()));
    st_item *ni = realloc(w->items, sizeof *ni * (size_t)(w->n + 1));
    RT_CHECK_ALLOC(ni, sizeof *ni * (size_t)(w->n + 1));
    w->items = ni;
    st_item *it = &w->items[w->n];
    it->name = strdup(name);
    RT_CHECK_ALLOC(it->name, strlen(name));
    it->dtype = dtype;
    it->ndim = ndim;
    for (int i = 0; i < ndim; i++) it->shape[i] = shape[i];
    it->data = data;
    it->nbytes = rt_tensor_nbytes(&desc);
    RT_REQUIRE(data || it->nbytes == 0, RT_ERR_INVALID, "safetensors: tensor '%s' has no data", name);
    w->n++;
    return RT_OK;
}

rt_status rt_st_writer_meta(rt_st_writer *w, const char *key, const char *value) {
    RT_REQUIRE(key && value, RT_ERR_INVALID, "safetensors: NULL metadata key or value");
    char **nk = realloc(w->keys, sizeof *nk * (size_t)(w->n_meta + 1));
    RT_CHECK_ALLOC(nk, 0);
    w->keys = nk;
    char **nv = realloc(w->values, sizeof *nv * (size_t)(w->n_meta + 1));
    RT_CHECK_ALLOC(nv, 0);
    w->values = nv;
    w->keys[w->n_meta] = strdup(key);
    w->values[w->n_meta] = strdup(value);
    if (!w->keys[w->n_meta] || !w->values[w->n_meta]) {
        free(w->keys[w->n_meta]);
        free(w->values[w->n_meta]);
        RT_FAIL(RT_ERR_NOMEM, "out of memory");
    }
    w->n_meta++;
    return RT_OK;
}

/* growable text buffer */
typedef struct sbuf {
    char *s;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_putn(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->oom = true;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}
static void sb_puts(sbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }
static void sb_printf(sbuf *b, const char *fmt, unsigned long long v) {
    char t[32];
    int n = snprintf(t, sizeof t, fmt, v);
    sb_putn(b, t, (size_t)n);
}
static void sb_json_string(sbuf *b, const char *s) {
    sb_puts(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_putn(b, e, 2);
        } else if (c < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", c);
            sb_puts(b, e);
        } else {
            sb_putn(b, (const char *)&c, 1);
        }
    }
    sb_puts(b, "\"");
}

static int cmp_item(const void *a, const void *b) {
    return strcmp(((const st_item *)a)->name, ((const st_item *)b)->name);
}

void rt_st_writer_each_data(rt_st_writer *w, void (*fn)(void *user, const void *data, size_t n), void *user) {
    qsort(w->items, (size_t)w->n, sizeof *w->items, cmp_item); /* as rt_st_writer_write */
    for (int i = 0; i < w->n; i++) fn(user, w->items[i].data, w->items[i].nbytes);
}

static rt_status write_all(int fd, const void *p, size_t n, const char *path) {
    const char *c = p;
    while (n) {
        ssize_t r = write(fd, c, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) RT_FAIL(RT_ERR_IO, "writing %s: %s", path, strerror(errno));
        c += r;
        n -= (size_t)r;
    }
    return RT_OK;
}

rt_status rt_st_writer_write(rt_st_writer *w, const char *path) {
    qsort(w->items, (size_t)w->n, sizeof *w->items, cmp_item);
    sbuf b = {0};
    sb_puts(&b, "{");
    bool first = true;
    if (w->n_meta) {
        sb_puts(&b, "\"__metadata__\":{");
        for (int i = 0; i < w->n_meta; i++) {
            if (i) sb_puts(&b, ",");
            sb_json_string(&b, w->keys[i]);
            sb_puts(&b, ":");
            sb_json_string(&b, w->values[i]);
        }
        sb_puts(&b, "}");
        first = false;
    }
    size_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const st_item *it = &w->items[i];
        if (!first) sb_puts(&b, ",");
        first = false;
        sb_json_string(&b, it->name);
        sb_puts(&b, ":{\"dtype\":\"");
        sb_puts(&b, st_dtype_name(it->dtype));
        sb_puts(&b, "\",\"shape\":[");
        for (int d = 0; d < it->ndim; d++) sb_printf(&b, d ? ",%llu" : "%llu", (unsigned long long)it->shape[d]);
        sb_puts(&b, "],\"data_offsets\":[");
        sb_printf(&b, "%llu", (unsigned long long)off);
        sb_printf(&b, ",%llu", (unsigned long long)(off + it->nbytes));
        sb_puts(&b, "]}");
        off += it->nbytes;
    }
    sb_puts(&b, "}");
    while (!b.oom && b.len % 8) sb_puts(&b, " "); /* pad: data starts 8-byte aligned */
    if (b.oom) {
        free(b.s);
        RT_FAIL(RT_ERR_NOMEM, "out of memory writing the header of %s", path);
    }
    char tmp[4096];
    int tl = snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (tl < 0 || (size_t)tl >= sizeof tmp) {
        free(b.s);
        RT_FAIL(RT_ERR_INVALID, "path too long: %s", path);
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        free(b.s);
        RT_FAIL(RT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    }
    unsigned char hl[8];
    for (int i = 0; i < 8; i++) hl[i] = (unsigned char)((uint64_t)b.len >> (8 * i));
    rt_status s = write_all(fd, hl, 8, tmp);
    if (s == RT_OK) s = write_all(fd, b.s, b.len, tmp);
    for (int i = 0; i < w->n && s == RT_OK; i++) s = write_all(fd, w->items[i].data, w->items[i].nbytes, tmp);
    free(b.s);
    if (s == RT_OK && fsync(fd) != 0) s = RT_ERROR(RT_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && s == RT_OK) s = RT_ERROR(RT_ERR_IO, "close %s: %s", tmp, strerror(errno));
    if (s == RT_OK && rename(tmp, path) != 0)
        s = RT_ERROR(RT_ERR_IO, "rename %s -> %s: %s", tmp, path, strerror(errno));
    if (s != RT_OK) unlink(tmp);
    return s;
}
