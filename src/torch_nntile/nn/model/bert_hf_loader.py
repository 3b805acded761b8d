"""Weights between HF's ``BertForMaskedLM`` and our ``BertMlm``, both ways.

Our parameter names are HF's except in the MLM head (``cls.dense`` is HF's
``cls.predictions.transform.dense``...), and only the attention projections change
layout (``nn.linear``'s converters). HF keeps the decoder's bias twice (``decoder.bias``
and ``cls.predictions.bias``, one tied tensor); we keep it once. Nothing here imports
``transformers``: an HF model is read through its ``state_dict()``.

The family-independent part (``load_mlm``, ``mlm_to_hf``, ``export_mlm``) also serves
RoBERTa; a family is named by the keywords they take (``BERT_NAMES``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from torch_nntile.nn.linear import (
    linear_to_output_weight,
    linear_to_qkv_bias,
    linear_to_qkv_weight,
    output_to_linear_weight,
    qkv_to_linear_bias,
    qkv_to_linear_weight,
)
from torch_nntile.nn.model.bert import BertConfig, BertMlm
from torch_nntile.nn.model.common import cfg

# Our MLM-head prefixes -> HF's, and HF's second name of the decoder bias.
BERT_HEAD_RENAMES = {"cls.dense.": "cls.predictions.transform.dense.",
                     "cls.LayerNorm.": "cls.predictions.transform.LayerNorm.",
                     "cls.decoder.": "cls.predictions.decoder."}
BERT_BIAS_ALIAS = "cls.predictions.bias"
BERT_NAMES = {"base": "bert", "renames": BERT_HEAD_RENAMES, "bias_alias": BERT_BIAS_ALIAS, "decoder": "cls.decoder"}

_QKV = tuple(f"attention.self.{p}." for p in ("query", "key", "value"))
_OUT_WEIGHT = "attention.output.dense.weight"


def _to_hf_layout(name: str, t: torch.Tensor) -> torch.Tensor:
    """One of our tensors (a parameter or its gradient) in HF's layout."""
    if any(q in name for q in _QKV):
        return qkv_to_linear_weight(t) if name.endswith("weight") else qkv_to_linear_bias(t)
    return output_to_linear_weight(t) if name.endswith(_OUT_WEIGHT) else t.detach()


def _from_hf_layout(name: str, t: torch.Tensor, n_heads: int, head_size: int) -> torch.Tensor:
    """An HF tensor in the layout of our parameter ``name``."""
    if any(q in name for q in _QKV):
        convert = linear_to_qkv_weight if name.endswith("weight") else linear_to_qkv_bias
        return convert(t, n_heads=n_heads, head_size=head_size)
    if name.endswith(_OUT_WEIGHT):
        return linear_to_output_weight(t, n_heads=n_heads, head_size=head_size)
    return t.detach()


def _rename(name: str, renames: Mapping[str, str]) -> str:
    """``name`` with its first matching prefix of ``renames`` replaced."""
    for ours, theirs in renames.items():
        if name.startswith(ours):
            return theirs + name[len(ours):]
    return name


def mlm_to_hf(tensors: Mapping[str, torch.Tensor], *, base: str, renames: Mapping[str, str],
              bias_alias: str, decoder: str) -> dict[str, torch.Tensor]:
    """Our MLM's tensors by name (parameters or gradients) under HF's names and layouts,
    on the CPU: every key of HF's ``state_dict()``.

    Args:
        tensors: ours, as ``named_parameters()`` gives them (a tied decoder weight
            appears only as the word embedding).
        base: the encoder's prefix, ``"bert"`` or ``"roberta"``.
        renames: our head prefixes -> HF's.
        bias_alias: HF's second name of the decoder bias.
        decoder: our decoder's prefix (``"cls.decoder"``).
    """
    out = {_rename(n, renames): _to_hf_layout(n, t).cpu().clone() for n, t in tensors.items()}
    word = out[f"{base}.embeddings.word_embeddings.weight"]
    out.setdefault(_rename(f"{decoder}.weight", renames), word)  # tied: one tensor, two names, as HF
    out[bias_alias] = out[_rename(f"{decoder}.bias", renames)]
    return out


def _is_tied(sd: Mapping[str, torch.Tensor], word_key: str, decoder_key: str) -> bool:
    """HF ties by sharing one tensor, and a saved checkpoint drops the tied copy."""
    if decoder_key not in sd:
        return True
    a, b = sd[decoder_key], sd[word_key]
    return a is b or (a.shape == b.shape and a.device == b.device and a.data_ptr() == b.data_ptr())


