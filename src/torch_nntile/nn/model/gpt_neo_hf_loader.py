"""Weights between HF's ``GPTNeoForCausalLM`` and our ``GPTNeoCausal``, both ways.

Only the attention differs in layout: HF's ``q_proj``, ``k_proj``, ``v_proj`` and
``out_proj`` are ``nn.Linear`` weights, ours are ``[hidden, head_dim, n_heads]`` and
``[head_dim, n_heads, hidden]`` (``torch_nntile.nn.linear``'s converters); every other
tensor keeps its name and shape. The converters work on any name-to-tensor dict, so they
also map gradients. ``transformers`` is never imported: the HF model is read by duck typing.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from torch_nntile.nn.linear import (
    linear_to_output_weight,
    linear_to_qkv_weight,
    output_to_linear_weight,
    qkv_to_linear_weight,
)
from torch_nntile.nn.model.common import fill_tied_head, load_converted_state_dict
from torch_nntile.nn.model.gpt_neo import GPTNeoCausal, GPTNeoConfig

_HF_ATTN = re.compile(r"^(transformer\.h\.\d+\.attn\.)attention\.(q_proj|k_proj|v_proj|out_proj)\.(weight|bias)$")
_OURS_ATTN = re.compile(r"^(transformer\.h\.\d+\.attn\.)(q|k|v|o)_(weight|bias)$")
_HF_TO_OURS = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "out_proj": "o"}
_OURS_TO_HF = {v: k for k, v in _HF_TO_OURS.items()}
_TIED = ("lm_head.weight", "transformer.wte.weight")
_SAME = re.compile(r"^(transformer\.(wte|wpe|ln_f|h\.\d+\.(ln_1|ln_2|mlp\.c_fc|mlp\.c_proj))\.(weight|bias)|lm_head\.weight)$")


def gpt_neo_config_from_hf(hf: Any) -> GPTNeoConfig:
    """Our config from HF's ``GPTNeoConfig`` (or any object with its attributes).

    Args:
        hf: the HF config (``model.config``).
    """
    return GPTNeoConfig.from_config(hf)


def gpt_neo_state_dict_from_hf(sd: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """HF ``GPTNeoForCausalLM`` names and layouts -> ours. Tensors we do not have (HF's
    mask buffers of old checkpoints) are dropped; a missing ``lm_head.weight`` is the
    token embedding (tied).

    Args:
        sd: HF's state dict (or gradients under HF's names).
        config: the model's config.
    """
    c = GPTNeoConfig.from_config(config)
    out: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        m = _HF_ATTN.match(name)
        if m:
            prefix, proj, kind = m.groups()
            if proj == "out_proj" and kind == "weight":
                t = linear_to_output_weight(t, n_heads=c.num_attention_heads, head_size=c.head_dim)
            elif kind == "weight":
                t = linear_to_qkv_weight(t, n_heads=c.num_attention_heads, head_size=c.head_dim)
            out[f"{prefix}{_HF_TO_OURS[proj]}_{kind}"] = t
        elif _SAME.match(name):
            out[name] = t
    return fill_tied_head(out, *_TIED)


def gpt_neo_state_dict_to_hf(sd: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """Ours -> HF ``GPTNeoForCausalLM`` names and layouts (CPU tensors); a missing
    ``lm_head.weight`` (a tied head's gradient, counted once) is the token embedding's.

    Args:
        sd: our state dict, or gradients under our names.
        config: the model's config.
    """
    del config  # the layouts carry the head counts
    out: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        t = t.detach().cpu()
        m = _OURS_ATTN.match(name)
        if m:
            prefix, proj, kind = m.groups()
            if proj == "o" and kind == "weight":
                t = output_to_linear_weight(t)
            elif kind == "weight":
                t = qkv_to_linear_weight(t)
            out[f"{prefix}attention.{_OURS_TO_HF[proj]}.{kind}"] = t
        elif _SAME.match(name):
            out[name] = t
    return fill_tied_head(out, *_TIED)


def load_hf_into_gpt_neo_causal(minimal: GPTNeoCausal, hf: Any) -> None:
    """Copy the weights of an HF GPT-Neo into ``minimal`` (strict: all of ours must be
    there). Its config must match ``minimal``'s.

    Args:
        minimal: our model, on any device.
        hf: a ``GPTNeoForCausalLM`` or its state dict.
    """
    load_converted_state_dict(minimal, hf, gpt_neo_state_dict_from_hf,
                              _TIED if minimal.config.tie_word_embeddings else None)


def export_gpt_neo_causal_to_hf_state_dict(minimal: GPTNeoCausal, *, config: Any = None) -> dict[str, torch.Tensor]:
    """``minimal``'s weights as ``GPTNeoForCausalLM.load_state_dict`` takes them (CPU
    copies).

    Args:
        minimal: our model.
        config: unused (kept for the published torch_nntile's signature): our model's
            config decides.
    """
    del config
    return {k: v.clone() for k, v in gpt_neo_state_dict_to_hf(minimal.state_dict(), minimal.config).items()}


__all__ = [
    "export_gpt_neo_causal_to_hf_state_dict",
    "gpt_neo_config_from_hf",
    "gpt_neo_state_dict_from_hf",
    "gpt_neo_state_dict_to_hf",
    "load_hf_into_gpt_neo_causal",
]
