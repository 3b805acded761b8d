"""Data in and out of the device: ingress from CPU, fills, readout to CPU."""

from __future__ import annotations

from typing import Any

import torch

from torch_nntile import stats
from torch_nntile.graph.nodes import DataNode, OpNode
from torch_nntile.kernels import Kernel, native
from torch_nntile.ops.base import Op, record
from torch_nntile.runtime.context import Runtime
from torch_nntile.runtime.failures import failure_error
from torch_nntile.runtime.host import HOST_COPY, host_copy
from torch_nntile.runtime.interrupts import SHIELD
from torch_nntile.runtime.workers import Done
from torch_nntile.tiling.tiles import Arg, Lowering, R, TileArray, W


def copy_in(src: torch.Tensor, box: tuple[tuple[int, int], ...], o: torch.Tensor) -> None:
    o.copy_(src[tuple(slice(a, b) for a, b in box)])


def _copy_in_record(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...],
                    dtypes: tuple[torch.dtype, ...]) -> tuple[list[int], tuple[float, ...]] | None:
    """A box copy from a host copy's bytes (``host_copy``), whose address (below 2**53,
    as user-space addresses are) is the record's one constant."""
    src, box = params
    addr = getattr(src, HOST_COPY, None)
    if addr is None or addr >= 2**53 or src.dtype is not dtypes[0]:
        return None
    dbox = tuple((0, n) for n in shapes[0])
    rec = native.copy_boxes_record(src.dtype, shapes[0], [native.box(1, tuple(src.shape), dbox, box)])
    if rec is None:
        return None
    return [native.INGRESS, *rec[0][1:]], (float(addr),)


native.TYPED[copy_in] = _copy_in_record
native.FRESH.add(copy_in)


def _lower_ingress(ctx: Lowering, node: OpNode) -> None:
    src: torch.Tensor = node.attrs
    out = ctx.output(node.outputs[0])
    for idx in out.indices():
        box = tuple((s.start, s.stop) for s in out.slices(idx))
        ctx.task(Kernel(copy_in, src, box), [Arg(out, idx, W)], "ingress")


INGRESS = Op("ingress", _lower_ingress, binds_data=True)


def ingress(cpu: torch.Tensor) -> DataNode:
    """A node holding a copy of a CPU tensor (copied now, tiled at compile).

    A tensor of no elements has nothing to copy: it is a fill of its shape (HF's
    ``DynamicCache`` makes ``torch.tensor([])`` four times a GPT-2 step; a host copy
    and its bookkeeping cost about 40 us a call, a fill a quarter of that)."""
    if cpu.numel() == 0:
        return fill(tuple(cpu.shape), cpu.dtype, 0)
    t0 = stats.enter()
    try:
        src = host_copy(cpu)
        stats.COUNTS["bytes_in"] += src.numel() * src.element_size()
    finally:
        stats.leave("ingress", t0)
    return record(INGRESS, (), src, [(tuple(src.shape), src.dtype, None)])[0]


def fill_tile(value: float | int | bool, o: torch.Tensor) -> None:
    o.fill_(value)


native.TRANSLATORS[fill_tile] = lambda p, params, refs: p.emit(native.COPY, params[0])


def _fill_rows(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...],
               dtypes: tuple[torch.dtype, ...]) -> tuple[list[int], tuple] | None:
    """Fills of other dtypes than float32 (whose program above runs them): a box copy
    with no box."""
    return None if dtypes[0] is torch.float32 else native.copy_boxes_record(dtypes[0], shapes[0], [], params[0])


native.TYPED[fill_tile] = _fill_rows


def _lower_fill(ctx: Lowering, node: OpNode) -> None:
    value = node.attrs
    out = ctx.output(node.outputs[0])
    kernel = Kernel(fill_tile, value)
    for idx in out.indices():
        ctx.task(kernel, [Arg(out, idx, W)], "fill")


FILL = Op("fill", _lower_fill)


def fill(shape: tuple[int, ...], dtype: torch.dtype, value: float | int | bool, axes=None) -> DataNode:
    return record(FILL, (), value, [(shape, dtype, axes)])[0]


def arange_tile(start: float | int, step: float | int, lo: int, exact: bool, o: torch.Tensor) -> None:
    """Items ``lo`` on of ``start + i * step``; as on CPU, computed in double for floats."""
    idx = torch.arange(lo, lo + o.shape[0], dtype=torch.int64 if exact else torch.float64, device=o.device)
    o.copy_(idx * step + start)


