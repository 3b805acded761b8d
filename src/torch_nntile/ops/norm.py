"""Layer normalization: forward and backward.

With the normalized (trailing) dims whole in a tile, one task per tile of the
leading dims runs ATen's kernel. With them tiled, each tile writes its rows' mean
and centred second moment, one task per row of tiles combines them (Chan's
combination, as exact as a two-pass variance), and each tile is then normalized.
The backward combines per-tile sums of ``g*w`` and ``g*w*xhat`` per row likewise;
the weight and bias gradients sum over the tiles of the leading dims.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any

import torch

from torch_nntile.graph.axes import new_group, union
from torch_nntile.graph.nodes import DataNode, OpNode
from torch_nntile.kernels import Kernel, native
from torch_nntile.ops.base import Op, record, reduce_into, split_chains
from torch_nntile.ops.reduce import acc_dtype, chan_combine, part_sizes, row_stats, stacked
from torch_nntile.tiling.tiles import Arg, Lowering, R, W

_aten = torch.ops.aten


def _affine_args(ctx: Lowering, nodes: tuple[DataNode, ...]) -> list[Arg]:
    """Weight and bias, each whole in one tile."""
    out = []
    for n in nodes:
        arr = ctx.input(n, tuple((s,) for s in n.shape))
        out.append(Arg(arr, (0,) * len(n.shape), R))
    return out


def _affine(has_w: bool, has_b: bool, wb: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    it = iter(wb)
    return (next(it) if has_w else None), (next(it) if has_b else None)


def layer_norm_tile(shape: tuple[int, ...], eps: float, has_w: bool, has_b: bool, o: torch.Tensor, m: torch.Tensor,
                    r: torch.Tensor, t: torch.Tensor, *wb: torch.Tensor) -> None:
    w, b = _affine(has_w, has_b, wb)
    _aten.native_layer_norm.out(t, list(shape), w, b, eps, out0=o, out1=m, out2=r)


def _layer_norm_rows(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...]) -> tuple[list[int], tuple] | None:
    shape, eps, has_w, has_b = params
    n = native.numel(shape)
    if n == 0 or shapes[0] != shapes[3]:
        return None
    return [native.LAYER_NORM, native.numel(shapes[3]) // n, n, int(has_w), int(has_b)], (float(eps),)


native.ROWS[layer_norm_tile] = _layer_norm_rows


def _trailing_tiled(ctx: Lowering, xn: DataNode, k: int) -> bool:
    planned = ctx.tiling(xn)
    return any(len(planned[d]) > 1 for d in range(len(xn.shape) - k, len(xn.shape)))


def ln_moments_partial(dims: tuple[int, ...], m: torch.Tensor, m2: torch.Tensor, t: torch.Tensor) -> None:
    v, mean = torch.var_mean(t.to(m.dtype), dims, correction=0, keepdim=True)
    m.copy_(mean)
    torch.mul(v, math.prod(t.shape[d] for d in dims), out=m2)


def ln_moments_combine(eps: float, sizes: tuple[int, ...], mean: torch.Tensor, rstd: torch.Tensor,
                       *parts: torch.Tensor) -> None:
    mu, m2, n = chan_combine(sizes, *stacked(parts, 2))
    mean.copy_(mu)
    rstd.copy_(torch.rsqrt((m2 / n).clamp_min(0) + eps))


def ln_apply(has_w: bool, has_b: bool, y: torch.Tensor, x: torch.Tensor, m: torch.Tensor, r: torch.Tensor,
             *wb: torch.Tensor) -> None:
    w, b = _affine(has_w, has_b, wb)
    acc = acc_dtype(x.dtype)
    out = (x.to(acc) - m.to(acc)) * r.to(acc)
    if w is not None:
        out = out * w
    if b is not None:
        out = out + b
    y.copy_(out)


def _lower_layer_norm_tiled(ctx: Lowering, node: OpNode) -> None:
    k, eps, has_w, has_b = node.attrs
    xn = node.inputs[0]
    nd = len(xn.shape)
    trailing = tuple(range(nd - k, nd))
    x = ctx.input(xn)
    y = ctx.output(node.outputs[0])
    mean, rstd = ctx.output(node.outputs[1]), ctx.output(node.outputs[2])
    affine = [ctx.input(n) for n in node.inputs[1:]]  # tiled as the normalized dims
    acc = acc_dtype(xn.dtype)
    row_stats(ctx, "native_layer_norm", x, trailing, lambda xi: [Arg(x, xi, R)], Kernel(ln_moments_partial, trailing),
              Kernel(ln_moments_combine, eps, part_sizes(x, trailing)), [mean, rstd], [acc, acc])
    apply = Kernel(ln_apply, has_w, has_b)
    for idx in y.indices():
        sidx = idx[:nd - k] + (0,) * k
        ctx.task(apply, [Arg(y, idx, W), Arg(x, idx, R), Arg(mean, sidx, R), Arg(rstd, sidx, R)]
                 + [Arg(a, idx[nd - k:], R) for a in affine], "native_layer_norm")


def _lower_layer_norm(ctx: Lowering, node: OpNode) -> None:
    k, eps, has_w, has_b = node.attrs
    xn = node.inputs[0]
    if _trailing_tiled(ctx, xn, k):
        _lower_layer_norm_tiled(ctx, node)
        return
    nd = len(xn.shape)
    trailing = range(nd - k, nd)
    x = ctx.input(xn, ctx.whole(xn, trailing))
    y = ctx.output(node.outputs[0], ctx.whole(node.outputs[0], trailing))
    mean, rstd = ctx.output(node.outputs[1]), ctx.output(node.outputs[2])
    affine = _affine_args(ctx, node.inputs[1:])
    kernel = Kernel(layer_norm_tile, tuple(xn.shape[nd - k:]), eps, has_w, has_b)
    for idx in y.indices():
        ctx.task(kernel, [Arg(y, idx, W), Arg(mean, idx, W), Arg(rstd, idx, W), Arg(x, idx, R), *affine],
                 "native_layer_norm")


LAYER_NORM = Op("native_layer_norm", _lower_layer_norm, cost=lambda node: node.inputs[0].numel)


def layer_norm(x: DataNode, normalized_shape: tuple[int, ...], w: DataNode | None, b: DataNode | None,
               eps: float) -> tuple[DataNode, DataNode, DataNode]:
    k = len(normalized_shape)
    nd = len(x.shape)
    if k == 0 or tuple(x.shape[nd - k:]) != tuple(normalized_shape):
        raise RuntimeError(f"Given normalized_shape={list(normalized_shape)}, expected input with shape "
                           f"[*, {', '.join(map(str, normalized_shape))}], but got input of size{list(x.shape)}")
    for p in (w, b):
        if p is not None and p.shape != tuple(normalized_shape):
            raise RuntimeError(f"Expected weight to be of same shape as normalized_shape, but got weight of shape "
                               f"{list(p.shape)} and normalized_shape = {list(normalized_shape)}")
        if p is not None:
            for a, xa in zip(p.axes, x.axes[nd - k:]):
                union(a, xa)
    stat_shape = x.shape[:nd - k] + (1,) * k
    stats = [(stat_shape, x.dtype, x.axes[:nd - k] + tuple(new_group(1) for _ in range(k))) for _ in range(2)]
    inputs = tuple(n for n in (x, w, b) if n is not None)
    return record(LAYER_NORM, inputs, (k, eps, w is not None, b is not None), [(x.shape, x.dtype, x.axes), *stats])


def layer_norm_grad(which: int, shape: tuple[int, ...], has_w: bool, has_b: bool, g: torch.Tensor, x: torch.Tensor,
                    m: torch.Tensor, r: torch.Tensor, wb: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Gradient ``which`` (0 input, 1 weight, 2 bias) of one tile of rows."""
    w, b = _affine(has_w, has_b, wb)
    return _aten.native_layer_norm_backward(g, x, list(shape), m, r, w, b, [i == which for i in range(3)])[which]


