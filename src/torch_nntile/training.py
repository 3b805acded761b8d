"""Training helpers: losses over logits of any rank, a whole training step, and
optimizers (``SGD``, ``Adam``, ``AdamW``) with one fused update op per parameter, also
as one-call functional steps; and the published torch_nntile's forms of these.

They run the same on CPU and on nntile (where every op they use is native): use them
beside, or instead of, ``torch.optim`` as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

import torch_nntile
import torch_nntile.nn.functional as NF
from torch_nntile.backend.device import DEVICE
from torch_nntile.optim import SGD, Adam, AdamW

__all__ = ["Adam", "AdamW", "SGD", "clone_model_weights", "cross_entropy", "fused_adam_step", "fused_adamw_step",
           "fused_sgd_step", "max_weight_delta", "mse_loss", "train_full_batch_step"]


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy of ``[..., C]`` logits (the class dim last) against ``labels`` of the
    leading shape ``[...]``, of any rank (0-dim labels with 1-D logits included): what a
    language model's loss needs, without reshaping by hand. ``reduction="none"`` gives
    the loss in the labels' shape."""
    if logits.dim() < 1:
        raise ValueError("cross_entropy: logits need a class dim (the last one); got a 0-dim tensor")
    if tuple(labels.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"cross_entropy: labels of shape {list(labels.shape)} do not match the leading dims "
                         f"{list(logits.shape[:-1])} of logits of shape {list(logits.shape)}")
    if label_smoothing == 0.0:  # one graph op forward and one backward
        return NF.cross_entropy(logits, labels, ignore_index=ignore_index, reduction=reduction)
    flat = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=ignore_index,
                           reduction=reduction, label_smoothing=label_smoothing)
    return flat.reshape(labels.shape) if reduction == "none" else flat


def mse_loss(prediction: torch.Tensor, target: torch.Tensor | float | None = None, reduction: str = "mean", *,
             scale: float | None = None) -> torch.Tensor:
    """Mean squared error against ``target`` (``torch.nn.functional.mse_loss``, for
    symmetry with ``cross_entropy``); without a target (or with a number in its place,
    or ``scale=``) the published torch_nntile's one-input loss ``scale * sum(x ** 2)``
    (``scale`` 1 by default)."""
    if isinstance(target, torch.Tensor):
        if scale is not None:
            raise TypeError("mse_loss: scale= is for the one-input form (no target)")
        return F.mse_loss(prediction, target, reduction=reduction)
    factor = float(target if target is not None else 1.0 if scale is None else scale)
    return prediction.square().sum() * factor


Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _sgd_for(model: torch.nn.Module, lr: float) -> SGD:
    """The plain SGD a model is trained with by learning rate (kept on the model, made
    anew when the rate changes), as the published torch_nntile does."""
    opt = getattr(model, "_nntile_optimizer", None)
    if opt is None or opt.param_groups[0]["lr"] != lr:
        opt = SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
        model._nntile_optimizer = opt
    return opt


