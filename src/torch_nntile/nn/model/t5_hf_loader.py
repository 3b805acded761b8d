"""Weights between HF's T5 (``T5ForConditionalGeneration`` / ``T5Model``) and ``nn.model.t5``.

The HF objects are only read by attribute (``transformers`` is never imported). Names
map one to one; only the attention weights change layout (HF's ``[heads * d_kv, d_model]``
linears against ``[d_model, d_kv, heads]`` and ``[d_kv, heads, d_model]``). HF keeps
aliases of ``shared.weight`` (both stacks' ``embed_tokens`` and, tied, ``lm_head``):
they are written back and, on loading, checked rather than loaded twice.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from torch_nntile.nn.linear import (
    linear_to_output_weight,
    linear_to_qkv_weight,
    output_to_linear_weight,
    qkv_to_linear_weight,
)
from torch_nntile.nn.model.common import cfg
from torch_nntile.nn.model.t5 import T5Config, T5ForConditionalGeneration, T5Model

# our sublayer -> (HF's layer index, HF's module name or None for the FF sublayer)
_ENCODER = {"layer_norm": (0, "layer_norm"), "self_attn": (0, "SelfAttention"), "ff": (1, None)}
_DECODER = {"layer_norm_0": (0, "layer_norm"), "self_attn": (0, "SelfAttention"), "layer_norm_1": (1, "layer_norm"),
            "cross_attn": (1, "EncDecAttention"), "ff": (2, None)}
_ALIASES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")


def _hf_name(name: str) -> tuple[str, str]:
    """HF's name of our parameter ``name`` and its layout: ``"plain"``, ``"qkv"`` or ``"out"``."""
    if name == "lm_head.weight":
        return name, "plain"
    name = name.removeprefix("model.")
    parts = name.split(".")
    if parts[0] == "shared" or parts[1] == "final_layer_norm":
        return name, "plain"
    stack, i, sub, tail = parts[0], parts[2], parts[3], parts[4:]
    layer, module = (_DECODER if stack == "decoder" else _ENCODER)[sub]
    prefix = f"{stack}.block.{i}.layer.{layer}."
    if module is None or module == "layer_norm":
        return prefix + ".".join(([module] if module else []) + tail), "plain"
    if tail[0] in ("q_weight", "k_weight", "v_weight", "o_weight"):
        return f"{prefix}{module}.{tail[0][0]}.weight", "out" if tail[0] == "o_weight" else "qkv"
    return prefix + ".".join([module, *tail]), "plain"


def _core(model: nn.Module) -> T5Model:
    return model.model if isinstance(model, T5ForConditionalGeneration) else model


def _tied(model: nn.Module) -> bool:
    return isinstance(model, T5ForConditionalGeneration) and model.lm_head is None


def t5_config_from_hf(hf: Any) -> T5Config:
    """Our ``T5Config`` from HF's (or from an HF model, through its ``config``).

    ``tie_word_embeddings`` becomes whether HF scales the decoder's output (HF 5 keeps
    that in ``scale_decoder_outputs`` and always ties), so the model built from the
    result computes what HF's does.

    Args:
        hf: an HF ``T5Config`` or an HF T5 model.
    """
    hf = getattr(hf, "config", hf)
    scale = getattr(hf, "scale_decoder_outputs", None)
    tie = bool(cfg(hf, "tie_word_embeddings", True) if scale is None else scale)
    n_layers = int(hf.num_layers)
    return T5Config(
        vocab_size=int(hf.vocab_size), d_model=int(hf.d_model), d_kv=int(hf.d_kv), d_ff=int(hf.d_ff),
        num_layers=n_layers, num_decoder_layers=int(cfg(hf, "num_decoder_layers", n_layers)),
        num_heads=int(hf.num_heads), relative_attention_num_buckets=int(cfg(hf, "relative_attention_num_buckets", 32)),
        relative_attention_max_distance=int(cfg(hf, "relative_attention_max_distance", 128)),
        layer_norm_epsilon=float(cfg(hf, "layer_norm_epsilon", 1e-6)), dropout_rate=float(cfg(hf, "dropout_rate", 0.0)),
        feed_forward_proj=str(cfg(hf, "feed_forward_proj", "relu")), tie_word_embeddings=tie,
        pad_token_id=cfg(hf, "pad_token_id", 0), eos_token_id=cfg(hf, "eos_token_id", 1),
        decoder_start_token_id=cfg(hf, "decoder_start_token_id", cfg(hf, "pad_token_id", 0)))


def disable_t5_relative_attention_bias(hf: Any) -> None:
    """Switch off the relative position bias of every self attention of HF's model (its
    tables stay); ``load_hf_into_t5`` then switches ours off too.

    Args:
        hf: an HF T5 model (anything with ``encoder.block`` / ``decoder.block``).
    """
    for stack in (hf.encoder, hf.decoder):
        for block in stack.block:
            block.layer[0].SelfAttention.has_relative_attention_bias = False


