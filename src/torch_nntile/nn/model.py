"""Reference models built from stock ``torch.nn`` layers (no transformers needed)."""

from __future__ import annotations

import torch
from torch import nn


class DeepReLU(nn.Sequential):
    """Bias-free MLP: Linear(in, hidden), then ``depth - 2`` times Linear(hidden, hidden),
    then Linear(hidden, out), with ReLU between the layers. ``depth`` counts Linear layers."""

    def __init__(self, in_features: int, hidden: int, out_features: int, depth: int = 3) -> None:
        if depth < 2:
            raise ValueError(f"depth must be at least 2 (got {depth})")
        dims = [in_features] + [hidden] * (depth - 1) + [out_features]
        layers: list[nn.Module] = []
        for i in range(depth):
            layers.append(nn.Linear(dims[i], dims[i + 1], bias=False))
            if i < depth - 1:
                layers.append(nn.ReLU())
        super().__init__(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)
