"""Reductions and the ops of cross-entropy: sum/mean, log-softmax, NLL loss."""

from __future__ import annotations

import itertools
import math

import torch

from torch_nntile.graph.axes import new_group, union
from torch_nntile.graph.nodes import DataNode, OpNode
from torch_nntile.kernels import Kernel
from torch_nntile.ops.base import (
    NotNative,
    Op,
    broadcast_axes,
    kernel_name,
    record,
    reduce_into,
    split_chains,
    wrap_dim,
    wrap_dims,
)
from torch_nntile.ops.data import fill_tile
from torch_nntile.ops.views import reshape
from torch_nntile.tiling.tiles import RW, Arg, Lowering, R, W

# -- sum / mean over dims ------------------------------------------------------


def sum_tile(dims: tuple[int, ...], keepdim: bool, dtype: torch.dtype, o: torch.Tensor, t: torch.Tensor) -> None:
    torch.sum(t, dims, keepdim=keepdim, dtype=dtype, out=o)


def sum_tile_into(dims: tuple[int, ...], keepdim: bool, dtype: torch.dtype, o: torch.Tensor, t: torch.Tensor) -> None:
    o.add_(torch.sum(t, dims, keepdim=keepdim, dtype=dtype))


def scale_tile(scale: float, o: torch.Tensor) -> None:
    o.mul_(scale)


def _lower_sum(ctx: Lowering, node: OpNode) -> None:
    dims, keepdim, scale = node.attrs
    x = ctx.input(node.inputs[0])
    out = ctx.output(node.outputs[0])
    kept = [d for d in range(len(x.shape)) if d not in dims]
    rgrids = [range(x.grid[d]) for d in dims]
    nchains = split_chains(ctx, node, math.prod(len(r) for r in rgrids), math.prod(out.grid))
    write = Kernel(sum_tile, dims, keepdim, out.dtype)
    acc = Kernel(sum_tile_into, dims, keepdim, out.dtype)
    finish = None if scale == 1 else Kernel(scale_tile, scale)
    for oidx in out.indices():
        kept_idx = [oidx[d] for d in kept] if keepdim else list(oidx)
        parts = []
        for ridx in itertools.product(*rgrids):
            xi = [0] * len(x.shape)
            for d, i in zip(kept, kept_idx):
                xi[d] = i
            for d, i in zip(dims, ridx):
                xi[d] = i
            parts.append((write, acc, [Arg(x, tuple(xi), R)]))
        reduce_into(ctx, out, oidx, parts, "sum", nchains, finish)


SUM = Op("sum", _lower_sum, cost=lambda node: node.inputs[0].numel)


def sum_op(x: DataNode, dims: tuple[int, ...], keepdim: bool, dtype: torch.dtype, mean: bool = False) -> DataNode:
    nd = len(x.shape)
    dims = tuple(d for d in wrap_dims(dims, nd) if d < nd) if dims else tuple(range(nd))
    count = math.prod(x.shape[d] for d in dims)
    scale = (1.0 / count if count else math.nan) if mean else 1  # the mean of nothing is nan
    shape, axes = [], []
    for d in range(nd):
        if d in dims:
            if keepdim:
                shape.append(1)
                axes.append(new_group(1))
        else:
            shape.append(x.shape[d])
            axes.append(x.axes[d])
    return record(SUM, (x,), (dims, keepdim, scale), [(tuple(shape), dtype, tuple(axes))])[0]


# -- log-softmax along one whole dim -------------------------------------------


def _lower_rowwise(ctx: Lowering, node: OpNode) -> None:
    fn, name, dims = node.attrs
    ins = [ctx.input(n, ctx.whole(n, dims)) for n in node.inputs]
    out = ctx.output(node.outputs[0], ctx.whole(node.outputs[0], dims))
    for idx in out.indices():
        ctx.task(fn, [Arg(out, idx, W)] + [Arg(a, idx, R) for a in ins], name)


