"""torch_nntile: a PyTorch device, ``nntile``, whose ops are recorded, tiled and run on StarPU.

Tensors moved to ``"nntile"`` record their ATen ops into a graph instead of computing
them. Reading a value back (``.cpu()``, ``.item()``, ``print``) compiles the pending
graph to tile tasks, runs them on StarPU's workers and waits for that value. Naming
axis groups and giving them tilings decides how values are cut into tiles.

```python
import torch
import torch_nntile

torch_nntile.init_context(ncpu=2)
x = torch.randn(1024, 784).to("nntile")
w = torch.randn(784, 10).to("nntile")
torch_nntile.set_axis_group_name(x, {0: "batch"})
torch_nntile.set_axis_group_tiling("batch", 256)  # 4 tiles of 256 rows
y = (x @ w).relu().sum()
print(y.cpu())  # flushes: compile, run on StarPU, wait, read back
```
"""

from __future__ import annotations

import os
from importlib import metadata as _metadata

import torch

from torch_nntile import backend as _backend  # noqa: F401  (registers the device)
from torch_nntile import stats as _stats
from torch_nntile.backend.capture import Captured, CaptureError, capture
from torch_nntile.backend.device import read as _read
from torch_nntile.graph import axes as _axes
from torch_nntile.graph.axes import TilingError
from torch_nntile.report import (
    dump_graph,
    format_info,
    format_pending_data_sizes,
    info,
    metrics,
    metrics_report,
    pending_op_names,
    print_info,
    reset_info,
    start_trace,
    stop_trace,
    trace,
)
from torch_nntile.runtime.agree import ProgramsDivergedError
from torch_nntile.runtime.context import built_with_cuda as _built_with_cuda
from torch_nntile.runtime.context import export_launch_env as _export_launch_env
from torch_nntile.runtime.context import launch_rank_size
from torch_nntile.runtime.cuda_libs import import_shim as _import_shim
from torch_nntile.runtime.failures import KernelError, TileMemoryError
from torch_nntile.runtime.ooc import OutOfCore
from torch_nntile.runtime.submission import WHERE_ANY, WHERE_CPU, WHERE_CUDA
from torch_nntile.session import SESSION_STATE as _S
from torch_nntile.session import Progress

try:
    __version__ = _metadata.version("torch_nntile")  # pyproject.toml's, as installed
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "Captured", "CaptureError", "KernelError", "TilingError", "built_with_cuda", "built_with_mpi", "capture",
    "compile_graph", "cuda_worker_count", "ddp", "dump_graph", "empty_cache", "execute", "fallback_counts",
    "format_axis_groups",
    "format_info", "format_pending_data_sizes", "has_pending_graph", "info", "init_context", "is_context_initialized",
    "is_cpu_fallback_enabled", "metrics", "metrics_report",
    "pending_op_names", "print_axis_groups", "print_info", "ProgramsDivergedError", "rank", "reset_info",
    "reset_graph_session", "restore_where", "restrict_cpu", "restrict_cuda", "run", "set_axis_group_distribution",
    "set_axis_group_name", "set_axis_group_tiling", "shutdown_context",
    "start_trace", "stop_trace", "TileMemoryError", "trace", "wait", "world_size",
    "BUILT_WITH_CUDA", "NNTILE_NATIVE_OPS", "TORCH_NATIVE_OPS", "device", "record_nntile_seconds", "wait_for_all",
]

_import_shim()  # the StarPU shim, and on the CUDA build NVIDIA's libraries: a clear error now, not at the first op
_export_launch_env()  # torch.distributed's env:// rendezvous under mpirun
if torch.distributed.is_available():  # a torch built without it has no process groups to join
    from torch_nntile import distributed as _distributed

    _distributed.register()  # init_process_group("nntile")

# Parameters are swapped, not re-wrapped, by Module.to(): tied weights stay tied.
torch.__future__.set_swap_module_params_on_conversion(True)


