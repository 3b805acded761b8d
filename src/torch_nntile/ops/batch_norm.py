"""Batch norm's statistics over the batch (training mode), forward and backward, tiled
along every dim: a channel's statistics are over the batch and the spatial dims, so
each tile computes its part with CPU's batch norm kernels and one small task per
channel tile combines the parts (Chan's formula for the variance, as every tiled
``var`` does) and updates the running statistics. The normalisation and the input's
gradient, elementwise given these, are recorded as elementwise ops
(``backend/table_norms.py``), which fuse with their neighbours (a ReLU).
"""

from __future__ import annotations

import itertools
import math

import torch

from torch_nntile.graph.axes import union
from torch_nntile.graph.nodes import DataNode, OpNode
from torch_nntile.kernels import Kernel
from torch_nntile.ops.base import Op, record
from torch_nntile.ops.reduce import chan_combine
from torch_nntile.tiling.tiles import Arg, Lowering, R, TileArray, W

_aten = torch.ops.aten


def bn_partial(pm: torch.Tensor, pm2: torch.Tensor, x: torch.Tensor) -> None:
    """One tile's per-channel mean and centred second moment."""
    m, v = torch.batch_norm_update_stats(x, None, None, 0.0)
    pm.copy_(m)
    torch.mul(v, x.numel() // max(x.shape[1], 1), out=pm2)


def bn_combine(eps: float, momentum: float, has_r: bool, sizes: tuple[int, ...], m: torch.Tensor, r: torch.Tensor,
               *rest: torch.Tensor) -> None:
    """A channel tile's mean and inverse deviation from its tiles' parts; the running
    statistics updated (the variance unbiased)."""
    nr = 2 if has_r else 0
    new, old, parts = rest[:nr], rest[nr:2 * nr], rest[2 * nr:]
    k = len(sizes)
    mean, m2, n = chan_combine(sizes, torch.stack(parts[:k]), torch.stack(parts[k:]))
    var = m2 / n
    m.copy_(mean)
    torch.rsqrt(var + eps, out=r)
    if has_r:
        new[0].copy_(old[0] * (1 - momentum) + mean * momentum)
        new[1].copy_(old[1] * (1 - momentum) + var * (n / max(n - 1, 1)) * momentum)


def bn_backward_partial(eps: float, sg: torch.Tensor, sgx: torch.Tensor, g: torch.Tensor, x: torch.Tensor,
                        m: torch.Tensor, r: torch.Tensor) -> None:
    """One tile's sums of ``g`` and of ``g * xhat`` per channel: CPU's eval-mode backward,
    which takes the statistics as running ones (the variance given back from ``r``)."""
    _, gx, gs = _aten.native_batch_norm_backward(g, x, None, m, r.pow(-2) - eps, None, None, False, eps,
                                                 [False, True, True])
    sgx.copy_(gx)
    sg.copy_(gs)


def sum_parts(o0: torch.Tensor, o1: torch.Tensor, *parts: torch.Tensor) -> None:
    """Each output the sum of its kind of parts (equally many of each)."""
    n = len(parts) // 2
    torch.sum(torch.stack(parts[:n]), 0, out=o0)
    torch.sum(torch.stack(parts[n:]), 0, out=o1)


def _rows(x: TileArray) -> list[list[tuple[int, ...]]]:
    """Per channel tile, the indices of ``x``'s tiles holding that channel's values."""
    others = [range(x.grid[d]) if d != 1 else [0] for d in range(len(x.shape))]
    return [[tuple(j if d == 1 else i[d] for d in range(len(x.shape))) for i in itertools.product(*others)]
            for j in range(x.grid[1])]


def _per_channel(ctx: Lowering, name: str, x: TileArray, partial: Kernel, ins: list[TileArray],
                 combine: object, outs: list[TileArray], extra: list[TileArray], part_dtype: torch.dtype) -> None:
    """Per channel tile ``j``: ``partial`` on each of its tiles (of ``x`` and the tiles of
    ``ins`` at the same index, then the per-channel tiles ``extra``) writes two parts;
    ``combine(j)`` writes tile ``j`` of ``outs`` from the per-channel ``extra`` tiles and
    the parts."""
    for j, row in enumerate(_rows(x)):
        c = x.tiling[1][j]
        parts: list[list[Arg]] = [[], []]
        for xi in row:
            ps = [ctx.temp((c,), part_dtype) for _ in range(2)]
            ctx.task(partial, [Arg(p, (0,), W) for p in ps] + [Arg(a, xi, R) for a in ins]
                     + [Arg(e, (j,), R) for e in extra], name)
            for lst, p in zip(parts, ps):
                lst.append(Arg(p, (0,), R))
        kernel, reads = combine(j, row)  # type: ignore[operator]
        ctx.task(kernel, [Arg(o, (j,), W) for o in outs] + [Arg(a, (j,), R) for a in reads] + parts[0] + parts[1],
                 name)


def _lower_stats(ctx: Lowering, node: OpNode) -> None:
    eps, momentum, has_r = node.attrs
    x = ctx.input(node.inputs[0])
    ch = (x.tiling[1],)
    old = [ctx.input(n, ch) for n in node.inputs[1:]]
    outs = [ctx.output(n, ch) for n in node.outputs]  # mean, invstd, and the new running statistics
    dims = (0, *range(2, len(x.shape)))

    def combine(j: int, row: list[tuple[int, ...]]) -> tuple[Kernel, list[TileArray]]:
        sizes = tuple(math.prod(x.tiling[d][xi[d]] for d in dims) for xi in row)
        return Kernel(bn_combine, eps, momentum, has_r, sizes), old

    _per_channel(ctx, "batch_norm_stats", x, Kernel(bn_partial), [x], combine, outs, [], node.outputs[0].dtype)


def _lower_sums(ctx: Lowering, node: OpNode) -> None:
    (eps,) = node.attrs
    x = ctx.input(node.inputs[1])
    g = ctx.input(node.inputs[0], x.tiling)
    ch = (x.tiling[1],)
    stats = [ctx.input(n, ch) for n in node.inputs[2:]]
    outs = [ctx.output(n, ch) for n in node.outputs]
    _per_channel(ctx, "batch_norm_sums", x, Kernel(bn_backward_partial, eps), [g, x],
                 lambda j, row: (Kernel(sum_parts), []), outs, stats, node.outputs[0].dtype)


def _cost(node: OpNode) -> float:
    return float(node.inputs[0].numel)


STATS = Op("batch_norm_stats", _lower_stats, cost=_cost)
SUMS = Op("batch_norm_sums", _lower_sums, cost=_cost)


def batch_norm_stats(x: DataNode, rm: DataNode | None, rv: DataNode | None, momentum: float,
                     eps: float) -> tuple[DataNode, ...]:
    """Per channel of ``x`` (``[N, C, ...]``, float32 or float64): the mean and the inverse
    deviation over every other dim, and, given running statistics, their new values."""
    ch = x.axes[1]
    has_r = rm is not None and rv is not None
    ins = (x, rm, rv) if has_r else (x,)
    for t in ins[1:]:
        union(ch, t.axes[0])
    c = (x.shape[1],)
    outs = [(c, x.dtype, (ch,)), (c, x.dtype, (ch,))]
    if has_r:
        outs += [(c, rm.dtype, (ch,)), (c, rv.dtype, (ch,))]
    return record(STATS, ins, (eps, momentum, has_r), outs)


def batch_norm_sums(g: DataNode, x: DataNode, mean: DataNode, invstd: DataNode, eps: float) -> tuple[DataNode, ...]:
    """Per channel: ``sum(g)`` and ``sum(g * xhat)``, ``xhat = (x - mean) * invstd``, over
    every other dim (the bias and weight gradients of batch norm)."""
    ch = x.axes[1]
    union(ch, mean.axes[0])
    union(ch, invstd.axes[0])
    c = (x.shape[1],)
    return record(SUMS, (g, x, mean, invstd), (eps,), [(c, x.dtype, (ch,)), (c, x.dtype, (ch,))])
