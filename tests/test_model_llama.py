"""torch_nntile.nn.model.llama, llama_hf_loader and hf_rope_layout against HF's Llama."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch
from conftest import rel_err
from hf_parity import RTOL, check_lm_against_hf, spread_norms_and_biases_, token_ids

from torch_nntile.nn.linear import linear_to_gqa_output_weight, linear_to_gqa_q_weight, linear_to_qkv_weight
from torch_nntile.nn.model import hf_rope_layout as layout
from torch_nntile.nn.model import llama_hf_loader as loader
from torch_nntile.nn.model.common import fill_tied_head
from torch_nntile.nn.model.llama import (
    Llama,
    LlamaAttention,
    LlamaCausal,
    LlamaConfig,
    LlamaDecoder,
    LlamaModel,
    make_causal_sdpa_mask,
)
from torch_nntile.rope import rope_sin_cos_from_position_ids

transformers = pytest.importorskip("transformers")
VOCAB = 61


def _config(**kw) -> object:
    args = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
                attn_implementation="eager")
    args.update(kw)
    return transformers.LlamaConfig(**args)


def _pair(**kw) -> tuple[torch.nn.Module, LlamaCausal]:
    config = _config(**kw)
    torch.manual_seed(0)
    hf = spread_norms_and_biases_(transformers.LlamaForCausalLM(config).eval(), "norm", bias=(-0.5, 0.5))
    ours = LlamaCausal(loader.llama_config_from_hf(config))
    loader.load_hf_into_llama_causal(ours, hf)
    return hf, ours


_ids = functools.partial(token_ids, VOCAB)


def _grads_to_hf(ours: LlamaCausal) -> Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    c = ours.config  # a tied head's gradient is the embedding's
    return lambda g: fill_tied_head(loader.llama_state_dict_to_hf(g, c.num_attention_heads, c.num_key_value_heads),
                                    "lm_head.weight", "model.embed_tokens.weight")


@pytest.mark.parametrize("device,tiles,kw,masked", [
    ("cpu", None, {}, False),
    ("nntile", None, {}, False),
    ("nntile", None, {"num_key_value_heads": 1}, True),
    ("nntile", {"batch": [1, 2], "seq": [5, 7]},
     {"num_key_value_heads": 4, "tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True}, False),
])
def test_causal_matches_hf(device, tiles, kw, masked):
    hf, ours = _pair(**kw)
    ours = ours.to(device)
    assert (ours.lm_head is None) == kw.get("tie_word_embeddings", False)
    grad = torch.randn(3, 12, VOCAB, generator=torch.Generator().manual_seed(2))
    mask = make_causal_sdpa_mask(12, device=device) if masked else None
    check_lm_against_hf(hf, ours, _ids(), _grads_to_hf(ours), tiles=tiles, out_grad=grad, attn_mask=mask)


def test_position_ids_sin_cos_and_padding_mask_match_hf():
    hf, ours = _pair()
    model = ours.model.to("nntile")
    ids = _ids(batch=2, seq=8)
    packed = torch.tensor([[0, 1, 2, 3, 100, 101, 102, 103], [5, 6, 7, 8, 9, 10, 11, 12]])
    want = hf.model(ids, position_ids=packed).last_hidden_state
    got = model(ids.to("nntile"), position_ids=packed.to("nntile"))
    assert rel_err(got.cpu(), want) <= RTOL
    sin, cos = rope_sin_cos_from_position_ids(packed, 8)  # [batch, seq, head_dim // 2], from the CPU
    assert rel_err(model(ids.to("nntile"), sin=sin.to("nntile"), cos=cos.to("nntile")).cpu(), want) <= RTOL
    sin, cos = rope_sin_cos_from_position_ids(torch.arange(8) + 3, 8)  # [seq, head_dim // 2]: an offset
    want = hf.model(ids, position_ids=(torch.arange(8) + 3).expand(2, 8)).last_hidden_state
    assert rel_err(model(ids.to("nntile"), sin=sin, cos=cos).cpu(), want) <= RTOL
    pad = torch.ones(2, 8, dtype=torch.long)
    pad[1, 5:] = 0  # right padding of the second sequence
    want = hf.model(ids, attention_mask=pad).last_hidden_state
    mask = make_causal_sdpa_mask(8) & pad.bool()[:, None, None, :]  # [batch, 1, seq, seq], used as given
    assert rel_err(model(ids.to("nntile"), attn_mask=mask.to("nntile")).cpu(), want) <= RTOL


def _load_attention(ours: LlamaAttention, theirs: torch.nn.Module) -> None:
    """The published torch_nntile's own way: HF rows to pairs, then the head layout."""
    d, h, kv, rep = ours.head_dim, ours.n_heads, ours.n_kv_heads, ours.n_rep
    q = layout.hf_to_nntile_qkv_weight(theirs.q_proj.weight, n_heads=h, head_dim=d)
    k = layout.hf_to_nntile_qkv_weight(theirs.k_proj.weight, n_heads=kv, head_dim=d)
    with torch.no_grad():
        ours.q_weight.copy_(linear_to_gqa_q_weight(q, n_kv_heads=kv, n_rep=rep, head_size=d))
        ours.k_weight.copy_(linear_to_qkv_weight(k, n_heads=kv, head_size=d))
        ours.v_weight.copy_(linear_to_qkv_weight(theirs.v_proj.weight, n_heads=kv, head_size=d))
        ours.o_weight.copy_(linear_to_gqa_output_weight(theirs.o_proj.weight, n_kv_heads=kv, n_rep=rep, head_size=d))


