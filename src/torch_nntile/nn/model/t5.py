"""T5 (encoder-decoder) with the module and parameter names of the published torch_nntile.

HF's math in eval mode: RMS-style layer norms (no mean, no bias) before each sublayer,
unscaled attention scores plus a bucketed relative position bias that the first block of
each stack owns and all its blocks share, cross attention in the decoder, a ReLU or
gated feed-forward chosen by ``feed_forward_proj``, and the decoder's output scaled by
``d_model ** -0.5`` before a tied LM head. Attention weights use the projection layout
of ``common.project_heads``; the bias and any masks reach ``nn.attention.attention`` as
one additive float mask.

Masks (``attn_mask`` and friends) broadcast to ``[batch, heads, seq_q, seq_k]`` and are
bool or integer (nonzero: attend) or additive float; HF's padding mask ``m`` ``[batch,
seq]`` is ``m[:, None, None, :]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torch_nntile.nn import functional as F
from torch_nntile.nn.attention import attention
from torch_nntile.nn.model.common import cfg, merge_heads, project_heads
from torch_nntile.nn.module import GELU, Embedding, Linear, ReLU, RMSNorm, SiLU

_ACTIVATIONS = {"relu": ReLU, "gelu": GELU, "gelu_new": lambda: GELU(approximate="tanh"),
                "gelu_pytorch_tanh": lambda: GELU(approximate="tanh"), "silu": SiLU, "swish": SiLU}


@dataclass
class T5Config:
    """The shape of a T5 model, with HF's field names (any object with these attributes,
    HF's ``T5Config`` included, builds the model too).

    Attributes:
        feed_forward_proj: ``"relu"``, ``"gelu"``, ``"silu"``... or ``"gated-<act>"``
            (``"gated-gelu"`` is GELU's tanh approximation, as in HF).
        is_gated_act: None: derived from ``feed_forward_proj``; a value that contradicts
            it fails ``validate``.
        tie_word_embeddings: the LM head reuses ``shared`` (no ``lm_head``) and, unless
            ``scale_decoder_outputs`` says otherwise, the decoder's output is scaled by
            ``d_model ** -0.5``.
        scale_decoder_outputs: None: as ``tie_word_embeddings`` (HF 5 keeps the scaling
            here and always ties).
    """

    vocab_size: int = 32100
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 1024
    num_layers: int = 6
    num_decoder_layers: int = 6
    num_heads: int = 8
    relative_attention_num_buckets: int = 32
    layer_norm_epsilon: float = 1e-6
    dropout_rate: float = 0.0
    feed_forward_proj: str = "gated-gelu"
    is_gated_act: bool | None = None
    tie_word_embeddings: bool = False
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int = 0
    name: str = "t5"
    relative_attention_max_distance: int = 128
    scale_decoder_outputs: bool | None = None

    def __post_init__(self) -> None:
        if self.is_gated_act is None:
            self.is_gated_act = str(self.feed_forward_proj).startswith("gated-")

    @property
    def head_dim(self) -> int:
        """The size of a head (``d_kv``)."""
        return self.d_kv

    @property
    def inner_dim(self) -> int:
        """The width of the attention's projections, ``num_heads * d_kv``."""
        return self.num_heads * self.d_kv

    def validate(self) -> None:
        """Raise ``ValueError`` if a model cannot be built from this config."""
        check_t5_config(self)


def feed_forward_kind(config: Any) -> tuple[bool, str]:
    """``(gated, activation name)`` from ``feed_forward_proj``, parsed as HF does.

    Args:
        config: any T5 config.

    Raises:
        ValueError: a malformed value or an activation not supported here.
    """
    proj = str(cfg(config, "feed_forward_proj", "relu"))
    parts = proj.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise ValueError(f"T5: feed_forward_proj {proj!r} is neither '<act>' nor 'gated-<act>'")
    act = "gelu_new" if proj == "gated-gelu" else parts[-1]
    if act not in _ACTIVATIONS:
        raise ValueError(f"T5: activation {act!r} (feed_forward_proj {proj!r}) is not supported; "
                         f"use one of {sorted(_ACTIVATIONS)}")
    return len(parts) == 2, act


def check_t5_config(config: Any) -> None:
    """Raise ``ValueError`` with the offending field if ``config`` cannot build a T5.

    Args:
        config: any T5 config.
    """
    for name in ("vocab_size", "d_model", "d_kv", "d_ff", "num_heads", "num_layers"):
        value = cfg(config, name, 0)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"T5Config: {name} must be a positive int (got {value!r})")
    n_dec = cfg(config, "num_decoder_layers", 1)
    if not isinstance(n_dec, int) or n_dec <= 0:
        raise ValueError(f"T5Config: num_decoder_layers must be a positive int (got {n_dec!r})")
    buckets, distance = _bucket_sizes(config)
    if buckets < 4 or distance <= buckets // 2:
        raise ValueError(f"T5Config: relative_attention_num_buckets must be at least 4 and below twice "
                         f"relative_attention_max_distance (got {buckets} and {distance})")
    gated, _ = feed_forward_kind(config)
    declared = getattr(config, "is_gated_act", None)
    if declared is not None and bool(declared) != gated:
        raise ValueError(f"T5Config: is_gated_act={declared} contradicts feed_forward_proj "
                         f"{cfg(config, 'feed_forward_proj', 'relu')!r}")


