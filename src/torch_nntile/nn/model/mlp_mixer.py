"""MLP-Mixer: a classifier over patch tokens that mixes along the patch axis and along
the feature axis with bias-free two-layer GELU MLPs, as the published torch_nntile's.

Tokens are ``[n_patches, batch, patch_dim]`` (``channel_dim`` is the number of
patches), so token mixing is a product with a weight on the leading axis
(``gemm(W, x)``) and channel mixing one on the last axis: neither needs the transposes
a stock ``nn.Linear`` would. ``MlpMixerCpu`` is the plain PyTorch model with the same
math (``nn.Linear`` after a transpose), the reference the tests compare against;
``copy_cpu_weights_to_nntile`` and ``copy_nntile_weights_to_cpu`` move weights between
the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torch_nntile.gemm import gemm
from torch_nntile.nn.functional import add, gelu
from torch_nntile.nn.model.common import cfg
from torch_nntile.nn.module import LayerNorm

_EXPANSION = 4  # each MLP's hidden width is 4 times its input


@dataclass
class MlpMixerConfig:
    """The Mixer's sizes.

    Args:
        channel_dim: patches per image (the axis token mixing runs along).
        init_patch_dim: features of an input patch.
        projected_patch_dim: features after the stem (the axis channel mixing runs along).
        num_mixer_layers: mixer blocks.
        n_classes: classifier outputs.
        layer_norm_epsilon: the layer norms' epsilon.
    """

    channel_dim: int = 8
    init_patch_dim: int = 4
    projected_patch_dim: int = 4
    num_mixer_layers: int = 2
    n_classes: int = 3
    layer_norm_epsilon: float = 1e-5


def _sizes(config: Any) -> dict[str, Any]:
    """The config's fields (defaults where absent), checked."""
    d = MlpMixerConfig()
    sizes = {name: cfg(config, name, getattr(d, name)) for name in
             ("channel_dim", "init_patch_dim", "projected_patch_dim", "num_mixer_layers", "n_classes",
              "layer_norm_epsilon")}
    for name, value in sizes.items():
        if name != "layer_norm_epsilon" and (not isinstance(value, int) or value < 1):
            raise ValueError(f"MlpMixer: {name} must be a positive integer, got {value!r}")
    return sizes


def _kaiming_(w: torch.Tensor) -> None:
    """``nn.Linear``'s default weight initialisation."""
    nn.init.kaiming_uniform_(w, a=math.sqrt(5))


