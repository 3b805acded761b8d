"""The CPU fallback is the safety net for ops nntile lacks: a program never breaks there."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close

import torch_nntile


@pytest.fixture(autouse=True)
def _fallback_on():
    torch_nntile.init_context(ncpu=2, cpu_fallback=True)


def test_gpt2_forward_and_backward_match_cpu():
    """A stock HuggingFace GPT-2 (built from a config) gives CPU's logits and gradients
    with the fallback enabled (whatever of it still needs the fallback)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    ref = GPT2LMHeadModel(cfg)
    model = GPT2LMHeadModel(cfg)
    model.load_state_dict(ref.state_dict())
    model = model.to("nntile")
    ids = torch.randint(0, 100, (2, 16))
    want = ref(ids, labels=ids)
    got = model(ids.to("nntile"), labels=ids.to("nntile"))
    assert_close(got.logits.detach().cpu(), want.logits.detach(), rtol=1e-5)
    assert_close(got.loss.detach().cpu(), want.loss.detach(), rtol=1e-5)
    want.loss.backward()
    got.loss.backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.grad is not None, name
        assert_close(p.grad.cpu(), q.grad, rtol=1e-4)


def test_layer_norm_with_parameters():
    ln = torch.nn.LayerNorm(6)
    x = torch.randn(4, 6)
    lnn = torch.nn.LayerNorm(6)
    lnn.load_state_dict(ln.state_dict())
    lnn = lnn.to("nntile")
    assert_close(lnn(x.to("nntile")).detach().cpu(), ln(x).detach())
    assert_close(F.layer_norm(x.to("nntile"), (6,)).cpu(), F.layer_norm(x, (6,)))


def test_matmul_of_vectors():
    a, b, m = torch.randn(5), torch.randn(5), torch.randn(5, 3)
    assert_close(torch.matmul(a.to("nntile"), b.to("nntile")).cpu(), torch.matmul(a, b))
    assert_close(torch.matmul(a.to("nntile"), m.to("nntile")).cpu(), torch.matmul(a, m))
    assert_close(torch.matmul(m.t().to("nntile"), a.to("nntile")).cpu(), torch.matmul(m.t(), a))


def test_out_argument_is_resized():
    """An op on the fallback with an empty ``out=`` tensor gives it the result's shape."""
    before = torch_nntile.fallback_counts().get("aten::_logcumsumexp", 0)
    out = torch.empty(0, device="nntile")
    torch.logcumsumexp(torch.arange(6.0, device="nntile"), 0, out=out)
    assert out.shape == (6,)
    assert_close(out.cpu(), torch.logcumsumexp(torch.arange(6.0), 0))
    with pytest.warns(UserWarning, match="was resized"):
        full = torch.zeros(2, device="nntile")
        torch.logcumsumexp(torch.zeros(3, device="nntile"), 0, out=full)
    assert_close(full.cpu(), torch.logcumsumexp(torch.zeros(3), 0))
    assert torch_nntile.fallback_counts()["aten::_logcumsumexp"] == before + 2  # it did run on the fallback


def test_wrapped_numbers_reach_the_cpu_as_tensors():
    x = torch.randn(5)
    assert_close(torch.copysign(x.to("nntile"), -2.5).cpu(), torch.copysign(x, -2.5))


def test_convolution_runs_on_the_cpu():
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 5, 5, requires_grad=True)
    convn = torch.nn.Conv2d(3, 4, 3, padding=1)
    convn.load_state_dict(conv.state_dict())
    convn = convn.to("nntile")
    xn = x.detach().to("nntile").requires_grad_()
    want, got = conv(x), convn(xn)
    assert_close(got.detach().cpu(), want.detach())
    want.sum().backward()
    got.sum().backward()
    assert_close(xn.grad.cpu(), x.grad)
    assert_close(convn.weight.grad.cpu(), conv.weight.grad)


def test_sparse_tensors():
    """Sparse layouts on nntile hold nntile parts; their ops run on the CPU."""
    a = torch.randn(4, 4).relu()
    b = torch.randn(4, 3)
    for sp in (a.to_sparse(), a.to_sparse_csr()):
        spn = sp.to("nntile")
        assert spn.layout == sp.layout and spn.device.type == "nntile"
        assert_close((spn @ b.to("nntile")).cpu(), sp @ b)
        assert_close(spn.to_dense().cpu(), a)


def test_tensor_lists_mixing_devices_raise_and_mutated_lists_come_back():
    """An op on the fallback taking a list of tensors from two devices raises, as PyTorch
    does for two devices; the tensors of a list it changes in place get the new values."""
    found, scale = torch.zeros(()).to("nntile"), torch.tensor(0.5).to("nntile")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch._amp_foreach_non_finite_check_and_unscale_([torch.ones(3).to("nntile"), torch.ones(3)], found, scale)
    a, b = torch.full((3,), 4.0).to("nntile"), torch.tensor([1.0, float("inf")]).to("nntile")
    torch._amp_foreach_non_finite_check_and_unscale_([a, b], found, scale)
    assert_close(a.cpu(), torch.full((3,), 2.0))
    assert found.cpu().item() == 1.0
