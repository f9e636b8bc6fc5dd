/* Row-major sgemm: OpenBLAS when built with it, a plain loop otherwise (slow; only so
 * that a build without OpenBLAS still runs and tests). */
#ifndef RT_MODEL_CPU_GEMM_H
#define RT_MODEL_CPU_GEMM_H

#include <stdbool.h>
#ifdef RT_HAVE_OPENBLAS
#include <cblas.h>
#endif

/* C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) + beta * C */
static inline void rt_cpu_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
                                const float *b, int ldb, float beta, float *c, int ldc) {
#ifdef RT_HAVE_OPENBLAS
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda,
                b, ldb, beta, c, ldc);
#else
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                float av = ta ? a[(long)p * lda + i] : a[(long)i * lda + p];
                float bv = tb ? b[(long)j * ldb + p] : b[(long)p * ldb + j];
                s += (double)av * bv;
            }
            float *cv = &c[(long)i * ldc + j];
            *cv = (float)(alpha * s + (beta == 0.0f ? 0.0 : (double)beta * *cv));
        }
#endif
}

#endif
