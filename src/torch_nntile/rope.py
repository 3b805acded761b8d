"""Rotary position embedding: ``rope(sin, cos, x)`` as the published torch_nntile calls it.

One op, two layouts of its operands (``layout=``; None: told apart by the shapes):

- ``"pairs"`` (the reference's): x ``[..., head_dim]`` rotated in interleaved pairs
  ``(x[2i], x[2i+1])``; sin and cos ``[..., head_dim // 2]`` broadcast against x's
  leading dims (``rope_sin_cos_from_position_ids`` makes them).
- ``"projection"`` (ours): x ``[batch, seq, head_size, heads]``, HF's ``rotate_half``
  (the halves of head_size); cos and sin ``[seq, head_size]`` or
  ``[batch or 1, seq, head_size]``.

Both run one autograd function: forward and backward each record one op
(``torch_nntile::rope_fwd`` / ``rope_bwd``); on CPU tensors they run eagerly. A pair is
the projection layout's head_size of 2, so ``"pairs"`` views x as ``[1, pairs, 2, 1]``
(free) and only sin and cos are expanded (``angles_per_channel``). Gradients flow to x only.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_nntile import backend  # noqa: F401  (defines the torch_nntile:: ops)

_FWD = torch.ops.torch_nntile.rope_fwd.default
_BWD = torch.ops.torch_nntile.rope_bwd.default
LAYOUTS = ("pairs", "projection")


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return _FWD(x, cos, sin)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        cos, sin = ctx.saved_tensors
        return _BWD(grad, cos, sin), None, None


def _fits_projection(sin: torch.Tensor, x: torch.Tensor) -> bool:
    return x.dim() == 4 and sin.dim() in (2, 3) and tuple(sin.shape[-2:]) == tuple(x.shape[1:3])


def _fits_pairs(sin: torch.Tensor, x: torch.Tensor) -> bool:
    if x.dim() < 1 or x.shape[-1] % 2 or sin.dim() < 1 or 2 * sin.shape[-1] != x.shape[-1]:
        return False
    want = (*x.shape[:-1], x.shape[-1] // 2)
    try:
        return torch.broadcast_shapes(sin.shape, want) == want
    except RuntimeError:
        return False


def _layout(sin: torch.Tensor, x: torch.Tensor, layout: str | None) -> str:
    if layout is not None:
        if layout not in LAYOUTS:
            raise ValueError(f"rope: layout must be one of {LAYOUTS}, got {layout!r}")
        return layout
    fits = [name for name, ok in (("pairs", _fits_pairs(sin, x)), ("projection", _fits_projection(sin, x))) if ok]
    if len(fits) == 2:
        raise ValueError(f"rope: x {list(x.shape)} with sin {list(sin.shape)} fits both layouts; pass layout=")
    return fits[0] if fits else "projection" if x.dim() == 4 else "pairs"


def angles_per_channel(t: torch.Tensor, keep: int = 0) -> torch.Tensor:
    """Angles (or their sines or cosines) ``[..., n]``, one per channel pair, as the
    per-channel table ``[*t.shape[:keep], m, 2]`` (each angle twice, the axes from
    ``keep`` on flattened into ``m``): what the projection layout takes to turn
    interleaved pairs seen as heads of size 2 (``[batch, m, 2, heads]``, a free view).

    Args:
        t: the per-pair values.
        keep: leading axes kept as they are (a batch axis the table broadcasts over).
    """
    return t.unsqueeze(-1).expand(*t.shape, 2).reshape(*t.shape[:keep], -1, 2)


def _pairs(sin: torch.Tensor, cos: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if not (_fits_pairs(sin, x) and sin.shape == cos.shape):
        raise ValueError(f"rope: sin and cos must have one shape broadcasting to x's leading dims with head_dim // 2 "
                         f"last, got sin {list(sin.shape)}, cos {list(cos.shape)} for x {list(x.shape)}")
    half = (*x.shape[:-1], x.shape[-1] // 2)
    y = _Rope.apply(x.reshape(1, -1, 2, 1), angles_per_channel(cos.expand(half)), angles_per_channel(sin.expand(half)))
    return y.reshape(x.shape)


def rope(sin: torch.Tensor, cos: torch.Tensor, x: torch.Tensor, *, layout: str | None = None) -> torch.Tensor:
    """``x`` rotated by the angles whose sines and cosines are given (see the module).

    Args:
        sin: the angles' sines (a constant: no gradient).
        cos: their cosines, of sin's shape.
        x: the queries or keys.
        layout: ``"pairs"`` or ``"projection"``; None picks the one the shapes fit.

    Raises:
        ValueError: the shapes fit neither layout (or both, without ``layout``), or a
            projection's head_size is odd.
    """
    if _layout(sin, x, layout) == "pairs":
        return _pairs(sin, cos, x)
    return _Rope.apply(x, cos, sin)


def _rope_ref_forward(sin: torch.Tensor, cos: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The pairs rotation in plain torch ops, eagerly on any device: the oracle the
    published torch_nntile's tests compare ``rope`` with (its private name)."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), -1).reshape(x.shape)


def _rope_ref_backward(sin: torch.Tensor, cos: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The gradient of ``_rope_ref_forward`` with respect to x: the rotation back."""
    return _rope_ref_forward(-sin, cos, grad)


def rope_sin_cos_from_position_ids(position_ids: torch.Tensor, head_dim: int, *, rope_theta: float = 10000.0,
                                   identity_pad_head_dim: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sin, cos)`` ``[batch, seq, head_dim // 2]`` (float32) of HF's default rotary
    frequencies ``rope_theta ** (-2i / head_dim)`` at ``position_ids`` ``[batch, seq]``,
    for ``rope(sin, cos, x)``'s pairs. ``identity_pad_head_dim`` (GPT-NeoX's partial
    rotary) appends pairs that do not rotate (sin 0, cos 1) up to that head size."""
    if head_dim % 2:
        raise ValueError(f"rope: head_dim must be even, got {head_dim}")
    half = head_dim // 2
    inv_freq = 1.0 / rope_theta ** (torch.arange(half, dtype=torch.float32) / half)
    freqs = position_ids.to(torch.float32).unsqueeze(-1) * inv_freq.to(position_ids.device)
    sin, cos = freqs.sin(), freqs.cos()
    if identity_pad_head_dim is None or identity_pad_head_dim == head_dim:
        return sin, cos
    if identity_pad_head_dim % 2 or identity_pad_head_dim < head_dim:
        raise ValueError(f"rope: identity_pad_head_dim must be even and at least head_dim={head_dim}, "
                         f"got {identity_pad_head_dim}")
    pad = (*sin.shape[:-1], identity_pad_head_dim // 2 - half)
    return (torch.cat([sin, sin.new_zeros(pad)], -1), torch.cat([cos, cos.new_ones(pad)], -1))


__all__ = ["angles_per_channel", "rope", "rope_sin_cos_from_position_ids"]
