"""DiT: the class-conditional diffusion transformer with AdaLN-Zero blocks, as diffusers'
``DiTTransformer2DModel`` computes it, with the published torch_nntile's module and
parameter names.

The model works on patch tokens ``[batch, n_patches, in_channels * p * p]`` and returns
tokens ``[batch, n_patches, p * p * out_channels]``: turning images into tokens and back
(``patchify_nchw``, ``unpatchify_nchw``) is a layout change done on the host, since
nntile has no convolution (the patch convolution of diffusers is a Linear on patches).
The Fourier features of integer timesteps are a frozen table looked up like an
embedding, the 2D sin/cos positions a frozen parameter, and the affine-free layer norms
carry frozen unit weights and zero biases; each fused modulation Linear of diffusers is
kept as separate ``Linear(H, H)`` layers, one per chunk.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torch_nntile.add_fiber import add_fiber
from torch_nntile.nn.attention import attention
from torch_nntile.nn.linear import NntileAttentionOutput, NntileLinear, NntileQKVProjection
from torch_nntile.nn.model.common import cfg, merge_heads, project_heads
from torch_nntile.nn.module import GELU, Embedding, LayerNorm, SiLU

_TIMESTEP_FREQ_DIM = 256  # width of the Fourier features of a timestep (diffusers' DiT)
_ADA_EPS = 1e-6  # diffusers' AdaLayerNormZero and output norm use this, whatever norm_eps is
_ADA_MOD_NAMES = ("shift_msa", "scale_msa", "gate_msa", "shift_mlp", "scale_mlp", "gate_mlp")
_ACTIVATIONS = {"gelu-approximate": "tanh", "gelu": "none"}


def timestep_embedding_table(num_embeds: int, dim: int = _TIMESTEP_FREQ_DIM, *, flip_sin_to_cos: bool = True,
                             downscale_freq_shift: float = 1.0, max_period: int = 10000) -> torch.Tensor:
    """Fourier features ``[num_embeds, dim]`` of the timesteps ``0 .. num_embeds - 1``, as
    diffusers' ``get_timestep_embedding``: row ``t`` is ``[cos(t f), sin(t f)]`` (``[sin,
    cos]`` without ``flip_sin_to_cos``), ``f_i = max_period ** (-i / (dim / 2 -
    downscale_freq_shift))``, zero-padded to an odd ``dim``.

    Args:
        num_embeds: how many timesteps.
        dim: the feature width.
        flip_sin_to_cos: cosines first.
        downscale_freq_shift: subtracted from ``dim / 2`` in the frequency exponent.
        max_period: the longest period.
    """
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / (half - downscale_freq_shift))
    args = torch.arange(num_embeds, dtype=torch.float32)[:, None] * freqs[None, :]
    sin, cos = torch.sin(args), torch.cos(args)
    emb = torch.cat([cos, sin] if flip_sin_to_cos else [sin, cos], dim=-1)
    return nn.functional.pad(emb, (0, 1)) if dim % 2 else emb


def _sincos_1d(dim: int, pos: torch.Tensor) -> torch.Tensor:
    omega = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) / (dim / 2))
    out = pos.reshape(-1, 1).double() * omega[None, :]
    return torch.cat([torch.sin(out), torch.cos(out)], dim=1)


def sincos_2d_pos_embed(embed_dim: int, grid_size: int) -> torch.Tensor:
    """The 2D sin/cos positions ``[grid_size ** 2, embed_dim]`` of diffusers' (and MAE's)
    ``get_2d_sincos_pos_embed``: patches row by row, the first half of the features
    encoding the column, the second the row.

    Args:
        embed_dim: the feature width, a multiple of 4.
        grid_size: patches per side.
    """
    if embed_dim % 4:
        raise ValueError(f"sincos_2d_pos_embed: embed_dim must be a multiple of 4, got {embed_dim}")
    rows, cols = torch.meshgrid(torch.arange(grid_size), torch.arange(grid_size), indexing="ij")
    return torch.cat([_sincos_1d(embed_dim // 2, cols), _sincos_1d(embed_dim // 2, rows)], dim=1).float()


def _grid(images: torch.Tensor, patch_size: int, what: str) -> tuple[int, int, int, int]:
    if images.dim() != 4:
        raise ValueError(f"{what}: expects NCHW images, got shape {list(images.shape)}")
    b, c, h, w = images.shape
    if h % patch_size or w % patch_size:
        raise ValueError(f"{what}: height {h} and width {w} must be multiples of patch_size {patch_size}")
    return b, c, h // patch_size, w // patch_size


def patchify_nchw(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Images ``[B, C, H, W]`` to tokens ``[B, (H/p) (W/p), C p p]``, patches row by row,
    features channel-major: what diffusers' patch convolution reads (its weight
    ``[hidden, C, p, p]`` flattened is the patch Linear's).

    Args:
        images: the images.
        patch_size: ``p``.
    """
    b, c, gh, gw = _grid(images, patch_size, "patchify_nchw")
    p = patch_size
    return images.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c * p * p)


