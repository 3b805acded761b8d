"""Tile grids and the lowering context that turns tensor ops into tile tasks.

A ``TileArray`` is the lowered value of one data node: per dimension a tuple of
tile sizes, and one StarPU handle per tile (flat, C order over the grid). The
``Lowering`` context collects tasks; nothing reaches StarPU until ``run()``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from torch_nntile import stats
from torch_nntile.graph.axes import describe, tiling_of
from torch_nntile.kernels import KERNEL_TYPES, Kernel, KernelData, native
from torch_nntile.runtime.context import Runtime
from torch_nntile.runtime.interrupts import in_finalizer, install, interrupt_later
from torch_nntile.runtime.submission import RW, R, TileSpec, W
from torch_nntile.tiling.distribution import tile_owners

Tiling = tuple[tuple[int, ...], ...]
REUSE_DISTANCE = 8
"""Tasks lowered after a value's last reader before its tiles' handles go to a new
value of the same compile. StarPU orders a handle's tasks by submission, so a new
value written at once into a handle just freed would wait for the old value's last
reader: independent branches of a graph (the two products of a linear layer's
backward, the chains of separate tiles) would run one after the other."""


def offsets(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """Start offsets of tiles with the given sizes: (3, 3, 2) -> (0, 3, 6)."""
    out, acc = [], 0
    for s in sizes:
        out.append(acc)
        acc += s
    return tuple(out)


_LAYOUTS: dict[tuple[Tiling, torch.dtype], tuple[tuple[int, ...], tuple[tuple[int, ...], ...], list[TileSpec],
                                                   list[int]]] = {}


def _layout(tiling: Tiling, dtype: torch.dtype) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...],
                                                        list[TileSpec], list[int]]:
    """Grid, tile offsets, tile specs and sizes of a tiling: shared by every array of it."""
    item = dtype.itemsize
    shapes = list(itertools.product(*tiling)) if tiling else [()]
    sizes = [math.prod(ts) for ts in shapes]
    specs: list[TileSpec] = [(n * item, dtype, ts) for n, ts in zip(sizes, shapes)]  # per flat index
    out = (tuple(len(t) for t in tiling), tuple(offsets(t) for t in tiling), specs, sizes)
    if len(_LAYOUTS) > 10_000:
        _LAYOUTS.clear()
    _LAYOUTS[(tiling, dtype)] = out
    return out


class TileArray:
    """The tiles of one value; its handles go back to the runtime's spares when it dies.

    A view (``base`` set) reads another array's tiles under other shapes: it owns no
    handles and keeps its base alive."""

    __slots__ = ("shape", "dtype", "tiling", "grid", "handles", "specs", "offs", "rt", "base", "__weakref__")

    def __init__(self, rt: Runtime, shape: tuple[int, ...], dtype: torch.dtype, tiling: Tiling,
                 base: TileArray | None = None, order: list[int] | None = None, source: Any = None,
                 owners: list[int] | None = None) -> None:
        self.rt = rt
        self.shape = shape
        self.dtype = dtype
        self.tiling = tiling
        self.base = base
        layout = _LAYOUTS.get((tiling, dtype))
        if layout is None:
            layout = _layout(tiling, dtype)
        self.grid, self.offs, self.specs, sizes = layout
        if base is None:  # ``source``: where handles come from, if not the runtime (``Lowering.register_many``)
            src = source or rt  # ``owners``: over several ranks, each tile's (tiling/distribution.py)
            self.handles = src.register_many(sizes, dtype.itemsize) if owners is None else \
                src.register_many(sizes, dtype.itemsize, owners)
        else:  # tile k is the base's tile order[k], the same bytes in another shape
            self.handles = [base.handles[f] for f in order]

    def indices(self) -> Iterator[tuple[int, ...]]:
        return itertools.product(*(range(g) for g in self.grid))

    def flat(self, idx: tuple[int, ...]) -> int:
        f = 0
        for i, g in zip(idx, self.grid):
            f = f * g + i
        return f

    def tile_shape(self, idx: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(t[i] for t, i in zip(self.tiling, idx))

    def slices(self, idx: tuple[int, ...]) -> tuple[slice, ...]:
        return tuple(slice(o[i], o[i] + t[i]) for o, t, i in zip(self.offs, self.tiling, idx))

    def __del__(self) -> None:
        if self.base is not None:
            return
        try:
            self.rt.release(self.handles)
        except KeyboardInterrupt:  # raised by a SIGINT handler other than ours (see interrupts)
            interrupt_later()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _check_kernel(fn: Any, name: str) -> None:
    if type(fn) not in KERNEL_TYPES:
        raise TypeError(f"tile kernel of {name} is a {type(fn).__name__}: kernels are Kernel, Gemm or PackB data")


class Arg:
    """One tile operand of a task: which tile and how it is accessed."""

    __slots__ = ("arr", "idx", "mode")

    def __init__(self, arr: TileArray, idx: tuple[int, ...], mode: int) -> None:
        self.arr, self.idx, self.mode = arr, idx, mode


class PlanHandles:
    """Stands in for the runtime when tasks are only planned (graph dumps): handles
    are plain tokens, nothing is registered with StarPU or counted as a live tile."""

    def __init__(self, rt: Runtime) -> None:
        self.ncpu = rt.ncpu
        self.pack_size = rt.pack_size
        self._tokens = itertools.count()

    def register_many(self, sizes: list[int], elemsize: int, owners: list[int] | None = None) -> list[int]:
        return [next(self._tokens) for _ in sizes]

    def release(self, handles: list[Any]) -> None:
        pass


class Given:
    """A source of handles for ``TileArray`` (its ``source``): the ones already chosen for
    the new array (a reused lowered step's, a replayed step's)."""

    __slots__ = ("handles",)

    def __init__(self, handles: list[Any]) -> None:
        self.handles = handles

    def register_many(self, sizes: list[int], elemsize: int, owners: list[int] | None = None) -> list[Any]:
        return self.handles


class Held:
    """Handles the tasks of a compile use that no value keeps: released (as a dead
    tile's are) once those tasks were submitted. ``counted``: still counted as live
    tiles (else they were counted out when their value died inside the compile)."""

    __slots__ = ("rt", "handles", "counted")

    def __init__(self, rt: Runtime, handles: list[Any], counted: bool = False) -> None:
        self.rt, self.handles, self.counted = rt, handles, counted

    def __del__(self) -> None:  # as TileArray's (see interrupts)
        try:
            if not self.counted:
                stats.tiles_added(len(self.handles))  # release counts them out
            self.rt.release(self.handles)
        except KeyboardInterrupt:
            interrupt_later()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


in_finalizer(TileArray.__del__.__code__, Held.__del__.__code__)
install()


class Lowering:
    """Collects tile tasks for one compile; values are committed at the end.

    Memory is reused within a compile, as eager PyTorch frees a temporary once its
    last reader ran: a value made in this compile that nothing outside it holds gives
    its tiles' handles, REUSE_DISTANCE tasks after its last reader, to the values
    lowered after that. StarPU runs a handle's tasks in submission order, so the new
    value's first write waits for the old value's last read.
    """

    def __init__(self, rt: Runtime | PlanHandles) -> None:
        self.rt = rt
        self.tasks: list[tuple[KernelData, list[Any], list[int], list[TileSpec], str]] = []
        self.values: dict[Any, TileArray] = {}  # node -> value produced in this compile
        self.keep: list[TileArray] = []  # every array a task uses stays registered until submitted
        self.planned: dict[Any, tuple[int, ...]] = {}  # root group -> tile sizes, as planned so far
        self._node_tilings: dict[Any, Tiling] = {}
        self.labels: dict[int, str] = {}  # id(array) -> label of the op that produced it (for dumps)
        self.ncpu = rt.ncpu
        self.ops: list[Any] = []  # the ops of this compile, in record order
        self.op: Any = None  # the op being lowered
        self.op_index: dict[Any, int] = {}
        # not when only planning (dumps): tiles stay distinct there; nor over several ranks (a handle holds one value)
        self.reuses_memory = isinstance(rt, Runtime) and not rt.distributed
        self.world = rt.world_size if isinstance(rt, Runtime) else 1  # ranks the tiles of a value spread over
        self.dying: dict[int, list[Any]] = {}  # op index -> the nodes that die after it
        self._viewed: set[int] = set()  # id(array) of arrays other arrays view: never given away
        # (items, item size) -> (handle, len(tasks) when its value died), free for reuse
        self._pool: dict[tuple[int, int], list[tuple[Any, int]]] = {}
        self.marks: list[tuple[Any, int]] = []  # each op lowered, with the index of its first task
        self.failed = False  # an op's lowering raised (its tasks raise the error instead)
        self.reused: Any = None  # the lowered step (``tiling.reuse.Bound``) these tasks were bound from, if any
        self.retiles: list[tuple[str, Any, int]] = []  # (op, node, dim) of each count this compile added to stats.RETILES

    # -- planning ---------------------------------------------------------
    def tiling(self, node: Any) -> Tiling:
        """The tiling of a node, from the tilings of its axis groups."""
        done = self._node_tilings.get(node)
        if done is None:
            done = self._node_tilings[node] = self.plan_tiling(node)
        return done

    def plan_tiling(self, node: Any) -> Tiling:
        """``tiling`` without remembering the node (which would count as a reference to it)."""
        out = []
        for ax in node.axes:
            r = ax.root()
            t = self.planned.get(r)
            if t is None:
                t = tiling_of(r, self.planned)
            out.append(t)
        return tuple(out)

    def plan(self, ops: list[Any], dying: dict[int, list[Any]] | None = None) -> None:
        """Resolve the tiling of every value the ops touch (errors name the group).
        ``dying``: op index -> the values made here that nothing reads after that op
        (``graph.nodes.deaths``); their tiles are reused (see the class docstring)."""
        self.ops = ops
        self.op_index = {op: i for i, op in enumerate(ops)}
        if self.reuses_memory and dying:
            self.dying = dying
        tiling = self.tiling
        for op in ops:
            for n in op.inputs:
                tiling(n)
            for n in op.outputs:
                tiling(n)

    def register_many(self, sizes: list[int], elemsize: int, owners: list[int] | None = None) -> list[Any]:
        """Handles for a new array: dead values' of this compile where there are (dead
        for REUSE_DISTANCE tasks at least), else the runtime's (over several ranks, where
        nothing is given away, owned as ``owners`` says)."""
        pool = self._pool
        if not pool:
            return self.rt.register_many(sizes, elemsize, owners)
        out = []
        ripe = len(self.tasks) - REUSE_DISTANCE
        for n in sizes:
            free = pool.get((max(n, 1), elemsize))
            if free and free[0][1] <= ripe:
                out.append(free.pop(0)[0])  # the longest dead: its readers are the likeliest done
                stats.tiles_added(1)
            else:
                out.extend(self.rt.register_many([n], elemsize))
        return out

    def _give_away(self, node: Any) -> None:
        """A value died: its tiles' handles go to the pool (not a view's, not a viewed
        array's, not those that got no memory)."""
        arr = self.values.get(node)
        if arr is None or arr.base is not None or id(arr) in self._viewed or not arr.handles:
            return
        keep, pool, key_of, now = [], self._pool, self.rt.reuse_key, len(self.tasks)
        for h in arr.handles:
            key = key_of(h)
            if key is None:
                keep.append(h)
            else:
                pool.setdefault(key, []).append((h, now))
        stats.tiles_added(len(keep) - len(arr.handles))
        arr.handles = keep

    def whole(self, node: Any, dims: Iterable[int]) -> Tiling:
        """The planned tiling of ``node`` with ``dims`` in one tile each: what an op
        that needs those dims whole asks for (inputs are re-tiled to it)."""
        planned = self.tiling(node)
        dims = set(dims)
        return tuple((s,) if d in dims else t for d, (s, t) in enumerate(zip(node.shape, planned)))

    # -- lowering one op ----------------------------------------------------
    def lower(self, op: Any) -> None:
        """Emit ``op``'s tasks, leaving its outputs in their planned tilings.

        An op may write an output in another tiling (``output(node, tiling)``); it is
        re-tiled here. An op whose lowering fails gets tasks that raise its error
        instead, so the values depending on it raise when read and the rest runs.
        """
        mark = len(self.tasks)
        self.marks.append((op, mark))
        self.op = op
        try:
            op.opdef.lower(self, op)
        except Exception as exc:  # noqa: BLE001 - a bug in one op must not stall the graph
            del self.tasks[mark:]
            self._fail(op, exc)
        for node in op.outputs:
            arr = self.values[node]
            want = self.tiling(node)
            if arr.tiling != want:
                self._count_retile(node, arr.tiling, want)
                self.values[node] = self.retile(arr, want)
        dead = self.dying.get(self.op_index.get(op, -1)) if self.dying else None
        if dead:
            for node in dead:
                self._give_away(node)

    def _fail(self, op: Any, exc: Exception) -> None:
        self.failed = True
        err = RuntimeError(f"lowering {op.label} failed: {type(exc).__name__}: {exc}")
        err.__cause__ = exc
        for node in op.outputs:
            arr = self.output(node)
            for idx in arr.indices():
                self.task(Kernel(_raise, err), [Arg(arr, idx, W)], op.label)

    # -- values -----------------------------------------------------------
    def output(self, node: Any, tiling: Tiling | None = None) -> TileArray:
        """The tiles an op writes for ``node``: planned, or ``tiling`` (re-tiled after)."""
        tiling = tiling if tiling is not None else self.tiling(node)
        owners = tile_owners(node.axes, tiling, self.world) if self.world > 1 else None
        arr = TileArray(self.rt, node.shape, node.dtype, tiling, source=self, owners=owners)
        self.values[node] = arr
        self.keep.append(arr)
        return arr

    def view_output(self, node: Any, base: TileArray, tiling: Tiling, order: list[int]) -> TileArray:
        """``node``'s tiles as ``base``'s (tile k is ``base``'s tile ``order[k]``, same
        bytes): for ops that only reinterpret a layout, no task and no memory."""
        arr = TileArray(self.rt, node.shape, node.dtype, tiling, base, order)
        root = base
        while root.base is not None:
            root = root.base
        self._viewed.add(id(root))
        self.values[node] = arr
        self.keep.append(arr)
        return arr

    def temp(self, shape: tuple[int, ...], dtype: torch.dtype, tiling: Tiling | None = None) -> TileArray:
        arr = TileArray(self.rt, shape, dtype, tiling if tiling is not None else tuple((s,) for s in shape),
                        source=self)
        self.keep.append(arr)
        return arr

    def input(self, node: Any, tiling: Tiling | None = None) -> TileArray:
        """The tiles of an input node in the planned (or the given) tiling."""
        arr = self.values.get(node)
        if arr is None:
            arr = node.value
            if arr is None:
                raise RuntimeError(f"internal error: {node!r} was neither materialized nor lowered")
        want = tiling if tiling is not None else self.tiling(node)
        self.keep.append(arr)
        if arr.tiling != want:
            self._count_retile(node, arr.tiling, want)
            arr = self.retile(arr, want)
            if tiling is None:
                self.values[node] = arr
        return arr

    def _count_retile(self, node: Any, have: Tiling, want: Tiling) -> None:
        """Count a re-tiling for the op being lowered and each axis group it changes
        (``metrics()["retiles"]``): a tiling an op could not use costs copies."""
        op = self.op.label if self.op is not None else "?"
        for d, (ax, a, b) in enumerate(zip(node.axes, have, want)):
            if a != b:
                stats.RETILES[(op, describe(ax))] += 1
                self.retiles.append((op, node, d))

    def retile(self, src: TileArray, tiling: Tiling) -> TileArray:
        """Copy a value into another tiling: one task per destination tile."""
        dst = TileArray(self.rt, src.shape, src.dtype, tiling, source=self)
        self.keep.append(dst)
        self.assemble(dst, [(src, (0,) * len(src.shape))], "retile")
        return dst

    def assemble(self, dst: TileArray, parts: list[tuple[TileArray, tuple[int, ...]]], name: str) -> None:
        """Write every tile of ``dst`` from the values in ``parts``, each placed at an
        offset in ``dst`` (a re-tiling, a concatenation): one task per ``dst`` tile,
        reading the source tiles it overlaps and casting to ``dst``'s dtype."""
        for didx in dst.indices():
            dsl = dst.slices(didx)
            args, boxes = [], []
            for src, off in parts:
                for sidx in src.indices():
                    ssl = tuple(slice(a.start + o, a.stop + o) for a, o in zip(src.slices(sidx), off))
                    box = [(max(a.start, b.start), min(a.stop, b.stop)) for a, b in zip(dsl, ssl)]
                    if all(lo < hi for lo, hi in box):
                        args.append(Arg(src, sidx, R))
                        boxes.append((
                            tuple((lo - d.start, hi - d.start) for (lo, hi), d in zip(box, dsl)),
                            tuple((lo - s.start, hi - s.start) for (lo, hi), s in zip(box, ssl)),
                        ))
            self.task(Kernel(copy_boxes, tuple(boxes)), [Arg(dst, didx, W), *args], name)

    # -- tasks ------------------------------------------------------------
    def task(self, fn: KernelData, args: list[Arg], name: str) -> None:
        """Add a task running kernel ``fn`` (data, never a closure: equal kernels must
        compare equal for a lowered step to be recognized) on the tiles of ``args``."""
        _check_kernel(fn, name)
        handles, modes, specs = [], [], []
        for a in args:
            arr = a.arr
            f = arr.flat(a.idx)
            handles.append(arr.handles[f])
            modes.append(a.mode)
            specs.append(arr.specs[f])
        self.tasks.append((fn, handles, modes, specs, name))

    def task_on_first_tiles(self, fn: KernelData, out: TileArray, ins: list[TileArray], name: str) -> None:
        """``task`` writing ``out``'s first tile from the first tiles of ``ins`` (values
        of one tile each: the common untiled case, without building ``Arg``s)."""
        _check_kernel(fn, name)
        self.tasks.append((fn, [out.handles[0], *[a.handles[0] for a in ins]], [W] + [R] * len(ins),
                           [out.specs[0], *[a.specs[0] for a in ins]], name))

    def _hold_pool(self) -> None:
        """Handles still in the pool stay held until this compile's tasks are submitted."""
        left = [h for free in self._pool.values() for h, _ in free]
        self._pool = {}
        if left:
            self.keep.append(Held(self.rt, left))

    def commit(self) -> None:
        self._hold_pool()
        for node, arr in self.values.items():
            node.value = arr
            if node.op is not None:
                self.labels[id(arr)] = node.op.label
        self.values = {}

    def discard(self) -> None:
        self._hold_pool()
        self.tasks = []
        self.values = {}
        self.keep = []


