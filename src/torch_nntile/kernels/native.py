"""Which ``Kernel``s the workers run in C, and their programs and records.

The registries here (``TRANSLATORS``, ``RULES``, ``VIEWS``, ``ROWS``, ``TYPED``,
``CALLS``, ``FRESH``) are filled by each op beside its kernel; ``record`` turns a task's
kernel and tile specs into the C record (``runtime/csrc/ew.h``, ``rows.h``), or None
for a Python task. See docs/architecture/kernels.md.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from functools import cache
from typing import Any

import torch

# opcodes of csrc/ew.h, in its order
(COPY, ADD, SUB, MUL, DIV, ADD_SCALED, SUB_SCALED, ADDCMUL, ADDCDIV, LERP, NEG, ABS, SQRT, RSQRT, RECIPROCAL,
 EXP, LOG, TANH, SIGMOID, POW, TANH_BACKWARD, SIGMOID_BACKWARD, THRESHOLD_BACKWARD, CLAMP_MIN, CLAMP_MAX,
 MAXIMUM, MINIMUM, GELU, GELU_TANH, SILU, WHERE, SIN, COS, GELU_BACKWARD, GELU_TANH_BACKWARD, STORE) = range(36)
CONST, TEMP, MAX_STEPS, MAX_BUFFERS = 64, 128, 48, 64
EW_F32, EW_BOOL, EW_OUT = 0, 1, 2  # kinds of a program's buffers (csrc/ew.h): read as float32 or bool, written


class Unsupported(Exception):
    """The kernel has no C program: it runs as Python."""


class Ref(int):
    """An operand of a program step: a buffer, a constant or an earlier step's result."""


class Program:
    """A program being built: steps ``(opcode, a, b, c, d)`` and double constants."""

    __slots__ = ("steps", "consts")

    def __init__(self) -> None:
        self.steps: list[tuple[int, int, int, int, int]] = []
        self.consts: list[float] = []

    def val(self, x: Any) -> Ref:
        """``x`` as an operand: a ``Ref`` as is, a real number (or a CPU scalar holding
        one) as a constant."""
        if type(x) is Ref:
            return x
        if type(x).__name__ == "CpuScalar":
            if x.dtype.is_complex:
                raise Unsupported
            x = x.value
        if type(x) not in (int, float, bool):
            raise Unsupported
        v = float(x)
        for i, c in enumerate(self.consts):
            if c.hex() == v.hex():  # -0.0 and 0.0 stay apart
                return Ref(CONST + i)
        if len(self.consts) == TEMP - CONST:
            raise Unsupported
        self.consts.append(v)
        return Ref(CONST + len(self.consts) - 1)

    def emit(self, op: int, *operands: Any) -> Ref:
        if len(self.steps) == MAX_STEPS:
            raise Unsupported
        refs = [self.val(o) for o in operands] + [-1] * (4 - len(operands))
        self.steps.append((op, *refs))  # type: ignore[arg-type]
        return Ref(TEMP + len(self.steps) - 1)


Rule = Callable[[Program, list[Any], dict[str, Any]], Ref]
RULES: dict[Any, Rule] = {}
"""ATen-level function -> rule emitting its steps from its arguments (tile arguments
as ``Ref``s) and keywords; a rule raises ``Unsupported`` for cases it does not cover."""

VIEWS: dict[Callable[..., None], Callable[[tuple[Any, ...], tuple[tuple[int, ...], ...]],
                                         dict[int, tuple[tuple[int, ...], int]]]] = {}
"""``Kernel.fn`` -> the (strides, offset) in elements by which input buffers are read,
per output dim, for its params and tile shapes: buffers not named are read by
broadcasting their shape (kernels that copy a view: permutations, strided views,
broadcasts); it raises ``Unsupported`` for shapes it cannot express (Python runs the
task). A kernel here whose program only copies copies tiles of any dtype."""

ROWS: dict[Callable[..., None], Callable[[tuple[Any, ...], tuple[tuple[int, ...], ...]],
                                        tuple[list[int], tuple[float, ...]] | None]] = {}
