"""Losses: negative log-likelihood (``nll_loss``, ``nll_loss2d``), cross-entropy over the
last dim and mean squared error, with the class dim tileable (per-tile parts combined
per row). See docs/architecture/adding-an-op.md (lowering patterns: losses).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from torch_nntile.graph.axes import union
from torch_nntile.graph.nodes import DataNode, OpNode
from torch_nntile.kernels import Kernel, native
from torch_nntile.ops.base import NotNative, Op, broadcast_axes, map_op, record, reduce_into, split_chains
from torch_nntile.ops.data import fill_tile
from torch_nntile.ops.reduce import acc_dtype, scale_tile, stacked, type_word
from torch_nntile.ops.softmax import finite_max, maxsumexp_combine, maxsumexp_partial
from torch_nntile.ops.views import expand, reshape
from torch_nntile.tiling.tiles import RW, Arg, Lowering, R, W

NONE, MEAN, SUM_RED = 0, 1, 2


# -- negative log-likelihood ------------------------------------------------------------


def check_targets(ignore_index: int, classes: int, t: torch.Tensor) -> None:
    """Targets out of range (and not ignored) raise as on CPU."""
    bad = ((t < 0) | (t >= classes)) & (t != ignore_index)
    if bool(bad.any()):
        raise IndexError(f"Target {int(t[bad].flatten()[0])} is out of bounds.")


def _picked(ignore_index: int, lo: int, classes: int | None, x: torch.Tensor, t: torch.Tensor,
            w: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``-w[t] * x[:, t - lo]`` per row where the target falls in this tile of classes
    (``lo`` on), 0 elsewhere. With ``classes``, targets out of range raise as on CPU."""
    if classes is not None:
        check_targets(ignore_index, classes, t)
    inside = (t >= lo) & (t < lo + x.shape[1]) & (t != ignore_index)
    v = x.gather(1, torch.where(inside, t - lo, 0).unsqueeze(1)).squeeze(1)
    if w:
        v = v * w[0][torch.where(inside, t, 0)]
    return torch.where(inside, -v, 0)


def nll_rows_tile(ignore_index: int, lo: int, classes: int | None, o: torch.Tensor, x: torch.Tensor,
                  t: torch.Tensor, *w: torch.Tensor) -> None:
    o.copy_(_picked(ignore_index, lo, classes, x, t, w))


def nll_sum_tile(ignore_index: int, lo: int, classes: int | None, o: torch.Tensor, x: torch.Tensor,
                 t: torch.Tensor, *w: torch.Tensor) -> None:
    o.copy_(_picked(ignore_index, lo, classes, x, t, w).sum())


def nll_weight_tile(ignore_index: int, two: torch.Tensor, tt: torch.Tensor, *wt: torch.Tensor) -> None:
    mask = tt != ignore_index
    two.copy_(mask.sum() if not wt else wt[0][tt[mask]].sum())


def sum_of(acc: torch.Tensor, *parts: torch.Tensor) -> None:
    acc.copy_(torch.stack(parts).sum())


def sum_stack(acc: torch.Tensor, *parts: torch.Tensor) -> None:
    torch.sum(torch.stack(parts), 0, out=acc)


def divide_by(lo: torch.Tensor, two: torch.Tensor) -> None:
    lo.div_(two)


# In C (csrc/rows.c) where the input is float32 [rows, classes], the targets int64 and
# there are no class weights: the loss of a language model's logits.
_F32, _I64 = torch.float32, torch.int64


def _nll_rows(per_row: bool) -> Callable[..., tuple[list[int], tuple] | None]:
    def rec(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...],
            dtypes: tuple[torch.dtype, ...]) -> tuple[list[int], tuple] | None:
        ignore_index, lo, classes = params
        if dtypes != (_F32, _F32, _I64) or len(shapes[1]) != 2 or not native.fits_int32(ignore_index):
            return None
        k, c = shapes[1]
        return [native.NLL, k, c, lo, classes or 0, ignore_index, int(per_row)], ()
    return rec


