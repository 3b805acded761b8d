"""Index-shaped ops: triangles, ops along one whole dim (cumulative sums, gather,
scatter), box copies (flip, roll, constant padding), advanced indexing, and the
embedding gradient.

Each is tiled over the dims it does not index: those share their axis groups with
the input's, while the dims it indexes (or scans) are whole in a tile.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch

from torch_nntile.graph.axes import AxisGroup, new_group, union
from torch_nntile.graph.nodes import DataNode, OpNode
from torch_nntile.kernels import Kernel, native
from torch_nntile.ops.base import Op, kernel_name, record, reduce_into, split_chains
from torch_nntile.ops.data import fill_tile
from torch_nntile.tiling.tiles import Arg, Lowering, R, W

# -- tril / triu ---------------------------------------------------------------


def tri_tile(upper: bool, k: int, o: torch.Tensor, t: torch.Tensor) -> None:
    (torch.triu if upper else torch.tril)(t, k, out=o)


def copy_tile(o: torch.Tensor, t: torch.Tensor) -> None:
    o.copy_(t)


def copy_program(p: native.Program, params: tuple[Any, ...], refs: list[native.Ref]) -> native.Ref:
    """The C program of kernels that copy (a view of) their input: on tiles of any
    dtype a strided copy (``native.VIEWS`` says how the input is read)."""
    return p.emit(native.COPY, refs[0])


COPY = Kernel(copy_tile)
native.TRANSLATORS[copy_tile] = copy_program
native.VIEWS[copy_tile] = lambda params, shapes: {}  # read by broadcasting, as copy_ reads (other dtypes: casts)
ZERO = Kernel(fill_tile, 0)


def _lower_tri(ctx: Lowering, node: OpNode) -> None:
    upper, k = node.attrs
    x = ctx.input(node.inputs[0])
    out = ctx.output(node.outputs[0])
    name = "triu" if upper else "tril"
    for idx in out.indices():
        h, w = out.tile_shape(idx)[-2:]
        kk = k + out.offs[-2][idx[-2]] - out.offs[-1][idx[-1]]  # the diagonal in the tile's own coordinates
        # tril keeps j - i <= kk: all of the tile when w - 1 <= kk, none when 1 - h > kk
        keep_all = (1 - h >= kk) if upper else (w - 1 <= kk)
        keep_none = (w - 1 < kk) if upper else (1 - h > kk)
        if h == 0 or w == 0 or keep_none:
            ctx.task(ZERO, [Arg(out, idx, W)], name)
        else:
            ctx.task(COPY if keep_all else Kernel(tri_tile, upper, kk), [Arg(out, idx, W), Arg(x, idx, R)], name)


TRI = Op("tri", _lower_tri, lambda node: "triu" if node.attrs[0] else "tril")


def tri(x: DataNode, k: int, upper: bool) -> DataNode:
    return record(TRI, (x,), (upper, k), [(x.shape, x.dtype, x.axes)])[0]


# -- ops along whole dims, tiled over the others -----------------------------------


def _lower_along(ctx: Lowering, node: OpNode) -> None:
    fn, name, dims, whole, follow = node.attrs
    # with ``follow``, the output's dim follow[1] is tiled as the index vector at position follow[0]
    out_dims = dims if follow is None else tuple(d for d in dims if d != follow[1])
    args = []  # (tiles, where a task reads them: its own index, a fixed index, or its index along a dim)
    for k, n in enumerate(node.inputs):
        if follow is not None and k == follow[0]:
            args.append((ctx.input(n), None, follow[1]))
        elif k in whole:
            args.append((ctx.input(n, tuple((s,) for s in n.shape)), (0,) * len(n.shape), None))
        else:
            args.append((ctx.input(n, ctx.whole(n, dims)), None, None))
    out = ctx.output(node.outputs[0], ctx.whole(node.outputs[0], out_dims))
    for idx in out.indices():
        at = idx if follow is None else idx[:follow[1]] + (0,) + idx[follow[1] + 1:]  # the inputs' dim is whole
        ctx.task(fn, [Arg(out, idx, W)] + [Arg(a, z if z is not None else at if d is None else (idx[d],), R)
                                           for a, z, d in args], name)


ALONG = Op("along", _lower_along, kernel_name)
"""Inputs and output of one rank whose other dims share axis groups (their extents
agree): one task per tile, ``dims`` whole in every tile; inputs at the positions
``whole`` (an index vector, a 0-dim value) go whole to every task, but the index
vector at position ``follow[0]`` where given: the output's dim ``follow[1]`` is that
vector's (row i of the output is entry i of the index, ``index_select``), tiled as it
is, each task reading the index tile of its output rows."""


def along(name: str, fn: Kernel, inputs: list[DataNode], dims: tuple[int, ...], shape: tuple[int, ...],
          dtype: torch.dtype, whole: tuple[int, ...] = (), follow: tuple[int, int] | None = None) -> DataNode:
    """Record ``fn(out_tile, *input_tiles)`` with ``dims`` whole; the other dims of the
    inputs (but those at positions ``whole``) and the output are merged (each must have
    the output's extent there). ``follow`` = (k, d): the output's dim ``d`` (one of
    ``dims``) shares the axis group of the 1-dim input ``k`` (one of ``whole``), whose
    tiles the output's rows follow."""
    tiled = [n for k, n in enumerate(inputs) if k not in whole]
    axes: list[AxisGroup] = []
    for d, s in enumerate(shape):
        if follow is not None and d == follow[1]:
            axes.append(inputs[follow[0]].axes[0])
            continue
        if d in dims:
            axes.append(new_group(s))
            continue
        g = tiled[0].axes[d]
        for n in tiled[1:]:
            union(g, n.axes[d])
        axes.append(g)
    return record(ALONG, tuple(inputs), (fn, name, dims, whole, follow), [(shape, dtype, tuple(axes))])[0]


# -- box copies: flip, roll, constant padding -------------------------------------
#
# Each output dim maps onto the input's by segments ``(o0, o1, i0, rev)``: output
# coordinate o in [o0, o1) reads input coordinate i0 + (o - o0), or i0 - (o - o0)
# when ``rev``; coordinates in no segment take the fill value. An output tile reads
# the input tiles its segments overlap, box by box.

Segment = tuple[int, int, int, bool]


def _pieces(segs: tuple[Segment, ...], lo: int, hi: int, in_offs: tuple[int, ...],
            in_sizes: tuple[int, ...]) -> tuple[list[tuple[int, int, int, int, int, bool]], bool]:
    """The pieces of output range [lo, hi): (out start, out stop) local to the tile,
    input tile, (in start, in stop) local to that tile, reversed; and whether they
    cover the range."""
    out, covered = [], 0
    for o0, o1, i0, rev in segs:
        a, b = max(lo, o0), min(hi, o1)
        if a >= b:
            continue
        covered += b - a
        # input coordinates [p, q) that output [a, b) reads
        p, q = (i0 + a - o0, i0 + b - o0) if not rev else (i0 - (b - 1 - o0), i0 - (a - o0) + 1)
        for t, (off, size) in enumerate(zip(in_offs, in_sizes)):
            s, e = max(p, off), min(q, off + size)
            if s >= e:
                continue
            oa, ob = (o0 + s - i0, o0 + e - i0) if not rev else (o0 + i0 - e + 1, o0 + i0 - s + 1)
            out.append((oa - lo, ob - lo, t, s - off, e - off, rev))
    return out, covered == hi - lo


def copy_box_tile(value: Any, boxes: tuple[Any, ...], o: torch.Tensor, *srcs: torch.Tensor) -> None:
    """Fill ``o`` with ``value`` (unless None), then copy each box: ``(source position,
    destination box, source box, dims to reverse)``."""
    if value is not None:
        o.fill_(value)
    for pos, dbox, sbox, rev in boxes:
        part = srcs[pos][tuple(slice(a, b) for a, b in sbox)]
        o[tuple(slice(a, b) for a, b in dbox)].copy_(part.flip(rev) if rev else part)


def _box_rows(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...],
              dtypes: tuple[torch.dtype, ...]) -> tuple[list[int], tuple] | None:
    """The fill and the boxes as strided copies in C, of tiles of one dtype: a reversed
    dim is read from its box's end by a negative stride."""
    value, boxes = params
    if any(d is not dtypes[0] for d in dtypes):
        return None
    if any(b - a != d - c for _, dbox, sbox, _ in boxes for (a, b), (c, d) in zip(dbox, sbox)):
        return None
    out = [native.box(1 + pos, shapes[1 + pos], dbox, sbox, rev) for pos, dbox, sbox, rev in boxes]
    return native.copy_boxes_record(dtypes[0], shapes[0], out, value)


