"""Scaled dot-product attention in the projection layout ``[batch, seq, head_size, heads]``.

One autograd function (``backend.table_attention.SDPA``): its forward records one op
(``torch_nntile::sdpa_fwd``, which also keeps the logsumexp), its backward one op
returning the three gradients (``sdpa_bwd``). On CPU tensors the same ops run eagerly.
``sdpa_eager`` is the published torch_nntile's name and signature for it; with a mask
it runs stock ``scaled_dot_product_attention`` on head-first views (no fused op takes
a mask).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

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


def nntile_model_transpose(x: torch.Tensor, model_ndim: int) -> torch.Tensor:
    """The last ``model_ndim`` axes moved to the front (dense), as the published
    torch_nntile's: ``[batch, seq, head_size, heads]`` with 1 gives ``[heads, batch,
    seq, head_size]``, and that with 3 gives it back."""
    n = x.dim()
    k = model_ndim % n if n else 0
    return x.permute(*range(n - k, n), *range(n - k)).contiguous()


def sdpa_eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
               batch_ndim: int = 2) -> torch.Tensor:
    """Attention over nntile projections ``[batch..., seq, head_size, n_heads]`` with scale
    ``1 / sqrt(head_size)``, as the published torch_nntile's ``nn.sdpa_eager``.

    Args:
        q: the queries, on nntile; ``batch_ndim`` counts the batch axes and the heads
            axis (2: ``[batch, seq, head_size, n_heads]``).
        k: the keys, laid out as q; they may have fewer heads (``sdpa``).
        v: the values, laid out as k.
        mask: None, or bool ``[seq_q, seq_k]`` on nntile (or broadcasting to ``[batch,
            n_heads, seq_q, seq_k]``): True where a query may attend to a key.

    Raises:
        ValueError: a tensor not on nntile, a mask not bool, or ranks that do not fit.
    """
    if any(t.device.type != "nntile" for t in (q, k, v)):
        raise ValueError("sdpa_eager expects nntile q, k and v tensors (torch_nntile.nn.functional.sdpa takes CPU ones)")
    if mask is not None and (mask.dtype != torch.bool or mask.device.type != "nntile"):
        raise ValueError(f"sdpa_eager: mask must be bool on device nntile, got {mask.dtype} on {mask.device}")
    if batch_ndim < 1 or not q.dim() == k.dim() == v.dim() == batch_ndim + 2:
        raise ValueError(f"sdpa_eager: batch_ndim={batch_ndim} needs tensors of rank {batch_ndim + 2}, got "
                         f"{q.dim()}, {k.dim()} and {v.dim()}")
    lead = q.shape[:batch_ndim - 1]
    q4, k4, v4 = (t.reshape(math.prod(lead), *t.shape[batch_ndim - 1:]) for t in (q, k, v))
    if mask is None:
        out = sdpa(q4, k4, v4)
    else:
        heads_first = [t.permute(0, 3, 1, 2) for t in (q4, k4, v4)]
        out = F.scaled_dot_product_attention(*heads_first, attn_mask=mask,
                                             enable_gqa=q4.shape[3] != k4.shape[3]).permute(0, 2, 3, 1)
    return out.reshape(*lead, *out.shape[1:])


__all__ = ["nntile_model_transpose", "sdpa", "sdpa_eager"]
