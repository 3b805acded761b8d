/* The StarPU shim (interface in shim.h): tile memory and handles, task submission in
   batches, the codelets that run tiles in C (products through BLAS, elementwise and
   row programs from ew.c / rows.c / typed.c) or through the Python callback, failures
   carried by tiles, and the per-kernel counts and trace events.

   Tile memory is allocated here, not by StarPU: StarPU waits forever for memory that
   cannot be had, while a failed allocation here is known at once and becomes a failure
   of the values that need that tile. Each handle's ``user_data`` says whether its
   current value exists (see ``tnt_task_failure``), so that a task whose inputs failed
   skips its kernel and passes the failure on to what it writes. */
#include <starpu.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

#include "ew.h"
#include "gemm.h"
#include "rows.h"
#include "shim.h"
#include "typed.h"

/* The state of a tile's current value, in its handle's user_data (an intptr_t):
   0: computed; 2 * id: not computed, because of failure ``id`` (the next task that
   writes the tile and runs clears it); 2 * id + 1: the tile has no memory (failure
   ``id``, for good). Tasks on a handle are ordered by StarPU, so a task reads the
   state its predecessors left. */
static int64_t tnt_abandon_id;  /* nonzero at exit: tasks that have not started skip their kernels */

/* The failure a task inherits: from a tile it reads that holds none, or one without memory. */
static int64_t tnt_task_failure(struct starpu_task *task, int n)
{
    for (int i = 0; i < n; i++) {
        intptr_t s = (intptr_t)starpu_data_get_user_data(STARPU_TASK_GET_HANDLE(task, i));
        if (s != 0 && ((s & 1) || (STARPU_TASK_GET_MODE(task, i) & STARPU_R)))
            return (int64_t)(s >> 1);
    }
    return __atomic_load_n(&tnt_abandon_id, __ATOMIC_RELAXED);
}

/* After a task: what it wrote holds a value, or not (``failure``). */
static void tnt_task_wrote(struct starpu_task *task, int n, int64_t failure)
{
    intptr_t want = (intptr_t)failure * 2;
    for (int i = 0; i < n; i++) {
        if (!(STARPU_TASK_GET_MODE(task, i) & STARPU_W))
            continue;
        starpu_data_handle_t h = STARPU_TASK_GET_HANDLE(task, i);
        intptr_t s = (intptr_t)starpu_data_get_user_data(h);
        if (s != want && !(s & 1))
            starpu_data_set_user_data(h, (void *)want);
    }
}

static void tnt_cpu_func(void *buffers[], void *cl_arg)
{
    struct starpu_task *task = starpu_task_get_current();
    int n = STARPU_TASK_GET_NBUFFERS(task);
    uintptr_t ptrs[n > 0 ? n : 1];
    for (int i = 0; i < n; i++)
        ptrs[i] = STARPU_VECTOR_GET_PTR(buffers[i]);
    int64_t failed = tnt_task_failure(task, n);
    failed = _tnt_kernel((int64_t)(intptr_t)cl_arg, ptrs, n, starpu_worker_get_id(), failed);
    tnt_task_wrote(task, n, failed);
}

/* Marks the tile it writes as failed (``cl_arg``): stands in for a task that never ran. */
static void tnt_fail_func(void *buffers[], void *cl_arg)
{
    (void)buffers;
    struct starpu_task *task = starpu_task_get_current();
    tnt_task_wrote(task, STARPU_TASK_GET_NBUFFERS(task), (int64_t)(intptr_t)cl_arg);
}

/* Tile memory. Large tiles get pages of their own (mmap), small ones come from malloc.
   Tiles live for steps while kernels' temporaries of every size come and go in the
   same heap: with large tiles there too, the heap fragmented (a medium GPT-2's
   process grew by ~150 MiB a step, all of it free heap that could not be returned).
   Pages of their own go back to the system when a tile's memory is freed. */
#define TNT_MMAP_MIN ((size_t)1 << 18)