native.TYPED[copy_box_tile] = _box_rows


def _lower_boxes(ctx: Lowering, node: OpNode) -> None:
    segs, value, name = node.attrs
    x = ctx.input(node.inputs[0])
    out = ctx.output(node.outputs[0])
    nd = len(out.shape)
    for idx in out.indices():
        per_dim, full = [], True
        for d in range(nd):
            lo = out.offs[d][idx[d]]
            ps, cov = _pieces(segs[d], lo, lo + out.tiling[d][idx[d]], x.offs[d], x.tiling[d])
            per_dim.append(ps)
            full = full and cov
        srcs: dict[tuple[int, ...], int] = {}
        boxes = []
        for combo in itertools.product(*per_dim):
            sidx = tuple(p[2] for p in combo)
            pos = srcs.setdefault(sidx, len(srcs))
            boxes.append((pos, tuple((p[0], p[1]) for p in combo), tuple((p[3], p[4]) for p in combo),
                          tuple(d for d, p in enumerate(combo) if p[5])))
        kernel = Kernel(copy_box_tile, None if full else value, tuple(boxes))
        ctx.task(kernel, [Arg(out, idx, W)] + [Arg(x, s, R) for s in srcs], name)


BOXES = Op("boxes", _lower_boxes, lambda node: node.attrs[2])


