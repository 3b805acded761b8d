"""The ATen table's machinery: which ATen overloads nntile runs and how.

Each entry (in ``table_*.py``) is a functional form returning a graph node; the
in-place (``op_``) and ``out=`` variants are derived from it when those overloads
exist. A form raising ``NotNative`` hands that call to the fallback. Everything not
registered goes to the boxed fallback (``fallback.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from threading import get_ident
from typing import Any

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from torch_nntile import stats
from torch_nntile.backend.device import (
    NNTILE,
    new_tensor,
    read,
    resize_output,
    write,
)
from torch_nntile.backend.fallback import run_fallback
from torch_nntile.graph.nodes import SESSION, DataNode
from torch_nntile.kernels import CpuScalar, Kernel
from torch_nntile.ops.base import TILE, NotNative, call_out, map_op
from torch_nntile.session import SESSION_STATE

aten = torch.ops.aten
_LIB = torch.library.Library("aten", "IMPL")
META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
REGISTERED: set[str] = set()
IMPLS: dict[str, Callable[..., Any]] = {}  # overload -> its kernel here, for calls from our own kernels
# overload -> (its functional form, whether the overload is the in-place one) for those defop / forms derive
FORMS: dict[str, tuple[Callable[..., DataNode], bool]] = {}
Scalar = int | float | bool
_DEFAULT_PROMOTION = ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT


def check_live() -> None:
    if SESSION_STATE.shut_down:
        raise RuntimeError("torch_nntile: the context has been shut down; nntile tensors can no longer be used")


def register(name: str, fn: Callable[..., Any]) -> None:
    """Register ``fn`` for an ATen overload (or a ``torch_nntile::`` op that ``define``
    made), counting its calls and record time."""
    if name.endswith(".default"):
        name = name[: -len(".default")]
    namespace, _, name = name.rpartition("::")
    namespace = namespace or "aten"
    key = f"{namespace}::{name}"
    calls, enter, leave, graph, state = stats.OP_CALLS, stats.enter, stats.leave, SESSION, SESSION_STATE
    base, _, ov = name.partition(".")
    overload = getattr(getattr(getattr(torch.ops, namespace), base), ov or "default")

    def recorded(*args: Any, **kw: Any) -> Any:
        thread = get_ident()
        if thread != state.thread:
            state.thread_switched(thread)
        t0 = enter()
        try:
            out = fn(*args, **kw)
        except NotNative as e:
            leave("record", t0)
            return run_fallback(overload, args, kw, str(e))
        except BaseException:
            leave("record", t0)
            raise
        calls[key] += 1
        leave("record", t0)
        if len(graph.pending) >= state.flush_ops:
            state.flush_early()
        return out

    if namespace != "aten":
        _OWN.impl(name, recorded, "PrivateUse1")
        return
    _LIB.impl(name, recorded, "PrivateUse1")
    REGISTERED.add(name)
    IMPLS[name] = recorded
    FORMS.pop(name, None)  # a form registered for ``name`` before is not its kernel now


_OWN = torch.library.Library("torch_nntile", "DEF")


def override_composite(name: str, fn: Callable[..., Any]) -> None:
    """Run ``fn`` for a CompositeImplicitAutograd ATen op on nntile tensors in place of
    its decomposition: at the autograd key (grad mode on or off) and at the backend
    key, which calls reach where autograd is excluded (inference mode)."""
    _LIB.impl(name, fn, "AutogradPrivateUse1")
    _LIB.impl(name, fn, "PrivateUse1")


def define(schema: str, cpu: Callable[..., Any], nntile: Callable[..., Any]) -> Any:
    """Define the op ``torch_nntile::<schema>``: ``cpu`` is its eager CPU kernel (plain
    torch code, also what the fallback runs), ``nntile`` records it (returning tensors,
    or raising ``NotNative`` to fall back). For ops of our own API that have no single
    ATen op: called inside an ``autograd.Function``, each records one graph op. Returns
    the op's default overload."""
    name = schema.partition("(")[0]
    _OWN.define(schema)
    _OWN.impl(name, cpu, "CPU")
    register(f"torch_nntile::{name}", nntile)
    return getattr(torch.ops.torch_nntile, name).default


def overload_exists(name: str) -> bool:
    base, _, ov = name.partition(".")
    packet = getattr(aten, base, None)
    return packet is not None and (ov or "default") in packet.overloads()


def defop(*names: str, inplace: bool = True, out: bool = True) -> Callable:
    """Register a functional form ``f(*args) -> DataNode`` for ``names`` and,
    where ATen has them, its in-place (``X_.ov``) and ``out=`` (``X.ov_out``, or
    ``X.out`` for the default / Tensor overload) overloads."""

    def deco(f: Callable[..., DataNode]) -> Callable[..., DataNode]:
        for name in names:
            base, _, ov = name.partition(".")

            def functional(*args: Any, **kw: Any) -> torch.Tensor:
                check_live()
                return new_tensor(f(*args, **kw))

            register(name, functional)
            FORMS[name.removesuffix(".default")] = (f, False)
            ip = f"{base}_.{ov}" if ov else f"{base}_"
            outs = [f"{base}.{ov}_out"] if ov and ov != "default" else []
            outs += [f"{base}.out"] if ov in ("", "default", "Tensor") else []
            forms(f, inplace=ip if inplace and overload_exists(ip) else None,
                  out=next((o for o in outs if overload_exists(o)), None) if out else None)
        return f

    return deco


