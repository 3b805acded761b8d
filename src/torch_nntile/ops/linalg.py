"""Matrix products: C = beta * bias + alpha * op(A) @ op(B), op = identity or transpose;
and batched products of 3-D values (bmm, baddbmm), tiled over the batch, M, N and K."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from torch_nntile.graph.axes import union
from torch_nntile.graph.nodes import DataNode, OpNode
from torch_nntile.kernels import Kernel, gemm, native, pack_b
from torch_nntile.ops.base import Op, input_index, record, reduce_into, split_chains
from torch_nntile.tiling.tiles import Arg, Lowering, R, TileArray, W

PACK_MIN = 1 << 16  # elements of a B tile worth packing once for several products
PACK_T_ROWS = 2048  # with MKL's packing: rows of the products a transposed B tile must feed
# (MKL packs a transposed [1024, 1024] B in 1.3-1.5 ms, a stored one in 0.35-0.4; a
# product of 256 rows saved 0-0.1 ms by it, one of 1024 rows 0.6-1.7 ms: so the MLP's
# forward, x @ W^T in 256-row tiles, runs faster unpacked, and an LM head's 1024-row
# tiles packed). The shim's own packing (Runtime.own_sgemm) transposes such a B in about
# 0.2 ms, the same for every row height: every B tile that feeds several row tiles is
# packed once, and its products run at 53-54 GMAC/s a core against MKL's 50-51.


def _lower_mm(ctx: Lowering, node: OpNode) -> None:
    ta, tb, alpha, beta = node.attrs
    a, b = ctx.input(node.inputs[0]), ctx.input(node.inputs[1])
    # beta * bias is written first and the products accumulate onto it; with beta 0 the
    # bias is not read at all (its NaNs do not propagate), as in PyTorch
    bias = ctx.input(node.inputs[2]) if len(node.inputs) > 2 and beta != 0 else None
    out = ctx.output(node.outputs[0])
    nk = a.grid[0] if ta else a.grid[1]
    ksizes = a.tiling[0] if ta else a.tiling[1]
    nchains = split_chains(ctx, node, nk, out.grid[0] * out.grid[1])
    # A B tile feeds every row of output tiles: pack it once per row-tile height that
    # several rows share, instead of inside every product.
    rows = Counter(out.tiling[0]) if out.dtype == torch.float32 else Counter()
    own = ctx.rt.own_sgemm  # one packing serves every row height
    if own and rows:
        rows = Counter({m: len(out.tiling[0]) for m in rows})
    scaled = Kernel(scaled_bias, beta)
    packs: dict[tuple[tuple[int, int], int], TileArray | None] = {}
    for i, j in out.indices():
        m, n = out.tiling[0][i], out.tiling[1][j]
        parts = []
        for k in range(nk):
            bidx = (j, k) if tb else (k, j)
            args = [Arg(a, (k, i) if ta else (i, k), R)]
            packed = None
            if rows[m] > 1 and n * ksizes[k] >= PACK_MIN and (not tb or own or rows[m] * m >= PACK_T_ROWS):
                packed = _packed_b(ctx, packs, b, bidx, tb, 1 if own else m, n, ksizes[k], alpha)
            if packed is not None:
                args.append(Arg(packed, (0,), R))
                parts.append((gemm(ta, tb, alpha, False, True), gemm(ta, tb, alpha, True, True), args))
                continue
            args.append(Arg(b, bidx, R))
            parts.append((gemm(ta, tb, alpha, False), gemm(ta, tb, alpha, True), args))
        if bias is not None:
            ctx.task(scaled, [Arg(out, (i, j), W), Arg(bias, input_index(bias, (i, j), 2), R)], "mm")
        reduce_into(ctx, out, (i, j), parts, "mm", nchains, started=bias is not None)


def _packed_b(ctx: Lowering, packs: dict, b: TileArray, bidx: tuple[int, int], tb: bool,
              m: int, n: int, k: int, alpha: float) -> TileArray | None:
    """The tile of ``b`` at ``bidx`` packed (once per compile) for products with ``m``
    rows; None where the runtime cannot pack."""
    key = (bidx, m)
    if key not in packs:
        nbytes = ctx.rt.pack_size(m, n, k)
        packs[key] = None
        if nbytes:
            p = packs[key] = ctx.temp(((nbytes + 3) // 4,), torch.float32)
            ctx.task(pack_b(tb, m, n, k, alpha), [Arg(p, (0,), W), Arg(b, bidx, R)], "mm")
    return packs[key]


def scaled_bias(beta: float, o: torch.Tensor, bias: torch.Tensor) -> None:
    """``o = beta * bias`` broadcast: where a product with a bias starts."""
    o.copy_(bias)
    if beta != 1:
        o.mul_(beta)


def _scaled_bias_program(p: native.Program, params: tuple[Any, ...], refs: list[native.Ref]) -> native.Ref:
    (beta,) = params
    return p.emit(native.COPY, refs[0]) if beta == 1 else p.emit(native.MUL, refs[0], beta)


native.TRANSLATORS[scaled_bias] = _scaled_bias_program


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
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({m}x{k1} and {k2}x{n})")  # PyTorch's words
    union(ak, bk)
    inputs = (a, b) if bias is None else (a, b, bias)
    if bias is not None:
        _check_bias(bias.shape, (m, n))
        off = 2 - len(bias.shape)
        for d, (s, ax) in enumerate(zip(bias.shape, bias.axes)):
            if s != 1:
                union(ax, (am, bn)[off + d])
    return record(MM, inputs, (ta, tb, alpha, beta), [((m, n), dtype, (am, bn))])[0]


def _check_bias(shape: tuple[int, ...], target: tuple[int, int]) -> None:
    """The bias must broadcast to the product's shape: PyTorch's error (from expand) otherwise."""
    if len(shape) > len(target):
        raise RuntimeError(f"expand({list(shape)}, size={list(target)}): the number of sizes provided "
                           f"({len(target)}) must be greater or equal to the number of dimensions in the tensor "
                           f"({len(shape)})")
    off = len(target) - len(shape)
    for d, s in enumerate(shape):
        t = target[off + d]
        if s != 1 and s != t:
            raise RuntimeError(f"The expanded size of the tensor ({t}) must match the existing size ({s}) at "
                               f"non-singleton dimension {off + d}.  Target sizes: {list(target)}.  "
                               f"Tensor sizes: {list(shape)}")


# -- batched products ---------------------------------------------------------------


def _bt(x: torch.Tensor, t: bool) -> torch.Tensor:
    return x.transpose(1, 2) if t else x


def baddbmm_tile(ta: bool, tb: bool, alpha: float, beta: float, o: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                 bias: torch.Tensor) -> None:
    torch.baddbmm(bias, _bt(x, ta), _bt(y, tb), beta=beta, alpha=alpha, out=o)


def _lower_bmm(ctx: Lowering, node: OpNode) -> None:
    ta, tb, alpha, beta = node.attrs
    a, b = ctx.input(node.inputs[0]), ctx.input(node.inputs[1])
    bias = ctx.input(node.inputs[2]) if len(node.inputs) > 2 else None
    out = ctx.output(node.outputs[0])
    nk = a.grid[1] if ta else a.grid[2]
    nchains = split_chains(ctx, node, nk, len(out.handles))
    write, accum = gemm(ta, tb, alpha, False), gemm(ta, tb, alpha, True)  # batched: 3-D tiles
    first = Kernel(baddbmm_tile, ta, tb, alpha, beta) if bias is not None else write
    for oidx in out.indices():
        p, i, j = oidx
        parts = []
        for k in range(nk):
            args = [Arg(a, (p, k, i) if ta else (p, i, k), R), Arg(b, (p, j, k) if tb else (p, k, j), R)]
            if k == 0 and bias is not None:
                args.append(Arg(bias, input_index(bias, oidx, 3), R))
            parts.append((first if k == 0 else write, accum, args))
        reduce_into(ctx, out, oidx, parts, "bmm", nchains)


def _bmm_cost(node: OpNode) -> float:
    ta = node.attrs[0]
    a, out = node.inputs[0], node.outputs[0]
    return out.numel * (a.shape[1] if ta else a.shape[2])


BMM = Op("bmm", _lower_bmm, cost=_bmm_cost)


def bmm(a: DataNode, ta: bool, b: DataNode, tb: bool, dtype: torch.dtype, bias: DataNode | None = None,
        alpha: float = 1, beta: float = 1) -> DataNode:
    """op(a) @ op(b) per batch item (+ beta * bias, broadcast to the result); ``ta`` / ``tb``
    read a stored (B, K, M) / (B, N, K) value transposed. Shapes are checked by the caller."""
    (_, am, ak) = (a.axes[0], a.axes[2], a.axes[1]) if ta else a.axes
    (_, bk, bn) = (b.axes[0], b.axes[2], b.axes[1]) if tb else b.axes
    union(a.axes[0], b.axes[0])
    union(ak, bk)
    m = a.shape[2] if ta else a.shape[1]
    n = b.shape[1] if tb else b.shape[2]
    out_axes = (a.axes[0], am, bn)
    inputs = (a, b) if bias is None else (a, b, bias)
    if bias is not None:
        off = 3 - len(bias.shape)
        for d, (s, ax) in enumerate(zip(bias.shape, bias.axes)):
            if s != 1:
                union(ax, out_axes[off + d])
    return record(BMM, inputs, (ta, tb, alpha, beta), [((a.shape[0], m, n), dtype, out_axes)])[0]
