"""Sums over one axis, as the published torch_nntile's ``sum_slice`` and ``gap``
(global average pooling over the leading axis). Each is one recorded reduction whose
gradient is one broadcast."""

from __future__ import annotations

import torch


def sum_slice(src: torch.Tensor, *, axis: int, alpha: float = 1.0, beta: float = 0.0) -> torch.Tensor:
    """``alpha * src.sum(axis)``: the slice left when ``axis`` is summed away.

    Args:
        src: any tensor with ``axis``.
        axis: the axis summed.
        alpha: the scale of the sum.
        beta: the scale of an existing output; only 0 (a new tensor) is supported.

    Raises:
        ValueError: ``beta`` is not 0.
    """
    if beta != 0.0:
        raise ValueError(f"sum_slice: beta must be 0 (the result is a new tensor), got {beta}")
    s = src.sum(axis)
    return s if alpha == 1.0 else alpha * s


def gap(x: torch.Tensor) -> torch.Tensor:
    """The mean over axis 0 (global average pooling when tokens or positions lead)."""
    return sum_slice(x, axis=0, alpha=1.0 / x.shape[0])


__all__ = ["gap", "sum_slice"]
