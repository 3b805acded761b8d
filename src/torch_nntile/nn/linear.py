"""Linear and attention projections in the published torch_nntile's weight layouts, and
the converters between those layouts and HF's ``nn.Linear`` weights.

Its q/k/v projection weight is ``[hidden, head_size, n_heads]`` (its bias ``[n_heads,
head_size]``), so ``gemm(x, w, ndim=1)`` gives ``[batch, seq, head_size, n_heads]``; its
output projection weight is ``[head_size, n_heads, hidden]``; grouped-query variants
split the heads into ``[n_kv_heads, n_rep]``. The converters are reshapes and permutes
of detached tensors (exact both ways) and need no ``transformers``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from torch_nntile.add_fiber import add_fiber
from torch_nntile.gemm import gemm
from torch_nntile.nn.attention import nntile_model_transpose


def _split(w: torch.Tensor, shape: tuple[int, ...], perm: tuple[int, ...]) -> torch.Tensor:
    return w.detach().reshape(shape).permute(perm).contiguous()


def _merge(w: torch.Tensor, perm: tuple[int, ...], out_first: bool) -> torch.Tensor:
    """The inverse of ``_split``'s permute, flattened back to an HF ``[rows, cols]`` weight
    (the head axes merged into the columns if ``out_first``, else into the rows)."""
    t = w.detach().permute(sorted(range(len(perm)), key=perm.__getitem__))
    return t.reshape(t.shape[0], -1).contiguous() if out_first else t.reshape(-1, t.shape[-1]).contiguous()


def linear_to_qkv_weight(weight: torch.Tensor, *, n_heads: int, head_size: int) -> torch.Tensor:
    """HF ``[n_heads * head_size, in]`` -> ``[in, head_size, n_heads]``."""
    return _split(weight, (n_heads, head_size, -1), (2, 1, 0))


def qkv_to_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """``[in, head_size, n_heads]`` -> HF ``[n_heads * head_size, in]``."""
    return _merge(weight, (2, 1, 0), out_first=False)


def linear_to_qkv_bias(bias: torch.Tensor, *, n_heads: int, head_size: int) -> torch.Tensor:
    """HF ``[n_heads * head_size]`` -> ``[n_heads, head_size]``."""
    return bias.detach().reshape(n_heads, head_size).contiguous()


def qkv_to_linear_bias(bias: torch.Tensor) -> torch.Tensor:
    """``[n_heads, head_size]`` -> HF ``[n_heads * head_size]``."""
    return bias.detach().reshape(-1).contiguous()


def linear_to_output_weight(weight: torch.Tensor, *, n_heads: int, head_size: int) -> torch.Tensor:
    """HF o ``[out, n_heads * head_size]`` -> ``[head_size, n_heads, out]``."""
    return _split(weight, (weight.shape[0], n_heads, head_size), (2, 1, 0))


def output_to_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """``[head_size, n_heads, out]`` -> HF o ``[out, n_heads * head_size]``."""
    return _merge(weight, (2, 1, 0), out_first=True)


def linear_to_gqa_q_weight(weight: torch.Tensor, *, n_kv_heads: int, n_rep: int, head_size: int) -> torch.Tensor:
    """HF q ``[n_kv_heads * n_rep * head_size, in]`` -> ``[in, head_size, n_kv_heads, n_rep]``."""
    return _split(weight, (n_kv_heads, n_rep, head_size, -1), (3, 2, 0, 1))


def gqa_q_to_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """``[in, head_size, n_kv_heads, n_rep]`` -> HF q ``[n_heads * head_size, in]``."""
    return _merge(weight, (3, 2, 0, 1), out_first=False)


def linear_to_gqa_output_weight(weight: torch.Tensor, *, n_kv_heads: int, n_rep: int,
                                head_size: int) -> torch.Tensor:
    """HF o ``[out, n_kv_heads * n_rep * head_size]`` -> ``[head_size, n_kv_heads, n_rep, out]``."""
    return _split(weight, (weight.shape[0], n_kv_heads, n_rep, head_size), (3, 1, 2, 0))


def gqa_output_to_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """``[head_size, n_kv_heads, n_rep, out]`` -> HF o ``[out, n_heads * head_size]``."""
    return _merge(weight, (3, 1, 2, 0), out_first=True)


def prepare_sdpa_mask(mask: torch.Tensor | None, x: torch.Tensor, *, q_len: int, k_len: int | None = None,
                      is_causal: bool = False) -> torch.Tensor | None:
    """A bool ``[q_len, k_len]`` mask (True: attend) on ``x``'s device for ``sdpa_eager``,
    from a bool or additive float mask (its first batch item and head), or causal
    (``is_causal`` without a mask); None without either."""
    k_len = q_len if k_len is None else k_len
    if mask is None and is_causal:
        mask = torch.ones(q_len, k_len, dtype=torch.bool).tril()
    if mask is None:
        return None
    keep = mask if mask.dtype == torch.bool else torch.isfinite(mask) & (mask >= 0)
    while keep.dim() > 2:
        keep = keep[0]
    return keep.reshape(q_len, k_len).to(x.device).contiguous()


class NntileLinear(nn.Module):
    """``[..., in] -> [..., out]`` by ``gemm(..., trans_b=True)`` and ``add_fiber``, with
    ``nn.Linear``'s weight ``[out, in]``, bias and initialisation."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_features) if self.in_features else 0.0
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = gemm(x, self.weight, ndim=1, trans_b=True)
        return y if self.bias is None else add_fiber(self.bias, y, axis=y.dim() - 1)