def load_hf_state_dict_into_t5(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Copy an HF T5 state dict into ``model`` (on any device).

    Args:
        model: our ``T5ForConditionalGeneration`` or ``T5Model``.
        state_dict: HF's names and layouts.

    Raises:
        ValueError: a missing, unexpected or mis-shaped tensor, or, for a tied model, an
            ``lm_head.weight`` other than ``shared.weight``.
    """
    used = set(_ALIASES)
    with torch.no_grad():
        for name, p in model.named_parameters():
            key, kind = _hf_name(name)
            if key not in state_dict:
                raise ValueError(f"T5 loader: the HF state dict lacks {key!r} (for our {name!r})")
            w = state_dict[key].detach()
            if kind == "qkv":
                w = linear_to_qkv_weight(w, n_heads=p.shape[2], head_size=p.shape[1])
            elif kind == "out":
                w = linear_to_output_weight(w, n_heads=p.shape[1], head_size=p.shape[0])
            if w.shape != p.shape:
                raise ValueError(f"T5 loader: {key!r} has shape {tuple(state_dict[key].shape)}, which does not fit "
                                 f"our {name!r} {tuple(p.shape)} (the configs differ)")
            p.copy_(w.to(p.dtype).to(p.device))
            used.add(key)
    if _tied(model) and "lm_head.weight" in state_dict:
        used.add("lm_head.weight")
        if not torch.equal(state_dict["lm_head.weight"].cpu(), state_dict["shared.weight"].cpu()):
            raise ValueError("T5 loader: the model ties lm_head to shared, but the HF lm_head.weight differs")
    extra = sorted(k for k in state_dict if k not in used and "EncDecAttention.relative_attention_bias" not in k)
    if extra:
        raise ValueError(f"T5 loader: HF tensors without a place in our model (the configs differ): {extra[:5]}")


def load_hf_into_t5(minimal: nn.Module, hf: Any) -> None:
    """Copy HF's T5 weights into ours and mirror which self attentions use their relative
    bias (see ``disable_t5_relative_attention_bias``).

    Args:
        minimal: our ``T5ForConditionalGeneration`` or ``T5Model``.
        hf: HF's ``T5ForConditionalGeneration`` or ``T5Model``.

    Raises:
        ValueError: as ``load_hf_state_dict_into_t5``.
    """
    load_hf_state_dict_into_t5(minimal, hf.state_dict())
    core = _core(minimal)
    for ours, theirs in ((core.encoder, hf.encoder), (core.decoder, hf.decoder)):
        for dst_block, src_block in zip(ours.block, theirs.block):
            dst, src = dst_block.self_attn, src_block.layer[0].SelfAttention
            if hasattr(dst, "relative_attention_bias"):
                dst.has_relative_attention_bias = bool(getattr(src, "has_relative_attention_bias", True))
    hf_config = getattr(hf, "config", None)
    if isinstance(minimal, T5ForConditionalGeneration) and hf_config is not None:
        hf_scale = getattr(hf_config, "scale_decoder_outputs", getattr(hf_config, "tie_word_embeddings", True))
        if bool(hf_scale) != minimal.scale_decoder_outputs:
            warnings.warn(f"T5 loader: HF {'scales' if hf_scale else 'does not scale'} the decoder's output by "
                          f"d_model**-0.5 and this model does {'' if minimal.scale_decoder_outputs else 'not '}"
                          "(build it from t5_config_from_hf to match)", stacklevel=2)


def export_t5_to_hf_state_dict(minimal: nn.Module, *, config: Any = None,
                               tensors: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Our weights as an HF T5 state dict (CPU tensors, HF's names and layouts, its
    aliases of ``shared.weight`` included), loadable by HF's ``load_state_dict``.

    Args:
        minimal: our ``T5ForConditionalGeneration`` or ``T5Model``.
        config: None, or an HF-style config whose sizes must match the model's.
        tensors: None: the parameters; else tensors keyed by our parameter names (their
            gradients, say) to convert instead.

    Raises:
        ValueError: ``config`` does not fit the model.
    """
    if config is not None:
        ours = _core(minimal).config
        for field in ("vocab_size", "d_model", "d_kv", "d_ff", "num_heads", "num_layers"):
            if cfg(config, field) != cfg(ours, field):
                raise ValueError(f"T5 export: config.{field}={cfg(config, field)!r} but the model has {cfg(ours, field)!r}")
    src = dict(minimal.named_parameters()) if tensors is None else tensors
    out: dict[str, torch.Tensor] = {}
    for name, t in src.items():
        key, kind = _hf_name(name)
        t = t.detach().cpu()
        out[key] = qkv_to_linear_weight(t) if kind == "qkv" else output_to_linear_weight(t) if kind == "out" \
            else t.clone()
    for alias in _ALIASES + (("lm_head.weight",) if _tied(minimal) else ()):
        out[alias] = out["shared.weight"].clone()
    return out


__all__ = ["disable_t5_relative_attention_bias", "export_t5_to_hf_state_dict", "load_hf_into_t5",
           "load_hf_state_dict_into_t5", "t5_config_from_hf"]
