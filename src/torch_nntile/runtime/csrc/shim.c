/* The StarPU shim (interface in shim.h), in files by concern that share what
   shim_internal.h declares: StarPU's start and stop and the workers (here), tile
   memory and handles (memory.c), task submission in batches and the codelets that run
   tiles in C (elementwise and row programs from ew.c / rows.c / typed.c) or through
   the Python callback (submit.c), products through BLAS (products.c), large tasks
   shared with an idle worker (share.c), tasks placed on the ranks of an MPI world
   (dist.c), failures carried by tiles, waits, and the
   per-kernel counts and trace events (failures.c).

   Here: starting StarPU (its codelets, its workers' niceness and idle hook) and
   stopping it, pausing and resuming the workers, and trimming malloc's heaps. */
#include <starpu.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <time.h>

#include "shim_internal.h"

/* Idle CPU workers of this StarPU build poll for tasks without ever blocking, each at
   100% of a core, while Python records the next tasks on the same cores. A worker
   idle for longer than TNT_SPIN_US (a gap in the work, not the wait for a task's
   inputs, which is shorter) naps TNT_NAP_NS at a time, so recording and the busy
   workers get the cores; it picks up new work at most about one nap late. (Once
   nothing is submitted at all the workers are paused instead: Runtime.pause.) */
#define TNT_SPIN_US 100.0
#define TNT_NAP_NS 20000L

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

#ifdef TNT_MPI
#include <starpu_mpi.h>
#endif
#include <errno.h>

static int tnt_mpi_on;  /* this process joined the MPI world at tnt_init */

int tnt_built_with_mpi(void)
{
#ifdef TNT_MPI
    return 1;
#else
    return 0;
#endif
}

int tnt_init(int ncpu, int ncuda, const char *sched, int nice, int mpi)
{
    struct starpu_conf conf;
    starpu_conf_init(&conf);
    conf.ncpus = ncpu;
    conf.ncuda = ncuda;  /* -1: every GPU; without CUDA in StarPU, only 0 (see tnt_cuda_init) */
    conf.nopencl = 0;
    conf.catch_signals = 0;
    if (sched != NULL && sched[0] != '\0')
        conf.sched_policy_name = sched;
    tnt_codelet(&tnt_cl, tnt_cpu_func, 0, "nntile_tile_kernel");
    tnt_codelet(&tnt_fail_cl, tnt_fail_func, 1, "nntile_fail");
    tnt_codelet(&tnt_free_cl, tnt_free_func, 1, "nntile_free");
    tnt_codelet(&tnt_init_cl, tnt_init_func, 1, "nntile_init");
    __atomic_store_n(&tnt_abandon_id, 0, __ATOMIC_RELAXED);
    /* Workers inherit this thread's signal mask: with SIGINT blocked there, Ctrl-C is
       delivered to a Python thread, which can act on it, never to a worker. */
    sigset_t intr, old;
    sigemptyset(&intr);
    sigaddset(&intr, SIGINT);
    pthread_sigmask(SIG_BLOCK, &intr, &old);
    int rc;
    if (mpi) {  /* StarPU-MPI initialises MPI, then StarPU with this configuration */
#ifdef TNT_MPI
        rc = starpu_mpi_init_conf(NULL, NULL, 1, MPI_COMM_WORLD, &conf);
        tnt_mpi_on = rc == 0;
        if (tnt_mpi_on)
            tnt_dist_start(starpu_mpi_world_rank(), starpu_mpi_world_size());
#else
        rc = -ENOSYS;
#endif
    } else {
        rc = starpu_init(&conf);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0 && tnt_cuda_init(ncuda) != 0) {  /* CUDA workers without cuBLAS: none at all */
        tnt_shutdown();
        rc = -ENODEV;
    }
    if (rc == 0) {
        tnt_cuda_codelet(&tnt_cl, TNT_CUDA_PYTHON);
        starpu_idle_hook_register(tnt_idle_hook, NULL);
        if (nice > 0)
            starpu_execute_on_each_worker(tnt_nice_worker, &nice, STARPU_CPU);
    }
    return rc;
}

void tnt_shutdown(void)
{
    tnt_cuda_shutdown();
#ifdef TNT_MPI
    if (tnt_mpi_on) {  /* StarPU's shutdown, then MPI's (StarPU-MPI initialised it) */
        tnt_mpi_on = 0;
        tnt_dist_start(0, 1);
        starpu_mpi_shutdown();
        return;
    }
#endif
    starpu_shutdown();
}

/* This process's rank and the world's size (0 and 1 outside MPI). */
int tnt_mpi_rank(void)
{
#ifdef TNT_MPI
    if (tnt_mpi_on)
        return starpu_mpi_world_rank();
#endif
    return 0;
}

int tnt_mpi_size(void)
{
#ifdef TNT_MPI
    if (tnt_mpi_on)
        return starpu_mpi_world_size();
#endif
    return 1;
}
int tnt_ncpu(void) { return (int)starpu_cpu_worker_get_count(); }
int tnt_nworkers(void) { return (int)starpu_worker_get_count(); }
void tnt_pause(void) { starpu_pause(); }
void tnt_resume(void) { starpu_resume(); }

/* Give the free pages of malloc's heaps back to the system. Kernels' temporaries of
   every size, made and freed on several threads, leave the heaps fragmented: free
   memory that malloc keeps, and the process's resident size grew by tens of MiB a
   step (a medium GPT-2) without it. */
void tnt_trim(void)
{
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}
