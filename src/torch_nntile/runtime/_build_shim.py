"""cffi (API mode) build script for the StarPU shim.

Every StarPU struct stays in C; Python sees a handful of plain functions. Built at
install time against whichever of ``starpu-1.4`` / ``starpu-1.3`` pkg-config finds.
"""

from __future__ import annotations

import shlex
import subprocess

from cffi import FFI

CDEF = """
typedef void *tnt_handle;
extern "Python" void _tnt_kernel(int64_t key, uintptr_t *ptrs, int n, int worker);
int tnt_init(int ncpu, const char *sched);
void tnt_shutdown(void);
int tnt_ncpu(void);
int tnt_nworkers(void);
void tnt_pause(void);
void tnt_resume(void);
tnt_handle tnt_register(uint32_t nelems, size_t elemsize);
void tnt_unregister_submit(tnt_handle h);
void tnt_invalidate_submit(tnt_handle h);
int tnt_submit(int64_t key, int n, tnt_handle *handles, int *modes, int prio, uint32_t where);
int tnt_wait_all(void);
"""

SOURCE = r"""
#include <starpu.h>
#include <stdlib.h>
#include <string.h>

typedef void *tnt_handle;
static void _tnt_kernel(int64_t key, uintptr_t *ptrs, int n, int worker);

static void tnt_cpu_func(void *buffers[], void *cl_arg)
{
    struct starpu_task *task = starpu_task_get_current();
    int n = STARPU_TASK_GET_NBUFFERS(task);
    uintptr_t ptrs[n > 0 ? n : 1];
    for (int i = 0; i < n; i++)
        ptrs[i] = STARPU_VECTOR_GET_PTR(buffers[i]);
    _tnt_kernel((int64_t)(intptr_t)cl_arg, ptrs, n, starpu_worker_get_id());
}

static struct starpu_codelet tnt_cl;

int tnt_init(int ncpu, const char *sched)
{
    struct starpu_conf conf;
    starpu_conf_init(&conf);
    conf.ncpus = ncpu;
    conf.ncuda = 0;
    conf.nopencl = 0;
    conf.catch_signals = 0;
    if (sched != NULL && sched[0] != '\0')
        conf.sched_policy_name = sched;
    memset(&tnt_cl, 0, sizeof(tnt_cl));
    tnt_cl.where = STARPU_CPU;
    tnt_cl.cpu_funcs[0] = tnt_cpu_func;
    tnt_cl.nbuffers = STARPU_VARIABLE_NBUFFERS;
    tnt_cl.name = "nntile_tile_kernel";
    return starpu_init(&conf);
}

void tnt_shutdown(void) { starpu_shutdown(); }
int tnt_ncpu(void) { return (int)starpu_cpu_worker_get_count(); }
int tnt_nworkers(void) { return (int)starpu_worker_get_count(); }
void tnt_pause(void) { starpu_pause(); }
void tnt_resume(void) { starpu_resume(); }

tnt_handle tnt_register(uint32_t nelems, size_t elemsize)
{
    starpu_data_handle_t h;
    starpu_vector_data_register(&h, -1, 0, nelems, elemsize);
    return (tnt_handle)h;
}

void tnt_unregister_submit(tnt_handle h) { starpu_data_unregister_submit((starpu_data_handle_t)h); }
void tnt_invalidate_submit(tnt_handle h) { starpu_data_invalidate_submit((starpu_data_handle_t)h); }

int tnt_submit(int64_t key, int n, tnt_handle *handles, int *modes, int prio, uint32_t where)
{
    struct starpu_task *task = starpu_task_create();
    task->cl = &tnt_cl;
    task->cl_arg = (void *)(intptr_t)key;
    task->nbuffers = n;
    task->priority = prio;
    task->where = where;
    if (n > STARPU_NMAXBUFS) {
        task->dyn_handles = malloc(n * sizeof(starpu_data_handle_t));
        task->dyn_modes = malloc(n * sizeof(enum starpu_data_access_mode));
    }
    for (int i = 0; i < n; i++) {
        STARPU_TASK_SET_HANDLE(task, (starpu_data_handle_t)handles[i], i);
        STARPU_TASK_SET_MODE(task, (enum starpu_data_access_mode)modes[i], i);
    }
    return starpu_task_submit(task);
}

int tnt_wait_all(void) { return starpu_task_wait_for_all(); }
"""


def _pkg_flags() -> tuple[list[str], list[str]]:
    for pkg in ("starpu-1.4", "starpu-1.3"):
        try:
            cflags = subprocess.check_output(
                ["pkg-config", "--cflags", pkg], text=True, stderr=subprocess.DEVNULL
            )
            libs = subprocess.check_output(["pkg-config", "--libs", pkg], text=True)
        except (OSError, subprocess.CalledProcessError):
            continue
        return shlex.split(cflags), shlex.split(libs)
    raise RuntimeError(
        "StarPU development files not found (pkg-config starpu-1.4 / starpu-1.3); "
        "install them with: apt-get install libstarpu-dev"
    )


ffibuilder = FFI()
ffibuilder.cdef(CDEF)
_cflags, _libs = _pkg_flags()
ffibuilder.set_source(
    "torch_nntile.runtime._shim",
    SOURCE,
    extra_compile_args=_cflags + ["-O2"],
    extra_link_args=_libs,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=False)
