"""DiT (``torch_nntile.nn.model.dit``) against diffusers' ``DiTTransformer2DModel``
math written out here in plain PyTorch (diffusers is not a dependency): a state dict
with diffusers' names and shapes, built by hand, is loaded with ``dit_hf_loader`` and
the images, the input's gradient and every HF tensor's gradient compared on CPU and on
nntile (untiled and with uneven batch and sequence tiles), and written back."""

from __future__ import annotations

import math
import types

import pytest
import torch
import torch.nn.functional as F
from conftest import rel_err
from hf_parity import tile

import torch_nntile
from torch_nntile.nn.model.dit import (
    DiT,
    DiTConfig,
    nchw_to_unpatchify_tokens,
    patchify_nchw,
    sincos_2d_pos_embed,
    timestep_embedding_table,
    unpatchify_nchw,
)
from torch_nntile.nn.model.dit_hf_loader import (
    dit_config_from_hf,
    dit_from_hf,
    dit_to_hf_state_dict,
    hf_to_dit_state_dict,
    load_hf_into_dit,
    load_hf_state_dict_into_dit,
)

TOL = 1e-4


def _hf_config(**kw) -> types.SimpleNamespace:
    """A diffusers ``DiTTransformer2DModel`` config (its attribute names and defaults)."""
    base = dict(sample_size=8, patch_size=2, in_channels=3, out_channels=None, num_layers=2, num_attention_heads=2,
                attention_head_dim=8, attention_bias=True, activation_fn="gelu-approximate", num_embeds_ada_norm=8,
                norm_type="ada_norm_zero", norm_elementwise_affine=False, norm_eps=1e-5, dropout=0.0)
    return types.SimpleNamespace(**{**base, **kw})


