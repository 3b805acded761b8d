"""ATen table: the elementwise family (arithmetic, unary, comparisons, logical, clamps,
the backward ops of activations), each a functional form plus its derived forms."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torch_nntile.backend.aten import Scalar, as_floating, aten, defop, ew, forms, promote, type_name
from torch_nntile.graph.nodes import DataNode

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