def boxes(name: str, x: DataNode, segs: tuple[tuple[Segment, ...], ...], shape: tuple[int, ...], value: Any,
          dtype: torch.dtype | None = None) -> DataNode:
    """Record a box copy; a dim of the input's extent keeps the input's group (any
    tiling of it works: a tile reads the input tiles its boxes overlap)."""
    axes = tuple(x.axes[d] if s == x.shape[d] else new_group(s) for d, s in enumerate(shape))
    return record(BOXES, (x,), (segs, value, name), [(shape, dtype or x.dtype, axes)])[0]


def flip(x: DataNode, dims: tuple[int, ...]) -> DataNode:
    segs = tuple(((0, s, s - 1, True),) if d in dims and s else ((0, s, 0, False),) for d, s in enumerate(x.shape))
    return boxes("flip", x, segs, x.shape, None)


def roll(x: DataNode, shifts: dict[int, int]) -> DataNode:
    segs = []
    for d, n in enumerate(x.shape):
        s = shifts.get(d, 0) % n if n else 0
        segs.append(tuple(seg for seg in ((s, n, 0, False), (0, s, n - s, False)) if seg[0] < seg[1]))
    return boxes("roll", x, tuple(segs), x.shape, None)


def constant_pad(x: DataNode, pads: list[tuple[int, int]], value: Any, shape: tuple[int, ...]) -> DataNode:
    """``pads[d]`` = (before, after) per dim, negative to crop; ``shape`` the result's."""
    segs = []
    for (b, _), n, m in zip(pads, x.shape, shape):
        o0, o1 = max(b, 0), min(b + n, m)
        segs.append(((o0, o1, o0 - b, False),) if o0 < o1 else ())
    return boxes("constant_pad_nd", x, tuple(segs), shape, value)


# -- advanced indexing -----------------------------------------------------------------


def _index_list(pattern: tuple[bool, ...], its: tuple[torch.Tensor, ...]) -> list[torch.Tensor | None]:
    it = iter(its)
    return [next(it) if p else None for p in pattern]


def index_tile(pattern: tuple[bool, ...], o: torch.Tensor, x: torch.Tensor, *its: torch.Tensor) -> None:
    torch.ops.aten.index.Tensor_out(x, _index_list(pattern, its), out=o)


def _index_rows(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...],
                dtypes: tuple[torch.dtype, ...]) -> tuple[list[int], tuple] | None:
    """One integer index tile along one dim of a tile of any dtype runs in C (checking
    the indices as CPU does); masks and several index tiles stay Python."""
    (pattern,) = params
    if len(shapes) > 3 or pattern.count(True) > 1:
        return _index_n_rows(pattern, shapes, dtypes)
    if len(shapes) != 3 or pattern.count(True) != 1 or dtypes[0] is not dtypes[1] \
            or dtypes[2] not in native.INDEX_DTYPES or dtypes[0] not in native.ELEMENT_SIZES:
        return None
    o, x, i = shapes
    d = pattern.index(True)
    if d >= len(x) or tuple(o) != tuple(x[:d]) + tuple(i) + tuple(x[d + 1:]):
        return None
    k = native.numel(i)
    if x[d] == 0 and k:
        return None  # CPU's own error for an empty dim: Python raises it
    return [native.INDEX, native.numel(x[:d]), x[d], native.numel(x[d + 1:]), k, native.ELEMENT_SIZES[dtypes[0]],
            int(dtypes[2] is torch.int64), 0], ()