def _nll_weight_rows(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...],
                     dtypes: tuple[torch.dtype, ...]) -> tuple[list[int], tuple] | None:
    (ignore_index,) = params
    if dtypes != (_F32, _I64) or not native.fits_int32(ignore_index):
        return None
    return [native.NLL_WEIGHT, native.numel(shapes[1]), ignore_index], ()


native.TYPED[nll_rows_tile] = _nll_rows(True)
native.TYPED[nll_sum_tile] = _nll_rows(False)
native.TYPED[nll_weight_tile] = _nll_weight_rows
native.TRANSLATORS[divide_by] = lambda p, params, refs: p.emit(native.DIV, native.Ref(0), refs[0])


def _sum_program(p: native.Program, params: tuple[Any, ...], refs: list[native.Ref]) -> native.Ref:
    """The parts added in order (a loss's per-tile sums: a handful of 0-dim tiles)."""
    acc = refs[0]
    for r in refs[1:]:
        acc = p.emit(native.ADD, acc, r)
    return acc


native.TRANSLATORS[sum_of] = _sum_program
native.TRANSLATORS[sum_stack] = _sum_program


def _row_index(ti: tuple[int, ...], j: int) -> tuple[int, ...]:
    """The input tile of the target tile ``ti`` and the class tile ``j``."""
    return (ti[0], j) + ti[1:]


def _lower_nll(ctx: Lowering, node: OpNode) -> None:
    reduction, ignore_index, name = node.attrs
    xn = node.inputs[0]
    x, t = ctx.input(xn), ctx.input(node.inputs[1])
    w = ctx.input(node.inputs[2], ctx.whole(node.inputs[2], (0,))) if len(node.inputs) > 2 else None
    loss, tw = ctx.output(node.outputs[0]), ctx.output(node.outputs[1])
    wargs = [Arg(w, (0,), R)] if w is not None else []
    classes = xn.shape[1]
    nc = x.grid[1]
    rows = list(t.indices())

    def pick(kernel: object, ti: tuple[int, ...], j: int) -> tuple[Kernel, list[Arg]]:
        k = Kernel(kernel, ignore_index, x.offs[1][j], classes if j == 0 else None)  # one class tile checks
        return k, [Arg(x, _row_index(ti, j), R), Arg(t, ti, R), *wargs]

    if reduction == NONE:
        for ti in rows:
            if nc == 1:
                k, args = pick(nll_rows_tile, ti, 0)
                ctx.task(k, [Arg(loss, ti, W), *args], name)
                continue
            parts = []
            for j in range(nc):
                p = ctx.temp(loss.tile_shape(ti), loss.dtype)
                k, args = pick(nll_rows_tile, ti, j)
                ctx.task(k, [Arg(p, (0,) * len(ti), W), *args], name)
                parts.append(Arg(p, (0,) * len(ti), R))
            ctx.task(Kernel(sum_stack), [Arg(loss, ti, W), *parts], name)
        ctx.task(Kernel(fill_tile, 0), [Arg(tw, (), W)], name)
        return

    weight_part = Kernel(nll_weight_tile, ignore_index)
    if len(rows) == 1 and nc == 1:
        ctx.task(weight_part, [Arg(tw, (), W), Arg(t, rows[0], R), *wargs], name)
        k, args = pick(nll_sum_tile, rows[0], 0)
        ctx.task(k, [Arg(loss, (), W), *args], name)
    else:
        pws, pls = [], []
        for ti in rows:
            pw = ctx.temp((), tw.dtype)
            ctx.task(weight_part, [Arg(pw, (), W), Arg(t, ti, R), *wargs], name)
            pws.append(Arg(pw, (), R))
            for j in range(nc):
                pl = ctx.temp((), loss.dtype)
                k, args = pick(nll_sum_tile, ti, j)
                ctx.task(k, [Arg(pl, (), W), *args], name)
                pls.append(Arg(pl, (), R))
        ctx.task(Kernel(sum_of), [Arg(tw, (), W), *pws], name)
        ctx.task(Kernel(sum_of), [Arg(loss, (), W), *pls], name)
    if reduction == MEAN:
        ctx.task(Kernel(divide_by), [Arg(loss, (), RW), Arg(tw, (), R)], name)


