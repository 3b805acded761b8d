"""Views as graph ops. A tensor viewing another is read by replaying the view on
the base value and written by scattering back (functionalization, lite).

A view is decoded into reshape -> permute -> reshape -> expand, or, where it slices,
a box of a reshape (keeping the tiling of the dims it does not cut); anything else
is a strided copy of the whole value in one tile (``as_strided``).
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache
from typing import Any

import torch

from torch_nntile.graph.axes import AxisGroup, new_group, union
from torch_nntile.graph.nodes import DataNode, OpNode
from torch_nntile.kernels import Kernel, native
from torch_nntile.ops.base import Op, record
from torch_nntile.ops.index import boxes, copy_program
from torch_nntile.tiling.tiles import Arg, Lowering, R, W

# -- permute -------------------------------------------------------------------


def permute_tile(perm: tuple[int, ...], o: torch.Tensor, t: torch.Tensor) -> None:
    o.copy_(t.permute(perm))


def _permute_view(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...]) -> dict[int, tuple[tuple[int, ...], int]]:
    (perm,) = params
    cs = native.contiguous_strides(shapes[1])
    return {1: (tuple(cs[p] for p in perm), 0)}


native.TRANSLATORS[permute_tile] = copy_program
native.VIEWS[permute_tile] = _permute_view


def _lower_permute(ctx: Lowering, node: OpNode) -> None:
    perm = node.attrs
    x = ctx.input(node.inputs[0])
    out = ctx.output(node.outputs[0])
    kernel = Kernel(permute_tile, perm)
    for idx in out.indices():
        xi = [0] * len(idx)
        for d, p in enumerate(perm):
            xi[p] = idx[d]
        ctx.task(kernel, [Arg(out, idx, W), Arg(x, tuple(xi), R)], "permute")


PERMUTE = Op("permute", _lower_permute)


def permute(x: DataNode, perm: tuple[int, ...]) -> DataNode:
    if perm == tuple(range(len(perm))):
        return x
    shape = tuple(x.shape[p] for p in perm)
    axes = tuple(x.axes[p] for p in perm)
    return record(PERMUTE, (x,), perm, [(shape, x.dtype, axes)])[0]


# -- reshape -------------------------------------------------------------------


def _blocks(a: tuple[int, ...], b: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """Pair minimal runs of dims of ``a`` and ``b`` with equal products (size-1 dims dropped)."""
    ia = [i for i, s in enumerate(a) if s != 1]
    ib = [i for i, s in enumerate(b) if s != 1]
    out, i, j = [], 0, 0
    while i < len(ia) or j < len(ib):
        ra, rb = [ia[i]], [ib[j]]
        pa, pb = a[ia[i]], b[ib[j]]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                pa *= a[ia[i]]
                ra.append(ia[i])
                i += 1
            else:
                pb *= b[ib[j]]
                rb.append(ib[j])
                j += 1
        out.append((ra, rb))
    return out


def _lower_reshape(ctx: Lowering, node: OpNode) -> None:
    """A tile's box reshapes like the whole value where each block of dims the reshape
    maps (one to one, one to several, several to one) is tiled on its first dim only,
    with tile sizes that agree across the block; other blocks are whole in a tile.
    No data moves: the output shares the input's tiles."""
    xn, on = node.inputs[0], node.outputs[0]
    tin, tout = ctx.tiling(xn), ctx.tiling(on)
    if all(len(t) == 1 for t in tin) and all(len(t) == 1 for t in tout):  # one tile each: it is the same tile
        ctx.view_output(on, ctx.input(xn), tout, [0])
        return
    tin, tout = list(tin), list(tout)
    whole_in, whole_out = lambda d: (xn.shape[d],), lambda d: (on.shape[d],)  # noqa: E731
    lead = []  # (input dim, output dim) whose tile indices correspond
    for ra, rb in node.attrs:
        inner_in = math.prod(xn.shape[d] for d in ra[1:])
        inner_out = math.prod(on.shape[d] for d in rb[1:])
        # tiles of the block's first output dim, in items of its first input dim
        if all(len(tout[d]) == 1 for d in rb[1:]) and all(s * inner_out % inner_in == 0 for s in tout[rb[0]]):
            tin[ra[0]] = tuple(s * inner_out // inner_in for s in tout[rb[0]])
            for d in ra[1:]:
                tin[d] = whole_in(d)
            lead.append((ra[0], rb[0]))
        else:
            for d in ra:
                tin[d] = whole_in(d)
            for d in rb:
                tout[d] = whole_out(d)
    x = ctx.input(xn, tuple(tin))
    # Each output tile holds its input tile's items in the same order (a tile's box
    # reshapes like the value): the output is the input's tiles under new shapes.
    order = []
    for idx in itertools.product(*(range(len(t)) for t in tout)):
        xi = [0] * len(xn.shape)
        for xd, od in lead:
            xi[xd] = idx[od]
        order.append(x.flat(tuple(xi)))
    ctx.view_output(on, x, tuple(tout), order)


RESHAPE = Op("reshape", _lower_reshape)


def reshape(x: DataNode, shape: tuple[int, ...]) -> DataNode:
    """A view with another shape. Dims mapped one to one share their axis group; the
    first dim of a split or merged block takes its tiling from the input's first dim
    (scaled), unless tiled by name itself."""
    if shape == x.shape:
        return x
    attrs, plan = _reshape_plan(x.shape, shape)
    xa = x.axes
    full = tuple(new_group(s) if d is None else xa[d] if f == 0 else new_group(s, (xa[d], f))
                 for s, (d, f) in zip(shape, plan))
    return record(RESHAPE, (x,), attrs, [(shape, x.dtype, full)])[0]


@lru_cache(maxsize=4096)
def _reshape_plan(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple, tuple[tuple[int | None, int], ...]]:
    """What ``reshape`` records for shape ``a`` to ``b`` (the same every step): the op's
    blocks, and per output dim where its axis group comes from, ``(input dim, 0)`` for
    the input's own group, ``(input dim, factor)`` for a new group deriving its tiling
    from that one (see ``AxisGroup.derive``), ``(None, 0)`` for a new group."""
    n = math.prod(a)
    if math.prod(b) != n:
        raise RuntimeError(f"shape {list(b)} is invalid for input of size {n}")
    plan: list[tuple[int | None, int]] = [(None, 0)] * len(b)
    blocks = _blocks(a, b) if n else []
    for ra, rb in blocks:
        if len(ra) == 1 and len(rb) == 1:
            plan[rb[0]] = (ra[0], 0)
            continue
        inner_in = math.prod(a[d] for d in ra[1:])
        inner_out = math.prod(b[d] for d in rb[1:])
        if inner_in % inner_out == 0 or inner_out % inner_in == 0:
            factor = inner_in // inner_out if inner_in >= inner_out else -(inner_out // inner_in)
            plan[rb[0]] = (ra[0], factor)
    return tuple((tuple(ra), tuple(rb)) for ra, rb in blocks), tuple(plan)


# -- expand --------------------------------------------------------------------


def expand_tile(o: torch.Tensor, t: torch.Tensor) -> None:
    o.copy_(t.expand(o.shape))


EXPAND_TILE = Kernel(expand_tile)
native.TRANSLATORS[expand_tile] = copy_program
native.VIEWS[expand_tile] = lambda params, shapes: {}  # the input is read by broadcasting


def _lower_expand(ctx: Lowering, node: OpNode) -> None:
    x = ctx.input(node.inputs[0])
    out = ctx.output(node.outputs[0])
    off = len(out.shape) - len(x.shape)
    for idx in out.indices():
        xi = tuple(0 if s == 1 else idx[off + d] for d, s in enumerate(x.shape))
        ctx.task(EXPAND_TILE, [Arg(out, idx, W), Arg(x, xi, R)], "expand")


EXPAND = Op("expand", _lower_expand)


def expand(x: DataNode, shape: tuple[int, ...]) -> DataNode:
    if shape == x.shape:
        return x
    off = len(shape) - len(x.shape)
    axes = []
    for d, s in enumerate(shape):
        xd = d - off
        if xd >= 0 and x.shape[xd] == s:
            axes.append(x.axes[xd])
        else:
            axes.append(new_group(s))
    return record(EXPAND, (x,), None, [(shape, x.dtype, tuple(axes))])[0]


# -- concatenation -----------------------------------------------------------------


def _lower_cat(ctx: Lowering, node: OpNode) -> None:
    dim = node.attrs
    out = ctx.output(node.outputs[0])
    parts, at = [], 0
    for n in node.inputs:
        off = [0] * len(n.shape)
        off[dim] = at
        parts.append((ctx.input(n), tuple(off)))
        at += n.shape[dim]
    ctx.assemble(out, parts, "cat")


CAT = Op("cat", _lower_cat)


def cat(xs: list[DataNode], dim: int, dtype: torch.dtype, group: AxisGroup | None = None) -> DataNode:
    """Concatenate along ``dim`` (wrapped, inputs checked by the caller); other dims
    share their axis groups across the inputs and the output. The output's ``dim`` is
    in ``group`` where given (a value rebuilt at its own extent keeps its tiling), else
    in a new one."""
    first = xs[0]
    shape = list(first.shape)
    shape[dim] = sum(x.shape[dim] for x in xs)
    axes: list[AxisGroup] = []
    for d in range(len(shape)):
        if d == dim:
            axes.append(group if group is not None else new_group(shape[d]))
            continue
        g = first.axes[d]
        for x in xs[1:]:
            union(g, x.axes[d])
        axes.append(g)
    return record(CAT, tuple(xs), dim, [(tuple(shape), dtype, tuple(axes))])[0]


# -- general strided views, on the whole value in one tile --------------------------


def _whole(n: DataNode) -> tuple[tuple[int, ...], ...]:
    return tuple((s,) for s in n.shape)


def as_strided_tile(size: tuple[int, ...], stride: tuple[int, ...], offset: int, o: torch.Tensor,
                    base: torch.Tensor) -> None:
    o.copy_(base.reshape(-1).as_strided(size, stride, offset))


def _as_strided_view(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...]) -> dict[int, tuple[tuple[int, ...], int]]:
    size, stride, offset = params
    return {1: (tuple(stride), offset)} if tuple(size) == shapes[0] else {}


