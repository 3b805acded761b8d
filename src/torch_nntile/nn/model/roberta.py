"""RoBERTa: BERT (``bert``'s classes, reused) with pad-aware positions and its own head
naming, computing what HF's ``RobertaForMaskedLM`` computes (eval semantics, no dropout).

What differs: positions count only real tokens and start after the padding index,
``cumsum(token != pad) * (token != pad) + pad`` (padding sits at position ``pad``, whose
row gets no gradient, as HF's ``padding_idx``); the head always uses exact GELU, as HF's
``RobertaLMHead``; and, as in the reference, ``position_ids`` comes before
``token_type_ids``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from torch_nntile.nn.model.bert import BertConfig, BertEmbeddings, BertMlm, BertMlmHead, BertModel


@dataclass
class RobertaConfig(BertConfig):
    """``BertConfig`` with RoBERTa's defaults (HF's ``RobertaConfig`` or any object with
    these attributes builds the same model).

    Args:
        vocab_size: tokens in the vocabulary.
        hidden_size: width of the hidden states.
        intermediate_size: width of the feed-forward layer.
        num_hidden_layers: encoder layers.
        num_attention_heads: heads per attention; must divide ``hidden_size``.
        max_position_embeddings: rows of the position table; sequences may be
            ``max_position_embeddings - pad_token_id - 1`` tokens long.
        type_vocab_size: rows of the token-type table.
        layer_norm_eps: epsilon of every LayerNorm.
        hidden_act: HF's activation name for the feed-forward layers.
        name: the family, for logs.
        pad_token_id: the padding token and padding position.
        tie_word_embeddings: the MLM decoder reuses the word embedding (HF's default).
        initializer_range: std of the normal initial weights.
    """

    vocab_size: int = 50265
    max_position_embeddings: int = 514
    type_vocab_size: int = 1
    layer_norm_eps: float = 1e-5
    name: str = "roberta"
    pad_token_id: int | None = 1

    def to_bert_config(self) -> BertConfig:
        """The same sizes as a ``BertConfig`` (what the reference builds BERT's layers from)."""
        return BertConfig(**{**{f.name: getattr(self, f.name) for f in fields(BertConfig)}, "name": "bert"})


def roberta_position_ids(input_ids: torch.Tensor, pad: int) -> torch.Tensor:
    """HF's ``create_position_ids_from_input_ids``: real tokens numbered from ``pad + 1``
    in order, padding at ``pad``; computed where ``input_ids`` are (recorded on nntile).

    Args:
        input_ids: tokens ``[batch, seq]``.
        pad: the padding token id (also the padding position).
    """
    real = (input_ids != pad).long()
    return torch.cumsum(real, dim=1) * real + pad


class RobertaEmbeddings(BertEmbeddings):
    """BERT's embeddings with pad-aware default positions.

    Args:
        config: a RoBERTa-like config.
    """

    config_class = RobertaConfig

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.position_padding_idx = self.pad_token_id

    def _positions(self, input_ids: torch.Tensor) -> torch.Tensor:
        pad, seq, limit = self.pad_token_id, input_ids.shape[-1], self.position_embeddings.num_embeddings
        last = seq - 1 if pad is None else seq + pad
        if last >= limit:
            raise ValueError(f"sequence of {seq} tokens needs position {last}, beyond max_position_embeddings {limit}")
        return super()._positions(input_ids) if pad is None else roberta_position_ids(input_ids, pad)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Embed ``input_ids`` ``[batch, seq]`` into ``[batch, seq, hidden]``.

        Args:
            input_ids: tokens.
            position_ids: positions; None: ``roberta_position_ids`` (no padding token:
                ``0 .. seq-1``).
            token_type_ids: segments; None: all zero.
        """
        return self.embed(input_ids, token_type_ids, position_ids)


class _RobertaCall(nn.Module):
    """The call of ``RobertaModel`` and ``RobertaMlm``: BERT's, in the reference's order."""

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None, *,
                is_causal: bool = False, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states ``[batch, seq, hidden]`` (of an MLM: logits ``[batch, seq, vocab]``).

        Args:
            input_ids: tokens ``[batch, seq]``.
            position_ids: positions; None: pad-aware, as HF.
            token_type_ids: segments; None: all zero.
            attn_mask: bool (True: attend) or additive, broadcasting to ``[batch, heads, seq, seq]``.
            is_causal: also hide later keys.
            attention_mask: HF's padding mask ``[batch, seq]`` (1: token, 0: padding).
        """
        return super().forward(input_ids, token_type_ids, position_ids, attn_mask, is_causal=is_causal,
                               attention_mask=attention_mask)  # BERT's call, after this in the MRO


class RobertaModel(_RobertaCall, BertModel):
    """Embeddings and BERT's encoder: HF's ``RobertaModel`` without the pooler.

    Args:
        config: a RoBERTa-like config.
    """

    config_class = RobertaConfig
    embeddings_class = RobertaEmbeddings


class RobertaMlmHead(BertMlmHead):
    """HF's ``RobertaLMHead``: BERT's head with exact GELU, whatever ``hidden_act``, and
    HF's names (its ``lm_head.bias`` is our decoder's bias).

    Args:
        config: a RoBERTa-like config.
    """

    config_class = RobertaConfig
    head_act = "gelu"
    names = ("act", "layer_norm")


class RobertaMlm(_RobertaCall, BertMlm):
    """RoBERTa and its masked-LM head (decoder tied to the word embedding as configured).

    Args:
        config: a RoBERTa-like config.
    """

    model_class = RobertaModel
    head_class = RobertaMlmHead
    names = ("roberta", "lm_head")


__all__ = ["RobertaConfig", "RobertaEmbeddings", "RobertaMlm", "RobertaMlmHead", "RobertaModel"]
