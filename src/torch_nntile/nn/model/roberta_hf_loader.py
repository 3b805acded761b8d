"""Weights between HF's ``RobertaForMaskedLM`` and our ``RobertaMlm``, both ways.

Every parameter has HF's name; the attention projections change layout, and HF's
``lm_head.bias`` is our decoder's bias (HF also keeps it as ``lm_head.decoder.bias``,
one tied tensor). The conversion itself is BERT's (``bert_hf_loader``); nothing here
imports ``transformers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from torch_nntile.nn.model.bert_hf_loader import export_mlm, load_mlm, mlm_to_hf
from torch_nntile.nn.model.roberta import RobertaConfig, RobertaMlm

ROBERTA_BIAS_ALIAS = "lm_head.bias"
ROBERTA_NAMES = {"base": "roberta", "renames": {}, "bias_alias": ROBERTA_BIAS_ALIAS, "decoder": "lm_head.decoder"}


def roberta_config_from_hf(hf: Any) -> RobertaConfig:
    """Our ``RobertaConfig`` from HF's (or from an HF model, by its ``config``).

    Args:
        hf: an HF ``RobertaConfig``, an HF model, or any object with those attributes.

    Raises:
        ValueError: a config our model cannot compute (``validate_config``).
    """
    return RobertaConfig.from_config(getattr(hf, "config", hf))


def load_hf_into_roberta_mlm(minimal: RobertaMlm, hf: Any) -> None:
    """Copy HF's ``RobertaForMaskedLM`` weights into ``minimal``, tying its decoder as
    HF's is (a state dict without ``lm_head.decoder.weight`` counts as tied).

    Args:
        minimal: our model, built from a matching config (on any device).
        hf: the HF model or its state dict.

    Raises:
        ValueError: a missing weight or a shape that does not match.
    """
    load_mlm(minimal, hf, tie=minimal.tie_weights, **ROBERTA_NAMES)


def roberta_mlm_to_hf(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our ``RobertaMlm``'s tensors by name (parameters or gradients) under HF's names and layouts.

    Args:
        tensors: name -> tensor, as ``named_parameters()`` names them.
    """
    return mlm_to_hf(tensors, **ROBERTA_NAMES)


def export_roberta_mlm_to_hf_state_dict(minimal: RobertaMlm, *, config: Any = None) -> dict[str, torch.Tensor]:
    """``minimal``'s weights as a ``RobertaForMaskedLM`` state dict (see ``export_mlm``).

    Args:
        minimal: our model (on any device).
        config: HF's config the state dict is meant for: its sizes are checked.
    """
    return export_mlm(minimal, config, ROBERTA_NAMES)


__all__ = ["export_roberta_mlm_to_hf_state_dict", "load_hf_into_roberta_mlm", "roberta_config_from_hf",
           "roberta_mlm_to_hf"]
