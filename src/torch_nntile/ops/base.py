"""Op definitions: each op is a name plus a lowering; record helpers build nodes.

An op definition owns its shape/axis rule (in its record function), its lowering
(tile tasks) and its kernels (thin torch calls on tile views), side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torch_nntile.graph.axes import AxisGroup, new_group, union
from torch_nntile.graph.nodes import SESSION, DataNode, OpNode
from torch_nntile.tiling.tiles import RW, Arg, Lowering, R, TileArray, W

Kernel = Callable[..., None]


class Op:
    """A tensor-level op: ``lower(ctx, opnode)`` emits its tile tasks."""

    __slots__ = ("name", "lower", "_label")

    def __init__(self, name: str, lower: Callable[[Lowering, OpNode], None],
                 label: Callable[[OpNode], str] | None = None) -> None:
        self.name = name
        self.lower = lower
        self._label = label

    def label(self, node: OpNode) -> str:
        return self._label(node) if self._label is not None else self.name

    def __repr__(self) -> str:
        return f"Op({self.name})"


def record(op: Op, inputs: tuple[DataNode, ...], attrs: Any, outs: list) -> tuple[DataNode, ...]:
    return SESSION.record(op, inputs, attrs, outs)


def broadcast_axes(nodes: list[DataNode]) -> tuple[tuple[int, ...], tuple[AxisGroup, ...]]:
    """Broadcast shapes and merge the groups of non-broadcast dims (right-aligned)."""
    first = nodes[0]
    if all(n.shape == first.shape for n in nodes):
        axes = first.axes
        for n in nodes[1:]:
            if n.axes is not axes:
                for a, b in zip(axes, n.axes):
                    if a is not b:
                        union(a, b)
        return first.shape, axes
    ndim = max(len(n.shape) for n in nodes)
    shape = list(torch.broadcast_shapes(*(n.shape for n in nodes)))
    axes: list[AxisGroup | None] = [None] * ndim
    for n in nodes:
        off = ndim - len(n.shape)
        for d, (s, ax) in enumerate(zip(n.shape, n.axes)):
            if s == shape[off + d]:
                cur = axes[off + d]
                if cur is None:
                    axes[off + d] = ax
                else:
                    union(cur, ax)
    return tuple(shape), tuple(a if a is not None else new_group(s) for a, s in zip(axes, shape))


def input_index(inp: TileArray, out_idx: tuple[int, ...], out_ndim: int) -> tuple[int, ...]:
    """Tile of a broadcast input that feeds an output tile (right-aligned dims)."""
    off = out_ndim - len(inp.shape)
    return tuple(0 if g == 1 else out_idx[off + d] for d, g in enumerate(inp.grid))


# -- elementwise family: one op, the kernel is data ---------------------------


def _lower_map(ctx: Lowering, node: OpNode) -> None:
    fn, name = node.attrs
    out_node = node.outputs[0]
    ins = [ctx.input(n) for n in node.inputs]
    out = ctx.output(out_node)
    nd = len(out.shape)
    for idx in out.indices():
        args = [Arg(out, idx, W)] + [Arg(a, input_index(a, idx, nd), R) for a in ins]
        ctx.task(fn, args, name)


def kernel_name(node: OpNode) -> str:
    """Label of ops whose attrs are ``(kernel, name)``: the ATen op they stand for."""
    return node.attrs[1]


MAP = Op("map", _lower_map, kernel_name)


def map_op(name: str, fn: Kernel, inputs: list[DataNode], dtype: torch.dtype) -> DataNode:
    """Record an elementwise op: ``fn(out_tile, *input_tiles)`` writes out_tile."""
    shape, axes = broadcast_axes(inputs)
    return record(MAP, tuple(inputs), (fn, name), [(shape, dtype, axes)])[0]


# -- reductions into one tile --------------------------------------------------


def _add_kernel(acc: torch.Tensor, part: torch.Tensor) -> None:
    acc.add_(part)


def reduce_into(
    ctx: Lowering,
    out: TileArray,
    idx: tuple[int, ...],
    parts: list[tuple[Kernel, Kernel, list[Arg]]],
    name: str,
    n_out_tiles: int,
    finish: Kernel | None = None,
) -> None:
    """Sum contributions into one output tile.

    Each part is ``(write, accumulate, args)``. With enough output tiles to keep
    the workers busy, parts accumulate in place one after another. Otherwise they
    are dealt into one chain per worker (the first into the output tile, the rest
    into temporary tiles) that run in parallel and are summed pairwise at the end.
    """
    nchains = 1 if n_out_tiles >= 2 * ctx.ncpu else min(ctx.ncpu, len(parts))
    shape = out.tile_shape(idx)
    zero = (0,) * len(shape)
    heads: list[tuple[TileArray, tuple[int, ...]]] = [(out, idx)]
    for _ in range(1, nchains):
        heads.append((ctx.temp(shape, out.dtype), zero))
    n = len(parts)
    for c, (arr, aidx) in enumerate(heads):
        chain = parts[c * n // nchains:(c + 1) * n // nchains]  # never empty: nchains <= n
        for j, (write, acc, args) in enumerate(chain):
            ctx.task(write if j == 0 else acc, [Arg(arr, aidx, W if j == 0 else RW), *args], name)
    while len(heads) > 1:
        nxt = []
        for i in range(0, len(heads) - 1, 2):
            (a, ai), (b, bi) = heads[i], heads[i + 1]
            ctx.task(_add_kernel, [Arg(a, ai, RW), Arg(b, bi, R)], name)
            nxt.append((a, ai))
        if len(heads) % 2:
            nxt.append(heads[-1])
        heads = nxt
    if finish is not None:
        ctx.task(finish, [Arg(out, idx, RW)], name)
