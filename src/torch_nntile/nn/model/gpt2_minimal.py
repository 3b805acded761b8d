"""GPT-2: what HF's ``GPT2LMHeadModel`` computes (no dropout, cache or padding mask: a
causal LM over full sequences, as training uses), with the published torch_nntile's
module and parameter names.

Attention weights are in the head layout of ``common`` (q/k/v ``[hidden, head_size,
heads]``), so the projections are ``[batch, seq, head_size, heads]`` with no transpose.
Without a mask the attention is one fused causal op each way; a bool mask given to
``forward`` (``make_causal_sdpa_mask`` or any other) takes the masked path instead.
``gpt2_hf_loader`` converts weights from and to HF's.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from torch_nntile.nn.attention import attention
from torch_nntile.nn.linear import NntileLinear
from torch_nntile.nn.model.common import TiedHeadModule, cfg, init_normal_, make_causal_sdpa_mask, merge_heads, project_heads
from torch_nntile.nn.model.gpt2_hf_loader import gpt2_state_dict_from_hf, gpt2_state_dict_to_hf
from torch_nntile.nn.module import GELU, Embedding, LayerNorm

# HF's activation names and the GELU each one is
_ACTIVATIONS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "none"}


@dataclass
class GPT2Config:
    """The shape of a GPT-2, with the field names and defaults (GPT-2 small) of HF's
    ``GPT2Config``; the models take HF's config as well (or any object with these
    attributes). HF's fields for what the model does not do (dropout, caches) are not kept.

    Attributes:
        n_inner: width of the MLP; None: ``4 * n_embd``.
        activation_function: ``"gelu_new"``, ``"gelu_pytorch_tanh"`` or ``"gelu_fast"``
            (the tanh approximation) or ``"gelu"`` (exact); others raise when the model
            is built.
        scale_attn_weights: scale attention scores by ``1 / sqrt(head_size)``.
        scale_attn_by_inverse_layer_idx: also divide them by the layer's index plus one.
        tie_word_embeddings: the LM head is the token embedding.
    """

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    tie_word_embeddings: bool = True

    @classmethod
    def from_hf(cls, config: Any) -> GPT2Config:
        """The config of an HF GPT-2 (``model.config``), field by field by name; fields
        it lacks or leaves None keep their defaults."""
        return cls(**{f.name: cfg(config, f.name, f.default) for f in fields(cls)})


class NntileConv1D(NntileLinear):
    """HF's ``Conv1D`` (``nf`` outputs from ``nx`` inputs) with the weight stored as a
    ``Linear``'s, ``[nf, nx]``; normal(0.02) weight and zero bias, as GPT-2 initialises."""

    def __init__(self, nf: int, nx: int, *, bias: bool = True) -> None:
        self.nf, self.nx = nf, nx
        super().__init__(nx, nf, bias=bias)

    def reset_parameters(self) -> None:
        init_normal_(self)


