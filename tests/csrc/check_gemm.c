/* The shim's own float32 product kernels (src/torch_nntile/runtime/csrc/gemm.c) against a
   double-precision reference: random shapes (k up to 2500: several k blocks), leading
   dimensions wider than the rows, both transposes, alpha 1 or 1.5, beta 0 (over a C of
   NaN), 1 or 0.5, B packed once or in the call. Exit status 0 when every case matches;
   77 where the CPU has no AVX-512F (nothing to check). Built and run by
   tests/test_gemm_kernels.py. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "gemm.h"

static float rnd(void) { return (float)rand() / (float)RAND_MAX - 0.5f; }

/* The largest error of c (m x n, rows ldc apart) against ref, in units of the
   rounding a k-long float32 sum of such values can carry. */
static double worst_error(int m, int n, int k, const float *c, int ldc, const double *ref)
{
    double worst = 0.0, unit = 1e-3 + 0.3 * sqrt((double)k);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double e = fabs((double)c[(long)i * ldc + j] - ref[(long)i * n + j]) / unit;
            if (!(e <= worst))  /* NaN counts as worst */
                worst = e;
        }
    return worst;
}

static int check_case(int it)
{
    int m = 1 + rand() % 300, n = 1 + rand() % 300, k = 1 + rand() % (it % 10 == 0 ? 2500 : 400);
    int ta = rand() % 2, tb = rand() % 2, per_call = rand() % 2;
    float alpha = rand() % 3 ? 1.0f : 1.5f, betas[3] = {0.0f, 1.0f, 0.5f}, beta = betas[rand() % 3];
    int lda = (ta ? m : k) + rand() % 3, ldb = (tb ? k : n) + rand() % 3, ldc = n + rand() % 3;
    long arows = ta ? k : m, brows = tb ? n : k;
    float *a = malloc(sizeof(float) * arows * lda), *b = malloc(sizeof(float) * brows * ldb);
    float *c = malloc(sizeof(float) * m * ldc);
    double *ref = malloc(sizeof(double) * m * n);
    for (long i = 0; i < arows * lda; i++)
        a[i] = rnd();
    for (long i = 0; i < brows * ldb; i++)
        b[i] = rnd();
    for (long i = 0; i < (long)m * ldc; i++)
        c[i] = beta == 0.0f ? NAN : rnd();
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0.0;
            for (int kk = 0; kk < k; kk++)
                s += (double)(ta ? a[(long)kk * lda + i] : a[(long)i * lda + kk])
                     * (double)(tb ? b[(long)j * ldb + kk] : b[(long)kk * ldb + j]);
            ref[(long)i * n + j] = alpha * s + (beta == 0.0f ? 0.0 : beta * c[(long)i * ldc + j]);
        }
    int ran = 1;
    if (per_call) {
        ran = tnt_sgemm_own(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    } else {
        float *bp = aligned_alloc(64, (sizeof(float) * tnt_sgemm_packed_floats(n, k) + 63) / 64 * 64);
        tnt_sgemm_pack_b(tb, n, k, alpha, b, ldb, bp);
        tnt_sgemm_packed(ta, m, n, k, a, lda, bp, beta, c, ldc);
        free(bp);
    }
    double worst = ran ? worst_error(m, n, k, c, ldc, ref) : 0.0;
    int bad = !(worst < 1e-5);
    if (bad)
        printf("bad: m %d n %d k %d ta %d tb %d per_call %d alpha %g beta %g lda %d ldb %d ldc %d: %g\n", m, n, k,
               ta, tb, per_call, alpha, beta, lda, ldb, ldc, worst);
    free(a);
    free(b);
    free(c);
    free(ref);
    return bad;
}

int main(void)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) {
        printf("no AVX-512F on this CPU\n");
        return 77;
    }
    srand(1);
    int bad = 0;
    for (int it = 0; it < 400; it++)
        bad += check_case(it);
    printf("400 cases, %d bad\n", bad);
    return bad != 0;
}
