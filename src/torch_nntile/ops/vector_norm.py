"""Vector norms (``linalg_vector_norm``) and their gradient, tiled: per tile the sum of
powers of the magnitudes (or their extremum, or the count of nonzeros), combined over
the tiles of a row as every reduction's partial results are (``ops/reduce.py``); the
gradient one task per input tile, the ties of an infinity norm counted over the row's
tiles first.
"""

from __future__ import annotations

import math

import torch

from torch_nntile.graph.axes import union
from torch_nntile.graph.nodes import DataNode, OpNode
from torch_nntile.kernels import Kernel
from torch_nntile.ops.base import Op, record
from torch_nntile.ops.reduce import (
    Reduction,
    acc_dtype,
    norm_dims,
    reduced_axes,
    reduced_shape,
    reduced_tiling,
    reduction,
    row_stats,
    sum_parts_combine,
    type_word,
)
from torch_nntile.tiling.tiles import Arg, Lowering, R, W


def vnorm_whole(dims: tuple[int, ...], keepdim: bool, params: tuple, o: torch.Tensor, t: torch.Tensor) -> None:
    torch.linalg.vector_norm(t, params[0], dims, keepdim, dtype=o.dtype, out=o)


def vnorm_partial(dims: tuple[int, ...], offs: None, params: tuple, p: torch.Tensor, t: torch.Tensor) -> None:
    order = params[0]
    a = t.to(p.dtype).abs()
    if order == math.inf:
        torch.amax(a, dims, True, out=p)
    elif order == -math.inf:
        torch.amin(a, dims, True, out=p)
    elif order == 0:
        p.copy_((a != 0).sum(dims, keepdim=True))
    elif order == 1:
        torch.sum(a, dims, keepdim=True, out=p)
    elif order == 2:
        torch.sum(a * a, dims, keepdim=True, out=p)
    else:
        torch.sum(a.pow(order), dims, keepdim=True, out=p)


def vnorm_combine(dims: tuple[int, ...], keepdim: bool, params: tuple, sizes: tuple[int, ...], o: torch.Tensor,
                  *parts: torch.Tensor) -> None:
    order = params[0]
    s = torch.stack(parts)
    if order == math.inf:
        r = s.amax(0)
    elif order == -math.inf:
        r = s.amin(0)
    else:
        r = s.sum(0)
        if order == 2:
            r = r.sqrt()
        elif order not in (0, 1):
            r = r.pow(1.0 / order)
    o.copy_(r.reshape(o.shape))


VNORM = Reduction("linalg_vector_norm", vnorm_whole, vnorm_partial, vnorm_combine, lambda dt, p: (acc_dtype(p[1]),))


def vector_norm(x: DataNode, order: float, dims: tuple[int, ...], keepdim: bool, dtype: torch.dtype | None) -> DataNode:
    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        raise RuntimeError(f"linalg.vector_norm: Expected a floating point or complex tensor as input. Got "
                           f"{type_word(x.dtype)}")
    if dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
        raise RuntimeError(f"linalg.vector_norm: dtype should be floating point or complex, but got {type_word(dtype)}")
    nd = len(x.shape)
    rd = norm_dims(dims, nd)
    if x.numel == 0 and (order < 0 or order == math.inf):
        shown = "inf" if order == math.inf else "-inf" if order == -math.inf else f"{order:g}"
        if not dims:
            raise RuntimeError(f"linalg.vector_norm cannot compute the {shown} norm on an empty tensor because the "
                               "operation does not have an identity")
        for d in rd:
            if x.shape[d] == 0:
                raise RuntimeError(f"linalg.vector_norm cannot compute the {shown} norm on the dimension {d}because "
                                   "this dimension is empty and the operation does not have an identity")
    out = (dtype or x.dtype).to_real()
    return reduction(VNORM, "linalg_vector_norm", x, rd, keepdim, (order, out), [out])[0]


# -- the gradient of a vector norm: one task per tile of the input -------------------------


def vnorm_grad(order: float, g: torch.Tensor, x: torch.Tensor, n: torch.Tensor,
               count: torch.Tensor | None = None) -> torch.Tensor:
    """PyTorch's ``norm_backward`` for the gradient ``g`` and the norm ``n`` (both with the
    reduced dims kept); ``count``, for the infinity norms, the number of entries at the norm
    per row (ties share the gradient)."""
    if order == 0:
        return torch.zeros_like(x)
    if order == 1:
        return x.sgn() * g
    if order == 2:
        return g * (x / n).masked_fill(n == 0, 0)
    if math.isinf(order):
        a = x.abs()
        mask = (a == n) | a.isnan()
        return x.sgn() * ((g / count) * mask)
    if order < 1:
        return x.sgn() * x.abs().pow(order - 1).masked_fill(x == 0, 0) * g * n.pow(1 - order)
    scale = (g / n.pow(order - 1)).masked_fill(n == 0, 0)
    return (x.sgn() * x.abs().pow(order - 1) if order < 2 else x * x.abs().pow(order - 2)) * scale


