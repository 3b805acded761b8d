"""torch_nntile.nn.model / module / weight_layout against HF transformers and torch.nn."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as TF
from conftest import assert_close, rel_err

import torch_nntile
from torch_nntile.nn import module as M
from torch_nntile.nn import weight_layout
from torch_nntile.nn.model import GPT2, DeepReLU, Llama

transformers = pytest.importorskip("transformers")

RTOL = 1e-4  # the bound for our models against HF's


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
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**args)).eval()
    with torch.no_grad():  # HF initialises norms to ones: make them matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def _loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return TF.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _check_against_hf(hf: torch.nn.Module, ours: torch.nn.Module, ids: torch.Tensor, to_hf, tiles=None) -> None:
    """Our logits and gradients (mapped to HF's names and layout) against HF's, on CPU."""
    want = hf(ids).logits
    _loss(want, ids).backward()
    dev = next(ours.parameters()).device
    ids_d = ids.to(dev)
    if dev.type == "nntile" and tiles:
        torch_nntile.set_axis_group_name(ids_d, {0: "batch", 1: "seq"})
        for name, t in tiles.items():
            torch_nntile.set_axis_group_tiling(name, t)
    got = ours(ids_d)
    _loss(got, ids_d).backward()
    assert rel_err(got.cpu(), want) <= RTOL
    grads = to_hf({n: p.grad.cpu() for n, p in ours.named_parameters()})
    for name, p in hf.named_parameters():
        err = rel_err(grads[name], p.grad)
        assert err <= RTOL, (name, err)


def _gpt2_grads_to_hf(model: GPT2):
    return lambda g: weight_layout.gpt2_to_hf(g, model.config.n_head)


def _llama_grads_to_hf(model: Llama):
    c = model.config

    def conv(g):
        sd = weight_layout.llama_to_hf(g, c.num_attention_heads, c.num_key_value_heads)
        if model.lm_head is None:
            sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
        return sd
    return conv


def _ids(batch: int = 3, seq: int = 12) -> torch.Tensor:
    return torch.randint(0, 97, (batch, seq), generator=torch.Generator().manual_seed(1))


# -- weight layout -----------------------------------------------------------------


def test_heads_layout_round_trip_and_order():
    w = torch.arange(24.0).reshape(6, 4)  # 3 heads of size 2, HF order: rows h * 2 + d
    ours = weight_layout.heads_to_ours(w, 3)
    assert torch.equal(ours[1], w[2])  # ours: row d * 3 + h; ours[1] is (d=0, h=1) = HF row 1 * 2 + 0
    assert torch.equal(weight_layout.heads_to_hf(ours, 3), w)
    assert torch.equal(weight_layout.heads_to_hf(weight_layout.heads_to_ours(w, 2, dim=1), 2, dim=1), w)
    with pytest.raises(ValueError, match="does not split into 4 heads"):
        weight_layout.heads_to_ours(w, 4)


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
    _check_against_hf(hf, ours, _ids(), _gpt2_grads_to_hf(ours))


def test_gpt2_matches_hf_tiled():
    hf = _hf_gpt2(activation_function="gelu")
    ours = GPT2.from_hf(hf).to("nntile")
    _check_against_hf(hf, ours, _ids(batch=5), _gpt2_grads_to_hf(ours), tiles={"batch": [2, 3]})


@pytest.mark.parametrize("device", ["cpu", "nntile"])
def test_llama_matches_hf(device):
    hf = _hf_llama()
    ours = Llama.from_hf(hf).to(device)
    _check_against_hf(hf, ours, _ids(), _llama_grads_to_hf(ours))


def test_llama_matches_hf_tiled_tied_full_heads():
    hf = _hf_llama(tie_word_embeddings=True, num_key_value_heads=4, attention_bias=True, mlp_bias=True)
    ours = Llama.from_hf(hf).to("nntile")
    _check_against_hf(hf, ours, _ids(batch=4), _llama_grads_to_hf(ours), tiles={"batch": 3})


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
