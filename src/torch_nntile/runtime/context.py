"""The StarPU runtime behind a small boundary: register tiles, submit, wait.

``Runtime`` starts and stops one StarPU session and is made of parts, one a module:
tile memory and its spares (``memory``), task submission with a C or Python callback
per task (``submission``), the workers' pausing and waits in slices (``workers``).
Failures carried by tiles are in ``failures``, torch's BLAS and host copies in
``host``. See docs/architecture/kernels.md, docs/architecture/memory.md and
docs/architecture/failures.md.
"""

from __future__ import annotations

import os
import tempfile
import threading
from typing import Any

import torch

from torch_nntile import stats
from torch_nntile.kernels import native
from torch_nntile.runtime import submission
from torch_nntile.runtime.agree import Agreement, timeout_s
from torch_nntile.runtime.cuda_libs import import_shim
from torch_nntile.runtime.failures import Failure, TileMemoryError
from torch_nntile.runtime.hints import Hints, cuda_hints
from torch_nntile.runtime.host import _find_blas, _warm_vector_math
from torch_nntile.runtime.memory import TileMemory
from torch_nntile.runtime.ooc import OutOfCore, Swap
from torch_nntile.runtime.submission import _CLOSURES, _TENSOR_CACHE, _WORKERS_READY, WHERE_ANY, Submission, _bind_callback
from torch_nntile.runtime.workers import Latch, Workers, _worker_nice

# What mpirun (OpenMPI's, or a PMI launcher) tells the processes it starts.
_RANK_VARS, _SIZE_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"), ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def mpi_launched() -> bool:
    """Whether this process was started by mpirun: ``init_context()`` then joins the MPI
    world (StarPU-MPI initialises MPI and StarPU)."""
    return any(v in os.environ for v in _SIZE_VARS)


def launch_rank_size() -> tuple[int, int]:
    """This process's rank and the world's size as its launcher set them (0 and 1 when
    not started by mpirun)."""
    rank = next((int(os.environ[v]) for v in _RANK_VARS if v in os.environ), 0)
    size = next((int(os.environ[v]) for v in _SIZE_VARS if v in os.environ), 1)
    return rank, size


