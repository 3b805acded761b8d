"""Op definitions: each op is a name plus a lowering; record helpers build nodes.

An op definition owns its shape/axis rule (in its record function), its lowering
(tile tasks) and its kernels (thin torch calls on tile views), side by side.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from torch_nntile.graph.axes import AxisGroup, new_group, union
from torch_nntile.graph.nodes import SESSION, DataNode, OpNode
from torch_nntile.kernels import CpuScalar, Kernel, native
from torch_nntile.kernels import typed as _typed  # noqa: F401 - its native.CALLS: comparisons, integer maps, where
from torch_nntile.tiling.tiles import RW, Arg, Lowering, R, TileArray, W


class NotNative(NotImplementedError):
    """A case of an op that nntile does not implement (raised before anything is
    recorded): the ATen table hands the call to the CPU fallback, or names it."""


class Op:
    """A tensor-level op: ``lower(ctx, opnode)`` emits its tile tasks.

    ``cost(opnode)``, where given, estimates the op's arithmetic (multiply-adds);
    lowering uses it to decide where extra parallelism is worth extra work. Ops
    without one count as free next to matrix products.

    For the reuse of lowered steps (``tiling.reuse``): ``binds_kernel`` says that the
    attrs are ``(kernel, name)`` and every task of the op runs that kernel (or copies
    tiles), so the kernel's scalars may change between steps; ``binds_data`` that the
    attrs are a CPU tensor which the op's kernels take as their first parameter.
    """

    __slots__ = ("name", "lower", "_label", "_cost", "binds_kernel", "binds_data")

    def __init__(self, name: str, lower: Callable[[Lowering, OpNode], None],
                 label: Callable[[OpNode], str] | None = None,
                 cost: Callable[[OpNode], float] | None = None, binds_kernel: bool = False,
                 binds_data: bool = False) -> None:
        self.name = name
        self.lower = lower
        self._label = label
        self._cost = cost
        self.binds_kernel = binds_kernel
        self.binds_data = binds_data

    def label(self, node: OpNode) -> str:
        return self._label(node) if self._label is not None else self.name

    def cost(self, node: OpNode) -> float:
        return self._cost(node) if self._cost is not None else 0.0

    def __repr__(self) -> str:
        return f"Op({self.name})"


def record(op: Op, inputs: tuple[DataNode, ...], attrs: Any, outs: list) -> tuple[DataNode, ...]:
    return SESSION.record(op, inputs, attrs, outs)


def broadcast_axes(nodes: list[DataNode]) -> tuple[tuple[int, ...], tuple[AxisGroup, ...]]:
    """Broadcast shapes and merge the groups of non-broadcast dims (right-aligned)."""
    first = nodes[0]
    if all(n.shape == first.shape for n in nodes):
        axes = first.axes
        for n in nodes[1:]:
            if n.axes is not axes:
                for a, b in zip(axes, n.axes):
                    if a is not b:
                        union(a, b)
        return first.shape, axes
    ndim = max(len(n.shape) for n in nodes)
    shape = functools.reduce(torch._C._infer_size, (torch.Size(n.shape) for n in nodes))  # ATen's rule, message
    axes: list[AxisGroup | None] = [None] * ndim
    for n in nodes:
        off = ndim - len(n.shape)
        for d, (s, ax) in enumerate(zip(n.shape, n.axes)):
            if s == shape[off + d]:
                cur = axes[off + d]
                if cur is None:
                    axes[off + d] = ax
                else:
                    union(cur, ax)
    return tuple(shape), tuple(a if a is not None else new_group(s) for a, s in zip(axes, shape))


def by_name(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments by their names in the schema, defaults filled in."""
    out = {}
    for i, a in enumerate(op._schema.arguments):
        if a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif i < len(args):
            out[a.name] = args[i]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def wrap_dim(d: int, ndim: int) -> int:
    """A dim index in ``[0, ndim)``, as PyTorch wraps it (0-dim tensors take 0 and -1)."""
    n = max(ndim, 1)
    if not -n <= d < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {d})")
    return d % n


