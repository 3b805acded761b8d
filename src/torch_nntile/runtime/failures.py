"""Failures carried by tiles: why some tiles hold no value, and the exceptions raised for them.

A kernel's exception, or a tile that got no memory, becomes a ``Failure`` registered
under an id; the tiles it left without a value carry that id (a task reading one skips
its kernel and passes it on), and its exception is raised where a value that needs them
is read, or by ``wait()``. Registered from any thread: kernel callbacks run on the
workers. See docs/architecture/failures.md.
"""

from __future__ import annotations

import collections
import itertools


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

    __slots__ = ("op", "exc", "nbytes", "reported", "note", "limit", "workers")

    def __init__(self, op: str | None, exc: BaseException | None = None, nbytes: int | None = None,
                 note: str | None = None, limit: int | None = None, workers: int = 0) -> None:
        self.op, self.exc, self.nbytes, self.note = op, exc, nbytes, note
        self.limit = limit  # out of core: the memory_limit the tile exceeds
        self.workers = workers  # out of core, where nbytes are a task's tiles together: the workers sharing limit
        self.reported = False

    def error(self) -> KernelError:
        """A fresh exception for this failure (raising one instance twice would chain tracebacks)."""
        if self.note is not None:
            return KernelError(f"torch_nntile: {self.note}")
        if self.nbytes is not None and self.workers:
            n, limit = self.workers, self.limit or 0
            share = "" if n == 1 else f" shared by {n} workers, {limit // n} bytes ({_human(limit // n)}) each"
            return TileMemoryError(
                f"torch_nntile: not enough memory for one task of {self.op}: its tiles need {self.nbytes} bytes "
                f"({_human(self.nbytes)}) at once, more than the out-of-core memory_limit of {limit} bytes "
                f"({_human(limit)}){share}; tile its tensors finer (set_axis_group_tiling), raise memory_limit "
                f"or use fewer workers")
        if self.nbytes is not None:
            what = f"a tile of {self.op}" if self.op else "a tile"
            over = "" if self.limit is None else \
                f", more than the out-of-core memory_limit of {self.limit} bytes ({_human(self.limit)})"
            return TileMemoryError(f"torch_nntile: not enough memory for {what}: you tried to allocate "
                                   f"{self.nbytes} bytes ({_human(self.nbytes)}){over}")
        exc = self.exc
        return KernelError.like(exc, f"tile kernel of {self.op} failed: {type(exc).__name__}: {exc}")


def _human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


_FAILURES: dict[int, Failure] = {}  # id -> failure; ids are what failed tiles carry
_FAILURE_IDS = itertools.count(1)
_UNREPORTED: collections.deque[Failure] = collections.deque()  # in the order they happened


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
            tasks = any(g.workers for g in others)  # out of core: tasks too big for a worker's share
            what = ("tiles or tasks" if tasks else "tiles") if n > 1 else ("tile or task" if tasks else "tile")
            err.args = (f"{err.args[0]} (and {n} more {what} got no memory)",)
    err.__cause__ = f.exc
    return err
