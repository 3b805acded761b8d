"""torch_nntile.nn.model and module against HF transformers and torch.nn."""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as TF
from conftest import assert_close
from hf_parity import check_lm_against_hf, spread_norms_and_biases_, token_ids

import torch_nntile
from torch_nntile.nn import module as M
from torch_nntile.nn.model import GPT2, DeepReLU, Llama, gpt2_hf_loader, llama_hf_loader
from torch_nntile.nn.model.common import fill_tied_head

transformers = pytest.importorskip("transformers")


def _hf_gpt2(**kw) -> torch.nn.Module:
    cfg = transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                                  attn_implementation="eager", **kw)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _hf_llama(**kw) -> torch.nn.Module:
    args = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
                attn_implementation="eager")
    args.update(kw)
    torch.manual_seed(0)
    return spread_norms_and_biases_(transformers.LlamaForCausalLM(transformers.LlamaConfig(**args)).eval(), "norm")


def _gpt2_grads_to_hf(model: GPT2):
    return lambda g: gpt2_hf_loader.gpt2_state_dict_to_hf(g, model.config.n_head)


def _llama_grads_to_hf(model: Llama):
    c = model.config  # a tied head's gradient is the embedding's
    return lambda g: fill_tied_head(llama_hf_loader.llama_state_dict_to_hf(g, c.num_attention_heads, c.num_key_value_heads),
                                    "lm_head.weight", "model.embed_tokens.weight")


_ids = functools.partial(token_ids, 97)


# -- weight layout -----------------------------------------------------------------


def test_gpt2_state_dict_round_trip():
    hf = _hf_gpt2()
    ours = GPT2.from_hf(hf)
    back = ours.hf_state_dict()
    want = hf.state_dict()
    assert set(back) == set(want)
    for k, v in want.items():
        assert torch.equal(back[k], v), k
    fresh = _hf_gpt2()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    fresh.load_state_dict(back, strict=True)
    ids = _ids()
    assert torch.equal(fresh(ids).logits, hf(ids).logits)


def test_llama_state_dict_round_trip():
    for tied in (False, True):
        hf = _hf_llama(tie_word_embeddings=tied)
        ours = Llama.from_hf(hf)
        assert (ours.lm_head is None) == tied
        back = ours.hf_state_dict()
        want = hf.state_dict()
        assert set(back) == set(want)
        for k, v in want.items():
            assert torch.equal(back[k], v), k


# -- models against HF ----------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "nntile"])
def test_gpt2_matches_hf(device):
    hf = _hf_gpt2()
    ours = GPT2.from_hf(hf).to(device)
    check_lm_against_hf(hf, ours, _ids(), _gpt2_grads_to_hf(ours))


def test_gpt2_matches_hf_tiled():
    hf = _hf_gpt2(activation_function="gelu")
    ours = GPT2.from_hf(hf).to("nntile")
    check_lm_against_hf(hf, ours, _ids(batch=5), _gpt2_grads_to_hf(ours), tiles={"batch": [2, 3]})


@pytest.mark.parametrize("device", ["cpu", "nntile"])
def test_llama_matches_hf(device):
    hf = _hf_llama()
    ours = Llama.from_hf(hf).to(device)
    check_lm_against_hf(hf, ours, _ids(), _llama_grads_to_hf(ours))


def test_llama_matches_hf_tiled_tied_full_heads():
    hf = _hf_llama(tie_word_embeddings=True, num_key_value_heads=4, attention_bias=True, mlp_bias=True)
    ours = Llama.from_hf(hf).to("nntile")
    check_lm_against_hf(hf, ours, _ids(batch=4), _llama_grads_to_hf(ours), tiles={"batch": 3})


def test_model_config_errors():
    with pytest.raises(ValueError, match="not a multiple of n_head"):
        GPT2(GPT2.from_hf(_hf_gpt2()).config.__class__(n_embd=30, n_head=4, n_layer=1))
    with pytest.raises(ValueError, match="longer than n_positions"):
        GPT2.from_hf(_hf_gpt2())(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match="do not split into groups"):
        Llama(Llama.from_hf(_hf_llama()).config.__class__(hidden_size=32, num_attention_heads=4, num_key_value_heads=3,
                                                           num_hidden_layers=1, vocab_size=10, intermediate_size=8))


# -- modules and packaging -----------------------------------------------------------


