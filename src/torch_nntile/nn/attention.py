"""Scaled dot-product attention in the projection layout ``[batch, seq, head_size, heads]``.

One autograd function: its forward records one op (``torch_nntile::sdpa_fwd``, which
also keeps the logsumexp), its backward one op returning the three gradients
(``sdpa_bwd``). On CPU tensors the same ops run eagerly.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_nntile import backend  # noqa: F401  (defines the torch_nntile:: ops)

_FWD = torch.ops.torch_nntile.sdpa_fwd.default
_BWD = torch.ops.torch_nntile.sdpa_bwd.default


class _SDPA(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                scale: float | None) -> torch.Tensor:
        out, lse = _FWD(q, k, v, is_causal, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal, ctx.scale = is_causal, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _BWD(grad, q, k, v, out, lse, ctx.is_causal, ctx.scale)
        return dq, dk, dv, None, None


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
         scale: float | None = None) -> torch.Tensor:
    """Attention of q ``[batch, seq_q, head_size, n_heads]`` over k and v ``[batch, seq_k,
    head_size, n_kv_heads]`` (q head ``h`` reads kv head ``h // (n_heads // n_kv_heads)``,
    as HF's ``repeat_kv``): what ``torch.nn.functional.scaled_dot_product_attention``
    gives on the ``[batch, heads, seq, head_size]`` permutations, in q's layout.
    ``scale`` None is ``1 / sqrt(head_size)``; ``is_causal`` masks top-left aligned.
    No dropout."""
    return _SDPA.apply(q, k, v, bool(is_causal), None if scale is None else float(scale))


__all__ = ["sdpa"]