def layer_norm_grad_tile(which: int, shape: tuple[int, ...], has_w: bool, has_b: bool, o: torch.Tensor,
                         *ts: torch.Tensor) -> None:
    o.copy_(layer_norm_grad(which, shape, has_w, has_b, *ts[:4], ts[4:]))


def layer_norm_grad_tile_into(which: int, shape: tuple[int, ...], has_w: bool, has_b: bool, o: torch.Tensor,
                              *ts: torch.Tensor) -> None:
    o.add_(layer_norm_grad(which, shape, has_w, has_b, *ts[:4], ts[4:]))


def _layer_norm_grad_rows(accumulate: bool, params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...]
                          ) -> tuple[list[int], tuple] | None:
    which, shape, has_w, has_b = params
    n = native.numel(shape)
    if n == 0 or shapes[1] != shapes[2] or (which == 0 and shapes[0] != shapes[1]) \
            or (which and native.numel(shapes[0]) != n):
        return None
    rows = native.numel(shapes[2]) // n
    return [native.LAYER_NORM_GRAD, rows, n, which, int(has_w), int(has_b), int(accumulate)], ()


native.ROWS[layer_norm_grad_tile] = functools.partial(_layer_norm_grad_rows, False)
native.ROWS[layer_norm_grad_tile_into] = functools.partial(_layer_norm_grad_rows, True)


