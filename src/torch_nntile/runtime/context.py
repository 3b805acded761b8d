"""The StarPU runtime behind a small boundary: register tiles, submit, wait.

``Runtime`` owns the workers, tile memory and its spares, task submission (C or Python
callback per task), waits in slices, and failures carried by tiles (``Failure``,
``KernelError``, ``TileMemoryError``). See docs/architecture/kernels.md,
docs/architecture/memory.md and docs/architecture/failures.md.
"""

from __future__ import annotations

import _thread
import collections
import functools
import itertools
import os
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

import torch

from torch_nntile import stats
from torch_nntile.kernels import Gemm, Kernel, PackB
from torch_nntile.kernels.native import input_error as native_input_error
from torch_nntile.kernels.native import record as ew_record
from torch_nntile.runtime.interrupts import SHIELD

R, W, RW = 1, 2, 3  # STARPU_R, STARPU_W, STARPU_RW
WHERE_ANY = 0xFFFFFFFF  # task->where = -1: the codelet's own targets
WHERE_CPU = 1 << 1  # STARPU_CPU

TileSpec = tuple[int, torch.dtype, tuple[int, ...]]  # (nbytes, dtype, shape)
TRIM_S = 0.25  # at most this often, when the workers go idle, malloc's free pages go back to the system
SPARE_COMPILES = 4  # compiles a size of spare handles may go unasked for before they are freed
SLICE_S = 0.05  # longest a blocking wait goes without looking at pending signals (Ctrl-C)
WORKER_NICE = 5
"""How much nicer than the process the CPU workers' threads run (``TORCH_NNTILE_WORKER_NICE``
overrides; 0 keeps them at the process's priority). The thread that records ops makes
the workers' work: where a worker and it share a core, the recording should run first.
At 0, on the 2-core machine a small GPT-2 step's main thread waited 18 ms a step for a
core held by busy workers (runnable, not running); at 5, about 8 ms (10-11 against 7
when the machine was quiet). 5, not more: against another process on its core, such
as a data loader's, a worker then still gets about a quarter of it."""


def _worker_nice() -> int:
    """WORKER_NICE, or ``TORCH_NNTILE_WORKER_NICE`` where set (an integer, 0 or more)."""
    text = os.environ.get("TORCH_NNTILE_WORKER_NICE")
    if text is None:
        return WORKER_NICE
    try:
        nice = int(text)
    except ValueError:
        nice = -1
    if nice < 0:
        raise ValueError(f"TORCH_NNTILE_WORKER_NICE must be an integer of 0 or more, got {text!r}")
    return nice


class KernelError(RuntimeError):
    """An exception raised inside a tile kernel, re-raised where a value that needs it is read.

    It is also an instance of the kernel's exception type where that type allows
    (``except IndexError`` catches an out-of-range index found by a kernel, as on CPU).
    """

    @staticmethod
    def like(exc: BaseException, message: str) -> KernelError:
        kind = type(exc)
        cls = _KERNEL_ERRORS.get(kind)
        if cls is None:
            cls = KernelError
            if issubclass(kind, Exception) and not issubclass(kind, KernelError):
                try:
                    cls = type("KernelError", (KernelError, kind), {"__module__": __name__})
                    cls(message)
                except TypeError:  # an exception type that cannot be mixed in or built from a message
                    cls = KernelError
            _KERNEL_ERRORS[kind] = cls
        return cls(message)


_KERNEL_ERRORS: dict[type, type[KernelError]] = {}


class TileMemoryError(KernelError, MemoryError):
    """A tile could not be allocated: raised where a value that needs it is read, or by wait()."""


