"""``nn.Module`` layers over ``torch_nntile.nn.functional``.

Each subclasses the matching ``torch.nn`` layer, so parameters, their names,
initialisation and ``repr`` are PyTorch's and state dicts load either way; only
``forward`` differs: it calls our functions, whose forward and backward each record
one tiled graph op on nntile (and run eagerly on CPU).
"""

from __future__ import annotations

import torch
from torch import nn

from torch_nntile.nn import functional as F


class Linear(nn.Linear):
    """``torch.nn.Linear`` (same arguments, parameters and state dict) whose forward is
    ``functional.linear``: on nntile, one tiled product forward and one per gradient.
    Accepts inputs of any rank ``[..., in_features]``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class ReLU(nn.ReLU):
    """``torch.nn.ReLU`` whose forward is ``functional.relu`` (one op forward, one
    backward on nntile). ``inplace`` is accepted but ignored: the result is a new tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x)


class GELU(nn.GELU):
    """``approximate="tanh"`` is GPT-2's ``gelu_new``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, self.approximate)


class SiLU(nn.SiLU):
    """``torch.nn.SiLU`` whose forward is ``functional.silu`` (one op forward, one
    backward on nntile). ``inplace`` is accepted but ignored: the result is a new tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)


class LayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` (same arguments, parameters and state dict) whose forward
    is ``functional.layer_norm``: one op forward, and one backward for the gradients of
    the input, weight and bias together."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.RMSNorm):
    """``torch.nn.RMSNorm`` (same arguments, parameters and state dict) whose forward is
    ``functional.rms_norm``: one op forward, one backward for the input's and weight's
    gradients. ``eps=None`` is the machine epsilon of the input's dtype, as in PyTorch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)


class Embedding(nn.Embedding):
    """Without ``padding_idx``, ``max_norm`` or sparse gradients (they raise)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, **kw: object) -> None:
        for option, unset in (("padding_idx", None), ("max_norm", None), ("sparse", False)):
            if kw.get(option, unset) is not unset:
                raise ValueError(f"torch_nntile.nn.Embedding does not support {option}")
        super().__init__(num_embeddings, embedding_dim, **kw)  # type: ignore[arg-type]

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        return F.embedding(indices, self.weight)


class SDPA(nn.Module):
    """Scaled dot-product attention over projections in the layout
    ``[batch, seq, head_size, n_heads]`` (see ``functional.sdpa``). A ``mask`` or another
    ``batch_ndim`` (the published torch_nntile's arguments) runs ``functional.sdpa_eager``,
    which takes neither ``is_causal`` nor ``scale``."""

    def __init__(self, is_causal: bool = False, scale: float | None = None, *, batch_ndim: int = 2) -> None:
        super().__init__()
        self.is_causal = is_causal
        self.scale = scale
        self.batch_ndim = batch_ndim

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is None and self.batch_ndim == 2:
            return F.sdpa(q, k, v, is_causal=self.is_causal, scale=self.scale)
        if self.is_causal or self.scale is not None:
            raise ValueError("SDPA: a mask or batch_ndim other than 2 takes neither is_causal nor scale")
        return F.sdpa_eager(q, k, v, mask, batch_ndim=self.batch_ndim)

    def extra_repr(self) -> str:
        return f"is_causal={self.is_causal}, scale={self.scale}"
