"""The order of the rotary channels of q and k weights: HF's and the published
torch_nntile's.

HF (Llama, GPT-NeoX) rotates channel ``i`` of a head with channel ``i + r / 2`` (its
``rotate_half`` over the first ``r`` rotary channels); the published torch_nntile's
``rope`` rotates neighbours ``(2i, 2i + 1)``. Reordering the output rows of the q and k
projections (and their biases) from one order to the other gives the same attention,
since q and k are permuted alike. Channels past the rotary ones, and v, keep their
order. The converters take detached tensors and return new contiguous ones (exact both
ways); none needs ``transformers``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _rotary_channels(head_dim: int, rotary_pct: float) -> int:
    rotary = int(head_dim * rotary_pct)
    if rotary % 2 or not 0 <= rotary <= head_dim:
        raise ValueError(f"rotary channels must be even and at most head_dim={head_dim}, got {rotary} "
                         f"(head_dim * rotary_pct={rotary_pct})")
    return rotary


def _reorder(t: Tensor, rotary: int, to_pairs: bool) -> Tensor:
    """``t`` ``[n_heads, head_dim, *rest]`` with each head's first ``rotary`` channels
    reordered: halves -> pairs (``to_pairs``) or pairs -> halves."""
    if rotary == 0:
        return t.clone()
    m = rotary // 2
    rot = t[:, :rotary].unflatten(1, (2, m) if to_pairs else (m, 2)).transpose(1, 2).flatten(1, 2)
    return torch.cat([rot, t[:, rotary:]], dim=1)


def _rows(weight: Tensor, n_heads: int, head_dim: int, rotary_pct: float, to_pairs: bool, parts: int = 1,
          what: str = "weight") -> Tensor:
    """The rows (a bias: the entries) of a q, k or fused ``[q|k|v]``-per-head projection
    reordered; ``parts`` is 1 (q or k) or 3 (fused: v's rows kept)."""
    rows = weight.shape[0]
    if rows != parts * n_heads * head_dim:
        raise ValueError(f"{what} has {rows} rows, expected {parts} * n_heads={n_heads} * head_dim={head_dim}")
    rotary = _rotary_channels(head_dim, rotary_pct)
    w = weight.detach().reshape(n_heads, parts * head_dim, -1)
    pieces = [w[:, i * head_dim:(i + 1) * head_dim] for i in range(parts)]
    pieces = [_reorder(p, rotary, to_pairs) if i < 2 else p for i, p in enumerate(pieces)]
    return torch.cat(pieces, dim=1).reshape(weight.shape).contiguous()


def hf_to_nntile_qkv_weight(weight: Tensor, *, n_heads: int, head_dim: int, rotary_pct: float = 1.0) -> Tensor:
    """An HF q or k ``nn.Linear`` weight ``[n_heads * head_dim, in]`` with rotary rows in
    neighbouring pairs (the published torch_nntile's ``rope``).

    Args:
        weight: the HF weight.
        n_heads: heads of the projection (a k projection's: the key/value heads).
        head_dim: channels of a head.
        rotary_pct: fraction of each head's channels that rotate (GPT-NeoX); the rest
            keep their place.

    Raises:
        ValueError: the shape does not fit, or the rotary channels are odd.
    """
    return _rows(weight, n_heads, head_dim, rotary_pct, to_pairs=True)


def nntile_to_hf_qkv_weight(weight: Tensor, *, n_heads: int, head_dim: int, rotary_pct: float = 1.0) -> Tensor:
    """The inverse of ``hf_to_nntile_qkv_weight``.

    Args:
        weight: ``[n_heads * head_dim, in]`` with rotary rows in pairs.
        n_heads: heads of the projection.
        head_dim: channels of a head.
        rotary_pct: fraction of each head's channels that rotate.
    """
    return _rows(weight, n_heads, head_dim, rotary_pct, to_pairs=False)


def hf_to_nntile_qkv_bias(bias: Tensor, *, n_heads: int, head_dim: int, rotary_pct: float = 1.0) -> Tensor:
    """An HF q or k bias ``[n_heads * head_dim]`` reordered as ``hf_to_nntile_qkv_weight``
    reorders the weight's rows.

    Args:
        bias: the HF bias.
        n_heads: heads of the projection.
        head_dim: channels of a head.
        rotary_pct: fraction of each head's channels that rotate.
    """
    return _rows(bias.reshape(-1, 1), n_heads, head_dim, rotary_pct, to_pairs=True, what="bias").reshape(-1)


def nntile_to_hf_qkv_bias(bias: Tensor, *, n_heads: int, head_dim: int, rotary_pct: float = 1.0) -> Tensor:
    """The inverse of ``hf_to_nntile_qkv_bias``.

    Args:
        bias: ``[n_heads * head_dim]`` with rotary entries in pairs.
        n_heads: heads of the projection.
        head_dim: channels of a head.
        rotary_pct: fraction of each head's channels that rotate.
    """
    return _rows(bias.reshape(-1, 1), n_heads, head_dim, rotary_pct, to_pairs=False, what="bias").reshape(-1)


def hf_to_nntile_fused_qkv_weight(weight: Tensor, *, n_heads: int, head_dim: int,
                                  rotary_pct: float = 1.0) -> Tensor:
    """GPT-NeoX's fused ``query_key_value`` weight ``[n_heads * 3 * head_dim, in]`` (per
    head: q, k, v rows) with the q and k rotary rows in pairs; v's rows are kept.

    Args:
        weight: the HF weight.
        n_heads: heads of the attention.
        head_dim: channels of a head.
        rotary_pct: fraction of each head's channels that rotate.
    """
    return _rows(weight, n_heads, head_dim, rotary_pct, to_pairs=True, parts=3)


def nntile_to_hf_fused_qkv_weight(weight: Tensor, *, n_heads: int, head_dim: int,
                                  rotary_pct: float = 1.0) -> Tensor:
    """The inverse of ``hf_to_nntile_fused_qkv_weight``.

    Args:
        weight: the fused weight with q and k rotary rows in pairs.
        n_heads: heads of the attention.
        head_dim: channels of a head.
        rotary_pct: fraction of each head's channels that rotate.
    """
    return _rows(weight, n_heads, head_dim, rotary_pct, to_pairs=False, parts=3)


def hf_to_nntile_fused_qkv_bias(bias: Tensor, *, n_heads: int, head_dim: int, rotary_pct: float = 1.0) -> Tensor:
    """GPT-NeoX's fused ``query_key_value`` bias reordered as its weight's rows.

    Args:
        bias: the HF bias ``[n_heads * 3 * head_dim]``.
        n_heads: heads of the attention.
        head_dim: channels of a head.
        rotary_pct: fraction of each head's channels that rotate.
    """
    return _rows(bias.reshape(-1, 1), n_heads, head_dim, rotary_pct, to_pairs=True, parts=3,
                 what="bias").reshape(-1)


def nntile_to_hf_fused_qkv_bias(bias: Tensor, *, n_heads: int, head_dim: int, rotary_pct: float = 1.0) -> Tensor:
    """The inverse of ``hf_to_nntile_fused_qkv_bias``.

    Args:
        bias: the fused bias with q and k rotary entries in pairs.
        n_heads: heads of the attention.
        head_dim: channels of a head.
        rotary_pct: fraction of each head's channels that rotate.
    """
    return _rows(bias.reshape(-1, 1), n_heads, head_dim, rotary_pct, to_pairs=False, parts=3,
                 what="bias").reshape(-1)


def copy_linear(dst: nn.Module, src: nn.Module) -> None:
    """Copy ``src``'s weight (and its bias, where both have one) into ``dst``: two layers
    with ``nn.Linear``'s ``[out, in]`` weight.

    Args:
        dst: the layer written (any device).
        src: the layer read.
    """
    with torch.no_grad():
        dst.weight.copy_(src.weight.detach())
        if getattr(dst, "bias", None) is not None and getattr(src, "bias", None) is not None:
            dst.bias.copy_(src.bias.detach())


__all__ = ["copy_linear", "hf_to_nntile_fused_qkv_bias", "hf_to_nntile_fused_qkv_weight", "hf_to_nntile_qkv_bias",
           "hf_to_nntile_qkv_weight", "nntile_to_hf_fused_qkv_bias", "nntile_to_hf_fused_qkv_weight",
           "nntile_to_hf_qkv_bias", "nntile_to_hf_qkv_weight"]