def train_full_batch_step(model: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor,
                          optimizer: torch.optim.Optimizer | float | None = None, loss_fn: Loss = cross_entropy,
                          name_axes: dict[int, str] | None = None, tilings: dict[str, int | list[int]] | None = None,
                          *, learning_rate: float | None = None,
                          name_axis_groups: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
                          axis_group_tiling: Mapping[str, int | list[int] | tuple[int, ...]] | None = None,
                          print_axis_groups: bool = False) -> float:
    """One training step on the whole batch ``x``: gradients set to None, forward,
    ``loss_fn(model(x), labels)``, backward, ``optimizer.step()``; on nntile the step is
    then compiled, run and waited for. Returns the loss as a float; the step's gradients
    stay on the parameters until the next step (as the published torch_nntile's).

    ``name_axes`` names dims of ``x`` (``{0: "batch"}``) and ``tilings`` tiles groups by
    name (``{"batch": 256}``), both before the forward is recorded; they apply only to an
    nntile ``x``.

    The published torch_nntile's form is accepted too: a learning rate in place of the
    optimizer (or ``learning_rate=``) trains with a plain SGD kept on the model;
    ``name_axis_groups(x, logits)`` and ``axis_group_tiling`` name and tile groups once
    the step is recorded, before it is compiled, and ``print_axis_groups`` prints them."""
    if learning_rate is not None:
        if optimizer is not None:
            raise TypeError("train_full_batch_step: give an optimizer or learning_rate=, not both")
        optimizer = learning_rate
    if optimizer is None:
        raise TypeError("train_full_batch_step: needs an optimizer or a learning rate")
    if isinstance(optimizer, (int, float)):
        optimizer = _sgd_for(model, float(optimizer))
    on_nntile = x.device.type == DEVICE
    if (name_axes or tilings or name_axis_groups or axis_group_tiling) and not on_nntile:
        raise ValueError(f"train_full_batch_step: name_axes and tilings need x on nntile, not on {x.device}")
    if name_axes:
        torch_nntile.set_axis_group_name(x, name_axes)
    for name, tiling in (tilings or {}).items():
        torch_nntile.set_axis_group_tiling(name, tiling)
    optimizer.zero_grad(set_to_none=True)
    logits = model(x)
    logits = getattr(logits, "logits", logits)  # an HF model's output
    loss = loss_fn(logits, labels)
    loss.backward()
    optimizer.step()
    if name_axis_groups is not None:
        name_axis_groups(x, logits)
    for name, tiling in (axis_group_tiling or {}).items():
        torch_nntile.set_axis_group_tiling(name, tiling)
    if print_axis_groups:
        torch_nntile.print_axis_groups()
    value = loss.item()  # on nntile: submits the whole step and waits for the loss
    if on_nntile:
        torch_nntile.wait()  # and for the rest of the step
    return value


def _one_step(make: Callable[..., Any], optimizer: Any, parameters: Iterable[torch.Tensor], lr: float,
              **kw: Any) -> Any:
    """The published torch_nntile's functional steps: one ``step()`` of ``optimizer``,
    or of a new one made from ``parameters`` (then returned, to be passed again so that
    its state carries over); a given optimizer takes ``lr`` as its new rate."""
    if optimizer is None:
        optimizer = make(list(parameters), lr=lr, **kw)
    else:
        for group in optimizer.param_groups:
            group["lr"] = float(lr)
    optimizer.step()
    return optimizer


def fused_sgd_step(parameters: Iterable[torch.Tensor], learning_rate: float, *, momentum: float = 0.0,
                   weight_decay: float = 0.0, dampening: float = 0.0, nesterov: bool = False,
                   optimizer: SGD | None = None) -> SGD:
    """One SGD step of ``parameters`` (their ``.grad``); returns the optimizer holding the
    momentum, to pass as ``optimizer=`` next time."""
    return _one_step(SGD, optimizer, parameters, learning_rate, momentum=momentum, weight_decay=weight_decay,
                     dampening=dampening, nesterov=nesterov)


def fused_adam_step(parameters: Iterable[torch.Tensor], learning_rate: float, *, betas: tuple[float, float] = (0.9, 0.999),
                    eps: float = 1e-8, weight_decay: float = 0.0, optimizer: Adam | None = None) -> Adam:
    """One Adam step of ``parameters``; returns the optimizer holding the moments."""
    return _one_step(Adam, optimizer, parameters, learning_rate, betas=betas, eps=eps, weight_decay=weight_decay)


def fused_adamw_step(parameters: Iterable[torch.Tensor], learning_rate: float, *,
                     betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01,
                     optimizer: AdamW | None = None) -> AdamW:
    """One AdamW step of ``parameters``; returns the optimizer holding the moments."""
    return _one_step(AdamW, optimizer, parameters, learning_rate, betas=betas, eps=eps, weight_decay=weight_decay)


def clone_model_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict as CPU copies (a checkpoint to compare against later)."""
    with torch.no_grad():
        return {name: t.detach().cpu().clone() for name, t in model.state_dict().items()}


def max_weight_delta(state_a: Mapping[str, torch.Tensor], state_b: Mapping[str, torch.Tensor]) -> float:
    """The largest absolute difference between two state dicts (CPU tensors) over the
    names of ``state_a``; 0.0 for empty ones."""
    return max(((state_a[n].double() - state_b[n].double()).abs().max().item() if state_a[n].numel() else 0.0
                for n in state_a), default=0.0)
