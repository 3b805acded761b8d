"""Ops run by PyTorch's CPU kernel one batch tile at a time.

An ATen op with no nntile kernel of its own whose results split along the batch (dim 0
of some inputs and results: a convolution, pooling, upsampling, per-sample norms) runs
as one task per tile of the batch axis group, each task calling the op on its batch
slice: the inputs that carry the batch come in that tile, the others whole. Results that
carry the batch are written tile by tile; results that sum over the batch (a
convolution's weight and bias gradients) are written per tile and summed pairwise.
Every other dim is one tile (inputs are re-tiled to that, counted). Where the batch is
one tile this is one task, as an untiled op (``ops.base.WHOLE``).

The kernel is ``untiled.run_untiled``'s: ``(run, args, kw, fresh, written)``. Integer
arguments that give the batch size (``N`` of ``native_group_norm``, the first entry of
an ``input_size`` list) hold ``BATCH`` and get the tile's size.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_nntile.graph.axes import new_group, union
from torch_nntile.graph.nodes import DataNode, OpNode
from torch_nntile.kernels import Kernel
from torch_nntile.ops.base import Op, record, sum_pairwise
from torch_nntile.tiling.tiles import Arg, Lowering, R, W

BATCH = type("BatchSize", (), {"__repr__": lambda self: "BATCH"})()
"""Where a kernel parameter is the batch size: each tile's task gets its own."""


def _sized(v: Any, n: int) -> Any:
    if v is BATCH:
        return n
    if type(v) is tuple:
        return tuple(_sized(x, n) for x in v)
    return v


def _whole(n: DataNode) -> tuple[tuple[int, ...], ...]:
    return tuple((s,) for s in n.shape)


def _lower_batched(ctx: Lowering, node: OpNode) -> None:
    kernel, name, split_in, summed, sized = node.attrs
    first = next(n for n, s in zip(node.inputs, split_in) if s)
    tiles = ctx.tiling(first)[0]

    def tiling(n: DataNode, split: bool) -> tuple[tuple[int, ...], ...]:
        return (tiles,) + _whole(n)[1:] if split else _whole(n)

    ins = [ctx.input(n, tiling(n, s)) for n, s in zip(node.inputs, split_in)]
    outs = [ctx.output(n, tiling(n, not s)) for n, s in zip(node.outputs, summed)]
    parts: list[list[tuple[Any, tuple[int, ...]]]] = [[] for _ in outs]
    for b, size in enumerate(tiles):
        k = Kernel(kernel.fn, *_sized(kernel.params, size)) if sized else kernel
        args = []
        for j, (o, s) in enumerate(zip(outs, summed)):
            zero = (0,) * len(o.shape)
            if not s:
                args.append(Arg(o, (b,) + zero[1:], W))
                continue
            arr = o if b == 0 else ctx.temp(o.shape, o.dtype)
            parts[j].append((arr, zero))
            args.append(Arg(arr, zero, W))
        args += [Arg(a, ((b,) if s else (0,)) + (0,) * (len(a.shape) - 1), R) if a.shape else Arg(a, (), R)
                 for a, s in zip(ins, split_in)]
        ctx.task(k, args, name)
    for heads in parts:  # the sums over the batch tiles
        sum_pairwise(ctx, heads, name)


BATCHED = Op("batched", _lower_batched, lambda node: node.attrs[1])


def batched_op(name: str, kernel: Kernel, inputs: list[DataNode], split_in: tuple[bool, ...],
               outs: list[tuple[tuple[int, ...], torch.dtype]], summed: tuple[bool, ...]) -> tuple[DataNode, ...]:
    """Record ``kernel`` per batch tile: ``split_in[i]``: input ``i`` carries the batch in
    dim 0; ``summed[j]``: result ``j`` is a sum over the batch, else it carries it."""
    batch = None
    for n, s in zip(inputs, split_in):
        if s:
            batch = n.axes[0] if batch is None else union(batch, n.axes[0])
    assert batch is not None, "a batched op needs an input that carries the batch"
    specs = []
    for (shape, dtype), s in zip(outs, summed):
        axes = tuple(new_group(e) for e in shape) if s else (batch, *(new_group(e) for e in shape[1:]))
        specs.append((shape, dtype, axes))
    sized = BATCH in _flat(kernel.params)
    return record(BATCHED, tuple(inputs), (kernel, name, split_in, summed, sized), specs)


def _flat(v: Any) -> list[Any]:
    if type(v) is tuple:
        return [y for x in v for y in _flat(x)]
    return [v]
