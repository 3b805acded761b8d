"""Layer normalization: forward and backward, one task per tile of the leading dims.

The normalized (trailing) dims are whole in a tile: a tiling of them is re-tiled
for the op (a per-tile moments scheme would lift this).
"""

from __future__ import annotations

import torch

from torch_nntile.graph.axes import new_group, union
from torch_nntile.graph.nodes import DataNode, OpNode
from torch_nntile.kernels import Kernel
from torch_nntile.ops.base import Op, record, reduce_into
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


def _lower_layer_norm(ctx: Lowering, node: OpNode) -> None:
    k, eps, has_w, has_b = node.attrs
    xn = node.inputs[0]
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


def _lower_layer_norm_backward(ctx: Lowering, node: OpNode) -> None:
    k, mask, has_w, has_b = node.attrs
    gn, xn, mn, rn = node.inputs[:4]
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
