"""GPT-Neo causal LM: what HF's ``GPTNeoForCausalLM`` computes (no dropout, cache or
padding), with the published torch_nntile's names and attention weight layout.

GPT-Neo differs from GPT-2 in three ways that matter here: its attention scores are not
scaled (``scale=1.0``), q, k and v have no bias, and some layers ("local") only attend
to the last ``window_size`` positions. Global layers (and local ones whose sequence fits
in the window) run the fused causal attention; the others pass a bool window mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from torch_nntile.nn.attention import attention
from torch_nntile.nn.linear import NntileLinear
from torch_nntile.nn.model.common import TiedHeadModule, cfg, init_normal_, make_causal_sdpa_mask, merge_heads, project_heads
from torch_nntile.nn.module import GELU, Embedding, LayerNorm

#: HF's ``activation_function`` names we run, as ``GELU``'s ``approximate``.
GELU_APPROXIMATIONS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}


def make_local_causal_sdpa_mask(seq_len: int, window_size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The bool mask ``[seq, seq]`` of a local layer: query ``q`` attends to key ``k``
    where ``k <= q`` and ``q - k < window_size`` (HF's ``attention_type == "local"``).
    Built on the CPU, then moved to ``device``.

    Args:
        seq_len: the sequence length.
        window_size: how many positions (the query's included) each query sees.
        device: where the mask goes; None keeps it on the CPU.
    """
    pos = torch.arange(seq_len)
    dist = pos[:, None] - pos[None, :]
    mask = (dist >= 0) & (dist < window_size)
    return mask if device is None else mask.to(device)


@dataclass
class GPTNeoConfig:
    """The shape of a GPT-Neo model, with the published torch_nntile's field names.

    ``head_dim`` is derived from ``hidden_size`` and ``num_attention_heads``; an empty
    ``attention_layers`` becomes HF's default pattern (even layers global, odd local).
    ``from_config`` reads HF's ``GPTNeoConfig`` (or any object with its attributes).
    """

    vocab_size: int = 50257
    hidden_size: int = 2048
    intermediate_size: int = 8192
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    max_position_embeddings: int = 2048
    head_dim: int = 128
    window_size: int = 256
    layer_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_layers: list[str] = field(default_factory=list)
    eos_token_id: int = 50256
    bos_token_id: int = 50256
    name: str = "gpt-neo"
    activation_function: str = "gelu_new"

    def __post_init__(self) -> None:
        if self.num_attention_heads > 0 and self.hidden_size % self.num_attention_heads == 0:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if not self.attention_layers:
            self.attention_layers = ["local" if i % 2 else "global" for i in range(self.num_hidden_layers)]

    def validate(self) -> None:
        """Check that a model can be built from this config.

        Raises:
            ValueError: heads that do not divide the hidden size, a layer pattern of the
                wrong length or with an unknown kind, a window under 1, or an
                activation other than GELU's.
        """
        if self.num_attention_heads < 1 or self.hidden_size % self.num_attention_heads:
            raise ValueError(f"GPTNeoConfig: hidden_size {self.hidden_size} is not divisible by "
                             f"num_attention_heads {self.num_attention_heads}")
        if len(self.attention_layers) != self.num_hidden_layers:
            raise ValueError(f"GPTNeoConfig: attention_layers has {len(self.attention_layers)} entries for "
                             f"num_hidden_layers {self.num_hidden_layers}")
        unknown = sorted(set(self.attention_layers) - {"global", "local"})
        if unknown:
            raise ValueError(f"GPTNeoConfig: attention layer kinds {unknown} are not 'global' or 'local'")
        if self.window_size < 1:
            raise ValueError(f"GPTNeoConfig: window_size must be at least 1, got {self.window_size}")
        if self.activation_function not in GELU_APPROXIMATIONS:
            raise ValueError(f"GPTNeoConfig: activation_function {self.activation_function!r} is not one of "
                             f"{sorted(GELU_APPROXIMATIONS)}")

    def is_local_attention_layer(self, layer_id: int) -> bool:
        """Whether layer ``layer_id`` attends within the sliding window."""
        return self.attention_layers[layer_id] == "local"

    @classmethod
    def from_config(cls, config: Any) -> GPTNeoConfig:
        """``config`` itself if it is one, else one read from HF's ``GPTNeoConfig`` or any
        object with its attribute names (``num_layers``, ``num_heads``,
        ``layer_norm_epsilon`` and an ``intermediate_size`` of None are understood)."""
        if isinstance(config, cls):
            return config
        hidden = cfg(config, "hidden_size", 2048)
        layers = cfg(config, "num_hidden_layers", cfg(config, "num_layers", 24))
        return cls(
            vocab_size=cfg(config, "vocab_size", 50257),
            hidden_size=hidden,
            intermediate_size=cfg(config, "intermediate_size", 4 * hidden),
            num_hidden_layers=layers,
            num_attention_heads=cfg(config, "num_attention_heads", cfg(config, "num_heads", 16)),
            max_position_embeddings=cfg(config, "max_position_embeddings", 2048),
            window_size=cfg(config, "window_size", 256),
            layer_norm_eps=cfg(config, "layer_norm_eps", cfg(config, "layer_norm_epsilon", 1e-5)),
            tie_word_embeddings=bool(cfg(config, "tie_word_embeddings", False)),
            attention_layers=list(cfg(config, "attention_layers", [])),
            eos_token_id=cfg(config, "eos_token_id", 50256),
            bos_token_id=cfg(config, "bos_token_id", 50256),
            activation_function=cfg(config, "activation_function", "gelu_new"),
        )