class Failure:
    """Why some tiles hold no value: a kernel that raised (``exc``) or a tile that got
    no memory (``nbytes``). ``op`` is the task name that failed; ``reported`` once
    some readout or wait() raised it."""

    __slots__ = ("op", "exc", "nbytes", "reported", "note")

    def __init__(self, op: str | None, exc: BaseException | None = None, nbytes: int | None = None,
                 note: str | None = None) -> None:
        self.op, self.exc, self.nbytes, self.note = op, exc, nbytes, note
        self.reported = False

    def error(self) -> KernelError:
        """A fresh exception for this failure (raising one instance twice would chain tracebacks)."""
        if self.note is not None:
            return KernelError(f"torch_nntile: {self.note}")
        if self.nbytes is not None:
            what = f"a tile of {self.op}" if self.op else "a tile"
            return TileMemoryError(f"torch_nntile: not enough memory for {what}: you tried to allocate "
                                   f"{self.nbytes} bytes ({_human(self.nbytes)})")
        exc = self.exc
        return KernelError.like(exc, f"tile kernel of {self.op} failed: {type(exc).__name__}: {exc}")


def _human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


class Latch:
    """Set once, by any thread; waited for in slices by the thread Ctrl-C reaches.

    A raw lock, not a ``threading.Condition``: a KeyboardInterrupt raised at any line of
    ``wait`` leaves it consistent, whereas one raised inside ``Condition.wait`` after its
    wait and before it takes its lock back makes the ``with`` around it fail with
    "release unlocked lock" instead.
    """

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        """Called once (a second call does nothing)."""
        if not self._set:
            self._set = True  # before the release: a waiter that wakes sees it
            self._lock.release()

    def wait(self, timeout: float) -> bool:
        """Whether it is set, after waiting at most ``timeout`` seconds for it."""
        return self._set or self._lock.acquire(timeout=timeout) or self._set


class Done(Latch):
    """Set once a readout's task has run; ``failure`` is then the id of the failure
    its tiles held (0: they held values)."""

    __slots__ = ("failure",)

    def __init__(self) -> None:
        super().__init__()
        self.failure = 0


class Batch:
    """Tasks as StarPU is sent them, less their handles (``Runtime.prepare``)."""

    __slots__ = ("n", "_tasks", "nbufs", "modes", "ngemm", "gemm", "coef", "n_ew", "ew", "ewc", "closures", "ew_at",
                 "py_at")

    def __init__(self, tasks: list[Any], nbufs: Any, modes: Any, ngemm: int, gemm: Any, coef: Any, n_ew: int,
                 ew: Any, ewc: Any, closures: list[tuple[int, Callable[..., None], list[TileSpec], str]],
                 ew_at: dict[int, tuple[int, int]]) -> None:
        self.n, self._tasks = len(tasks), tasks
        self.nbufs, self.modes, self.ngemm, self.gemm, self.coef = nbufs, modes, ngemm, gemm, coef
        self.n_ew, self.ew, self.ewc, self.closures = n_ew, ew, ewc, closures
        self.ew_at = ew_at  # task -> where its C program's record and constants are in ``ew`` and ``ewc``
        self.py_at = {c[0]: j for j, c in enumerate(closures)}  # task -> its entry in ``closures``

    def tasks(self, handles: list[Any]) -> list[tuple[Callable[..., None], list[Any], list[int], list[TileSpec], str]]:
        """The tasks again, on ``handles`` (for naming failures: the rare path)."""
        out, off = [], 0
        for fn, _old, modes, specs, name in self._tasks:
            out.append((fn, handles[off:off + len(modes)], modes, specs, name))
            off += len(modes)
        return out


def _new_failure(f: Failure, reported: bool = False) -> int:
    """Register a failure (from any thread); its id is what tiles carry."""
    fid = next(_FAILURE_IDS)
    f.reported = reported
    _FAILURES[fid] = f
    if not reported:
        _UNREPORTED.append(f)
    return fid