def unpatchify_nchw(tokens: torch.Tensor, *, patch_size: int, out_channels: int, grid_h: int,
                    grid_w: int) -> torch.Tensor:
    """The model's output tokens ``[B, grid_h grid_w, p p C]`` (features ``(p, p, C)``,
    as diffusers' unpatchify reads them) to images ``[B, C, grid_h p, grid_w p]``.

    Args:
        tokens: the tokens.
        patch_size: ``p``.
        out_channels: ``C``.
        grid_h: patches per column.
        grid_w: patches per row.
    """
    p = patch_size
    x = tokens.reshape(tokens.shape[0], grid_h, grid_w, p, p, out_channels)
    return x.permute(0, 5, 1, 3, 2, 4).reshape(tokens.shape[0], out_channels, grid_h * p, grid_w * p)


def nchw_to_unpatchify_tokens(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """The inverse of ``unpatchify_nchw``: images to tokens with features ``(p, p, C)``
    (e.g. to bring a gradient of the images back to the output tokens).

    Args:
        images: ``[B, C, H, W]``.
        patch_size: ``p``.
    """
    b, c, gh, gw = _grid(images, patch_size, "nchw_to_unpatchify_tokens")
    p = patch_size
    return images.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 3, 5, 1).reshape(b, gh * gw, p * p * c)


