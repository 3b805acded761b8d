/* Matrix-product tiles run here, in the StarPU worker, calling BLAS directly:
   no Python, no GIL. Tiles are row-major; BLAS is column-major, so the row-major
   C (m x n) = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T. */
#include <starpu.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "gemm.h"
#include "shim_internal.h"

typedef void (*tnt_sgemm_t)(const char *, const char *, const int *, const int *, const int *,
                            const float *, const float *, const int *, const float *, const int *,
                            const float *, float *, const int *);
typedef void (*tnt_dgemm_t)(const char *, const char *, const int *, const int *, const int *,
                            const double *, const double *, const int *, const double *, const int *,
                            const double *, double *, const int *);
typedef int (*tnt_threads_t)(int);
/* MKL's packed products (cblas_sgemm_pack_get_size / _pack / _compute): a B operand
   shared by several products is packed once instead of inside every call. */
typedef size_t (*tnt_packsize_t)(int, int, int, int);
typedef void (*tnt_pack_t)(int, int, int, int, int, int, float, const float *, int, float *);
typedef void (*tnt_compute_t)(int, int, int, int, int, int, const float *, int, const float *, int,
                              float, float *, int);
enum { TNT_ROW_MAJOR = 101, TNT_NO_TRANS = 111, TNT_TRANS = 112, TNT_PACKED = 151, TNT_B_MATRIX = 162 };
enum { TNT_GEMM = 0, TNT_GEMM_PACKED_B = 1, TNT_PACK_B = 2 };

static tnt_sgemm_t tnt_sgemm;
static tnt_dgemm_t tnt_dgemm;
static tnt_threads_t tnt_blas_threads;
static tnt_packsize_t tnt_spack_size;
static tnt_pack_t tnt_spack;
static tnt_compute_t tnt_scompute;
/* Packed float32 products (and large ones on a B read as stored, tnt_own_worth) run
   gemm.c's kernels (their own packed format) instead of MKL's: tnt_set_own_sgemm, on
   an AMD CPU with AVX-512 (tnt_sgemm_ok). */
static int tnt_own_sgemm;
int tnt_skip_kernels;
static struct starpu_codelet tnt_gemm_cl;

/* Products of at least this many multiply-adds run in two parts (tnt_gemm_shared):
   about 20 us of one core. */
static double tnt_split_macs = 1048576.0;
void tnt_set_split_macs(double macs) { tnt_split_macs = macs; }

/* Whether a float32 product (or part) runs gemm.c's kernels with B packed in the call:
   where B is read as stored (packing it is a copy) and the product is large enough.
   Decided by shape alone, so the same values every run. */
static int tnt_own_worth(const struct tnt_gemm_part *p)
{
    return tnt_own_sgemm && p->opy == 'N' && p->m >= 64 && p->n >= 32 && p->k >= 64;
}

void tnt_gemm_run(const struct tnt_gemm_part *p)
{
    char *c = p->c, *x = p->x, *y = p->y;
    for (int b = 0; b < p->batch; b++, c += p->sc, x += p->sx, y += p->sy) {
        if (p->dbl) {
            double al = p->alpha, be = p->beta;
            tnt_dgemm(&p->opy, &p->opx, &p->n, &p->m, &p->k, &al, (double *)y, &p->ldy, (double *)x, &p->ldx,
                      &be, (double *)c, &p->ldc);
        } else {
            float al = (float)p->alpha, be = (float)p->beta;
            if (tnt_own_worth(p) && tnt_sgemm_own(p->opx == 'T', p->opy == 'T', p->m, p->n, p->k, al, (float *)x,
                                                  p->ldx, (float *)y, p->ldy, be, (float *)c, p->ldc))
                continue;
            tnt_sgemm(&p->opy, &p->opx, &p->n, &p->m, &p->k, &al, (float *)y, &p->ldy, (float *)x, &p->ldx,
                      &be, (float *)c, &p->ldc);
        }
    }
}