def wrap_dims(dims: tuple[int, ...], ndim: int) -> tuple[int, ...]:
    """Sorted wrapped dims of a reduction; a repeated dim raises as in PyTorch."""
    out: list[int] = []
    for d in dims:
        w = wrap_dim(d, ndim)
        if w in out:
            raise RuntimeError(f"dim {w} appears multiple times in the list of dims")
        out.append(w)
    return tuple(sorted(out))


def input_index(inp: TileArray, out_idx: tuple[int, ...], out_ndim: int) -> tuple[int, ...]:
    """Tile of a broadcast input that feeds an output tile (right-aligned dims)."""
    off = out_ndim - len(inp.shape)
    return tuple(0 if g == 1 else out_idx[off + d] for d, g in enumerate(inp.grid))


# -- elementwise family: one op, the kernel is data ---------------------------


def elements(node: OpNode) -> list[tuple[tuple[DataNode, ...], tuple[DataNode, ...]]]:
    """Per element of an elementwise op (one for a map, one per list element for a
    ``foreach`` op), its inputs and its results: each element reads equally many
    inputs and writes ``attrs[2]`` results of one shape (one unless given: a fused
    chain that also keeps intermediate values, ``ops.fusion``)."""
    nres = node.attrs[2] if len(node.attrs) > 2 else 1
    outs = node.outputs
    n = len(outs) // nres
    k = len(node.inputs) // n
    return [(node.inputs[e * k:(e + 1) * k], outs[e * nres:(e + 1) * nres]) for e in range(n)]


def _lower_map(ctx: Lowering, node: OpNode) -> None:
    """``fn(out_tile, *more_out_tiles, *input_tiles)`` per output tile of each element,
    its further results (if any) tiled as its first."""
    fn, name = node.attrs[0], node.attrs[1]
    for inputs, results in elements(node):
        ins = [ctx.input(n) for n in inputs]
        out = ctx.output(results[0])
        more = [ctx.output(n, out.tiling) for n in results[1:]]
        if not more and len(out.handles) == 1 and all(len(a.handles) == 1 for a in ins):
            ctx.task_on_first_tiles(fn, out, ins, name)  # untiled: one task, no index work
            continue
        nd = len(out.shape)
        for idx in out.indices():
            args = [Arg(o, idx, W) for o in (out, *more)] + [Arg(a, input_index(a, idx, nd), R) for a in ins]
            ctx.task(fn, args, name)


def kernel_name(node: OpNode) -> str:
    """Label of ops whose attrs are ``(kernel, name)``: the ATen op they stand for."""
    return node.attrs[1]


MAP = Op("map", _lower_map, kernel_name, binds_kernel=True)


TILE = type("TileSlot", (), {"__repr__": lambda self: "TILE"})()
"""Where ``call_out``'s arguments take the task's input tiles, in order."""


def call_out(fn: Callable[..., Any], kw: tuple[tuple[str, Any], ...], args: tuple[Any, ...], o: torch.Tensor,
             *tiles: torch.Tensor) -> None:
    """The kernel of elementwise and whole-value ops: ``fn(*args, **kw, out=o)`` with
    each ``TILE`` in ``args`` an input tile and each ``CpuScalar`` a 0-dim CPU tensor."""
    it = iter(tiles)
    full = [next(it) if a is TILE else a.tensor() if type(a) is CpuScalar else a for a in args]
    fn(*full, **dict(kw), out=o)


def _call_out_program(p: native.Program, params: tuple[Any, ...], refs: list[native.Ref]) -> native.Ref:
    fn, kw, args = params
    it = iter(refs)
    return native.apply_rule(p, fn, [next(it) if a is TILE else a for a in args], dict(kw))


native.TRANSLATORS[call_out] = _call_out_program


def _call_out_typed(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...],
                    dtypes: tuple[torch.dtype, ...]) -> tuple[list[int], tuple[float, ...]] | None:
    fn, kw, args = params
    rec = native.CALLS.get(fn)
    if rec is None:
        return None
    refs = iter(range(1, len(shapes)))
    return rec(tuple(native.Ref(next(refs)) if a is TILE else a for a in args), dict(kw), shapes, dtypes)


