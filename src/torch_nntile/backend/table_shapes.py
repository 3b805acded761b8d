"""Meta forms nntile supplies for ATen ops whose results' shapes their arguments decide
but for which PyTorch has no Meta kernel, or marks the op as shaped by values: each
takes the call's arguments (tensors on the meta device) and returns the results on the
meta device, so that ``untiled.record`` can record the op into the graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _ctc_loss(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: Any, target_lengths: Any,
              blank: int = 0, zero_infinity: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss per batch item and the forward variables: ``[N, T, 2 * max(target) + 1]``
    (the integer lengths decide the shape, not the values of a tensor)."""
    if log_probs.dim() != 3:
        raise NotImplementedError("_ctc_loss of other than [T, N, C] log-probabilities")
    t, n, _ = log_probs.shape
    width = 2 * max(target_lengths, default=0) + 1
    return log_probs.new_empty(n), log_probs.new_empty(n, t, width)


def _ctc_loss_backward(grad: torch.Tensor, log_probs: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.empty_like(log_probs)


META_FORMS: dict[str, Callable[..., Any]] = {
    "aten::_ctc_loss": _ctc_loss,
    "aten::_ctc_loss_backward": _ctc_loss_backward,
}
