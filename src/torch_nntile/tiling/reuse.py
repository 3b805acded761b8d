"""Reuse of lowered steps: a compile with the structure of an earlier one takes that
compile's tile tasks again, bound to new tiles, instead of being lowered.

``Structure`` is the key, ``Template`` a lowered compile with tiles as slots and
kernels as recipes, ``StepCache`` the templates of one runtime.
``TORCH_NNTILE_CHECK_REUSE=1`` lowers every reused compile again and compares. See
docs/architecture/kernels.md (reuse of lowered steps).
"""

from __future__ import annotations

import collections
import enum
import os
import types
from typing import Any

import torch

from torch_nntile import stats
from torch_nntile.graph.axes import describe, distribution_version
from torch_nntile.graph.nodes import OpNode
from torch_nntile.kernels import CpuScalar, Gemm, Kernel, Marker, PackB
from torch_nntile.tiling import _structure  # type: ignore[attr-defined]
from torch_nntile.tiling.tiles import Given, Held, Lowering, TileArray

MAX_TEMPLATES = 32  # structures kept (least recently used dropped): a loop has a few compiles a step
MAX_SEEN = 1024  # structures seen once (a template is made the second time)


class Uncacheable(Exception):
    """This compile is lowered every time (its structure is not plain data)."""


# -- the key ---------------------------------------------------------------------------

_PLAIN = (int, str, type(None), torch.dtype, types.FunctionType, types.BuiltinFunctionType, type, Gemm, PackB,
          torch._ops.OpOverload, torch._ops.OpOverloadPacket, torch.device, torch.memory_format, torch.layout)


def _attr_key(x: Any) -> Any:
    """A hashable image of an attribute that tells apart every value lowering could
    treat differently (``1``, ``1.0``, ``True``, ``0.0`` and ``-0.0`` differ)."""
    t = type(x)
    if t is tuple:
        for y in x:
            if type(y) is not int:
                return tuple([_attr_key(y) for y in x])
        return x  # ints only (dims, sizes): the common case, as it is
    if t in _PLAIN:
        return x
    if t is Kernel:
        return (Kernel, x.fn, _attr_key(x.params))
    if t is float:
        return (float, x.hex())
    if t is bool:
        return (bool, x)
    if t is CpuScalar:
        return (CpuScalar, x.dtype, _attr_key(x.value))
    if isinstance(x, Marker):  # a task's input tile (Slot), a split dim's extent (ops.batched.Extent)
        return x
    if t is list:
        return (list, tuple([_attr_key(y) for y in x]))
    if isinstance(x, enum.Enum) or getattr(x, "__module__", "").startswith("torch_nntile.") and (
            t.__hash__ is object.__hash__ and t.__eq__ is object.__eq__):
        return x  # singletons compared by identity (a Reduction, the TILE slot marker)
    if t is complex:
        return (complex, x.real.hex(), x.imag.hex())
    raise Uncacheable(t.__name__)


def _op_attrs(op: OpNode) -> Any:
    d = op.opdef
    a = op.attrs
    if d.binds_kernel:  # attrs = (kernel, name): the tasks run the new op's kernel, whatever it holds
        return a[1]
    if d.binds_data and type(a) is torch.Tensor:  # ingress: a contiguous CPU copy
        return (torch.Tensor, tuple(a.shape), a.dtype)
    return _attr_key(a)


class Key:
    """A structure's parts, hashed once (a dict lookup and the seen-set both need it)."""

    __slots__ = ("parts", "hash")

    def __init__(self, parts: tuple[Any, ...]) -> None:
        self.parts, self.hash = parts, hash(parts)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return type(other) is Key and other.hash == self.hash and other.parts == self.parts