def ln_backward_partial(dims: tuple[int, ...], has_w: bool, pa: torch.Tensor, pc: torch.Tensor, g: torch.Tensor,
                        x: torch.Tensor, m: torch.Tensor, r: torch.Tensor, *w: torch.Tensor) -> None:
    """Per row of a tile: ``sum(g*w)`` and ``sum(g*w*xhat)`` over the normalized dims."""
    acc = pa.dtype
    gw = g.to(acc) * w[0] if has_w else g.to(acc)
    torch.sum(gw, dims, keepdim=True, out=pa)
    torch.sum(gw * ((x.to(acc) - m.to(acc)) * r.to(acc)), dims, keepdim=True, out=pc)


def sum_pairs_combine(a: torch.Tensor, c: torch.Tensor, *parts: torch.Tensor) -> None:
    sa, sc = stacked(parts, 2)
    torch.sum(sa, 0, out=a)
    torch.sum(sc, 0, out=c)


def ln_backward_apply(has_w: bool, n: int, gx: torch.Tensor, g: torch.Tensor, x: torch.Tensor, m: torch.Tensor,
                      r: torch.Tensor, *rest: torch.Tensor) -> None:
    """``gx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat))``."""
    a, c = rest[-2], rest[-1]
    acc = a.dtype
    rf = r.to(acc)
    gw = g.to(acc) * rest[0] if has_w else g.to(acc)
    xhat = (x.to(acc) - m.to(acc)) * rf
    gx.copy_(rf * (gw - a / n - xhat * (c / n)))


def ln_param_grad(which: int, lead: int, g: torch.Tensor, x: torch.Tensor, m: torch.Tensor,
                  r: torch.Tensor) -> torch.Tensor:
    """Weight (``which`` 1: ``g * xhat``) or bias (2: ``g``) gradient of one tile, summed
    over the leading dims."""
    acc = acc_dtype(g.dtype)
    v = g.to(acc) * ((x.to(acc) - m.to(acc)) * r.to(acc)) if which == 1 else g.to(acc)
    return v.sum(tuple(range(lead))) if lead else v


def ln_param_grad_tile(which: int, lead: int, o: torch.Tensor, *ts: torch.Tensor) -> None:
    o.copy_(ln_param_grad(which, lead, *ts))


def ln_param_grad_tile_into(which: int, lead: int, o: torch.Tensor, *ts: torch.Tensor) -> None:
    o.add_(ln_param_grad(which, lead, *ts))


