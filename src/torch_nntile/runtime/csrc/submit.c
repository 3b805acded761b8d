/* Task submission: the codelets, tasks built with their handles and modes (beyond
   STARPU_NMAXBUFS in arrays of their own), the CPU entry points that run a tile's
   elementwise or row program in C or call back into Python for its kernel, and whole
   batches in one call. */
#include <starpu.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ew.h"
#include "rows.h"
#include "shim_internal.h"

struct starpu_codelet tnt_cl;

/* The Python kernel of task ``key`` on the worker's copies of its tiles (host or
   device buffers); what the task writes holds the failure it returned. */
void tnt_run_python(int64_t key, void *buffers[])
{
    struct starpu_task *task = starpu_task_get_current();
    int n = STARPU_TASK_GET_NBUFFERS(task);
    uintptr_t ptrs[n > 0 ? n : 1];
    for (int i = 0; i < n; i++)
        ptrs[i] = STARPU_VECTOR_GET_PTR(buffers[i]);
    int64_t failed = tnt_task_failure(task, n);
    failed = _tnt_kernel(key, ptrs, n, starpu_worker_get_id(), failed);
    tnt_task_wrote(task, n, failed);
}

void tnt_cpu_func(void *buffers[], void *cl_arg)
{
    tnt_run_python((int64_t)(intptr_t)cl_arg, buffers);
}

/* A CPU codelet running ``fn``: on one tile it writes (``writes_one``), else on the
   handles and modes each task brings. */
void tnt_codelet(struct starpu_codelet *cl, void (*fn)(void *[], void *), int writes_one, const char *name)
{
    memset(cl, 0, sizeof(*cl));
    cl->where = STARPU_CPU;
    cl->cpu_funcs[0] = fn;
    cl->name = name;
    if (writes_one) {
        cl->nbuffers = 1;
        cl->modes[0] = STARPU_W;
    } else {
        cl->nbuffers = STARPU_VARIABLE_NBUFFERS;
    }
}

/* A task's handles and modes; more than STARPU_NMAXBUFS go in arrays of their own
   (StarPU frees them with the task). Nonzero when those cannot be had. */
int tnt_set_buffers(struct starpu_task *task, int n, tnt_handle *handles, int *modes)
{
    task->nbuffers = n;
    if (n > STARPU_NMAXBUFS) {
        task->dyn_handles = malloc(n * sizeof(starpu_data_handle_t));
        task->dyn_modes = malloc(n * sizeof(enum starpu_data_access_mode));
        if (task->dyn_handles == NULL || task->dyn_modes == NULL)
            return 1;
    }
    for (int i = 0; i < n; i++) {
        STARPU_TASK_SET_HANDLE(task, (starpu_data_handle_t)handles[i], i);
        STARPU_TASK_SET_MODE(task, (enum starpu_data_access_mode)modes[i], i);
    }
    return 0;
}

/* Set a task's buffers and submit it; out of core, ``hints`` (or NULL) run once it has
   run (disk.c). They are the task's: freed with it, or here if it cannot be sent (as
   the builders below free them where they fail before this). Over several ranks
   (dist.c) a task another rank runs is not submitted here: 1, the task destroyed. */
int tnt_send(struct starpu_task *task, int n, tnt_handle *handles, int *modes, struct tnt_hints *hints)
{
    if (tnt_set_buffers(task, n, handles, modes)) {
        free(hints);
        return -ENOMEM;
    }
    int x = 0;
    if (tnt_dist_on) {
        x = tnt_dist_place(n, handles, modes, task->priority);
        if (!tnt_dist_here(x)) {
            free(hints);
            task->destroy = 0;
            starpu_task_destroy(task);
            tnt_dist_after(n, handles, modes, x, 0);
            return 1;
        }
    }
    if (hints != NULL) {
        task->epilogue_callback_func = tnt_hints_run;  /* before the task's dependents, which may unregister */
        task->epilogue_callback_arg = hints;
        task->epilogue_callback_arg_free = 1;
    }
    int prio = task->priority;
    int rc = starpu_task_submit(task);
    if (rc != 0 && hints != NULL) {
        task->epilogue_callback_arg = NULL;
        free(hints);
    }
    if (tnt_dist_on)
        tnt_dist_after(n, handles, modes, x, prio);
    return rc;
}