class Structure:
    """The key of a compile's ops, and what binding a template to them needs: the
    values read from before the compile (``nodes``, their tiles ``values``) and which
    tile handle of theirs is which slot (``slot_of``). Holding those nodes is safe:
    reference counts are read for the compile's own outputs only."""

    __slots__ = ("key", "nodes", "values", "slot_of")

    def __init__(self, ops: list[OpNode], ctx: Lowering) -> None:
        self.nodes: list[Any] = []
        self.values: list[TileArray] = []
        self.slot_of: dict[Any, int] = {}
        parts: list[Any] = [ctx.ncpu, ctx.world, distribution_version() if ctx.world > 1 else 0]
        _structure.parts(ops, parts, _op_attrs, _attr_key, ctx.plan_tiling, ctx.planned,
                         (self.nodes, self.values, self.slot_of, Uncacheable))
        self.key = Key(tuple(parts))


# -- kernels as recipes ----------------------------------------------------------------

class _Hole:
    """In a recipe: the kernel (``part`` 0) or the attributes (``part`` 1) of op ``i``,
    the template's hole number ``j``."""

    __slots__ = ("i", "part", "j")

    def __init__(self, i: int, part: int, j: int) -> None:
        self.i, self.part, self.j = i, part, j

    def __eq__(self, other: object) -> bool:
        return type(other) is _Hole and (other.i, other.part, other.j) == (self.i, self.part, self.j)

    def value(self, ops: list[OpNode]) -> Any:
        a = ops[self.i].attrs
        return a[0] if self.part == 0 else a


def _recipe(x: Any, holes: dict[int, _Hole]) -> Any:
    """``x`` with the objects that come from bound ops replaced by holes (``x`` itself
    where there are none)."""
    h = holes.get(id(x))
    if h is not None:
        return h
    t = type(x)
    if t is Kernel:
        params = _recipe(x.params, holes)
        return x if params is x.params else _KernelRecipe(x.fn, params)
    if t is tuple:
        items = [_recipe(y, holes) for y in x]
        at = tuple(i for i, (a, b) in enumerate(zip(items, x)) if a is not b)
        return _TupleRecipe(x, at, tuple(items[i] for i in at)) if at else x
    return x


class _KernelRecipe:
    __slots__ = ("fn", "params")

    def __init__(self, fn: Any, params: Any) -> None:
        self.fn, self.params = fn, params

    def __eq__(self, other: object) -> bool:
        return type(other) is _KernelRecipe and other.fn is self.fn and other.params == self.params


class _TupleRecipe:
    """A tuple whose items at ``at`` are recipes (``parts``); the others are ``items``'."""

    __slots__ = ("items", "at", "parts")

    def __init__(self, items: tuple[Any, ...], at: tuple[int, ...], parts: tuple[Any, ...]) -> None:
        self.items, self.at, self.parts = items, at, parts

    def __eq__(self, other: object) -> bool:
        return (type(other) is _TupleRecipe and other.at == self.at and other.parts == self.parts
                and all(a is b or a == b for i, (a, b) in enumerate(zip(other.items, self.items)) if i not in self.at))


def _cook(r: Any, values: list[Any]) -> Any:
    """Recipe ``r`` made with the holes' ``values``."""
    t = type(r)
    if t is _Hole:
        return values[r.j]
    if t is _KernelRecipe:
        return Kernel(r.fn, *_cook(r.params, values))
    if t is _TupleRecipe:
        out = list(r.items)
        for i, p in zip(r.at, r.parts):
            out[i] = _cook(p, values)
        return tuple(out)
    return r


def _holes_in(r: Any) -> frozenset[int]:
    """The numbers of the holes recipe ``r`` takes values from."""
    t = type(r)
    if t is _Hole:
        return frozenset((r.j,))
    if t is _KernelRecipe:
        return _holes_in(r.params)
    if t is _TupleRecipe:
        return frozenset().union(*map(_holes_in, r.parts))
    return frozenset()


def _unchanged(a: Any, b: Any, part: int) -> bool:
    """Whether a hole's new value ``a`` makes the same kernels as ``b`` did (a CPU
    tensor's, part 1, only when it is the same tensor)."""
    return a is b or part == 0 and a == b


