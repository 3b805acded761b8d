"""Reductions: sum/mean, and the reductions that combine per-tile partial results.

A reduction along dims that are whole in a tile runs one task per tile. Along tiled
dims, each input tile writes partial results (its reduced dims kept, of extent 1)
into temporary tiles, and one task per output tile combines them (the scheme of
NNTile's kernels): maxima and their indices, sums of powers, counts, means and
centred second moments (Chan's combination). ``row_stats`` does the same for ops
that then use the statistics tile by tile (softmax, layer norm).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import torch

from torch_nntile.graph.axes import new_group
from torch_nntile.graph.nodes import DataNode, OpNode
from torch_nntile.kernels import Kernel, native
from torch_nntile.kernels.typed import TYPES
from torch_nntile.ops.base import Op, record, reduce_into, split_chains, wrap_dims
from torch_nntile.tiling.tiles import Arg, Lowering, R, TileArray, W

# -- sum / mean over dims ------------------------------------------------------


def sum_tile(dims: tuple[int, ...], keepdim: bool, dtype: torch.dtype, o: torch.Tensor, t: torch.Tensor) -> None:
    torch.sum(t, dims, keepdim=keepdim, dtype=dtype, out=o)


def sum_tile_into(dims: tuple[int, ...], keepdim: bool, dtype: torch.dtype, o: torch.Tensor, t: torch.Tensor) -> None:
    o.add_(torch.sum(t, dims, keepdim=keepdim, dtype=dtype))


def scale_tile(scale: float, o: torch.Tensor) -> None:
    o.mul_(scale)


def _sum_rows(accumulate: bool) -> Callable[..., tuple[list[int], tuple] | None]:
    """Sums of float32 over consecutive dims run in C (a bias gradient: the rows of a tile)."""
    def rec(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...]) -> tuple[list[int], tuple] | None:
        dims, _, dtype = params
        x = shapes[1]
        if dtype is not torch.float32 or not dims or list(dims) != list(range(dims[0], dims[-1] + 1)):
            return None
        outer, inner = native.numel(x[:dims[0]]), native.numel(x[dims[-1] + 1:])
        return [native.SUM, outer, native.numel(x[dims[0]:dims[-1] + 1]), inner, int(accumulate)], ()
    return rec


def _isum_rows(accumulate: bool) -> Callable[..., tuple[list[int], tuple] | None]:
    """Sums of integer or bool tiles into int64 over consecutive dims run in C (a count
    of the tokens a padding mask keeps)."""
    def rec(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...],
            dtypes: tuple[torch.dtype, ...]) -> tuple[list[int], tuple] | None:
        dims, _, dtype = params
        x, src = shapes[1], dtypes[1]
        if dtype is not torch.int64 or dtypes[0] is not torch.int64 or src.is_floating_point or src not in TYPES \
                or not dims or list(dims) != list(range(dims[0], dims[-1] + 1)):
            return None
        outer, inner = native.numel(x[:dims[0]]), native.numel(x[dims[-1] + 1:])
        return [native.ISUM, outer, native.numel(x[dims[0]:dims[-1] + 1]), inner, int(accumulate), TYPES[src]], ()
    return rec


native.ROWS[sum_tile] = _sum_rows(False)
native.ROWS[sum_tile_into] = _sum_rows(True)
native.TYPED[sum_tile] = _isum_rows(False)
native.TYPED[sum_tile_into] = _isum_rows(True)
native.TRANSLATORS[scale_tile] = lambda p, params, refs: p.emit(native.MUL, native.Ref(0), params[0])


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
    shape, axes = reduced_axes(x, dims, keepdim)
    return record(SUM, (x,), (dims, keepdim, scale), [(shape, dtype, axes)])[0]




def reduced_axes(x: DataNode, dims: tuple[int, ...], keepdim: bool) -> tuple[tuple[int, ...], tuple]:
    """Shape and axis groups of a reduction's result: kept dims keep their groups."""
    shape, axes = [], []
    for d in range(len(x.shape)):
        if d in dims:
            if keepdim:
                shape.append(1)
                axes.append(new_group(1))
        else:
            shape.append(x.shape[d])
            axes.append(x.axes[d])
    return tuple(shape), tuple(axes)