ROWWISE = Op("rowwise", _lower_rowwise, kernel_name)
"""Same-shape inputs and output, computed tile by tile with ``dims`` whole in a tile."""


def log_softmax_tile(dim: int, o: torch.Tensor, t: torch.Tensor) -> None:
    torch.ops.aten._log_softmax.out(t, dim, False, out=o)


def log_softmax_backward_tile(dim: int, dtype: torch.dtype, o: torch.Tensor, g: torch.Tensor, y: torch.Tensor) -> None:
    torch.ops.aten._log_softmax_backward_data.out(g, y, dim, dtype, out=o)


def log_softmax(x: DataNode, dim: int) -> DataNode:
    dim = wrap_dim(dim, len(x.shape))
    return record(ROWWISE, (x,), (Kernel(log_softmax_tile, dim), "_log_softmax", (dim,)), [(x.shape, x.dtype, x.axes)])[0]


def log_softmax_backward(grad: DataNode, out: DataNode, dim: int, in_dtype: torch.dtype) -> DataNode:
    dim = wrap_dim(dim, len(out.shape))
    shape, axes = broadcast_axes([grad, out])
    kernel = Kernel(log_softmax_backward_tile, dim, in_dtype)
    return record(ROWWISE, (grad, out), (kernel, "_log_softmax_backward_data", (dim,)), [(shape, in_dtype, axes)])[0]


# -- negative log-likelihood, class dim last -----------------------------------

NONE, MEAN, SUM_RED = 0, 1, 2


def nll_tile(reduction: int, ignore_index: int, lo: torch.Tensor, xt: torch.Tensor, tt: torch.Tensor,
             *wt: torch.Tensor) -> None:
    lo.copy_(torch.ops.aten.nll_loss_forward(xt, tt, wt[0] if wt else None, reduction, ignore_index)[0])


def nll_weight_tile(ignore_index: int, two: torch.Tensor, tt: torch.Tensor, *wt: torch.Tensor) -> None:
    mask = tt != ignore_index
    two.copy_(mask.sum() if not wt else wt[0][tt[mask]].sum())


def sum_of(acc: torch.Tensor, *parts: torch.Tensor) -> None:
    acc.copy_(torch.stack(parts).sum())


def divide_by(lo: torch.Tensor, two: torch.Tensor) -> None:
    lo.div_(two)


def nll_backward_tile(reduction: int, ignore_index: int, o: torch.Tensor, gt: torch.Tensor, xt: torch.Tensor,
                      tt: torch.Tensor, twt: torch.Tensor, *wt: torch.Tensor) -> None:
    o.copy_(torch.ops.aten.nll_loss_backward(gt, xt, tt, wt[0] if wt else None, reduction, ignore_index, twt))


def _lower_nll(ctx: Lowering, node: OpNode) -> None:
    reduction, ignore_index = node.attrs
    x, t = ctx.input(node.inputs[0], ctx.whole(node.inputs[0], (1,))), ctx.input(node.inputs[1])
    w = ctx.input(node.inputs[2], ctx.whole(node.inputs[2], (0,))) if len(node.inputs) > 2 else None
    loss, tw = ctx.output(node.outputs[0]), ctx.output(node.outputs[1])
    wargs = [Arg(w, (0,), R)] if w is not None else []
    nb = x.grid[0]

    if reduction == NONE:
        rows = Kernel(nll_tile, NONE, ignore_index)
        for i in range(nb):
            ctx.task(rows, [Arg(loss, (i,), W), Arg(x, (i, 0), R), Arg(t, (i,), R), *wargs], "nll_loss_forward")
        ctx.task(Kernel(fill_tile, 0), [Arg(tw, (), W)], "nll_loss_forward")
        return

    # The total weight depends on the targets only: computed apart from the loss,
    # the backward of one row tile need not wait for the forward of the others.
    weight_part = Kernel(nll_weight_tile, ignore_index)
    loss_part = Kernel(nll_tile, SUM_RED, ignore_index)
    total, mean = Kernel(sum_of), Kernel(divide_by)

    if nb == 1:
        ctx.task(weight_part, [Arg(tw, (), W), Arg(t, (0,), R), *wargs], "nll_loss_forward")
        ctx.task(loss_part, [Arg(loss, (), W), Arg(x, (0, 0), R), Arg(t, (0,), R), *wargs], "nll_loss_forward")
    else:
        pws, pls = [], []
        for i in range(nb):
            pw, pl = ctx.temp((), tw.dtype), ctx.temp((), loss.dtype)
            ctx.task(weight_part, [Arg(pw, (), W), Arg(t, (i,), R), *wargs], "nll_loss_forward")
            ctx.task(loss_part, [Arg(pl, (), W), Arg(x, (i, 0), R), Arg(t, (i,), R), *wargs], "nll_loss_forward")
            pws.append(Arg(pw, (), R))
            pls.append(Arg(pl, (), R))
        ctx.task(total, [Arg(tw, (), W), *pws], "nll_loss_forward")
        ctx.task(total, [Arg(loss, (), W), *pls], "nll_loss_forward")
    if reduction == MEAN:
        ctx.task(mean, [Arg(loss, (), RW), Arg(tw, (), R)], "nll_loss_forward")


