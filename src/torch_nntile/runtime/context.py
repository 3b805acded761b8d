"""The StarPU runtime behind a small boundary: register tiles, submit, wait.

Tile memory is allocated by StarPU (handles registered with no home buffer) at a
tile's first writer. A dead tile's handle keeps its memory as a spare for the next
tile of the same size, until no compile has asked for that size for a while or
``empty_cache()``. Kernels are Python callables run on StarPU's CPU workers; each
receives torch tensors that view the tile buffers StarPU hands to the task. The
matrix-product kernel (``kernels.Gemm``) is also run in C, calling BLAS with no
Python callback, where torch's BLAS exports it.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from torch_nntile import stats
from torch_nntile.kernels import Gemm, PackB

R, W, RW = 1, 2, 3  # STARPU_R, STARPU_W, STARPU_RW
WHERE_ANY = 0xFFFFFFFF  # task->where = -1: the codelet's own targets
WHERE_CPU = 1 << 1  # STARPU_CPU

TileSpec = tuple[int, torch.dtype, tuple[int, ...]]  # (nbytes, dtype, shape)
SPARE_COMPILES = 4  # compiles a size of spare handles may go unasked for before they are freed


class KernelError(RuntimeError):
    """An exception raised inside a tile kernel, re-raised from wait()."""


class Runtime:
    """One StarPU session. Create through ``torch_nntile.init_context``."""

    def __init__(self, ncpu: int, scheduler: str | None) -> None:
        if ncpu < 1:
            raise ValueError(f"ncpu must be at least 1, got {ncpu}")
        os.environ.setdefault("STARPU_HOME", os.path.join(tempfile.gettempdir(), "torch_nntile_starpu"))
        os.environ.setdefault("STARPU_SILENT", "1")
        from torch_nntile.runtime import _shim

        self.ffi, self.lib = _shim.ffi, _shim.lib
        _bind_callback(self.ffi)
        rc = self.lib.tnt_init(ncpu, (scheduler or "lws").encode())
        if rc != 0:
            raise RuntimeError(f"starpu_init failed with code {rc}")
        self.ncpu = int(self.lib.tnt_ncpu())
        stats.ensure_workers(int(self.lib.tnt_nworkers()))
        # Dry-run switches (read once per context): time the host side alone.
        self.skip_starpu = stats.env_flag("TORCH_NNTILE_SKIP_STARPU")
        global _SKIP_KERNELS
        _SKIP_KERNELS = stats.env_flag("TORCH_NNTILE_SKIP_KERNELS")
        self.alive = True
        self.paused = False
        self.where = WHERE_ANY
        self._next = 0
        # Matrix-product tiles call BLAS from C on the worker (no GIL) when the BLAS
        # that torch is linked with exports it and lets each worker keep it to one
        # thread; otherwise they run as torch calls.
        blas = _find_blas()
        self.lib.tnt_set_blas(*blas[:3], int(_SKIP_KERNELS))
        self.lib.tnt_set_pack(*blas[3:])
        self.native_gemm = bool(blas[0] and blas[2]) and not stats.env_flag("TORCH_NNTILE_PYTHON_KERNELS")
        self._gemm_dtypes = (torch.float32, torch.float64) if blas[1] else (torch.float32,)
        self._gemm_names: dict[str, int] = {}  # task name -> small id the C side counts under
        stats.COLLECTORS.append(self._collect_native)
        # Handles whose tiles died are kept, with their memory, for new tiles of the same
        # size: a training loop then reuses last step's buffers instead of allocating
        # (and page-faulting) ~100 MB per step. Spares of a size no compile has asked
        # for in SPARE_COMPILES compiles are unregistered (StarPU frees their memory).
        self._size: dict[Any, tuple[int, int]] = {}
        self._spares: dict[tuple[int, int], list[Any]] = {}
        self._wanted: dict[tuple[int, int], int] = {}  # size -> compile count when last asked for
        self._compiles = 0
        self.tasks_submitted = 0
        self._waited = (0, self.tasks_done())  # (submitted, done) at the last wait: progress counts from there
        # Idle StarPU workers poll (Debian's build has non-blocking drivers) and would
        # take the cores from the user's code, so workers are paused whenever nothing
        # is queued: by wait(), or by this thread once the tasks of a run drain (a
        # readout waits for its value only, so work goes on after it returns).
        self._lock = threading.Lock()  # guards paused and every pause/resume
        self._epoch = 0  # submissions so far
        self._drain = threading.Event()
        self._pauser = threading.Thread(target=self._pause_when_drained, name="torch_nntile-pauser", daemon=True)
        self.pause()
        self._pauser.start()
        global _CURRENT
        _CURRENT = self

    # -- data -------------------------------------------------------------
    def register(self, nelems: int, elemsize: int) -> Any:
        """A handle for a tile of ``nelems`` items: a spare of that size, else a new one.

        A spare's old content is garbage; every tile's first task writes it (W).
        """
        stats.tiles_added(1)
        key = (max(nelems, 1), elemsize)
        self._wanted[key] = self._compiles
        spares = self._spares.get(key)
        if spares:
            return spares.pop(0)  # the longest dead: its last readers are the likeliest done
        h = self.lib.tnt_register(key[0], elemsize)
        self._size[h] = key
        stats.COUNTS["tiles_registered"] += 1
        return h

    def spare_count(self) -> int:
        return sum(len(v) for v in self._spares.values())

    def release(self, handles: list[Any]) -> None:
        """Return dead tiles' handles to the spares (safe from any thread, after shutdown too)."""
        if self.alive:
            stats.tiles_added(-len(handles))
            size, spares = self._size, self._spares
            for h in handles:
                spares.setdefault(size[h], []).append(h)

    def empty_cache(self) -> None:
        """Unregister every spare handle now (StarPU frees their memory)."""
        self.check_alive()
        spares, self._spares = self._spares, {}
        for handles in spares.values():
            self._unregister(handles)

    def recycle(self, keep: int = SPARE_COMPILES) -> None:
        """After a compile: unregister spares of sizes not asked for in ``keep`` compiles."""
        self._compiles += 1
        now, wanted = self._compiles, self._wanted
        for key in [k for k, last in wanted.items() if now - last > keep]:
            del wanted[key]
        for key in [k for k in self._spares if k not in wanted]:
            self._unregister(self._spares.pop(key))

    def _unregister(self, handles: list[Any]) -> None:
        unreg, size = self.lib.tnt_unregister_submit, self._size
        for h in handles:
            del size[h]
            unreg(h)

    # -- tasks ------------------------------------------------------------
    def submit(self, tasks: list[tuple[Callable[..., None], list[Any], list[int], list[TileSpec], str]],
               notify: threading.Event | None = None) -> None:
        """Submit tasks (kernel, handles, modes, specs, name) in order; returns at once.

        ``notify`` is set once the last task has run and been accounted for.
        """
        self.check_alive()
        if self.skip_starpu:
            stats.COUNTS["tasks_skipped"] += len(tasks)
            return
        # The batch goes to StarPU in one C call that does not hold the GIL, so the
        # workers keep running (and Python kernels keep their turns) while it goes in.
        native = self.native_gemm and not _SKIP_KERNELS
        names, dtypes, tracing = self._gemm_names, self._gemm_dtypes, int(stats.TRACE is not None)
        f32 = torch.float32
        nbufs: list[int] = []
        hs: list[Any] = []
        ms: list[int] = []
        gemm: list[int] = []
        coef: list[float] = []
        closures = {}
        key0, n, last = self._next, len(tasks), len(tasks) - 1
        for i, (fn, handles, modes, specs, name) in enumerate(tasks):
            nbufs.append(len(handles))
            hs += handles
            ms += modes
            kind = type(fn)
            if native and (kind is Gemm or kind is PackB) and (i != last or notify is None):
                dt = specs[0][1]
                nid = names.get(name)
                if nid is None and len(names) < _GEMM_NAMES:
                    nid = names[name] = len(names)
                if nid is not None and kind is PackB:  # planned by the lowering only when natively run
                    gemm += (i, 2, 0, fn.tb, fn.m, fn.n, fn.k, 0, nid)
                    coef += (fn.alpha, 0.0)
                    continue
                if nid is not None and dt in dtypes and (dt is f32 or not fn.packed_b):
                    (m, nn), xs = specs[0][2], specs[1][2]
                    gemm += (i, int(fn.packed_b), fn.ta, fn.tb, m, nn, xs[0] if fn.ta else xs[1],
                             dt is torch.float64, nid)
                    coef += (fn.alpha, 1.0 if fn.accumulate else 0.0)
                    continue
            closures[key0 + i] = (fn, specs, name, notify if i == last else None)
        self._next = key0 + n
        _CLOSURES.update(closures)
        ffi = self.ffi
        rc = ffi.new("int *")
        with self._lock:
            done = self.lib.tnt_submit_batch(
                n, key0, ffi.new("int[]", nbufs), ffi.new("tnt_handle[]", hs), ffi.new("int[]", ms),
                len(gemm) // 9, ffi.new("int[]", gemm), ffi.new("double[]", coef), tracing, self.where, rc)
            self.tasks_submitted += done
            stats.COUNTS["tasks_submitted"] += done
            if self.paused:
                self.lib.tnt_resume()
                self.paused = False
            self._epoch += 1
        self._drain.set()
        if done < n:
            for key in range(key0 + done, key0 + n):
                _CLOSURES.pop(key, None)
            raise RuntimeError(f"starpu_task_submit failed ({rc[0]}) for {tasks[done][4]}")

    def _pause_when_drained(self) -> None:
        while True:
            self._drain.wait()
            with self._lock:
                if not self.alive:
                    return
                self._drain.clear()
                epoch = self._epoch
            self.lib.tnt_wait_all()
            with self._lock:
                if self.alive and epoch == self._epoch and not self.paused:
                    self.lib.tnt_pause()
                    self.paused = True

    @property
    def dry_run(self) -> str | None:
        """The active dry-run switch, if any: results are then not meaningful."""
        if self.skip_starpu:
            return "TORCH_NNTILE_SKIP_STARPU"
        return "TORCH_NNTILE_SKIP_KERNELS" if _SKIP_KERNELS else None

    def pack_size(self, m: int, n: int, k: int) -> int:
        """Bytes of a float32 B operand (k x n) packed for products with ``m`` rows, or 0
        when products do not run natively with a BLAS that packs."""
        if not self.native_gemm or _SKIP_KERNELS:
            return 0
        return int(self.lib.tnt_pack_size(m, n, k))

    def tasks_done(self) -> int:
        return sum(stats.DONE) + self.lib.tnt_gemm_done()

    def _collect_native(self) -> None:
        """Fold the counts, kernel seconds and trace events of C-run tasks into stats."""
        ffi, lib = self.ffi, self.lib
        calls, secs = ffi.new("int64_t *"), ffi.new("double *")
        for name, nid in self._gemm_names.items():
            for w, per in enumerate(stats.KERNELS):
                lib.tnt_gemm_take_stats(w, nid, calls, secs)
                if calls[0]:
                    st = per.setdefault(name, [0, 0.0])
                    st[0] += calls[0]
                    st[1] += secs[0]
        cap = lib.tnt_gemm_event_count()  # recorded only for tasks submitted while tracing
        if cap:
            keys, workers, nids, t0, t1 = bufs = (ffi.new("int64_t[]", cap), ffi.new("int[]", cap),
                                                  ffi.new("int[]", cap), ffi.new("double[]", cap),
                                                  ffi.new("double[]", cap))
            n = lib.tnt_gemm_take_events(*bufs, cap)
            trace = stats.TRACE
            if trace is not None:
                ids = {nid: name for name, nid in self._gemm_names.items()}
                trace.extend((keys[i], ids[nids[i]], workers[i], t0[i], t1[i]) for i in range(n))

    def wait(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Wait for every submitted task; raise the first kernel error, naming its op.

        ``progress(done, total)`` is called about every 0.1 s while tasks remain.
        """
        self.check_alive()
        sub0, done0 = self._waited
        total = self.tasks_submitted - sub0
        if progress is not None:
            while (done := self.tasks_done() - done0) < total and not _ERRORS:
                progress(done, total)
                time.sleep(0.1)
        self.pause()
        self._waited = (self.tasks_submitted, self.tasks_done())
        if progress is not None:
            progress(total, total)
        self.raise_errors()

    def raise_errors(self) -> None:
        """Raise the first kernel error since the last call, naming its op."""
        if _ERRORS:
            errs = list(_ERRORS)
            _ERRORS.clear()
            name, exc = errs[0]
            more = f" (and {len(errs) - 1} more failed tasks)" if len(errs) > 1 else ""
            raise KernelError(f"tile kernel of {name} failed: {type(exc).__name__}: {exc}{more}") from exc

    def pause(self) -> None:
        """Wait for every submitted task, then keep the workers from polling."""
        self.lib.tnt_wait_all()
        with self._lock:
            if not self.paused:
                self.lib.tnt_pause()
                self.paused = True

    def check_alive(self) -> None:
        if not self.alive:
            raise RuntimeError("torch_nntile: the runtime context has been shut down")

    def shutdown(self) -> None:
        if not self.alive:
            return
        try:
            self.wait()
        finally:
            self.recycle(keep=-1)
            with self._lock:
                if self.paused:
                    self.lib.tnt_resume()
                    self.paused = False
                self.alive = False
            self._drain.set()
            self._pauser.join()
            self.lib.tnt_wait_all()
            self._collect_native()
            stats.COLLECTORS.remove(self._collect_native)
            self.lib.tnt_shutdown()
            _TENSOR_CACHE.clear()


_CURRENT: Runtime | None = None
_CLOSURES: dict[int, tuple[Callable[..., None], list[TileSpec], str, threading.Event | None]] = {}
_ERRORS: list[tuple[str, BaseException]] = []
# (address, spec) -> tensor viewing that memory. StarPU reuses buffers, so the same
# tile comes back every step and building a tensor (~6 us) is paid once. The view
# does not own the memory; kernels must not change a tile tensor's metadata.
_TENSOR_CACHE: dict[tuple[int, TileSpec], torch.Tensor] = {}
_WORKERS_READY: set[int] = set()
_BOUND = False
_SKIP_KERNELS = False


def _bind_callback(ffi: Any) -> None:
    global _BOUND
    if _BOUND:
        return
    _BOUND = True
    perf = stats.perf
    cache = _TENSOR_CACHE
    kstats = stats.KERNELS
    done = stats.DONE

    @ffi.def_extern()
    def _tnt_kernel(key: int, ptrs: Any, n: int, worker: int) -> None:  # noqa: ANN001
        fn, specs, name, notify = _CLOSURES.pop(key)
        try:
            if worker not in _WORKERS_READY:
                torch.set_num_threads(1)
                _WORKERS_READY.add(worker)
            tensors = []
            for i in range(n):
                spec = specs[i]
                addr = ptrs[i]
                t = cache.get((addr, spec))
                if t is None:
                    t = _tile_tensor(addr, spec)
                tensors.append(t)
            t0 = perf()
            if not _SKIP_KERNELS:
                fn(*tensors)
            t1 = perf()
            st = kstats[worker].get(name)
            if st is None:
                kstats[worker][name] = [1, t1 - t0]
            else:
                st[0] += 1
                st[1] += t1 - t0
            trace = stats.TRACE
            if trace is not None:
                trace.append((key, name, worker, t0, t1))
        except BaseException as exc:  # noqa: BLE001 - re-raised from wait()
            _ERRORS.append((name, exc))
        finally:
            done[worker] += 1
            if notify is not None:
                notify.set()


def _tile_tensor(addr: int, spec: TileSpec) -> torch.Tensor:
    nbytes, dtype, shape = spec
    ffi = _CURRENT.ffi  # type: ignore[union-attr]
    flat = (torch.frombuffer(ffi.buffer(ffi.cast("void *", addr), nbytes), dtype=torch.uint8) if nbytes
            else torch.empty(0, dtype=torch.uint8))
    t = flat.view(dtype).view(shape)
    if len(_TENSOR_CACHE) > 100_000:
        _TENSOR_CACHE.clear()
    _TENSOR_CACHE[(addr, spec)] = t
    return t


_GEMM_NAMES = 16  # TNT_NAMES in the shim


_BLAS_SYMBOLS = ("sgemm_", "dgemm_", "MKL_Set_Num_Threads_Local",
                 "cblas_sgemm_pack_get_size", "cblas_sgemm_pack", "cblas_sgemm_compute")


def _find_blas() -> tuple[int, ...]:
    """Addresses of ``_BLAS_SYMBOLS`` in the library torch runs its CPU matrix products
    with (0 where it does not export one). MKL's ``MKL_Set_Num_Threads_Local`` is the C,
    by-value entry; the lower-case name takes a pointer."""
    import ctypes
    import glob

    out = [0] * len(_BLAS_SYMBOLS)
    libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
    for path in sorted(glob.glob(os.path.join(libdir, "libtorch_cpu*.so*"))):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for i, sym in enumerate(_BLAS_SYMBOLS):
            if not out[i] and hasattr(lib, sym):
                out[i] = ctypes.cast(getattr(lib, sym), ctypes.c_void_p).value or 0
    return tuple(out)


def current() -> Runtime | None:
    return _CURRENT