def norm_dims(dims: tuple[int, ...], nd: int) -> tuple[int, ...]:
    """Wrapped, sorted reduction dims; none given means all (a 0-dim value has none)."""
    if nd > 64:
        raise RuntimeError("only tensors with up to 64 dims are supported")
    return tuple(d for d in wrap_dims(dims, nd) if d < nd) if dims else tuple(range(nd))


# -- partial results per tile, combined -----------------------------------------------


def reduced_shape(shape: tuple[int, ...], dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if d in dims else s for d, s in enumerate(shape))


def reduced_tiling(x: TileArray, dims: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """``x``'s tiling with ``dims`` of extent 1: the tiling of per-row statistics."""
    return tuple((1,) if d in dims else t for d, t in enumerate(x.tiling))


def part_sizes(x: TileArray, dims: tuple[int, ...]) -> tuple[int, ...]:
    """Items per row that each tile along ``dims`` holds, in the order partials are made."""
    grids = [range(x.grid[d]) for d in dims]
    return tuple(math.prod(x.tiling[d][i] for d, i in zip(dims, r)) for r in itertools.product(*grids))


def stacked(parts: tuple[torch.Tensor, ...], kinds: int) -> list[torch.Tensor]:
    """Partial tiles, grouped by kind (as ``row_stats`` passes them), each kind stacked on a new dim 0."""
    n = len(parts) // kinds
    return [torch.stack(parts[k * n:(k + 1) * n]) for k in range(kinds)]


def sum_parts_combine(kinds: int, *ts: torch.Tensor) -> None:
    """A ``row_stats`` combination: each of the first ``kinds`` tiles is the sum of its
    kind's parts (the rest)."""
    for out, s in zip(ts[:kinds], stacked(ts[kinds:], kinds)):
        torch.sum(s, 0, out=out)


def row_stats(ctx: Lowering, name: str, x: TileArray, dims: tuple[int, ...], args_of: Callable[[tuple[int, ...]], list[Arg]],
              partial: Kernel, combine: Kernel, stats: list[TileArray], part_dtypes: list[torch.dtype]) -> None:
    """Statistics over ``dims`` into ``stats`` (``x``'s shape and tiling with ``dims`` of
    extent 1): the tile of ``x`` at each index along ``dims`` writes its partial results
    (``partial(*parts, *args_of(index))``) into temporary tiles, and one task per stats
    tile combines them (``combine(*stats, *parts of the first kind, *parts of the second, ...)``).
    The partials of a row run in parallel; the combine is small (one row of values)."""
    grids = [range(x.grid[d]) for d in dims]
    for sidx in stats[0].indices():
        shape = stats[0].tile_shape(sidx)
        zero = (0,) * len(shape)
        parts: list[list[Arg]] = [[] for _ in part_dtypes]
        for ridx in itertools.product(*grids):
            xi = list(sidx)
            for d, i in zip(dims, ridx):
                xi[d] = i
            ps = [ctx.temp(shape, dt) for dt in part_dtypes]
            ctx.task(partial, [Arg(p, zero, W) for p in ps] + args_of(tuple(xi)), name)
            for lst, p in zip(parts, ps):
                lst.append(Arg(p, zero, R))
        ctx.task(combine, [Arg(s, sidx, W) for s in stats] + [a for lst in parts for a in lst], name)


def acc_dtype(dt: torch.dtype) -> torch.dtype:
    """The dtype partial results are kept in: float32 for the half-precision types."""
    return torch.float32 if dt in (torch.float16, torch.bfloat16) else dt


class Reduction:
    """How one reduction runs on tiles, as module-level kernel functions:

    ``whole(dims, keepdim, params, *outs, x)``: the results of a tile whose reduced dims are whole;
    ``partial(dims, offsets, params, *parts, x)``: one tile's partial results (reduced dims kept,
    of extent 1); ``offsets`` (the tile's offsets) only for reductions returning indices;
    ``combine(dims, keepdim, params, sizes, *outs, *parts)``: the results from the partials of
    one output tile, grouped by kind; ``sizes``: items per row of each part.
    ``parts(x_dtype, params)`` gives the dtypes of the partial results.
    """

    __slots__ = ("name", "whole", "partial", "combine", "parts", "indexed")

    def __init__(self, name: str, whole: Callable[..., None], partial: Callable[..., None],
                 combine: Callable[..., None], parts: Callable[[torch.dtype, Any], tuple[torch.dtype, ...]],
                 indexed: bool = False) -> None:
        self.name, self.whole, self.partial, self.combine = name, whole, partial, combine
        self.parts, self.indexed = parts, indexed

    def __repr__(self) -> str:
        return f"Reduction({self.name})"


def _lower_reduce(ctx: Lowering, node: OpNode) -> None:
    kind, name, dims, keepdim, params = node.attrs
    x = ctx.input(node.inputs[0])
    outs = [ctx.output(n) for n in node.outputs]
    nd = len(x.shape)
    kept = [d for d in range(nd) if d not in dims]

    def x_index(oidx: tuple[int, ...], ridx: tuple[int, ...]) -> tuple[int, ...]:
        xi = [0] * nd
        for d, i in zip(kept, [oidx[d] for d in kept] if keepdim else oidx):
            xi[d] = i
        for d, i in zip(dims, ridx):
            xi[d] = i
        return tuple(xi)

    if all(x.grid[d] == 1 for d in dims):  # the reduced dims whole: one task per tile
        whole = Kernel(kind.whole, dims, keepdim, params)
        for oidx in outs[0].indices():
            ctx.task(whole, [Arg(o, oidx, W) for o in outs] + [Arg(x, x_index(oidx, ()), R)], name)
        return
    pdt = kind.parts(x.dtype, params)
    grids = [range(x.grid[d]) for d in dims]
    combine = Kernel(kind.combine, dims, keepdim, params, part_sizes(x, dims))
    plain = None if kind.indexed else Kernel(kind.partial, dims, None, params)
    zero = (0,) * nd
    for oidx in outs[0].indices():
        parts: list[list[Arg]] = [[] for _ in pdt]
        for ridx in itertools.product(*grids):
            xi = x_index(oidx, ridx)
            shape = reduced_shape(x.tile_shape(xi), dims)
            ps = [ctx.temp(shape, dt) for dt in pdt]
            partial = plain or Kernel(kind.partial, dims, tuple(o[i] for o, i in zip(x.offs, xi)), params)
            ctx.task(partial, [Arg(p, zero, W) for p in ps] + [Arg(x, xi, R)], name)
            for lst, p in zip(parts, ps):
                lst.append(Arg(p, zero, R))
        ctx.task(combine, [Arg(o, oidx, W) for o in outs] + [a for lst in parts for a in lst], name)


REDUCE = Op("reduce", _lower_reduce, lambda node: node.attrs[1], cost=lambda node: node.inputs[0].numel)


def reduction(kind: Reduction, name: str, x: DataNode, dims: tuple[int, ...], keepdim: bool, params: Any,
              dtypes: list[torch.dtype]) -> tuple[DataNode, ...]:
    """Record a reduction of ``x`` over ``dims`` (normalized: ``norm_dims``); one output per dtype."""
    shape, axes = reduced_axes(x, dims, keepdim)
    return record(REDUCE, (x,), (kind, name, dims, keepdim, params), [(shape, dt, axes) for dt in dtypes])


# -- amax / amin, max / min of everything ----------------------------------------------


def extremum_whole(dims: tuple[int, ...], keepdim: bool, params: tuple, o: torch.Tensor, t: torch.Tensor) -> None:
    (torch.amax if params[0] else torch.amin)(t, dims, keepdim, out=o)


def extremum_partial(dims: tuple[int, ...], offs: None, params: tuple, p: torch.Tensor, t: torch.Tensor) -> None:
    (torch.amax if params[0] else torch.amin)(t, dims, True, out=p)


def extremum_combine(dims: tuple[int, ...], keepdim: bool, params: tuple, sizes: tuple[int, ...], o: torch.Tensor,
                     *parts: torch.Tensor) -> None:
    s = torch.stack(parts)
    o.copy_((s.amax(0) if params[0] else s.amin(0)).reshape(o.shape))


EXTREMUM = Reduction("amax", extremum_whole, extremum_partial, extremum_combine, lambda dt, p: (dt,))


def _check_nonempty(name: str, x: DataNode, dims: tuple[int, ...], given: bool) -> None:
    """PyTorch's errors for reductions without an identity over nothing."""
    if not given and x.numel == 0:
        raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. Specify the "
                           "reduction dim with the 'dim' argument.")
    for d in dims:
        if x.shape[d] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")