def load_mlm(model: nn.Module, hf: Any, *, base: str, renames: Mapping[str, str], bias_alias: str,
             tie: Callable[[bool], None], decoder: str) -> None:
    """Copy an HF MLM's weights into ours, tying our decoder as HF's is.

    Args:
        model: ours (on any device).
        hf: the HF model or its state dict.
        base: the encoder's prefix, ``"bert"`` or ``"roberta"``.
        renames: our head prefixes -> HF's.
        bias_alias: HF's second name of the decoder bias (used when ``decoder.bias`` is
            missing, as in saved checkpoints).
        tie: ours' ``tie_weights``.
        decoder: our decoder's prefix (``"cls.decoder"``).

    Raises:
        ValueError: a weight missing from the HF state dict or of another shape.
    """
    sd = hf.state_dict() if isinstance(hf, nn.Module) else hf
    word_key = f"{base}.embeddings.word_embeddings.weight"
    tie(_is_tied(sd, word_key, _rename(f"{decoder}.weight", renames)))
    n_heads = int(cfg(model.config, "num_attention_heads"))
    head_size = int(cfg(model.config, "hidden_size")) // n_heads
    missing = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            key = _rename(name, renames)
            if key not in sd and name == f"{decoder}.bias":
                key = bias_alias
            if key not in sd:
                missing.append(key)
                continue
            value = _from_hf_layout(name, sd[key], n_heads, head_size)
            if value.shape != p.shape:
                raise ValueError(f"HF weight {key} has shape {tuple(value.shape)} in our layout, "
                                 f"expected {tuple(p.shape)} for {name}: do the configs match?")
            p.copy_(value.to(dtype=p.dtype, device=p.device))
    if missing:
        raise ValueError(f"the HF state dict lacks {len(missing)} weights, e.g. {', '.join(missing[:3])}")


def bert_config_from_hf(hf: Any) -> BertConfig:
    """Our ``BertConfig`` from HF's (or from an HF model, by its ``config``).

    Args:
        hf: an HF ``BertConfig``, an HF model, or any object with those attributes.

    Raises:
        ValueError: a config our model cannot compute (``validate_config``).
    """
    return BertConfig.from_config(getattr(hf, "config", hf))


def _check_config(minimal: nn.Module, config: Any) -> None:
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        ours, theirs = getattr(minimal.config, name, None), getattr(config, name, None)
        if None not in (ours, theirs) and ours != theirs:
            raise ValueError(f"config {name}={theirs} does not match the model's {ours}")


def export_mlm(minimal: nn.Module, config: Any, names: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """``minimal``'s weights as HF's MLM state dict (CPU copies; tied weights share one
    tensor, as HF's ``state_dict()``), for its ``load_state_dict``.

    Args:
        minimal: our MLM (on any device).
        config: HF's config the state dict is meant for, whose sizes are checked; or None.
        names: the family's keywords of ``mlm_to_hf`` (``BERT_NAMES``).

    Raises:
        ValueError: ``config``'s sizes differ from the model's.
    """
    if config is not None:
        _check_config(minimal, config)
    return mlm_to_hf(dict(minimal.named_parameters()), **names)


def load_hf_into_bert_mlm(minimal: BertMlm, hf: Any) -> None:
    """Copy HF's ``BertForMaskedLM`` weights into ``minimal``, tying its decoder as HF's
    is (a state dict without ``cls.predictions.decoder.weight`` counts as tied).

    Args:
        minimal: our model, built from a matching config (on any device).
        hf: the HF model or its state dict.

    Raises:
        ValueError: a missing weight or a shape that does not match.
    """
    load_mlm(minimal, hf, tie=minimal.tie_weights, **BERT_NAMES)


def bert_mlm_to_hf(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our ``BertMlm``'s tensors by name (parameters or gradients) under HF's names and layouts.

    Args:
        tensors: name -> tensor, as ``named_parameters()`` names them.
    """
    return mlm_to_hf(tensors, **BERT_NAMES)


def export_bert_mlm_to_hf_state_dict(minimal: BertMlm, *, config: Any = None) -> dict[str, torch.Tensor]:
    """``minimal``'s weights as a ``BertForMaskedLM`` state dict (see ``export_mlm``).

    Args:
        minimal: our model (on any device).
        config: HF's config the state dict is meant for: its sizes are checked.
    """
    return export_mlm(minimal, config, BERT_NAMES)


__all__ = ["bert_config_from_hf", "bert_mlm_to_hf", "export_bert_mlm_to_hf_state_dict", "load_hf_into_bert_mlm"]