def _has_scalar(x: Any) -> bool:
    """Whether kernel data holds a float, a CPU scalar or a tensor (a value a new op may change)."""
    t = type(x)
    if t is Kernel:
        return _has_scalar(x.params)
    if t is tuple or t is list:
        return any(_has_scalar(y) for y in x)
    return t is float or t is CpuScalar or t is torch.Tensor or t is complex


# -- templates -------------------------------------------------------------------------


class Template:
    """A lowered compile with its tiles as slots and its kernels as recipes."""

    __slots__ = ("kernels", "holes", "deps", "same", "cooked", "tasks", "fresh", "fresh_by_size", "arrays", "temps",
                 "retiles", "nslots", "batch", "users", "key")

    kernels: tuple[Any, ...]  # recipes
    holes: tuple[_Hole, ...]  # where the recipes' values come from, by number
    deps: tuple[frozenset[int], ...]  # per recipe, the holes it takes
    same: tuple[tuple[_Hole, _Hole], ...]  # holes that were one object (one hole stands for both in the recipes)
    cooked: tuple[list[Any], list[Any]] | None  # the holes' values and the kernels made of them, last binding
    tasks: tuple[tuple[int, tuple[int, ...], list[int], list[Any], str], ...]  # kernel, slots, modes, specs, name
    fresh: tuple[tuple[int, ...], ...]  # per new slot, (items, item size), and over several ranks its owner
    fresh_by_size: tuple[tuple[tuple[int, ...], tuple[int, ...], list[int]], ...]  # (item size[, owner]), slots, items
    arrays: tuple[tuple[Any, ...], ...]  # shape, dtype, tiling, own slots | None, base, order, (op, output), label
    temps: tuple[int, ...]  # new slots no value keeps: released once the tasks were submitted
    retiles: tuple[tuple[str, tuple[int, int], int], ...]  # re-tilings counted: op, (op, output) re-tiled, dim
    nslots: int
    batch: tuple[Any, list[Any]] | None  # what StarPU was last sent for these tasks (Runtime.prepare), and its kernels
    users: list[list[int]] | None  # per kernel, the tasks that run it (made when first needed)
    key: Key  # its key in StepCache.templates: found by identity there, not by comparing all its parts again

    def tasks_of(self, k: int) -> list[int]:
        if self.users is None:
            self.users = [[] for _ in self.kernels]
            for i, task in enumerate(self.tasks):
                self.users[task[0]].append(i)
        return self.users[k]

    def signature(self) -> tuple[Any, ...]:
        return self.kernels, self.tasks, self.fresh, self.arrays, self.temps, self.retiles, self.nslots


