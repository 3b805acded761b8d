"""Records of kernels over tiles of any dtype (``csrc/rows.h`` ``MAP`` and cast records,
run by ``csrc/typed.c``): comparisons, integer and bitwise arithmetic, ``where``,
``masked_fill``, ``isposinf`` / ``isneginf`` for ``call_out`` kernels (``native.CALLS``),
and conversions between dtypes (``cast_record``), each in PyTorch's common dtype of
its operands. See docs/architecture/kernels.md.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

import torch

from torch_nntile.kernels import CpuScalar
from torch_nntile.kernels.native import CALLS, MAP, Ref, Unsupported, broadcast_strides

# element types of csrc/rows.h (TNT_T_*), in its order
TYPES = {torch.bool: 0, torch.uint8: 1, torch.int8: 2, torch.int16: 3, torch.int32: 4, torch.int64: 5,
         torch.float32: 6, torch.float64: 7}
I64, F32, F64 = 5, 6, 7
# TNT_MAP_* ops
EQ, NE, LT, LE, GT, GE, ADD, SUB, MUL, WHERE, AND, OR, XOR, CAST = range(14)

Record = tuple[list[int], tuple[float, ...]]


def _dummy(a: Any, shapes: tuple[tuple[int, ...], ...], dtypes: tuple[torch.dtype, ...]) -> Any:
    """An operand as ``torch.result_type`` takes it: a tile as an empty tensor of its
    dtype and rank (0-dim tensors promote differently), a CPU scalar as its tensor."""
    if type(a) is Ref:
        return torch.empty((0,) * len(shapes[a]) if shapes[a] else (), dtype=dtypes[a])
    if type(a) is CpuScalar:
        return a.tensor()
    if type(a) in (bool, int, float):
        return a
    raise Unsupported


def common_dtype(args: list[Any], shapes: tuple[tuple[int, ...], ...], dtypes: tuple[torch.dtype, ...]) -> torch.dtype:
    """PyTorch's dtype for an op on the two operands ``args``."""
    a, b = (_dummy(x, shapes, dtypes) for x in args)
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        raise Unsupported
    return torch.result_type(a, b)


def _class(dt: torch.dtype) -> int:
    """The type a map computes in for dtype ``dt``: int64 for integers and bool."""
    if dt in (torch.float32, torch.float64):
        return TYPES[dt]
    if dt in TYPES:
        return I64
    raise Unsupported


def _immediate(x: Any, dt: torch.dtype, as_: int) -> tuple[int, int]:
    """Number ``x`` converted to ``dt`` as PyTorch converts it (wrapping integers), as
    the two 32-bit halves of an int64 (``as_`` I64) or of a double's bits."""
    if type(x) is CpuScalar:
        t = x.tensor()
    elif type(x) is bool:
        t = torch.tensor(x)
    elif type(x) is int:
        if not -2**63 <= x < 2**63:
            raise Unsupported
        t = torch.tensor(x, dtype=torch.int64)
    elif type(x) is float:
        t = torch.tensor(x, dtype=torch.float64)
    else:
        raise Unsupported
    v = t.to(dt).item()
    raw = struct.pack("<q", int(v)) if as_ == I64 else struct.pack("<d", float(v))
    return struct.unpack("<ii", raw)


def map_record(op: int, out: torch.dtype, dt: torch.dtype, args: list[Any], shapes: tuple[tuple[int, ...], ...],
               dtypes: tuple[torch.dtype, ...]) -> Record | None:
    """The ``MAP`` record of ``op`` on ``args`` (tiles as ``Ref``s, numbers) computing in
    ``dt`` and writing a tile of ``out``; where's condition is read as integers."""
    ctype = _class(dt)
    if dtypes[0] is not out or out not in TYPES:
        return None
    oshape = shapes[0] or (1,)
    nd = len(oshape)
    if nd > 16:
        return None
    ints = [MAP, op, ctype, TYPES[out], nd, *oshape]
    for k, a in enumerate(args):
        as_ = I64 if op == WHERE and k == 0 else ctype
        if type(a) is Ref:
            strides = broadcast_strides(shapes[a], oshape)
            if strides is None or dtypes[a] not in TYPES or as_ == I64 and dtypes[a].is_floating_point:
                return None
            ints += (TYPES[dtypes[a]], int(a), 0, 0, *strides)
        else:
            ints += (as_, -1, *_immediate(a, dt, as_), *(0,) * nd)
    return ints, ()


def _compare(op: int) -> Callable[..., Record | None]:
    def rec(args: tuple[Any, ...], kw: dict[str, Any], shapes: tuple[tuple[int, ...], ...],
            dtypes: tuple[torch.dtype, ...]) -> Record | None:
        if kw or len(args) != 2:
            return None
        return map_record(op, torch.bool, common_dtype(list(args), shapes, dtypes), list(args), shapes, dtypes)
    return rec


def _fits(x: Any, dt: torch.dtype) -> bool:
    """Whether ``x`` is an integer (not a bool: PyTorch refuses a bool alpha for integer
    results) that ``dt`` holds as it is."""
    info = torch.iinfo(dt)
    return type(x) is int and info.min <= x <= info.max