"""``Kernel.fn`` -> its record (a ``csrc/rows.h`` kind and parameters, constants) for
its params and tile shapes, or None: row-wise kernels (softmax, layer norm)."""

TYPED: dict[Callable[..., None], Callable[[tuple[Any, ...], tuple[tuple[int, ...], ...], tuple[torch.dtype, ...]],
                                         tuple[list[int], tuple[float, ...]] | None]] = {}
"""Like ``ROWS``, for kernels that also read or write tiles of other dtypes (indices,
targets): the function is given the tiles' dtypes and checks them."""

FRESH: set[Callable[..., None]] = set()
"""``Kernel.fn``s whose parameters hold data (an ingress's CPU copy, whose address its
record carries): their records are made for each task and never cached."""

CALLS: dict[Any, Callable[[tuple[Any, ...], dict[str, Any], tuple[tuple[int, ...], ...], tuple[torch.dtype, ...]],
                          tuple[list[int], tuple[float, ...]] | None]] = {}
"""ATen-level function of an elementwise-style kernel (``call_out``) -> its typed row
record for its arguments (tiles as ``Ref``s), keywords, tile shapes and dtypes."""

TRANSLATORS: dict[Callable[..., None], Callable[[Program, tuple[Any, ...], list[Ref]], Ref]] = {}
"""``Kernel.fn`` -> translator: emits the kernel's steps for its params and its input
tiles (``Ref``s of buffers 1, 2, ...), returns the result's operand."""


def _kw(kw: dict[str, Any], allowed: dict[str, Any]) -> list[Any]:
    if not set(kw) <= set(allowed):
        raise Unsupported
    return [kw.get(k, d) for k, d in allowed.items()]


def _binary(op: int, scaled: int | None = None) -> Rule:
    def rule(p: Program, args: list[Any], kw: dict[str, Any]) -> Ref:
        (alpha,) = _kw(kw, {"alpha": 1})
        if len(args) != 2:
            raise Unsupported
        if alpha == 1 or scaled is None:
            if alpha != 1:
                raise Unsupported
            return p.emit(op, *args)
        return p.emit(scaled, args[0], args[1], alpha)
    return rule


def _unary(op: int) -> Rule:
    def rule(p: Program, args: list[Any], kw: dict[str, Any]) -> Ref:
        if kw or len(args) != 1:
            raise Unsupported
        return p.emit(op, args[0])
    return rule


def _div(p: Program, args: list[Any], kw: dict[str, Any]) -> Ref:
    (mode,) = _kw(kw, {"rounding_mode": None})
    if mode is not None or len(args) != 2:
        raise Unsupported
    return p.emit(DIV, *args)


def _addc(op: int) -> Rule:
    def rule(p: Program, args: list[Any], kw: dict[str, Any]) -> Ref:
        (value,) = _kw(kw, {"value": 1})
        if len(args) != 3:
            raise Unsupported
        return p.emit(op, *args, value)
    return rule


def _nary(op: int, n: int) -> Rule:
    def rule(p: Program, args: list[Any], kw: dict[str, Any]) -> Ref:
        if kw or len(args) != n:
            raise Unsupported
        return p.emit(op, *args)
    return rule


def _pow(p: Program, args: list[Any], kw: dict[str, Any]) -> Ref:
    """Exponents PyTorch computes by multiplication or roots (pow_tensor_scalar) alike."""
    if kw or len(args) != 2:
        raise Unsupported
    x, e = args
    if type(e) is Ref or type(e) not in (int, float):
        return p.emit(POW, x, e)
    if e == 2:
        return p.emit(MUL, x, x)
    if e == 3:
        return p.emit(MUL, p.emit(MUL, x, x), x)
    if e == 0.5:
        return p.emit(SQRT, x)
    if e == -0.5:
        return p.emit(RSQRT, x)
    if e == -1:
        return p.emit(RECIPROCAL, x)
    if e == -2:
        return p.emit(RECIPROCAL, p.emit(MUL, x, x))
    return p.emit(POW, x, e)