static int tnt_submit(int64_t key, int n, tnt_handle *handles, int *modes, uint32_t where, int urgent,
                      struct tnt_hints *hints)
{
    struct starpu_task *task = starpu_task_create();
    task->cl = &tnt_cl;
    task->cl_arg = (void *)(intptr_t)key;
    task->where = where;
    if (urgent)
        task->priority = STARPU_MAX_PRIO;
    return tnt_send(task, n, handles, modes, hints);
}

/* Elementwise and row-wise tiles (csrc/ew.c, rows.c, typed.c): cl_arg is a tnt_ew_args
   followed by its program (nints int32: the kind, 0 for an ew.h program, else a
   rows.h kind, then its layout) and its constants (nconst doubles, 8-byte aligned). */
struct tnt_ew_args { int64_t key; int name, trace, nints, nconst; };
struct starpu_codelet tnt_ew_cl;

static size_t tnt_ew_consts_at(int nints)
{
    size_t at = sizeof(struct tnt_ew_args) + (size_t)nints * sizeof(int32_t);
    return (at + 7) & ~(size_t)7;
}

/* An ingress's source, held since submission, is let go once the task has run. */
void tnt_ew_release(const void *cl_arg)
{
    const struct tnt_ew_args *a = cl_arg;
    const int32_t *prog = (const int32_t *)(a + 1);
    const double *consts = (const double *)((const char *)a + tnt_ew_consts_at(a->nints));
    if (prog[0] == TNT_ROWS_INGRESS)
        tnt_blob_release((void *)(uintptr_t)consts[0]);
}

void tnt_ew_func(void *buffers[], void *cl_arg)
{
    const struct tnt_ew_args *a = cl_arg;
    struct starpu_task *task = starpu_task_get_current();
    int nbuf = STARPU_TASK_GET_NBUFFERS(task);
    const int32_t *prog = (const int32_t *)(a + 1);
    const double *consts = (const double *)((const char *)a + tnt_ew_consts_at(a->nints));
    if (tnt_cuda_on)  /* its Python kernel, there for a CUDA worker, goes unused */
        tnt_cuda_ran_in_c(a->key);
    int64_t failed = tnt_task_failure(task, nbuf);
    if (failed) {
        tnt_ew_release(a);
        tnt_native_failed(task, nbuf, failed);
        return;
    }
    void *ptrs[TNT_EW_CONST];
    for (int i = 0; i < nbuf; i++)
        ptrs[i] = (void *)STARPU_VECTOR_GET_PTR(buffers[i]);
    double t0 = tnt_now();
    int rc = TNT_ROWS_OK;
    int64_t bad[3] = {0, 0, 0};
    if (!tnt_skip_kernels) {
        if (prog[0] == 0) {
            if (!tnt_ew_shared(prog + 1, consts, ptrs))
                tnt_ew_run(prog + 1, consts, ptrs);
        }
        else if (!tnt_softmax_shared(prog[0], prog + 1, ptrs))
            rc = tnt_rows_run(prog[0], prog + 1, consts, ptrs, bad);
    }
    tnt_ew_release(a);
    if (rc != TNT_ROWS_OK) {  /* a bad index or target: the task fails as the CPU kernel would */
        tnt_native_failed(task, nbuf, _tnt_input_error(a->name, rc, bad[0], bad[1], bad[2]));
        return;
    }
    tnt_native_done(task, nbuf, a->key, starpu_worker_get_id(), a->name, a->trace, t0);
}

