"""Ops run by PyTorch's CPU kernel one tile at a time along the axes they map over.

An ATen op with no nntile kernel of its own whose results split along some axes of its
inputs (a convolution along the batch and its output channels; a pooling, upsampling or
padding along the batch and the channels, i.e. per plane; a sort along every dim but
the sorted one) runs as one task per tile of those axes, each task calling the op on
its slice: each input comes in the tile of the axes it carries (a convolution's input
in a batch tile, its weight in an output-channel tile), whole along the rest. Results
that carry every axis are written tile by tile; results that sum over an axis (a
convolution's weight gradient over the batch, its input gradient over the output
channels) are written per tile and summed pairwise. Every other dim is one tile (inputs
are re-tiled to that, counted). Where the split axes are one tile each this is one task,
as an untiled op (``ops.base.WHOLE``).

The kernel is ``untiled.run_untiled``'s: ``(run, args, kw, fresh, written)``. Integer
arguments that give a split dim's extent (``N`` of ``native_group_norm``, the leading
entries of an ``input_size`` list) hold ``Extent(i)`` (split dim ``i``) and get the
tile's extent.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from torch_nntile.graph.axes import new_group, union
from torch_nntile.graph.nodes import DataNode, OpNode
from torch_nntile.kernels import Kernel, Marker
from torch_nntile.ops.base import Op, record, sum_pairwise
from torch_nntile.tiling.tiles import Arg, Lowering, R, W


class Extent(Marker):
    """Where a kernel parameter is the extent of split dim ``i``: each tile's task gets
    its own."""

    __slots__ = ()


def _sized(v: Any, sizes: tuple[int, ...]) -> Any:
    if type(v) is Extent:
        return sizes[v.i]
    if type(v) is tuple:
        return tuple(_sized(x, sizes) for x in v)
    return v


def _tiling(n: DataNode, dims: tuple[int | None, ...], tiles: list[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """``n`` whole but along the dims that carry split axes, tiled there as the axes."""
    out = [(s,) for s in n.shape]
    for d, t in zip(dims, tiles):
        if d is not None:
            out[d] = t
    return tuple(out)


def _at(ndim: int, dims: tuple[int | None, ...], index: tuple[int, ...]) -> tuple[int, ...]:
    out = [0] * ndim
    for d, i in zip(dims, index):
        if d is not None:
            out[d] = i
    return tuple(out)


def _lower_batched(ctx: Lowering, node: OpNode) -> None:
    kernel, name, sized, axes_in, axes_out = node.attrs
    tiles = []
    for a in range(len(axes_in[0])):  # each split axis is tiled as the first input carrying it
        i = next(i for i, ax in enumerate(axes_in) if ax[a] is not None)
        tiles.append(ctx.tiling(node.inputs[i])[axes_in[i][a]])
    ins = [ctx.input(n, _tiling(n, ax, tiles)) for n, ax in zip(node.inputs, axes_in)]
    outs = [ctx.output(n, _tiling(n, ax, tiles)) for n, ax in zip(node.outputs, axes_out)]
    parts: list[dict[tuple[int, ...], list[tuple[Any, tuple[int, ...]]]]] = [{} for _ in outs]
    for index in itertools.product(*(range(len(t)) for t in tiles)):
        sizes = tuple(t[i] for t, i in zip(tiles, index))
        k = Kernel(kernel.fn, *_sized(kernel.params, sizes)) if sized else kernel
        args = []
        for j, (o, ax) in enumerate(zip(outs, axes_out)):
            at = _at(len(o.shape), ax, index)
            if None not in ax:
                args.append(Arg(o, at, W))
                continue
            heads = parts[j].setdefault(tuple(i for i, d in zip(index, ax) if d is not None), [])
            arr, pos = (o, at) if not heads else (ctx.temp(o.tile_shape(at), o.dtype), (0,) * len(o.shape))
            heads.append((arr, pos))
            args.append(Arg(arr, pos, W))
        args += [Arg(a, _at(len(a.shape), ax, index), R) if a.shape else Arg(a, (), R) for a, ax in zip(ins, axes_in)]
        ctx.task(k, args, name)
    for sums in parts:  # results summed over the axes they do not carry
        for heads in sums.values():
            sum_pairwise(ctx, heads, name)


BATCHED = Op("batched", _lower_batched, lambda node: node.attrs[1])


def batched_op(name: str, kernel: Kernel, inputs: list[DataNode], outs: list[tuple[tuple[int, ...], torch.dtype]],
               axes_in: tuple[tuple[int | None, ...], ...], axes_out: tuple[tuple[int | None, ...], ...]
               ) -> tuple[DataNode, ...]:
    """Record ``kernel`` per tile of its split axes: ``axes_in[i][a]``, the dim of input
    ``i`` that carries axis ``a`` (None: it is whole for every task); ``axes_out[j][a]``,
    the dim of result ``j`` that carries it (None: the result is a sum over it)."""
    groups = []
    for a in range(len(axes_in[0])):
        g = None
        for n, ax in zip(inputs, axes_in):
            if ax[a] is not None:
                g = n.axes[ax[a]] if g is None else union(g, n.axes[ax[a]])
        assert g is not None, "every split axis needs an input that carries it"
        groups.append(g)
    specs = []
    for (shape, dtype), ax in zip(outs, axes_out):
        axes = [new_group(e) for e in shape]
        for d, g in zip(ax, groups):
            if d is not None:
                axes[d] = g
        specs.append((shape, dtype, tuple(axes)))
    sized = any(type(v) is Extent for v in _flat(kernel.params))
    return record(BATCHED, tuple(inputs), (kernel, name, sized, axes_in, axes_out), specs)


def _flat(v: Any) -> list[Any]:
    if type(v) is tuple:
        return [y for x in v for y in _flat(x)]
    return [v]