NLL = Op("nll_loss_forward", _lower_nll)


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


def nll_loss(x: DataNode, t: DataNode, w: DataNode | None, reduction: int, ignore_index: int) -> tuple[DataNode, DataNode]:
    _check_nll(x, t, w)
    if len(x.shape) == 1:  # one sample: (C,) with target ()
        loss, tw = nll_loss(reshape(x, (1, x.shape[0])), reshape(t, (1,)), w, reduction, ignore_index)
        return (reshape(loss, ()) if reduction == NONE else loss), tw
    union(x.axes[0], t.axes[0])
    inputs = (x, t) if w is None else (x, t, w)
    lshape, laxes = ((x.shape[0],), (x.axes[0],)) if reduction == NONE else ((), ())
    return record(NLL, inputs, (reduction, ignore_index), [(lshape, x.dtype, laxes), ((), x.dtype, ())])


def _lower_nll_backward(ctx: Lowering, node: OpNode) -> None:
    reduction, ignore_index = node.attrs
    g, t, tw = ctx.input(node.inputs[0]), ctx.input(node.inputs[2]), ctx.input(node.inputs[3])
    x = ctx.input(node.inputs[1], ctx.whole(node.inputs[1], (1,)))
    w = ctx.input(node.inputs[4], ctx.whole(node.inputs[4], (0,))) if len(node.inputs) > 4 else None
    out = ctx.output(node.outputs[0], ctx.whole(node.outputs[0], (1,)))
    wargs = [Arg(w, (0,), R)] if w is not None else []
    k = Kernel(nll_backward_tile, reduction, ignore_index)
    for i in range(out.grid[0]):
        gi = (i,) if reduction == NONE else ()
        ctx.task(k, [Arg(out, (i, 0), W), Arg(g, gi, R), Arg(x, (i, 0), R), Arg(t, (i,), R), Arg(tw, (), R), *wargs],
                 "nll_loss_backward")


NLL_BACKWARD = Op("nll_loss_backward", _lower_nll_backward)


def nll_loss_backward(
    g: DataNode, x: DataNode, t: DataNode, w: DataNode | None, reduction: int, ignore_index: int, tw: DataNode
) -> DataNode:
    _check_nll(x, t, w)
    if len(x.shape) == 1:
        g2 = reshape(g, (1,)) if reduction == NONE else g
        return reshape(nll_loss_backward(g2, reshape(x, (1, x.shape[0])), reshape(t, (1,)), w, reduction,
                                         ignore_index, tw), x.shape)
    union(x.axes[0], t.axes[0])
    if reduction == NONE:
        union(g.axes[0], x.axes[0])
    inputs = (g, x, t, tw) if w is None else (g, x, t, tw, w)
    return record(NLL_BACKWARD, inputs, (reduction, ignore_index), [(x.shape, x.dtype, x.axes)])[0]