def _index_n_rows(pattern: tuple[bool, ...], shapes: tuple[tuple[int, ...], ...],
                  dtypes: tuple[torch.dtype, ...]) -> tuple[list[int], tuple] | None:
    """Several integer index tiles, broadcast together (a padding mask looked up by
    batch and key positions): ``INDEX_N``, element by element."""
    o, x, *its = shapes
    dims = [d for d, p in enumerate(pattern) if p]
    if dtypes[0] is not dtypes[1] or len(dims) != len(its) or any(d not in native.INDEX_DTYPES for d in dtypes[2:]) \
            or dims[-1] >= len(x):
        return None
    try:
        bshape = tuple(torch.broadcast_shapes(*its))
    except RuntimeError:
        return None
    start, kept = index_layout(len(x), tuple(dims), bshape)
    want = list(bshape)
    for d, od in sorted(kept.items(), key=lambda kv: kv[1]):
        want.insert(od, x[d])
    if tuple(o) != tuple(want):
        return None
    if native.numel(bshape) and any(x[d] == 0 for d in dims):
        return None  # CPU's own error for indices into an empty dim (even where the result is empty): Python raises it
    reads = []
    for j, (it, dt, d) in enumerate(zip(its, dtypes[2:], dims)):
        istride = [0] * max(1, len(o))
        for k, (size, st) in enumerate(zip(it, native.contiguous_strides(it))):
            if size != 1:
                istride[start + len(bshape) - len(it) + k] = st
        reads.append((dt, d, False, j, istride))
    return _index_n_record(dtypes[0], o, x, kept, reads)


def _index_n_record(dtype: torch.dtype, o: tuple[int, ...], x: tuple[int, ...], kept: dict[int, int],
                    reads: list[tuple[torch.dtype, int, bool, int, list[int]]]) -> tuple[list[int], tuple] | None:
    """The ``INDEX_N`` record of output tile ``o`` read from tile ``x``: its dims ``kept``
    (x dim -> output dim) by their strides, and per index tile (its dtype, the x dim it
    indexes, gather's rules or indexing's, the dim its error names, its strides per
    output dim) that dim."""
    if dtype not in native.ELEMENT_SIZES or not x:
        return None
    shape = tuple(o) or (1,)  # a 0-dim result: one element
    xs = native.contiguous_strides(x)
    xstride = [0] * len(shape)
    for d, od in kept.items():
        xstride[od] = xs[d]
    ints = [native.INDEX_N, native.ELEMENT_SIZES[dtype], len(shape), len(reads), *shape, *xstride]
    for dt, d, gather, dim, istride in reads:
        ints += [int(dt is torch.int64) | (2 if gather else 0), x[d], xs[d], dim, *istride]
    return (ints, ()) if len(shape) <= 16 and native.fits_int32(*ints, native.numel(x)) else None


def _gather_record(args: tuple[Any, ...], kw: dict[str, Any], shapes: tuple[tuple[int, ...], ...],
                   dtypes: tuple[torch.dtype, ...]) -> tuple[list[int], tuple] | None:
    """``torch.gather`` of a tile of any dtype (BERT's position and token type ids):
    ``INDEX_N`` with one index tile laid out as the result, whose values must lie in
    ``[0, n)`` (CPU's error otherwise)."""
    if kw or len(args) != 3 or type(args[0]) is not native.Ref or type(args[2]) is not native.Ref \
            or type(args[1]) is not int:
        return None
    o, x, i = shapes[0], shapes[args[0]], shapes[args[2]]
    d = args[1]
    if dtypes[0] is not dtypes[args[0]] or dtypes[args[2]] is not torch.int64 or len(x) != len(i) or tuple(o) != i \
            or not 0 <= d < len(x) or (args[0], args[2]) != (1, 2):
        return None
    kept = {k: k for k in range(len(x)) if k != d}
    return _index_n_record(dtypes[0], o, x, kept, [(torch.int64, d, True, d, list(native.contiguous_strides(i)))])


