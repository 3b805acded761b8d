/* Out of core: the swap disk StarPU evicts tiles to, and what it moved.

   The disk node is StarPU's O_DIRECT back end (the page cache would keep evicted tiles
   in RAM) with one change: each object's space is reserved (posix_fallocate) when
   StarPU creates it. StarPU creates objects sparse and treats a failed write as fatal
   (it aborts the process); with the space reserved, a full disk refuses the eviction
   instead, which is counted here and reported by the runtime's stall watchdog.

   Profiling is on out of core, so that StarPU counts the bytes of each bus and the
   time workers waited for data; tnt_ooc_stats adds them up (StarPU resets its
   counters at each read). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <starpu.h>
#include <stdlib.h>
#include <unistd.h>

#include "shim_internal.h"

/* The first fields of StarPU 1.4's unistd disk objects (disk_unistd_global.h). The
   StarPU is the project's own build of a pinned version (scripts/build_starpu.sh). */
struct tnt_unistd_obj { int descriptor; char *path; };

static struct starpu_disk_ops tnt_disk_ops;
static int tnt_disk_node = -1;
static int64_t tnt_refused, tnt_refused_bytes, tnt_refused_errno;
int tnt_watch;  /* out of core: count the kernels that begin */
static int64_t tnt_started;  /* kernels that began (tnt_task_failure): the watchdog's sign of life */
static double tnt_sums[3];  /* bytes RAM -> disk, disk -> RAM, seconds workers waited for data */
static int64_t tnt_hinted[2];  /* hinted evictions done, and declined by StarPU (the tile in use) */

void tnt_kernel_started(void) { __atomic_add_fetch(&tnt_started, 1, __ATOMIC_RELAXED); }
int64_t tnt_kernels_started(void) { return __atomic_load_n(&tnt_started, __ATOMIC_RELAXED); }

static void *tnt_disk_alloc(void *base, size_t size)
{
    void *obj = starpu_disk_unistd_o_direct_ops.alloc(base, size);
    int rc = obj == NULL ? (errno ? errno : EIO) : 0;
    if (obj != NULL) {
        struct tnt_unistd_obj *o = obj;
        int fd = o->descriptor >= 0 ? o->descriptor : open(o->path, O_RDWR);
        rc = fd < 0 ? errno : posix_fallocate(fd, 0, (off_t)size);
        if (o->descriptor < 0 && fd >= 0)
            close(fd);
        if (rc != 0) {
            starpu_disk_unistd_o_direct_ops.free(base, obj, size);
            obj = NULL;
        }
    }
    if (obj == NULL) {
        __atomic_add_fetch(&tnt_refused, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&tnt_refused_bytes, (int64_t)size, __ATOMIC_RELAXED);
        __atomic_store_n(&tnt_refused_errno, (int64_t)rc, __ATOMIC_RELAXED);
    }
    return obj;
}

/* Graph-aware hints (runtime/hints.py): the tiles a task evicts once it has run, their
   next read being too far off for them to stay in memory until then (out of core, RAM;
   with CUDA workers and a GPU memory limit, the GPUs'). StarPU's
   starpu_data_wont_use cannot say it: for a tile without a home node it only
   schedules a copy to disk, and leaves the tile where it is in the LRU order. */
struct tnt_hints { int n; starpu_data_handle_t h[]; };

/* Hints of n handles, at positions ``at`` of ``handles``; NULL without memory. */
struct tnt_hints *tnt_hints_make(int n, const int32_t *at, const tnt_handle *handles)
{
    struct tnt_hints *x = malloc(sizeof(*x) + (size_t)n * sizeof(starpu_data_handle_t));
    if (x == NULL)
        return NULL;
    x->n = n;
    for (int i = 0; i < n; i++)
        x->h[i] = (starpu_data_handle_t)handles[at[i]];
    return x;
}

/* A task's epilogue: it runs before the task's dependents are released, so no handle
   here has been unregistered. The eviction writes the tile to disk now, on this worker
   (as StarPU's own evictions do when a worker needs room); StarPU declines it where a
   task or a transfer holds the tile. */
void tnt_hints_run(void *arg)
{
    struct tnt_hints *x = arg;
    for (int i = 0; i < x->n; i++) {
        if (tnt_cuda_on) {  /* GPU memory: a tile with a home in RAM; StarPU writes it back when
                               the bus is idle and evicts it from the GPUs first */
            starpu_data_wont_use(x->h[i]);
            __atomic_add_fetch(&tnt_hinted[0], 1, __ATOMIC_RELAXED);
            continue;
        }
        int rc = starpu_data_evict_from_node(x->h[i], STARPU_MAIN_RAM);
        __atomic_add_fetch(&tnt_hinted[rc == 0 ? 0 : 1], 1, __ATOMIC_RELAXED);
    }
}

/* A disk node of nbytes in the folder path. Its memory node, or a negative errno. */
int tnt_add_disk(const char *path, int64_t nbytes)
{
    tnt_disk_ops = starpu_disk_unistd_o_direct_ops;
    tnt_disk_ops.alloc = tnt_disk_alloc;
    starpu_profiling_status_set(STARPU_PROFILING_ENABLE);
    tnt_watch = 1;
    tnt_refused = tnt_refused_bytes = tnt_refused_errno = 0;
    for (int i = 0; i < 3; i++)
        tnt_sums[i] = 0;
    tnt_hinted[0] = tnt_hinted[1] = 0;
    tnt_disk_node = starpu_disk_register(&tnt_disk_ops, (void *)path, (starpu_ssize_t)nbytes);
    return tnt_disk_node;
}

static void tnt_take_bus(int src, int dst, double *bytes)
{
    struct starpu_profiling_bus_info info;
    int bus = starpu_bus_get_id(src, dst);
    if (bus < 0 || starpu_bus_get_profiling_info(bus, &info) != 0)
        return;
    *bytes += (double)info.transferred_bytes;
}

/* out: bytes evicted to disk, bytes loaded from it, seconds workers waited for data,
   evictions the full disk refused, their bytes, the errno of the last refusal; hinted
   evictions done and declined. */
void tnt_ooc_stats(double *out)
{
    if (tnt_disk_node >= 0) {
        tnt_take_bus(STARPU_MAIN_RAM, tnt_disk_node, &tnt_sums[0]);
        tnt_take_bus(tnt_disk_node, STARPU_MAIN_RAM, &tnt_sums[1]);
        unsigned n = starpu_worker_get_count();
        for (unsigned w = 0; w < n; w++) {
            struct starpu_profiling_worker_info info;
            if (starpu_profiling_worker_get_info((int)w, &info) == 0)
                tnt_sums[2] += starpu_timing_timespec_to_us(&info.waiting_time) * 1e-6;
        }
    }
    out[0] = tnt_sums[0];
    out[1] = tnt_sums[1];
    out[2] = tnt_sums[2];
    out[3] = (double)__atomic_load_n(&tnt_refused, __ATOMIC_RELAXED);
    out[4] = (double)__atomic_load_n(&tnt_refused_bytes, __ATOMIC_RELAXED);
    out[5] = (double)__atomic_load_n(&tnt_refused_errno, __ATOMIC_RELAXED);
    out[6] = (double)__atomic_load_n(&tnt_hinted[0], __ATOMIC_RELAXED);
    out[7] = (double)__atomic_load_n(&tnt_hinted[1], __ATOMIC_RELAXED);
}

/* After shutdown: no disk node any more. */
void tnt_disk_gone(void) { tnt_disk_node = -1; tnt_watch = 0; }
