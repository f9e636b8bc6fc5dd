/* The bf16 compression kernels of src/dist/cuda/bf16_cuda.cu (the casts of the gradient
 * reducer's compress_bf16 and the reduction steps of the nccl transport's bf16 ring),
 * compiled as host code through the CUDA emulation:
 *  - the fp32 -> bf16 cast against a rounding of the test's own (the nearer of the two
 *    bf16 neighbours in double, a tie to the even one; NaN a quiet NaN of the same sign),
 *    on zeros, infinities, NaNs (quiet, signalling, with payloads), subnormals, exact
 *    ties both ways, the values beside them, FLT_MAX (rounds to infinity) and random bits;
 *  - bf16 -> fp32 (exact: the bits shifted);
 *  - each reduction step (every op, AVG's fused division by 2, 3 and 7, the division
 *    alone) bit for bit against dist/reduce.c's host steps on the same bf16 inputs (NaN:
 *    any NaN, as the hardware's NaN payloads are its own). */
#include "emu_test_util.h"

#include "core/bf16.h"
#include "dist/internal/bf16_cuda.h"
#include "dist/reduce.h"

#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

static float f_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static uint32_t u_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* the expected bf16 of x, independently of core/bf16.h */
static uint16_t want_bf16(float x) {
    uint32_t u = u_of(x);
    if (isnan(x)) return (uint16_t)((u >> 16) | 0x40u);
    if (isinf(x)) return (uint16_t)(u >> 16);
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u; /* toward zero, away from zero */
    /* past the largest bf16 the neighbour is infinity, which rounding treats as 2^128 */
    double vh = (hi & 0x7fffffffu) == 0x7f800000u ? copysign(ldexp(1.0, 128), x) : (double)f_of(hi);
    double dl = fabs((double)x - (double)f_of(lo)), dh = fabs(vh - (double)x);
    if (dl < dh || (dl == dh && ((lo >> 16) & 1u) == 0)) return (uint16_t)(lo >> 16);
    return (uint16_t)(hi >> 16);
}

enum { NSPECIAL = 26, NRAND = 4096, N = NSPECIAL + NRAND };

static void inputs(float *x, uint64_t salt) {
    uint64_t r = g_seed ^ salt;
    const uint32_t special[NSPECIAL] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, /* zeros, infinities */
        0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fa12345u, /* NaNs: quiet, signalling, payloads */
        0x00000001u, 0x807fffffu, 0x00008000u, 0x00018000u, /* subnormals, subnormal ties */
        0x3f808000u, 0x3f818000u, 0xbf808000u, 0xbf818000u, /* ties: down to even, up to even */
        0x3f807fffu, 0x3f808001u, 0x3f817fffu, 0x3f818001u, /* beside the ties */
        0x7f7fffffu, 0xff7fffffu, 0x7f7f7fffu, 0x7f7f8000u, /* FLT_MAX (to inf), below, the tie to inf */
        0x00800000u, 0x3f800000u,                           /* FLT_MIN, 1 */
    };
    for (int i = 0; i < NSPECIAL; i++) x[i] = f_of(special[i]);
    for (int i = 0; i < NRAND; i++) { /* any bits: every exponent, NaNs and infinities included */
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        x[NSPECIAL + i] = f_of((uint32_t)(r >> 32));
    }
}

static void test_casts(void **state) {
    (void)state;
    float *x = rt_test_floats(N), *back = rt_test_nans(N);
    inputs(x, 1);
    uint16_t *b = malloc(N * sizeof *b);
    assert_non_null(b);
    memset(b, 0xa5, N * sizeof *b);
    assert_int_equal(rt_dist_bf16_pack((cudaStream_t)0, x, b, N), cudaSuccess);
    size_t bad = 0;
    for (int i = 0; i < N; i++) {
        uint16_t w = want_bf16(x[i]);
        if (b[i] != w && bad++ < 5)
            printf("  fp32 %08x -> bf16 %04x, expected %04x\n", (unsigned)u_of(x[i]), (unsigned)b[i], (unsigned)w);
    }
    printf("  fp32 -> bf16: %zu of %d differ from the rounding\n", bad, N);
    assert_int_equal(bad, 0);
    assert_int_equal(rt_dist_bf16_unpack((cudaStream_t)0, b, back, N), cudaSuccess);
    for (int i = 0; i < N; i++) assert_int_equal(u_of(back[i]), (uint32_t)b[i] << 16);
    assert_int_equal(rt_dist_bf16_pack((cudaStream_t)0, x, b, 0), cudaSuccess); /* nothing to do */
    free(x), free(back), free(b);
}

/* the bf16 arrays as floats, for et_check_exact */
static void widen(const uint16_t *b, float *f, size_t n) {
    for (size_t i = 0; i < n; i++) f[i] = rt_bf16_to_f32(b[i]);
}

static void test_steps(void **state) {
    (void)state;
    float *x = rt_test_floats(N), *y = rt_test_floats(N), *fc = rt_test_nans(N), *fg = rt_test_nans(N);
    inputs(x, 2);
    inputs(y, 3);
    for (int i = 0; i < NSPECIAL; i++) y[i] = y[(i * 7 + 3) % NSPECIAL]; /* the special values in other pairs */
    uint16_t *d0 = malloc(N * 2), *s = malloc(N * 2), *dc = malloc(N * 2), *dg = malloc(N * 2);
    assert_true(d0 && s && dc && dg);
    for (int i = 0; i < N; i++) {
        d0[i] = rt_bf16_from_f32(x[i]);
        s[i] = rt_bf16_from_f32(y[i]);
    }
    const int divs[] = {0, 2, 3, 7};
    for (int op = 0; op < RT_OP_COUNT_; op++)
        for (int k = 0; k < 4; k++) {
            int div = divs[k];
            if (div && op != RT_OP_AVG) continue; /* the fused division is AVG's last step */
            memcpy(dc, d0, N * 2);
            memcpy(dg, d0, N * 2);
            if (div)
                rt_reduce_apply_div(dc, s, N, RT_BF16, div);
            else
                rt_reduce_apply(dc, s, N, RT_BF16, (rt_reduce_op)op);
            assert_int_equal(rt_dist_bf16_combine((cudaStream_t)0, dg, s, N, op, div), cudaSuccess);
            widen(dc, fc, N);
            widen(dg, fg, N);
            char what[64];
            snprintf(what, sizeof what, "bf16 %s%s%d", rt_reduce_op_name((rt_reduce_op)op), div ? ", fused / " : " ",
                     div);
            et_check_exact(what, fc, fg, N);
        }
    for (int k = 1; k < 4; k++) {
        memcpy(dc, d0, N * 2);
        memcpy(dg, d0, N * 2);
        rt_reduce_div(dc, N, RT_BF16, divs[k]);
        assert_int_equal(rt_dist_bf16_div((cudaStream_t)0, dg, N, divs[k]), cudaSuccess);
        widen(dc, fc, N);
        widen(dg, fg, N);
        char what[64];
        snprintf(what, sizeof what, "bf16 / %d", divs[k]);
        et_check_exact(what, fc, fg, N);
    }
    free(x), free(y), free(fc), free(fg), free(d0), free(s), free(dc), free(dg);
}

int main(void) {
    et_pick_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_casts),
        cmocka_unit_test(test_steps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
