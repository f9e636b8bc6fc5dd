/* The readers of src/data on hostile or careless input (issue 14, item 4): a FIFO, a
 * directory, a device or a symlink loop where a dataset file should be is named as such
 * (never "missing") and never blocks; a raw file whose size disagrees with its header is
 * refused before it is read whole; a gzip bomb is refused as soon as it inflates past
 * the size its IDX header declares. Memory is checked with the peak RSS (getrusage),
 * never with a wall-clock threshold. */
#include "data_test_util.h"

#include "data/dataset.h"
#include "data/internal/bytes.h"
#include "data/internal/idx.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>

enum { N = 5, ROWS = 3, COLS = 4 };

static void be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16), p[2] = (unsigned char)(v >> 8),
    p[3] = (unsigned char)v;
}

static unsigned char g_img[16 + N * ROWS * COLS], g_lab[8 + N];

static int setup(void **state) {
    (void)state;
    be32(g_img, 0x803), be32(g_img + 4, N), be32(g_img + 8, ROWS), be32(g_img + 12, COLS);
    for (int i = 0; i < N * ROWS * COLS; i++) g_img[16 + i] = (unsigned char)i;
    be32(g_lab, 0x801), be32(g_lab + 4, N);
    for (int i = 0; i < N; i++) g_lab[8 + i] = (unsigned char)(i % 10);
    alarm(120); /* a reader that blocks fails the test instead of hanging it */
    return 0;
}

/* peak resident set of this process, in bytes */
static size_t peak_rss(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (size_t)ru.ru_maxrss * 1024;
}

/* A dataset folder with good labels and `make` putting something at the images' path. */
static void expect_named(void (*make)(const char *path), const char *what) {
    char *dir = dt_mkdtemp("hostile");
    dt_write(dir, "train-labels-idx1-ubyte", g_lab, sizeof g_lab);
    char p[4200];
    dt_path(p, sizeof p, dir, "train-images-idx3-ubyte");
    make(p);
    rt_dataset ds;
    rt_status st = rt_dataset_load(dir, "train", RT_DATASET_AUTO, &ds);
    if (st == RT_OK) fail_msg("loaded a dataset whose images are %s", what);
    assert_int_equal(st, RT_ERR_IO);
    assert_error_has("train-images-idx3-ubyte");
    assert_error_has(what);
    if (strstr(rt_error_message(), "missing")) fail_msg("called missing: %s", rt_error_message());
    dt_rm_rf(dir);
    free(dir);
}

static void make_fifo(const char *p) {
    if (mkfifo(p, 0644) != 0) fail_msg("mkfifo %s: %s", p, strerror(errno));
}
static void make_dir(const char *p) {
    if (mkdir(p, 0755) != 0) fail_msg("mkdir %s: %s", p, strerror(errno));
}
static void make_devnull(const char *p) {
    if (symlink("/dev/null", p) != 0) fail_msg("symlink %s: %s", p, strerror(errno));
}
static void make_loop(const char *p) {
    if (symlink(p, p) != 0) fail_msg("symlink %s: %s", p, strerror(errno));
}
static void make_dangling(const char *p) {
    if (symlink("/nonexistent/rt-nowhere", p) != 0) fail_msg("symlink %s: %s", p, strerror(errno));
}

static void test_not_regular_files_named(void **state) {
    (void)state;
    expect_named(make_fifo, "is a FIFO (named pipe)");
    expect_named(make_dir, "is a directory");
    expect_named(make_devnull, "is a device");
    expect_named(make_loop, "Too many levels of symbolic links");
    expect_named(make_dangling, "a dangling symbolic link");
    /* the same for a CIFAR-10 batch */
    char *dir = dt_mkdtemp("hostile-cifar");
    char p[4200];
    dt_path(p, sizeof p, dir, "test_batch.bin");
    make_fifo(p);
    rt_dataset ds;
    assert_int_equal(rt_dataset_load(dir, "test", RT_DATASET_CIFAR10, &ds), RT_ERR_IO);
    assert_error_has("test_batch.bin is a FIFO (named pipe)");
    dt_rm_rf(dir);
    free(dir);
}

/* Permission problems are named (root bypasses them: the check runs in a child that
 * drops to nobody, or is skipped where that is impossible). */
static void test_permission_named(void **state) {
    (void)state;
    char *dir = dt_mkdtemp("hostile-perm");
    chmod(dir, 0755);
    dt_write(dir, "train-labels-idx1-ubyte", g_lab, sizeof g_lab);
    dt_write(dir, "train-images-idx3-ubyte", g_img, sizeof g_img);
    char p[4200];
    dt_path(p, sizeof p, dir, "train-images-idx3-ubyte");
    chmod(p, 0);
    pid_t pid = fork();
    if (pid == 0) {
        if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(77);
        rt_dataset ds;
        rt_status st = rt_dataset_load(dir, "train", RT_DATASET_AUTO, &ds);
        if (st != RT_ERR_IO || !strstr(rt_error_message(), "Permission denied") ||
            !strstr(rt_error_message(), "train-images-idx3-ubyte")) {
            fprintf(stderr, "status %d: %s\n", (int)st, rt_error_message());
            _exit(1);
        }
        _exit(0);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    dt_rm_rf(dir);
    free(dir);
    if (WIFEXITED(ws) && WEXITSTATUS(ws) == 77) {
        print_message("could not drop privileges: the permission case is skipped\n");
        skip();
    }
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) fail_msg("the unreadable file was not named (see above)");
}