def extremum(x: DataNode, dims: tuple[int, ...], keepdim: bool, largest: bool, name: str) -> DataNode:
    """amax / amin over ``dims`` (none: all), and max() / min() of everything."""
    nd = len(x.shape)
    rd = norm_dims(dims, nd)
    _check_nonempty(name, x, rd, bool(dims))
    return reduction(EXTREMUM, name, x, rd, keepdim, (largest,), [x.dtype])[0]


# -- max / min along a dim with indices, argmax / argmin --------------------------------


_NO_INDEX = torch.iinfo(torch.int64).max


def index_whole(dims: tuple[int, ...], keepdim: bool, params: tuple, *tiles: torch.Tensor) -> None:
    largest, with_values, flat = params
    t = tiles[-1]
    dim = dims[0] if dims else 0
    if with_values:
        (torch.max if largest else torch.min)(t, dim, keepdim, out=(tiles[0], tiles[1]))
    else:
        (torch.argmax if largest else torch.argmin)(t, None if flat is not None else dim, keepdim, out=tiles[0])


def index_partial(dims: tuple[int, ...], offs: tuple[int, ...], params: tuple, pv: torch.Tensor, pi: torch.Tensor,
                  t: torch.Tensor) -> None:
    """The extremum of a tile and its index in the whole value: along the dim, or
    flat (row-major over the whole shape ``flat``)."""
    largest, _, flat = params
    if flat is None:
        d = dims[0]
        v, i = (torch.max if largest else torch.min)(t, d, keepdim=True)
        pv.copy_(v)
        torch.add(i, offs[d], out=pi)
        return
    f = t.reshape(-1)
    loc = int((torch.argmax if largest else torch.argmin)(f))
    pv.view(-1)[0] = f[loc]
    g, stride = 0, 1
    for d in reversed(range(t.dim())):
        loc, r = divmod(loc, t.shape[d])
        g += (offs[d] + r) * stride
        stride *= flat[d]
    pi.fill_(g)