native.TRANSLATORS[as_strided_tile] = copy_program
native.VIEWS[as_strided_tile] = _as_strided_view


def _lower_as_strided(ctx: Lowering, node: OpNode) -> None:
    xn, on = node.inputs[0], node.outputs[0]
    if 0 in on.shape:  # an empty view reads nothing: its base is not gathered
        ctx.output(on, _whole(on))
        return
    x, out = ctx.input(xn, _whole(xn)), ctx.output(on, _whole(on))  # re-tiled as planned after
    ctx.task(Kernel(as_strided_tile, *node.attrs), [Arg(out, (0,) * len(on.shape), W), Arg(x, (0,) * len(xn.shape), R)],
             "as_strided")


AS_STRIDED = Op("as_strided", _lower_as_strided)


def as_strided_scatter_tile(size: tuple[int, ...], stride: tuple[int, ...], offset: int, o: torch.Tensor,
                            base: torch.Tensor, src: torch.Tensor) -> None:
    o.copy_(base)
    o.reshape(-1).as_strided(size, stride, offset).copy_(src)


def _lower_as_strided_scatter(ctx: Lowering, node: OpNode) -> None:
    (bn, sn), on = node.inputs, node.outputs[0]
    base, src, out = ctx.input(bn, _whole(bn)), ctx.input(sn, _whole(sn)), ctx.output(on, _whole(on))
    zero = (0,) * len(on.shape)
    ctx.task(Kernel(as_strided_scatter_tile, *node.attrs),
             [Arg(out, zero, W), Arg(base, zero, R), Arg(src, (0,) * len(sn.shape), R)], "as_strided_scatter")


