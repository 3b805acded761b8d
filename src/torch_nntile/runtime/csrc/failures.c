/* Failures carried by tiles (the state in each handle's user_data, what a task
   inherits and passes on, the tasks that mark a tile failed, abandoning what has not
   started), waiting for all tasks, and the counts, kernel seconds and trace events of
   the tasks run in C. */
#include <starpu.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shim_internal.h"

/* The state of a tile's current value, in its handle's user_data (an intptr_t):
   0: computed; 2 * id: not computed, because of failure ``id`` (the next task that
   writes the tile and runs clears it); 2 * id + 1: the tile has no memory (failure
   ``id``, for good). Tasks on a handle are ordered by StarPU, so a task reads the
   state its predecessors left. */
int64_t tnt_abandon_id;  /* nonzero at exit: tasks that have not started skip their kernels */

/* The failure a task inherits: from a tile it reads that holds none, or one without memory.
   Every kernel calls it first: out of core, it counts the kernels that began. */
int64_t tnt_task_failure(struct starpu_task *task, int n)
{
    if (tnt_watch)
        tnt_kernel_started();
    for (int i = 0; i < n; i++) {
        intptr_t s = (intptr_t)starpu_data_get_user_data(STARPU_TASK_GET_HANDLE(task, i));
        if (s != 0 && ((s & 1) || (STARPU_TASK_GET_MODE(task, i) & STARPU_R)))
            return (int64_t)(s >> 1);
    }
    return __atomic_load_n(&tnt_abandon_id, __ATOMIC_RELAXED);
}

/* After a task: what it wrote holds a value, or not (``failure``). */
void tnt_task_wrote(struct starpu_task *task, int n, int64_t failure)
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

/* Marks the tile it writes as failed (``cl_arg``): stands in for a task that never ran. */
void tnt_fail_func(void *buffers[], void *cl_arg)
{
    (void)buffers;
    struct starpu_task *task = starpu_task_get_current();
    tnt_task_wrote(task, STARPU_TASK_GET_NBUFFERS(task), (int64_t)(intptr_t)cl_arg);
}

struct starpu_codelet tnt_fail_cl;

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

int tnt_wait_all(void) { return starpu_task_wait_for_all(); }

/* The tasks run in C: how many are done, their counts and kernel nanoseconds per
   worker and name, and their trace events (under tnt_ev_lock). */
static int64_t tnt_gemm_ndone;
static int64_t tnt_gemm_calls[STARPU_NMAXWORKERS][TNT_NAMES];
static int64_t tnt_gemm_ns[STARPU_NMAXWORKERS][TNT_NAMES];
static starpu_pthread_mutex_t tnt_ev_lock = STARPU_PTHREAD_MUTEX_INITIALIZER;
struct tnt_event { int64_t key; int worker, name; double t0, t1; };
static struct tnt_event *tnt_events;
static int64_t tnt_nevents, tnt_evcap;

double tnt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);  /* the clock of Python's time.perf_counter */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* After a task run in C: its count and kernel seconds under its name, a trace event
   when tracing, its outputs marked computed. */
void tnt_native_done(struct starpu_task *task, int nbuf, int64_t key, int w, int name, int trace,
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
void tnt_native_failed(struct starpu_task *task, int nbuf, int64_t failure)
{
    tnt_task_wrote(task, nbuf, failure);
    __atomic_add_fetch(&tnt_gemm_ndone, 1, __ATOMIC_RELEASE);
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