def build(ctx: Lowering, pre: list[OpNode], st: Structure) -> Template:
    """The template of a compile just lowered (before ``ctx.commit``), ``pre`` its ops
    before fusion."""
    if ctx.failed:
        raise Uncacheable("an op failed to lower")
    holes: dict[int, _Hole] = {}
    same: list[tuple[_Hole, _Hole]] = []
    where: dict[int, tuple[int, int]] = {}  # id(node) -> (op, output) in ``pre``
    for i, op in enumerate(pre):
        d = op.opdef
        part = 0 if d.binds_kernel else 1 if d.binds_data and type(op.attrs) is torch.Tensor else -1
        if part >= 0:
            key = id(op.attrs[0] if part == 0 else op.attrs)
            first = holes.get(key)
            if first is None:
                holes[key] = _Hole(i, part, len(holes))
            else:  # ops sharing a kernel (one hole stands for both): bound again only while they still share one
                same.append((first, _Hole(i, part, -1)))
        for j, n in enumerate(op.outputs):
            where[id(n)] = (i, j)
    # tasks: kernels as recipes (one per kernel object), handles as slots
    slot_of = dict(st.slot_of)
    n_ext = len(slot_of)
    rt = ctx.rt
    fresh: list[tuple[int, ...]] = []  # per new slot: rt.reuse_key

    def slot(h: Any) -> int:
        s = slot_of.get(h)
        if s is None:
            size = rt.reuse_key(h)
            if size is None:
                raise Uncacheable("a tile got no memory")
            s = slot_of[h] = len(slot_of)
            fresh.append(size)
        return s

    kernel_slot: dict[int, int] = {}
    kernels: list[Any] = []
    marks = ctx.marks
    ends = [m for _, m in marks[1:]] + [len(ctx.tasks)]
    tasks = []
    for (op, start), end in zip(marks, ends):
        loose = op.opdef.binds_kernel or op.opdef.binds_data
        for fn, handles, modes, specs, name in ctx.tasks[start:end]:
            k = kernel_slot.get(id(fn))
            if k is None:
                r = _recipe(fn, holes)
                if r is fn and loose and _has_scalar(fn):  # a scalar the key left out, in a kernel no recipe rebuilds
                    raise Uncacheable(f"a kernel of {op.label} holds its op's scalars")
                k = kernel_slot[id(fn)] = len(kernels)
                kernels.append(r)
            tasks.append((k, tuple([slot(h) for h in handles]), modes, specs, name))
    # values left behind, and the arrays they need (view bases first)
    index: dict[int, int] = {id(a): ~k for k, a in enumerate(st.values)}
    arrays: list[list[Any]] = []
    owned: set[int] = set()

    def array(arr: TileArray, at: tuple[int, int] | None, label: str | None) -> int:
        a = index.get(id(arr))
        if a is not None:
            if at is None:
                return a
            if a < 0 or arrays[a][6] is not None:
                raise Uncacheable("one array for two values")
            arrays[a][6:] = [at, label]
            return a
        if arr.base is None:
            tiles = tuple([slot(h) for h in arr.handles])
            owned.update(tiles)
            spec = [arr.shape, arr.dtype, arr.tiling, tiles, None, None]
        else:
            b = array(arr.base, None, None)
            pos = {h: f for f, h in enumerate(arr.base.handles)}
            spec = [arr.shape, arr.dtype, arr.tiling, None, b, [pos[h] for h in arr.handles]]
        index[id(arr)] = len(arrays)
        arrays.append([*spec, at, label])
        return len(arrays) - 1

    ext = {id(n): (~k, 0) for k, n in enumerate(st.nodes)}  # a value from before (re-tiled for good)
    dying = {id(n) for dead in ctx.dying.values() for n in dead}
    for node, arr in ctx.values.items():
        if id(node) in dying:
            continue
        at = where.get(id(node)) or ext.get(id(node))
        if at is None:
            raise Uncacheable("a value of no op")
        array(arr, at, node.op.label if node.op is not None else None)
    t = Template()
    t.kernels = tuple(kernels)
    t.holes = tuple(holes.values())
    t.deps = tuple(_holes_in(r) for r in kernels)
    t.same = tuple(same)
    t.cooked = None
    t.tasks = tuple(tasks)
    t.fresh = tuple(fresh)
    by_size: dict[tuple[int, ...], list[int]] = {}
    for k, key in enumerate(fresh):
        by_size.setdefault(key[1:], []).append(k)  # item size, and over several ranks the owner
    t.fresh_by_size = tuple((rest, tuple(ks), [fresh[k][0] for k in ks]) for rest, ks in by_size.items())
    t.arrays = tuple(tuple(a) for a in arrays)
    t.temps = tuple(s for s in range(n_ext, len(slot_of)) if s not in owned)
    try:
        t.retiles = tuple((op, where.get(id(n)) or ext[id(n)], d) for op, n, d in ctx.retiles)
    except KeyError:
        raise Uncacheable("a re-tiled value of no op") from None
    t.nslots = len(slot_of)
    t.batch = t.users = None
    return t


