"""GPT-NeoX causal LM: what HF's ``GPTNeoXForCausalLM`` computes (no dropout, cache or
padding), with the published torch_nntile's names and attention weight layout.

Rotary embedding. HF rotates the first ``rotary_ndims`` channels of each q and k head
as two halves (``rotate_half``); we keep the published torch_nntile's layout instead:
those channels stored as interleaved pairs ``(2i, 2i + 1)`` (the loader reorders HF's
fused ``query_key_value`` rows accordingly, which leaves ``q . k`` unchanged), and
``sin``/``cos`` ``[seq, head_dim // 2]`` (or ``[batch, seq, head_dim // 2]``) with the
channels past ``rotary_ndims`` padded as pairs that do not turn (sin 0, cos 1). So
partial rotary needs no slicing: a projection ``[batch, seq, head_dim, heads]`` is seen
for free as ``[batch, seq * head_dim / 2, 2, heads]``, a rotation of pairs, and one
``rope`` op (``"projection"`` layout, head size 2) turns it with the per-pair tables
expanded to ``[seq * head_dim / 2, 2]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from torch_nntile.nn.attention import attention
from torch_nntile.nn.linear import NntileLinear
from torch_nntile.nn.model.common import TiedHeadModule, cfg, init_normal_, make_causal_sdpa_mask, merge_heads, project_heads
from torch_nntile.nn.model.gpt_neo import GELU_APPROXIMATIONS
from torch_nntile.nn.module import GELU, Embedding, LayerNorm
from torch_nntile.rope import angles_per_channel, rope, rope_sin_cos_from_position_ids

RopeTables = tuple[torch.Tensor, torch.Tensor]


@dataclass
class GPTNeoXConfig:
    """The shape of a GPT-NeoX model, with the published torch_nntile's field names.

    ``head_dim`` is derived from ``hidden_size`` and ``num_attention_heads``;
    ``rotary_ndims`` (a property) is HF's ``int(head_dim * rotary_pct)``. ``from_config``
    reads HF's ``GPTNeoXConfig`` (``rope_parameters`` or the older ``rotary_pct`` /
    ``rotary_emb_base``) or any object with its attributes.
    """

    vocab_size: int = 50280
    hidden_size: int = 1024
    intermediate_size: int = 4096
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    max_position_embeddings: int = 2048
    head_dim: int = 64
    layer_norm_eps: float = 1e-5
    rotary_pct: float = 0.25
    rotary_emb_base: float = 10000.0
    use_parallel_residual: bool = True
    attention_bias: bool = True
    tie_word_embeddings: bool = False
    attention_layers: list[str] = field(default_factory=list)
    eos_token_id: int = 50256
    bos_token_id: int = 50256
    name: str = "gpt-neox"
    hidden_act: str = "gelu"

    def __post_init__(self) -> None:
        if self.num_attention_heads > 0 and self.hidden_size % self.num_attention_heads == 0:
            self.head_dim = self.hidden_size // self.num_attention_heads

    @property
    def rotary_ndims(self) -> int:
        """Channels of each q and k head that the rotary embedding turns."""
        return max(0, int(self.head_dim * self.rotary_pct))

    def validate(self) -> None:
        """Check that a model can be built from this config.

        Raises:
            ValueError: heads that do not divide the hidden size, a ``rotary_pct``
                outside ``[0, 1]`` or giving an odd ``rotary_ndims``, or an activation
                other than GELU's.
        """
        if self.num_attention_heads < 1 or self.hidden_size % self.num_attention_heads:
            raise ValueError(f"GPTNeoXConfig: hidden_size {self.hidden_size} is not divisible by "
                             f"num_attention_heads {self.num_attention_heads}")
        if not 0.0 <= self.rotary_pct <= 1.0:
            raise ValueError(f"GPTNeoXConfig: rotary_pct must be in [0, 1], got {self.rotary_pct}")
        if self.rotary_ndims % 2:
            raise ValueError(f"GPTNeoXConfig: rotary_pct {self.rotary_pct} of head_dim {self.head_dim} gives an odd "
                             f"rotary_ndims {self.rotary_ndims} (rotated channels come in pairs)")
        if self.hidden_act not in GELU_APPROXIMATIONS:
            raise ValueError(f"GPTNeoXConfig: hidden_act {self.hidden_act!r} is not one of "
                             f"{sorted(GELU_APPROXIMATIONS)}")

    @classmethod
    def from_config(cls, config: Any) -> GPTNeoXConfig:
        """``config`` itself if it is one, else one read from HF's ``GPTNeoXConfig`` or any
        object with its attribute names.

        Raises:
            ValueError: ``rope_parameters`` asks for a rope type other than the default.
        """
        if isinstance(config, cls):
            return config
        rope_params = cfg(config, "rope_parameters", None) or cfg(config, "rope_scaling", None) or {}
        if rope_params.get("rope_type", rope_params.get("type", "default")) != "default":
            raise ValueError(f"GPTNeoX: rope type {rope_params.get('rope_type')!r} is not supported (only the default)")
        return cls(
            vocab_size=cfg(config, "vocab_size", 50280),
            hidden_size=cfg(config, "hidden_size", 1024),
            intermediate_size=cfg(config, "intermediate_size", 4096),
            num_hidden_layers=cfg(config, "num_hidden_layers", 24),
            num_attention_heads=cfg(config, "num_attention_heads", 16),
            max_position_embeddings=cfg(config, "max_position_embeddings", 2048),
            layer_norm_eps=cfg(config, "layer_norm_eps", 1e-5),
            rotary_pct=float(rope_params.get("partial_rotary_factor", cfg(config, "rotary_pct", 0.25))),
            rotary_emb_base=float(rope_params.get("rope_theta", cfg(config, "rotary_emb_base", 10000.0))),
            use_parallel_residual=bool(cfg(config, "use_parallel_residual", True)),
            attention_bias=bool(cfg(config, "attention_bias", True)),
            tie_word_embeddings=bool(cfg(config, "tie_word_embeddings", False)),
            eos_token_id=cfg(config, "eos_token_id", 50256),
            bos_token_id=cfg(config, "bos_token_id", 50256),
            hidden_act=cfg(config, "hidden_act", "gelu"),
        )


def rope_pair_tables(sin: torch.Tensor, cos: torch.Tensor, head_dim: int) -> RopeTables:
    """``(sin, cos)`` ``[seq, n]`` or ``[batch, seq, n]`` (one angle per pair, ``n <=
    head_dim // 2``; pairs past ``n`` do not turn) -> the tables ``[..., seq * head_dim
    // 2, 2]`` that turn a projection seen as pairs (see the module), on sin's device.

    Args:
        sin: the angles' sines, as ``rope_sin_cos_from_position_ids`` gives them.
        cos: their cosines, of sin's shape.
        head_dim: the heads' size.

    Raises:
        ValueError: the shapes differ, are not 2-D or 3-D, or have more than
            ``head_dim // 2`` angles.
    """
    half = head_dim // 2
    if sin.shape != cos.shape or sin.dim() not in (2, 3) or sin.shape[-1] > half:
        raise ValueError(f"GPTNeoX: sin and cos must share a shape [seq, n] or [batch, seq, n] with n <= head_dim // 2 "
                         f"= {half}, got {list(sin.shape)} and {list(cos.shape)}")
    pad = half - sin.shape[-1]
    if pad:
        sin = torch.cat([sin, sin.new_zeros(*sin.shape[:-1], pad)], -1)
        cos = torch.cat([cos, cos.new_ones(*cos.shape[:-1], pad)], -1)

    return angles_per_channel(sin, sin.dim() - 2), angles_per_channel(cos, cos.dim() - 2)


def rotate_pairs(x: torch.Tensor, tables: RopeTables) -> torch.Tensor:
    """The projection ``x`` ``[batch, seq, head_dim, heads]`` with each channel pair
    ``(2i, 2i + 1)`` turned by ``rope_pair_tables``'s angles: one ``rope`` op, and no copy
    (the views are free).

    Args:
        x: queries or keys.
        tables: ``rope_pair_tables``'s ``(sin, cos)`` for x's sequence and head size.
    """
    b, s, d, h = x.shape
    sin, cos = tables
    y = rope(sin, cos, x.reshape(b, s * d // 2, 2, h), layout="projection")
    return y.reshape(b, s, d, h)


class GPTNeoXAttention(nn.Module):
    """Self-attention with a partial rotary embedding: q, k, v ``[hidden, head_dim,
    n_heads]`` (rotary channels as interleaved pairs) with biases ``[n_heads, head_dim]``,
    output ``o_weight`` ``[head_dim, n_heads, hidden]`` and ``o_bias`` (biases only with
    ``attention_bias``).

    Args:
        config: the model's config (see ``GPTNeoXConfig.from_config``).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        c = GPTNeoXConfig.from_config(config)
        self.n_heads, self.head_dim, self.hidden = c.num_attention_heads, c.head_dim, c.hidden_size
        self.rotary_ndims, self.attention_bias = c.rotary_ndims, c.attention_bias
        qkv_shape = (self.hidden, self.head_dim, self.n_heads)
        self.q_weight = nn.Parameter(torch.empty(qkv_shape))
        self.k_weight = nn.Parameter(torch.empty(qkv_shape))
        self.v_weight = nn.Parameter(torch.empty(qkv_shape))
        self.o_weight = nn.Parameter(torch.empty(self.head_dim, self.n_heads, self.hidden))
        for name, shape in (("q_bias", (self.n_heads, self.head_dim)), ("k_bias", (self.n_heads, self.head_dim)),
                            ("v_bias", (self.n_heads, self.head_dim)), ("o_bias", (self.hidden,))):
            self.register_parameter(name, nn.Parameter(torch.empty(shape)) if c.attention_bias else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weights normal with std 0.02, biases zero."""
        init_normal_(self)

    def forward(self, x: torch.Tensor, sin: torch.Tensor | None = None, cos: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, *, is_causal: bool = True,
                rope_tables: RopeTables | None = None) -> torch.Tensor:
        """Self-attention of ``x`` ``[batch, seq, hidden]``.

        Args:
            x: the hidden states.
            sin: the rotary angles' sines ``[seq, n]`` or ``[batch, seq, n]``
                (``rope_sin_cos_from_position_ids``; ``n`` up to ``head_dim // 2``, the
                rest identity-padded); None (with cos): no rotary embedding.
            cos: their cosines.
            attn_mask: None, or a bool (True: attend) or additive float mask
                broadcasting to ``[batch, heads, seq, seq]``.
            is_causal: also mask keys after each query.
            rope_tables: ``rope_pair_tables``'s result, used instead of sin and cos
                (the model prepares them once for all layers).

        Returns:
            ``[batch, seq, hidden]``.
        """
        q = project_heads(x, self.q_weight, self.q_bias)
        k = project_heads(x, self.k_weight, self.k_bias)
        v = project_heads(x, self.v_weight, self.v_bias)
        if rope_tables is None and sin is not None and cos is not None and self.rotary_ndims > 0:
            rope_tables = rope_pair_tables(sin.to(x.device), cos.to(x.device), self.head_dim)
        if rope_tables is not None:
            q, k = rotate_pairs(q, rope_tables), rotate_pairs(k, rope_tables)
        if attn_mask is not None:
            attn_mask = attn_mask.to(x.device)
        out = attention(q, k, v, attn_mask, is_causal=is_causal)
        return merge_heads(out, self.o_weight, self.o_bias)


class GPTNeoXMLP(nn.Module):
    """``dense_4h_to_h(gelu(dense_h_to_4h(x)))`` with ``nn.Linear``-layout weights.

    Args:
        config: the model's config (see ``GPTNeoXConfig.from_config``).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        c = GPTNeoXConfig.from_config(config)
        if c.hidden_act not in GELU_APPROXIMATIONS:
            raise ValueError(f"GPTNeoXMLP: hidden_act {c.hidden_act!r} is not one of {sorted(GELU_APPROXIMATIONS)}")
        self.dense_h_to_4h = NntileLinear(c.hidden_size, c.intermediate_size)
        self.dense_4h_to_h = NntileLinear(c.intermediate_size, c.hidden_size)
        self.act = GELU(approximate=GELU_APPROXIMATIONS[c.hidden_act])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(self.act(self.dense_h_to_4h(x)))


class GPTNeoXLayer(nn.Module):
    """Pre-norm layer: with ``use_parallel_residual`` ``x + attn(ln1(x)) + mlp(ln2(x))``,
    else ``h = x + attn(ln1(x))`` then ``h + mlp(ln2(h))``.

    Args:
        config: the model's config (see ``GPTNeoXConfig.from_config``).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        c = GPTNeoXConfig.from_config(config)
        self.use_parallel_residual = c.use_parallel_residual
        self.input_layernorm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.attention = GPTNeoXAttention(c)
        self.post_attention_layernorm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.mlp = GPTNeoXMLP(c)

    def forward(self, x: torch.Tensor, sin: torch.Tensor | None = None, cos: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, *, is_causal: bool = True,
                rope_tables: RopeTables | None = None) -> torch.Tensor:
        """The layer on ``x`` ``[batch, seq, hidden]``.

        Args:
            x: the hidden states.
            sin: see ``GPTNeoXAttention.forward``.
            cos: see ``GPTNeoXAttention.forward``.
            attn_mask: see ``GPTNeoXAttention.forward``.
            is_causal: see ``GPTNeoXAttention.forward``.
            rope_tables: see ``GPTNeoXAttention.forward``.
        """
        a = self.attention(self.input_layernorm(x), sin, cos, attn_mask, is_causal=is_causal, rope_tables=rope_tables)
        if self.use_parallel_residual:
            return x + a + self.mlp(self.post_attention_layernorm(x))
        h = x + a
        return h + self.mlp(self.post_attention_layernorm(h))


class GPTNeoXModel(nn.Module):
    """Token embedding, the layers and the final norm (HF's ``GPTNeoXModel``):
    ``forward`` returns the last hidden states.

    Args:
        config: the model's config (see ``GPTNeoXConfig.from_config``).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        c = GPTNeoXConfig.from_config(config)
        c.validate()
        self.config = c
        self.embed_in = Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(GPTNeoXLayer(c) for _ in range(c.num_hidden_layers))
        self.final_layer_norm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self._rope: dict[tuple[int, torch.device], RopeTables] = {}  # per length and device
        # the published torch_nntile's tables [seq, head_dim // 2] per length, under its name
        self._rope_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _tables(self, position_ids: torch.Tensor) -> RopeTables:
        c = self.config
        sin, cos = rope_sin_cos_from_position_ids(position_ids, c.rotary_ndims, rope_theta=c.rotary_emb_base)
        return rope_pair_tables(sin, cos, c.head_dim)

    def _cached_tables(self, seq: int, device: torch.device | str) -> RopeTables:
        device = torch.device(device)
        key = (seq, torch.device(device.type, device.index or 0))
        if key not in self._rope:
            c = self.config
            sin, cos = rope_sin_cos_from_position_ids(torch.arange(seq), c.rotary_ndims, rope_theta=c.rotary_emb_base,
                                                      identity_pad_head_dim=c.head_dim)
            self._rope_cache[seq] = (sin.to(device), cos.to(device))
            self._rope[key] = tuple(t.to(device) for t in rope_pair_tables(sin, cos, c.head_dim))
        return self._rope[key]

    def clear_sequence_caches(self) -> None:
        """Forget the kept rotary tables (kept per length and device)."""
        self._rope.clear()
        self._rope_cache.clear()

    def warm_sequence_caches(self, *, batch_sizes: Any = None, seq_len: int, device: torch.device | str) -> None:
        """Prepare the rotary tables of ``seq_len`` on ``device`` before training.

        Args:
            batch_sizes: unused (the tables serve every batch size).
            seq_len: the sequence length.
            device: where the model runs.

        Raises:
            ValueError: ``seq_len`` under 1.
        """
        del batch_sizes
        if seq_len < 1:
            raise ValueError(f"GPTNeoX: seq_len must be at least 1, got {seq_len}")
        if self.config.rotary_ndims > 0:
            self._cached_tables(seq_len, torch.device(device))

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                sin: torch.Tensor | None = None, cos: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, *, is_causal: bool = True) -> torch.Tensor:
        """Last hidden states ``[batch, seq, hidden]`` of ``input_ids`` ``[batch, seq]``.

        Args:
            input_ids: token ids.
            position_ids: None (``0 .. seq - 1``, tables kept) or positions ``[seq]`` /
                ``[batch, seq]`` for the rotary embedding.
            sin: the rotary sines (``GPTNeoXAttention.forward``), used instead of
                position_ids.
            cos: their cosines.
            attn_mask: see ``GPTNeoXAttention.forward``.
            is_causal: see ``GPTNeoXAttention.forward``.
        """
        tables = None
        if self.config.rotary_ndims > 0:
            if sin is not None and cos is not None:
                tables = rope_pair_tables(sin.to(input_ids.device), cos.to(input_ids.device), self.config.head_dim)
            elif position_ids is not None:
                sin, cos = self._tables(position_ids.cpu())
                tables = (sin.to(input_ids.device), cos.to(input_ids.device))
            else:
                tables = self._cached_tables(input_ids.shape[-1], input_ids.device)
        x = self.embed_in(input_ids)
        for layer in self.layers:
            x = layer(x, attn_mask=attn_mask, is_causal=is_causal, rope_tables=tables)
        return self.final_layer_norm(x)


class GPTNeoXCausal(TiedHeadModule):
    """GPT-NeoX with its LM head ``embed_out``: ``forward(input_ids)`` returns logits
    ``[batch, seq, vocab]``. With ``tie_word_embeddings`` the head's weight is the token
    embedding's (kept tied across ``.to()``).

    Args:
        config: the model's config (see ``GPTNeoXConfig.from_config``).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.gpt_neox = GPTNeoXModel(config)
        self.config = c = self.gpt_neox.config
        self.embed_out = NntileLinear(c.hidden_size, c.vocab_size, bias=False)
        self._tie()

    def _tie(self) -> None:
        if self.config.tie_word_embeddings:
            self.embed_out.weight = self.gpt_neox.embed_in.weight

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                sin: torch.Tensor | None = None, cos: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of the next token at each position (causal).

        Args:
            input_ids: token ids ``[batch, seq]``.
            position_ids: see ``GPTNeoXModel.forward``.
            sin: see ``GPTNeoXModel.forward``.
            cos: see ``GPTNeoXModel.forward``.
            attn_mask: see ``GPTNeoXModel.forward``.
        """
        hidden = self.gpt_neox(input_ids, position_ids, sin, cos, attn_mask, is_causal=True)
        return self.embed_out(hidden)


__all__ = [
    "GPTNeoXAttention",
    "GPTNeoXCausal",
    "GPTNeoXConfig",
    "GPTNeoXLayer",
    "GPTNeoXMLP",
    "GPTNeoXModel",
    "make_causal_sdpa_mask",
    "rope_pair_tables",
    "rotate_pairs",
]