class GPTNeoAttention(nn.Module):
    """Unscaled multi-head self-attention: q, k, v ``[hidden, head_dim, n_heads]`` without
    bias, output ``o_weight`` ``[head_dim, n_heads, hidden]`` with ``o_bias``.

    Args:
        config: the model's config (see ``GPTNeoConfig.from_config``).
        local: attend within the config's ``window_size`` (a local layer).
    """

    def __init__(self, config: Any, *, local: bool = False) -> None:
        super().__init__()
        c = GPTNeoConfig.from_config(config)
        self.n_heads, self.head_dim, self.hidden = c.num_attention_heads, c.head_dim, c.hidden_size
        self.local, self.window_size = local, c.window_size
        qkv_shape = (self.hidden, self.head_dim, self.n_heads)
        self.q_weight = nn.Parameter(torch.empty(qkv_shape))
        self.k_weight = nn.Parameter(torch.empty(qkv_shape))
        self.v_weight = nn.Parameter(torch.empty(qkv_shape))
        self.o_weight = nn.Parameter(torch.empty(self.head_dim, self.n_heads, self.hidden))
        self.o_bias = nn.Parameter(torch.empty(self.hidden))
        self._masks: dict[tuple[int, torch.device], torch.Tensor] = {}
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weights normal with std 0.02, the output bias zero."""
        init_normal_(self)

    def _window(self, seq: int, device: torch.device) -> torch.Tensor:
        key = (seq, device)
        if key not in self._masks:
            self._masks[key] = make_local_causal_sdpa_mask(seq, self.window_size, device)
        return self._masks[key]

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, *,
                is_causal: bool | None = None) -> torch.Tensor:
        """Self-attention of ``x`` ``[batch, seq, hidden]``.

        Args:
            x: the hidden states.
            attn_mask: None, or a bool (True: attend) or additive float mask broadcasting
                to ``[batch, heads, seq, seq]``; given, it is the whole mask unless
                ``is_causal`` also asks for the causal one.
            is_causal: mask causally (within the window on a local layer); None: only
                without ``attn_mask``.

        Returns:
            ``[batch, seq, hidden]``.
        """
        seq = x.shape[1]
        q, k, v = (project_heads(x, w) for w in (self.q_weight, self.k_weight, self.v_weight))
        causal = attn_mask is None if is_causal is None else bool(is_causal)
        if attn_mask is not None:
            attn_mask = attn_mask.to(x.device)
        if causal and self.local and seq > self.window_size:
            window = self._window(seq, x.device)
            if attn_mask is None:
                attn_mask = window
            elif attn_mask.dtype == torch.bool:
                attn_mask = attn_mask & window
            else:
                attn_mask = attn_mask.masked_fill(~window, float("-inf"))
            causal = False
        out = attention(q, k, v, attn_mask, is_causal=causal, scale=1.0)
        return merge_heads(out, self.o_weight, self.o_bias)


class GPTNeoMLP(nn.Module):
    """``c_proj(gelu(c_fc(x)))`` with ``nn.Linear``-layout weights (HF's own).

    Args:
        config: the model's config (see ``GPTNeoConfig.from_config``).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        c = GPTNeoConfig.from_config(config)
        if c.activation_function not in GELU_APPROXIMATIONS:
            raise ValueError(f"GPTNeoMLP: activation_function {c.activation_function!r} is not one of "
                             f"{sorted(GELU_APPROXIMATIONS)}")
        self.c_fc = NntileLinear(c.hidden_size, c.intermediate_size)
        self.c_proj = NntileLinear(c.intermediate_size, c.hidden_size)
        self.act = GELU(approximate=GELU_APPROXIMATIONS[c.activation_function])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class GPTNeoBlock(nn.Module):
    """Pre-norm block: ``x + attn(ln_1(x))``, then ``+ mlp(ln_2(.))``.

    Args:
        config: the model's config (see ``GPTNeoConfig.from_config``).
        layer_id: the layer's index, which picks global or local attention.
    """

    def __init__(self, config: Any, layer_id: int) -> None:
        super().__init__()
        c = GPTNeoConfig.from_config(config)
        self.ln_1 = LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.attn = GPTNeoAttention(c, local=c.is_local_attention_layer(layer_id))
        self.ln_2 = LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.mlp = GPTNeoMLP(c)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, *,
                is_causal: bool | None = None) -> torch.Tensor:
        """The block on ``x`` ``[batch, seq, hidden]`` (``attn_mask`` and ``is_causal`` as
        ``GPTNeoAttention.forward``'s).

        Args:
            x: the hidden states.
            attn_mask: passed to the attention.
            is_causal: passed to the attention.
        """
        x = x + self.attn(self.ln_1(x), attn_mask, is_causal=is_causal)
        return x + self.mlp(self.ln_2(x))