def instantiate(t: Template, ctx: Lowering, ops: list[OpNode], st: Structure) -> None:
    """Fill ``ctx`` with ``t``'s tasks on new tiles and commit the values ``ops`` leave."""
    rt = ctx.rt
    slots: list[Any] = [None] * t.nslots
    for h, s in st.slot_of.items():
        slots[s] = h
    n_ext = len(st.slot_of)
    for rest, ks, sizes in t.fresh_by_size:
        owners = [rest[1]] * len(sizes) if len(rest) > 1 else None
        for k, h in zip(ks, rt.register_many(sizes, rest[0], owners)):
            slots[n_ext + k] = h
    keep = ctx.keep
    keep.extend(st.values)
    made: list[TileArray] = []
    for shape, dtype, tiling, tiles, base, order, _, _ in t.arrays:
        if tiles is not None:
            arr = TileArray(rt, shape, dtype, tiling, source=Given([slots[s] for s in tiles]))
        else:
            arr = TileArray(rt, shape, dtype, tiling, made[base] if base >= 0 else st.values[~base], order)
        made.append(arr)
    keep.extend(made)
    if t.temps:
        keep.append(Held(rt, [slots[s] for s in t.temps], counted=True))
    kernels = _kernels(t, ops)
    ctx.tasks = [(kernels[k], [slots[s] for s in hs], modes, specs, name) for k, hs, modes, specs, name in t.tasks]
    ctx.reused = Bound(t, kernels)
    for op, at, d in t.retiles:  # counted under the new values' axis groups
        stats.RETILES[(op, describe(_node(at, ops, st).axes[d]))] += 1
    labels = ctx.labels
    for arr, (*_, at, label) in zip(made, t.arrays):
        if at is not None:
            _node(at, ops, st).value = arr
            if label is not None:
                labels[id(arr)] = label


def _kernels(t: Template, ops: list[OpNode]) -> list[Any]:
    """The template's kernels for ``ops``: those whose holes hold the values of the last
    binding (equal kernels) are that binding's objects, so that ``Bound.submit`` knows
    them unchanged by identity; the others are made anew."""
    values = [h.value(ops) for h in t.holes]
    last = t.cooked
    if last is None:
        kernels = [_cook(r, values) for r in t.kernels]
    else:
        old_values, kernels = last
        holes = t.holes
        dirty = {j for j, (a, b) in enumerate(zip(values, old_values)) if not _unchanged(a, b, holes[j].part)}
        kernels = list(kernels)
        if dirty:
            for k, deps in enumerate(t.deps):
                if deps and not dirty.isdisjoint(deps):
                    kernels[k] = _cook(t.kernels[k], values)
    t.cooked = (values, kernels)
    return kernels


def _node(at: tuple[int, int], ops: list[OpNode], st: Structure) -> Any:
    """The value a template names: output ``j`` of op ``i``, or (``i < 0``) value ``~i``
    from before the compile."""
    i, j = at
    return ops[i].outputs[j] if i >= 0 else st.nodes[~i]


class Bound:
    """A template's tasks bound to one compile's tiles and kernels: submitted with the
    batch prepared for the template's last binding, its tasks whose kernels changed
    given the new ones (``Runtime.rebind``: new constants of the same C programs, new
    Python callables), else prepared anew (``Runtime.prepare``)."""

    __slots__ = ("template", "kernels")

    def __init__(self, template: Template, kernels: list[Any]) -> None:
        self.template, self.kernels = template, kernels

    def submit(self, rt: Any, tasks: list[Any]) -> None:
        if rt.skip_starpu:  # a dry run prepares nothing
            rt.submit(tasks)
            return
        t = self.template
        last = t.batch
        if last is not None:
            changed = [k for k, (a, b) in enumerate(zip(self.kernels, last[1])) if a is not b and a != b]
            if changed:
                if rt.rebind(last[0], tasks, (i for k in changed for i in t.tasks_of(k))):
                    t.batch = last = (last[0], self.kernels)
                else:
                    last = None
        if last is None:
            last = t.batch = (rt.prepare(tasks), self.kernels)
        rt.submit_batch(last[0], [h for task in tasks for h in task[1]])


