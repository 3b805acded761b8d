"""GPT-NeoX (``torch_nntile.nn.model.gpt_neox``) against HF's ``GPTNeoXForCausalLM``:
logits and every gradient on CPU and nntile (untiled and tiled) for partial and full
rotary embeddings, parallel and sequential residuals, with and without biases; the
attention through the reference's ``sin``/``cos`` API; the weight round trip and
config errors."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import rel_err
from hf_parity import RTOL, check_lm_against_hf, spread_norms_and_biases_, token_ids

from torch_nntile.nn.model import gpt_neox_hf_loader as loader
from torch_nntile.nn.model.gpt_neox import (
    GPTNeoXAttention,
    GPTNeoXCausal,
    GPTNeoXConfig,
    GPTNeoXLayer,
    rope_pair_tables,
)
from torch_nntile.rope import rope_sin_cos_from_position_ids

transformers = pytest.importorskip("transformers")


def _hf_neox(**kw) -> torch.nn.Module:
    args = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                max_position_embeddings=32, rotary_pct=0.25, use_parallel_residual=True, attention_bias=True,
                tie_word_embeddings=False, hidden_dropout=0.0, attention_dropout=0.0, bos_token_id=0, eos_token_id=0,
                attn_implementation="eager")
    args.update(kw)
    torch.manual_seed(0)
    return spread_norms_and_biases_(transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**args)).eval(), "norm")


def _ours(hf: torch.nn.Module, device: str = "cpu") -> GPTNeoXCausal:
    model = GPTNeoXCausal(loader.gpt_neox_config_from_hf(hf.config))
    loader.load_hf_into_gpt_neox_causal(model, hf)
    return model.to(device)


_ids = functools.partial(token_ids, 97)


def _check(hf: torch.nn.Module, ours: GPTNeoXCausal, ids: torch.Tensor, tiles: dict | None = None) -> float:
    return check_lm_against_hf(hf, ours, ids, lambda g: loader.gpt_neox_state_dict_to_hf(g, ours.config), tiles=tiles,
                               embedding=ours.gpt_neox.embed_in)


VARIANTS = {
    "partial_parallel_bias": {},
    "half_sequential_nobias_tied": dict(rotary_pct=0.5, use_parallel_residual=False, attention_bias=False,
                                        tie_word_embeddings=True),
    "full_rotary": dict(rotary_pct=1.0, num_attention_heads=4),
    "no_rotary": dict(rotary_pct=0.0),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("device", ["cpu", "nntile"])
def test_gpt_neox_matches_hf(device, variant):
    hf = _hf_neox(**VARIANTS[variant])
    _check(hf, _ours(hf, device), _ids())


@pytest.mark.parametrize("variant", ["partial_parallel_bias", "half_sequential_nobias_tied"])
def test_gpt_neox_matches_hf_tiled(variant):
    hf = _hf_neox(**VARIANTS[variant])
    ours = _ours(hf, "nntile")
    if hf.config.tie_word_embeddings:
        assert ours.embed_out.weight is ours.gpt_neox.embed_in.weight  # still tied after .to()
    _check(hf, ours, _ids(), tiles={"batch": [1, 2], "seq": [5, 7]})


def _hf_position_embeddings(hf: torch.nn.Module, position_ids: torch.Tensor):
    return hf.gpt_neox.rotary_emb(torch.zeros(1, dtype=torch.float32), position_ids)


@pytest.mark.parametrize("device", ["cpu", "nntile"])
def test_gpt_neox_attention_and_layer_with_sin_cos(device):
    """The reference's API: sin/cos ``[batch, seq, rotary_ndims // 2]`` (not padded) or
    ``[seq, head_dim // 2]`` (identity-padded), causal or not, forward and x's gradient."""
    hf = _hf_neox(num_attention_heads=4)  # head_dim 8, rotary_ndims 2
    ours = _ours(hf)
    c = ours.config
    b, s = 2, 7
    pos = torch.arange(s).expand(b, s)
    hf_pe = _hf_position_embeddings(hf, pos)
    sin, cos = rope_sin_cos_from_position_ids(pos, c.rotary_ndims, rope_theta=c.rotary_emb_base)
    sin_pad, cos_pad = rope_sin_cos_from_position_ids(torch.arange(s), c.rotary_ndims, rope_theta=c.rotary_emb_base,
                                                      identity_pad_head_dim=c.head_dim)
    assert sin.shape == (b, s, c.rotary_ndims // 2) and sin_pad.shape == (s, c.head_dim // 2)
    x = torch.randn(b, s, c.hidden_size, generator=torch.Generator().manual_seed(3), requires_grad=True)
    causal_mask = torch.full((s, s), float("-inf")).triu(1)
    attn = ours.gpt_neox.layers[0].attention.to(device)
    hf_attn = hf.gpt_neox.layers[0].attention
    for causal in (True, False):
        want = hf_attn(x, attention_mask=causal_mask if causal else None, position_embeddings=hf_pe)[0]
        grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(4))
        (want_gx,) = torch.autograd.grad(want, x, grad)
        for sn, cs in ((sin, cos), (sin_pad, cos_pad)):
            xd = x.detach().to(device).requires_grad_()
            got = attn(xd, sn.to(device), cs.to(device), None, is_causal=causal)
            (gx,) = torch.autograd.grad(got, xd, grad.to(device))
            assert rel_err(got.cpu(), want) <= RTOL
            assert rel_err(gx.cpu(), want_gx) <= RTOL
    layer = ours.gpt_neox.layers[1].to(device)
    want = hf.gpt_neox.layers[1](x, attention_mask=causal_mask, position_embeddings=hf_pe)
    got = layer(x.detach().to(device), sin.to(device), cos.to(device), is_causal=True)
    assert rel_err(got.cpu(), want) <= RTOL


def test_gpt_neox_position_ids_and_sin_cos_on_the_model():
    hf = _hf_neox()
    ours = _ours(hf, "nntile")
    ids = _ids(batch=2, seq=6)
    pos = torch.arange(6).expand(2, 6) + torch.tensor([[3], [5]])
    want = hf(ids, position_ids=pos).logits
    assert rel_err(ours(ids.to("nntile"), position_ids=pos).cpu(), want) <= RTOL
    c = ours.config
    sin, cos = rope_sin_cos_from_position_ids(pos, c.rotary_ndims, rope_theta=c.rotary_emb_base)
    assert rel_err(ours(ids.to("nntile"), sin=sin, cos=cos).cpu(), want) <= RTOL
    ours.gpt_neox.warm_sequence_caches(seq_len=6, device="nntile")
    assert rel_err(ours(ids.to("nntile")).cpu(), hf(ids).logits) <= RTOL
    assert list(ours.gpt_neox._rope) == [(6, torch.device("nntile:0"))]  # the warmed tables, reused
    ours.gpt_neox.clear_sequence_caches()
    assert not ours.gpt_neox._rope


def test_gpt_neox_state_dict_round_trip():
    for kw in ({}, VARIANTS["half_sequential_nobias_tied"], VARIANTS["full_rotary"]):
        hf = _hf_neox(**kw)
        ours = _ours(hf)
        back = loader.export_gpt_neox_causal_to_hf_state_dict(ours)
        want = hf.state_dict()
        assert set(back) == set(want)
        for k, v in want.items():
            assert torch.equal(back[k], v), k
        fresh = _hf_neox(**kw)
        with torch.no_grad():
            for p in fresh.parameters():
                p.zero_()
        fresh.load_state_dict(back, strict=True)
        assert torch.equal(fresh(_ids()).logits, hf(_ids()).logits)
        again = GPTNeoXCausal(hf.config)  # an HF config directly, loaded from a bare state dict
        loader.load_hf_into_gpt_neox_causal(again, back)
        assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), ours.state_dict().values()))
    old = loader.export_gpt_neox_causal_to_hf_state_dict(ours, head_key="embed_out.weight")
    assert "embed_out.weight" in old and "lm_head.weight" not in old