NLL = Op("nll_loss_forward", _lower_nll, lambda node: node.attrs[2], cost=lambda node: node.inputs[1].numel)


def nll_backward_tile(reduction: int, ignore_index: int, lo: int, o: torch.Tensor, g: torch.Tensor, t: torch.Tensor,
                      tw: torch.Tensor, *w: torch.Tensor) -> None:
    """Zeros but at the targets that fall in this tile of classes: ``-w[t] * g``
    (``g / total_weight`` for the mean)."""
    inside = (t >= lo) & (t < lo + o.shape[1]) & (t != ignore_index)
    scale = g / tw if reduction == MEAN else g
    v = -(w[0][torch.where(inside, t, 0)] * scale if w else scale)
    v = torch.where(inside, v, 0).to(o.dtype)
    o.zero_()
    o.scatter_(1, torch.where(inside, t - lo, 0).unsqueeze(1), v.unsqueeze(1))


def _nll_backward_rows(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...],
                       dtypes: tuple[torch.dtype, ...]) -> tuple[list[int], tuple] | None:
    reduction, ignore_index, lo = params
    if dtypes != (_F32, _F32, _I64, _F32) or len(shapes[0]) != 2 or not native.fits_int32(ignore_index):
        return None
    k, c = shapes[0]
    return [native.NLL_GRAD, k, c, lo, ignore_index, int(reduction == MEAN), int(reduction == NONE)], ()


native.TYPED[nll_backward_tile] = _nll_backward_rows


def _lower_nll_backward(ctx: Lowering, node: OpNode) -> None:
    reduction, ignore_index, name = node.attrs
    g, t, tw = ctx.input(node.inputs[0]), ctx.input(node.inputs[2]), ctx.input(node.inputs[3])
    w = ctx.input(node.inputs[4], ctx.whole(node.inputs[4], (0,))) if len(node.inputs) > 4 else None
    out = ctx.output(node.outputs[0])
    wargs = [Arg(w, (0,), R)] if w is not None else []
    for idx in out.indices():
        ti = (idx[0],) + idx[2:]
        k = Kernel(nll_backward_tile, reduction, ignore_index, out.offs[1][idx[1]])
        ctx.task(k, [Arg(out, idx, W), Arg(g, ti if reduction == NONE else (), R), Arg(t, ti, R), Arg(tw, (), R),
                     *wargs], name)


NLL_BACKWARD = Op("nll_loss_backward", _lower_nll_backward, lambda node: node.attrs[2])


def _check_nll(x: DataNode, t: DataNode, w: DataNode | None) -> None:
    """PyTorch's own checks of nll_loss arguments, with its messages."""
    if not 1 <= len(x.shape) <= 2:
        raise RuntimeError("input tensor should be 1D or 2D")
    if len(t.shape) > 1:
        raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
    if len(x.shape) == 1 and t.shape:
        raise NotNative("nll_loss of a 1-D input with a 1-D target")
    if len(x.shape) == 2 and (not t.shape or t.shape[0] != x.shape[0]):
        raise RuntimeError(f"size mismatch (got input: {list(x.shape)}, target: {list(t.shape)})")
    if w is not None and w.numel != x.shape[-1]:
        raise RuntimeError(f"weight tensor should be defined either for all {x.shape[-1]} classes or no classes "
                           f"but got weight tensor of shape: {list(w.shape)}")
    if x.shape[-1] == 0:
        raise NotNative("nll_loss over no classes")


def _check_nll2d(x: DataNode, t: DataNode, w: DataNode | None) -> None:
    if len(t.shape) != 3:
        raise RuntimeError(f"only batches of spatial targets supported (3D tensors) but got targets of dimension: "
                           f"{len(t.shape)}")
    if len(x.shape) != 4:
        raise RuntimeError(f"only batches of spatial inputs supported (4D tensors), but got input of dimension: "
                           f"{len(x.shape)}")
    if w is not None and w.numel != x.shape[1]:
        raise RuntimeError("weight tensor should be defined either for all or no classes")
    if (x.shape[0],) + x.shape[2:] != t.shape:
        raise RuntimeError(f"size mismatch (got input: {list(x.shape)} , target: {list(t.shape)}")
    if x.shape[1] == 0:
        raise NotNative("nll_loss2d over no classes")