static void *tnt_alloc(size_t nbytes)
{
    if (nbytes >= TNT_MMAP_MIN) {
        void *p = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    void *p = NULL;
    return posix_memalign(&p, 64, nbytes ? nbytes : 1) == 0 ? p : NULL;
}

static void tnt_free(void *p, size_t nbytes)
{
    if (p == NULL)
        return;
    if (nbytes >= TNT_MMAP_MIN)
        munmap(p, nbytes);
    else
        free(p);
}

/* CPU data copied in (an ingress: an input batch, a dropout mask), held here so that
   the task copying it into tiles runs in C. The Python object that made the copy holds
   one reference and every submitted task that reads it one more: the bytes outlive
   whichever lets go last (Python may drop its copy before the task has run). */
struct tnt_blob { int64_t refs; uint64_t magic; size_t nbytes; };
#define TNT_BLOB_HEAD 64  /* the data after the header stays 64-byte aligned */
#define TNT_BLOB_MAGIC 0x746e745f626c6f62ULL

void *tnt_blob_new(size_t nbytes)
{
    struct tnt_blob *b = tnt_alloc(TNT_BLOB_HEAD + nbytes);
    if (b == NULL)
        return NULL;
    b->refs = 1;
    b->magic = TNT_BLOB_MAGIC;
    b->nbytes = nbytes;
    return (char *)b + TNT_BLOB_HEAD;
}

void tnt_blob_release(void *data)
{
    struct tnt_blob *b = (struct tnt_blob *)((char *)data - TNT_BLOB_HEAD);
    if (__atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        size_t nbytes = b->nbytes;
        b->magic = 0;
        tnt_free(b, TNT_BLOB_HEAD + nbytes);
    }
}

/* A task's reference to the data a TNT_ROWS_INGRESS record reads (its box copy's
   parameters ``p``, the data's address ``addr``): NULL where that is no blob or too
   small for the boxes' sources. */
static void *tnt_blob_hold(const int32_t *p, double addr)
{
    struct tnt_blob *b = (struct tnt_blob *)((char *)(uintptr_t)addr - TNT_BLOB_HEAD);
    if (addr < (double)TNT_BLOB_HEAD || b->magic != TNT_BLOB_MAGIC || tnt_copy_boxes_source_bytes(p, 1) > b->nbytes)
        return NULL;
    __atomic_add_fetch(&b->refs, 1, __ATOMIC_RELAXED);
    return (char *)b + TNT_BLOB_HEAD;
}

/* A registered tile's bytes (see tnt_register: items, or one item of the whole size). */
static size_t tnt_nbytes(starpu_data_handle_t d)
{
    return (size_t)starpu_vector_get_nx(d) * starpu_vector_get_elemsize(d);
}

/* Frees a tile's memory once every earlier task on it is done (its handle is then unregistered). */
static void tnt_free_func(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    tnt_free((void *)STARPU_VECTOR_GET_PTR(buffers[0]),
             (size_t)STARPU_VECTOR_GET_NX(buffers[0]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[0]));
}

static struct starpu_codelet tnt_fail_cl, tnt_free_cl;

static struct starpu_codelet tnt_cl;

/* Idle CPU workers of this StarPU build poll for tasks without ever blocking, each at
   100% of a core, while Python records the next tasks on the same cores. A worker
   idle for longer than TNT_SPIN_US (a gap in the work, not the wait for a task's
   inputs, which is shorter) naps TNT_NAP_NS at a time, so recording and the busy
   workers get the cores; it picks up new work at most about one nap late. (Once
   nothing is submitted at all the workers are paused instead: Runtime.pause.) */
#define TNT_SPIN_US 100.0
#define TNT_NAP_NS 20000L

static int tnt_help(void);

static unsigned tnt_idle_hook(void *arg)
{
    (void)arg;
    static __thread double since, last;  /* start of this worker's idle stretch, its last poll */
    if (tnt_help()) {  /* ran half of another worker's product or softmax: busy, not idle */
        last = 0.0;
        return 1;
    }
    double now = starpu_timing_now();
    if (now - last > 20.0)  /* the previous poll was long ago: a task ran in between */
        since = now;
    last = now;
    if (now - since > TNT_SPIN_US) {
        struct timespec ts = {0, TNT_NAP_NS};
        nanosleep(&ts, NULL);
        last = starpu_timing_now();
    }
    return 1;
}

/* Runs on each CPU worker once at start: lower that thread's scheduling priority by
   *arg below the process's (Linux's setpriority applies to the calling thread alone). */
static void tnt_nice_worker(void *arg)
{
    int nice = getpriority(PRIO_PROCESS, 0) + *(int *)arg;
    setpriority(PRIO_PROCESS, 0, nice < 19 ? nice : 19);
}

/* A CPU codelet running ``fn``: on one tile it writes (``writes_one``), else on the
   handles and modes each task brings. */
static void tnt_codelet(struct starpu_codelet *cl, void (*fn)(void *[], void *), int writes_one, const char *name)
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

int tnt_init(int ncpu, const char *sched, int nice)
{
    struct starpu_conf conf;
    starpu_conf_init(&conf);
    conf.ncpus = ncpu;
    conf.ncuda = 0;
    conf.nopencl = 0;
    conf.catch_signals = 0;
    if (sched != NULL && sched[0] != '\0')
        conf.sched_policy_name = sched;
    tnt_codelet(&tnt_cl, tnt_cpu_func, 0, "nntile_tile_kernel");
    tnt_codelet(&tnt_fail_cl, tnt_fail_func, 1, "nntile_fail");
    tnt_codelet(&tnt_free_cl, tnt_free_func, 1, "nntile_free");
    __atomic_store_n(&tnt_abandon_id, 0, __ATOMIC_RELAXED);
    /* Workers inherit this thread's signal mask: with SIGINT blocked there, Ctrl-C is
       delivered to a Python thread, which can act on it, never to a worker. */
    sigset_t intr, old;
    sigemptyset(&intr);
    sigaddset(&intr, SIGINT);
    pthread_sigmask(SIG_BLOCK, &intr, &old);
    int rc = starpu_init(&conf);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0) {
        starpu_idle_hook_register(tnt_idle_hook, NULL);
        if (nice > 0)
            starpu_execute_on_each_worker(tnt_nice_worker, &nice, STARPU_CPU);
    }
    return rc;
}

