"""GPT-2 weights between HF's ``GPT2LMHeadModel`` and ``gpt2_minimal.GPT2LMHead``.

Both have the same names except inside a block: HF fuses q, k and v into one
``Conv1D`` (``c_attn``, weight ``[hidden, 3 * hidden]``, inputs first) and keeps its
MLP's ``Conv1D`` weights inputs first; ours splits q/k/v into the head layout of
``common`` and stores MLP weights as a ``Linear``'s ``[out, in]``. The conversions are
plain tensor reshapes of state dicts: no ``transformers`` import.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

StateDict = dict[str, torch.Tensor]


def attn_from_hf(c_attn_w: torch.Tensor, c_attn_b: torch.Tensor, c_proj_w: torch.Tensor, c_proj_b: torch.Tensor,
                 n_heads: int) -> StateDict:
    """One HF attention's weights as ``GPT2Attention``'s (``q_weight`` ... ``o_bias``).

    Args:
        c_attn_w: ``c_attn.weight`` ``[hidden, 3 * hidden]``: q, k, v outputs, head-major.
        c_attn_b: ``c_attn.bias`` ``[3 * hidden]``.
        c_proj_w: ``c_proj.weight`` ``[hidden (heads, head_size), hidden]``.
        c_proj_b: ``c_proj.bias``.
        n_heads: the heads.
    """
    hidden = c_attn_w.shape[0]
    head_size = hidden // n_heads
    out: StateDict = {}
    for p, w, b in zip("qkv", c_attn_w.split(hidden, 1), c_attn_b.split(hidden)):
        out[f"{p}_weight"] = w.reshape(hidden, n_heads, head_size).transpose(1, 2).contiguous()
        out[f"{p}_bias"] = b.reshape(n_heads, head_size).contiguous()
    out["o_weight"] = c_proj_w.reshape(n_heads, head_size, hidden).transpose(0, 1).contiguous()
    out["o_bias"] = c_proj_b
    return out


def attn_to_hf(sd: StateDict) -> StateDict:
    """The inverse of ``attn_from_hf``: ``c_attn.weight``, ``c_attn.bias``, ``c_proj.weight``
    and ``c_proj.bias`` from a ``GPT2Attention``'s tensors."""
    hidden = sd["q_weight"].shape[0]
    ws = [sd[f"{p}_weight"].transpose(1, 2).reshape(hidden, hidden) for p in "qkv"]
    return {"c_attn.weight": torch.cat(ws, 1), "c_attn.bias": torch.cat([sd[f"{p}_bias"].reshape(-1) for p in "qkv"]),
            "c_proj.weight": sd["o_weight"].transpose(0, 1).reshape(hidden, hidden).contiguous(),
            "c_proj.bias": sd["o_bias"]}


def _blocks(sd: StateDict, prefix: str) -> list[str]:
    n = {int(k[len(prefix):].split(".")[0]) for k in sd if k.startswith(prefix)}
    return [f"{prefix}{i}." for i in range(max(n) + 1)] if n else []


def gpt2_state_dict_from_hf(sd: StateDict, n_head: int, *, tied: bool = True) -> StateDict:
    """An HF GPT-2 state dict as ``GPT2LMHead``'s.

    Args:
        sd: ``GPT2LMHeadModel``'s, or ``GPT2Model``'s (without ``transformer.``).
        n_head: the heads of the config.
        tied: the head is the token embedding: without ``lm_head.weight`` in ``sd`` it is
            taken from ``wte``.
    """
    sd = {k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}": v for k, v in sd.items()}
    out: StateDict = {}
    for key, t in sd.items():
        if ".attn." not in key and ".mlp." not in key:  # attention and MLP weights are converted below
            out[key] = t
    for blk in _blocks(sd, "transformer.h."):
        a = f"{blk}attn."
        for name, t in attn_from_hf(sd[a + "c_attn.weight"], sd[a + "c_attn.bias"], sd[a + "c_proj.weight"],
                                    sd[a + "c_proj.bias"], n_head).items():
            out[a + name] = t
        for lin in ("c_fc", "c_proj"):
            out[f"{blk}mlp.{lin}.weight"] = sd[f"{blk}mlp.{lin}.weight"].t().contiguous()
            out[f"{blk}mlp.{lin}.bias"] = sd[f"{blk}mlp.{lin}.bias"]
    if tied and "lm_head.weight" not in out:
        out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def gpt2_state_dict_to_hf(sd: StateDict, n_head: int) -> StateDict:
    """``GPT2LMHead``'s state dict as ``GPT2LMHeadModel.load_state_dict`` takes it.

    Args:
        sd: ours (its ``lm_head.weight`` is kept, the token embedding where tied).
        n_head: the heads of the config (the layout carries them: kept for symmetry).
    """
    del n_head
    out: StateDict = {k: v for k, v in sd.items() if ".attn." not in k and ".mlp." not in k}
    for blk in _blocks(sd, "transformer.h."):
        a = f"{blk}attn."
        ours = {k[len(a):]: v for k, v in sd.items() if k.startswith(a)}
        out.update({a + k: v for k, v in attn_to_hf(ours).items()})
        for lin in ("c_fc", "c_proj"):
            out[f"{blk}mlp.{lin}.weight"] = sd[f"{blk}mlp.{lin}.weight"].t().contiguous()
            out[f"{blk}mlp.{lin}.bias"] = sd[f"{blk}mlp.{lin}.bias"]
    return out


def _split_hf_attn_weights(attn: Any, hidden: int, n_heads: int, head_size: int) -> StateDict:
    """``attn_from_hf`` of an HF ``GPT2Attention`` module, as the reference names it.

    Args:
        attn: the HF module (its ``c_attn`` and ``c_proj``).
        hidden: its width (checked).
        n_heads: its heads.
        head_size: its head size (checked).
    """
    if hidden != n_heads * head_size or attn.c_attn.weight.shape[0] != hidden:
        raise ValueError(f"GPT2: hidden {hidden} is not n_heads {n_heads} x head_size {head_size} of this attention")
    return {k: v.detach() for k, v in attn_from_hf(attn.c_attn.weight, attn.c_attn.bias, attn.c_proj.weight,
                                                   attn.c_proj.bias, n_heads).items()}


def load_hf_into_gpt2_lm_head(minimal: nn.Module, hf: nn.Module) -> None:
    """Copy an HF ``GPT2LMHeadModel``'s weights into a ``GPT2LMHead`` (on either's device).

    Args:
        minimal: ours, of the same config.
        hf: HF's.
    """
    sd = {k: v.detach() for k, v in hf.state_dict().items()}
    minimal.load_state_dict(gpt2_state_dict_from_hf(sd, minimal.transformer.h[0].attn.n_head, tied=minimal.tied))


def export_gpt2_lm_head_to_hf_state_dict(minimal: nn.Module, *, config: Any = None) -> StateDict:
    """A ``GPT2LMHead``'s weights as a ``GPT2LMHeadModel`` state dict of CPU tensors.

    Args:
        minimal: ours.
        config: accepted for the reference's signature; the layout needs none.
    """
    del config
    sd = {k: v.detach().cpu() for k, v in minimal.state_dict().items()}
    return gpt2_state_dict_to_hf(sd, minimal.transformer.h[0].attn.n_head)


__all__ = ["attn_from_hf", "attn_to_hf", "export_gpt2_lm_head_to_hf_state_dict", "gpt2_state_dict_from_hf",
           "gpt2_state_dict_to_hf", "load_hf_into_gpt2_lm_head"]
