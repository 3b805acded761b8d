"""Batch norm in training mode (batch statistics), tiled: ``ops/batch_norm.py`` records
its statistics (and the backward's per-channel sums) as one op, and the normalisation
(and the input's gradient) are elementwise ops on nntile tensors, which fuse with their
neighbours. In eval mode (running statistics) batch norm is per sample:
``table_batched`` runs it per batch tile.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_nntile.backend.aten import check_live, register
from torch_nntile.backend.device import new_tensor, read, write
from torch_nntile.ops import batch_norm as bn
from torch_nntile.ops.base import NotNative


def _check(x: torch.Tensor, *others: torch.Tensor | None) -> None:
    if x.dim() < 2 or x.dtype not in (torch.float32, torch.float64) or any(
            t is not None and (t.dtype != x.dtype or t.dim() != 1) for t in others):
        raise NotNative("batch norm of other than a float32 / float64 batch with channels and parameters alike")


def _batch_norm(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                running_mean: torch.Tensor | None, running_var: torch.Tensor | None, training: bool,
                momentum: float, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """As CPU's ``native_batch_norm``: the output, the batch mean and inverse deviation,
    and the running statistics updated (the variance unbiased) in place."""
    if not training:
        raise NotNative("eval mode: per batch tile")
    check_live()
    _check(input, weight, bias, running_mean, running_var)
    track = running_mean is not None and running_var is not None
    stats = bn.batch_norm_stats(read(input), read(running_mean) if track else None,
                                read(running_var) if track else None, momentum, eps)
    if track:
        write(running_mean, stats[2])
        write(running_var, stats[3])
    mean, invstd = new_tensor(stats[0]), new_tensor(stats[1])
    shape = _channels(input)
    scale = invstd if weight is None else invstd * weight
    out = (input - mean.view(shape)) * scale.view(shape)
    return (out + bias.view(shape) if bias is not None else out), mean, invstd


def _batch_norm_backward(grad_out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor | None,
                         running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                         save_mean: torch.Tensor | None, save_invstd: torch.Tensor | None, train: bool, eps: float,
                         output_mask: Any) -> tuple[torch.Tensor | None, ...]:
    """As CPU's ``native_batch_norm_backward`` with batch statistics: the per-channel
    sums, then the input's gradient as one elementwise pass."""
    if not train or save_mean is None or save_invstd is None:
        raise NotNative("eval mode: per batch tile")
    check_live()
    _check(input, weight, save_mean, save_invstd)
    sum_g, sum_gx = (new_tensor(n) for n in bn.batch_norm_sums(read(grad_out), read(input), read(save_mean),
                                                                 read(save_invstd), eps))
    grad_input = None
    if output_mask[0]:
        shape, n = _channels(input), input.numel() // max(input.shape[1], 1)
        scale = save_invstd if weight is None else save_invstd * weight
        k = sum_gx * save_invstd / n
        grad_input = (grad_out - (sum_g / n).view(shape) - (input - save_mean.view(shape)) * k.view(shape)) \
            * scale.view(shape)
    return grad_input, sum_gx if output_mask[1] else None, sum_g if output_mask[2] else None


def _channels(x: torch.Tensor) -> list[int]:
    """The shape a per-channel value broadcasts in against ``x``."""
    return [1, x.shape[1]] + [1] * (x.dim() - 2)


register("native_batch_norm", _batch_norm)
register("native_batch_norm_backward", _batch_norm_backward)