@dataclass
class DiTConfig:
    """DiT's sizes, with diffusers' ``DiTTransformer2DModel`` argument names.

    Args:
        sample_size: image height and width.
        patch_size: patch side.
        in_channels: image channels.
        out_channels: output channels (None: ``in_channels``).
        num_layers: transformer blocks.
        num_attention_heads: heads.
        attention_head_dim: features per head.
        attention_bias: q, k and v have biases.
        activation_fn: ``"gelu-approximate"`` (tanh) or ``"gelu"``.
        num_embeds_ada_norm: classes (and timesteps the table covers).
        norm_eps: epsilon of the norm before the MLP.
        mlp_ratio: MLP width over hidden size.
        norm_elementwise_affine: the norm before the MLP has a trainable scale and shift.
        attention_out_bias: the attention's output projection has a bias (diffusers: always).
        use_cfg_embedding: the class table has one more row, the null class of
            classifier-free guidance (diffusers' DiT has it).
    """

    sample_size: int = 16
    patch_size: int = 2
    in_channels: int = 3
    out_channels: int | None = None
    num_layers: int = 2
    num_attention_heads: int = 2
    attention_head_dim: int = 8
    attention_bias: bool = True
    activation_fn: str = "gelu-approximate"
    num_embeds_ada_norm: int = 1000
    norm_eps: float = 1e-5
    mlp_ratio: float = 4.0
    norm_elementwise_affine: bool = False
    attention_out_bias: bool = True
    use_cfg_embedding: bool = False

    @property
    def hidden_size(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.patch_size * self.patch_size

    @property
    def grid_size(self) -> int:
        return self.sample_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid_size * self.grid_size

    @property
    def output_channels(self) -> int:
        return self.in_channels if self.out_channels is None else self.out_channels

    def validate(self) -> None:
        """Raise ValueError on sizes the model cannot have."""
        for name in ("sample_size", "patch_size", "in_channels", "num_layers", "num_attention_heads",
                     "attention_head_dim", "num_embeds_ada_norm"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"DiTConfig: {name} must be a positive integer, got {value!r}")
        if self.out_channels is not None and self.out_channels < 1:
            raise ValueError(f"DiTConfig: out_channels must be positive, got {self.out_channels}")
        if self.sample_size % self.patch_size:
            raise ValueError(f"DiTConfig: sample_size {self.sample_size} must be a multiple of patch_size "
                             f"{self.patch_size}")
        if self.activation_fn not in _ACTIVATIONS:
            raise ValueError(f"DiTConfig: activation_fn must be one of {sorted(_ACTIVATIONS)}, got {self.activation_fn!r}")
        if self.hidden_size % 4:
            raise ValueError(f"DiTConfig: hidden size {self.hidden_size} (heads x head dim) must be a multiple of 4 "
                             "for the 2D sin/cos positions")


def as_dit_config(config: Any) -> DiTConfig:
    """A checked ``DiTConfig`` from ours or any object with its attribute names (diffusers'
    config among them, whose ``norm_type`` must then be ``ada_norm_zero``).

    Args:
        config: the config.
    """
    norm_type = getattr(config, "norm_type", "ada_norm_zero")
    if norm_type != "ada_norm_zero":
        raise ValueError(f"DiT: only norm_type 'ada_norm_zero' is supported, got {norm_type!r}")
    if not isinstance(config, DiTConfig):
        config = DiTConfig(**{f.name: cfg(config, f.name, f.default) for f in dataclasses.fields(DiTConfig)})
    config.validate()
    return config


def _frozen_layer_norm(size: int, eps: float, affine: bool = False) -> LayerNorm:
    """A LayerNorm; without ``affine`` its unit weight and zero bias are frozen (an
    affine-free norm with the parameters the published torch_nntile's has)."""
    norm = LayerNorm(size, eps=eps)
    if not affine:
        norm.weight.requires_grad_(False)
        norm.bias.requires_grad_(False)
    return norm


def _modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``x * (1 + scale) + shift`` per batch item: ``x`` ``[B, T, H]``, the others ``[B, H]``."""
    return add_fiber(shift, x + x * scale.unsqueeze(1), axis=2, batch_ndim=1)


def _gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``gate[:, None] * x``."""
    return x * gate.unsqueeze(1)


class CombinedTimestepLabelEmbeddings(nn.Module):
    """The conditioning: an MLP of the timestep's Fourier features plus the class's embedding.

    Args:
        num_classes: classes, and the timesteps the frozen Fourier table covers.
        embedding_dim: the hidden size.
        use_cfg_embedding: one more class row (the null class).
    """

    def __init__(self, num_classes: int, embedding_dim: int, *, use_cfg_embedding: bool = False) -> None:
        super().__init__()
        self.time_freq = Embedding(num_classes, _TIMESTEP_FREQ_DIM)
        with torch.no_grad():
            self.time_freq.weight.copy_(timestep_embedding_table(num_classes))
        self.time_freq.weight.requires_grad_(False)
        self.time_linear_1 = NntileLinear(_TIMESTEP_FREQ_DIM, embedding_dim)
        self.time_act = SiLU()
        self.time_linear_2 = NntileLinear(embedding_dim, embedding_dim)
        self.class_embed = Embedding(num_classes + int(use_cfg_embedding), embedding_dim)

    def forward(self, timestep: torch.Tensor, class_labels: torch.Tensor) -> torch.Tensor:
        t = self.time_linear_2(self.time_act(self.time_linear_1(self.time_freq(timestep))))
        return t + self.class_embed(class_labels)


class AdaLayerNormZero(nn.Module):
    """Affine-free norm of the block's input modulated by the conditioning; also returns
    the gates and the MLP's modulation.

    Args:
        hidden_size: the hidden size.
        num_embeds: classes (and timesteps).
        use_cfg_embedding: the class table has the null class row.
    """

    def __init__(self, hidden_size: int, num_embeds: int, *, use_cfg_embedding: bool = False) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.emb = CombinedTimestepLabelEmbeddings(num_embeds, hidden_size, use_cfg_embedding=use_cfg_embedding)
        self.silu = SiLU()
        for name in _ADA_MOD_NAMES:
            setattr(self, name, NntileLinear(hidden_size, hidden_size))
        self.norm = _frozen_layer_norm(hidden_size, _ADA_EPS)

    def forward(self, x: torch.Tensor, timestep: torch.Tensor,
                class_labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(modulated x, gate_msa, shift_mlp, scale_mlp, gate_mlp)``."""
        cond = self.silu(self.emb(timestep, class_labels))
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (getattr(self, n)(cond) for n in _ADA_MOD_NAMES)
        return _modulate(self.norm(x), scale_msa, shift_msa), gate_msa, shift_mlp, scale_mlp, gate_mlp


class DiTAttention(nn.Module):
    """Unmasked self-attention; weights in the projection layout (q, k, v ``[hidden,
    head_size, heads]``, output ``[head_size, heads, hidden]``).

    Args:
        config: a ``DiTConfig``.
    """

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        h, d, n, b = config.hidden_size, config.attention_head_dim, config.num_attention_heads, config.attention_bias
        self.query = NntileQKVProjection(h, d, n, bias=b)
        self.key = NntileQKVProjection(h, d, n, bias=b)
        self.value = NntileQKVProjection(h, d, n, bias=b)
        self.out = NntileAttentionOutput(d, n, h, bias=config.attention_out_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (project_heads(x, m.weight, m.bias) for m in (self.query, self.key, self.value))
        return merge_heads(attention(q, k, v), self.out.weight, self.out.bias)


class DiTMlp(nn.Module):
    """``hidden -> mlp_ratio * hidden -> hidden`` with GELU.

    Args:
        config: a ``DiTConfig``.
    """

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        inner = int(hidden * config.mlp_ratio)
        self.fc1 = NntileLinear(hidden, inner)
        self.act = GELU(approximate=_ACTIVATIONS[config.activation_fn])
        self.fc2 = NntileLinear(inner, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class DiTBlock(nn.Module):
    """AdaLN-Zero block: modulated attention and modulated MLP, each gated into the residual.

    Args:
        config: a ``DiTConfig``.
    """

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.norm1 = AdaLayerNormZero(config.hidden_size, config.num_embeds_ada_norm,
                                      use_cfg_embedding=config.use_cfg_embedding)
        self.attn = DiTAttention(config)
        self.norm2 = _frozen_layer_norm(config.hidden_size, config.norm_eps, config.norm_elementwise_affine)
        self.mlp = DiTMlp(config)

    def forward(self, x: torch.Tensor, timestep: torch.Tensor, class_labels: torch.Tensor) -> torch.Tensor:
        h, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(x, timestep, class_labels)
        x = x + _gate(self.attn(h), gate_msa)
        return x + _gate(self.mlp(_modulate(self.norm2(x), scale_mlp, shift_mlp)), gate_mlp)


class DiT(nn.Module):
    """Class-conditional AdaLN-Zero diffusion transformer over patch tokens.

    Args:
        config: a ``DiTConfig`` or any object with its attribute names.
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        config = as_dit_config(config)
        self.config = config
        hidden = config.hidden_size
        self.out_channels = config.output_channels
        self.patch_embed = NntileLinear(config.patch_dim, hidden)
        self.pos_embed = nn.Parameter(sincos_2d_pos_embed(hidden, config.grid_size), requires_grad=False)
        self.blocks = nn.ModuleList(DiTBlock(config) for _ in range(config.num_layers))
        self.norm_out = _frozen_layer_norm(hidden, _ADA_EPS)
        self.proj_out_shift = NntileLinear(hidden, hidden)
        self.proj_out_scale = NntileLinear(hidden, hidden)
        self.proj_out_silu = SiLU()
        self.proj_out_2 = NntileLinear(hidden, config.patch_size ** 2 * self.out_channels)

    def _check(self, x: torch.Tensor, timestep: torch.Tensor, class_labels: torch.Tensor) -> torch.Tensor:
        c = self.config
        if x.dim() == 4:
            if x.device.type == "nntile":
                raise ValueError("DiT: patchify NCHW images on the host (patchify_nchw), then move the tokens to "
                                 "nntile: there is no patch convolution on nntile")
            x = patchify_nchw(x, c.patch_size)
        if x.device != self.pos_embed.device:
            raise ValueError(f"DiT: the tokens are on {x.device}, the model on {self.pos_embed.device}")
        if x.dim() != 3 or tuple(x.shape[1:]) != (c.num_patches, c.patch_dim):
            raise ValueError(f"DiT: tokens must be [batch, {c.num_patches}, {c.patch_dim}], got {list(x.shape)}")
        for name, t in (("timestep", timestep), ("class_labels", class_labels)):
            if t.dim() != 1 or t.shape[0] != x.shape[0] or t.dtype.is_floating_point:
                raise ValueError(f"DiT: {name} must be integers of shape [{x.shape[0]}], got {t.dtype} of shape "
                                 f"{list(t.shape)}")
        return x

    def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor, class_labels: torch.Tensor) -> torch.Tensor:
        """Predicted tokens ``[B, T, p p out_channels]`` (``unpatchify_nchw`` makes images).

        Args:
            hidden_states: tokens ``[B, T, C p p]`` (``patchify_nchw``), or NCHW images on the CPU.
            timestep: integer timesteps ``[B]``, below ``num_embeds_ada_norm``.
            class_labels: integer classes ``[B]``.
        """
        x = self._check(hidden_states, timestep, class_labels)
        x = self.patch_embed(x) + self.pos_embed
        for block in self.blocks:
            x = block(x, timestep, class_labels)
        cond = self.proj_out_silu(self.blocks[0].norm1.emb(timestep, class_labels))
        x = _modulate(self.norm_out(x), self.proj_out_scale(cond), self.proj_out_shift(cond))
        return self.proj_out_2(x)


__all__ = ["AdaLayerNormZero", "CombinedTimestepLabelEmbeddings", "DiT", "DiTAttention", "DiTBlock", "DiTConfig",
           "DiTMlp", "as_dit_config", "nchw_to_unpatchify_tokens", "patchify_nchw", "sincos_2d_pos_embed",
           "timestep_embedding_table", "unpatchify_nchw"]
