/* Single-precision products on a B operand packed once (gemm.c): the weight of a
   layer feeds the product of every row tile of a batch, so it is packed (and, where
   it is read transposed, transposed) once for all of them instead of inside each
   BLAS call. For AMD CPUs with AVX-512 (where MKL's kernels lag); tnt_sgemm_ok says
   whether this machine is one.

   Packed layout of a logical B (k x n): per block of TNT_SGEMM_KC rows of k, per
   panel of TNT_SGEMM_NR columns, the block's rows one after another, TNT_SGEMM_NR
   values each (columns past n hold 0). */
#ifndef TNT_GEMM_H
#define TNT_GEMM_H

#include <stddef.h>

#define TNT_SGEMM_NR 32
#define TNT_SGEMM_KC 1024

/* 1 where these kernels run here: an AMD CPU with AVX-512F. */
int tnt_sgemm_ok(void);

/* Floats of a packed B of k x n. */
size_t tnt_sgemm_packed_floats(int n, int k);

/* Packs alpha * op(B), op(B) being k x n: B stored k x n (tb 0) or n x k (tb 1),
   rows ldb apart. */
void tnt_sgemm_pack_b(int tb, int n, int k, float alpha, const float *b, int ldb, float *bp);

/* C (m x n, rows ldc apart) = beta * C + op(A) @ B, op(A) m x k: A stored m x k
   (ta 0) or k x m (ta 1), rows lda apart; B packed by tnt_sgemm_pack_b. With beta 0
   C is only written (its NaNs do not propagate). Each result is one sum over k in
   order, in blocks of TNT_SGEMM_KC added to C. */
void tnt_sgemm_packed(int ta, int m, int n, int k, const float *a, int lda, const float *bp, float beta, float *c,
                      int ldc);

/* The same with B packed here, one k block at a time, into a buffer of this thread:
   C = beta * C + op(A) @ (alpha * op(B)). Returns 0 (nothing done) where the block's
   packed B would not fit that buffer (1 Mi floats), else 1. */
int tnt_sgemm_own(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                  float beta, float *c, int ldc);

#endif
