"""SGD, Adam and AdamW whose step updates each parameter with one fused op.

Each step issues ``torch_nntile::sgd_step`` / ``adamw_step`` per parameter (one graph op
on nntile, torch ops on CPU tensors). They are ``torch.optim.Optimizer`` subclasses with
``torch.optim``'s arguments, checks, math and state, so param groups, LR schedulers and
``state_dict`` round trips work unchanged. See docs/architecture/kernels.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim.optimizer import ParamsT
from torch.optim.sgd import sgd as torch_sgd

from torch_nntile.backend import table_optim
from torch_nntile.ops.optim import bias_corrections


def _number(x: float | torch.Tensor) -> float:
    """A hyperparameter (a number or a 1-element tensor) as a Python float."""
    return float(x.item()) if isinstance(x, torch.Tensor) else float(x)


def _check_lr(lr: float | torch.Tensor) -> None:
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")


def _scalar_dtype() -> torch.dtype:
    """The dtype of the ``step`` count, as ``torch.optim`` makes it."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


class _FusedOptimizer(torch.optim.Optimizer):
    """The step both optimizers share: the closure, then ``_group_step`` per group."""

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One update of every parameter that has a gradient; returns ``closure()``'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._group_step(group)
        return loss

    def _group_step(self, group: dict[str, Any]) -> None:
        raise NotImplementedError


class SGD(_FusedOptimizer):
    """``torch.optim.SGD`` (momentum, dampening, weight decay, Nesterov, maximize) with
    one ``torch_nntile::sgd_step`` per parameter per step. Sparse gradients take
    ``torch.optim``'s own sparse path."""

    def __init__(self, params: ParamsT, lr: float | torch.Tensor = 1e-3, momentum: float = 0, dampening: float = 0,
                 weight_decay: float | torch.Tensor = 0, nesterov: bool = False, *, maximize: bool = False) -> None:
        _check_lr(lr)
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
                        maximize=maximize)
        super().__init__(params, defaults)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)
            group.setdefault("maximize", False)

    def _group_step(self, group: dict[str, Any]) -> None:
        lr, momentum, dampening = _number(group["lr"]), float(group["momentum"]), float(group["dampening"])
        weight_decay, nesterov, maximize = _number(group["weight_decay"]), group["nesterov"], group["maximize"]
        for p in group["params"]:
            grad = p.grad
            if grad is None:
                continue
            if grad.is_sparse:
                self._sparse_step(p, group)
                continue
            buf, first = None, False
            if momentum != 0:  # as torch.optim: no state without momentum
                state = self.state[p]
                buf = state.get("momentum_buffer")
                first = buf is None
                if first:  # the op starts it as the gradient
                    buf = state["momentum_buffer"] = torch.empty_like(p, memory_format=torch.preserve_format)
            table_optim.sgd_step(p, grad, buf, lr, momentum, dampening, weight_decay, nesterov, maximize, first)

    def _sparse_step(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        """``torch.optim.SGD``'s update for a sparse gradient (it has no fused form)."""
        bufs = [self.state[p].get("momentum_buffer")]
        torch_sgd([p], [p.grad], bufs, has_sparse_grad=True, foreach=False, fused=False,
                  weight_decay=group["weight_decay"], momentum=group["momentum"], lr=group["lr"],
                  dampening=group["dampening"], nesterov=group["nesterov"], maximize=group["maximize"])
        if group["momentum"] != 0:
            self.state[p]["momentum_buffer"] = bufs[0]


class AdamW(_FusedOptimizer):
    """``torch.optim.AdamW`` (decoupled weight decay, AMSGrad, maximize) with one
    ``torch_nntile::adamw_step`` per parameter per step.

    ``capturable``: as ``torch.optim``'s, the ``step`` count lives on the parameter's
    device and the kernel works the bias corrections out from it, so every step records
    the same ops and ``torch_nntile.capture`` can replay it."""

    def __init__(self, params: ParamsT, lr: float | torch.Tensor = 1e-3,
                 betas: tuple[float | torch.Tensor, float | torch.Tensor] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 capturable: bool = False) -> None:
        _check_lr(lr)
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not (all(isinstance(b, float) for b in betas) or all(isinstance(b, torch.Tensor) for b in betas)):
            raise ValueError("betas must be either both floats or both Tensors")
        for i, b in enumerate(betas):
            if isinstance(b, torch.Tensor) and b.numel() != 1:
                raise ValueError(f"Tensor betas[{i}] must be 1-element")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, capturable=capturable)
        super().__init__(params, defaults)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Also for a ``torch.optim.AdamW`` state being loaded: ``step`` becomes a CPU
        tensor, or one on the parameter's device when ``capturable``."""
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)
            group.setdefault("maximize", False)
            group.setdefault("capturable", False)
            for p in group["params"]:
                p_state = self.state.get(p, {})
                step = p_state.get("step")
                where = p.device if group["capturable"] else torch.device("cpu")
                if step is not None and not (isinstance(step, torch.Tensor) and step.device == where):
                    p_state["step"] = torch.tensor(_number(step), dtype=_scalar_dtype(), device=where)

    _decoupled = True  # weight decay applied to the parameter (AdamW), not added to the gradient (Adam)

    def _group_step(self, group: dict[str, Any]) -> None:
        lr, eps, weight_decay = _number(group["lr"]), float(group["eps"]), float(group["weight_decay"])
        beta1, beta2 = (_number(b) for b in group["betas"])
        amsgrad, maximize, capturable = group["amsgrad"], group["maximize"], group.get("capturable", False)
        l2 = not self._decoupled and weight_decay != 0
        for p in group["params"]:
            grad = p.grad
            if grad is None:
                continue
            if grad.is_sparse:
                raise RuntimeError("Adam does not support sparse gradients, please consider SparseAdam instead")
            if l2:  # Adam's weight decay: added to the (maximized) gradient, as torch.optim.Adam does
                grad = torch.add(-grad if maximize else grad, p, alpha=weight_decay)
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=_scalar_dtype(), device=p.device if capturable else None)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if amsgrad:
                    state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            vmax = state["max_exp_avg_sq"] if amsgrad else None
            wd, mx = (0.0, False) if l2 else (weight_decay, maximize)
            if capturable:
                table_optim.adamw_step(p, grad, state["exp_avg"], state["exp_avg_sq"], vmax, lr, beta1, beta2, eps,
                                       wd, mx, 0.0, 0.0, state["step"])
                continue
            step_size, bias_correction2_sqrt = bias_corrections(lr, beta1, beta2, state["step"].item())
            table_optim.adamw_step(p, grad, state["exp_avg"], state["exp_avg_sq"], vmax, lr, beta1, beta2, eps,
                                   wd, mx, step_size, bias_correction2_sqrt)


class Adam(AdamW):
    """``torch.optim.Adam`` (L2 weight decay added to the gradient, AMSGrad, maximize):
    AdamW's fused update with the decay moved into the gradient first."""

    _decoupled = False

    def __init__(self, params: ParamsT, lr: float | torch.Tensor = 1e-3,
                 betas: tuple[float | torch.Tensor, float | torch.Tensor] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, *, maximize: bool = False,
                 capturable: bool = False) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize, capturable=capturable)


__all__ = ["Adam", "AdamW", "SGD"]
