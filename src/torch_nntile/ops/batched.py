"""Ops run by PyTorch's CPU kernel one tile at a time along the dims they map over.

An ATen op with no nntile kernel of its own whose results split along some dims of its
inputs (a convolution along the batch; a pooling, upsampling or padding along the batch
and the channels, i.e. per plane; a sort along every dim but the sorted one) runs as one
task per tile of those dims, each task calling the op on its slice: the inputs that
carry the split dims come in that tile, the others whole. Results that carry them are
written tile by tile; results that sum over them (a convolution's weight and bias
gradients, which sum over the batch) are written per tile and summed pairwise. Every
other dim is one tile (inputs are re-tiled to that, counted). Where the split dims are
one tile each this is one task, as an untiled op (``ops.base.WHOLE``).

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


def _tiling(n: DataNode, dims: tuple[int, ...], tiles: list[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """``n`` whole but along ``dims``, tiled there as ``tiles``."""
    out = [(s,) for s in n.shape]
    for d, t in zip(dims, tiles):
        out[d] = t
    return tuple(out)


def _at(ndim: int, dims: tuple[int, ...], index: tuple[int, ...]) -> tuple[int, ...]:
    out = [0] * ndim
    for d, i in zip(dims, index):
        out[d] = i
    return tuple(out)


def _lower_batched(ctx: Lowering, node: OpNode) -> None:
    kernel, name, split_in, summed, sized, dims, out_dims = node.attrs
    first = next(n for n, s in zip(node.inputs, split_in) if s)
    lead = ctx.tiling(first)
    tiles = [lead[d] for d in dims]
    ins = [ctx.input(n, _tiling(n, dims, tiles) if s else _tiling(n, (), [])) for n, s in zip(node.inputs, split_in)]
    outs = [ctx.output(n, _tiling(n, (), []) if s else _tiling(n, od, tiles))
            for n, s, od in zip(node.outputs, summed, out_dims)]
    parts: list[list[tuple[Any, tuple[int, ...]]]] = [[] for _ in outs]
    for index in itertools.product(*(range(len(t)) for t in tiles)):
        sizes = tuple(t[i] for t, i in zip(tiles, index))
        k = Kernel(kernel.fn, *_sized(kernel.params, sizes)) if sized else kernel
        args = []
        for j, (o, s, od) in enumerate(zip(outs, summed, out_dims)):
            if not s:
                args.append(Arg(o, _at(len(o.shape), od, index), W))
                continue
            zero = (0,) * len(o.shape)
            arr = o if not parts[j] else ctx.temp(o.shape, o.dtype)
            parts[j].append((arr, zero))
            args.append(Arg(arr, zero, W))
        args += [Arg(a, _at(len(a.shape), dims if s else (), index), R) if a.shape else Arg(a, (), R)
                 for a, s in zip(ins, split_in)]
        ctx.task(k, args, name)
    for heads in parts:  # the sums over the tiles
        sum_pairwise(ctx, heads, name)


BATCHED = Op("batched", _lower_batched, lambda node: node.attrs[1])


def batched_op(name: str, kernel: Kernel, inputs: list[DataNode], split_in: tuple[bool, ...],
               outs: list[tuple[tuple[int, ...], torch.dtype]], summed: tuple[bool, ...],
               dims: tuple[int, ...] = (0,), out_dims: tuple[tuple[int, ...], ...] | None = None
               ) -> tuple[DataNode, ...]:
    """Record ``kernel`` per tile of ``dims``: ``split_in[i]``: input ``i`` carries them
    (its ``dims`` are the lead input's); ``summed[j]``: result ``j`` is a sum over them,
    else it carries them at ``out_dims[j]`` (default: ``dims``)."""
    groups = None
    for n, s in zip(inputs, split_in):
        if s:
            groups = [n.axes[d] for d in dims] if groups is None else [union(g, n.axes[d])
                                                                      for g, d in zip(groups, dims)]
    assert groups is not None, "a batched op needs an input that carries the split dims"
    out_dims = out_dims if out_dims is not None else tuple(dims for _ in outs)
    specs = []
    for (shape, dtype), s, od in zip(outs, summed, out_dims):
        axes = [new_group(e) for e in shape]
        if not s:
            for d, g in zip(od, groups):
                axes[d] = g
        specs.append((shape, dtype, tuple(axes)))
    sized = any(type(v) is Extent for v in _flat(kernel.params))
    return record(BATCHED, tuple(inputs), (kernel, name, split_in, summed, sized, dims, out_dims), specs)


def _flat(v: Any) -> list[Any]:
    if type(v) is tuple:
        return [y for x in v for y in _flat(x)]
    return [v]