void tnt_shutdown(void) { starpu_shutdown(); }
int tnt_ncpu(void) { return (int)starpu_cpu_worker_get_count(); }
int tnt_nworkers(void) { return (int)starpu_worker_get_count(); }
void tnt_pause(void) { starpu_pause(); }
void tnt_resume(void) { starpu_resume(); }

/* Give the free pages of malloc's heaps back to the system. Kernels' temporaries of
   every size, made and freed on several threads, leave the heaps fragmented: free
   memory that malloc keeps, and the process's resident size grew by tens of MiB a
   step (a medium GPT-2) without it. */
void tnt_trim(void) { malloc_trim(0); }

/* A tile of nelems items in memory allocated here, registered with main RAM as its
   home. *allocated = 0 when there is no memory for it: the handle then has none
   (the caller marks it with tnt_set_no_memory before any task uses it) and is
   registered empty: StarPU 1.4 reads a CPU buffer's first and last bytes when it is
   registered. StarPU counts a vector's items in 32 bits: a larger tile is one item of
   its whole size. */
tnt_handle tnt_register(size_t nelems, size_t elemsize, int *allocated)
{
    size_t nbytes = nelems * elemsize;
    void *p = tnt_alloc(nbytes);
    *allocated = p != NULL;
    starpu_data_handle_t h;
    if (p == NULL && nbytes)
        starpu_vector_data_register(&h, STARPU_MAIN_RAM, 0, 0, elemsize);
    else if (nelems <= UINT32_MAX)
        starpu_vector_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)p, (uint32_t)nelems, elemsize);
    else
        starpu_vector_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)p, 1, nbytes);
    return (tnt_handle)h;
}

void tnt_set_no_memory(tnt_handle h, int64_t failure)
{
    starpu_data_set_user_data((starpu_data_handle_t)h, (void *)((intptr_t)failure * 2 + 1));
}

/* Unregister once the tasks submitted on h are done, then free its memory: a task
   frees it in order after them. */
void tnt_unregister_submit(tnt_handle h)
{
    starpu_data_handle_t d = (starpu_data_handle_t)h;
    struct starpu_task *task = starpu_task_create();
    task->cl = &tnt_free_cl;
    task->handles[0] = d;
    if (starpu_task_submit(task) != 0) {  /* cannot happen with CPU workers; never leak silently */
        void *p = starpu_data_handle_to_pointer(d, STARPU_MAIN_RAM);
        size_t nbytes = tnt_nbytes(d);
        starpu_data_unregister(d);
        tnt_free(p, nbytes);
        return;
    }
    starpu_data_unregister_submit(d);
}

