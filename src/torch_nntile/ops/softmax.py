"""Softmax and log-softmax along one dim, and their backward ops.

With the dim whole in a tile, one task per tile runs ATen's kernel. With the dim
tiled, two passes: each tile writes its partial maximum and sum of exponentials
(relative to that maximum) per row, one task per row of tiles combines them
(``m = max m_k``, ``s = sum s_k exp(m_k - m)``), then each tile is normalized. The
backward ops likewise combine per-tile sums (``sum(g * y)``, or ``sum(g)``).
"""

from __future__ import annotations

from typing import Any

import torch

from torch_nntile.graph.axes import union
from torch_nntile.graph.nodes import DataNode, OpNode
from torch_nntile.kernels import Kernel, native
from torch_nntile.ops.base import Op, record, wrap_dim
from torch_nntile.ops.reduce import acc_dtype, reduced_shape, reduced_tiling, row_stats, stacked
from torch_nntile.tiling.tiles import Arg, Lowering, R, W

_aten = torch.ops.aten
_NAMES = {(False, False): "_softmax", (True, False): "_log_softmax",
          (False, True): "_softmax_backward_data", (True, True): "_log_softmax_backward_data"}


def softmax_tile(dim: int, log: bool, o: torch.Tensor, t: torch.Tensor) -> None:
    (_aten._log_softmax.out if log else _aten._softmax.out)(t, dim, False, out=o)


def softmax_backward_tile(dim: int, log: bool, dtype: torch.dtype, o: torch.Tensor, g: torch.Tensor,
                          y: torch.Tensor) -> None:
    if log:
        _aten._log_softmax_backward_data.out(g, y, dim, dtype, out=o)
    else:
        _aten._softmax_backward_data.out(g, y, dim, dtype, grad_input=o)


def _softmax_rows(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...]) -> tuple[list[int], tuple] | None:
    dim, log = params[:2]
    if len(params) == 3 and params[2] is not torch.float32 or any(s != shapes[0] for s in shapes):
        return None
    kind = native.SOFTMAX if len(params) == 2 else native.SOFTMAX_BACKWARD
    return [kind, *native.rows_around(shapes[0], dim % max(len(shapes[0]), 1)), int(log)], ()


native.ROWS[softmax_tile] = native.ROWS[softmax_backward_tile] = _softmax_rows


def finite_max(m: torch.Tensor) -> torch.Tensor:
    """The maximum to subtract: 0 where a row is all -inf (so its exponentials are 0, not NaN)."""
    return m.masked_fill(m == -torch.inf, 0)


def maxsumexp_partial(dim: int, m: torch.Tensor, s: torch.Tensor, t: torch.Tensor) -> None:
    tf = t.to(m.dtype)
    torch.amax(tf, dim, keepdim=True, out=m)
    torch.sum(torch.exp(tf - finite_max(m)), dim, keepdim=True, out=s)


def maxsumexp_combine(m: torch.Tensor, s: torch.Tensor, *parts: torch.Tensor) -> None:
    ms, ss = stacked(parts, 2)
    torch.amax(ms, 0, out=m)
    torch.sum(ss * torch.exp(ms - finite_max(m)), 0, out=s)


def softmax_apply(log: bool, o: torch.Tensor, t: torch.Tensor, m: torch.Tensor, s: torch.Tensor) -> None:
    shifted = t.to(m.dtype) - finite_max(m)
    o.copy_(shifted - torch.log(s) if log else torch.exp(shifted) / s)


def rowsum_partial(dim: int, log: bool, p: torch.Tensor, g: torch.Tensor, y: torch.Tensor) -> None:
    gf = g.to(p.dtype)
    torch.sum(gf if log else gf * y.to(p.dtype), dim, keepdim=True, out=p)


def rowsum_combine(o: torch.Tensor, *parts: torch.Tensor) -> None:
    torch.sum(torch.stack(parts), 0, out=o)


def softmax_backward_apply(log: bool, o: torch.Tensor, g: torch.Tensor, y: torch.Tensor, c: torch.Tensor) -> None:
    gf, yf = g.to(c.dtype), y.to(c.dtype)
    o.copy_(gf - torch.exp(yf) * c if log else yf * (gf - c))


def _lower_softmax(ctx: Lowering, node: OpNode) -> None:
    dim, log, backward, dtype = node.attrs
    name = _NAMES[(log, backward)]
    ins = [ctx.input(n) for n in node.inputs]
    out = ctx.output(node.outputs[0])
    x = ins[0]
    if not x.shape or x.grid[dim] == 1:  # the dim whole in a tile: one task per tile
        k = Kernel(softmax_backward_tile, dim, log, dtype) if backward else Kernel(softmax_tile, dim, log)
        for idx in out.indices():
            ctx.task(k, [Arg(out, idx, W)] + [Arg(a, idx, R) for a in ins], name)
        return
    acc = acc_dtype(out.dtype)
    dims = (dim,)
    nstats = 1 if backward else 2
    stats = [ctx.temp(reduced_shape(x.shape, dims), acc, reduced_tiling(x, dims)) for _ in range(nstats)]
    if backward:
        partial, combine, apply = Kernel(rowsum_partial, dim, log), Kernel(rowsum_combine), \
            Kernel(softmax_backward_apply, log)
    else:
        partial, combine, apply = Kernel(maxsumexp_partial, dim), Kernel(maxsumexp_combine), Kernel(softmax_apply, log)
    row_stats(ctx, name, x, dims, lambda xi: [Arg(a, xi, R) for a in ins], partial, combine, stats, [acc] * nstats)
    for idx in out.indices():
        sidx = tuple(0 if d == dim else i for d, i in enumerate(idx))
        ctx.task(apply, [Arg(out, idx, W)] + [Arg(a, idx, R) for a in ins] + [Arg(s, sidx, R) for s in stats], name)


SOFTMAX = Op("softmax", _lower_softmax, lambda node: _NAMES[(node.attrs[1], node.attrs[2])],
             cost=lambda node: node.inputs[0].numel)


def _check_dtype(x: DataNode, log: bool) -> None:
    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        kind = "log_softmax" if log else "softmax"
        raise NotImplementedError(f'"{kind}_lastdim_kernel_impl" not implemented for '
                                  f"'{str(x.dtype).removeprefix('torch.')}'")


def softmax(x: DataNode, dim: int, log: bool) -> DataNode:
    """softmax (``log``: log-softmax) of ``x`` along ``dim``."""
    _check_dtype(x, log)
    dim = wrap_dim(dim, len(x.shape))
    return record(SOFTMAX, (x,), (dim, log, False, None), [(x.shape, x.dtype, x.axes)])[0]


def softmax_backward(grad: DataNode, out: DataNode, dim: int, log: bool, in_dtype: torch.dtype) -> DataNode:
    """The gradient of (log-)softmax from its output ``out`` and the output's gradient."""
    if grad.shape != out.shape:
        raise RuntimeError(f"grad_output of shape {list(grad.shape)} does not match the output's {list(out.shape)}")
    dim = wrap_dim(dim, len(out.shape))
    for a, b in zip(grad.axes, out.axes):
        union(a, b)
    return record(SOFTMAX, (grad, out), (dim, log, True, in_dtype), [(out.shape, in_dtype, out.axes)])[0]