/* Splits ``p`` in two: ``p`` keeps the first part, ``rest`` gets the second (by batch
   items, else by rows of C, else by its columns). 0 where it is too small to pay. */
int tnt_gemm_split(struct tnt_gemm_part *p, struct tnt_gemm_part *rest)
{
    size_t item = p->dbl ? sizeof(double) : sizeof(float);
    if ((double)p->m * p->n * p->k * p->batch < tnt_split_macs)
        return 0;
    *rest = *p;
    if (p->batch >= 2) {
        int half = p->batch / 2;
        rest->batch = p->batch - half;
        rest->c += half * p->sc;
        rest->x += half * p->sx;
        rest->y += half * p->sy;
        p->batch = half;
    } else if (p->m >= p->n && p->m >= 32) {  /* rows of C: rows of op(X) */
        int half = p->m / 2;
        rest->m = p->m - half;
        rest->c += (size_t)half * p->ldc * item;
        rest->x += (p->opx == 'T' ? (size_t)half : (size_t)half * p->ldx) * item;
        p->m = half;
    } else if (p->n >= 32) {  /* columns of C: columns of op(Y) */
        int half = p->n / 2;
        rest->n = p->n - half;
        rest->c += (size_t)half * item;
        rest->y += (p->opy == 'T' ? (size_t)half * p->ldy : (size_t)half) * item;
        p->n = half;
    } else {
        return 0;
    }
    return 1;
}

void tnt_blas_single(void)
{
    static __thread int single_threaded;
    if (!single_threaded) {  /* one core per worker: no BLAS threads of its own */
        if (tnt_blas_threads)
            tnt_blas_threads(1);
        single_threaded = 1;
    }
}

static void tnt_gemm_func(void *buffers[], void *cl_arg)
{
    const struct tnt_gemm_args *a = cl_arg;
    struct starpu_task *task = starpu_task_get_current();
    int nbuf = STARPU_TASK_GET_NBUFFERS(task);
    int64_t failed = tnt_task_failure(task, nbuf);
    if (failed) {  /* an input holds no value: neither does the output */
        tnt_native_failed(task, nbuf, failed);
        return;
    }
    int w = starpu_worker_get_id();
    tnt_blas_single();
    double t0 = tnt_now();
    if (tnt_skip_kernels || a->m <= 0 || a->n <= 0) {
        /* nothing to compute */
    } else if (a->kind == TNT_PACK_B) {  /* buffers: packed (W), B as stored (R) */
        const float *b = (const float *)STARPU_VECTOR_GET_PTR(buffers[1]);
        float *packed = (float *)STARPU_VECTOR_GET_PTR(buffers[0]);
        if (tnt_own_sgemm)
            tnt_sgemm_pack_b(a->tb, a->n, a->k, (float)a->alpha, b, a->tb ? a->k : a->n, packed);
        else
            tnt_spack(TNT_ROW_MAJOR, TNT_B_MATRIX, a->tb ? TNT_TRANS : TNT_NO_TRANS, a->m, a->n, a->k,
                      (float)a->alpha, b, a->tb ? a->k : a->n, packed);
    } else if (a->kind == TNT_GEMM_PACKED_B) {  /* alpha was applied when packing */
        const float *x = (const float *)STARPU_VECTOR_GET_PTR(buffers[1]);
        const float *packed = (const float *)STARPU_VECTOR_GET_PTR(buffers[2]);
        float *c = (float *)STARPU_VECTOR_GET_PTR(buffers[0]);
        if (tnt_own_sgemm)
            tnt_sgemm_packed(a->ta, a->m, a->n, a->k, x, a->ta ? a->m : a->k, packed, (float)a->beta, c, a->n);
        else
            tnt_scompute(TNT_ROW_MAJOR, a->ta ? TNT_TRANS : TNT_NO_TRANS, TNT_PACKED, a->m, a->n, a->k, x,
                         a->ta ? a->m : a->k, packed, a->n, (float)a->beta, c, a->n);
    } else {  /* batch items follow each other in every tile */
        size_t item = a->dbl ? sizeof(double) : sizeof(float);
        struct tnt_gemm_part p = {
            (char *)STARPU_VECTOR_GET_PTR(buffers[0]), (char *)STARPU_VECTOR_GET_PTR(buffers[1]),
            (char *)STARPU_VECTOR_GET_PTR(buffers[2]), a->m, a->n, a->k,
            a->ta ? a->m : a->k, a->tb ? a->k : a->n, a->n, a->batch, a->dbl,
            a->ta ? 'T' : 'N', a->tb ? 'T' : 'N',
            item * a->m * a->n, item * a->m * a->k, item * a->k * a->n, a->alpha, a->beta,
        };
        if (p.ldy < 1) p.ldy = 1;
        if (p.ldx < 1) p.ldx = 1;
        tnt_gemm_shared(&p);
    }
    tnt_native_done(task, nbuf, a->key, w, a->name, a->trace, t0);
}

