"""Models built from ``torch_nntile.nn`` layers: no ``transformers`` needed to import.

``GPT2`` and ``Llama`` compute what HF's ``GPT2LMHeadModel`` and ``LlamaForCausalLM``
compute (without dropout, caches or padding masks: a causal LM over full sequences,
as training uses), with attention projections in our head layout
(``weight_layout``). ``from_hf(model)`` builds one from an HF model (its config is
read by attribute name) and ``hf_state_dict()`` writes the weights back for HF.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from torch_nntile.nn import functional as F
from torch_nntile.nn import weight_layout
from torch_nntile.nn.module import GELU, SDPA, Embedding, LayerNorm, Linear, ReLU, RMSNorm, SiLU


class DeepReLU(nn.Sequential):
    """Bias-free MLP: Linear(input_dim, hidden_dim), then ``depth - 2`` times
    Linear(hidden_dim, hidden_dim), then Linear(hidden_dim, output_dim), with ReLU
    between the layers. ``depth`` counts Linear layers; with 1 it is one Linear from
    input to output. The layers are the Sequential's own (``0.weight``, ``2.weight``...)."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, depth: int = 3) -> None:
        if depth < 1:
            raise ValueError(f"DeepReLU: depth must be at least 1 (got {depth})")
        dims = [input_dim] + [hidden_dim] * (depth - 1) + [output_dim]
        layers: list[nn.Module] = []
        for i in range(depth):
            layers.append(Linear(dims[i], dims[i + 1], bias=False))
            if i < depth - 1:
                layers.append(ReLU())
        super().__init__(*layers)
        self.input_dim, self.hidden_dim, self.output_dim, self.depth = input_dim, hidden_dim, output_dim, depth

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)

    @classmethod
    def tiny(cls) -> DeepReLU:
        """128 inputs, 5 layers of 256, 10 outputs: the reference's small test model."""
        return cls(128, 256, 10, depth=5)

    @classmethod
    def mnist(cls, hidden_dim: int = 256, depth: int = 5) -> DeepReLU:
        """A classifier of flattened 28 x 28 images into 10 classes."""
        return cls(28 * 28, hidden_dim, 10, depth=depth)

    def init_kaiming_uniform_(self, seed: int = 42) -> None:
        """Each Linear's weight uniform in ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]``, drawn in
        layer order from a CPU generator seeded with ``seed``: the same weights whatever
        the device the model is on."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    bound = m.in_features ** -0.5
                    m.weight.copy_(torch.empty(m.weight.shape, dtype=m.weight.dtype).uniform_(-bound, bound, generator=g))


def _from_config(cls: type, config: Any, renames: dict[str, tuple[str, ...]]) -> Any:
    """A dataclass ``cls`` from an HF config object: each field from the first of its
    HF attribute names (``renames``, else its own name) that the config has set."""
    values = {}
    for f in fields(cls):
        for attr in renames.get(f.name, (f.name,)):
            v = getattr(config, attr, None)
            if v is not None:
                values[f.name] = v
                break
    return cls(**values)


class Attention(nn.Module):
    """Causal self-attention: projections to the ``[batch, seq, head_size, heads]`` layout,
    optional rotary embedding of q and k, ``sdpa``, output projection."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, head_size: int, bias: bool, out_bias: bool,
                 scale: float | None = None) -> None:
        super().__init__()
        if n_heads % n_kv_heads:
            raise ValueError(f"{n_heads} attention heads do not split into groups of {n_kv_heads} key/value heads")
        self.n_heads, self.n_kv_heads, self.head_size = n_heads, n_kv_heads, head_size
        self.q = Linear(dim, n_heads * head_size, bias=bias)
        self.k = Linear(dim, n_kv_heads * head_size, bias=bias)
        self.v = Linear(dim, n_kv_heads * head_size, bias=bias)
        self.o = Linear(n_heads * head_size, dim, bias=out_bias)
        self.sdpa = SDPA(is_causal=True, scale=scale)

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Causal self-attention of the sequence ``x`` over itself.

        The q, k and v projections reshape for free to ``[batch, seq, head_size, heads]``
        (our head layout), so no transpose is recorded before ``sdpa``.

        Args:
            x: hidden states ``[batch, seq, dim]``.
            rotary: ``(cos, sin)`` of a rotary embedding (``[seq, head_size]`` each, as
                ``Llama.rotary`` gives them) applied to q and k; None (GPT-2): none.

        Returns:
            The output projection of the attention, ``[batch, seq, dim]``.
        """
        b, s = x.shape[0], x.shape[1]
        q = self.q(x).view(b, s, self.head_size, self.n_heads)
        k = self.k(x).view(b, s, self.head_size, self.n_kv_heads)
        v = self.v(x).view(b, s, self.head_size, self.n_kv_heads)
        if rotary is not None:
            cos, sin = rotary
            q, k = (F.rope(sin, cos, t, layout="projection") for t in (q, k))
        return self.o(self.sdpa(q, k, v).reshape(b, s, self.n_heads * self.head_size))


# -- GPT-2 ---------------------------------------------------------------------

_ACTIVATIONS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "none"}


@dataclass
class GPT2Config:
    """The shape of a ``GPT2`` model, with the field names and defaults (GPT-2 small) of
    HF's ``GPT2Config``. HF's fields for what the model does not do (dropout, caches)
    are not kept.

    Attributes:
        n_inner: width of the MLP; None: ``4 * n_embd``.
        activation_function: ``"gelu_new"``, ``"gelu_pytorch_tanh"`` or ``"gelu_fast"``
            (the tanh approximation) or ``"gelu"`` (exact); others raise when the model
            is built.
        scale_attn_weights: scale attention scores by ``1 / sqrt(head_size)``.
        scale_attn_by_inverse_layer_idx: also divide them by the layer's index plus one.
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

    @classmethod
    def from_hf(cls, config: Any) -> GPT2Config:
        """The config of an HF GPT-2 model (``model.config``), read field by field by
        name; fields it lacks or leaves None keep their defaults. ``transformers`` need
        not be imported here: any object with those attributes works."""
        return _from_config(cls, config, {})


