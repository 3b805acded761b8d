"""The one place where ATen ops without a tiled nntile kernel are handled.

Where PyTorch has a Meta kernel for the op, it is recorded into the graph as one
untiled task (backend/untiled.py). The rest (no Meta kernel, results whose shape
depends on values, random draws) run on the host with ``cpu_fallback=True``: inputs
are gathered (which flushes the graph), outputs and mutated arguments are moved back,
and the call is counted per op name with the reason. Otherwise a
``NotImplementedError`` (a ``RuntimeError``, as PyTorch raises for an op a backend
lacks) names the op and the reason. ``tiled_only=True`` raises for both.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.utils._pytree import tree_map

from torch_nntile import stats
from torch_nntile.backend import aten_calls, untiled
from torch_nntile.backend.device import DEVICE, from_cpu, ingress, resize, to_cpu, write
from torch_nntile.backend.sparse import route_to, sparse_to_cpu, write_sparse
from torch_nntile.graph.nodes import SESSION
from torch_nntile.ops.base import by_name
from torch_nntile.session import SESSION_STATE

_LIB = torch.library.Library("_", "IMPL")
_WARNED: set[str] = set()  # ops already warned about under TORCH_NNTILE_DEBUG
# Debugging: "0" sends what would be an untiled task to the host fallback instead.
_UNTILED = os.environ.get("TORCH_NNTILE_UNTILED", "1") != "0"
_OFF = untiled.HostOnly("untiled tasks are off (TORCH_NNTILE_UNTILED=0)")


def op_name(op: Any) -> str:
    schema = op._schema
    return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")


def _fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    return run_fallback(op, args, kwargs)


def run_fallback(op: Any, args: tuple, kwargs: dict, case: str | None = None) -> Any:
    """Run ``op`` as an untiled task, or on the CPU, or raise naming it (and the
    ``case`` nntile's tiled kernel lacks)."""
    name = op_name(op)
    state = SESSION_STATE
    if state.shut_down:
        raise RuntimeError("torch_nntile: the context has been shut down; nntile tensors can no longer be used")
    host = _OFF
    if _UNTILED:
        t0 = stats.enter()
        try:
            out = untiled.record(op, args, kwargs, name, _CPU_FORM.get(name), state.tiled_only)
        finally:
            stats.leave("record", t0)
        if type(out) is not untiled.HostOnly:
            stats.OP_CALLS[name] += 1
            if len(SESSION.pending) >= state.flush_ops:
                state.flush_early()
            return out
        host = out
    if state.tiled_only:
        raise NotImplementedError(
            f"torch_nntile: {name} has no tiled kernel on the nntile device{f' ({case})' if case else ''} "
            "and init_context(tiled_only=True) asks for tiled kernels only")
    if not state.cpu_fallback:
        if host.error is not None:
            raise host.error
        raise NotImplementedError(
            f"torch_nntile: {name} is not supported on the nntile device{f' ({case})' if case else ''}: "
            f"{host.reason} (init_context(cpu_fallback=True) runs it on the CPU)"
        )
    base = name.split(".")[0]
    stats.OP_CALLS[name] += 1
    stats.FALLBACK_CALLS[base] += 1
    if base not in stats.FALLBACK_SOURCE:
        stats.FALLBACK_SOURCE[base] = stats.user_frame()
    stats.FALLBACK_REASON[base] = host.reason
    if base not in _WARNED and stats.env_flag("TORCH_NNTILE_DEBUG"):
        _WARNED.add(base)
        stats.warn_user(f"torch_nntile: {base} is not implemented on nntile and runs on the CPU "
                        f"({host.reason}; called from {stats.user_frame()})")
    t0 = stats.enter()
    try:
        return _run_on_cpu(op, args, kwargs)
    finally:
        stats.leave("fallback", t0)


def _conv_backward(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, stride: Any,
                   padding: Any, dilation: Any, transposed: bool, output_padding: Any, groups: int,
                   output_mask: Any) -> Any:
    return _CONV_BACKWARD(*_conv_backward_args(grad_output, input, weight, stride, padding, dilation, transposed,
                                               output_padding, groups, output_mask, weight_shape=weight.shape))


_CONV_BACKWARD = torch.ops.aten.convolution_backward.default


def _conv_backward_args(grad_output: Any, input: Any, weight: Any, stride: Any, padding: Any, dilation: Any,
                        transposed: bool, output_padding: Any, groups: int, output_mask: Any,
                        weight_shape: tuple[int, ...]) -> tuple[Any, ...]:
    """``convolution_backward``'s arguments for the hook's: the bias's size (its output
    channels) from the weight's shape."""
    channels = weight_shape[1] * groups if transposed else weight_shape[0]
    return (grad_output, input, weight, (channels,), stride, padding, dilation, transposed, output_padding, groups,
            output_mask)


def _conv_backward_call(args: tuple[Any, ...], kw: dict[str, Any], shapes: tuple[tuple[int, ...], ...],
                        nout: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A task's ``_conv_backward`` arguments (tiles as ``Slot``s of its buffers
    ``shapes``, ``nout`` outputs first) as ``convolution_backward``'s."""
    named = by_name(torch.ops.aten.convolution_backward_overrideable.default, args, kw)
    return _conv_backward_args(**named, weight_shape=shapes[nout + named["weight"].i]), {}


aten_calls.REWRITES[_conv_backward] = (_CONV_BACKWARD, _conv_backward_call)


def _histc(x: torch.Tensor, bins: int = 100, min: float = 0, max: float = 0) -> torch.Tensor:
    """``histc`` as CUDA computes it, which takes integer inputs (CPU's kernel does not):
    bounds cast to the input's type, each value's bin ``(v - min) * bins // (max - min)``
    in integer arithmetic, the maximum in the last bin; the counts in the input's type."""
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        return torch.ops.aten.histc.default(x, bins, min, max)
    if bins <= 0:
        raise RuntimeError("torch.histc: bins must be > 0")
    if x.device.type == "meta":
        return x.new_empty(bins)
    v = x.reshape(-1).long()
    lo, hi = int(min), int(max)
    if lo == hi and v.numel():
        lo, hi = int(v.min()), int(v.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if lo > hi:
        raise RuntimeError("torch.histc: max must be larger than min")
    v = v[(v >= lo) & (v <= hi)]
    at = ((v - lo) * bins).div((hi - lo), rounding_mode="floor").clamp_(max=bins - 1)
    return torch.bincount(at, minlength=bins).to(x.dtype)


# The hooks PyTorch calls for a backend's own convolutions have no CPU kernel: the
# CPU runs the generic ops they stand for. An accelerator computes as CUDA does where
# CUDA and CPU differ: histc of integers.
_CPU_FORM: dict[str, Any] = {
    "aten::convolution_overrideable": torch.ops.aten.convolution.default,
    "aten::convolution_backward_overrideable": _conv_backward,
    "aten::histc": _histc,
}


def _run_on_cpu(op: Any, args: tuple, kwargs: dict) -> Any:
    """Gather the inputs, run ``op`` on the CPU, move results and mutations back."""
    originals: dict[int, torch.Tensor] = {}

    def to_host(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type == DEVICE:
            cpu = to_cpu(x) if x.layout == torch.strided else sparse_to_cpu(x)
            if x.requires_grad:  # some kernels keep what a backward needs only then
                cpu.requires_grad_()
            originals[id(cpu)] = x
            return cpu
        return x

    _check_lists(op, args)
    cpu_args, cpu_kwargs = _wrap_numbers(op, *tree_map(to_host, (args, kwargs)))
    if isinstance(cpu_kwargs.get("device"), torch.device) and cpu_kwargs["device"].type == DEVICE:
        cpu_kwargs["device"] = torch.device("cpu")  # a factory: made on the CPU, then moved in
    result = _CPU_FORM.get(op_name(op), op)(*cpu_args, **cpu_kwargs)
    flat = list(cpu_args) + list(cpu_kwargs.values())
    unmarked = untiled.UNMARKED_WRITES.get(op_name(op), ())
    for arg, value in zip(op._schema.arguments, flat if not cpu_kwargs else _by_schema(op, cpu_args, cpu_kwargs)):
        if (arg.alias_info is None or not arg.alias_info.is_write) and arg.name not in unmarked:
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:  # Tensor(a!) or Tensor(a!)[]
            orig = originals.get(id(v)) if isinstance(v, torch.Tensor) else None
            if orig is None:
                continue
            if orig.layout != torch.strided:
                write_sparse(orig, v)
            else:
                resize(orig, tuple(v.shape))  # out= arguments take the result's shape
                write(orig, ingress(v))

    def back(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            orig = originals.get(id(x))
            if orig is not None:
                return orig
            if x.device.type == "cpu":
                return from_cpu(x) if x.layout == torch.strided else x.to(DEVICE)
        return x

    return tree_map(back, result)


def _check_lists(op: Any, args: tuple) -> None:
    """Tensor lists (``cat``, ``stack``) mixing nntile and CPU tensors raise as PyTorch
    does for two devices; the dispatcher checks single tensor arguments itself."""
    for arg, v in zip(op._schema.arguments, args):
        if str(arg.type) == "List[Tensor]" and isinstance(v, (list, tuple)):
            devs = {t.device.type for t in v if isinstance(t, torch.Tensor) and (t.dim() or t.device.type == DEVICE)}
            if len(devs) > 1:
                raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                                   f"{DEVICE}:0 and cpu!")


def _wrap_numbers(op: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Python numbers where the schema takes a Tensor, as 0-dim tensors.

    A boxed kernel receives PyTorch's wrapped-number tensors (``x * 2.5`` inside a
    composite op) as plain numbers. The tensor made for one takes the dtype that the
    number and the first tensor argument promote to, as a wrapped number would."""
    schema = op._schema.arguments
    ref = next((x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)), None)

    def wrap(arg: Any, v: Any) -> Any:
        if isinstance(v, (bool, int, float, complex)) and arg.type.kind() == "TensorType":
            return torch.tensor(v, dtype=torch.result_type(ref, v) if ref is not None else None)
        return v

    args = tuple(wrap(a, v) for a, v in zip(schema, args)) + args[len(schema):]
    by_name = {a.name: a for a in schema}
    return args, {k: wrap(by_name[k], v) if k in by_name else v for k, v in kwargs.items()}


def _by_schema(op: Any, args: tuple, kwargs: dict) -> list[Any]:
    out = list(args)
    for arg in op._schema.arguments[len(args):]:
        out.append(kwargs.get(arg.name))
    return out


_LIB.fallback(_fallback, "PrivateUse1")
_LIB.fallback(_fallback, "SparsePrivateUse1")
_LIB.fallback(_fallback, "SparseCsrPrivateUse1")
route_to(lambda op: lambda *a, **k: _fallback(op, *a, **k))
# Those hooks have a default kernel that raises, so the boxed fallback never sees them.
_ATEN = torch.library.Library("aten", "IMPL")
for _name in _CPU_FORM:
    _op = getattr(torch.ops.aten, _name.removeprefix("aten::")).default
    _ATEN.impl(_op.__name__.split(".")[0], lambda *a, _op=_op, **k: _fallback(_op, *a, **k), "PrivateUse1")
_LIB.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