def init_context(ncpu: int | None = None, ncuda: int | None = None, cpu_fallback: bool = False, scheduler: str | None = None,
                 memory_limit: int | None = None, swap_dir: str | os.PathLike | None = None,
                 swap_size: int | None = None, tiled_only: bool = False, *, verbose: int = 0,
                 runtime_mode: str | None = None) -> None:
    """Start StarPU with ``ncpu`` CPU workers: by default (or -1) ``STARPU_NCPU`` where
    it is set, else one per core this process may run on (the first op starts a context
    with the defaults by itself); an explicit ``ncpu`` wins over ``STARPU_NCPU``. More
    workers than cores is allowed. ``scheduler`` names a StarPU scheduler (default ``lws``;
    ``dmdas`` with CUDA workers).

    ``ncuda`` CUDA workers (one per GPU; -1: every visible GPU; default: the
    ``TORCH_NNTILE_NCUDA`` environment variable, else 0) run tile tasks beside
    the CPU workers on a CUDA build (``built_with_cuda()``): products with cuBLAS, the
    rest with torch's CUDA kernels on the tiles' device copies; StarPU moves tiles
    between host and GPU memory (``STARPU_LIMIT_CUDA_MEM``, in MiB, bounds what it
    keeps on each GPU). Values read back and autograd stay on the host.

    An ATen op with no tiled kernel runs in the graph as one untiled task where PyTorch
    has a Meta kernel for it (listed by ``metrics_report()``). ``cpu_fallback`` runs
    the rest (no Meta kernel, results whose shape depends on values, random draws) on
    the CPU, counted, instead of raising. ``tiled_only`` raises at the first op with
    no tiled kernel, naming it, whatever ``cpu_fallback`` says.

    Out of core: with ``memory_limit`` (bytes), tiles take at most that much RAM and
    StarPU evicts the rest to files in ``swap_dir`` (an existing, writable folder), at
    most ``swap_size`` bytes of them (default: half the folder's free space), loading
    each back before a task reads it. One task's tiles must fit in a worker's share of
    the limit (``memory_limit / ncpu``); see the out-of-core guide.

    ``runtime_mode``: ``"graph"`` (the default) records ops and runs them when a value
    is read, in batches; ``"eager"`` runs every op and waits for it as it is recorded,
    so that an error, a kernel's too, is raised by the op that caused it (a debugging
    mode: slow). It can be switched on a running context. ``verbose`` > 0 prints the
    context's workers and settings when it starts.

    Raises:
        RuntimeError: a context with another ``ncpu``, ``ncuda``, scheduler or out-of-core
            setting is running (``shutdown_context()`` first).
    """
    if runtime_mode not in (None, "graph", "eager"):
        raise ValueError(f"init_context: runtime_mode must be 'graph' or 'eager', got {runtime_mode!r}")
    _S.init(ncpu, ncuda, cpu_fallback, scheduler, OutOfCore.make(memory_limit, swap_dir, swap_size), tiled_only,
            eager=None if runtime_mode is None else runtime_mode == "eager", verbose=verbose)


def is_context_initialized() -> bool:
    """Whether a context is running (``init_context``, or started by the first op)."""
    return _S.live_runtime() is not None


def is_cpu_fallback_enabled() -> bool:
    """Whether ops nntile cannot run in the graph go to the CPU (``init_context(cpu_fallback=True)``)."""
    return _S.cpu_fallback


def has_pending_graph() -> bool:
    """Whether recorded ops wait to be submitted (a read-back, ``execute()`` or ``run()`` submits them)."""
    return _S.has_pending()


def reset_graph_session() -> None:
    """Submit what is pending and wait for everything (values are kept), then forget the
    axis-group tilings and distributions set so far and the lowered steps kept for
    reuse: the next ops start as on a fresh context, without restarting StarPU."""
    _S.reset()


