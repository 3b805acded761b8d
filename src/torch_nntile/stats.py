"""Counters every layer writes and the report functions read.

A leaf module: it imports nothing from the package, so the backend, the graph,
the tiling and the runtime can all count into it without import cycles. Phase
times are *exclusive*: a readout that flushes the graph counts its compile and
wait under those phases, not under readout.

Kernel statistics are written from StarPU worker threads; each worker owns its
own dict, so no lock is needed on the task path.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable

PHASES = (
    "record", "ingress", "fallback", "compile", "compile.reuse", "compile.axis_groups", "compile.lowering",
    "run", "replay", "wait", "readout",
)

perf = time.perf_counter
PHASE_TIME: dict[str, float] = dict.fromkeys(PHASES, 0.0)
PHASE_CALLS: Counter[str] = Counter()
_STACKS: dict[int, list[float]] = {}  # per thread: time spent in nested phases, one entry per open phase
_ident = threading.get_ident

OP_CALLS: Counter[str] = Counter()  # ATen overload -> recorded calls
FALLBACK_CALLS: Counter[str] = Counter()  # ATen op -> calls run on the CPU fallback
UNTILED_CALLS: Counter[str] = Counter()  # ATen overload -> calls recorded as one untiled task (backend/untiled.py)
BATCHED_CALLS: Counter[str] = Counter()  # ATen overload -> calls recorded per batch tile (ops/batched.py)
UNTILED_BYTES: Counter[str] = Counter()  # ATen overload -> bytes of the inputs its untiled tasks read whole
UNTILED_SOURCE: dict[str, str] = {}  # ATen overload -> first user source line that recorded it untiled
FALLBACK_SOURCE: dict[str, str] = {}  # ATen op -> first user source line that triggered it
FALLBACK_REASON: dict[str, str] = {}  # ATen op -> why its last call could not be an untiled task
RETILES: Counter[tuple[str, str]] = Counter()  # (op, axis group) -> values re-tiled along it for (or after) the op

COUNTS: Counter[str] = Counter()  # tasks_submitted, tasks_skipped, bytes_in, bytes_out, tiles_live
TILES_PEAK = [0]
# peaks of the tile bytes (allocated, reserved: runtime/memory.py) since the start or
# torch.nntile.reset_peak_memory_stats(); reset_info() leaves them, as it leaves the bytes
TILE_BYTES_PEAK = [0, 0]
DATA_WAIT = [0.0]  # out of core: seconds StarPU workers waited for tiles to arrive (from disk)

# worker id -> {kernel name: [tasks, seconds]}; grown by the runtime at init
KERNELS: list[dict[str, list[float]]] = []
DONE: list[int] = []  # tasks finished per worker (progress)
TRACE: list[tuple[int, str, int, float, float]] | None = None  # (task, name, worker, start, end) while tracing
TRACE_HOST: list[tuple[str, float, float]] = []  # (phase, start, end) while tracing
# Called before KERNELS / TRACE are read or reset: the runtime folds in what its C
# kernels counted (they cannot touch Python objects).
COLLECTORS: list[Callable[[], None]] = []


def collect() -> None:
    for fn in list(COLLECTORS):
        fn()


def enter() -> float:
    """Open a phase; pass the result to ``leave``."""
    stack = _STACKS.get(_ident())
    if stack is None:
        stack = _STACKS[_ident()] = [0.0]
    stack.append(0.0)
    return perf()


def leave(name: str, t0: float) -> None:
    t1 = perf()
    dt = t1 - t0
    stack = _STACKS[_ident()]
    PHASE_TIME[name] += dt - stack.pop()
    PHASE_CALLS[name] += 1
    stack[-1] += dt
    if TRACE is not None:
        TRACE_HOST.append((name, t0, t1))


_TILES_LOCK = threading.RLock()  # tiles die on any thread (StarPU workers drop kernel closures)


def tiles_added(n: int) -> None:
    with _TILES_LOCK:  # a read-modify-write: unguarded, two threads lose one's update
        live = COUNTS["tiles_live"] + n
        COUNTS["tiles_live"] = live
        if live > TILES_PEAK[0]:
            TILES_PEAK[0] = live


def tile_bytes_now(allocated: int, reserved: int) -> None:
    """The tile bytes now (the caller holds the runtime's byte lock): the peaks follow."""
    peak = TILE_BYTES_PEAK
    if allocated > peak[0]:
        peak[0] = allocated
    if reserved > peak[1]:
        peak[1] = reserved


def reset_tile_bytes_peak(allocated: int = 0, reserved: int = 0) -> None:
    """Let the byte peaks restart from the tile bytes now (none without a context)."""
    TILE_BYTES_PEAK[:] = [allocated, reserved]


def ensure_workers(n: int) -> None:
    while len(KERNELS) < n:
        KERNELS.append({})
        DONE.append(0)


def env_flag(name: str) -> bool:
    """An on/off environment switch: set and not "0"."""
    return os.environ.get(name, "") not in ("", "0")


def _internal(filename: str) -> bool:
    return _inside(filename, "torch") or _inside(filename, "torch_nntile") or filename.startswith("<frozen")


def count_untiled(name: str, nbytes: int) -> None:
    """One call of ``name`` recorded as an untiled task reading ``nbytes`` whole."""
    UNTILED_CALLS[name] += 1
    UNTILED_BYTES[name] += nbytes
    if name not in UNTILED_SOURCE:
        UNTILED_SOURCE[name] = user_frame()


def user_frame() -> str:
    """``file:line`` of the innermost caller outside torch and torch_nntile."""
    f = sys._getframe(1)
    while f is not None:
        if not _internal(f.f_code.co_filename):
            return f"{f.f_code.co_filename}:{f.f_lineno}"
        f = f.f_back
    return "<unknown>"


def warn_user(message: str, category: type[Warning] = RuntimeWarning) -> None:
    """``warnings.warn`` attributed to the user's line, not to package internals."""
    f, level = sys._getframe(1), 2
    while f is not None and _internal(f.f_code.co_filename):
        f, level = f.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if f is not None else 2)


def _inside(filename: str, package: str) -> bool:
    mod = sys.modules.get(package)
    root = getattr(mod, "__file__", None)
    if not root:
        return False
    return filename.startswith(root.rsplit("/", 1)[0] + "/")


def reset() -> None:
    collect()
    for k in PHASE_TIME:
        PHASE_TIME[k] = 0.0
    PHASE_CALLS.clear()
    OP_CALLS.clear()
    FALLBACK_CALLS.clear()
    UNTILED_CALLS.clear()
    BATCHED_CALLS.clear()
    UNTILED_BYTES.clear()
    UNTILED_SOURCE.clear()
    FALLBACK_SOURCE.clear()
    FALLBACK_REASON.clear()
    RETILES.clear()
    live = COUNTS["tiles_live"]
    COUNTS.clear()
    COUNTS["tiles_live"] = live
    TILES_PEAK[0] = live
    DATA_WAIT[0] = 0.0
    for d in KERNELS:
        d.clear()