/* Unregister and free now (no task may still use h: after a wait). */
void tnt_unregister_now(tnt_handle h)
{
    starpu_data_handle_t d = (starpu_data_handle_t)h;
    void *p = starpu_data_handle_to_pointer(d, STARPU_MAIN_RAM);
    size_t nbytes = tnt_nbytes(d);
    starpu_data_unregister(d);
    tnt_free(p, nbytes);
}

/* A task that marks h's next value as failed, in order after h's earlier tasks. */
int tnt_submit_fail(tnt_handle h, int64_t failure)
{
    struct starpu_task *task = starpu_task_create();
    task->cl = &tnt_fail_cl;
    task->cl_arg = (void *)(intptr_t)failure;
    task->handles[0] = (starpu_data_handle_t)h;
    return starpu_task_submit(task);
}

void tnt_set_abandon(int64_t failure) { __atomic_store_n(&tnt_abandon_id, failure, __ATOMIC_RELAXED); }

/* A task's handles and modes; more than STARPU_NMAXBUFS go in arrays of their own
   (StarPU frees them with the task). Nonzero when those cannot be had. */
static int tnt_set_buffers(struct starpu_task *task, int n, tnt_handle *handles, int *modes)
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

static int tnt_submit(int64_t key, int n, tnt_handle *handles, int *modes, uint32_t where, int urgent)
{
    struct starpu_task *task = starpu_task_create();
    task->cl = &tnt_cl;
    task->cl_arg = (void *)(intptr_t)key;
    task->where = where;
    if (urgent)
        task->priority = STARPU_MAX_PRIO;
    return tnt_set_buffers(task, n, handles, modes) ? -ENOMEM : starpu_task_submit(task);
}

int tnt_wait_all(void) { return starpu_task_wait_for_all(); }

/* Matrix-product tiles run here, in the StarPU worker, calling BLAS directly:
   no Python, no GIL. Tiles are row-major; BLAS is column-major, so the row-major
   C (m x n) = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T. */

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

#define TNT_NAMES 4096
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
static int tnt_skip_kernels;
static struct starpu_codelet tnt_gemm_cl;
static int64_t tnt_gemm_ndone;
static int64_t tnt_gemm_calls[STARPU_NMAXWORKERS][TNT_NAMES];
static int64_t tnt_gemm_ns[STARPU_NMAXWORKERS][TNT_NAMES];
static starpu_pthread_mutex_t tnt_ev_lock = STARPU_PTHREAD_MUTEX_INITIALIZER;
struct tnt_event { int64_t key; int worker, name; double t0, t1; };
static struct tnt_event *tnt_events;
static int64_t tnt_nevents, tnt_evcap;

struct tnt_gemm_args { int64_t key; int kind, ta, tb, m, n, k, dbl, name, trace, batch; double alpha, beta; };

static double tnt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);  /* the clock of Python's time.perf_counter */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* After a task run in C: its count and kernel seconds under its name, a trace event
   when tracing, its outputs marked computed. */
static void tnt_native_done(struct starpu_task *task, int nbuf, int64_t key, int w, int name, int trace,
                            double t0)
{
    int64_t ns = (int64_t)((tnt_now() - t0) * 1e9 + 0.5);
    double t1 = t0 + 1e-9 * (double)ns;  /* the trace's duration is the one counted */
    __atomic_add_fetch(&tnt_gemm_calls[w][name], 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&tnt_gemm_ns[w][name], ns, __ATOMIC_RELAXED);
    if (trace) {
        STARPU_PTHREAD_MUTEX_LOCK(&tnt_ev_lock);
        if (tnt_nevents == tnt_evcap) {
            int64_t cap = tnt_evcap ? 2 * tnt_evcap : 4096;
            struct tnt_event *ev = realloc(tnt_events, cap * sizeof(*ev));
            if (ev) { tnt_events = ev; tnt_evcap = cap; }
        }
        if (tnt_nevents < tnt_evcap) {
            struct tnt_event e = { key, w, name, t0, t1 };
            tnt_events[tnt_nevents++] = e;
        }
        STARPU_PTHREAD_MUTEX_UNLOCK(&tnt_ev_lock);
    }
    tnt_task_wrote(task, nbuf, 0);
    __atomic_add_fetch(&tnt_gemm_ndone, 1, __ATOMIC_RELEASE);
}