AS_STRIDED_SCATTER = Op("as_strided_scatter", _lower_as_strided_scatter)


# -- geometry decoding -----------------------------------------------------------


@lru_cache(maxsize=4096)
def decode(base_shape: tuple[int, ...], sizes: tuple[int, ...], strides: tuple[int, ...], offset: int) -> tuple | None:
    """Steps (R, perm, S, expand_to) such that view = expand(reshape(permute(reshape(base, R), perm), S)).

    None when the view is not a permutation of a reshape of the whole base.
    """
    n = math.prod(base_shape)
    core = [(st, sz, d) for d, (sz, st) in enumerate(zip(sizes, strides)) if sz != 1 and st != 0]
    if offset != 0 or math.prod(sz for _, sz, _ in core) != n:
        return None
    order = sorted(core, key=lambda c: -c[0])
    expect = 1
    for st, sz, _ in reversed(order):
        if st != expect:
            return None
        expect *= sz
    return (tuple(sz for _, sz, _ in order), *_arrange(core, order, sizes, strides))


@lru_cache(maxsize=4096)
def decode_box(n: int, sizes: tuple[int, ...], strides: tuple[int, ...], offset: int) -> tuple | None:
    """Steps (R, box, perm, S, expand_to) such that view = expand(reshape(permute(box of
    reshape(base, R)), S)), ``box`` a (start, size) per dim of R: views that slice
    (``split``, ``narrow``, ``x[:, 1:]``), for a base of ``n`` items.

    R has one dim per traversed dim of the view, in decreasing stride, each as long as
    the stride above it allows, and one more inner dim, held at one index, where the
    smallest stride exceeds 1. None when the view is not such a box (strides that do
    not nest, ranges that wrap)."""
    core = [(st, sz, d) for d, (sz, st) in enumerate(zip(sizes, strides)) if sz != 1 and st != 0]
    if not core or not n or any(sz == 0 for sz in sizes):
        return None
    order = sorted(core, key=lambda c: -c[0])
    r_shape, box = [], []
    outer = n
    for st, sz, _ in order:
        if outer % st:
            return None
        extent = outer // st
        start = (offset // st) % extent
        if start + sz > extent:
            return None
        r_shape.append(extent)
        box.append((start, sz))
        outer = st
    if outer > 1:  # the smallest stride skips items: an inner dim, held at one index
        r_shape.append(outer)
        box.append((offset % outer, 1))
    if offset // order[0][0] >= n // order[0][0]:
        return None
    return (tuple(r_shape), tuple(box), *_arrange(core, order, sizes, strides))


def _arrange(core: list[tuple[int, int, int]], order: list[tuple[int, int, int]], sizes: tuple[int, ...],
             strides: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...] | None]:
    """The steps after R of ``decode`` and ``decode_box``: the permutation from R's order
    (decreasing stride) to the view's, the shape with broadcast and size-1 dims as 1, and
    the expanded shape if the view broadcasts (else None)."""
    perm = tuple(order.index(c) for c in core)
    s_shape = tuple(1 if st == 0 else sz for sz, st in zip(sizes, strides))
    expanded = any(sz != 1 and st == 0 for sz, st in zip(sizes, strides))
    return perm, s_shape, (sizes if expanded else None)