Box = tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]  # (dst ranges, src ranges) per dim


def copy_boxes(boxes: tuple[Box, ...], dst: torch.Tensor, *srcs: torch.Tensor) -> None:
    """Copy a box of each source tile into a box of the destination tile."""
    for (dbox, sbox), s in zip(boxes, srcs):
        dst[tuple(slice(a, b) for a, b in dbox)].copy_(s[tuple(slice(a, b) for a, b in sbox)])


def _copy_boxes_record(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...],
                       dtypes: tuple[torch.dtype, ...]) -> tuple[list[int], tuple] | None:
    """Boxes of tiles of one dtype (any) are strided copies in C; casts stay Python."""
    (boxes,) = params
    if len(boxes) != len(shapes) - 1 or any(d is not dtypes[0] for d in dtypes):
        return None
    out = [native.box(b + 1, sshape, dbox, sbox) for b, ((dbox, sbox), sshape) in enumerate(zip(boxes, shapes[1:]))]
    return native.copy_boxes_record(dtypes[0], shapes[0], out)


native.TYPED[copy_boxes] = _copy_boxes_record


def _raise(err: BaseException, *tiles: torch.Tensor) -> None:
    raise err


__all__ = ["Arg", "Given", "Held", "Lowering", "PlanHandles", "R", "RW", "TileArray", "Tiling", "W", "offsets"]
