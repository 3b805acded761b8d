"""Convert the published torch_nntile's 3-D attention weights to and from torch's.

q/k/v ``[hidden, n_heads, head_size]`` (torch's, heads split off a ``Linear`` weight)
become ``[hidden, head_size, n_heads]``, whose projection is the layout ``[batch, seq,
head_size, n_heads]`` of ``sdpa``; the output ``[n_heads, head_size, hidden]`` becomes
``[head_size, n_heads, hidden]``. Each is its own inverse's transpose, so round trips
are exact. Whole HF state dicts are each family's ``nn.model.*_hf_loader``'s job.
"""

from __future__ import annotations

import torch

StateDict = dict[str, torch.Tensor]


def _swap_3d(w: torch.Tensor, dims: tuple[int, int], what: str) -> torch.Tensor:
    if w.dim() != 3:
        raise ValueError(f"{what} must be 3D, got shape {list(w.shape)}")
    return w.transpose(*dims).contiguous()


def torch_to_nntile_qkv_weight(w: torch.Tensor) -> torch.Tensor:
    """``[hidden, n_heads, head_size]`` -> ``[hidden, head_size, n_heads]``."""
    return _swap_3d(w, (1, 2), "qkv weight (hidden, n_heads, head_size)")


def nntile_to_torch_qkv_weight(w: torch.Tensor) -> torch.Tensor:
    """``[hidden, head_size, n_heads]`` -> ``[hidden, n_heads, head_size]``."""
    return _swap_3d(w, (1, 2), "qkv weight (hidden, head_size, n_heads)")


def torch_to_nntile_o_weight(w: torch.Tensor) -> torch.Tensor:
    """``[n_heads, head_size, hidden]`` -> ``[head_size, n_heads, hidden]``."""
    return _swap_3d(w, (0, 1), "o weight (n_heads, head_size, hidden)")


def nntile_to_torch_o_weight(w: torch.Tensor) -> torch.Tensor:
    """``[head_size, n_heads, hidden]`` -> ``[n_heads, head_size, hidden]``."""
    return _swap_3d(w, (0, 1), "o weight (head_size, n_heads, hidden)")


_ATTN_CONVERTERS = {"torch_to_nntile": (torch_to_nntile_qkv_weight, torch_to_nntile_o_weight),
                    "nntile_to_torch": (nntile_to_torch_qkv_weight, nntile_to_torch_o_weight)}


def convert_attn_weights(weights: StateDict, direction: str, *, prefix: str = "") -> StateDict:
    """A copy of ``weights`` whose keys ending in ``q_weight``, ``k_weight``, ``v_weight``
    (or ``o_weight``) are converted in ``direction`` (``"torch_to_nntile"`` or
    ``"nntile_to_torch"``); biases and other keys are kept. With ``prefix``, only keys
    under it."""
    if direction not in _ATTN_CONVERTERS:
        raise ValueError(f"direction must be 'torch_to_nntile' or 'nntile_to_torch', got {direction!r}")
    qkv, o = _ATTN_CONVERTERS[direction]
    under = prefix if not prefix or prefix.endswith(".") else prefix + "."
    out = dict(weights)
    for key, t in weights.items():
        leaf = key.rsplit(".", 1)[-1]
        if key.startswith(under) and leaf in ("q_weight", "k_weight", "v_weight", "o_weight"):
            out[key] = o(t) if leaf == "o_weight" else qkv(t)
    return out