def keep_reduced(dims: tuple[int, ...], keepdim: bool, t: torch.Tensor) -> torch.Tensor:
    """A reduced tile with its reduced dims back (of extent 1)."""
    if keepdim:
        return t
    for d in dims:
        t = t.unsqueeze(d)
    return t


def vnorm_at_norm(dims: tuple[int, ...], keepdim: bool, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    a = x.abs()
    return ((a == keep_reduced(dims, keepdim, n)) | a.isnan()).sum(dims, keepdim=True)


def vnorm_count_partial(dims: tuple[int, ...], keepdim: bool, c: torch.Tensor, x: torch.Tensor, n: torch.Tensor) -> None:
    c.copy_(vnorm_at_norm(dims, keepdim, x, n))


def vnorm_grad_tile(order: float, dims: tuple[int, ...], keepdim: bool, o: torch.Tensor, g: torch.Tensor,
                    x: torch.Tensor, n: torch.Tensor, *count: torch.Tensor) -> None:
    """One tile of the gradient; an infinity norm whose reduced dims are whole here counts
    its ties itself."""
    nk = keep_reduced(dims, keepdim, n)
    c = (count[0] if count else vnorm_at_norm(dims, keepdim, x, n)) if math.isinf(order) else None
    o.copy_(vnorm_grad(order, keep_reduced(dims, keepdim, g), x, nk, c))


def _lower_vnorm_backward(ctx: Lowering, node: OpNode) -> None:
    order, dims, keepdim = node.attrs
    gn, xn, nn = node.inputs
    x = ctx.input(xn)
    g, n = ctx.input(gn), ctx.input(nn)
    out = ctx.output(node.outputs[0], x.tiling)
    nd = len(x.shape)
    kept = [d for d in range(nd) if d not in dims]
    name = "vector_norm_backward"

    def reduced(idx: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(0 if d in dims else i for d, i in enumerate(idx)) if keepdim else tuple(idx[d] for d in kept)

    counts = []
    if math.isinf(order) and any(x.grid[d] > 1 for d in dims):  # ties counted over the tiles of a row
        c = ctx.temp(reduced_shape(x.shape, dims), x.dtype, reduced_tiling(x, dims))
        row_stats(ctx, name, x, dims, lambda xi: [Arg(x, xi, R), Arg(n, reduced(xi), R)],
                  Kernel(vnorm_count_partial, dims, keepdim), Kernel(sum_parts_combine, 1), [c], [x.dtype])
        counts = [c]
    k = Kernel(vnorm_grad_tile, order, dims, keepdim)
    for idx in out.indices():
        cidx = tuple(0 if d in dims else i for d, i in enumerate(idx))
        ctx.task(k, [Arg(out, idx, W), Arg(g, reduced(idx), R), Arg(x, idx, R), Arg(n, reduced(idx), R)]
                 + [Arg(c, cidx, R) for c in counts], name)


VNORM_BACKWARD = Op("vector_norm_backward", _lower_vnorm_backward, cost=lambda node: node.inputs[1].numel)


def vector_norm_backward(g: DataNode, x: DataNode, n: DataNode, order: float, dims: tuple[int, ...],
                         keepdim: bool) -> DataNode:
    """The gradient of ``linalg_vector_norm(x, order, dims, keepdim)`` (its value ``n``) for
    its gradient ``g``: one task per tile of ``x``."""
    rd = norm_dims(dims, len(x.shape))
    shape, _ = reduced_axes(x, rd, keepdim)
    for v in (g, n):
        if v.shape != shape:
            raise RuntimeError(f"vector_norm_backward: expected a value of shape {list(shape)}, got {list(v.shape)}")
    kept = [d for d in range(len(x.shape)) if d not in rd]
    for v in (g, n):
        for d, a in zip(kept, [v.axes[d] for d in kept] if keepdim else v.axes):
            union(x.axes[d], a)
    return record(VNORM_BACKWARD, (g, x, n), (float(order), rd, keepdim), [(x.shape, x.dtype, x.axes)])[0]