def _check(x: DataNode, t: DataNode, w: DataNode | None, spatial: bool) -> None:
    (_check_nll2d if spatial else _check_nll)(x, t, w)


def _union_rows(x: DataNode, t: DataNode) -> None:
    for a, b in zip((x.axes[0],) + x.axes[2:], t.axes):
        union(a, b)


def nll_loss(x: DataNode, t: DataNode, w: DataNode | None, reduction: int, ignore_index: int,
             spatial: bool = False) -> tuple[DataNode, DataNode]:
    """``nll_loss_forward`` (input (N, C) or (C,)), or ``nll_loss2d_forward`` (``spatial``:
    input (N, C, H, W)): the loss and the total weight."""
    _check(x, t, w, spatial)
    if len(x.shape) == 1:  # one sample: (C,) with target ()
        loss, tw = nll_loss(reshape(x, (1, x.shape[0])), reshape(t, (1,)), w, reduction, ignore_index)
        return (reshape(loss, ()) if reduction == NONE else loss), tw
    _union_rows(x, t)
    inputs = (x, t) if w is None else (x, t, w)
    lshape, laxes = (t.shape, t.axes) if reduction == NONE else ((), ())
    name = "nll_loss2d_forward" if spatial else "nll_loss_forward"
    return record(NLL, inputs, (reduction, ignore_index, name), [(lshape, x.dtype, laxes), ((), x.dtype, ())])


def nll_loss_backward(g: DataNode, x: DataNode, t: DataNode, w: DataNode | None, reduction: int, ignore_index: int,
                      tw: DataNode, spatial: bool = False) -> DataNode:
    _check(x, t, w, spatial)
    if len(x.shape) == 1:
        g2 = reshape(g, (1,)) if reduction == NONE else g
        return reshape(nll_loss_backward(g2, reshape(x, (1, x.shape[0])), reshape(t, (1,)), w, reduction,
                                         ignore_index, tw), x.shape)
    _union_rows(x, t)
    if reduction == NONE:
        if g.shape != t.shape:
            raise RuntimeError(f"Expected a tensor of dimension {len(t.shape)} and tensor.size[0] == {t.shape[0]} "
                               f"but got: dimension {len(g.shape)} and tensor.size[0] == "
                               f"{g.shape[0] if g.shape else 1}")
        for a, b in zip(g.axes, t.axes):
            union(a, b)
    elif g.numel != 1:
        raise RuntimeError(f"Expected a single element grad_output tensor, but got: {list(g.shape)}")
    elif g.shape:
        g = reshape(g, ())
    inputs = (g, x, t, tw) if w is None else (g, x, t, tw, w)
    name = "nll_loss2d_backward" if spatial else "nll_loss_backward"
    return record(NLL_BACKWARD, inputs, (reduction, ignore_index, name), [(x.shape, x.dtype, x.axes)])[0]


# -- mean squared error ----------------------------------------------------------------