static int tnt_submit_ew(int nbuf, tnt_handle *handles, int *modes, const int32_t *rec, const double *consts,
                         int64_t key, int trace, uint32_t where, struct tnt_hints *hints)
{
    int name = rec[0], nints = rec[1], nconst = rec[2];
    const int32_t *prog = rec + 3;
    if (name < 0 || name >= TNT_NAMES || nconst < 0 || nconst > TNT_EW_TEMP - TNT_EW_CONST || nints < 1
        || nbuf > TNT_EW_CONST
        || (prog[0] == 0 ? tnt_ew_check(prog + 1, nints - 1, nconst, nbuf)
                         : tnt_rows_check(prog[0], prog + 1, nints - 1, nconst, nbuf)) != 0) {
        free(hints);
        return -EINVAL;
    }
    void *blob = NULL;  /* the data an ingress reads: held until the task has run */
    if (prog[0] == TNT_ROWS_INGRESS && (blob = tnt_blob_hold(prog + 1, consts[0])) == NULL) {
        free(hints);
        return -EINVAL;
    }
    size_t at = tnt_ew_consts_at(nints), size = at + (size_t)nconst * sizeof(double);
    struct tnt_ew_args *a = malloc(size);
    if (a == NULL) {
        if (blob)
            tnt_blob_release(blob);
        free(hints);
        return -ENOMEM;
    }
    struct tnt_ew_args v = { key, name, trace, nints, nconst };
    *a = v;
    memcpy(a + 1, prog, (size_t)nints * sizeof(int32_t));
    memcpy((char *)a + at, consts, (size_t)nconst * sizeof(double));
    struct starpu_task *task = starpu_task_create();
    task->cl = &tnt_ew_cl;
    task->cl_arg = a;
    task->cl_arg_size = size;
    task->cl_arg_free = 1;
    task->where = where;
    int rc = tnt_send(task, nbuf, handles, modes, hints);
    if (rc != 0 && blob)  /* not submitted (or run by another rank) */
        tnt_blob_release(blob);
    return rc;
}

/* A whole batch in one call (Python does not hold the GIL meanwhile). Task i has key
   key0 + i and nbufs[i] handles/modes, consecutive in handles/modes. Product tasks are
   listed in gemm (10 ints each: task index, kind, ta, tb, m, n, k, double?, name id, batch; by
   task index) with coef (alpha, beta); elementwise tasks in ew (records by task index:
   task index, name id, nints, nconst, then the kind and its csrc/ew.h or rows.h layout) with their constants
   consecutive in ewc; the others run the Python kernel of their key.
   Returns how many tasks went in; out[0] counts them as they go (so the caller knows
   even if it is interrupted right after this returns), out[1] is StarPU's error for
   the first that did not. With urgent_last the last task (a readout, which the host
   waits for) gets the highest priority: it runs as soon as its tiles are ready, not
   after the tasks queued before it. Out of core, nhint tasks get hints: tiles they evict
   once run (records by task index: task index, count, then as many positions in handles).
   Over several ranks, here[i] says whether task i runs on this one (out[2] counts them);
   here is NULL otherwise. */
int tnt_submit_batch(int n, int64_t key0, int *nbufs, tnt_handle *handles, int *modes,
                     int ngemm, int *gemm, double *coef, int new, int32_t *ew, double *ewc,
                     int nhint, int32_t *hint, int trace, uint32_t where, int urgent_last, int *out,
                     uint8_t *here)
{
    out[0] = 0;
    out[2] = 0;
    int off = 0, g = 0, e = 0, h = 0;
    for (int i = 0; i < n; i++) {
        int r;
        struct tnt_hints *hints = NULL;
        if (h < nhint && hint[0] == i) {
            hints = tnt_hints_make(hint[1], hint + 2, handles);
            if (hints == NULL) {
                out[1] = -ENOMEM;
                return i;
            }
            hint += 2 + hint[1];
            h++;
        }
        if (g < ngemm && gemm[10 * g] == i) {
            r = tnt_submit_gemm(nbufs[i], handles + off, modes + off, gemm + 10 * g + 1, coef[2 * g],
                                coef[2 * g + 1], key0 + i, trace, where, hints);
            g++;
        } else if (e < new && ew[0] == i) {  /* record: task index, name, nints, nconst, program */
            r = tnt_submit_ew(nbufs[i], handles + off, modes + off, ew + 1, ewc, key0 + i, trace, where, hints);
            ewc += ew[3];
            ew += 4 + ew[2];
            e++;
        } else {
            r = tnt_submit(key0 + i, nbufs[i], handles + off, modes + off, where, urgent_last && i == n - 1, hints);
        }
        if (r < 0) {
            out[1] = r;
            return i;
        }
        if (here != NULL)
            here[i] = r == 0;
        out[2] += r == 0;
        out[0] = i + 1;
        off += nbufs[i];
    }
    out[1] = 0;
    return n;
}
