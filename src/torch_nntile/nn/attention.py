"""Scaled dot-product attention in the projection layout ``[batch, seq, head_size, heads]``.

One autograd function (``backend.table_attention.SDPA``): its forward records one op
(``torch_nntile::sdpa_fwd``, which also keeps the logsumexp), its backward one op
returning the three gradients (``sdpa_bwd``). On CPU tensors the same ops run eagerly.
"""

from __future__ import annotations

import torch

from torch_nntile.backend.table_attention import SDPA


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
         scale: float | None = None) -> torch.Tensor:
    """Attention of q ``[batch, seq_q, head_size, n_heads]`` over k and v ``[batch, seq_k,
    head_size, n_kv_heads]`` (q head ``h`` reads kv head ``h // (n_heads // n_kv_heads)``,
    as HF's ``repeat_kv``): what ``torch.nn.functional.scaled_dot_product_attention``
    gives on the ``[batch, heads, seq, head_size]`` permutations, in q's layout.
    ``scale`` None is ``1 / sqrt(head_size)``; ``is_causal`` masks top-left aligned.
    No dropout."""
    return SDPA.apply(q, k, v, bool(is_causal), None if scale is None else float(scale), "bsdh")


__all__ = ["sdpa"]
