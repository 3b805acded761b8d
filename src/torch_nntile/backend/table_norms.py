"""Batch norm in training mode (batch statistics), tiled: ``ops/batch_norm.py`` records
its statistics (and the backward's per-channel sums) as one op, with the per-channel
coefficients of the normalisation (and of the input's gradient), which is then one
elementwise op that fuses with its neighbours (a ReLU). In eval mode (running
statistics) batch norm is per sample: ``table_batched`` runs it per batch tile.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_nntile.backend.aten import check_live, ew, register
from torch_nntile.backend.device import new_tensor, read, read_opt, write
from torch_nntile.ops import batch_norm as bn
from torch_nntile.ops.base import NotNative
from torch_nntile.ops.views import reshape


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
    stats = bn.batch_norm_stats(read(input), read_opt(weight), read_opt(bias), read_opt(running_mean) if track else None,
                                read_opt(running_var) if track else None, momentum, eps)
    if track:
        write(running_mean, stats[4])
        write(running_var, stats[5])
    shape = _channels(input)
    alpha, beta = (reshape(n, shape) for n in stats[2:4])
    out = ew("native_batch_norm", bn.bn_apply_out, [input, new_tensor(alpha), new_tensor(beta)], input.dtype)
    return new_tensor(out), new_tensor(stats[0]), new_tensor(stats[1])


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
    mean = read(save_mean)
    sum_g, sum_gx, *coef = bn.batch_norm_sums(read(grad_out), read(input), mean, read(save_invstd), read_opt(weight), eps)
    grad_input = None
    if output_mask[0]:
        shape = _channels(input)
        per_channel = [new_tensor(reshape(n, shape)) for n in (mean, *coef)]
        grad_input = new_tensor(ew("native_batch_norm_backward", bn.bn_grad_out, [grad_out, input, *per_channel],
                                   input.dtype))
    return (grad_input, new_tensor(sum_gx) if output_mask[1] else None, new_tensor(sum_g) if output_mask[2] else None)


def _channels(x: torch.Tensor) -> tuple[int, ...]:
    """The shape a per-channel value broadcasts in against ``x``."""
    return (1, x.shape[1]) + (1,) * (x.dim() - 2)


register("native_batch_norm", _batch_norm)
register("native_batch_norm_backward", _batch_norm_backward)
