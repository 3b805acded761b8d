"""Task submission: what StarPU is sent for a list of tasks (products and elementwise
programs run in C, or a callback into Python per task), and that callback, which runs a
Python kernel on tensors viewing its tiles. See docs/architecture/kernels.md.
"""

from __future__ import annotations

import itertools
import traceback
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch

from torch_nntile import stats
from torch_nntile.kernels import Gemm, Kernel, PackB
from torch_nntile.kernels.native import input_error as native_input_error
from torch_nntile.kernels.native import record as ew_record
from torch_nntile.runtime.failures import Failure, _new_failure
from torch_nntile.runtime.workers import Done

if TYPE_CHECKING:
    from torch_nntile.runtime.context import Runtime

R, W, RW = 1, 2, 3  # STARPU_R, STARPU_W, STARPU_RW
WHERE_ANY = 0xFFFFFFFF  # task->where = -1: the codelet's own targets
WHERE_CPU = 1 << 1  # STARPU_CPU
WHERE_CUDA = 1 << 3  # STARPU_CUDA

TileSpec = tuple[int, torch.dtype, tuple[int, ...]]  # (nbytes, dtype, shape)

_GEMM_NAMES = 4096  # TNT_NAMES in the shim: names of C-run tasks counted apart (the last id shared)
OTHER_C_TASKS = "(other C-run tasks)"  # the name the shared id's tasks are counted under


class Batch:
    """Tasks as StarPU is sent them, less their handles (``Runtime.prepare``)."""

    __slots__ = ("n", "_tasks", "nbufs", "modes", "ngemm", "gemm", "coef", "n_ew", "ew", "ewc", "closures", "ew_at",
                 "py_at", "too_big", "hint_key", "hint_layout")

    def __init__(self, tasks: list[Any], nbufs: Any, modes: Any, ngemm: int, gemm: Any, coef: Any, n_ew: int,
                 ew: Any, ewc: Any, closures: list[tuple[int, Callable[..., None], list[TileSpec], str]],
                 ew_at: dict[int, tuple[int, int]]) -> None:
        self.n, self._tasks = len(tasks), list(tasks)  # its own: rebind() gives it new kernels
        self.nbufs, self.modes, self.ngemm, self.gemm, self.coef = nbufs, modes, ngemm, gemm, coef
        self.n_ew, self.ew, self.ewc, self.closures = n_ew, ew, ewc, closures
        self.ew_at = ew_at  # task -> where its C program's record and constants are in ``ew`` and ``ewc``
        self.py_at = {c[0]: j for j, c in enumerate(closures)}  # task -> its entry in ``closures``
        self.too_big: list[tuple[int, int]] = []  # out of core: (task, bytes) of tasks whose tiles exceed the limit
        self.hint_key: Any = None  # out of core: what the graph-aware hints (runtime/hints.py) know this batch by
        self.hint_layout: list[tuple[int, list[int], list[int]]] = []  # and its tasks' handle counts, modes, bytes

    def tasks(self, handles: list[Any]) -> list[tuple[Callable[..., None], list[Any], list[int], list[TileSpec], str]]:
        """The tasks again, on ``handles``, with their current kernels (for naming failures
        and, out of core, for submitting around tasks too big: the rare paths)."""
        out, off = [], 0
        for fn, _old, modes, specs, name in self._tasks:
            out.append((fn, handles[off:off + len(modes)], modes, specs, name))
            off += len(modes)
        return out