@pytest.mark.parametrize("make,shape", [
    (lambda: M.Linear(6, 5), (4, 6)),
    (lambda: M.Linear(6, 5, bias=False), (2, 3, 6)),
    (lambda: M.ReLU(), (4, 6)),
    (lambda: M.GELU(), (4, 6)),
    (lambda: M.GELU(approximate="tanh"), (4, 6)),
    (lambda: M.SiLU(), (4, 6)),
    (lambda: M.LayerNorm(6), (4, 6)),
    (lambda: M.RMSNorm(6, eps=1e-6), (3, 4, 6)),
])
@pytest.mark.parametrize("tiled", [False, True])
def test_modules_match_torch(make, shape, tiled):
    torch.manual_seed(0)
    ours = make()
    with torch.no_grad():
        for p in ours.parameters():
            p.uniform_(-1, 1)
    ref = torch.nn.Module.__new__(type(ours).__mro__[1])  # the torch.nn parent, with the same state
    ref.__dict__ = {k: v for k, v in ours.__dict__.items()}
    ref._parameters = {k: torch.nn.Parameter(v.detach().clone()) if v is not None else None
                       for k, v in ours._parameters.items()}
    x = torch.randn(shape)
    xc = x.clone().requires_grad_()
    want = ref(xc)
    want.square().sum().backward()
    dev = ours.to("nntile")
    xd = x.to("nntile")
    if tiled:  # uneven tiles on the leading dim, and on the feature dim (which norms need whole)
        torch_nntile.set_axis_group_name(xd, {0: "lead", -1: "features"})
        torch_nntile.set_axis_group_tiling("lead", [1, shape[0] - 1])
        torch_nntile.set_axis_group_tiling("features", [4, 2])
    xd.requires_grad_()
    got = dev(xd)
    got.square().sum().backward()
    assert_close(got.cpu(), want)
    assert_close(xd.grad.cpu(), xc.grad)
    for p, q in zip(dev.parameters(), ref.parameters()):
        assert_close(p.grad.cpu(), q.grad)


def test_embedding_and_sdpa_modules():
    torch.manual_seed(0)
    emb = M.Embedding(10, 4)
    ids = torch.tensor([[1, 2, 9], [0, 0, 3]])
    want = TF.embedding(ids, emb.weight)
    want.square().sum().backward()
    dev = M.Embedding(10, 4).to("nntile")
    with torch.no_grad():
        dev.weight.copy_(emb.weight.detach().to("nntile"))
    got = dev(ids.to("nntile"))
    got.square().sum().backward()
    assert_close(got.cpu(), want.detach())
    assert_close(dev.weight.grad.cpu(), emb.weight.grad)
    q, k, v = (torch.randn(2, 5, 4, 3) for _ in range(3))  # [batch, seq, head_size, heads]
    want = TF.scaled_dot_product_attention(*(t.permute(0, 3, 1, 2) for t in (q, k, v)), is_causal=True)
    got = M.SDPA(is_causal=True)(*(t.to("nntile") for t in (q, k, v)))
    assert_close(got.cpu(), want.permute(0, 2, 3, 1))
    with pytest.raises(ValueError, match="padding_idx"):
        M.Embedding(10, 4, padding_idx=0)


def test_deep_relu_layers_and_names():
    model = DeepReLU(8, 16, 3, depth=3)
    assert [type(m) for m in model] == [M.Linear, M.ReLU, M.Linear, M.ReLU, M.Linear]
    assert list(model.state_dict()) == ["0.weight", "2.weight", "4.weight"]


def test_models_alias_and_no_transformers_import():
    import torch_nntile.models as models
    assert models.GPT2 is GPT2 and models.Llama is Llama and models.DeepReLU is DeepReLU
    code = ("import sys, torch_nntile.nn, torch_nntile.models, torch_nntile.training; "
            "assert 'transformers' not in sys.modules, 'transformers imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("make", [lambda: M.Linear(3, 4), lambda: M.LayerNorm(3), lambda: M.RMSNorm(3)])
def test_module_moves_to_nntile_while_a_cpu_graph_lives(make):
    """As stock layers: a CPU forward's graph keeps no reference that stops ``.to``."""
    m = make()
    x = torch.randn(2, 3, requires_grad=True)
    want = m(x)
    m.to("nntile")
    assert m.weight.device.type == "nntile"
    assert_close(m(x.detach().to("nntile")).cpu(), want.detach())
