"""ATen table: the elementwise family (arithmetic, unary math, comparisons, logical and
bitwise ops, clamps, activations and their backward ops), each a functional form plus
its derived forms. All are tiled: one task per output tile."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from torch_nntile.backend.aten import Scalar, as_floating, aten, defop, ew, forms, promote, type_name
from torch_nntile.backend.device import DEVICE
from torch_nntile.graph.nodes import DataNode
from torch_nntile.kernels import native, typed

# -- elementwise ---------------------------------------------------------------


@defop("add.Tensor", "add.Scalar")
def _add(self: Any, other: Any, alpha: Scalar = 1) -> DataNode:
    if alpha == 1:
        return ew("add", torch.add, [self, other], promote(self, other))
    return ew("add", torch.add, [self, other], promote(self, other), alpha=alpha)


@defop("sub.Tensor", "sub.Scalar")
def _sub(self: Any, other: Any, alpha: Scalar = 1) -> DataNode:
    return ew("sub", torch.sub, [self, other], promote(self, other), alpha=alpha)


@defop("rsub.Tensor", "rsub.Scalar", inplace=False)
def _rsub(self: Any, other: Any, alpha: Scalar = 1) -> DataNode:
    return ew("rsub", torch.sub, [other, self], promote(self, other), alpha=alpha)


@defop("mul.Tensor", "mul.Scalar")
def _mul(self: Any, other: Any) -> DataNode:
    return ew("mul", torch.mul, [self, other], promote(self, other))


@defop("div.Tensor", "div.Scalar")
def _div(self: Any, other: Any) -> DataNode:
    return ew("div", torch.div, [self, other], as_floating(promote(self, other)))


@defop("div.Tensor_mode", "div.Scalar_mode")
def _div_mode(self: Any, other: Any, *, rounding_mode: str | None = None) -> DataNode:
    dt = promote(self, other) if rounding_mode else as_floating(promote(self, other))
    return ew("div", torch.div, [self, other], dt, rounding_mode=rounding_mode)


@defop("pow.Tensor_Scalar", "pow.Tensor_Tensor")
def _pow(self: Any, exponent: Any) -> DataNode:
    return ew("pow", torch.pow, [self, exponent], promote(self, exponent))


def grad_input_out(op: Any, *args: Any, out: torch.Tensor) -> None:
    """The kernel of backward ops whose ``out=`` argument is named ``grad_input``."""
    op(*args, grad_input=out)


def relu_out(x: torch.Tensor, out: torch.Tensor) -> None:
    torch.clamp_min(x, 0, out=out)


@defop("threshold_backward.default")
def _threshold_backward(grad_output: torch.Tensor, self: torch.Tensor, threshold: Scalar) -> DataNode:
    return ew("threshold_backward", grad_input_out, [aten.threshold_backward.grad_input, grad_output, self, threshold],
              grad_output.dtype)


@defop("where.self", inplace=False)
def _where(condition: torch.Tensor, self: Any, other: Any) -> DataNode:
    return ew("where", torch.where, [condition, self, other], promote(self, other))


def _unary(name: str, fn: Callable[..., Any], floating: bool = False) -> None:
    @defop(f"{name}.default")
    def f(self: torch.Tensor) -> DataNode:
        if name == "neg" and self.dtype == torch.bool:
            raise RuntimeError("Negation, the `-` operator, on a bool tensor is not supported. If you are trying to "
                               "invert a mask, use the `~` or `logical_not()` operator instead.")
        dt = as_floating(self.dtype) if floating else self.dtype
        return ew(name, fn, [self], dt.to_real() if name == "abs" else dt)  # |complex| is real


for _name, _fn, _fl in [
    ("relu", relu_out, False),
    ("neg", torch.neg, False), ("abs", torch.abs, False), ("sgn", torch.sgn, False), ("sign", torch.sign, False),
    ("exp", torch.exp, True), ("log", torch.log, True), ("sqrt", torch.sqrt, True),
    ("rsqrt", torch.rsqrt, True), ("tanh", torch.tanh, True), ("sigmoid", torch.sigmoid, True),
    ("reciprocal", torch.reciprocal, True), ("_conj_physical", torch.conj_physical, False),
]:
    _unary(_name, _fn, _fl)


def _compare(name: str, fn: Callable[..., Any]) -> None:
    @defop(f"{name}.Tensor", f"{name}.Scalar", inplace=False)
    def f(self: Any, other: Any) -> DataNode:
        return ew(name, fn, [self, other], torch.bool)


for _name, _fn in [("eq", torch.eq), ("ne", torch.ne), ("lt", torch.lt), ("le", torch.le),
                   ("gt", torch.gt), ("ge", torch.ge)]:
    _compare(_name, _fn)


@defop("addcmul.default")
def _addcmul(self: Any, tensor1: Any, tensor2: Any, *, value: Scalar = 1) -> DataNode:
    return ew("addcmul", torch.addcmul, [self, tensor1, tensor2], promote(self, tensor1, tensor2), value=value)


@defop("addcdiv.default")
def _addcdiv(self: Any, tensor1: Any, tensor2: Any, *, value: Scalar = 1) -> DataNode:
    return ew("addcdiv", torch.addcdiv, [self, tensor1, tensor2], promote(self, tensor1, tensor2), value=value)


@defop("lerp.Scalar")
def _lerp(self: Any, end: Any, weight: Scalar) -> DataNode:
    return ew("lerp", torch.lerp, [self, end, weight], promote(self, end))


@defop("lerp.Tensor")
def _lerp_tensor(self: Any, end: Any, weight: Any) -> DataNode:
    return ew("lerp", torch.lerp, [self, end, weight], promote(self, end))


@defop("maximum.default")
def _maximum(self: Any, other: Any) -> DataNode:
    return ew("maximum", torch.maximum, [self, other], promote(self, other))


@defop("minimum.default")
def _minimum(self: Any, other: Any) -> DataNode:
    return ew("minimum", torch.minimum, [self, other], promote(self, other))


def _clamp_dtype(self: Any, *bounds: Any) -> torch.dtype:
    given = [b for b in bounds if b is not None]
    if not given:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    return promote(self, *given)


@defop("clamp.default", "clamp.Tensor")
def _clamp(self: Any, min: Any = None, max: Any = None) -> DataNode:
    return ew("clamp", torch.clamp, [self, min, max], _clamp_dtype(self, min, max))


def _clamp_side(name: str, fn: Callable[..., Any]) -> None:
    @defop(f"{name}.default", f"{name}.Tensor")
    def f(self: Any, bound: Any) -> DataNode:
        return ew(name, fn, [self, bound], promote(self, bound))


_clamp_side("clamp_min", torch.clamp_min)
_clamp_side("clamp_max", torch.clamp_max)


@defop("pow.Scalar", inplace=False)
def _pow_scalar_base(self: Scalar, exponent: torch.Tensor) -> DataNode:
    return ew("pow", torch.pow, [self, exponent], promote(self, exponent))


def _pow_same(self: torch.Tensor, exponent: Any) -> DataNode:
    return ew("pow", torch.pow, [self, exponent], promote(self, exponent))


forms(_pow_same, inplace="pow_.Scalar")
forms(_pow_same, inplace="pow_.Tensor")


# -- ops that the backward of maximum / clamp / lerp asks for ----------------------


def _masked_fill_kernel(a: torch.Tensor, mask: torch.Tensor, value: Any, out: torch.Tensor) -> None:
    out.copy_(a)
    out.masked_fill_(mask, value)


native.CALLS[_masked_fill_kernel] = typed.masked_fill_record  # a where in C


@defop("masked_fill.Scalar", "masked_fill.Tensor")
def _masked_fill(self: torch.Tensor, mask: torch.Tensor, value: Any) -> DataNode:
    if isinstance(value, torch.Tensor) and value.dim() != 0:
        raise RuntimeError(f"masked_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                           f"{value.dim()} dimension(s).")
    if not self.dtype.is_complex and (isinstance(value, complex) or
                                      isinstance(value, torch.Tensor) and value.dtype.is_complex):
        raise RuntimeError(f"value cannot be converted to type {type_name(self.dtype).lower()} without overflow")
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_fill_ only supports boolean masks, but got mask with dtype {mask.dtype}")
    if not isinstance(value, torch.Tensor) or value.device.type == "cpu":  # PyTorch's range check of the value
        torch.empty(0, dtype=self.dtype).masked_fill_(torch.empty(0, dtype=torch.bool), value)
    return ew("masked_fill", _masked_fill_kernel, [self, mask, value], self.dtype)



def _logical(name: str, fn: Callable[..., Any]) -> None:
    @defop(f"{name}.default")
    def f(self: Any, other: Any) -> DataNode:
        return ew(name, fn, [self, other], torch.bool)


for _name, _fn in [("logical_and", torch.logical_and), ("logical_or", torch.logical_or),
                   ("logical_xor", torch.logical_xor)]:
    _logical(_name, _fn)


@defop("logical_not.default")
def _logical_not(self: torch.Tensor) -> DataNode:
    return ew("logical_not", torch.logical_not, [self], torch.bool)


def _activation_backward(name: str) -> None:
    op = getattr(aten, name).grad_input

    @defop(f"{name}.default", out=False)
    def f(grad_output: torch.Tensor, output: torch.Tensor) -> DataNode:
        return ew(name, grad_input_out, [op, grad_output, output], promote(grad_output, output))

    forms(f, out=f"{name}.grad_input")


for _name in ("sigmoid_backward", "tanh_backward"):
    _activation_backward(_name)


# -- C programs of the helper kernels above (kernels.native) ----------------------


def _helper_rule(p: native.Program, args: list[Any], kw: dict[str, Any]) -> native.Ref:
    return native.apply_rule(p, args[0], args[1:], kw)  # helper(op, *args, **kw): op's rule


def _relu_rule(p: native.Program, args: list[Any], kw: dict[str, Any]) -> native.Ref:
    if kw or len(args) != 1:
        raise native.Unsupported
    return p.emit(native.CLAMP_MIN, args[0], 0)


# -- dtype rules by probing the CPU ------------------------------------------------
#
# The ops below take their result dtype (and their dtype errors, with PyTorch's
# messages) from the CPU op itself, run once per combination of argument dtypes on
# one-element tensors and cached: PyTorch's rules differ op by op (int -> float for
# sin, int kept for floor, bool for signbit, no floats for bitwise_and).


def _probe_key(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        if x.device.type != DEVICE and x.dim() == 0:
            return ("c", x.dtype)  # a CPU 0-dim tensor promotes as a 0-dim tensor
        return ("t", x.dtype, x.dim() > 0)
    if x is None:
        return ("n",)
    return ("s", type(x), x)  # the type too: True, 1 and 1.0 are equal keys


def _probe_value(k: Any) -> Any:
    if k[0] == "t":
        return torch.ones(1 if k[2] else (), dtype=k[1])
    if k[0] == "c":
        return torch.ones((), dtype=k[1])
    return None if k[0] == "n" else k[2]


@functools.lru_cache(maxsize=4096)
def _probe(op: Any, keys: tuple[Any, ...], kw: tuple[tuple[str, Any], ...], default: torch.dtype) -> torch.dtype:
    return op(*(_probe_value(k) for k in keys), **dict(kw)).dtype


def result_dtype(op: Any, args: list[Any], kw: dict[str, Any]) -> torch.dtype:
    """The dtype CPU PyTorch gives ``op(*args, **kw)``; raises what it raises for the dtypes."""
    try:
        return _probe(op, tuple(_probe_key(a) for a in args), tuple(kw.items()), torch.get_default_dtype())
    except TypeError as e:
        if "unhashable" in str(e):  # a list argument: probe uncached
            return op(*(_probe_value(_probe_key(a)) for a in args), **kw).dtype
        raise


def aten_out(op: Any, *args: Any, out: torch.Tensor, **kw: Any) -> None:
    """The kernel of ops run through their ATen ``out=`` overload ``op``."""
    op(*args, **kw, out=out)


def _out_overload(name: str, ov: str) -> Any:
    packet = getattr(aten, name)
    names = [f"{ov}_out", f"Out{ov}"] if ov != "default" else []
    for o in names + (["out"] if ov in ("default", "Tensor") else []):
        if o in packet.overloads():
            return getattr(packet, o)
    return None


def _pointwise(name: str, kernel: Callable[..., Any] | None = None, *overloads: str,
               inplace: bool = True, out: bool = True) -> dict[str, Callable[..., DataNode]]:
    """Register ``name``'s overloads (default: ``name.default``) as tiled elementwise ops:
    the tile kernel is ``kernel(*args, **kw, out=tile)`` (default: the overload's ATen
    ``out=`` form), the dtype the CPU op's. Returns the functional forms by overload."""
    made = {}
    for ov in overloads or ("default",):
        op = getattr(getattr(aten, name), ov)
        out_op = _out_overload(name, ov) if kernel is None else None

        def f(*args: Any, _op: Any = op, _out: Any = out_op, **kw: Any) -> DataNode:
            dt = result_dtype(_op, list(args), kw)
            if _out is None:
                return ew(name, kernel, list(args), dt, **kw)
            return ew(name, aten_out, [_out, *args], dt, **kw)

        made[ov] = defop(f"{name}.{ov}", inplace=inplace, out=out)(f)
    return made