@pytest.mark.parametrize("causal", [True, False])
def test_attention_and_decoder_match_hf(causal):
    from transformers.models.llama import modeling_llama as M

    config = _config()
    torch.manual_seed(3)
    hf_layer = M.LlamaDecoderLayer(config, layer_idx=0).eval()
    ours = LlamaDecoder(config)  # HF's config is read by name
    _load_attention(ours.self_attn, hf_layer.self_attn)
    for name in ("gate_proj", "up_proj", "down_proj"):
        layout.copy_linear(getattr(ours.mlp, name), getattr(hf_layer.mlp, name))
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(4), requires_grad=True)
    positions = torch.arange(8).expand(2, 8)
    pos_emb = M.LlamaRotaryEmbedding(config=config)(x, positions)
    hf_mask = torch.zeros(8, 8).masked_fill(~make_causal_sdpa_mask(8), float("-inf")) if causal else None
    want = hf_layer.self_attn(x, position_embeddings=pos_emb, attention_mask=hf_mask)[0]
    want.square().sum().backward()
    sin, cos = (t.to("nntile") for t in rope_sin_cos_from_position_ids(torch.arange(8), 8))
    ours = ours.to("nntile")
    xd = x.detach().to("nntile").requires_grad_()
    got = ours.self_attn(xd, sin=sin, cos=cos, is_causal=causal)
    got.square().sum().backward()
    assert rel_err(got.cpu(), want) <= RTOL
    assert rel_err(xd.grad.cpu(), x.grad) <= RTOL
    if causal:
        out = hf_layer(x, attention_mask=hf_mask, position_embeddings=pos_emb)
        want = out[0] if isinstance(out, tuple) else out
        assert rel_err(ours(x.detach().to("nntile"), sin, cos).cpu(), want) <= RTOL


def test_state_dict_round_trip_export_and_legacy_name():
    for kw in ({}, {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True, "num_key_value_heads": 4}):
        hf, ours = _pair(**kw)
        want = hf.state_dict()
        for back in (loader.export_llama_causal_to_hf_state_dict(ours.to("nntile"), config=hf.config),
                     Llama.from_hf(hf).hf_state_dict()):
            assert set(back) == set(want)
            for k, v in want.items():
                assert back[k].device.type == "cpu" and torch.equal(back[k], v), k
        fresh = Llama(hf.config)
        fresh.load_hf_state_dict(want)
        assert loader.llama_state_dict_to_hf(fresh.state_dict(), 4, kw.get("num_key_value_heads", 2)).keys() <= want.keys()
        ids = _ids(batch=1, seq=5)
        assert rel_err(fresh(ids).detach(), hf(ids).logits) <= RTOL
    with pytest.raises(ValueError, match="differs from the model's in num_key_value_heads"):
        loader.export_llama_causal_to_hf_state_dict(ours, config=_config(num_key_value_heads=1))