def _difference(old: Template, new: Template) -> str:
    """Where two templates of one structure differ, for the check's error."""
    for i, (a, b) in enumerate(zip(old.tasks, new.tasks)):
        if a != b or old.kernels[a[0]] != new.kernels[b[0]]:
            return f"task {i} ({b[4]}): {old.kernels[a[0]]!r} on {a[1:4]}, now {new.kernels[b[0]]!r} on {b[1:4]}"
    for name in Template.__slots__:
        if getattr(old, name) != getattr(new, name):
            return f"{name}: {getattr(old, name)!r}, now {getattr(new, name)!r}"
    return "?"


class StepCache:
    """Templates by structure, for one runtime (``graph.nodes.Reuse``); counts in
    ``stats.COUNTS``: ``compiles_reused``, ``compiles_lowered`` and, in check mode,
    ``compiles_checked`` (lowered, and found to match their template)."""

    def __init__(self) -> None:
        self.templates: collections.OrderedDict[Any, Template] = collections.OrderedDict()
        self.seen: set[int] = set()  # hashes of structures seen once (a collision only makes a template early)
        self.check = stats.env_flag("TORCH_NNTILE_CHECK_REUSE")
        self.enabled = stats.env_flag("TORCH_NNTILE_REUSE") or "TORCH_NNTILE_REUSE" not in os.environ
        self._learn: Structure | None = None  # the structure of the compile being lowered, to learn from
        self._checking: Template | None = None  # the template that compile must match (check mode)

    def reuse(self, ctx: Lowering, ops: list[OpNode]) -> bool:
        """Bind ``ops`` to the template of their structure, if there is one (True)."""
        self._learn = None
        if not self.enabled or not ops or not ctx.reuses_memory:
            return False
        t0 = stats.enter()
        try:
            try:
                st = Structure(ops, ctx)
            except Uncacheable:
                return False
            t = self.templates.get(st.key)
            if t is None:
                h = st.key.hash
                if h in self.seen:
                    self._learn = st
                else:
                    if len(self.seen) >= MAX_SEEN:
                        self.seen.clear()
                    self.seen.add(h)
                return False
            self.templates.move_to_end(t.key)
            if any(a.value(ops) is not b.value(ops) for a, b in t.same):  # the recipes cannot tell them apart now
                self._learn = st
                return False
            if self.check:
                self._learn = st
                self._checking = t
                return False
            instantiate(t, ctx, ops, st)
            stats.COUNTS["compiles_reused"] += 1
            return True
        finally:
            stats.leave("compile.reuse", t0)

    def learn(self, ctx: Lowering, pre: list[OpNode]) -> None:
        """``ctx`` holds the lowering of ``pre`` (not committed): keep its template if
        its structure was seen before."""
        stats.COUNTS["compiles_lowered"] += 1
        st, self._learn = self._learn, None
        checking, self._checking = self._checking, None
        if st is None:
            return
        t0 = stats.enter()
        try:
            try:
                t = build(ctx, pre, st)
            except Uncacheable:
                self.seen.discard(st.key.hash)
                return
            if checking is not None:
                if t.signature() != checking.signature():
                    raise RuntimeError("torch_nntile internal error: a compile with the structure of an earlier one "
                                       f"lowered to other tasks (TORCH_NNTILE_CHECK_REUSE): {_difference(checking, t)}")
                stats.COUNTS["compiles_checked"] += 1
                return
            self.seen.discard(st.key.hash)
            t.key = st.key
            self.templates[st.key] = t
            if len(self.templates) > MAX_TEMPLATES:
                self.templates.popitem(last=False)
        finally:
            stats.leave("compile.reuse", t0)
