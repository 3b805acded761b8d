"""torch_nntile.nn.model.gpt2_minimal and gpt2_hf_loader against HF's GPT-2."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import rel_err
from hf_parity import RTOL, check_lm_against_hf, spread_norms_and_biases_, token_ids

from torch_nntile.models import gpt2_hf_loader as loader
from torch_nntile.nn.model.gpt2_minimal import GPT2Attention, GPT2Block, GPT2LMHead, make_causal_sdpa_mask

transformers = pytest.importorskip("transformers")


def _config(**kw) -> object:
    args = dict(n_layer=2, n_head=2, n_embd=32, n_positions=16, vocab_size=61, n_inner=48, attn_pdrop=0.0,
                resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    args.update(kw)
    return transformers.GPT2Config(**args)


def _pair(**kw) -> tuple[torch.nn.Module, GPT2LMHead]:
    config = _config(**kw)
    torch.manual_seed(0)
    hf = spread_norms_and_biases_(transformers.GPT2LMHeadModel(config).eval(), "ln", bias=(0.5, 1.5))
    ours = GPT2LMHead(config)
    loader.load_hf_into_gpt2_lm_head(ours, hf)
    return hf, ours


_ids = functools.partial(token_ids, 61, seq=10)


@pytest.mark.parametrize("device,tiles,tied,masked", [
    ("cpu", None, True, False),
    ("nntile", None, True, False),
    ("nntile", None, False, True),
    ("nntile", {"batch": [1, 2], "seq": [4, 6]}, False, False),
])
def test_lm_head_matches_hf(device, tiles, tied, masked):
    hf, ours = _pair(tie_word_embeddings=tied)
    ours = ours.to(device)
    assert (ours.lm_head.weight is ours.transformer.wte.weight) == tied  # the tie survives .to()
    grad = torch.randn(3, 10, 61, generator=torch.Generator().manual_seed(2))
    mask = make_causal_sdpa_mask(10, device=device) if masked else None
    check_lm_against_hf(hf, ours, _ids(), lambda g: loader.gpt2_state_dict_to_hf(g, ours.config.n_head), tiles=tiles,
                        out_grad=grad, causal_mask=mask)


def test_block_and_attention_with_a_mask_match_hf():
    hf, ours = _pair()
    hf_block, block = hf.transformer.h[1], GPT2Block(hf.config, layer_idx=1)
    block.load_state_dict(ours.transformer.h[1].state_dict())
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(3))
    hf_mask = torch.zeros(7, 7).masked_fill(~make_causal_sdpa_mask(7), float("-inf"))  # HF's blocks take it additive
    out = hf_block(x, attention_mask=hf_mask)
    want = out[0] if isinstance(out, tuple) else out
    got = block.to("nntile")(x.to("nntile"), make_causal_sdpa_mask(7, "nntile"))
    assert rel_err(got.cpu(), want) <= RTOL
    attn = GPT2Attention(hf.config)
    for name, t in loader._split_hf_attn_weights(hf_block.attn, 32, 2, 16).items():
        getattr(attn, name).data.copy_(t)
    want = hf_block.attn(x, attention_mask=hf_mask)[0]
    assert rel_err(attn(x).detach(), want) <= RTOL
    assert rel_err(attn(x, torch.ones(7, 7, dtype=torch.bool)).detach(), hf_block.attn(x)[0]) <= RTOL  # no mask


def test_state_dict_round_trip_and_export():
    for tied in (True, False):
        hf, ours = _pair(tie_word_embeddings=tied)
        back = loader.export_gpt2_lm_head_to_hf_state_dict(ours.to("nntile"))
        want = hf.state_dict()
        assert set(back) == set(want)
        for k, v in want.items():
            assert torch.equal(back[k], v), k


def test_scaling_options_and_exact_gelu_match_hf():
    hf, ours = _pair(scale_attn_by_inverse_layer_idx=True, activation_function="gelu", n_inner=None)
    ids = _ids(batch=2, seq=6)
    assert rel_err(ours.to("nntile")(ids.to("nntile")).cpu(), hf(ids).logits) <= RTOL


def test_errors_and_caches():
    with pytest.raises(ValueError, match="not a multiple of n_head"):
        GPT2LMHead(_config(n_embd=30, n_head=4))
    with pytest.raises(ValueError, match="activation 'relu'"):
        GPT2LMHead(_config(activation_function="relu"))
    _, ours = _pair()
    with pytest.raises(ValueError, match="longer than n_positions 16"):
        ours(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="must be positive"):
        ours.warm_sequence_caches(batch_sizes=[0], seq_len=4, device="cpu")
    ours = ours.to("nntile")
    ours.warm_sequence_caches(batch_sizes=[2], seq_len=4, device="nntile")
    tr = ours.transformer
    pos, mask = tr._position_ids_cache[(2, 4)], tr._causal_mask_cache[4]  # the reference's names
    assert pos.device.type == "nntile" and pos.cpu().tolist() == [[0, 1, 2, 3]] * 2
    assert torch.equal(mask.cpu(), make_causal_sdpa_mask(4))
    ours(torch.zeros(2, 4, dtype=torch.long).to("nntile"))
    assert tr._position_ids_cache[(2, 4)] is pos  # reused by the forward
    ours.clear_sequence_caches()
    assert not tr._position_ids_cache and not tr._causal_mask_cache
    assert make_causal_sdpa_mask(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