def test_rope_layout_round_trips():
    w = torch.arange(2 * 3 * 8 * 5, dtype=torch.float32).reshape(2 * 3 * 8, 5)
    pairs = layout.hf_to_nntile_qkv_weight(w[:16], n_heads=2, head_dim=8)
    assert pairs[:4, 0].tolist() == [0.0, 20.0, 5.0, 25.0]  # rows 0, 4, 1, 5: each with its partner half a head on
    assert torch.equal(layout.nntile_to_hf_qkv_weight(pairs, n_heads=2, head_dim=8), w[:16])
    part = layout.hf_to_nntile_qkv_bias(w[:16, 0], n_heads=2, head_dim=8, rotary_pct=0.5)
    assert part[:8].tolist() == [0.0, 10.0, 5.0, 15.0, 20.0, 25.0, 30.0, 35.0]  # 4 rotary channels, 4 kept
    assert torch.equal(layout.nntile_to_hf_qkv_bias(part, n_heads=2, head_dim=8, rotary_pct=0.5), w[:16, 0])
    fused = layout.hf_to_nntile_fused_qkv_weight(w, n_heads=2, head_dim=8)
    assert torch.equal(fused[16:24], w[16:24])  # the first head's v rows are kept
    assert torch.equal(layout.nntile_to_hf_fused_qkv_weight(fused, n_heads=2, head_dim=8), w)
    b = w[:, 0]
    assert torch.equal(layout.nntile_to_hf_fused_qkv_bias(layout.hf_to_nntile_fused_qkv_bias(
        b, n_heads=2, head_dim=8), n_heads=2, head_dim=8), b)
    with pytest.raises(ValueError, match="rows"):
        layout.hf_to_nntile_qkv_weight(w, n_heads=2, head_dim=8)
    with pytest.raises(ValueError, match="must be even"):
        layout.hf_to_nntile_qkv_weight(w[:16], n_heads=2, head_dim=8, rotary_pct=0.375)


def test_config_defaults_validation_and_from_hf():
    c = LlamaConfig()
    assert (c.head_dim, c.num_key_value_heads) == (128, 32)
    c.validate()
    for kw, match in [({"hidden_size": 65, "num_attention_heads": 4}, "not a multiple of num_attention_heads"),
                      ({"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 3},
                       "do not split into groups"),
                      ({"hidden_size": 36, "num_attention_heads": 4}, "head_dim must be even"),
                      ({"hidden_act": "gelu"}, "activation 'gelu'")]:
        bad = LlamaConfig(**kw)  # built, rejected when validated or used
        with pytest.raises(ValueError, match=match):
            bad.validate()
        with pytest.raises(ValueError, match=match):
            LlamaModel(bad)
    assert LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=32).head_dim == 32  # HF allows it
    local = loader.llama_config_from_hf(_config(rope_theta=500.0, head_dim=16))
    assert (local.rope_theta, local.head_dim, local.num_key_value_heads) == (500.0, 16, 2)
    assert loader.llama_config_from_hf(transformers.LlamaForCausalLM(_config(num_hidden_layers=1))).num_hidden_layers == 1
    llama3 = _config(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    with pytest.raises(ValueError, match="rope type 'llama3' is not supported"):
        LlamaCausal(llama3)
    with pytest.raises(ValueError, match="head_dim // 2 = 4"):
        LlamaModel(_config())(_ids(1, 3), sin=torch.zeros(3, 3), cos=torch.ones(3, 3))


def test_rope_tables_and_caches():
    model = LlamaModel(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=8, num_hidden_layers=1,
                                   num_attention_heads=4))
    packed = torch.tensor([[0, 1, 2, 3, 100, 101]])
    sin, cos = model._rope_tables_from_position_ids(packed.to("nntile"))
    want_sin, want_cos = rope_sin_cos_from_position_ids(packed, 8)
    assert rel_err(sin.cpu(), want_sin) <= 1e-6 and rel_err(cos.cpu(), want_cos) <= 1e-6
    model.warm_sequence_caches(batch_sizes=[2], seq_len=6, device="cpu")
    key = (6, torch.device("cpu"), torch.float32)
    assert list(model._rope_full_cache) == [key]
    assert model._rope_full_cache[key][0].shape == (6, 8)  # HF's form, made once for all layers
    assert model._rope_cache[6][0].shape == (6, 4)  # the published torch_nntile's, under its name
    assert model.double()(_ids(2, 6)).dtype == torch.float64  # tables in the activations' dtype, as HF's
    assert (6, torch.device("cpu"), torch.float64) in model._rope_full_cache
    model.clear_sequence_caches()
    assert not model._rope_cache and not model._rope_full_cache
    with pytest.raises(ValueError, match="seq_len must be at least 1"):
        model.warm_sequence_caches(seq_len=0, device="cpu")
