"""Weights between diffusers' ``DiTTransformer2DModel`` and our ``DiT``.

Works on state dicts with diffusers' names, so ``diffusers`` itself is never imported:
``load_hf_into_dit`` reads the model it is given through ``state_dict()`` (and its
``pos_embed.pos_embed`` buffer, which diffusers leaves out of the state dict). The
patch convolution ``[hidden, C, p, p]`` is our patch Linear ``[hidden, C p p]``; the
fused modulation Linears (``norm1.linear``: six chunks, ``proj_out_1``: shift and scale)
are split into ours; q, k, v and the attention output change layout
(``torch_nntile.nn.linear``'s converters). All conversions are exact both ways.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from torch_nntile.nn.linear import (
    linear_to_output_weight,
    linear_to_qkv_bias,
    linear_to_qkv_weight,
    output_to_linear_weight,
    qkv_to_linear_bias,
    qkv_to_linear_weight,
)
from torch_nntile.nn.model.dit import _ADA_MOD_NAMES, DiT, DiTConfig, as_dit_config

StateDict = dict[str, torch.Tensor]
# (HF key, our keys, HF tensor -> ours (one per our key), ours -> HF tensor)
_Rule = tuple[str, tuple[str, ...], Callable[[torch.Tensor], list[torch.Tensor]],
              Callable[[list[torch.Tensor]], torch.Tensor]]

_CLASS_TABLE = "norm1.emb.class_embedder.embedding_table.weight"
_HF_POS = "pos_embed.pos_embed"  # a non-persistent buffer in diffusers


def dit_config_from_hf(hf_config: Any) -> DiTConfig:
    """Our config from diffusers' ``DiTTransformer2DModel.config`` (its class table has the
    null class row, so ours does too).

    Args:
        hf_config: the diffusers config (or any object with its attribute names).
    """
    config = as_dit_config(hf_config)
    return DiTConfig(**{**vars(config), "use_cfg_embedding": True,
                        "norm_elementwise_affine": bool(getattr(hf_config, "norm_elementwise_affine", False))})


def _same(t: torch.Tensor) -> list[torch.Tensor]:
    return [t]


def _one(ts: list[torch.Tensor]) -> torch.Tensor:
    return ts[0]


def _linear(hf: str, ours: str, bias: bool = True) -> list[_Rule]:
    rules: list[_Rule] = [(f"{hf}.weight", (f"{ours}.weight",), _same, _one)]
    return rules + [(f"{hf}.bias", (f"{ours}.bias",), _same, _one)] if bias else rules


def _chunks(hf: str, ours: list[str]) -> list[_Rule]:
    """A fused Linear whose output splits into ``len(ours)`` equal Linears."""
    n = len(ours)
    return [(f"{hf}.{p}", tuple(f"{o}.{p}" for o in ours), lambda t: list(t.chunk(n, dim=0)),
             lambda ts: torch.cat(ts, dim=0)) for p in ("weight", "bias")]


def _rules(c: DiTConfig) -> list[_Rule]:
    """Every HF tensor of the model, with ours and the conversions both ways."""
    n, d, p = c.num_attention_heads, c.attention_head_dim, c.patch_size
    qkv_w = (lambda t: [linear_to_qkv_weight(t, n_heads=n, head_size=d)], lambda ts: qkv_to_linear_weight(ts[0]))
    qkv_b = (lambda t: [linear_to_qkv_bias(t, n_heads=n, head_size=d)], lambda ts: qkv_to_linear_bias(ts[0]))
    out_w = (lambda t: [linear_to_output_weight(t, n_heads=n, head_size=d)], lambda ts: output_to_linear_weight(ts[0]))
    rules: list[_Rule] = [
        ("pos_embed.proj.weight", ("patch_embed.weight",), lambda t: [t.reshape(t.shape[0], -1)],
         lambda ts: ts[0].reshape(ts[0].shape[0], c.in_channels, p, p)),
        ("pos_embed.proj.bias", ("patch_embed.bias",), _same, _one),
    ]
    for i in range(c.num_layers):
        hf, ours = f"transformer_blocks.{i}", f"blocks.{i}"
        rules += _linear(f"{hf}.norm1.emb.timestep_embedder.linear_1", f"{ours}.norm1.emb.time_linear_1")
        rules += _linear(f"{hf}.norm1.emb.timestep_embedder.linear_2", f"{ours}.norm1.emb.time_linear_2")
        rules.append((f"{hf}.{_CLASS_TABLE}", (f"{ours}.norm1.emb.class_embed.weight",), _same, _one))
        rules += _chunks(f"{hf}.norm1.linear", [f"{ours}.norm1.{m}" for m in _ADA_MOD_NAMES])
        for x, name in (("q", "query"), ("k", "key"), ("v", "value")):
            rules.append((f"{hf}.attn1.to_{x}.weight", (f"{ours}.attn.{name}.weight",), *qkv_w))
            if c.attention_bias:
                rules.append((f"{hf}.attn1.to_{x}.bias", (f"{ours}.attn.{name}.bias",), *qkv_b))
        rules.append((f"{hf}.attn1.to_out.0.weight", (f"{ours}.attn.out.weight",), *out_w))
        if c.attention_out_bias:
            rules.append((f"{hf}.attn1.to_out.0.bias", (f"{ours}.attn.out.bias",), _same, _one))
        if c.norm_elementwise_affine:
            rules += _linear(f"{hf}.norm3", f"{ours}.norm2")
        rules += _linear(f"{hf}.ff.net.0.proj", f"{ours}.mlp.fc1") + _linear(f"{hf}.ff.net.2", f"{ours}.mlp.fc2")
    return rules + _chunks("proj_out_1", ["proj_out_shift", "proj_out_scale"]) + _linear("proj_out_2", "proj_out_2")


def hf_to_dit_state_dict(state_dict: Mapping[str, torch.Tensor], config: Any) -> StateDict:
    """diffusers' tensors under our names and layouts (those present; ``pos_embed.pos_embed``
    too, if there). Tensors are taken to the CPU first.

    Args:
        state_dict: tensors with diffusers' names.
        config: ours or diffusers' config.
    """
    c = as_dit_config(config)
    out: StateDict = {}
    for hf, ours, to_ours, _ in _rules(c):
        if hf in state_dict:
            out.update(zip(ours, to_ours(state_dict[hf].detach().cpu())))
    if _HF_POS in state_dict:
        pos = state_dict[_HF_POS].detach().cpu()
        out["pos_embed"] = pos.reshape(pos.shape[-2:])
    return {k: v.contiguous() for k, v in out.items()}


def dit_to_hf_state_dict(local: DiT, state_dict: Mapping[str, torch.Tensor] | None = None) -> StateDict:
    """Our weights (or any tensors under our names, e.g. gradients) under diffusers' names
    and layouts, on the CPU: what ``DiTTransformer2DModel.load_state_dict`` takes. Tensors
    without an HF counterpart (the frozen tables and norms) are left out, and so is an HF
    tensor some of whose parts are missing.

    Args:
        local: the model (for its config).
        state_dict: tensors with our names; None: ``local``'s parameters.
    """
    sd = local.state_dict() if state_dict is None else state_dict
    out: StateDict = {}
    for hf, ours, _, to_hf in _rules(local.config):
        if all(k in sd and sd[k] is not None for k in ours):
            out[hf] = to_hf([sd[k].detach().cpu() for k in ours]).contiguous()
    return out


def load_hf_state_dict_into_dit(local: DiT, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Copy a diffusers state dict into ``local`` (on whatever device it is). The class
    tables may differ by the null class row: the rows both have are copied.

    Args:
        local: the destination.
        state_dict: diffusers' ``DiTTransformer2DModel`` tensors.

    Raises:
        ValueError: a tensor is missing, unexpected or of another shape.
    """
    rules = _rules(local.config)
    want = {r[0] for r in rules}
    missing = sorted(want - set(state_dict))
    unexpected = sorted(set(state_dict) - want - {_HF_POS})
    if missing or unexpected:
        raise ValueError(f"load_hf_state_dict_into_dit: missing {missing[:8]}, unexpected {unexpected[:8]} "
                         "(does the config match the checkpoint?)")
    ours = hf_to_dit_state_dict(state_dict, local.config)
    params = dict(local.named_parameters())
    with torch.no_grad():
        for name, src in ours.items():
            dst = params[name]
            if name.endswith("class_embed.weight") and src.shape[1:] == dst.shape[1:]:
                rows = min(src.shape[0], dst.shape[0])
                dst[:rows].copy_(src[:rows].to(dst.device))
                continue
            if src.shape != dst.shape:
                raise ValueError(f"load_hf_state_dict_into_dit: {name} is {list(dst.shape)}, the checkpoint's "
                                 f"{list(src.shape)}")
            dst.copy_(src.to(dst.device))


def load_hf_into_dit(local: DiT, hf: Any) -> None:
    """Copy the weights of diffusers' ``DiTTransformer2DModel`` ``hf`` into ``local``.

    Args:
        local: the destination (built from ``dit_config_from_hf(hf.config)``).
        hf: the diffusers model.
    """
    sd = dict(hf.state_dict())
    pos = getattr(getattr(hf, "pos_embed", None), "pos_embed", None)
    if isinstance(pos, torch.Tensor):
        sd[_HF_POS] = pos
    load_hf_state_dict_into_dit(local, sd)


def dit_from_hf(hf: Any) -> DiT:
    """Our DiT with the config and weights of diffusers' ``DiTTransformer2DModel`` ``hf``.

    Args:
        hf: the diffusers model.
    """
    local = DiT(dit_config_from_hf(hf.config))
    load_hf_into_dit(local, hf)
    return local


__all__ = ["dit_config_from_hf", "dit_from_hf", "dit_to_hf_state_dict", "hf_to_dit_state_dict", "load_hf_into_dit",
           "load_hf_state_dict_into_dit"]
