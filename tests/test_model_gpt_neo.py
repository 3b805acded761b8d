"""GPT-Neo (``torch_nntile.nn.model.gpt_neo``) against HF's ``GPTNeoForCausalLM``:
logits and every gradient on CPU and nntile (untiled and tiled), the local layers'
sliding window, the weight round trip and config errors."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import rel_err
from hf_parity import RTOL, check_lm_against_hf, spread_norms_and_biases_, token_ids

from torch_nntile.nn.model import gpt_neo_hf_loader as loader
from torch_nntile.nn.model.gpt_neo import (
    GPTNeoCausal,
    GPTNeoConfig,
    GPTNeoModel,
    make_local_causal_sdpa_mask,
)

transformers = pytest.importorskip("transformers")


def _hf_neo(layers=("global", "local", "global", "local"), **kw) -> torch.nn.Module:
    args = dict(vocab_size=97, hidden_size=32, num_layers=len(layers), num_heads=4, max_position_embeddings=32,
                intermediate_size=48, window_size=4, attention_types=[[list(layers), 1]], embed_dropout=0.0,
                attention_dropout=0.0, resid_dropout=0.0, bos_token_id=0, eos_token_id=0, tie_word_embeddings=False,
                attn_implementation="eager")
    args.update(kw)
    torch.manual_seed(0)
    return spread_norms_and_biases_(transformers.GPTNeoForCausalLM(transformers.GPTNeoConfig(**args)).eval(), "ln_")


def _ours(hf: torch.nn.Module, device: str = "cpu") -> GPTNeoCausal:
    model = GPTNeoCausal(loader.gpt_neo_config_from_hf(hf.config))
    loader.load_hf_into_gpt_neo_causal(model, hf)
    return model.to(device)


_ids = functools.partial(token_ids, 97)


def _check(hf: torch.nn.Module, ours: GPTNeoCausal, ids: torch.Tensor, tiles: dict | None = None) -> float:
    return check_lm_against_hf(hf, ours, ids, lambda g: loader.gpt_neo_state_dict_to_hf(g, ours.config), tiles=tiles,
                               embedding=ours.transformer.wte)


@pytest.mark.parametrize("device", ["cpu", "nntile"])
def test_gpt_neo_matches_hf(device):
    hf = _hf_neo()
    _check(hf, _ours(hf, device), _ids())


def test_gpt_neo_matches_hf_tiled_tied():
    hf = _hf_neo(tie_word_embeddings=True)
    ours = _ours(hf, "nntile")
    assert ours.lm_head.weight is ours.transformer.wte.weight  # still tied after .to()
    _check(hf, ours, _ids(), tiles={"batch": [1, 2], "seq": [5, 7]})


def test_gpt_neo_window_wider_than_sequence_is_causal():
    """A local layer whose window covers the sequence runs the fused causal path."""
    hf = _hf_neo(window_size=16)
    _check(hf, _ours(hf, "nntile"), _ids())


def test_gpt_neo_attention_modes_match_hf_layer():
    """One layer through the reference's API: local window, causal and no mask."""
    hf = _hf_neo()
    ours = _ours(hf)
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(2))
    for layer in (0, 1):
        hf_attn, attn = hf.transformer.h[layer].attn, ours.transformer.h[layer].attn
        assert attn.local == (layer == 1)
        want = hf_attn(x)[0]
        assert rel_err(attn(x), want) <= RTOL
        assert rel_err(attn(x, attn_mask=None, is_causal=True), want) <= RTOL
    inner = hf.transformer.h[0].attn.attention
    keep = inner.bias
    inner.bias = torch.ones_like(keep)  # HF without its causal mask
    want = hf.transformer.h[0].attn(x)[0]
    inner.bias = keep
    got = ours.transformer.h[0].attn.to("nntile")(x.to("nntile"), is_causal=False)
    assert rel_err(got.cpu(), want) <= RTOL
    # an explicit mask is the whole mask: the causal one given as bool gives the causal result
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    got = ours.transformer.h[0].attn(x.to("nntile"), attn_mask=causal)
    assert rel_err(got.cpu(), hf.transformer.h[0].attn(x)[0]) <= RTOL


def test_local_mask():
    m = make_local_causal_sdpa_mask(6, 3)
    q, k = torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")
    assert torch.equal(m, (k <= q) & (q - k < 3))
    assert make_local_causal_sdpa_mask(2, 1, "nntile").device.type == "nntile"


def test_gpt_neo_state_dict_round_trip():
    for tied in (False, True):
        hf = _hf_neo(tie_word_embeddings=tied)
        ours = _ours(hf)
        back = loader.export_gpt_neo_causal_to_hf_state_dict(ours)
        want = hf.state_dict()
        assert set(back) == set(want)
        for k, v in want.items():
            assert torch.equal(back[k], v), k
        fresh = _hf_neo(tie_word_embeddings=tied)
        with torch.no_grad():
            for p in fresh.parameters():
                p.zero_()
        fresh.load_state_dict(back, strict=True)
        assert torch.equal(fresh(_ids()).logits, hf(_ids()).logits)
        # and back from a bare state dict
        again = GPTNeoCausal(hf.config)
        loader.load_hf_into_gpt_neo_causal(again, back)
        assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), ours.state_dict().values()))


def test_gpt_neo_config_from_hf_and_defaults():
    hf = _hf_neo().config
    c = loader.gpt_neo_config_from_hf(hf)
    assert (c.num_hidden_layers, c.num_attention_heads, c.head_dim, c.window_size) == (4, 4, 8, 4)
    assert c.attention_layers == ["global", "local", "global", "local"]
    assert c.layer_norm_eps == hf.layer_norm_epsilon and c.activation_function == "gelu_new"
    assert GPTNeoConfig(num_hidden_layers=3).attention_layers == ["global", "local", "global"]
    assert GPTNeoConfig.from_config(c) is c
    model = GPTNeoModel(hf)  # an HF config directly
    assert [b.attn.local for b in model.h] == [False, True, False, True]
    assert model.h[0].attn.q_weight.shape == (32, 8, 4) and model.h[0].attn.o_weight.shape == (8, 4, 32)


def test_gpt_neo_errors():
    with pytest.raises(ValueError, match="not divisible by num_attention_heads"):
        GPTNeoCausal(GPTNeoConfig(hidden_size=30, num_attention_heads=4, num_hidden_layers=1))
    with pytest.raises(ValueError, match="attention_layers has 1 entries"):
        GPTNeoConfig(num_hidden_layers=2, attention_layers=["global"]).validate()
    with pytest.raises(ValueError, match="are not 'global' or 'local'"):
        GPTNeoConfig(num_hidden_layers=1, attention_layers=["sparse"]).validate()
    with pytest.raises(ValueError, match="activation_function 'relu'"):
        GPTNeoCausal(GPTNeoConfig(hidden_size=16, num_attention_heads=2, num_hidden_layers=1,
                                  activation_function="relu"))
    with pytest.raises(ValueError, match="longer than max_position_embeddings"):
        _ours(_hf_neo())(torch.zeros(1, 33, dtype=torch.long))
