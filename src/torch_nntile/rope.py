"""Rotary position embedding (placeholder until its implementation lands)."""

from __future__ import annotations

import torch


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError("torch_nntile.rope: not implemented yet")
