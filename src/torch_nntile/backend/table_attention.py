"""torch_nntile:: ops of attention: ``sdpa_fwd`` / ``sdpa_bwd`` and ``rope_fwd`` / ``rope_bwd``;
stock ``aten::scaled_dot_product_attention`` on nntile tensors.

Each call records one graph op (``ops/attention.py``); the CPU kernels compute the
same values eagerly with the same plain functions. ``SDPA`` is the autograd function
over the pair, which the API's ``sdpa`` and the stock op both call.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_nntile.backend.aten import check_live, define, override_composite
from torch_nntile.backend.device import DEVICE, new_tensor, read
from torch_nntile.ops import attention


def _laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A ``[b, h, s, d]`` result, dense in ``layout``."""
    return attention.from_heads_first(t, layout).contiguous()


def _sdpa_fwd_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float | None,
                  layout: str = "bsdh") -> tuple[torch.Tensor, torch.Tensor]:
    rep = attention.check_sdpa(tuple(q.shape), tuple(k.shape), tuple(v.shape), (q.dtype, k.dtype, v.dtype), layout)
    out, lse = attention.attend(q, k, v, rep, is_causal, scale, layout)
    return _laid_out(out, layout), lse.permute(0, 2, 1).contiguous()


def _sdpa_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float | None,
              layout: str = "bsdh") -> tuple[torch.Tensor, torch.Tensor]:
    check_live()
    out, lse = attention.sdpa(read(q), read(k), read(v), is_causal, scale, layout)
    return new_tensor(out), new_tensor(lse)


def _sdpa_bwd_cpu(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, is_causal: bool, scale: float | None, layout: str = "bsdh"
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rep = attention.check_sdpa(tuple(q.shape), tuple(k.shape), tuple(v.shape), (q.dtype, k.dtype, v.dtype), layout)
    grads = attention.attend_backward(g, q, k, v, out, lse, rep, is_causal, scale, layout)
    return tuple(_laid_out(t, layout) for t in grads)  # type: ignore[return-value]


def _sdpa_bwd(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
              lse: torch.Tensor, is_causal: bool, scale: float | None, layout: str = "bsdh"
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_live()
    nodes = attention.sdpa_backward(*(read(t) for t in (g, q, k, v, out, lse)), is_causal, scale, layout)
    return tuple(new_tensor(n) for n in nodes)  # type: ignore[return-value]


def _rope_cpu(transpose: bool):  # noqa: ANN202 - one CPU kernel per direction
    def cpu(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        attention.check_rope(tuple(x.shape), tuple(cos.shape), tuple(sin.shape))
        y = torch.empty(x.shape, dtype=attention.rope_dtype(x.dtype, cos.dtype, sin.dtype))
        attention.rope_tile(transpose, y, x, cos, sin)
        return y
    return cpu


def _rope(transpose: bool):  # noqa: ANN202
    def nntile(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        check_live()
        return new_tensor(attention.rope(read(x), read(cos), read(sin), transpose))
    return nntile


SDPA_FWD = define("sdpa_fwd(Tensor q, Tensor k, Tensor v, bool is_causal, float? scale, str layout=\"bsdh\") "
                  "-> (Tensor, Tensor)", _sdpa_fwd_cpu, _sdpa_fwd)
SDPA_BWD = define("sdpa_bwd(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool is_causal, "
                  "float? scale, str layout=\"bsdh\") -> (Tensor, Tensor, Tensor)", _sdpa_bwd_cpu, _sdpa_bwd)
ROPE_FWD = define("rope_fwd(Tensor x, Tensor cos, Tensor sin) -> Tensor", _rope_cpu(False), _rope(False))
ROPE_BWD = define("rope_bwd(Tensor grad, Tensor cos, Tensor sin) -> Tensor", _rope_cpu(True), _rope(True))


class SDPA(torch.autograd.Function):
    """Attention as one recorded op each way; the forward keeps the logsumexp."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                scale: float | None, layout: str) -> torch.Tensor:
        out, lse = SDPA_FWD(q, k, v, is_causal, scale, layout)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal, ctx.scale, ctx.layout = is_causal, scale, layout
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = SDPA_BWD(grad, q, k, v, out, lse, ctx.is_causal, ctx.scale, ctx.layout)
        return dq, dk, dv, None, None, None


# -- stock scaled_dot_product_attention ------------------------------------------------


def _fused_fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
                dropout_p: float, enable_gqa: bool) -> bool:
    """Whether the call is one the flash op computes as CPU's SDPA does: no mask or
    dropout, [batch, (heads,) seq, head_size] nntile tensors that ``check_sdpa``
    accepts, q heads a multiple of kv heads only where ``enable_gqa`` asks."""
    if attn_mask is not None or dropout_p != 0.0 or q.dim() not in (3, 4) or not q.dim() == k.dim() == v.dim():
        return False
    if any(t.device.type != DEVICE for t in (q, k, v)):
        return False
    shapes = [tuple(t.shape) if t.dim() == 4 else (t.shape[0], 1, *t.shape[1:]) for t in (q, k, v)]
    try:
        rep = attention.check_sdpa(*shapes, (q.dtype, k.dtype, v.dtype), "bhsd")
    except (ValueError, TypeError):  # not attention the op computes: the composite decides (and raises)
        return False
    return rep == 1 or enable_gqa


def _check_mask(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> None:
    """A mask that does not broadcast to the scores: CPU's error (the composite adds the
    mask to the scores), saying also what the published torch_nntile's does."""
    try:
        scores = (*q.shape[:-1], k.shape[-2])
    except IndexError:  # not attention at all: the composite raises CPU's error
        return
    try:
        torch.broadcast_shapes(scores, tuple(mask.shape))
        return
    except RuntimeError:
        pass
    try:  # CPU's words, from the add of two expanded scalars (it fails before allocating)
        torch.empty(()).expand(scores) + torch.empty(()).expand(mask.shape)
    except RuntimeError as e:
        raise RuntimeError(f"{e} (scaled_dot_product_attention: the attention mask of shape {list(mask.shape)} "
                           f"does not broadcast to the scores' shape {list(scores)})") from None


def _scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                  attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                  is_causal: bool = False, scale: float | None = None,
                                  enable_gqa: bool = False) -> torch.Tensor:
    """Stock SDPA: the flash op where it fits (read in the order q lies in memory, so
    HF's projections need no permuting copy), else ATen's own composite (the math
    path, which validates the call as on CPU)."""
    if not _fused_fits(query, key, value, attn_mask, dropout_p, enable_gqa):
        if attn_mask is not None:
            _check_mask(query, key, attn_mask)
        return torch.ops.aten.scaled_dot_product_attention.default.decompose(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    q, k, v = (t.unsqueeze(1) for t in (query, key, value)) if query.dim() == 3 else (query, key, value)
    if q.stride(1) <= q.stride(2):  # heads inside the sequence in memory: [b, s, h, d]
        out = SDPA.apply(*(t.transpose(1, 2) for t in (q, k, v)), bool(is_causal), scale, "bshd").transpose(1, 2)
    else:
        out = SDPA.apply(q, k, v, bool(is_causal), scale, "bhsd")
    return out.squeeze(1) if query.dim() == 3 else out


override_composite("scaled_dot_product_attention", _scaled_dot_product_attention)
