/* safetensors reader and writer, with a small JSON parser for exactly this header
 * schema (objects, strings, non-negative integers, arrays of them). See the header
 * for the format and for what is validated. */
#include "core/safetensors.h"

#include "core/names.h"

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

/* ---- JSON parsing ---------------------------------------------------------------- */

typedef struct jp {
    const char *s;
    size_t n, i;
    const char *what; /* file name */
} jp;

#define JFAIL(p, ...)                                                                                                  \
    do {                                                                                                               \
        char m_[256];                                                                                                  \
        snprintf(m_, sizeof m_, __VA_ARGS__);                                                                          \
        return RT_ERROR(RT_ERR_FORMAT, "%s: header JSON at byte %zu: %s", (p)->what, (p)->i + 8, m_);                  \
    } while (0)

static void ws(jp *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) p->i++;
}

static rt_status expect(jp *p, char c) {
    ws(p);
    if (p->i >= p->n) JFAIL(p, "expected '%c', found the end of the header", c);
    if (p->s[p->i] != c) JFAIL(p, "expected '%c', found '%c'", c, p->s[p->i]);
    p->i++;
    return RT_OK;
}

static bool peek(jp *p, char c) {
    ws(p);
    return p->i < p->n && p->s[p->i] == c;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* a JSON string into a new malloc'd, NUL-terminated UTF-8 string (no embedded NULs) */
static rt_status parse_string(jp *p, char **out) {
    *out = NULL;
    RT_CHECK(expect(p, '"'));
    size_t cap = 16, len = 0;
    char *buf = malloc(cap);
    RT_CHECK_ALLOC(buf, cap);
    for (;;) {
        if (p->i >= p->n) {
            free(buf);
            JFAIL(p, "unterminated string");
        }
        unsigned char c = (unsigned char)p->s[p->i++];
        uint32_t cp;
        if (c == '"') break;
        if (c < 0x20) {
            free(buf);
            JFAIL(p, "control character 0x%02x in a string", c);
        }
        if (c == '\\') {
            if (p->i >= p->n) {
                free(buf);
                JFAIL(p, "unterminated escape");
            }
            char e = p->s[p->i++];
            switch (e) {
            case '"':
                cp = '"';
                break;
            case '\\':
                cp = '\\';
                break;
            case '/':
                cp = '/';
                break;
            case 'b':
                cp = '\b';
                break;
            case 'f':
                cp = '\f';
                break;
            case 'n':
                cp = '\n';
                break;
            case 'r':
                cp = '\r';
                break;
            case 't':
                cp = '\t';
                break;
            case 'u': {
                if (p->n - p->i < 4) {
                    free(buf);
                    JFAIL(p, "truncated \\u escape");
                }
                cp = 0;
                for (int k = 0; k < 4; k++) {
                    int h = hexval(p->s[p->i + k]);
                    if (h < 0) {
                        free(buf);
                        JFAIL(p, "bad hex digit in \\u escape");
                    }
                    cp = cp * 16 + (uint32_t)h;
                }
                p->i += 4;
                if (cp == 0 || (cp >= 0xD800 && cp <= 0xDFFF)) {
                    free(buf);
                    JFAIL(p, "\\u%04x is not allowed in a name (NUL or surrogate)", (unsigned)cp);
                }
                break;
            }
            default:
                free(buf);
                JFAIL(p, "unknown escape '\\%c'", e);
            }
        } else {
            cp = c; /* raw byte (UTF-8 passes through) */
        }
        if (len + 5 > cap) {
            cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                RT_FAIL(RT_ERR_NOMEM, "out of memory parsing %s", p->what);
            }
            buf = nb;
        }
        if (c == '\\' && cp >= 0x80) {
            if (cp < 0x800) {
                buf[len++] = (char)(0xC0 | (cp >> 6));
                buf[len++] = (char)(0x80 | (cp & 0x3F));
            } else {
                buf[len++] = (char)(0xE0 | (cp >> 12));
                buf[len++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                buf[len++] = (char)(0x80 | (cp & 0x3F));
            }
        } else {
            buf[len++] = (char)cp;
        }
    }
    buf[len] = 0;
    *out = buf;
    return RT_OK;
}

static rt_status parse_uint(jp *p, uint64_t *out) {
    ws(p);
    size_t start = p->i;
    uint64_t v = 0;
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') JFAIL(p, "expected a non-negative integer");
    if (p->s[p->i] == '0' && p->i + 1 < p->n && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9')
        JFAIL(p, "leading zero in an integer");
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        uint64_t d = (uint64_t)(p->s[p->i] - '0');
        if (v > (UINT64_MAX - d) / 10) {
            p->i = start;
            JFAIL(p, "integer too large");
        }
        v = v * 10 + d;
        p->i++;
    }
    if (p->i < p->n && (p->s[p->i] == '.' || p->s[p->i] == 'e' || p->s[p->i] == 'E'))
        JFAIL(p, "expected an integer, found a fraction or exponent");
    *out = v;
    return RT_OK;
}

/* [u, u, ...] with at most `max` elements */
static rt_status parse_uint_array(jp *p, uint64_t *vals, int max, int *count, const char *field) {
    RT_CHECK(expect(p, '['));
    *count = 0;
    if (peek(p, ']')) {
        p->i++;
        return RT_OK;
    }
    for (;;) {
        if (*count >= max) JFAIL(p, "'%s' has more than %d elements", field, max);
        RT_CHECK(parse_uint(p, &vals[(*count)++]));
        if (peek(p, ',')) {
            p->i++;
            continue;
        }
        RT_CHECK(expect(p, ']'));
        return RT_OK;
    }
}

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

static rt_status parse_metadata(jp *p, rt_safetensors *st) {
    RT_CHECK(expect(p, '{'));
    if (peek(p, '}')) {
        p->i++;
        return RT_OK;
    }
    for (;;) {
        char *k = NULL, *v = NULL;
        RT_CHECK(parse_string(p, &k));
        rt_status s = expect(p, ':');
        if (s == RT_OK) {
            if (!peek(p, '"')) {
                free(k);
                JFAIL(p, "__metadata__ values must be strings");
            }
            s = parse_string(p, &v);
        }
        if (s != RT_OK) {
            free(k);
            return s;
        }
        char **nk = realloc(st->meta_keys, sizeof *nk * (size_t)(st->n_meta + 1));
        if (nk) st->meta_keys = nk;
        char **nv = nk ? realloc(st->meta_values, sizeof *nv * (size_t)(st->n_meta + 1)) : NULL;
        if (nv) st->meta_values = nv;
        if (!nk || !nv) {
            free(k);
            free(v);
            RT_FAIL(RT_ERR_NOMEM, "out of memory parsing %s", p->what);
        }
        st->meta_keys[st->n_meta] = k;
        st->meta_values[st->n_meta] = v;
        st->n_meta++;
        if (peek(p, ',')) {
            p->i++;
            continue;
        }
        return expect(p, '}');
    }
}

static rt_status parse_tensor(jp *p, rt_st_tensor *t) {
    bool have_dtype = false, have_shape = false, have_off = false;
    RT_CHECK(expect(p, '{'));
    if (peek(p, '}')) JFAIL(p, "tensor '%s' has no fields (needs dtype, shape, data_offsets)", t->name);
    for (;;) {
        char *key = NULL;
        RT_CHECK(parse_string(p, &key));
        rt_status s = expect(p, ':');
        if (s != RT_OK) {
            free(key);
            return s;
        }
        if (strcmp(key, "dtype") == 0 && !have_dtype) {
            free(key);
            char *d = NULL;
            RT_CHECK(parse_string(p, &d));
            bool ok = false;
            for (size_t i = 0; i < sizeof k_st_dtypes / sizeof k_st_dtypes[0]; i++)
                if (strcmp(d, k_st_dtypes[i].name) == 0) {
                    t->dtype = k_st_dtypes[i].dtype;
                    ok = true;
                }
            if (!ok) {
                char dn[32], list[64] = "";
                snprintf(dn, sizeof dn, "%s", d);
                free(d);
                for (size_t i = 0; i < sizeof k_st_dtypes / sizeof k_st_dtypes[0]; i++)
                    rt_names_append(list, sizeof list, k_st_dtypes[i].name);
                JFAIL(p, "tensor '%s': dtype \"%s\" is not supported (expected %s)", t->name, dn, list);
            }
            free(d);
            have_dtype = true;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            free(key);
            uint64_t dims[RT_MAX_DIMS];
            RT_CHECK(parse_uint_array(p, dims, RT_MAX_DIMS, &t->ndim, "shape"));
            for (int d = 0; d < t->ndim; d++) {
                if (dims[d] > (uint64_t)INT64_MAX) JFAIL(p, "tensor '%s': dimension too large", t->name);
                t->shape[d] = (int64_t)dims[d];
            }
            have_shape = true;
        } else if (strcmp(key, "data_offsets") == 0 && !have_off) {
            free(key);
            uint64_t off[2];
            int cnt = 0;
            RT_CHECK(parse_uint_array(p, off, 2, &cnt, "data_offsets"));
            if (cnt != 2) JFAIL(p, "tensor '%s': data_offsets needs [begin, end]", t->name);
            if (off[0] > off[1]) JFAIL(p, "tensor '%s': data_offsets begin > end", t->name);
            if (off[1] > SIZE_MAX) JFAIL(p, "tensor '%s': data_offsets too large", t->name);
            t->begin = (size_t)off[0];
            t->end = (size_t)off[1];
            have_off = true;
        } else {
            char kn[64];
            snprintf(kn, sizeof kn, "%s", key);
            free(key);
            JFAIL(p, "tensor '%s': unexpected or repeated field \"%s\"", t->name, kn);
        }
        if (peek(p, ',')) {
            p->i++;
            continue;
        }
        RT_CHECK(expect(p, '}'));
        break;
    }
    if (!have_dtype || !have_shape || !have_off)
        JFAIL(p, "tensor '%s' lacks %s", t->name, !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");
    return RT_OK;
}

static int cmp_begin(const void *a, const void *b) {
    const rt_st_tensor *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}
static int cmp_name(const void *a, const void *b) {
    return strcmp(((const rt_st_tensor *)a)->name, ((const rt_st_tensor *)b)->name);
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
    jp p = {.s = (const char *)b + 8, .n = (size_t)hlen, .i = 0, .what = what};
    const size_t data_size = st->size - 8 - (size_t)hlen;
    const unsigned char *data = b + 8 + hlen;
    RT_CHECK(expect(&p, '{'));
    bool first = true, have_meta = false;
    while (!peek(&p, '}')) {
        if (!first) RT_CHECK(expect(&p, ','));
        first = false;
        char *name = NULL;
        RT_CHECK(parse_string(&p, &name));
        rt_status s = expect(&p, ':');
        if (s != RT_OK) {
            free(name);
            return s;
        }
        if (strcmp(name, "__metadata__") == 0) {
            free(name);
            if (have_meta) JFAIL(&p, "__metadata__ appears twice");
            have_meta = true;
            RT_CHECK(parse_metadata(&p, st));
            continue;
        }
        rt_st_tensor *nt = realloc(st->tensors, sizeof *nt * (size_t)(st->n + 1));
        if (!nt) {
            free(name);
            RT_FAIL(RT_ERR_NOMEM, "out of memory parsing %s", what);
        }
        st->tensors = nt;
        rt_st_tensor *t = &st->tensors[st->n++];
        memset(t, 0, sizeof *t);
        t->name = name;
        RT_CHECK(parse_tensor(&p, t));
    }
    p.i++; /* '}' */
    ws(&p);
    if (p.i != p.n) JFAIL(&p, "unexpected bytes after the header object");
    /* sizes, ranges, overlaps */
    for (int i = 0; i < st->n; i++) {
        rt_st_tensor *t = &st->tensors[i];
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] && numel > UINT64_MAX / 16 / (uint64_t)t->shape[d])
                RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s': element count overflows", what, t->name);
            numel *= (uint64_t)t->shape[d];
        }
        uint64_t nbytes = numel * rt_dtype_size(t->dtype);
        if (t->end - t->begin != nbytes)
            RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s': data_offsets [%zu, %zu] hold %zu bytes but %s x shape needs %llu",
                    what, t->name, t->begin, t->end, t->end - t->begin, st_dtype_name(t->dtype),
                    (unsigned long long)nbytes);
        if (t->end > data_size)
            RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s': data_offsets end %zu is beyond the %zu data bytes", what, t->name,
                    t->end, data_size);
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
                        what, t->name, t->begin, pos);
            pos = t->end;
        }
        if (pos != data_size)
            RT_FAIL(RT_ERR_FORMAT, "%s: tensors cover %zu data bytes but the file holds %zu", what, pos, data_size);
        qsort(st->tensors, (size_t)st->n, sizeof *st->tensors, cmp_name);
        for (int i = 1; i < st->n; i++)
            if (strcmp(st->tensors[i - 1].name, st->tensors[i].name) == 0)
                RT_FAIL(RT_ERR_FORMAT, "%s: tensor '%s' appears twice", what, st->tensors[i].name);
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
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) RT_FAIL(RT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        RT_FAIL(RT_ERR_IO, "%s is not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    char *buf = malloc(size ? size : 1);
    if (!buf) {
        close(fd);
        RT_FAIL(RT_ERR_NOMEM, "out of memory (%zu bytes) reading %s", size, path);
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            free(buf);
            close(fd);
            RT_FAIL(RT_ERR_IO, "reading %s at byte %zu: %s", path, got, r == 0 ? "unexpected end" : strerror(e));
        }
        got += (size_t)r;
    }
    close(fd);
    rt_safetensors *st = calloc(1, sizeof *st);
    if (!st) {
        free(buf);
        RT_FAIL(RT_ERR_NOMEM, "out of memory");
    }
    snprintf(st->path, sizeof st->path, "%s", path);
    st->bytes = buf;
    st->size = size;
    rt_status s = parse_all(st);
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
