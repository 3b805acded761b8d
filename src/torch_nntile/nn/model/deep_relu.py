"""``DeepReLU``: the bias-free ReLU MLP of the published torch_nntile's examples."""

from __future__ import annotations

import torch
from torch import nn

from torch_nntile.nn.module import Linear, ReLU


class DeepReLU(nn.Sequential):
    """Bias-free MLP: Linear(input_dim, hidden_dim), then ``depth - 2`` times
    Linear(hidden_dim, hidden_dim), then Linear(hidden_dim, output_dim), with ReLU
    between the layers. ``depth`` counts Linear layers; with 1 it is one Linear from
    input to output. The layers are the Sequential's own (``0.weight``, ``2.weight``...)."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, depth: int = 3) -> None:
        if depth < 1:
            raise ValueError(f"DeepReLU: depth must be at least 1 (got {depth})")
        dims = [input_dim] + [hidden_dim] * (depth - 1) + [output_dim]
        layers: list[nn.Module] = []
        for i in range(depth):
            layers.append(Linear(dims[i], dims[i + 1], bias=False))
            if i < depth - 1:
                layers.append(ReLU())
        super().__init__(*layers)
        self.input_dim, self.hidden_dim, self.output_dim, self.depth = input_dim, hidden_dim, output_dim, depth

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)

    @classmethod
    def tiny(cls) -> DeepReLU:
        """128 inputs, 5 layers of 256, 10 outputs: the reference's small test model."""
        return cls(128, 256, 10, depth=5)

    @classmethod
    def mnist(cls, hidden_dim: int = 256, depth: int = 5) -> DeepReLU:
        """A classifier of flattened 28 x 28 images into 10 classes."""
        return cls(28 * 28, hidden_dim, 10, depth=depth)

    def init_kaiming_uniform_(self, seed: int = 42) -> None:
        """Each Linear's weight uniform in ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]``, drawn in
        layer order from a CPU generator seeded with ``seed``: the same weights whatever
        the device the model is on."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    bound = m.in_features ** -0.5
                    m.weight.copy_(torch.empty(m.weight.shape, dtype=m.weight.dtype).uniform_(-bound, bound, generator=g))


__all__ = ["DeepReLU"]