native.CALLS[torch.ops.aten.gather.out] = _gather_record


native.TYPED[index_tile] = _index_rows


def index_put_tile(pattern: tuple[bool, ...], accumulate: bool, o: torch.Tensor, x: torch.Tensor, v: torch.Tensor,
                   *its: torch.Tensor) -> None:
    o.copy_(x)
    torch.ops.aten._index_put_impl_(o, _index_list(pattern, its), v, accumulate, False)


def _lower_index(ctx: Lowering, node: OpNode) -> None:
    pattern, indexed, kept, put, accumulate = node.attrs
    kept = dict(kept)
    xn = node.inputs[0]
    nx = len(xn.shape)
    x = ctx.input(xn, ctx.whole(xn, indexed))
    its = [ctx.input(n, tuple((s,) for s in n.shape)) for n in node.inputs[2 if put else 1:]]
    targs = [Arg(a, (0,) * len(a.shape), R) for a in its]
    if put:
        vn = node.inputs[1]
        v = ctx.input(vn, ctx.whole(vn, set(range(len(vn.shape))) - set(kept)))
        out = ctx.output(node.outputs[0], ctx.whole(node.outputs[0], indexed))
        kernel = Kernel(index_put_tile, pattern, accumulate)
        for idx in out.indices():
            vi = [0] * len(vn.shape)
            for vd, xd in kept.items():
                vi[vd] = idx[xd]
            ctx.task(kernel, [Arg(out, idx, W), Arg(x, idx, R), Arg(v, tuple(vi), R), *targs], "index_put")
        return
    on = node.outputs[0]
    out = ctx.output(on, ctx.whole(on, set(range(len(on.shape))) - set(kept)))
    kernel = Kernel(index_tile, pattern)
    for idx in out.indices():
        xi = [0] * nx
        for od, xd in kept.items():
            xi[xd] = idx[od]
        ctx.task(kernel, [Arg(out, idx, W), Arg(x, tuple(xi), R), *targs], "index")


INDEX = Op("index", _lower_index, lambda node: "index_put" if node.attrs[2] else "index")


def index_layout(x_ndim: int, indexed: tuple[int, ...], bshape: tuple[int, ...]) -> tuple[int, dict[int, int]]:
    """Where ``x[indices]`` puts the broadcast index dims (their first position) and
    which result dim each kept (not ``indexed``) dim of ``x`` becomes."""
    pos = list(indexed)
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    start = pos[0] if adjacent else 0
    kept, r = {}, 0
    for d in range(x_ndim):
        if d in pos:
            continue
        if r == start:
            r += len(bshape)
        kept[d] = r
        r += 1
    return start, kept


def index(x: DataNode, pattern: tuple[bool, ...], indexed: tuple[int, ...], its: list[DataNode],
          shape: tuple[int, ...], bshape: tuple[int, ...]) -> DataNode:
    """``x[indices]``: ``pattern`` says which entries of the index list are tensors (``its``,
    in order; a bool mask stands for as many dims as it has), ``indexed`` the dims of
    ``x`` they index, ``shape`` the result's, ``bshape`` the broadcast index shape."""
    _, kept_x = index_layout(len(x.shape), indexed, bshape)
    axes: list[AxisGroup | None] = [None] * len(shape)
    for xd, od in kept_x.items():
        axes[od] = x.axes[xd]
    full = tuple(a if a is not None else new_group(s) for a, s in zip(axes, shape))
    kept = tuple(sorted((od, xd) for xd, od in kept_x.items()))
    return record(INDEX, (x, *its), (pattern, indexed, kept, False, False), [(shape, x.dtype, full)])[0]


def index_put(x: DataNode, pattern: tuple[bool, ...], indexed: tuple[int, ...], its: list[DataNode],
              values: DataNode, bshape: tuple[int, ...], accumulate: bool) -> DataNode:
    """``x`` with ``x[indices] = values`` (or ``+=``); ``values`` already has the shape
    of ``x[indices]``."""
    _, kept_x = index_layout(len(x.shape), indexed, bshape)
    for xd, vd in kept_x.items():
        union(x.axes[xd], values.axes[vd])
    kept = tuple(sorted((vd, xd) for xd, vd in kept_x.items()))
    return record(INDEX, (x, values, *its), (pattern, indexed, kept, True, accumulate),
                  [(x.shape, x.dtype, x.axes)])[0]