class NntileQKVProjection(nn.Module):
    """``[batch, seq, hidden] -> [n_heads, batch, seq, head_size]`` (heads first, the
    attention kernel's layout): weight ``[hidden, head_size, n_heads]``, bias ``[n_heads,
    head_size]``; normal(0.02) weights, zero bias."""

    def __init__(self, hidden_size: int, head_size: int, n_heads: int, *, bias: bool = True) -> None:
        super().__init__()
        self.hidden_size, self.head_size, self.n_heads = hidden_size, head_size, n_heads
        self.weight = nn.Parameter(torch.empty(hidden_size, head_size, n_heads))
        self.bias = nn.Parameter(torch.empty(n_heads, head_size)) if bias else None
        _init_projection(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nntile_model_transpose(gemm(x, self.weight, ndim=1), 1)
        return y if self.bias is None else add_fiber(self.bias, y, axis=3, batch_ndim=1)


class NntileAttentionOutput(nn.Module):
    """``[n_heads, batch, seq, head_size] -> [batch, seq, hidden]``: weight ``[head_size,
    n_heads, hidden]``, bias ``[hidden]``; normal(0.02) weights, zero bias."""

    def __init__(self, head_size: int, n_heads: int, hidden_size: int, *, bias: bool = True) -> None:
        super().__init__()
        self.head_size, self.n_heads, self.hidden_size = head_size, n_heads, hidden_size
        self.weight = nn.Parameter(torch.empty(head_size, n_heads, hidden_size))
        self.bias = nn.Parameter(torch.empty(hidden_size)) if bias else None
        _init_projection(self)

    def forward(self, attn_out: torch.Tensor) -> torch.Tensor:
        y = gemm(nntile_model_transpose(attn_out, 3), self.weight, ndim=2)
        return y if self.bias is None else add_fiber(self.bias, y, axis=y.dim() - 1)


def _init_projection(m: nn.Module) -> None:
    nn.init.normal_(m.weight, std=0.02)
    if m.bias is not None:
        nn.init.zeros_(m.bias)


__all__ = ["NntileAttentionOutput", "NntileLinear", "NntileQKVProjection", "gqa_output_to_linear_weight",
           "gqa_q_to_linear_weight", "linear_to_gqa_output_weight", "linear_to_gqa_q_weight",
           "linear_to_output_weight", "linear_to_qkv_bias", "linear_to_qkv_weight", "output_to_linear_weight",
           "prepare_sdpa_mask", "qkv_to_linear_bias", "qkv_to_linear_weight"]
