"""Capture and replay of a fixed step: ``step = torch_nntile.capture(fn)``.

Calls 1-3 run ``fn``, the second and third tracing the tile tasks and read-backs sent
to StarPU; if the two traces agree, later calls replay the prepared tasks on the
current tiles, with no op dispatched, recorded or lowered. As with CUDA Graphs, what
Python computed in the traced calls is frozen: what the traces show to change (a kernel
scalar, data copied from the CPU, a value read back, a tensor kept outside the result)
is refused with ``CaptureError``. See docs/guide/capture.md and docs/architecture/kernels.md.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree

from torch_nntile import stats
from torch_nntile.backend.device import Buf, _buf, is_nntile, new_tensor, read
from torch_nntile.graph.nodes import SESSION, DataNode
from torch_nntile.kernels import Kernel
from torch_nntile.ops.data import readout
from torch_nntile.runtime.context import Runtime
from torch_nntile.runtime.submission import Batch, R, W
from torch_nntile.session import SESSION_STATE
from torch_nntile.tiling.tiles import Given, TileArray

Source = tuple[str, int]  # ("arg", flat argument index) or ("buf", id of a Buf alive before the call)


class CaptureError(RuntimeError):
    """``fn`` cannot be replayed as captured (its graph would change), or a replay's
    inputs do not fit the captured step."""


_HINT = ("Values Python computes in the step are frozen in a replay: pass changing values as nntile tensors "
         "(an optimizer's step count and bias corrections: create torch.optim.Adam/AdamW or "
         "torch_nntile.training.AdamW with capturable=True, which keeps the step count on nntile)")


def capture(fn: Callable[..., Any]) -> Captured:
    """``fn`` as a step that is replayed from its fourth call on; a training loop calls the
    result instead of ``fn`` to skip Python dispatch, recording and lowering.

    The first call runs ``fn``; the second and third run it and trace the tile tasks
    and read-backs it sends StarPU. If the two traces agree, later calls resubmit those
    tasks on the current tiles of the tensors ``fn`` reads and return new (detached)
    tensors for its tensor results. What Python computed in the traced calls is frozen,
    so what the traces show to change is refused with ``CaptureError`` at the third
    call: a kernel scalar (an optimizer without ``capturable=True``), data copied from
    the CPU, a value read back, a tensor kept outside the result. See
    docs/guide/capture.md.

    Args:
        fn: the step; it takes nntile tensors (and Python values that stay equal) and
            returns tensors (the loss as a tensor, not ``loss.item()``).

    Returns:
        A ``Captured`` to call in place of ``fn``.
    """
    return Captured(fn)


class Captured:
    """A captured function; ``replays`` counts the calls that were replayed."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.calls = 0
        self.replays = 0
        self._traces: list[_Trace] = []
        self._program: _Program | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the step: as ``fn`` for the first three calls (tracing the second and
        third), replayed from the fourth.

        Args:
            *args: as ``fn`` takes them; tensors must be nntile tensors, and in a replay
                of the traced shapes, dtypes, strides and tilings; other values equal
                to the traced ones.
            **kwargs: likewise.

        Returns:
            What ``fn`` returns; in a replay, its tensors are new, detached nntile tensors.

        Raises:
            CaptureError: a tensor argument is not on nntile; the two traced calls
                differ (raised by the third call, whose results are in place; the next
                call traces again); or a replay's arguments, or a value it reads back,
                do not match the traced ones (nothing has changed then).
        """
        flat, spec = _pytree.tree_flatten((args, kwargs))
        for i, a in enumerate(flat):
            if isinstance(a, torch.Tensor) and not is_nntile(a):
                raise CaptureError(f"capture: argument {i} is a tensor on {a.device}; a captured step takes nntile "
                                   "tensors (move it with .to('nntile') outside the step)")
        self.calls += 1
        if SESSION_STATE.runtime().distributed:  # a replay reuses tiles across values: a rank's tiles are its own
            stats.warn_user("torch_nntile: capture does not replay over several processes yet; the step is "
                            "recorded on each call")
            return self.fn(*args, **kwargs)
        if self._program is not None:
            t0 = stats.enter()
            try:
                out = self._program.replay(flat, spec)
            finally:
                stats.leave("replay", t0)
            self.replays += 1
            return out
        if self.calls == 1:
            return self.fn(*args, **kwargs)
        out, trace = _traced(self.fn, args, kwargs, flat)
        trace.arg_spec = spec
        self._traces.append(trace)
        if len(self._traces) == 2:
            a, b = self._traces
            self._traces = []
            diff = a.difference(b)
            if diff:
                self.calls = 1  # the next call traces again
                raise CaptureError(f"capture: two calls of {getattr(self.fn, '__name__', 'fn')} ran different "
                                   f"steps ({diff}); this call ran and its results are in place. {_HINT}")
            self._program = _Program(SESSION_STATE.runtime(), b)
        return out


# -- tracing -------------------------------------------------------------------


class _Trace:
    """What one call sent StarPU, with each tile as a slot: an input (a tile of a value
    that existed before the call, by where it came from) or a new tile (by size)."""

    def __init__(self, rt: Runtime, outer: dict[Any, list[tuple[Source, int]]], sources: dict[Source, tuple]) -> None:
        self.rt = rt
        self.outer = outer  # handle -> [(source, flat index)], the binding first
        self.sources = sources  # source -> (shape, dtype, tiling) of its value then
        self.slot_of: dict[Any, int] = {}
        self.slots: list[tuple] = []  # ("in", [(source, index), ...]) or ("new", (items, item size))
        self.segments: list[tuple[list, list[int], list[tuple[tuple, torch.Tensor]]]] = []
        self.written: dict[Source, tuple] = {}  # values replaced: source -> (desc, axes)
        self.outputs: list[Any] = []  # per flat result: (desc, axes) for tensors, else the value
        self.out_spec: Any = None
        self.arg_geometry: list[Any] = []
        self.arg_spec: Any = None
        self.error: str | None = None
        self._descs: dict[int, tuple[tuple, TileArray]] = {}  # id(array) -> (its description, the array)
        self.refs: dict[Source, weakref.ref] = {}  # the Bufs of "buf" sources

    def _slot(self, h: Any, mode: int) -> int:
        """The slot of handle ``h`` at this access: each value written is a slot of its
        own (so traces compare whichever handles the runtime happened to reuse)."""
        if mode == W:
            size = self.rt.reuse_key(h)
            if size is None:
                self.error = self.error or "a tile got no memory"
                size = (0, 0)
            s = self.slot_of[h] = len(self.slots)
            self.slots.append(("new", size))
            return s
        s = self.slot_of.get(h)
        if s is None:
            keys = self.outer.get(h)
            if keys is None:
                self.error = self.error or "a task read a tile no tensor held"
                keys = [(("lost", 0), 0)]
            elif mode & W:
                self.error = self.error or "a task changed a tile of a value made before the call"
            s = self.slot_of[h] = len(self.slots)
            self.slots.append(("in", keys))
        return s

    # the session's hooks
    def tasks(self, tasks: list[Any]) -> None:
        slot = self._slot
        self.segments.append((tasks, [slot(h, m) for t in tasks for h, m in zip(t[1], t[2])], []))

    def read(self, arr: TileArray, cpu: torch.Tensor) -> None:
        if not self.segments:
            self.segments.append(([], [], []))
        self.segments[-1][2].append((self._guard(arr), cpu))

    def _guard(self, arr: TileArray) -> tuple:
        return arr.shape, arr.dtype, arr.tiling, tuple(self._slot(h, R) for h in arr.handles)

    def desc(self, arr: TileArray, start: dict[int, Source]) -> tuple:
        """How a replay builds this value: a value that existed before the call (by its
        source), a view of another, or an array of new tiles (by slot)."""
        done = self._descs.get(id(arr))
        if done is not None:
            return done[0]  # one description per array: a replay builds it once
        src = start.get(id(arr))
        if src is not None:
            d: tuple = ("outer", src)
        elif arr.base is not None:
            pos = {h: i for i, h in enumerate(arr.base.handles)}
            d = ("view", arr.shape, arr.dtype, arr.tiling, self.desc(arr.base, start),
                 tuple(pos[h] for h in arr.handles))
        else:
            slots = []
            for h in arr.handles:
                s = self.slot_of.get(h)
                if s is None:
                    s = self._slot(h, W)  # a tile no task wrote (zero size): a new one
                elif self.slots[s][0] != "new":
                    self.error = self.error or "a result is a view of a value made before the step"
                slots.append(s)
            d = ("owner", arr.shape, arr.dtype, arr.tiling, tuple(slots))
        self._descs[id(arr)] = (d, arr)
        return d

    def difference(self, other: _Trace) -> str | None:
        """The first way two traces differ (None: the same step)."""
        for t in (self, other):
            if t.error:
                return t.error
        if [s if s[0] == "new" else ("in", s[1][0]) for s in self.slots] != \
                [s if s[0] == "new" else ("in", s[1][0]) for s in other.slots]:
            return "their tasks used tiles differently"
        if len(self.segments) != len(other.segments):
            return f"{len(self.segments)} and {len(other.segments)} batches of tasks"
        n = 0
        for (ta, sa, ga), (tb, sb, gb) in zip(self.segments, other.segments):
            if len(ta) != len(tb):
                return f"batches of {len(ta)} and {len(tb)} tasks after task {n}"
            if sa != sb:
                return f"the tasks after task {n} used their tiles differently"
            for a, b in zip(ta, tb):
                if a[2] != b[2] or a[3] != b[3] or a[4] != b[4]:
                    return f"task {n} is {a[4]} on {[s[2] for s in a[3]]} and {b[4]} on {[s[2] for s in b[3]]}"
                if not _same(a[0], b[0]):
                    return f"task {n} ({a[4]}) has other kernel parameters or data"
                n += 1
            if len(ga) != len(gb) or any(x[0] != y[0] or not _same(x[1], y[1]) for x, y in zip(ga, gb)):
                return "a value read back inside the step differs"
        if {k: v[0] for k, v in self.written.items()} != {k: v[0] for k, v in other.written.items()}:
            return "they replaced other tensors' values"
        if self.out_spec != other.out_spec or len(self.outputs) != len(other.outputs) or \
                not all(_same(a[:2], b[:2]) for a, b in zip(self.outputs, other.outputs)):  # axis groups aside
            return "their results differ in kind or in a value that is not a tensor"
        if self.arg_spec != other.arg_spec or not _same(self.arg_geometry, other.arg_geometry):
            return "their arguments differ"
        return None


def _same(a: Any, b: Any) -> bool:
    """Equality of kernel data (parameters may hold tensors: ingress data, bit for bit)."""
    if a is b:
        return True
    ta = type(a)
    if ta is not type(b):
        return False
    if ta is Kernel:
        return a.fn is b.fn and _same(a.params, b.params)
    if ta is tuple or ta is list:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if ta is dict:
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
            return False
        return bool(torch.equal(a, b) or (a.is_floating_point() and ((a == b) | (a.isnan() & b.isnan())).all()))
    if ta is float:
        return a == b or (a != a and b != b)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values that do not compare: not the same
        return False


def _geometry(flat: list[Any], arg_bufs: dict[int, int]) -> list[tuple]:
    """Per flat argument: for a tensor its shape, strides, offset, dtype and the first
    argument that shares its storage (a replay must pass tensors alike); any other value
    itself (a replay must pass an equal one). ``arg_bufs`` gets the first argument of
    each storage."""
    out: list[tuple] = []
    for i, a in enumerate(flat):
        if isinstance(a, torch.Tensor):
            first = arg_bufs.setdefault(id(_buf(a)), i)
            out.append(("tensor", tuple(a.shape), a.stride(), a.storage_offset(), a.dtype, first))
        else:
            out.append(("value", a))
    return out


def _live_bufs() -> list[Buf]:
    gen = SESSION_STATE.generation
    return [o for o in gc.get_objects() if type(o) is Buf and o.generation == gen]


def _traced(fn: Callable[..., Any], args: tuple, kwargs: dict, flat: list[Any]) -> tuple[Any, _Trace]:
    """Run ``fn`` as usual, tracing what it sends StarPU."""
    session = SESSION_STATE
    session.execute()  # the step starts from values, not pending ops
    arg_bufs: dict[int, int] = {}
    geometry = _geometry(flat, arg_bufs)
    gc.collect()
    bufs = _live_bufs()
    outer: dict[Any, list[tuple[Source, int]]] = {}
    sources: dict[Source, tuple] = {}
    start: dict[int, Source] = {}
    refs: dict[Source, weakref.ref] = {}
    held: list[Any] = []  # every value of before the call stays alive through it: its tiles keep their handles
    for b in bufs:
        arr = b.node.value
        if arr is None:
            continue
        b.views = None  # a cached view of an older value: re-read inside the call
        i = arg_bufs.get(id(b))
        src: Source = ("arg", i) if i is not None else ("buf", id(b))
        sources[src] = (arr.shape, arr.dtype, arr.tiling)
        if i is None:
            refs[src] = weakref.ref(b)
        if id(arr) not in start or src < start[id(arr)]:  # the same source whatever order gc lists them in
            start[id(arr)] = src
        held.append((b, b.node))
        for f, h in enumerate(arr.handles):
            outer.setdefault(h, []).append((src, f))
    for keys in outer.values():
        keys.sort()
    trace = _Trace(session.runtime(), outer, sources)
    trace.refs = refs
    trace.arg_geometry = geometry
    session.tracer = trace
    try:
        out = fn(*args, **kwargs)
        out_flat, out_spec = _pytree.tree_flatten(out)
        nodes = [read(t) if is_nntile(t) else None for t in out_flat]
        session.execute()
    finally:
        session.tracer = None
    trace.out_spec = out_spec
    gc.collect()
    before = {id(b): node for b, node in held}
    out_bufs = {id(_buf(t)) for t in out_flat if is_nntile(t)}
    for b in _live_bufs():
        old = before.get(id(b))
        if old is not None:
            if b.node is not old:
                i = arg_bufs.get(id(b))
                src = ("arg", i) if i is not None else ("buf", id(b))
                trace.written[src] = (trace.desc(b.node.value, start), b.node.axes)
        elif id(b) not in out_bufs and b.node.value is not None:
            trace.error = trace.error or (
                f"the step kept a tensor it made (shape {list(b.node.shape)}) outside its result (in an attribute, a "
                "list, a .grad, or the autograd graph of a result that requires grad: call backward inside the step, "
                "or run it under torch.no_grad()): a replay could not update it")
    for t, node in zip(out_flat, nodes):
        if node is None:
            trace.outputs.append(("value", t))
        else:
            trace.outputs.append(("tensor", trace.desc(node.value, start), node.axes))
    del held
    trace._descs = {}
    return out, trace


# -- replay --------------------------------------------------------------------


class _Borrowed:
    """A stand-in base for arrays that only read tiles others own (a guard's readout)."""

    __slots__ = ("handles", "base")

    def __init__(self, handles: list[Any]) -> None:
        self.handles, self.base = handles, None


class _Program:
    """A traced step as prepared batches over slots, ready to replay."""

    def __init__(self, rt: Runtime, t: _Trace) -> None:
        self.rt = rt
        self.inputs: list[tuple[int, list[tuple[Source, int]]]] = [
            (s, info[1]) for s, info in enumerate(t.slots) if info[0] == "in"]
        self.segments: list[tuple[Batch, list[int], list[tuple[tuple, torch.Tensor]]]] = [
            (rt.prepare(tasks), slots, guards) for tasks, slots, guards in t.segments]
        self.written = t.written
        self.outputs = t.outputs
        self.out_spec = t.out_spec
        self.arg_geometry, self.arg_spec = t.arg_geometry, t.arg_spec
        owned: set[int] = set()  # the slots of values the step leaves behind
        used = {src for _s, keys in self.inputs for src, _f in keys} | set(t.written)  # sources a replay reads
        for desc, _axes in [*t.written.values(), *[o[1:] for o in t.outputs if o[0] == "tensor"]]:
            _left_behind(desc, owned, used)
        self.registers, self.owned = _allocate(t, owned)
        self.nslots = len(t.slots)
        self.sources = {src: sig for src, sig in t.sources.items() if src in used}  # those a replay looks at
        self._bufs = {src: ref for src, ref in t.refs.items() if src in used}

    def _buf_of(self, src: Source, flat: list[Any]) -> Buf | None:
        if src[0] == "arg":
            return _buf(flat[src[1]])
        ref = self._bufs.get(src)
        return ref() if ref is not None else None

    def replay(self, flat: list[Any], spec: Any) -> Any:
        session = SESSION_STATE
        with session.lock:
            if spec != self.arg_spec:
                raise CaptureError(f"capture: the step was captured with arguments {self.arg_spec}, called with {spec}")
            self._check_args(flat)
            if SESSION.pending or session.compiled is not None:
                session.execute()
            rt = session.runtime()
            if rt is not self.rt:
                raise CaptureError("capture: the context the step was captured in was shut down")
            arrays: dict[Source, TileArray] = {}
            for src, (shape, dtype, tiling) in self.sources.items():
                b = self._buf_of(src, flat)
                if b is None or b.generation != session.generation:
                    continue
                arr = b.node.value
                if arr.shape != shape or arr.dtype != dtype or arr.tiling != tiling:
                    raise CaptureError(f"capture: a tensor the step reads ({describe_source(src)}) is now "
                                       f"{list(arr.shape)} {arr.dtype} tiled {arr.tiling}, captured as "
                                       f"{list(shape)} {dtype} tiled {tiling}")
                arrays[src] = arr
            handles: list[Any] = [None] * self.nslots
            for slot, keys in self.inputs:
                arr = arrays.get(keys[0][0])
                if arr is None:
                    raise CaptureError(f"capture: a tensor the step reads ({describe_source(keys[0][0])}) no longer "
                                       "exists")
                h = handles[slot] = arr.handles[keys[0][1]]
                for src, f in keys[1:]:
                    other = arrays.get(src)
                    if other is not None and other.handles[f] is not h:
                        raise CaptureError("capture: two tensors that shared a value when the step was captured "
                                           f"({describe_source(keys[0][0])}, {describe_source(src)}) no longer do")
            regs: list[Any] = []
            for size, items, slots in self.registers:
                hs = rt.register_many(items, size)
                regs += hs
                for s, r in slots:
                    handles[s] = hs[r]
            try:
                for batch, slots, guards in self.segments:
                    if batch.n:
                        rt.submit_batch(batch, [handles[s] for s in slots])
                    for (shape, dtype, tiling, gslots), want in guards:
                        self._check_guard(rt, shape, dtype, tiling, [handles[s] for s in gslots], want)
            except BaseException:
                rt.release(regs)
                raise
            built: dict[int, TileArray] = {}
            results = []
            for out in self.outputs:
                if out[0] == "value":
                    results.append(out[1])
                else:
                    results.append(new_tensor(self._node(out[1], out[2], handles, arrays, built)))
            for src, (desc, axes) in self.written.items():
                b = self._buf_of(src, flat)
                if b is not None:
                    b.node, b.views = self._node(desc, axes, handles, arrays, built), None
            rt.release([h for h, owned in zip(regs, self.owned) if not owned])
            rt.recycle()
        return _pytree.tree_unflatten(results, self.out_spec)

    def _check_args(self, flat: list[Any]) -> None:
        if len(flat) != len(self.arg_geometry):
            raise CaptureError(f"capture: the step was captured with {len(self.arg_geometry)} arguments (flattened), "
                               f"called with {len(flat)}")
        for i, (a, geo) in enumerate(zip(flat, self.arg_geometry)):
            if geo[0] == "value":
                if isinstance(a, torch.Tensor) or not _same(a, geo[1]):
                    raise CaptureError(f"capture: argument {i} is {a!r}, captured as {geo[1]!r}: a replay repeats "
                                       "the captured call's Python values")
            elif not isinstance(a, torch.Tensor):
                raise CaptureError(f"capture: argument {i} was a tensor when the step was captured, now {type(a)}")
        for i, (now, geo) in enumerate(zip(_geometry(flat, {}), self.arg_geometry)):
            if now[0] == "value" or now == geo:
                continue
            if now[:5] != geo[:5]:
                raise CaptureError(f"capture: argument {i} is {list(now[1])} {now[4]} (strides {now[2]}), captured "
                                   f"as {list(geo[1])} {geo[4]} (strides {geo[2]}): capture the step again for it")
            raise CaptureError(f"capture: argument {i} shares its storage with argument {now[5]} where the captured "
                               f"call's shared it with argument {geo[5]}")

    def _check_guard(self, rt: Runtime, shape: tuple, dtype: torch.dtype, tiling: tuple, handles: list[Any],
                     want: torch.Tensor) -> None:
        node = DataNode(shape, dtype)
        node.value = TileArray(rt, shape, dtype, tiling, _Borrowed(handles), list(range(len(handles))))
        got = readout(rt, node)
        if not _same(got, want):
            raise CaptureError(f"capture: a value the step reads back ({list(shape)} {dtype}) is not what it was "
                               "when the step was captured, so its Python would now take another path; nothing "
                               "was changed. Capture the step again (torch_nntile.capture(fn)) for it")

    def _node(self, desc: tuple, axes: tuple, handles: list[Any], arrays: dict[Source, TileArray],
              built: dict[int, TileArray]) -> DataNode:
        """A new node holding the value ``desc`` describes, as a replay made it."""
        arr = self._build(desc, handles, arrays, built)
        node = DataNode(arr.shape, arr.dtype, axes)
        node.value = arr
        return node

    def _build(self, desc: tuple, handles: list[Any], arrays: dict[Source, TileArray],
               built: dict[int, TileArray]) -> TileArray:
        if desc[0] == "outer":
            return arrays[desc[1]]
        key = id(desc)
        arr = built.get(key)
        if arr is None:
            if desc[0] == "view":
                _, shape, dtype, tiling, base, order = desc
                arr = TileArray(self.rt, shape, dtype, tiling, self._build(base, handles, arrays, built), list(order))
            else:
                _, shape, dtype, tiling, slots = desc
                arr = TileArray(self.rt, shape, dtype, tiling, source=Given([handles[s] for s in slots]))
            built[key] = arr
        return arr


def _allocate(t: _Trace, owned: set[int]) -> tuple[list[tuple[int, list[int], list[tuple[int, int]]]], list[bool]]:
    """Tiles for the new values of a replay, reused as the lowering reuses them: a value's
    tile, once its last task is submitted, takes a later value of its size (the
    longest free first: its readers are the likeliest done). Values that outlive the
    step (``owned``) keep theirs.

    Returns per tile size: the item size, the registers' items and, per slot, its
    (slot, register index within the size); and per register in that order whether a
    result owns it."""
    last: dict[int, int] = {}
    order: list[list[int]] = []  # per position: the slots accessed
    for tasks, slots, guards in t.segments:
        pos = 0
        for task in tasks:
            handles = task[1]
            order.append(slots[pos:pos + len(handles)])
            pos += len(handles)
        order.append([s for g, _want in guards for s in g[3]])
    for p, slots in enumerate(order):
        for s in slots:
            last[s] = p
    free: dict[tuple[int, int], list[int]] = {}
    reg_of: dict[int, int] = {}
    regs: list[tuple[tuple[int, int], bool]] = []
    for p, slots in enumerate(order):
        for s in slots:
            info = t.slots[s]
            if info[0] == "new" and s not in reg_of:
                pool = free.get(info[1])
                if pool:
                    reg_of[s] = pool.pop(0)
                else:
                    reg_of[s] = len(regs)
                    regs.append((info[1], False))
        for s in slots:
            if last.get(s) == p and s in reg_of and s not in owned:
                free.setdefault(t.slots[s][1], []).append(reg_of[s])
                last.pop(s)
    for s in owned:  # results no task wrote (zero size)
        if s not in reg_of:
            reg_of[s] = len(regs)
            regs.append((t.slots[s][1], False))
    for s in owned:
        regs[reg_of[s]] = (regs[reg_of[s]][0], True)
    by_size: dict[tuple[int, int], list[int]] = {}
    for r, (size, _owned) in enumerate(regs):
        by_size.setdefault(size, []).append(r)
    index = {r: i for rs in by_size.values() for i, r in enumerate(rs)}
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {size: [] for size in by_size}
    for s, r in reg_of.items():
        groups[regs[r][0]].append((s, index[r]))
    out = [(size[1], [size[0]] * len(rs), groups[size]) for size, rs in by_size.items()]
    flags = [regs[r][1] for rs in by_size.values() for r in rs]
    return out, flags


def _left_behind(desc: tuple, slots: set[int], sources: set[Source]) -> None:
    """Add the new tiles (slots) and the values from before the step (sources) that a
    value the step leaves behind is built of."""
    if desc[0] == "owner":
        slots.update(desc[4])
    elif desc[0] == "outer":
        sources.add(desc[1])
    else:  # a view of another
        _left_behind(desc[4], slots, sources)


def describe_source(src: Source) -> str:
    return f"argument {src[1]}" if src[0] == "arg" else "a tensor from outside the step"
