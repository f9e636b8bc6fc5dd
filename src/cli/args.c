/* Command-line helpers; see args.h. */
#include "cli/args.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int rt_cli_opt(const char *prog, int argc, char **argv, int *i, const char *name, const char **val) {
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0) return 0;
    if (a[n] == '=') {
        *val = a + n + 1;
        return 1;
    }
    if (a[n] != '\0') return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "%s: %s needs a value (try --help)\n", prog, name);
        return -1;
    }
    *val = argv[++*i];
    return 1;
}

int rt_cli_flag(const char *prog, const char *arg, const char *name) {
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) return 0;
    if (arg[n] == '\0') return 1;
    if (arg[n] == '=') {
        fprintf(stderr, "%s: %s takes no value (got '%s')\n", prog, name, arg);
        return -1;
    }
    return 0;
}

int rt_cli_parse_i64(const char *text, int64_t lo, int64_t hi, int64_t *out) {
    if (!text) return -1;
    const char *d = text[0] == '-' ? text + 1 : text;
    if (*d < '0' || *d > '9') return -1; /* no spaces, '+', or empty text */
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end != '\0' || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int rt_cli_parse_int(const char *text, int lo, int hi, int *out) {
    int64_t v;
    if (rt_cli_parse_i64(text, lo, hi, &v) != 0) return -1;
    *out = (int)v;
    return 0;
}

int rt_cli_parse_double(const char *text, double lo, double hi, double *out) {
    if (!text) return -1;
    const char *d = text[0] == '-' ? text + 1 : text;
    if (!((*d >= '0' && *d <= '9') || (*d == '.' && d[1] >= '0' && d[1] <= '9'))) return -1;
    for (const char *p = d; *p; p++) /* decimal only: no hex floats, inf or nan */
        if (!strchr("0123456789.eE+-", *p)) return -1;
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno == ERANGE || end == text || *end != '\0' || !isfinite(v) || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int rt_cli_check_output(const char *prog, const char *opt, const char *path) {
    /* a few tries: ranks of one job may check the same path at once (one creates and
     * removes it while another finds it there) */
    for (int tries = 0; tries < 5; tries++) {
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NONBLOCK | O_CLOEXEC, 0644);
        if (fd >= 0) { /* it did not exist: leave nothing behind */
            close(fd);
            unlink(path);
            return 0;
        }
        if (errno != EEXIST) break;
        fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC); /* no O_TRUNC: not touched yet */
        if (fd >= 0) {
            struct stat sb;
            bool regular = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode);
            close(fd);
            if (regular) return 0;
            fprintf(stderr, "%s: %s %s: cannot write: not a regular file\n", prog, opt, path);
            return -1;
        }
        if (errno != ENOENT) break;
    }
    fprintf(stderr, "%s: %s %s: cannot write: %s\n", prog, opt, path, strerror(errno));
    return -1;
}

/* A size in bytes with an optional K/M/G suffix; at most 1 TiB (so the cast below is
 * defined: inf, nan and 1e30 are refused). */
int rt_cli_parse_size(const char *s, size_t *out) {
    char *end;
    if (!((*s >= '0' && *s <= '9') || *s == '.')) return -1; /* no spaces, signs, inf, nan */
    double v = strtod(s, &end);
    if (end == s || !(v >= 0 && v <= 1099511627776.0)) return -1;
    double mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1024, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1024.0 * 1024 * 1024, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end || v * mul > 1099511627776.0) return -1;
    *out = (size_t)(v * mul);
    return 0;
}
