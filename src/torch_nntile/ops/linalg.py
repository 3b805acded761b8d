"""Matrix products: C = beta * bias + alpha * op(A) @ op(B), op = identity or transpose."""

from __future__ import annotations

from functools import cache

import torch

from torch_nntile.graph.axes import union
from torch_nntile.graph.nodes import DataNode, OpNode
from torch_nntile.kernels import gemm
from torch_nntile.ops.base import Op, input_index, record, reduce_into, split_chains
from torch_nntile.tiling.tiles import Arg, Lowering, R


def _lower_mm(ctx: Lowering, node: OpNode) -> None:
    ta, tb, alpha, beta = node.attrs
    a, b = ctx.input(node.inputs[0]), ctx.input(node.inputs[1])
    bias = ctx.input(node.inputs[2]) if len(node.inputs) > 2 else None
    out = ctx.output(node.outputs[0])
    nk = a.grid[0] if ta else a.grid[1]
    nchains = split_chains(ctx, node, nk, out.grid[0] * out.grid[1])
    for i, j in out.indices():
        parts = []
        for k in range(nk):
            args = [Arg(a, (k, i) if ta else (i, k), R), Arg(b, (j, k) if tb else (k, j), R)]
            if k == 0 and bias is not None:
                args.append(Arg(bias, input_index(bias, (i, j), 2), R))
                write = _mm_bias_kernel(ta, tb, alpha, beta)
            else:
                write = gemm(ta, tb, alpha, False)
            parts.append((write, gemm(ta, tb, alpha, True), args))
        reduce_into(ctx, out, (i, j), parts, "mm", nchains)


@cache
def _mm_bias_kernel(ta: bool, tb: bool, alpha: float, beta: float):
    def k(o: torch.Tensor, x: torch.Tensor, y: torch.Tensor, bias: torch.Tensor) -> None:
        torch.addmm(bias, x.t() if ta else x, y.t() if tb else y, beta=beta, alpha=alpha, out=o)
    return k


def _mm_cost(node: OpNode) -> float:
    ta = node.attrs[0]
    a, out = node.inputs[0], node.outputs[0]
    return out.shape[0] * out.shape[1] * (a.shape[0] if ta else a.shape[1])


MM = Op("mm", _lower_mm, cost=_mm_cost)


def mm(
    a: DataNode, ta: bool, b: DataNode, tb: bool, dtype: torch.dtype,
    bias: DataNode | None = None, alpha: float = 1, beta: float = 1,
) -> DataNode:
    """op(a) @ op(b) (+ beta * bias); ``ta``/``tb`` read a stored matrix transposed."""
    am, ak = (a.axes[1], a.axes[0]) if ta else (a.axes[0], a.axes[1])
    bk, bn = (b.axes[1], b.axes[0]) if tb else (b.axes[0], b.axes[1])
    m, k1 = (a.shape[1], a.shape[0]) if ta else a.shape
    k2, n = (b.shape[1], b.shape[0]) if tb else b.shape
    if k1 != k2:
        raise RuntimeError(f"mm: shapes ({m}x{k1}) and ({k2}x{n}) cannot be multiplied")
    union(ak, bk)
    inputs = (a, b) if bias is None else (a, b, bias)
    if bias is not None:
        off = 2 - len(bias.shape)
        for d, (s, ax) in enumerate(zip(bias.shape, bias.axes)):
            if s != 1:
                union(ax, (am, bn)[off + d])
    return record(MM, inputs, (ta, tb, alpha, beta), [((m, n), dtype, (am, bn))])[0]