def _lower_layer_norm_backward_tiled(ctx: Lowering, node: OpNode) -> None:
    k, mask, has_w, has_b = node.attrs
    gn, xn, mn, rn = node.inputs[:4]
    nd = len(xn.shape)
    lead = nd - k
    trailing = tuple(range(lead, nd))
    g, x, mean, rstd = (ctx.input(n) for n in (gn, xn, mn, rn))
    w = ctx.input(node.inputs[4]) if has_w else None
    acc = acc_dtype(xn.dtype)
    name = "native_layer_norm_backward"

    def row_args(idx: tuple[int, ...]) -> list[Arg]:
        sidx = idx[:lead] + (0,) * k
        args = [Arg(g, idx, R), Arg(x, idx, R), Arg(mean, sidx, R), Arg(rstd, sidx, R)]
        return args + ([Arg(w, idx[lead:], R)] if w is not None else [])

    outs = iter(node.outputs)
    if mask[0]:
        gx = ctx.output(next(outs))
        stats = [ctx.temp(mn.shape, acc, mean.tiling) for _ in range(2)]
        row_stats(ctx, name, x, trailing, row_args, Kernel(ln_backward_partial, trailing, has_w),
                  Kernel(sum_pairs_combine), stats, [acc, acc])
        apply = Kernel(ln_backward_apply, has_w, math.prod(xn.shape[lead:]))
        for idx in gx.indices():
            sidx = idx[:lead] + (0,) * k
            ctx.task(apply, [Arg(gx, idx, W), *row_args(idx), Arg(stats[0], sidx, R), Arg(stats[1], sidx, R)], name)
    for which in (1, 2):
        if not mask[which]:
            continue
        out = ctx.output(next(outs))
        write, accum = Kernel(ln_param_grad_tile, which, lead), Kernel(ln_param_grad_tile_into, which, lead)
        lead_grid = [range(n) for n in x.grid[:lead]]
        nlead = math.prod(len(r) for r in lead_grid)
        nchains = split_chains(ctx, node, nlead, math.prod(out.grid))
        for pidx in out.indices():
            parts = [(write, accum, row_args(li + pidx)[:4]) for li in itertools.product(*lead_grid)]
            reduce_into(ctx, out, pidx, parts, name, nchains)


def _lower_layer_norm_backward(ctx: Lowering, node: OpNode) -> None:
    k, mask, has_w, has_b = node.attrs
    gn, xn, mn, rn = node.inputs[:4]
    if _trailing_tiled(ctx, xn, k):
        _lower_layer_norm_backward_tiled(ctx, node)
        return
    nd = len(xn.shape)
    trailing = range(nd - k, nd)
    g, x = ctx.input(gn, ctx.whole(gn, trailing)), ctx.input(xn, ctx.whole(xn, trailing))
    mean, rstd = ctx.input(mn), ctx.input(rn)
    affine = _affine_args(ctx, node.inputs[4:])
    shape = tuple(xn.shape[nd - k:])
    outs = iter(node.outputs)
    rows = [(idx, [Arg(g, idx, R), Arg(x, idx, R), Arg(mean, idx, R), Arg(rstd, idx, R), *affine])
            for idx in x.indices()]
    if mask[0]:
        gx = ctx.output(next(outs), ctx.whole(xn, trailing))
        kernel = Kernel(layer_norm_grad_tile, 0, shape, has_w, has_b)
        for idx, args in rows:
            ctx.task(kernel, [Arg(gx, idx, W), *args], "native_layer_norm_backward")
    for which in (1, 2):
        if not mask[which]:
            continue
        out = ctx.output(next(outs), tuple((s,) for s in shape))
        write = Kernel(layer_norm_grad_tile, which, shape, has_w, has_b)
        acc = Kernel(layer_norm_grad_tile_into, which, shape, has_w, has_b)
        reduce_into(ctx, out, (0,) * k, [(write, acc, args) for _, args in rows], "native_layer_norm_backward", 1)


LAYER_NORM_BACKWARD = Op("native_layer_norm_backward", _lower_layer_norm_backward,
                         cost=lambda node: 3 * node.inputs[1].numel)


def layer_norm_backward(g: DataNode, x: DataNode, normalized_shape: tuple[int, ...], mean: DataNode,
                        rstd: DataNode, w: DataNode | None, b: DataNode | None,
                        mask: tuple[bool, bool, bool]) -> list[DataNode | None]:
    """The gradients ``mask`` asks for (None for the others)."""
    k = len(normalized_shape)
    for a, ga in zip(x.axes, g.axes):
        union(a, ga)
    if not any(mask):
        return [None, None, None]
    if (mask[1] and w is None) or (mask[2] and b is None):
        mask = (mask[0], mask[1] and w is not None, mask[2] and b is not None)
    pshape = tuple(normalized_shape)
    outs = []
    if mask[0]:
        outs.append((x.shape, x.dtype, x.axes))
    for m, p in zip(mask[1:], (w, b)):
        if m:
            outs.append((pshape, p.dtype, p.axes))
    inputs = tuple(n for n in (g, x, mean, rstd, w, b) if n is not None)
    nodes = iter(record(LAYER_NORM_BACKWARD, inputs, (k, mask, w is not None, b is not None), outs))
    return [next(nodes) if m else None for m in mask]