/* A task run in C that computed nothing: what it writes holds ``failure``; it counts as done. */
static void tnt_native_failed(struct starpu_task *task, int nbuf, int64_t failure)
{
    tnt_task_wrote(task, nbuf, failure);
    __atomic_add_fetch(&tnt_gemm_ndone, 1, __ATOMIC_RELEASE);
}

/* Products of at least this many multiply-adds run in two parts (tnt_gemm_shared):
   about 20 us of one core. */
static double tnt_split_macs = 1048576.0;
void tnt_set_split_macs(double macs) { tnt_split_macs = macs; }

/* A product, or a part of one: ``batch`` products of C (m x n) = op(X) op(Y), items
   ``sc``/``sx``/``sy`` bytes apart; leading dimensions are those of the whole tiles. */
struct tnt_gemm_part {
    char *c, *x, *y;
    int m, n, k, ldx, ldy, ldc, batch, dbl;
    char opx, opy;
    size_t sc, sx, sy;
    double alpha, beta;
};

/* Whether a float32 product (or part) runs gemm.c's kernels with B packed in the call:
   where B is read as stored (packing it is a copy) and the product is large enough.
   Decided by shape alone, so the same values every run. */
static int tnt_own_worth(const struct tnt_gemm_part *p)
{
    return tnt_own_sgemm && p->opy == 'N' && p->m >= 64 && p->n >= 32 && p->k >= 64;
}

static void tnt_gemm_run(const struct tnt_gemm_part *p)
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
static int tnt_gemm_split(struct tnt_gemm_part *p, struct tnt_gemm_part *rest)
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

/* Work a second worker may take (tnt_share): a part of a product (rows_kind 0), a
   part of an elementwise program (TNT_JOB_EW), or rows of a row-wise kernel (rows.h). */
#define TNT_JOB_EW (-1)
struct tnt_job {
    int rows_kind;
    struct tnt_gemm_part gemm;
    int32_t p[4];
    void *bufs[3];
    const int32_t *prog;  /* TNT_JOB_EW: the program, its constants, its buffers, the part (of 2) */
    const double *consts;
    void *const *ptrs;
    int part;
};

static void tnt_job_run(const struct tnt_job *j)
{
    if (j->rows_kind == 0) {
        tnt_gemm_run(&j->gemm);
    } else if (j->rows_kind == TNT_JOB_EW) {
        tnt_ew_run_part(j->prog, j->consts, j->ptrs, j->part, 2);
    } else {
        int64_t bad[3];
        tnt_rows_run(j->rows_kind, j->p, NULL, j->bufs, bad);
    }
}

/* Sharing work. While a host thread waits for a result (a readout: the loss of a
   training step) its core is free, and a chain of dependent tasks (a forward pass)
   keeps one worker busy while the other idles. A worker starting a large product
   or softmax then posts half of it here; an idle worker (its idle hook) takes it, as
   eager PyTorch would use a second thread. Whatever is not taken the poster runs
   itself, so nothing waits on a worker that is busy elsewhere. One slot. */
enum { TNT_HELP_FREE, TNT_HELP_FILLING, TNT_HELP_POSTED, TNT_HELP_TAKEN, TNT_HELP_DONE };
static int tnt_help_state, tnt_host_waits;
static struct tnt_job tnt_help_job;

/* A host thread starts (+1) or stops (-1) waiting for the workers. */
void tnt_host_waiting(int change) { __atomic_add_fetch(&tnt_host_waits, change, __ATOMIC_RELAXED); }

static int tnt_may_share(void)
{
    return __atomic_load_n(&tnt_host_waits, __ATOMIC_RELAXED) > 0
           && __atomic_load_n(&tnt_help_state, __ATOMIC_RELAXED) == TNT_HELP_FREE;
}