def isnan_out(x: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(torch.isnan(x))


def isinf_out(x: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(torch.isinf(x))


for _name in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erf", "erfc",
              "erfinv", "expm1", "log1p", "log2", "log10", "exp2", "floor", "ceil", "trunc", "frac", "bitwise_not",
              "nan_to_num"):
    _pointwise(_name)
_pointwise("round", None, "default", "decimals")
for _name in ("signbit", "isposinf", "isneginf"):
    _pointwise(_name, None, inplace=False)
_pointwise("isnan", isnan_out, inplace=False)
_pointwise("isinf", isinf_out, inplace=False)

for _name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    _pointwise(_name, None, "Tensor", "Scalar", "Scalar_Tensor")
for _name in ("atan2", "hypot", "fmax", "fmin"):
    _pointwise(_name)
_pointwise("fmod", None, "Tensor", "Scalar")
_pointwise("remainder", None, "Tensor", "Scalar", "Scalar_Tensor")
_pointwise("copysign", None, "Tensor", "Scalar")
_xlogy = _pointwise("xlogy", None, "Tensor", "Scalar_Self", "Scalar_Other")
for _ov in ("Tensor", "Scalar_Self", "Scalar_Other"):
    forms(_xlogy[_ov], out=f"xlogy.Out{_ov}")
_floor_divide = _pointwise("floor_divide", None, "default", "Scalar")
forms(_floor_divide["default"], inplace="floor_divide_.Tensor")
_pointwise("sinc")


# -- activations and their backward ops ------------------------------------------


def grad_input_kw(op: Any, *args: Any, out: torch.Tensor, **kw: Any) -> None:
    op(*args, **kw, grad_input=out)


def _activation(name: str, backward: str | None) -> None:
    fwd, fwd_out = getattr(aten, name).default, getattr(aten, name).out

    @defop(f"{name}.default")
    def f(self: torch.Tensor, *args: Any, **kw: Any) -> DataNode:
        return ew(name, aten_out, [fwd_out, self, *args], result_dtype(fwd, [self, *args], kw), **kw)

    if backward is None:
        return
    bwd, bwd_out = getattr(aten, backward).default, getattr(aten, backward).grad_input

    def b(*args: Any, **kw: Any) -> DataNode:
        return ew(backward, grad_input_kw, [bwd_out, *args], result_dtype(bwd, list(args), kw), **kw)

    defop(f"{backward}.default", out=False)(b)
    forms(b, out=f"{backward}.grad_input")


for _name, _bwd in [("gelu", "gelu_backward"), ("silu", None), ("softplus", "softplus_backward"),
                    ("elu", "elu_backward"), ("leaky_relu", "leaky_relu_backward"), ("hardtanh", "hardtanh_backward"),
                    ("mish", None)]:
    _activation(_name, _bwd)
# silu_backward and mish_backward have composite kernels (sigmoid, mul, ...): they
# decompose into native ops, and registering them would hide the decomposition.

native.RULES.update({grad_input_out: _helper_rule, grad_input_kw: _helper_rule, aten_out: _helper_rule,
                     relu_out: _relu_rule})


def _helper_call(args: tuple[Any, ...], kw: dict[str, Any], shapes: tuple[tuple[int, ...], ...],
                 dtypes: tuple[torch.dtype, ...]) -> Any:
    rec = native.CALLS.get(args[0])  # aten_out(op, *args): op's typed record
    return rec(args[1:], kw, shapes, dtypes) if rec is not None else None


native.CALLS[aten_out] = _helper_call
