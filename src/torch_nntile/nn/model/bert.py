"""BERT, computing what HF's ``BertForMaskedLM`` does (eval, no dropout); RoBERTa reuses it.

Names and signatures follow the published torch_nntile, so its scripts run unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from torch_nntile.nn.attention import attention, nntile_model_transpose
from torch_nntile.nn.linear import NntileAttentionOutput, NntileLinear, NntileQKVProjection
from torch_nntile.nn.model.common import cfg, init_normal_, merge_heads, project_heads
from torch_nntile.nn.module import GELU, Embedding, LayerNorm, ReLU, SiLU

# HF's ACT2FN names we compute exactly: GELU's ``approximate`` (tanh: one formula, many names) or a module.
_ACTIVATIONS: dict[str, Any] = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelutanh": "tanh",
                                "gelu_fast": "tanh", "relu": ReLU, "silu": SiLU, "swish": SiLU}


@dataclass
class BertConfig:
    """BERT's sizes under HF's names, so that HF's config (or any such object) builds the same model.

    Args:
        vocab_size: tokens in the vocabulary.
        hidden_size: width of the hidden states.
        intermediate_size: width of the feed-forward layer.
        num_hidden_layers: encoder layers.
        num_attention_heads: heads per attention; must divide ``hidden_size``.
        max_position_embeddings: rows of the position table.
        type_vocab_size: rows of the token-type (segment) table.
        layer_norm_eps: epsilon of every LayerNorm.
        hidden_act: HF's activation name for the feed-forward and the MLM transform.
        name: the family, for logs.
        pad_token_id: the token whose embedding row gets no gradient; None: none.
        tie_word_embeddings: the MLM decoder reuses the word embedding (HF's default).
        initializer_range: std of the normal initial weights.
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    name: str = "bert"
    pad_token_id: int | None = 0
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_attention_heads

    def validate(self) -> None:
        """Raise ValueError where the sizes or the activation cannot build a model."""
        validate_config(self)

    @classmethod
    def from_config(cls, config: Any) -> BertConfig:
        """Validated, from any config by HF's names (defaults where missing); ours as is.

        Args:
            config: read by attribute name.
        """
        validate_config(config)
        if isinstance(config, cls):
            return config
        values = {f.name: cfg(config, f.name, f.default) for f in fields(cls)}
        if hasattr(config, "pad_token_id") and config.pad_token_id is None:  # explicitly no padding row
            values["pad_token_id"] = None
        return cls(**values)


def validate_config(config: Any) -> None:
    """Check a BERT-like config, so a bad one fails with its reason, not a shape error.

    Args:
        config: read by attribute name.

    Raises:
        ValueError: bad sizes, an activation we lack, or relative position embeddings.
    """
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "max_position_embeddings"):
        value = cfg(config, name)
        if value is not None and int(value) <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    hidden, heads = cfg(config, "hidden_size", 768), cfg(config, "num_attention_heads", 12)
    if hidden % heads:
        raise ValueError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    act = cfg(config, "hidden_act", "gelu")
    if act not in _ACTIVATIONS:
        raise ValueError(f"unsupported hidden_act {act!r}; supported: {', '.join(sorted(_ACTIVATIONS))}")
    kind = cfg(config, "position_embedding_type", "absolute")
    if kind != "absolute":
        raise ValueError(f"position_embedding_type {kind!r} is not supported (only 'absolute')")


def _activation(name: str) -> nn.Module:
    kind = _ACTIVATIONS[name]
    return GELU(approximate=kind) if isinstance(kind, str) else kind()


def _no_grad_where(x: torch.Tensor, ids: torch.Tensor, pad: int | None) -> torch.Tensor:
    """``x``, but rows whose id is ``pad`` pass no gradient back (HF's ``padding_idx``)."""
    if pad is None or not (torch.is_grad_enabled() and x.requires_grad):
        return x
    return torch.where((ids == pad).unsqueeze(-1), x.detach(), x)


def _ids_like(ids: torch.Tensor, values: torch.Tensor, expand: bool = True) -> torch.Tensor:
    """``values``, built on the CPU, on ``ids``' device (and broadcast to its shape)."""
    values = values.expand(ids.shape).contiguous() if expand else values
    return values if ids.device.type == "cpu" else values.to(ids.device)


