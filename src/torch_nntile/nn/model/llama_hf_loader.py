"""Weights between HF's ``LlamaForCausalLM`` and our ``LlamaCausal`` (``llama``), both ways.

The names match except the attention's: HF's ``self_attn.{q,k,v,o}_proj.{weight,bias}``
are ours ``self_attn.{q,k,v,o}_{weight,bias}`` in the head layout of ``nn.linear``'s
converters, with the rotary channels of q and k in neighbouring pairs
(``hf_rope_layout``). The HF model is only read by attribute (``config``,
``state_dict()``): ``transformers`` is not imported.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from torch_nntile.nn.linear import (
    gqa_output_to_linear_weight,
    gqa_q_to_linear_weight,
    linear_to_gqa_output_weight,
    linear_to_gqa_q_weight,
    linear_to_output_weight,
    linear_to_qkv_weight,
    output_to_linear_weight,
    qkv_to_linear_weight,
)
from torch_nntile.nn.model.hf_rope_layout import (
    hf_to_nntile_qkv_bias,
    hf_to_nntile_qkv_weight,
    nntile_to_hf_qkv_bias,
    nntile_to_hf_qkv_weight,
)
from torch_nntile.nn.model.llama import LlamaCausal, LlamaConfig

StateDict = dict[str, torch.Tensor]

# the fields a state dict's shapes depend on
_SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "attention_bias", "mlp_bias")


def llama_config_from_hf(hf: Any) -> LlamaConfig:
    """Our ``LlamaConfig`` from HF's (or from an HF model, through its ``config``).

    Args:
        hf: HF's ``LlamaConfig`` (any object with its attribute names), or a model with one.

    Raises:
        ValueError: a rope type other than the default.
    """
    if not hasattr(hf, "hidden_size") and hasattr(hf, "config"):
        hf = hf.config
    return LlamaConfig.from_hf(hf)


def _attn_from_hf(proj: str, leaf: str, t: torch.Tensor, n_heads: int, n_kv: int) -> torch.Tensor:
    rep = n_heads // n_kv
    heads = n_heads if proj in "qo" else n_kv
    d = (t.shape[0] if proj != "o" else t.shape[-1]) // heads
    if leaf == "bias":
        if proj == "o":
            return t
        if proj in "qk":
            t = hf_to_nntile_qkv_bias(t, n_heads=heads, head_dim=d)
        shape = (n_kv, rep, d) if proj == "q" and rep > 1 else (heads, d)
        return t.detach().reshape(shape).contiguous()
    if proj == "o":
        if rep > 1:
            return linear_to_gqa_output_weight(t, n_kv_heads=n_kv, n_rep=rep, head_size=d)
        return linear_to_output_weight(t, n_heads=n_heads, head_size=d)
    if proj in "qk":
        t = hf_to_nntile_qkv_weight(t, n_heads=heads, head_dim=d)
    if proj == "q" and rep > 1:
        return linear_to_gqa_q_weight(t, n_kv_heads=n_kv, n_rep=rep, head_size=d)
    return linear_to_qkv_weight(t, n_heads=heads, head_size=d)


def _attn_to_hf(proj: str, leaf: str, t: torch.Tensor, n_heads: int, n_kv: int) -> torch.Tensor:
    heads = n_heads if proj in "qo" else n_kv
    if leaf == "bias":
        if proj == "o":
            return t
        flat = t.detach().reshape(-1).contiguous()
        return nntile_to_hf_qkv_bias(flat, n_heads=heads, head_dim=t.shape[-1]) if proj in "qk" else flat
    grouped = t.dim() == 4
    if proj == "o":
        return gqa_output_to_linear_weight(t) if grouped else output_to_linear_weight(t)
    w = gqa_q_to_linear_weight(t) if grouped else qkv_to_linear_weight(t)
    return nntile_to_hf_qkv_weight(w, n_heads=heads, head_dim=t.shape[1]) if proj in "qk" else w


def _split_attn_key(key: str, hf: bool) -> tuple[str, str, str] | None:
    """``(prefix, proj, leaf)`` of an attention projection's key (HF's
    ``<prefix>.q_proj.weight`` or ours ``<prefix>.q_weight``), else None."""
    if hf:
        prefix, _, name = key.rpartition(".")
        prefix, _, proj = prefix.rpartition(".")
        if not proj.endswith("_proj"):
            return None
        proj, leaf = proj.removesuffix("_proj"), name
    else:
        prefix, _, name = key.rpartition(".")
        proj, _, leaf = name.partition("_")
    if proj not in ("q", "k", "v", "o") or leaf not in ("weight", "bias") or not prefix.endswith("self_attn"):
        return None
    return prefix, proj, leaf


def _map_attn(sd: StateDict, from_hf: bool, n_heads: int, n_kv: int) -> StateDict:
    """``sd`` with the attention projections renamed and converted one way (HF's ->
    ours with ``from_hf``, else back); other keys kept."""
    out: StateDict = {}
    for key, t in sd.items():
        parts = _split_attn_key(key, hf=from_hf)
        if parts is None:
            out[key] = t
            continue
        prefix, proj, leaf = parts
        if from_hf:
            out[f"{prefix}.{proj}_{leaf}"] = _attn_from_hf(proj, leaf, t, n_heads, n_kv)
        else:
            out[f"{prefix}.{proj}_proj.{leaf}"] = _attn_to_hf(proj, leaf, t, n_heads, n_kv)
    return out


def llama_state_dict_from_hf(sd: StateDict, n_heads: int, n_kv_heads: int | None = None) -> StateDict:
    """An HF ``LlamaForCausalLM`` state dict (or its ``LlamaModel``'s, without the
    ``model.`` prefix) under our names and layouts; keys other than the attention
    projections' are kept as they are.

    Args:
        sd: the HF state dict (gradients work too).
        n_heads: attention heads.
        n_kv_heads: key/value heads; None: ``n_heads``.
    """
    if not any(k.startswith("model.") for k in sd):
        sd = {(k if k.startswith("lm_head.") else "model." + k): v for k, v in sd.items()}
    return _map_attn(sd, True, n_heads, n_kv_heads or n_heads)


def llama_state_dict_to_hf(sd: StateDict, n_heads: int, n_kv_heads: int | None = None) -> StateDict:
    """The inverse of ``llama_state_dict_from_hf``: our ``LlamaCausal``'s state dict (or
    its gradients) under HF's names and layouts.

    Args:
        sd: our state dict.
        n_heads: attention heads.
        n_kv_heads: key/value heads; None: ``n_heads``.
    """
    return _map_attn(sd, False, n_heads, n_kv_heads or n_heads)


def load_hf_into_llama_causal(minimal: LlamaCausal, hf: nn.Module) -> None:
    """Copy the weights of an HF ``LlamaForCausalLM`` into ``minimal`` (on whatever
    device it is), strictly: every parameter of ours must be there. With tied
    embeddings HF's ``lm_head.weight`` is not used.

    Args:
        minimal: our model, of the HF model's config.
        hf: the HF model (read by ``state_dict()``).
    """
    minimal.load_hf_state_dict(hf.state_dict())


def export_llama_causal_to_hf_state_dict(minimal: LlamaCausal, *, config: Any = None) -> StateDict:
    """Our weights as ``LlamaForCausalLM.load_state_dict`` takes them: CPU copies under
    HF's names (``lm_head.weight`` is the embedding where ours are tied).

    Args:
        minimal: our model (any device).
        config: None, or the HF config the result is meant for; it must have our shapes.

    Raises:
        ValueError: ``config`` describes other shapes.
    """
    c = minimal.config
    if config is not None:
        other = llama_config_from_hf(config)
        diff = [f for f in _SHAPE_FIELDS if getattr(other, f) != getattr(c, f)]
        if diff:
            raise ValueError(f"Llama: the config differs from the model's in {', '.join(diff)}")
    sd = {k: v.detach().cpu().clone() for k, v in minimal.state_dict().items()}
    out = llama_state_dict_to_hf(sd, c.num_attention_heads, c.num_key_value_heads)
    if minimal.lm_head is None:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


__all__ = ["export_llama_causal_to_hf_state_dict", "llama_config_from_hf", "llama_state_dict_from_hf",
           "llama_state_dict_to_hf", "load_hf_into_llama_causal"]