void tnt_set_pack(uintptr_t pack_get_size, uintptr_t pack, uintptr_t compute)
{
    tnt_spack_size = (tnt_packsize_t)pack_get_size;
    tnt_spack = (tnt_pack_t)pack;
    tnt_scompute = (tnt_compute_t)compute;
}

/* Bytes of B (k x n) packed for products with m rows; 0 when packing is unavailable. */
size_t tnt_pack_size(int m, int n, int k)
{
    if (tnt_own_sgemm)
        return tnt_sgemm_packed_floats(n, k) * sizeof(float);
    if (!tnt_spack_size || !tnt_spack || !tnt_scompute)
        return 0;
    return tnt_spack_size(TNT_B_MATRIX, m, n, k);
}

int tnt_set_own_sgemm(int on)
{
    tnt_own_sgemm = on && tnt_sgemm_ok();
    return tnt_own_sgemm;
}

void tnt_set_blas(uintptr_t sgemm, uintptr_t dgemm, uintptr_t set_threads_local, int skip)
{
    tnt_sgemm = (tnt_sgemm_t)sgemm;
    tnt_dgemm = (tnt_dgemm_t)dgemm;
    tnt_blas_threads = (tnt_threads_t)set_threads_local;
    tnt_skip_kernels = skip;
    tnt_codelet(&tnt_gemm_cl, tnt_gemm_func, 0, "nntile_gemm");
    tnt_codelet(&tnt_ew_cl, tnt_ew_func, 0, "nntile_ew");
    tnt_cuda_codelet(&tnt_gemm_cl, TNT_CUDA_GEMM);
    tnt_cuda_codelet(&tnt_ew_cl, TNT_CUDA_PROGRAM);
}

int tnt_submit_gemm(int nbuf, tnt_handle *handles, int *modes, const int *p, double alpha,
                    double beta, int64_t key, int trace, uint32_t where, struct tnt_hints *hints)
{
    int kind = p[0], ta = p[1], tb = p[2], m = p[3], n = p[4], k = p[5], dbl = p[6], name = p[7], batch = p[8];
    if (name < 0 || name >= TNT_NAMES || (dbl ? tnt_dgemm == NULL : tnt_sgemm == NULL) || batch < 0
        || (kind != TNT_GEMM && (dbl || batch != 1 || !tnt_spack || !tnt_scompute))) {
        free(hints);
        return -EINVAL;
    }
    struct tnt_gemm_args *a = malloc(sizeof(*a));
    if (a == NULL) {
        free(hints);
        return -ENOMEM;
    }
    struct tnt_gemm_args v = { key, kind, ta, tb, m, n, k, dbl, name, trace, batch, alpha, beta };
    *a = v;
    struct starpu_task *task = starpu_task_create();
    task->cl = &tnt_gemm_cl;
    task->cl_arg = a;
    task->cl_arg_size = sizeof(*a);
    task->cl_arg_free = 1;
    task->where = kind == TNT_GEMM ? where : where & STARPU_CPU;  /* packed operands: the host's BLAS only */
    return tnt_send(task, nbuf, handles, modes, hints);
}