def mse_tile(o: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
    torch.sub(x, y, out=o)
    o.square_()


def mse_backward_tile(scale: float, o: torch.Tensor, g: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
    torch.mul((x - y) * scale, g, out=o)  # CPU's order: norm * (input - target) * grad


def _check_mse(x: DataNode, dtype: torch.dtype) -> None:
    if not (dtype.is_floating_point or dtype.is_complex):
        raise NotImplementedError(f"\"mse_cpu\" not implemented for '{type_word(dtype)}'")


def mse_sum_tile(o: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
    o.copy_(torch.sum(torch.square(x - y)))


def mse_sum_tile_into(o: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
    o.add_(torch.sum(torch.square(x - y)))


def _lower_mse_reduced(ctx: Lowering, node: OpNode) -> None:
    (scale,) = node.attrs
    x = ctx.input(node.inputs[0])
    y = ctx.input(node.inputs[1], x.tiling)
    out = ctx.output(node.outputs[0])
    write, acc = Kernel(mse_sum_tile), Kernel(mse_sum_tile_into)
    parts = [(write, acc, [Arg(x, idx, R), Arg(y, idx, R)]) for idx in x.indices()]
    finish = None if scale == 1 else Kernel(scale_tile, scale)
    reduce_into(ctx, out, (), parts, "mse_loss", split_chains(ctx, node, len(parts), 1), finish)


MSE_REDUCED = Op("mse_loss", _lower_mse_reduced, cost=lambda node: node.inputs[0].numel)


def mse_loss(x: DataNode, y: DataNode, reduction: int, dtype: torch.dtype) -> DataNode:
    """``(x - y)^2`` elementwise, or its mean or sum: one op (the sum over tiles in chains)."""
    _check_mse(x, dtype)
    if reduction == NONE:
        return map_op("mse_loss", Kernel(mse_tile), [x, y], dtype)
    if x.shape != y.shape:  # operands that broadcast: expanded first
        shape, _ = broadcast_axes([x, y])
        x, y = (n if n.shape == shape else expand(n, shape) for n in (x, y))
    for a, b in zip(x.axes, y.axes):
        union(a, b)
    n = x.numel
    scale = (1.0 / n if n else math.nan) if reduction == MEAN else 1  # the mean of nothing is nan
    return record(MSE_REDUCED, (x, y), (scale,), [((), dtype, ())])[0]


def mse_loss_backward(g: DataNode, x: DataNode, y: DataNode, reduction: int, dtype: torch.dtype) -> DataNode:
    _check_mse(x, dtype)
    scale = 2.0 / x.numel if reduction == MEAN and x.numel else 2.0
    return map_op("mse_loss_backward", Kernel(mse_backward_tile, scale), [g, x, y], dtype)


# -- cross-entropy over the last dim ------------------------------------------------------


def _label_logit(ignore_index: int, lo: int, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Per row, the logit of the label where it falls in this tile of classes (``lo`` on), else 0."""
    inside = (t >= lo) & (t < lo + x.shape[-1]) & (t != ignore_index)
    v = x.gather(-1, torch.where(inside, t - lo, 0).unsqueeze(-1)).squeeze(-1)
    return torch.where(inside, v, 0)


def _ce_finish(reduction: int, ignore_index: int, final: bool, lse: torch.Tensor, picked: torch.Tensor,
               t: torch.Tensor, lse_o: torch.Tensor, loss_o: torch.Tensor, count_o: torch.Tensor) -> None:
    """The rows' ``logsumexp``, their losses (or their sum; the mean where ``final``) and the
    number of labels not ignored."""
    lse_o.copy_(lse)
    valid = t != ignore_index
    rows = torch.where(valid, lse - picked, 0)
    count = valid.sum()
    count_o.copy_(count)
    if reduction == NONE:
        loss_o.copy_(rows)
    else:
        total = rows.sum()
        loss_o.copy_(total / count if final and reduction == MEAN else total)


def ce_rows_tile(reduction: int, ignore_index: int, final: bool, lse_o: torch.Tensor, loss_o: torch.Tensor,
                 count_o: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> None:
    """Rows with all their classes in one tile."""
    check_targets(ignore_index, x.shape[-1], t)
    xf = x.to(lse_o.dtype)
    _ce_finish(reduction, ignore_index, final, torch.logsumexp(xf, -1), _label_logit(ignore_index, 0, xf, t), t,
               lse_o, loss_o, count_o)


def ce_partial(ignore_index: int, lo: int, classes: int | None, m: torch.Tensor, s: torch.Tensor, p: torch.Tensor,
               x: torch.Tensor, t: torch.Tensor) -> None:
    """One tile of classes: per row its maximum, sum of exponentials relative to it and the
    label's logit (0 where the label is elsewhere); with ``classes`` it checks the labels."""
    if classes is not None:
        check_targets(ignore_index, classes, t)
    maxsumexp_partial(-1, m.unsqueeze(-1), s.unsqueeze(-1), x)  # softmax's statistics, per row
    p.copy_(_label_logit(ignore_index, lo, x.to(m.dtype), t))


def ce_combine(reduction: int, ignore_index: int, final: bool, lse_o: torch.Tensor, loss_o: torch.Tensor,
               count_o: torch.Tensor, t: torch.Tensor, *parts: torch.Tensor) -> None:
    n = len(parts) // 3
    m, s = torch.empty_like(lse_o), torch.empty_like(lse_o)
    maxsumexp_combine(m, s, *parts[:2 * n])  # softmax's combination of the class tiles' statistics
    picked = torch.stack(parts[2 * n:]).sum(0)
    _ce_finish(reduction, ignore_index, final, torch.log(s) + finite_max(m), picked, t, lse_o, loss_o, count_o)


def ce_total(reduction: int, *ts: torch.Tensor) -> None:
    """The loss (unless per row) and the count from the parts of the row tiles."""
    if reduction == NONE:
        count_o, counts = ts[0], ts[1:]
    else:
        loss_o, count_o = ts[:2]
        losses, counts = stacked(ts[2:], 2)
        total = losses.sum()
        loss_o.copy_(total / counts.sum() if reduction == MEAN else total)
    count_o.copy_(torch.stack(counts).sum() if reduction == NONE else counts.sum())


def _lower_cross_entropy(ctx: Lowering, node: OpNode) -> None:
    reduction, ignore_index = node.attrs
    xn, tn = node.inputs
    x = ctx.input(xn)
    t = ctx.input(tn, x.tiling[:-1])
    loss, lse, count = (ctx.output(n) for n in node.outputs)
    acc = lse.dtype
    rows = list(lse.indices())
    final = len(rows) == 1
    nc = x.grid[-1]
    name = "cross_entropy"
    loss_parts, count_parts = [], []
    for ri in rows:
        if final:
            loss_arg, count_arg = Arg(loss, ri if reduction == NONE else (), W), Arg(count, (), W)
        else:
            loss_arg = Arg(loss, ri, W) if reduction == NONE else Arg(ctx.temp((), loss.dtype), (), W)
            count_arg = Arg(ctx.temp((), acc), (), W)
            if reduction != NONE:
                loss_parts.append(Arg(loss_arg.arr, (), R))
            count_parts.append(Arg(count_arg.arr, (), R))
        outs = [Arg(lse, ri, W), loss_arg, count_arg]
        if nc == 1:
            ctx.task(Kernel(ce_rows_tile, reduction, ignore_index, final), outs + [Arg(x, ri + (0,), R), Arg(t, ri, R)],
                     name)
            continue
        shape = lse.tile_shape(ri)
        zero = (0,) * len(shape)
        parts: list[list[Arg]] = [[], [], []]
        for j in range(nc):
            ps = [ctx.temp(shape, acc) for _ in range(3)]
            k = Kernel(ce_partial, ignore_index, x.offs[-1][j], xn.shape[-1] if j == 0 else None)  # one tile checks
            ctx.task(k, [Arg(p, zero, W) for p in ps] + [Arg(x, ri + (j,), R), Arg(t, ri, R)], name)
            for lst, p in zip(parts, ps):
                lst.append(Arg(p, zero, R))
        ctx.task(Kernel(ce_combine, reduction, ignore_index, final), outs + [Arg(t, ri, R)] + [a for p in parts for a in p],
                 name)
    if not final:
        outs = [Arg(count, (), W)] if reduction == NONE else [Arg(loss, (), W), Arg(count, (), W)]
        ctx.task(Kernel(ce_total, reduction), outs + loss_parts + count_parts, name)


CROSS_ENTROPY = Op("cross_entropy", _lower_cross_entropy, cost=lambda node: 2 * node.inputs[0].numel)


def ce_grad_tile(reduction: int, ignore_index: int, lo: int, o: torch.Tensor, g: torch.Tensor, x: torch.Tensor,
                 t: torch.Tensor, lse: torch.Tensor, count: torch.Tensor) -> None:
    """``(softmax(x) - onehot(t)) * scale`` on one tile of classes (``lo`` on); ``scale`` is
    the row's gradient (over the count for the mean), 0 for ignored rows."""
    acc = lse.dtype
    p = torch.exp(x.to(acc) - lse.unsqueeze(-1))
    inside = (t >= lo) & (t < lo + x.shape[-1]) & (t != ignore_index)
    p.scatter_add_(-1, torch.where(inside, t - lo, 0).unsqueeze(-1), -inside.to(acc).unsqueeze(-1))
    gf = g.to(acc)
    scale = torch.where(t != ignore_index, gf / count if reduction == MEAN else gf, 0)
    o.copy_(p * scale.unsqueeze(-1))


def _lower_cross_entropy_backward(ctx: Lowering, node: OpNode) -> None:
    reduction, ignore_index = node.attrs
    gn, xn, tn, ln, cn = node.inputs
    x = ctx.input(xn)
    out = ctx.output(node.outputs[0], x.tiling)
    lead = x.tiling[:-1]
    g = ctx.input(gn, lead) if reduction == NONE else ctx.input(gn)
    t, lse, count = ctx.input(tn, lead), ctx.input(ln, lead), ctx.input(cn)
    for idx in out.indices():
        ri = idx[:-1]
        k = Kernel(ce_grad_tile, reduction, ignore_index, x.offs[-1][idx[-1]])
        ctx.task(k, [Arg(out, idx, W), Arg(g, ri if reduction == NONE else (), R), Arg(x, idx, R), Arg(t, ri, R),
                     Arg(lse, ri, R), Arg(count, (), R)], "cross_entropy_backward")


CROSS_ENTROPY_BACKWARD = Op("cross_entropy_backward", _lower_cross_entropy_backward,
                            cost=lambda node: 2 * node.inputs[1].numel)


def _label_dtype_error(dtype: torch.dtype) -> RuntimeError:
    """CPU's error for class labels of ``dtype``, in this torch's words: they changed
    between releases (torch 2.11: "expected scalar type Long but found Int")."""
    try:
        torch.nn.functional.nll_loss(torch.zeros(1, 1), torch.zeros(1, dtype=dtype))
    except RuntimeError as e:
        return RuntimeError(str(e))
    return RuntimeError(f"expected target dtype to be Long or Byte, but got {type_word(dtype)}")


def check_cross_entropy(x: DataNode, t: DataNode) -> None:
    if not x.shape:
        raise ValueError("cross_entropy: logits need a class dim (the last one); got a 0-dim tensor")
    if t.shape != x.shape[:-1]:
        raise ValueError(f"cross_entropy: labels of shape {list(t.shape)} do not match the leading dims "
                         f"{list(x.shape[:-1])} of logits of shape {list(x.shape)}")
    if t.dtype != torch.int64:
        raise _label_dtype_error(t.dtype)
    if not x.dtype.is_floating_point:
        raise NotNative("cross_entropy of logits that are not floating point")
    if x.shape[-1] == 0:
        raise NotNative("cross_entropy over no classes")


def cross_entropy(x: DataNode, t: DataNode, reduction: int, ignore_index: int) -> tuple[DataNode, DataNode, DataNode]:
    """Cross-entropy of ``[..., C]`` logits against ``[...]`` labels: the loss (per row for
    ``NONE``), the rows' ``logsumexp`` and the number of labels not ignored."""
    check_cross_entropy(x, t)
    for a, b in zip(x.axes, t.axes):
        union(a, b)
    acc = acc_dtype(x.dtype)
    lshape, laxes = (t.shape, t.axes) if reduction == NONE else ((), ())
    return record(CROSS_ENTROPY, (x, t), (reduction, ignore_index),
                  [(lshape, x.dtype, laxes), (t.shape, acc, t.axes), ((), acc, ())])  # type: ignore[return-value]


def cross_entropy_backward(g: DataNode, x: DataNode, t: DataNode, lse: DataNode, count: DataNode, reduction: int,
                           ignore_index: int) -> DataNode:
    check_cross_entropy(x, t)
    want = t.shape if reduction == NONE else ()
    if g.shape != want:
        raise RuntimeError(f"cross_entropy_backward: grad of shape {list(g.shape)}, expected {list(want)}")
    for a, b in zip(g.axes, t.axes):
        union(a, b)
    return record(CROSS_ENTROPY_BACKWARD, (g, x, t, lse, count), (reduction, ignore_index),
                  [(x.shape, x.dtype, x.axes)])[0]