RULES.update({
    torch.add: _binary(ADD, ADD_SCALED), torch.sub: _binary(SUB, SUB_SCALED), torch.mul: _binary(MUL),
    torch.div: _div, torch.pow: _pow, torch.addcmul: _addc(ADDCMUL), torch.addcdiv: _addc(ADDCDIV),
    torch.lerp: _nary(LERP, 3), torch.where: _nary(WHERE, 3),
    torch.clamp_min: _nary(CLAMP_MIN, 2), torch.clamp_max: _nary(CLAMP_MAX, 2),
    torch.maximum: _nary(MAXIMUM, 2), torch.minimum: _nary(MINIMUM, 2),
    torch.neg: _unary(NEG), torch.abs: _unary(ABS), torch.sqrt: _unary(SQRT), torch.rsqrt: _unary(RSQRT),
    torch.reciprocal: _unary(RECIPROCAL), torch.exp: _unary(EXP), torch.log: _unary(LOG),
    torch.tanh: _unary(TANH), torch.sigmoid: _unary(SIGMOID),
    torch.ops.aten.tanh_backward.grad_input: _nary(TANH_BACKWARD, 2),
    torch.ops.aten.sigmoid_backward.grad_input: _nary(SIGMOID_BACKWARD, 2),
    torch.ops.aten.threshold_backward.grad_input: _nary(THRESHOLD_BACKWARD, 3),
    torch.ops.aten.silu.out: _unary(SILU),
})


@cache
def gelu_specials() -> tuple[float, float]:
    """PyTorch's exact float32 GELU at +inf and at -0 on this machine: its vector code
    gives NaN or inf, -0 or +0, by instruction set."""
    x = torch.tensor([float("inf")] * 16 + [-0.0] * 16)
    y = torch.nn.functional.gelu(x)
    return y[0].item(), y[16].item()


def _gelu(p: Program, args: list[Any], kw: dict[str, Any]) -> Ref:
    (approximate,) = _kw(kw, {"approximate": "none"})
    if len(args) != 1 or approximate not in ("none", "tanh"):
        raise Unsupported
    if approximate == "tanh":
        return p.emit(GELU_TANH, args[0])
    return p.emit(GELU, args[0], *gelu_specials())


def _gelu_backward(p: Program, args: list[Any], kw: dict[str, Any]) -> Ref:
    (approximate,) = _kw(kw, {"approximate": "none"})
    if len(args) != 2 or approximate not in ("none", "tanh"):
        raise Unsupported
    return p.emit(GELU_TANH_BACKWARD if approximate == "tanh" else GELU_BACKWARD, *args)


RULES.update({torch.ops.aten.gelu.out: _gelu, torch.ops.aten.gelu_backward.grad_input: _gelu_backward,
              torch.ops.aten.sin.out: _unary(SIN), torch.ops.aten.cos.out: _unary(COS)})


def apply_rule(p: Program, fn: Any, args: list[Any], kw: dict[str, Any]) -> Ref:
    rule = RULES.get(fn)
    if rule is None:
        raise Unsupported
    return rule(p, args, kw)


_MISSING = object()
_CACHED = 2048  # entries per cache (then cleared): kernels whose scalars change every step (Adam's bias
# corrections) come anew each step, so a cache holds only a few steps of them
_PROGRAMS: dict[Any, tuple[tuple[int, ...], tuple[float, ...]] | None] = {}
_RECORDS: dict[tuple[Any, tuple[tuple[int, ...], ...]], tuple[list[int], tuple[float, ...]] | None] = {}


def program(kernel: Any, nin: int) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
    """The steps (flattened) and constants of ``kernel`` with ``nin`` input tiles, or None."""
    tr = TRANSLATORS.get(getattr(kernel, "fn", None))
    if tr is None:
        return None  # not cached: such kernels may hold data (an ingress's CPU tensor)
    key = (kernel, nin)
    got = _PROGRAMS.get(key, _MISSING)
    if got is not _MISSING:
        return got  # type: ignore[return-value]
    out = None
    if nin < MAX_BUFFERS:
        p = Program()
        try:
            res = tr(p, kernel.params, [Ref(i + 1) for i in range(nin)])
            if not p.steps or res != TEMP + len(p.steps) - 1:
                p.emit(COPY, res)
            out = (tuple(v for s in p.steps for v in s), tuple(p.consts))
        except Unsupported:
            out = None
    if len(_PROGRAMS) > _CACHED:
        _PROGRAMS.clear()
    _PROGRAMS[key] = out
    return out