native.TYPED[call_out] = _call_out_typed


def map_op(name: str, fn: Kernel, inputs: list[DataNode], dtype: torch.dtype) -> DataNode:
    """Record an elementwise op: kernel ``fn(out_tile, *input_tiles)`` writes out_tile."""
    shape, axes = broadcast_axes(inputs)
    return record(MAP, tuple(inputs), (fn, name), [(shape, dtype, axes)])[0]


FOREACH = Op("foreach", _lower_map, kernel_name, binds_kernel=True)
"""One elementwise op over the elements of tensor lists (a ``_foreach_*`` call): output
``e`` is the map of inputs ``e*k .. e*k+k-1``, all elements running one kernel. A list
of parameters is one graph op, not one per parameter."""


def foreach_op(name: str, fn: Kernel, inputs: list[list[DataNode]], dtype: torch.dtype) -> tuple[DataNode, ...]:
    """Record ``fn`` over each element's (equally many) inputs, as ``map_op`` would one by one."""
    flat: list[DataNode] = []
    outs = []
    for nodes in inputs:
        shape, axes = broadcast_axes(nodes)
        flat.extend(nodes)
        outs.append((shape, dtype, axes))
    return record(FOREACH, tuple(flat), (fn, name), outs)


# -- whole-value ops: one task over the values gathered into single tiles ----------


def _lower_whole(ctx: Lowering, node: OpNode) -> None:
    fn, name = node.attrs
    ins = [ctx.input(n, tuple((s,) for s in n.shape)) for n in node.inputs]
    outs = [ctx.output(n, tuple((s,) for s in n.shape)) for n in node.outputs]  # re-tiled as planned after
    ctx.task(fn, [Arg(o, (0,) * len(o.shape), W) for o in outs] + [Arg(a, (0,) * len(a.shape), R) for a in ins],
             name)


WHOLE = Op("whole", _lower_whole, kernel_name)
"""Ops with no tiled lowering yet: inputs are gathered (counted as re-tiles) and one
task runs the ATen op on them; outputs are then split into their planned tiles."""


def whole_op(name: str, fn: Kernel, inputs: list[DataNode],
             outs: list[tuple[tuple[int, ...], torch.dtype, Any]]) -> tuple[DataNode, ...]:
    """Record ``fn(*out_tiles, *input_tiles)`` over whole values."""
    return record(WHOLE, tuple(inputs), (fn, name), outs)


# -- reductions into one tile --------------------------------------------------


def add_into(acc: torch.Tensor, part: torch.Tensor) -> None:
    acc.add_(part)


def _add_into_typed(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...],
                    dtypes: tuple[torch.dtype, ...]) -> tuple[list[int], tuple[float, ...]] | None:
    """Integer tiles (the partial sums of a tiled integer reduction): a typed map that
    reads the accumulator, buffer 0. Float32 ones are the program below."""
    return native.CALLS[torch.add]((native.Ref(0), native.Ref(1)), {}, shapes, dtypes)


ADD_INTO = Kernel(add_into)
native.TRANSLATORS[add_into] = lambda p, params, refs: p.emit(native.ADD, native.Ref(0), refs[0])
native.TYPED[add_into] = _add_into_typed


LOOKAHEAD = 256  # ops scanned for independent work: bounds compile time on long graphs


def independent_work(ctx: Lowering, node: OpNode, enough: float) -> bool:
    """Whether the ops after ``node`` in this compile that do not depend on it cost
    at least ``enough``: work the other workers can do while it runs."""
    dep = {node}
    free = 0.0
    start = ctx.op_index[node] + 1
    for op in ctx.ops[start:start + LOOKAHEAD]:
        if any(i.op in dep for i in op.inputs):
            dep.add(op)
        else:
            free += op.opdef.cost(op)
            if free >= enough:
                return True
    return False