def ddp(axis: str = "batch") -> None:
    """Data parallelism over the named axis group: split it into one tile per worker
    (CPU and CUDA) of every process, as evenly as its extent allows (fewer where it is
    shorter). It applies to the groups of that name now and to those recorded later, so
    it may come before the first op; the split shows in ``format_axis_groups()``, and a
    later ``set_axis_group_tiling`` replaces it. Over several processes the tiles spread
    over the ranks (``set_axis_group_distribution``), each rank's over its workers.
    Asking again for the same axis changes nothing.

    Raises:
        RuntimeError: data parallelism is already enabled over another axis.
    """
    rt = _S.runtime()
    other = [n for n in _axes.split_names() if n != axis]
    if other:
        raise RuntimeError(f"torch_nntile.ddp: data parallelism is already enabled over axis {other[0]!r}; "
                           f"it splits one axis (asked for {axis!r})")
    _axes.set_split(axis, (rt.ncpu + rt.ncuda) * rt.world_size)


def shutdown_context() -> None:
    """Wait for all work, then stop StarPU and free all tile memory; nntile tensors made
    so far are unusable afterwards. ``init_context`` (any configuration) starts a new one."""
    _S.shutdown()


def compile_graph() -> None:
    """Merge axis groups, apply tilings and lower the pending graph to tile tasks."""
    _S.compile()


def run(progress: Progress = None) -> None:
    """Submit compiled tasks to StarPU; returns at once. ``progress``: a callback
    ``(tasks done, total)``, or True for a bar on stderr, fed by the next wait."""
    _S.run(progress)


def wait(progress: Progress = None) -> None:
    """Wait for submitted tasks; raise a failure no read-back has raised yet (a kernel's
    exception as ``KernelError`` naming its op, or ``TileMemoryError``). Ctrl-C interrupts
    the wait (the tasks go on)."""
    _S.wait(progress)


def execute(progress: Progress = None) -> None:
    """compile_graph() + run()."""
    _S.execute(progress)