_F32 = torch.float32
_BIG = 2**31 - 1


def record(kernel: Any, specs: list[tuple[int, torch.dtype, tuple[int, ...]]]) -> tuple[list[int], tuple[float, ...]] | None:
    """The program record (``nbuf, ndim, shape, strides, nsteps, steps``) and constants
    of a task running ``kernel`` on tiles ``specs`` (output first), or None when the
    task must run as Python."""
    if len(specs) > MAX_BUFFERS:
        return None
    fn = getattr(kernel, "fn", None)
    typed, rows = TYPED.get(fn), ROWS.get(fn)
    if typed is None and rows is None and fn not in TRANSLATORS:
        return None
    shapes = tuple(s[2] for s in specs)
    dtypes = tuple(s[1] for s in specs)
    if fn in FRESH:
        return typed(kernel.params, shapes, dtypes) if typed is not None else None
    key = (kernel, shapes, dtypes)
    got = _RECORDS.get(key, _MISSING)
    if got is not _MISSING:
        return got  # type: ignore[return-value]
    out = None
    small = all(numel(s) <= _BIG for s in shapes)
    if typed is not None and small:
        try:
            out = typed(kernel.params, shapes, dtypes)
        except Unsupported:
            out = None
    f32 = all(d is _F32 for d in dtypes)
    arith = f32 or _promotes_bool(dtypes)  # tiles a float32 program reads
    if out is None and rows is not None:
        if f32 and small:
            out = rows(kernel.params, shapes)
    elif out is None and (arith or fn in VIEWS) and (prog := program(kernel, len(specs) - 1)) is not None:
        views = VIEWS.get(fn)
        try:
            view = views(kernel.params, shapes) if views is not None else {}
            if arith:
                out = _layout(shapes, dtypes, prog, view)
            elif prog == _COPY_ONLY and small:  # a kernel copying a view: any dtype
                out = _copy_record(shapes, dtypes, view)
        except Unsupported:  # a view these tile shapes cannot take
            out = None
    if len(_RECORDS) > _CACHED:
        _RECORDS.clear()
    _RECORDS[key] = out
    return out


_COPY_ONLY = ((COPY, 1, -1, -1, -1), ())  # the program of a kernel that copies its one input


def _promotes_bool(dtypes: tuple[torch.dtype, ...]) -> bool:
    """Whether a float32 program reads these tiles as PyTorch computes with them: a
    float32 output from float32 and bool inputs, at least one float32 (so that the op's
    common dtype is float32 and its bools count as 0 and 1; bools alone would be added
    as bools, ``True + True`` being ``True``)."""
    return dtypes[0] is _F32 and _F32 in dtypes[1:] and all(d is _F32 or d is torch.bool for d in dtypes)


def _reads(shapes: tuple[tuple[int, ...], ...], views: dict[int, tuple[tuple[int, ...], int]]
           ) -> tuple[tuple[int, ...], list[tuple[tuple[int, ...], int]]] | None:
    """The output's shape (``(1,)`` for 0-dim) and, per buffer, the strides and offset
    (in elements) by which it is read along the output's dims: from ``views``, else by
    broadcasting; None where a buffer cannot be read so."""
    oshape = shapes[0] or (1,)
    nd = len(oshape)
    if nd > 16:
        return None
    out = []
    for b, s in enumerate(shapes):
        n = numel(s)
        if n > _BIG:
            return None
        view = views.get(b)
        if view is not None:
            strides, offset = view
            if not shapes[0]:
                strides = (0,) * (nd - len(strides)) + tuple(strides)  # a 0-dim output: one element
            if len(strides) != nd:
                return None
            last = offset + sum((e - 1) * st for e, st in zip(oshape, strides))
            if n and 0 not in oshape and not 0 <= offset <= last < n:  # reads inside its tile only
                return None
            out.append((tuple(strides), offset))
            continue
        strides = broadcast_strides(s, oshape)
        if strides is None:
            return None
        out.append((strides, 0))
    return oshape, out