def read_view(base: DataNode, sizes: tuple[int, ...], strides: tuple[int, ...], offset: int) -> DataNode:
    """The value seen through a view of ``base`` (a contiguous tensor): reshapes,
    permutations and boxes (which keep the tiling of the dims they do not cut) where
    the view is one, else a strided copy of the whole value."""
    steps = decode(base.shape, sizes, strides, offset)
    if steps is not None:
        r_shape, perm, s_shape, exp = steps
        v = permute(reshape(base, r_shape), perm)
    else:
        steps = decode_box(base.numel, sizes, strides, offset)
        if steps is None:
            return record(AS_STRIDED, (base,), (sizes, strides, offset), [(sizes, base.dtype, None)])[0]
        r_shape, box, perm, s_shape, exp = steps
        v = reshape(base, r_shape)
        v = boxes("slice", v, tuple(((0, sz, start, False),) for start, sz in box), tuple(sz for _, sz in box), None)
        v = permute(reshape(v, tuple(sz for _, sz in box[:len(perm)])), perm)
    v = reshape(v, s_shape)
    return expand(v, exp) if exp is not None else v


def write_view(base: DataNode, value: DataNode, sizes: tuple[int, ...], strides: tuple[int, ...], offset: int) -> DataNode:
    """The new base after writing ``value`` through a view of it: the inverse steps of
    ``read_view`` where the view is a permuted reshape or a box of one (a box is placed
    by slices of the base and concatenation, tiled, in C), else a strided scatter of
    the whole value."""
    if 0 in sizes:
        return base  # an empty view writes nothing
    steps = decode(base.shape, sizes, strides, offset)
    if steps is not None and steps[3] is None:
        r_shape, perm, _s_shape, _ = steps
        return reshape(_unpermute(value, r_shape, perm), base.shape)
    steps = decode_box(base.numel, sizes, strides, offset) if steps is None else None
    if steps is None or steps[4] is not None:  # a broadcast view writes each item several times
        return record(AS_STRIDED_SCATTER, (base, value), (sizes, strides, offset),
                      [(base.shape, base.dtype, base.axes)])[0]
    r_shape, box, perm, _s_shape, _ = steps
    v = _unpermute(value, tuple(sz for _, sz in box), perm)
    return reshape(_place(reshape(base, r_shape), v, box, 0), base.shape)


def _unpermute(value: DataNode, r_shape: tuple[int, ...], perm: tuple[int, ...]) -> DataNode:
    """``value`` (seen as ``R`` permuted by ``perm``, ``read_view``'s steps) back in ``R``'s
    layout, ``r_shape``."""
    inv = tuple(perm.index(i) for i in range(len(perm)))
    return reshape(permute(reshape(value, tuple(r_shape[p] for p in perm)), inv), r_shape)


def _place(x: DataNode, v: DataNode, box: tuple[tuple[int, int], ...], d: int) -> DataNode:
    """``x`` with its ``box`` (a (start, size) per dim, from dim ``d`` on) replaced by
    ``v``: per cut dim, the slices of ``x`` before and after the box around the rest."""
    cut = [k for k in range(d, len(box)) if box[k] != (0, x.shape[k])]
    if not cut:
        return v
    d = cut[0]
    start, size = box[d]
    end = x.shape[d] - start - size
    parts = [_slice(x, d, 0, start)] if start else []
    parts.append(_place(_slice(x, d, start, size), v, box, d + 1) if len(cut) > 1 else v)
    if end:
        parts.append(_slice(x, d, start + size, end))
    return cat(parts, d, x.dtype, x.axes[d]) if len(parts) > 1 else parts[0]


def _slice(x: DataNode, d: int, start: int, size: int) -> DataNode:
    segs = tuple(((0, size, start, False),) if k == d else ((0, s, 0, False),) for k, s in enumerate(x.shape))
    return boxes("slice", x, segs, x.shape[:d] + (size,) + x.shape[d + 1:], None)
