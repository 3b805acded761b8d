/* CUDA workers (a StarPU built with CUDA: STARPU_USE_CUDA). Each codelet the shim
   submits tiles with gets a CUDA implementation here, run by StarPU's CUDA workers on
   the worker's own stream, next to its CPU one:
   - products: cuBLAS (strided batched, on the worker's handle), float32 and float64;
   - elementwise and row programs, and every kernel run through the Python callback:
     the task's Python kernel, on CUDA tensors viewing the tiles' device buffers
     (runtime/submission.py), i.e. torch's own CUDA kernels.
   StarPU synchronizes the worker's stream after each call (no STARPU_CUDA_ASYNC, unless
   TORCH_NNTILE_CUDA_ASYNC): a task's outputs are complete when its dependents start, on
   the GPU or the host.

   A program task (tnt_ew_cl) has a Python kernel too when CUDA workers exist, in case
   a CUDA worker runs it; where a CPU worker runs its C program instead, that kernel is
   never called, and its key is logged here (tnt_cuda_take_ran_in_c) so that Python
   drops it.

   Without CUDA every function below reports that no CUDA worker exists. */
#include <starpu.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rows.h"
#include "shim_internal.h"

int tnt_cuda_on;  /* CUDA workers started: codelets get their CUDA implementations */
/* TORCH_NNTILE_CUDA_ASYNC=1: the CUDA implementations only launch their work on the
   worker's stream (STARPU_CUDA_ASYNC): StarPU learns of its end by an event, and the
   worker goes on to the next task meanwhile. A CUDA error then shows in a later task. */
static int tnt_cuda_async;

#ifdef STARPU_USE_CUDA
#include <starpu_cublas_v2.h>

/* History-based performance models, one per codelet, so that a scheduler of the dm*
   family (dmdas, the default with CUDA workers) weighs a task's time on a CPU against
   its time on a GPU and the moves of its tiles; footprints are StarPU's (the tiles'
   sizes). Calibrated in STARPU_HOME, run after run. */
static struct starpu_perfmodel tnt_models[3];
static const char *const tnt_model_names[3] = {"torch_nntile_python", "torch_nntile_program", "torch_nntile_gemm"};

static __typeof__(cublasSgemmStridedBatched) *tnt_cublas_sgemm;
static __typeof__(cublasDgemmStridedBatched) *tnt_cublas_dgemm;

/* Keys of program tasks a CPU worker ran in C (their Python kernels go unused). */
static int64_t *tnt_ran_in_c;
static int64_t tnt_nran, tnt_ran_cap;
static starpu_pthread_mutex_t tnt_ran_lock = STARPU_PTHREAD_MUTEX_INITIALIZER;

/* Called by tnt_ew_func only while tnt_cuda_on. */
void tnt_cuda_ran_in_c(int64_t key)
{
    STARPU_PTHREAD_MUTEX_LOCK(&tnt_ran_lock);
    if (tnt_nran == tnt_ran_cap) {
        int64_t cap = tnt_ran_cap ? 2 * tnt_ran_cap : 4096;
        int64_t *p = realloc(tnt_ran_in_c, (size_t)cap * sizeof(*p));
        if (p) { tnt_ran_in_c = p; tnt_ran_cap = cap; }
    }
    if (tnt_nran < tnt_ran_cap)  /* else (no memory) its Python kernel stays until the context stops */
        tnt_ran_in_c[tnt_nran++] = key;
    STARPU_PTHREAD_MUTEX_UNLOCK(&tnt_ran_lock);
}

int64_t tnt_cuda_take_ran_in_c(int64_t *keys, int64_t max)
{
    STARPU_PTHREAD_MUTEX_LOCK(&tnt_ran_lock);
    int64_t n = tnt_nran < max ? tnt_nran : max;
    for (int64_t i = 0; i < n; i++)
        keys[i] = tnt_ran_in_c[tnt_nran - n + i];
    tnt_nran -= n;
    STARPU_PTHREAD_MUTEX_UNLOCK(&tnt_ran_lock);
    return n;
}

/* A program task on a CUDA worker: its Python kernel (the key leads its arguments);
   the Python codelet's CUDA implementation is its CPU one, tnt_cpu_func, on device
   buffers. */
static void tnt_ew_cuda_func(void *buffers[], void *cl_arg)
{
    tnt_run_python(*(const int64_t *)cl_arg, buffers);
    tnt_ew_release(cl_arg);
}

/* A product with cuBLAS. Tiles are row-major, cuBLAS column-major: the row-major
   C (m x n) = op(X) op(Y) is the column-major C^T = op(Y)^T op(X)^T. */