def broadcast_strides(shape: tuple[int, ...], oshape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The strides (0 along broadcast dims) by which a contiguous tile of ``shape`` is
    read along the dims of ``oshape`` (right-aligned, as PyTorch broadcasts), or None."""
    nd = len(oshape)
    if len(shape) > nd:
        return None
    s = (1,) * (nd - len(shape)) + tuple(shape)
    strides = [0] * nd
    step = 1
    for d in range(nd - 1, -1, -1):
        if s[d] != oshape[d] and s[d] != 1:
            return None
        strides[d] = step if s[d] != 1 else 0
        step *= s[d]
    return tuple(strides)


def _layout(shapes: tuple[tuple[int, ...], ...], dtypes: tuple[torch.dtype, ...],
            prog: tuple[tuple[int, ...], tuple[float, ...]],
            views: dict[int, tuple[tuple[int, ...], int]]) -> tuple[list[int], tuple[float, ...]] | None:
    got = _reads(shapes, views)
    if got is None:
        return None
    oshape, reads = got
    ints = [0, len(shapes), len(oshape), *oshape]  # kind 0: an ew.h program
    for strides, _ in reads:
        ints += strides
    ints += [offset for _, offset in reads]
    steps, consts = prog
    stored = {steps[i + 2] for i in range(0, len(steps), 5) if steps[i] == STORE}  # further results' buffers
    ints += [EW_OUT if b in stored else EW_BOOL if d is torch.bool else EW_F32 for b, d in enumerate(dtypes)]
    ints.append(len(steps) // 5)
    ints += steps
    return ints, consts


def _copy_record(shapes: tuple[tuple[int, ...], ...], dtypes: tuple[torch.dtype, ...],
                 views: dict[int, tuple[tuple[int, ...], int]]) -> tuple[list[int], tuple[float, ...]] | None:
    """A copy-only program on tiles of another dtype than float32: one strided box."""
    got = _reads(shapes, views)
    if got is None or dtypes[0] is not dtypes[1]:
        return None
    oshape, reads = got
    strides, offset = reads[1]
    return copy_boxes_record(dtypes[0], oshape, [(1, numel(shapes[1]), offset, (0,) * len(oshape), oshape, strides)])


Box = tuple[int, int, int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]
"""A box of ``COPY_BOXES``: source buffer, its element count, offset of the box's first
element there, the box's start in the destination, its extent, the source's strides."""


def box(src: int, sshape: tuple[int, ...], dbox: tuple[tuple[int, int], ...], sbox: tuple[tuple[int, int], ...],
        rev: tuple[int, ...] = ()) -> Box:
    """The box copying ``sbox`` (per dim ``(lo, hi)``) of the contiguous tile ``sshape`` in
    buffer ``src`` to ``dbox`` of the destination; the dims in ``rev`` are read from the
    box's end, by negative strides."""
    cs = contiguous_strides(sshape)
    strides = tuple(-st if d in rev else st for d, st in enumerate(cs))
    offset = sum((b - 1 if d in rev and b > a else a) * st for d, ((a, b), st) in enumerate(zip(sbox, cs)))
    return src, numel(sshape), offset, tuple(a for a, _ in dbox), tuple(b - a for a, b in dbox), strides


def copy_boxes_record(dtype: torch.dtype, dshape: tuple[int, ...], boxes: list[Box],
                      fill: Any = None) -> tuple[list[int], tuple[float, ...]] | None:
    """The ``COPY_BOXES`` record of ``boxes`` into a tile of ``dshape`` and ``dtype`` (all
    of it first filled with ``fill`` unless None; a 0-dim tile is one of shape ``(1,)``),
    or None for a dtype it cannot copy."""
    esize = ELEMENT_SIZES.get(dtype)
    if esize is None or len(dshape) > 16:
        return None
    if not dshape:
        dshape = (1,)
        boxes = [(src, n, off, (0,), (1,), (0,)) for src, n, off, *_ in boxes]
    words = (0, 0) if fill is None else fill_words(fill, dtype)
    if words is None:
        return None
    ints = [COPY_BOXES, esize, len(dshape), len(boxes), int(fill is not None), *words, *dshape]
    for src, n, off, dlo, ext, strides in boxes:
        ints += (src, n, off, *dlo, *ext, *strides)
    return ints, ()


def fill_words(value: Any, dtype: torch.dtype) -> tuple[int, int] | None:
    """The element ``o.fill_(value)`` writes into a tile of ``dtype``, as the low and
    high 32 bits (signed) of its bytes; None where that fill raises (Python then does)."""
    try:
        t = torch.empty(1, dtype=dtype).fill_(value)
    except (RuntimeError, TypeError, ValueError, OverflowError):
        return None
    raw = bytes(t.view(torch.uint8).tolist()).ljust(8, b"\0")
    return struct.unpack("<ii", raw)


ELEMENT_SIZES = {dt: dt.itemsize for dt in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                                            torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                            torch.complex64)}
"""The dtypes tiles are copied of in C, by their element sizes (bits are moved as they are)."""


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for v in shape:
        n *= v
    return n


