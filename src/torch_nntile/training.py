"""Training helpers: losses over logits of any rank, a whole training step, and
optimizers (``SGD``, ``AdamW``) with one fused update op per parameter.

They run the same on CPU and on nntile (where every op they use is native): use them
beside, or instead of, ``torch.optim`` as usual.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

import torch_nntile
import torch_nntile.nn.functional as NF
from torch_nntile.backend.device import DEVICE
from torch_nntile.optim import SGD, AdamW

__all__ = ["AdamW", "SGD", "cross_entropy", "mse_loss", "train_full_batch_step"]


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


def mse_loss(prediction: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Mean squared error (``torch.nn.functional.mse_loss``), for symmetry with ``cross_entropy``."""
    return F.mse_loss(prediction, target, reduction=reduction)


Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def train_full_batch_step(model: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor,
                          optimizer: torch.optim.Optimizer, loss_fn: Loss = cross_entropy,
                          name_axes: dict[int, str] | None = None, tilings: dict[str, int | list[int]] | None = None,
                          ) -> float:
    """One training step on the whole batch ``x``: forward, ``loss_fn(model(x), labels)``,
    backward, ``optimizer.step()``, gradients set to None; on nntile the step is then
    compiled, run and waited for. Returns the loss as a float.

    ``name_axes`` names dims of ``x`` (``{0: "batch"}``) and ``tilings`` tiles groups by
    name (``{"batch": 256}``), both before the forward is recorded; they apply only to an
    nntile ``x``."""
    on_nntile = x.device.type == DEVICE
    if (name_axes or tilings) and not on_nntile:
        raise ValueError(f"train_full_batch_step: name_axes and tilings need x on nntile, not on {x.device}")
    if name_axes:
        torch_nntile.set_axis_group_name(x, name_axes)
    for name, tiling in (tilings or {}).items():
        torch_nntile.set_axis_group_tiling(name, tiling)
    loss = loss_fn(model(x), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    value = loss.item()  # on nntile: submits the whole step and waits for the loss
    if on_nntile:
        torch_nntile.wait()  # and for the rest of the step
    return value