def index_combine(dims: tuple[int, ...], keepdim: bool, params: tuple, sizes: tuple[int, ...],
                  *tiles: torch.Tensor) -> None:
    """The extremum over the parts; its index the smallest among the parts holding it
    (NaN counts as the extremum, as on CPU)."""
    largest, with_values, _ = params
    nout = 2 if with_values else 1
    v, i = stacked(tiles[nout:], 2)
    best = v.amax(0) if largest else v.amin(0)
    hit = v == best
    if v.is_floating_point():
        hit |= v.isnan() & best.isnan()
    idx = torch.where(hit, i, _NO_INDEX).amin(0)
    if with_values:
        tiles[0].copy_(best.reshape(tiles[0].shape))
    tiles[nout - 1].copy_(idx.reshape(tiles[nout - 1].shape))


INDEXED = Reduction("max", index_whole, index_partial, index_combine, lambda dt, p: (dt, torch.int64), indexed=True)


def extremum_dim(x: DataNode, dim: int, keepdim: bool, largest: bool) -> tuple[DataNode, DataNode]:
    """max / min along ``dim``: values and indices."""
    name = "max" if largest else "min"
    rd = norm_dims((dim,), len(x.shape))
    _check_nonempty(name, x, rd, True)
    v, i = reduction(INDEXED, name, x, rd, keepdim, (largest, True, None), [x.dtype, torch.int64])
    return v, i


