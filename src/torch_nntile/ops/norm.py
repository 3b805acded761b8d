"""Layer and RMS normalization over the trailing dims, forward and backward, from one
factory; with the normalized dims tiled, per-tile statistics are combined per row.
See docs/architecture/adding-an-op.md (lowering patterns: layer norm and RMS norm).
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
from torch_nntile.ops.reduce import acc_dtype, chan_combine, part_sizes, row_stats, stacked, sum_parts_combine
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


def _xhat(x: torch.Tensor, stats: tuple[torch.Tensor, ...], acc: torch.dtype) -> torch.Tensor:
    """The normalized rows: ``(x - mean) * rstd`` from (mean, rstd), ``x * rstd`` from (rstd,)."""
    r = stats[-1].to(acc)
    return (x.to(acc) - stats[0].to(acc)) * r if len(stats) == 2 else x.to(acc) * r


def _trailing(t: torch.Tensor, k: int) -> tuple[int, ...]:
    return tuple(range(t.dim() - k, t.dim()))


# -- whole-row kernels (the normalized dims in one tile) ------------------------------


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


def rms_norm_tile(shape: tuple[int, ...], eps: float, has_w: bool, has_b: bool, o: torch.Tensor, r: torch.Tensor,
                  t: torch.Tensor, *w: torch.Tensor) -> None:
    """As CPU's ``rms_norm``: ``x * rsqrt(mean(x^2) + eps) * w``."""
    acc = acc_dtype(t.dtype)
    tf = t.to(acc)
    rs = torch.rsqrt(tf.square().mean(_trailing(t, len(shape)), keepdim=True) + eps)
    r.copy_(rs)
    y = tf * rs
    o.copy_(y * w[0] if has_w else y)


