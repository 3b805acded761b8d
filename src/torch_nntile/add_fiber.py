"""Adding a fiber (a bias along one axis, per batch item) to a tensor, as the published
torch_nntile's ``add_fiber``: the fiber is a broadcast view, so nothing of the
tensor's size is materialised for it, and its gradient is one sum.
"""

from __future__ import annotations

import torch


def axpby(x: torch.Tensor, y: torch.Tensor, alpha: float = 1.0, beta: float = 1.0) -> torch.Tensor:
    """``alpha * x + beta * y`` (broadcasting), skipping the scalings that are 1."""
    return (x if alpha == 1 else alpha * x) + (y if beta == 1 else beta * y)


def add_fiber(fiber: torch.Tensor, tensor: torch.Tensor, *, axis: int, batch_ndim: int = 0, alpha: float = 1.0,
              beta: float = 1.0) -> torch.Tensor:
    """``alpha * fiber + beta * tensor``, the fiber broadcast along every other axis.

    Args:
        fiber: of shape ``tensor.shape[:batch_ndim] + (tensor.shape[axis],)``.
        tensor: any shape.
        axis: the axis of ``tensor`` the fiber runs along (after the batch axes).
        batch_ndim: how many leading axes of ``tensor`` the fiber has too.

    Raises:
        ValueError: ``axis`` is a batch axis, or the fiber's shape does not fit.
    """
    axis = axis % tensor.dim() if tensor.dim() else axis
    want = (*tensor.shape[:batch_ndim], tensor.shape[axis])
    if not batch_ndim <= axis < tensor.dim() or tuple(fiber.shape) != want:
        raise ValueError(f"add_fiber: fiber of shape {list(fiber.shape)} does not fit axis={axis}, "
                         f"batch_ndim={batch_ndim} of a tensor of shape {list(tensor.shape)} (want {list(want)})")
    view = [n if i < batch_ndim or i == axis else 1 for i, n in enumerate(tensor.shape)]
    return axpby(fiber.reshape(view), tensor, alpha, beta)


__all__ = ["add_fiber"]