def arg_extremum(x: DataNode, dim: int | None, keepdim: bool, largest: bool) -> DataNode:
    name = "argmax" if largest else "argmin"
    if x.dtype == torch.bool:
        raise RuntimeError(f"{name}(): does not support bool input")
    nd = len(x.shape)
    if dim is None:
        if x.numel == 0:
            raise IndexError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0.")
        return reduction(INDEXED, name, x, tuple(range(nd)), keepdim, (largest, False, x.shape), [torch.int64])[0]
    rd = norm_dims((dim,), nd)
    _check_nonempty(name, x, rd, True)
    return reduction(INDEXED, name, x, rd, keepdim, (largest, False, None), [torch.int64])[0]


# -- any / all ------------------------------------------------------------------------


def anyall_whole(dims: tuple[int, ...], keepdim: bool, params: tuple, o: torch.Tensor, t: torch.Tensor) -> None:
    (torch.any if params[0] else torch.all)(t, dims, keepdim, out=o)


def anyall_partial(dims: tuple[int, ...], offs: None, params: tuple, p: torch.Tensor, t: torch.Tensor) -> None:
    p.copy_((torch.any if params[0] else torch.all)(t, dims, True))


def anyall_combine(dims: tuple[int, ...], keepdim: bool, params: tuple, sizes: tuple[int, ...], o: torch.Tensor,
                   *parts: torch.Tensor) -> None:
    s = torch.stack(parts)
    o.copy_((s.any(0) if params[0] else s.all(0)).reshape(o.shape))


def _anyall_rows(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...],
                 dtypes: tuple[torch.dtype, ...]) -> tuple[list[int], tuple] | None:
    """any / all of a bool (or uint8) tile over consecutive dims, whole or partial, in C."""
    dims, _, (is_any,) = params
    x = shapes[1]
    if dtypes[1] not in (torch.bool, torch.uint8) or dtypes[0] is not dtypes[1]:
        return None
    if (list(dims) != list(range(dims[0], dims[-1] + 1))) if dims else x:
        return None  # (no dims: a 0-dim tile)
    lo, hi = (dims[0], dims[-1] + 1) if dims else (0, 0)
    outer, inner = native.numel(x[:lo]), native.numel(x[hi:])
    if native.numel(shapes[0]) != outer * inner:
        return None
    return [native.ANY, outer, native.numel(x[lo:hi]), inner, int(not is_any)], ()


native.TYPED[anyall_whole] = native.TYPED[anyall_partial] = _anyall_rows

ANYALL = Reduction("any", anyall_whole, anyall_partial, anyall_combine, lambda dt, p: (torch.bool,))


def any_all(x: DataNode, dims: tuple[int, ...], keepdim: bool, is_any: bool) -> DataNode:
    """any / all over ``dims`` (none: all): bool, or uint8 for a uint8 input (as on CPU)."""
    out = torch.uint8 if x.dtype == torch.uint8 else torch.bool
    return reduction(ANYALL, "any" if is_any else "all", x, norm_dims(dims, len(x.shape)), keepdim, (is_any,),
                     [out])[0]


# -- var / std (and their means): count, mean and centred second moment per tile -----------