/* A raw IDX file whose size disagrees with its header is refused before it is read:
 * a 512 MiB sparse file behind a header declaring 10 images of 28x28 costs no memory. */
static void test_size_mismatch_refused_before_reading(void **state) {
    (void)state;
    char *dir = dt_mkdtemp("hostile-size");
    dt_write(dir, "train-labels-idx1-ubyte", g_lab, sizeof g_lab);
    unsigned char h[16];
    be32(h, 0x803), be32(h + 4, N), be32(h + 8, 28), be32(h + 12, 28);
    dt_write(dir, "train-images-idx3-ubyte", h, sizeof h);
    char p[4200];
    dt_path(p, sizeof p, dir, "train-images-idx3-ubyte");
    const off_t big = (off_t)512 << 20;
    if (truncate(p, big) != 0) fail_msg("truncate: %s", strerror(errno));
    size_t before = peak_rss();
    rt_dataset ds;
    assert_int_equal(rt_dataset_load(dir, "train", RT_DATASET_AUTO, &ds), RT_ERR_FORMAT);
    assert_error_has("train-images-idx3-ubyte");
    assert_error_has("unexpected bytes after the data: expected exactly 3920 bytes after the header");
    size_t grew = peak_rss() - before;
    if (grew > ((size_t)64 << 20))
        fail_msg("refusing a %lld-byte file raised the peak RSS by %zu bytes", (long long)big, grew);
    /* the same for a CIFAR-10 batch that is not whole records */
    char *cdir = dt_mkdtemp("hostile-cifar-size");
    dt_write(cdir, "test_batch.bin", "", 0);
    dt_path(p, sizeof p, cdir, "test_batch.bin");
    if (truncate(p, big + 1) != 0) fail_msg("truncate: %s", strerror(errno));
    before = peak_rss();
    assert_int_equal(rt_dataset_load(cdir, "test", RT_DATASET_CIFAR10, &ds), RT_ERR_FORMAT);
    assert_error_has("not a whole number of 3073-byte records");
    grew = peak_rss() - before;
    if (grew > ((size_t)64 << 20)) fail_msg("refusing a CIFAR batch raised the peak RSS by %zu bytes", grew);
    dt_rm_rf(cdir);
    free(cdir);
    dt_rm_rf(dir);
    free(dir);
}

/* gzip of an IDX header followed by `zeros` zero bytes, streamed (no big buffer). */
static unsigned char *gzip_bomb(const unsigned char *head, size_t hl, size_t zeros, size_t *out_len) {
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (deflateInit2(&zs, 9, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY) != Z_OK) fail_msg("deflateInit2");
    size_t cap = zeros / 500 + 4096, len = 0;
    unsigned char *out = malloc(cap);
    static unsigned char chunk[1 << 16];
    size_t left = zeros;
    bool first = true;
    int flush = Z_NO_FLUSH;
    while (flush != Z_FINISH) {
        if (first) {
            zs.next_in = (Bytef *)head, zs.avail_in = (uInt)hl, first = false;
        } else {
            size_t n = left < sizeof chunk ? left : sizeof chunk;
            left -= n;
            zs.next_in = chunk, zs.avail_in = (uInt)n;
            if (left == 0) flush = Z_FINISH;
        }
        int zr;
        do {
            if (cap - len < 4096) out = realloc(out, cap *= 2);
            zs.next_out = out + len, zs.avail_out = (uInt)(cap - len);
            zr = deflate(&zs, flush);
            len = cap - zs.avail_out;
        } while (zs.avail_in > 0 || (flush == Z_FINISH && zr != Z_STREAM_END));
    }
    deflateEnd(&zs);
    *out_len = len;
    return out;
}