class GPT2Block(nn.Module):
    def __init__(self, c: GPT2Config, layer: int) -> None:
        super().__init__()
        if c.activation_function not in _ACTIVATIONS:
            raise ValueError(f"GPT2: activation {c.activation_function!r} is not one of {sorted(_ACTIVATIONS)}")
        head_size = c.n_embd // c.n_head
        scale = 1 / math.sqrt(head_size) if c.scale_attn_weights else 1.0
        if c.scale_attn_by_inverse_layer_idx:
            scale /= layer + 1
        inner = c.n_inner or 4 * c.n_embd
        self.ln_1 = LayerNorm(c.n_embd, eps=c.layer_norm_epsilon)
        self.attn = Attention(c.n_embd, c.n_head, c.n_head, head_size, bias=True, out_bias=True, scale=scale)
        self.ln_2 = LayerNorm(c.n_embd, eps=c.layer_norm_epsilon)
        self.mlp = nn.Sequential()
        self.mlp.add_module("fc", Linear(c.n_embd, inner))
        self.mlp.add_module("act", GELU(approximate=_ACTIVATIONS[c.activation_function]))
        self.mlp.add_module("proj", Linear(inner, c.n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """GPT-2 with its LM head (tied to the token embedding): ``forward(ids [batch, seq])``
    returns logits ``[batch, seq, vocab]``."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError(f"GPT2: n_embd {config.n_embd} is not a multiple of n_head {config.n_head}")
        self.config = config
        self.wte = Embedding(config.vocab_size, config.n_embd)
        self.wpe = Embedding(config.n_positions, config.n_embd)
        self.blocks = nn.ModuleList(GPT2Block(config, i) for i in range(config.n_layer))
        self.ln_f = LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits of the next token at each position, attending causally.

        Args:
            ids: token ids ``[batch, seq]``, with ``seq`` at most ``n_positions``.

        Returns:
            Logits ``[batch, seq, vocab_size]`` (no dropout, cache or padding mask).

        Raises:
            ValueError: the sequence is longer than ``n_positions``.
        """
        s = ids.shape[-1]
        if s > self.config.n_positions:
            raise ValueError(f"GPT2: sequence of {s} tokens is longer than n_positions {self.config.n_positions}")
        x = self.wte(ids) + self.wpe(torch.arange(s, device=ids.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)

    @classmethod
    def from_hf(cls, model: nn.Module) -> GPT2:
        """Our GPT-2 with the weights of an HF ``GPT2LMHeadModel`` (copied, on its device)."""
        ours = cls(GPT2Config.from_hf(model.config)).to(next(model.parameters()).device)
        ours.load_hf_state_dict(model.state_dict())
        return ours

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Load the weights of an HF GPT-2 into this model.

        Converts HF's names, its fused and transposed ``Conv1D`` attention weights and
        its head order to ours (``weight_layout.gpt2_from_hf``), then loads them with
        ``load_state_dict`` (strict: every parameter of ours must be there).

        Args:
            sd: a ``GPT2LMHeadModel`` state dict, or a ``GPT2Model``'s (without the
                ``transformer.`` prefix); ``lm_head.weight`` is ignored, as our head is
                tied to ``wte``. Its config must match this model's.
        """
        self.load_state_dict(weight_layout.gpt2_from_hf(sd, self.config.n_head))

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights as ``GPT2LMHeadModel.load_state_dict`` takes them."""
        return weight_layout.gpt2_to_hf(self.state_dict(), self.config.n_head)


# -- Llama ---------------------------------------------------------------------


@dataclass
class LlamaConfig:
    """The shape of a ``Llama`` model, with the field names and defaults (Llama 7B's) of
    HF's ``LlamaConfig``. Only the default rotary embedding and the SiLU MLP are
    supported.

    Attributes:
        num_key_value_heads: key/value heads (grouped-query attention); None: as many as
            ``num_attention_heads``.
        head_dim: size of a head; None: ``hidden_size // num_attention_heads``.
        rope_theta: base of the rotary embedding's frequencies.
        tie_word_embeddings: the LM head reuses the token embedding (no ``lm_head``).
        attention_bias: biases on the q, k, v and output projections.
        mlp_bias: biases on the MLP's projections.
        hidden_act: must be ``"silu"``; others raise when the model is built.
    """

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"

    @classmethod
    def from_hf(cls, config: Any) -> LlamaConfig:
        """The config of an HF Llama model (``model.config``), read field by field by
        name; fields it lacks or leaves None keep their defaults. ``rope_theta`` is also
        read from ``rope_parameters`` / ``rope_scaling`` (newer ``transformers`` keep it there).

        Raises:
            ValueError: the config asks for a rope type other than the default (scaled
                variants such as Llama 3's are not supported).
        """
        c = _from_config(cls, config, {})
        rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"Llama: rope type {rope['rope_type']!r} is not supported (only the default)")
        if "rope_theta" in rope:
            c.rope_theta = float(rope["rope_theta"])
        return c


class LlamaBlock(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        if c.hidden_act != "silu":
            raise ValueError(f"Llama: activation {c.hidden_act!r} is not supported (only silu)")
        head_size = c.head_dim or c.hidden_size // c.num_attention_heads
        self.attn_norm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.attn = Attention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads or c.num_attention_heads,
                              head_size, bias=c.attention_bias, out_bias=c.attention_bias, scale=head_size ** -0.5)
        self.mlp_norm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.mlp = nn.Module()
        self.mlp.gate = Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.mlp.up = Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.mlp.down = Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)
        self.mlp.act = SiLU()

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rotary)
        h = self.mlp_norm(x)
        return x + self.mlp.down(self.mlp.act(self.mlp.gate(h)) * self.mlp.up(h))