def forms(f: Callable[..., DataNode], inplace: str | None = None, out: str | None = None) -> None:
    """Register the in-place overload ``inplace`` and the ``out=`` overload ``out`` of
    the functional form ``f`` (for names defop's rule does not derive, e.g.
    ``pow_.Scalar`` belongs to ``pow.Tensor_Scalar``)."""
    if inplace is not None:
        def in_place(self: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
            check_live()
            write_inplace(self, f(self, *args, **kw))
            return self
        register(inplace, in_place)
        FORMS[inplace.removesuffix(".default")] = (f, True)
    if out is not None:
        base, _, ov = out.partition(".")
        schema = getattr(getattr(aten, base), ov)._schema
        out_kw = next(a.name for a in schema.arguments if a.kwarg_only and a.alias_info is not None)

        def out_variant(*args: Any, **kw: Any) -> torch.Tensor:
            check_live()
            dest = kw.pop(out_kw)
            value = f(*args, **kw)
            resize_output(dest, value.shape)
            write(dest, value)
            return dest
        register(out, out_variant)


def type_name(dt: torch.dtype) -> str:
    return torch.empty(0, dtype=dt).type().removeprefix("torch.").removesuffix("Tensor")


def inplace_error(t: torch.Tensor, value: DataNode) -> str | None:
    """Why ``value`` cannot be an in-place op's result in ``t`` (CPU's message), or None:
    it must have ``t``'s shape and a dtype ``t`` can hold."""
    if value.shape != tuple(t.shape):
        return f"output with shape {list(t.shape)} doesn't match the broadcast shape {list(value.shape)}"
    if value.dtype != t.dtype and not torch.can_cast(value.dtype, t.dtype):
        return f"result type {type_name(value.dtype)} can't be cast to the desired output type {type_name(t.dtype)}"
    return None


def write_inplace(t: torch.Tensor, value: DataNode) -> None:
    """The result of an in-place op into ``t`` (``inplace_error`` raised if it cannot be)."""
    error = inplace_error(t, value)
    if error is not None:
        raise RuntimeError(error)
    write(t, value)


# -- operands ------------------------------------------------------------------


def _operand(x: Any) -> DataNode | Any:
    """A tensor argument as a node; a CPU 0-dim tensor as a ``CpuScalar`` (it promotes
    as a tensor, and the caller may change it before the kernel runs); others as given."""
    if isinstance(x, torch.Tensor):
        if x.device != NNTILE and x.dim() == 0:
            return CpuScalar(x)
        return read(x)
    return x


def promote(*xs: Any) -> torch.dtype:
    """PyTorch's result dtype for tensors and numbers (dimensioned tensors over 0-dim
    tensors over Python numbers), for any number of operands."""
    first = xs[0]
    if isinstance(first, torch.Tensor):  # the common case, decided without PyTorch's general rule
        dt = first.dtype
        if all(type(x) is torch.Tensor and x.dtype is dt or _keeps(x, dt) for x in xs[1:]):
            return dt
    return elementwise_dtypes(*xs, type_promotion_kind=_DEFAULT_PROMOTION)[1]


def _keeps(x: Any, dt: torch.dtype) -> bool:
    """Whether Python number ``x`` leaves a tensor of dtype ``dt`` at that dtype."""
    kind = type(x)
    if kind is bool:
        return True
    if kind is int:
        return dt is not torch.bool
    return kind is float and dt.is_floating_point or dt.is_complex and kind in (float, complex)


def as_floating(dt: torch.dtype) -> torch.dtype:
    return dt if dt.is_floating_point or dt.is_complex else torch.get_default_dtype()


def out_kernel(fn: Callable[..., Any], args: list[Any], **kw: Any) -> tuple[Kernel, list[DataNode]]:
    """The kernel ``fn(*args, **kw, out=tile)`` with the tensor arguments replaced by
    their tiles (the nodes returned, in order) and the others baked in as data."""
    consts, nodes = [], []
    for a in args:
        v = _operand(a)
        if type(v) is DataNode:
            nodes.append(v)
            consts.append(TILE)  # the kernel keeps no input values alive
        else:
            consts.append(v)
    return Kernel(call_out, fn, tuple(kw.items()) if kw else (), tuple(consts)), nodes


def ew(name: str, fn: Callable[..., Any], args: list[Any], dtype: torch.dtype, **kw: Any) -> DataNode:
    """Elementwise op: ``fn(*args, **kw, out=tile)`` per output tile over the (broadcast)
    tiles of the tensor arguments."""
    kernel, nodes = out_kernel(fn, args, **kw)
    return map_op(name, kernel, nodes, dtype)
