"""ATen-table rows for the ``torch_nntile::`` optimizer updates (``torch_nntile.optim``).

Each op updates one parameter and its state in place: on CPU tensors with torch
ops, on nntile tensors by recording one graph op (``ops/optim.py``) whose new
values are written back into the tensors.
"""

from __future__ import annotations

import torch

from torch_nntile.backend.aten import check_live, define, register
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


def _adamw_operands(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                    max_exp_avg_sq: torch.Tensor | None, step: torch.Tensor | None) -> list[DataNode | None]:
    """The nodes of one AdamW update's operands, step count last (NotNative if any cannot be)."""
    nodes = _operands(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq)
    s = None
    if step is not None:
        s = read(step)
        if s.shape != () or not s.dtype.is_floating_point:
            raise NotNative(f"a step count of shape {list(s.shape)} and dtype {s.dtype}")
    return [*nodes, s]


def _adamw_record(tensors: tuple[torch.Tensor | None, ...], nodes: list[DataNode | None], lr: float, beta1: float,
                  beta2: float, eps: float, weight_decay: float, maximize: bool, step_size: float,
                  bias_correction2_sqrt: float) -> None:
    p, g, m, v, vmax, s = nodes
    outs = optim.adamw_step(p, g, m, v, vmax, lr, beta1, beta2, eps, weight_decay, maximize, step_size,
                            bias_correction2_sqrt, s)
    for t, node in zip((tensors[0], tensors[2], tensors[3], tensors[4]), outs):
        write(t, node)


def _adamw_nntile(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                  max_exp_avg_sq: torch.Tensor | None, lr: float, beta1: float, beta2: float, eps: float,
                  weight_decay: float, maximize: bool, step_size: float, bias_correction2_sqrt: float,
                  step: torch.Tensor | None = None) -> None:
    check_live()
    tensors = (param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq)
    _adamw_record(tensors, _adamw_operands(*tensors, step), lr, beta1, beta2, eps, weight_decay, maximize,
                  step_size, bias_correction2_sqrt)


adamw_step = define(ADAMW_SCHEMA, _adamw_cpu, _adamw_nntile)


# -- torch.optim's fused Adam / AdamW (``fused=True``): one update op per parameter --------


def _fused(decoupled: bool):
    """``_fused_adamw_`` (``decoupled``) / ``_fused_adam_``: per parameter one AdamW update
    whose bias corrections come from its step count (a 0-dim tensor on nntile, counted
    up by the optimizer just before); Adam's weight decay is added to the gradient
    first. Every element is checked before any is recorded, so one the update cannot
    take sends the whole call to the CPU fallback, not half of it."""
    def f(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
          exp_avg_sqs: list[torch.Tensor], max_exp_avg_sqs: list[torch.Tensor], state_steps: list[torch.Tensor], *,
          lr: float, beta1: float, beta2: float, weight_decay: float, eps: float, amsgrad: bool, maximize: bool,
          grad_scale: torch.Tensor | None = None, found_inf: torch.Tensor | None = None) -> None:
        check_live()
        if grad_scale is not None or found_inf is not None:
            raise NotNative("grad_scale / found_inf (gradient scaling)")
        n = len(params)
        lists = (grads, exp_avgs, exp_avg_sqs, state_steps) + ((max_exp_avg_sqs,) if amsgrad else ())
        if any(len(x) != n for x in lists):
            raise RuntimeError(f"Tensor lists must have the same number of tensors, got {n} and "
                               f"{next(len(x) for x in lists if len(x) != n)}")
        rows = []
        for i in range(n):
            tensors = (params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], max_exp_avg_sqs[i] if amsgrad else None)
            rows.append((tensors, _adamw_operands(*tensors, state_steps[i])))
        l2 = not decoupled and weight_decay != 0
        for tensors, nodes in rows:
            if l2:  # Adam's weight decay: added to the (maximized) gradient, as torch.optim.Adam does
                g = torch.add(-tensors[1] if maximize else tensors[1], tensors[0], alpha=weight_decay)
                nodes[1] = read(g)
            _adamw_record(tensors, nodes, lr, beta1, beta2, eps, 0.0 if l2 else weight_decay, maximize and not l2,
                          0.0, 0.0)
    return f


register("_fused_adamw_", _fused(True))
register("_fused_adam_", _fused(False))
