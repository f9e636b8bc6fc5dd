/* The tables of bf16 compression's steps (dist/internal/bf16_ops.h, label gpu; exit 77
 * without a GPU, never "passed"): what the gradient reducer calls by the device of its
 * bf16 copy. The CUDA table, on a GPU buffer and a stream of the device layer, must give
 * the CPU table's bits on the same inputs, step for step: the casts, every reduction step
 * (each op, AVG's fused division), the division alone. Finite inputs (zeros, subnormals,
 * ties and random values of every magnitude): a GPU's NaN bits are its own. Both tables
 * are picked by device kind; test_dist_compress_gpu runs the reducer itself. */
#include "../test_util.h"
#include "core/device.h"
#include "dist/internal/bf16_ops.h"

#include <math.h>
#include <string.h>

enum { N = 6000 };

static float g_x[N], g_y[N];

static float f_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* finite values: the first few special, the rest random bits with a finite exponent */
static void inputs(float *x, uint64_t r) {
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x3f808000u,
                                0x3f818000u, 0xbf808000u, 0x3f807fffu, 0x7f7f7fffu, 0x3f800000u};
    const int ns = (int)(sizeof special / sizeof special[0]);
    for (int i = 0; i < N; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = i < ns ? special[i] : (uint32_t)(r >> 32);
        if ((u & 0x7f800000u) == 0x7f800000u) u &= 0xbfffffffu; /* no inf or NaN */
        x[i] = f_of(u);
    }
}

/* The two tables and their buffers: h, hs, hf on the host for the CPU table; d, ds, df
 * on the GPU (dev) for the CUDA table, which enqueues on st. */
typedef struct pair {
    const rt_dist_bf16_ops *cpu, *gpu;
    rt_device dev;
    rt_stream *st;
    uint16_t *h, *d, *hs, *ds;
    float *hf, *df;
} pair;

/* the GPU's bf16 result (d, once st is done) is the CPU's (h), bit for bit */
static void same_bf16(pair *p, const char *what) {
    uint16_t back[N];
    assert_rt_ok(rt_stream_sync(p->st));
    assert_rt_ok(rt_memcpy(back, rt_device_cpu(), p->d, p->dev, sizeof back, NULL));
    size_t differ = 0;
    for (int i = 0; i < N; i++)
        if (back[i] != p->h[i] && differ++ < 3)
            printf("  %s: element %d: GPU %04x, CPU %04x\n", what, i, back[i], p->h[i]);
    if (differ) fail_msg("%s: %zu of %d elements differ", what, differ, N);
}

static void tables_agree(void **state) {
    (void)state;
    pair p = {.cpu = rt_dist_bf16_ops_of(RT_DEVICE_CPU),
              .gpu = rt_dist_bf16_ops_of(RT_DEVICE_CUDA),
              .dev = rt_device_cuda(0)};
    assert_ptr_equal(p.cpu, &rt_dist_bf16_cpu);
    assert_ptr_equal(p.gpu, &rt_dist_bf16_cuda);
    assert_null(rt_dist_bf16_ops_of(RT_DEVICE_KIND_COUNT_));
    assert_rt_ok(rt_stream_create(p.dev, &p.st));
    p.h = malloc(N * 2), p.hs = malloc(N * 2), p.hf = malloc(N * sizeof(float));
    assert_true(p.h && p.hs && p.hf);
    assert_rt_ok(rt_malloc(p.dev, N * 2, (void **)&p.d));
    assert_rt_ok(rt_malloc(p.dev, N * 2, (void **)&p.ds));
    assert_rt_ok(rt_malloc(p.dev, N * sizeof(float), (void **)&p.df));
    inputs(g_x, 1);
    inputs(g_y, 2);
    /* the second operand: packed on each side by its own table */
    assert_rt_ok(rt_memcpy(p.df, p.dev, g_y, rt_device_cpu(), sizeof g_y, NULL));
    assert_rt_ok(p.cpu->pack(NULL, g_y, p.hs, N));
    assert_rt_ok(p.gpu->pack(p.st, p.df, p.ds, N));
    assert_rt_ok(rt_stream_sync(p.st)); /* before df is refilled */
    assert_rt_ok(rt_memcpy(p.df, p.dev, g_x, rt_device_cpu(), sizeof g_x, NULL));
    for (int op = 0; op < RT_OP_COUNT_; op++)
        for (int div = 0; div <= 3; div += 3) {
            if (div && op != RT_OP_AVG) continue; /* the fused division is AVG's last step */
            char what[64];
            snprintf(what, sizeof what, "%s%s", rt_reduce_op_name((rt_reduce_op)op), div ? ", fused / 3" : "");
            assert_rt_ok(p.cpu->pack(NULL, g_x, p.h, N)); /* rounding point 1 */
            assert_rt_ok(p.gpu->pack(p.st, p.df, p.d, N));
            same_bf16(&p, "pack");
            assert_rt_ok(p.cpu->combine(NULL, p.h, p.hs, N, (rt_reduce_op)op, div));
            assert_rt_ok(p.gpu->combine(p.st, p.d, p.ds, N, (rt_reduce_op)op, div));
            same_bf16(&p, what);
        }
    assert_rt_ok(p.cpu->div(NULL, p.h, N, 7));
    assert_rt_ok(p.gpu->div(p.st, p.d, N, 7));
    same_bf16(&p, "/ 7");
    float back[N];
    assert_rt_ok(p.cpu->unpack(NULL, p.h, p.hf, N)); /* exact */
    assert_rt_ok(p.gpu->unpack(p.st, p.d, p.df, N));
    assert_rt_ok(rt_stream_sync(p.st));
    assert_rt_ok(rt_memcpy(back, rt_device_cpu(), p.df, p.dev, sizeof back, NULL));
    assert_memory_equal(back, p.hf, sizeof back);
    assert_rt_ok(p.gpu->pack(p.st, p.df, p.d, 0)); /* n == 0: nothing */
    rt_free(p.dev, p.d), rt_free(p.dev, p.ds), rt_free(p.dev, p.df);
    rt_stream_destroy(p.st);
    free(p.h), free(p.hs), free(p.hf);
}

int main(void) {
    RT_SKIP_WITHOUT_GPU();
    const struct CMUnitTest tests[] = {cmocka_unit_test(tables_agree)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
