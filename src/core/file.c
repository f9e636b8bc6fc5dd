/* Opening regular files without blocking; see file.h. */
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *kind_of(mode_t m) {
    if (S_ISDIR(m)) return "is a directory";
    if (S_ISFIFO(m)) return "is a FIFO (named pipe)";
    if (S_ISCHR(m)) return "is a device (character special file)";
    if (S_ISBLK(m)) return "is a device (block special file)";
    if (S_ISSOCK(m)) return "is a socket";
    return "is not a regular file";
}

rt_status rt_file_open_regular(const char *path, const char *what, int *fd, uint64_t *size) {
    *fd = -1;
    if (size) *size = 0;
    const char *pre = what ? what : "", *sep = what ? " " : "";
    if (!path || !*path) RT_FAIL(RT_ERR_IO, "%s%sempty path", pre, what ? ": " : "");
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (f < 0) {
        int e = errno;
        const char *extra = "";
        struct stat lsb;
        if (e == ENOENT && lstat(path, &lsb) == 0 && S_ISLNK(lsb.st_mode)) extra = " (a dangling symbolic link)";
        RT_FAIL(RT_ERR_IO, "%s%s%s: %s%s", pre, sep, path, strerror(e), extra);
    }
    struct stat sb;
    if (fstat(f, &sb) != 0) {
        int e = errno;
        close(f);
        RT_FAIL(RT_ERR_IO, "%s%s%s: cannot stat: %s", pre, sep, path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(f);
        RT_FAIL(RT_ERR_IO, "%s%s%s %s, not a regular file", pre, sep, path, kind_of(sb.st_mode));
    }
    int fl = fcntl(f, F_GETFL);
    if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(f);
        RT_FAIL(RT_ERR_IO, "%s%s%s: fcntl: %s", pre, sep, path, strerror(e));
    }
    *fd = f;
    if (size) *size = (uint64_t)sb.st_size;
    return RT_OK;
}

rt_status rt_file_read_exact(int fd, void *buf, size_t n, const char *path) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) RT_FAIL(RT_ERR_IO, "%s: read error at byte %zu: %s", path, got, strerror(errno));
        if (r == 0)
            RT_FAIL(RT_ERR_IO, "%s: the file ended at byte %zu, expected %zu bytes (changed while read?)", path, got,
                    n);
        got += (size_t)r;
    }
    return RT_OK;
}

rt_status rt_file_read_all(const char *path, const char *what, size_t max_size, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    int fd;
    uint64_t size;
    RT_CHECK(rt_file_open_regular(path, what, &fd, &size));
    if (size > max_size) {
        close(fd);
        RT_FAIL(RT_ERR_IO, "%s%s%s: %llu bytes, more than the %zu-byte limit", what ? what : "", what ? " " : "", path,
                (unsigned long long)size, max_size);
    }
    char *buf = malloc((size_t)size + 1);
    if (!buf) {
        close(fd);
        RT_FAIL(RT_ERR_NOMEM, "%s: out of memory (%llu bytes)", path, (unsigned long long)size);
    }
    rt_status st = rt_file_read_exact(fd, buf, (size_t)size, path);
    close(fd);
    if (st != RT_OK) {
        free(buf);
        return st;
    }
    buf[size] = '\0';
    *out = buf;
    *len = (size_t)size;
    return RT_OK;
}

rt_status rt_file_mkdirs(const char *path, const char *what) {
    char buf[4096];
    size_t n = strlen(path);
    RT_REQUIRE(n > 0 && n < sizeof buf, RT_ERR_INVALID, "%s: bad directory name '%s'", what, path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return RT_ERROR(RT_ERR_IO, "cannot create the %s %s: %s", what, buf, strerror(errno));
        buf[i] = c;
    }
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return RT_ERROR(RT_ERR_IO, "%s %s: exists and is not a directory", what, path);
    return RT_OK;
}
