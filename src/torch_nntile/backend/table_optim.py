"""ATen-table rows for the ``torch_nntile::`` optimizer updates (``torch_nntile.optim``).

Each op updates one parameter and its state in place: on CPU tensors with torch
ops, on nntile tensors by recording one graph op (``ops/optim.py``) whose new
values are written back into the tensors.
"""

from __future__ import annotations

import torch

from torch_nntile.backend.aten import check_live, define
from torch_nntile.backend.device import read, write
from torch_nntile.graph.nodes import DataNode
from torch_nntile.ops import optim
from torch_nntile.ops.base import NotNative


def _operands(param: torch.Tensor, *others: torch.Tensor | None) -> list[DataNode | None]:
    """The nodes of a parameter and of its gradient and state (None stays None), which
    must all be floating tensors of the parameter's shape and dtype."""
    nodes = [read(param)] + [read(t) if t is not None else None for t in others]
    p = nodes[0]
    if not (p.dtype.is_floating_point or p.dtype.is_complex):
        raise NotNative(f"a parameter of dtype {p.dtype}")
    for n in nodes[1:]:
        if n is not None and (n.shape != p.shape or n.dtype != p.dtype):
            raise NotNative(f"an operand of shape {list(n.shape)} and dtype {n.dtype} for a parameter of shape "
                            f"{list(p.shape)} and dtype {p.dtype}")
    return nodes


SGD_SCHEMA = ("sgd_step(Tensor(a!) param, Tensor grad, Tensor(b!)? momentum_buffer, float lr, float momentum, "
              "float dampening, float weight_decay, bool nesterov, bool maximize, bool first) -> ()")


def _check_buffer(momentum: float, buf: torch.Tensor | None) -> None:
    if (momentum != 0) != (buf is not None):
        raise RuntimeError("sgd_step: momentum_buffer must be given exactly when momentum is nonzero")


def _sgd_cpu(param: torch.Tensor, grad: torch.Tensor, buf: torch.Tensor | None, lr: float, momentum: float,
             dampening: float, weight_decay: float, nesterov: bool, maximize: bool, first: bool) -> None:
    _check_buffer(momentum, buf)
    optim.sgd_update(lr, momentum, dampening, weight_decay, nesterov, maximize, first, param, buf, param, grad, buf)


def _sgd_nntile(param: torch.Tensor, grad: torch.Tensor, buf: torch.Tensor | None, lr: float, momentum: float,
                dampening: float, weight_decay: float, nesterov: bool, maximize: bool, first: bool) -> None:
    check_live()
    _check_buffer(momentum, buf)
    p, g, b = _operands(param, grad, None if first else buf)
    outs = optim.sgd_step(p, g, b, lr, momentum, dampening, weight_decay, nesterov, maximize, first)
    write(param, outs[0])
    if buf is not None:
        write(buf, outs[1])


sgd_step = define(SGD_SCHEMA, _sgd_cpu, _sgd_nntile)


ADAMW_SCHEMA = ("adamw_step(Tensor(a!) param, Tensor grad, Tensor(b!) exp_avg, Tensor(c!) exp_avg_sq, "
                "Tensor(d!)? max_exp_avg_sq, float lr, float beta1, float beta2, float eps, float weight_decay, "
                "bool maximize, float step_size, float bias_correction2_sqrt, Tensor? step=None) -> ()")
"""``step`` (a 0-dim count, on the parameter's device): the bias corrections are worked
out from it, and ``step_size`` / ``bias_correction2_sqrt`` are ignored."""


def _adamw_cpu(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
               max_exp_avg_sq: torch.Tensor | None, lr: float, beta1: float, beta2: float, eps: float,
               weight_decay: float, maximize: bool, step_size: float, bias_correction2_sqrt: float,
               step: torch.Tensor | None = None) -> None:
    if step is not None:
        step_size, bias_correction2_sqrt = optim.bias_corrections(lr, beta1, beta2, step.item())
    optim.adamw_update(lr, beta1, beta2, eps, weight_decay, maximize, step_size, bias_correction2_sqrt,
                       param, exp_avg, exp_avg_sq, max_exp_avg_sq, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq)


def _adamw_nntile(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                  max_exp_avg_sq: torch.Tensor | None, lr: float, beta1: float, beta2: float, eps: float,
                  weight_decay: float, maximize: bool, step_size: float, bias_correction2_sqrt: float,
                  step: torch.Tensor | None = None) -> None:
    check_live()
    p, g, m, v, vmax = _operands(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq)
    s = None
    if step is not None:
        s = read(step)
        if s.shape != () or not s.dtype.is_floating_point:
            raise NotNative(f"a step count of shape {list(s.shape)} and dtype {s.dtype}")
    outs = optim.adamw_step(p, g, m, v, vmax, lr, beta1, beta2, eps, weight_decay, maximize, step_size,
                            bias_correction2_sqrt, s)
    for t, node in zip((param, exp_avg, exp_avg_sq, max_exp_avg_sq), outs):
        write(t, node)


adamw_step = define(ADAMW_SCHEMA, _adamw_cpu, _adamw_nntile)