def _arith(op: int) -> Callable[..., Record | None]:
    """Integer add / sub (with alpha) and mul; float ones are ``native`` programs."""
    def rec(args: tuple[Any, ...], kw: dict[str, Any], shapes: tuple[tuple[int, ...], ...],
            dtypes: tuple[torch.dtype, ...]) -> Record | None:
        if len(args) != 2 or set(kw) - ({"alpha"} if op != MUL else set()):
            return None
        dt = common_dtype(list(args), shapes, dtypes)
        alpha = kw.get("alpha", 1)
        if dt.is_floating_point or dt.is_complex or dt is torch.bool or not _fits(alpha, dt):
            return None  # (PyTorch checks alpha's range: out of it, Python raises as it does)
        return map_record(op, dt, dt, [*args, alpha][:3 if op != MUL else 2], shapes, dtypes)
    return rec


def _bitwise(op: int) -> Callable[..., Record | None]:
    """Bitwise and / or / xor of integers and bools (PyTorch has none of floats)."""
    def rec(args: tuple[Any, ...], kw: dict[str, Any], shapes: tuple[tuple[int, ...], ...],
            dtypes: tuple[torch.dtype, ...]) -> Record | None:
        if kw or len(args) != 2:
            return None
        dt = common_dtype(list(args), shapes, dtypes)
        if dt.is_floating_point or dt.is_complex:
            return None
        return map_record(op, dt, dt, list(args), shapes, dtypes)
    return rec


def _where(args: tuple[Any, ...], kw: dict[str, Any], shapes: tuple[tuple[int, ...], ...],
           dtypes: tuple[torch.dtype, ...]) -> Record | None:
    if kw or len(args) != 3 or type(args[0]) is not Ref or dtypes[args[0]] is not torch.bool:
        return None
    dt = common_dtype(list(args[1:]), shapes, dtypes)
    return map_record(WHERE, dt, dt, list(args), shapes, dtypes)


def _is_inf(sign: float) -> Callable[..., Record | None]:
    """``isposinf`` / ``isneginf`` of a float tile: equality with that infinity."""
    def rec(args: tuple[Any, ...], kw: dict[str, Any], shapes: tuple[tuple[int, ...], ...],
            dtypes: tuple[torch.dtype, ...]) -> Record | None:
        if kw or len(args) != 1 or type(args[0]) is not Ref or not dtypes[args[0]].is_floating_point:
            return None
        return map_record(EQ, torch.bool, dtypes[args[0]], [args[0], sign], shapes, dtypes)
    return rec


def masked_fill_record(args: tuple[Any, ...], kw: dict[str, Any], shapes: tuple[tuple[int, ...], ...],
                       dtypes: tuple[torch.dtype, ...]) -> Record | None:
    """``masked_fill(a, mask, value)``: ``where(mask, value, a)`` in ``a``'s dtype, a
    number converted to it as PyTorch converts it (the op checked its range). A value
    tile of another dtype (whose range only the kernel can check) is left to Python."""
    if kw or len(args) != 3 or type(args[0]) is not Ref or type(args[1]) is not Ref:
        return None
    a, mask, value = args
    out = dtypes[0]
    if dtypes[a] is not out or dtypes[mask] is not torch.bool or type(value) is Ref and dtypes[value] is not out:
        return None
    return map_record(WHERE, out, out, [mask, value, a], shapes, dtypes)


def cast_record(params: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...],
                dtypes: tuple[torch.dtype, ...]) -> Record | None:
    """A copy of one tile into another dtype, converted as ``Tensor.to`` converts
    (integers wrap; a bool is whether the value is nonzero, NaN included). None for the
    same dtype (a plain copy) and for floats to integers, whose values out of the
    integer's range PyTorch leaves unspecified: Python runs those."""
    out, src = dtypes
    if out is src or out not in TYPES or src not in TYPES:
        return None
    if out is torch.bool:
        return map_record(NE, out, src if src.is_floating_point else torch.int64, [Ref(1), 0], shapes, dtypes)
    if src.is_floating_point and not out.is_floating_point:
        return None
    return map_record(CAST, out, out, [Ref(1)], shapes, dtypes)


CALLS.update({
    torch.eq: _compare(EQ), torch.ne: _compare(NE), torch.lt: _compare(LT), torch.le: _compare(LE),
    torch.gt: _compare(GT), torch.ge: _compare(GE),
    torch.add: _arith(ADD), torch.sub: _arith(SUB), torch.mul: _arith(MUL), torch.where: _where,
})
CALLS.update({torch.ops.aten.isposinf.out: _is_inf(math.inf), torch.ops.aten.isneginf.out: _is_inf(-math.inf)})
for _name, _op in (("bitwise_and", AND), ("bitwise_or", OR), ("bitwise_xor", XOR)):
    _packet = getattr(torch.ops.aten, _name)
    CALLS.update({getattr(_packet, ov): _bitwise(_op) for ov in ("Tensor_out", "Scalar_out", "Scalar_Tensor_out")
                  if ov in _packet.overloads()})