def export_launch_env() -> None:
    """Started by mpirun: the variables ``torch.distributed``'s ``env://`` rendezvous reads
    (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), where not
    set, as torchrun would set them: an unchanged ``init_process_group("nntile")`` then
    joins the same world."""
    if not mpi_launched():
        return
    rank, size = launch_rank_size()
    local = os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", str(rank))
    for k, v in (("RANK", str(rank)), ("WORLD_SIZE", str(size)), ("LOCAL_RANK", local),
                 ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        os.environ.setdefault(k, v)


class Runtime(TileMemory, Submission, Workers, Swap, Agreement):
    """One StarPU session. Create through ``torch_nntile.init_context``."""

    def __init__(self, ncpu: int, scheduler: str | None, ooc: OutOfCore | None = None, ncuda: int = 0) -> None:
        if ncpu < 1:
            raise ValueError(f"ncpu must be at least 1, got {ncpu}")
        if ncuda < -1:
            raise ValueError(f"ncuda must be -1 (every GPU), 0 or a count of GPUs, got {ncuda}")
        os.environ.setdefault("STARPU_HOME", os.path.join(tempfile.gettempdir(), "torch_nntile_starpu"))
        os.environ.setdefault("STARPU_SILENT", "1")
        _shim = import_shim()
        self.ffi, self.lib = _shim.ffi, _shim.lib
        if ncuda and ooc is not None:
            raise NotImplementedError("torch_nntile: CUDA workers with out-of-core host memory are not supported yet")
        _bind_callback(self.ffi)
        _warm_vector_math()
        nice = _worker_nice()
        # StarPU reads these once, at init, and lets them override its configuration: set
        # them to what was asked (an explicit ncpu wins over STARPU_NCPU, which only gives
        # the default: session.default_ncpu), then put the user's back
        init_env = {"STARPU_NCPU": str(ncpu)}
        if ooc is not None:  # the RAM budget of out-of-core
            init_env["STARPU_LIMIT_CPU_MEM"] = str(ooc.limit_mib)
            self.lib.tnt_set_managed(ooc.memory_limit)
        mpi = mpi_launched()
        if mpi and not self.lib.tnt_built_with_mpi():
            raise RuntimeError("torch_nntile: started by mpirun, but this build's StarPU has no StarPU-MPI "
                               "(build it with scripts/build_starpu.sh, which `make setup` runs)")
        saved = {k: os.environ.get(k) for k in init_env}
        os.environ.update(init_env)
        try:
            # CUDA workers next to CPU ones: a scheduler that weighs where a task runs best
            # and what its tiles' moves cost; CPU workers alone: locality work stealing.
            self.scheduler = scheduler or ("dmdas" if ncuda else "lws")
            rc = self.lib.tnt_init(ncpu, ncuda, self.scheduler.encode(), nice, int(mpi))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        if rc != 0:
            self.lib.tnt_set_managed(0)
            raise RuntimeError(f"{'starpu_mpi_init_conf' if mpi else 'starpu_init'} failed with code {rc}"
                               + (" (CUDA workers, but cuBLAS could not be found)" if ncuda and rc == -19 else ""))
        self.ncuda = int(self.lib.tnt_ncuda())
        try:
            submission.start_cuda(self, ncuda)
        except Exception:
            self.lib.tnt_shutdown()
            raise
        self.rank, self.world_size = int(self.lib.tnt_mpi_rank()), int(self.lib.tnt_mpi_size())
        # Over several ranks every tile has an owner and a tag (runtime/csrc/dist.c): each
        # handle holds one value for its whole life (no spares), so that the ranks, which
        # submit the same tasks, agree on them without talking.
        self.distributed = self.world_size > 1
        self._agreements = 0  # the ranks' checks so far (runtime/agree.py)
        try:
            if self.distributed and ooc is not None:
                raise NotImplementedError("torch_nntile: out-of-core memory over several processes is not supported yet")
            self._timeout = timeout_s() if self.distributed else 0.0
        except Exception:
            self.lib.tnt_shutdown()
            self.lib.tnt_set_managed(0)
            raise
        if self.world_size > 1:
            self.install_excepthook()
        self.ooc = ooc
        self._stuck: str | None = None  # out of core, why StarPU is stuck (Swap.check_stall)
        self._hints: Hints | None = cuda_hints(self.ncuda)  # graph-aware evictions (runtime/hints.py)
        if ooc is not None:
            self._start_swap(ooc)
        self.ncpu = int(self.lib.tnt_ncpu())
        stats.ensure_workers(int(self.lib.tnt_nworkers()))
        # Dry-run switches (read once per context): time the host side alone.
        self.skip_starpu = stats.env_flag("TORCH_NNTILE_SKIP_STARPU")
        submission._SKIP_KERNELS = stats.env_flag("TORCH_NNTILE_SKIP_KERNELS")
        self.alive = True
        self.paused = False
        self.where = WHERE_ANY
        self._next = 0
        self.sent = 0  # tasks of the last submit() that reached StarPU (read when it raised)
        self._abandoned = False
        # Matrix-product tiles call BLAS from C on the worker (no GIL) when the BLAS
        # that torch is linked with exports it and lets each worker keep it to one
        # thread; otherwise they run as torch calls.
        blas = _find_blas()
        self.lib.tnt_set_blas(*blas[:3], int(submission._SKIP_KERNELS))
        self.lib.tnt_set_aten(native.ATEN_RUNNER)  # ops with no tiled kernel, called from C++ (backend/aten_calls.py)
        # MKL's packed B is opaque and does not survive a move to disk and back (the
        # losses went wrong). Out of core, products pack nothing: tiles StarPU may not
        # move would sit outside the limit (a medium GPT-2's step packs 389 MiB). The
        # results then differ from an in-memory run's by rounding (plain sgemm instead
        # of the packed one); with packing off on both, they are the same bits.
        # Over several ranks a packed B read by a product on another rank would be sent
        # there, and MKL's packed format does not survive the move either (SIGFPE in MKL).
        # TORCH_NNTILE_NO_PACK=1 packs nothing in one process too: the same bits as over several.
        # With CUDA workers a product may run on a GPU: nothing is packed for the host's BLAS.
        self.packs_b = (ooc is None and not self.distributed and not self.ncuda
                        and not stats.env_flag("TORCH_NNTILE_NO_PACK"))
        self.lib.tnt_set_pack(*(blas[3:] if self.packs_b else (0, 0, 0)))
        # Float32 products on a B tile shared by several row tiles (packed once), and
        # large ones on a B read as stored, run the shim's own AVX-512 kernels on AMD
        # CPUs, where they beat MKL's; elsewhere MKL's packed API and sgemm.
        self.own_sgemm = bool(self.lib.tnt_set_own_sgemm(int(not stats.env_flag("TORCH_NNTILE_MKL_PACK"))))
        self.native_gemm = bool(blas[0] and blas[2]) and not stats.env_flag("TORCH_NNTILE_PYTHON_KERNELS")
        self._gemm_dtypes = (torch.float32, torch.float64) if blas[1] else (torch.float32,)
        # Elementwise float32 tiles whose kernels have a C program (kernels.native) run it.
        self.native_ew = not stats.env_flag("TORCH_NNTILE_PYTHON_KERNELS")
        self._gemm_names: dict[str, int] = {}  # task name -> small id the C side counts under
        stats.COLLECTORS.append(self._collect_native)
        # Handles whose tiles died are kept, with their memory, for new tiles of the same
        # size: a training loop then reuses last step's buffers instead of allocating
        # (and page-faulting) ~100 MB per step. Spares of a size no compile has asked
        # for in SPARE_COMPILES compiles are unregistered (their memory freed). Tiles
        # die on any thread (a kernel closure can hold the last reference), so the
        # spares are guarded by a lock; reentrant, as a tile can die (garbage
        # collection) while the lock is held.
        self._size: dict[Any, tuple[int, int]] = {}  # every registered handle -> (items, item size)
        self._owner: dict[Any, int] = {}  # over several ranks, every registered handle -> its owner as registered
        self._turn = 0  # next_turn()
        self._by_tag: dict[int, Any] = {}  # over several ranks, every registered handle by its MPI tag
        self._spares: dict[tuple[int, int], list[Any]] = {}
        self._spare_lock = threading.RLock()
        self._wanted: dict[tuple[int, int], int] = {}  # size -> compile count when last asked for
        self._compiles = 0
        self._alloc_ok = self.ffi.new("int *")
        self._no_memory: dict[Any, Failure] = {}  # handles that got no memory -> their failure
        self._unnamed: dict[Any, Failure] = {}  # ... whose failure awaits the name of the task writing it
        self._dead_no_memory: list[Any] = []  # ... whose tiles died: unregistered at the next compile
        self.tasks_submitted = 0
        self._waited = (0, self.tasks_done())  # (submitted, done) at the last wait: progress counts from there
        # Idle StarPU workers poll (Debian's build has non-blocking drivers) and would
        # take the cores from the user's code, so workers are paused whenever nothing
        # is queued: by wait(), or by this thread once the tasks of a run drain (a
        # readout waits for its value only, so work goes on after it returns). The
        # thread also tells wait() when everything submitted is done: wait() itself
        # then blocks on a condition in slices, not inside StarPU, so Ctrl-C gets through.
        self._lock = threading.Lock()  # guards paused and every pause/resume
        self._epoch = 0  # submissions so far
        self._drained = 0  # every task of submissions up to this one has run
        self._waiters: list[tuple[int, Latch]] = []  # (target, latch) of wait()s: set once target is drained
        self._drain = threading.Event()
        self._trimmed = 0.0  # time.monotonic() of the last tnt_trim
        self._pauser = threading.Thread(target=self._pause_when_drained, name="torch_nntile-pauser", daemon=True)
        self.lib.tnt_pause()
        self.paused = True
        self._pauser.start()
        submission._CURRENT = self

    def check_alive(self) -> None:
        if not self.alive:
            raise RuntimeError("torch_nntile: the runtime context has been shut down")
        if self._stuck is not None:
            raise TileMemoryError(self._stuck)

    def shutdown(self, abandon: bool = False) -> None:
        """Wait for the submitted tasks (``abandon``: skip those not started), free every
        tile's memory and stop StarPU. An interrupted wait abandons the rest."""
        if not self.alive:
            return
        if self.distributed:  # every rank stops here, or none (StarPU-MPI's shutdown waits for all)
            self.agree("shutdown", [])
        if self._stuck is not None:  # StarPU waits forever: leave it to the process's exit
            self.alive = False
            return
        try:
            if abandon:
                self.abandon()
            self.wait()
        except BaseException:
            self.abandon()
            raise
        finally:
            if self._stuck is None:
                self._stop()
            else:  # the wait found StarPU stuck (out of core): nothing more can be waited for
                self.alive = False

    def _stop(self) -> None:
        """Stop the pauser and StarPU, and free every tile's memory (after the last wait)."""
        with self._lock:
            if self.paused:
                self.lib.tnt_resume()
                self.paused = False
            self.alive = False
        self._drain.set()
        self._pauser.join()
        self.lib.tnt_wait_all()
        # Every tile's memory is ours: free it (tensors of this context are dead now).
        stats.tiles_added(-(len(self._size) - self.spare_count() - len(self._dead_no_memory)))
        for h in self._size:
            self.lib.tnt_unregister_now(h)
        self._size.clear()
        self._owner.clear()
        self._by_tag.clear()
        self._spares.clear()
        self._no_memory.clear()
        self._unnamed.clear()
        self._dead_no_memory.clear()
        self._collect_native()
        stats.COLLECTORS.remove(self._collect_native)
        if self.ooc is not None:
            self._stop_swap()
        self.lib.tnt_shutdown()
        self.lib.tnt_set_managed(0)
        _TENSOR_CACHE.clear()
        _WORKERS_READY.clear()
        _CLOSURES.clear()
        submission.stop_cuda()


def built_with_cuda() -> bool:
    """Whether the shim's StarPU has CUDA workers."""
    return bool(import_shim().lib.tnt_built_with_cuda())


def current() -> Runtime | None:
    return submission._CURRENT