def _hf_state_dict(c: types.SimpleNamespace, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors under diffusers' names and shapes (``norm1.norm``, ``norm_out``
    and, without affine, ``norm3`` have none; the class table has the null class row)."""
    g = torch.Generator().manual_seed(seed)
    d, p = c.num_attention_heads * c.attention_head_dim, c.patch_size
    out_ch = c.out_channels or c.in_channels
    shapes: dict[str, tuple[int, ...]] = {"pos_embed.proj.weight": (d, c.in_channels, p, p), "pos_embed.proj.bias": (d,)}
    for i in range(c.num_layers):
        b = f"transformer_blocks.{i}"
        shapes.update({
            f"{b}.norm1.emb.timestep_embedder.linear_1.weight": (d, 256),
            f"{b}.norm1.emb.timestep_embedder.linear_1.bias": (d,),
            f"{b}.norm1.emb.timestep_embedder.linear_2.weight": (d, d),
            f"{b}.norm1.emb.timestep_embedder.linear_2.bias": (d,),
            f"{b}.norm1.emb.class_embedder.embedding_table.weight": (c.num_embeds_ada_norm + 1, d),
            f"{b}.norm1.linear.weight": (6 * d, d), f"{b}.norm1.linear.bias": (6 * d,),
            f"{b}.attn1.to_out.0.weight": (d, d), f"{b}.attn1.to_out.0.bias": (d,),
            f"{b}.ff.net.0.proj.weight": (4 * d, d), f"{b}.ff.net.0.proj.bias": (4 * d,),
            f"{b}.ff.net.2.weight": (d, 4 * d), f"{b}.ff.net.2.bias": (d,),
        })
        for x in "qkv":
            shapes[f"{b}.attn1.to_{x}.weight"] = (d, d)
            if c.attention_bias:
                shapes[f"{b}.attn1.to_{x}.bias"] = (d,)
        if c.norm_elementwise_affine:
            shapes.update({f"{b}.norm3.weight": (d,), f"{b}.norm3.bias": (d,)})
    shapes.update({"proj_out_1.weight": (2 * d, d), "proj_out_1.bias": (2 * d,),
                   "proj_out_2.weight": (p * p * out_ch, d), "proj_out_2.bias": (p * p * out_ch,)})
    sd = {}
    for k, s in shapes.items():
        fan_in = s[1] if len(s) == 2 else (math.prod(s[1:]) if len(s) > 2 else 1)
        scale = 1.0 if "embedding_table" in k else (0.5 if len(s) == 1 else 1.5 / math.sqrt(fan_in))
        sd[k] = (scale * torch.randn(s, generator=g)).contiguous()
        if k.endswith("norm3.weight"):
            sd[k] += 1.0
    return sd


# -- diffusers' math, written out ---------------------------------------------------------


def _timestep_proj(t: torch.Tensor, dim: int = 256) -> torch.Tensor:
    """diffusers' ``Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=1)``."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / (half - 1))
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def _pos_embed(d: int, grid: int) -> torch.Tensor:
    """diffusers' ``get_2d_sincos_pos_embed`` (numpy's ``meshgrid(w, h)``: x first)."""
    gw, gh = torch.meshgrid(torch.arange(grid, dtype=torch.float64), torch.arange(grid, dtype=torch.float64),
                            indexing="xy")

    def one(pos):
        omega = 1.0 / 10000 ** (torch.arange(d // 4, dtype=torch.float64) / (d / 4))
        out = torch.outer(pos.reshape(-1), omega)
        return torch.cat([out.sin(), out.cos()], 1)

    return torch.cat([one(gw), one(gh)], 1).float()


def _reference(sd: dict[str, torch.Tensor], c, images, timestep, labels) -> torch.Tensor:
    d, n, p = c.num_attention_heads * c.attention_head_dim, c.num_attention_heads, c.patch_size
    out_ch = c.out_channels or c.in_channels
    b = images.shape[0]
    x = F.conv2d(images, sd["pos_embed.proj.weight"], sd["pos_embed.proj.bias"], stride=p).flatten(2).transpose(1, 2)
    grid = c.sample_size // p
    x = x + _pos_embed(d, grid)[None]
    tproj = _timestep_proj(timestep)

    def emb(i):
        e = f"transformer_blocks.{i}.norm1.emb."
        h = F.silu(F.linear(tproj, sd[e + "timestep_embedder.linear_1.weight"], sd[e + "timestep_embedder.linear_1.bias"]))
        h = F.linear(h, sd[e + "timestep_embedder.linear_2.weight"], sd[e + "timestep_embedder.linear_2.bias"])
        return h + F.embedding(labels, sd[e + "class_embedder.embedding_table.weight"])

    def lin(x, k):
        return F.linear(x, sd[k + ".weight"], sd.get(k + ".bias"))

    gelu = "tanh" if c.activation_fn == "gelu-approximate" else "none"
    for i in range(c.num_layers):
        blk = f"transformer_blocks.{i}"
        mods = lin(F.silu(emb(i)), f"{blk}.norm1.linear").chunk(6, dim=1)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (m[:, None] for m in mods)
        h = F.layer_norm(x, (d,), eps=1e-6) * (1 + scale_msa) + shift_msa
        q, k, v = (lin(h, f"{blk}.attn1.to_{w}").reshape(b, -1, n, d // n).transpose(1, 2) for w in "qkv")
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, -1, d)
        x = gate_msa * lin(a, f"{blk}.attn1.to_out.0") + x
        h = F.layer_norm(x, (d,), sd.get(f"{blk}.norm3.weight"), sd.get(f"{blk}.norm3.bias"), c.norm_eps)
        h = h * (1 + scale_mlp) + shift_mlp
        x = gate_mlp * lin(F.gelu(lin(h, f"{blk}.ff.net.0.proj"), approximate=gelu), f"{blk}.ff.net.2") + x
    shift, scale = lin(F.silu(emb(0)), "proj_out_1").chunk(2, dim=1)
    x = lin(F.layer_norm(x, (d,), eps=1e-6) * (1 + scale[:, None]) + shift[:, None], "proj_out_2")
    x = x.reshape(b, grid, grid, p, p, out_ch)
    return torch.einsum("nhwpqc->nchpwq", x).reshape(b, out_ch, grid * p, grid * p)


# -- helpers ------------------------------------------------------------------------------


def test_patchify_matches_unfold_and_unpatchify_inverts():
    images = torch.randn(2, 3, 8, 6)
    tokens = patchify_nchw(images, 2)
    assert torch.equal(tokens, F.unfold(images, kernel_size=2, stride=2).transpose(1, 2))
    back = unpatchify_nchw(nchw_to_unpatchify_tokens(images, 2), patch_size=2, out_channels=3, grid_h=4, grid_w=3)
    assert torch.equal(back, images)


def test_tables_match_diffusers_formulas():
    assert torch.allclose(timestep_embedding_table(8), _timestep_proj(torch.arange(8)), atol=1e-6)
    assert timestep_embedding_table(5, 7).shape == (5, 7)
    assert torch.allclose(sincos_2d_pos_embed(16, 4), _pos_embed(16, 4), atol=1e-6)


# -- parity -------------------------------------------------------------------------------


def _inputs(c, batch: int = 3):
    g = torch.Generator().manual_seed(1)
    images = torch.randn(batch, c.in_channels, c.sample_size, c.sample_size, generator=g)
    timestep = torch.randint(0, c.num_embeds_ada_norm, (batch,), generator=g)
    labels = torch.randint(0, c.num_embeds_ada_norm + 1, (batch,), generator=g)  # the null class too
    return images, timestep, labels


def _check(hf_cfg, device: str, tiles: dict | None = None) -> dict[str, float]:
    sd = {k: v.clone().requires_grad_() for k, v in _hf_state_dict(hf_cfg).items()}
    ours = DiT(dit_config_from_hf(hf_cfg))
    load_hf_state_dict_into_dit(ours, sd)
    ours = ours.to(device)
    images, timestep, labels = _inputs(hf_cfg)
    img = images.clone().requires_grad_()
    want = _reference(sd, hf_cfg, img, timestep, labels)
    g = torch.randn(want.shape, generator=torch.Generator().manual_seed(2))
    want.backward(g)

    p = hf_cfg.patch_size
    tokens = patchify_nchw(images, p).to(device)
    t_d, y_d = timestep.to(device), labels.to(device)
    tile(tiles, (tokens, {0: "batch", 1: "seq"}), (t_d, {0: "batch"}), (y_d, {0: "batch"}))
    tokens.requires_grad_()
    got = ours(tokens, t_d, y_d)
    got.backward(nchw_to_unpatchify_tokens(g, p).to(device))
    grid = hf_cfg.sample_size // p
    errs = {"images": rel_err(unpatchify_nchw(got.cpu(), patch_size=p, out_channels=ours.out_channels, grid_h=grid,
                                              grid_w=grid), want),
            "input grad": rel_err(tokens.grad.cpu(), patchify_nchw(img.grad, p))}
    grads = dit_to_hf_state_dict(ours, {n: q.grad for n, q in ours.named_parameters() if q.grad is not None})
    assert set(grads) == set(sd)
    for k, v in sd.items():
        if k.endswith("to_k.bias"):  # softmax ignores a shift of every score: 0 up to rounding, against the v bias's
            scale = sd[k.replace("to_k", "to_v")].grad.norm()
            errs[k] = max(grads[k].norm(), v.grad.norm()).item() / scale.item()
        else:
            errs[k] = rel_err(grads[k], v.grad)
    assert max(errs.values()) <= TOL, {k: e for k, e in errs.items() if e > TOL}
    return errs


@pytest.mark.parametrize("device", ["cpu", "nntile"])
def test_dit_matches_diffusers(device):
    _check(_hf_config(), device)


def test_dit_matches_diffusers_tiled():
    _check(_hf_config(), "nntile", {"batch": [1, 2], "seq": [5, 11]})
    m = torch_nntile.metrics()
    assert m["kernels"]["mm"]["tasks"] > m["ops"]["aten::mm"]  # the tiles reached the products


@pytest.mark.parametrize("device", ["cpu", "nntile"])
def test_dit_variant_matches_diffusers(device):
    """No q/k/v bias, an affine norm before the MLP, exact GELU, more output channels."""
    _check(_hf_config(attention_bias=False, norm_elementwise_affine=True, activation_fn="gelu", out_channels=6,
                      num_layers=1, num_attention_heads=4, attention_head_dim=4), device)


# -- loader -------------------------------------------------------------------------------


def test_state_dict_round_trip():
    c = _hf_config(norm_elementwise_affine=True)
    sd = _hf_state_dict(c)
    ours = DiT(dit_config_from_hf(c))
    load_hf_state_dict_into_dit(ours, sd)
    back = dit_to_hf_state_dict(ours.to("nntile"))
    assert set(back) == set(sd)
    for k, v in sd.items():
        assert torch.equal(back[k], v), k
    assert set(hf_to_dit_state_dict(sd, c)) == {n for n, q in ours.named_parameters() if q.requires_grad}
    assert ours.blocks[0].attn.query.weight.shape == (16, 8, 2) and ours.blocks[0].attn.out.weight.shape == (8, 2, 16)


def test_load_from_a_diffusers_like_model():
    """``load_hf_into_dit`` and ``dit_from_hf`` read only ``config``, ``state_dict()`` and
    the ``pos_embed.pos_embed`` buffer (``[1, T, D]``, not in the state dict)."""
    c = _hf_config(num_layers=1)
    sd = _hf_state_dict(c)
    pos = torch.randn(1, 16, 16)
    hf = types.SimpleNamespace(config=c, state_dict=lambda: dict(sd), pos_embed=types.SimpleNamespace(pos_embed=pos))
    ours = dit_from_hf(hf)
    assert torch.equal(ours.pos_embed, pos[0])
    assert ours.blocks[0].norm1.emb.class_embed.weight.shape == (9, 16)
    # a model without the null class row takes the rows it has (as the published torch_nntile's)
    small = DiT(DiTConfig(**{**vars(dit_config_from_hf(c)), "use_cfg_embedding": False}))
    load_hf_into_dit(small, hf)
    table = sd["transformer_blocks.0.norm1.emb.class_embedder.embedding_table.weight"]
    assert torch.equal(small.blocks[0].norm1.emb.class_embed.weight, table[:8])


def test_errors():
    with pytest.raises(ValueError, match="activation_fn must be one of"):
        DiT(_hf_config(activation_fn="geglu"))
    with pytest.raises(ValueError, match="only norm_type 'ada_norm_zero'"):
        DiT(_hf_config(norm_type="ada_norm"))
    with pytest.raises(ValueError, match="sample_size 9 must be a multiple of patch_size 2"):
        DiT(DiTConfig(sample_size=9))
    with pytest.raises(ValueError, match="must be a multiple of 4"):
        DiT(DiTConfig(num_attention_heads=3, attention_head_dim=3))
    model = DiT(DiTConfig(sample_size=8, num_layers=1, num_embeds_ada_norm=4))
    t = torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="tokens must be"):
        model(torch.randn(2, 15, 12), t, t)
    with pytest.raises(ValueError, match="timestep must be integers"):
        model(torch.randn(2, 16, 12), t.float(), t)
    images = torch.randn(2, 3, 8, 8)
    assert model(images, t, t).shape == (2, 16, 12)  # NCHW on the CPU is patchified
    model = model.to("nntile")
    with pytest.raises(ValueError, match="patchify NCHW"):
        model(images.to("nntile"), t.to("nntile"), t.to("nntile"))
    sd = _hf_state_dict(_hf_config(num_layers=1))
    with pytest.raises(ValueError, match="missing .*unexpected"):
        load_hf_state_dict_into_dit(DiT(dit_config_from_hf(_hf_config(num_layers=2))), sd)
    with pytest.raises(ValueError, match="patch_embed.weight is"):
        load_hf_state_dict_into_dit(DiT(dit_config_from_hf(_hf_config(num_layers=1, in_channels=4))), sd)