def _arange_rows(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...],
                 dtypes: tuple[torch.dtype, ...]) -> tuple[list[int], tuple] | None:
    """int64 and float32 ranges run in C, where start and step are exact as doubles."""
    start, step, lo, exact = params
    dt = dtypes[0]
    if exact and (dt is not torch.int64 or not all(type(v) is int and abs(v) < 2**53 for v in (start, step))):
        return None
    if not exact and (dt is not torch.float32 or not all(type(v) in (int, float) for v in (start, step))):
        return None
    return [native.ARANGE, native.numel(shapes[0]), int(exact), lo], (float(start), float(step))


native.TYPED[arange_tile] = _arange_rows


def _lower_arange(ctx: Lowering, node: OpNode) -> None:
    start, step = node.attrs
    out = ctx.output(node.outputs[0])
    exact = not (out.dtype.is_floating_point or out.dtype.is_complex)
    for (i,) in out.indices():
        lo = out.offs[0][i]
        ctx.task(Kernel(arange_tile, start, step, lo, exact), [Arg(out, (i,), W)], "arange")


ARANGE = Op("arange", _lower_arange)


def arange(n: int, start: float | int, step: float | int, dtype: torch.dtype) -> DataNode:
    """``start + i * step`` for i < n, tiled like any 1-D value."""
    return record(ARANGE, (), (start, step), [((n,), dtype, None)])[0]


def copy_out(views: tuple[torch.Tensor, ...], *tiles: torch.Tensor) -> None:
    # a read under inference mode allocates an inference tensor, which a worker thread
    # (outside that thread-local mode) may only write inside the mode
    with torch.inference_mode():
        for v, t in zip(views, tiles):
            v.copy_(t)


def _readout_groups(rt: Runtime, arr: TileArray) -> list[list[tuple[int, ...]]]:
    """The tiles of ``arr`` one readout task reads each: all of them, but out of core
    as many as fit in a share of the memory limit (one task's tiles must all be in RAM
    at once, next to the other workers' tasks)."""
    idxs = list(arr.indices())
    if rt.ooc is None:
        return [idxs]
    share = rt.ooc.memory_limit // (2 * max(rt.ncpu, 1))
    groups: list[list[tuple[int, ...]]] = [[]]
    nbytes = 0
    for idx, (tile, _dtype, _shape) in zip(idxs, arr.specs):  # specs: per tile, in the order of indices()
        if groups[-1] and nbytes + tile > share:
            groups.append([])
            nbytes = 0
        groups[-1].append(idx)
        nbytes += tile
    return groups


def readout(rt: Runtime, node: DataNode) -> torch.Tensor:
    """Copy a materialized node's tiles into a new CPU tensor.

    Waits for this value only: one task reads every tile once its writers are done
    (out of core, a few tasks), while the rest of the submitted work goes on (the
    next step can be recorded and submitted meanwhile). If a tile holds a failure
    instead of a value (a kernel that raised, upstream, or a tile without memory)
    that failure is raised here; failures of other values are not. The wait lets Ctrl-C through. Under a dry-run
    switch the tiles hold nothing meaningful: the result is zeros and a warning
    says so.
    """
    t0 = stats.enter()
    try:
        arr = node.value
        dry = rt.dry_run
        cpu = (torch.zeros if dry else torch.empty)(node.shape, dtype=node.dtype)
        if dry:
            stats.warn_user(f"torch_nntile: {dry} is set; values read back are zeros, not results")
            rt.wait()  # what was submitted still completes (and idle workers pause)
        else:
            dones = []
            with SHIELD:
                for idxs in _readout_groups(rt, arr):
                    views = [cpu[arr.slices(idx)] for idx in idxs]
                    ctx = Lowering(rt)
                    ctx.task(Kernel(copy_out, tuple(views)), [Arg(arr, idx, R) for idx in idxs], "readout")
                    dones.append(Done())
                    rt.submit(ctx.tasks, notify=dones[-1])
            t1 = stats.enter()
            try:
                for done in dones:
                    rt.wait_for(done)
            finally:
                stats.leave("wait", t1)
            for done in dones:
                if done.failure:
                    raise failure_error(done.failure)
        stats.COUNTS["bytes_out"] += cpu.numel() * cpu.element_size()
        return cpu
    finally:
        stats.leave("readout", t0)
