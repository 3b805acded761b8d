"""Llama: what HF's ``LlamaForCausalLM`` computes (RMSNorm, rotary embedding, grouped
kv heads, SiLU-gated MLP; no dropout or cache), with the published torch_nntile's
module and parameter names.

Attention weights are in the head layout of ``common`` (q/k/v ``[hidden, head_dim,
heads]``, grouped q ``[hidden, head_dim, n_kv_heads, n_rep]``), and the rotary
channels of q and k are stored as the published torch_nntile stores them: in
neighbouring pairs (``hf_rope_layout``), with ``sin``/``cos`` tables ``[..., seq,
head_dim // 2]`` (``rope_sin_cos_from_position_ids``). The forward reorders the q and k
weights to HF's halves (a weight-sized copy) so that the rotation is the fused
``rope`` op on the projection itself, and attends with one fused op each way when no
mask is given. ``llama_hf_loader`` converts weights from and to HF's.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from torch_nntile.nn import functional as F
from torch_nntile.nn.attention import attention
from torch_nntile.nn.model.common import cfg, init_normal_, make_causal_sdpa_mask, merge_heads, project_heads
from torch_nntile.nn.module import Embedding, Linear, RMSNorm, SiLU
from torch_nntile.rope import rope, rope_sin_cos_from_position_ids


@dataclass
class LlamaConfig:
    """The shape of a Llama, with the published torch_nntile's fields (HF's names and
    Llama 7B's defaults). The models also take HF's config (or any object with these
    attributes); it is read with ``from_hf``. Only the default rotary embedding and the
    SiLU MLP are supported.

    Attributes:
        num_key_value_heads: key/value heads (grouped-query attention); None (resolved
            when built): as many as ``num_attention_heads``.
        max_position_embeddings: kept for the configs' sake; positions past it are not
            rejected (HF does not either).
        head_dim: channels of a head; None (resolved when built, where it divides):
            ``hidden_size // num_attention_heads``.
        rope_theta: base of the rotary embedding's frequencies.
        attention_bias: biases on the q, k, v and output projections.
        mlp_bias: biases on the MLP's projections.
        tie_word_embeddings: the LM head is the token embedding (``lm_head`` None).
        name: a label.
        hidden_act: must be ``"silu"`` (``validate`` rejects others).
    """

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    max_position_embeddings: int = 2048
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    eos_token_id: Any = 2
    bos_token_id: Any = 1
    name: str = "llama"
    hidden_act: str = "silu"

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None and self.num_attention_heads > 0 and self.hidden_size % self.num_attention_heads == 0:
            self.head_dim = self.hidden_size // self.num_attention_heads

    def validate(self) -> None:
        """Check that the shapes fit together (the models call it when built).

        Raises:
            ValueError: no head size (``hidden_size`` not a multiple of
                ``num_attention_heads`` and no ``head_dim``), an odd head size (the
                rotary embedding rotates pairs), heads that do not split into the kv
                groups, or an activation other than SiLU.
        """
        if self.num_attention_heads <= 0 or not self.num_key_value_heads or self.num_key_value_heads <= 0:
            raise ValueError(f"Llama: need positive head counts, got num_attention_heads={self.num_attention_heads}, "
                             f"num_key_value_heads={self.num_key_value_heads}")
        if self.head_dim is None:
            raise ValueError(f"Llama: hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                             f"{self.num_attention_heads} (give head_dim)")
        if self.head_dim % 2:
            raise ValueError(f"Llama: head_dim must be even for the rotary embedding, got {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"Llama: {self.num_attention_heads} attention heads do not split into groups of "
                             f"{self.num_key_value_heads} key/value heads")
        if self.hidden_act != "silu":
            raise ValueError(f"Llama: activation {self.hidden_act!r} is not supported (only silu)")

    @classmethod
    def from_hf(cls, config: Any) -> LlamaConfig:
        """The config of an HF Llama (``model.config``) field by field by name; fields it
        lacks or leaves None keep their defaults. ``rope_theta`` is also read from
        ``rope_parameters`` / ``rope_scaling`` (where newer ``transformers`` keep it).
        ``transformers`` need not be imported: any object with those attributes works.

        Args:
            config: HF's ``LlamaConfig``, ours, or a namespace.

        Raises:
            ValueError: the config asks for a rope type other than the default (scaled
                variants such as Llama 3's are not supported).
        """
        values = {f.name: cfg(config, f.name) for f in fields(cls)}
        values = {k: v for k, v in values.items() if v is not None}
        rope_params = cfg(config, "rope_parameters") or cfg(config, "rope_scaling") or {}
        rope_type = rope_params.get("rope_type", rope_params.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"Llama: rope type {rope_type!r} is not supported (only the default)")
        if "rope_theta" in rope_params:
            values["rope_theta"] = float(rope_params["rope_theta"])
        return cls(**values)


def _as_config(config: Any) -> LlamaConfig:
    """``config`` as our dataclass (HF's or another object read by name), validated."""
    c = config if isinstance(config, LlamaConfig) else LlamaConfig.from_hf(config)
    c.validate()
    return c


def _pairs_to_halves(t: torch.Tensor, dim: int) -> torch.Tensor:
    """The head channels on axis ``dim`` of ``t`` reordered from neighbouring pairs to HF's
    halves (one copy, differentiable): the q and k weights as HF's ``rotate_half`` sees them."""
    dim %= t.dim()
    n = t.shape[dim]
    return t.unflatten(dim, (n // 2, 2)).transpose(dim, dim + 1).reshape(t.shape)


def _rope_full(t: torch.Tensor, head_dim: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A ``sin`` or ``cos`` table ``[..., seq, head_dim // 2]`` as HF's ``[..., seq,
    head_dim]`` (each angle for both halves) on ``device`` in ``dtype`` (the activations',
    as HF casts them); a full table is only moved."""
    t = t.to(device=device, dtype=dtype)
    if t.shape[-1] == head_dim:
        return t
    if t.shape[-1] != head_dim // 2:
        raise ValueError(f"Llama: sin/cos must end in head_dim // 2 = {head_dim // 2} (or head_dim), "
                         f"got shape {list(t.shape)}")
    return torch.cat([t, t], dim=-1)


class LlamaRMSNorm(RMSNorm):
    """HF's ``LlamaRMSNorm``: ``x / sqrt(mean(x^2) + eps) * weight`` over the last axis
    (one op each way on nntile).

    Args:
        hidden_size: the normalised axis' length.
        eps: added to the mean square.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__(hidden_size, eps=eps)


class LlamaMLP(nn.Module):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` (weights ``[out, in]``).

    Args:
        config: a Llama config (ours, HF's or any object with the names).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        c = _as_config(config)
        self.gate_proj = Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up_proj = Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)
        self.act = SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class LlamaAttention(nn.Module):
    """Self-attention with grouped kv heads and the rotary embedding.

    Parameters: ``q_weight`` ``[hidden, head_dim, n_heads]`` (grouped:
    ``[hidden, head_dim, n_kv_heads, n_rep]``), ``k_weight`` and ``v_weight``
    ``[hidden, head_dim, n_kv_heads]``, ``o_weight`` ``[head_dim, n_heads, hidden]``
    (grouped: ``[head_dim, n_kv_heads, n_rep, hidden]``); q and k rotary channels in
    pairs. With ``attention_bias``: ``q_bias`` ``[*q heads, head_dim]``, ``k_bias`` and
    ``v_bias`` ``[n_kv_heads, head_dim]``, ``o_bias`` ``[hidden]``.

    Args:
        config: a Llama config (ours, HF's or any object with the names).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        c = _as_config(config)
        self.hidden_size, self.head_dim = c.hidden_size, c.head_dim
        self.n_heads, self.n_kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.n_rep = self.n_heads // self.n_kv_heads
        self.use_gqa = self.n_rep > 1
        q_heads = (self.n_kv_heads, self.n_rep) if self.use_gqa else (self.n_heads,)
        h, d, kv = self.hidden_size, self.head_dim, self.n_kv_heads
        self.q_weight = nn.Parameter(torch.empty(h, d, *q_heads))
        self.k_weight = nn.Parameter(torch.empty(h, d, kv))
        self.v_weight = nn.Parameter(torch.empty(h, d, kv))
        self.o_weight = nn.Parameter(torch.empty(d, *q_heads, h))
        bias = c.attention_bias
        self.q_bias = nn.Parameter(torch.empty(*q_heads, d)) if bias else None
        self.k_bias = nn.Parameter(torch.empty(kv, d)) if bias else None
        self.v_bias = nn.Parameter(torch.empty(kv, d)) if bias else None
        self.o_bias = nn.Parameter(torch.empty(h)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weights normal(0, 0.02), biases zero (HF's initialisation)."""
        init_normal_(self)

    def forward(self, x: torch.Tensor, sin: torch.Tensor | None = None, cos: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, *, is_causal: bool = True) -> torch.Tensor:
        """Attention of the sequence ``x`` over itself.

        Args:
            x: hidden states ``[batch, seq, hidden]``.
            sin: sines of the rotary angles, ``[seq, head_dim // 2]`` or ``[batch or 1,
                seq, head_dim // 2]`` (``[..., head_dim]`` in HF's duplicated form also
                works); None with ``cos``: no rotary embedding.
            cos: their cosines, of sin's shape.
            attn_mask: None, or a bool (True: attend) or additive float mask
                broadcasting to ``[batch, heads, seq, seq]``, used as given (then
                ``is_causal`` is not applied).
            is_causal: without a mask, attend causally (one fused op each way).

        Returns:
            ``[batch, seq, hidden]``.
        """
        q_w, k_w = self.q_weight, self.k_weight
        q_b, k_b = self.q_bias, self.k_bias
        rotate = sin is not None and cos is not None
        if rotate:  # our pairs -> HF's halves, so that the fused rope rotates the projections
            q_w, k_w = _pairs_to_halves(q_w, 1), _pairs_to_halves(k_w, 1)
            if q_b is not None:
                q_b, k_b = _pairs_to_halves(q_b, -1), _pairs_to_halves(k_b, -1)
        q = project_heads(x, q_w, q_b)
        k = project_heads(x, k_w, k_b)
        v = project_heads(x, self.v_weight, self.v_bias)
        if rotate:
            sin, cos = (_rope_full(t, self.head_dim, x.device, x.dtype) for t in (sin, cos))
            q = rope(sin, cos, q, layout="projection")
            k = rope(sin, cos, k, layout="projection")
        a = attention(q, k, v, attn_mask, is_causal=is_causal and attn_mask is None)
        return merge_heads(a, self.o_weight, self.o_bias)


class LlamaDecoder(nn.Module):
    """One layer: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``.

    Args:
        config: a Llama config (ours, HF's or any object with the names).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        c = _as_config(config)
        self.input_layernorm = LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.self_attn = LlamaAttention(c)
        self.post_attention_layernorm = LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.mlp = LlamaMLP(c)

    def forward(self, x: torch.Tensor, sin: torch.Tensor | None = None, cos: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, *, is_causal: bool = True) -> torch.Tensor:
        """The layer's output ``[batch, seq, hidden]``.

        Args:
            x: hidden states ``[batch, seq, hidden]``.
            sin: rotary sines, as ``LlamaAttention`` takes them.
            cos: rotary cosines.
            attn_mask: as ``LlamaAttention`` takes it.
            is_causal: without a mask, attend causally.
        """
        x = x + self.self_attn(self.input_layernorm(x), sin, cos, attn_mask, is_causal=is_causal)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Token embedding, the decoder layers and the final norm: ``forward`` returns the
    last hidden states (HF's ``LlamaModel``'s ``last_hidden_state``).

    Args:
        config: a Llama config (ours, HF's or any object with the names).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = c = _as_config(config)
        self.embed_tokens = Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoder(c) for _ in range(c.num_hidden_layers))
        self.norm = LlamaRMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        # constants of the model: the published torch_nntile's tables of positions 0..seq-1
        # per seq ([seq, head_dim // 2], its name), and HF's form of them per (seq, device, dtype)
        self._rope_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._rope_full_cache: dict[tuple[int, torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def _rope_tables_from_position_ids(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sin, cos)`` ``[..., seq, head_dim // 2]`` (float32) at ``position_ids``, on their device."""
        return rope_sin_cos_from_position_ids(position_ids, self.config.head_dim, rope_theta=self.config.rope_theta)

    def _default_rope(self, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """HF-form tables ``[seq, head_dim]`` of positions ``0..seq-1`` in the embedding's
        dtype, made on the CPU once per length, device and dtype and kept."""
        key = (seq, torch.device(device), self.embed_tokens.weight.dtype)
        if key not in self._rope_full_cache:
            half = self._rope_cache.get(seq)
            if half is None or half[0].device != key[1]:
                half = tuple(t.to(key[1]) for t in self._rope_tables_from_position_ids(torch.arange(seq)))
                self._rope_cache[seq] = half
            self._rope_full_cache[key] = tuple(_rope_full(t, self.config.head_dim, *key[1:]) for t in half)
        return self._rope_full_cache[key]

    def clear_sequence_caches(self) -> None:
        """Forget the kept rotary tables (for instance before a new graph session)."""
        self._rope_cache.clear()
        self._rope_full_cache.clear()

    def warm_sequence_caches(self, *, batch_sizes: Any = None, seq_len: int, device: torch.device | str) -> None:
        """Make the rotary tables of ``seq_len`` positions on ``device`` ahead of training.

        Args:
            batch_sizes: accepted for the published signature; the tables do not depend
                on the batch.
            seq_len: the sequence length.
            device: where the tables are kept.

        Raises:
            ValueError: ``seq_len`` below 1.
        """
        del batch_sizes
        if seq_len < 1:
            raise ValueError(f"Llama: seq_len must be at least 1, got {seq_len}")
        self._default_rope(seq_len, torch.device(device))

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                sin: torch.Tensor | None = None, cos: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, *, is_causal: bool = True) -> torch.Tensor:
        """The last hidden states ``[batch, seq, hidden]``.

        Args:
            input_ids: token ids ``[batch, seq]``.
            position_ids: positions ``[seq]`` or ``[batch, seq]`` for the rotary
                embedding (packed sequences, offsets); None: ``0..seq-1``. Ignored when
                ``sin`` and ``cos`` are given.
            sin: rotary sines ``[seq, head_dim // 2]`` or ``[batch or 1, seq, head_dim //
                2]`` (``rope_sin_cos_from_position_ids``), instead of ``position_ids``.
            cos: their cosines.
            attn_mask: None, or a bool (True: attend) or additive float mask broadcasting
                to ``[batch, heads, seq, seq]``, used as given.
            is_causal: without a mask, attend causally (one fused op each way).
        """
        x = self.embed_tokens(input_ids)
        if sin is None or cos is None:
            if position_ids is None:
                sin, cos = self._default_rope(input_ids.shape[-1], input_ids.device)
            else:
                sin, cos = self._rope_tables_from_position_ids(position_ids)
        sin, cos = (_rope_full(t, self.config.head_dim, x.device, x.dtype) for t in (sin, cos))  # once for all layers
        for layer in self.layers:
            x = layer(x, sin, cos, attn_mask, is_causal=is_causal)
        return self.norm(x)


class LlamaCausal(nn.Module):
    """``LlamaModel`` and the LM head: ``forward`` returns logits ``[batch, seq, vocab]``.
    With ``tie_word_embeddings`` the head is the token embedding and ``lm_head`` is None.

    Args:
        config: a Llama config (ours, HF's or any object with the names).
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = c = _as_config(config)
        self.model = LlamaModel(c)
        self.lm_head = None if c.tie_word_embeddings else Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                sin: torch.Tensor | None = None, cos: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, *, is_causal: bool = True) -> torch.Tensor:
        """Logits of the next token at each position.

        Args:
            input_ids: token ids ``[batch, seq]``.
            position_ids: as ``LlamaModel`` takes them.
            sin: as ``LlamaModel`` takes them.
            cos: as ``LlamaModel`` takes them.
            attn_mask: as ``LlamaModel`` takes it.
            is_causal: without a mask, attend causally.
        """
        h = self.model(input_ids, position_ids, sin, cos, attn_mask, is_causal=is_causal)
        return F.linear(h, self.model.embed_tokens.weight) if self.lm_head is None else self.lm_head(h)

    @classmethod
    def from_hf(cls, model: nn.Module) -> LlamaCausal:
        """Ours with the weights of an HF ``LlamaForCausalLM`` (copied, on its device).

        Args:
            model: the HF model (read by attribute: ``config`` and ``state_dict()``).
        """
        ours = cls(LlamaConfig.from_hf(model.config)).to(next(model.parameters()).device)
        ours.load_hf_state_dict(model.state_dict())
        return ours

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Load an HF ``LlamaForCausalLM`` state dict (strict: every parameter of ours must
        be there; with tied embeddings ``lm_head.weight`` is ignored).

        Args:
            sd: the HF state dict; its config must match this model's.
        """
        from torch_nntile.nn.model.llama_hf_loader import llama_state_dict_from_hf

        ours = llama_state_dict_from_hf(sd, self.config.num_attention_heads, self.config.num_key_value_heads)
        if self.lm_head is None:
            ours.pop("lm_head.weight", None)
        self.load_state_dict(ours)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights as ``LlamaForCausalLM.load_state_dict`` takes them (on the CPU)."""
        from torch_nntile.nn.model.llama_hf_loader import export_llama_causal_to_hf_state_dict

        return export_llama_causal_to_hf_state_dict(self)


class Llama(LlamaCausal):
    """The earlier name of ``LlamaCausal`` (same model, parameters and methods):
    ``Llama(config)`` or ``Llama.from_hf(hf_model)``, ``forward(ids)`` -> logits."""


__all__ = ["Llama", "LlamaAttention", "LlamaCausal", "LlamaConfig", "LlamaDecoder", "LlamaMLP", "LlamaModel",
           "LlamaRMSNorm", "make_causal_sdpa_mask"]
