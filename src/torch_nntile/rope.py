"""Rotary position embedding in the projection layout ``[batch, seq, head_size, heads]``.

One autograd function: forward and backward each record one op
(``torch_nntile::rope_fwd`` / ``rope_bwd``); on CPU tensors they run eagerly.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_nntile import backend  # noqa: F401  (defines the torch_nntile:: ops)

_FWD = torch.ops.torch_nntile.rope_fwd.default
_BWD = torch.ops.torch_nntile.rope_bwd.default


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return _FWD(x, cos, sin)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        cos, sin = ctx.saved_tensors
        return _BWD(grad, cos, sin), None, None


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` (HF's convention: ``rotate_half(x) =
    cat(-x[d/2:], x[:d/2])`` along head_size) for x ``[batch, seq, head_size, heads]``
    and cos, sin ``[seq, head_size]`` or ``[batch or 1, seq, head_size]`` (broadcast
    over heads). head_size must be even. The gradient flows to x only (cos and sin
    are constants, as HF's buffers): ``g * cos - rotate_half(g * sin)``."""
    return _Rope.apply(x, cos, sin)


__all__ = ["rope"]
