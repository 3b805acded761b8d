"""MLP-Mixer (``torch_nntile.nn.model.mlp_mixer``) against its stock-PyTorch twin
``MlpMixerCpu`` and a formula written here: output, input gradient and every
parameter's gradient, on CPU and on nntile (untiled and with uneven tiles of the patch
axis, which token mixing contracts over). There is no HF Mixer to compare with."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F
from conftest import rel_err
from hf_parity import tile

import torch_nntile
from torch_nntile.nn.model.mlp_mixer import (
    MixerMlp,
    MlpMixer,
    MlpMixerConfig,
    MlpMixerCpu,
    copy_cpu_weights_to_nntile,
    copy_nntile_weights_to_cpu,
)

TOL = 1e-4


def _config(**kw) -> MlpMixerConfig:
    return MlpMixerConfig(**{**dict(channel_dim=8, init_patch_dim=6, projected_patch_dim=12, num_mixer_layers=2,
                                    n_classes=5), **kw})


def _cpu_model(config) -> MlpMixerCpu:
    torch.manual_seed(0)
    cpu = MlpMixerCpu(config)
    with torch.no_grad():  # norms away from ones and zeros, so their gradients matter
        for p in cpu.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return cpu


def _names(n_layers: int) -> dict[str, str]:
    """``MlpMixerCpu``'s parameter names -> ours."""
    names = {"mixer_sequence.0.weight": "stem_weight", "classification.weight": "classifier_weight"}
    for i in range(n_layers):
        c, o = f"mixer_sequence.{i + 1}", f"blocks.{i}"
        for norm in ("norm_1", "norm_2"):
            names.update({f"{c}.{norm}.{p}": f"{o}.{norm}.{p}" for p in ("weight", "bias")})
        for mlp in ("mlp_1", "mlp_2"):
            names.update({f"{c}.{mlp}.fn.0.weight": f"{o}.{mlp}.fc1_weight", f"{c}.{mlp}.fn.2.weight": f"{o}.{mlp}.fc2_weight"})
    return names


def _formula(p: dict[str, torch.Tensor], x: torch.Tensor, n_layers: int, eps: float) -> torch.Tensor:
    """The Mixer written out from ``MlpMixerCpu``'s parameters."""
    h = x @ p["mixer_sequence.0.weight"].t()
    for i in range(n_layers):
        c = f"mixer_sequence.{i + 1}"
        n = F.layer_norm(h, h.shape[-1:], p[f"{c}.norm_1.weight"], p[f"{c}.norm_1.bias"], eps)
        t = torch.einsum("op,pbd->obd", p[f"{c}.mlp_1.fn.0.weight"], n)
        h = torch.einsum("po,obd->pbd", p[f"{c}.mlp_1.fn.2.weight"], F.gelu(t)) + h
        n = F.layer_norm(h, h.shape[-1:], p[f"{c}.norm_2.weight"], p[f"{c}.norm_2.bias"], eps)
        h = F.gelu(n @ p[f"{c}.mlp_2.fn.0.weight"].t()) @ p[f"{c}.mlp_2.fn.2.weight"].t() + h
    return h.mean(0) @ p["classification.weight"].t()


def test_cpu_twin_matches_formula():
    c = _config()
    cpu = _cpu_model(c)
    x = torch.randn(8, 3, 6)
    with torch.no_grad():
        assert rel_err(cpu(x), _formula(dict(cpu.named_parameters()), x, 2, c.layer_norm_epsilon)) <= 1e-6


@pytest.mark.parametrize("device,tiles", [("cpu", None), ("nntile", None), ("nntile", {"patch": [3, 5]})])
def test_mixer_matches_cpu_twin(device, tiles):
    c = _config()
    cpu = _cpu_model(c)
    ours = MlpMixer(c)
    copy_cpu_weights_to_nntile(cpu, ours)
    ours = ours.to(device)
    x = torch.randn(8, 3, 6, generator=torch.Generator().manual_seed(1))
    xc = x.clone().requires_grad_()
    want = cpu(xc)
    g = torch.randn_like(want)
    want.backward(g)

    xd = x.to(device)
    tile(tiles, (xd, {0: "patch", 1: "batch"}))
    xd.requires_grad_()
    got = ours(xd)
    got.backward(g.to(device))
    errs = {"out": rel_err(got.cpu(), want), "x": rel_err(xd.grad.cpu(), xc.grad)}
    grads = {n: p.grad for n, p in ours.named_parameters()}
    for cname, p in cpu.named_parameters():
        errs[cname] = rel_err(grads[_names(2)[cname]].cpu(), p.grad)
    assert max(errs.values()) <= TOL, errs
    if tiles:  # the patch tiling reached the products: more tasks than ops
        m = torch_nntile.metrics()
        assert m["kernels"]["mm"]["tasks"] > m["ops"]["aten::mm"]


def test_weights_round_trip_and_names():
    c = _config(num_mixer_layers=3)
    cpu = _cpu_model(c)
    ours = MlpMixer(c)
    copy_cpu_weights_to_nntile(cpu, ours)
    names = _names(3)
    assert {names[n] for n, _ in cpu.named_parameters()} == {n for n, _ in ours.named_parameters()}
    back = MlpMixerCpu(c)
    copy_nntile_weights_to_cpu(ours.to("nntile"), back)
    for (n, p), (m, q) in zip(cpu.named_parameters(), back.named_parameters()):
        assert n == m and torch.equal(p, q), n
    assert ours.blocks[0].mlp_1.fc1_weight.shape == (32, 8) and ours.blocks[0].mlp_2.fc2_weight.shape == (12, 48)


def test_duck_typed_config():
    ns = types.SimpleNamespace(channel_dim=4, init_patch_dim=3, projected_patch_dim=8, num_mixer_layers=1, n_classes=2)
    assert MlpMixer(ns)(torch.randn(4, 2, 3)).shape == (2, 2)


def test_errors():
    with pytest.raises(ValueError, match="num_mixer_layers must be a positive integer"):
        MlpMixer(_config(num_mixer_layers=0))
    with pytest.raises(ValueError, match="side must be 'L' or 'R'"):
        MixerMlp("X", 4)
    with pytest.raises(ValueError, match=r"input must be \[channel_dim=8, batch, init_patch_dim=6\]"):
        MlpMixer(_config())(torch.randn(3, 8, 6))
    with pytest.raises(ValueError, match="have 2 and 1 blocks"):
        copy_cpu_weights_to_nntile(MlpMixerCpu(_config()), MlpMixer(_config(num_mixer_layers=1)))
