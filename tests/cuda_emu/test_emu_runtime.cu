/* The emulation itself (docs/cuda-emulation.md), compiled the way the project's .cu
 * files are (rewritten by rewrite_cu.cmake, built as host C++): the built-ins cover a
 * 3-D grid of 3-D blocks once each, __syncthreads is a real barrier (a thread reads
 * what its neighbour wrote before it), threads that return early do not block the
 * barrier, atomics count across blocks, parameters are per-thread copies, an invalid
 * configuration is a launch error that cudaGetLastError reports once, and the rounding
 * intrinsics round once (no contraction). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
extern "C" { /* cmocka.h declares its functions without extern "C" */
#include <cmocka.h>
}
#include "test_util.h"

#include <cuda_runtime.h>

#include <string.h>
#include <vector>

/* ---- built-ins --------------------------------------------------------------------- */

static __global__ void coords_kernel(unsigned *hits, unsigned *where) {
    unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned g = b * (blockDim.x * blockDim.y * blockDim.z) + t;
    hits[g] += 1;
    where[g] = (blockIdx.z << 24) | (blockIdx.y << 16) | (blockIdx.x << 8) | (threadIdx.z << 6) | (threadIdx.y << 3) |
               threadIdx.x;
}

static void test_builtins(void **state) {
    (void)state;
    const dim3 grid(3, 2, 2), block(5, 3, 2);
    const unsigned total = 3 * 2 * 2 * 5 * 3 * 2;
    std::vector<unsigned> hits(total, 0), where(total, 0);
    coords_kernel<<<grid, block>>>(hits.data(), where.data());
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    for (unsigned g = 0; g < total; g++) {
        assert_int_equal(hits[g], 1);
        unsigned t = g % 30, b = g / 30;
        unsigned expect =
            ((b / 6) << 24) | (((b / 3) % 2) << 16) | ((b % 3) << 8) | ((t / 15) << 6) | (((t / 5) % 3) << 3) | (t % 5);
        assert_int_equal(where[g], expect);
    }
}

/* ---- the barrier ------------------------------------------------------------------- */

#define ROT_THREADS 200 /* not a power of two, not a warp multiple */

/* each thread reads the value its right neighbour stored: wrong without the barrier,
 * since the threads run in order and thread t would read slot t+1 before it is written */
static __global__ void rotate_kernel(const int *in, int *out) {
    __shared__ int sh[ROT_THREADS];
    int t = threadIdx.x, base = blockIdx.x * blockDim.x;
    sh[t] = in[base + t];
    __syncthreads();
    out[base + t] = sh[(t + 1) % ROT_THREADS];
    __syncthreads(); /* the next iteration of the same block would overwrite sh */
    sh[t] = -1;
}

static void test_barrier(void **state) {
    (void)state;
    const int blocks = 3, n = blocks * ROT_THREADS;
    std::vector<int> in(n), out(n, 0);
    for (int i = 0; i < n; i++) in[i] = 7 * i + 1;
    rotate_kernel<<<blocks, ROT_THREADS, 0, 0>>>(in.data(), out.data());
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < ROT_THREADS; t++)
            assert_int_equal(out[b * ROT_THREADS + t], in[b * ROT_THREADS + (t + 1) % ROT_THREADS]);
}

/* threads at or beyond `live` return before the reduction; the others still meet at
 * every barrier (CUDA counts only threads that have not exited) */
static __global__ void early_exit_sum_kernel(const int *x, int live, int *out) {
    __shared__ int sh[256];
    if ((int)threadIdx.x >= live) return;
    sh[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w && (int)threadIdx.x + w < live) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = sh[0];
}

static void test_early_exit(void **state) {
    (void)state;
    std::vector<int> x(256);
    for (int i = 0; i < 256; i++) x[i] = i + 1;
    const int lives[] = {1, 2, 77, 128, 255, 256};
    for (int live : lives) {
        int out = -1;
        early_exit_sum_kernel<<<1, 256>>>(x.data(), live, &out);
        assert_int_equal(cudaGetLastError(), cudaSuccess);
        assert_int_equal(out, live * (live + 1) / 2);
    }
}

/* ---- atomics, parameters ----------------------------------------------------------- */

static __global__ void count_kernel(int n, int *count, unsigned *maxv) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        atomicAdd(count, 1);
        atomicMax(maxv, (unsigned)i);
    }
    n -= 1000000; /* a parameter is the thread's own copy */
    if (n > 0) atomicAdd(count, 1000);
}

static void test_atomics_and_parameters(void **state) {
    (void)state;
    int count = 0;
    unsigned maxv = 0;
    long long n = 1000;                         /* converted to the kernel's int once, as a launch does */
    count_kernel<<<(unsigned)((n + 255) / 256), /* a launch over three lines */
                   256>>>(n,                    /* converted to int */
                          &count, &maxv);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(count, 1000);
    assert_int_equal(maxv, 999);
}

/* ---- launch errors ----------------------------------------------------------------- */

static __global__ void touch_kernel(int *x) { *x = 1; }

static void test_launch_errors(void **state) {
    (void)state;
    int x = 0;
    unsigned long long before = rt_emu_launch_count();
    touch_kernel<<<1, 2048>>>(&x); /* more than 1024 threads */
    assert_int_equal(cudaPeekAtLastError(), cudaErrorInvalidConfiguration);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    assert_int_equal(cudaGetLastError(), cudaSuccess); /* reported once */
    touch_kernel<<<0, 32>>>(&x);                       /* an empty grid */
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    touch_kernel<<<dim3(1, 70000), 32>>>(&x); /* grid.y > 65535 */
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    assert_int_equal(x, 0);
    assert_true(rt_emu_launch_count() == before);
    touch_kernel<<<1, 1>>>(&x);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(x, 1);
    assert_true(rt_emu_launch_count() == before + 1);
}

/* ---- rounding intrinsics ----------------------------------------------------------- */

static __global__ void round_kernel(float a, float b, float c, float *out) {
    out[0] = __fmaf_rn(a, b, c);            /* one rounding */
    out[1] = __fadd_rn(__fmul_rn(a, b), c); /* two roundings */
    out[2] = a * b + c;                     /* -ffp-contract=off: also two */
}

static void test_rounding(void **state) {
    (void)state;
    /* a = b = 1 + 2^-23: a*b = 1 + 2^-22 + 2^-46, rounded to 1 + 2^-22 */
    const float a = 1.0f + 0x1p-23f, c = -(1.0f + 0x1p-22f);
    float out[3];
    round_kernel<<<1, 1>>>(a, a, c, out);
    assert_true(out[0] == 0x1p-46f);
    assert_true(out[1] == 0.0f);
    assert_true(out[2] == 0.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builtins),      cmocka_unit_test(test_barrier),
        cmocka_unit_test(test_early_exit),    cmocka_unit_test(test_atomics_and_parameters),
        cmocka_unit_test(test_launch_errors), cmocka_unit_test(test_rounding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
