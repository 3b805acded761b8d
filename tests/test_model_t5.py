"""T5 (``nn.model.t5``) against HF's ``T5ForConditionalGeneration``: logits and every
parameter's gradient on CPU and nntile (untiled and unevenly tiled, with padding masks),
the state dict both ways, the published torch_nntile's usage (relative bias switched
off) and config errors."""

from __future__ import annotations

import pytest
import torch
from conftest import rel_err
from hf_parity import grad_errors, tile

from torch_nntile.nn.linear import linear_to_output_weight, linear_to_qkv_weight
from torch_nntile.nn.model.t5 import T5Attention, T5Config, T5ForConditionalGeneration, relative_position_bucket
from torch_nntile.nn.model.t5_hf_loader import (
    disable_t5_relative_attention_bias,
    export_t5_to_hf_state_dict,
    load_hf_into_t5,
    load_hf_state_dict_into_t5,
    t5_config_from_hf,
)

transformers = pytest.importorskip("transformers")

TOL = 1e-4
VOCAB = 61


def _hf(**kw):
    """A tiny seeded HF T5 (eval, eager attention); 8 buckets up to distance 16, so the
    sequences below reach the log-spaced buckets."""
    args = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=3, num_heads=4,
                relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0)
    config = transformers.T5Config(**{**args, **kw})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(config).eval()


def _ours(hf, device="cpu"):
    ours = T5ForConditionalGeneration(t5_config_from_hf(hf.config))
    load_hf_into_t5(ours, hf)
    return ours.to(device)


def _inputs(batch=3, enc=12, dec=9):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (batch, enc), generator=g), torch.randint(0, VOCAB, (batch, dec), generator=g)


def _padding(batch, seq, lengths):
    m = torch.ones(batch, seq, dtype=torch.long)
    for i, n in enumerate(lengths):
        m[i, n:] = 0
    return m


def _check(hf, device, *, enc_mask=None, dec_mask=None, tiles=None):
    """Our logits and gradients (mapped to HF's names; a separate lm_head's gradient
    added to shared's, which HF always ties) against HF's."""
    enc, dec = _inputs()
    want = hf(input_ids=enc, decoder_input_ids=dec, attention_mask=enc_mask, decoder_attention_mask=dec_mask).logits
    g = torch.randn(want.shape, generator=torch.Generator().manual_seed(2))
    want.backward(g)
    ours = _ours(hf, device)
    enc_d, dec_d = enc.to(device), dec.to(device)
    tile(tiles, (enc_d, {0: "batch", 1: "enc_seq"}), (dec_d, {0: "batch", 1: "dec_seq"}))
    masks = [None if m is None else m[:, None, None, :].bool().to(device) for m in (enc_mask, dec_mask)]
    got = ours(enc_d, dec_d, *masks)
    got.backward(g.to(device))
    assert rel_err(got.cpu(), want) <= TOL
    grads = export_t5_to_hf_state_dict(ours, tensors={n: p.grad for n, p in ours.named_parameters()})
    if ours.lm_head is not None:
        grads["shared.weight"] = grads["shared.weight"] + grads["lm_head.weight"]
    errs = grad_errors(hf, grads)
    assert max(errs.values()) <= TOL, {k: e for k, e in errs.items() if e > TOL}


@pytest.mark.parametrize("device", ["cpu", "nntile"])
def test_t5_matches_hf(device):
    """HF's default T5: ReLU feed-forward, tied head with the d_model**-0.5 scaling."""
    hf = _hf()
    assert hf.config.scale_decoder_outputs and _ours(hf).lm_head is None
    _check(hf, device)