def _rms_norm_rows(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...]) -> tuple[list[int], tuple] | None:
    shape, eps, has_w, _ = params
    n = native.numel(shape)
    if n == 0 or shapes[0] != shapes[2]:
        return None
    return [native.RMS_NORM, native.numel(shapes[2]) // n, n, int(has_w)], (float(eps),)


native.ROWS[rms_norm_tile] = _rms_norm_rows


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


def rms_norm_grad(which: int, shape: tuple[int, ...], has_w: bool, g: torch.Tensor, x: torch.Tensor, r: torch.Tensor,
                  w: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Gradient ``which`` (0 input: ``rstd * (g*w - xhat * mean(g*w*xhat))``, 1 weight:
    ``g * xhat`` summed over the leading dims) of one tile of rows."""
    acc = acc_dtype(g.dtype)
    dims = _trailing(x, len(shape))
    xhat = _xhat(x, (r,), acc)
    if which:
        v = g.to(acc) * xhat
        return v.sum(tuple(range(dims[0]))) if dims[0] else v
    gw = g.to(acc) * w[0] if has_w else g.to(acc)
    return r.to(acc) * (gw - xhat * (gw * xhat).mean(dims, keepdim=True))


def rms_norm_grad_tile(which: int, shape: tuple[int, ...], has_w: bool, has_b: bool, o: torch.Tensor,
                       *ts: torch.Tensor) -> None:
    o.copy_(rms_norm_grad(which, shape, has_w, *ts[:3], ts[3:]))


def rms_norm_grad_tile_into(which: int, shape: tuple[int, ...], has_w: bool, has_b: bool, o: torch.Tensor,
                            *ts: torch.Tensor) -> None:
    o.add_(rms_norm_grad(which, shape, has_w, *ts[:3], ts[3:]))


def _rms_norm_grad_rows(accumulate: bool, params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...]
                        ) -> tuple[list[int], tuple] | None:
    which, shape, has_w, _ = params
    n = native.numel(shape)
    if n == 0 or shapes[1] != shapes[2] or (which == 0 and shapes[0] != shapes[1]) \
            or (which and native.numel(shapes[0]) != n):
        return None
    return [native.RMS_NORM_GRAD, native.numel(shapes[2]) // n, n, which, int(has_w), int(accumulate)], ()


native.ROWS[rms_norm_grad_tile] = functools.partial(_rms_norm_grad_rows, False)
native.ROWS[rms_norm_grad_tile_into] = functools.partial(_rms_norm_grad_rows, True)


# -- kernels of tiled rows: partial statistics, combined, then applied -------------------


def ln_moments_partial(dims: tuple[int, ...], m: torch.Tensor, m2: torch.Tensor, t: torch.Tensor) -> None:
    v, mean = torch.var_mean(t.to(m.dtype), dims, correction=0, keepdim=True)
    m.copy_(mean)
    torch.mul(v, math.prod(t.shape[d] for d in dims), out=m2)


def ln_moments_combine(eps: float, sizes: tuple[int, ...], mean: torch.Tensor, rstd: torch.Tensor,
                       *parts: torch.Tensor) -> None:
    mu, m2, n = chan_combine(sizes, *stacked(parts, 2))
    mean.copy_(mu)
    rstd.copy_(torch.rsqrt((m2 / n).clamp_min(0) + eps))


def rms_sumsq_partial(dims: tuple[int, ...], ss: torch.Tensor, t: torch.Tensor) -> None:
    torch.sum(t.to(ss.dtype).square(), dims, keepdim=True, out=ss)


def rms_combine(eps: float, sizes: tuple[int, ...], rstd: torch.Tensor, *parts: torch.Tensor) -> None:
    rstd.copy_(torch.rsqrt(torch.stack(parts).sum(0) / sum(sizes) + eps))


def norm_apply(nstats: int, has_w: bool, has_b: bool, y: torch.Tensor, x: torch.Tensor, *rest: torch.Tensor) -> None:
    """``xhat * w + b`` of a tile, from its rows' statistics (``nstats`` of them)."""
    w, b = _affine(has_w, has_b, rest[nstats:])
    out = _xhat(x, rest[:nstats], acc_dtype(x.dtype))
    if w is not None:
        out = out * w
    if b is not None:
        out = out + b
    y.copy_(out)


def _xhat_program(p: native.Program, nstats: int, x: native.Ref, stats: list[native.Ref]) -> native.Ref:
    return p.emit(native.MUL, p.emit(native.SUB, x, stats[0]) if nstats == 2 else x, stats[-1])


def _norm_apply_program(p: native.Program, params: tuple[Any, ...], refs: list[native.Ref]) -> native.Ref:
    """``norm_apply``'s steps in its order (float32 tiles: its accumulation dtype is theirs)."""
    nstats, has_w, has_b = params
    out = _xhat_program(p, nstats, refs[0], refs[1:1 + nstats])
    rest = iter(refs[1 + nstats:])
    if has_w:
        out = p.emit(native.MUL, out, next(rest))
    return p.emit(native.ADD, out, next(rest)) if has_b else out


native.TRANSLATORS[norm_apply] = _norm_apply_program


def norm_backward_partial(nstats: int, dims: tuple[int, ...], has_w: bool, *ts: torch.Tensor) -> None:
    """Per row of a tile: ``sum(g*w)`` (layer norm only) and ``sum(g*w*xhat)`` over the
    normalized dims; ``ts``: the partial tiles, then g, x, the statistics and w."""
    nparts = nstats
    parts, (g, x), stats, w = ts[:nparts], ts[nparts:nparts + 2], ts[nparts + 2:2 * nparts + 2], ts[2 * nparts + 2:]
    acc = parts[0].dtype
    gw = g.to(acc) * w[0] if has_w else g.to(acc)
    if nparts == 2:
        torch.sum(gw, dims, keepdim=True, out=parts[0])
    torch.sum(gw * _xhat(x, stats, acc), dims, keepdim=True, out=parts[-1])


def norm_backward_apply(nstats: int, has_w: bool, n: int, gx: torch.Tensor, g: torch.Tensor, x: torch.Tensor,
                        *rest: torch.Tensor) -> None:
    """``gx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat))``, without ``mean(g*w)`` for RMS norm;
    ``rest``: the statistics, w, then the row sums."""
    stats, sums = rest[:nstats], rest[len(rest) - nstats:]
    acc = sums[0].dtype
    gw = g.to(acc) * rest[nstats] if has_w else g.to(acc)
    out = gw - _xhat(x, stats, acc) * (sums[-1] / n)
    if nstats == 2:
        out = out - sums[0] / n
    gx.copy_(stats[-1].to(acc) * out)


def _norm_backward_apply_program(p: native.Program, params: tuple[Any, ...], refs: list[native.Ref]) -> native.Ref:
    nstats, has_w, n = params
    g, x, stats = refs[0], refs[1], refs[2:2 + nstats]
    w, sums = refs[2 + nstats:2 + nstats + has_w], refs[len(refs) - nstats:]
    gw = p.emit(native.MUL, g, w[0]) if has_w else g
    out = p.emit(native.SUB, gw, p.emit(native.MUL, _xhat_program(p, nstats, x, stats), p.emit(native.DIV, sums[-1], n)))
    if nstats == 2:
        out = p.emit(native.SUB, out, p.emit(native.DIV, sums[0], n))
    return p.emit(native.MUL, stats[-1], out)


native.TRANSLATORS[norm_backward_apply] = _norm_backward_apply_program


def norm_param_grad(which: int, lead: int, g: torch.Tensor, x: torch.Tensor, *stats: torch.Tensor) -> torch.Tensor:
    """Weight (``which`` 1: ``g * xhat``) or bias (2: ``g``) gradient of one tile, summed
    over the leading dims."""
    acc = acc_dtype(g.dtype)
    v = g.to(acc) * _xhat(x, stats, acc) if which == 1 else g.to(acc)
    return v.sum(tuple(range(lead))) if lead else v


def norm_param_grad_tile(which: int, lead: int, o: torch.Tensor, *ts: torch.Tensor) -> None:
    o.copy_(norm_param_grad(which, lead, *ts))


def norm_param_grad_tile_into(which: int, lead: int, o: torch.Tensor, *ts: torch.Tensor) -> None:
    o.add_(norm_param_grad(which, lead, *ts))


# -- the factory: what distinguishes a normalization, and its two ops ---------------------


class Norm:
    """One normalization: its op names, the number of row statistics (2: mean and rstd;
    1: rstd), the kernels of whole rows (forward; backward writing and accumulating)
    and of tiled rows (partial statistics and their combination)."""

    __slots__ = ("name", "backward_name", "nstats", "whole", "grad", "grad_into", "partial", "combine", "forward_op",
                 "backward_op")

    def __init__(self, name: str, backward_name: str, nstats: int, whole: Any, grad: Any, grad_into: Any,
                 partial: Any, combine: Any) -> None:
        self.name, self.backward_name, self.nstats = name, backward_name, nstats
        self.whole, self.grad, self.grad_into, self.partial, self.combine = whole, grad, grad_into, partial, combine
        self.forward_op = Op(name, functools.partial(_lower_norm, self), cost=lambda node: node.inputs[0].numel)
        self.backward_op = Op(backward_name, functools.partial(_lower_norm_backward, self),
                              cost=lambda node: 3 * node.inputs[1].numel)

    def __repr__(self) -> str:
        return f"Norm({self.name})"


def _trailing_tiled(ctx: Lowering, xn: DataNode, k: int) -> bool:
    planned = ctx.tiling(xn)
    return any(len(planned[d]) > 1 for d in range(len(xn.shape) - k, len(xn.shape)))


def _lower_norm(kind: Norm, ctx: Lowering, node: OpNode) -> None:
    k, eps, has_w, has_b = node.attrs
    xn = node.inputs[0]
    nd = len(xn.shape)
    lead = nd - k
    trailing = tuple(range(lead, nd))
    name = kind.name
    if not _trailing_tiled(ctx, xn, k):
        x = ctx.input(xn, ctx.whole(xn, trailing))
        y = ctx.output(node.outputs[0], ctx.whole(node.outputs[0], trailing))
        stats = [ctx.output(n) for n in node.outputs[1:]]
        affine = _affine_args(ctx, node.inputs[1:])
        kernel = Kernel(kind.whole, tuple(xn.shape[lead:]), eps, has_w, has_b)
        for idx in y.indices():
            ctx.task(kernel, [Arg(y, idx, W), *(Arg(s, idx, W) for s in stats), Arg(x, idx, R), *affine], name)
        return
    x = ctx.input(xn)
    y = ctx.output(node.outputs[0])
    stats = [ctx.output(n) for n in node.outputs[1:]]
    affine = [ctx.input(n) for n in node.inputs[1:]]  # tiled as the normalized dims
    acc = acc_dtype(xn.dtype)
    row_stats(ctx, name, x, trailing, lambda xi: [Arg(x, xi, R)], Kernel(kind.partial, trailing),
              Kernel(kind.combine, eps, part_sizes(x, trailing)), stats, [acc] * kind.nstats)
    apply = Kernel(norm_apply, kind.nstats, has_w, has_b)
    for idx in y.indices():
        sidx = idx[:lead] + (0,) * k
        ctx.task(apply, [Arg(y, idx, W), Arg(x, idx, R), *(Arg(s, sidx, R) for s in stats)]
                 + [Arg(a, idx[lead:], R) for a in affine], name)


def _lower_norm_backward_tiled(kind: Norm, ctx: Lowering, node: OpNode) -> None:
    k, mask, has_w, has_b = node.attrs
    ns = kind.nstats
    gn, xn = node.inputs[:2]
    nd = len(xn.shape)
    lead = nd - k
    trailing = tuple(range(lead, nd))
    g, x = ctx.input(gn), ctx.input(xn)
    stats = [ctx.input(n) for n in node.inputs[2:2 + ns]]
    w = ctx.input(node.inputs[2 + ns]) if has_w else None
    acc = acc_dtype(xn.dtype)
    name = kind.backward_name

    def row_args(idx: tuple[int, ...]) -> list[Arg]:
        sidx = idx[:lead] + (0,) * k
        args = [Arg(g, idx, R), Arg(x, idx, R), *(Arg(s, sidx, R) for s in stats)]
        return args + ([Arg(w, idx[lead:], R)] if w is not None else [])

    outs = iter(node.outputs)
    if mask[0]:
        gx = ctx.output(next(outs))
        sums = [ctx.temp(node.inputs[2].shape, acc, stats[0].tiling) for _ in range(ns)]
        row_stats(ctx, name, x, trailing, row_args, Kernel(norm_backward_partial, ns, trailing, has_w),
                  Kernel(sum_parts_combine, ns), sums, [acc] * ns)
        apply = Kernel(norm_backward_apply, ns, has_w, math.prod(xn.shape[lead:]))
        for idx in gx.indices():
            sidx = idx[:lead] + (0,) * k
            ctx.task(apply, [Arg(gx, idx, W), *row_args(idx), *(Arg(s, sidx, R) for s in sums)], name)
    for which in (1, 2):
        if not mask[which]:
            continue
        out = ctx.output(next(outs))
        write, accum = Kernel(norm_param_grad_tile, which, lead), Kernel(norm_param_grad_tile_into, which, lead)
        lead_grid = [range(n) for n in x.grid[:lead]]
        nlead = math.prod(len(r) for r in lead_grid)
        nchains = split_chains(ctx, node, nlead, math.prod(out.grid))
        for pidx in out.indices():
            parts = [(write, accum, row_args(li + pidx)[:2 + ns]) for li in itertools.product(*lead_grid)]
            reduce_into(ctx, out, pidx, parts, name, nchains)


def _lower_norm_backward(kind: Norm, ctx: Lowering, node: OpNode) -> None:
    k, mask, has_w, has_b = node.attrs
    ns = kind.nstats
    gn, xn = node.inputs[:2]
    if _trailing_tiled(ctx, xn, k):
        _lower_norm_backward_tiled(kind, ctx, node)
        return
    nd = len(xn.shape)
    trailing = range(nd - k, nd)
    g, x = ctx.input(gn, ctx.whole(gn, trailing)), ctx.input(xn, ctx.whole(xn, trailing))
    stats = [ctx.input(n) for n in node.inputs[2:2 + ns]]
    affine = _affine_args(ctx, node.inputs[2 + ns:])
    shape = tuple(xn.shape[nd - k:])
    name = kind.backward_name
    outs = iter(node.outputs)
    rows = [(idx, [Arg(g, idx, R), Arg(x, idx, R), *(Arg(s, idx, R) for s in stats), *affine]) for idx in x.indices()]
    if mask[0]:
        gx = ctx.output(next(outs), ctx.whole(xn, trailing))
        kernel = Kernel(kind.grad, 0, shape, has_w, has_b)
        for idx, args in rows:
            ctx.task(kernel, [Arg(gx, idx, W), *args], name)
    for which in (1, 2):
        if not mask[which]:
            continue
        out = ctx.output(next(outs), tuple((s,) for s in shape))
        write = Kernel(kind.grad, which, shape, has_w, has_b)
        acc = Kernel(kind.grad_into, which, shape, has_w, has_b)
        reduce_into(ctx, out, (0,) * k, [(write, acc, args) for _, args in rows], name, 1)


LAYER = Norm("native_layer_norm", "native_layer_norm_backward", 2, layer_norm_tile, layer_norm_grad_tile,
             layer_norm_grad_tile_into, ln_moments_partial, ln_moments_combine)
RMS = Norm("rms_norm", "rms_norm_backward", 1, rms_norm_tile, rms_norm_grad_tile, rms_norm_grad_tile_into,
           rms_sumsq_partial, rms_combine)
LAYER_NORM, LAYER_NORM_BACKWARD = LAYER.forward_op, LAYER.backward_op
RMS_NORM, RMS_NORM_BACKWARD = RMS.forward_op, RMS.backward_op


# -- recording ------------------------------------------------------------------------


def check_shapes(kind: Norm, x: DataNode, normalized_shape: tuple[int, ...], params: tuple[DataNode | None, ...]
                  ) -> None:
    """PyTorch's checks of a normalization's shapes, with its messages."""
    k = len(normalized_shape)
    nd = len(x.shape)
    if k == 0:
        raise RuntimeError("Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one "
                           "element, but got normalized_shape = []")
    for p in params:
        if p is not None and p.shape != tuple(normalized_shape):
            raise RuntimeError(f"Expected weight to be of same shape as normalized_shape, but got weight of shape "
                               f"{list(p.shape)} and normalized_shape = {list(normalized_shape)}")
    if k > nd or tuple(x.shape[nd - k:]) != tuple(normalized_shape):
        dims = ", ".join(map(str, normalized_shape))
        want = f"[*, {dims}]" if kind is LAYER else f"[*{dims}]"
        raise RuntimeError(f"Given normalized_shape={list(normalized_shape)}, expected input with shape {want}, but "
                           f"got input of size{list(x.shape)}")


def _record_norm(kind: Norm, x: DataNode, normalized_shape: tuple[int, ...], w: DataNode | None, b: DataNode | None,
                 eps: float) -> tuple[DataNode, ...]:
    check_shapes(kind, x, normalized_shape, (w, b))
    k = len(normalized_shape)
    nd = len(x.shape)
    for p in (w, b):
        if p is not None:
            for a, xa in zip(p.axes, x.axes[nd - k:]):
                union(a, xa)
    stat_shape = x.shape[:nd - k] + (1,) * k
    stats = [(stat_shape, x.dtype, x.axes[:nd - k] + tuple(new_group(1) for _ in range(k))) for _ in range(kind.nstats)]
    inputs = tuple(n for n in (x, w, b) if n is not None)
    return record(kind.forward_op, inputs, (k, eps, w is not None, b is not None), [(x.shape, x.dtype, x.axes), *stats])


def layer_norm(x: DataNode, normalized_shape: tuple[int, ...], w: DataNode | None, b: DataNode | None,
               eps: float) -> tuple[DataNode, DataNode, DataNode]:
    """The normalized value, the mean and rstd per row."""
    return _record_norm(LAYER, x, normalized_shape, w, b, eps)  # type: ignore[return-value]


def rms_norm(x: DataNode, normalized_shape: tuple[int, ...], w: DataNode | None, eps: float) -> tuple[DataNode, DataNode]:
    """The normalized value and rstd per row."""
    return _record_norm(RMS, x, normalized_shape, w, None, eps)  # type: ignore[return-value]


def _record_norm_backward(kind: Norm, g: DataNode, x: DataNode, normalized_shape: tuple[int, ...],
                          stats: tuple[DataNode, ...], w: DataNode | None, b: DataNode | None,
                          mask: tuple[bool, bool, bool]) -> list[DataNode | None]:
    k = len(normalized_shape)
    if g.shape != x.shape:
        raise RuntimeError(f"{kind.backward_name}: grad of shape {list(g.shape)} does not match the input's "
                           f"{list(x.shape)}")
    for a, ga in zip(x.axes, g.axes):
        union(a, ga)
    if not any(mask):
        return [None, None, None]
    mask = (mask[0], mask[1] and w is not None, mask[2] and b is not None)
    pshape = tuple(normalized_shape)
    outs = []
    if mask[0]:
        outs.append((x.shape, x.dtype, x.axes))
    for m, p in zip(mask[1:], (w, b)):
        if m:
            outs.append((pshape, p.dtype, p.axes))
    inputs = tuple(n for n in (g, x, *stats, w, b) if n is not None)
    nodes = iter(record(kind.backward_op, inputs, (k, mask, w is not None, b is not None), outs))
    return [next(nodes) if m else None for m in mask]


def layer_norm_backward(g: DataNode, x: DataNode, normalized_shape: tuple[int, ...], mean: DataNode,
                        rstd: DataNode, w: DataNode | None, b: DataNode | None,
                        mask: tuple[bool, bool, bool]) -> list[DataNode | None]:
    """The gradients ``mask`` asks for (None for the others)."""
    return _record_norm_backward(LAYER, g, x, normalized_shape, (mean, rstd), w, b, mask)


def rms_norm_backward(g: DataNode, x: DataNode, normalized_shape: tuple[int, ...], rstd: DataNode,
                      w: DataNode | None, mask: tuple[bool, bool]) -> list[DataNode | None]:
    """The input and weight gradients ``mask`` asks for (None for the others)."""
    return _record_norm_backward(RMS, g, x, normalized_shape, (rstd,), w, None, (mask[0], mask[1], False))[:2]
