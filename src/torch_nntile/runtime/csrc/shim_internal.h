/* What the shim's files (shim.c, memory.c, disk.c, failures.c, submit.c, products.c, share.c, dist.c, cuda.c)
   share with each other: not part of its interface (shim.h), which is all Python sees.
   Each is described where it is defined. */
#ifndef TNT_SHIM_INTERNAL_H
#define TNT_SHIM_INTERNAL_H

#include <starpu.h>
#include <stddef.h>
#include <stdint.h>

#include "shim.h"

#define TNT_NAMES 4096  /* name ids: counts and kernel seconds are kept per worker and name */

/* A product, or a part of one: ``batch`` products of C (m x n) = op(X) op(Y), items
   ``sc``/``sx``/``sy`` bytes apart; leading dimensions are those of the whole tiles. */
struct tnt_gemm_part {
    char *c, *x, *y;
    int m, n, k, ldx, ldy, ldc, batch, dbl;
    char opx, opy;
    size_t sc, sx, sy;
    double alpha, beta;
};

/* A product task's arguments (products.c, cuda.c). */
struct tnt_gemm_args { int64_t key; int kind, ta, tb, m, n, k, dbl, name, trace, batch; double alpha, beta; };

/* memory.c */
extern struct starpu_codelet tnt_free_cl, tnt_init_cl;
void tnt_free_func(void *buffers[], void *cl_arg);
void tnt_init_func(void *buffers[], void *cl_arg);
void *tnt_blob_hold(const int32_t *p, double addr);

/* failures.c */
extern int64_t tnt_abandon_id;
extern struct starpu_codelet tnt_fail_cl;
int64_t tnt_task_failure(struct starpu_task *task, int n);
void tnt_task_wrote(struct starpu_task *task, int n, int64_t failure);
void tnt_fail_func(void *buffers[], void *cl_arg);
double tnt_now(void);
void tnt_native_done(struct starpu_task *task, int nbuf, int64_t key, int w, int name, int trace, double t0);
void tnt_native_failed(struct starpu_task *task, int nbuf, int64_t failure);

/* disk.c */
extern int tnt_watch;
void tnt_kernel_started(void);
struct tnt_hints;
struct tnt_hints *tnt_hints_make(int n, const int32_t *at, const tnt_handle *handles);
void tnt_hints_run(void *arg);

/* submit.c */
extern struct starpu_codelet tnt_cl, tnt_ew_cl;
void tnt_cpu_func(void *buffers[], void *cl_arg);
void tnt_run_python(int64_t key, void *buffers[]);
void tnt_ew_func(void *buffers[], void *cl_arg);
void tnt_codelet(struct starpu_codelet *cl, void (*fn)(void *[], void *), int writes_one, const char *name);
int tnt_set_buffers(struct starpu_task *task, int n, tnt_handle *handles, int *modes);
int tnt_send(struct starpu_task *task, int n, tnt_handle *handles, int *modes, struct tnt_hints *hints);
void tnt_ew_release(const void *cl_arg);

/* cuda.c */
enum { TNT_CUDA_PYTHON = 0, TNT_CUDA_PROGRAM, TNT_CUDA_GEMM };
extern int tnt_cuda_on;
int tnt_cuda_init(int ncuda);
void tnt_cuda_shutdown(void);
void tnt_cuda_codelet(struct starpu_codelet *cl, int kind);
void tnt_cuda_ran_in_c(int64_t key);

/* products.c */
extern int tnt_skip_kernels;
void tnt_gemm_run(const struct tnt_gemm_part *p);
int tnt_gemm_split(struct tnt_gemm_part *p, struct tnt_gemm_part *rest);
void tnt_blas_single(void);
int tnt_submit_gemm(int nbuf, tnt_handle *handles, int *modes, const int *p, double alpha, double beta,
                    int64_t key, int trace, uint32_t where, struct tnt_hints *hints);

/* dist.c */
#define TNT_DIST_ALL (-2)  /* tnt_dist_place: every rank runs the task */
extern int tnt_dist_on;
void tnt_dist_start(int me, int size);
int tnt_dist_place(int n, tnt_handle *handles, int *modes, int prio);
void tnt_dist_after(int n, tnt_handle *handles, int *modes, int x, int prio);
int tnt_dist_here(int x);

/* share.c */
int tnt_help(void);
void tnt_gemm_shared(struct tnt_gemm_part *p);
int tnt_softmax_shared(int kind, const int32_t *p, void *const *ptrs);
int tnt_ew_shared(const int32_t *prog, const double *consts, void *const *ptrs);

#endif