def failure_error(fid: int) -> KernelError:
    """The exception of failure ``fid``, now counted as reported.

    Running out of memory is one condition, however many tiles it hit: the other
    tiles that got no memory so far are reported with it (counted in the message).
    """
    f = _FAILURES[fid]
    f.reported = True
    err = f.error()
    if f.nbytes is not None:
        others = [g for g in list(_UNREPORTED) if g.nbytes is not None and not g.reported]
        for g in others:
            g.reported = True
        if others:
            n = len(others)
            err.args = (f"{err.args[0]} (and {n} more tile{'s' if n > 1 else ''} got no memory)",)
    err.__cause__ = f.exc
    return err


@functools.cache  # once a process: the initialisation it forces is the process's
def _warm_vector_math() -> None:
    """Make PyTorch's first vectorized math calls here, before any worker does.

    Its MKL-backed vector math initializes lazily and not thread-safely: two workers
    making their first ``exp`` at once, after a matrix product ran in them, were seen
    to get values off by about 3e-5 (2 runs in 30, reproduced without torch_nntile)."""
    for dtype in (torch.float32, torch.float64):
        x = torch.linspace(-2, 2, 64, dtype=dtype)
        for fn in (torch.exp, torch.log1p, torch.tanh, torch.erf, torch.sigmoid, torch.sin, torch.cos, torch.rsqrt):
            fn(x.abs() if fn is torch.log1p or fn is torch.rsqrt else x)
        torch.log(x.abs() + 1)


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
        _warm_vector_math()
        rc = self.lib.tnt_init(ncpu, (scheduler or "lws").encode(), _worker_nice())
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
        self.sent = 0  # tasks of the last submit() that reached StarPU (read when it raised)
        self._abandoned = False
        # Matrix-product tiles call BLAS from C on the worker (no GIL) when the BLAS
        # that torch is linked with exports it and lets each worker keep it to one
        # thread; otherwise they run as torch calls.
        blas = _find_blas()
        self.lib.tnt_set_blas(*blas[:3], int(_SKIP_KERNELS))
        self.lib.tnt_set_pack(*blas[3:])
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
        global _CURRENT
        _CURRENT = self

    # -- data -------------------------------------------------------------
    def register_many(self, sizes: list[int], elemsize: int) -> list[Any]:
        """Handles for the tiles of one value, of ``sizes`` items each: for each, a spare
        of that size, else a new one.

        A spare's old content is garbage; every tile's first task writes it (W). A
        tile that gets no memory, even after the spares are freed, still gets a
        handle: the values that need it fail when read (``TileMemoryError``).
        """
        stats.tiles_added(len(sizes))
        keys = [(max(n, 1), elemsize) for n in sizes]
        wanted, compiles = self._wanted, self._compiles
        out: list[Any] = []
        missed = 0
        with self._spare_lock:  # once for the value's spares, not once a tile
            spares = self._spares
            for key in keys:
                wanted[key] = compiles
                free = spares.get(key)
                if free:
                    out.append(free.pop(0))  # the longest dead: its last readers are the likeliest done
                else:
                    out.append(None)
                    missed += 1
        if missed:  # registered outside the lock: freeing the spares to find memory takes it
            out = [self._register(k) if h is None else h for h, k in zip(out, keys)]
        return out

    def _register(self, key: tuple[int, int]) -> Any:
        """A new handle of ``key``'s size (items, item size), with memory where there is some."""
        elemsize = key[1]
        ok = self._alloc_ok
        h = self.lib.tnt_register(key[0], elemsize, ok)
        if not ok[0] and self._spares:  # as PyTorch's caching allocators do: free the cache, try again
            self.lib.tnt_unregister_now(h)
            self._free_spares_now()
            h = self.lib.tnt_register(key[0], elemsize, ok)
        self._size[h] = key
        stats.COUNTS["tiles_registered"] += 1
        if not ok[0]:
            f = Failure(None, nbytes=key[0] * elemsize)
            self.lib.tnt_set_no_memory(h, _new_failure(f))
            self._no_memory[h] = self._unnamed[h] = f
        return h

    def reuse_key(self, h: Any) -> tuple[int, int] | None:
        """The size of handle ``h`` (items, item size), or None if it may not hold another
        tile (it got no memory: a new tile of its size may find some)."""
        return None if h in self._no_memory else self._size[h]

    def _free_spares_now(self) -> None:
        """Wait for every task, then unregister the spares and free their memory at once."""
        self.pause()
        with self._spare_lock:
            spares, self._spares = self._spares, {}
        for handles in spares.values():
            for h in handles:
                del self._size[h]
                self.lib.tnt_unregister_now(h)

    def spare_count(self) -> int:
        with self._spare_lock:
            return sum(len(v) for v in self._spares.values())

    def release(self, handles: list[Any]) -> None:
        """Return dead tiles' handles to the spares (safe from any thread, after shutdown too)."""
        if self.alive:
            stats.tiles_added(-len(handles))
            size, spares, bad = self._size, self._spares, self._no_memory
            with self._spare_lock:
                for h in handles:
                    if bad and h in bad:  # never reused: a new tile of that size may find memory
                        self._dead_no_memory.append(h)
                    else:
                        spares.setdefault(size[h], []).append(h)

    def empty_cache(self) -> None:
        """Unregister every spare handle now (their memory is freed once their last tasks ran)."""
        self.check_alive()
        with self._spare_lock:
            spares, self._spares = self._spares, {}
        for handles in spares.values():
            self._unregister(handles)

    def recycle(self, keep: int = SPARE_COMPILES) -> None:
        """After a compile: unregister spares of sizes not asked for in ``keep`` compiles."""
        self._compiles += 1
        now, wanted = self._compiles, self._wanted
        for key in [k for k, last in wanted.items() if now - last > keep]:
            del wanted[key]
        with self._spare_lock:
            stale = [self._spares.pop(k) for k in [k for k in list(self._spares) if k not in wanted]]
            dead, self._dead_no_memory = self._dead_no_memory, []
        for h in dead:
            self._no_memory.pop(h, None)
            self._unnamed.pop(h, None)
        for handles in [*stale, dead]:
            self._unregister(handles)
        self._trim_due()  # the workers may never go idle (a loop without waits): the pauser would not trim

    def _trim_due(self) -> None:
        """Return malloc's free pages to the system (see tnt_trim), at most every TRIM_S."""
        now = time.monotonic()
        if now - self._trimmed >= TRIM_S:
            self._trimmed = now
            self.lib.tnt_trim()

    def _unregister(self, handles: list[Any]) -> None:
        """Unregister handles after their submitted tasks; a task frees their memory."""
        if not handles:
            return
        unreg, size = self.lib.tnt_unregister_submit, self._size
        for h in handles:
            del size[h]
            unreg(h)
        self._kick()

    def _kick(self) -> None:
        """Tasks went in: let the workers run them, and the pauser pause them afterwards."""
        with self._lock:
            if self.paused:
                self.lib.tnt_resume()
                self.paused = False
            self._epoch += 1
        self._drain.set()

    # -- tasks ------------------------------------------------------------
    def submit(self, tasks: list[tuple[Callable[..., None], list[Any], list[int], list[TileSpec], str]],
               notify: Done | None = None) -> None:
        """Submit tasks (kernel, handles, modes, specs, name) in order; returns at once.

        ``notify`` is set once the last task has run and been accounted for. If this
        raises, ``self.sent`` says how many of the tasks reached StarPU; the tiles the
        others would have written hold the error.
        """
        if not self._dry_run_counts(len(tasks)):  # a dry run prepares nothing
            self.submit_batch(self.prepare(tasks, notify is not None), [h for t in tasks for h in t[1]], notify)

    def _dry_run_counts(self, n: int) -> bool:
        """Start a submission of ``n`` tasks: True under TORCH_NNTILE_SKIP_STARPU, where
        they are only counted."""
        self.sent = 0
        self.check_alive()
        if self.skip_starpu:
            stats.COUNTS["tasks_skipped"] += n
            return True
        return False

    def prepare(self, tasks: list[tuple[Callable[..., None], list[Any], list[int], list[TileSpec], str]],
                notify_last: bool = False) -> Batch:
        """What StarPU is sent for ``tasks``, less their handles: which tasks run in C
        and with what arguments, which call back into Python. A replayed step
        (``capture``) prepares its tasks once and submits them with new handles."""
        native = self.native_gemm and not _SKIP_KERNELS
        name_id, dtypes = self._name_id, self._gemm_dtypes
        f32 = torch.float32
        nbufs: list[int] = []
        ms: list[int] = []
        gemm: list[int] = []
        coef: list[float] = []
        ew: list[int] = []
        ewc: list[float] = []
        native_ew = self.native_ew and not _SKIP_KERNELS
        n_ew = 0
        closures: list[tuple[int, Callable[..., None], list[TileSpec], str]] = []
        ew_at: dict[int, tuple[int, int]] = {}
        last = len(tasks) - 1
        for i, (fn, handles, modes, specs, name) in enumerate(tasks):
            nbufs.append(len(handles))
            ms += modes
            kind = type(fn)
            if native and (kind is Gemm or kind is PackB) and (i != last or not notify_last):
                dt = specs[0][1]
                nid = name_id(name)
                if kind is PackB:  # planned by the lowering only when natively run
                    gemm += (i, 2, 0, fn.tb, fn.m, fn.n, fn.k, 0, nid, 1)
                    coef += (fn.alpha, 0.0)
                    continue
                if dt in dtypes and (dt is f32 or not fn.packed_b):
                    oshape, xs = specs[0][2], specs[1][2]
                    batch = oshape[0] if len(oshape) == 3 else 1
                    m, nn = oshape[-2:]
                    gemm += (i, int(fn.packed_b), fn.ta, fn.tb, m, nn, xs[-2] if fn.ta else xs[-1],
                             dt is torch.float64, nid, batch)
                    coef += (fn.alpha, 1.0 if fn.accumulate else 0.0)
                    continue
            elif native_ew and kind is Kernel and (i != last or not notify_last):
                rec = ew_record(fn, specs)
                if rec is not None:
                    ints, consts = rec
                    ew_at[i] = (len(ew), len(ewc))
                    ew += (i, name_id(name), len(ints), len(consts))
                    ew += ints
                    ewc += consts
                    n_ew += 1
                    continue
            closures.append((i, fn, specs, name))
        ffi = self.ffi
        return Batch(tasks, ffi.new("int[]", nbufs), ffi.new("int[]", ms), len(gemm) // 10, ffi.new("int[]", gemm),
                     ffi.new("double[]", coef), n_ew, ffi.new("int32_t[]", ew), ffi.new("double[]", ewc), closures, ew_at)

    def _name_id(self, name: str) -> int:
        """The id a C-run task's name is counted under; past the first _GEMM_NAMES - 1
        names, all share the last (a long-running process meets many fused chains)."""
        names = self._gemm_names
        nid = names.get(name)
        if nid is None:
            if len(names) >= _GEMM_NAMES - 1:
                return _GEMM_NAMES - 1
            nid = names[name] = len(names)
        return nid

    def _name_ids(self) -> list[tuple[str, int]]:
        """Every (name, id) C-run tasks are counted under, the shared one last."""
        return [*self._gemm_names.items(), (OTHER_C_TASKS, _GEMM_NAMES - 1)]

    def rebind(self, b: Batch, tasks: list[tuple[Callable[..., None], list[Any], list[int], list[TileSpec], str]],
               changed: Iterable[int]) -> bool:
        """Give the prepared ``b`` the kernels of ``tasks`` at the indices ``changed``, in
        place; False (``b`` then half changed: prepare anew) where that changes more than
        a C program's constants or a Python task's callable (another program, a task
        that would now run elsewhere). The optimizer's per-step scalars take this path."""
        native_ew = self.native_ew and not _SKIP_KERNELS
        ew, ewc, py_at = b.ew, b.ewc, b.py_at
        for i in changed:
            fn, _handles, _modes, specs, name = tasks[i]
            kind = type(fn)
            at = b.ew_at.get(i)
            if at is not None:
                rec = ew_record(fn, specs) if kind is Kernel else None
                if rec is None:
                    return False
                ints, consts = rec
                o, c = at
                if ew[o + 2] != len(ints) or ew[o + 3] != len(consts) or list(ew[o + 4:o + 4 + len(ints)]) != list(ints):
                    return False
                ewc[c:c + len(consts)] = consts
                continue
            j = py_at.get(i)
            if j is None or kind is not Kernel or native_ew and ew_record(fn, specs) is not None:
                return False  # a product's (its coefficients), or one that would run in C now
            b.closures[j] = (i, fn, specs, name)
        return True

    def submit_batch(self, b: Batch, handles: list[Any], notify: Done | None = None) -> None:
        """Submit a prepared batch on ``handles`` (every task's, in order); as ``submit``."""
        if self._dry_run_counts(b.n):
            return
        n = b.n
        if self._unnamed:
            self._name_failures(b.tasks(handles))
        key0, last = self._next, n - 1
        self._next = key0 + n
        _CLOSURES.update({key0 + i: (fn, specs, name, notify if i == last else None)
                          for i, fn, specs, name in b.closures})
        ffi = self.ffi
        out = ffi.new("int[2]")  # tasks that went in, StarPU's error
        # The batch goes to StarPU in one C call that does not hold the GIL, so the
        # workers keep running (and Python kernels keep their turns) while it goes in.
        args = (n, key0, b.nbufs, ffi.new("tnt_handle[]", handles), b.modes, b.ngemm, b.gemm, b.coef, b.n_ew, b.ew,
                b.ewc, int(stats.TRACE is not None), self.where, int(notify is not None), out)
        try:
            with self._lock:
                try:
                    self.lib.tnt_submit_batch(*args)
                finally:
                    done = self.sent = out[0]
                    self.tasks_submitted += done
                    stats.COUNTS["tasks_submitted"] += done
                    if done and self.paused:
                        self.lib.tnt_resume()
                        self.paused = False
                    self._epoch += 1
            self._drain.set()
        finally:
            if out[0] < n:
                for key in range(key0 + out[0], key0 + n):
                    _CLOSURES.pop(key, None)
        if done < n:
            tasks = b.tasks(handles)
            name = tasks[done][4]
            err = RuntimeError(f"starpu_task_submit failed ({out[1]}) for {name}")
            self._fail_writes(tasks[done:], Failure(name, err), reported=True)
            raise err

    def _fail_writes(self, tasks: list[Any], f: Failure, reported: bool) -> None:
        """The tiles ``tasks`` would have written hold failure ``f`` (in order after their earlier tasks)."""
        fid = _new_failure(f, reported)
        for _fn, handles, modes, _specs, _name in tasks:
            for h, m in zip(handles, modes):
                if m & W:
                    self.lib.tnt_submit_fail(h, fid)
        self._kick()

    def _name_failures(self, tasks: list[Any]) -> None:
        """A tile without memory is named after the first task that writes it."""
        unnamed = self._unnamed
        for _fn, handles, _modes, _specs, name in tasks:
            for h in handles:
                f = unnamed.pop(h, None)
                if f is not None:
                    f.op = name
                    if not unnamed:
                        return

    def _pause_when_drained(self) -> None:
        # Ctrl-C goes to the main thread (or another one that can act on it), not here.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
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
            with self._lock:
                if epoch > self._drained:
                    self._drained = epoch
                left = []
                for target, latch in self._waiters:
                    if target <= self._drained:
                        latch.set()
                    else:
                        left.append((target, latch))
                self._waiters = left
            self._trim_due()  # idle now

    def _wait_drained(self) -> int:
        """Block until every task submitted so far has run; return that submission count.

        Waits for a latch the pauser sets, in slices: Ctrl-C raises KeyboardInterrupt here
        within about SLICE_S while tasks still run (they go on).
        """
        latch = Latch()
        with self._lock:
            target = self._epoch
            if self._drained >= target:
                return target
            self._waiters.append((target, latch))
        self.wait_for(latch, self._pauser_gone)
        return target

    def _pauser_gone(self) -> bool:
        if self._pauser.is_alive():
            return False
        self.lib.tnt_wait_all()  # the pauser is gone (it never should be): wait here
        return True

    def wait_for(self, done: Latch, gone: Callable[[], bool] | None = None) -> None:
        """Block until ``done`` is set (or ``gone()``, asked after each slice), in slices:
        Ctrl-C gets through. Meanwhile the workers may share products
        (``tnt_host_waiting``): this thread leaves its core free."""
        self.lib.tnt_host_waiting(1)
        try:
            while not done.wait(SLICE_S):
                if gone is not None and gone():
                    break
        finally:
            self.lib.tnt_host_waiting(-1)

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
        for name, nid in self._name_ids():
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
                ids = {nid: name for name, nid in self._name_ids()}
                trace.extend((keys[i], ids[nids[i]], workers[i], t0[i], t1[i]) for i in range(n))

    def wait(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Wait for every submitted task; raise the first failure no readout has reported
        (a kernel's error naming its op, or a tile that got no memory).

        ``progress(done, total)`` is called about every 0.1 s while tasks remain.
        """
        self.check_alive()
        sub0, done0 = self._waited
        total = self.tasks_submitted - sub0
        if progress is not None:
            while (done := self.tasks_done() - done0) < total:
                progress(done, total)
                time.sleep(0.1)
        self.pause()
        self._waited = (self.tasks_submitted, self.tasks_done())
        if progress is not None:
            progress(total, total)
        self.raise_unreported()

    def raise_unreported(self) -> None:
        """Raise the first failure not reported yet (counting the others in its message)."""
        new = []
        with SHIELD:  # Ctrl-C waits: a failure taken from the queue is not lost
            while _UNREPORTED:
                f = _UNREPORTED.popleft()
                if not f.reported:
                    f.reported = True
                    new.append(f)
        if new:
            err = new[0].error()
            if len(new) > 1:
                err.args = (f"{err.args[0]} (and {len(new) - 1} more failures)",)
            raise err from new[0].exc

    def pause(self) -> None:
        """Wait for every submitted task, then keep the workers from polling."""
        target = self._wait_drained()
        with self._lock:
            if not self.paused and self._epoch == target:
                self.lib.tnt_pause()
                self.paused = True

    def check_alive(self) -> None:
        if not self.alive:
            raise RuntimeError("torch_nntile: the runtime context has been shut down")

    def abandon(self) -> None:
        """From now on tasks that have not started skip their kernels (what they write
        holds no value): for an exit, where nothing can read them any more."""
        if not self._abandoned:
            self._abandoned = True
            fid = _new_failure(Failure(None, note="the context was shut down before this value was computed"),
                               reported=True)
            self.lib.tnt_set_abandon(fid)

    def shutdown(self, abandon: bool = False) -> None:
        """Wait for the submitted tasks (``abandon``: skip those not started), free every
        tile's memory and stop StarPU. An interrupted wait abandons the rest."""
        if not self.alive:
            return
        try:
            if abandon:
                self.abandon()
            self.wait()
        except BaseException:
            self.abandon()
            raise
        finally:
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
            self._spares.clear()
            self._no_memory.clear()
            self._unnamed.clear()
            self._dead_no_memory.clear()
            self._collect_native()
            stats.COLLECTORS.remove(self._collect_native)
            self.lib.tnt_shutdown()
            _TENSOR_CACHE.clear()
            _WORKERS_READY.clear()
            _CLOSURES.clear()


_CURRENT: Runtime | None = None
_CLOSURES: dict[int, tuple[Callable[..., None], list[TileSpec], str, Done | None]] = {}
_FAILURES: dict[int, Failure] = {}  # id -> failure; ids are what failed tiles carry
_FAILURE_IDS = itertools.count(1)
_UNREPORTED: collections.deque[Failure] = collections.deque()  # in the order they happened
# (address, spec) -> tensor viewing that memory. Spares reuse buffers, so the same
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

    def _internal_error(exc_type: type, exc: BaseException, tb: Any) -> int:
        """The callback itself failed (not the kernel): what the task writes fails too."""
        return _new_failure(Failure("(runtime callback)", exc))

    @ffi.def_extern(onerror=_internal_error)
    def _tnt_input_error(nid: int, code: int, value: int, dim: int, size: int) -> int:
        """A C kernel found a bad value in its inputs (rare: the GIL is taken only then)."""
        rt = _CURRENT
        names = rt._name_ids() if rt is not None else []
        name = next((n for n, i in names if i == nid), "(C kernel)")
        return _new_failure(Failure(name, native_input_error(code, value, dim, size)))

    @ffi.def_extern(onerror=_internal_error)
    def _tnt_kernel(key: int, ptrs: Any, n: int, worker: int, failed: int) -> int:  # noqa: ANN001
        """Run the kernel of task ``key`` on its tiles, unless an input holds failure
        ``failed``; return the failure what it wrote holds (0: none)."""
        fn, specs, name, notify = _CLOSURES.pop(key)
        try:
            if not failed:
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
        except BaseException as exc:  # noqa: BLE001 - raised where its values are read
            traceback.clear_frames(exc.__traceback__)  # keep the lines, drop the tiles and closures
            failed = _new_failure(Failure(name, exc))
        finally:
            done[worker] += 1
            if notify is not None:
                notify.failure = failed
                notify.set()
        return failed


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


_GEMM_NAMES = 4096  # TNT_NAMES in the shim: names of C-run tasks counted apart (the last id shared)
OTHER_C_TASKS = "(other C-run tasks)"  # the name the shared id's tasks are counted under


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


HOST_COPY = "_tnt_host_copy"  # the attribute holding a host copy's address (host_copy)


def host_copy(cpu: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``cpu`` (its values now) in memory the shim holds
    (``tnt_blob_new``), for an ingress: the tasks copying it into tiles run in C and hold
    the bytes from their submission until they have run. The memory goes back once
    this tensor (with its views) is gone and those tasks are done, in either order."""
    import ctypes
    import weakref

    from torch_nntile.runtime import _shim

    cpu = cpu.detach()
    if cpu.layout != torch.strided:
        return cpu.clone(memory_format=torch.contiguous_format)
    n = cpu.numel() * cpu.element_size()
    ptr = _shim.lib.tnt_blob_new(n)
    if ptr == _shim.ffi.NULL:
        raise MemoryError(f"torch_nntile: no memory for a copy of {n} bytes of CPU data")
    addr = int(_shim.ffi.cast("uintptr_t", ptr))
    raw = (ctypes.c_char * max(n, 1)).from_address(addr)
    weakref.finalize(raw, _shim.lib.tnt_blob_release, ptr).atexit = False  # the tensor keeps raw alive
    out = torch.frombuffer(raw, dtype=torch.uint8)[:n].view(cpu.dtype).view(cpu.shape)
    if cpu.is_contiguous() and not cpu.is_conj() and not cpu.is_neg():
        # one thread: torch's copy_ of 32768 elements or more wakes its OpenMP team on the
        # recording thread, which then spins on the cores the workers run on (the small
        # GPT-2 with dropout copies seven masks a step: its products ran 20-30 % slower)
        ctypes.memmove(addr, cpu.data_ptr(), n)
    else:
        out.copy_(cpu)
    setattr(out, HOST_COPY, addr)
    return out


def current() -> Runtime | None:
    return _CURRENT