# -- the gradient of an embedding, tiled along the embedding dim ----------------------


def embedding_backward_tile(num_weights: int, padding_idx: int, scale: bool, o: torch.Tensor, g: torch.Tensor,
                            i: torch.Tensor) -> None:
    torch.ops.aten.embedding_dense_backward.out(g, i, num_weights, padding_idx, scale, out=o)


def embedding_backward_tile_into(num_weights: int, padding_idx: int, scale: bool, o: torch.Tensor, g: torch.Tensor,
                                 i: torch.Tensor) -> None:
    o.add_(torch.ops.aten.embedding_dense_backward(g, i, num_weights, padding_idx, scale))


def _embedding_grad_rows(accumulate: bool) -> Callable[..., tuple[list[int], tuple] | None]:
    """Float32 gradients of an embedding not scaled by frequencies run in C."""
    def rec(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...],
            dtypes: tuple[torch.dtype, ...]) -> tuple[list[int], tuple] | None:
        num_weights, padding_idx, scale = params
        o, g, _ = shapes
        if scale or dtypes[:2] != (torch.float32, torch.float32) or dtypes[2] not in native.INDEX_DTYPES \
                or len(o) != 2 or not g or o[1] != g[-1] or not native.fits_int32(padding_idx):
            return None
        return [native.EMBEDDING_GRAD, native.numel(g[:-1]), g[-1], o[0], padding_idx,
                int(dtypes[2] is torch.int64), int(accumulate)], ()
    return rec


native.TYPED[embedding_backward_tile] = _embedding_grad_rows(False)
native.TYPED[embedding_backward_tile_into] = _embedding_grad_rows(True)


def _lower_embedding_backward(ctx: Lowering, node: OpNode) -> None:
    """One task per tile of the embedding dim; with tiled leading dims (batch, sequence),
    each row tile adds its part into the gradient (a reduction), unless the gradient
    is scaled by frequencies, which counts over all rows: then they are gathered."""
    gn, inn = node.inputs
    num_weights, padding_idx, scale = node.attrs
    lead = range(len(gn.shape) - 1)
    if scale:
        g = ctx.input(gn, ctx.whole(gn, lead))
        i = ctx.input(inn, tuple((s,) for s in inn.shape))
    else:  # the indices (small) follow the gradient's row tiles
        g = ctx.input(gn)
        i = ctx.input(inn, g.tiling[:-1])
    out = ctx.output(node.outputs[0], ctx.whole(node.outputs[0], (0,)))
    write = Kernel(embedding_backward_tile, *node.attrs)
    acc = Kernel(embedding_backward_tile_into, *node.attrs)
    rows = list(itertools.product(*(range(g.grid[d]) for d in lead)))
    nchains = split_chains(ctx, node, len(rows), out.grid[1])
    for j in range(out.grid[1]):
        parts = [(write, acc, [Arg(g, (*r, j), R), Arg(i, r, R)]) for r in rows]
        reduce_into(ctx, out, (0, j), parts, "embedding_dense_backward", nchains)


EMBEDDING_BACKWARD = Op("embedding_dense_backward", _lower_embedding_backward, cost=lambda node: node.inputs[0].numel)


def embedding_backward(g: DataNode, indices: DataNode, num_weights: int, padding_idx: int, scale: bool) -> DataNode:
    """The gradient's rows (all dims of ``g`` but the last) are the indices' (row r of
    ``g`` is the gradient of entry r's lookup): they share axis groups, so a tiling of
    the token ids reaches the gradient, unless both groups carry names of their own
    (two tilings the user chose: the lowering re-tiles the indices to ``g``'s)."""
    if indices.shape == g.shape[:-1]:
        for a, b in zip(g.axes, indices.axes):
            ra, rb = a.root(), b.root()
            if ra is not rb and not (ra.name is not None and rb.name is not None
                                     and not set(ra.names()) & set(rb.names())):
                union(ra, rb)
    d = g.shape[-1]
    axes = (new_group(num_weights), g.axes[-1])
    return record(EMBEDDING_BACKWARD, (g, indices), (num_weights, padding_idx, scale),
                  [((num_weights, d), g.dtype, axes)])[0]