static void test_gzip_bomb_refused_early(void **state) {
    (void)state;
    /* 10 images of 28x28 declared, 100 MiB of zeros inflated: ~100 KiB compressed */
    unsigned char h[16];
    be32(h, 0x803), be32(h + 4, 10), be32(h + 8, 28), be32(h + 12, 28);
    const size_t zeros = (size_t)100 << 20;
    size_t zl;
    unsigned char *z = gzip_bomb(h, sizeof h, zeros, &zl);
    if (zl > ((size_t)1 << 20)) fail_msg("the bomb is %zu bytes compressed", zl);
    char *dir = dt_mkdtemp("hostile-bomb");
    dt_write(dir, "train-images-idx3-ubyte.gz", z, zl);
    unsigned char lab[8 + 10];
    be32(lab, 0x801), be32(lab + 4, 10);
    memset(lab + 8, 1, 10);
    dt_write(dir, "train-labels-idx1-ubyte", lab, sizeof lab);
    size_t before = peak_rss();
    rt_dataset ds;
    assert_int_equal(rt_dataset_load(dir, "train", RT_DATASET_AUTO, &ds), RT_ERR_FORMAT);
    assert_error_has("train-images-idx3-ubyte.gz");
    assert_error_has("inflates past the 7856 bytes its header declares");
    size_t grew = peak_rss() - before;
    if (grew > ((size_t)16 << 20))
        fail_msg("refusing a gzip bomb of %zu inflated bytes raised the peak RSS by %zu bytes", zeros + 16, grew);
    /* in memory too, with the rule */
    rt_bytes out;
    rt_bytes_rule rule = rt_idx_rule(3);
    assert_int_equal(rt_gunzip(z, zl, "bomb", RT_DATASET_MAX_FILE, &rule, &out), RT_ERR_FORMAT);
    assert_error_has("inflates past the 7856 bytes");
    free(z);
    /* a header that declares more than the limit is refused from its first bytes */
    be32(h + 4, 0xffffffffu), be32(h + 8, 4096), be32(h + 12, 4096);
    z = gzip_bomb(h, sizeof h, 1 << 20, &zl);
    assert_int_equal(rt_gunzip(z, zl, "huge", (size_t)1 << 30, &rule, &out), RT_ERR_FORMAT);
    assert_error_has("more than the 1073741824-byte limit");
    free(z);
    /* the good file still loads through the rule, gzip and raw */
    dt_write_gz(dir, "train-images-idx3-ubyte.gz", g_img, sizeof g_img);
    dt_write(dir, "train-labels-idx1-ubyte", g_lab, sizeof g_lab);
    assert_rt_ok(rt_dataset_load(dir, "train", RT_DATASET_AUTO, &ds));
    assert_int_equal(ds.n, N);
    assert_memory_equal(ds.images, g_img + 16, N * ROWS * COLS);
    rt_dataset_free(&ds);
    dt_rm_rf(dir);
    free(dir);
}

/* The address space this process has mapped (VmSize), in bytes; 0 when unknown. */
static size_t vm_size(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

/* A tiny gzip IDX file whose header declares 60000 images of 256x256 (3.9 GB) and holds
 * 8 KiB of zeros (more than the first 4 KiB buffer, so inflating goes on past the header): a clean "truncated data"
 * error, and no buffer of the declared size. The reader runs in a child whose address space may grow by 256 MiB only
 * (RLIMIT_AS), so an allocation of the declared size fails there, touched or not. */
static void test_declared_size_not_allocated(void **state) {
    (void)state;
    unsigned char h[16];
    be32(h, 0x803), be32(h + 4, 60000), be32(h + 8, 256), be32(h + 12, 256);
    size_t zl;
    unsigned char *z = gzip_bomb(h, sizeof h, 8192, &zl);
    if (zl > 100) fail_msg("the file is %zu bytes compressed", zl);
    char *dir = dt_mkdtemp("hostile-declared");
    dt_write(dir, "train-images-idx3-ubyte.gz", z, zl);
    char p[512];
    dt_path(p, sizeof p, dir, "train-images-idx3-ubyte.gz");
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit rl = {.rlim_cur = vm_size() + ((size_t)256 << 20), .rlim_max = RLIM_INFINITY};
        if (vm_size() == 0 || setrlimit(RLIMIT_AS, &rl) != 0) _exit(3);
        rt_bytes out;
        rt_bytes_rule rule = rt_idx_rule(3);
        const char *want = "truncated data: expected 3932160000 bytes after the 16-byte header, got 8192";
        rt_status a = rt_bytes_read_maybe_gz(p, RT_DATASET_MAX_FILE, &rule, &out);
        fprintf(stderr, "from the file: %s: %s\n", rt_status_name(a), rt_error_message());
        if (a != RT_ERR_FORMAT || !strstr(rt_error_message(), want)) _exit(1);
        rt_status b = rt_gunzip(z, zl, "declared", RT_DATASET_MAX_FILE, &rule, &out);
        fprintf(stderr, "from memory: %s: %s\n", rt_status_name(b), rt_error_message());
        _exit(b == RT_ERR_FORMAT && strstr(rt_error_message(), want) ? 0 : 2);
    }
    int wst = 0;
    assert_int_equal(waitpid(pid, &wst, 0), pid);
    if (!WIFEXITED(wst) || WEXITSTATUS(wst) != 0)
        fail_msg("reading a %zu-byte file that declares 3.9 GB: the child %s %d (1, 2: a wrong error, e.g. "
                 "RT_ERR_NOMEM from an allocation of the declared size; 3: no RLIMIT_AS)",
                 zl, WIFEXITED(wst) ? "exited with" : "died of signal",
                 WIFEXITED(wst) ? WEXITSTATUS(wst) : WTERMSIG(wst));
    free(z);
    dt_rm_rf(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        /* memory checks first, while the peak RSS is still low */
        cmocka_unit_test(test_gzip_bomb_refused_early),
        cmocka_unit_test(test_declared_size_not_allocated),
        cmocka_unit_test(test_size_mismatch_refused_before_reading),
        cmocka_unit_test(test_not_regular_files_named),
        cmocka_unit_test(test_permission_named),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