def hf_padding_mask(attention_mask: torch.Tensor | None, attn_mask: torch.Tensor | None, device: torch.device, *,
                    dtype: torch.dtype = torch.float32, is_causal: bool = False) -> torch.Tensor | None:
    """``attn_mask``, or HF's eager mask: additive (``finfo.min`` hides), so that a query
    seeing no key averages all values as in HF, where a bool mask would give NaN.

    Args:
        attention_mask: HF's padding mask ``[batch, seq]`` (0: padding), or None.
        attn_mask: the reference's mask argument, or None.
        device: where the hidden states are.
        dtype: the hidden states' dtype.
        is_causal: fold the causal mask into the padding mask, as HF does.

    Raises:
        ValueError: both masks given, or a padding mask that is not 2-D.
    """
    if attention_mask is not None and attn_mask is not None:
        raise ValueError("pass either attention_mask (HF padding, [batch, seq]) or attn_mask, not both")
    if attention_mask is not None:
        if attention_mask.dim() != 2:
            raise ValueError(f"attention_mask must be [batch, seq] of 1/0, got shape {tuple(attention_mask.shape)}")
        hide = (attention_mask == 0)[:, None, None, :]
        if is_causal:
            seq = attention_mask.shape[1]
            hide = hide | _ids_like(hide, torch.ones(seq, seq, dtype=torch.bool).triu(1), expand=False)
        attn_mask = hide.to(dtype) * torch.finfo(dtype).min
    return attn_mask if attn_mask is None or attn_mask.device == device else attn_mask.to(device)


def _init_weights(model: nn.Module, std: float) -> None:
    """HF's: dense and embedding weights normal(std), biases zero, padding rows zero."""
    for m in model.modules():
        if isinstance(m, (NntileLinear, NntileQKVProjection, NntileAttentionOutput, Embedding)):
            init_normal_(m, std)
    for m in model.modules():
        if isinstance(m, BertEmbeddings):
            with torch.no_grad():
                for table, row in ((m.word_embeddings, m.pad_token_id), (m.position_embeddings, m.position_padding_idx)):
                    if row is not None and 0 <= row < table.num_embeddings:
                        table.weight[row].zero_()