class GPT2Attention(nn.Module):
    """Causal self-attention: q/k/v ``[hidden, head_size, n_head]`` with biases ``[n_head,
    head_size]``, output ``[head_size, n_head, hidden]`` and its bias ``[hidden]``."""

    def __init__(self, config: Any, layer_idx: int = 0) -> None:
        super().__init__()
        hidden, n_head = cfg(config, "n_embd", 768), cfg(config, "n_head", 12)
        if n_head <= 0 or hidden % n_head:
            raise ValueError(f"GPT2: n_embd {hidden} is not a multiple of n_head {n_head}")
        self.hidden, self.n_head, self.head_size = hidden, n_head, hidden // n_head
        self.scale = self.head_size ** -0.5 if cfg(config, "scale_attn_weights", True) else 1.0
        if cfg(config, "scale_attn_by_inverse_layer_idx", False):
            self.scale /= layer_idx + 1
        for p in "qkv":
            setattr(self, f"{p}_weight", nn.Parameter(torch.empty(hidden, self.head_size, n_head)))
            setattr(self, f"{p}_bias", nn.Parameter(torch.empty(n_head, self.head_size)))
        self.o_weight = nn.Parameter(torch.empty(self.head_size, n_head, hidden))
        self.o_bias = nn.Parameter(torch.empty(hidden))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_normal_(self)

    def forward(self, x: torch.Tensor, causal_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of ``x`` ``[batch, seq, hidden]`` over itself.

        Args:
            x: the hidden states.
            causal_mask: None (causal, the fused path) or a bool mask ``[seq, seq]`` (True:
                attend) on x's device.
        """
        q, k, v = (project_heads(x, getattr(self, f"{p}_weight"), getattr(self, f"{p}_bias")) for p in "qkv")
        out = attention(q, k, v, causal_mask, is_causal=causal_mask is None, scale=self.scale)
        return merge_heads(out, self.o_weight, self.o_bias)


class GPT2MLP(nn.Module):
    """``c_proj(gelu(c_fc(x)))``, the GELU as ``activation_function`` names it."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        act = cfg(config, "activation_function", "gelu_new")
        if act not in _ACTIVATIONS:
            raise ValueError(f"GPT2: activation {act!r} is not one of {sorted(_ACTIVATIONS)}")
        hidden = cfg(config, "n_embd", 768)
        inner = cfg(config, "n_inner", 4 * hidden)
        self.c_fc = NntileConv1D(inner, hidden)
        self.c_proj = NntileConv1D(hidden, inner)
        self.act = GELU(approximate=_ACTIVATIONS[act])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class GPT2Block(nn.Module):
    """Pre-LN transformer block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, config: Any, layer_idx: int = 0) -> None:
        super().__init__()
        hidden, eps = cfg(config, "n_embd", 768), cfg(config, "layer_norm_epsilon", 1e-5)
        self.ln_1 = LayerNorm(hidden, eps=eps)
        self.attn = GPT2Attention(config, layer_idx)
        self.ln_2 = LayerNorm(hidden, eps=eps)
        self.mlp = GPT2MLP(config)

    def forward(self, x: torch.Tensor, causal_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), causal_mask)
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    """Token and position embeddings, the blocks and the final LayerNorm: hidden states
    ``[batch, seq, n_embd]``."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        hidden = cfg(config, "n_embd", 768)
        self.n_positions = cfg(config, "n_positions", 1024)
        self.wte = Embedding(cfg(config, "vocab_size", 50257), hidden)
        self.wpe = Embedding(self.n_positions, hidden)
        self.h = nn.ModuleList(GPT2Block(config, i) for i in range(cfg(config, "n_layer", 12)))
        self.ln_f = LayerNorm(hidden, eps=cfg(config, "layer_norm_epsilon", 1e-5))
        # constants of the model, kept under the published torch_nntile's names: position
        # ids [batch, seq] per (batch, seq) and causal masks per seq (masks only for callers
        # that pass one: without a mask the attention is the fused causal op)
        self._position_ids_cache: dict[tuple[int, int], torch.Tensor] = {}
        self._causal_mask_cache: dict[int, torch.Tensor] = {}

    def positions(self, batch: int, seq: int, device: torch.device | str) -> torch.Tensor:
        """Position ids ``[batch, seq]`` (``0 .. seq - 1`` in each row) on ``device``, made
        once and kept (made again if the model moved to another device)."""
        device = torch.device(device)
        ids = self._position_ids_cache.get((batch, seq))
        if ids is None or ids.device.type != device.type:
            ids = torch.arange(seq).expand(batch, seq).contiguous().to(device)
            self._position_ids_cache[(batch, seq)] = ids
        return ids

    def causal_mask(self, seq: int, device: torch.device | str) -> torch.Tensor:
        """``make_causal_sdpa_mask(seq)`` on ``device``, made once and kept."""
        device = torch.device(device)
        mask = self._causal_mask_cache.get(seq)
        if mask is None or mask.device.type != device.type:
            mask = self._causal_mask_cache[seq] = make_causal_sdpa_mask(seq, device)
        return mask

    def clear_sequence_caches(self) -> None:
        """Forget the kept position ids and masks (after moving the model, say)."""
        self._position_ids_cache.clear()
        self._causal_mask_cache.clear()

    def warm_sequence_caches(self, *, batch_sizes: list[int] | tuple[int, ...] = (), seq_len: int,
                             device: torch.device | str) -> None:
        """Make the position ids and the causal mask of ``seq_len`` on ``device`` now rather
        than in the first step.

        Args:
            batch_sizes: the batch sizes the steps use (each positive).
            seq_len: the sequence length.
            device: where the steps will run.
        """
        if any(int(b) < 1 for b in batch_sizes) or seq_len < 1:
            raise ValueError(f"GPT2: batch sizes and seq_len must be positive, got {list(batch_sizes)} and {seq_len}")
        for b in sorted({int(b) for b in batch_sizes}):
            self.positions(b, seq_len, device)
        self.causal_mask(seq_len, device)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                causal_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states of ``input_ids`` ``[batch, seq]``.

        Args:
            input_ids: token ids, ``seq`` at most ``n_positions``.
            position_ids: ``[batch, seq]`` or ``[seq]``; None: ``0 .. seq - 1``.
            causal_mask: None (causal) or a bool ``[seq, seq]`` mask (True: attend).

        Raises:
            ValueError: the sequence is longer than ``n_positions``.
        """
        s = input_ids.shape[-1]
        if s > self.n_positions:
            raise ValueError(f"GPT2: sequence of {s} tokens is longer than n_positions {self.n_positions}")
        if position_ids is None:
            position_ids = self.positions(input_ids.shape[0] if input_ids.dim() > 1 else 1, s, input_ids.device)
        x = self.wte(input_ids) + self.wpe(position_ids)
        for block in self.h:
            x = block(x, causal_mask)
        return self.ln_f(x)


class GPT2LMHead(TiedHeadModule):
    """``GPT2Model`` and the LM head: logits ``[batch, seq, vocab_size]``. With
    ``tie_word_embeddings`` (HF's default) the head's weight is the token embedding's,
    and stays so across ``.to()``."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.transformer = GPT2Model(config)
        self.lm_head = NntileConv1D(cfg(config, "vocab_size", 50257), cfg(config, "n_embd", 768), bias=False)
        self.tied = bool(cfg(config, "tie_word_embeddings", True))
        if self.tied:
            self.tie_weights()

    def tie_weights(self) -> None:
        """Make the head's weight the token embedding's (one parameter, two names)."""
        self.lm_head.weight = self.transformer.wte.weight
        self.tied = True

    def _tie(self) -> None:
        if self.tied:
            self.tie_weights()

    def clear_sequence_caches(self) -> None:
        """See ``GPT2Model.clear_sequence_caches``."""
        self.transformer.clear_sequence_caches()

    def warm_sequence_caches(self, *, batch_sizes: list[int] | tuple[int, ...] = (), seq_len: int,
                             device: torch.device | str) -> None:
        """See ``GPT2Model.warm_sequence_caches``.

        Args:
            batch_sizes: the batch sizes the steps use.
            seq_len: the sequence length.
            device: where the steps will run.
        """
        self.transformer.warm_sequence_caches(batch_sizes=batch_sizes, seq_len=seq_len, device=device)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                causal_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of the next token at each position (arguments as ``GPT2Model.forward``).

        Args:
            input_ids: token ids ``[batch, seq]``.
            position_ids: None: ``0 .. seq - 1``.
            causal_mask: None (causal) or a bool ``[seq, seq]`` mask.
        """
        return self.lm_head(self.transformer(input_ids, position_ids, causal_mask))


class GPT2(GPT2LMHead):
    """``GPT2LMHead`` under this package's earlier name, with HF conversions as methods:
    ``GPT2.from_hf(hf_model)``, ``load_hf_state_dict(sd)`` and ``hf_state_dict()``."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)

    @classmethod
    def from_hf(cls, model: nn.Module) -> GPT2:
        """A copy of an HF ``GPT2LMHeadModel``, on its device."""
        ours = cls(GPT2Config.from_hf(model.config)).to(next(model.parameters()).device)
        ours.load_hf_state_dict(model.state_dict())
        return ours

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Load an HF GPT-2 state dict (``GPT2LMHeadModel``'s, or ``GPT2Model``'s without
        the ``transformer.`` prefix when the head is tied); strict: every parameter must be
        there."""
        self.load_state_dict(gpt2_state_dict_from_hf(sd, self.transformer.h[0].attn.n_head, tied=self.tied))

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights as ``GPT2LMHeadModel.load_state_dict`` takes them."""
        return gpt2_state_dict_to_hf(self.state_dict(), self.transformer.h[0].attn.n_head)


__all__ = ["GPT2", "GPT2Attention", "GPT2Block", "GPT2Config", "GPT2LMHead", "GPT2MLP", "GPT2Model", "NntileConv1D",
           "make_causal_sdpa_mask"]