class Llama(nn.Module):
    """Llama causal LM: ``forward(ids [batch, seq])`` returns logits ``[batch, seq, vocab]``."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.head_size = config.head_dim or config.hidden_size // config.num_attention_heads
        self.embed = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaBlock(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = None if config.tie_word_embeddings else Linear(config.hidden_size, config.vocab_size, bias=False)
        self._rotary: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def rotary(self, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[seq, head_size]`` of the default rotary embedding, computed on the
        CPU as HF computes them (kept per length and device: constants of the model)."""
        key = (seq, torch.device(device))
        if key not in self._rotary:
            d = self.head_size
            inv_freq = 1.0 / (self.config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
            freqs = torch.arange(seq).float()[:, None] * inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            self._rotary[key] = (emb.cos().to(device), emb.sin().to(device))
        return self._rotary[key]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits of the next token at each position, attending causally.

        The rotary embedding's cos and sin for this length are computed once on the CPU
        and kept (see ``rotary``).

        Args:
            ids: token ids ``[batch, seq]``.

        Returns:
            Logits ``[batch, seq, vocab_size]`` (no cache or padding mask).
        """
        rotary = self.rotary(ids.shape[-1], ids.device)
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, rotary)
        x = self.norm(x)
        return F.linear(x, self.embed.weight if self.lm_head is None else self.lm_head.weight)

    @classmethod
    def from_hf(cls, model: nn.Module) -> Llama:
        """Our Llama with the weights of an HF ``LlamaForCausalLM`` (copied, on its device)."""
        ours = cls(LlamaConfig.from_hf(model.config)).to(next(model.parameters()).device)
        ours.load_hf_state_dict(model.state_dict())
        return ours

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Load the weights of an HF Llama into this model.

        Converts HF's names and head order to ours (``weight_layout.llama_from_hf``),
        then loads them with ``load_state_dict`` (strict: every parameter of ours must
        be there).

        Args:
            sd: a ``LlamaForCausalLM`` state dict. With tied embeddings its
                ``lm_head.weight`` is ignored; otherwise it is required. Its config must
                match this model's.
        """
        c = self.config
        ours = weight_layout.llama_from_hf(sd, c.num_attention_heads, c.num_key_value_heads)
        if self.lm_head is None:
            ours.pop("lm_head.weight", None)
        self.load_state_dict(ours)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights as ``LlamaForCausalLM.load_state_dict`` takes them."""
        c = self.config
        sd = weight_layout.llama_to_hf(self.state_dict(), c.num_attention_heads, c.num_key_value_heads)
        if self.lm_head is None:
            sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
        return sd


__all__ = ["DeepReLU", "GPT2", "GPT2Config", "Llama", "LlamaConfig", "Attention"]
