"""The one place where ATen ops without an nntile implementation are handled.

With ``cpu_fallback=True`` the op runs on the CPU: inputs are gathered (which
flushes the graph), outputs and mutated arguments are moved back, and the call
is counted per op name. Otherwise a ``RuntimeError`` names the op.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

from torch_nntile import stats
from torch_nntile.backend.device import DEVICE, from_cpu, ingress, to_cpu, write
from torch_nntile.session import SESSION_STATE

_LIB = torch.library.Library("_", "IMPL")
_WARNED: set[str] = set()  # ops already warned about under TORCH_NNTILE_DEBUG


def op_name(op: Any) -> str:
    schema = op._schema
    return f"aten::{schema.name.split('::')[-1]}" + (f".{schema.overload_name}" if schema.overload_name else "")


def _fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    name = op_name(op)
    if SESSION_STATE.shut_down:
        raise RuntimeError("torch_nntile: the context has been shut down; nntile tensors can no longer be used")
    if not SESSION_STATE.cpu_fallback:
        raise RuntimeError(
            f"torch_nntile: {name} is not supported on the nntile device "
            "(init_context(cpu_fallback=True) runs unsupported ops on the CPU)"
        )
    base = name.split(".")[0]
    stats.OP_CALLS[name] += 1
    stats.FALLBACK_CALLS[base] += 1
    if base not in stats.FALLBACK_SOURCE:
        stats.FALLBACK_SOURCE[base] = stats.user_frame()
    if base not in _WARNED and stats.env_flag("TORCH_NNTILE_DEBUG"):
        _WARNED.add(base)
        stats.warn_user(f"torch_nntile: {base} is not implemented on nntile and runs on the CPU "
                        f"(called from {stats.user_frame()})")
    t0 = stats.enter()
    try:
        return _run_on_cpu(op, args, kwargs)
    finally:
        stats.leave("fallback", t0)


def _run_on_cpu(op: Any, args: tuple, kwargs: dict) -> Any:
    """Gather the inputs, run ``op`` on the CPU, move results and mutations back."""
    originals: dict[int, torch.Tensor] = {}

    def to_host(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type == DEVICE:
            cpu = to_cpu(x)
            originals[id(cpu)] = x
            return cpu
        return x

    cpu_args, cpu_kwargs = tree_map(to_host, (args, kwargs))
    result = op(*cpu_args, **cpu_kwargs)
    flat = list(cpu_args) + list(cpu_kwargs.values())
    for arg, value in zip(op._schema.arguments, flat if not cpu_kwargs else _by_schema(op, cpu_args, cpu_kwargs)):
        if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, torch.Tensor):
            orig = originals.get(id(value))
            if orig is not None:
                write(orig, ingress(value))

    def back(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            orig = originals.get(id(x))
            if orig is not None:
                return orig
            if x.device.type == "cpu":
                return from_cpu(x)
        return x

    return tree_map(back, result)


def _by_schema(op: Any, args: tuple, kwargs: dict) -> list[Any]:
    out = list(args)
    for arg in op._schema.arguments[len(args):]:
        out.append(kwargs.get(arg.name))
    return out


_LIB.fallback(_fallback, "PrivateUse1")
_LIB.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