def split_chains(ctx: Lowering, node: OpNode, n_parts: int, n_out_tiles: int) -> int:
    """How many parallel chains a reduction of ``n_parts`` parts into one tile uses.

    One chain accumulates in place. More chains keep idle workers busy but cost a
    temporary tile and a sum each, so they are used only when neither the op's
    other output tiles nor independent later ops (e.g. the rest of a backward pass
    next to a weight gradient) can keep the workers busy.
    """
    ncpu = ctx.ncpu
    if n_out_tiles >= 2 * ncpu or n_parts < 2 or ncpu < 2:
        return 1
    own = node.opdef.cost(node)
    if own and independent_work(ctx, node, (ncpu - 1) * own):
        return 1
    return min(ncpu, n_parts)


def sum_pairwise(ctx: Lowering, heads: list[tuple[TileArray, tuple[int, ...]]], name: str) -> None:
    """Add the tiles ``heads`` into the first, in pairs: log2(len) rounds of tasks that
    can run side by side."""
    while len(heads) > 1:
        nxt = []
        for i in range(0, len(heads) - 1, 2):
            (a, ai), (b, bi) = heads[i], heads[i + 1]
            ctx.task(ADD_INTO, [Arg(a, ai, RW), Arg(b, bi, R)], name)
            nxt.append((a, ai))
        if len(heads) % 2:
            nxt.append(heads[-1])
        heads = nxt


def _place_sum(ctx: Lowering, out: TileArray, idx: tuple[int, ...], parts: list[tuple[Kernel, Kernel, list[Arg]]]) -> None:
    """Over several ranks: a sum whose parts read tiles of several ranks (a weight's
    gradient over the batch tiles), into a tile no rule owns, lives on the rank with
    the most parts, ties broken in turn (so that the gradients spread over the ranks);
    by default it would follow its first part's rank. Only where the sum runs changes,
    not how it adds."""
    rt = ctx.rt
    h = out.handles[out.flat(idx)]
    if rt.owner_of(h) >= 0:
        return
    count: dict[int, int] = {}
    for _w, _a, args in parts:
        a = args[0]
        o = rt.owner_of(a.arr.handles[a.arr.flat(a.idx)])
        if o >= 0:
            count[o] = count.get(o, 0) + 1
    if len(count) < 2:
        return
    most = max(count.values())
    best = sorted(o for o, n in count.items() if n == most)
    rt.pin_owner(h, best[rt.next_turn() % len(best)])


def reduce_into(
    ctx: Lowering,
    out: TileArray,
    idx: tuple[int, ...],
    parts: list[tuple[Kernel, Kernel, list[Arg]]],
    name: str,
    nchains: int,
    finish: Kernel | None = None,
    started: bool = False,
) -> None:
    """Sum contributions into one output tile.

    Each part is ``(write, accumulate, args)``. The parts are dealt round-robin
    into ``nchains`` chains (see ``split_chains``), so that parts whose inputs are
    ready together (e.g. the batch tiles of a gradient) start together: the first
    chain accumulates in the output tile, the others in temporary tiles; chains run
    in parallel and are summed pairwise at the end. With ``started`` the output tile
    already holds a value (a bias) that the first chain accumulates onto.
    """
    nchains = max(1, min(nchains, len(parts)))
    if ctx.world > 1:
        _place_sum(ctx, out, idx, parts)
    shape = out.tile_shape(idx)
    zero = (0,) * len(shape)
    heads: list[tuple[TileArray, tuple[int, ...]]] = [(out, idx)]
    for _ in range(1, nchains):
        heads.append((ctx.temp(shape, out.dtype), zero))
    for c, (arr, aidx) in enumerate(heads):
        chain = parts[c::nchains]  # never empty: nchains <= len(parts)
        for j, (write, acc, args) in enumerate(chain):
            first = j == 0 and not (started and c == 0)
            ctx.task(write if first else acc, [Arg(arr, aidx, W if first else RW), *args], name)
    sum_pairwise(ctx, heads, name)
    if finish is not None:
        ctx.task(finish, [Arg(out, idx, RW)], name)