class Submission:
    """Preparing and submitting tasks, and the C-run tasks' names and counts: a part of
    ``Runtime`` (runtime/context.py sets up its state)."""

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
        b = Batch(tasks, ffi.new("int[]", nbufs), ffi.new("int[]", ms), len(gemm) // 10, ffi.new("int[]", gemm),
                  ffi.new("double[]", coef), n_ew, ffi.new("int32_t[]", ew), ffi.new("double[]", ewc), closures, ew_at)
        if self.ooc is not None:
            b.too_big = self.too_big(tasks)
        return b

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
            b._tasks[i] = tasks[i]  # what tasks() gives
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
        if b.too_big:
            self._submit_around(b, handles, notify)
            return
        n = b.n
        if self._unnamed:
            self._name_failures(b.tasks(handles))
        key0, last = self._next, n - 1
        self._next = key0 + n
        _CLOSURES.update({key0 + i: (fn, specs, name, notify if i == last else None)
                          for i, fn, specs, name in b.closures})
        if self.ncuda:  # a C program's task may run on a CUDA worker: as its Python kernel there
            self._drop_ran_in_c()
            tasks = b._tasks
            _CLOSURES.update({key0 + i: (tasks[i][0], tasks[i][3], tasks[i][4], None) for i in b.ew_at})
        ffi = self.ffi
        out = ffi.new("int[3]")  # tasks that went in, StarPU's error, those run on this rank
        here = ffi.new("uint8_t[]", n) if self.distributed else ffi.NULL  # per task: run on this rank
        nhint, hint = self._plan_hints(b, handles) if self._hints is not None else (0, ffi.NULL)
        # The batch goes to StarPU in one C call that does not hold the GIL, so the
        # workers keep running (and Python kernels keep their turns) while it goes in.
        args = (n, key0, b.nbufs, ffi.new("tnt_handle[]", handles), b.modes, b.ngemm, b.gemm, b.coef, b.n_ew, b.ew,
                b.ewc, nhint, hint, int(stats.TRACE is not None), self.where, int(notify is not None), out, here)
        try:
            with self._lock:
                try:
                    self.lib.tnt_submit_batch(*args)
                finally:
                    done = self.sent = out[0]
                    local = out[2]
                    self.tasks_submitted += local
                    stats.COUNTS["tasks_submitted"] += local
                    if local and self.paused:
                        self.lib.tnt_resume()
                        self.paused = False
                    self._epoch += 1
            self._drain.set()
        finally:
            if out[0] < n:
                for key in range(key0 + out[0], key0 + n):
                    _CLOSURES.pop(key, None)
            if here:  # another rank runs these: their kernels are not called here
                kept = itertools.chain((c[0] for c in b.closures), b.ew_at if self.ncuda else ())
                for i in kept:
                    if i < out[0] and not here[i]:
                        _CLOSURES.pop(key0 + i, None)
        if done < n:
            tasks = b.tasks(handles)
            name = tasks[done][4]
            err = RuntimeError(f"starpu_task_submit failed ({out[1]}) for {name}")
            self._fail_writes(tasks[done:], Failure(name, err), reported=True)
            raise err

    def cuda_info(self) -> dict[str, Any] | None:
        """With CUDA workers: how many, their GPUs, and the tasks they ran so far (of
        those stats has collected: ``info()`` collects first); None without any."""
        if not self.ncuda:
            return None
        workers = [w for w, d in enumerate(_CUDA_DEVICE) if d >= 0]
        return {"workers": len(workers), "devices": sorted({_CUDA_DEVICE[w] for w in workers}),
                "tasks": sum(c for w in workers for c, _s in stats.KERNELS[w].values())}

    def _drop_ran_in_c(self) -> None:
        """Forget the Python kernels of program tasks a CPU worker ran in C."""
        keys, cap = self._ran_in_c, len(self._ran_in_c)
        while True:
            k = self.lib.tnt_cuda_take_ran_in_c(keys, cap)
            for j in range(k):
                _CLOSURES.pop(keys[j], None)
            if k < cap:
                return

    def _submit_around(self, b: Batch, handles: list[Any], notify: Done | None) -> None:
        """Out of core: submit the batch but for its tasks whose tiles need more than a
        worker's share of the memory (``too_big``: StarPU could wait forever to fit
        them); what those write holds a TileMemoryError naming the task and the sizes,
        raised where it is read."""
        tasks, start = b.tasks(handles), 0
        limit = self.ooc.memory_limit  # type: ignore[attr-defined]
        failed: dict[Any, int] = {}  # tile -> the failure a skipped task left it (passed on, not made anew)
        for i, nbytes in b.too_big:
            if start < i:
                self.submit(tasks[start:i])
            _fn, hs, modes, _specs, name = tasks[i]
            fid = next((failed[h] for h, m in zip(hs, modes) if m & R and h in failed), 0)
            if fid:
                self._fail_writes([tasks[i]], fid)
            else:
                fid = self._fail_writes([tasks[i]], Failure(name, nbytes=nbytes, limit=limit, workers=self.ncpu))
            failed.update((h, fid) for h, m in zip(hs, modes) if m & W)
            if notify is not None and i == b.n - 1:
                notify.failure = fid
                notify.set()
            start = i + 1
        if start < b.n:
            self.submit(tasks[start:], notify)

    def _fail_writes(self, tasks: list[Any], f: Failure | int, reported: bool = False) -> int:
        """The tiles ``tasks`` would have written hold failure ``f`` (or the registered
        failure of that id), in order after their earlier tasks; the failure's id."""
        fid = f if isinstance(f, int) else _new_failure(f, reported)
        for _fn, handles, modes, _specs, _name in tasks:
            for h, m in zip(handles, modes):
                if m & W:
                    self.lib.tnt_submit_fail(h, fid)
        self._kick()
        return fid

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

    @property
    def dry_run(self) -> str | None:
        """The active dry-run switch, if any: results are then not meaningful."""
        if self.skip_starpu:
            return "TORCH_NNTILE_SKIP_STARPU"
        return "TORCH_NNTILE_SKIP_KERNELS" if _SKIP_KERNELS else None

    def pack_size(self, m: int, n: int, k: int) -> int:
        """Bytes of a float32 B operand (k x n) packed for products with ``m`` rows, or 0
        when products do not run natively with a BLAS that packs."""
        if not self.native_gemm or _SKIP_KERNELS or not self.packs_b:  # see tnt_set_pack in context.py
            return 0
        return int(self.lib.tnt_pack_size(m, n, k))

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


