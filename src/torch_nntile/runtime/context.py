"""The StarPU runtime behind a small boundary: register tiles, submit, wait.

Tile memory is allocated by StarPU (handles registered with no home buffer), so
a tile exists only between its first writer and its unregistration. Kernels are
Python callables run on StarPU's CPU workers; each receives torch tensors that
view the tile buffers StarPU hands to the task.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import torch

R, W, RW = 1, 2, 3  # STARPU_R, STARPU_W, STARPU_RW
WHERE_ANY = 0xFFFFFFFF  # task->where = -1: the codelet's own targets
WHERE_CPU = 1 << 1  # STARPU_CPU

TileSpec = tuple[int, torch.dtype, tuple[int, ...]]  # (nbytes, dtype, shape)


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
        self.alive = True
        self.paused = False
        self.where = WHERE_ANY
        self._next = 0
        self._doomed: list[Any] = []  # handles whose data died; unregistered from the main thread
        self._lock = threading.Lock()
        self.tasks_submitted = 0
        self.pause()
        global _CURRENT
        _CURRENT = self

    # -- data -------------------------------------------------------------
    def register(self, nelems: int, elemsize: int) -> Any:
        return self.lib.tnt_register(max(nelems, 1), elemsize)

    def release(self, handles: list[Any]) -> None:
        """Queue handles for unregistration (safe from any thread, after shutdown too)."""
        if self.alive:
            self._doomed.extend(handles)

    def _flush_releases(self) -> None:
        doomed, self._doomed = self._doomed, []
        unreg = self.lib.tnt_unregister_submit
        for h in doomed:
            unreg(h)

    # -- tasks ------------------------------------------------------------
    def submit(self, tasks: list[tuple[Callable[..., None], list[Any], list[int], list[TileSpec], str]]) -> None:
        """Submit tasks (kernel, handles, modes, specs, name) in order; returns at once."""
        self.check_alive()
        if self.paused:
            self.lib.tnt_resume()
            self.paused = False
        ffi, submit, where = self.ffi, self.lib.tnt_submit, self.where
        for fn, handles, modes, specs, name in tasks:
            key = self._next
            self._next = key + 1
            _CLOSURES[key] = (fn, specs, name)
            n = len(handles)
            rc = submit(key, n, ffi.new("tnt_handle[]", handles), ffi.new("int[]", modes), 0, where)
            if rc != 0:
                _CLOSURES.pop(key, None)
                raise RuntimeError(f"starpu_task_submit failed ({rc}) for {name}")
        self.tasks_submitted += len(tasks)
        self._flush_releases()

    def wait(self) -> None:
        """Wait for every submitted task; raise the first kernel error, naming its op."""
        self.check_alive()
        self._flush_releases()
        if not self.paused:
            self.lib.tnt_wait_all()
            self.lib.tnt_pause()
            self.paused = True
        if _ERRORS:
            errs = list(_ERRORS)
            _ERRORS.clear()
            name, exc = errs[0]
            more = f" (and {len(errs) - 1} more failed tasks)" if len(errs) > 1 else ""
            raise KernelError(f"tile kernel of {name} failed: {type(exc).__name__}: {exc}{more}") from exc

    def pause(self) -> None:
        if not self.paused:
            self.lib.tnt_wait_all()
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
            self._flush_releases()
            if self.paused:
                self.lib.tnt_resume()
            self.lib.tnt_wait_all()
            self.alive = False
            self.lib.tnt_shutdown()
            _TENSOR_CACHE.clear()


_CURRENT: Runtime | None = None
_CLOSURES: dict[int, tuple[Callable[..., None], list[TileSpec], str]] = {}
_ERRORS: list[tuple[str, BaseException]] = []
# (address, nbytes) -> uint8 tensor viewing it. StarPU reuses buffers, so the same
# tile address comes back every step; the view does not own the memory.
_TENSOR_CACHE: dict[tuple[int, int], torch.Tensor] = {}
_WORKERS_READY: set[int] = set()
_BOUND = False


def _bind_callback(ffi: Any) -> None:
    global _BOUND
    if _BOUND:
        return
    _BOUND = True
    cast = ffi.cast
    buffer = ffi.buffer

    @ffi.def_extern()
    def _tnt_kernel(key: int, ptrs: Any, n: int, worker: int) -> None:  # noqa: ANN001
        fn, specs, name = _CLOSURES.pop(key)
        try:
            if worker not in _WORKERS_READY:
                torch.set_num_threads(1)
                _WORKERS_READY.add(worker)
            tensors = []
            for i in range(n):
                nbytes, dtype, shape = specs[i]
                addr = int(cast("uintptr_t", ptrs[i]))
                flat = _TENSOR_CACHE.get((addr, nbytes))
                if flat is None:
                    flat = (torch.frombuffer(buffer(ptrs[i], nbytes), dtype=torch.uint8) if nbytes
                            else torch.empty(0, dtype=torch.uint8))
                    if len(_TENSOR_CACHE) > 100_000:
                        _TENSOR_CACHE.clear()
                    _TENSOR_CACHE[(addr, nbytes)] = flat
                tensors.append(flat.view(dtype).view(shape))
            fn(*tensors)
        except BaseException as exc:  # noqa: BLE001 - re-raised from wait()
            _ERRORS.append((name, exc))


def current() -> Runtime | None:
    return _CURRENT

