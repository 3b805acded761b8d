"""A stock HF GPT-2 in bfloat16 and float16 trains on nntile natively (no CPU fallback):
loss, logits and gradients agree with CPU PyTorch in the same dtype to within that
dtype's rounding (products and sums are accumulated in other orders). The suite runs
with ``cpu_fallback=False``: an op without an nntile kernel would raise."""

from __future__ import annotations

import pytest
import torch
import transformers as hf

hf.logging.set_verbosity_error()

# relative tolerances: loss, logits, every parameter gradient (bfloat16 keeps 8 bits)
TOL = {torch.bfloat16: (5e-3, 2e-2, 5e-2), torch.float16: (1e-3, 3e-3, 1e-2)}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_gpt2_half_precision_matches_cpu(dtype):
    cfg = hf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    ref = hf.GPT2LMHeadModel(cfg).to(dtype)
    model = hf.GPT2LMHeadModel(cfg).to(dtype)
    model.load_state_dict(ref.state_dict())
    model = model.to("nntile")
    ids = torch.randint(0, 100, (2, 16))
    want = ref(ids, labels=ids)
    got = model(ids.to("nntile"), labels=ids.to("nntile"))
    want.loss.backward()
    got.loss.backward()
    loss_tol, logit_tol, grad_tol = TOL[dtype]
    assert got.logits.dtype == dtype
    assert _rel(got.loss.cpu(), want.loss) <= loss_tol
    assert _rel(got.logits.cpu(), want.logits) <= logit_tol
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.grad.dtype == dtype, name
        assert _rel(p.grad.cpu(), q.grad) <= grad_tol, name