class GPTNeoModel(nn.Module):
    """Token and position embeddings, the blocks and the final norm (HF's
    ``GPTNeoModel``): ``forward`` returns the last hidden states.

    Args:
        config: the model's config (see ``GPTNeoConfig.from_config``).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        c = GPTNeoConfig.from_config(config)
        c.validate()
        self.config = c
        self.wte = Embedding(c.vocab_size, c.hidden_size)
        self.wpe = Embedding(c.max_position_embeddings, c.hidden_size)
        self.h = nn.ModuleList(GPTNeoBlock(c, i) for i in range(c.num_hidden_layers))
        self.ln_f = LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self._positions: dict[tuple[int, torch.device], torch.Tensor] = {}

    def clear_sequence_caches(self) -> None:
        """Forget the kept position ids and window masks (they are kept per length and
        device, as constants of the model)."""
        self._positions.clear()
        for block in self.h:
            block.attn._masks.clear()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Last hidden states ``[batch, seq, hidden]`` of ``input_ids`` ``[batch, seq]``.

        Args:
            input_ids: token ids.
            position_ids: None (``0 .. seq - 1``) or ids ``[seq]`` / ``[batch, seq]``.
            attn_mask: None (causal), or the mask every layer uses instead (see
                ``GPTNeoAttention.forward``).

        Raises:
            ValueError: the sequence is longer than ``max_position_embeddings``.
        """
        seq = input_ids.shape[-1]
        if position_ids is None:
            if seq > self.config.max_position_embeddings:
                raise ValueError(f"GPTNeo: sequence of {seq} tokens is longer than max_position_embeddings "
                                 f"{self.config.max_position_embeddings}")
            key = (seq, input_ids.device)
            if key not in self._positions:
                self._positions[key] = torch.arange(seq).to(input_ids.device)
            position_ids = self._positions[key]
        x = self.wte(input_ids) + self.wpe(position_ids)
        for block in self.h:
            x = block(x, attn_mask)
        return self.ln_f(x)


class GPTNeoCausal(TiedHeadModule):
    """GPT-Neo with its LM head: ``forward(input_ids)`` returns logits ``[batch, seq,
    vocab]``. With ``tie_word_embeddings`` the head's weight is the token embedding's
    (kept tied across ``.to()``).

    Args:
        config: the model's config (see ``GPTNeoConfig.from_config``).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.transformer = GPTNeoModel(config)
        self.config = c = self.transformer.config
        self.lm_head = NntileLinear(c.hidden_size, c.vocab_size, bias=False)
        self._tie()

    def _tie(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.transformer.wte.weight

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of the next token at each position.

        Args:
            input_ids: token ids ``[batch, seq]``.
            position_ids: see ``GPTNeoModel.forward``.
            attn_mask: see ``GPTNeoModel.forward``.
        """
        return self.lm_head(self.transformer(input_ids, position_ids, attn_mask))


__all__ = [
    "GPTNeoAttention",
    "GPTNeoBlock",
    "GPTNeoCausal",
    "GPTNeoConfig",
    "GPTNeoMLP",
    "GPTNeoModel",
    "make_causal_sdpa_mask",
    "make_local_causal_sdpa_mask",
]