def moments_whole(dims: tuple[int, ...], keepdim: bool, params: tuple, *tiles: torch.Tensor) -> None:
    correction, root, with_mean, _ = params
    t = tiles[-1]
    count = math.prod(t.shape[d] for d in dims)
    if _batch_norm_dims(t, dims) and count > correction:
        v, m = var_mean(t, dims, keepdim)
        if correction:
            v = v * (count / (count - correction))
        if root:
            v = v.sqrt()
    else:
        v, m = (torch.std_mean if root else torch.var_mean)(t, dims, correction=correction, keepdim=keepdim)
    tiles[0].copy_(v)
    if with_mean:
        tiles[1].copy_(m)


def _batch_norm_dims(t: torch.Tensor, dims: tuple[int, ...]) -> bool:
    n = t.dim()
    return n >= 2 and tuple(dims) == (0, *range(2, n)) and t.dtype in (torch.float32, torch.float64) and t.numel() > 0


def var_mean(t: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.var_mean(t, dims, correction=0)``; over every dim but 1 (batch norm's
    statistics) by CPU's batch norm kernel, which is several times faster there."""
    n = t.dim()
    if _batch_norm_dims(t, dims):
        m, v = torch.batch_norm_update_stats(t, None, None, 0.0)
        if keepdim:
            shape = (1, t.shape[1]) + (1,) * (n - 2)
            m, v = m.reshape(shape), v.reshape(shape)
        return v, m
    return torch.var_mean(t, dims, correction=0, keepdim=keepdim)


def moments_partial(dims: tuple[int, ...], offs: None, params: tuple, pm: torch.Tensor, pm2: torch.Tensor,
                    t: torch.Tensor) -> None:
    v, m = var_mean(t.to(pm.dtype), dims, keepdim=True)
    pm.copy_(m)
    torch.mul(v, math.prod(t.shape[d] for d in dims), out=pm2)


def chan_combine(sizes: tuple[int, ...], means: torch.Tensor, m2s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Mean and centred second moment of the union of parts (Chan et al.): the parts'
    counts ``sizes``, means and second moments stacked on dim 0."""
    n = sum(sizes)
    cnt = torch.tensor(sizes, dtype=means.dtype, device=means.device).reshape((len(sizes),) + (1,) * (means.dim() - 1))
    mean = (cnt * means).sum(0) / n
    m2 = m2s.sum(0) + (cnt * (means - mean) ** 2).sum(0)
    return mean, m2, n


def moments_combine(dims: tuple[int, ...], keepdim: bool, params: tuple, sizes: tuple[int, ...],
                    *tiles: torch.Tensor) -> None:
    correction, root, with_mean, _ = params
    nout = 2 if with_mean else 1
    mean, m2, n = chan_combine(sizes, *stacked(tiles[nout:], 2))
    var = m2 / max(n - correction, 0)
    tiles[0].copy_((var.sqrt() if root else var).reshape(tiles[0].shape))
    if with_mean:
        tiles[1].copy_(mean.reshape(tiles[1].shape))


MOMENTS = Reduction("var", moments_whole, moments_partial, moments_combine, lambda dt, p: (p[3], p[3]))


def moments(x: DataNode, dims: tuple[int, ...], correction: float, keepdim: bool, root: bool,
            with_mean: bool) -> tuple[DataNode, ...]:
    """var / std over ``dims`` (none: all) with ``correction``, and the mean if asked."""
    if not x.dtype.is_floating_point:
        raise RuntimeError("std and var only support floating point and complex dtypes")
    name = ("std" if root else "var") + ("_mean" if with_mean else "")
    params = (correction, root, with_mean, acc_dtype(x.dtype))
    return reduction(MOMENTS, name, x, norm_dims(dims, len(x.shape)), keepdim, params,
                     [x.dtype] * (2 if with_mean else 1))


def type_word(dt: torch.dtype) -> str:
    """A dtype as ATen's messages name it (``Long``, ``Float``)."""
    return {torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
            torch.bool: "Bool", torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
            torch.bfloat16: "BFloat16"}.get(dt, str(dt).removeprefix("torch."))
