"""Data and op nodes of the session TensorGraph.

A ``DataNode`` is one immutable value: shape, dtype, one axis group per dim, the
op that produces it while pending, and its tiles once lowered. In-place ATen ops
create a new node; the backend re-points the tensor at it. Liveness is Python's
refcount: a node dies when no tensor, view cache or pending op refers to it, and
its tiles go with it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any, Protocol

import torch

from torch_nntile import stats
from torch_nntile.graph import _refs  # type: ignore[attr-defined]
from torch_nntile.graph.axes import AxisGroup, new_group


class OpDef(Protocol):
    """What the graph needs from an op definition (``ops.base.Op``)."""

    name: str
    binds_kernel: bool
    binds_data: bool

    def lower(self, ctx: Any, node: OpNode) -> None: ...

    def label(self, node: OpNode) -> str: ...


class DataNode:
    __slots__ = ("shape", "dtype", "axes", "op", "value", "__weakref__")

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        axes: tuple[AxisGroup, ...] | None = None,
        op: OpNode | None = None,
    ) -> None:
        self.shape = shape
        self.dtype = dtype
        self.axes = axes if axes is not None else tuple(new_group(s) for s in shape)
        self.op = op
        self.value: Any = None  # a TileArray once lowered

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def __repr__(self) -> str:
        src = self.op.label if self.op is not None else "materialized"
        return f"DataNode({list(self.shape)}, {self.dtype}, {src})"


class OpNode:
    __slots__ = ("opdef", "inputs", "outputs", "attrs")

    def __init__(self, opdef: OpDef, inputs: tuple[DataNode, ...], attrs: Any) -> None:
        self.opdef = opdef
        self.inputs = inputs
        self.outputs: tuple[DataNode, ...] = ()
        self.attrs = attrs

    @property
    def label(self) -> str:
        """The op's name for people: the kernel's name for elementwise maps."""
        return self.opdef.label(self)


class TensorGraph:
    """The pending ops of the session, in record order."""

    def __init__(self) -> None:
        self.pending: list[OpNode] = []
        self.lock = threading.Lock()
        self.recorded_ops = 0

    def record(
        self,
        opdef: OpDef,
        inputs: tuple[DataNode, ...],
        attrs: Any,
        outs: list[tuple[tuple[int, ...], torch.dtype, tuple[AxisGroup, ...] | None]],
    ) -> tuple[DataNode, ...]:
        """Append one op; return its output nodes (nothing is computed)."""
        op = OpNode(opdef, inputs, attrs)
        op.outputs = tuple(DataNode(s, d, a, op) for s, d, a in outs)
        with self.lock:
            self.pending.append(op)
            self.recorded_ops += 1
        return op.outputs

    def take(self) -> list[OpNode]:
        """Detach the pending ops for lowering."""
        with self.lock:
            ops, self.pending = self.pending, []
        return ops

    def pending_names(self) -> list[str]:
        with self.lock:
            return [op.label for op in self.pending]

    def snapshot(self) -> list[OpNode]:
        with self.lock:
            return list(self.pending)


def outside_refs(op: OpNode) -> list[int]:
    """Per output of ``op``: the references to it beyond its op's own (tensors, views,
    the inputs of other ops). Read in C (``csrc/refs.c``), where no loop of ours holds
    a reference to the outputs themselves."""
    return _refs.outside_refs(op)


def prune_dead(ops: list[OpNode]) -> list[OpNode]:
    """Drop the ops whose outputs nothing can read any more: no tensor, view or later
    op holds them (``torch.ones`` records a fill behind ``empty``'s dead zero fill).
    Ops are pure, so dropping one changes no result. Later ops go first, so a dead
    op's release of its inputs can make earlier ones dead too; a dropped op's outputs
    lose their link to it, so no node <-> op cycle is left for the garbage collector."""
    kept, pruned = _refs.prune_dead(ops)
    if pruned:
        stats.COUNTS["ops_pruned"] += pruned
    return kept


def deaths(ops: list[OpNode]) -> dict[int, list[DataNode]]:
    """Op index -> the values made by these ops that die after it: the ones whose only
    holders are the inputs of ops in the list, at their last reader (at their own op
    if none reads them). Called before the lowering holds any node, so that reference
    counts tell."""
    readers: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, op in enumerate(ops):
        for key in map(id, op.inputs):  # ids only: a loop variable left holding a node would count as a holder
            readers[key] = readers.get(key, 0) + 1
            last[key] = i
    dying: dict[int, list[DataNode]] = {}
    for i, op in enumerate(ops):
        for out, refs in zip(op.outputs, outside_refs(op)):
            key = id(out)
            if refs == readers.get(key, 0):
                dying.setdefault(last.get(key, i), []).append(out)
    return dying


class Reuse(Protocol):
    """What ``lower_pending`` needs from a cache of lowered steps (``tiling.reuse``)."""

    def reuse(self, ctx: Any, ops: list[OpNode]) -> bool: ...

    def learn(self, ctx: Any, pre: list[OpNode]) -> None: ...


def lower_pending(graph: TensorGraph, make_ctx: Callable[[], Any],
                  rewrite: Callable[[list[OpNode]], list[OpNode]] | None = None, steps: Reuse | None = None) -> Any:
    """Lower every pending op in record order into a context's task list.

    Nothing is committed to the nodes until every op lowered: an invalid tiling
    (found while planning) leaves the graph pending and all tensors as they were.
    An op whose lowering fails otherwise raises its error from the values that
    depend on it (``Lowering.lower``). ``steps``: a compile with the structure of an
    earlier one takes its tasks from there (``steps.reuse``), and a lowered one is
    offered to it before its values are committed (``steps.learn``).
    """
    ops = prune_dead(graph.take())
    ctx = make_ctx()
    pre = ops
    try:
        if steps is None or not steps.reuse(ctx, ops):
            ops = lower_ops(ctx, ops, rewrite)
            if steps is not None:
                steps.learn(ctx, pre)
            ctx.commit()
    except BaseException:
        ctx.discard()
        with graph.lock:
            graph.pending[:0] = ops
        raise
    for op in ops:
        for out in op.outputs:
            out.op = None  # materialized: drop the link to history
    return ctx


def lower_ops(ctx: Any, ops: list[OpNode], rewrite: Callable[[list[OpNode]], list[OpNode]] | None) -> list[OpNode]:
    """Rewrite ``ops`` (fusion), plan their tilings and lower each into ``ctx``; the ops
    lowered are returned (nothing committed)."""
    if rewrite is not None:
        ops = rewrite(ops)
    t0 = stats.enter()
    try:
        ctx.plan(ops, deaths(ops))
    finally:
        stats.leave("compile.axis_groups", t0)
    t0 = stats.enter()
    try:
        for op in ops:
            ctx.lower(op)
    finally:
        stats.leave("compile.lowering", t0)
    return ops


SESSION = TensorGraph()
"""The one graph every nntile op of this process records into."""
