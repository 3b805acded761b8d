"""Scaled dot-product attention in the projection layout (placeholder)."""

from __future__ import annotations

import torch


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
         scale: float | None = None) -> torch.Tensor:
    raise NotImplementedError("torch_nntile.nn.attention.sdpa: not implemented yet")
