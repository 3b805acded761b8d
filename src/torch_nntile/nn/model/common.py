"""What the model families share: reading a config, the causal mask, the
projections between hidden states and the attention's heads, and keeping an LM head
tied to the token embedding through loading and moves.

Attention weights are kept in the published torch_nntile's layout: q, k and v
``[hidden, head_size, *heads]`` and the output ``[head_size, *heads, hidden]``, so a
projection is one ``gemm`` whose result is already the projection layout
``[batch, seq, head_size, heads]`` that ``nn.attention.attention`` takes (no transpose
is recorded). Biases of q, k and v are ``[*heads, head_size]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from torch_nntile.add_fiber import add_fiber
from torch_nntile.gemm import gemm


def cfg(config: Any, name: str, default: Any = None) -> Any:
    """``config.name``, or ``default`` where the config lacks it or leaves it None: configs
    are read by attribute, so HF's config classes, ours and plain namespaces all work
    and ``transformers`` need not be imported."""
    value = getattr(config, name, None)
    return default if value is None else value


def make_causal_sdpa_mask(seq_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The bool causal mask ``[seq, seq]``: ``mask[q, k]`` is True where ``k <= q`` (True:
    attend), built on the CPU and moved to ``device``."""
    mask = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    return mask if device is None else mask.to(device)


def project_heads(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Hidden states ``[..., hidden]`` projected to ``[..., head_size, heads]``.

    Args:
        x: the hidden states.
        weight: ``[hidden, head_size, *heads]`` (grouped-query q weights have two head
            axes, ``[n_kv_heads, n_rep]``; they are flattened kv-major, as HF's heads).
        bias: None or ``[*heads, head_size]``.
    """
    head_size = weight.shape[1]
    y = gemm(x, weight, ndim=1)
    y = y.reshape(*x.shape[:-1], head_size, -1)
    if bias is not None:
        y = y + bias.reshape(-1, head_size).t()
    return y


def merge_heads(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The attention's output ``[..., head_size, heads]`` projected back to ``[..., hidden]``.

    Args:
        a: the attention's output.
        weight: ``[head_size, *heads, hidden]``.
        bias: None or ``[hidden]``.
    """
    y = gemm(a.reshape(*a.shape[:-1], *weight.shape[1:-1]), weight, ndim=weight.dim() - 1)
    return y if bias is None else add_fiber(bias, y, axis=y.dim() - 1)


def init_normal_(module: nn.Module, std: float = 0.02) -> None:
    """Every weight of ``module`` normal with ``std`` and every bias zero (GPT-2's and
    Llama's initialisation), norms left as they are."""
    for name, p in module.named_parameters(recurse=False):
        with torch.no_grad():
            p.zero_() if "bias" in name else p.normal_(0.0, std)


class TiedHeadModule(nn.Module):
    """Base of the models whose LM head may share the token embedding's weight.

    ``_apply`` (behind ``.to()``) gives each module new parameters one by one, which
    would leave the head and the embedding with a copy each: it calls ``_tie`` after,
    which subclasses override to share the weight again where their config says so.
    """

    def _tie(self) -> None:
        """Make the head's weight the embedding's where the model is tied (a no-op here)."""

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> TiedHeadModule:
        super()._apply(fn, *args, **kwargs)
        self._tie()
        return self


def fill_tied_head(sd: dict[str, torch.Tensor], head: str, embedding: str) -> dict[str, torch.Tensor]:
    """``sd`` with ``sd[head]`` set to ``sd[embedding]`` where only the embedding is there
    (a tied model's state dict or gradients name the shared tensor once).

    Args:
        sd: a state dict, changed in place.
        head: the LM head's key.
        embedding: the token embedding's key.
    """
    if head not in sd and embedding in sd:
        sd[head] = sd[embedding]
    return sd


def load_converted_state_dict(model: nn.Module, hf: Any, to_ours: Callable[[dict[str, torch.Tensor], Any], dict],
                              tie: tuple[str, str] | None = None) -> None:
    """Load HF's weights into ``model`` strictly, through the family's name and layout
    converter.

    Args:
        model: our model (its ``config`` goes to ``to_ours``), on any device.
        hf: an HF model (anything with ``state_dict()``) or its state dict.
        to_ours: ``(state_dict, config) -> state dict`` under our names and layouts.
        tie: None, or the keys ``(head, embedding)`` of a tied model: the head then
            takes the embedding's values whatever HF's head holds.
    """
    ours = to_ours(hf.state_dict() if hasattr(hf, "state_dict") else hf, model.config)
    if tie is not None:
        ours[tie[0]] = ours[tie[1]]
    with torch.no_grad():
        model.load_state_dict(ours)


__all__ = ["TiedHeadModule", "cfg", "fill_tied_head", "init_normal_", "load_converted_state_dict",
           "make_causal_sdpa_mask", "merge_heads", "project_heads"]