static void tnt_blas_single(void)
{
    static __thread int single_threaded;
    if (!single_threaded) {  /* one core per worker: no BLAS threads of its own */
        if (tnt_blas_threads)
            tnt_blas_threads(1);
        single_threaded = 1;
    }
}

/* In an idle worker: run a posted job, if there is one (1). */
static int tnt_help(void)
{
    int posted = TNT_HELP_POSTED;
    if (__atomic_load_n(&tnt_help_state, __ATOMIC_RELAXED) != TNT_HELP_POSTED
        || !__atomic_compare_exchange_n(&tnt_help_state, &posted, TNT_HELP_TAKEN, 0, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED))
        return 0;
    tnt_blas_single();
    tnt_job_run(&tnt_help_job);
    __atomic_store_n(&tnt_help_state, TNT_HELP_DONE, __ATOMIC_RELEASE);
    return 1;
}

/* Runs two independent jobs: ``rest`` on an idle worker where one takes it while a
   host thread waits, else both here. */
static void tnt_share(const struct tnt_job *mine, const struct tnt_job *rest)
{
    int free_ = TNT_HELP_FREE;
    if (!tnt_may_share()
        || !__atomic_compare_exchange_n(&tnt_help_state, &free_, TNT_HELP_FILLING, 0, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED)) {
        tnt_job_run(mine);
        tnt_job_run(rest);
        return;
    }
    tnt_help_job = *rest;
    __atomic_store_n(&tnt_help_state, TNT_HELP_POSTED, __ATOMIC_RELEASE);
    tnt_job_run(mine);
    int posted = TNT_HELP_POSTED;
    if (__atomic_compare_exchange_n(&tnt_help_state, &posted, TNT_HELP_FILLING, 0, __ATOMIC_ACQUIRE,
                                    __ATOMIC_RELAXED)) {
        tnt_job_run(rest);  /* nobody took it */
    } else {
        while (__atomic_load_n(&tnt_help_state, __ATOMIC_ACQUIRE) != TNT_HELP_DONE)
            sched_yield();
    }
    __atomic_store_n(&tnt_help_state, TNT_HELP_FREE, __ATOMIC_RELEASE);
}

/* Runs ``p``: a large product in two parts, the second maybe on another worker
   (tnt_share). It is split the same way whoever runs the parts, so its values never
   depend on timing. */
static void tnt_gemm_shared(struct tnt_gemm_part *p)
{
    struct tnt_job mine = {0}, rest = {0};
    if (!tnt_gemm_split(p, &rest.gemm)) {
        tnt_gemm_run(p);
        return;
    }
    mine.gemm = *p;
    tnt_share(&mine, &rest);
}

#define TNT_SHARE_MIN_ITEMS 32768  /* a softmax worth sharing: about 50 us of one core */

/* A softmax or its backward (rows.h) in two parts by outer rows where another worker
   may take one (1), else nothing done (0). Rows are independent: the same values
   either way. */
static int tnt_softmax_shared(int kind, const int32_t *p, void *const *ptrs)
{
    int64_t outer = p[0], n = p[1], inner = p[2];
    if ((kind != TNT_ROWS_SOFTMAX && kind != TNT_ROWS_SOFTMAX_BACKWARD) || outer < 2
        || outer * n * inner < TNT_SHARE_MIN_ITEMS || !tnt_may_share())
        return 0;
    int nbuf = kind == TNT_ROWS_SOFTMAX ? 2 : 3, half = (int)(outer / 2);
    struct tnt_job mine = {0}, rest = {0};
    mine.rows_kind = rest.rows_kind = kind;
    for (int i = 0; i < 4; i++)
        mine.p[i] = rest.p[i] = p[i];
    mine.p[0] = half;
    rest.p[0] = (int32_t)(outer - half);
    for (int i = 0; i < nbuf; i++) {
        mine.bufs[i] = ptrs[i];
        rest.bufs[i] = (float *)ptrs[i] + (size_t)half * n * inner;
    }
    tnt_share(&mine, &rest);
    return 1;
}

/* Elementwise programs of at least this many element-steps (elements times steps)
   run in two parts (tnt_ew_shared): about 50-100 us of one core. */
static double tnt_split_ew_cost = 262144.0;
void tnt_set_split_ew_cost(double cost) { tnt_split_ew_cost = cost; }

