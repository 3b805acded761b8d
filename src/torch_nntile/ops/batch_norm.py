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
from typing import Any

import torch

from torch_nntile.graph.axes import union
from torch_nntile.graph.nodes import DataNode, OpNode
from torch_nntile.kernels import Kernel, native
from torch_nntile.ops.base import Op, record
from torch_nntile.ops.reduce import chan_combine, var_mean
from torch_nntile.tiling.tiles import Arg, Lowering, R, TileArray, W

_aten = torch.ops.aten


def bn_partial(pm: torch.Tensor, pm2: torch.Tensor, x: torch.Tensor) -> None:
    """One tile's per-channel mean and centred second moment."""
    v, m = var_mean(x, (0, *range(2, x.dim())), keepdim=False)
    pm.copy_(m)
    torch.mul(v, x.numel() // max(x.shape[1], 1), out=pm2)


def bn_combine(eps: float, momentum: float, has_w: bool, has_b: bool, has_r: bool, sizes: tuple[int, ...],
               m: torch.Tensor, r: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, *rest: torch.Tensor) -> None:
    """A channel tile's mean and inverse deviation from its tiles' parts, the scale and
    shift the normalisation applies (``x * alpha + beta``, CPU's form), and the running
    statistics updated (the variance unbiased). ``rest``: the new running statistics,
    the weight, the bias, the old running statistics, then the parts."""
    nr = 2 if has_r else 0
    new, rest = rest[:nr], rest[nr:]
    it = iter(rest)
    w = next(it) if has_w else None
    b = next(it) if has_b else None
    old = [next(it) for _ in range(nr)]
    parts = list(it)
    k = len(sizes)
    mean, m2, n = chan_combine(sizes, torch.stack(parts[:k]), torch.stack(parts[k:]))
    var = m2 / n
    m.copy_(mean)
    torch.rsqrt(var + eps, out=r)
    torch.mul(r, w, out=alpha) if w is not None else alpha.copy_(r)
    torch.sub(b, m * alpha, out=beta) if b is not None else torch.mul(m, alpha, out=beta).neg_()
    if has_r:
        new[0].copy_(old[0] * (1 - momentum) + mean * momentum)
        new[1].copy_(old[1] * (1 - momentum) + var * (n / max(n - 1, 1)) * momentum)


def bn_apply_out(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, out: torch.Tensor) -> None:
    """The normalisation, as CPU's batch norm applies it: ``x * alpha + beta``."""
    torch.add(torch.mul(x, alpha), beta, out=out)


native.RULES[bn_apply_out] = lambda p, args, kw: p.emit(native.ADD, p.emit(native.MUL, args[0], args[1]), args[2])


def bn_grad_out(g: torch.Tensor, x: torch.Tensor, m: torch.Tensor, c0: torch.Tensor, k: torch.Tensor,
                a: torch.Tensor, out: torch.Tensor) -> None:
    """The input's gradient, as CPU's: ``(g - mean(g) - (x - mean) * k) * invstd * w``."""
    torch.mul(g - c0 - (x - m) * k, a, out=out)


def _bn_grad_rule(p: native.Program, args: list[Any], kw: dict[str, Any]) -> native.Ref:
    g, x, m, c0, k, a = args
    centred = p.emit(native.MUL, p.emit(native.SUB, x, m), k)
    return p.emit(native.MUL, p.emit(native.SUB, p.emit(native.SUB, g, c0), centred), a)


native.RULES[bn_grad_out] = _bn_grad_rule


def bn_backward_partial(eps: float, sg: torch.Tensor, sgx: torch.Tensor, g: torch.Tensor, x: torch.Tensor,
                        m: torch.Tensor, r: torch.Tensor) -> None:
    """One tile's sums of ``g`` and of ``g * xhat`` per channel: CPU's eval-mode backward,
    which takes the statistics as running ones (the variance given back from ``r``)."""
    _, gx, gs = _aten.native_batch_norm_backward(g, x, None, m, r.pow(-2) - eps, None, None, False, eps,
                                                 [False, True, True])
    sgx.copy_(gx)
    sg.copy_(gs)


def bn_grad_combine(n: int, has_w: bool, sg: torch.Tensor, sgx: torch.Tensor, c0: torch.Tensor, k: torch.Tensor,
                    a: torch.Tensor, r: torch.Tensor, *rest: torch.Tensor) -> None:
    """A channel tile's ``sum(g)`` and ``sum(g * xhat)`` from its tiles' parts, and the
    coefficients of the input's gradient (``bn_grad_out``): ``mean(g)``,
    ``sum(g * xhat) * invstd / n`` and ``invstd * w``."""
    w, parts = (rest[0], rest[1:]) if has_w else (None, rest)
    half = len(parts) // 2
    torch.sum(torch.stack(parts[:half]), 0, out=sg)
    torch.sum(torch.stack(parts[half:]), 0, out=sgx)
    torch.div(sg, n, out=c0)
    torch.div(sgx * r, n, out=k)
    torch.mul(r, w, out=a) if w is not None else a.copy_(r)


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
    eps, momentum, has_w, has_b, has_r = node.attrs
    x = ctx.input(node.inputs[0])
    ch = (x.tiling[1],)
    per_channel = [ctx.input(n, ch) for n in node.inputs[1:]]  # weight, bias, running statistics
    outs = [ctx.output(n, ch) for n in node.outputs]  # mean, invstd, alpha, beta, new running statistics
    dims = (0, *range(2, len(x.shape)))

    def combine(j: int, row: list[tuple[int, ...]]) -> tuple[Kernel, list[TileArray]]:
        sizes = tuple(math.prod(x.tiling[d][xi[d]] for d in dims) for xi in row)
        return Kernel(bn_combine, eps, momentum, has_w, has_b, has_r, sizes), per_channel

    _per_channel(ctx, "batch_norm_stats", x, Kernel(bn_partial), [x], combine, outs, [], node.outputs[0].dtype)


def _lower_sums(ctx: Lowering, node: OpNode) -> None:
    eps, n, has_w = node.attrs
    x = ctx.input(node.inputs[1])
    g = ctx.input(node.inputs[0], x.tiling)
    ch = (x.tiling[1],)
    m, r, *w = [ctx.input(t, ch) for t in node.inputs[2:]]
    outs = [ctx.output(t, ch) for t in node.outputs]
    _per_channel(ctx, "batch_norm_sums", x, Kernel(bn_backward_partial, eps), [g, x],
                 lambda j, row: (Kernel(bn_grad_combine, n, has_w), [r, *w]), outs, [m, r], node.outputs[0].dtype)


def _cost(node: OpNode) -> float:
    return float(node.inputs[0].numel)


STATS = Op("batch_norm_stats", _lower_stats, cost=_cost)
SUMS = Op("batch_norm_sums", _lower_sums, cost=_cost)


def batch_norm_stats(x: DataNode, w: DataNode | None, b: DataNode | None, rm: DataNode | None, rv: DataNode | None,
                     momentum: float, eps: float) -> tuple[DataNode, ...]:
    """Per channel of ``x`` (``[N, C, ...]``, float32 or float64): the mean and the inverse
    deviation over every other dim, the scale ``alpha`` and shift ``beta`` of the
    normalisation (``bn_apply_out``), and, given running statistics, their new values."""
    ch = x.axes[1]
    has_r = rm is not None and rv is not None
    ins = [x] + [t for t in (w, b) if t is not None] + ([rm, rv] if has_r else [])
    for t in ins[1:]:
        union(ch, t.axes[0])
    c = (x.shape[1],)
    outs = [(c, x.dtype, (ch,)) for _ in range(4)]
    if has_r:
        outs += [(c, rm.dtype, (ch,)), (c, rv.dtype, (ch,))]
    return record(STATS, tuple(ins), (eps, momentum, w is not None, b is not None, has_r), outs)


def batch_norm_sums(g: DataNode, x: DataNode, mean: DataNode, invstd: DataNode, w: DataNode | None,
                    eps: float) -> tuple[DataNode, ...]:
    """Per channel: ``sum(g)`` and ``sum(g * xhat)`` (``xhat = (x - mean) * invstd``) over
    every other dim (the bias and weight gradients of batch norm), and the coefficients
    of the input's gradient (``bn_grad_out``)."""
    ch = x.axes[1]
    for t in (mean, invstd, w):
        if t is not None:
            union(ch, t.axes[0])
    c = (x.shape[1],)
    n = math.prod(s for d, s in enumerate(x.shape) if d != 1)
    ins = (g, x, mean, invstd) + ((w,) if w is not None else ())
    return record(SUMS, ins, (eps, n, w is not None), [(c, x.dtype, (ch,)) for _ in range(5)])


def _tile_rows(x: tuple[int, ...]) -> list[int] | None:
    """outer, c, inner of a tile ``[N, C, ...]`` (batch, channels, the rest)."""
    ints = [x[0], x[1], native.numel(x[2:])] if len(x) >= 2 else None
    return ints if ints is not None and native.fits_int32(*ints) else None


def _stats_rows(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...]) -> tuple[list[int], tuple] | None:
    ints = _tile_rows(shapes[2])
    return ([native.BN_STATS, *ints], ()) if ints is not None else None


def _sums_rows(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...]) -> tuple[list[int], tuple] | None:
    ints = _tile_rows(shapes[3])
    return ([native.BN_SUMS, *ints], ()) if ints is not None and shapes[2] == shapes[3] else None


def _combine_rows(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...]) -> tuple[list[int], tuple] | None:
    eps, momentum, has_w, has_b, has_r, sizes = params
    ints = [shapes[0][0], len(sizes), int(has_w), int(has_b), int(has_r), *sizes]
    return ([native.BN_COMBINE, *ints], (eps, momentum)) if native.fits_int32(*ints) else None


def _grad_combine_rows(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...]) -> tuple[list[int], tuple] | None:
    n, has_w = params
    ints = [shapes[0][0], (len(shapes) - 6 - int(has_w)) // 2, int(has_w), n]
    return ([native.BN_GRAD_COMBINE, *ints], ()) if native.fits_int32(*ints) else None


native.ROWS[bn_partial] = _stats_rows
native.ROWS[bn_backward_partial] = _sums_rows
native.ROWS[bn_combine] = _combine_rows
native.ROWS[bn_grad_combine] = _grad_combine_rows