def test_gpt_neox_config():
    c = GPTNeoXConfig(hidden_size=64, num_attention_heads=4, rotary_pct=0.25)
    assert (c.head_dim, c.rotary_ndims) == (16, 4)
    assert GPTNeoXConfig(hidden_size=64, num_attention_heads=4, rotary_pct=0.0).rotary_ndims == 0
    hf = _hf_neox(rotary_pct=0.5, rotary_emb_base=500.0, hidden_act="gelu_new").config
    local = loader.gpt_neox_config_from_hf(hf)
    assert (local.rotary_pct, local.rotary_ndims, local.rotary_emb_base, local.hidden_act) == (0.5, 8, 500.0, "gelu_new")
    layer = GPTNeoXLayer(hf)
    assert layer.attention.q_weight.shape == (32, 16, 2) and layer.attention.q_bias.shape == (2, 16)
    assert layer.mlp.act.approximate == "tanh"
    assert GPTNeoXAttention(GPTNeoXConfig(hidden_size=8, num_attention_heads=2, attention_bias=False)).o_bias is None


def test_gpt_neox_errors():
    with pytest.raises(ValueError, match="not divisible by num_attention_heads"):
        GPTNeoXConfig(hidden_size=66, num_attention_heads=4).validate()
    with pytest.raises(ValueError, match="odd rotary_ndims 1"):
        GPTNeoXCausal(GPTNeoXConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=1, rotary_pct=0.0625))
    with pytest.raises(ValueError, match="rotary_pct must be in"):
        GPTNeoXConfig(hidden_size=32, num_attention_heads=2, rotary_pct=1.5).validate()
    with pytest.raises(ValueError, match="hidden_act 'relu'"):
        GPTNeoXCausal(GPTNeoXConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=1, hidden_act="relu"))
    hf = _hf_neox().config
    hf.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    with pytest.raises(ValueError, match="rope type 'linear' is not supported"):
        loader.gpt_neox_config_from_hf(hf)
    with pytest.raises(ValueError, match="n <= head_dim // 2"):
        rope_pair_tables(torch.zeros(4, 5), torch.zeros(4, 5), head_dim=8)