static void tnt_gemm_cuda_func(void *buffers[], void *cl_arg)
{
    const struct tnt_gemm_args *a = cl_arg;
    struct starpu_task *task = starpu_task_get_current();
    int nbuf = STARPU_TASK_GET_NBUFFERS(task);
    int64_t failed = tnt_task_failure(task, nbuf);
    if (failed) {
        tnt_native_failed(task, nbuf, failed);
        return;
    }
    double t0 = tnt_now();
    int rc = 0;
    if (!tnt_skip_kernels && a->m > 0 && a->n > 0 && a->batch > 0) {
        cublasHandle_t h = starpu_cublas_get_local_handle();
        cublasOperation_t opx = a->ta ? CUBLAS_OP_T : CUBLAS_OP_N, opy = a->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        int ldx = a->ta ? a->m : a->k, ldy = a->tb ? a->k : a->n;
        if (ldx < 1) ldx = 1;
        if (ldy < 1) ldy = 1;
        long long sc = (long long)a->m * a->n, sx = (long long)a->m * a->k, sy = (long long)a->k * a->n;
        void *c = (void *)STARPU_VECTOR_GET_PTR(buffers[0]);
        const void *x = (const void *)STARPU_VECTOR_GET_PTR(buffers[1]);
        const void *y = (const void *)STARPU_VECTOR_GET_PTR(buffers[2]);
        if (a->dbl) {
            double al = a->alpha, be = a->beta;
            rc = tnt_cublas_dgemm(h, opy, opx, a->n, a->m, a->k, &al, y, ldy, sy, x, ldx, sx, &be, c, a->n, sc,
                                  a->batch);
        } else {
            float al = (float)a->alpha, be = (float)a->beta;
            rc = tnt_cublas_sgemm(h, opy, opx, a->n, a->m, a->k, &al, y, ldy, sy, x, ldx, sx, &be, c, a->n, sc,
                                  a->batch);
        }
    }
    if (rc != 0) {
        tnt_native_failed(task, nbuf, _tnt_input_error(a->name, TNT_CUDA_CUBLAS_FAILED, rc, 0, 0));
        return;
    }
    tnt_native_done(task, nbuf, a->key, starpu_worker_get_id(), a->name, a->trace, t0);
}

/* After starpu_init with CUDA workers: cuBLAS on each, its entry points looked up in
   the libcublas StarPU was linked with (already loaded). 0 on success. */
static int tnt_cuda_start(void)
{
    void *lib = dlopen("libcublas.so.13", RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL)
        lib = dlopen("libcublas.so", RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL)
        return -1;
    tnt_cublas_sgemm = (__typeof__(tnt_cublas_sgemm))dlsym(lib, "cublasSgemmStridedBatched");
    tnt_cublas_dgemm = (__typeof__(tnt_cublas_dgemm))dlsym(lib, "cublasDgemmStridedBatched");
    if (tnt_cublas_sgemm == NULL || tnt_cublas_dgemm == NULL)
        return -1;
    starpu_cublas_init();
    for (int i = 0; i < 3; i++) {  /* afresh each start: StarPU loads a model on its first use */
        memset(&tnt_models[i], 0, sizeof(tnt_models[i]));
        tnt_models[i].type = STARPU_HISTORY_BASED;
        tnt_models[i].symbol = tnt_model_names[i];
    }
    const char *async = getenv("TORCH_NNTILE_CUDA_ASYNC");  /* read at each start, as Python reads it */
    tnt_cuda_async = async != NULL && async[0] != '\0' && strcmp(async, "0") != 0;
    tnt_cuda_on = 1;
    return 0;
}

int tnt_cuda_init(int ncuda)
{
    if (ncuda == 0 || starpu_cuda_worker_get_count() == 0)
        return 0;
    return tnt_cuda_start();
}

void tnt_cuda_shutdown(void)
{
    if (tnt_cuda_on) {
        starpu_cublas_shutdown();
        tnt_cuda_on = 0;
    }
}

void tnt_cuda_codelet(struct starpu_codelet *cl, int kind)
{
    if (!tnt_cuda_on)
        return;
    cl->where = STARPU_CPU | STARPU_CUDA;
    cl->model = &tnt_models[kind];
    cl->cuda_flags[0] = tnt_cuda_async ? STARPU_CUDA_ASYNC : 0;
    cl->cuda_funcs[0] = kind == TNT_CUDA_GEMM ? tnt_gemm_cuda_func
                        : kind == TNT_CUDA_PROGRAM ? tnt_ew_cuda_func : tnt_cpu_func;
}

int tnt_built_with_cuda(void) { return 1; }
int tnt_ncuda(void) { return tnt_cuda_on ? (int)starpu_cuda_worker_get_count() : 0; }

int tnt_worker_cuda_device(int worker)
{
    if (worker < 0 || worker >= (int)starpu_worker_get_count()
        || starpu_worker_get_type(worker) != STARPU_CUDA_WORKER)
        return -1;
    return starpu_worker_get_devid(worker);
}

uintptr_t tnt_cuda_stream(void) { return (uintptr_t)starpu_cuda_get_local_stream(); }

#else  /* no CUDA in this StarPU */

void tnt_cuda_ran_in_c(int64_t key) { (void)key; }
int64_t tnt_cuda_take_ran_in_c(int64_t *keys, int64_t max) { (void)keys; (void)max; return 0; }
int tnt_cuda_init(int ncuda) { return ncuda == 0 ? 0 : -1; }
void tnt_cuda_shutdown(void) {}
void tnt_cuda_codelet(struct starpu_codelet *cl, int kind) { (void)cl; (void)kind; }
int tnt_built_with_cuda(void) { return 0; }
int tnt_ncuda(void) { return 0; }
int tnt_worker_cuda_device(int worker) { (void)worker; return -1; }
uintptr_t tnt_cuda_stream(void) { return 0; }

#endif