@pytest.mark.parametrize("device", ["cpu", "nntile"])
def test_t5_gated_padded_matches_hf(device):
    """Gated-GELU, no output scaling (a separate lm_head), padding on both sides."""
    hf = _hf(feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    _check(hf, device, enc_mask=_padding(3, 12, [12, 7, 4]), dec_mask=_padding(3, 9, [9, 9, 5]))


def test_t5_matches_hf_tiled():
    hf = _hf(feed_forward_proj="gated-silu")
    _check(hf, "nntile", enc_mask=_padding(3, 12, [12, 8, 10]),
           tiles={"batch": [1, 2], "enc_seq": [5, 7], "dec_seq": [4, 5]})


def test_t5_state_dict_round_trip():
    hf = _hf()
    ours = _ours(hf)
    back = export_t5_to_hf_state_dict(ours, config=hf.config)
    want = hf.state_dict()
    assert set(back) == set(want)
    for k, v in want.items():
        assert torch.equal(back[k], v), k
    fresh = T5ForConditionalGeneration(t5_config_from_hf(hf.config))
    load_hf_state_dict_into_t5(fresh, back)
    for (n, p), q in zip(fresh.named_parameters(), ours.parameters()):
        assert torch.equal(p, q), n
    other = _hf()
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    other.load_state_dict(back)
    enc, dec = _inputs()
    torch.testing.assert_close(other(input_ids=enc, decoder_input_ids=dec).logits,
                               hf(input_ids=enc, decoder_input_ids=dec).logits, rtol=0, atol=0)


def test_t5_reference_usage_without_relative_bias():
    """The published torch_nntile's tests switch HF's bias off and keep the head untied."""
    hf = _hf(feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    disable_t5_relative_attention_bias(hf)
    config = t5_config_from_hf(hf.config)
    assert config.tie_word_embeddings is False and config.head_dim == 8 and config.inner_dim == 32
    config.validate()
    ours = _ours(hf, "nntile")
    assert not ours.model.encoder.block[0].self_attn.has_relative_attention_bias
    enc, dec = _inputs()
    with torch.no_grad():
        want = hf(input_ids=enc, decoder_input_ids=dec).logits
        got = ours(enc.to("nntile"), dec.to("nntile"))
    assert rel_err(got.cpu(), want) <= TOL
    # one attention layer on its own, causal, from the reference's layout of HF's weights
    src = hf.decoder.block[1].layer[0].SelfAttention
    attn = T5Attention(config, is_decoder=True)
    for name in ("q", "k", "v", "o"):
        conv = linear_to_output_weight if name == "o" else linear_to_qkv_weight
        getattr(attn, f"{name}_weight").data.copy_(conv(getattr(src, name).weight, n_heads=4, head_size=8))
    x = torch.randn(2, 7, 32)
    causal = torch.zeros(7, 7).masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
    with torch.no_grad():
        want = src(x, mask=causal[None, None])[0]
        got = attn.to("nntile")(x.to("nntile"), is_causal=True)
    assert rel_err(got.cpu(), want) <= TOL


def test_relative_position_bucket_matches_hf():
    offsets = torch.arange(-300, 300)[None, :] - torch.arange(0, 40)[:, None]
    hf_bucket = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 16), (6, 20)):
            want = hf_bucket(offsets, bidirectional=bidirectional, num_buckets=buckets, max_distance=distance)
            got = relative_position_bucket(offsets, bidirectional=bidirectional, num_buckets=buckets,
                                           max_distance=distance)
            assert torch.equal(got, want), (bidirectional, buckets, distance)


@pytest.mark.parametrize("kw,match", [
    (dict(d_model=0), "d_model must be a positive int"),
    (dict(num_decoder_layers=0), "num_decoder_layers"),
    (dict(feed_forward_proj="gated-tanhh"), "activation 'tanhh'"),
    (dict(feed_forward_proj="fast-relu"), "neither"),
    (dict(feed_forward_proj="relu", is_gated_act=True), "contradicts"),
    (dict(relative_attention_num_buckets=8, relative_attention_max_distance=4), "relative_attention_max_distance"),
])
def test_t5_config_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        T5Config(**{**dict(vocab_size=10, d_model=8, d_kv=4, d_ff=8, num_heads=2), **kw}).validate()
    with pytest.raises(ValueError, match=match):
        T5ForConditionalGeneration(T5Config(**{**dict(vocab_size=10, d_model=8, d_kv=4, d_ff=8, num_heads=2), **kw}))


def test_t5_loader_errors():
    hf = _hf()
    small = T5ForConditionalGeneration(T5Config(vocab_size=VOCAB, d_model=16, d_kv=4, d_ff=48, num_layers=2,
                                                num_decoder_layers=3, num_heads=4, relative_attention_num_buckets=8,
                                                relative_attention_max_distance=16, feed_forward_proj="relu"))
    with pytest.raises(ValueError, match="does not fit"):
        load_hf_into_t5(small, hf)
    shallow = T5ForConditionalGeneration(t5_config_from_hf(_hf(num_decoder_layers=2).config))
    with pytest.raises(ValueError, match="without a place"):
        load_hf_into_t5(shallow, hf)
    with pytest.raises(ValueError, match="d_model"):
        export_t5_to_hf_state_dict(small, config=hf.config)