class BertEmbeddings(nn.Module):
    """Word + position + token-type embeddings, then LayerNorm.

    Args:
        config: a BERT-like config.
    """

    config_class: type[BertConfig] = BertConfig

    def __init__(self, config: Any) -> None:
        super().__init__()
        c = self.config_class.from_config(config)
        self.word_embeddings = Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.pad_token_id = c.pad_token_id
        self.position_padding_idx: int | None = None  # RoBERTa's positions have one

    def clear_sequence_caches(self) -> None:
        """Nothing to clear (ids are built per call); kept for the reference's scripts."""

    def _positions(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq, limit = input_ids.shape[-1], self.position_embeddings.num_embeddings
        if seq > limit:
            raise ValueError(f"sequence of {seq} tokens is longer than max_position_embeddings {limit}")
        return _ids_like(input_ids, torch.arange(seq))

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Embed ``input_ids`` ``[batch, seq]`` into ``[batch, seq, hidden]``.

        Args:
            input_ids: tokens.
            token_type_ids: segments; None: all zero.
            position_ids: positions; None: ``0 .. seq-1`` (RoBERTa: pad-aware).
        """
        if position_ids is None:
            position_ids = self._positions(input_ids)
        if token_type_ids is None:
            token_type_ids = _ids_like(input_ids, torch.zeros(1, dtype=torch.long))
        words = _no_grad_where(self.word_embeddings(input_ids), input_ids, self.pad_token_id)
        positions = _no_grad_where(self.position_embeddings(position_ids), position_ids, self.position_padding_idx)
        return self.LayerNorm(words + self.token_type_embeddings(token_type_ids) + positions)

    embed = forward  # this argument order for both families (RoBERTa's forward swaps the last two)


class _Block(nn.Module):
    """The call of the blocks taking a mask (self-attention and up); each defines ``_run``."""

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, *, is_causal: bool = False) -> torch.Tensor:
        """``[batch, seq, hidden]`` (``BertSelfAttention``: ``[n_heads, batch, seq, head_size]``).

        Args:
            x: hidden states ``[batch, seq, hidden]``.
            attn_mask: as for ``BertSelfAttention.heads``.
            is_causal: also hide later keys.
        """
        return self._run(x, attn_mask, is_causal)


class BertSelfAttention(_Block):
    """Multi-head self-attention: q, k, v and the attention (``BertSelfOutput`` projects).

    Args:
        config: a BERT-like config.
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        c = BertConfig.from_config(config)
        self.n_heads, self.head_dim, self.hidden = c.num_attention_heads, c.head_dim, c.hidden_size
        self.query, self.key, self.value = (NntileQKVProjection(self.hidden, self.head_dim, self.n_heads, bias=True)
                                            for _ in range(3))

    def heads(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, *, is_causal: bool = False) -> torch.Tensor:
        """The attention in the projection layout ``[batch, seq, head_size, n_heads]``.

        Args:
            x: hidden states ``[batch, seq, hidden]``.
            attn_mask: bool (True: attend) or additive, to ``[batch, n_heads, seq, seq]``.
            is_causal: also hide later keys.
        """
        q, k, v = (project_heads(x, p.weight, p.bias) for p in (self.query, self.key, self.value))
        return attention(q, k, v, attn_mask, is_causal=is_causal)

    def _run(self, x: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
        return nntile_model_transpose(self.heads(x, attn_mask, is_causal=is_causal), 1)  # the reference's layout


class BertOutput(nn.Module):
    """The feed-forward's projection back, residual, LayerNorm (how both blocks end).

    Args:
        config: a BERT-like config.
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        c = BertConfig.from_config(config)
        self.dense = self._dense(c)
        self.LayerNorm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    @staticmethod
    def _dense(c: BertConfig) -> nn.Module:
        return NntileLinear(c.intermediate_size, c.hidden_size)

    def forward(self, hidden: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        """``LayerNorm(dense(hidden) + input_tensor)``.

        Args:
            hidden: the block's activations (attention: ``BertSelfAttention``'s output).
            input_tensor: the block's input ``[batch, seq, hidden]``.
        """
        return self.LayerNorm(self.dense(hidden) + input_tensor)


class BertSelfOutput(BertOutput):
    """``BertOutput`` for the attention: projection of the heads, residual, LayerNorm.

    Args:
        config: a BERT-like config.
    """

    @staticmethod
    def _dense(c: BertConfig) -> nn.Module:
        return NntileAttentionOutput(c.head_dim, c.num_attention_heads, c.hidden_size, bias=True)

    def from_heads(self, heads: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        """``forward`` from ``BertSelfAttention.heads``: one product, no transpose.

        Args:
            heads: ``[batch, seq, head_size, n_heads]``.
            input_tensor: the attention's input ``[batch, seq, hidden]``.
        """
        return self.LayerNorm(merge_heads(heads, self.dense.weight, self.dense.bias) + input_tensor)


class BertIntermediate(nn.Module):
    """The feed-forward's expansion and activation.

    Args:
        config: a BERT-like config.
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        c = BertConfig.from_config(config)
        self.dense = NntileLinear(c.hidden_size, c.intermediate_size)
        self.intermediate_act_fn = _activation(c.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``act(dense(x))``.

        Args:
            x: hidden states ``[batch, seq, hidden]``.
        """
        return self.intermediate_act_fn(self.dense(x))


class BertAttention(_Block):
    """Self-attention with its output block.

    Args:
        config: a BERT-like config.
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def _run(self, x: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
        return self.output.from_heads(self.self.heads(x, attn_mask, is_causal=is_causal), x)


class BertLayer(_Block):
    """One post-LN encoder layer: attention block, then feed-forward block.

    Args:
        config: a BERT-like config.
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def _run(self, x: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
        x = self.attention(x, attn_mask, is_causal=is_causal)
        return self.output(self.intermediate(x), x)


class BertEncoder(_Block):
    """``num_hidden_layers`` layers in sequence.

    Args:
        config: a BERT-like config.
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(BertConfig.from_config(config).num_hidden_layers))

    def _run(self, x: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, attn_mask, is_causal=is_causal)
        return x


class _BertCall(nn.Module):
    """The call of ``BertModel`` and ``BertMlm``; each defines ``_run``."""

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None, *,
                is_causal: bool = False, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states ``[batch, seq, hidden]`` (of an MLM: logits ``[batch, seq, vocab]``).

        Args:
            input_ids: tokens ``[batch, seq]``.
            token_type_ids: segments; None: all zero.
            position_ids: positions; None: ``0 .. seq-1`` (RoBERTa: pad-aware, as HF).
            attn_mask: bool (True: attend) or additive, broadcasting to ``[batch, heads, seq, seq]``.
            is_causal: also hide later keys.
            attention_mask: HF's padding mask ``[batch, seq]`` (1: token, 0: padding).
        """
        return self._run(input_ids, token_type_ids=token_type_ids, position_ids=position_ids, attn_mask=attn_mask,
                         is_causal=is_causal, attention_mask=attention_mask)


class BertModel(_BertCall):
    """Embeddings and encoder: HF's ``BertModel`` without the pooler.

    Args:
        config: a BERT-like config.
    """

    config_class: type[BertConfig] = BertConfig
    embeddings_class: type[BertEmbeddings] = BertEmbeddings

    def __init__(self, config: Any) -> None:
        super().__init__()
        c = self.config_class.from_config(config)
        self.config = config
        self.embeddings = self.embeddings_class(c)
        self.encoder = BertEncoder(c)
        _init_weights(self, c.initializer_range)

    def _run(self, input_ids: torch.Tensor, *, token_type_ids: torch.Tensor | None, position_ids: torch.Tensor | None,
             attn_mask: torch.Tensor | None, is_causal: bool, attention_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.embeddings.embed(input_ids, token_type_ids, position_ids)
        mask = hf_padding_mask(attention_mask, attn_mask, x.device, dtype=x.dtype, is_causal=is_causal)
        return self.encoder(x, mask, is_causal=is_causal and attention_mask is None)


class BertMlmHead(nn.Module):
    """HF's prediction head: dense, activation, LayerNorm, vocabulary decoder.

    Args:
        config: a BERT-like config.
    """

    config_class: type[BertConfig] = BertConfig
    head_act: str | None = None  # the activation's HF name; None: the config's hidden_act
    names = ("transform_act_fn", "LayerNorm")  # HF's names of the activation and the norm

    def __init__(self, config: Any) -> None:
        super().__init__()
        c = self.config_class.from_config(config)
        self.dense = NntileLinear(c.hidden_size, c.hidden_size)
        setattr(self, self.names[0], _activation(self.head_act or c.hidden_act))
        setattr(self, self.names[1], LayerNorm(c.hidden_size, eps=c.layer_norm_eps))
        self.decoder = NntileLinear(c.hidden_size, c.vocab_size, bias=True)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, seq, vocab]``.

        Args:
            hidden: the encoder's output ``[batch, seq, hidden]``.
        """
        act, norm = (getattr(self, name) for name in self.names)
        return self.decoder(norm(act(self.dense(hidden))))


class BertMlm(_BertCall):
    """BERT and its masked-LM head (decoder tied to the word embedding as configured).

    Args:
        config: a BERT-like config.
    """

    model_class: type[BertModel] = BertModel
    head_class: type[BertMlmHead] = BertMlmHead
    names = ("bert", "cls")  # HF's names of the encoder and the head

    def __init__(self, config: Any) -> None:
        super().__init__()
        c = self.model_class.config_class.from_config(config)
        self.config = config
        setattr(self, self.names[0], self.model_class(config))
        setattr(self, self.names[1], self.head_class(config))
        _init_weights(self._parts()[1], c.initializer_range)
        self.tie_weights(bool(c.tie_word_embeddings))

    def _parts(self) -> tuple[BertModel, BertMlmHead]:
        return getattr(self, self.names[0]), getattr(self, self.names[1])

    @property
    def tied(self) -> bool:
        """Whether the decoder and the word embedding share one weight."""
        model, head = self._parts()
        return head.decoder.weight is model.embeddings.word_embeddings.weight

    def tie_weights(self, tied: bool = True) -> None:
        """Share the decoder's weight with the word embedding, or give the decoder a copy.

        Args:
            tied: share (else untie).
        """
        model, head = self._parts()
        if tied:
            head.decoder.weight = model.embeddings.word_embeddings.weight
        elif self.tied:
            head.decoder.weight = nn.Parameter(head.decoder.weight.detach().clone())

    def _run(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        model, head = self._parts()
        return head(model(input_ids, **kwargs))  # by keyword: RoBERTa orders them otherwise


__all__ = ["BertAttention", "BertConfig", "BertEmbeddings", "BertEncoder", "BertIntermediate", "BertLayer", "BertMlm",
           "BertMlmHead", "BertModel", "BertOutput", "BertSelfAttention", "BertSelfOutput"]