/* Runs a large elementwise program in two parts, the second maybe on another worker
   (tnt_share), and returns 1; else runs nothing (0). Always split the same way, like
   products: whole blocks either way, so its values never depend on timing. ``ptrs``
   stays valid: tnt_share returns once both parts ran. */
static int tnt_ew_shared(const int32_t *prog, const double *consts, void *const *ptrs)
{
    int64_t cost = tnt_ew_cost(prog);
    if (cost == 0 || (double)cost < tnt_split_ew_cost)
        return 0;
    struct tnt_job mine = {0}, rest = {0};
    mine.rows_kind = rest.rows_kind = TNT_JOB_EW;
    mine.prog = rest.prog = prog;
    mine.consts = rest.consts = consts;
    mine.ptrs = rest.ptrs = ptrs;
    rest.part = 1;
    tnt_share(&mine, &rest);
    return 1;
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

/* Elementwise and row-wise tiles (csrc/ew.c, rows.c, typed.c): cl_arg is a tnt_ew_args
   followed by its program (nints int32: the kind, 0 for an ew.h program, else a
   rows.h kind, then its layout) and its constants (nconst doubles, 8-byte aligned). */
struct tnt_ew_args { int64_t key; int name, trace, nints, nconst; };
static struct starpu_codelet tnt_ew_cl;

static size_t tnt_ew_consts_at(int nints)
{
    size_t at = sizeof(struct tnt_ew_args) + (size_t)nints * sizeof(int32_t);
    return (at + 7) & ~(size_t)7;
}

static void tnt_ew_func(void *buffers[], void *cl_arg)
{
    const struct tnt_ew_args *a = cl_arg;
    struct starpu_task *task = starpu_task_get_current();
    int nbuf = STARPU_TASK_GET_NBUFFERS(task);
    const int32_t *prog = (const int32_t *)(a + 1);
    const double *consts = (const double *)((const char *)a + tnt_ew_consts_at(a->nints));
    void *blob = prog[0] == TNT_ROWS_INGRESS ? (void *)(uintptr_t)consts[0] : NULL;  /* held since submission */
    int64_t failed = tnt_task_failure(task, nbuf);
    if (failed) {
        if (blob)
            tnt_blob_release(blob);
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
    if (blob)
        tnt_blob_release(blob);
    if (rc != TNT_ROWS_OK) {  /* a bad index or target: the task fails as the CPU kernel would */
        tnt_native_failed(task, nbuf, _tnt_input_error(a->name, rc, bad[0], bad[1], bad[2]));
        return;
    }
    tnt_native_done(task, nbuf, a->key, starpu_worker_get_id(), a->name, a->trace, t0);
}

static int tnt_submit_ew(int nbuf, tnt_handle *handles, int *modes, const int32_t *rec, const double *consts,
                         int64_t key, int trace, uint32_t where)
{
    int name = rec[0], nints = rec[1], nconst = rec[2];
    const int32_t *prog = rec + 3;
    if (name < 0 || name >= TNT_NAMES || nconst < 0 || nconst > TNT_EW_TEMP - TNT_EW_CONST || nints < 1
        || nbuf > TNT_EW_CONST
        || (prog[0] == 0 ? tnt_ew_check(prog + 1, nints - 1, nconst, nbuf)
                         : tnt_rows_check(prog[0], prog + 1, nints - 1, nconst, nbuf)) != 0)
        return -EINVAL;
    void *blob = NULL;  /* the data an ingress reads: held until the task has run */
    if (prog[0] == TNT_ROWS_INGRESS && (blob = tnt_blob_hold(prog + 1, consts[0])) == NULL)
        return -EINVAL;
    size_t at = tnt_ew_consts_at(nints), size = at + (size_t)nconst * sizeof(double);
    struct tnt_ew_args *a = malloc(size);
    if (a == NULL) {
        if (blob)
            tnt_blob_release(blob);
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
    int rc = tnt_set_buffers(task, nbuf, handles, modes) ? -ENOMEM : starpu_task_submit(task);
    if (rc != 0 && blob)
        tnt_blob_release(blob);
    return rc;
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
}

static int tnt_submit_gemm(int nbuf, tnt_handle *handles, int *modes, const int *p, double alpha,
                           double beta, int64_t key, int trace, uint32_t where)
{
    int kind = p[0], ta = p[1], tb = p[2], m = p[3], n = p[4], k = p[5], dbl = p[6], name = p[7], batch = p[8];
    if (name < 0 || name >= TNT_NAMES || (dbl ? tnt_dgemm == NULL : tnt_sgemm == NULL) || batch < 0
        || (kind != TNT_GEMM && (dbl || batch != 1 || !tnt_spack || !tnt_scompute)))
        return -EINVAL;
    struct tnt_gemm_args *a = malloc(sizeof(*a));
    if (a == NULL)
        return -ENOMEM;
    struct tnt_gemm_args v = { key, kind, ta, tb, m, n, k, dbl, name, trace, batch, alpha, beta };
    *a = v;
    struct starpu_task *task = starpu_task_create();
    task->cl = &tnt_gemm_cl;
    task->cl_arg = a;
    task->cl_arg_size = sizeof(*a);
    task->cl_arg_free = 1;
    task->where = where;
    return tnt_set_buffers(task, nbuf, handles, modes) ? -ENOMEM : starpu_task_submit(task);
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
   after the tasks queued before it. */
int tnt_submit_batch(int n, int64_t key0, int *nbufs, tnt_handle *handles, int *modes,
                     int ngemm, int *gemm, double *coef, int new, int32_t *ew, double *ewc,
                     int trace, uint32_t where, int urgent_last, int *out)
{
    out[0] = 0;
    int off = 0, g = 0, e = 0;
    for (int i = 0; i < n; i++) {
        int r;
        if (g < ngemm && gemm[10 * g] == i) {
            r = tnt_submit_gemm(nbufs[i], handles + off, modes + off, gemm + 10 * g + 1, coef[2 * g],
                                coef[2 * g + 1], key0 + i, trace, where);
            g++;
        } else if (e < new && ew[0] == i) {  /* record: task index, name, nints, nconst, program */
            r = tnt_submit_ew(nbufs[i], handles + off, modes + off, ew + 1, ewc, key0 + i, trace, where);
            ewc += ew[3];
            ew += 4 + ew[2];
            e++;
        } else {
            r = tnt_submit(key0 + i, nbufs[i], handles + off, modes + off, where, urgent_last && i == n - 1);
        }
        if (r != 0) {
            out[1] = r;
            return i;
        }
        out[0] = i + 1;
        off += nbufs[i];
    }
    out[1] = 0;
    return n;
}

int64_t tnt_gemm_done(void) { return __atomic_load_n(&tnt_gemm_ndone, __ATOMIC_ACQUIRE); }

void tnt_gemm_take_stats(int worker, int name, int64_t *calls, double *seconds)
{
    *calls = __atomic_exchange_n(&tnt_gemm_calls[worker][name], 0, __ATOMIC_RELAXED);
    *seconds = 1e-9 * (double)__atomic_exchange_n(&tnt_gemm_ns[worker][name], 0, __ATOMIC_RELAXED);
}

int64_t tnt_gemm_event_count(void)
{
    STARPU_PTHREAD_MUTEX_LOCK(&tnt_ev_lock);
    int64_t n = tnt_nevents;
    STARPU_PTHREAD_MUTEX_UNLOCK(&tnt_ev_lock);
    return n;
}

/* Moves the oldest (at most max) trace events out; events recorded meanwhile stay. */
int64_t tnt_gemm_take_events(int64_t *keys, int *workers, int *names, double *t0, double *t1, int64_t max)
{
    STARPU_PTHREAD_MUTEX_LOCK(&tnt_ev_lock);
    int64_t n = tnt_nevents < max ? tnt_nevents : max;
    for (int64_t i = 0; i < n; i++) {
        keys[i] = tnt_events[i].key;
        workers[i] = tnt_events[i].worker;
        names[i] = tnt_events[i].name;
        t0[i] = tnt_events[i].t0;
        t1[i] = tnt_events[i].t1;
    }
    memmove(tnt_events, tnt_events + n, (tnt_nevents - n) * sizeof(*tnt_events));
    tnt_nevents -= n;
    STARPU_PTHREAD_MUTEX_UNLOCK(&tnt_ev_lock);
    return n;
}
