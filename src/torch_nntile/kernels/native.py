"""Elementwise kernels as C programs (``runtime/csrc/ew.h``): which ``Kernel``s the
workers can run without Python, and their programs.

A kernel's program is worked out once (kernels are data, so equal kernels share it)
by the translator registered for its function (``TRANSLATORS``); the translators of
``call_out`` and of fused chains look the ATen-level function up in ``RULES``. A
task's record adds its tile shapes. Anything a rule does not know, any tile that is
not float32, or a tile too large for 32-bit sizes keeps the Python kernel, which
gives the same values through torch.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import torch

# opcodes of csrc/ew.h, in its order
(COPY, ADD, SUB, MUL, DIV, ADD_SCALED, SUB_SCALED, ADDCMUL, ADDCDIV, LERP, NEG, ABS, SQRT, RSQRT, RECIPROCAL,
 EXP, LOG, TANH, SIGMOID, POW, TANH_BACKWARD, SIGMOID_BACKWARD, THRESHOLD_BACKWARD, CLAMP_MIN, CLAMP_MAX,
 MAXIMUM, MINIMUM, GELU, GELU_TANH, SILU) = range(30)
CONST, TEMP, MAX_STEPS, MAX_BUFFERS = 64, 128, 48, 64


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
boxes); it raises ``Unsupported`` for shapes it cannot express (Python runs the task)."""

ROWS: dict[Callable[..., None], Callable[[tuple[Any, ...], tuple[tuple[int, ...], ...]],
                                        tuple[list[int], tuple[float, ...]] | None]] = {}
"""``Kernel.fn`` -> its record (a ``csrc/rows.h`` kind and parameters, constants) for
its params and tile shapes, or None: row-wise kernels (softmax, layer norm)."""

TYPED: dict[Callable[..., None], Callable[[tuple[Any, ...], tuple[tuple[int, ...], ...], tuple[torch.dtype, ...]],
                                         tuple[list[int], tuple[float, ...]] | None]] = {}
"""Like ``ROWS``, for kernels that also read or write tiles of other dtypes (indices,
targets): the function is given the tiles' dtypes and checks them."""

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
    torch.lerp: _nary(LERP, 3), torch.clamp_min: _nary(CLAMP_MIN, 2), torch.clamp_max: _nary(CLAMP_MAX, 2),
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


RULES[torch.ops.aten.gelu.out] = _gelu


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
    key = (kernel, shapes, dtypes)
    got = _RECORDS.get(key, _MISSING)
    if got is not _MISSING:
        return got  # type: ignore[return-value]
    out = None
    small = all(numel(s) <= _BIG for s in shapes)
    if typed is not None and small:
        out = typed(kernel.params, shapes, dtypes)
    if out is None and all(d is _F32 for d in dtypes):
        if rows is not None:
            if small:
                out = rows(kernel.params, shapes)
        elif (prog := program(kernel, len(specs) - 1)) is not None:
            views = VIEWS.get(fn)
            try:
                out = _layout(shapes, prog, views(kernel.params, shapes) if views is not None else {})
            except Unsupported:  # a view these tile shapes cannot take
                out = None
    if len(_RECORDS) > _CACHED:
        _RECORDS.clear()
    _RECORDS[key] = out
    return out


def _layout(shapes: tuple[tuple[int, ...], ...], prog: tuple[tuple[int, ...], tuple[float, ...]],
            views: dict[int, tuple[tuple[int, ...], int]]) -> tuple[list[int], tuple[float, ...]] | None:
    oshape = shapes[0] or (1,)
    nd = len(oshape)
    if any(len(s) > nd for s in shapes) or nd > 16:
        return None
    ints = [0, len(shapes), nd, *oshape]  # kind 0: an ew.h program
    offsets = []
    for b, s in enumerate(shapes):
        n = numel(s)
        if n > _BIG:
            return None
        view = views.get(b)
        if view is not None:
            strides, offset = view
            if len(strides) != nd:
                return None
            last = offset + sum((n - 1) * st for n, st in zip(oshape, strides))
            if n and not 0 <= offset <= last < n:  # reads inside its tile only
                return None
            ints += strides
            offsets.append(offset)
            continue
        s = (1,) * (nd - len(s)) + tuple(s)
        strides = [0] * nd
        step = 1
        for d in range(nd - 1, -1, -1):
            if s[d] != oshape[d] and s[d] != 1:
                return None
            strides[d] = step if s[d] != 1 else 0
            step *= s[d]
        ints += strides
        offsets.append(0)
    ints += offsets
    steps, consts = prog
    ints.append(len(steps) // 5)
    ints += steps
    return ints, consts


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
 NLL_GRAD, ARANGE, SGD, ADAMW, RMS_NORM, RMS_NORM_GRAD, ROPE) = range(1, 18)
INDEX_DTYPES = (torch.int64, torch.int32)  # index tiles the C kernels read (1: int64, 0: int32)
# what a C kernel finds wrong in its inputs (csrc/rows.h), raised as on CPU
BAD_INDEX, BAD_TARGET = 1, 2


def input_error(code: int, value: int) -> BaseException:
    """The exception PyTorch's CPU kernel raises where a C kernel reported ``code``."""
    if code == BAD_TARGET:
        return IndexError(f"Target {value} is out of bounds.")
    return IndexError("index out of range in self")


def fits_int32(*vs: int) -> bool:
    return all(-2**31 <= v < 2**31 for v in vs)


def rows_around(shape: tuple[int, ...], dim: int) -> tuple[int, int, int]:
    """(outer, n, inner) of a tile reduced along ``dim``."""
    if not shape:
        return 1, 1, 1
    return numel(shape[:dim]), shape[dim], numel(shape[dim + 1:])