# csrc/rows.h kinds
(SOFTMAX, SOFTMAX_BACKWARD, LAYER_NORM, LAYER_NORM_GRAD, COPY_BOXES, SUM, GATHER, EMBEDDING_GRAD, NLL, NLL_WEIGHT,
 NLL_GRAD, ARANGE, SGD, ADAMW, RMS_NORM, RMS_NORM_GRAD, ROPE, MAP, ANY, INDEX, INGRESS, INDEX_N, ISUM, MAX_POOL2D,
 MAX_POOL2D_GRAD, BN_STATS, BN_SUMS, ATEN, BN_COMBINE, BN_GRAD_COMBINE) = range(1, 31)
INDEX_DTYPES = (torch.int64, torch.int32)  # index tiles the C kernels read (1: int64, 0: int32)
# what a C kernel finds wrong in its inputs (csrc/rows.h), raised as on CPU; ATEN_FAILED: an ATen op raised
BAD_INDEX, BAD_TARGET, BAD_SUBSCRIPT, BAD_GATHER, ATEN_FAILED, CUBLAS_FAILED = 1, 2, 3, 4, 5, 6
ATEN_RUNNER = 0
"""The address of the function that runs ``ATEN`` records (backend/csrc/aten_calls.cpp),
set by the backend where its C++ library is built; the runtime hands it to the shim."""
ATEN_ERROR: Callable[[], BaseException] | None = None
"""The exception of the ATen op that last failed an ``ATEN`` task on the calling thread."""


def input_error(code: int, value: int, dim: int = 0, size: int = 0) -> BaseException:
    """The exception PyTorch's CPU kernel raises where a C kernel reported ``code``
    (``dim`` and ``size``: those of an index out of bounds)."""
    if code == ATEN_FAILED and ATEN_ERROR is not None:
        return ATEN_ERROR()
    if code == BAD_TARGET:
        return IndexError(f"Target {value} is out of bounds.")
    if code == CUBLAS_FAILED:
        return RuntimeError(f"CUDA error: a cuBLAS product on a CUDA worker failed with status {value}")
    if code == BAD_SUBSCRIPT:
        return IndexError(f"index {value} is out of bounds for dimension {dim} with size {size}")
    if code == BAD_GATHER:
        return RuntimeError(f"index {value} is out of bounds for dimension {dim} with size {size}")
    return IndexError("index out of range in self")


def fits_int32(*vs: int) -> bool:
    return all(-2**31 <= v < 2**31 for v in vs)


def rows_around(shape: tuple[int, ...], dim: int) -> tuple[int, int, int]:
    """(outer, n, inner) of a tile reduced along ``dim``."""
    if not shape:
        return 1, 1, 1
    return numel(shape[:dim]), shape[dim], numel(shape[dim + 1:])
