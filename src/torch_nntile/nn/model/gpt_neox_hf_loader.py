"""Weights between HF's ``GPTNeoXForCausalLM`` and our ``GPTNeoXCausal``, both ways.

HF fuses q, k and v in ``query_key_value`` (rows ``[n_heads, 3, head_dim]``: each
head's q, then k, then v) and rotates the first ``rotary_ndims`` channels of a head as
two halves; ours are three ``[hidden, head_dim, n_heads]`` weights (biases ``[n_heads,
head_dim]``) whose rotary channels are interleaved pairs: our channel ``2i`` is HF's
``i`` and ``2i + 1`` is HF's ``rotary_ndims / 2 + i`` (``hf_rope_layout``'s reorder,
the same for q and k, so scores are unchanged). ``dense`` becomes ``o_weight``
``[head_dim, n_heads, hidden]``; other tensors keep their names, the LM head being HF's
``lm_head`` (``embed_out`` in transformers 4) and our ``embed_out``. The converters take
any name-to-tensor dict, so they also map gradients. ``transformers`` is never imported.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from torch_nntile.nn.linear import linear_to_output_weight, output_to_linear_weight
from torch_nntile.nn.model.common import fill_tied_head, load_converted_state_dict
from torch_nntile.nn.model.gpt_neox import GPTNeoXCausal, GPTNeoXConfig
from torch_nntile.nn.model.hf_rope_layout import (
    hf_to_nntile_fused_qkv_bias,
    hf_to_nntile_fused_qkv_weight,
    nntile_to_hf_fused_qkv_bias,
    nntile_to_hf_fused_qkv_weight,
)

_LAYER = r"^(gpt_neox\.layers\.\d+\.attention\.)"
_HF_ATTN = re.compile(_LAYER + r"(query_key_value|dense)\.(weight|bias)$")
_OURS_ATTN = re.compile(_LAYER + r"(q|k|v|o)_(weight|bias)$")
_SAME = re.compile(r"^gpt_neox\.(embed_in|final_layer_norm|layers\.\d+\.(input_layernorm|post_attention_layernorm|"
                   r"mlp\.dense_h_to_4h|mlp\.dense_4h_to_h))\.(weight|bias)$")
_HF_HEADS = ("lm_head.weight", "embed_out.weight")
_TIED = ("embed_out.weight", "gpt_neox.embed_in.weight")


def gpt_neox_config_from_hf(hf: Any) -> GPTNeoXConfig:
    """Our config from HF's ``GPTNeoXConfig`` (or any object with its attributes).

    Args:
        hf: the HF config (``model.config``).
    """
    return GPTNeoXConfig.from_config(hf)


def gpt_neox_state_dict_from_hf(sd: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """HF ``GPTNeoXForCausalLM`` names and layouts -> ours. Tensors we do not have (the
    rotary frequencies and mask buffers of old checkpoints) are dropped; without an LM
    head the token embedding stands for it (tied).

    Args:
        sd: HF's state dict (or gradients under HF's names).
        config: the model's config.
    """
    c = GPTNeoXConfig.from_config(config)
    h, d = c.num_attention_heads, c.head_dim
    out: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        m = _HF_ATTN.match(name)
        if m and m.group(2) == "dense":
            prefix, _, kind = m.groups()
            out[f"{prefix}o_{kind}"] = linear_to_output_weight(t, n_heads=h, head_size=d) if kind == "weight" else t
        elif m:
            prefix, _, kind = m.groups()
            to_pairs = hf_to_nntile_fused_qkv_weight if kind == "weight" else hf_to_nntile_fused_qkv_bias
            t = to_pairs(t, n_heads=h, head_dim=d, rotary_pct=c.rotary_pct).reshape(h, 3, d, -1)
            for i, proj in enumerate("qkv"):  # t: [heads, q/k/v, channel, in (or 1 for the bias)]
                w = t[:, i]
                out[f"{prefix}{proj}_{kind}"] = (w.permute(2, 1, 0) if kind == "weight" else w[..., 0]).contiguous()
        elif _SAME.match(name):
            out[name] = t
        elif name in _HF_HEADS:
            out["embed_out.weight"] = t
    return fill_tied_head(out, *_TIED)


def gpt_neox_state_dict_to_hf(sd: dict[str, torch.Tensor], config: Any, *,
                              head_key: str = "lm_head.weight") -> dict[str, torch.Tensor]:
    """Ours -> HF ``GPTNeoXForCausalLM`` names and layouts (CPU tensors); a missing
    ``embed_out.weight`` (a tied head's gradient, counted once) is the token embedding's.

    Args:
        sd: our state dict, or gradients under our names.
        config: the model's config.
        head_key: HF's name of the LM head (``"embed_out.weight"`` for transformers 4).
    """
    c = GPTNeoXConfig.from_config(config)
    h, d = c.num_attention_heads, c.head_dim
    sd = {k: v.detach().cpu() for k, v in sd.items()}
    out: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        m = _OURS_ATTN.match(name)
        if m and m.group(2) == "o":
            prefix, _, kind = m.groups()
            out[f"{prefix}dense.{kind}"] = output_to_linear_weight(t) if kind == "weight" else t
        elif m and m.group(2) == "q":
            prefix, _, kind = m.groups()
            parts = [sd[f"{prefix}{p}_{kind}"] for p in "qkv"]
            if kind == "weight":  # [in, channel, heads] -> [heads, channel, in]
                parts = [p.permute(2, 1, 0) for p in parts]
            fused = torch.stack(parts, 1)  # [heads, q/k/v, channel(, in)]
            fused = fused.reshape(-1, *fused.shape[3:])
            to_halves = nntile_to_hf_fused_qkv_weight if kind == "weight" else nntile_to_hf_fused_qkv_bias
            out[f"{prefix}query_key_value.{kind}"] = to_halves(fused, n_heads=h, head_dim=d, rotary_pct=c.rotary_pct)
        elif _SAME.match(name):
            out[name] = t
        elif name == "embed_out.weight":
            out[head_key] = t
    return fill_tied_head(out, head_key, _TIED[1])


def load_hf_into_gpt_neox_causal(minimal: GPTNeoXCausal, hf: Any) -> None:
    """Copy the weights of an HF GPT-NeoX into ``minimal`` (strict: all of ours must be
    there). Its config must match ``minimal``'s.

    Args:
        minimal: our model, on any device.
        hf: a ``GPTNeoXForCausalLM`` or its state dict.
    """
    load_converted_state_dict(minimal, hf, gpt_neox_state_dict_from_hf,
                              _TIED if minimal.config.tie_word_embeddings else None)


def export_gpt_neox_causal_to_hf_state_dict(minimal: GPTNeoXCausal, *, config: Any = None,
                                            head_key: str = "lm_head.weight") -> dict[str, torch.Tensor]:
    """``minimal``'s weights as ``GPTNeoXForCausalLM.load_state_dict`` takes them (CPU
    copies).

    Args:
        minimal: our model.
        config: unused (kept for the published torch_nntile's signature): our model's
            config decides.
        head_key: HF's name of the LM head (``"embed_out.weight"`` for transformers 4).
    """
    del config
    sd = gpt_neox_state_dict_to_hf(minimal.state_dict(), minimal.config, head_key=head_key)
    return {k: v.clone() for k, v in sd.items()}


__all__ = [
    "export_gpt_neox_causal_to_hf_state_dict",
    "gpt_neox_config_from_hf",
    "gpt_neox_state_dict_from_hf",
    "gpt_neox_state_dict_to_hf",
    "load_hf_into_gpt_neox_causal",
]