_CURRENT: Runtime | None = None  # set by each Runtime; context.current() returns it
_CLOSURES: dict[int, tuple[Callable[..., None], list[TileSpec], str, Done | None]] = {}
# (address, spec) -> tensor viewing that memory. Spares reuse buffers, so the same
# tile comes back every step and building a tensor (~6 us) is paid once. The view
# does not own the memory; kernels must not change a tile tensor's metadata.
_TENSOR_CACHE: dict[tuple[int, TileSpec], torch.Tensor] = {}
_WORKERS_READY: set[int] = set()
_BOUND = False
_SKIP_KERNELS = False  # TORCH_NNTILE_SKIP_KERNELS, read once by each Runtime


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
                dev = _CUDA_DEVICE[worker] if _CUDA_DEVICE else -1
                if dev >= 0:
                    t0 = perf()
                    if not _SKIP_KERNELS:
                        _run_on_cuda(fn, specs, ptrs, n, worker, dev)
                    t1 = perf()
                else:
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


# CUDA workers: per worker, the GPU it drives (-1: a CPU worker; empty: no CUDA worker),
# and the torch stream over its StarPU stream; tensors viewing device buffers by (address, spec).
_CUDA_DEVICE: list[int] = []
_CUDA_SYNC = True  # wait for the stream at the end of each task (not under TORCH_NNTILE_CUDA_ASYNC)
_CUDA_STREAMS: dict[int, Any] = {}
_CUDA_TENSORS: dict[tuple[int, TileSpec], torch.Tensor] = {}


def start_cuda(rt: Runtime, asked: int) -> None:
    """After StarPU started ``rt.ncuda`` CUDA workers (``asked``: the ``ncuda`` asked for,
    -1 for every GPU): check that they can run torch's CUDA kernels, and note each
    worker's GPU."""
    global _CUDA_DEVICE, _CUDA_SYNC
    rt._ran_in_c = rt.ffi.new("int64_t[]", 4096)
    _CUDA_SYNC = not stats.env_flag("TORCH_NNTILE_CUDA_ASYNC")
    n = rt.ncuda
    if asked > 0 and n < asked:
        raise RuntimeError(f"torch_nntile: ncuda={asked}, but StarPU started {n} CUDA worker(s): too few GPUs "
                           "visible (CUDA_VISIBLE_DEVICES), or StarPU's STARPU_NCUDA limits them")
    if n and not torch.cuda.is_available():
        raise RuntimeError("torch_nntile: CUDA workers run torch's CUDA kernels on their tiles, but this PyTorch "
                           "has no CUDA (torch.cuda.is_available() is False); install a CUDA build of PyTorch, "
                           "or use ncuda=0")
    if n:
        torch.cuda.init()
    _CUDA_DEVICE = [int(rt.lib.tnt_worker_cuda_device(w)) for w in range(rt.lib.tnt_nworkers())] if n else []


def worker_label(w: int) -> str:
    """How a trace names worker ``w``."""
    dev = _CUDA_DEVICE[w] if w < len(_CUDA_DEVICE) else -1
    return f"CUDA worker {w} (GPU {dev})" if dev >= 0 else f"CPU worker {w}"


def stop_cuda() -> None:
    global _CUDA_DEVICE
    _CUDA_DEVICE = []
    _CUDA_STREAMS.clear()
    _CUDA_TENSORS.clear()


class _DeviceBytes:
    """``nbytes`` bytes of GPU memory at ``addr``, as torch.as_tensor takes them (the CUDA
    array interface, version 2: no stream to wait for; the worker's stream is current)."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, addr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (addr, False), "version": 2}


def _run_on_cuda(fn: Callable[..., None], specs: list[TileSpec], ptrs: Any, n: int, worker: int, dev: int) -> None:
    """A Python kernel on a CUDA worker: on CUDA tensors viewing the tiles' device
    buffers, on the worker's stream (torch's CUDA kernels; StarPU's moved the tiles).
    Waits for the stream, so that an asynchronous CUDA error fails this task (under
    ``TORCH_NNTILE_CUDA_ASYNC`` StarPU waits for it by an event instead)."""
    stream = _CUDA_STREAMS.get(worker)
    if stream is None:
        stream = _CUDA_STREAMS[worker] = torch.cuda.ExternalStream(int(_CURRENT.lib.tnt_cuda_stream()), device=dev)  # type: ignore[union-attr]
    cache = _CUDA_TENSORS
    tensors = []
    for i in range(n):
        spec, addr = specs[i], ptrs[i]
        t = cache.get((addr, spec))
        if t is None:
            nbytes, dtype, shape = spec
            flat = (torch.as_tensor(_DeviceBytes(addr, nbytes), device=torch.device("cuda", dev)) if nbytes
                    else torch.empty(0, dtype=torch.uint8, device=torch.device("cuda", dev)))
            t = flat.view(dtype).view(shape)
            if len(cache) > 100_000:
                cache.clear()
            cache[(addr, spec)] = t
        tensors.append(t)
    with torch.cuda.device(dev), torch.cuda.stream(stream):
        fn(*tensors)
        if _CUDA_SYNC:
            stream.synchronize()


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