class MixerMlp(nn.Module):
    """Bias-free ``dim -> 4 dim -> dim`` MLP with exact GELU, applied along the last axis
    (``side="L"``, channel mixing) or along the leading axis (``side="R"``, token mixing).

    Args:
        side: ``"L"`` or ``"R"``.
        dim: the length of the axis it mixes.
    """

    def __init__(self, side: str, dim: int) -> None:
        super().__init__()
        if side not in ("L", "R"):
            raise ValueError(f"MixerMlp: side must be 'L' or 'R', got {side!r}")
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"MixerMlp: dim must be a positive integer, got {dim!r}")
        self.side, self.dim = side, dim
        self.fc1_weight = nn.Parameter(torch.empty(_EXPANSION * dim, dim))
        self.fc2_weight = nn.Parameter(torch.empty(dim, _EXPANSION * dim))
        _kaiming_(self.fc1_weight)
        _kaiming_(self.fc2_weight)

    def _apply_weight(self, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        # W [out, in]: on the leading axis W @ x, on the last one x @ W^T.
        return gemm(w, x, ndim=1) if self.side == "R" else gemm(x, w, ndim=1, trans_b=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._apply_weight(self.fc2_weight, gelu(self._apply_weight(self.fc1_weight, x)))

    def extra_repr(self) -> str:
        return f"side={self.side!r}, dim={self.dim}"


class MixerBlock(nn.Module):
    """Pre-norm token mixing then pre-norm channel mixing, each with a residual.

    Args:
        channel_dim: patches per image.
        patch_dim: features per patch.
        eps: the layer norms' epsilon.
    """

    def __init__(self, channel_dim: int, patch_dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm_1 = LayerNorm(patch_dim, eps=eps)
        self.mlp_1 = MixerMlp("R", channel_dim)
        self.norm_2 = LayerNorm(patch_dim, eps=eps)
        self.mlp_2 = MixerMlp("L", patch_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = add(self.mlp_1(self.norm_1(x)), x)
        return add(self.mlp_2(self.norm_2(y)), y)


class MlpMixer(nn.Module):
    """MLP-Mixer classifier: bias-free stem, mixer blocks, mean over patches, bias-free
    classifier. Input ``[channel_dim, batch, init_patch_dim]``, output ``[batch, n_classes]``.

    Args:
        config: an ``MlpMixerConfig`` or any object with its attribute names.
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        s = _sizes(config)
        self.config = config
        self.stem_weight = nn.Parameter(torch.empty(s["projected_patch_dim"], s["init_patch_dim"]))
        self.blocks = nn.ModuleList(
            MixerBlock(s["channel_dim"], s["projected_patch_dim"], s["layer_norm_epsilon"])
            for _ in range(s["num_mixer_layers"]))
        self.classifier_weight = nn.Parameter(torch.empty(s["n_classes"], s["projected_patch_dim"]))
        _kaiming_(self.stem_weight)
        _kaiming_(self.classifier_weight)
        self._sizes = s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self._sizes
        want = (s["channel_dim"], s["init_patch_dim"])
        if x.dim() != 3 or (x.shape[0], x.shape[2]) != want:
            raise ValueError(f"MlpMixer: input must be [channel_dim={want[0]}, batch, init_patch_dim={want[1]}], "
                             f"got {list(x.shape)}")
        h = gemm(x, self.stem_weight, ndim=1, trans_b=True)
        for block in self.blocks:
            h = block(h)
        return gemm(h.mean(dim=0), self.classifier_weight, ndim=1, trans_b=True)


class _CpuMixerMlp(nn.Module):
    """``MixerMlp`` as stock layers: ``nn.Linear`` on the last axis, after swapping the
    leading axis there for token mixing."""

    def __init__(self, side: str, dim: int) -> None:
        super().__init__()
        self.side = side
        self.fn = nn.Sequential(nn.Linear(dim, _EXPANSION * dim, bias=False), nn.GELU(),
                                nn.Linear(_EXPANSION * dim, dim, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.side == "L":
            return self.fn(x)
        return self.fn(x.transpose(0, 2)).transpose(0, 2)


class _CpuMixer(nn.Module):
    def __init__(self, channel_dim: int, patch_dim: int, eps: float) -> None:
        super().__init__()
        self.norm_1 = nn.LayerNorm(patch_dim, eps=eps)
        self.mlp_1 = _CpuMixerMlp("R", channel_dim)
        self.norm_2 = nn.LayerNorm(patch_dim, eps=eps)
        self.mlp_2 = _CpuMixerMlp("L", patch_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.mlp_1(self.norm_1(x)) + x
        return self.mlp_2(self.norm_2(y)) + y


class MlpMixerCpu(nn.Module):
    """The same model in stock PyTorch layers (the published torch_nntile's CPU
    reference, with its parameter names: ``mixer_sequence.0`` is the stem,
    ``mixer_sequence.{i + 1}`` block ``i``, ``classification`` the classifier).

    Args:
        config: an ``MlpMixerConfig`` or any object with its attribute names.
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        s = _sizes(config)
        self.config = config
        self.mixer_sequence = nn.Sequential(
            nn.Linear(s["init_patch_dim"], s["projected_patch_dim"], bias=False),
            *(_CpuMixer(s["channel_dim"], s["projected_patch_dim"], s["layer_norm_epsilon"])
              for _ in range(s["num_mixer_layers"])))
        self.classification = nn.Linear(s["projected_patch_dim"], s["n_classes"], bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classification(self.mixer_sequence(x).mean(dim=0))


def _pairs(cpu: MlpMixerCpu, nnt: MlpMixer) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(CPU model's parameter, ours) for every parameter."""
    if len(cpu.mixer_sequence) - 1 != len(nnt.blocks):
        raise ValueError(f"MlpMixer: the models have {len(cpu.mixer_sequence) - 1} and {len(nnt.blocks)} blocks")
    pairs = [(cpu.mixer_sequence[0].weight, nnt.stem_weight), (cpu.classification.weight, nnt.classifier_weight)]
    for src, dst in zip(list(cpu.mixer_sequence)[1:], nnt.blocks):
        for norm in ("norm_1", "norm_2"):
            pairs += [(getattr(src, norm).weight, getattr(dst, norm).weight),
                      (getattr(src, norm).bias, getattr(dst, norm).bias)]
        for mlp in ("mlp_1", "mlp_2"):
            pairs += [(getattr(src, mlp).fn[0].weight, getattr(dst, mlp).fc1_weight),
                      (getattr(src, mlp).fn[2].weight, getattr(dst, mlp).fc2_weight)]
    return pairs


def copy_cpu_weights_to_nntile(cpu: MlpMixerCpu, nnt: MlpMixer) -> None:
    """Copy ``MlpMixerCpu``'s weights into ``MlpMixer`` (on whatever device it is).

    Args:
        cpu: the source.
        nnt: the destination.
    """
    with torch.no_grad():
        for src, dst in _pairs(cpu, nnt):
            dst.copy_(src.detach().to(dst.device))


def copy_nntile_weights_to_cpu(nnt: MlpMixer, cpu: MlpMixerCpu) -> None:
    """Copy ``MlpMixer``'s weights back into ``MlpMixerCpu`` (the inverse of
    ``copy_cpu_weights_to_nntile``).

    Args:
        nnt: the source.
        cpu: the destination.
    """
    with torch.no_grad():
        for dst, src in _pairs(cpu, nnt):
            dst.copy_(src.detach().to(dst.device))


__all__ = ["MixerBlock", "MixerMlp", "MlpMixer", "MlpMixerConfig", "MlpMixerCpu", "copy_cpu_weights_to_nntile",
           "copy_nntile_weights_to_cpu"]
