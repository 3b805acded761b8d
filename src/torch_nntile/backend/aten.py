"""The ATen table: which ATen overloads nntile runs and how.

Each entry is a functional form returning a graph node; the in-place (``op_``)
and ``out=`` variants are derived from it when those overloads exist. Views are
computed on the Meta key and alias their base's storage. Everything not listed
goes to the boxed fallback (``fallback.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torch_nntile import stats
from torch_nntile.backend.device import (
    DEVICE,
    cast,
    from_cpu,
    is_nntile,
    new_tensor,
    read,
    read_transposable,
    to_cpu,
    write,
)
from torch_nntile.graph.nodes import DataNode
from torch_nntile.ops import linalg, reduce
from torch_nntile.ops.base import map_op
from torch_nntile.ops.data import fill, ingress
from torch_nntile.session import SESSION_STATE

aten = torch.ops.aten
_LIB = torch.library.Library("aten", "IMPL")
_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
REGISTERED: set[str] = set()
Scalar = int | float | bool


def _check_live() -> None:
    if SESSION_STATE.shut_down:
        raise RuntimeError("torch_nntile: the context has been shut down; nntile tensors can no longer be used")


def _register(name: str, fn: Callable[..., Any]) -> None:
    """Register ``fn`` for an ATen overload, counting its calls and record time."""
    if name.endswith(".default"):
        name = name[: -len(".default")]
    key = f"aten::{name}"
    calls, enter, leave = stats.OP_CALLS, stats.enter, stats.leave

    def recorded(*args: Any, **kw: Any) -> Any:
        calls[key] += 1
        t0 = enter()
        try:
            return fn(*args, **kw)
        finally:
            leave("record", t0)

    _LIB.impl(name, recorded, "PrivateUse1")
    REGISTERED.add(name)


def _overload_exists(name: str) -> bool:
    base, _, ov = name.partition(".")
    packet = getattr(aten, base, None)
    return packet is not None and (ov or "default") in packet.overloads()


def defop(*names: str, inplace: bool = True, out: bool = True) -> Callable:
    """Register a functional form ``f(*args) -> DataNode`` for ``names`` and,
    where ATen has them, its in-place and ``out=`` overloads."""

    def deco(f: Callable[..., DataNode]) -> Callable[..., DataNode]:
        for name in names:
            base, _, ov = name.partition(".")

            def functional(*args: Any, **kw: Any) -> torch.Tensor:
                _check_live()
                return new_tensor(f(*args, **kw))

            _register(name, functional)
            ip = f"{base}_.{ov}" if ov else f"{base}_"
            if inplace and _overload_exists(ip):
                def in_place(self: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
                    _check_live()
                    write(self, f(self, *args, **kw))
                    return self
                _register(ip, in_place)
            on = f"{base}.out" if ov in ("", "default", "Tensor") else f"{base}.{ov}_out"
            if out and _overload_exists(on):
                def out_variant(*args: Any, out: torch.Tensor, **kw: Any) -> torch.Tensor:
                    _check_live()
                    value = f(*args, **kw)
                    if tuple(out.shape) != value.shape:
                        raise RuntimeError(
                            f"torch_nntile: out= tensor of shape {list(out.shape)} for {name} "
                            f"needs shape {list(value.shape)} (resizing out= tensors is not supported)"
                        )
                    write(out, value)
                    return out
                _register(on, out_variant)
        return f

    return deco


# -- operands ------------------------------------------------------------------


def _operand(x: Any) -> DataNode | Scalar:
    """A tensor argument as a node; Python numbers stay scalars."""
    if isinstance(x, torch.Tensor):
        if x.device.type != DEVICE and x.dim() == 0:
            return x.item()
        return read(x)
    return x


def _promote(*xs: Any) -> torch.dtype:
    if len(xs) == 1:
        x = xs[0]
        return x.dtype if isinstance(x, torch.Tensor) else torch.tensor(x).dtype
    return torch.result_type(*xs[:2]) if len(xs) == 2 else torch.result_type(xs[0], torch.result_type(*xs[1:]))


def _float(dt: torch.dtype) -> torch.dtype:
    return dt if dt.is_floating_point or dt.is_complex else torch.get_default_dtype()


def _ew(name: str, kernel: Callable[..., Any], args: list[Any], dtype: torch.dtype) -> DataNode:
    """Elementwise op over tensor and scalar arguments; scalars are baked into the kernel."""
    vals = [_operand(a) for a in args]
    nodes = [v for v in vals if isinstance(v, DataNode)]
    if len(nodes) == len(vals):
        return map_op(name, lambda o, *t: kernel(*t, out=o), nodes, dtype)
    pos = [i for i, v in enumerate(vals) if isinstance(v, DataNode)]

    def k(o: torch.Tensor, *tiles: torch.Tensor) -> None:
        full = list(vals)
        for i, t in zip(pos, tiles):
            full[i] = t
        kernel(*full, out=o)

    return map_op(name, k, nodes, dtype)


# -- elementwise ---------------------------------------------------------------


@defop("add.Tensor", "add.Scalar")
def _add(self: Any, other: Any, alpha: Scalar = 1) -> DataNode:
    if alpha == 1:
        return _ew("add", torch.add, [self, other], _promote(self, other))
    return _ew("add", lambda a, b, out: torch.add(a, b, alpha=alpha, out=out), [self, other], _promote(self, other))


@defop("sub.Tensor", "sub.Scalar")
def _sub(self: Any, other: Any, alpha: Scalar = 1) -> DataNode:
    return _ew("sub", lambda a, b, out: torch.sub(a, b, alpha=alpha, out=out), [self, other], _promote(self, other))


@defop("rsub.Tensor", "rsub.Scalar", inplace=False)
def _rsub(self: Any, other: Any, alpha: Scalar = 1) -> DataNode:
    return _ew("rsub", lambda a, b, out: torch.sub(b, a, alpha=alpha, out=out), [self, other], _promote(self, other))


@defop("mul.Tensor", "mul.Scalar")
def _mul(self: Any, other: Any) -> DataNode:
    return _ew("mul", torch.mul, [self, other], _promote(self, other))


@defop("div.Tensor", "div.Scalar")
def _div(self: Any, other: Any) -> DataNode:
    return _ew("div", torch.div, [self, other], _float(_promote(self, other)))


@defop("div.Tensor_mode", "div.Scalar_mode")
def _div_mode(self: Any, other: Any, *, rounding_mode: str | None = None) -> DataNode:
    dt = _promote(self, other) if rounding_mode else _float(_promote(self, other))
    return _ew("div", lambda a, b, out: torch.div(a, b, rounding_mode=rounding_mode, out=out), [self, other], dt)


@defop("pow.Tensor_Scalar", "pow.Tensor_Tensor")
def _pow(self: Any, exponent: Any) -> DataNode:
    return _ew("pow", torch.pow, [self, exponent], _promote(self, exponent))


@defop("threshold_backward.default")
def _threshold_backward(grad_output: torch.Tensor, self: torch.Tensor, threshold: Scalar) -> DataNode:
    return _ew("threshold_backward",
               lambda g, x, out: torch.ops.aten.threshold_backward.grad_input(g, x, threshold, grad_input=out),
               [grad_output, self], grad_output.dtype)


@defop("where.self", inplace=False)
def _where(condition: torch.Tensor, self: Any, other: Any) -> DataNode:
    return _ew("where", torch.where, [condition, self, other], _promote(self, other))


def _unary(name: str, fn: Callable[..., Any], floating: bool = False) -> None:
    @defop(f"{name}.default")
    def f(self: torch.Tensor) -> DataNode:
        return _ew(name, fn, [self], _float(self.dtype) if floating else self.dtype)


for _name, _fn, _fl in [
    ("relu", lambda x, out: torch.clamp_min(x, 0, out=out), False),
    ("neg", torch.neg, False), ("abs", torch.abs, False), ("sgn", torch.sgn, False), ("sign", torch.sign, False),
    ("exp", torch.exp, True), ("log", torch.log, True), ("sqrt", torch.sqrt, True),
    ("rsqrt", torch.rsqrt, True), ("tanh", torch.tanh, True), ("sigmoid", torch.sigmoid, True),
    ("reciprocal", torch.reciprocal, True),
]:
    _unary(_name, _fn, _fl)


def _compare(name: str, fn: Callable[..., Any]) -> None:
    @defop(f"{name}.Tensor", f"{name}.Scalar", inplace=False)
    def f(self: Any, other: Any) -> DataNode:
        return _ew(name, fn, [self, other], torch.bool)


for _name, _fn in [("eq", torch.eq), ("ne", torch.ne), ("lt", torch.lt), ("le", torch.le),
                   ("gt", torch.gt), ("ge", torch.ge)]:
    _compare(_name, _fn)


# -- fills, copies, conversions --------------------------------------------------


def _fill_value(value: Any) -> Scalar:
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor with {value.dim()} dimensions.")
        return value.item() if value.device.type != DEVICE else to_cpu(value).item()
    return value


@defop("fill.Scalar", "fill.Tensor")
def _fill(self: torch.Tensor, value: Any) -> DataNode:
    return fill(tuple(self.shape), self.dtype, _fill_value(value))


@defop("zero.default")
def _zero(self: torch.Tensor) -> DataNode:
    return fill(tuple(self.shape), self.dtype, 0)


def _empty(size: Any, dtype: torch.dtype | None = None, layout: Any = None, device: Any = None,
           pin_memory: Any = None, memory_format: Any = None) -> torch.Tensor:
    _check_live()
    dt = dtype or torch.get_default_dtype()
    shape = tuple(int(s) for s in size)
    return new_tensor(fill(shape, dt, 0))


def _empty_strided(size: Any, stride: Any, dtype: torch.dtype | None = None, layout: Any = None,
                   device: Any = None, pin_memory: Any = None) -> torch.Tensor:
    return _empty(size, dtype)


_register("empty.memory_format", _empty)
_register("empty_strided", _empty_strided)


def _copy_(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    _check_live()
    if self.device.type != DEVICE:
        return self.copy_(to_cpu(src))
    value = read(src) if is_nntile(src) else ingress(src)
    write(self, value)
    return self


_register("copy_", _copy_)


def _to_copy(self: torch.Tensor, *, dtype: torch.dtype | None = None, layout: Any = None, device: Any = None,
             pin_memory: Any = None, non_blocking: bool = False, memory_format: Any = None) -> torch.Tensor:
    _check_live()
    dev = torch.device(device) if device is not None else self.device
    if dev.type == DEVICE:
        if self.device.type != DEVICE:
            t = from_cpu(self if dtype is None else self.to(dtype))
            return t
        node = read(self)
        return new_tensor(cast(node, dtype) if dtype is not None and dtype != node.dtype else node)
    if dev.type != "cpu":
        raise RuntimeError(f"torch_nntile: copies from nntile go to the CPU only, not to {dev}")
    cpu = to_cpu(self)
    return cpu.to(dtype) if dtype is not None else cpu


_register("_to_copy", _to_copy)


def _clone(self: torch.Tensor, *, memory_format: Any = None) -> torch.Tensor:
    _check_live()
    return new_tensor(read(self))  # values are immutable: a clone shares the node


_register("clone", _clone)


def _local_scalar_dense(self: torch.Tensor) -> Scalar:
    _check_live()
    return to_cpu(self).item()


_register("_local_scalar_dense", _local_scalar_dense)


def _random_inplace(name: str) -> None:
    """In-place random fills draw from the CPU generator, then move the values in."""

    def f(self: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
        _check_live()
        cpu = torch.empty(tuple(self.shape), dtype=self.dtype)
        getattr(cpu, name)(*args, **kw)
        write(self, ingress(cpu))
        return self

    _register(name, f)


for _name in ("normal_", "uniform_", "bernoulli_.float", "random_", "random_.from", "random_.to", "exponential_"):
    _random_inplace(_name)


# -- views: computed on Meta, aliasing the same storage -------------------------


def _meta_view(op: Any) -> Callable[..., torch.Tensor]:
    def f(*args: Any, **kw: Any) -> torch.Tensor:
        return op.redispatch(_META, *args, **kw)
    return f


for _name in ("as_strided", "view", "_reshape_alias"):
    _register(_name, _meta_view(getattr(aten, _name).default))


# -- linear algebra ------------------------------------------------------------


@defop("mm.default")
def _mm(self: torch.Tensor, mat2: torch.Tensor) -> DataNode:
    a, ta = read_transposable(self)
    b, tb = read_transposable(mat2)
    return linalg.mm(a, ta, b, tb, _promote(self, mat2))


@defop("addmm.default")
def _addmm(self: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: Scalar = 1, alpha: Scalar = 1) -> DataNode:
    a, ta = read_transposable(mat1)
    b, tb = read_transposable(mat2)
    if beta == 0:
        return linalg.mm(a, ta, b, tb, _promote(mat1, mat2), alpha=alpha)
    return linalg.mm(a, ta, b, tb, _promote(mat1, mat2), bias=read(self), alpha=alpha, beta=beta)


# -- reductions ----------------------------------------------------------------


def _red_dtype(self: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    return torch.int64 if not (self.dtype.is_floating_point or self.dtype.is_complex) else self.dtype


def _dims(dim: Any) -> tuple[int, ...]:
    if dim is None:
        return ()
    return (dim,) if isinstance(dim, int) else tuple(dim)


@defop("sum.default", inplace=False)
def _sum_all(self: torch.Tensor, *, dtype: torch.dtype | None = None) -> DataNode:
    return reduce.sum_op(read(self), (), False, _red_dtype(self, dtype))


@defop("sum.dim_IntList", inplace=False)
def _sum(self: torch.Tensor, dim: Any, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> DataNode:
    return reduce.sum_op(read(self), _dims(dim), keepdim, _red_dtype(self, dtype))


def _mean_dtype(self: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    dt = dtype or self.dtype
    if not (dt.is_floating_point or dt.is_complex):
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a floating point "
                           f"or complex dtype. Got: {dt}")
    return dt


@defop("mean.default", inplace=False)
def _mean_all(self: torch.Tensor, *, dtype: torch.dtype | None = None) -> DataNode:
    return reduce.sum_op(read(self), (), False, _mean_dtype(self, dtype), mean=True)


@defop("mean.dim", inplace=False)
def _mean(self: torch.Tensor, dim: Any, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> DataNode:
    return reduce.sum_op(read(self), _dims(dim), keepdim, _mean_dtype(self, dtype), mean=True)


# -- cross-entropy ----------------------------------------------------------------


@defop("_log_softmax.default", inplace=False)
def _log_softmax(self: torch.Tensor, dim: int, half_to_float: bool) -> DataNode:
    return reduce.log_softmax(read(self), dim)


@defop("_log_softmax_backward_data.default", inplace=False)
def _log_softmax_bw(grad_output: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype) -> DataNode:
    return reduce.log_softmax_backward(read(grad_output), read(output), dim, input_dtype)


def _nll_forward(self: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, reduction: int,
                 ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    _check_live()
    w = read(weight) if weight is not None else None
    loss, tw = reduce.nll_loss(read(self), read(target), w, reduction, ignore_index)
    return new_tensor(loss), new_tensor(tw)


_register("nll_loss_forward", _nll_forward)


@defop("nll_loss_backward.default", inplace=False)
def _nll_backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None,
                  reduction: int, ignore_index: int, total_weight: torch.Tensor) -> DataNode:
    w = read(weight) if weight is not None else None
    return reduce.nll_loss_backward(read(grad_output), read(self), read(target), w, reduction, ignore_index,
                                    read(total_weight))


# -- foreach ops (optimizers) ------------------------------------------------------


def _foreach(name: str) -> None:
    """``_foreach_X`` overloads applied element by element through ``X``."""
    base = name.split(".")[0][len("_foreach_"):]
    per = getattr(aten, base)

    def f(*args: Any, **kw: Any) -> Any:
        lists = [a for a in args if isinstance(a, (list, tuple))]
        n = len(lists[0])
        outs = []
        for i in range(n):
            el = [a[i] if isinstance(a, (list, tuple)) else a for a in args]
            outs.append(per(*el, **kw))
        return None if base.endswith("_") else outs

    _register(name, f)


for _base in ("add", "sub", "mul", "div"):
    for _ov in ("List", "Scalar", "ScalarList", "Tensor"):
        for _n in (f"_foreach_{_base}.{_ov}", f"_foreach_{_base}_.{_ov}"):
            if _overload_exists(_n):
                _foreach(_n)
for _n in ("_foreach_addcmul_.Scalar", "_foreach_addcdiv_.Scalar", "_foreach_lerp_.Scalar",
           "_foreach_neg_.default", "_foreach_sqrt.default", "_foreach_sqrt_.default", "_foreach_zero_.default",
           "_foreach_copy_.default", "_foreach_addcmul.Scalar", "_foreach_addcdiv.Scalar", "_foreach_neg.default"):
    if _overload_exists(_n):
        _foreach(_n)


@defop("addcmul.default")
def _addcmul(self: Any, tensor1: Any, tensor2: Any, *, value: Scalar = 1) -> DataNode:
    return _ew("addcmul", lambda a, b, c, out: torch.addcmul(a, b, c, value=value, out=out),
               [self, tensor1, tensor2], _promote(self, tensor1, tensor2))


@defop("addcdiv.default")
def _addcdiv(self: Any, tensor1: Any, tensor2: Any, *, value: Scalar = 1) -> DataNode:
    return _ew("addcdiv", lambda a, b, c, out: torch.addcdiv(a, b, c, value=value, out=out),
               [self, tensor1, tensor2], _promote(self, tensor1, tensor2))


@defop("lerp.Scalar")
def _lerp(self: Any, end: Any, weight: Scalar) -> DataNode:
    return _ew("lerp", lambda a, b, out: torch.lerp(a, b, weight, out=out), [self, end], _promote(self, end))