def _bucket_sizes(config: Any) -> tuple[int, int]:
    return int(cfg(config, "relative_attention_num_buckets", 32)), int(cfg(config, "relative_attention_max_distance", 128))


def relative_position_bucket(relative_position: torch.Tensor, *, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> torch.Tensor:
    """T5's bucket of each ``key - query`` offset: exact for small distances, log-spaced
    up to ``max_distance``, one bucket beyond; a bidirectional bias gives keys after the
    query their own half of the buckets. The same float32 steps as HF, so the buckets
    agree exactly.

    Args:
        relative_position: integer offsets ``key_pos - query_pos``.
        bidirectional: the encoder's (True) or the causal decoder's (False) scheme.
        num_buckets: buckets in all.
        max_distance: the distance from which all offsets share the last bucket.
    """
    bucket = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    # clamp only touches distances below max_exact, which take the exact branch
    scaled = torch.log(distance.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (scaled * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return bucket + torch.where(distance < max_exact, distance, large)


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A bool or integer mask as an additive one (0, or the dtype's lowest value as in
    HF's eager masks); float masks and None pass through.

    Args:
        mask: None, bool or integer (nonzero: attend), or float (already additive).
        dtype: the scores' dtype.
    """
    if mask is None or mask.dtype.is_floating_point:
        return mask
    keep = mask if mask.dtype == torch.bool else mask != 0
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, torch.finfo(dtype).min)


def _add_terms(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    return b if a is None else a if b is None else a + b


class T5LayerNorm(RMSNorm):
    """T5's norm: ``x / sqrt(mean(x^2) + eps) * weight`` (an RMSNorm; one op on nntile).

    Args:
        d_model: the normalised (last) size.
        eps: added to the mean square.
    """

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__(d_model, eps=eps)


def _norm(config: Any) -> T5LayerNorm:
    return T5LayerNorm(cfg(config, "d_model"), eps=cfg(config, "layer_norm_epsilon", 1e-6))


class T5DenseActDense(nn.Module):
    """``wo(act(wi(x)))``: the plain feed-forward (``feed_forward_proj="relu"`` etc.)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        d_model, d_ff = cfg(config, "d_model"), cfg(config, "d_ff")
        self.wi = Linear(d_model, d_ff, bias=False)
        self.wo = Linear(d_ff, d_model, bias=False)
        self.act = _ACTIVATIONS[feed_forward_kind(config)[1]]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(self.act(self.wi(x)))


class T5DenseGatedActDense(nn.Module):
    """``wo(act(wi_0(x)) * wi_1(x))``: the gated feed-forward of T5 v1.1 and later."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        d_model, d_ff = cfg(config, "d_model"), cfg(config, "d_ff")
        self.wi_0 = Linear(d_model, d_ff, bias=False)
        self.wi_1 = Linear(d_model, d_ff, bias=False)
        self.wo = Linear(d_ff, d_model, bias=False)
        self.act = _ACTIVATIONS[feed_forward_kind(config)[1]]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(self.act(self.wi_0(x)) * self.wi_1(x))


class T5LayerFF(nn.Module):
    """The pre-norm residual feed-forward sublayer: ``x + DenseReluDense(layer_norm(x))``."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.layer_norm = _norm(config)
        gated = feed_forward_kind(config)[0]
        self.DenseReluDense = T5DenseGatedActDense(config) if gated else T5DenseActDense(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.DenseReluDense(self.layer_norm(x))


class T5Attention(nn.Module):
    """Multi-head attention without score scaling, optionally owning the relative
    position bias (``relative_attention_bias``, ``[num_buckets, n_heads]`` as HF's).

    Weights: q, k and v ``[d_model, d_kv, n_heads]``, o ``[d_kv, n_heads, d_model]``.

    Args:
        config: any T5 config.
        is_decoder: decoder attention: its relative bias is unidirectional.
        has_relative_attention_bias: own the bias table (the first block of a stack).
    """

    def __init__(self, config: Any, *, is_decoder: bool = False, has_relative_attention_bias: bool = False) -> None:
        super().__init__()
        self.is_decoder = is_decoder
        self.has_relative_attention_bias = has_relative_attention_bias
        self.n_heads, self.key_value_proj_dim = cfg(config, "num_heads"), cfg(config, "d_kv")
        self.inner_dim, self.d_model = self.n_heads * self.key_value_proj_dim, cfg(config, "d_model")
        self.relative_attention_num_buckets, self.relative_attention_max_distance = _bucket_sizes(config)
        qkv = (self.d_model, self.key_value_proj_dim, self.n_heads)
        self.q_weight, self.k_weight, self.v_weight = (nn.Parameter(torch.empty(qkv)) for _ in range(3))
        self.o_weight = nn.Parameter(torch.empty(self.key_value_proj_dim, self.n_heads, self.d_model))
        if has_relative_attention_bias:
            self.relative_attention_bias = Embedding(self.relative_attention_num_buckets, self.n_heads)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """HF's initialisation (``initializer_factor`` 1)."""
        stds = {"q_weight": (self.d_model * self.key_value_proj_dim) ** -0.5, "k_weight": self.d_model ** -0.5,
                "v_weight": self.d_model ** -0.5, "o_weight": self.inner_dim ** -0.5}
        for name, std in stds.items():
            nn.init.normal_(getattr(self, name), std=std)
        if hasattr(self, "relative_attention_bias"):
            nn.init.normal_(self.relative_attention_bias.weight, std=self.d_model ** -0.5)

    def compute_bias(self, query_length: int, key_length: int) -> torch.Tensor:
        """The bias ``[1, n_heads, query_length, key_length]`` on the table's device (the
        buckets are computed on the CPU, the lookup is one embedding op).

        Args:
            query_length: positions of the queries.
            key_length: positions of the keys.
        """
        offsets = torch.arange(key_length)[None, :] - torch.arange(query_length)[:, None]
        buckets = relative_position_bucket(offsets, bidirectional=not self.is_decoder,
                                           num_buckets=self.relative_attention_num_buckets,
                                           max_distance=self.relative_attention_max_distance)
        table = self.relative_attention_bias.weight
        return F.embedding(buckets.to(table.device), table).permute(2, 0, 1).unsqueeze(0)

    def forward(self, hidden: torch.Tensor, key_value_states: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, *, is_causal: bool = False,
                position_bias: torch.Tensor | None = None) -> torch.Tensor:
        """``[batch, seq_q, d_model] -> [batch, seq_q, d_model]``.

        Args:
            hidden: the queries' (and, for self attention, the keys') hidden states.
            key_value_states: the encoder's output for cross attention; None: self attention.
            attn_mask: None or a mask (see the module's docstring), added to the scores.
            is_causal: also mask keys after each query.
            position_bias: an additive term ``[1 or batch, heads, seq_q, seq_k]`` (the
                stack's shared bias); None: this layer's own bias if it has one.
        """
        kv = hidden if key_value_states is None else key_value_states
        q, k, v = (project_heads(x, w) for x, w in ((hidden, self.q_weight), (kv, self.k_weight), (kv, self.v_weight)))
        if position_bias is None and self.has_relative_attention_bias:
            position_bias = self.compute_bias(hidden.shape[1], kv.shape[1])
        mask = _add_terms(position_bias, additive_mask(attn_mask, q.dtype))
        return merge_heads(attention(q, k, v, mask, is_causal=is_causal, scale=1.0), self.o_weight)


class T5EncoderBlock(nn.Module):
    """Self attention then feed-forward, each pre-norm and residual.

    Args:
        config: any T5 config.
        has_relative_attention_bias: the block owns the stack's bias table.
    """

    def __init__(self, config: Any, *, has_relative_attention_bias: bool = False) -> None:
        super().__init__()
        self.layer_norm = _norm(config)
        self.self_attn = T5Attention(config, is_decoder=False, has_relative_attention_bias=has_relative_attention_bias)
        self.ff = T5LayerFF(config)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, *,
                position_bias: torch.Tensor | None = None) -> torch.Tensor:
        """The block's output ``[batch, seq, d_model]``.

        Args:
            x: ``[batch, seq, d_model]``.
            attn_mask: None or a mask over the keys.
            position_bias: the stack's additive term for the scores (see ``T5Attention``).
        """
        x = x + self.self_attn(self.layer_norm(x), attn_mask=attn_mask, position_bias=position_bias)
        return self.ff(x)


class T5DecoderBlock(nn.Module):
    """Causal self attention, cross attention over the encoder's output (skipped without
    one, as HF), then feed-forward; each pre-norm and residual.

    Args:
        config: any T5 config.
        has_relative_attention_bias: the block owns the stack's bias table.
    """

    def __init__(self, config: Any, *, has_relative_attention_bias: bool = False) -> None:
        super().__init__()
        self.layer_norm_0 = _norm(config)
        self.self_attn = T5Attention(config, is_decoder=True, has_relative_attention_bias=has_relative_attention_bias)
        self.layer_norm_1 = _norm(config)
        self.cross_attn = T5Attention(config, is_decoder=True)
        self.ff = T5LayerFF(config)

    def forward(self, x: torch.Tensor, encoder_hidden: torch.Tensor | None, self_attn_mask: torch.Tensor | None = None,
                cross_attn_mask: torch.Tensor | None = None, *,
                position_bias: torch.Tensor | None = None) -> torch.Tensor:
        """The block's output ``[batch, seq, d_model]``.

        Args:
            x: ``[batch, seq, d_model]``.
            encoder_hidden: ``[batch, seq_enc, d_model]``, or None for no cross attention.
            self_attn_mask: None or a mask, applied on top of the causal one.
            cross_attn_mask: None or a mask over the encoder's positions.
            position_bias: the stack's additive term for the self attention's scores.
        """
        x = x + self.self_attn(self.layer_norm_0(x), attn_mask=self_attn_mask, is_causal=True, position_bias=position_bias)
        if encoder_hidden is not None:
            x = x + self.cross_attn(self.layer_norm_1(x), key_value_states=encoder_hidden, attn_mask=cross_attn_mask)
        return self.ff(x)


class T5Stack(nn.Module):
    """Embedding, blocks (the first owning the relative bias) and a final norm.

    Args:
        config: any T5 config.
        embed_tokens: the token embedding (shared with the other stack).
        is_decoder: a decoder stack (causal, with cross attention).
        num_layers: blocks in the stack.
    """

    def __init__(self, config: Any, embed_tokens: nn.Module, *, is_decoder: bool, num_layers: int) -> None:
        super().__init__()
        self.embed_tokens, self.is_decoder = embed_tokens, is_decoder
        block = T5DecoderBlock if is_decoder else T5EncoderBlock
        self.block = nn.ModuleList(block(config, has_relative_attention_bias=i == 0) for i in range(num_layers))
        self.final_layer_norm = _norm(config)

    def forward(self, input_ids: torch.Tensor, encoder_hidden: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, cross_attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The stack's last hidden states ``[batch, seq, d_model]``.

        Args:
            input_ids: token ids ``[batch, seq]``.
            encoder_hidden: the encoder's output (decoder only; None: no cross attention).
            attn_mask: None or a self-attention mask (the decoder adds the causal one).
            cross_attn_mask: None or a mask over the encoder's positions (decoder only).
        """
        x = self.embed_tokens(input_ids)
        seq = input_ids.shape[1]
        first = self.block[0].self_attn if len(self.block) else None
        bias = first.compute_bias(seq, seq) if first is not None and first.has_relative_attention_bias else None
        bias = _add_terms(bias, additive_mask(attn_mask, x.dtype))  # built once, shared by all blocks
        cross = additive_mask(cross_attn_mask, x.dtype)
        for blk in self.block:
            x = blk(x, encoder_hidden, cross_attn_mask=cross, position_bias=bias) if self.is_decoder \
                else blk(x, position_bias=bias)
        return self.final_layer_norm(x)


class T5Model(nn.Module):
    """The encoder and decoder over one shared embedding; returns the decoder's hidden states.

    Args:
        config: any T5 config (checked by ``check_t5_config``).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        check_t5_config(config)
        self.config = config
        self.shared = Embedding(cfg(config, "vocab_size"), cfg(config, "d_model"))
        nn.init.normal_(self.shared.weight)
        n_enc = cfg(config, "num_layers")
        self.encoder = T5Stack(config, self.shared, is_decoder=False, num_layers=n_enc)
        self.decoder = T5Stack(config, self.shared, is_decoder=True, num_layers=cfg(config, "num_decoder_layers", n_enc))

    def forward(self, encoder_input_ids: torch.Tensor, decoder_input_ids: torch.Tensor,
                encoder_attention_mask: torch.Tensor | None = None, decoder_attention_mask: torch.Tensor | None = None,
                cross_attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The decoder's last hidden states ``[batch, seq_dec, d_model]``.

        Args:
            encoder_input_ids: ``[batch, seq_enc]``.
            decoder_input_ids: ``[batch, seq_dec]`` (already shifted right).
            encoder_attention_mask: None or the encoder's self-attention mask.
            decoder_attention_mask: None or the decoder's, on top of the causal one.
            cross_attention_mask: None or a mask over the encoder's positions; None with an
                encoder mask of one query row (a padding mask) reuses that, as HF does.
        """
        if cross_attention_mask is None and encoder_attention_mask is not None and encoder_attention_mask.dim() >= 2 \
                and encoder_attention_mask.shape[-2] == 1:
            cross_attention_mask = encoder_attention_mask
        enc = self.encoder(encoder_input_ids, attn_mask=encoder_attention_mask)
        return self.decoder(decoder_input_ids, encoder_hidden=enc, attn_mask=decoder_attention_mask,
                            cross_attn_mask=cross_attention_mask)


class T5ForConditionalGeneration(nn.Module):
    """``T5Model`` and the LM head: logits ``[batch, seq_dec, vocab_size]``.

    With ``tie_word_embeddings`` the head is ``model.shared.weight`` (``lm_head`` is
    None); the decoder's output is scaled by ``d_model ** -0.5`` where
    ``scale_decoder_outputs`` (default: ``tie_word_embeddings``) says so.

    Args:
        config: any T5 config (checked by ``check_t5_config``).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.model = T5Model(config)
        tied = bool(cfg(config, "tie_word_embeddings", False))
        self.scale_decoder_outputs = bool(cfg(config, "scale_decoder_outputs", tied))
        d_model = cfg(config, "d_model")
        self.lm_head = None if tied else Linear(d_model, cfg(config, "vocab_size"), bias=False)
        if self.lm_head is not None:
            nn.init.normal_(self.lm_head.weight)
        self.output_scale = d_model ** -0.5 if self.scale_decoder_outputs else 1.0

    def forward(self, encoder_input_ids: torch.Tensor, decoder_input_ids: torch.Tensor,
                encoder_attention_mask: torch.Tensor | None = None, decoder_attention_mask: torch.Tensor | None = None,
                cross_attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[batch, seq_dec, vocab_size]``; the arguments are ``T5Model``'s.

        Args:
            encoder_input_ids: ``[batch, seq_enc]``.
            decoder_input_ids: ``[batch, seq_dec]`` (already shifted right).
            encoder_attention_mask: None or the encoder's self-attention mask.
            decoder_attention_mask: None or the decoder's, on top of the causal one.
            cross_attention_mask: None or a mask over the encoder's positions.
        """
        hidden = self.model(encoder_input_ids, decoder_input_ids, encoder_attention_mask, decoder_attention_mask,
                            cross_attention_mask)
        if self.output_scale != 1.0:
            hidden = hidden * self.output_scale
        return F.linear(hidden, self.model.shared.weight if self.lm_head is None else self.lm_head.weight)


__all__ = ["T5Attention", "T5Config", "T5DecoderBlock", "T5DenseActDense", "T5DenseGatedActDense", "T5EncoderBlock",
           "T5ForConditionalGeneration", "T5LayerFF", "T5LayerNorm", "T5Model", "T5Stack", "check_t5_config",
           "relative_position_bucket"]