def set_axis_group_name(tensor: torch.Tensor, names: dict[int, str]) -> None:
    """Name the axis groups of some of ``tensor``'s dimensions: ``{0: "batch"}``."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "nntile":
        where = tensor.device if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise TypeError(f"set_axis_group_name needs a tensor on nntile, got {where}; name the dimensions of the "
                        "tensor after moving it (x = x.to('nntile'))")
    node = _read(tensor)
    for dim, name in names.items():
        if not -len(node.shape) <= dim < len(node.shape):
            raise ValueError(f"dimension {dim} out of range for a tensor of shape {list(node.shape)}")
        _axes.set_name(node.axes[dim], name)


def set_axis_group_tiling(name: str, tiling: int | list[int] | tuple[int, ...] | None) -> None:
    """Tile the named group: a tile size, or a list of sizes summing to its extent; None: one tile.

    Raises:
        TilingError: an invalid tiling (both a ``ValueError`` and a ``RuntimeError``).
        ValueError: no live axis group has that name.
    """
    if tiling is None:
        _axes.clear_tiling(name)
    else:
        _axes.set_tiling(name, tiling)


def set_axis_group_distribution(name: str, rule: str | list[int] | tuple[int, ...] | None) -> None:
    """How the named group's tiles map to the ranks of a run over several processes.

    ``"cyclic"`` (tile i on rank i % world_size, the default of a tiled group),
    ``"block"`` (consecutive tiles together), a list of one rank per tile, or ``"none"``
    (this group does not decide where tiles live). None goes back to the default. A
    value's tiles are owned by the rank its distributed dims give; tasks run where what
    they write is owned. Over one process it has no effect."""
    _axes.set_distribution(name, rule)


def format_axis_groups() -> str:
    """The live axis groups, one line of ``key=value`` tokens each, named groups first::

        DDP axis='batch' replicas=2
        name='batch' extent=4 members=3 ntiles=2 tiles=2,2
        name='k=inner' extent=10 members=2 ntiles=3 tiles=4,4,2
        name=- extent=6 members=1 ntiles=1 tiles=6

    ``name``: the group's name(s) (``a=b`` where ops merged named groups, ``-`` if
    unnamed); ``extent``; ``members`` (dimensions of live values, pending ones
    included); ``ntiles`` and ``tiles`` (the tile sizes joined by commas; an untiled
    group is one tile of its extent). While ops are recorded and not yet submitted
    (``has_pending_graph()``) these two are ``pending_ntiles`` / ``pending_tiles``: the
    tiling the next compile gives. A group whose tiling is invalid ends
    ``tiling=invalid: <reason>`` instead. With data parallelism on (``ddp(axis)``) a
    first line ``DDP axis='<name>' replicas=<parts>`` gives the split.

    Use it to check which dimensions share a group and how they will be cut into tiles.
    """
    return _axes.format_groups(pending=_S.has_pending())


def print_axis_groups() -> None:
    """Print ``format_axis_groups()``."""
    print(format_axis_groups())


def restrict_cpu() -> None:
    """Run the next submitted tasks on CPU workers only."""
    _S.runtime().where = WHERE_CPU


def rank() -> int:
    """This process's rank among the processes ``mpirun`` (or ``python -m
    torch_nntile.launch``) started, 0 outside one. Each rank runs the same program."""
    rt = _S.live_runtime()
    return rt.rank if rt is not None else launch_rank_size()[0]


def world_size() -> int:
    """How many processes ``mpirun`` started (1 outside one)."""
    rt = _S.live_runtime()
    return rt.world_size if rt is not None else launch_rank_size()[1]


def built_with_mpi() -> bool:
    """Whether this build's StarPU has StarPU-MPI (the project's own build does)."""
    return bool(_import_shim().lib.tnt_built_with_mpi())


def built_with_cuda() -> bool:
    """Whether this build's StarPU has CUDA workers (the CUDA wheel, or StarPU built with
    ``STARPU_CUDA=1``); whether a GPU is there too is ``torch_nntile.cuda_worker_count()``."""
    return _built_with_cuda()


def cuda_worker_count() -> int:
    """How many CUDA workers the running context has (0 on a CPU build or without a GPU)."""
    return _S.runtime().ncuda


def restrict_cuda() -> None:
    """Run the next submitted tasks on CUDA workers only (the counterpart of ``restrict_cpu``).

    Raises:
        RuntimeError: the context has no CUDA worker (a CPU build, no GPU, or ``ncuda=0``).
    """
    rt = _S.runtime()
    if not rt.ncuda:
        why = "this StarPU build has none (see built_with_cuda())" if not built_with_cuda() else \
            "the context was started without any (init_context(ncuda=...), and a visible GPU)"
        raise RuntimeError(f"torch_nntile: no CUDA workers: {why}; restrict_cuda() is unavailable")
    rt.where = WHERE_CUDA


def restore_where() -> None:
    """Let tasks run on any worker again."""
    _S.runtime().where = WHERE_ANY


def empty_cache() -> None:
    """Free the tile memory kept for reuse: dead tiles' buffers, held (like PyTorch's
    CUDA caching allocator) for new tiles of the same size in the next steps."""
    _S.empty_cache()


def record_nntile_seconds() -> float:
    """Seconds spent recording ops into the graph since the last ``reset_info``: the
    ``record`` phase of ``info()``, under the published torch_nntile's name."""
    return float(info()["phases"].get("record", {}).get("seconds", 0.0))


def _set_axis_group_tiling(name: str, tile_sizes: int | list[int] | tuple[int, ...]) -> None:
    """``set_axis_group_tiling`` under the published torch_nntile's private name, and as
    it checks: the sizes against the group's extent only when the next graph is compiled
    (a ``TilingError`` then, and the recorded ops stay pending)."""
    _axes.set_tiling(name, tile_sizes, check=False)


# the published torch_nntile's names: the device, its wait, and its build flags (stock
# ops run on nntile, and so do the package's own ``nn.functional`` ops)
device = torch.device("nntile")
wait_for_all = wait
BUILT_WITH_CUDA = _built_with_cuda()
TORCH_NATIVE_OPS = True
NNTILE_NATIVE_OPS = True


def fallback_counts() -> dict[str, int]:
    """How often each ATen op ran on the CPU fallback."""
    return dict(_stats.FALLBACK_CALLS)
