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
        mask: None, or bool ``[seq_q, seq_k]`` (or broadcasting to ``[batch, n_heads,
            seq_q, seq_k]``): True where a query may attend to a key; on the CPU it is
            moved to nntile.

    Raises:
        ValueError: a tensor not on nntile, a mask not bool, or ranks that do not fit.
    """
    if any(t.device.type != "nntile" for t in (q, k, v)):
        raise ValueError("sdpa_eager expects nntile q, k and v tensors (torch_nntile.nn.functional.sdpa takes CPU ones)")
    if mask is not None and mask.dtype != torch.bool:
        raise ValueError(f"sdpa_eager: mask must be bool, got {mask.dtype}")
    if mask is not None and mask.device != q.device:  # a CPU mask is a constant: moved, as the reference does
        mask = mask.to(q.device)
    if batch_ndim < 1 or not q.dim() == k.dim() == v.dim() == batch_ndim + 2:
        raise ValueError(f"sdpa_eager: batch_ndim={batch_ndim} needs tensors of rank {batch_ndim + 2}, got "
                         f"{q.dim()}, {k.dim()} and {v.dim()}")
    lead = q.shape[:batch_ndim - 1]
    q4, k4, v4 = (t.reshape(math.prod(lead), *t.shape[batch_ndim - 1:]) for t in (q, k, v))
    out = attention(q4, k4, v4, mask)
    return out.reshape(*lead, *out.shape[1:])


def sdpa_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
                batch_ndim: int = 2) -> torch.Tensor:
    """Attention in the heads-first layout ``[batch..., seq, head_size]`` (``batch_ndim``
    leading axes, heads among them, shared by q, k and v), scale ``1 / sqrt(head_size)``,
    as the published torch_nntile's ``sdpa_kernel``.

    Args:
        q: the queries ``[batch..., seq_q, head_size]``.
        k: the keys ``[batch..., seq_k, head_size]``.
        v: the values, laid out as k.
        mask: None or bool ``[seq_q, seq_k]`` (True: attend).
        batch_ndim: how many leading axes are batch axes.

    Raises:
        ValueError: ranks that do not fit ``batch_ndim``, or leading axes that differ.
    """
    if not q.dim() == k.dim() == v.dim() == batch_ndim + 2 or not q.shape[:batch_ndim] == k.shape[:batch_ndim] == \
            v.shape[:batch_ndim]:
        raise ValueError(f"sdpa_kernel: batch_ndim={batch_ndim} needs q, k and v of rank {batch_ndim + 2} with the "
                         f"same leading axes, got {list(q.shape)}, {list(k.shape)} and {list(v.shape)}")
    lead = q.shape[:batch_ndim]
    q3, k3, v3 = (t.reshape(math.prod(lead), *t.shape[batch_ndim:]).unsqueeze(-1) for t in (q, k, v))
    return attention(q3, k3, v3, mask).squeeze(-1).reshape(q.shape)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
              is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """Attention in the projection layout ``[batch, seq, head_size, heads]`` with an
    optional mask: the one entry point of the model zoo's attention layers.

    Without a mask it is ``sdpa`` (one fused op each way); with one, stock
    ``scaled_dot_product_attention`` on head-first views (no fused op takes a mask).

    Args:
        q: the queries ``[batch, seq_q, head_size, n_heads]``.
        k: the keys ``[batch, seq_k, head_size, n_kv_heads]``.
        v: the values, laid out as k.
        mask: None, a bool mask (True: attend) or an additive float mask, broadcasting to
            ``[batch, n_heads, seq_q, seq_k]``.
        is_causal: also mask keys after each query (top-left aligned).
        scale: of the scores; None is ``1 / sqrt(head_size)``.
    """
    if mask is None:
        return sdpa(q, k, v, is_causal=is_causal, scale=scale)
    if is_causal:
        causal = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool).tril().to(mask.device)
        mask = mask & causal if mask.dtype == torch.bool else mask.masked_fill(~causal, float("-inf"))
    heads_first = [t.permute(0, 3, 1, 2) for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*heads_first, attn_mask=mask, scale=scale,
                                         enable_gqa=q.shape[3] != k.shape[3])
    return out.permute(0, 2, 3, 1)

__all__ = ["attention", "nntile_model_transpose", "sdpa", "sdpa_eager", "sdpa_kernel"]
